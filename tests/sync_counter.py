"""Counts the calls of a decoding step that would make the host wait for a GPU.

On a CPU every tensor lives on "the host", so nothing actually waits; :class:`SyncCounter` (a
``torch.overrides.TorchFunctionMode``) counts the calls that would be host syncs with the engine
on a GPU:

* device -> host reads: ``item``, ``tolist``, ``numpy`` / ``__array__``, ``cpu``, ``bool`` /
  ``int`` / ``float`` / ``operator.index`` of a tensor, and ops whose output size depends on the
  data (``nonzero``, ``argwhere``, ``masked_select``, ``unique``, ``repeat_interleave`` without
  ``output_size``, indexing with a bool tensor, ``equal``, ``allclose``);
* blocking copies: ``to`` / ``cuda`` naming a device (and ``copy_`` between a host and a device
  tensor) without ``non_blocking=True``
  (on a GPU the engine names a device only to move data between the host and the GPU; a blocking
  copy waits for the stream), and ``torch.tensor`` / ``torch.as_tensor`` with a ``device``.

The model's own forward (refdec.transformers.runner.ModelRunner.logits / hidden) is not counted: what
transformers does inside it is the model's, not the engine's (on a GPU its output stays there).
Its output, ``torch.tensor(..., device=...)`` and ``to`` outputs count as on the device; ``cpu``
outputs as on the host (the engine moves data to the host with ``cpu()``).

Only tensors made on "the device" count for the reads: those that came out of a torch call
while the mode was on (model outputs, ``torch.arange(..., device=...)``, ...), not those made
from host data (``torch.tensor(list)`` without a device, ``torch.from_numpy``, which the mode
does not see) nor tensors that existed before (weights, the cache).

:func:`count_step_syncs` runs a decode and records the count of every engine step
(refdec.engine.engine._step); the prefill (its first token) is not a step.
"""

from __future__ import annotations

import weakref
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

import refdec.engine.engine as engine
from refdec.transformers.runner import ModelRunner

_READS = {"item", "tolist", "numpy", "__array__", "__bool__", "__int__", "__float__", "__index__", "cpu"}
_DATA_DEPENDENT = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "equal", "allclose"}
_COPIES = {"to", "cuda"}


def _is_bool_tensor(x) -> bool:
    if isinstance(x, torch.Tensor):
        return x.dtype == torch.bool
    if isinstance(x, (tuple, list)):
        return any(_is_bool_tensor(i) for i in x)
    return False


def _names_device(args, kwargs) -> bool:
    if kwargs.get("device") is not None:
        return True
    return any(isinstance(a, (str, torch.device)) or (isinstance(a, torch.Tensor)) for a in args[1:])


class SyncCounter(TorchFunctionMode):
    """``counts``: collections.Counter of would-be syncs by function name; ``total``: their sum."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()
        self.paused = 0  # > 0 inside the model's own forward
        self._device = weakref.WeakValueDictionary()  # id -> tensor, for tensors made "on the device" while the mode is on

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def _on_device(self, x) -> bool:
        return isinstance(x, torch.Tensor) and self._device.get(id(x)) is x

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        counted = None
        if self.paused:
            pass
        elif name in _READS and args and self._on_device(args[0]):
            counted = name
        elif name in _DATA_DEPENDENT:
            counted = name
        elif name == "repeat_interleave" and kwargs.get("output_size") is None and not isinstance(
                args[1] if len(args) > 1 else kwargs.get("repeats"), int):
            counted = name
        elif name in ("__getitem__", "__setitem__", "index_put_", "index_put") and len(args) > 1 \
                and _is_bool_tensor(args[1]):
            counted = f"{name}[bool]"
        elif name in _COPIES and _names_device(args, kwargs) and not kwargs.get("non_blocking", False):
            counted = f"{name}(device)"
        elif name == "copy_" and len(args) > 1 and self._on_device(args[0]) != self._on_device(args[1]) \
                and not (kwargs.get("non_blocking", False) or (len(args) > 2 and args[2])):
            counted = "copy_(host<->device)"
        elif name in ("tensor", "as_tensor") and kwargs.get("device") is not None:
            counted = f"{name}(device=)"
        if counted is not None:
            self.counts[counted] += 1
        out = func(*args, **kwargs)
        if name == "cpu":  # on a CPU the same tensor: from now on it is the host's copy
            self._device.pop(id(out), None)
        if name != "cpu" and (name not in ("tensor", "as_tensor") or kwargs.get("device") is not None):
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self._device[id(t)] = t
        return out


def count_step_syncs(monkeypatch, run) -> list[Counter]:
    """The would-be syncs of each engine step while ``run()`` decodes (a Counter per step)."""
    steps: list[Counter] = []
    real_step = engine._step
    mode: list[SyncCounter] = []

    def counted_step(*args, **kwargs):
        before = Counter(mode[0].counts)
        real_step(*args, **kwargs)
        steps.append(mode[0].counts - before)

    def paused(method):
        def run_paused(*args, **kwargs):
            mode[0].paused += 1
            try:
                return method(*args, **kwargs)
            finally:
                mode[0].paused -= 1
        return run_paused

    monkeypatch.setattr(engine, "_step", counted_step)
    for name in ("logits", "hidden"):
        monkeypatch.setattr(ModelRunner, name, paused(getattr(ModelRunner, name)))
    with SyncCounter() as counter:
        mode.append(counter)
        run()
    return steps
