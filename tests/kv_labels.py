"""KV caches whose entries are labels: the entry at (batch row b, slot s) holds a number that
says where it came from, so a test reads back which entries a row API call kept and where."""

from __future__ import annotations

import torch

from refdec.transformers.cache import new_cache


def labelled_cache(preallocate: bool, labels: list[list[int]]):
    """A two-layer cache of ``len(labels)`` batch rows whose entry at (row b, slot s) holds the label
    ``labels[b][s]`` (labels >= 1, 0 for a hole; + 1000 in layer 1; every head and dim alike;
    values = -keys)."""
    cache = new_cache(preallocate)
    append(cache, labels)
    return cache


def append(cache, labels: list[list[int]]) -> None:
    """One update of every layer with new slots labelled ``labels`` (one list per batch row)."""
    base = torch.tensor(labels, dtype=torch.float64)[:, None, :, None].expand(-1, 2, -1, 3)  # [B, H, S, D]
    for layer_idx in range(2):
        keys = torch.where(base > 0, base + 1000 * layer_idx, 0.0)
        cache.update(keys, -keys, layer_idx)


def labels_of(cache) -> list[list[int]]:
    """The labels of every row's slots (0: a hole), checked to agree across layers, heads, dims and
    values."""
    first = cache.layers[0].keys
    assert torch.equal(first, first[:, :1, :, :1].expand_as(first))
    for layer_idx, layer in enumerate(cache.layers):
        assert layer.keys.shape == layer.values.shape == first.shape
        assert torch.equal(layer.values, -layer.keys)
        assert torch.equal(layer.keys, torch.where(first > 0, first + 1000 * layer_idx, 0.0))
    assert cache.get_seq_length() == first.shape[2]
    return first[:, 0, :, 0].long().tolist()
