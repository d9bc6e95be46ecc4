"""One step's draft for one request: as many nodes as its budget chooses, cleaned for the model."""

from __future__ import annotations

import numpy as np

from refdec.drafting.proposer import Drafter
from refdec.drafting.tree import DraftTree, keep_nodes, prune_to_depth
from refdec.sizing.budget import Budget

__all__ = ["draft_for_step", "drop_out_of_vocab"]


def drop_out_of_vocab(tree: DraftTree, vocab_size: int) -> DraftTree:
    """The subtree without nodes whose token is >= ``vocab_size`` or < 0 (and their descendants).

    A reference or an index built for a larger vocabulary can draft ids the model has
    no embedding for, and an index file whose body is corrupt (``CorpusIndex.verify()``
    is False; loading checks the structure, not every token) negative ones; such a node
    could never be accepted and must not reach the model."""
    parents = tree.parents
    keep = (tree.token_ids < vocab_size) & (tree.token_ids >= 0)
    for node_idx in range(len(tree)):  # parents precede children
        if keep[node_idx] and parents[node_idx] >= 0 and not keep[parents[node_idx]]:
            keep[node_idx] = False
    return keep_nodes(tree, np.flatnonzero(keep))


def draft_for_step(drafter: Drafter, budget: Budget, useful_depth: int, max_depth: int,
                   vocab_size: int) -> DraftTree:
    """As many nodes as ``budget`` chooses, cut to ``useful_depth`` (the tokens still allowed)
    and without tokens the model's vocabulary lacks. The budget's selection of the prefix to
    verify comes after, for all rows of the step together (refdec.sizing.budget.Budget.select_batch)."""
    n_nodes = budget.max_nodes
    if n_nodes <= 0:
        return DraftTree.empty()
    tree = drafter.propose(n_nodes)
    if len(tree) and (int(tree.token_ids.max()) >= vocab_size or int(tree.token_ids.min()) < 0):
        tree = drop_out_of_vocab(tree, vocab_size)
    if len(tree) and useful_depth < max_depth:
        tree = prune_to_depth(tree, useful_depth)
    return tree
