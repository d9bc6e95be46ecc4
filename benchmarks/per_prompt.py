"""End-to-end runs on transformers one prompt at a time (``e2e.py``'s default run): every method
on every prompt, the ratios to the timing reference and the identity check.

Each prompt runs every method once (the order rotates from prompt to prompt); the ratio to the
timing reference (hf-greedy, or hf-sample) in tokens/s is taken per prompt, then summarised
(median, min, max). On a shared machine only these ratios mean something, not absolute times.
Every method's output must be token-identical to hf-greedy's: a mismatch is printed loudly and
the run's exit status is 1.

Sampling (``--sample``): every method samples with the same temperature / top-k / top-p;
refdec's methods with the same seed, so each must give exactly the tokens of refdec-0 (refdec's
plain sampler: the identity reference then); HF's sampler draws other tokens from the same
distribution, so its speed is compared in tokens/s (the timing reference: hf-sample).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass

from benchmarks import corpora, report, workloads
from benchmarks.methods import Runner, first_difference

DEFAULT_WORKLOADS = ("edits", "summarization", "rag", "humaneval", "mtbench")
DEFAULT_METHODS = ("hf-greedy", "hf-pld", "refdec-auto", "refdec-chain", "refdec-16", "refdec-64")
SAMPLE_METHODS = ("hf-sample", "refdec-0", "refdec-auto", "refdec-chain")


@dataclass
class Plan:
    """What a run compares: the methods, the timing reference (``baseline``), the identity
    reference and the sampling settings (None: greedy)."""

    methods: list
    baseline: str = "hf-greedy"
    identity_ref: str = "hf-greedy"
    sampling: dict | None = None


def plan(methods: str | None, sample: bool, temperature: float, top_k, top_p, seed: int) -> Plan:
    """The plan of ``--methods`` (comma-separated; None: the defaults) and the sampling flags;
    ValueError for a method that cannot run so."""
    chosen = [m for m in (methods or ",".join(SAMPLE_METHODS if sample else DEFAULT_METHODS)).split(",") if m]
    if sample:
        greedy_only = [m for m in chosen if m in ("hf-greedy", "hf-pld")]
        if greedy_only:
            raise ValueError(f"--sample: {greedy_only} decode greedily; use hf-sample")
        if not temperature > 0:
            raise ValueError(f"--temperature must be > 0, got {temperature}")
        out = Plan(chosen, "hf-sample", "refdec-0",
                   dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed))
    elif "hf-sample" in chosen:
        raise ValueError("hf-sample needs --sample")
    else:
        out = Plan(chosen)
    for ref in dict.fromkeys((out.identity_ref, out.baseline)):
        if ref not in out.methods:
            out.methods.insert(0, ref)
    return out


def run(model, tok, plan: Plan, load, workload_names: list, limits: dict, only: dict, max_new_tokens: int,
        edits_max_new_tokens: int | None) -> dict:
    """Every prompt of the workloads through every method; ``load(name, limit)`` gives a workload,
    ``only`` {method: the workloads it runs on}. The payload of the result."""
    import torch

    methods, baseline, identity_ref = plan.methods, plan.baseline, plan.identity_ref
    runner = Runner(model, tok, max_new_tokens, edits_max_new_tokens, plan.sampling)
    # warm-up (kernels, allocator)
    warm = load("edits", 1).cases if "edits" in workload_names else (load("mtbench", 1).cases
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
    if mismatches:
        print(f"!!!!! {len(mismatches)} OUTPUT MISMATCHES: {mismatches}", file=sys.stderr)
    # diagnostics from the decoder's "auto" policy (a private attribute: absent, it is left out)
    auto_chosen = {f"{m}/{w}": budget.chosen for (m, w), d in runner.decoders.items()
                   if (budget := getattr(d, "_auto_budget", None)) is not None}
    return {"methods": methods, "baseline": baseline, "identity_reference": identity_ref,
            "workloads": workload_names, "limits": limits, "records": records, "summary": summary,
            "markdown": table, "mismatches": mismatches, "auto_chosen_nodes": auto_chosen,
            "seconds": time.time() - started}


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


def resummarize(path) -> int:
    """Recomputes the summary and the table of a results file (``--resummarize``); its exit status."""
    data = json.loads(path.read_text())
    baseline = data.get("baseline", "hf-greedy")
    data["summary"] = summarize(data["records"], data["methods"], data["workloads"], baseline)
    data["markdown"] = markdown(data["summary"], data["methods"], data["workloads"], baseline)
    report.write_json(path, data)
    print(data["markdown"])
    return 1 if data.get("mismatches") else 0
