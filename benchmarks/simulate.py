"""Model-free drafting simulator: how many tokens per verification step would a
drafter reach if the target model always produced a known output?

For each (prompt, true output) pair the drafter is replayed step by step:

    1. it proposes a tree (or chain) of at most ``budget`` nodes;
    2. accepted = the longest root path of the tree that matches the true
       continuation, plus one bonus token (the target's own next token), so a
       step always advances by >= 1 token (never past the end of the output);
    3. the drafter is told the advanced tokens (``accept``).

tokens/step = output tokens / steps, pooled over the cases of a workload.
Proposal latency = the time of propose + accept per step (p50 / p99, µs).

    python benchmarks/simulate.py --workloads edits,humaneval,summarization,rag \\
        --budgets 8,16,32,64 [--methods refdec,prompt-lookup,oracle-chain] [--limit N] [--json OUT]

Methods:
    refdec          refdec.Proposer (live context + per-request references + the
                    workload's corpus index, if any)
    prompt-lookup   last earlier occurrence of the trailing 3-, else 2-, else
                    1-gram; one chain of k = budget tokens (DESIGN.md's rule)
    hf-prompt-lookup transformers' prompt_lookup_num_tokens exactly: 2..1-grams,
                    the first (leftmost) occurrence
    oracle-chain    longest k-capped run of the true continuation found verbatim
                    in prompt + output so far (bound for any copied chain)
    arctic          ArcticInference SuffixDecodingCache (if importable)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import baselines  # noqa: E402
import workloads  # noqa: E402

OUT_DIR = Path(__file__).resolve().parent / "out"
DEFAULT_METHODS = ("refdec", "prompt-lookup", "hf-prompt-lookup", "oracle-chain", "arctic")


# ---------------------------------------------------------------- accounting

def accepted_length(tree, truth: list, pos: int) -> int:
    """Length of the longest root path of ``tree`` whose tokens equal
    ``truth[pos:]`` (``truth`` a list of ints). Parents precede children, so one
    forward pass suffices."""
    n = len(tree)
    remaining = len(truth) - pos
    if n == 0 or remaining <= 0:
        return 0
    tokens = tree.token_ids.tolist()
    parents = tree.parents.tolist()
    depth = [0] * n
    on_path = [False] * n
    best = 0
    for node_idx in range(n):
        parent = parents[node_idx]
        if parent < 0:
            d, parent_ok = 1, True
        else:
            d, parent_ok = depth[parent] + 1, on_path[parent]
        depth[node_idx] = d
        if parent_ok and d <= remaining and tokens[node_idx] == truth[pos + d - 1]:
            on_path[node_idx] = True
            if d > best:
                best = d
    return best


@dataclass
class Replay:
    """The replay of one drafter on one case.

    accepted   int list [steps]: draft tokens accepted per step (bonus excluded)
    advanced   int list [steps]: output tokens emitted per step (>= 1)
    nodes      int list [steps]: tree size proposed per step
    latency_ns int list [steps]: propose + accept time per step
    """

    output_tokens: int
    accepted: list = field(default_factory=list)
    advanced: list = field(default_factory=list)
    nodes: list = field(default_factory=list)
    latency_ns: list = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.advanced)


def replay(proposer, prompt, output, budget: int) -> Replay:
    """Replay ``proposer`` (start / propose / accept) over one (prompt, output)."""
    truth = np.asarray(output, dtype=np.int32)
    truth_list = truth.tolist()
    m = len(truth_list)
    rec = Replay(output_tokens=m)
    t0 = time.perf_counter_ns()
    proposer.start(np.asarray(prompt, dtype=np.int32))
    rec.start_ns = time.perf_counter_ns() - t0
    pos = 0
    while pos < m:
        t0 = time.perf_counter_ns()
        tree = proposer.propose(budget)
        t1 = time.perf_counter_ns()
        if len(tree) > budget:
            raise ValueError(f"{type(proposer).__name__} proposed {len(tree)} nodes over the budget {budget}")
        acc = accepted_length(tree, truth_list, pos)
        adv = min(acc + 1, m - pos)
        t2 = time.perf_counter_ns()
        proposer.accept(truth[pos:pos + adv])
        t3 = time.perf_counter_ns()
        rec.accepted.append(acc)
        rec.advanced.append(adv)
        rec.nodes.append(len(tree))
        rec.latency_ns.append((t1 - t0) + (t3 - t2))
        pos += adv
    return rec


def summarize(replays: list) -> dict:
    tokens = sum(r.output_tokens for r in replays)
    steps = sum(r.steps for r in replays)
    lat = np.concatenate([np.asarray(r.latency_ns, dtype=np.int64) for r in replays]) if replays else np.zeros(0)
    nodes = np.concatenate([np.asarray(r.nodes) for r in replays]) if replays else np.zeros(0)
    return {
        "cases": len(replays),
        "output_tokens": tokens,
        "steps": steps,
        "tokens_per_step": tokens / steps if steps else float("nan"),
        "mean_nodes": float(nodes.mean()) if nodes.size else 0.0,
        "latency_us_p50": float(np.percentile(lat, 50)) / 1e3 if lat.size else 0.0,
        "latency_us_p99": float(np.percentile(lat, 99)) / 1e3 if lat.size else 0.0,
        "start_ms_mean": float(np.mean([getattr(r, "start_ns", 0) for r in replays])) / 1e6 if replays else 0.0,
    }


# ---------------------------------------------------------------- methods

def refdec_available() -> bool:
    try:
        import refdec

        return hasattr(refdec, "Proposer")
    except Exception:
        return False


def method_factory(name: str, workload, corpus=None, max_depth: int = 64):
    """A function case -> a fresh drafter for that case, or None if unavailable."""
    if name == "prompt-lookup":
        return lambda case: baselines.PromptLookup(max_ngram=3, occurrence="last")
    if name == "hf-prompt-lookup":
        return lambda case: baselines.PromptLookup(max_ngram=2, occurrence="first")
    if name == "oracle-chain":
        return lambda case: baselines.OracleChain(case.output)
    if name == "refdec":
        if not refdec_available():
            return None
        import refdec

        return lambda case: refdec.Proposer(index=corpus, references=list(case.references) or None,
                                            max_depth=max_depth)
    if name == "arctic":
        if not baselines.arctic_available():
            return None
        # Arctic's per-request tree covers prompt + output; references of the
        # edits workload are inside the prompt already. No global corpus.
        return lambda case: baselines.ArcticSuffix()
    raise ValueError(f"unknown method {name!r}; expected one of {DEFAULT_METHODS}")


def run(workload_names, methods, budgets, limit=None, progress=True) -> dict:
    results = {}
    for wname in workload_names:
        wl = workloads.load_workload(wname, limit)
        if not wl.cases:
            print(f"[{wname}] no cases (data or cached outputs missing): skipped", file=sys.stderr)
            continue
        corpus = None
        if wl.corpus and "refdec" in methods and refdec_available():
            t0 = time.time()
            corpus = workloads.corpus_index(wl.corpus, show_progress=progress)
            print(f"[{wname}] corpus {wl.corpus} ready in {time.time() - t0:.1f}s", file=sys.stderr)
        results[wname] = {"cases": len(wl.cases),
                          "output_tokens": int(sum(len(c.output) for c in wl.cases)),
                          "prompt_tokens": int(sum(len(c.prompt) for c in wl.cases)),
                          "corpus": wl.corpus, "methods": {}}
        for mname in methods:
            make = method_factory(mname, wl, corpus)
            if make is None:
                print(f"[{wname}] method {mname} unavailable: skipped", file=sys.stderr)
                continue
            per_budget = {}
            for budget in budgets:
                t0 = time.time()
                reps = [replay(make(case), case.prompt, case.output, budget) for case in wl.cases]
                per_budget[str(budget)] = summarize(reps)
                if progress:
                    s = per_budget[str(budget)]
                    print(f"[{wname}] {mname:>16} k={budget:<3} {s['tokens_per_step']:6.2f} tok/step  "
                          f"p50 {s['latency_us_p50']:.0f}us p99 {s['latency_us_p99']:.0f}us "
                          f"({time.time() - t0:.1f}s)", file=sys.stderr)
            results[wname]["methods"][mname] = per_budget
    return results


def markdown(results: dict, budgets) -> str:
    lines = []
    head = "| workload | method | " + " | ".join(f"k={b}" for b in budgets) + " | p50 / p99 µs (k=max) |"
    lines += [head, "|" + "---|" * (len(budgets) + 3)]
    for wname, w in results.items():
        meth = w["methods"]
        for mname, per in meth.items():
            cells = [f"{per[str(b)]['tokens_per_step']:.2f}" if str(b) in per else "" for b in budgets]
            last = per[str(budgets[-1])]
            lines.append(f"| {wname} | {mname} | " + " | ".join(cells)
                         + f" | {last['latency_us_p50']:.0f} / {last['latency_us_p99']:.0f} |")
        if "refdec" in meth and "oracle-chain" in meth:
            cells = [f"{meth['refdec'][str(b)]['tokens_per_step'] / meth['oracle-chain'][str(b)]['tokens_per_step']:.2f}"
                     for b in budgets]
            lines.append(f"| {wname} | refdec / oracle | " + " | ".join(cells) + " | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="edits,humaneval,summarization,rag")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    ap.add_argument("--budgets", default="8,16,32,64")
    ap.add_argument("--limit", type=int, default=None, help="cases per workload")
    ap.add_argument("--quick", action="store_true", help="5 cases per workload, budgets 8,32")
    ap.add_argument("--json", default=None, help="output JSON path (default benchmarks/out/simulate-<time>.json)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    budgets = [int(b) for b in args.budgets.split(",") if b]
    limit = args.limit
    if args.quick:
        budgets = [8, 32] if args.budgets == ap.get_default("budgets") else budgets
        limit = limit or 5
    wnames = [w for w in args.workloads.split(",") if w]
    methods = [m for m in args.methods.split(",") if m]
    if not workloads.data_dir().exists():
        print(f"data directory {workloads.data_dir()} not found (set REFDEC_DATA): nothing to do", file=sys.stderr)
        return 0
    results = run(wnames, methods, budgets, limit, progress=not args.quiet)
    print(markdown(results, budgets))
    out = Path(args.json) if args.json else OUT_DIR / f"simulate-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"budgets": budgets, "limit": limit, "results": results}, indent=1))
    print(f"\nJSON: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
