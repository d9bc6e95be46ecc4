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

A batch's cache is one ``[B, H, S, D]`` tensor per layer (``S`` = slots shared by
all rows); the engine moves entries with the row API below (:func:`gather_slots`,
:func:`append_rows`, :func:`select_rows`), the only code that touches a layer's tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from refdec.tokens import is_int

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
    # Static mode (refdec.transformers.static_step, :func:`make_static`): ``rows -> int64 [rows]`` on the
    # buffer's device, the slots a forward of that many query rows writes (persistent tensors the
    # step refills); the forward then returns the whole buffer. None: the entries are appended.
    static_slots: dict[int, torch.Tensor] | None = None

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
        if self.static_slots is not None:  # no host-side state changes: a CUDA graph replays this
            slots = self.static_slots[key_states.shape[-2]]
            self._key_buf.index_copy_(2, slots, key_states)
            self._value_buf.index_copy_(2, slots, value_states)
            return self._key_buf, self._value_buf
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._length + key_states.shape[-2]
        if self._key_buf is None or end > self._key_buf.shape[-2]:
            self._grow(key_states, value_states, end)
        self._key_buf[..., self._length:end, :] = key_states
        self._value_buf[..., self._length:end, :] = value_states
        self.set_length(end)
        if self.prefill_window is not None:
            visible = self.prefill_window - 1 + key_states.shape[-2]
            if visible < end:
                return self.keys[..., end - visible:, :], self.values[..., end - visible:, :]
        return self.keys, self.values

    def set_length(self, length: int) -> None:
        """The first ``length`` buffered entries become the layer's keys / values."""
        self._length = length
        self.keys = self._key_buf[..., :length, :]
        self.values = self._value_buf[..., :length, :]

    def replace_buffers(self, key_buf: torch.Tensor, value_buf: torch.Tensor, length: int) -> None:
        """New buffers ([B, H, capacity, D]) whose first ``length`` slots are the entries."""
        self._key_buf, self._value_buf = key_buf, value_buf
        self.set_length(length)

    def keep_rows(self, rows: torch.Tensor, start: int, end: int) -> None:
        """Keep the batch rows ``rows`` (int64 [B']) and the slots ``[start, end)``, renumbered from 0."""
        # index_select copies; the slice past ``start`` is a view, whose capacity update() handles
        self.replace_buffers(self._key_buf.index_select(0, rows)[:, :, start:],
                             self._value_buf.index_select(0, rows)[:, :, start:], end - start)

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative number of tokens to remove, got {tokens_to_remove}")
        if tokens_to_remove and self.is_initialized:
            self.set_length(self._length + tokens_to_remove)

    def reset(self) -> None:
        super().reset()
        self._key_buf = self._value_buf = None
        self._length = 0

    def batch_repeat_interleave(self, repeats: int) -> None:  # pragma: no cover - not used by refdec
        raise NotImplementedError("refdec moves batch rows with refdec.transformers.cache's row API")

    def batch_select_indices(self, indices: torch.Tensor) -> None:  # pragma: no cover
        raise NotImplementedError("refdec moves batch rows with refdec.transformers.cache's row API")


class _GrowingCache(DynamicCache):
    """``DynamicCache()`` (no config) whose lazily created layers are :class:`GrowingLayer`."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_class_to_replicate = GrowingLayer


def set_prefill_window(cache: DynamicCache, layer_indices: list[int], window: int | None) -> None:
    """Sets ``prefill_window`` of the given (sliding-window) layers of a :func:`new_cache`
    cache that exist yet; ``None`` turns it off. Between the chunks of a prefill, so that
    a sliding layer's attention reads ``window - 1 + chunk`` keys instead of all of them."""
    if window is not None and (not is_int(window) or window < 1):
        raise ValueError(f"window must be an int >= 1 or None, got {window!r}")
    for layer_idx in layer_indices:
        if layer_idx < len(cache.layers) and isinstance(cache.layers[layer_idx], GrowingLayer):
            cache.layers[layer_idx].prefill_window = window


def make_static(cache: DynamicCache, capacity: int, slots: dict[int, torch.Tensor],
                reuse: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> tuple[int, ...]:
    """Puts every layer of ``cache`` (a :func:`new_cache` cache) in static mode: a zero-filled
    buffer of ``capacity`` slots holding the layer's entries (stale slots never hold NaN, which a
    masked key would still spread through the attention's value product), into which a forward of
    ``r`` query rows writes at ``slots[r]`` (int64 [r] on the layer's device; see
    :attr:`GrowingLayer.static_slots`). ``reuse``: per layer, the (key, value) buffers to fill
    instead of new ones (the same shapes as new ones would have: a CUDA graph captured on them
    stays valid). Returns the buffers' identity (:func:`static_buffers`)."""
    for layer_idx, layer in enumerate(layers(cache)):
        if not isinstance(layer, GrowingLayer):
            raise TypeError(f"static mode needs refdec.transformers.cache.new_cache() layers, got {type(layer).__name__}")
        length = layer.get_seq_length()
        if capacity < length:
            raise ValueError(f"capacity {capacity} is less than the cache's {length} entries")
        keys, values = layer.keys, layer.values
        if reuse is None:
            key_buf = keys.new_zeros(*keys.shape[:-2], capacity, keys.shape[-1])
            value_buf = values.new_zeros(*values.shape[:-2], capacity, values.shape[-1])
        else:
            key_buf, value_buf = reuse[layer_idx]
            if key_buf.shape[-2] != capacity or key_buf.shape[:-2] != keys.shape[:-2]:
                raise ValueError(f"layer {layer_idx}: a buffer of shape {tuple(key_buf.shape)} cannot hold "
                                 f"{tuple(keys.shape[:-2])} rows at capacity {capacity}")
            key_buf.zero_()
            value_buf.zero_()
        key_buf[..., :length, :] = keys
        value_buf[..., :length, :] = values
        layer.replace_buffers(key_buf, value_buf, length)
        layer.static_slots = slots
    return static_buffers(cache)


def layer_buffers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (key, value) buffer (static mode: the whole capacity), for :func:`make_static`'s ``reuse``."""
    return [(layer._key_buf, layer._value_buf) for layer in layers(cache)]


def static_buffers(cache: DynamicCache) -> tuple[int, ...]:
    """The identity of ``cache``'s buffers (each layer's key and value buffer addresses and their
    capacity): it changes whenever a row API call or a growth replaces them."""
    return tuple((layer._key_buf.data_ptr(), layer._value_buf.data_ptr(), layer._key_buf.shape[-2])
                 for layer in layers(cache))


def set_lengths(cache: DynamicCache, length: int) -> None:
    """Every layer's first ``length`` buffered slots become its entries (a static-mode forward
    writes its rows without moving the length: :mod:`refdec.transformers.static_step` sets it after)."""
    for layer in layers(cache):
        _set_length(layer, length)


def new_cache(preallocate: bool = True) -> DynamicCache:
    """An empty cache that never evicts (see module docstring)."""
    return _GrowingCache() if preallocate else DynamicCache()


def layers(cache: DynamicCache):
    """The initialised KV layers of ``cache`` (a hybrid model's recurrent layers are skipped: their
    state moves with refdec.transformers.hybrid.state); raises TypeError for a layer that may evict
    entries (only :class:`GrowingLayer` and ``DynamicLayer`` keep them all)."""
    for layer_idx, layer in enumerate(cache.layers):
        if getattr(layer, "refdec_recurrent", False) and not isinstance(layer, GrowingLayer):
            continue  # a recurrent layer holds no KV entries (refdec.transformers.hybrid.state)
        if not layer.is_initialized:
            continue
        if type(layer) not in (GrowingLayer, DynamicLayer) and not getattr(layer, "refdec_recurrent", False):
            raise TypeError(
                f"cache layer {layer_idx} is {type(layer).__name__}; tree verification needs full layers "
                "(refdec.transformers.cache.new_cache(), or DynamicCache() without a config)"
            )
        yield layer


def _set_length(layer, length: int) -> None:
    if isinstance(layer, GrowingLayer):
        layer.set_length(length)
    else:
        layer.keys = layer.keys[:, :, :length]
        layer.values = layer.values[:, :, :length]


class _OnLayerDevices:
    """Index tensors copied once to each device a cache layer lives on (under ``device_map="auto"``
    the layers of one model sit on several devices); ``on(device)`` gives them there, in order
    (no copy for the device they are on)."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self._by_device = {tensors[0].device: tensors}

    def on(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        found = self._by_device.get(device)
        if found is None:
            found = tuple(t.to(device, non_blocking=True) for t in next(iter(self._by_device.values())))
            self._by_device[device] = found
        return found


def gather_slots(cache: DynamicCache, batch_idx: torch.Tensor, src: torch.Tensor, dst: torch.Tensor,
                 new_len: int) -> None:
    """Per row ``b``: slots ``dst[b, j] <- src[b, j]`` (``batch_idx`` int64 [B, 1], ``src`` / ``dst``
    int64 [B, K], on any device: each layer gets them on its own), then cut the cache to ``new_len``
    slots. Padding entries repeat a real (src, dst) pair, so duplicate writes carry the same value."""
    indices = _OnLayerDevices(batch_idx, src, dst)
    for layer in layers(cache):
        keys, values = layer.keys, layer.values
        batch_idx, src, dst = indices.on(keys.device)
        # advanced indices around a slice: [B, K, H, D]; the read copies before the write
        keys[batch_idx, :, dst] = keys[batch_idx, :, src]
        values[batch_idx, :, dst] = values[batch_idx, :, src]
        _set_length(layer, new_len)


def append_rows(cache: DynamicCache, other: DynamicCache) -> int:
    """Appends the batch rows of ``other`` (a cache of the same model) after those of ``cache``.

    Both are padded at the end of the slot dim to the longer one's length ``n``, which is
    returned: a row's entries stay where they were, the slots after them are holes. A growing
    layer gets room for the next steps too (as :meth:`GrowingLayer.update`), so the next
    update does not copy again."""
    n = 0
    for layer, extra in zip(layers(cache), layers(other)):
        slots, other_slots = layer.keys.shape[2], extra.keys.shape[2]
        n = max(slots, other_slots)
        capacity = 2 * n if isinstance(layer, GrowingLayer) else n
        keys = torch.cat([F.pad(layer.keys, (0, 0, 0, capacity - slots)),
                          F.pad(extra.keys, (0, 0, 0, capacity - other_slots))])
        values = torch.cat([F.pad(layer.values, (0, 0, 0, capacity - slots)),
                            F.pad(extra.values, (0, 0, 0, capacity - other_slots))])
        if isinstance(layer, GrowingLayer):
            layer.replace_buffers(keys, values, n)
        else:
            layer.keys, layer.values = keys, values
    return n


def select_rows(cache: DynamicCache, rows: torch.Tensor, start: int, new_len: int) -> None:
    """Keep the batch rows ``rows`` (int64 [B'], on any device: each layer gets them on its own) and the
    slots ``[start, new_len)`` (renumbered from 0)."""
    indices = _OnLayerDevices(rows)
    for layer in layers(cache):
        rows, = indices.on(layer.keys.device)
        if isinstance(layer, GrowingLayer):
            layer.keep_rows(rows, start, new_len)
        else:
            layer.keys = layer.keys.index_select(0, rows)[:, :, start:new_len]
            layer.values = layer.values.index_select(0, rows)[:, :, start:new_len]


def row_entries(cache: DynamicCache, row: int, start: int, end: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of batch row ``row``'s slots ``[start, end)``, per layer: (keys, values), each
    float [1, H, end - start, D] on the layer's device."""
    return [(layer.keys[row:row + 1, :, start:end].clone(), layer.values[row:row + 1, :, start:end].clone())
            for layer in layers(cache)]


def cache_from_entries(entries: list[tuple[torch.Tensor, torch.Tensor]], length: int) -> DynamicCache:
    """A new cache (:func:`new_cache`) of one row holding the first ``length`` slots of ``entries``
    (per layer: (keys, values) float [1, H, n >= length, D], as :func:`row_entries` gives them)."""
    cache = new_cache()
    for layer_idx, (keys, values) in enumerate(entries):
        cache.update(keys[:, :, :length], values[:, :, :length], layer_idx)
    return cache

