"""Draft-size policy: how many tree nodes to ask the proposer for at each step.

A policy is a small object with ``choose(match_lengths) -> int`` (called before
each proposal with the proposer's ``last_match_lengths()``) and
``observe(proposed, accepted)`` (called after each verification). The loop asks
for no draft when ``choose`` returns 0. ``FixedBudget`` serves an integer
``max_draft_tokens``; ``MatchLengthBudget`` is the interim ``"auto"`` policy,
to be replaced by one calibrated on the model's measured cost curve.
"""

from __future__ import annotations


class FixedBudget:
    """Always the same number of nodes (0 = plain decoding)."""

    def __init__(self, max_nodes: int) -> None:
        self.max_nodes = int(max_nodes)

    def choose(self, match_lengths: dict[str, int]) -> int:
        return self.max_nodes

    def observe(self, proposed: int, accepted: int) -> None:
        pass

    def __repr__(self) -> str:
        return f"FixedBudget({self.max_nodes})"


class MatchLengthBudget:
    """Nodes grow with the longest current suffix match; none when nothing matches.

    ``choose`` returns ``0`` if no source matches, else
    ``clamp(per_match_token * longest_match * gain, min_nodes, max_nodes)`` where
    ``gain`` (in [0.25, 2]) tracks the recent acceptance rate: it rises when most
    of a draft's depth is accepted and falls when drafts are mostly rejected.
    """

    def __init__(self, min_nodes: int = 4, max_nodes: int = 64, per_match_token: float = 4.0) -> None:
        self.min_nodes = int(min_nodes)
        self.max_nodes = int(max_nodes)
        self.per_match_token = float(per_match_token)
        self.gain = 1.0

    def choose(self, match_lengths: dict[str, int]) -> int:
        longest = max(match_lengths.values(), default=0)
        if longest <= 0:
            return 0
        want = int(round(self.per_match_token * longest * self.gain))
        return max(self.min_nodes, min(self.max_nodes, want))

    def observe(self, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        # An exponential moving target: accepting >= 1/4 of the nodes (a long chain) grows the draft.
        rate = accepted / proposed
        factor = 1.25 if rate >= 0.25 else (0.8 if accepted == 0 else 1.0)
        self.gain = min(2.0, max(0.25, self.gain * factor))

    def __repr__(self) -> str:
        return f"MatchLengthBudget(min={self.min_nodes}, max={self.max_nodes}, gain={self.gain:.2f})"


def make_budget(max_draft_tokens):
    """``int >= 0`` → FixedBudget; ``"auto"`` → MatchLengthBudget; an object with choose/observe as is."""
    if isinstance(max_draft_tokens, str):
        if max_draft_tokens != "auto":
            raise ValueError(f"max_draft_tokens must be an int >= 0 or 'auto', got {max_draft_tokens!r}")
        return MatchLengthBudget()
    if hasattr(max_draft_tokens, "choose") and hasattr(max_draft_tokens, "observe"):
        return max_draft_tokens
    if isinstance(max_draft_tokens, bool) or not isinstance(max_draft_tokens, int):
        raise ValueError(f"max_draft_tokens must be an int >= 0 or 'auto', got {max_draft_tokens!r}")
    if max_draft_tokens < 0:
        raise ValueError(f"max_draft_tokens must be >= 0, got {max_draft_tokens}")
    return FixedBudget(max_draft_tokens)
