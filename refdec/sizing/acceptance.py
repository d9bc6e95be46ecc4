"""How often a draft node is accepted, learnt from verification.

A draft tree's node scores (``refdec.drafting.tree.DraftTree.scores``) are the proposer's estimates; how
often nodes are really accepted depends on the model and the workload. Replaying vLLM's greedy
outputs through the adapter's chains (benchmarks/RESULTS.md section 6), edit nodes scored 0.1-0.2
were accepted 29% of the time, and live-context loop nodes scored under 0.02 in 66-74%.
:class:`AcceptanceTable` keeps one acceptance rate per *cell* -- (source, score bucket, depth
bucket) -- counted from the nodes that were verified, so a policy prices nodes by what they
do, not by what they were scored. Two policies read it: refdec's "auto" draft size
(:class:`refdec.sizing.budget.AutoBudget`; one table per decoder, ``SpeculativeDecoder.acceptance``,
that each request reads and teaches, a copy per row of a batch) and the vLLM adapter's chain choice
(:mod:`refdec.vllm.chain`, one table per vLLM worker). The table does not say what a score is:
the vLLM adapter gives node scores and learns how often a node is accepted; "auto" gives each
node's step score (its score over its parent's) and learns how often a node is accepted once its
parent was, so what the shallow steps of a chain teach carries to its deep ones.
"""

from __future__ import annotations

import numpy as np

from refdec.tokens import check_int

__all__ = ["AcceptanceTable", "DEPTH_CENTERS", "DEPTH_EDGES", "SCORE_CENTERS", "SCORE_EDGES"]

# Score buckets (upper edges) and depth buckets (lower edges of depths 2, 3, 5, ...).
SCORE_EDGES = np.array([0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.85, 0.95], dtype=np.float32)
SCORE_CENTERS = np.array([0.01, 0.035, 0.075, 0.15, 0.27, 0.42, 0.6, 0.77, 0.9, 0.97])
DEPTH_EDGES = np.array([2, 3, 5, 9, 17, 33], dtype=np.int32)
DEPTH_CENTERS = np.array([1, 2, 3.5, 6.5, 12.5, 24.5, 48])


class AcceptanceTable:
    """Acceptance rate per cell (source, score bucket, depth bucket).

    ``rates[cell]`` = (accepted + ``prior_weight`` * prior) / (verified + ``prior_weight``), where
    the counts decay by ``decay`` per observed draft (the estimate follows the workload) and the
    prior of depth bucket 0 is the bucket's score centre, of bucket d the rate of bucket d - 1
    times ``prior_depth_decay`` ** (depth gap): deep cells never verified learn from the
    shallow ones. Scores are probabilities of a path or of a step; either way they already fall
    with depth where acceptance does, so the default adds no decay of its own (1.0).

    Arrays (float64, flat over ``shape`` = (n_sources, score buckets, depth buckets)):
    ``accepted`` and ``verified`` (the decayed counts), ``rates`` (read them by :meth:`cells`).
    """

    def __init__(self, n_sources: int = 4, *, prior_weight: float = 3.0, prior_depth_decay: float = 1.0,
                 decay: float = 0.998) -> None:
        self.n_sources = check_int("n_sources", n_sources, 1)
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        if not prior_weight > 0.0:
            raise ValueError(f"prior_weight must be > 0, got {prior_weight!r}")
        self.prior_weight = float(prior_weight)
        self.decay = float(decay)
        self.shape = (self.n_sources, len(SCORE_CENTERS), len(DEPTH_CENTERS))
        self._gap_decay = prior_depth_decay ** np.diff(DEPTH_CENTERS)
        self._first_prior = np.broadcast_to(SCORE_CENTERS[None, :], self.shape[:2]).copy()
        self.accepted = np.zeros(int(np.prod(self.shape)))
        self.verified = np.zeros_like(self.accepted)
        self.update_rates()

    def cells(self, scores: np.ndarray, depths: np.ndarray, source_ids: np.ndarray) -> np.ndarray:
        """int64 [n]: the cell of each node of a tree (``scores`` float32 [n], ``depths`` int32 [n],
        ``source_ids`` int32 [n], as in :class:`refdec.drafting.tree.DraftTree`)."""
        s = np.searchsorted(SCORE_EDGES, scores, side="right")
        d = np.searchsorted(DEPTH_EDGES, depths, side="right")
        src = np.clip(source_ids, 0, self.n_sources - 1)
        return (src.astype(np.int64) * len(SCORE_CENTERS) + s) * len(DEPTH_CENTERS) + d

    def observe(self, verified_cells: np.ndarray, accepted_cells: np.ndarray, num_drafts: int = 1) -> None:
        """Counts verified nodes: ``verified_cells`` (int64 [m]) the cells of every verified node,
        ``accepted_cells`` (int64 [j]) those of the accepted ones; the old counts decay by
        ``decay ** num_drafts`` first (``num_drafts``: the drafts these nodes came from)."""
        size = self.accepted.shape[0]
        factor = self.decay ** num_drafts
        self.verified *= factor
        self.accepted *= factor
        self.verified += np.bincount(verified_cells, minlength=size)
        if len(accepted_cells):
            self.accepted += np.bincount(accepted_cells, minlength=size)
        self.update_rates()

    def update_rates(self) -> None:
        """Recomputes ``rates`` from the counts (after the counts were changed in place)."""
        acc = self.accepted.reshape(self.shape)
        ver = self.verified.reshape(self.shape)
        rate = np.empty(self.shape)
        w = self.prior_weight
        prior = self._first_prior
        for d in range(self.shape[2]):
            rate[:, :, d] = (acc[:, :, d] + w * prior) / (ver[:, :, d] + w)
            if d + 1 < self.shape[2]:
                prior = rate[:, :, d] * self._gap_decay[d]
        self.rates = rate.ravel()
