"""KV cache handling for tree verification.

refdec uses a ``transformers.DynamicCache`` built WITHOUT a model config: every
layer keeps all entries, sliding-window layers included (the model applies
the window through the mask). A config-built cache keeps only ``window - 1``
entries in sliding layers, so the rejected tree nodes of a step would evict
real history.

The layers are :class:`GrowingLayer`, a ``DynamicLayer`` that appends into a
preallocated buffer (capacity doubles) instead of ``torch.cat``-ing the whole
history at every step; ``keys``/``values`` are views of the filled part.
``new_cache(preallocate=False)`` gives plain ``DynamicLayer`` layers.

Invariant kept by the decoding loop: the cache holds the keys/values of every
token of the sequence except the last one (the *root* of the next tree), in
order, so ``cache length == position of the root``.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

_MIN_CAPACITY = 256


class GrowingLayer(DynamicLayer):
    """A full (never evicting) cache layer over a buffer of growing capacity.

    ``prefill_window`` (set by :func:`set_prefill_window` while a prompt is prefilled in
    chunks): a sliding-window layer then presents to attention only its last
    ``prefill_window - 1`` entries plus the new ones, as transformers'
    ``DynamicSlidingWindowLayer`` does (and reports the matching mask sizes), while it
    still keeps every entry. ``None`` (the decoding loop, which passes its own masks):
    every entry is visible.
    """

    prefill_window: int | None = None

    @property
    def is_sliding(self) -> bool:
        return self.prefill_window is not None

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if self.prefill_window is None:
            return super().get_mask_sizes(query_length)
        past = self.get_seq_length()  # masks are built before this forward's update
        visible = min(past, self.prefill_window - 1)
        return visible + query_length, past - visible

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buf = None
        self._value_buf = None
        self._length = 0

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        capacity = max(_MIN_CAPACITY, 2 * needed)
        key_buf = key_states.new_empty(*key_states.shape[:-2], capacity, key_states.shape[-1])
        value_buf = value_states.new_empty(*value_states.shape[:-2], capacity, value_states.shape[-1])
        if self._length:
            key_buf[..., : self._length, :] = self._key_buf[..., : self._length, :]
            value_buf[..., : self._length, :] = self._value_buf[..., : self._length, :]
        self._key_buf, self._value_buf = key_buf, value_buf

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._length + key_states.shape[-2]
        if self._key_buf is None or end > self._key_buf.shape[-2]:
            self._grow(key_states, value_states, end)
        self._key_buf[..., self._length:end, :] = key_states
        self._value_buf[..., self._length:end, :] = value_states
        self._set_length(end)
        if self.prefill_window is not None:
            visible = self.prefill_window - 1 + key_states.shape[-2]
            if visible < end:
                return self.keys[..., end - visible:, :], self.values[..., end - visible:, :]
        return self.keys, self.values

    def _set_length(self, length: int) -> None:
        self._length = length
        self.keys = self._key_buf[..., :length, :]
        self.values = self._value_buf[..., :length, :]

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative number of tokens to remove, got {tokens_to_remove}")
        if tokens_to_remove and self.is_initialized:
            self._set_length(self._length + tokens_to_remove)

    def reset(self) -> None:
        super().reset()
        self._key_buf = self._value_buf = None
        self._length = 0

    def batch_repeat_interleave(self, repeats: int) -> None:  # pragma: no cover - batching is not supported
        raise NotImplementedError("refdec caches hold one sequence")

    def batch_select_indices(self, indices: torch.Tensor) -> None:  # pragma: no cover
        raise NotImplementedError("refdec caches hold one sequence")


class _GrowingCache(DynamicCache):
    """``DynamicCache()`` (no config) whose lazily created layers are :class:`GrowingLayer`."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_class_to_replicate = GrowingLayer


def set_prefill_window(cache: DynamicCache, layer_indices: list[int], window: int | None) -> None:
    """Sets ``prefill_window`` of the given (sliding-window) layers of a :func:`new_cache`
    cache that exist yet; ``None`` turns it off. Between the chunks of a prefill, so that
    a sliding layer's attention reads ``window - 1 + chunk`` keys instead of all of them."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be an int >= 1 or None, got {window!r}")
    for layer_idx in layer_indices:
        if layer_idx < len(cache.layers) and isinstance(cache.layers[layer_idx], GrowingLayer):
            cache.layers[layer_idx].prefill_window = window


def cache_kwarg(module: torch.nn.Module) -> str:
    """The name ``module.forward`` takes the KV cache under: ``cache`` in newer transformers,
    ``past_key_values`` (deprecated there, removed in 5.40) before."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def new_cache(preallocate: bool = True) -> DynamicCache:
    """An empty cache that never evicts (see module docstring)."""
    return _GrowingCache() if preallocate else DynamicCache()


def compact(cache: DynamicCache, base: int, keep_offsets: torch.Tensor | None, n_keep: int) -> None:
    """Keep entries ``[0, base)`` followed by entries ``base + keep_offsets``, drop the rest.

    ``base``: number of leading entries kept as they are (prefix + root).
    ``keep_offsets``: int64 tensor [n_keep], increasing offsets past ``base`` of the
    entries to keep (the accepted tree nodes, in path order), or ``None`` when
    they are exactly ``0 .. n_keep-1`` (a chain prefix: a plain truncation).
    Per layer: one gather-copy into place per K and V (none for a chain prefix),
    then the length is cut.
    """
    end = base + n_keep
    for layer_idx, layer in enumerate(cache.layers):
        if not layer.is_initialized:
            continue
        if type(layer) not in (GrowingLayer, DynamicLayer):
            raise TypeError(
                f"cache layer {layer_idx} is {type(layer).__name__}; tree verification needs full layers "
                "(refdec.cache.new_cache(), or DynamicCache() without a config)"
            )
        keys, values = layer.keys, layer.values
        if keep_offsets is not None:
            src = keep_offsets + base
            # advanced indexing copies before the write, so overlapping src/dst is safe
            keys[:, :, base:end] = keys[:, :, src]
            values[:, :, base:end] = values[:, :, src]
        if isinstance(layer, GrowingLayer):
            layer._set_length(end)
        else:
            layer.keys = keys[:, :, :end]
            layer.values = values[:, :, :end]
