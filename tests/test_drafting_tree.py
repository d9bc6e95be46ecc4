"""Specifies refdec.drafting.tree: ``DraftTree.from_paths`` merges shared prefixes into one trie and stops
adding nodes at ``max_nodes``; ``keep_nodes`` and ``prune_to_depth`` keep a subtree with its
parents renumbered; a tree's ``depths`` are set once (derived from a hand-made tree's parents, or
given and checked against them) and carried along by the trees made from it."""

from __future__ import annotations

import numpy as np
import pytest

from drawn_trees import CHAIN3_PARENTS, FORK_DEPTH, FORK_PARENTS, WIDE_DEPTH, WIDE_PARENTS, random_tree
from refdec.drafting import tree as tree_module
from refdec.drafting.tree import DraftBatch, DraftTree, keep_nodes, prune_to_depth


def test_from_paths_merges_shared_prefixes_and_stops_adding_at_max_nodes():
    tree = DraftTree.from_paths([[5, 6, 7], [5, 6, 8], [9, 5]], max_nodes=10, path_sources=[0, 1, 1],
                                source_names=("a", "b"))
    assert tree.token_ids.tolist() == [5, 6, 7, 8, 9, 5]
    assert tree.parents.tolist() == [-1, 0, 1, 1, -1, 4]
    assert tree.source_ids.tolist() == [0, 0, 0, 1, 1, 1] and tree.source_names == ("a", "b")
    # at the cap a path stops adding nodes, but a later path may still follow existing ones
    capped = DraftTree.from_paths([[5, 6, 7], [9], [5, 6, 8]], max_nodes=3)
    assert capped.token_ids.tolist() == [5, 6, 7] and capped.parents.tolist() == [-1, 0, 1]
    assert len(DraftTree.from_paths([], max_nodes=4)) == 0


def test_keep_nodes_renumbers_parents():
    tree = DraftTree(np.array([10, 11, 12, 13]), np.array([-1, 0, -1, 2]), np.ones(4, np.float32))
    sub = keep_nodes(tree, np.array([2, 3]))
    assert sub.token_ids.tolist() == [12, 13] and sub.parents.tolist() == [-1, 0]
    assert len(keep_nodes(tree, np.array([], dtype=np.int64))) == 0


def test_prune_to_depth_keeps_shallow_nodes_and_renumbers_parents():
    tree = DraftTree(np.array([10, 11, 12, 13, 14]), np.array(WIDE_PARENTS), np.ones(5))
    pruned = prune_to_depth(tree, 2)  # drops e (depth 3)
    assert pruned.token_ids.tolist() == [10, 11, 12, 13]
    assert pruned.parents.tolist() == [-1, 0, 0, -1]
    one = prune_to_depth(tree, 1)  # a, d
    assert one.token_ids.tolist() == [10, 13] and one.parents.tolist() == [-1, -1]
    assert len(prune_to_depth(tree, 0)) == 0


@pytest.mark.parametrize("parents, depths", [
    (CHAIN3_PARENTS, [1, 2, 3]),
    (FORK_PARENTS, FORK_DEPTH[1:]),  # the drawings count the root as row 0, depth 0
    (WIDE_PARENTS, WIDE_DEPTH[1:]),
    ([], []),
])
def test_a_hand_made_trees_depths_are_derived_from_its_parents(parents, depths):
    tree = DraftTree(np.arange(len(parents)), np.asarray(parents), np.ones(len(parents)))
    assert tree.depths.dtype == np.int32 and tree.depths.tolist() == depths
    given = DraftTree(tree.token_ids, tree.parents, tree.scores, depths=np.asarray(depths, np.int64))
    assert given.depths.dtype == np.int32 and given.depths.tolist() == depths


@pytest.mark.parametrize("depths, message", [
    ([1, 1, 2, 2, 3], r"depths\[1\] = 1, expected 2"),   # WIDE: a (1) ─ b (2)
    ([2, 3, 3, 2, 4], r"depths\[0\] = 2, expected 1"),   # a child of the root is at depth 1
    ([1, 2, 2, 1, 4], r"depths\[4\] = 4, expected 3"),
    ([1, 2, 2, 1], r"depths must have shape \(5,\), got \(4,\)"),
])
def test_given_depths_are_checked_against_the_parents_naming_the_first_wrong_one(depths, message):
    with pytest.raises(ValueError, match=message):
        DraftTree(np.arange(5), np.array(WIDE_PARENTS), np.ones(5), depths=np.array(depths))


def test_trees_made_from_a_tree_carry_its_depths_without_deriving_them(monkeypatch):
    rng = np.random.default_rng(4)
    trees = [random_tree(rng, 30, n_tokens=5) for _ in range(40)]
    batch = DraftBatch(*(np.concatenate([getattr(t, name) for t in trees])
                         for name in ("token_ids", "parents", "scores", "source_ids", "depths")),
                       offsets=np.cumsum([0] + [len(t) for t in trees]).astype(np.int64))

    def derive(parents):
        raise AssertionError("depths derived again")

    monkeypatch.setattr(tree_module, "_derive_depths", derive)
    assert DraftTree.chain([5, 6, 7]).depths.tolist() == [1, 2, 3]
    assert DraftTree.from_paths([[5, 6, 7], [5, 8], [9]], max_nodes=8).depths.tolist() == [1, 2, 3, 2, 1]
    for r, tree in enumerate(trees):
        assert batch.tree(r).depths.tolist() == tree.depths.tolist()
        if not len(tree):
            continue
        # a random subtree: each node kept with probability 0.7 while its parent is kept
        keep = rng.random(len(tree)) < 0.7
        for node_idx, parent in enumerate(tree.parents.tolist()):
            keep[node_idx] &= parent < 0 or bool(keep[parent])
        kept = keep_nodes(tree, np.flatnonzero(keep))
        assert kept.depths.tolist() == tree.depths[keep].tolist()
        pruned = prune_to_depth(tree, 3)
        assert pruned.depths.tolist() == tree.depths[tree.depths <= 3].tolist()
    monkeypatch.undo()
    for tree in trees:  # and those depths are the parents' (derived once, here)
        pruned = prune_to_depth(tree, 3)
        assert pruned.depths.tolist() == DraftTree(pruned.token_ids, pruned.parents, pruned.scores).depths.tolist()


def test_keep_nodes_refuses_a_node_whose_parent_it_drops():
    tree = DraftTree(np.array([10, 11, 12, 13]), np.array([-1, 0, -1, 2]), np.ones(4, np.float32))
    with pytest.raises(ValueError, match=r"depths\[0\] = 2, expected 1"):
        keep_nodes(tree, np.array([1, 2]))  # 11 without its parent 10
