"""The verification cost curve of one model on one machine: seconds per forward against
draft-tree size (measured by refdec.transformers.calibration and refdec.llama_cpp.calibration,
refit online by refdec.sizing.cost_model, consumed by refdec.sizing.budget).

Both calibrations measure in the same plan (:func:`calibration_order`): a warm-up round whose
times are dropped (the first forwards of a size pay for allocations and cold caches), then
``repeats`` rounds, each over every size, alternately ascending and descending, so that load that
comes and goes on a shared machine spreads over all sizes instead of landing on some. A size's
seconds are the median of its rounds; :func:`repeats_disagree` says why a curve whose rounds
disagree must not be cached (the process uses it, and refdec.sizing.cost_model corrects it as it runs).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from refdec.drafting.tree import MAX_NODES
from refdec.tokens import check_int

__all__ = ["CALIBRATED_SIZES", "CostCurve", "DEFAULT_CPU_CURVE", "calibration_order", "curve_table", "flat_curve",
           "median_seconds",
           "repeats_disagree", "warn_not_cached"]

# 2: head_chunk_seconds, head_chunk_rows; 3: measured after a warm-up round and cached only when the
# rounds agree (a format-2 file may hold a curve measured under load: measured again)
_FORMAT = 3


def curve_table(xs: np.ndarray, ys: np.ndarray, max_nodes: int) -> np.ndarray:
    """float64 [max_nodes + 1]: the curve through the points (``xs`` float64 [k], increasing; ``ys``
    float64 [k]) at 0 .. max_nodes, linearly interpolated, and past the last point extrapolated along
    the last segment (never decreasing)."""
    n = np.arange(max_nodes + 1, dtype=np.float64)
    out = np.interp(n, xs, ys)
    if len(xs) >= 2 and max_nodes > xs[-1]:
        slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
        tail = n > xs[-1]
        out[tail] = ys[-1] + slope * (n[tail] - xs[-1])
    return out


@dataclass(frozen=True)
class CostCurve:
    """Forward cost (seconds) at draft-tree sizes ``nodes``, linearly interpolated between
    them and extrapolated linearly past the last point.

    ``nodes``: increasing ints >= 0 (draft nodes; a forward feeds ``1 + n`` rows).
    ``seconds``: the forward time at each size (median over repeats); with
    ``head_chunk_seconds`` set, the backbone's time only (no LM head).
    ``head_chunk_seconds``: None when ``seconds`` include every row's head, else the
    time of the head on one chunk of ``head_chunk_rows`` rows (lazy head).
    """

    nodes: tuple
    seconds: tuple
    meta: dict | None = field(default=None, compare=False)
    head_chunk_seconds: float | None = None
    head_chunk_rows: int = 4

    def __post_init__(self) -> None:
        nodes = tuple(int(n) for n in self.nodes)
        seconds = tuple(float(s) for s in self.seconds)
        if len(nodes) != len(seconds) or not nodes:
            raise ValueError(f"CostCurve needs as many nodes as seconds (>= 1), got {len(nodes)} and {len(seconds)}")
        if any(b <= a for a, b in zip(nodes, nodes[1:])) or nodes[0] < 0:
            raise ValueError(f"CostCurve nodes must be increasing ints >= 0, got {nodes}")
        if any(not np.isfinite(s) or s <= 0 for s in seconds):
            raise ValueError(f"CostCurve seconds must be finite and > 0, got {seconds}")
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "seconds", seconds)
        if self.head_chunk_seconds is not None:
            head = float(self.head_chunk_seconds)
            if not np.isfinite(head) or head < 0:
                raise ValueError(f"CostCurve head_chunk_seconds must be finite and >= 0, got {self.head_chunk_seconds}")
            object.__setattr__(self, "head_chunk_seconds", head)
        object.__setattr__(self, "head_chunk_rows", check_int("CostCurve head_chunk_rows", self.head_chunk_rows, 1))

    @property
    def lazy_head(self) -> bool:
        return self.head_chunk_seconds is not None

    def head_seconds(self, expected_accepted):
        """Head cost of a step that accepts ``expected_accepted`` nodes (float or float64 array):
        0 for a curve whose ``seconds`` include the head; else the chunks the walk visits,
        ``max(1, (k + 2.5) / rows)`` (k + 1 rows on the path plus, on average, half a chunk)."""
        if self.head_chunk_seconds is None:
            return np.zeros_like(np.asarray(expected_accepted, dtype=np.float64))
        chunks = np.maximum(1.0, (np.asarray(expected_accepted, dtype=np.float64) + 2.5) / self.head_chunk_rows)
        return self.head_chunk_seconds * chunks

    def table(self, max_nodes: int) -> np.ndarray:
        """float64 array of shape (max_nodes + 1,): the cost of n = 0 .. max_nodes draft nodes."""
        return curve_table(np.asarray(self.nodes, dtype=np.float64), np.asarray(self.seconds, dtype=np.float64),
                           max_nodes)

    def __call__(self, n: int, expected_accepted: float = 0.0) -> float:
        """Seconds for a step verifying ``n`` nodes that accepts ``expected_accepted`` of them."""
        return float(self.table(int(n))[int(n)] + self.head_seconds(expected_accepted))

    def relative(self) -> dict:
        """{n: cost(n) / cost(0)} at the measured sizes (cost(0) interpolated if not measured), a
        lazy head counted for a step that accepts nothing."""
        base = self(0)
        head = float(self.head_seconds(0.0))
        return {n: (s + head) / base for n, s in zip(self.nodes, self.seconds)}

    def to_json(self) -> dict:
        return {"format": _FORMAT, "nodes": list(self.nodes), "seconds": list(self.seconds),
                "head_chunk_seconds": self.head_chunk_seconds, "head_chunk_rows": self.head_chunk_rows,
                "meta": self.meta or {}}

    @classmethod
    def from_json(cls, data: dict) -> "CostCurve":
        if data.get("format") != _FORMAT:
            raise ValueError(f"calibration format {data.get('format')!r}, expected {_FORMAT}")
        return cls(tuple(data["nodes"]), tuple(data["seconds"]), data.get("meta"),
                   data.get("head_chunk_seconds"), int(data.get("head_chunk_rows", 4)))


# The tree sizes a calibration measures (both backends'; sizes between them are interpolated).
CALIBRATED_SIZES = (0, 1, 2, 4, 8, 16, 24, 32, 48, MAX_NODES)


# A size's repeats disagree when they spread (max - min) over more than REPEAT_TOLERANCE of their
# median plus REPEAT_SLACK_SECONDS; a curve is not cached when more than DISAGREEING_SIZES of its
# sizes disagree (one stray spike is noise the median absorbs; several sizes at once is load).
REPEAT_TOLERANCE = 0.25
REPEAT_SLACK_SECONDS = 1e-3
DISAGREEING_SIZES = 0.25


def calibration_order(nodes, repeats: int, warmup: int = 1) -> list[tuple[int, int]]:
    """(round, size) pairs in the order a calibration measures them: rounds ``0 .. warmup - 1``
    warm up (their times are dropped), then ``repeats`` rounds; every round measures each of
    ``nodes`` once, ascending in even rounds and descending in odd ones."""
    check_int("repeats", repeats, 1)
    check_int("warmup", warmup, 0)
    ascending = tuple(sorted(nodes))
    return [(rnd, n) for rnd in range(warmup + repeats) for n in (ascending if rnd % 2 == 0 else ascending[::-1])]


def median_seconds(samples: dict) -> tuple:
    """The median of each size's repeats: ``samples`` maps size -> list of seconds (>= 1 each),
    the result is in the order of ``samples``' keys."""
    return tuple(float(np.median(times)) for times in samples.values())


def repeats_disagree(samples: dict, *, tolerance: float = REPEAT_TOLERANCE, slack: float = REPEAT_SLACK_SECONDS,
                     most: float = DISAGREEING_SIZES) -> str | None:
    """Why a calibration's rounds disagree (a sentence naming the sizes), or None when they agree.

    ``samples``: size -> list of seconds, one per round. A size disagrees when its repeats
    spread over more than ``tolerance`` of their median plus ``slack`` seconds; the curve when
    more than ``most`` of its sizes do (with one round, never)."""
    bad = [(n, times) for n, times in samples.items()
           if len(times) > 1 and max(times) - min(times) > tolerance * float(np.median(times)) + slack]
    if len(bad) <= most * len(samples):
        return None
    shown = "; ".join(f"{n} nodes " + " / ".join(f"{1e3 * t:.1f}" for t in times) + " ms" for n, times in bad[:3])
    more = f"; {len(bad) - 3} more" if len(bad) > 3 else ""
    return (f"the repeats of {len(bad)} of {len(samples)} sizes differ by more than {100 * tolerance:.0f}% "
            f"({shown}{more})")


def warn_not_cached(disagreement: str) -> None:
    """Says on stderr (one line) that a measured curve is not cached and why (``disagreement``:
    :func:`repeats_disagree`'s sentence)."""
    print(f"refdec: warning: the measured cost curve is not cached: {disagreement}; the machine looks busy. "
          f"This process uses it and corrects it from the steps it times; it is measured again next time "
          f"(refdec calibrate --force, on a quiet machine)", file=sys.stderr, flush=True)


def flat_curve(seconds: float = 1.0) -> CostCurve:
    """A GPU-like curve: verifying any tree costs as much as one token."""
    return CostCurve((0, 1), (seconds, seconds))


# A CPU-like curve (DESIGN.md: Gemma 3 270M, 2 threads, 512 cached tokens) for models that are
# not worth calibrating (tiny test models) and when calibration is switched off.
DEFAULT_CPU_CURVE = CostCurve((0, 1, 16, 64, 128), (0.100, 0.105, 0.280, 0.500, 0.810))
