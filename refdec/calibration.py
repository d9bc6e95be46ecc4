"""The verification cost curve of one model on this machine: seconds per forward
against draft-tree size.

On a CPU a tree-verification forward costs more the more rows it has (Gemma 3
270M, 2 threads: 1 node ~ 0.1 s, 64 ~ 0.5 s); on a GPU it barely grows. The
"auto" budget (refdec.budget.AutoBudget) weighs the expected accepted length of
a tree against this curve.

    curve = calibrate(model)          # ~10-30 s the first time, then read from disk
    curve(16)                         # seconds for a forward with 16 draft nodes
    CostCurve([1, 64], [1.0, 1.0])    # a synthetic (GPU-like, flat) curve

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
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from refdec.atomic import atomic_write

DEFAULT_NODES = (0, 1, 2, 4, 8, 16, 24, 32, 48, 64)
_FORMAT = 1
# Part of the cache key: bump when the verification forward changes (its cost curve with it).
FORWARD_VERSION = "mm-head-1-min"  # -min: per-size minimum of repeats (was the median)


@dataclass(frozen=True)
class CostCurve:
    """Forward cost (seconds) at draft-tree sizes ``nodes``, linearly interpolated between
    them and extrapolated linearly past the last point.

    ``nodes``: increasing ints >= 0 (draft nodes; a forward feeds ``1 + n`` rows).
    ``seconds``: the forward time at each size (minimum over repeats).
    """

    nodes: tuple
    seconds: tuple
    meta: dict | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        nodes = tuple(int(n) for n in self.nodes)
        seconds = tuple(float(s) for s in self.seconds)
        if len(nodes) != len(seconds) or not nodes:
            raise ValueError(f"CostCurve needs as many nodes as seconds (>= 1), got {len(nodes)} and {len(seconds)}")
        if any(b <= a for a, b in zip(nodes, nodes[1:])) or nodes[0] < 0:
            raise ValueError(f"CostCurve nodes must be increasing ints >= 0, got {nodes}")
        if any(not np.isfinite(s) or s <= 0 for s in seconds):
            raise ValueError(f"CostCurve seconds must be finite and > 0, got {seconds}")
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "seconds", seconds)

    def table(self, max_nodes: int) -> np.ndarray:
        """float64 array of shape (max_nodes + 1,): the cost of n = 0 .. max_nodes draft nodes."""
        n = np.arange(max_nodes + 1, dtype=np.float64)
        xs = np.asarray(self.nodes, dtype=np.float64)
        ys = np.asarray(self.seconds, dtype=np.float64)
        out = np.interp(n, xs, ys)
        if len(xs) >= 2 and max_nodes > xs[-1]:
            slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
            tail = n > xs[-1]
            out[tail] = ys[-1] + slope * (n[tail] - xs[-1])
        return out

    def __call__(self, n: int) -> float:
        return float(self.table(int(n))[int(n)])

    def relative(self) -> dict:
        """{n: cost(n) / cost(0)} at the measured sizes (cost(0) interpolated if not measured)."""
        base = self(0)
        return {n: s / base for n, s in zip(self.nodes, self.seconds)}

    def to_json(self) -> dict:
        return {"format": _FORMAT, "nodes": list(self.nodes), "seconds": list(self.seconds),
                "meta": self.meta or {}}

    @classmethod
    def from_json(cls, data: dict) -> "CostCurve":
        if data.get("format") != _FORMAT:
            raise ValueError(f"calibration format {data.get('format')!r}, expected {_FORMAT}")
        return cls(tuple(data["nodes"]), tuple(data["seconds"]), data.get("meta"))


def flat_curve(seconds: float = 1.0) -> CostCurve:
    """A GPU-like curve: verifying any tree costs as much as one token."""
    return CostCurve((0, 1), (seconds, seconds))


def model_key(model) -> str:
    """Identifies (model config, dtype, device, torch threads) for the calibration cache."""
    import torch

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
    from refdec.models import cache_dir

    return cache_dir() / "calibration" / f"{model_key(model)}.json"


def measure(model, nodes=DEFAULT_NODES, *, cache_len: int = 512, repeats: int = 3,
            warmup: int = 1) -> CostCurve:
    """Times tree-verification forwards of ``1 + n`` rows over a cache of ``cache_len`` tokens.

    The trees are chains (the mask shape does not change the cost of an SDPA forward);
    sizes are interleaved across repeats so that load drifts on a shared machine hit all
    sizes alike. Returns the per-size minimum (load only adds time).
    """
    import torch

    from refdec.cache import compact, new_cache
    from refdec.masks import build_tree_inputs, mask_spec_for
    from refdec.tree import DraftTree
    from refdec.verify import tree_forward_fn

    spec = mask_spec_for(model)
    tree_forward = tree_forward_fn(model)
    device = next(model.parameters()).device
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") \
        else model.config
    vocab = int(config.vocab_size)
    rng = np.random.default_rng(0)
    prompt = torch.from_numpy(rng.integers(3, min(vocab, 30000), size=cache_len)).unsqueeze(0).to(device)
    nodes = tuple(sorted(set(int(n) for n in nodes)))
    times: dict[int, list[float]] = {n: [] for n in nodes}
    with torch.inference_mode():
        cache = new_cache()
        model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        for rep in range(warmup + repeats):
            order = nodes if rep % 2 == 0 else tuple(reversed(nodes))
            for n in order:
                tree = DraftTree.chain(rng.integers(3, min(vocab, 30000), size=n))
                inputs = build_tree_inputs(tree, 5, cache_len, spec, device)
                t0 = time.perf_counter()
                if tree_forward is not None:  # the decoder's own verification forward
                    logits = tree_forward(cache, input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                                          attention_mask=inputs.attention_mask)
                else:
                    logits = model(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                                   attention_mask=inputs.attention_mask, past_key_values=cache,
                                   use_cache=True).logits[0]
                logits.argmax(-1).cpu()
                elapsed = time.perf_counter() - t0
                del logits
                compact(cache, cache_len, None, 0)  # back to the prompt
                if rep >= warmup:
                    times[n].append(elapsed)
    seconds = tuple(float(np.min(times[n])) for n in nodes)
    meta = {"cache_len": cache_len, "repeats": repeats, "threads": torch.get_num_threads(),
            "samples": {str(n): times[n] for n in nodes}, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    return CostCurve(nodes, seconds, meta)


def load_cached(model) -> CostCurve | None:
    path = calibration_path(model)
    if not path.exists():
        return None
    try:
        return CostCurve.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, json.JSONDecodeError):
        return None


def calibrate(model, *, force: bool = False, **measure_kwargs) -> CostCurve:
    """The model's cost curve: read from the calibration cache, or measured and saved."""
    if not force:
        cached = load_cached(model)
        if cached is not None:
            return cached
    curve = measure(model, **measure_kwargs)
    path = calibration_path(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, [json.dumps(curve.to_json(), indent=1).encode()])
    return curve


def model_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
