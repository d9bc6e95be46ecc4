"""The verification cost curve of one model on this machine: seconds per forward
against draft-tree size.

On a CPU a tree-verification forward costs more the more rows it has (Gemma 3
270M, 2 threads: 1 node ~ 0.1 s, 64 ~ 0.5 s); on a GPU it barely grows. The
"auto" budget (refdec.budget.AutoBudget) weighs the expected accepted length of
a tree against this curve.

    curve = calibrate(model)          # ~10-30 s the first time, then read from disk
    curve(16)                         # seconds for a forward with 16 draft nodes
    CostCurve([1, 64], [1.0, 1.0])    # a synthetic (GPU-like, flat) curve

With a lazy head (the decoder's default on a CPU, refdec.decode.lazy_head.LazyRowLogits) the
LM head runs only on the rows the acceptance walk visits, a chunk of 4 at a time;
the curve then holds the backbone's cost per tree size (``seconds``) plus the cost
of one head chunk (``head_chunk_seconds``), and a step that accepts ``k`` nodes
costs about ``seconds(n) + head_chunk_seconds * (k + 2.5) / 4``.

``calibrate`` measures forwards of ``1 + n`` rows (root + n nodes) over a cache
of ``cache_len`` tokens with the tree mask the decoder uses, ``repeats`` times
each (the minimum: load from other work on a shared machine only ever adds
time, so the least-disturbed run is the best estimate), and caches the result as JSON under
``refdec.models.cache_dir()/calibration/`` keyed by the model's config, dtype,
device and the number of torch threads.
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
from refdec.cost_curve import DEFAULT_CPU_CURVE, CostCurve, flat_curve
from refdec.decode.cache import compact, new_cache
from refdec.decode.plain_head import split_forward_fn
from refdec.decode.masks import build_tree_inputs
from refdec.decode.model_support import cache_kwarg, mask_spec_for, text_config
from refdec.models import cache_dir
from refdec.tree import DraftTree

__all__ = ["CALIBRATE_MIN_PARAMETERS", "CostCurve", "DEFAULT_CPU_CURVE", "auto_cost_curve", "calibrate",
           "calibration_path", "flat_curve", "load_cached", "measure", "model_key"]

DEFAULT_NODES = (0, 1, 2, 4, 8, 16, 24, 32, 48, 64)
# Part of the cache key: bump when the verification forward changes (its cost curve with it).
FORWARD_VERSION = "lazy-head-1"  # backbone curve + head chunk (was "mm-head-1-min": the whole tree's head)


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


def measure(model, nodes=DEFAULT_NODES, *, cache_len: int = 512, repeats: int = 3,
            warmup: int = 1, lazy_head: bool | None = None) -> CostCurve:
    """Times tree-verification forwards of ``1 + n`` rows over a cache of ``cache_len`` tokens.

    The trees are chains (the mask shape does not change the cost of an SDPA forward);
    sizes are interleaved across repeats so that load drifts on a shared machine hit all
    sizes alike. Returns the per-size minimum (load only adds time).

    ``lazy_head`` (default: as the decoder, i.e. a plain-head model on a CPU): time the
    backbone alone per size and the head on one chunk of rows; else the whole forward.
    """
    spec = mask_spec_for(model)
    split = split_forward_fn(model)
    device = next(model.parameters()).device
    if lazy_head is None:
        lazy_head = split is not None and device.type == "cpu"
    if lazy_head and split is None:
        raise ValueError("lazy_head=True needs a model with a plain linear LM head "
                         "(refdec.decode.plain_head.split_forward_fn)")
    vocab = int(text_config(model).vocab_size)
    rng = np.random.default_rng(0)
    prompt = torch.from_numpy(rng.integers(3, min(vocab, 30000), size=cache_len)).unsqueeze(0).to(device)
    nodes = tuple(sorted(set(int(n) for n in nodes)))
    times: dict[int, list[float]] = {n: [] for n in nodes}
    head_times: list[float] = []
    chunk_rows = 4
    with torch.inference_mode():
        cache = new_cache()
        cache_kw = cache_kwarg(model)
        model(input_ids=prompt, use_cache=True, logits_to_keep=1, **{cache_kw: cache})
        for rep in range(warmup + repeats):
            order = nodes if rep % 2 == 0 else tuple(reversed(nodes))
            for n in order:
                tree = DraftTree.chain(rng.integers(3, min(vocab, 30000), size=n))
                inputs = build_tree_inputs(tree, 5, cache_len, spec, device)
                kwargs = dict(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                              attention_mask=inputs.attention_mask)
                t0 = time.perf_counter()
                if lazy_head:
                    out = split[0](cache, **kwargs)[0]  # [1 + n, D]
                    out[-1, :1].cpu()  # wait for the device
                else:  # the model's own forward, as the engine verifies without a lazy head
                    out = model(use_cache=True, **kwargs, **{cache_kw: cache}).logits[0]
                    out.argmax(-1).cpu()
                elapsed = time.perf_counter() - t0
                if lazy_head and n == nodes[-1]:
                    t0 = time.perf_counter()
                    split[1].logits(out[:chunk_rows]).argmax(-1).tolist()
                    if rep >= warmup:
                        head_times.append(time.perf_counter() - t0)
                del out
                compact(cache, cache_len, None, 0)  # back to the prompt
                if rep >= warmup:
                    times[n].append(elapsed)
    seconds = tuple(float(np.min(times[n])) for n in nodes)
    meta = {"cache_len": cache_len, "repeats": repeats, "threads": torch.get_num_threads(),
            "samples": {str(n): times[n] for n in nodes}, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    if lazy_head:
        meta["head_samples"] = head_times
        return CostCurve(nodes, seconds, meta, float(np.min(head_times)), chunk_rows)
    return CostCurve(nodes, seconds, meta)


def load_cached(model) -> CostCurve | None:
    path = calibration_path(model)
    if not path.exists():
        return None
    try:
        return CostCurve.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, json.JSONDecodeError):
        return None


def calibrate(model, *, force: bool = False, announce: bool = True, **measure_kwargs) -> CostCurve:
    """The model's cost curve: read from the calibration cache, or measured and saved.

    Measuring takes a few seconds to half a minute; with ``announce`` it says so on stderr,
    one line: what is measured, for which (dtype, device, threads), how long it took and
    where the curve is kept. ``refdec calibrate`` runs this ahead of time."""
    if not force:
        cached = load_cached(model)
        if cached is not None:
            return cached
    path = calibration_path(model)
    device = next(model.parameters()).device
    if announce:
        print(f"refdec: measuring this model's verification cost against draft size, once for "
              f"{str(model.dtype).replace('torch.', '')} on {device.type} with {torch.get_num_threads()} threads "
              f"(cached for later runs) ...", end="", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    curve = measure(model, **measure_kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, [json.dumps(curve.to_json(), indent=1).encode()])
    if announce:
        print(f" {time.perf_counter() - t0:.1f} s ({path})", file=sys.stderr, flush=True)
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
