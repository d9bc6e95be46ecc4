"""The cost curve refit online from the steps the engine times.

A calibration (refdec.transformers.calibration, refdec.llama_cpp.calibration) measures the curve
once, in a few seconds; the machine it runs on may be busy then or later, the curve may come
from another machine (the default CPU curve), or a size may have paid a warm-up. Every
verification step is itself a measurement of the curve at its size, so a :class:`LearntCost`
keeps, per size bucket, the last ``window`` steps' ratios of measured to predicted seconds (in log
space) and prices each size by the calibrated curve times its bucket's median ratio, the
calibration counting as ``prior_weight`` ratios of 1 in that median (with few steps the prior
dominates; after ``prior_weight + 1`` agreeing steps the bucket follows them, and the window's
median ignores a stray slow step). Memory is fixed: ``len(BUCKETS) * window`` floats.

Sizes between observed buckets take the ratio interpolated between them (over ``log1p`` of the
size), sizes past them the nearest one's; below the smallest observed bucket a size costs at most
what that bucket's size costs. More rows never cost less: the corrected curve is then made
non-decreasing (a weighted isotonic fit, each point weighing ``prior_weight`` plus its bucket's
steps), so a calibration's warm-up-inflated size or a curve measured in a burst of load does not
make a larger tree look cheaper than a smaller one.

One LearntCost describes one model on one machine, so the budgets of all requests share it
(refdec.engine.decoder makes one per decoder; a copy of a budget, one per batch row, keeps the
same object: ``copy.deepcopy`` returns it).
"""

from __future__ import annotations

import math

import numpy as np

from refdec.sizing.cost_curve import CALIBRATED_SIZES, CostCurve, curve_table
from refdec.tokens import check_int

__all__ = ["BUCKETS", "LearntCost", "non_decreasing"]

# The size buckets: the calibrated sizes, then sizes a batch's forward reaches (rows * (1 + n) - 1).
# A step is counted in the bucket nearest its size in log1p; past the last, in the last.
BUCKETS = tuple(CALIBRATED_SIZES) + (96, 128, 192, 256, 384, 512)


class LearntCost:
    """The calibrated curve ``prior`` corrected by the steps' measured seconds (module docstring).

    ``window``: the steps kept per bucket (the latest; older ones are overwritten);
    ``prior_weight``: how many ratios of 1 the calibration counts as in each bucket's median.
    ``version`` grows with every observation (a budget rebuilds its tables when it changes).
    """

    def __init__(self, prior: CostCurve, *, window: int = 16, prior_weight: int = 3) -> None:
        if not isinstance(prior, CostCurve):
            raise ValueError(f"prior must be a refdec.sizing.cost_curve.CostCurve, got {type(prior).__name__}")
        self.prior = prior
        self.window = check_int("window", window, 1)
        self.prior_weight = check_int("prior_weight", prior_weight, 0)
        self._buckets = np.asarray(BUCKETS, dtype=np.int64)
        self._log_buckets = np.log1p(self._buckets.astype(np.float64))
        sizes = np.log1p(np.arange(BUCKETS[-1] + 1, dtype=np.float64))  # each size's bucket, looked up
        self._bucket_of = np.abs(sizes[:, None] - self._log_buckets[None, :]).argmin(axis=1).tolist()
        self._log_ratios = np.zeros((len(BUCKETS), self.window))  # float64 [buckets, window], a ring per bucket
        self._counts = np.zeros(len(BUCKETS), dtype=np.int64)  # steps observed per bucket (ever)
        self._medians = np.full(len(BUCKETS), np.nan)  # float64 [buckets]: log_ratios(), kept up to date
        self._nodes = np.asarray(sorted(set(BUCKETS) | set(prior.nodes)), dtype=np.int64)
        self._log_nodes = np.log1p(self._nodes.astype(np.float64))
        self._node_buckets = np.asarray([self.bucket(int(n)) for n in self._nodes], dtype=np.int64)
        self._node_is_bucket = np.isin(self._nodes, self._buckets)  # bool [len(nodes)]: a bucket's own size
        self._prior_table = prior.table(int(self._nodes[-1]))  # float64 [largest node + 1]
        self._prior_at_nodes = self._prior_table[self._nodes]
        self.version = 0
        self._seconds = self._prior_at_nodes  # float64 [len(nodes)]: the corrected curve at its nodes
        self._seconds_version = 0
        self._curve = prior
        self._curve_version = 0

    def __deepcopy__(self, memo) -> "LearntCost":
        return self  # shared by the copies of a budget: it describes the machine, not a request

    def bucket(self, nodes: int) -> int:
        """The index in BUCKETS of the bucket a step of ``nodes`` nodes counts in."""
        return self._bucket_of[min(max(0, nodes), BUCKETS[-1])]

    def predicted(self, nodes: int) -> float:
        """The calibrated curve's seconds at ``nodes`` nodes (its table, no head)."""
        if nodes < len(self._prior_table):
            return float(self._prior_table[max(0, nodes)])
        return float(self.prior.table(nodes)[nodes])

    def observe(self, nodes: int, seconds: float) -> None:
        """One step's measured seconds for a forward of ``nodes`` nodes, what the curve's table
        prices (the LM head as the curve prices it taken off); not finite or <= 0 is ignored."""
        if not math.isfinite(seconds) or seconds <= 0:
            return
        nodes = int(nodes)
        j = self.bucket(nodes)
        count = int(self._counts[j])
        self._log_ratios[j, count % self.window] = math.log(seconds / self.predicted(nodes))
        self._counts[j] = count + 1
        kept = min(count + 1, self.window)
        values = sorted(self._log_ratios[j, :kept].tolist() + [0.0] * self.prior_weight)
        middle = len(values) // 2
        self._medians[j] = values[middle] if len(values) % 2 else 0.5 * (values[middle - 1] + values[middle])
        self.version += 1

    def observations(self) -> np.ndarray:
        """int64 [len(BUCKETS)]: the steps each bucket's estimate holds (at most ``window``)."""
        return np.minimum(self._counts, self.window)

    def log_ratios(self) -> np.ndarray:
        """float64 [len(BUCKETS)]: each bucket's log(measured / calibrated) estimate, the median of
        its steps and ``prior_weight`` zeros; NaN for a bucket without steps."""
        return self._medians.copy()

    def _corrected(self) -> np.ndarray:
        """float64 [len(nodes)]: the corrected curve's seconds at its nodes (module docstring)."""
        if self._seconds_version != self.version:
            seen = np.flatnonzero(~np.isnan(self._medians))
            seconds = self._prior_at_nodes * np.exp(np.interp(self._log_nodes, self._log_buckets[seen],
                                                              self._medians[seen]))
            smallest = self._buckets[seen[0]]
            below = self._nodes < smallest
            seconds[below] = np.minimum(seconds[below], seconds[np.searchsorted(self._nodes, smallest)])
            weights = self.prior_weight + self.observations()[self._node_buckets] * self._node_is_bucket
            self._seconds, self._seconds_version = non_decreasing(seconds, weights), self.version
        return self._seconds

    def table(self, max_nodes: int) -> np.ndarray:
        """float64 [max_nodes + 1]: the corrected curve's table (as :meth:`CostCurve.table`), without
        building a CostCurve."""
        if self.version == 0:
            return self.prior.table(max_nodes)
        return curve_table(self._nodes.astype(np.float64), self._corrected(), max_nodes)

    def curve(self) -> CostCurve:
        """The corrected curve (the prior itself before any step), with the prior's head terms."""
        if self._curve_version != self.version:
            prior = self.prior
            self._curve = CostCurve(tuple(self._nodes.tolist()), tuple(self._corrected().tolist()), prior.meta,
                                    prior.head_chunk_seconds, prior.head_chunk_rows)
            self._curve_version = self.version
        return self._curve

    def __repr__(self) -> str:
        return f"LearntCost(steps={int(self._counts.sum())}, window={self.window}, prior_weight={self.prior_weight})"


def non_decreasing(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """float64 [n]: the non-decreasing sequence nearest ``values`` (float64 [n]) in weighted least
    squares (``weights`` float64 [n], > 0): pool adjacent violators, each pooled run its weighted
    mean."""
    means: list[float] = []
    totals: list[float] = []
    lengths: list[int] = []
    for value, weight in zip(np.asarray(values, dtype=np.float64).tolist(), np.asarray(weights, dtype=np.float64).tolist()):
        means.append(value)
        totals.append(weight)
        lengths.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            weight = totals[-2] + totals[-1]
            means[-2] = (means[-2] * totals[-2] + means[-1] * totals[-1]) / weight
            totals[-2] = weight
            lengths[-2] += lengths[-1]
            del means[-1], totals[-1], lengths[-1]
    return np.repeat(np.asarray(means), lengths)
