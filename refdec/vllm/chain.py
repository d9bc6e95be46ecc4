"""From refdec's draft trees to the chains vLLM verifies, one per request.

Each node's acceptance probability is read from an :class:`refdec.acceptance.AcceptanceTable`
(learnt from what vLLM accepted; the node's own score where no table is given) and held
non-increasing along a path (a path is accepted no more often than its prefix). Per request,
:func:`walk_trees` (one call for the whole batch) takes the root path of highest expected
accepted length (the sum of its probabilities) less a price per token; :func:`token_price` sets
that price each step from the whole batch (what one more verified token costs, in tokens). The
walk is compiled with numba on first use (vLLM depends on numba); without numba it runs as
Python on lists.
"""

from __future__ import annotations

import numpy as np

from refdec.acceptance import DEPTH_EDGES, SCORE_EDGES

__all__ = ["best_chain", "token_price", "walk_trees"]

_NO_RATES = np.zeros(0, np.float64)
_SCORE_EDGES = SCORE_EDGES.astype(np.float32)
_DEPTH_EDGES = DEPTH_EDGES.astype(np.int32)


def _walk_trees(token_ids, parents, scores, source_ids, offsets, max_lens, rates, score_edges, depth_edges, price,
                out_tokens, out_probs, out_cells, out_lengths):  # pragma: no cover - numba compiles it
    """The walk of :func:`walk_trees`: per tree, one pass in topological order keeps each node's
    cell, probability, path value and depth; then the best node's path is written root first."""
    n_score = len(score_edges) + 1
    n_depth = len(depth_edges) + 1
    n_sources = len(rates) // (n_score * n_depth)
    n_total = len(token_ids)
    value = np.empty(n_total, np.float64)
    prob = np.empty(n_total, np.float64)
    depth = np.empty(n_total, np.int32)
    cell = np.zeros(n_total, np.int64)
    for r in range(len(max_lens)):
        start = offsets[r]
        max_len = max_lens[r]
        best = -1
        best_value = 0.0
        for i in range(start, offsets[r + 1]):
            p = parents[i]  # within the tree; -1: a child of the root
            v = 0.0
            d = 1
            if p >= 0:
                v = value[start + p]
                d = depth[start + p] + 1
            if n_sources > 0:  # the calibrated rate of the node's cell (AcceptanceTable.cells)
                s = 0
                while s < n_score - 1 and scores[i] >= score_edges[s]:
                    s += 1
                b = 0
                while b < n_depth - 1 and d >= depth_edges[b]:
                    b += 1
                src = min(max(source_ids[i], 0), n_sources - 1)
                c = (src * n_score + s) * n_depth + b
                cell[i] = c
                q = rates[c]
            else:
                q = scores[i]
            if p >= 0 and q > prob[start + p]:
                q = prob[start + p]
            if token_ids[i] < 0:  # a corrupt index body: never this node or its subtree
                q = 0.0
                v = -np.inf
            else:
                v += q - price
            prob[i] = q
            value[i] = v
            depth[i] = d
            if d <= max_len and v > best_value:
                best = i
                best_value = v
        length = 0
        if best >= 0:
            length = depth[best]
            i = best
            for j in range(length - 1, -1, -1):
                out_tokens[r, j] = token_ids[i]
                out_probs[r, j] = prob[i]
                out_cells[r, j] = cell[i]
                i = start + parents[i]
        out_lengths[r] = length


def _walk_trees_py(token_ids, parents, scores, source_ids, offsets, max_lens, rates, score_edges, depth_edges, price,
                   out_tokens, out_probs, out_cells, out_lengths) -> None:
    """:func:`_walk_trees` in Python, on lists (indexing a list is faster than a numpy array)."""
    _walk_trees(token_ids.tolist(), parents.tolist(), scores.tolist(), source_ids.tolist(), offsets.tolist(),
                max_lens.tolist(), rates.tolist(), score_edges.tolist(), depth_edges.tolist(), price, out_tokens,
                out_probs, out_cells, out_lengths)


_walk_trees_impl = None


def _walk_impl():
    """numba's compiled walk where numba is installed (vLLM depends on it), else the Python one.
    Imported on first use, never at import: vLLM's CPU worker scans every loaded module's
    attributes while it starts, and llvmlite's objects break that scan (vLLM 0.32)."""
    global _walk_trees_impl
    if _walk_trees_impl is None:
        try:
            from numba import njit
        except ImportError:  # pragma: no cover - depends on the environment
            _walk_trees_impl = _walk_trees_py
        else:
            _walk_trees_impl = njit(cache=False, nogil=True)(_walk_trees)
    return _walk_trees_impl


def walk_trees(token_ids: np.ndarray, parents: np.ndarray, scores: np.ndarray, source_ids: np.ndarray,
               offsets: np.ndarray, max_lens: np.ndarray, rates: np.ndarray | None, price: float,
               out_tokens: np.ndarray, out_probs: np.ndarray, out_cells: np.ndarray, out_lengths: np.ndarray) -> None:
    """The chains of R draft trees (a step's batch) in one call, written into the ``out_*`` arrays.

    Trees, concatenated (:class:`refdec.tree.DraftTree` arrays, each tree in topological order):
    ``token_ids`` int32 (n,), ``parents`` int32 (n,) (within its tree; -1 = child of the root),
    ``scores`` float32 (n,), ``source_ids`` int32 (n,); tree r is ``[offsets[r], offsets[r + 1])``
    (``offsets`` int64 (R + 1,)); ``max_lens`` int64 (R,): its longest chain. ``rates``: float64,
    an :class:`~refdec.acceptance.AcceptanceTable`'s ``rates`` (a node's probability = its cell's
    rate), or None (= its score). Probabilities are held non-increasing along a path. Tree r's
    chain is the root path ending at the node of depth <= ``max_lens[r]`` that maximises
    ``sum over the path of (probability - price)``; empty when no path is worth more than 0. Ties
    go to the node first in the tree (refdec builds best first); nodes with a negative token id
    (a corrupt index body) and their subtrees are never chosen. Outputs, chain r in row r, root
    first (each row at least max(max_lens) long): ``out_tokens`` int32 (R, L) token ids,
    ``out_probs`` float64 (R, L) probabilities, ``out_cells`` int64 (R, L) the nodes' table cells
    (0 without a table), ``out_lengths`` int64 (R,) chain lengths."""
    rates = _NO_RATES if rates is None else rates
    (_walk_trees_impl or _walk_impl())(token_ids, parents, scores, source_ids, offsets, max_lens, rates,
                                       _SCORE_EDGES, _DEPTH_EDGES, float(price), out_tokens, out_probs, out_cells,
                                       out_lengths)


def best_chain(token_ids: np.ndarray, parents: np.ndarray, scores: np.ndarray, max_len: int,
               draft_cost: float = 0.0, out: np.ndarray | None = None) -> np.ndarray:
    """The chain (int32 token ids, root first) of one draft tree scored by ``scores`` alone
    (:func:`walk_trees` of one tree, no table, price ``draft_cost``). ``token_ids`` int32 (n,),
    ``parents`` int32 (n,), ``scores`` float32 (n,) (estimated probability that the path to the
    node is accepted). ``out`` (int32, length >= max_len) is reused when given; the result is a
    view of it."""
    if out is None:
        out = np.empty(max(max_len, 1), dtype=np.int32)
    n = token_ids.shape[0]
    if n == 0 or max_len <= 0:
        return out[:0]
    width = max(max_len, 1)
    tokens = np.empty((1, width), np.int32)
    lengths = np.zeros(1, np.int64)
    walk_trees(token_ids, parents, scores, np.zeros(n, np.int32), np.array([0, n], np.int64),
               np.array([max_len], np.int64), None, draft_cost, tokens, np.empty((1, width)),
               np.empty((1, width), np.int64), lengths)
    length = int(lengths[0])
    out[:length] = tokens[0, :length]
    return out[:length]


def token_price(probs: np.ndarray, lengths: np.ndarray, num_rows: int, token_cost: float) -> float:
    """This step's price of one more verified token, in expected accepted tokens.

    A step verifies ``num_rows`` requests (each its last token plus its chain) in
    ``a + b * (tokens verified)`` time (a: the fixed part, weights and scheduling; b: one more
    token; ``token_cost`` = b / a) and emits ``num_rows`` + (accepted drafts) tokens. Sending
    the ``m`` most probable draft tokens of the batch's best chains yields expected tokens per
    time ``V(m) = (num_rows + their probability sum) / (1 + token_cost * (num_rows + m))``; at
    the best ``m``, one more token raises ``V`` only if its probability exceeds
    ``token_cost * V``: that is the price returned. Each request then sends its tree's best path
    at that price (:func:`walk_trees`). The price rises with the batch (a loaded batch pays
    nearly its own yield per verified token) and with what the step already emits.

    ``probs``: float64 (R, L), request r's chain probabilities (its best path at no cost) in
    the first ``lengths[r]`` entries (int (R,)); ``num_rows`` >= R (rows without a draft
    are verified too)."""
    mask = np.arange(probs.shape[1]) < lengths[:, None]
    flat = probs[mask]
    flat = -np.sort(-flat)
    value = (num_rows + np.cumsum(flat)) / (1.0 + token_cost * (num_rows + np.arange(1, flat.shape[0] + 1)))
    best_value = num_rows / (1.0 + token_cost * num_rows)
    if flat.shape[0]:
        best_value = max(best_value, float(value.max()))
    return token_cost * best_value
