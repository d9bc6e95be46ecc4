"""DraftTree: the one currency between the proposer and the verifier.

A draft tree is stored as flat arrays in topological order (a parent always
comes before its children), following ArcticInference's draft format:

    token_ids  int32   [n]  the token each node proposes
    parents    int32   [n]  index of the parent node, -1 for children of the root
                            (the root is the last accepted token, not stored)
    scores     float32 [n]  estimated probability that the path to this node is accepted
    source_ids int32   [n]  which draft source proposed the node (index into ``source_names``)
    depths     int32   [n]  depth of each node: 1 for children of the root, else 1 + its parent's

A tree's depths are one fact, set when the tree is made: the C++ builder that drafts it knows
each node's depth and returns it with the other arrays; a tree made by hand derives them once
from ``parents`` (or is given them, checked against ``parents``), and the helpers here that make
a tree from another (:func:`keep_nodes`, :meth:`DraftBatch.tree`, ...) carry them along. Code
that needs a node's depth (positions, acceptance cells, chains) reads ``depths``.

A :class:`DraftBatch` holds the trees of a batch step the same way, one tree after another
(``offsets`` int64 [R + 1]: tree r is nodes ``[offsets[r], offsets[r + 1])``, its parents
indexing within the tree).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from refdec import _C

# The most nodes a step verifies per row by default, and the deepest a draft goes: the "auto"
# budget's max_nodes, the proposer's and the decoder's max_depth, the llama.cpp backend's tree,
# the largest size the calibrations measure. Past it a CPU step costs more than its tokens gain.
# Stated in C++ (csrc/proposer_core.h, kMaxNodes), whose copy cursor is tuned for it.
MAX_NODES = _C.MAX_NODES


def _derive_depths(parents: np.ndarray) -> np.ndarray:
    """int32 [n]: the depth of each node (1 for children of the root) of a topologically ordered
    tree; ``parents``: int32 [n], -1 <= parents[i] < i."""
    depth = [0] * len(parents)
    for node_idx, parent in enumerate(parents.tolist()):
        depth[node_idx] = 1 if parent < 0 else depth[parent] + 1
    return np.asarray(depth, dtype=np.int32)


@dataclass(frozen=True)
class DraftTree:
    """A draft tree (the arrays of the module docstring). ``source_ids`` defaults to zeros;
    ``depths`` (int32 [n]) to the depths derived from ``parents``: given, they are checked
    against ``parents`` (1 for a child of the root, else 1 + the parent's depth)."""

    token_ids: np.ndarray
    parents: np.ndarray
    scores: np.ndarray
    source_ids: np.ndarray = None  # type: ignore[assignment]
    source_names: tuple[str, ...] = field(default=("draft",))
    depths: np.ndarray = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        token_ids = np.ascontiguousarray(self.token_ids, dtype=np.int32)
        parents = np.ascontiguousarray(self.parents, dtype=np.int32)
        scores = np.ascontiguousarray(self.scores, dtype=np.float32)
        n = token_ids.shape[0]
        if token_ids.ndim != 1 or parents.shape != (n,) or scores.shape != (n,):
            raise ValueError(
                f"DraftTree arrays must be 1-D of one length: token_ids {token_ids.shape}, "
                f"parents {parents.shape}, scores {scores.shape}"
            )
        if self.source_ids is None:
            source_ids = np.zeros(n, dtype=np.int32)
        else:
            source_ids = np.ascontiguousarray(self.source_ids, dtype=np.int32)
            if source_ids.shape != (n,):
                raise ValueError(f"DraftTree source_ids must have shape ({n},), got {source_ids.shape}")
        if n:
            node_idx = np.arange(n, dtype=np.int32)
            bad = np.nonzero((parents < -1) | (parents >= node_idx))[0]
            if bad.size:
                i = int(bad[0])
                raise ValueError(
                    f"DraftTree parents must satisfy -1 <= parents[i] < i; parents[{i}] = {int(parents[i])}"
                )
            if (token_ids < 0).any():
                i = int(np.nonzero(token_ids < 0)[0][0])
                raise ValueError(f"DraftTree token_ids must be >= 0; token_ids[{i}] = {int(token_ids[i])}")
        if self.depths is None:
            depths = _derive_depths(parents)
        else:
            depths = np.ascontiguousarray(self.depths, dtype=np.int32)
            if depths.shape != (n,):
                raise ValueError(f"DraftTree depths must have shape ({n},), got {depths.shape}")
            # node i's expected depth from its parent's (given) one: the first mismatch is the
            # first wrong depth, its parent's being right
            expected = np.where(parents < 0, 1, depths[np.maximum(parents, 0)] + 1)
            bad = np.flatnonzero(depths != expected)
            if bad.size:
                i = int(bad[0])
                raise ValueError(f"DraftTree depths must be 1 for a child of the root, else 1 + the parent's "
                                 f"depth; depths[{i}] = {int(depths[i])}, expected {int(expected[i])}")
        object.__setattr__(self, "token_ids", token_ids)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "source_ids", source_ids)
        object.__setattr__(self, "depths", depths)

    @classmethod
    def _trusted(cls, token_ids: np.ndarray, parents: np.ndarray, scores: np.ndarray, source_ids: np.ndarray,
                 depths: np.ndarray, source_names: tuple[str, ...]) -> "DraftTree":
        """A tree from arrays its maker guarantees valid (int32 / int32 / float32 / int32 / int32,
        1-D, one length, -1 <= parents[i] < i, depths those of ``parents``): the C++ builder's
        output, or a part of a valid tree. Skips ``__post_init__``'s checks, which cost more than
        a whole build; token ids may be negative only for a corrupt CorpusIndex body
        (``verify()`` False), nodes the decoder drops."""
        tree = object.__new__(cls)
        tree.__dict__.update(token_ids=token_ids, parents=parents, scores=scores, source_ids=source_ids,
                             source_names=source_names, depths=depths)
        return tree

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    @classmethod
    def empty(cls) -> "DraftTree":
        z = np.zeros(0, dtype=np.int32)
        return cls(z, z, np.zeros(0, dtype=np.float32), depths=z)

    @classmethod
    def chain(cls, tokens, source_names: tuple[str, ...] = ("draft",)) -> "DraftTree":
        """A single path: tokens[0] is a child of the root, tokens[i] of tokens[i-1]."""
        tokens = np.asarray(tokens, dtype=np.int32)
        n = tokens.shape[0]
        return cls(tokens, np.arange(-1, n - 1, dtype=np.int32), np.ones(n, dtype=np.float32),
                   source_names=source_names, depths=np.arange(1, n + 1, dtype=np.int32))

    @classmethod
    def from_paths(cls, paths, max_nodes: int, path_sources=None,
                   source_names: tuple[str, ...] = ("draft",)) -> "DraftTree":
        """Merge root-down token paths (lists of ints) into one trie, first path first.

        A path follows an existing node while its token matches a child there; a new node is
        added only while the tree has fewer than ``max_nodes`` (the rest of that path is
        dropped, later paths may still follow existing nodes). Scores are 1; a node's source
        is ``path_sources[i]`` of the path ``i`` that added it (default 0)."""
        tokens, parents, sources, depths = [], [], [], []
        children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
        for path_idx, path in enumerate(paths):
            source = 0 if path_sources is None else int(path_sources[path_idx])
            parent = -1
            for depth, tok in enumerate(path, start=1):
                node = children.get((parent, int(tok)))
                if node is None:
                    if len(tokens) >= max_nodes:
                        break
                    node = len(tokens)
                    tokens.append(int(tok))
                    parents.append(parent)
                    sources.append(source)
                    depths.append(depth)
                    children[(parent, int(tok))] = node
                parent = node
        return cls(np.asarray(tokens, dtype=np.int32), np.asarray(parents, dtype=np.int32),
                   np.ones(len(tokens), dtype=np.float32), np.asarray(sources, dtype=np.int32),
                   source_names=source_names, depths=np.asarray(depths, dtype=np.int32))

    def __repr__(self) -> str:
        return f"DraftTree(n={len(self)}, max_depth={int(self.depths.max()) if len(self) else 0})"


@dataclass(frozen=True)
class DraftBatch:
    """The draft trees of R requests in one step, concatenated (what
    :meth:`refdec.Proposer.propose_batch` returns): ``token_ids`` int32 (n,), ``parents`` int32
    (n,) (within its tree; -1 = child of the root), ``scores`` float32 (n,), ``source_ids``
    int32 (n,), ``depths`` int32 (n,) (1 = child of the root), ``offsets`` int64 (R + 1,): tree
    r is nodes ``[offsets[r], offsets[r + 1])``, each tree in topological order. Made by
    refdec's C++ builder, whose output is trusted (no checks); ``tree(r)`` gives one tree as a
    :class:`DraftTree` of views."""

    token_ids: np.ndarray
    parents: np.ndarray
    scores: np.ndarray
    source_ids: np.ndarray
    depths: np.ndarray
    offsets: np.ndarray
    source_names: tuple[str, ...] = ("draft",)

    def __len__(self) -> int:
        """The number of trees (R)."""
        return int(self.offsets.shape[0]) - 1

    def tree(self, r: int) -> DraftTree:
        """Tree ``r`` (0 <= r < R) as a :class:`DraftTree` whose arrays are views of the batch's."""
        if not 0 <= r < len(self):
            raise IndexError(f"r must be in [0, {len(self)}), got {r}")
        a, b = int(self.offsets[r]), int(self.offsets[r + 1])
        return DraftTree._trusted(self.token_ids[a:b], self.parents[a:b], self.scores[a:b], self.source_ids[a:b],
                                  self.depths[a:b], self.source_names)


def keep_nodes(tree: DraftTree, node_idx: np.ndarray) -> DraftTree:
    """The subtree of the nodes ``node_idx`` (increasing ints; every kept node's parent is kept
    too), renumbered in the same order; each node keeps its depth (a ValueError where a kept
    node's parent was not kept)."""
    if node_idx.size == 0:
        return DraftTree.empty()
    new_index = np.full(len(tree), -1, dtype=np.int32)
    new_index[node_idx] = np.arange(node_idx.size, dtype=np.int32)
    old_parents = tree.parents[node_idx]
    parents = np.where(old_parents < 0, -1, new_index[np.maximum(old_parents, 0)]).astype(np.int32)
    return DraftTree(tree.token_ids[node_idx], parents, tree.scores[node_idx], tree.source_ids[node_idx],
                     source_names=tree.source_names, depths=tree.depths[node_idx])


def prune_to_depth(tree: DraftTree, max_depth: int) -> DraftTree:
    """The subtree of nodes at depth <= ``max_depth`` (indices renumbered, order kept)."""
    if len(tree) == 0:
        return tree
    depth = tree.depths
    if int(depth.max()) <= max_depth:
        return tree
    return keep_nodes(tree, np.flatnonzero(depth <= max_depth))
