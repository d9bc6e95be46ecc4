"""Stop conditions inside an accepted run: eos ids and stop strings."""

from __future__ import annotations

import os

__all__ = ["StopChecker"]


class StopChecker:
    """Finds the first token of an accepted run at which generation must stop.

    eos: the eos token itself is emitted (as model.generate does). Stop strings:
    the run stops at the token that completes a stop string, with the same rule
    as transformers' StopStringCriteria (the occurrence must overlap the final
    token's text); that token is emitted, nothing after it.
    """

    def __init__(self, eos: set[int], stop_strings: list[str], tokenizer) -> None:
        self.eos = eos
        self.stop_strings = stop_strings
        self.tokenizer = tokenizer
        # enough tokens to hold any stop string: a token decodes to >= 1 character, or to >= 1 byte
        # of one (byte-fallback tokens), and a character is at most 4 UTF-8 bytes
        self.window = 4 * max((len(s) for s in stop_strings), default=0) + 2

    def _completes_stop_string(self, seq: list[int]) -> bool:
        decode = self.tokenizer.decode
        start = max(0, len(seq) - self.window)
        text = decode(seq[start:], skip_special_tokens=False)
        # A window that starts inside a character decodes to "\ufffd" there (SentencePiece's byte
        # fallback turns a whole invalid run of byte tokens into them): start up to 3 tokens earlier.
        for _ in range(3):
            if start == 0 or not text.startswith("\ufffd"):
                break
            start -= 1
            text = decode(seq[start:], skip_special_tokens=False)
        tail = seq[start:]
        # Occurrences that end inside the final token's text: past the text the tail had without it.
        # Decoding need not be concatenative: a token completing a UTF-8 character turns the
        # "\ufffd" before it into that character (byte-level tokenizers), or a whole run of byte
        # tokens (byte fallback). So "without it" is the longest text of the tail's first k tokens,
        # k < len(tail), that is a prefix of the text (the bytes of the character the final token
        # completes belong to its text); failing that, the common prefix with the text.
        unchanged, without_last = None, ""
        for k in range(len(tail) - 1, max(0, len(tail) - 5), -1):
            before = decode(tail[:k], skip_special_tokens=False)
            if k == len(tail) - 1:
                without_last = before
            if text.startswith(before):
                unchanged = len(before)
                break
        if unchanged is None:
            unchanged = len(os.path.commonprefix([without_last, text]))
        for s in self.stop_strings:
            start = max(0, unchanged - len(s) + 1)
            if s in text[start:]:
                return True
        return False

    def cut(self, seq: list[int], n_new: int) -> tuple[int, str]:
        """``seq`` ends with the ``n_new`` tokens of this run; return (tokens to keep, reason or '')."""
        first = len(seq) - n_new
        for i in range(first, len(seq)):
            if seq[i] in self.eos:
                return i - first + 1, "eos"
            if self.stop_strings and self._completes_stop_string(seq[: i + 1]):
                return i - first + 1, "stop_string"
        return n_new, ""
