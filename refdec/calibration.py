"""The verification cost curve of one model on this machine: seconds per forward
against draft-tree size.

On a CPU a tree-verification forward costs more the more rows it has (Gemma 3
270M, 2 threads: 1 node ~ 0.1 s, 64 ~ 0.5 s); on a GPU it barely grows. The
"auto" budget (refdec.budget.AutoBudget) weighs the expected accepted length of
a tree against this curve.

    curve = calibrate(model)          # ~10-30 s the first time, then read from disk
    curve(16)                         # seconds for a forward with 16 draft nodes
    CostCurve([1, 64], [1.0, 1.0])    # a synthetic (GPU-like, flat) curve

With a lazy head (the decoder's default on a CPU, refdec.verify.LazyRowLogits) the
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
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from refdec.atomic import atomic_write

DEFAULT_NODES = (0, 1, 2, 4, 8, 16, 24, 32, 48, 64)
_FORMAT = 2  # 2: head_chunk_seconds, head_chunk_rows
# Part of the cache key: bump when the verification forward changes (its cost curve with it).
FORWARD_VERSION = "lazy-head-1"  # backbone curve + head chunk (was "mm-head-1-min": the whole tree's head)


@dataclass(frozen=True)
class CostCurve:
    """Forward cost (seconds) at draft-tree sizes ``nodes``, linearly interpolated between
    them and extrapolated linearly past the last point.

    ``nodes``: increasing ints >= 0 (draft nodes; a forward feeds ``1 + n`` rows).
    ``seconds``: the forward time at each size (minimum over repeats); with
    ``head_chunk_seconds`` set, the backbone's time only (no LM head).
    ``head_chunk_seconds``: None when ``seconds`` include every row's head, else the
    time of the head on one chunk of ``head_chunk_rows`` rows (lazy head).
    """

    nodes: tuple
    seconds: tuple
    meta: dict | None = field(default=None, compare=False)
    head_chunk_seconds: float | None = None
    head_chunk_rows: int = 4

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
        if self.head_chunk_seconds is not None:
            head = float(self.head_chunk_seconds)
            if not np.isfinite(head) or head < 0:
                raise ValueError(f"CostCurve head_chunk_seconds must be finite and >= 0, got {self.head_chunk_seconds}")
            object.__setattr__(self, "head_chunk_seconds", head)
        if isinstance(self.head_chunk_rows, bool) or int(self.head_chunk_rows) < 1:
            raise ValueError(f"CostCurve head_chunk_rows must be an int >= 1, got {self.head_chunk_rows!r}")
        object.__setattr__(self, "head_chunk_rows", int(self.head_chunk_rows))

    @property
    def lazy_head(self) -> bool:
        return self.head_chunk_seconds is not None

    def head_seconds(self, expected_accepted):
        """Head cost of a step that accepts ``expected_accepted`` nodes (float or float64 array):
        0 for a curve whose ``seconds`` include the head; else the chunks the walk visits,
        ``max(1, (k + 2.5) / rows)`` (k + 1 rows on the path plus, on average, half a chunk)."""
        if self.head_chunk_seconds is None:
            return np.zeros_like(np.asarray(expected_accepted, dtype=np.float64))
        chunks = np.maximum(1.0, (np.asarray(expected_accepted, dtype=np.float64) + 2.5) / self.head_chunk_rows)
        return self.head_chunk_seconds * chunks

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

    def __call__(self, n: int, expected_accepted: float = 0.0) -> float:
        """Seconds for a step verifying ``n`` nodes that accepts ``expected_accepted`` of them."""
        return float(self.table(int(n))[int(n)] + self.head_seconds(expected_accepted))

    def relative(self) -> dict:
        """{n: cost(n) / cost(0)} at the measured sizes (cost(0) interpolated if not measured), a
        lazy head counted for a step that accepts nothing."""
        base = self(0)
        head = float(self.head_seconds(0.0))
        return {n: (s + head) / base for n, s in zip(self.nodes, self.seconds)}

    def to_json(self) -> dict:
        return {"format": _FORMAT, "nodes": list(self.nodes), "seconds": list(self.seconds),
                "head_chunk_seconds": self.head_chunk_seconds, "head_chunk_rows": self.head_chunk_rows,
                "meta": self.meta or {}}

    @classmethod
    def from_json(cls, data: dict) -> "CostCurve":
        if data.get("format") != _FORMAT:
            raise ValueError(f"calibration format {data.get('format')!r}, expected {_FORMAT}")
        return cls(tuple(data["nodes"]), tuple(data["seconds"]), data.get("meta"),
                   data.get("head_chunk_seconds"), int(data.get("head_chunk_rows", 4)))


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
            warmup: int = 1, lazy_head: bool | None = None) -> CostCurve:
    """Times tree-verification forwards of ``1 + n`` rows over a cache of ``cache_len`` tokens.

    The trees are chains (the mask shape does not change the cost of an SDPA forward);
    sizes are interleaved across repeats so that load drifts on a shared machine hit all
    sizes alike. Returns the per-size minimum (load only adds time).

    ``lazy_head`` (default: as the decoder, i.e. a plain-head model on a CPU): time the
    backbone alone per size and the head on one chunk of rows; else the whole forward.
    """
    import torch

    from refdec.cache import cache_kwarg, compact, new_cache
    from refdec.compat import text_config
    from refdec.masks import build_tree_inputs, mask_spec_for
    from refdec.tree import DraftTree
    from refdec.verify import split_forward_fn, tree_forward_fn

    spec = mask_spec_for(model)
    tree_forward = tree_forward_fn(model)
    split = split_forward_fn(model)
    device = next(model.parameters()).device
    if lazy_head is None:
        lazy_head = split is not None and device.type == "cpu"
    if lazy_head and split is None:
        raise ValueError("lazy_head=True needs a model with a plain linear LM head (refdec.verify.split_forward_fn)")
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
                elif tree_forward is not None:  # the decoder's own verification forward
                    out = tree_forward(cache, **kwargs)
                    out.argmax(-1).cpu()
                else:
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
