"""Specifies refdec.transformers.lazy_head: the lazy head (``LazyRowLogits``) computes only the rows asked
for, a chunk along the best path at a time, and they equal the model's logits;
``LockstepLazyWalks`` serves a batch's walks with one head GEMM per round, each walk its own rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tiny_models
from tiny_models import one_tree_inputs
from refdec.engine.accept import accept_walk
from refdec.transformers.cache import new_cache
from refdec.transformers.lazy_head import LazyRowLogits, LockstepLazyWalks
from refdec.transformers.model_support import cache_kwarg, mask_spec_for
from refdec.transformers.plain_head import PlainHead, split_forward_fn
from drawn_trees import BEST_FIRST_TREE, random_tree
from refdec.drafting.tree import DraftTree


def _tree_hidden(model, tree):
    backbone_forward, head = split_forward_fn(model)
    spec = mask_spec_for(model)
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]])
    inputs = one_tree_inputs(tree, 17, prompt.shape[1], spec)
    with torch.inference_mode():
        cache = new_cache()
        model(input_ids=prompt, use_cache=True, **{cache_kwarg(model): cache})
        hidden = backbone_forward(cache, input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                                  attention_mask=inputs.attention_mask)[0]
        cache = new_cache()
        model(input_ids=prompt, use_cache=True, **{cache_kwarg(model): cache})
        full = model(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                     attention_mask=inputs.attention_mask, use_cache=True, **{cache_kwarg(model): cache}).logits[0]
    return hidden, head, full


@pytest.mark.parametrize("name", tiny_models.family_params(("gemma3", "gpt2", "llama")))
def test_lazy_rows_equal_the_model_logits_and_compute_chunks_along_the_best_path(tiny_model_cache, name):
    model = tiny_models.cached_model(tiny_model_cache, name)
    hidden, head, full = _tree_hidden(model, BEST_FIRST_TREE)
    lazy = LazyRowLogits(BEST_FIRST_TREE, hidden, head, chunk=3)
    assert lazy.argmax(0) == int(full[0].argmax())
    # the first chunk is the root and its best-child chain: rows 0, 1, 2
    assert lazy.rows_computed == 3 and sorted(lazy._argmax) == [0, 1, 2]
    torch.testing.assert_close(lazy.row_logits(1), full[1], rtol=1e-10, atol=1e-10)
    assert lazy.rows_computed == 3  # already there
    # a row off the path starts a new chunk: row 3, its child row 5, then the next row by index (4)
    torch.testing.assert_close(lazy.row_logits(3), full[3], rtol=1e-10, atol=1e-10)
    assert lazy.rows_computed == 6 and sorted(lazy._argmax) == [0, 1, 2, 3, 4, 5]
    for row in range(len(BEST_FIRST_TREE) + 1):
        assert lazy.argmax(row) == int(full[row].argmax())
    assert lazy.rows_computed == 7


def test_lazy_row_logits_chunk_rows_and_store_keep_its_single_walk_behaviour():
    tree = DraftTree(np.array([20, 21, 22, 23, 24, 25]), np.array([-1, 0, -1, 1, 2, 1]), np.ones(6, np.float32))
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 5, dtype=torch.float64, generator=gen)
    head = PlainHead(torch.randn(30, 5, dtype=torch.float64, generator=gen), None)
    lazy = LazyRowLogits(tree, hidden, head, chunk=3)
    assert lazy.chunk_rows(0, 3) == [0, 1, 2] and lazy.chunk_rows(0, 1) == [0]
    assert not lazy.has(0)
    logits = head.logits(hidden[[0, 1]])
    lazy.store([0, 1], logits, logits.argmax(-1).tolist())
    assert lazy.has(1) and lazy.rows_computed == 2 and lazy.seconds == 0.0
    assert lazy.chunk_rows(0, 3) == [0, 2, 3]  # computed rows are skipped
    lazy.argmax(2)  # its own head call: row 2 and the next rows not computed
    assert lazy.rows_computed == 5 and sorted(lazy._argmax) == [0, 1, 2, 3, 4]


def one_hot_head(targets: list[np.ndarray], width: int, vocab: int = 3):
    """hidden float64 [n_walks, width, n_walks * width] and a PlainHead whose logits at
    ``hidden[walk_idx, row]`` peak at ``targets[walk_idx][row]`` (and nowhere else): a head call
    on the wrong (walk, row) pair gives another row's target.
    ``targets``: per walk an int64 array (1 + n_nodes,)."""
    n_walks = len(targets)
    dim = n_walks * width
    hidden = torch.eye(dim, dtype=torch.float64).reshape(n_walks, width, dim)
    weight = torch.zeros(vocab, dim, dtype=torch.float64)
    for walk_idx, t in enumerate(targets):
        for row, token in enumerate(t):
            weight[int(token), walk_idx * width + row] = 1.0
    return hidden, PlainHead(weight, None)


@pytest.mark.parametrize("adaptive", [True, False])
def test_lockstep_walks_read_each_walks_own_rows(adaptive):
    """Every walk gets the targets of its own tree rows (a one-hot head: a head call on a wrong
    (batch row, tree row) pair reads another row's target and changes the walk)."""
    rng = np.random.default_rng(2)
    for _ in range(100):
        trees = [random_tree(rng) for _ in range(int(rng.integers(1, 7)))]
        width = 1 + max(len(t) for t in trees)
        targets = [rng.integers(0, 3, size=len(t) + 1) for t in trees]
        hidden, head = one_hot_head(targets, width)
        walks = LockstepLazyWalks(trees, hidden, head, adaptive=adaptive)
        got = walks.run(lambda i, r, depth: walks.lazy[i].argmax(r))
        for walk_idx, tree in enumerate(trees):
            want = accept_walk(tree, targets[walk_idx])
            assert got[walk_idx][0].tolist() == want[0].tolist() and got[walk_idx][1] == want[1]
            lazy = walks.lazy[walk_idx]
            for row in lazy._logits:  # every stored row holds that row's logits
                torch.testing.assert_close(lazy.row_logits(row), head.logits(hidden[walk_idx, row: row + 1])[0])
            assert lazy.rows_computed == len(lazy._logits) <= 1 + len(tree)
            assert lazy.seconds == 0.0  # no head call of its own: the lock-step GEMMs filled it


def test_lockstep_walks_run_one_head_call_per_round_not_per_walk():
    # six walks, each a chain of 3 nodes all accepted (targets follow the chain)
    chain = DraftTree.chain(np.array([1, 2, 0]))
    trees = [chain] * 6
    targets = [np.array([1, 2, 0, 2])] * 6
    hidden, head = one_hot_head(targets, 4)
    calls = []
    logits = head.logits
    head.logits = lambda h: (calls.append(h.shape[0]), logits(h))[1]
    walks = LockstepLazyWalks(trees, hidden, head, adaptive=False)
    results = walks.run(lambda i, r, depth: walks.lazy[i].argmax(r))
    assert all(a.tolist() == [0, 1, 2] and bonus == 2 for a, bonus in results)
    assert calls == [24] and walks.head_calls == 1  # one chunk of 4 rows per walk, one GEMM
    # adaptive: with 6 walks waiting each computes just the asked row (4 rounds of 6 rows)
    calls.clear()
    walks = LockstepLazyWalks(trees, hidden, head)
    results = walks.run(lambda i, r, depth: walks.lazy[i].argmax(r))
    assert all(a.tolist() == [0, 1, 2] and bonus == 2 for a, bonus in results)
    assert calls == [6, 6, 6, 6]
    # two walks waiting: 2 rows each (the empty tree has only its root); then the one walk left
    # waiting takes a whole chunk along its best path (the head pads to 4 rows anyway)
    calls.clear()
    walks = LockstepLazyWalks([DraftTree.empty(), chain], hidden[:2], head)
    walks.run(lambda i, r, depth: walks.lazy[i].argmax(r))
    assert calls == [3, 2] and [lazy.rows_computed for lazy in walks.lazy] == [1, 4]


def test_lockstep_walks_reject_hidden_states_that_do_not_fit_the_trees():
    hidden, head = one_hot_head([np.zeros(2, dtype=np.int64)], 2)
    with pytest.raises(ValueError, match="hidden has 1 batch rows for 2 trees"):
        LockstepLazyWalks([DraftTree.empty(), DraftTree.empty()], hidden, head)
    with pytest.raises(ValueError, match="tree 0 has 4 rows"):
        LockstepLazyWalks([DraftTree.chain(np.array([1, 2, 0]))], hidden, head)
