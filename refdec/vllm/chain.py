"""From refdec's draft tree to the one chain vLLM verifies: the path of highest expected accepted
length less a cost per drafted token (:func:`best_chain`), the cost set from the batch
(:func:`draft_cost`). The inner loop is compiled with numba on first use."""

from __future__ import annotations

import numpy as np

__all__ = ["best_chain", "draft_cost"]


def draft_cost(token_cost: float, num_requests: int, emitted_per_request: float, drafted_per_request: float) -> float:
    """The acceptance probability a drafted token needs to pay for its verification, this step.

    A step verifies B requests' last tokens and drafts and takes ``a + b * (B + drafted)`` time
    (a: the fixed part, weights and scheduling; b: one more token); it emits E tokens a request
    (accepted drafts + 1). One more drafted token, accepted with probability s, adds s tokens for
    b more time: it raises throughput when ``s / b > B * E / (a + b * B * (1 + D))``, i.e. when

        s > x * B * E / (1 + x * B * (1 + D)),    x = b / a = ``token_cost``,

    with D the tokens drafted a request. With the default x = 0.05, E = 15, D = 22: 0.35 for one
    request, 0.51 for eight; as the batch grows the bound tends to E / (1 + D), the batch's own
    yield per verified token: a loaded server drafts only what is likelier than its average to be
    accepted. Measured on this CPU (benchmarks/RESULTS.md section 6): at eight clients this beats
    a fixed 0.1 by 9-22%; at one client a fixed 0.1 (``REFDEC_VLLM_DRAFT_COST=0.1``) is ~6% faster
    (x = 0.01, ~0.1 for one request, was slower at both)."""
    b = num_requests * token_cost
    return b * emitted_per_request / (1.0 + b * (1.0 + drafted_per_request))


def _best_chain_walk(token_ids, parents, scores, max_len, draft_cost, out):  # pragma: no cover - numba compiles it
    """The walk of :func:`best_chain`: one pass in topological order keeps each node's path value
    and depth, then the best node's path is written to ``out`` root first; returns its length.
    Compiled by numba for numpy arrays; run as Python on lists where numba is missing."""
    n = len(token_ids)
    value = np.empty(n, np.float64)
    depth = np.empty(n, np.int32)
    best = -1
    best_value = 0.0
    for i in range(n):
        p = parents[i]
        v = 0.0
        d = 0
        if p >= 0:
            v = value[p]
            d = depth[p]
        if token_ids[i] >= 0:
            v += scores[i] - draft_cost
        else:
            v = -np.inf
        d += 1
        value[i] = v
        depth[i] = d
        if d <= max_len and v > best_value:
            best = i
            best_value = v
    if best < 0:
        return 0
    length = depth[best]
    i = best
    for j in range(length - 1, -1, -1):
        out[j] = token_ids[i]
        i = parents[i]
    return length


def _best_chain_py(token_ids, parents, scores, max_len: int, draft_cost: float, out: np.ndarray) -> int:
    """:func:`_best_chain_walk` in Python, on lists (indexing a list is faster than a numpy array)."""
    return int(_best_chain_walk(token_ids.tolist(), parents.tolist(), scores.tolist(), max_len, draft_cost, out))


_best_chain_impl = None


def _chain_impl():
    """numba's compiled walk where numba is installed (vLLM depends on it), else the Python one.
    Imported on first use, never at import: vLLM's CPU worker scans every loaded module's
    attributes while it starts, and llvmlite's objects break that scan (vLLM 0.32)."""
    global _best_chain_impl
    if _best_chain_impl is None:
        try:
            from numba import njit
        except ImportError:  # pragma: no cover - depends on the environment
            _best_chain_impl = _best_chain_py
        else:
            _best_chain_impl = njit(cache=False, nogil=True)(_best_chain_walk)
    return _best_chain_impl


def best_chain(token_ids: np.ndarray, parents: np.ndarray, scores: np.ndarray, max_len: int,
               draft_cost: float = 0.0, out: np.ndarray | None = None) -> np.ndarray:
    """The chain vLLM verifies, from a refdec draft tree.

    ``token_ids`` int32 (n,), ``parents`` int32 (n,) (-1 = child of the root, topological order),
    ``scores`` float32 (n,) (estimated probability that the path to the node is accepted).
    Returns the tokens (int32, root first) of the root path ending at the node of depth
    <= ``max_len`` that maximises ``sum over the path of (score - draft_cost)``: with no cost,
    the path of highest expected accepted length (the expected number of accepted tokens of a
    chain is the sum of its nodes' scores); with a cost, the chain stops where a further token's
    expected gain falls below its cost, and is empty when no token pays. Ties go to the node
    first in the tree (refdec builds best first). Nodes with a negative token id (a corrupt
    index body) and their subtrees are never chosen. ``out`` (int32, length >= max_len) is
    reused when given; the result is a view of it."""
    n = token_ids.shape[0]
    if out is None:
        out = np.empty(max(max_len, 1), dtype=np.int32)
    if n == 0 or max_len <= 0:
        return out[:0]
    length = (_best_chain_impl or _chain_impl())(token_ids, parents, scores, int(max_len), float(draft_cost), out)
    return out[:length]


# ---------------------------------------------------------------------------------------------
# Corpus index
