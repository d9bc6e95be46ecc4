"""Specifies refdec.decode.cache: the KV cache never evicts (sliding layers included), grows into a
preallocated buffer, and moves entries only through its row API -- ``gather_slots`` (each batch row
moves its own slots: a step's accepted nodes after the row's entries), ``append_rows`` (a joining
group's rows after the running batch's), ``select_rows`` (rows and a slot range kept)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer

from drawn_trees import FORK_PARENTS
from kv_labels import append, labels_of, labelled_cache
from refdec.decode.cache import GrowingLayer, append_rows, gather_slots, new_cache, select_rows, set_prefill_window
from refdec.decode.masks import build_tree_inputs
from refdec.decode.model_support import mask_spec_for
from refdec.tree import DraftTree


@pytest.mark.parametrize("preallocate, prefix_len", [(True, 14), (True, 254), (False, 14)])
def test_a_steps_kept_path_equals_the_cache_of_a_plain_prefill(family_model, preallocate, prefix_len):
    """After a fork's forward, the root and the accepted nodes gathered right after the prefix (as a
    step keeps them, refdec.decode.batch.RunningBatch.keep_accepted) leave the cache of a plain
    prefill of that sequence (254: the tree step overflows the preallocated buffer's first capacity
    of 256)."""
    name, model = family_model
    prefix = [3 + (7 * i) % 90 for i in range(prefix_len)]
    tree = DraftTree(np.array([30, 31, 32, 33, 34]), np.array(FORK_PARENTS), np.ones(5))
    accepted = np.array([1, 3, 4])  # b ─ d ─ e
    slots = len(prefix) - 1  # the root's slot: the step's rows follow the prefix
    with torch.no_grad():
        cache = new_cache(preallocate)
        model(input_ids=torch.tensor([prefix[:-1]]), cache=cache, use_cache=True)
        inp = build_tree_inputs(tree, prefix[-1], slots, mask_spec_for(model))
        model(input_ids=inp.input_ids, position_ids=inp.position_ids, attention_mask=inp.attention_mask,
              cache=cache, use_cache=True)
        src = torch.from_numpy(slots + np.concatenate([[0], accepted + 1]))[None]  # the root, then the path
        gather_slots(cache, torch.zeros((1, 1), dtype=torch.int64), src, torch.arange(slots, slots + 4)[None],
                     slots + 4)
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


# ---------------------------------------------------------------- the row API, on labelled entries


@pytest.mark.parametrize("preallocate", [True, False])
def test_gather_slots_moves_each_rows_own_slots_and_cuts_the_cache(preallocate):
    cache = labelled_cache(preallocate, [list(range(1, 9)), list(range(101, 109))])
    # row 0 keeps slots 5, 6 at 2, 3 (its last pair repeated as padding); row 1 keeps 4, 5, 7 at 1, 2, 3
    src = torch.tensor([[5, 6, 6], [4, 5, 7]])
    dst = torch.tensor([[2, 3, 3], [1, 2, 3]])
    gather_slots(cache, torch.arange(2)[:, None], src, dst, 4)
    assert labels_of(cache) == [[1, 2, 6, 7], [101, 105, 106, 108]]
    append(cache, [[9], [109]])
    assert labels_of(cache) == [[1, 2, 6, 7, 9], [101, 105, 106, 108, 109]]
    # moving left onto slots it reads (row 0: 1 <- 2, 2 <- 4; row 1: 2 <- 3, 3 <- 4), cut to 4 slots
    gather_slots(cache, torch.arange(2)[:, None], torch.tensor([[2, 4], [3, 4]]), torch.tensor([[1, 2], [2, 3]]), 4)
    assert labels_of(cache) == [[1, 6, 9, 7], [101, 105, 108, 109]]


@pytest.mark.parametrize("preallocate", [True, False])
@pytest.mark.parametrize("running_slots, joining_slots", [(3, 5), (5, 3), (4, 4)])
def test_append_rows_puts_the_joining_rows_after_the_running_ones_padded_to_the_longer(preallocate, running_slots,
                                                                                       joining_slots):
    running = [list(range(1, 1 + running_slots))]
    joining = [list(range(101, 101 + joining_slots)), list(range(201, 201 + joining_slots))]
    cache = labelled_cache(preallocate, running)
    n = max(running_slots, joining_slots)
    assert append_rows(cache, labelled_cache(preallocate, joining)) == n
    assert labels_of(cache) == [row + [0] * (n - len(row)) for row in running + joining]  # 0: holes at the end
    append(cache, [[7], [107], [207]])  # every row's next entry goes to slot n
    assert [row[n:] for row in labels_of(cache)] == [[7], [107], [207]]


@pytest.mark.parametrize("preallocate", [True, False])
def test_select_rows_keeps_the_chosen_rows_and_a_slot_range_renumbered_from_zero(preallocate):
    cache = labelled_cache(preallocate, [list(range(1, 7)), list(range(101, 107)), list(range(201, 207))])
    select_rows(cache, torch.tensor([2, 0]), 1, 4)
    assert labels_of(cache) == [[202, 203, 204], [2, 3, 4]]
    append(cache, [[9], [19]])
    assert labels_of(cache) == [[202, 203, 204, 9], [2, 3, 4, 19]]


def test_a_cache_layer_that_may_evict_entries_is_refused_naming_it():
    cache = DynamicCache()
    cache.layers.append(DynamicSlidingWindowLayer(sliding_window=4))
    append(cache, [[1, 2]])
    with pytest.raises(TypeError, match=r"cache layer 0 is DynamicSlidingWindowLayer; tree verification needs full "
                                        r"layers"):
        gather_slots(cache, torch.zeros((1, 1), dtype=torch.int64), torch.ones((1, 1), dtype=torch.int64),
                     torch.ones((1, 1), dtype=torch.int64), 2)
