"""The verification forward with fixed shapes, replayable as a CUDA graph.

A CUDA graph replays recorded kernels on the same memory: every shape and every buffer
address must be the same at each replay, and nothing may run on the host in between. The
engine's step changes both: T (the query rows: root + nodes) every step, the cache's length
S every step. :class:`StaticStep` gives the backbone's forward fixed shapes:

* T rounded up to a bucket (:data:`QUERY_BUCKETS`); the padding rows are the root again, see
  only themselves, and are written to cache slots past those the step keeps;
* the cache in *static mode* (refdec.transformers.cache.make_static): one zero-filled buffer per layer
  of fixed capacity C (``S + the most tokens any row may still emit + T``, rounded up), into which
  a forward writes its T rows at slots held in a persistent device tensor (``index_copy_``) and
  whose whole C slots attention reads: the masks [B, 1, T, C] hide the holes and every slot past
  ``S + T`` (refdec.transformers.masks.device_tree_inputs with ``rows`` and ``width``);
* with ``cuda_graphs`` the forward is captured once per (forward, B, T bucket, cache buffers)
  and replayed on persistent input buffers (ids, positions, masks) refilled each step.

The step keeps its buffers from one decode to the next: a new prompt's cache is copied into them
(when its rows fit), so the graphs captured once for a batch size stay valid. When the batch's
rows change (a row finishes or joins: refdec.transformers.batch) or a row outgrows C, the step makes the
cache static in new buffers and captures anew. Without
``cuda_graphs`` the same fixed-shape forward runs eagerly: on a CPU the tests check it gives
the engine's tokens, and that each bucket's forward sees one shape and one cache buffer.
Attention over C slots instead of S + T costs more per step; a replayed graph saves the
kernel launches of every layer (what pays depends on the GPU and the model: benchmarks/gpu.py).
"""

from __future__ import annotations

import numpy as np
import torch

from refdec.drafting.tree import DraftTree
from refdec.transformers.batch import RunningBatch
from refdec.transformers.cache import layer_buffers, make_static, set_lengths, static_buffers
from refdec.transformers.masks import DeviceTrees, MaskSpec, TreeInputs, device_tree_inputs

__all__ = ["CAPACITY_STEP", "QUERY_BUCKETS", "StaticStep", "query_bucket"]

# Query-row counts (root + nodes) a forward is padded to; past the last, multiples of 64.
QUERY_BUCKETS = (2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# The static cache's capacity is a multiple of this many slots.
CAPACITY_STEP = 256


def query_bucket(rows: int) -> int:
    """The padded query-row count of a forward over ``rows`` rows (>= 1)."""
    for bucket in QUERY_BUCKETS:
        if rows <= bucket:
            return bucket
    return -(-rows // 64) * 64


class _Captured:
    """One captured forward: its graph, persistent inputs (``inputs``: the forward's keyword
    arguments) and output (overwritten by each replay)."""

    def __init__(self, graph, inputs: dict, output: torch.Tensor) -> None:
        self.graph = graph
        self.inputs = inputs
        self.output = output


def _copy_into(persistent, value) -> None:
    """Refills a persistent input (a tensor, or a dict of mask tensors) with ``value``'s elements."""
    if isinstance(persistent, dict):
        for name, tensor in persistent.items():
            tensor.copy_(value[name])
    else:
        persistent.copy_(value)


def _persistent_like(value):
    """A tensor (or dict of tensors) of ``value``'s shape, dtype, device and strides, for graph inputs:
    the masks keep their aligned row stride (refdec.transformers.masks.MASK_ROW_ALIGN)."""
    if isinstance(value, dict):
        return {name: _persistent_like(tensor) for name, tensor in value.items()}
    return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device).copy_(value)


class StaticStep:
    """Fixed-shape verification forwards for one model (module docstring).

    ``device``: the model's; ``mask_spec``: its masks (refdec.transformers.masks.MaskSpec);
    ``cuda_graphs``: capture and replay each forward (a CUDA device only), else run it eagerly.
    Diagnostics: ``captures`` (graphs captured), ``replays``, ``restaticised`` (times the cache
    was made static).
    """

    def __init__(self, device, mask_spec: MaskSpec, cuda_graphs: bool = False) -> None:
        device = torch.device(device)
        if cuda_graphs and device.type != "cuda":
            raise ValueError(f"cuda_graphs=True needs the model on a CUDA device; it is on {device}")
        self.device = device
        self.mask_spec = mask_spec
        self.cuda_graphs = bool(cuda_graphs)
        self._slots: dict[int, torch.Tensor] = {}  # rows -> int64 [rows]: the slots a forward writes
        self._offsets: dict[int, torch.Tensor] = {}  # rows -> arange(rows)
        self._buffers: tuple | None = None  # the static cache's identity (refdec.transformers.cache.static_buffers)
        self._owned: list | None = None  # its (key, value) buffers, per layer: reused by the next decode
        self._capacity = 0
        self._step_start = 0  # S of the step being run
        self._graphs: dict[tuple, _Captured] = {}
        self._pool = None
        self.captures = self.replays = self.restaticised = 0

    def prepare(self, batch: RunningBatch, trees: list[DraftTree], roots: np.ndarray,
                root_pos: np.ndarray) -> tuple[TreeInputs, DeviceTrees]:
        """The step's inputs at fixed shapes (as refdec.transformers.masks.device_tree_inputs, T padded to
        its bucket, masks over the cache's capacity), the cache made static first where it is not
        (or is too small), and the slots this step's rows are written to set."""
        slots = batch.slots
        rows = query_bucket(1 + max(len(tree) for tree in trees))
        if static_buffers(batch.cache) != self._buffers or slots + rows > self._capacity:
            self._restatic(batch, slots + max(request.room for request in batch.requests) + rows)
        if rows not in self._slots:
            self._offsets[rows] = torch.arange(rows, dtype=torch.int64, device=self.device)
            self._slots[rows] = torch.empty(rows, dtype=torch.int64, device=self.device)
        torch.add(self._offsets[rows], slots, out=self._slots[rows])  # slots S .. S + rows - 1
        self._step_start = slots
        return device_tree_inputs(trees, roots, root_pos, batch.key_pos, self.mask_spec, self.device,
                                  rows=rows, width=self._capacity)

    def _restatic(self, batch: RunningBatch, needed: int) -> None:
        """Makes ``batch``'s cache static with room for ``needed`` slots: in the buffers of the last
        time when they have the batch's rows and room enough (the graphs captured on them stay
        valid: a new decode of one prompt replays the last one's), else in new ones."""
        owned = self._owned
        rows = len(batch.requests)
        in_owned = owned is not None and any(  # a cache already in them (only outgrown) is not copied onto itself
            layer_keys.untyped_storage().data_ptr() == key_buf.untyped_storage().data_ptr()
            for (layer_keys, _), (key_buf, _) in zip(layer_buffers(batch.cache), owned))
        if owned is not None and not in_owned and owned[0][0].shape[0] == rows and needed <= self._capacity:
            self._buffers = make_static(batch.cache, self._capacity, self._slots, reuse=owned)
        else:
            self._owned = None  # before allocating: the old buffers' memory may be reused
            self._graphs.clear()  # captured on the old buffers
            self._capacity = -(-needed // CAPACITY_STEP) * CAPACITY_STEP
            self._buffers = make_static(batch.cache, self._capacity, self._slots)
        self._owned = layer_buffers(batch.cache)
        self.restaticised += 1

    def run(self, forward, cache, inputs: dict) -> torch.Tensor:
        """``forward(cache, **inputs)`` (refdec.transformers.runner.ModelRunner.hidden or .logits) over the
        inputs :meth:`prepare` built: replayed from its graph (captured on first use) or run
        eagerly. Afterwards the cache's entries end past the step's rows (as an appending forward
        leaves them, for the engine's compaction). Returns the forward's output; a replayed one is
        overwritten by the next replay."""
        batch, rows = inputs["input_ids"].shape
        if self.cuda_graphs:
            key = (forward.__name__, batch, rows)
            captured = self._graphs.get(key)
            if captured is None:
                captured = self._graphs[key] = self._capture(forward, cache, inputs)
            else:
                for name, value in inputs.items():
                    _copy_into(captured.inputs[name], value)
                captured.graph.replay()
                self.replays += 1
            output = captured.output
        else:
            output = forward(cache, **inputs)
        set_lengths(cache, self._step_start + rows)
        return output

    def _capture(self, forward, cache, inputs: dict) -> _Captured:
        """Captures ``forward`` over persistent copies of ``inputs`` (warmed up on a side stream first,
        as torch.cuda.graphs asks; the warm-up writes only this step's own cache slots) and replays
        it once, so that its output holds this step's result."""
        persistent = {name: _persistent_like(value) for name, value in inputs.items()}
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                forward(cache, **persistent)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                output = forward(cache, **persistent)
        except RuntimeError as exc:
            raise RuntimeError(f"cuda_graphs=True: capturing the verification forward failed ({exc}); "
                               "decode without cuda_graphs") from exc
        self.captures += 1
        graph.replay()
        return _Captured(graph, persistent, output)
