"""Specifies refdec.decode.cache: the KV cache never evicts (sliding layers included), grows into a
preallocated buffer, and moves entries only through its row API -- ``compact`` (one row keeps its
accepted nodes), ``gather_slots`` (each batch row moves its own slots), ``append_rows`` (a joining
group's rows after the running batch's), ``select_rows`` (rows and a slot range kept)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.cache_utils import DynamicSlidingWindowLayer

from drawn_trees import FORK_PARENTS
from refdec.decode.cache import GrowingLayer, compact, new_cache, set_prefill_window
from refdec.decode.masks import build_tree_inputs
from refdec.decode.model_support import mask_spec_for
from refdec.tree import DraftTree


@pytest.mark.parametrize("preallocate, prefix_len", [(True, 14), (True, 254), (False, 14)])
def test_compacted_cache_equals_cache_of_plain_prefill(family_model, preallocate, prefix_len):
    """After keeping the accepted nodes of a fork, the cache equals a plain prefill of that sequence
    (254: the tree step overflows the preallocated buffer's first capacity of 256)."""
    name, model = family_model
    prefix = [3 + (7 * i) % 90 for i in range(prefix_len)]
    tree = DraftTree(np.array([30, 31, 32, 33, 34]), np.array(FORK_PARENTS), np.ones(5))
    accepted = np.array([1, 3, 4])  # b ─ d ─ e
    with torch.no_grad():
        cache = new_cache(preallocate)
        model(input_ids=torch.tensor([prefix[:-1]]), cache=cache, use_cache=True)
        inp = build_tree_inputs(tree, prefix[-1], len(prefix) - 1, mask_spec_for(model))
        model(input_ids=inp.input_ids, position_ids=inp.position_ids, attention_mask=inp.attention_mask,
              cache=cache, use_cache=True)
        compact(cache, len(prefix), torch.from_numpy(accepted), 3)
        plain = new_cache()
        model(input_ids=torch.tensor([prefix + [31, 33, 34]]), cache=plain, use_cache=True)
    assert cache.get_seq_length() == len(prefix) + 3
    assert all(type(layer).__name__ == ("GrowingLayer" if preallocate else "DynamicLayer") for layer in cache.layers)
    for got, want in zip(cache.layers, plain.layers):
        torch.testing.assert_close(got.keys, want.keys, rtol=0, atol=1e-12)
        torch.testing.assert_close(got.values, want.values, rtol=0, atol=1e-12)


@pytest.mark.parametrize("chunk", [1, 3, 7, 12])
def test_windowed_growing_layer_presents_what_the_sliding_layer_presents(chunk):
    window = 8
    ours, theirs = GrowingLayer(), DynamicSlidingWindowLayer(sliding_window=window)
    ours.prefill_window = window
    torch.manual_seed(0)
    stored = []
    for step in range(6):
        k, v = torch.randn(1, 2, chunk, 4), torch.randn(1, 2, chunk, 4)
        assert ours.get_mask_sizes(chunk) == theirs.get_mask_sizes(chunk), step
        ours_k, ours_v = ours.update(k, v)
        theirs_k, theirs_v = theirs.update(k, v)
        assert torch.equal(ours_k, theirs_k) and torch.equal(ours_v, theirs_v), step
        stored.append(k)
    # ... and every entry is kept: with the window off, the layer is the whole history
    ours.prefill_window = None
    assert not ours.is_sliding and torch.equal(ours.keys, torch.cat(stored, dim=-2))
    assert ours.get_mask_sizes(1) == (6 * chunk + 1, 0)


def test_set_prefill_window_validates_and_skips_missing_layers():
    cache = new_cache()
    set_prefill_window(cache, [0, 5], 8)  # no layer exists yet: nothing to set
    with pytest.raises(ValueError, match="window"):
        set_prefill_window(cache, [0], 0)

