"""Specifies refdec.transformers.hybrid.paths: each tree row's ancestors are its path, padding rows
stand alone, and a convolution window reads the row's path and, above the root, the cached window."""

from __future__ import annotations

import numpy as np
import pytest

from hybrid_trees import path_of, paths_of
from refdec.drafting.tree import DraftTree
from refdec.transformers.hybrid.paths import tree_paths


def test_ancestors_and_depths_are_each_rows_path():
    paths, parent_rows = paths_of()
    for row in range(len(parent_rows)):
        path = path_of(parent_rows, row)
        assert np.flatnonzero(paths.ancestors[0, row].numpy()).tolist() == path
        assert int(paths.depth[0, row]) == len(path) - 1


@pytest.mark.parametrize("kernel", [2, 3, 4])
def test_conv_columns_read_each_rows_path_then_the_cached_window(kernel):
    paths, parent_rows = paths_of()
    cached = kernel - 1  # the cached inputs sit at columns 0 .. kernel - 2, tree row r at kernel - 1 + r
    columns = paths.conv_columns(kernel)[0].tolist()
    for row in range(len(parent_rows)):
        want = (list(range(cached)) + [cached + r for r in path_of(parent_rows, row)])[-kernel:]
        assert columns[row] == want, row


def test_padding_rows_start_from_the_cached_state_alone():
    trees = [DraftTree(np.array([5, 6]), np.array([-1, 0]), np.ones(2, np.float32)), DraftTree.empty()]
    paths = tree_paths(trees, 3, "cpu")
    assert paths.ancestors[1].numpy().tolist() == np.eye(3, dtype=bool).tolist()
    assert paths.parent_rows[1].tolist() == [-1, -1, -1]
    assert paths.conv_columns(3)[1, 2].tolist() == [0, 1, 4]
    with pytest.raises(ValueError, match="rows=2 is fewer than the 3 rows of tree 0"):
        tree_paths(trees, 2, "cpu")
