"""Specifies refdec.transformers.hybrid.state: a hybrid cache has refdec's KV layers for attention and
recurrent layers for the rest; a frozen layer records pending commits and refuses transformers' own
state updates; rows are appended and kept with their states; a commit runs each pending commit
with every row's accepted tree row and drops them."""

from __future__ import annotations

import pytest
import torch

from refdec.transformers.cache import GrowingLayer, layers
from refdec.transformers.hybrid.state import (GrowingRecurrentLayer, RecurrentLayer, append_state_rows, commit_states,
                                              discard_pending, has_pending, new_hybrid_cache, select_state_rows,
                                              state_bytes)


def _filled(rows: int, offset: float = 0.0):
    cache = new_hybrid_cache(["linear_attention", "full_attention", "hybrid"])
    for idx in (0, 2):
        cache.layers[idx].update_conv_state(torch.arange(rows * 2 * 3.0).view(rows, 2, 3) + offset, conv_kernel_size=3)
        cache.layers[idx].update_recurrent_state(torch.arange(rows * 4.0).view(rows, 2, 2) + offset)
    for idx in (1, 2):
        cache.update(torch.zeros(rows, 1, 5, 2), torch.zeros(rows, 1, 5, 2), idx)
    return cache


def test_layer_classes_by_type_and_only_kv_layers_are_kv():
    cache = _filled(2)
    assert [type(layer) for layer in cache.layers] == [RecurrentLayer, GrowingLayer, GrowingRecurrentLayer]
    assert list(layers(cache)) == [cache.layers[1], cache.layers[2]]
    assert state_bytes(cache) == 2 * (2 * 2 * 3 + 2 * 4) * 4
    with pytest.raises(ValueError, match="'lightning' has no refdec layer"):
        new_hybrid_cache(["lightning"])


def test_a_frozen_layer_records_commits_and_refuses_transformers_own_updates():
    layer = _filled(1).layers[0]
    layer.frozen = True
    with pytest.raises(RuntimeError, match="causal convolution"):
        layer.update_conv_state(torch.zeros(1, 2, 1))
    with pytest.raises(RuntimeError, match="recurrence"):
        layer.update_recurrent_state(torch.zeros(1, 2, 2))
    layer.update_recurrent_state(lambda rows: None)
    assert len(layer.pending) == 1


def test_rows_move_with_their_states():
    cache, other = _filled(2), _filled(1, offset=100.0)
    append_state_rows(cache, other)
    assert cache.layers[0].recurrent_states[0][:, 0, 0].tolist() == [0.0, 4.0, 100.0]
    select_state_rows(cache, torch.tensor([2, 0]))
    assert cache.layers[2].conv_states[0][:, 0, 0].tolist() == [100.0, 0.0]


def test_a_commit_runs_the_pending_commits_with_each_rows_accepted_row_once():
    cache = _filled(2)
    seen = []
    cache.layers[0].pending.append(lambda rows: seen.append(rows.tolist()))
    cache.layers[2].pending.append(lambda rows: seen.append(rows.tolist()))
    assert has_pending(cache)
    commit_states(cache, torch.tensor([3, 0]))
    assert seen == [[3, 0], [3, 0]] and not has_pending(cache)
    cache.layers[0].pending.append(lambda rows: seen.append("no"))
    discard_pending(cache)
    commit_states(cache, torch.tensor([1, 1]))
    assert seen == [[3, 0], [3, 0]]
