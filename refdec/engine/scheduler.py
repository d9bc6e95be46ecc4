"""Continuous batching: which waiting requests join the running batch, and when.

Requests wait in the caller's order. Whenever fewer than ``capacity`` rows decode,
the next ones join (as many as fit) before the next step: they are prefilled as a
group of their own and their cache rows appended to the running batch's
(refdec.transformers.batch.RunningBatch.join). Each row's positions, mask and sampling keys
are its own, so its output does not depend on which rows it shares a step with
(exactly so in float64; in lower precision, as for any batching, other matmul shapes
may flip a near-tie).
"""

from __future__ import annotations

from collections import deque

from refdec.engine.requests import Request

__all__ = ["Scheduler"]


class Scheduler:
    """``requests`` in caller order; at most ``capacity`` (an int >= 1) decode together."""

    def __init__(self, requests: list[Request], capacity: int) -> None:
        self.pending = deque(requests)
        self.capacity = int(capacity)

    def __bool__(self) -> bool:
        """Whether requests are still waiting (one finished while waiting, cancelled, is not)."""
        self._forget_finished()
        return bool(self.pending)

    def extend(self, requests) -> None:
        """Queues ``requests`` after the waiting ones (a running engine takes them as rows leave room)."""
        self.pending.extend(requests)

    def next_group(self, active_rows: int) -> list[Request]:
        """The requests that join now, while ``active_rows`` rows decode (may be none)."""
        self._forget_finished()
        room = min(self.capacity - active_rows, len(self.pending))
        return [self.pending.popleft() for _ in range(max(0, room))]

    def _forget_finished(self) -> None:
        if any(getattr(request, "done", False) for request in self.pending):
            self.pending = deque(request for request in self.pending if not getattr(request, "done", False))
