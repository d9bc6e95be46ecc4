"""Acceptance walk over a verified draft tree.

Given the target token at every tree row (row 0 = root, row ``1 + node_idx`` =
draft node ``node_idx``; the target at a row is the token the target model
emits *after* that row), start at the root and descend while some child of the
current row proposes exactly the current row's target. The accepted path is the
sequence of nodes descended into; the bonus token is the target at the last
row reached. Greedy and position-keyed sampling share this walk: only the way
targets are chosen differs (see refdec.engine.sampling).
"""

from __future__ import annotations

import numpy as np
import torch

from refdec.drafting.tree import DraftTree

__all__ = ["accept_walk", "accept_walk_lazy", "accept_walk_steps", "accept_walks_on_device", "first_child_rows",
           "walks_from_device"]


def accept_walk(tree: DraftTree, targets: np.ndarray) -> tuple[np.ndarray, int]:
    """Return ``(accepted_nodes, bonus_token)``.

    ``targets``: int64 array of shape (1 + n,), per row as in the module docstring.
    ``accepted_nodes``: int64 array (k,) of node indices along the accepted path,
    root-to-leaf (empty when nothing was accepted).
    """
    n = len(tree)
    if n == 0:
        return np.zeros(0, dtype=np.int64), int(targets[0])
    parent_rows = tree.parents.astype(np.int64) + 1
    # a node is "correct" iff it proposes its parent row's target
    correct = tree.token_ids.astype(np.int64) == targets[parent_rows]
    accepted = []
    row = 0
    candidates = np.flatnonzero(correct)
    while candidates.size:
        kids = candidates[parent_rows[candidates] == row]
        if kids.size == 0:
            break
        node = int(kids[0])  # siblings carry distinct tokens in a trie; take the first otherwise
        accepted.append(node)
        row = node + 1
        candidates = candidates[candidates > node]  # descendants come later in topological order
    return np.asarray(accepted, dtype=np.int64), int(targets[row])


def accept_walks_on_device(token_rows: torch.Tensor, parent_rows: torch.Tensor, ancestors: torch.Tensor,
                           depth: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """:func:`accept_walk` for a batch of trees at once, on their device, without a host sync.

    The trees as refdec.transformers.masks.DeviceTrees lays them out: ``token_rows``, ``parent_rows``,
    ``depth`` int64 [B, T], ``ancestors`` bool [B, T, T]; ``targets`` int64 [B, T], the target at
    every row. A node is accepted when it is the first child of its parent row that proposes the
    parent's target (as the walk's ``kids[0]``) and so is every ancestor; the accepted nodes form
    one path from the root, the bonus token is the target at its deepest row.

    Returns int64 [B, T + 1]: per row ``k`` (accepted nodes), the bonus token, then the accepted
    node indices in path order (``k`` of them, then -1): :func:`walks_from_device` reads it.
    """
    batch, t = token_rows.shape
    rows = torch.arange(t, device=token_rows.device).expand(batch, t)
    is_node = parent_rows != rows  # the root and padding rows are their own parents
    correct = is_node & (token_rows == targets.gather(1, parent_rows))
    # the first correct child of each row (t: none); a padding row is nobody's parent
    first = torch.full_like(rows, t).scatter_reduce(1, parent_rows, torch.where(correct, rows, t), "amin")
    ok = (correct & (first.gather(1, parent_rows) == rows)) | (rows == 0)
    accepted = ~(ancestors & ~ok[:, None, :]).any(dim=2)
    k = accepted.sum(dim=1) - 1
    deepest = torch.where(accepted, depth, -1).argmax(dim=1, keepdim=True)
    path = torch.full((batch, t + 1), -1, dtype=torch.int64, device=token_rows.device)
    path.scatter_(1, torch.where(accepted & is_node, depth - 1, t), rows - 1)  # column t: the rest
    return torch.cat([k[:, None], targets.gather(1, deepest), path[:, : t - 1]], dim=1)


def walks_from_device(result: np.ndarray) -> list[tuple[np.ndarray, int]]:
    """``(accepted_nodes int64 [k], bonus token)`` per row of ``result`` (int64 [B, T + 1], from
    :func:`accept_walks_on_device`, on the host)."""
    return [(row[2:2 + row[0]].copy(), int(row[1])) for row in result]


def accept_walk_lazy(tree: DraftTree, target_of_row) -> tuple[np.ndarray, int]:
    """The same walk, asking ``target_of_row(row, depth) -> int`` only for the rows on the path.

    Used for sampling, where a target costs a pass over the vocabulary: a step that
    accepts ``k`` nodes computes ``k + 1`` targets, whatever the tree size.
    """
    walk = accept_walk_steps(tree)
    request = next(walk)
    try:
        while True:
            request = walk.send(int(target_of_row(*request)))
    except StopIteration as done:
        return done.value


def accept_walk_steps(tree: DraftTree):
    """:func:`accept_walk_lazy` as a generator, for walks that wait on each other.

    Yields ``(row, depth)`` whenever the walk needs the target of ``row``; the caller
    passes the target (int) back with ``send``. The walk ends with ``StopIteration`` whose
    ``value`` is ``(accepted_nodes, bonus_token)``, as :func:`accept_walk_lazy` returns.
    """
    parent_rows = tree.parents.astype(np.int64) + 1
    token_ids = tree.token_ids
    accepted = []
    row = 0
    while True:
        target = int((yield row, len(accepted)))
        kids = np.flatnonzero(parent_rows == row)
        match = kids[token_ids[kids] == target]
        if match.size == 0:
            return np.asarray(accepted, dtype=np.int64), target
        node = int(match[0])
        accepted.append(node)
        row = node + 1


def first_child_rows(tree: DraftTree) -> np.ndarray:
    """int64 [1 + n]: the row of each row's first (best) child, -1 for leaves.

    Row 0 is the root, row ``1 + node_idx`` node ``node_idx``; nodes come best-first, so
    a row's first child is its most probable one."""
    n = len(tree)
    out = np.full(n + 1, -1, dtype=np.int64)
    if n:
        parent_rows = tree.parents.astype(np.int64) + 1
        child_rows = np.arange(1, n + 1, dtype=np.int64)
        out[parent_rows[::-1]] = child_rows[::-1]  # the last write per parent is its lowest-index child
    return out
