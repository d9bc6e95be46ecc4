"""Drafting step latency of several refdec builds, side by side in one run.

Each build is a checkout with its extension built in place (``python setup.py build_ext
--inplace``; e.g. ``git worktree add /tmp/old 807ba70``). The same replay as
``index_bench.py`` (the stdlib corpus index, a held-out file fed token by token after a
512-token prompt) runs in a fresh process per (build, round), the builds alternating
within each round so that load on a shared machine hits them alike:

    step = Proposer.propose(budget) + Proposer.accept(the next `accept` tokens of the file)

The child imports ``refdec.proposer`` from the build without ``refdec/__init__`` (no torch).
Reported per build and step shape: the median over rounds of the per-round p50 / p99 / mean
(µs). ``--callgrind`` instead counts instructions per step under valgrind (steps N minus
steps 0: repeatable under load). ``--shards 1,4`` also runs each build on the corpus split
into that many index files (contiguous runs of documents; ``ShardedIndex.load_many``).
``--batch 64`` drafts for 64 requests per engine step (request i reads the file from its own
offset), the serving case: the time of the whole step is reported.

    python benchmarks/step_ab.py --build before=/tmp/old --build after=. [--rounds 7] [--callgrind]
    python benchmarks/step_ab.py --build after=. --shards 1,4
    python benchmarks/step_ab.py --build before=/tmp/old --build after=. --batch 64 --shape 16:2 --steps 2000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import held_out_split, machine_info, read_stdlib_corpus, tokenize_cached, write_json  # noqa: E402

_CHILD = r"""
import json, sys, time, types
repo, index_paths, prompt_path, rest_path, budget, accept, steps, warmup, mode, batch = sys.argv[1:11]
batch = int(batch)
budget, accept, steps, warmup = int(budget), int(accept), int(steps), int(warmup)
package = types.ModuleType("refdec")
package.__path__ = [repo + "/refdec"]
sys.modules["refdec"] = package
import numpy as np
from refdec.index import CorpusIndex
from refdec.proposer import Proposer
paths = index_paths.split(",")
if len(paths) == 1:
    index = CorpusIndex.load(paths[0])
else:
    from refdec.index import ShardedIndex
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

if mode == "count":  # under callgrind: the steps alone, untimed
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
    from refdec.index import CorpusIndex
    from refdec.models import load_tokenizer

    documents, _ = read_stdlib_corpus()
    tokenizer = load_tokenizer()
    arrays = tokenize_cached(documents, tokenizer, tag="stdlib")
    corpus_idx, held_idx = held_out_split(documents)
    corpus = [arrays[i] for i in corpus_idx]
    prompt_path, rest_path = os.path.join(workdir, "prompt.npy"), os.path.join(workdir, "rest.npy")
    doc = max((arrays[i] for i in held_idx), key=len)
    if len(doc) < prompt_len + need:
        raise SystemExit(f"the longest held-out file has {len(doc)} tokens, fewer than {prompt_len + need}")
    np.save(prompt_path, doc[:prompt_len].astype(np.int32))
    np.save(rest_path, doc[prompt_len:].astype(np.int32))
    data = {}
    for n in shard_counts:
        bounds = np.linspace(0, len(corpus), n + 1).astype(int)
        paths = []
        for shard, (begin, end) in enumerate(zip(bounds, bounds[1:])):
            paths.append(os.path.join(workdir, f"stdlib-{shard}-of-{n}.refdec"))
            CorpusIndex.build(corpus[begin:end], show_progress=False, vocab_size=len(tokenizer),
                              growable=False).save(paths[-1])
        data[n] = (",".join(paths), prompt_path, rest_path)
    return data


def run_child(repo: str, data, budget: int, accept: int, steps: int, warmup: int, callgrind: bool,
              batch: int = 1) -> dict:
    args = [sys.executable, "-c", _CHILD, repo, *data, str(budget), str(accept)]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    if not callgrind:
        out = subprocess.run(args + [str(steps), str(warmup), "time", str(batch)], capture_output=True, text=True,
                             env=env, check=True)
        return json.loads(out.stdout)
    counts = []
    for n in (0, steps):
        grind = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"] + args + [str(n), "0", "count",
                                                                                              str(batch)]
        out = subprocess.run(grind, capture_output=True, text=True, env=env, check=True)
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
        data = replay_data(workdir, args.prompt_len, need, shard_counts)
        for round_idx in range(args.rounds):
            order = builds if round_idx % 2 == 0 else builds[::-1]
            for budget, accept in shapes:
                for name, path, n in order:
                    r = run_child(os.path.abspath(path), data[n], budget, accept, args.steps, args.warmup,
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
    out = write_json("step_ab", {"command": " ".join([Path(sys.executable).name] + sys.argv), "args": vars(args),
                                 "builds": {name: path for name, path, _ in builds}, "machine": machine_info(),
                                 "summary": summary,
                                 "rounds": results})
    print(f"\nwrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
