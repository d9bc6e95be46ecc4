"""What a packed llama.cpp decode costs against its entries and its rows, as refdec verifies them.

    python -m benchmarks.llama_packed [--model editor] [--threads 2] [--context 1536]
        [--totals 4,36,68,148] [--rows 4] [--repeats 3] [--no-exact] [--json OUT]
    python -m benchmarks.llama_packed --context-sweep 512,2048 --totals 1,17,65,129

The budget (refdec.sizing.budget.packed_prefix_sizes) prices a step of B rows by the cost curve at
the forward's entries, ``sum_b (1 + n_b) - 1`` nodes, as if the rows did not matter; the curve is
measured on one row over a 512-token context (refdec.llama_cpp.calibration). This times, over
``--context`` tokens of context per sequence (random token ids: the cost does not depend on them),
for each total ``N`` of ``--totals``: one row of N entries; ``--rows`` rows of N / rows entries each
in sequences with consecutive ids (llama.cpp's KV streams split a batch into micro-batches of
streams with consecutive, increasing ids); the same in sequences with every other id, and in
descending ids (a batch laid out in its rows' order when a row that joined holds a lower id: refdec
lays rows out by id); and rows of unequal lengths (half, a quarter, ... of N). Every decode asks for
every entry's logits and, in exact mode (the default, as ``refdec serve`` runs), with
batch-invariant products; the shapes alternate within each repeat, and each cell is the median over
``--repeats``. The table gives milliseconds, each cell against one row of as many entries, and the
calibrated curve's price.

``--context-sweep C1,C2,...``: instead, one row of each total over each context length (a sequence
prefilled to each), the contexts alternating within each repeat; each cell against the first
context's.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from benchmarks import report


def prefilled_backend(args, contexts: list[int], most_entries: int):
    """``(backend, rng, high)``: model ``args.model`` on llama.cpp (exact mode unless
    ``args.no_exact``) with a sequence per context length of ``contexts``, sequence i prefilled with
    ``contexts[i]`` random token ids (below ``high``) in the Llama's prefill chunks, and room after it
    for a decode of ``most_entries`` entries; ``rng`` draws the decodes' tokens."""
    import torch

    import refdec
    from benchmarks.backends import load_model

    torch.set_num_threads(args.threads)
    cells = max(contexts) + most_entries + 1
    llm, _ = load_model(args.model, "llama.cpp", threads=args.threads, n_ctx=cells * len(contexts))
    backend = refdec.SpeculativeDecoder(llm, max_rows=len(contexts), prefix_cache=0, exact=not args.no_exact).backend
    ctx = backend.ctx
    if ctx.n_batch < most_entries:
        raise SystemExit(f"a decode here takes at most {ctx.n_batch} entries; --totals asked {most_entries}")
    rng = np.random.default_rng(0)
    high = min(backend.vocab_size, 30000)
    for seq, length in enumerate(contexts):
        context = rng.integers(0, high, length).astype(np.int32)
        for begin in range(0, length, ctx.prefill_chunk):
            part = context[begin: begin + ctx.prefill_chunk]
            ctx.decode(part, np.arange(begin, begin + len(part)), [[seq]] * len(part), np.zeros(len(part), bool))
    return backend, rng, high


def timed_decode(ctx, rng, high: int, lengths: list[int], seqs: list[int], starts: list[int], invariant: bool) -> float:
    """Seconds of one decode of random tokens (below ``high``), ``lengths[b]`` entries in sequence
    ``seqs[b]`` from position ``starts[b]`` (its context's end), every entry's logits; the entries
    are removed after."""
    tokens = rng.integers(0, high, sum(lengths)).astype(np.int32)
    positions = np.concatenate([start + np.arange(n) for n, start in zip(lengths, starts)]).astype(np.int32)
    ids = [[seq] for n, seq in zip(lengths, seqs) for _ in range(n)]
    t0 = time.perf_counter()
    ctx.decode(tokens, positions, ids, np.ones(len(tokens), bool), invariant=invariant)
    elapsed = time.perf_counter() - t0
    for seq, start in zip(seqs, starts):
        ctx.seq_remove(seq, start, -1)
    return elapsed


def mode_line(args, what: str) -> str:
    mode = "llama.cpp's kernels" if args.no_exact else "exact mode"
    return f"{args.model}, {mode}, {args.threads} threads, {what}; median of {args.repeats}"


def shapes(total: int, rows: int) -> dict[str, tuple[list[int], list[int]]]:
    """{name: (entries per row, sequence id per row)} for a decode of ``total`` entries."""
    equal = max(1, total // rows)
    unequal = [max(1, total >> (b + 1)) for b in range(rows - 1)]
    unequal.append(max(1, total - sum(unequal)))
    return {
        "1 row": ([total], [0]),
        f"{rows} rows, consecutive ids": ([equal] * rows, list(range(rows))),
        f"{rows} rows, every other id": ([equal] * rows, list(range(0, 2 * rows, 2))),
        f"{rows} rows, ids descending": ([equal] * rows, list(range(rows - 1, -1, -1))),
        f"{rows} rows, unequal": (unequal, list(range(rows))),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="editor", help="a benchmarks.backends model name (default: editor)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=1536, help="tokens of context in each sequence")
    ap.add_argument("--totals", default="4,36,68,148", help="entries per decode, comma-separated")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-exact", action="store_true", help="llama.cpp's usual kernels (refdec serve --no-exact)")
    ap.add_argument("--context-sweep", help="context lengths, comma-separated: one row over each (module docstring)")
    ap.add_argument("--json", help="write the measurements here")
    args = ap.parse_args(argv)
    totals = [int(t) for t in args.totals.split(",")]
    if args.context_sweep:
        return context_sweep(args, [int(c) for c in args.context_sweep.split(",")], totals)
    if args.rows < 2 or min(totals) < args.rows:
        ap.error(f"--rows must be >= 2 and every total >= --rows, got rows {args.rows}, totals {totals}")

    sequences = 2 * args.rows  # every other id needs twice the ids
    backend, rng, high = prefilled_backend(args, [args.context] * sequences, max(totals))
    curve = backend.auto_cost_curve()

    def decode_seconds(lengths: list[int], seqs: list[int]) -> float:
        return timed_decode(backend.ctx, rng, high, lengths, seqs, [args.context] * len(seqs), not args.no_exact)

    cases = {total: shapes(total, args.rows) for total in totals}
    decode_seconds([1], [0])  # warm-up
    samples = {(total, name): [] for total, named in cases.items() for name in named}
    for _ in range(args.repeats):
        for total, named in cases.items():
            for name, (lengths, seqs) in named.items():
                samples[(total, name)].append(decode_seconds(lengths, seqs))
    print(mode_line(args, f"{args.context} tokens of context per sequence"), file=sys.stderr)
    rows = []
    for total, named in cases.items():
        one = float(np.median(samples[(total, "1 row")]))
        for name, (lengths, _seqs) in named.items():
            ms = float(np.median(samples[(total, name)])) * 1e3
            rows.append([total, name, "/".join(map(str, lengths)), f"{ms:.1f}", f"{ms / one / 1e3:.2f}",
                         f"{curve(total - 1) * 1e3:.1f}"])
    print(report.markdown_table(rows, ["entries", "shape", "entries per row", "ms", "× one row", "curve's price ms"]))
    if args.json:
        report.write_result(args.json, {"samples": {f"{t}|{n}": s for (t, n), s in samples.items()}})
    return 0


def context_sweep(args, contexts: list[int], totals: list[int]) -> int:
    """``--context-sweep``: one row of each total over each context length, interleaved."""
    backend, rng, high = prefilled_backend(args, contexts, max(totals))
    samples = {(n, c): [] for n in totals for c in contexts}
    for _ in range(args.repeats):
        for n in totals:
            for seq, length in enumerate(contexts):
                samples[(n, length)].append(timed_decode(backend.ctx, rng, high, [n], [seq], [length],
                                                         not args.no_exact))
    print(mode_line(args, "one row"), file=sys.stderr)
    rows = []
    for n in totals:
        first = float(np.median(samples[(n, contexts[0])]))
        rows.append([n] + [f"{np.median(samples[(n, c)]) * 1e3:.1f} ({np.median(samples[(n, c)]) / first:.2f})"
                           for c in contexts])
    print(report.markdown_table(rows, ["entries"] + [f"{c} tokens of context: ms (×)" for c in contexts]))
    if args.json:
        report.write_result(args.json, {"samples": {f"{n}|{c}": s for (n, c), s in samples.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
