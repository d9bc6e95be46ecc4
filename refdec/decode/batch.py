"""The running batch: the requests decoding together and where their KV entries are.

The KV cache is one ``[B, H, S, D]`` tensor per layer (``S`` = cache slots, shared
by all rows). Row ``b`` keeps its entries contiguously in slots ``[0, lengths[b])``
(with its prompt's left-padding holes at the front); slots ``[lengths[b], S)`` are
*holes* (stale entries), masked out. A step appends the ``T`` query rows at slots
``[S, S + T)`` for every row; afterwards the root and the accepted nodes of row ``b``
are gathered (one advanced-index copy per layer for all rows) into slots
``lengths[b] ..``, ``lengths[b] += 1 + k_b``, and the cache is cut to
``S = max_b lengths[b]`` (:meth:`RunningBatch.keep_accepted`). The alternative,
*masked holes* (leave rejected nodes in place and mask them forever), lets the cache
grow by ``T`` slots per step for every row — with 64-node trees that is ~65 slots per
step of which a handful are real. With compaction a row's holes are bounded by how
far it lags the longest row, and attention cost stays ~``B * max_len``.

Finished rows leave the batch (:meth:`RunningBatch.drop_finished`): their cache rows
are dropped, so they stop costing compute, and the left-padding slots every remaining
row has are cut as well. A joining group's cache rows are appended
(:meth:`RunningBatch.join`): both are padded at the end of the slot dim to the longer
one, so a row's entries stay in ``[0, length)`` and the holes after them are where its
next entries go, as for a row that lags the longest.
"""

from __future__ import annotations

import numpy as np
import torch

from refdec.decode.cache import append_rows, gather_slots, select_rows
from refdec.decode.requests import Request
from refdec.decode.transfer import to_device

__all__ = ["RunningBatch"]


class RunningBatch:
    """``requests``: the active rows, in batch order; ``cache``: their KV cache (None while
    empty), on ``device``; ``lengths`` int64 [B]: each row's valid slot count (left holes included);
    ``valid`` bool [B, S]: which slots hold the row's tokens; ``key_pos`` int64 [B, S]: the
    absolute position of each slot (-1 for a hole)."""

    def __init__(self, device, requests: list[Request], cache, lengths: np.ndarray, valid: np.ndarray,
                 key_pos: np.ndarray) -> None:
        self.device = device
        self.requests = requests
        self.cache = cache
        self.lengths = lengths
        self.valid = valid
        self.key_pos = key_pos

    @classmethod
    def empty(cls, device) -> "RunningBatch":
        return cls(device, [], None, np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=bool),
                   np.zeros((0, 0), dtype=np.int64))

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def slots(self) -> int:
        """``S``: the cache length."""
        return int(self.lengths.max())

    def join(self, other: "RunningBatch") -> None:
        """Appends the rows of ``other`` (a group prefilled on its own) after this batch's."""
        if not len(other):
            return
        if not len(self):
            self.requests, self.cache = other.requests, other.cache
            self.lengths, self.valid, self.key_pos = other.lengths, other.valid, other.key_pos
            return
        n = append_rows(self.cache, other.cache)

        def padded(a: np.ndarray, fill) -> np.ndarray:
            return np.pad(a, ((0, 0), (0, n - a.shape[1])), constant_values=fill)

        self.requests = self.requests + other.requests
        self.lengths = np.concatenate([self.lengths, other.lengths])
        self.valid = np.concatenate([padded(self.valid, False), padded(other.valid, False)])
        self.key_pos = np.concatenate([padded(self.key_pos, -1), padded(other.key_pos, -1)])

    def keep_accepted(self, root_pos: np.ndarray, accepted_rows: list[np.ndarray]) -> None:
        """After a step over ``S`` slots: row ``b`` keeps its root (slot ``S``) and its accepted
        nodes (``accepted_rows[b]``, int64 [k_b] node indices; node ``i`` sits at slot
        ``S + 1 + i``) at slots ``lengths[b] ..``; ``root_pos`` int64 [B] is each row's root
        position. The cache is cut to the longest row."""
        slots = self.slots
        n_rows = len(self.requests)
        kmax = 1 + max(a.shape[0] for a in accepted_rows)
        src = np.empty((n_rows, kmax), dtype=np.int64)
        dst = np.empty((n_rows, kmax), dtype=np.int64)
        grow = max(0, int(max(self.lengths[b] + 1 + a.shape[0] for b, a in enumerate(accepted_rows))) - slots)
        if grow:
            self.valid = np.concatenate([self.valid, np.zeros((n_rows, grow), dtype=bool)], axis=1)
            self.key_pos = np.concatenate([self.key_pos, np.full((n_rows, grow), -1, dtype=np.int64)], axis=1)
        for b, accepted in enumerate(accepted_rows):
            kept = 1 + accepted.shape[0]
            s = slots + np.concatenate([[0], accepted + 1])
            d = self.lengths[b] + np.arange(kept)
            src[b, :kept], dst[b, :kept] = s, d
            src[b, kept:], dst[b, kept:] = s[-1], d[-1]  # padding repeats a real pair
            self.valid[b, d] = True
            self.key_pos[b, d] = root_pos[b] + np.arange(kept)
            self.lengths[b] += kept
        new_len = self.slots
        device = self.device
        src_dst = to_device(np.stack([src, dst]), device)  # one copy, no host sync
        gather_slots(self.cache, torch.arange(n_rows, device=device)[:, None], src_dst[0], src_dst[1], new_len)
        self.valid, self.key_pos = self.valid[:, :new_len], self.key_pos[:, :new_len]

    def drop_finished(self) -> None:
        """Removes finished rows (their cache rows included) and cuts holes no active row needs."""
        keep = [b for b, request in enumerate(self.requests) if not request.done]
        if len(keep) == len(self.requests):
            return
        if not keep:
            self.requests, self.cache = [], None
            self.lengths, self.valid, self.key_pos = self.lengths[:0], self.valid[:0], self.key_pos[:0]
            return
        lengths = self.lengths[keep]
        new_len = int(lengths.max())
        valid = self.valid[keep, :new_len]
        # left-padding holes that every remaining row has (a long prompt's row left): cut them too
        start = int(valid.argmax(axis=1).min())
        select_rows(self.cache, to_device(np.asarray(keep, dtype=np.int64), self.device), start, new_len)
        self.requests = [self.requests[b] for b in keep]
        self.lengths = lengths - start
        self.valid = valid[:, start:]
        self.key_pos = self.key_pos[keep, start:new_len]
