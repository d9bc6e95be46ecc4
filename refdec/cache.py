"""KV cache handling for tree verification.

refdec uses ``transformers.DynamicCache()`` built WITHOUT a model config: every
layer is a plain ``DynamicLayer`` that keeps all entries, sliding-window layers
included (the model applies the window through the mask). A config-built cache
keeps only ``window - 1`` entries in sliding layers, so the rejected tree nodes
of a step would evict real history.

Invariant kept by the decoding loop: the cache holds the keys/values of every
token of the sequence except the last one (the *root* of the next tree), in
order, so ``cache length == position of the root``.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def new_cache() -> DynamicCache:
    """An empty cache that never evicts (see module docstring)."""
    return DynamicCache()


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def check_cache_layers(cache: DynamicCache) -> None:
    """Raise if a layer is not a plain full ``DynamicLayer`` (compaction would be wrong)."""
    for layer_idx, layer in enumerate(cache.layers):
        if type(layer) is not DynamicLayer:
            raise TypeError(
                f"cache layer {layer_idx} is {type(layer).__name__}; tree verification needs plain "
                "DynamicLayer layers (build the cache with DynamicCache() and no config)"
            )


def compact(cache: DynamicCache, base: int, keep_offsets: torch.Tensor | None, n_keep: int) -> None:
    """Keep entries ``[0, base)`` followed by entries ``base + keep_offsets``, drop the rest.

    ``base``: number of leading entries kept as they are (prefix + root).
    ``keep_offsets``: int64 tensor [n_keep], increasing offsets past ``base`` of the
    entries to keep (the accepted tree nodes, in path order), or ``None`` when
    they are exactly ``0 .. n_keep-1`` (a chain prefix: a plain truncation).
    Per layer: one gather-copy into place plus a view per K and V.
    """
    end = base + n_keep
    for layer in cache.layers:
        if not layer.is_initialized:
            continue
        keys, values = layer.keys, layer.values
        if keep_offsets is not None:
            src = keep_offsets + base
            # advanced indexing copies before the write, so overlapping src/dst is safe
            keys[:, :, base:end] = keys[:, :, src]
            values[:, :, base:end] = values[:, :, src]
        layer.keys = keys[:, :, :end]
        layer.values = values[:, :, :end]
