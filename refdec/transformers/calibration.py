"""The verification cost curve of one model on this machine: seconds per forward
against draft-tree size.

On a CPU a tree-verification forward costs more the more rows it has (Gemma 3
270M, 2 threads: 1 node ~ 0.1 s, 64 ~ 0.5 s); on a GPU it barely grows. The
"auto" budget (refdec.sizing.budget.AutoBudget) weighs the expected accepted length of
a tree against this curve.

    curve = calibrate(model)          # ~10-30 s the first time, then read from disk
    curve(16)                         # seconds for a forward with 16 draft nodes
    CostCurve([1, 64], [1.0, 1.0])    # a synthetic (GPU-like, flat) curve

With a lazy head (the decoder's default on a CPU, refdec.transformers.lazy_head.LazyRowLogits) the
LM head runs only on the rows the acceptance walk visits, a chunk of 4 at a time;
the curve then holds a step's cost without the head per tree size (``seconds``: its
inputs and the backbone) plus the cost of one head chunk (``head_chunk_seconds``), and a
step that accepts ``k`` nodes costs about ``seconds(n) + head_chunk_seconds * (k + 2.5) / 4``.

``calibrate`` times the engine's own verification step (refdec.transformers.verify.verify_step:
its inputs laid out, one forward of ``1 + n`` rows -- root + n nodes -- and the head as the
engine runs it) over a cache of ``cache_len`` tokens: a warm-up round, then ``repeats`` rounds over
the sizes, alternately ascending and descending, the median of each size's rounds
(refdec.sizing.cost_curve.calibration_order), and caches the result as JSON under
``refdec.models.cache_dir()/calibration/`` keyed by the model's config, dtype,
device and the number of torch threads. A curve whose rounds disagree (load from other work on a
shared machine; refdec.sizing.cost_curve.repeats_disagree) is not cached: the process keeps it, says why
on stderr, and the budget corrects it from the steps it times (refdec.sizing.cost_model).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from refdec.atomic import atomic_write
from refdec.sizing.cost_curve import (CALIBRATED_SIZES, DEFAULT_CPU_CURVE, CostCurve, calibration_order, flat_curve,
                               median_seconds, repeats_disagree, warn_not_cached)
from refdec.drafting.tree import DraftTree
from refdec.models import cache_dir
from refdec.tokens import check_int
from refdec.transformers.cache import select_rows
from refdec.transformers.prefill import prefill_tokens
from refdec.transformers.runner import ModelRunner
from refdec.transformers.verify import verify_step

__all__ = ["CALIBRATE_MIN_PARAMETERS", "CostCurve", "DEFAULT_CPU_CURVE", "auto_cost_curve", "calibrate",
           "calibration_path", "flat_curve", "load_cached", "measure", "model_key"]

# Part of the cache key: bump when the verification forward changes (its cost curve with it).
# "engine-step-1": the engine's step, its inputs' layout included, the full head in row chunks
# (was "lazy-head-1": the forward alone, the full head as the model's own forward)
FORWARD_VERSION = "engine-step-1"


def model_key(model) -> str:
    """Identifies (model config, dtype, device, torch threads) for the calibration cache."""
    config = model.config
    try:
        text = config.to_json_string(use_diff=False)
    except TypeError:  # pragma: no cover - older configs
        text = config.to_json_string()
    device = next(model.parameters()).device
    parts = [text, str(model.dtype), str(device), str(torch.get_num_threads()),
             str(getattr(config, "_attn_implementation", "")), FORWARD_VERSION]
    name = getattr(config, "_name_or_path", "") or getattr(config, "model_type", "model")
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(name).split("/")[-1])[:40] or "model"
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return f"{slug}-{str(model.dtype).replace('torch.', '')}-{device.type}-t{torch.get_num_threads()}-{digest}"


def calibration_path(model) -> Path:
    return cache_dir() / "calibration" / f"{model_key(model)}.json"


def measure(model, nodes=CALIBRATED_SIZES, *, cache_len: int = 512, repeats: int = 3,
            warmup: int = 1, lazy_head: bool | None = None) -> CostCurve:
    """Times the engine's verification step (refdec.transformers.verify.verify_step, greedy) of a tree of
    ``n`` nodes, for each ``n`` in ``nodes``, over a cache of ``cache_len`` tokens: laying out the
    inputs (on the host or on the device, as the engine does), the forward and the LM head as the
    engine runs them, the walk.

    The cache is a one-row running batch prefilled with ``cache_len`` random tokens; after each step
    it is cut back to them, so every step sees ``cache_len`` slots. The trees are chains of random
    tokens (the mask shape does not change the cost of an SDPA forward; the walk rejects the first
    node, but for a chance hit). The sizes are measured in refdec.sizing.cost_curve.calibration_order:
    ``warmup`` rounds (dropped), then ``repeats`` rounds, alternately ascending and descending, so
    that load drifts on a shared machine hit all sizes alike; each size's seconds are the median of
    its rounds. ``meta["disagreement"]``: why the rounds disagree (then the curve is not cached), else
    None.

    ``lazy_head`` (default: as the engine, i.e. a plain-head model on a CPU): ``seconds`` are the
    step without its LM head, which is priced apart: one chunk of rows, the walk's first, at the
    largest size (``head_chunk_seconds``). Else ``seconds`` include every row's target (the head in
    row chunks, refdec.transformers.runner.ModelRunner.row_targets, or the model's own forward for another
    head).
    """
    check_int("cache_len", cache_len, 1)
    check_int("repeats", repeats, 1)
    check_int("warmup", warmup, 0)
    runner = ModelRunner(model)
    if lazy_head is None:
        lazy_head = runner.uses_lazy_head
    if lazy_head and runner.head is None:
        raise ValueError("lazy_head=True needs a model with a plain linear LM head (refdec.transformers.plain_head.split_forward_fn)")
    runner.lazy_head = bool(lazy_head)
    high = min(runner.vocab_size, 30000)
    rng = np.random.default_rng(0)
    nodes = tuple(sorted(set(check_int("nodes", n, 0) for n in nodes)))
    times: dict[int, list[float]] = {n: [] for n in nodes}
    head_times: list[float] = []
    chunk_rows = 4  # the rows of a lazy head chunk (refdec.transformers.lazy_head.LockstepLazyWalks)
    root_pos = np.array([cache_len])
    row = torch.zeros(1, dtype=torch.int64, device=runner.device)
    with torch.inference_mode():
        batch, _ = prefill_tokens(runner, rng.integers(3, high, size=cache_len))
        for rnd, n in calibration_order(nodes, repeats, warmup):
            tree = DraftTree.chain(rng.integers(3, high, size=n))
            root = rng.integers(3, high, size=1)
            t0 = time.perf_counter()
            verified = verify_step(runner, batch, [tree], root, root_pos, [None])
            elapsed = time.perf_counter() - t0
            select_rows(batch.cache, row, 0, cache_len)  # the step's rows dropped: back to the prompt
            if rnd >= warmup:
                times[n].append(elapsed - verified.lazy_head_seconds)
                if lazy_head and n == nodes[-1]:
                    head_times.append(verified.lazy_head_seconds)
    seconds = median_seconds(times)
    meta = {"cache_len": cache_len, "repeats": repeats, "warmup": warmup, "threads": torch.get_num_threads(),
            "samples": {str(n): times[n] for n in nodes}, "disagreement": repeats_disagree(times),
            "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    if lazy_head:
        meta["head_samples"] = head_times
        return CostCurve(nodes, seconds, meta, float(np.median(head_times)), chunk_rows)
    return CostCurve(nodes, seconds, meta)


def load_cached(model) -> CostCurve | None:
    path = calibration_path(model)
    if not path.exists():
        return None
    try:
        return CostCurve.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, json.JSONDecodeError):
        return None


# curves measured in this process but not cached (their rounds disagreed), by calibration path:
# measured once per process (unless forced), and said so once
_UNCACHED: dict[str, CostCurve] = {}


def calibrate(model, *, force: bool = False, announce: bool = True, **measure_kwargs) -> CostCurve:
    """The model's cost curve: read from the calibration cache, or measured and saved.

    Measuring takes a few seconds to half a minute; with ``announce`` it says so on stderr,
    one line: what is measured, for which (dtype, device, threads), how long it took and
    where the curve is kept. ``refdec calibrate`` runs this ahead of time. A curve whose rounds
    disagree (``meta["disagreement"]``, a busy machine) is not saved: this process keeps it (a
    later call returns it without measuring, ``force`` measures again) and a warning on stderr
    says why."""
    path = calibration_path(model)
    if not force:
        cached = load_cached(model)
        if cached is not None:
            return cached
        if str(path) in _UNCACHED:
            return _UNCACHED[str(path)]
    device = next(model.parameters()).device
    if announce:
        print(f"refdec: measuring this model's verification cost against draft size, once for "
              f"{str(model.dtype).replace('torch.', '')} on {device.type} with {torch.get_num_threads()} threads "
              f"(cached for later runs) ...", end="", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    curve = measure(model, **measure_kwargs)
    disagreement = (curve.meta or {}).get("disagreement")
    if disagreement:
        _UNCACHED[str(path)] = curve
    else:
        _UNCACHED.pop(str(path), None)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, [json.dumps(curve.to_json(), indent=1).encode()])
    if announce:
        print(f" {time.perf_counter() - t0:.1f} s ({path})", file=sys.stderr, flush=True)
    if disagreement:
        warn_not_cached(disagreement)
    return curve


def model_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


# Models smaller than this are not calibrated ("auto" uses DEFAULT_CPU_CURVE): tiny test models.
CALIBRATE_MIN_PARAMETERS = 20_000_000


def auto_cost_curve(model) -> CostCurve:
    """The cost curve "auto" uses for ``model``: measured once per (model, dtype, device,
    threads) and cached, or DEFAULT_CPU_CURVE for tiny models and when ``$REFDEC_CALIBRATE=0``."""
    if os.environ.get("REFDEC_CALIBRATE", "1") == "0":
        return DEFAULT_CPU_CURVE
    if model_parameters(model) < CALIBRATE_MIN_PARAMETERS:
        return DEFAULT_CPU_CURVE
    return calibrate(model)
