"""Specifies refdec.transformers.cache: the KV cache never evicts (sliding layers included), grows into a
preallocated buffer, and moves entries only through its row API -- ``gather_slots`` (each batch row
moves its own slots: a step's accepted nodes after the row's entries), ``append_rows`` (a joining
group's rows after the running batch's), ``select_rows`` (rows and a slot range kept); in static mode
(``make_static``, refdec.transformers.static_step) a layer is one buffer of fixed capacity written at given
slots."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer

from drawn_trees import FORK_PARENTS
from kv_labels import append, labels_of, labelled_cache
from refdec.transformers.cache import (GrowingLayer, append_rows, gather_slots, layer_buffers, make_static, new_cache,
                                 select_rows, set_lengths, set_prefill_window, static_buffers)
from refdec.drafting.tree import DraftTree
from refdec.transformers.model_support import mask_spec_for
from tiny_models import one_tree_inputs


@pytest.mark.parametrize("preallocate, prefix_len", [(True, 14), (True, 254), (False, 14)])
def test_a_steps_kept_path_equals_the_cache_of_a_plain_prefill(mask_family_model, preallocate, prefix_len):
    """After a fork's forward, the root and the accepted nodes gathered right after the prefix (as a
    step keeps them, refdec.transformers.batch.RunningBatch.keep_accepted) leave the cache of a plain
    prefill of that sequence (254: the tree step overflows the preallocated buffer's first capacity
    of 256)."""
    name, model = mask_family_model
    prefix = [3 + (7 * i) % 90 for i in range(prefix_len)]
    tree = DraftTree(np.array([30, 31, 32, 33, 34]), np.array(FORK_PARENTS), np.ones(5))
    accepted = np.array([1, 3, 4])  # b ─ d ─ e
    slots = len(prefix) - 1  # the root's slot: the step's rows follow the prefix
    with torch.no_grad():
        cache = new_cache(preallocate)
        model(input_ids=torch.tensor([prefix[:-1]]), cache=cache, use_cache=True)
        inp = one_tree_inputs(tree, prefix[-1], slots, mask_spec_for(model))
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


class _IndexDevices(torch.overrides.TorchFunctionMode):
    """Records (indexed tensor's device, index tensor's device) of every indexing call."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs: list[tuple[str, str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("__getitem__", "__setitem__", "index_select") and isinstance(args[0], torch.Tensor):
            index = args[1] if name != "index_select" else args[2]
            parts = index if isinstance(index, tuple) else (index,)
            self.pairs += [(args[0].device.type, part.device.type) for part in parts if isinstance(part, torch.Tensor)]
        return func(*args, **kwargs)


def test_row_moves_send_the_indices_to_each_layers_own_device():
    """Under device_map="auto" a model's layers (and their cache) sit on several devices: the row API
    indexes each layer with indices on that layer's device ("meta" stands in for a second device)."""
    cache = new_cache()
    for layer_idx, device in enumerate(["cpu", "meta", "cpu"]):
        kv = torch.zeros(2, 1, 6, 4, device=device)
        cache.update(kv, kv.clone(), layer_idx)
    recorder = _IndexDevices()
    with recorder:
        gather_slots(cache, torch.arange(2)[:, None], torch.tensor([[4, 5], [5, 5]]),
                     torch.tensor([[2, 3], [1, 1]]), 4)
        select_rows(cache, torch.tensor([1]), 1, 4)
    assert {"meta", "cpu"} <= {indexed for indexed, _ in recorder.pairs}
    assert all(indexed == index for indexed, index in recorder.pairs), recorder.pairs
    assert [tuple(layer.keys.shape) for layer in cache.layers] == [(1, 1, 3, 4)] * 3


def test_a_static_layer_keeps_its_entries_writes_a_forwards_rows_at_the_given_slots_and_returns_its_buffer():
    cache = new_cache()
    for layer_idx in range(2):
        cache.update(torch.arange(1.0, 4.0).view(1, 1, 3, 1), -torch.arange(1.0, 4.0).view(1, 1, 3, 1), layer_idx)
    slots = {2: torch.tensor([5, 6])}
    buffers = make_static(cache, 8, slots)
    assert buffers == static_buffers(cache) and len(buffers) == 2
    layer = cache.layers[0]
    assert layer.get_seq_length() == 3 and layer.static_slots is slots
    assert layer._key_buf[0, 0, :, 0].tolist() == [1, 2, 3, 0, 0, 0, 0, 0]  # the entries, then zeros (no NaN)
    keys, values = layer.update(torch.tensor([[[[7.0], [8.0]]]]), torch.tensor([[[[-7.0], [-8.0]]]]))
    assert keys.shape[-2] == 8 and keys[0, 0, :, 0].tolist() == [1, 2, 3, 0, 0, 7, 8, 0]
    assert values[0, 0, 5:7, 0].tolist() == [-7, -8] and layer.get_seq_length() == 3  # the length is the caller's
    set_lengths(cache, 7)
    assert [lay.get_seq_length() for lay in cache.layers] == [7, 7] and static_buffers(cache) == buffers
    select_rows(cache, torch.tensor([0]), 1, 7)  # a row API call that replaces the buffers
    assert static_buffers(cache) != buffers
    with pytest.raises(ValueError, match="capacity 4 is less than the cache's 6 entries"):
        make_static(cache, 4, slots)


def test_make_static_fills_the_buffers_it_is_given_zeroing_what_they_held():
    def cache_of(values):
        cache = new_cache()
        cache.update(torch.tensor(values).view(1, 1, -1, 1), torch.tensor(values).view(1, 1, -1, 1), 0)
        return cache

    first = cache_of([1.0, 2.0, 3.0])
    make_static(first, 6, {})
    set_lengths(first, 5)  # a step's rows written past the entries
    reuse = layer_buffers(first)
    reuse[0][0][0, 0, 3:5, 0] = 9.0
    second = cache_of([4.0, 5.0])
    assert make_static(second, 6, {}, reuse=reuse) == static_buffers(first)
    assert second.layers[0]._key_buf[0, 0, :, 0].tolist() == [4, 5, 0, 0, 0, 0]
    with pytest.raises(ValueError, match=r"layer 0: a buffer of shape \(1, 1, 6, 1\) cannot hold \(1, 1\) rows at "
                                         "capacity 8"):
        make_static(cache_of([1.0]), 8, {}, reuse=reuse)
