"""The live context index: one request's prompt and accepted tokens, one growing document."""

from __future__ import annotations

import numpy as np

from refdec import _C
from refdec.drafting.index.queries import AutomatonQueries
from refdec.tokens import as_token_ids, is_int

__all__ = ["ContextIndex"]


class ContextIndex(AutomatonQueries):
    """The live context of one request: one document that grows by
    :meth:`extend` in O(1) amortised per token. Not thread-safe."""

    def __init__(self, tokens=None) -> None:
        self._sam = _C.SuffixAutomaton()
        self._sam.start_document()
        if tokens is not None:
            self._sam.extend_many(as_token_ids(tokens))

    def _view(self):
        return self._sam

    @property
    def automaton(self):
        """The live automaton over the context (``refdec._C.SuffixAutomaton``, an
        ``AutomatonView``); it grows with :meth:`extend` (and a Proposer's ``accept``)."""
        return self._sam

    def extend(self, tokens) -> None:
        """Appends tokens (an int, or a sequence / int array of token ids)."""
        if is_int(tokens):
            tokens = [tokens]
        self._sam.extend_many(as_token_ids(tokens))

    def __len__(self) -> int:
        return int(self._sam.num_tokens)

    def tokens(self) -> np.ndarray:
        """int32 array: the whole context."""
        return self._sam.tokens()

    def match_state(self) -> tuple[int, int]:
        """(state, length): the longest suffix of the context that occurred
        earlier with a continuation (``link(last)`` of the automaton)."""
        state = int(self._sam.match_state())
        return state, int(self._sam.length(state))

    @property
    def current_match_length(self) -> int:
        """Length of that suffix (0: the last token never occurred before)."""
        return self.match_state()[1]

    def __repr__(self) -> str:
        return f"ContextIndex({len(self)} tokens, current_match_length={self.current_match_length})"

