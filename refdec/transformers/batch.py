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

Finished rows leave the batch (:meth:`RunningBatch.drop_finished`; ``retire``, when set, is
handed each one's entries first: the backend's prefix cache): their cache rows are dropped, so they stop costing compute, and the left-padding slots every remaining
row has are cut as well. A joining group's cache rows are appended
(:meth:`RunningBatch.join`): both are padded at the end of the slot dim to the longer
one, so a row's entries stay in ``[0, length)`` and the holes after them are where its
next entries go, as for a row that lags the longest.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from refdec.engine.requests import Request
from refdec.transformers.cache import append_rows, gather_slots, row_entries, select_rows
from refdec.transformers.hybrid.state import (append_state_rows, commit_states, has_pending, recurrent_layers,
                                               row_states, select_state_rows)
from refdec.transformers.transfer import to_device

__all__ = ["RunningBatch"]


class RunningBatch:
    """``requests``: the active rows, in batch order; ``cache``: their KV cache (None while
    empty), on ``device``; ``lengths`` int64 [B] (host): each row's valid slot count (left holes
    included); ``lead_holes`` int64 [B] (host): each row's left-padding holes at the front;
    ``key_pos`` int64 [B, S] **on the device**, kept there: the absolute position of each slot
    (-1 for a hole), from which the step's masks are built (a slot is valid iff its position is
    >= 0). The constructor takes ``key_pos`` from the host (int64 [B, S] numpy, every row with a
    valid slot). ``retire(request, n, entries, states)``, when set, receives each finished row's cache
    entries before they go (refdec.transformers.cache.row_entries of its positions
    ``0 .. n - 1``, the tokens ``request.seq[:n]`` it kept) and, a hybrid model's, its recurrent
    state after those ``n`` tokens (refdec.transformers.hybrid.state.row_states; None for an
    attention model). A hybrid row whose state is past its ``n`` tokens (a stop string cut
    tokens it ran) is not retired: its state cannot be rolled back."""

    retire = None

    def __init__(self, device, requests: list[Request], cache, lengths: np.ndarray, key_pos: np.ndarray) -> None:
        self.device = device
        self.requests = requests
        self.cache = cache
        self.lengths = lengths
        self.lead_holes = (key_pos >= 0).argmax(axis=1).astype(np.int64) if key_pos.shape[1] else \
            np.zeros(key_pos.shape[0], dtype=np.int64)
        self.key_pos = to_device(key_pos.astype(np.int64), device)  # a copy: the caller's array stays its own

    @classmethod
    def empty(cls, device) -> "RunningBatch":
        return cls(device, [], None, np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.int64))

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def slots(self) -> int:
        """``S``: the cache length."""
        return int(self.lengths.max())

    def host_key_pos(self) -> np.ndarray:
        """int64 [B, S]: ``key_pos`` on the host (the host-built masks of the CPU's lazy-head path;
        on a CPU no copy, on a GPU a host sync)."""
        return self.key_pos.cpu().numpy()

    def join(self, other: "RunningBatch") -> None:
        """Appends the rows of ``other`` (a group prefilled on its own) after this batch's."""
        if not len(other):
            return
        if not len(self):
            self.requests, self.cache = other.requests, other.cache
            self.lengths, self.lead_holes, self.key_pos = other.lengths, other.lead_holes, other.key_pos
            return
        # a model without KV layers (Mamba2) moves no slots: its rows' widths are the positions' alone
        n = append_rows(self.cache, other.cache) or max(self.key_pos.shape[1], other.key_pos.shape[1])
        append_state_rows(self.cache, other.cache)
        self.requests = self.requests + other.requests
        self.lengths = np.concatenate([self.lengths, other.lengths])
        self.lead_holes = np.concatenate([self.lead_holes, other.lead_holes])
        self.key_pos = torch.cat([F.pad(self.key_pos, (0, n - self.key_pos.shape[1]), value=-1),
                                  F.pad(other.key_pos, (0, n - other.key_pos.shape[1]), value=-1)])

    def keep_accepted(self, root_pos: np.ndarray, accepted_rows: list[np.ndarray]) -> None:
        """After a step over ``S`` slots: row ``b`` keeps its root (slot ``S``) and its accepted
        nodes (``accepted_rows[b]``, int64 [k_b] node indices; node ``i`` sits at slot
        ``S + 1 + i``) at slots ``lengths[b] ..``; ``root_pos`` int64 [B] is each row's root
        position. The cache is cut to the longest row. One host-to-device copy (the slot moves
        and the kept slots' positions), no host sync. A hybrid model's recurrent layers take each
        row's last kept tree row's state (refdec.transformers.hybrid.state.commit_states)."""
        slots = self.slots
        n_rows = len(self.requests)
        kmax = 1 + max(a.shape[0] for a in accepted_rows)
        moves = np.empty((3, n_rows, kmax), dtype=np.int64)  # source slots, destination slots, positions
        for b, accepted in enumerate(accepted_rows):
            kept = 1 + accepted.shape[0]
            moves[0, b, 0], moves[0, b, 1:kept] = slots, slots + 1 + accepted
            moves[1, b, :kept] = self.lengths[b] + np.arange(kept)
            moves[2, b, :kept] = root_pos[b] + np.arange(kept)
            moves[:, b, kept:] = moves[:, b, kept - 1:kept]  # padding repeats a real move
            self.lengths[b] += kept
        new_len = self.slots
        sent = to_device(moves, self.device)  # one copy, no host sync
        grow = new_len - self.key_pos.shape[1]
        if grow > 0:
            self.key_pos = F.pad(self.key_pos, (0, grow), value=-1)
        self.key_pos.scatter_(1, sent[1], sent[2])
        gather_slots(self.cache, torch.arange(n_rows, device=self.device)[:, None], sent[0], sent[1], new_len)
        self.key_pos = self.key_pos[:, :new_len]
        if has_pending(self.cache):  # a hybrid model: each row's recurrent state becomes its last kept row's
            final = np.array([a[-1] + 1 if a.shape[0] else 0 for a in accepted_rows], dtype=np.int64)
            commit_states(self.cache, to_device(final, self.device))

    def drop_finished(self) -> None:
        """Removes finished rows (their cache rows included) and cuts holes no active row needs."""
        keep = [b for b, request in enumerate(self.requests) if not request.done]
        if len(keep) == len(self.requests):
            return
        if self.retire is not None:
            for b, request in enumerate(self.requests):
                if request.done:
                    held = int(self.lengths[b] - self.lead_holes[b])
                    n = min(len(request.seq) - 1, held)  # a stop string may have cut tokens whose entries exist
                    hybrid = bool(recurrent_layers(self.cache))
                    if n > 0 and (n == held or not hybrid):
                        lead = int(self.lead_holes[b])
                        self.retire(request, n, row_entries(self.cache, b, lead, lead + n),
                                    row_states(self.cache, b) if hybrid else None)
        if not keep:
            self.requests, self.cache = [], None
            self.lengths, self.lead_holes, self.key_pos = self.lengths[:0], self.lead_holes[:0], self.key_pos[:0]
            return
        lengths = self.lengths[keep]
        new_len = int(lengths.max())
        # left-padding holes that every remaining row has (a long prompt's row left): cut them too
        start = int(self.lead_holes[keep].min())
        rows = to_device(np.asarray(keep, dtype=np.int64), self.device)
        select_rows(self.cache, rows, start, new_len)
        select_state_rows(self.cache, rows)
        self.requests = [self.requests[b] for b in keep]
        self.lengths = lengths - start
        self.lead_holes = self.lead_holes[keep] - start
        self.key_pos = self.key_pos.index_select(0, rows)[:, start:new_len]
