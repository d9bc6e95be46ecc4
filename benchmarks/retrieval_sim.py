"""Does request-time retrieval (``generate(..., retrieve=k)``) raise tokens/step?

Model-free, with simulate.py's replay harness (the drafter is told the true
output step by step; tokens/step = output tokens / steps). For each case the k
documents of the stdlib corpus index most similar to the prompt
(``CorpusIndex.retriever().top_k``) become extra per-request references, as
``refdec.generate`` does, next to the live context and the whole corpus.

    python -m benchmarks.retrieval_sim [--workloads humaneval,rag,stdlib-tail]
        [--budgets 32,64] [--k 1,3] [--score containment] [--limit N] [--json OUT]

Methods per workload:
    nocorpus          live context + the case's references only
    corpus            + the stdlib corpus index (simulate.py's ``refdec``)
    corpus+rK         + the K retrieved documents as references
    rK-only           the K retrieved documents, no corpus index

Workloads: simulate.py's (humaneval: HumanEval prompts, canonical solutions;
rag: Spec-Bench RAG prompts, Gemma 3 270M's greedy outputs), plus
``stdlib-tail``: a stdlib file's first 256 tokens as the prompt, its next 256
as the output. The file itself is in the index, so this is a sanity check
(retrieval should find the right document: ``r1-only`` should reach what the
whole corpus reaches), not a measure of gain.

The figures: benchmarks/RESULTS.md (section 3, "Retrieval").
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from benchmarks import corpora, report, simulate, workloads


def stdlib_tail_workload(limit: int | None, index) -> workloads.Workload:
    """Every 8th stdlib file with >= 1024 tokens: prompt = its first 256 tokens, output = the next 256."""
    cases = []
    for doc_idx in range(0, index.num_documents, 8):
        doc = index.document(doc_idx)
        if doc.size < 1024:
            continue
        cases.append(workloads.Case(prompt=doc[:256].copy(), output=doc[256:512].copy(), name=f"stdlib/{doc_idx}"))
        if limit and len(cases) >= limit:
            break
    return workloads.Workload("stdlib-tail", cases, corpus="stdlib")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="humaneval,rag,stdlib-tail")
    ap.add_argument("--budgets", default="32,64")
    ap.add_argument("--k", default="1,3", help="documents retrieved per prompt (comma-separated)")
    ap.add_argument("--score", default="containment", choices=("containment", "jaccard"))
    ap.add_argument("--limit", type=int, default=None, help="cases per workload")
    ap.add_argument("--reference-params", default=None, metavar="WEIGHT:HALF_LEN",
                    help="Proposer SourceParams of the reference source (where the retrieved documents draft); "
                         "default the Proposer's (1.0:2.0); the corpus source uses 0.9:4.0")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import torch

    import refdec
    import refdec.drafting.proposer

    torch.set_num_threads(1)  # as simulate.py: the replay runs the proposer alone
    params = None
    if args.reference_params:
        weight, half_len = (float(x) for x in args.reference_params.split(":"))
        params = {"reference": refdec.drafting.proposer.SourceParams(weight, half_len)}
    budgets = [int(b) for b in args.budgets.split(",")]
    ks = [int(k) for k in args.k.split(",")]
    index = corpora.corpus_index("stdlib")
    t0 = time.time()
    retriever = index.retriever()  # the signatures stored in the cached index file
    print(f"retriever ready in {time.time() - t0:.1f}s: {retriever!r}", file=sys.stderr)

    results = {}
    for wname in args.workloads.split(","):
        wl = stdlib_tail_workload(args.limit, index) if wname == "stdlib-tail" else \
            workloads.load_workload(wname, args.limit)
        if not wl.cases:
            print(f"[{wname}] no cases: skipped", file=sys.stderr)
            continue
        t0 = time.time()
        hits = [retriever.top_k(case.prompt, max(ks), score=args.score) for case in wl.cases]
        retrieve_ms = (time.time() - t0) * 1e3 / len(wl.cases)
        docs = {d: index.document(d) for h in hits for d, _ in h}
        res = {"cases": len(wl.cases), "retrieve_ms_mean": retrieve_ms,
               "mean_top1_score": float(np.mean([h[0][1] if h else 0.0 for h in hits])), "methods": {}}
        methods = {"nocorpus": (None, 0), "corpus": (index, 0)}
        for k in ks:
            methods[f"corpus+r{k}"] = (index, k)
            methods[f"r{k}-only"] = (None, k)
        for mname, (corpus, k) in methods.items():
            per_budget = {}
            for budget in budgets:
                t0 = time.time()
                reps = []
                for case, h in zip(wl.cases, hits):
                    refs = list(case.references) + [docs[d] for d, _ in h[:k]]
                    prop = refdec.Proposer(index=corpus, references=refs or None, max_depth=64, params=params)
                    reps.append(simulate.replay(prop, case.prompt, case.output, budget))
                s = simulate.summarize(reps)
                per_budget[str(budget)] = s
                print(f"[{wname}] {mname:>14} k={budget:<3} {s['tokens_per_step']:6.3f} tok/step "
                      f"by source {s['accepted_by_source']} ({time.time() - t0:.1f}s)", file=sys.stderr)
            res["methods"][mname] = per_budget
        results[wname] = res

    print("\n| workload | method | " + " | ".join(f"k={b}" for b in budgets) + " |")
    print("|---|---|" + "---|" * len(budgets))
    for wname, res in results.items():
        for mname, per_budget in res["methods"].items():
            cells = " | ".join(f"{per_budget[str(b)]['tokens_per_step']:.3f}" for b in budgets)
            print(f"| {wname} | {mname} | {cells} |")
    out = report.write_result(report.result_path(args.json, "retrieval_sim", timestamp=False),
                              {"args": vars(args), "results": results}, argv=argv)
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
