"""From refdec's draft trees to the chains vLLM verifies, one per request.

Each node's acceptance probability is read from an :class:`refdec.sizing.acceptance.AcceptanceTable`
(learnt from what vLLM accepted; the node's own score where no table is given) and held
non-increasing along a path (a path is accepted no more often than its prefix). Per request,
:func:`walk_trees` (one call for the whole batch) takes the root path of highest expected
accepted length (the sum of its probabilities) less a price per token; :func:`token_price` sets
that price each step from the whole batch (what one more verified token costs, in tokens). The
walk is compiled with numba on first use (vLLM depends on numba); without numba the same code
runs as Python.
"""

from __future__ import annotations

import numpy as np

from refdec.sizing.acceptance import DEPTH_EDGES, SCORE_EDGES

__all__ = ["best_chain", "choose_chains", "token_price", "walk_trees"]

_NO_RATES = np.zeros(0, np.float64)
_SCORE_EDGES = SCORE_EDGES.astype(np.float32)
_DEPTH_EDGES = DEPTH_EDGES.astype(np.int32)


def _node_probs(token_ids, parents, scores, source_ids, depths, offsets, rates, score_edges, depth_edges, prob,
                cell):  # pragma: no cover - numba compiles it
    """Per node of every tree (one pass in topological order): its table ``cell`` (int64; 0
    without a table) and ``prob`` (float64): the cell's rate (its score without a table), held
    non-increasing along the path, 0 for a negative token id."""
    n_score = len(score_edges) + 1
    n_depth = len(depth_edges) + 1
    n_sources = len(rates) // (n_score * n_depth)
    for r in range(len(offsets) - 1):
        start = offsets[r]
        for i in range(start, offsets[r + 1]):
            p = parents[i]  # within the tree; -1: a child of the root
            c = 0
            if n_sources > 0:  # the calibrated rate of the node's cell (AcceptanceTable.cells)
                s = 0
                while s < n_score - 1 and scores[i] >= score_edges[s]:
                    s += 1
                b = 0
                while b < n_depth - 1 and depths[i] >= depth_edges[b]:
                    b += 1
                src = min(max(source_ids[i], 0), n_sources - 1)
                c = (src * n_score + s) * n_depth + b
                q = rates[c]
            else:
                q = scores[i]
            if p >= 0 and q > prob[start + p]:
                q = prob[start + p]
            if token_ids[i] < 0:
                q = 0.0
            prob[i] = q
            cell[i] = c


def _best_paths(token_ids, parents, depths, offsets, max_lens, prob, cell, price, value, out_tokens, out_probs,
                out_cells, out_lengths):  # pragma: no cover - numba compiles it
    """Per tree, the root path of depth <= its max_len that maximises sum(prob - price) (the
    first such node on ties; never through a negative token id), written root first into row r
    of the outputs. ``value`` float64 (n,): scratch."""
    for r in range(len(max_lens)):
        start = offsets[r]
        max_len = max_lens[r]
        best = -1
        best_value = 0.0
        for i in range(start, offsets[r + 1]):
            p = parents[i]
            v = 0.0
            if p >= 0:
                v = value[start + p]
            if token_ids[i] < 0:  # a corrupt index body: never this node or its subtree
                v = -np.inf
            else:
                v += prob[i] - price
            value[i] = v
            if depths[i] <= max_len and v > best_value:
                best = i
                best_value = v
        length = 0
        if best >= 0:
            length = depths[best]
            i = best
            for j in range(length - 1, -1, -1):
                out_tokens[r, j] = token_ids[i]
                out_probs[r, j] = prob[i]
                out_cells[r, j] = cell[i]
                i = start + parents[i]
        out_lengths[r] = length


def _price_of(probs, lengths, num_rows, token_cost):
    """:func:`token_price` (numba compiles it into :func:`choose_chains`)."""
    n = 0
    for r in range(len(lengths)):
        n += lengths[r]
    flat = np.empty(n, np.float64)
    n = 0
    for r in range(len(lengths)):
        for j in range(lengths[r]):
            flat[n] = -probs[r, j]
            n += 1
    flat.sort()  # the probabilities from the largest (as -p ascending)
    best_value = num_rows / (1.0 + token_cost * num_rows)
    total = 0.0
    for m in range(n):
        total += -flat[m]
        value = (num_rows + total) / (1.0 + token_cost * (num_rows + m + 1))
        if value > best_value:
            best_value = value
    return token_cost * best_value


def _make_choose(node_probs, best_paths, price_of):
    """:func:`choose_chains`'s body over the three passes (compiled, or Python)."""

    def choose(token_ids, parents, scores, source_ids, depths, offsets, max_lens, rates, score_edges, depth_edges,
               fixed_price, token_cost, num_rows, out_tokens, out_probs, out_cells, out_lengths):
        # the node pass once; the path pass at fixed_price (>= 0), or at no cost and then at the
        # price those candidates set (fixed_price < 0)
        n = len(token_ids)
        prob = np.empty(n, np.float64)
        cell = np.empty(n, np.int64)
        value = np.empty(n, np.float64)
        node_probs(token_ids, parents, scores, source_ids, depths, offsets, rates, score_edges, depth_edges, prob, cell)
        price = fixed_price
        if fixed_price < 0.0:
            best_paths(token_ids, parents, depths, offsets, max_lens, prob, cell, 0.0, value, out_tokens, out_probs,
                       out_cells, out_lengths)
            price = price_of(out_probs, out_lengths, num_rows, token_cost)
            if price <= 0.0:
                return price
        best_paths(token_ids, parents, depths, offsets, max_lens, prob, cell, price, value, out_tokens, out_probs,
                   out_cells, out_lengths)
        return price

    return choose


_choose_py = _make_choose(_node_probs, _best_paths, _price_of)  # without numba (slower, the same results)
_choose_impl = None


def _compiled_choose():
    """numba's compiled choice where numba is installed (vLLM depends on it), else
    ``_choose_py``. Compiled on first use, never at import: vLLM's CPU worker scans every loaded
    module's attributes while it starts, and llvmlite's objects break that scan (vLLM 0.32)."""
    global _choose_impl
    if _choose_impl is None:
        try:
            from numba import njit
        except ImportError:  # pragma: no cover - depends on the environment
            _choose_impl = _choose_py
        else:
            jit = njit(cache=False, nogil=True)
            _choose_impl = jit(_make_choose(jit(_node_probs), jit(_best_paths), jit(_price_of)))
    return _choose_impl


def walk_trees(token_ids: np.ndarray, parents: np.ndarray, scores: np.ndarray, source_ids: np.ndarray,
               depths: np.ndarray, offsets: np.ndarray, max_lens: np.ndarray, rates: np.ndarray | None, price: float,
               out_tokens: np.ndarray, out_probs: np.ndarray, out_cells: np.ndarray, out_lengths: np.ndarray) -> None:
    """The chains of R draft trees (a step's batch) in one call, written into the ``out_*`` arrays.

    Trees, concatenated (:class:`refdec.drafting.tree.DraftBatch` arrays, each tree in topological order):
    ``token_ids`` int32 (n,), ``parents`` int32 (n,) (within its tree; -1 = child of the root),
    ``scores`` float32 (n,), ``source_ids`` int32 (n,), ``depths`` int32 (n,) (the trees' own,
    1 = child of the root); tree r is ``[offsets[r], offsets[r + 1])``
    (``offsets`` int64 (R + 1,)); ``max_lens`` int64 (R,): its longest chain. ``rates``: float64,
    an :class:`~refdec.sizing.acceptance.AcceptanceTable`'s ``rates`` (a node's probability = its cell's
    rate), or None (= its score). Probabilities are held non-increasing along a path. Tree r's
    chain is the root path ending at the node of depth <= ``max_lens[r]`` that maximises
    ``sum over the path of (probability - price)``; empty when no path is worth more than 0. Ties
    go to the node first in the tree (refdec builds best first); nodes with a negative token id
    (a corrupt index body) and their subtrees are never chosen. Outputs, chain r in row r, root
    first (each row at least max(max_lens) long): ``out_tokens`` int32 (R, L) token ids,
    ``out_probs`` float64 (R, L) probabilities, ``out_cells`` int64 (R, L) the nodes' table cells
    (0 without a table), ``out_lengths`` int64 (R,) chain lengths."""
    if price < 0.0:
        raise ValueError(f"price must be >= 0, got {price!r}")
    choose_chains(token_ids, parents, scores, source_ids, depths, offsets, max_lens, rates, price, 0.0, 0, out_tokens,
                  out_probs, out_cells, out_lengths)


def choose_chains(token_ids: np.ndarray, parents: np.ndarray, scores: np.ndarray, source_ids: np.ndarray,
                  depths: np.ndarray, offsets: np.ndarray, max_lens: np.ndarray, rates: np.ndarray | None,
                  fixed_price: float | None, token_cost: float, num_rows: int, out_tokens: np.ndarray,
                  out_probs: np.ndarray, out_cells: np.ndarray, out_lengths: np.ndarray) -> float:
    """A step's chains in one call: :func:`walk_trees` at ``fixed_price`` when given; else at
    no cost, then :func:`token_price` of those candidates (``num_rows`` rows verified, the
    step's ``token_cost``), then again at that price. Each node's probability is computed once
    for both walks. Arguments and outputs as :func:`walk_trees`; returns the price the chains
    were chosen at."""
    rates = _NO_RATES if rates is None else rates
    choose = _choose_impl or _compiled_choose()
    return float(choose(token_ids, parents, scores, source_ids, depths, offsets, max_lens, rates, _SCORE_EDGES,
                        _DEPTH_EDGES, -1.0 if fixed_price is None else float(fixed_price), float(token_cost),
                        int(num_rows), out_tokens, out_probs, out_cells, out_lengths))


def best_chain(token_ids: np.ndarray, parents: np.ndarray, scores: np.ndarray, depths: np.ndarray, max_len: int,
               draft_cost: float = 0.0, out: np.ndarray | None = None) -> np.ndarray:
    """The chain (int32 token ids, root first) of one draft tree scored by ``scores`` alone
    (:func:`walk_trees` of one tree, no table, price ``draft_cost``). ``token_ids`` int32 (n,),
    ``parents`` int32 (n,), ``scores`` float32 (n,) (estimated probability that the path to the
    node is accepted), ``depths`` int32 (n,), as in :class:`refdec.drafting.tree.DraftTree`. ``out``
    (int32, length >= max_len) is reused when given; the result is a view of it."""
    if out is None:
        out = np.empty(max(max_len, 1), dtype=np.int32)
    n = token_ids.shape[0]
    if n == 0 or max_len <= 0:
        return out[:0]
    width = max(max_len, 1)
    tokens = np.empty((1, width), np.int32)
    lengths = np.zeros(1, np.int64)
    walk_trees(token_ids, parents, scores, np.zeros(n, np.int32), depths, np.array([0, n], np.int64),
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
    are verified too). The arithmetic is :func:`choose_chains`'s, run as Python."""
    return float(_price_of(probs, lengths, num_rows, token_cost))
