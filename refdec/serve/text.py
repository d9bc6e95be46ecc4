"""New tokens to the text a client sees: stop strings trimmed, never streamed in part.

The engine stops a request at the token that completes a stop string (refdec.engine.stops);
that token's text, and the eos token, are not the client's. :class:`TextStream` turns the
request's new tokens into text deltas such that the concatenated deltas are exactly the final
text: everything before the first stop string, special tokens dropped. A delta never ends with
the beginning of a stop string (it is held back until the text shows it is not one) or with an
incomplete UTF-8 character.
"""

from __future__ import annotations

__all__ = ["TextStream"]

REPLACEMENT = "\ufffd"  # what a decoder shows for the bytes of a character not complete yet


class TextStream:
    """The text of one request's new tokens, as deltas. ``tokenizer.decode(ids,
    skip_special_tokens=True)`` gives text; ``skip_ids``: token ids never shown (the eos ids);
    ``stop_strings``: non-empty strings."""

    def __init__(self, tokenizer, stop_strings: list[str], skip_ids: set[int]) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = list(stop_strings)
        self.skip_ids = set(skip_ids)
        self.ids: list[int] = []
        self.sent = ""  # the text handed out so far
        self.stopped = False  # a stop string was seen: nothing more is shown

    def push(self, tokens: list[int]) -> str:
        """The text that ``tokens`` (the next new token ids) make safe to show."""
        if self.stopped:
            return ""
        self.ids.extend(int(t) for t in tokens if int(t) not in self.skip_ids)
        return self._delta(final=False)

    def finish(self) -> str:
        """The rest of the text, once the request is done (a character left incomplete is shown as
        the decoder shows it)."""
        return "" if self.stopped else self._delta(final=True)

    @property
    def text(self) -> str:
        """Everything shown so far (the whole text after :meth:`finish`)."""
        return self.sent

    def _delta(self, final: bool) -> str:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in self.stop_strings) if i >= 0), default=-1)
        if cut >= 0:
            text, self.stopped = text[:cut], True
        elif not final:
            text = text[:len(text) - self._held_back(text)]
        if not text.startswith(self.sent):  # a decoder that rewrote shown text: show only what follows
            return ""
        delta, self.sent = text[len(self.sent):], text
        return delta

    def _held_back(self, text: str) -> int:
        """Characters at the end of ``text`` not to show yet: the longest end that begins a stop
        string, or an incomplete character."""
        held = 0
        for stop in self.stop_strings:
            for k in range(min(len(stop) - 1, len(text)), held, -1):
                if text.endswith(stop[:k]):
                    held = k
                    break
        incomplete = len(text) - len(text.rstrip(REPLACEMENT))
        return max(held, incomplete)
