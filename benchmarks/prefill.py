"""Prefill cost against the prefill chunk size, on the real model.

    python -m benchmarks.prefill [--threads 2] [--lengths 512,1024,2048,4096,8192]
        [--chunks none,1024-allkeys,512,1024,2048] [--repeats 3] [--batch B] [--json OUT]

For each prompt length, times refdec's prefill (``SpeculativeDecoder.generate``
with ``max_new_tokens=1``, no drafting: ``stats.prefill_seconds``) at each
``prefill_chunk`` (``none`` = one forward over the whole prompt, what
``model.generate`` does; ``1024-allkeys`` = chunks of 1,024 with Gemma 3's sliding layers
reading every earlier key instead of their window, the ablation of
``refdec.transformers.cache.set_prefill_window``), the settings alternating within each repeat; reports
the minimum over repeats and the ratio to ``none``, and checks that every
setting gives the same first token. Prompts: the longest edit prompts of
edits-click.jsonl where ../shared/data is present, else random tokens.
``--batch B`` (> 1) times the batched prefill instead: B left-padded prompts of
lengths n, n - 64, ..., n - 64 (B - 1), cut from different places of that text.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from benchmarks import data, report, workloads


def prompts_of_lengths(lengths, vocab: int) -> dict:
    """{length: int32 array}: a prefix of the concatenated edit prompts (real text) when the
    data is present, else random token ids."""
    text = np.zeros(0, dtype=np.int32)
    if data.data_dir().exists():
        wl = workloads.load_edits()
        text = np.concatenate([c.prompt for c in sorted(wl.cases, key=lambda c: -len(c.prompt))])
    rng = np.random.default_rng(0)
    out = {}
    for n in lengths:
        if len(text) < n:
            print(f"prompt of {n} tokens: random token ids (the edit prompts hold {len(text)})", file=sys.stderr)
        out[n] = text[:n] if len(text) >= n else rng.integers(3, min(vocab, 30000), size=n).astype(np.int32)
    return out


def batch_prompts(text: np.ndarray, n: int, batch: int) -> list:
    """``batch`` int32 prompts of lengths n, n - 64, ... cut from consecutive places of ``text``
    (wrapping around)."""
    out = []
    for b in range(batch):
        length = max(1, n - 64 * b)
        start = (b * n) % max(1, len(text) - length) if len(text) > length else 0
        out.append(np.resize(text[start:], length).astype(np.int32))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", default="512,1024,2048,4096,8192")
    ap.add_argument("--chunks", default="none,1024-allkeys,512,1024,2048")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1, help="B > 1: the batched prefill of B prompts")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.batch < 1:
        ap.error(f"--batch must be >= 1, got {args.batch}")

    import torch

    torch.set_num_threads(args.threads)
    from refdec import SpeculativeDecoder
    from refdec.models import load_default

    model, _ = load_default()
    lengths = [int(x) for x in args.lengths.split(",") if x]
    chunks = [c for c in args.chunks.split(",") if c]
    decoders = {}
    for c in chunks:
        size, _, variant = c.partition("-")
        if not (size == "none" or size.isdigit()) or variant not in ("", "allkeys"):
            ap.error(f"--chunks values are 'none', N or N-allkeys, got {c!r}")
        decoders[c] = SpeculativeDecoder(model, prefill_chunk=None if size == "none" else int(size),
                                         prefix_cache=0)  # every timed prefill from the first token
        if variant == "allkeys":
            decoders[c].backend.runner.sliding_layers = []  # sliding layers see every earlier key
    prompts = prompts_of_lengths(lengths, decoders[chunks[0]].vocab_size)
    if args.batch > 1:
        text = prompts_of_lengths([max(lengths) * args.batch], decoders[chunks[0]].vocab_size)
        text = next(iter(text.values()))
        prompts = {n: batch_prompts(text, n, args.batch) for n in lengths}
    rows = []
    for n in lengths:
        times = {c: [] for c in chunks}
        firsts = set()
        for rep in range(args.repeats + 1):  # the first round warms up
            order = chunks if rep % 2 == 0 else list(reversed(chunks))
            for c in order:
                out = decoders[c].generate(prompts[n], max_new_tokens=1, max_draft_tokens=0, eos_token_id=[])
                firsts.add(tuple(out.sequences[:, -1].tolist()))
                if rep:
                    times[c].append(out.stats.prefill_seconds)
        if len(firsts) != 1:
            print(f"MISMATCH: prompt {n}: first tokens {sorted(firsts)} differ across chunk sizes", file=sys.stderr)
        best = {c: min(v) for c, v in times.items()}
        base = best[chunks[0]]
        row = {"tokens": n, "seconds": {c: round(best[c], 4) for c in chunks},
               "vs_first": {c: round(base / best[c], 3) for c in chunks}, "same_first_token": len(firsts) == 1}
        rows.append(row)
        cells = "  ".join(f"{c}: {best[c]:.3f}s ({base / best[c]:.2f}x)" for c in chunks)
        print(f"{n:6d} tokens  {cells}", flush=True)
    print(f"\n| prompt tokens | " + " | ".join(f"chunk {c}" for c in chunks) + " |")
    print("|---|" + "---|" * len(chunks))
    for r in rows:
        print(f"| {r['tokens']} | " + " | ".join(
            f"{r['seconds'][c]:.2f} s ({r['vs_first'][c]:.2f}×)" for c in chunks) + " |")
    out = report.write_result(report.result_path(args.json, "prefill"),
                              {"threads": args.threads, "batch": args.batch, "rows": rows}, argv=argv)
    print(f"\nJSON: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
