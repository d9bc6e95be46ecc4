"""Finished requests' KV entries kept for the next prompt that begins the same way.

A backend hands a finished row's cache entries to a :class:`PrefixCache` instead of freeing them
(llama.cpp: the row's sequence id, whose cells stay; transformers: the row's keys and values);
a new prompt then takes the longest prefix any kept entry shares with it and is prefilled from
there on. The same file edited again, a shared system prompt and a chat's earlier turns are
prefilled once per process, not once per request.

The cache is backend-neutral: an entry is the token ids its KV entries hold (positions
``0 .. len - 1``) and an opaque ``handle`` the backend reads them by. The backend evicts
(:meth:`PrefixCache.pop_oldest`) when it needs the room, and frees each evicted handle itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from refdec.tokens import check_int

__all__ = ["CachedPrefix", "PrefixCache", "common_prefix"]

Handle = TypeVar("Handle")


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (int arrays [n], [m])."""
    n = min(a.shape[0], b.shape[0])
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.shape[0] else n


@dataclass(eq=False)  # entries are compared by identity (their handles and tokens are arrays)
class CachedPrefix(Generic[Handle]):
    """One kept entry: ``tokens`` int64 [n], the tokens at positions ``0 .. n - 1`` of ``handle``'s
    KV entries; ``last_used``: the cache's clock when it was added or last reused; ``size``: what
    it holds, in the caller's unit (bytes), 0 when the caller does not count."""

    handle: Handle
    tokens: np.ndarray
    last_used: int
    size: int = 0


class PrefixCache(Generic[Handle]):
    """At most ``max_entries`` (an int >= 0; 0 keeps nothing) kept entries of at most ``max_size``
    in all (None: no bound), least recently used evicted first. ``whole``: an entry is reused only
    whole, by a prompt that begins with all its tokens (a hybrid model's entry holds a recurrent state
    after its last token, which cannot be cut back to a shorter prefix)."""

    def __init__(self, max_entries: int, max_size: int | None = None, *, whole: bool = False) -> None:
        max_entries = check_int("max_entries", max_entries, 0)
        if max_size is not None:
            max_size = check_int("max_size", max_size, 0)
        self.max_entries = max_entries
        self.max_size = max_size
        self.whole = bool(whole)
        self.entries: list[CachedPrefix[Handle]] = []
        self._clock = 0

    def __len__(self) -> int:
        return len(self.entries)

    def handles(self) -> list[Handle]:
        return [entry.handle for entry in self.entries]

    def longest(self, prompt: np.ndarray) -> tuple[CachedPrefix[Handle] | None, int]:
        """The entry sharing the longest prefix with ``prompt`` (int array [L]) and that length (None
        and 0 when none shares a token; with ``whole``, only an entry all of whose tokens begin
        ``prompt``). The entry counts as used now."""
        best, best_len = None, 0
        for entry in self.entries:
            n = common_prefix(entry.tokens, prompt)
            if self.whole and n < entry.tokens.shape[0]:
                continue
            if n > best_len:
                best, best_len = entry, n
        if best is not None:
            self._clock += 1
            best.last_used = self._clock
        return best, best_len

    @property
    def size(self) -> int:
        return sum(entry.size for entry in self.entries)

    def add(self, handle: Handle, tokens: np.ndarray, size: int = 0) -> list[Handle]:
        """Keeps ``handle`` (holding ``tokens``, int array [n]; ``size``: what it holds); returns the
        handles the caller must free now: ``handle`` itself when it holds nothing an entry does not
        (or it alone is over ``max_size``, or the cache keeps nothing), the entries whose tokens it
        extends, and the oldest beyond ``max_entries`` and ``max_size``."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if self.max_entries == 0 or tokens.shape[0] == 0 or (self.max_size is not None and size > self.max_size):
            return [handle]
        freed = []
        for entry in list(self.entries):
            n = common_prefix(entry.tokens, tokens)
            if n == tokens.shape[0] and (not self.whole or n == entry.tokens.shape[0]):  # an entry holds it already
                self._clock += 1
                entry.last_used = self._clock
                return freed + [handle]
            if n == entry.tokens.shape[0]:  # the new entry extends this one
                self.entries.remove(entry)
                freed.append(entry.handle)
        self._clock += 1
        self.entries.append(CachedPrefix(handle, tokens, self._clock, size))
        while len(self.entries) > self.max_entries or (self.max_size is not None and self.size > self.max_size):
            freed.append(self.pop_oldest())
        return freed

    def pop_oldest(self) -> Handle | None:
        """Removes the least recently used entry and returns its handle (None when empty)."""
        if not self.entries:
            return None
        oldest = min(self.entries, key=lambda entry: entry.last_used)
        self.entries.remove(oldest)
        return oldest.handle

    def clear(self) -> list[Handle]:
        """Removes every entry; returns their handles."""
        handles, self.entries = self.handles(), []
        return handles
