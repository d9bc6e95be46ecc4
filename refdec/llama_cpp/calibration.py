"""The llama.cpp backend's cost curve: seconds of one ``llama_decode`` against tree size, with
the backbone rows and the logits rows apart.

A logits row (the LM head over a 150k-260k vocabulary) costs several backbone rows on a CPU,
so the curve holds ``seconds[n]``: a decode of ``1 + n`` entries over a 512-token context with
logits for one entry, and ``head_chunk_seconds``: one more logits row (``head_chunk_rows`` =
1), the median over the measured sizes of ``(all rows' logits - one row's) / n``. The
"auto" budget (refdec.sizing.budget.AutoBudget) prices a step at ``seconds[n]`` plus the head rows
its walk is expected to need.

Measured once per (model file, threads, batch sizes, KV types, flash attention, llama-cpp-python
version), announced on stderr, outside any timed decode, and cached as JSON under
``refdec.gguf_files.cache_dir()/calibration/``: a warm-up round first, then three rounds over the
sizes, the median of each (refdec.sizing.cost_curve.calibration_order); a curve whose rounds disagree is
kept for the process only, with a warning on stderr (refdec.sizing.cost_curve.repeats_disagree).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from refdec.atomic import atomic_write
from refdec.sizing.cost_curve import (CALIBRATED_SIZES, CostCurve, calibration_order, median_seconds, repeats_disagree,
                               warn_not_cached)
from refdec.gguf_files import cache_dir
from refdec.llama_cpp.api import ggml_cpu_build, llama_version

__all__ = ["auto_cost_curve", "calibration_path", "measure"]

FORWARD_VERSION = "llama-tree-1"


def _key(backend) -> str:
    llm = backend.llm
    params = llm.context_params
    path = Path(llm.model_path)
    stat = path.stat()
    fields = {
        "model": str(path.resolve()), "size": stat.st_size, "mtime": int(stat.st_mtime),
        "threads": backend.ctx.n_threads(), "n_batch": backend.ctx.n_batch, "n_ubatch": int(params.n_ubatch),
        "type_k": int(params.type_k), "type_v": int(params.type_v), "flash_attn": int(params.flash_attn_type),
        "llama_cpp_python": llama_version(), "ggml_cpu": ggml_cpu_build(), "forward": FORWARD_VERSION,
        "max_tree": backend.max_tree,
        "exact": bool(getattr(backend, "exact", False)),
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]


def calibration_path(backend) -> Path:
    return cache_dir() / "calibration" / f"llama-{_key(backend)}.json"


def measure(backend, nodes=CALIBRATED_SIZES, *, cache_len: int = 512, repeats: int = 3, warmup: int = 1,
            seed: int = 0) -> CostCurve:
    """Times ``llama_decode`` of ``1 + n`` entries for each ``n`` in ``nodes`` over ``cache_len``
    tokens of context (random token ids: the cost does not depend on them), with one logits row
    and with a logits row for every entry, in refdec.sizing.cost_curve.calibration_order: ``warmup``
    rounds (dropped; one decode per size, every logits row) then ``repeats`` rounds over the
    sizes, alternately ascending and descending; each size's seconds are the median of its rounds.
    ``meta["disagreement"]``: why the rounds disagree (refdec.sizing.cost_curve.repeats_disagree; then
    the curve is not cached), else None."""
    ctx = backend.ctx
    invariant = bool(getattr(backend, "exact", False))  # timed as exact mode verifies
    nodes = tuple(sorted(n for n in set(nodes) if n <= backend.max_tree))
    cache_len = max(1, min(cache_len, ctx.n_ctx - 2 - max(nodes)))
    rng = np.random.default_rng(seed)
    high = min(backend.vocab_size, 32000)
    times = {all_rows: {n: [] for n in nodes} for all_rows in (False, True)}
    backend.clear_prefix_cache()  # its cells would leave the measured context no room
    seq = backend.take_seq()
    scratch = backend.take_seq() if getattr(backend, "scratch_chains", False) else None
    try:
        context = rng.integers(0, high, cache_len).astype(np.int32)
        for begin in range(0, cache_len, ctx.prefill_chunk):
            part = context[begin: begin + ctx.prefill_chunk]
            ctx.decode(part, np.arange(begin, begin + len(part)), [[seq]] * len(part), np.zeros(len(part), bool))
        for rnd, n in calibration_order(nodes, repeats, warmup):
            rows = 1 + n
            tokens = rng.integers(0, high, rows).astype(np.int32)
            positions = cache_len + np.arange(rows, dtype=np.int32)
            last_only = np.zeros(rows, dtype=bool)
            last_only[-1] = True
            for all_rows in ((True,) if rnd < warmup else (False, True)):
                into = seq
                if scratch is not None:  # a state llama.cpp cannot roll back: decode on a copy, then drop it
                    ctx.seq_copy(seq, scratch)
                    into = scratch
                t0 = time.perf_counter()
                ctx.decode(tokens, positions, [[into]] * rows, np.ones(rows, bool) if all_rows else last_only,
                           invariant=invariant)
                elapsed = time.perf_counter() - t0
                if scratch is not None:
                    ctx.seq_remove(scratch)
                else:
                    ctx.seq_remove(seq, cache_len, -1)
                if rnd >= warmup:
                    times[all_rows][n].append(elapsed)
    finally:
        backend.release_seq(seq)
        if scratch is not None:
            backend.release_seq(scratch)
    one, every = median_seconds(times[False]), median_seconds(times[True])
    per_row = [(e - o) / n for n, o, e in zip(nodes, one, every) if n > 0]
    head = max(0.0, float(np.median(per_row))) if per_row else 0.0
    return CostCurve(nodes, one, meta={"cache_len": cache_len, "repeats": repeats, "warmup": warmup,
                                       "engine": "llama.cpp", "model": str(backend.llm.model_path),
                                       "all_logits_seconds": list(every),
                                       "samples": {str(n): t for n, t in times[False].items()},
                                       "disagreement": repeats_disagree(times[False]),
                                       "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")},
                     head_chunk_seconds=head, head_chunk_rows=1)


# curves measured in this process but not cached (their rounds disagreed), by calibration path:
# measured once per process, and said so once
_UNCACHED: dict[str, CostCurve] = {}


def auto_cost_curve(backend, *, announce: bool = True) -> CostCurve:
    """The backend's cost curve, measured on first use (a few seconds, on stderr) and then read.
    A curve whose rounds disagree (a busy machine) is not cached: this process keeps it (the
    budget corrects it from the steps it times, refdec.sizing.cost_model), a warning on stderr says why."""
    path = calibration_path(backend)
    if path.is_file():
        try:
            return CostCurve.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, json.JSONDecodeError):
            pass  # an older or damaged file: measure again
    if str(path) in _UNCACHED:
        return _UNCACHED[str(path)]
    if announce:
        print(f"refdec: measuring llama.cpp's decode cost against tree size once for this model and thread "
              f"count (cached at {path})", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    curve = measure(backend)
    disagreement = (curve.meta or {}).get("disagreement")
    if disagreement:
        _UNCACHED[str(path)] = curve
        warn_not_cached(disagreement)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, [json.dumps(curve.to_json(), indent=1).encode()])
    if announce:
        print(f"refdec: measured in {time.perf_counter() - t0:.1f} s: one entry {curve(0) * 1e3:.1f} ms, "
              f"{curve.nodes[-1]} nodes {curve.seconds[-1] * 1e3:.1f} ms, one logits row "
              f"{curve.head_chunk_seconds * 1e3:.2f} ms", file=sys.stderr, flush=True)
    return curve
