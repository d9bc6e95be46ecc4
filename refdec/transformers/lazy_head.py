"""The lazy LM head: which tree rows the head runs on as the acceptance walks advance.

On a CPU the head of a large-vocabulary model is most of a forward. For models with a plain linear
head (refdec.transformers.plain_head) the verifier runs the model's backbone on every tree row and the
head only on the rows the acceptance walk visits (:class:`LazyRowLogits`; :class:`LockstepLazyWalks`
for a batch, one head GEMM per round for all rows).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from refdec.drafting.tree import DraftTree
from refdec.engine.accept import accept_walk_steps, first_child_rows
from refdec.transformers.plain_head import PlainHead

__all__ = ["LazyRowLogits", "LockstepLazyWalks"]


class LazyRowLogits:
    """Logits of a verified tree's rows, computed only when the acceptance walk asks.

    The backbone has produced ``hidden`` (float [1 + n, D]) for every row; the head
    (the expensive part on a CPU for a large vocabulary) runs ``chunk`` rows at a time:
    the asked-for row, then its best-child chain (the path the walk most likely takes
    next), then the next rows in best-first order to fill the chunk. A step that accepts
    ``k`` nodes computes about ``k + 1`` rows instead of ``1 + n``, whatever the tree size.

    ``row_logits(row)``: float [V]; ``argmax(row)``: int, the greedy target.
    ``rows_computed``: how many rows the head ran on (diagnostics).
    """

    def __init__(self, tree: DraftTree, hidden, head: PlainHead, chunk: int = 4) -> None:
        self.hidden = hidden
        self.head = head
        self.chunk = max(1, int(chunk))
        self.n_rows = len(tree) + 1
        self._first_child = first_child_rows(tree)
        self._logits: dict[int, object] = {}
        self._argmax: dict[int, int] = {}
        self.rows_computed = 0
        self.seconds = 0.0  # time spent in the head (perf_counter)

    def chunk_rows(self, row: int, chunk: int) -> list[int]:
        """The rows (tree row indices, at most ``chunk``) one head call computes when ``row`` is asked:
        ``row``, its best-child chain, then the next rows by index; only rows not computed yet."""
        rows = [row]
        nxt = int(self._first_child[row])
        while nxt >= 0 and len(rows) < chunk and nxt not in self._argmax:
            rows.append(nxt)
            nxt = int(self._first_child[nxt])
        fill = row + 1
        while len(rows) < chunk and fill < self.n_rows:
            if fill not in self._argmax and fill not in rows:
                rows.append(fill)
            fill += 1
        return rows

    def has(self, row: int) -> bool:
        """True when ``row``'s logits are computed (asking for them costs no head call)."""
        return row in self._argmax

    def store(self, rows: list[int], logits, best: list[int]) -> None:
        """Record logits computed elsewhere (one GEMM for several walks, :class:`LockstepLazyWalks`):
        ``logits`` float [len(rows), V] and their argmax ``best`` for the tree rows ``rows``."""
        for i, r in enumerate(rows):
            self._logits[r] = logits[i]
            self._argmax[r] = int(best[i])
        self.rows_computed += len(rows)

    def _compute(self, row: int) -> None:
        t0 = time.perf_counter()
        rows = self.chunk_rows(row, self.chunk)
        logits = self.head.logits(self.hidden[torch.tensor(rows, dtype=torch.long, device=self.hidden.device)])
        best = logits.argmax(dim=-1).tolist()  # the one host sync of this chunk
        self.store(rows, logits, best)
        self.seconds += time.perf_counter() - t0

    def argmax(self, row: int) -> int:
        if row not in self._argmax:
            self._compute(row)
        return self._argmax[row]

    def row_logits(self, row: int):
        if row not in self._logits:
            self._compute(row)
        return self._logits[row]


class LockstepLazyWalks:
    """The acceptance walks of a batch of verified trees, with ONE head GEMM per round for all of them.

    ``trees[walk_idx]`` was verified in batch row ``walk_idx`` of ``hidden`` (float
    [n_walks, T, D], the backbone's output; tree row ``r`` of walk ``walk_idx`` is
    ``hidden[walk_idx, r]``, rows past ``len(tree)`` are padding and never read). Each walk
    has a :class:`LazyRowLogits` (``self.lazy[walk_idx]``). :meth:`run` advances every walk as
    far as its computed rows allow; the walks then waiting on a row each contribute a chunk
    (:meth:`LazyRowLogits.chunk_rows`: the row, its best-child chain, the next rows) and one
    :meth:`PlainHead.logits` call computes all chunks. A step costs about as many head calls
    as the longest walk needs chunks, not one per walk.

    Chunk size: ``chunk`` rows per waiting walk, or with ``adaptive`` (the default) the
    fewest that keep a call at the head's ``min_rows`` — ``ceil(min_rows / waiting)``,
    at most ``chunk``: with 8 walks waiting each computes just the asked row (on a CPU the
    head costs about a row's worth per row past ``min_rows``, so rows the walk may never
    visit are paid for), with one walk left it takes a whole chunk along its best path (the
    padding would be computed anyway).

    ``seconds``: time in the head (GEMM + argmax + host sync); ``head_calls``: GEMMs run;
    ``self.lazy[walk_idx].rows_computed``: the rows computed for each walk.
    """

    def __init__(self, trees: list[DraftTree], hidden, head: PlainHead, chunk: int = 4,
                 adaptive: bool = True) -> None:
        if hidden.shape[0] != len(trees):
            raise ValueError(f"hidden has {hidden.shape[0]} batch rows for {len(trees)} trees")
        too_big = [i for i, t in enumerate(trees) if 1 + len(t) > hidden.shape[1]]
        if too_big:
            raise ValueError(f"tree {too_big[0]} has {1 + len(trees[too_big[0]])} rows, hidden only "
                             f"{hidden.shape[1]} per batch row")
        self.trees = trees
        self.hidden = hidden
        self.head = head
        self.chunk = max(1, int(chunk))
        self.adaptive = bool(adaptive)
        self.lazy = [LazyRowLogits(tree, hidden[i, : 1 + len(tree)], head, self.chunk)
                     for i, tree in enumerate(trees)]
        self.seconds = 0.0
        self.head_calls = 0

    def run(self, target_of_row) -> list[tuple[np.ndarray, int]]:
        """Every walk's ``(accepted_nodes, bonus_token)``, in walk order.

        ``target_of_row(walk_idx, row, depth) -> int`` is called only once ``row``'s logits are
        computed: ``self.lazy[walk_idx].argmax(row)`` (greedy) or a draw from
        ``self.lazy[walk_idx].row_logits(row)`` (sampling) costs no head call there.
        """
        walks = [accept_walk_steps(tree) for tree in self.trees]
        results: list = [None] * len(walks)
        waiting = {walk_idx: next(walk) for walk_idx, walk in enumerate(walks)}  # walk_idx -> (row, depth)
        while waiting:
            for walk_idx in list(waiting):
                row, depth = waiting[walk_idx]
                while self.lazy[walk_idx].has(row):
                    try:
                        row, depth = walks[walk_idx].send(target_of_row(walk_idx, row, depth))
                    except StopIteration as end:
                        results[walk_idx] = end.value
                        del waiting[walk_idx]
                        break
                else:
                    waiting[walk_idx] = (row, depth)
            if waiting:
                self._compute({walk_idx: row for walk_idx, (row, _) in waiting.items()})
        return results

    def _compute(self, asked: dict[int, int]) -> None:
        """One head call for the chunks of the walks in ``asked`` (walk_idx -> tree row)."""
        t0 = time.perf_counter()
        chunk = self.chunk
        if self.adaptive:
            chunk = min(chunk, max(1, -(-self.head.min_rows // len(asked))))
        chunks = {walk_idx: self.lazy[walk_idx].chunk_rows(row, chunk) for walk_idx, row in asked.items()}
        walk_of = [walk_idx for walk_idx, rows in chunks.items() for _ in rows]
        row_of = [r for rows in chunks.values() for r in rows]
        device = self.hidden.device
        hidden = self.hidden[torch.tensor(walk_of, dtype=torch.long, device=device),
                             torch.tensor(row_of, dtype=torch.long, device=device)]  # [sum_rows, D]
        logits = self.head.logits(hidden)
        best = logits.argmax(dim=-1).tolist()  # the one host sync of this round
        start = 0
        for walk_idx, rows in chunks.items():
            stop = start + len(rows)
            self.lazy[walk_idx].store(rows, logits[start:stop], best[start:stop])
            start = stop
        self.head_calls += 1
        self.seconds += time.perf_counter() - t0
