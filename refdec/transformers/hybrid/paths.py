"""A verification step's trees as the recurrent layers read them: each tree row's path.

A verification forward feeds, per batch row, ``T`` query rows: the root (row 0) and the draft
nodes (row ``1 + i``), padded to one length (refdec.transformers.masks). A recurrent layer
advances its state along each row's root-to-node path, so it needs, per tree row, which rows
are on that path (:attr:`TreePaths.ancestors`) and which inputs its causal convolution reads
(:meth:`TreePaths.conv_columns`). A padding row's path is itself alone: it starts from the
cached state like the root, and nothing reads its result.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from refdec.drafting.tree import DraftTree

__all__ = ["TreePaths", "tree_paths"]


@dataclass
class TreePaths:
    """``parent_rows`` int64 [B, T]: each row's parent row (the root and padding rows: -1, the
    cached state); ``ancestors`` bool [B, T, T]: ``ancestors[b, r, c]`` iff row ``c`` is on row
    ``r``'s path (``r`` itself included); ``depth`` int64 [B, T]: rows above ``r`` on its path (the
    root and padding rows: 0). On the model's device."""

    parent_rows: torch.Tensor
    ancestors: torch.Tensor
    depth: torch.Tensor
    _columns: dict = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return int(self.parent_rows.shape[1])

    def conv_columns(self, kernel: int) -> torch.Tensor:
        """int64 [B, T, kernel]: for each tree row, the columns of its convolution window in
        ``cat([window[..., -(kernel - 1):], tree_inputs], -1)`` (the cached window's last
        ``kernel - 1`` inputs, then the ``T`` rows' inputs), oldest first, the row itself last:
        ``j`` steps up its path is the ancestor row there, past the root the cached window."""
        found = self._columns.get(kernel)
        if found is None:
            found = self._columns[kernel] = _conv_columns(self.parent_rows, self.depth, kernel)
        return found


def _conv_columns(parent_rows: torch.Tensor, depth: torch.Tensor, kernel: int) -> torch.Tensor:
    cached = kernel - 1
    row = torch.arange(parent_rows.shape[1], device=parent_rows.device).expand_as(parent_rows)
    columns = [cached + row]
    up = row
    for j in range(1, kernel):
        up = parent_rows.clamp(min=0).gather(1, up)  # j steps up; meaningless once past the root
        columns.append(torch.where(depth >= j, cached + up, cached - (j - depth)))
    return torch.stack(columns[::-1], dim=-1)


def tree_paths(trees: list[DraftTree], rows: int, device) -> TreePaths:
    """The :class:`TreePaths` of ``trees`` (``trees[b]``: batch row b's draft tree) padded to
    ``rows`` query rows (at least ``1 + max len(tree)``)."""
    batch = len(trees)
    parent_rows = np.full((batch, rows), -1, dtype=np.int64)
    depth = np.zeros((batch, rows), dtype=np.int64)
    ancestors = np.zeros((batch, rows, rows), dtype=bool)
    ancestors[:] = np.eye(rows, dtype=bool)
    for b, tree in enumerate(trees):
        n = len(tree)
        if 1 + n > rows:
            raise ValueError(f"rows={rows} is fewer than the {1 + n} rows of tree {b}")
        parent_rows[b, 1:n + 1] = tree.parents.astype(np.int64) + 1
        depth[b, 1:n + 1] = tree.depths
        for r in range(1, n + 1):  # topological order: a parent's path is complete before its children
            ancestors[b, r] |= ancestors[b, parent_rows[b, r]]
    return TreePaths(torch.from_numpy(parent_rows).to(device), torch.from_numpy(ancestors).to(device),
                     torch.from_numpy(depth).to(device))
