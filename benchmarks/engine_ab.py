"""The same work from two or more refdec checkouts: whole decodes, or the drafting step alone (--step).

Decodes give tokens, verify passes and seconds per prompt; the drafting step its latency (or its
instruction count) per step shape.

**Decoding** (the default). Run it once per checkout and compare the JSON files. The benchmarks
package comes from this tree, refdec from the checkout under test: ``python -m`` puts the current
directory first on ``sys.path``, so run the old checkout's refdec from a directory that links it
next to this tree's benchmarks (the result records ``refdec.__file__``)::

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
``SpeculativeDecoder`` (greedy, ``max_draft_tokens="auto"``), after one untimed warm-up. The
draft-cost curve is read from the calibration cache (or measured) before any timing, so both
checkouts use the same curve when its cache key is the same. ``--compare`` prints whether the
tokens and the pass counts are identical and the ratio of the per-prompt minimum times over the
runs given, per workload (alternate the checkouts over several runs). The decoders price with the
calibrated curve as it is (``decoder.timed_budget = False`` where a checkout has it): a curve
refit from the steps' measured time, and the guard that stops drafting where it does not pay,
make the pass counts depend on the machine's timings; ``--timed-budget`` keeps them on (then only
the tokens compare).

**The drafting step** (``--step``), several builds side by side in one run. Each build is a
checkout with its extension built in place (``python setup.py build_ext --inplace``; e.g. ``git
worktree add /tmp/old 807ba70``). The replay of benchmarks/step_replay.py runs in a fresh process
per (build, round), the builds alternating within each round so that load on a shared machine
hits them alike. Reported per build and step shape: the median over rounds of the per-round p50 /
p99 / mean (µs). ``--callgrind`` instead counts instructions per step under valgrind.
``--shards 1,4`` also runs each build on the corpus split into that many index files. ``--batch
64`` drafts for 64 requests per engine step (request i reads the file from its own offset), the
serving case: the time of the whole step is reported.

    python -m benchmarks.engine_ab --step --build before=/tmp/old --build after=. [--rounds 7] [--callgrind]
    python -m benchmarks.engine_ab --step --build after=. --shards 1,4
    python -m benchmarks.engine_ab --step --build before=/tmp/old --build after=. --batch 64 --shape 16:2 --steps 2000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from benchmarks import report, step_replay, workloads
from benchmarks.backends import load_model

# ---------------------------------------------------------------- decoding

def decode(names: list[str], limit: int, max_new_tokens: int, backend: str = "transformers",
           threads: int = 2, timed_budget: bool = False) -> list[dict]:
    """A row per prompt (tokens, passes, seconds) of the first ``limit`` of each workload, decoded by
    the default model (Gemma 3 270M) on ``backend``: transformers (converted from its GGUF) or
    llama.cpp (the GGUF itself; the same vocabulary, so the workloads' token ids serve both)."""
    import refdec

    model, tok = load_model("default", backend, threads=threads)
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
        rows.append({"workload": name, "case": case.name, "passes": out.stats.forward_passes,
                     "new_tokens": out.stats.new_tokens, "seconds": seconds,
                     "tokens": out.sequences[0, len(case.prompt):].tolist()})
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


# ---------------------------------------------------------------- the drafting step

def step(args) -> dict:
    """``--step``: each build's replay, alternated per round; prints the table, returns the payload."""
    shard_counts = [int(n) for n in args.shards.split(",")]
    builds = [(f"{name}" if len(shard_counts) == 1 else f"{name}/{n} shards", path, n)
              for name, path in (b.split("=", 1) for b in args.build) for n in shard_counts]
    shapes = [tuple(int(x) for x in s.split(":")) for s in (args.shape or ["32:1", "16:2"])]
    if args.callgrind:
        args.rounds, args.steps = 1, min(args.steps, 2_000)
    need = max(args.warmup, args.steps) * max(a for _, a in shapes)

    results: dict = {name: {f"{b}:{a}": [] for b, a in shapes} for name, _, _ in builds}
    with tempfile.TemporaryDirectory() as workdir:
        replays = step_replay.replay_data(workdir, args.prompt_len, need, shard_counts)
        for round_idx in range(args.rounds):
            order = builds if round_idx % 2 == 0 else builds[::-1]
            for budget, accept in shapes:
                for name, path, n in order:
                    r = step_replay.run_child(os.path.abspath(path), replays[n], budget, accept, args.steps,
                                              args.warmup, args.callgrind, args.batch)
                    results[name][f"{budget}:{accept}"].append(r)
            print(f"round {round_idx + 1}/{args.rounds} done, load {os.getloadavg()[0]:.2f}", file=sys.stderr)

    base = builds[0][0]
    summary: dict = {}
    unit = "instructions / step" if args.callgrind else "p50 / p99 / mean µs"
    if args.batch > 1:
        unit = f"{unit} per request" if args.callgrind else f"engine step of {args.batch} requests, {unit}"
    print(f"\n| build | step | {unit} | vs {base} |")
    print("|---|---|---|---|")
    for name, _, _ in builds:
        summary[name] = {}
        for shape, rounds in results[name].items():
            med = {k: float(np.median([r[k] for r in rounds])) for k in rounds[0]}
            summary[name][shape] = med
            key = "instructions_per_step" if args.callgrind else "p50"
            ratio = med[key] / summary[base][shape][key]
            budget, accept = shape.split(":")
            cell = (f"{med[key] / 1e3:.1f}k" if args.callgrind
                    else f"{med['p50']:.1f} / {med['p99']:.1f} / {med['mean']:.1f}")
            print(f"| {name} | propose({budget}) + accept({accept}) | {cell} | {ratio:.2f}x |")
    return {"args": vars(args), "builds": {name: path for name, path, _ in builds}, "summary": summary,
            "rounds": results}


# ---------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None,
                    help="results JSON path (default benchmarks/out/engine_ab[-step]-<time>.json)")
    dec = ap.add_argument_group("decoding (the default)")
    dec.add_argument("--workloads", default="edits,mtbench", help="comma-separated (default edits,mtbench)")
    dec.add_argument("--limit", type=int, default=10, help="prompts per workload (default 10)")
    dec.add_argument("--max-new-tokens", type=int, default=512)
    dec.add_argument("--threads", type=int, default=2)
    dec.add_argument("--backend", choices=("transformers", "llama.cpp"), default="transformers",
                     help="the default model on transformers (default) or its GGUF on llama.cpp")
    dec.add_argument("--timed-budget", action="store_true",
                     help="let 'auto' learn from the steps' time (pass counts then vary with the machine's load)")
    dec.add_argument("--compare", nargs=2, metavar=("OLD[,OLD...]", "NEW[,NEW...]"),
                     help="compare result files (comma-separated runs of each checkout) and exit")
    st = ap.add_argument_group("the drafting step (--step)")
    st.add_argument("--step", action="store_true", help="time (or count) the drafting step of each --build")
    st.add_argument("--build", action="append", default=[], metavar="NAME=PATH",
                    help="a checkout with refdec/_C built in place (repeat; the first is the baseline)")
    st.add_argument("--shape", action="append", default=None, metavar="BUDGET:ACCEPT",
                    help="propose(BUDGET) + accept(ACCEPT tokens); default 32:1 and 16:2")
    st.add_argument("--rounds", type=int, default=7)
    st.add_argument("--steps", type=int, default=10_000)
    st.add_argument("--warmup", type=int, default=500)
    st.add_argument("--prompt-len", type=int, default=512)
    st.add_argument("--shards", default="1", help="comma-separated shard counts of the corpus (default 1)")
    st.add_argument("--batch", type=int, default=1,
                    help="concurrent requests per engine step (the step times all of them; per request = / batch)")
    st.add_argument("--callgrind", action="store_true", help="instructions per step (one round, 2,000 steps)")
    args = ap.parse_args(argv)
    if args.step != bool(args.build):
        ap.error("--step takes one --build NAME=PATH or more, and --build goes with --step")
    if args.compare:
        compare(args.compare[0].split(","), args.compare[1].split(","))
        return 0
    if args.step:
        path = report.write_result(report.result_path(args.json, "engine_ab-step"), step(args), argv=argv)
        print(f"\nwrote {path}", file=sys.stderr)
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
