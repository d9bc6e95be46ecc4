"""Drafting simulation of a memory of past outputs: refdec's OutputMemory against ArcticInference's
global suffix tree, on request streams replayed in order (model-free, as ``benchmarks.simulate``).

    python -m benchmarks.memory_sim --budgets 16,64 --json benchmarks/out/memory_sim.json

Each stream is a list of requests, replayed one after another; after a request its true output
joins the memory (refdec: :class:`refdec.OutputMemory`; Arctic: ``SuffixDecodingCache``'s global
tree of finished responses, ``stop_request``), so a request drafts from every output before it.

Streams (edits-click.jsonl, in file order: 60 commits of one repository, many to the same files):

    edits           the edit prompt around the original file, the original as ``prediction``
                    (a reference), output = the updated file
    edits-noref     the same without ``prediction`` (the file only in the prompt)
    agent           a scripted agent's three tool calls per commit (``memory_sweep.AGENT_SYSTEM``):
                    ``read_file``, ``write_file`` with the updated file as a JSON string (after the
                    original as the tool's result), ``done`` with the commit's subject; the calls are
                    written by this script around the true files, not by a model

Methods: ``refdec`` (context and reference, no memory), ``refdec+memory`` (the same plus the
memory source), ``arctic`` (per-request tree over prompt + output and the global tree; its
defaults as ``baselines.ArcticSuffix``). Memory sizes: refdec's ``OutputMemory.nbytes``; Arctic's
global tree has no size query: the growth of a fresh process's resident memory while the same
outputs fill a ``SuffixDecodingCache`` (:func:`arctic_global_bytes`), an estimate. ``--bounded F``:
refdec's budget is F times the unbounded memory's bytes, and Arctic keeps as many requests as
refdec's memory held at the end (the same outputs kept).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks import baselines, data, simulate, tokens, workloads
from benchmarks.memory_sweep import AGENT_SYSTEM

STREAMS = ("edits", "edits-noref", "agent")


def agent_requests(rows: list[dict]) -> list[tuple[str, str]]:
    """(prompt text, output text) of a scripted agent's three calls per edit row, in order."""
    requests = []
    for row in rows:
        path, subject = row["path"], row["message"].splitlines()[0] if row["message"] else "done"
        task = f"{AGENT_SYSTEM}\n\nuser: Task: {row['message']} The file is {path}.\nassistant: "
        read = json.dumps({"tool": "read_file", "path": path})
        requests.append((task, read))
        seen = f"{task}{read}\nuser: Tool result for read_file {path}:\n{row['before']}\nassistant: "
        write = json.dumps({"tool": "write_file", "path": path, "content": row["after"]})
        requests.append((seen, write))
        done = json.dumps({"tool": "done", "summary": subject})
        requests.append((f"{seen}{write}\nuser: Tool result for write_file {path}: ok\nassistant: ", done))
    return requests


def load_stream(name: str, limit: int | None) -> list[workloads.Case]:
    """The requests of stream ``name`` (:data:`STREAMS`) as simulator cases, in order."""
    if name in ("edits", "edits-noref"):
        cases = workloads.load_edits(limit).cases
        if name == "edits-noref":
            cases = [workloads.Case(prompt=c.prompt, output=c.output, name=c.name) for c in cases]
        return cases
    if name == "agent":
        rows = data.edit_rows()
        rows = rows[:limit] if limit else rows
        pairs = agent_requests(rows)
        prompts = tokens.token_ids([p for p, _ in pairs], tag="agent-sim-prompt", bos=True)
        outputs = tokens.token_ids([o for _, o in pairs], tag="agent-sim-output")
        return [workloads.Case(prompt=p, output=o, name=f"call {i % 3}")
                for i, (p, o) in enumerate(zip(prompts, outputs))]
    raise ValueError(f"unknown stream {name!r}; expected one of {STREAMS}")


_ARCTIC_FILL = """
import sys, numpy as np
from arctic_inference.suffix_decoding import SuffixDecodingCache
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
outputs = np.load(sys.argv[1])
cache = SuffixDecodingCache(max_tree_depth=int(sys.argv[2]), max_cached_requests=100000)
before = rss()
for i, key in enumerate(outputs.files):
    cache.start_request(f"r{i}", np.zeros(0, dtype=np.int32))
    cache.add_active_response(f"r{i}", outputs[key])
    cache.stop_request(f"r{i}")
print(rss() - before)
"""


def arctic_global_bytes(outputs: list, max_tree_depth: int = 128) -> int:
    """Resident bytes a fresh process grows by while ``outputs`` (int32 arrays) fill Arctic's global
    tree as finished responses: an estimate of that tree's size."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "outputs.npz"
        np.savez(path, *[np.asarray(o, dtype=np.int32) for o in outputs])
        done = subprocess.run([sys.executable, "-c", _ARCTIC_FILL, str(path), str(max_tree_depth)],
                              capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


def replay_stream(method: str, cases: list, budget: int, memory_bytes: int | None = None,
                  arctic_requests: int = 100000) -> dict:
    """Replays ``cases`` in order with ``method``; the memory learns each output after its request.
    Returns simulate.summarize's figures plus the memory's size and the requests after the first's
    tokens per step."""
    import refdec

    memory = None
    arctic = None
    if method == "refdec+memory":
        memory = refdec.OutputMemory(max_bytes=memory_bytes if memory_bytes is not None else 1 << 40)
    if method == "arctic":
        arctic = baselines.ArcticSuffix()
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        arctic.cache = SuffixDecodingCache(max_tree_depth=arctic.depth, max_cached_requests=arctic_requests)
    replays = []
    for case in cases:
        if method == "arctic":
            drafter = arctic  # start() stops the previous request: its response joins the global tree
        else:
            drafter = refdec.Proposer(references=list(case.references) or None, max_depth=64,
                                      cursor=bool(case.references),
                                      memory=memory.automata() if memory is not None else None)
        replays.append(simulate.replay(drafter, case.prompt, case.output, budget))
        if memory is not None:
            memory.add(case.output)
    summary = simulate.summarize(replays)
    later = simulate.summarize(replays[1:])
    summary["tokens_per_step_after_first"] = later["tokens_per_step"]
    summary["per_request_tokens_per_step"] = [r.output_tokens / r.steps for r in replays]
    if memory is not None:
        summary["memory_bytes"] = memory.nbytes
        summary["memory_outputs_kept"] = len(cases) - memory.evicted_outputs
    if arctic is not None:
        arctic.cache.stop_request(arctic.rid)
        kept = cases[-arctic_requests:]
        summary["memory_bytes_rss_estimate"] = arctic_global_bytes([c.output for c in kept], arctic.depth)
    return summary


def run(streams, budgets, limit=None, bounded: float | None = None) -> dict:
    methods = ["refdec", "refdec+memory"] + (["arctic"] if baselines.arctic_available() else [])
    if "arctic" not in methods:
        print("arctic-inference is not importable: its rows are skipped", file=sys.stderr)
    results = {}
    for stream in streams:
        cases = load_stream(stream, limit)
        results[stream] = {"requests": len(cases), "output_tokens": int(sum(len(c.output) for c in cases)),
                           "budgets": {}}
        for budget in budgets:
            row = {}
            for method in methods:
                row[method] = replay_stream(method, cases, budget)
            if bounded is not None:
                unbounded = row["refdec+memory"]["memory_bytes"]
                row["refdec+memory bounded"] = replay_stream("refdec+memory", cases, budget,
                                                             memory_bytes=int(bounded * unbounded))
                kept = row["refdec+memory bounded"]["memory_outputs_kept"]
                if "arctic" in methods:
                    row["arctic bounded"] = replay_stream("arctic", cases, budget, arctic_requests=max(kept, 1))
            for method, s in row.items():
                size = s.get("memory_bytes", s.get("memory_bytes_rss_estimate"))
                print(f"[{stream}] k={budget:<3} {method:>22}: {s['tokens_per_step']:.2f} tok/step, after the "
                      f"first {s['tokens_per_step_after_first']:.2f}; memory "
                      f"{'-' if size is None else f'{size / 2**20:.1f} MiB'}; by source {s['accepted_by_source']}",
                      file=sys.stderr, flush=True)
            results[stream]["budgets"][str(budget)] = row
    return results


def markdown(results: dict) -> str:
    lines = ["| stream | k | refdec | refdec + memory | arctic (global tree) | memory MiB: refdec / arctic (RSS) |",
             "|---|---|---|---|---|---|"]
    for stream, r in results.items():
        for budget, row in r["budgets"].items():
            def cell(method):
                s = row.get(method)
                return "–" if s is None else f"{s['tokens_per_step']:.2f}"
            arctic = row.get("arctic", {}).get("memory_bytes_rss_estimate")
            lines.append(f"| {stream} ({r['requests']} requests) | {budget} | {cell('refdec')} | "
                         f"{cell('refdec+memory')} | {cell('arctic')} | "
                         f"{row['refdec+memory']['memory_bytes'] / 2**20:.1f} / "
                         f"{'–' if arctic is None else f'{arctic / 2**20:.1f}'} |")
            if "refdec+memory bounded" in row:
                b = row["refdec+memory bounded"]
                arctic_b = row.get("arctic bounded", {}).get("memory_bytes_rss_estimate")
                lines.append(f"| {stream}, bounded ({b['memory_outputs_kept']} last outputs kept) | {budget} | | "
                             f"{b['tokens_per_step']:.2f} | {cell('arctic bounded')} | "
                             f"{b['memory_bytes'] / 2**20:.1f} / "
                             f"{'–' if arctic_b is None else f'{arctic_b / 2**20:.1f}'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", default=",".join(STREAMS))
    ap.add_argument("--budgets", default="16,64")
    ap.add_argument("--limit", type=int, default=None, help="the first N edit rows")
    ap.add_argument("--bounded", type=float, default=None,
                    help="also run refdec's memory at this fraction of its unbounded size, Arctic at equal outputs")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    streams = [s for s in args.streams.split(",") if s]
    for s in streams:
        if s not in STREAMS:
            ap.error(f"--streams: unknown stream {s!r}; expected some of {','.join(STREAMS)}")
    try:
        budgets = [int(b) for b in args.budgets.split(",")]
    except ValueError:
        ap.error(f"--budgets must be comma-separated integers, got {args.budgets!r}")
    if any(b < 1 for b in budgets):
        ap.error(f"--budgets must be >= 1, got {args.budgets!r}")
    if args.bounded is not None and not 0 < args.bounded < 1:
        ap.error(f"--bounded must be in (0, 1), got {args.bounded}")
    results = run(streams, budgets, args.limit, args.bounded)
    print(markdown(results))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
