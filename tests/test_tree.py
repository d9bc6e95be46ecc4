"""Specifies refdec.tree: ``DraftTree.from_paths`` merges shared prefixes into one trie and stops
adding nodes at ``max_nodes``; ``keep_nodes`` and ``prune_to_depth`` keep a subtree with its
parents renumbered."""

from __future__ import annotations

import numpy as np

from drawn_trees import WIDE_PARENTS
from refdec.tree import DraftTree, keep_nodes, prune_to_depth


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
