"""Specifies refdec.engine.accept, the acceptance walk: from the root, descend into the child whose
token is the current row's target while there is one; the accepted nodes form a root path and the
bonus token is the last visited row's target. The lazy walk (targets asked row by row) and the
step generator visit the same rows and give the same result; so do the walks of a padded batch
on the device (the full head's path)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings, strategies as st

from drawn_trees import FORK_PARENTS, BEST_FIRST_TREE, random_tree
from refdec.engine.accept import (accept_walk, accept_walk_lazy, accept_walk_steps, accept_walks_on_device,
                                  first_child_rows, walks_from_device)
from refdec.drafting.tree import DraftTree
from refdec.transformers.masks import MaskSpec, device_tree_inputs


def test_walk_descends_the_branch_that_matches_the_targets():
    #        ┌ a=10 ─ c=12
    #   R ───┤
    #        └ b=11 ─ d=13 ─ e=14
    tree = DraftTree(np.array([10, 11, 12, 13, 14]), np.array(FORK_PARENTS), np.ones(5))
    # targets per row: R→11 (take b), b→13 (take d), d→99 (no child 99): accept b, d; bonus 99
    targets = np.array([11, 0, 13, 0, 99, 0])
    accepted, bonus = accept_walk(tree, targets)
    assert accepted.tolist() == [1, 3] and bonus == 99
    # nothing matches at the root: no node accepted, the bonus is the root's target
    accepted, bonus = accept_walk(tree, np.array([42, 0, 0, 0, 0, 0]))
    assert accepted.tolist() == [] and bonus == 42
    # a whole branch accepted: the bonus is the leaf's target
    accepted, bonus = accept_walk(tree, np.array([11, 0, 13, 0, 14, 7]))
    assert accepted.tolist() == [1, 3, 4] and bonus == 7


@st.composite
def trees_and_targets(draw):
    n = draw(st.integers(0, 24))
    parents = [draw(st.integers(-1, i - 1)) for i in range(n)]
    tokens = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    targets = draw(st.lists(st.integers(0, 3), min_size=n + 1, max_size=n + 1))
    return DraftTree(np.array(tokens, dtype=np.int32), np.array(parents, dtype=np.int32), np.ones(n)), \
        np.array(targets, dtype=np.int64)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(trees_and_targets())
def test_lazy_walk_equals_vectorised_walk_and_accepts_a_root_path_of_matching_tokens(case):
    tree, targets = case
    accepted, bonus = accept_walk(tree, targets)
    asked = []

    def target_of_row(row, depth):
        asked.append(row)
        return int(targets[row])

    lazy_accepted, lazy_bonus = accept_walk_lazy(tree, target_of_row)
    assert lazy_accepted.tolist() == accepted.tolist() and lazy_bonus == bonus
    assert len(asked) == len(accepted) + 1  # one target per row on the path
    row = 0
    for node in accepted:  # a root-to-node path whose every token is its parent row's target
        assert tree.parents[node] + 1 == row and tree.token_ids[node] == targets[row]
        row = node + 1
    assert bonus == targets[row]


def test_lazy_walk_equals_the_full_walk_for_random_targets():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(0, 12))
        parents = np.array([int(rng.integers(-1, i)) for i in range(n)], dtype=np.int32)
        tokens = rng.integers(0, 3, size=n)
        tree = DraftTree(tokens, parents, np.ones(n, np.float32))
        targets = rng.integers(0, 3, size=n + 1)
        full = accept_walk(tree, targets)
        lazy = accept_walk_lazy(tree, lambda row, depth: int(targets[row]))
        assert full[0].tolist() == lazy[0].tolist() and full[1] == lazy[1]


def test_walk_steps_generator_equals_the_lazy_walk():
    rng = np.random.default_rng(1)
    for _ in range(200):
        tree = random_tree(rng)
        targets = rng.integers(0, 3, size=len(tree) + 1)
        asked = []
        walk = accept_walk_steps(tree)
        row, depth = next(walk)
        try:
            while True:
                asked.append((row, depth))
                row, depth = walk.send(int(targets[row]))
        except StopIteration as end:
            accepted, bonus = end.value
        lazy_asked = []
        want = accept_walk_lazy(tree, lambda r, d: (lazy_asked.append((r, d)), int(targets[r]))[1])
        assert accepted.tolist() == want[0].tolist() and bonus == want[1]
        assert asked == lazy_asked


def test_first_child_rows_follow_the_best_child():
    # rows: 0 root, 1 node0(20), 2 node1(21), 3 node2(22), 4 node3(23), 5 node4(24), 6 node5(25)
    assert first_child_rows(BEST_FIRST_TREE).tolist() == [1, 2, 4, 5, -1, -1, -1]
    assert first_child_rows(DraftTree.empty()).tolist() == [-1]


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(trees_and_targets(), min_size=1, max_size=4))
def test_the_device_walks_of_a_padded_batch_equal_each_tree_walk(cases):
    # tokens and targets from {0..3}: siblings often carry the same token, and the walk takes the first
    trees = [tree for tree, _ in cases]
    _, on_device = device_tree_inputs(trees, np.zeros(len(trees), dtype=np.int64), np.full(len(trees), 5),
                                      torch.arange(5)[None].repeat(len(trees), 1),
                                      MaskSpec("single", None, False, torch.float32), "cpu")
    t = on_device.token_rows.shape[1]
    targets = torch.tensor(np.stack([np.pad(tg, (0, t - tg.shape[0]), constant_values=2) for _, tg in cases]))
    result = accept_walks_on_device(on_device.token_rows, on_device.parent_rows, on_device.ancestors,
                                    on_device.depth, targets)
    for (tree, tg), (accepted, bonus) in zip(cases, walks_from_device(result.numpy())):
        want_accepted, want_bonus = accept_walk(tree, tg)
        assert accepted.tolist() == want_accepted.tolist() and bonus == want_bonus
