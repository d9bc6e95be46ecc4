"""The same decoding from two checkouts of refdec: tokens, verify passes and seconds per prompt.

Run it once per checkout and compare the JSON files. The benchmarks package comes from this
tree, refdec from the checkout under test: ``python -m`` puts the current directory first on
``sys.path``, so run the old checkout's refdec from a directory that links it next to this tree's
benchmarks (the result records ``refdec.__file__``)::

    mkdir old && ln -s OLD_CHECKOUT/refdec old/refdec && ln -s THIS_TREE/benchmarks old/benchmarks
    (cd old && python -m benchmarks.engine_ab --json old.json)
    python -m benchmarks.engine_ab --json new.json
    python -m benchmarks.engine_ab --compare old.json new.json

Both checkouts must read the same cost curve for the same passes: when the calibration's cache key
differs between them, copy the old curve's file to the new key's name first.

``--backend llama.cpp`` decodes the default model's GGUF on llama.cpp instead of transformers.
The old checkout needs ``SpeculativeDecoder.backend.auto_cost_curve`` (0.1 has it).

Each of the first ``--limit`` prompts of each of ``--workloads`` (default: edit pairs, the pair's
original file as the reference; and MT-Bench chat prompts, no reference) is decoded by a fresh
``SpeculativeDecoder`` (greedy, ``max_draft_tokens="auto"``), after one untimed warm-up. The draft-cost curve is read from the calibration cache (or measured) before any
timing, so both checkouts use the same curve when its cache key is the same. The decoders
price with the calibrated curve as it is (``decoder.timed_budget = False`` where a checkout has
it): a curve refit from the steps' measured time, and the guard that stops drafting where it does
not pay, make the pass counts depend on the machine's timings; ``--timed-budget`` keeps them on
(then only the tokens compare). ``--compare``
prints whether the tokens and the pass counts are identical and the ratio of the per-prompt
minimum times over the runs given, per workload (alternate the checkouts over several runs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from benchmarks import report, workloads


def _load(backend: str, threads: int):
    """The default model (Gemma 3 270M) on ``backend``: transformers (converted from its GGUF) or
    llama.cpp (the GGUF itself; the same vocabulary, so the workloads' token ids serve both)."""
    if backend == "llama.cpp":
        import llama_cpp

        from refdec.gguf_files import default_model_gguf

        llm = llama_cpp.Llama(str(default_model_gguf()), n_ctx=4096, n_threads=threads, n_threads_batch=threads,
                              verbose=False)
        return llm, None
    from refdec.models import load_default

    return load_default()


def decode(names: list[str], limit: int, max_new_tokens: int, backend: str = "transformers",
           threads: int = 2, timed_budget: bool = False) -> list[dict]:
    import refdec

    model, tok = _load(backend, threads)
    refdec.SpeculativeDecoder(model, tok).backend.auto_cost_curve()  # measured (or read) before any timing
    cases = [(name, case) for name in names for case in workloads.load_workload(name, limit, require_output=False).cases]
    first = cases[0][1]
    refdec.generate(model, first.prompt.tolist(), tokenizer=tok, references=[r.tolist() for r in first.references],
                    max_new_tokens=4)  # warm-up
    rows = []
    for name, case in cases:
        decoder = refdec.SpeculativeDecoder(model, tok)
        if hasattr(decoder, "timed_budget"):  # older checkouts price with the calibrated curve anyway
            decoder.timed_budget = timed_budget
        t0 = time.perf_counter()
        out = decoder.generate(case.prompt.tolist(), references=[r.tolist() for r in case.references],
                               max_new_tokens=max_new_tokens)
        seconds = time.perf_counter() - t0
        rows.append({"workload": name, "case": case.name, "passes": out.stats.forward_passes, "new_tokens": out.stats.new_tokens,
                     "seconds": seconds, "tokens": out.sequences[0, len(case.prompt):].tolist()})
        print(f"{name} {case.name}: {out.stats.forward_passes} passes, {out.stats.new_tokens} tokens, {seconds:.2f} s",
              flush=True)
    return rows


def compare(old_paths: list[str], new_paths: list[str]) -> None:
    def load(paths):
        return [json.load(open(p))["rows"] for p in paths]

    olds, news = load(old_paths), load(new_paths)
    reference = olds[0]
    runs = olds + news
    print("tokens identical:", all(a["tokens"] == b["tokens"] for run in runs for a, b in zip(reference, run)))
    print("passes identical:", all(a["passes"] == b["passes"] for run in runs for a, b in zip(reference, run)))
    old = [min(run[i]["seconds"] for run in olds) for i in range(len(reference))]
    new = [min(run[i]["seconds"] for run in news) for i in range(len(reference))]
    print(f"passes: {sum(r['passes'] for r in reference)}; per-prompt minimum seconds summed: old {sum(old):.2f}, "
          f"new {sum(new):.2f}, old/new {sum(old) / sum(new):.3f} (> 1: the new is faster)")
    for name in dict.fromkeys(r.get("workload", "edits") for r in reference):
        at = [i for i, r in enumerate(reference) if r.get("workload", "edits") == name]
        o, n = sum(old[i] for i in at), sum(new[i] for i in at)
        print(f"  {name}: {len(at)} prompts, old {o:.2f} s, new {n:.2f} s, old/new {o / n:.3f}; per prompt "
              + ", ".join(f"{old[i] / new[i]:.3f}" for i in at))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="edits,mtbench", help="comma-separated (default edits,mtbench)")
    ap.add_argument("--limit", type=int, default=10, help="prompts per workload (default 10)")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", choices=("transformers", "llama.cpp"), default="transformers",
                    help="the default model on transformers (default) or its GGUF on llama.cpp")
    ap.add_argument("--timed-budget", action="store_true",
                    help="let 'auto' learn from the steps' time (pass counts then vary with the machine's load)")
    ap.add_argument("--json", default=None, help="results JSON path (default benchmarks/out/engine_ab-<time>.json)")
    ap.add_argument("--compare", nargs=2, metavar=("OLD[,OLD...]", "NEW[,NEW...]"),
                    help="compare result files (comma-separated runs of each checkout) and exit")
    args = ap.parse_args(argv)
    if args.compare:
        compare(args.compare[0].split(","), args.compare[1].split(","))
        return 0
    import torch

    torch.set_num_threads(args.threads)
    import refdec

    rows = decode([w.strip() for w in args.workloads.split(",") if w.strip()], args.limit, args.max_new_tokens,
                  args.backend, args.threads, args.timed_budget)
    path = report.write_result(report.result_path(args.json, "engine_ab"), {"refdec": refdec.__file__, "rows": rows},
                               argv=argv)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
