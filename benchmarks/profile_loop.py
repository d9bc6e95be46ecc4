"""Where a refdec step's time goes, on the real model.

    python -m benchmarks.profile_loop [--threads 1] [--max-new-tokens 64] [--budgets 16,auto]
        [--e2e benchmarks/out/e2e-....json] [--json OUT]

1. Per-step split (ms/step: propose / prepare / forward / accept) of
   ``SpeculativeDecoder.generate`` on an edit prompt and a chat prompt, for two
   verification forwards: the model's own (``model``: ``F.linear`` head on every
   row) and the lazy head refdec uses on a CPU (``lazy-head``: the head only on
   the rows the acceptance walk visits, refdec.transformers.lazy_head.LazyRowLogits); they
   alternate and must give the same tokens.
2. A torch.profiler table (top ops by self CPU time) of one generate call: how
   much of a step is the LM head, attention, the rest, and the host side.
3. The cost curve (refdec.transformers.calibration) and the projected speed-up on a flat,
   GPU-like cost curve: if verifying n nodes cost as much as one token, the
   speed-up over plain decoding would be tokens/pass (from --e2e results).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks import report, workloads


def split_ms(stats) -> dict:
    steps = max(1, stats.forward_passes - 1)
    return {"steps": steps, "tokens_per_pass": round(stats.tokens_per_pass, 2),
            "propose": 1e3 * stats.propose_seconds / steps, "prepare": 1e3 * stats.prepare_seconds / steps,
            "forward": 1e3 * stats.forward_seconds / steps, "accept": 1e3 * stats.accept_seconds / steps,
            "prefill_s": stats.prefill_seconds, "wall_s": stats.wall_seconds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--budgets", default="16,auto")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--e2e", default=None, help="an e2e.py results JSON, for the projected GPU speed-up")
    ap.add_argument("--no-profiler", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from refdec import Proposer, SpeculativeDecoder
    from refdec.models import load_default
    from refdec.transformers.calibration import auto_cost_curve

    model, tok = load_default()
    curve = auto_cost_curve(model)
    result = {"threads": args.threads, "cost_curve": curve.to_json()}
    base = curve(0)
    print("cost curve (forward seconds vs draft nodes, relative to plain decoding"
          + (f"; backbone only, + {curve.head_chunk_seconds * 1e3:.1f} ms per head chunk of "
             f"{curve.head_chunk_rows} visited rows" if curve.lazy_head else "") + "):")
    for n, s in zip(curve.nodes, curve.seconds):
        print(f"  {n:3d} nodes: {s * 1e3:7.1f} ms  ({curve(n) / base:.2f}x with one head chunk)")

    edit = workloads.load_workload("edits", 1).cases[0]
    chat = workloads.load_workload("mtbench", 1).cases[0]
    cases = {"edits": (edit, True), "mtbench": (chat, False)}
    budgets = [b if b == "auto" else int(b) for b in args.budgets.split(",")]

    def factory(editing):
        return lambda index, refs, depth: Proposer(index=index, references=refs or None, max_depth=depth,
                                                   cursor=True if editing else None)

    rows = []
    for name, (case, editing) in cases.items():
        refs = [r.tolist() for r in case.references] or None
        for budget in budgets:
            variants = ("model", "lazy-head")
            results = {v: [] for v in variants}
            tokens = {}
            for rep in range(args.repeats):
                for variant in (variants if rep % 2 == 0 else variants[::-1]):
                    dec = SpeculativeDecoder(model, tok, proposer_factory=factory(editing), prefix_cache=0)
                    dec.backend.lazy_head = variant == "lazy-head"
                    out = dec.generate(case.prompt.tolist(), references=refs, max_new_tokens=args.max_new_tokens,
                                       max_draft_tokens=budget)
                    results[variant].append({**split_ms(out.stats), "head_rows": out.stats.head_rows})
                    tokens[variant] = out.sequences[0].tolist()
            same = all(t == tokens["model"] for t in tokens.values())
            for variant, splits in results.items():
                med = {k: statistics.median(s[k] for s in splits) for k in splits[0]}
                rows.append({"workload": name, "budget": budget, "variant": variant, "same_tokens": same, **med})
                print(f"{name:8s} budget={budget!s:5s} {variant:9s}: "
                      f"propose {med['propose']:.2f}  prepare {med['prepare']:.2f}  forward {med['forward']:.1f}  "
                      f"accept {med['accept']:.2f} ms/step; {med['tokens_per_pass']:.2f} tok/pass; "
                      f"head rows {med['head_rows']:.0f}; wall {med['wall_s']:.1f} s (prefill {med['prefill_s']:.1f} s)"
                      + ("" if same else "  !!! tokens differ"), flush=True)
    result["split"] = rows

    if not args.no_profiler:
        from torch.profiler import ProfilerActivity, profile

        dec = SpeculativeDecoder(model, tok, proposer_factory=factory(True), prefix_cache=0)
        refs = [r.tolist() for r in edit.references]
        dec.generate(edit.prompt.tolist(), references=refs, max_new_tokens=8, max_draft_tokens=16)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            dec.generate(edit.prompt.tolist(), references=refs, max_new_tokens=32, max_draft_tokens=16)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18)
        print(table)
        result["profiler_table"] = table

    if args.e2e:
        data = json.loads(Path(args.e2e).read_text())
        proj = {}
        for key, s in data["summary"].items():
            if s.get("tokens_per_pass_median"):
                proj[key] = s["tokens_per_pass_median"]
        result["projected_flat_curve_speedup"] = proj
        print("projected speed-up on a flat (GPU-like) cost curve = tokens/pass:")
        for key, v in proj.items():
            print(f"  {key}: {v:.2f}x")

    path = report.write_result(report.result_path(args.json, "profile"), result, argv=argv)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
