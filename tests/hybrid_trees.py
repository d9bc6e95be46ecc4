"""A draft tree for the hybrid kernels' tests, with each tree row's path (root first)."""

from __future__ import annotations

import numpy as np

from refdec.drafting.tree import DraftTree
from refdec.transformers.hybrid.paths import tree_paths

# node parents (-1 = a child of the root): branches at depths 1 and 2, a chain of four
PARENTS = [-1, 0, 1, -1, 3, 1, 5, 2]


def paths_of(parents=PARENTS):
    """(refdec.transformers.hybrid.paths.TreePaths of one tree, parent row of each tree row: -1 for the root)."""
    tree = DraftTree(np.arange(len(parents)), np.array(parents), np.ones(len(parents), np.float32))
    return tree_paths([tree], 1 + len(parents), "cpu"), [-1] + [p + 1 for p in parents]


def path_of(parent_rows: list[int], row: int) -> list[int]:
    """The tree rows from the root down to ``row``."""
    path = []
    while row >= 0:
        path.append(row)
        row = parent_rows[row]
    return path[::-1]
