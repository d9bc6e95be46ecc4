"""One prepared run for a lent GPU (issue 27): what only a GPU can show, in one command under
8 minutes.

    python -m benchmarks.gpu [--device cuda] [--quick] [--sections equivalence,syncs,forward,loop,replay]
                             [--budget-s 450] [--json OUT]

Sections (each prints a markdown table and its wall time):

* ``equivalence``: tiny random Llama / Qwen2 / Gemma 3 (sliding-window layers) models
  (benchmarks/tiny_model.py, the test suite's) in float32 on the device: ``refdec`` greedy
  (``max_draft_tokens="auto"``, and 64 nodes with a reference holding the model's own output with
  one token changed) against ``model.generate`` greedy on repetitive prompts, token for token;
  the LM head as the decoder picks it for the device (lazy on a CPU, every row on a GPU).
* ``syncs``: host syncs of a decode, counted with ``torch.cuda.set_sync_debug_mode("warn")``
  (CUDA only; on a CPU "n/a": tests/test_step_syncs.py counts them there): per engine step (from
  one backbone forward's start to the next's, the model's own syncs inside its forward apart),
  in the prefill, and where they come from.
* ``forward``: random-weight bfloat16 models of Gemma 3 270M's and Llama-3-8B's shapes (no weights
  travel: the configs are written out below): one tree-verification forward over a cache of 1,024
  tokens against draft nodes 0..128, timed as ``refdec.transformers.calibration.measure`` times it (the engine's
  verification step: its inputs laid out on the device, the forward, every row's target with the
  head in row chunks, the walk, the result to the host; the median of the repeats) and with CUDA
  events around the backbone's forward (the head runs after it); and ``model.generate`` greedy's
  time per token after a prompt of that length.
* ``loop``: the engine's own time per step (propose + prepare + accept: walks, compaction,
  bookkeeping; ``DecodingStats``) against the forward's, on the Gemma-shape model, with drafts of
  8..128 nodes copied from a reference holding the model's own plain output.
* ``graphs``: fixed-shape steps (refdec.transformers.static_step): ``SpeculativeDecoder(cuda_graphs=True)``
  (on a CPU ``decoder.backend.static_shapes = True``, no graphs) on the tiny float32 models against
  ``model.generate`` (64-node drafts from a reference of the model's own output), token for token;
  then on the Gemma-shape bf16 model the loop section's decodes three ways -- dynamic shapes,
  fixed shapes eagerly, fixed shapes replayed as CUDA graphs -- tokens/s, forward ms per step,
  graphs captured and replayed, and whether the output equals the dynamic one's.
* ``replay``: tokens/s projected from the drafting simulator's tokens/step on the edits (a table
  copied from benchmarks/RESULTS.md §3, as the data is not on a lent machine) over the measured
  step time at that tree size (and with the rest of the loop's time added: propose and accept),
  against one forward per token (greedy) and ``model.generate``'s measured greedy time per token,
  with prompt lookup's tokens/step at its chain size alongside.

``--quick``: fewer prompts and repeats, 2 layers of the real widths. ``--device cpu --quick`` runs
every section on a CPU in seconds (tiny shapes: a 4,096-token vocabulary, a 64-token cache, no
Llama-3-8B): how the script is checked without a GPU (tests/benchmarks/test_bench_gpu.py).

A run needs a CUDA build of torch, transformers and refdec built (its C++ extension); no network,
no data files, no weights. Time budget: ``--budget-s`` (default 450 s, 7.5 minutes); a section or a
model that might run past it is not started, and the output says so. The result (every section,
with the run record) goes to ``--json`` (default benchmarks/out/gpu-<time>.json), written again
after each section. Exit status 1 if a section failed or an output differed from
``model.generate``, 2 without the device.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import traceback
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from benchmarks import report, tiny_model

SECTIONS = ("equivalence", "syncs", "forward", "loop", "graphs", "replay")
FORWARD_NODES = (0, 1, 2, 4, 8, 16, 32, 64, 128)

# Gemma 3 270M as refdec.models.load_default() converts it (~/.cache/refdec/gemma-3-270m/config.json:
# the sliding window on 5 layers of 6); the forward section compares where that file exists.
GEMMA3_270M = dict(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                   num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                   query_pre_attn_scalar=256, max_position_embeddings=32768, rms_norm_eps=1e-6,
                   hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                   rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
                   bos_token_id=2, eos_token_id=1, pad_token_id=0)
GEMMA3_SLIDING_PATTERN = 6  # every 6th layer attends to the whole context
# Llama-3-8B (meta-llama/Meta-Llama-3-8B's config.json)
LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rms_norm_eps=1e-5,
                 rope_parameters={"rope_type": "default", "rope_theta": 500_000.0}, tie_word_embeddings=False,
                 bos_token_id=128000, eos_token_id=128001, pad_token_id=0)
SHAPES = {"gemma3-270m": GEMMA3_270M, "llama3-8b": LLAMA3_8B}

# Tokens per verification step of the drafting simulator (benchmarks/simulate.py), from
# benchmarks/RESULTS.md §3, "Edits: the true edited files" (edits-click.jsonl, 60 pairs; refdec in
# editing mode, k = 128 from the "N nodes" table) and "Edits: the model's own output" (edits-model,
# 30 pairs, Gemma 3 270M's greedy outputs). Prompt lookup: last occurrence, 3..1-gram, a chain of k
# (k = 10: transformers' prompt_lookup_num_tokens default).
REPLAY_SOURCE = "benchmarks/RESULTS.md §3 (python -m benchmarks.simulate; tokens/step, model-free)"
REPLAY_TOKENS_PER_STEP = {
    "edits": {"refdec": {8: 8.39, 16: 14.85, 32: 25.74, 64: 41.86, 128: 42.60},
              "prompt lookup": {8: 5.84, 10: 6.80, 16: 9.37, 32: 15.04, 64: 23.73}},
    "edits-model": {"refdec": {8: 7.30, 16: 11.67, 32: 17.24, 64: 23.41},
                    "prompt lookup": {8: 5.86, 16: 8.05, 32: 9.67, 64: 10.49}},
}


@dataclass(frozen=True)
class Plan:
    """The sizes of one run (``make_plan``); ``estimates``: seconds a unit of work may take at most
    (what the budget reserves before starting it)."""

    eq_prompts: int
    eq_new: int
    sync_new: int
    layers: int | None  # None: the real depth
    vocab: int | None  # None: the real vocabulary
    cache_len: int
    nodes: tuple
    repeats: int
    warmup: int
    hf_tokens: int
    llama8b: bool
    loop_prompt: int
    loop_new: int
    loop_budgets: tuple
    estimates: dict = field(default_factory=dict)


def make_plan(device: torch.device, quick: bool) -> Plan:
    if device.type == "cuda":
        estimates = {"equivalence": 60, "syncs": 30, "gemma3-270m": 60, "llama3-8b": 120, "loop": 45, "graphs": 60,
                     "replay": 5}
        if quick:
            return Plan(2, 32, 24, 2, None, 1024, FORWARD_NODES, 5, 2, 16, True, 512, 64, (8, 64), estimates)
        return Plan(4, 64, 48, None, None, 1024, FORWARD_NODES, 10, 3, 64, True, 1024, 256, (8, 16, 32, 64, 128),
                    estimates)
    estimates = {"equivalence": 30, "syncs": 20, "gemma3-270m": 30, "llama3-8b": 10_000, "loop": 20, "graphs": 30,
                 "replay": 5}
    if quick:
        return Plan(2, 16, 16, 2, 4096, 64, (0, 1, 4, 16), 2, 1, 4, False, 48, 12, (4, 16), estimates)
    return Plan(4, 64, 48, None, None, 1024, FORWARD_NODES, 3, 1, 16, False, 512, 64, (8, 32, 64),
                {**estimates, "gemma3-270m": 300, "loop": 200, "graphs": 300})


class Clock:
    """The run's time budget: ``allows(seconds, what)`` says whether ``what`` may start."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.started = time.perf_counter()
        self.not_started: list[str] = []

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.started)

    def allows(self, seconds: float, what: str) -> bool:
        if self.left() >= seconds:
            return True
        note = (f"{what}: not started (it may take {seconds:.0f} s; {max(0.0, self.left()):.0f} s left of the "
                f"{self.budget_s:.0f} s budget)")
        print("  " + note, flush=True)
        self.not_started.append(note)
        return False


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- equivalence

def hf_greedy(model, prompt: list[int], max_new_tokens: int, device: torch.device) -> list[int]:
    ids = torch.tensor([prompt], device=device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new_tokens, pad_token_id=0)
    return out[0].tolist()


def own_reference(output: list[int], prompt_len: int) -> list[int]:
    """The model's own continuation (with the prompt's last 2 tokens, where the copy cursor
    anchors) with one token changed: drafts accepted up to it, then rejected."""
    ref = list(output[prompt_len - 2:])
    if len(ref) > 10:
        ref[9] = (ref[9] + 1) % tiny_model.VOCAB
    return ref


def section_equivalence(plan: Plan, device: torch.device, clock: Clock, ctx: dict) -> dict:
    import refdec

    runs, families = [], {}
    for family, build in tiny_model.TINY_MODELS.items():
        if not clock.allows(plan.estimates["equivalence"] / 3, f"equivalence, {family}"):
            families[family] = "not started (budget)"
            continue
        model = build(dtype=torch.float32).to(device)
        decoder = refdec.SpeculativeDecoder(model, prefix_cache=0)
        for i, prompt in enumerate(tiny_model.repetitive_prompts(plan.eq_prompts, seed=21)):
            want = hf_greedy(model, prompt, plan.eq_new, device)
            for budget, refs in (("auto", None), (64, [own_reference(want, len(prompt))])):
                out = decoder.generate(prompt, references=refs, max_new_tokens=plan.eq_new, max_draft_tokens=budget)
                stats = out.stats
                runs.append({"family": family, "prompt": i, "max_draft_tokens": budget, "reference": refs is not None,
                             "identical": out.sequences[0].tolist() == want, "new_tokens": stats.new_tokens,
                             "output_device": str(out.sequences.device),
                             "hf_new_tokens": len(want) - len(prompt), "passes": stats.forward_passes,
                             "tokens_per_pass": round(stats.tokens_per_pass, 3), "lazy_head": decoder.backend.lazy_head})
        families[family] = "run"
        ctx.setdefault("tiny", {})[family] = model
    rows = []
    for family in tiny_model.TINY_MODELS:
        mine = [r for r in runs if r["family"] == family]
        if mine:
            rows.append([family, len(mine), sum(r["identical"] for r in mine),
                         f"{np.mean([r['tokens_per_pass'] for r in mine]):.2f}", mine[0]["lazy_head"]])
        else:
            rows.append([family, 0, "-", "-", "-"])
    print(report.markdown_table(rows, ["float32 model", "runs", "identical to model.generate", "tokens/pass",
                                       "lazy head"]))
    mismatches = [r for r in runs if not r["identical"]]
    for r in mismatches:
        print(f"  MISMATCH: {r}")
    return {"dtype": "float32", "families": families, "runs": runs, "all_identical": not mismatches}


# ---------------------------------------------------------------- syncs

SYNC_RUNS = (  # (tiny model, batch rows, max draft nodes, sampling)
    ("llama", 1, 4, False), ("llama", 1, 64, False), ("llama", 4, 16, False), ("llama", 1, 16, True),
    ("gemma3", 1, 16, False))


def _sync_site() -> str:
    """Where a sync was called: the innermost frame in refdec's package (else in transformers')."""
    import refdec
    import transformers

    stack = traceback.extract_stack()[:-2]
    for package in (refdec, transformers):
        root = os.path.dirname(os.path.abspath(package.__file__))
        for frame in reversed(stack):
            name = os.path.abspath(frame.filename)
            if name.startswith(root + os.sep):
                rel = os.path.relpath(name, os.path.dirname(root)).replace(os.sep, "/")
                return f"{rel}:{frame.lineno} {frame.name}"
    return "elsewhere"


def count_syncs(model, device: torch.device, run) -> dict:
    """The CUDA syncs ``run()`` makes (torch's sync debug mode; none on a CPU), split at the starts
    of the model's backbone forwards: window 0 is the prefill (and the first step's drafting),
    window i >= 1 the i-th step; a sync inside a forward is the model's own."""
    backbone = getattr(model, getattr(model, "base_model_prefix", ""), None) or model
    events: list[tuple[str, bool]] = []  # (site, inside the model's forward)
    starts: list[int] = []
    depth = [0]

    def pre(module, args, kwargs):
        if depth[0] == 0:
            starts.append(len(events))
        depth[0] += 1

    def post(module, args, kwargs, output):
        depth[0] -= 1

    def show(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            events.append((_sync_site(), depth[0] > 0))

    handles = [backbone.register_forward_pre_hook(pre, with_kwargs=True),
               backbone.register_forward_hook(post, with_kwargs=True)]
    cuda = device.type == "cuda"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                out = run()
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode(0)
    finally:
        for handle in handles:
            handle.remove()
    bounds = starts + [len(events)]
    windows = [[e for e in events[bounds[i]:bounds[i + 1]] if not e[1]] for i in range(len(starts))]
    steps = [len(w) for w in windows[1:]]
    return {"stats": out.stats, "forwards": len(starts), "prefill_window": len(windows[0]) if windows else 0,
            "per_step": steps, "max_per_step": max(steps, default=0),
            "mean_per_step": float(np.mean(steps)) if steps else 0.0,
            "model_own": sum(inside for _, inside in events), "total": len(events),
            "sites": Counter(site for site, inside in events if not inside).most_common(6)}


def section_syncs(plan: Plan, device: torch.device, clock: Clock, ctx: dict) -> dict:
    import refdec

    cuda = device.type == "cuda"
    runs = []
    for family, batch, max_draft, do_sample in SYNC_RUNS:
        if not clock.allows(plan.estimates["syncs"] / len(SYNC_RUNS), f"syncs, {family} B={batch} k={max_draft}"):
            continue
        model = ctx.setdefault("tiny", {}).get(family)
        if model is None:
            model = ctx["tiny"][family] = tiny_model.TINY_MODELS[family](dtype=torch.float32).to(device)
        decoder = refdec.SpeculativeDecoder(model, prefix_cache=0)
        prompts = tiny_model.repetitive_prompts(batch, seed=21)
        kwargs = dict(max_new_tokens=plan.sync_new, eos_token_id=[], do_sample=do_sample,
                      **(dict(seed=7, temperature=0.8, top_k=20) if do_sample else {}))
        refs = []
        for b, prompt in enumerate(prompts):  # row b samples with seed 7 + b
            row = {**kwargs, "seed": 7 + b} if do_sample else kwargs
            own = decoder.generate(prompt, max_draft_tokens=0, **row).sequences[0].tolist()
            refs.append([own_reference(own, len(prompt))])
        inputs, references = (prompts[0], refs[0]) if batch == 1 else (prompts, refs)

        def run():
            return decoder.generate(inputs, references=references, max_draft_tokens=max_draft, **kwargs)

        run()  # warm-up: first-call work is not the steady state
        counted = count_syncs(model, device, run)
        stats = counted.pop("stats")
        runs.append({"model": family, "batch": batch, "max_draft_tokens": max_draft,
                     "mode": "sampling" if do_sample else "greedy", "lazy_head": decoder.backend.lazy_head,
                     "steps": stats.forward_passes - 1, "accepted_tokens": stats.accepted_tokens, **counted})
    if cuda:
        rows = [[r["model"], r["batch"], r["max_draft_tokens"], r["mode"], r["steps"], r["max_per_step"],
                 f"{r['mean_per_step']:.2f}", r["prefill_window"], r["model_own"]] for r in runs]
        print(report.markdown_table(rows, ["tiny model", "B", "k", "mode", "steps", "syncs/step max", "mean",
                                           "prefill", "inside the model's forwards"]))
        sites = Counter()
        for r in runs:
            sites.update(dict(r["sites"]))
        for site, count in sites.most_common(6):
            print(f"  {count:5d}  {site}")
    else:
        print("  n/a: torch.cuda.set_sync_debug_mode needs CUDA (on a CPU, tests/test_step_syncs.py counts "
              f"the would-be syncs); {len(runs)} decodes ran")
    return {"cuda_sync_debug": cuda, "runs": runs,
            "note": None if cuda else "n/a on a CPU: torch's sync debug mode needs CUDA"}


# ---------------------------------------------------------------- forward cost against tree size

def gemma_layer_types(layers: int) -> list[str]:
    """Gemma 3's 5 sliding layers to 1 full one; a cut-down model keeps a full layer last."""
    return ["full_attention" if (i + 1) % GEMMA3_SLIDING_PATTERN == 0 or i == layers - 1 else "sliding_attention"
            for i in range(layers)]


def real_config(name: str, layers: int | None = None, vocab: int | None = None):
    from transformers import Gemma3TextConfig, LlamaConfig

    shape = dict(SHAPES[name])
    if layers is not None:
        shape["num_hidden_layers"] = layers
    if vocab is not None:
        shape["vocab_size"] = vocab
    if name == "gemma3-270m":
        return Gemma3TextConfig(**shape, layer_types=gemma_layer_types(shape["num_hidden_layers"]))
    return LlamaConfig(**shape)


def check_gemma_config() -> dict:
    """GEMMA3_270M against the converted default model's config.json, where it exists."""
    from refdec.models import default_model_dir

    path = default_model_dir() / "config.json"
    if not path.exists():
        return {"path": str(path), "found": False}
    theirs = json.loads(path.read_text())
    ours = {**GEMMA3_270M, "layer_types": gemma_layer_types(GEMMA3_270M["num_hidden_layers"])}
    differ = {k: {"ours": v, "config.json": theirs.get(k)} for k, v in ours.items()
              if k not in ("rms_norm_eps",) and theirs.get(k) != v}
    if abs(theirs.get("rms_norm_eps", 0) - ours["rms_norm_eps"]) > 1e-9:
        differ["rms_norm_eps"] = {"ours": ours["rms_norm_eps"], "config.json": theirs.get("rms_norm_eps")}
    return {"path": str(path), "found": True, "differences": differ}


def build_real(name: str, plan: Plan, device: torch.device):
    """A random-weight bfloat16 model of ``name``'s shape, made on the device."""
    from transformers import AutoModelForCausalLM

    cfg = real_config(name, plan.layers, plan.vocab)
    torch.manual_seed(0)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    except Exception as exc:  # slower, through host memory, but the section goes on
        print(f"  {name}: building on {device} failed ({type(exc).__name__}: {exc}); building on the CPU and moving it")
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(device)
    model.eval()
    model.generation_config.pad_token_id = 0
    return model


def event_times(records: list, warmup: int) -> dict[int, list[float]]:
    """Milliseconds per forward by rows fed, from (rows, start event, end event); the first record
    (the cache's prefill) and each size's first ``warmup`` forwards left out."""
    by_rows: dict[int, list[float]] = {}
    for rows, start, end in records[1:]:
        by_rows.setdefault(rows, []).append(start.elapsed_time(end))
    return {rows: times[warmup:] for rows, times in by_rows.items()}


def hf_ms_per_token(model, plan: Plan, device: torch.device) -> float:
    """``model.generate`` greedy after a ``cache_len``-token prompt: ms per token past the first."""
    gen = torch.Generator().manual_seed(1)
    vocab = int(model.config.vocab_size)
    ids = torch.randint(3, min(vocab, 30000), (1, plan.cache_len), generator=gen).to(device)

    def timed(n: int) -> float:
        config = copy.deepcopy(model.generation_config)
        config.update(min_new_tokens=n, do_sample=False, max_new_tokens=n, pad_token_id=0)  # every run n tokens
        sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        sync(device)
        return time.perf_counter() - t0

    timed(2)
    one = min(timed(1) for _ in range(2))
    many = timed(plan.hf_tokens)
    return (many - one) / (plan.hf_tokens - 1) * 1e3


def forward_curve(model, plan: Plan, device: torch.device) -> dict:
    from refdec.transformers.calibration import measure

    records: list = []
    handles = []
    if device.type == "cuda":
        def pre(module, args, kwargs):
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            records.append([int(kwargs["input_ids"].shape[1]), start, None])

        def post(module, args, kwargs, output):
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            records[-1][2] = end

        backbone = model.base_model  # the engine runs it alone when it runs the head by row chunks
        handles = [backbone.register_forward_pre_hook(pre, with_kwargs=True),
                   backbone.register_forward_hook(post, with_kwargs=True)]
    try:
        curve = measure(model, plan.nodes, cache_len=plan.cache_len, repeats=plan.repeats, warmup=plan.warmup,
                        lazy_head=False)
    finally:
        for handle in handles:
            handle.remove()
    sync(device)
    events = event_times(records, plan.warmup) if records else {}
    samples = curve.meta["samples"]
    out = {}
    for n in plan.nodes:
        wall = np.asarray(samples[str(n)]) * 1e3
        ev = events.get(1 + n)
        out[n] = {"median_ms": float(np.median(wall)), "min_ms": float(wall.min()),
                  "event_median_ms": float(np.median(ev)) if ev else None, "repeats": len(wall)}
    return out


def section_forward(plan: Plan, device: torch.device, clock: Clock, ctx: dict) -> dict:
    result = {"dtype": "bfloat16", "cache_len": plan.cache_len, "layers": plan.layers or "real",
              "vocab": plan.vocab or "real", "gemma_config_check": check_gemma_config(), "models": {}}
    differ = result["gemma_config_check"].get("differences")
    if differ:
        print(f"  Gemma 3 270M's shape here differs from {result['gemma_config_check']['path']}: {differ}")
    for name in SHAPES:
        if name == "llama3-8b" and not plan.llama8b:
            result["models"][name] = {"skipped": f"not on a {device.type} run"}
            print(f"  {name}: skipped on {device.type}")
            continue
        if not clock.allows(plan.estimates[name], f"forward, {name}"):
            result["models"][name] = {"skipped": "budget"}
            continue
        t0 = time.perf_counter()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        model = build_real(name, plan, device)
        built = time.perf_counter() - t0
        curve = forward_curve(model, plan, device)
        hf_ms = hf_ms_per_token(model, plan, device)
        entry = {"parameters": sum(p.numel() for p in model.parameters()),
                 "layers": model.config.num_hidden_layers, "vocab": model.config.vocab_size,
                 "build_seconds": built, "nodes": {str(n): v for n, v in curve.items()},
                 "hf_generate_ms_per_token": hf_ms,
                 "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}
        result["models"][name] = entry
        ctx.setdefault("forward", {})[name] = {"nodes": list(curve), "ms": [curve[n]["median_ms"] for n in curve],
                                               "hf_ms": hf_ms}
        base = curve[plan.nodes[0]]["median_ms"]
        rows = [[n, 1 + n, f"{v['median_ms']:.2f}", f"{v['min_ms']:.2f}",
                 "-" if v["event_median_ms"] is None else f"{v['event_median_ms']:.2f}", f"{v['median_ms'] / base:.2f}"]
                for n, v in curve.items()]
        print(f"{name}: {entry['parameters'] / 1e6:,.0f} M parameters, {entry['layers']} layers, bf16, "
              f"cache {plan.cache_len}; built in {built:.1f} s; model.generate greedy {hf_ms:.2f} ms/token")
        print(report.markdown_table(rows, ["draft nodes", "rows", "step ms (median)", "min", "backbone CUDA ms",
                                           "/ 0 nodes"]))
        if name == "gemma3-270m":
            ctx["gemma"] = model
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


# ---------------------------------------------------------------- the loop's own time

def per_step(stats, k: int, same) -> dict:
    steps = max(1, stats.forward_passes - 1)  # the prefill's pass yields the first token
    loop_s = stats.propose_seconds + stats.prepare_seconds + stats.accept_seconds
    decode_s = stats.wall_seconds - stats.prefill_seconds
    return {"max_draft_tokens": k, "steps": steps, "tokens_per_step": (stats.new_tokens - 1) / steps,
            "nodes_per_step": stats.proposed_tokens / steps,
            "forward_ms": stats.forward_seconds / steps * 1e3, "propose_ms": stats.propose_seconds / steps * 1e3,
            "prepare_ms": stats.prepare_seconds / steps * 1e3, "accept_ms": stats.accept_seconds / steps * 1e3,
            "loop_ms": loop_s / steps * 1e3, "loop_over_forward": loop_s / stats.forward_seconds,
            "step_ms": decode_s / steps * 1e3, "tokens_per_s": (stats.new_tokens - 1) / decode_s,
            "same_as_plain": same}


def section_loop(plan: Plan, device: torch.device, clock: Clock, ctx: dict) -> dict:
    import refdec

    if not clock.allows(plan.estimates["loop"], "loop"):
        return {"skipped": "budget"}
    model = ctx.get("gemma")
    if model is None:
        model = ctx["gemma"] = build_real("gemma3-270m", plan, device)
    decoder = refdec.SpeculativeDecoder(model, prefix_cache=0)
    rng = np.random.default_rng(3)
    prompt = rng.integers(3, min(int(model.config.vocab_size), 30000), size=plan.loop_prompt).tolist()
    common = dict(max_new_tokens=plan.loop_new, eos_token_id=[])
    decoder.generate(prompt, max_new_tokens=4, max_draft_tokens=0, eos_token_id=[])  # warm-up
    plain = decoder.generate(prompt, max_draft_tokens=0, **common)
    want = plain.sequences[0].tolist()
    reference = prompt[-2:] + want[len(prompt):]  # the model's own output: drafts of the full size accepted
    rows = [per_step(plain.stats, 0, True)]
    for k in plan.loop_budgets:
        decoder.generate(prompt, references=[reference], max_new_tokens=8, max_draft_tokens=k, eos_token_id=[])
        out = decoder.generate(prompt, references=[reference], max_draft_tokens=k, **common)
        rows.append(per_step(out.stats, k, out.sequences[0].tolist() == want))
    # the forward section's step times include laying out the inputs (prepare): the rest of the loop only
    ctx["loop_ms"] = {r["max_draft_tokens"]: r["loop_ms"] - r["prepare_ms"] for r in rows}
    ctx["loop_decode"] = (prompt, reference, want)
    print(f"gemma3-270m shape ({model.config.num_hidden_layers} layers, bf16), prompt {plan.loop_prompt}, "
          f"{plan.loop_new} new tokens, lazy head {decoder.backend.lazy_head}; the reference is the model's own output")
    table = [[r["max_draft_tokens"], f"{r['nodes_per_step']:.1f}", f"{r['tokens_per_step']:.2f}",
              f"{r['forward_ms']:.2f}", f"{r['propose_ms']:.2f}", f"{r['prepare_ms']:.2f}", f"{r['accept_ms']:.2f}",
              f"{r['loop_over_forward']:.2f}", f"{r['tokens_per_s']:.0f}", r["same_as_plain"]] for r in rows]
    print(report.markdown_table(table, ["k", "nodes/step", "tokens/step", "forward ms", "propose ms", "prepare ms",
                                        "accept ms", "loop / forward", "tokens/s", "same as k=0"]))
    return {"model": "gemma3-270m", "layers": model.config.num_hidden_layers, "prompt_len": plan.loop_prompt,
            "new_tokens": plan.loop_new, "lazy_head": decoder.backend.lazy_head, "rows": rows,
            "note": "bfloat16: a tree forward may round differently from one row's, so the output may differ "
                    "from k = 0; on a GPU the forward's kernels run asynchronously and the wait for them falls "
                    "in the step's one host sync (the forward's time)"}


# ---------------------------------------------------------------- fixed shapes, CUDA graphs

def fixed_shape_decoder(model, device: torch.device):
    """A decoder whose steps run at fixed shapes: replayed as CUDA graphs on a GPU, eagerly elsewhere."""
    import refdec

    if device.type == "cuda":
        return refdec.SpeculativeDecoder(model, cuda_graphs=True, prefix_cache=0)
    decoder = refdec.SpeculativeDecoder(model, prefix_cache=0)
    decoder.backend.static_shapes = True
    return decoder


def section_graphs(plan: Plan, device: torch.device, clock: Clock, ctx: dict) -> dict:
    import refdec

    if not clock.allows(plan.estimates["graphs"], "graphs"):
        return {"skipped": "budget"}
    graphs = device.type == "cuda"
    runs = []
    for family, build in tiny_model.TINY_MODELS.items():
        model = ctx.get("tiny", {}).get(family) or build(dtype=torch.float32).to(device)
        decoder = fixed_shape_decoder(model, device)
        for i, prompt in enumerate(tiny_model.repetitive_prompts(plan.eq_prompts, seed=23)):
            want = hf_greedy(model, prompt, plan.eq_new, device)
            out = decoder.generate(prompt, references=[own_reference(want, len(prompt))], max_new_tokens=plan.eq_new,
                                   max_draft_tokens=64)
            step = decoder.backend.runner.static_step
            runs.append({"family": family, "prompt": i, "identical": out.sequences[0].tolist() == want,
                         "tokens_per_pass": round(out.stats.tokens_per_pass, 3), "captures": step.captures,
                         "replays": step.replays})
    rows = [[family, sum(r["family"] == family for r in runs), sum(r["identical"] for r in runs if r["family"] == family),
             max(r["captures"] for r in runs if r["family"] == family),
             max(r["replays"] for r in runs if r["family"] == family)] for family in tiny_model.TINY_MODELS]
    print(f"fixed-shape steps ({'CUDA graphs' if graphs else 'eager, no graphs on ' + device.type}), float32, "
          "64-node drafts from the model's own output")
    print(report.markdown_table(rows, ["float32 model", "runs", "identical to model.generate", "graphs captured",
                                       "replays"]))
    result = {"cuda_graphs": graphs, "equivalence": runs, "all_identical": all(r["identical"] for r in runs)}
    if "loop_decode" not in ctx or "gemma" not in ctx:
        print("  speed: skipped (needs the loop section's model and decode in the same command)")
        return result
    model = ctx["gemma"]
    prompt, reference, _ = ctx["loop_decode"]
    common = dict(max_new_tokens=plan.loop_new, eos_token_id=[])
    speed = []
    for k in plan.loop_budgets:
        if not clock.allows(plan.estimates["graphs"] / 4, f"graphs, k={k}"):
            break
        outs = {}
        for way in ("dynamic", "fixed", "graphs"):
            if way == "graphs" and not graphs:
                continue
            if way == "dynamic":
                decoder = refdec.SpeculativeDecoder(model, prefix_cache=0)
            elif way == "fixed":
                decoder = refdec.SpeculativeDecoder(model, prefix_cache=0)
                decoder.backend.static_shapes = True
            else:
                decoder = refdec.SpeculativeDecoder(model, cuda_graphs=True, prefix_cache=0)
            decoder.generate(prompt, references=[reference], max_new_tokens=16, max_draft_tokens=k, eos_token_id=[])
            out = decoder.generate(prompt, references=[reference], max_draft_tokens=k, **common)  # captured: warm
            outs[way] = out.sequences[0].tolist()
            step = decoder.backend.runner.static_step
            row = per_step(out.stats, k, outs[way] == outs["dynamic"])
            row.update(way=way, captures=None if step is None else step.captures,
                       replays=None if step is None else step.replays)
            speed.append(row)
    table = [[r["max_draft_tokens"], r["way"], f"{r['tokens_per_step']:.2f}", f"{r['forward_ms']:.2f}",
              f"{r['step_ms']:.2f}", f"{r['tokens_per_s']:.0f}", r["captures"], r["replays"], r["same_as_plain"]]
             for r in speed]
    print(f"gemma3-270m shape ({model.config.num_hidden_layers} layers, bf16), prompt {len(prompt)}, "
          f"{plan.loop_new} new tokens, the reference the model's own output")
    print(report.markdown_table(table, ["k", "shapes", "tokens/step", "forward ms", "step ms", "tokens/s",
                                        "graphs captured", "replays", "same as dynamic"]))
    result["speed"] = speed
    return result


# ---------------------------------------------------------------- replayed acceptance

def section_replay(plan: Plan, device: torch.device, clock: Clock, ctx: dict) -> dict:
    forward = ctx.get("forward")
    if not forward:
        print("  skipped: needs the forward section's times (run it in the same command)")
        return {"skipped": "no forward times"}
    loop = ctx.get("loop_ms")
    result = {"source": REPLAY_SOURCE, "tokens_per_step": REPLAY_TOKENS_PER_STEP, "models": {}}
    for name, fwd in forward.items():
        nodes, ms = np.asarray(fwd["nodes"], dtype=float), np.asarray(fwd["ms"])
        greedy_ms = float(np.interp(0, nodes, ms))
        rows = [{"workload": "-", "method": "one forward per token", "k": 0, "tokens_per_step": 1.0,
                 "forward_ms": greedy_ms, "tokens_per_s": 1e3 / greedy_ms,
                 "tokens_per_s_with_loop": None if loop is None else 1e3 / (greedy_ms + loop[0])},
                {"workload": "-", "method": "model.generate greedy (measured)", "k": 0, "tokens_per_step": 1.0,
                 "forward_ms": fwd["hf_ms"], "tokens_per_s": 1e3 / fwd["hf_ms"], "tokens_per_s_with_loop": None}]
        for workload, methods in REPLAY_TOKENS_PER_STEP.items():
            for method, table in methods.items():
                for k, tps in table.items():
                    if k > nodes.max():
                        continue
                    t = float(np.interp(k, nodes, ms))
                    with_loop = None
                    if loop is not None:
                        ks = sorted(loop)
                        t_loop = float(np.interp(k, ks, [loop[x] for x in ks]))
                        with_loop = tps / (t + t_loop) * 1e3
                    rows.append({"workload": workload, "method": method, "k": k, "tokens_per_step": tps,
                                 "forward_ms": t, "tokens_per_s": tps / t * 1e3, "tokens_per_s_with_loop": with_loop})
        for row in rows:
            row["x_one_forward_per_token"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
            best = row["tokens_per_s_with_loop"] or row["tokens_per_s"]
            row["x_model_generate"] = best / rows[1]["tokens_per_s"]
        result["models"][name] = rows
        print(f"{name} ({'the real depth' if plan.layers is None else f'{plan.layers} layers'}, bf16): "
              f"tokens/s = tokens/step / forward time"
              + ("" if loop is None else " (+ the Gemma-shape loop's time per step)"))
        table = [[r["workload"], r["method"], r["k"], f"{r['tokens_per_step']:.2f}", f"{r['forward_ms']:.2f}",
                  f"{r['tokens_per_s']:.0f}",
                  "-" if r["tokens_per_s_with_loop"] is None else f"{r['tokens_per_s_with_loop']:.0f}",
                  f"{r['x_one_forward_per_token']:.2f}", f"{r['x_model_generate']:.2f}"] for r in rows]
        print(report.markdown_table(table, ["workload", "method", "k", "tokens/step", "forward ms", "tokens/s",
                                            "with the loop", "x one forward/token", "x model.generate"]))
    print(f"  tokens/step: {REPLAY_SOURCE}")
    return result


SECTION_FUNCTIONS = {"equivalence": section_equivalence, "syncs": section_syncs, "forward": section_forward,
                     "loop": section_loop, "graphs": section_graphs, "replay": section_replay}


def device_info(device: torch.device) -> dict:
    import transformers

    info = {"device": str(device), "transformers": transformers.__version__,
            "allow_tf32_matmul": torch.backends.cuda.matmul.allow_tf32}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, memory_gib=props.total_memory / 2**30, cuda=torch.version.cuda)
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="torch device (default cuda)")
    ap.add_argument("--quick", action="store_true", help="fewer prompts and repeats, 2 layers of the real widths "
                                                         "(with --device cpu: tiny shapes, seconds)")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {','.join(SECTIONS)}")
    ap.add_argument("--budget-s", type=float, default=450.0, help="stop starting work past this (default 450 s)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    ap.add_argument("--json", default=None, help="results JSON path (default benchmarks/out/gpu-<time>.json)")
    args = ap.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if not sections or unknown:
        ap.error(f"unknown sections {unknown}; choose from {','.join(SECTIONS)}")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here (run with --device cpu --quick to check the script on a CPU)", file=sys.stderr)
        return 2
    plan = make_plan(device, args.quick)
    clock = Clock(args.budget_s)
    path = report.result_path(args.json, "gpu")
    payload = {"device_info": device_info(device), "quick": args.quick, "plan": asdict(plan),
               "budget_s": args.budget_s, "sections": {}, "section_seconds": {}}
    print(f"refdec on {payload['device_info'].get('name', device)}; budget {args.budget_s:.0f} s; "
          f"sections {','.join(sections)}", flush=True)
    ctx: dict = {}
    failed = False
    for name in sections:
        print(f"\n== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            result = SECTION_FUNCTIONS[name](plan, device, clock, ctx)
        except Exception:  # a failed section must not cost the others their (scarce) device time
            failed = True
            result = {"error": traceback.format_exc()}
            print(result["error"], file=sys.stderr)
        payload["section_seconds"][name] = time.perf_counter() - t0
        payload["sections"][name] = result
        print(f"({name}: {payload['section_seconds'][name]:.1f} s)", flush=True)
        payload["not_started"] = clock.not_started
        payload["total_seconds"] = time.perf_counter() - clock.started
        report.write_result(path, payload, argv=argv)
    mismatch = any(payload["sections"].get(name, {}).get("all_identical") is False
                   for name in ("equivalence", "graphs"))
    print(f"\ntotal {payload['total_seconds']:.1f} s of {args.budget_s:.0f}"
          + ("; NOT STARTED: " + "; ".join(clock.not_started) if clock.not_started else "")
          + ("; OUTPUTS DIFFERED from model.generate" if mismatch else "")
          + ("; A SECTION FAILED" if failed else ""))
    print(f"wrote {path}")
    return 1 if failed or mismatch else 0


if __name__ == "__main__":
    sys.exit(main())
