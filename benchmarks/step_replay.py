"""The drafting-step replay one refdec build runs in a child process (``engine_ab.py --step``).

The same replay as ``index_bench.py``: the stdlib corpus index (held-out files excluded, optionally
split into shards: contiguous runs of documents, ``ShardedIndex.load_many``), the longest held-out
file fed after a ``prompt_len``-token prompt, ``batch`` requests each reading it from its own
offset, one engine step drafting for all of them:

    step = Proposer.propose(budget) + Proposer.accept(the next `accept` tokens of the file)

The child runs in the build's checkout and imports refdec's public names from it. Timed: p50 /
p99 / mean µs of a step; under valgrind (``callgrind=True``): instructions per step and request
(steps N minus steps 0, the imports uninstrumented: repeatable under load).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from benchmarks import data, tokens

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
