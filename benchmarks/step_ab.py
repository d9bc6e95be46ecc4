"""Drafting step latency of several refdec builds, side by side in one run.

Each build is a checkout with its extension built in place (``python setup.py build_ext
--inplace``; e.g. ``git worktree add /tmp/old 807ba70``). The same replay as
``index_bench.py`` (the stdlib corpus index, a held-out file fed token by token after a
512-token prompt) runs in a fresh process per (build, round), the builds alternating
within each round so that load on a shared machine hits them alike:

    step = Proposer.propose(budget) + Proposer.accept(the next `accept` tokens of the file)

The child imports refdec's public names from the build (it runs in the build's checkout).
Reported per build and step shape: the median over rounds of the per-round p50 / p99 / mean
(µs). ``--callgrind`` instead counts instructions per step under valgrind (steps N minus
steps 0: repeatable under load). ``--shards 1,4`` also runs each build on the corpus split
into that many index files (contiguous runs of documents; ``ShardedIndex.load_many``).
``--batch 64`` drafts for 64 requests per engine step (request i reads the file from its own
offset), the serving case: the time of the whole step is reported.

    python -m benchmarks.step_ab --build before=/tmp/old --build after=. [--rounds 7] [--callgrind]
    python -m benchmarks.step_ab --build after=. --shards 1,4
    python -m benchmarks.step_ab --build before=/tmp/old --build after=. --batch 64 --shape 16:2 --steps 2000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from benchmarks import data, report, tokens

_CHILD = r"""
import json, os, subprocess, sys, time
index_paths, prompt_path, rest_path, budget, accept, steps, warmup, mode, batch = sys.argv[1:10]
budget, accept, steps, warmup, batch = int(budget), int(accept), int(steps), int(warmup), int(batch)
import numpy as np
from refdec import CorpusIndex, Proposer  # the build's: the child runs in its checkout
paths = index_paths.split(",")
if len(paths) == 1:
    index = CorpusIndex.load(paths[0])
else:
    from refdec import ShardedIndex
    index = ShardedIndex.load_many(paths)
prompt, rest = np.load(prompt_path), np.load(rest_path)

def replay(n, times=None):
    # batch requests, request i reading the file from i * stride: one engine step drafts for all
    doc = np.concatenate([prompt, rest])
    stride = (len(doc) - len(prompt) - n * accept) // max(batch - 1, 1) if batch > 1 else 0
    requests = []
    for i in range(batch):
        proposer = Proposer(index=index, max_depth=64)
        proposer.start(doc[i * stride:i * stride + len(prompt)])
        requests.append((proposer, doc[i * stride + len(prompt):]))
    for pos in range(0, n * accept, accept):
        t0 = time.perf_counter()
        for proposer, text in requests:
            proposer.propose(budget)
            proposer.accept(text[pos:pos + accept])
        if times is not None:
            times.append(time.perf_counter() - t0)

if mode == "count":  # under callgrind, instrumented from here on: the steps alone, untimed
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True)
    replay(steps)
    sys.exit(0)
replay(warmup)
times = []
replay(steps, times)
if times:
    us = np.asarray(times) * 1e6
    print(json.dumps({"p50": float(np.median(us)), "p99": float(np.percentile(us, 99)), "mean": float(us.mean())}))
"""


def replay_data(workdir: str, prompt_len: int, need: int, shard_counts: list[int]) -> dict[int, tuple[str, str, str]]:
    """Saves the stdlib corpus index (held-out files excluded), split into each number of
    shards, and the longest held-out file as prompt + continuation; returns
    {shards: (comma-separated index paths, prompt path, continuation path)}."""
    from refdec import CorpusIndex

    documents, _ = data.read_stdlib(tests=True)  # index_bench's corpus and held-out files
    tokenizer = tokens.tokenizer()
    arrays = tokens.token_ids([doc.text for doc in documents], tag="stdlib")
    corpus_idx, held_idx = data.held_out_split(documents)
    corpus = [arrays[i] for i in corpus_idx]
    prompt_path, rest_path = os.path.join(workdir, "prompt.npy"), os.path.join(workdir, "rest.npy")
    doc = max((arrays[i] for i in held_idx), key=len)
    if len(doc) < prompt_len + need:
        raise SystemExit(f"the longest held-out file has {len(doc)} tokens, fewer than {prompt_len + need}")
    np.save(prompt_path, doc[:prompt_len].astype(np.int32))
    np.save(rest_path, doc[prompt_len:].astype(np.int32))
    replays = {}
    for n in shard_counts:
        bounds = np.linspace(0, len(corpus), n + 1).astype(int)
        paths = []
        for shard, (begin, end) in enumerate(zip(bounds, bounds[1:])):
            paths.append(os.path.join(workdir, f"stdlib-{shard}-of-{n}.refdec"))
            CorpusIndex.build(corpus[begin:end], show_progress=False, vocab_size=len(tokenizer),
                              growable=False).save(paths[-1])
        replays[n] = (",".join(paths), prompt_path, rest_path)
    return replays


def run_child(repo: str, replay, budget: int, accept: int, steps: int, warmup: int, callgrind: bool,
              batch: int = 1) -> dict:
    # The child runs in the build's checkout, which comes first on its path ('' for -c).
    args = [sys.executable, "-c", _CHILD, *replay, str(budget), str(accept)]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONHASHSEED="0", PYTHONPATH=repo)
    if not callgrind:
        out = subprocess.run(args + [str(steps), str(warmup), "time", str(batch)], capture_output=True, text=True,
                             env=env, cwd=repo, check=True)
        return json.loads(out.stdout)
    counts = []
    for n in (0, steps):  # instrumented from the replay on (the imports run uninstrumented)
        grind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=/dev/null", *args,
                 str(n), "0", "count", str(batch)]
        out = subprocess.run(grind, capture_output=True, text=True, env=env, cwd=repo, check=True)
        line = next(x for x in out.stderr.splitlines() if "Collected" in x)
        counts.append(int(line.split()[-1].replace(",", "")))
    return {"instructions_per_step": (counts[1] - counts[0]) / steps / batch}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="append", required=True, metavar="NAME=PATH",
                    help="a checkout with refdec/_C built in place (repeat; the first is the baseline)")
    ap.add_argument("--shape", action="append", default=None, metavar="BUDGET:ACCEPT",
                    help="propose(BUDGET) + accept(ACCEPT tokens); default 32:1 and 16:2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--shards", default="1", help="comma-separated shard counts of the corpus (default 1)")
    ap.add_argument("--batch", type=int, default=1,
                    help="concurrent requests per engine step (the step times all of them; per request = / batch)")
    ap.add_argument("--callgrind", action="store_true", help="instructions per step (one round, 2,000 steps)")
    args = ap.parse_args(argv)
    shard_counts = [int(n) for n in args.shards.split(",")]
    builds = [(f"{name}" if len(shard_counts) == 1 else f"{name}/{n} shards", path, n)
              for name, path in (b.split("=", 1) for b in args.build) for n in shard_counts]
    shapes = [tuple(int(x) for x in s.split(":")) for s in (args.shape or ["32:1", "16:2"])]
    if args.callgrind:
        args.rounds, args.steps = 1, min(args.steps, 2_000)
    need = max(args.warmup, args.steps) * max(a for _, a in shapes)

    results: dict = {name: {f"{b}:{a}": [] for b, a in shapes} for name, _, _ in builds}
    with tempfile.TemporaryDirectory() as workdir:
        replays = replay_data(workdir, args.prompt_len, need, shard_counts)
        for round_idx in range(args.rounds):
            order = builds if round_idx % 2 == 0 else builds[::-1]
            for budget, accept in shapes:
                for name, path, n in order:
                    r = run_child(os.path.abspath(path), replays[n], budget, accept, args.steps, args.warmup,
                                  args.callgrind, args.batch)
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
    out = report.write_result(report.result_path(None, "step_ab", timestamp=False),
                              {"args": vars(args), "builds": {name: path for name, path, _ in builds},
                               "summary": summary, "rounds": results})
    print(f"\nwrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
