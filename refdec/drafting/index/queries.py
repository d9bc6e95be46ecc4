"""The four queries every token index answers (refdec.drafting.index's docstring states them)."""

from __future__ import annotations

import numpy as np

from refdec.tokens import as_token_ids, check_int

__all__ = ["AutomatonQueries"]


class AutomatonQueries:
    """The four queries over ``self._view()`` (an ``_C.AutomatonView``): a base of the indexes."""

    def _view(self):  # pragma: no cover - overridden
        raise NotImplementedError

    def match_length(self, tokens) -> int:
        """Length of the longest suffix of ``tokens`` that occurs in the index."""
        return int(self._view().match_length(as_token_ids(tokens)))

    def count(self, tokens) -> int:
        """Occurrences of ``tokens`` inside one document; ``count([]) == len(self)``."""
        return int(self._view().count(as_token_ids(tokens)))

    def next_tokens(self, tokens, k: int) -> list[tuple[int, int]]:
        """Up to ``k`` (token, count) pairs following ``tokens``; most frequent first, ties by smaller token."""
        return [(int(t), int(c)) for t, c in self._view().next_tokens(as_token_ids(tokens), check_int("k", k, 0))]

    def continuation(self, tokens, length: int) -> np.ndarray:
        """int32 array of shape (<= length,): tokens that follow one occurrence of ``tokens``."""
        return self._view().continuation(as_token_ids(tokens), check_int("length", length, 0))

