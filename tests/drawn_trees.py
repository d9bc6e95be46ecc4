"""Draft trees drawn for the tests: parent arrays (-1 = a child of the root), with each tree's
ancestor matrix over its rows and its row depths; and random trees."""

import numpy as np

from refdec.drafting.tree import DraftTree

# Rows: R = root (row 0), node i = row i+1.

#   R ─ a ─ b ─ c            a chain of three
CHAIN3_PARENTS = [-1, 0, 1]
CHAIN3_ANC = [
    # R a b c
    [1, 0, 0, 0],  # R
    [1, 1, 0, 0],  # a
    [1, 1, 1, 0],  # b
    [1, 1, 1, 1],  # c
]

#        ┌ a ─ c
#   R ───┤
#        └ b ─ d ─ e           two branches
FORK_PARENTS = [-1, -1, 0, 1, 3]
FORK_ANC = [
    # R a b c d e
    [1, 0, 0, 0, 0, 0],  # R
    [1, 1, 0, 0, 0, 0],  # a
    [1, 0, 1, 0, 0, 0],  # b
    [1, 1, 0, 1, 0, 0],  # c
    [1, 0, 1, 0, 1, 0],  # d
    [1, 0, 1, 0, 1, 1],  # e
]
FORK_DEPTH = [0, 1, 1, 2, 2, 3]

#        ┌ a ─┬ b
#   R ───┤    └ c ─ e       a wide tree, a node with two children
#        └ d
WIDE_PARENTS = [-1, 0, 0, -1, 2]
WIDE_ANC = [
    # R a b c d e
    [1, 0, 0, 0, 0, 0],  # R
    [1, 1, 0, 0, 0, 0],  # a
    [1, 1, 1, 0, 0, 0],  # b
    [1, 1, 0, 1, 0, 0],  # c
    [1, 0, 0, 0, 1, 0],  # d
    [1, 1, 0, 1, 0, 1],  # e
]
WIDE_DEPTH = [0, 1, 2, 2, 1, 3]

# root -> 20 -> 21 -> 23, root -> 22 -> 24, 21 -> 25 (nodes best-first: first child = best)
BEST_FIRST_TREE = DraftTree(np.array([20, 21, 22, 23, 24, 25]), np.array([-1, 0, -1, 1, 2, 1]), np.ones(6, np.float32))


def random_tree(rng, max_nodes: int = 12, n_tokens: int = 3) -> DraftTree:
    n = int(rng.integers(0, max_nodes + 1))
    parents = np.array([int(rng.integers(-1, i)) for i in range(n)], dtype=np.int32)
    return DraftTree(rng.integers(0, n_tokens, size=n), parents, np.ones(n, np.float32))
