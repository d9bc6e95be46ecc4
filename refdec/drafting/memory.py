"""A bounded memory of past outputs: finished requests' tokens draft for later requests.

Agents and editors repeat themselves across requests (the same tool-call scaffolding, the same
change applied file after file, a patch retried). :class:`OutputMemory` keeps the outputs of
finished requests in suffix automata that a later request's :class:`~refdec.drafting.proposer.Proposer`
matches as its ``memory`` source, priced by the acceptance table like the other sources.

Layout, per tenant: sealed *segments* (immutable automata of up to ``segment_tokens`` tokens,
oldest first) and one *young* segment that each new output rebuilds (at most ``segment_tokens``
tokens, so an addition costs O(``segment_tokens``)). The young segment is also sealed once it holds
an eighth of ``max_bytes``: eviction drops a whole sealed segment, so a segment as large as a small
budget would empty the memory at each seal. A request takes a snapshot at its start
(:meth:`OutputMemory.automata`: a tuple of automata no one changes afterwards), so requests and
additions on other threads never race. Past ``max_bytes`` (every tenant together) the oldest
sealed segment of any tenant is dropped, then the young segments' oldest outputs.

Isolation: drafting never changes an output, but the speed of a reply shows whether its text was
in the memory: a tenant must not draft from another's outputs (a timing side channel), so each
tenant has its own segments. ``refdec serve`` keys tenants by API key or the request's ``user``.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from refdec import _C
from refdec.tokens import as_token_ids, check_int

__all__ = ["OutputMemory", "automaton_bytes"]

DEFAULT_MAX_BYTES = 64 << 20
DEFAULT_SEGMENT_TOKENS = 1 << 15
SEGMENT_SHARE = 8  # a young segment is sealed at max_bytes / SEGMENT_SHARE: eviction's step


def automaton_bytes(sam) -> int:
    """The memory a :class:`refdec._C.SuffixAutomaton` holds, estimated from its arrays
    (csrc/suffix_automaton.h): a 28-byte record per state, per edge an 8-byte list node and a
    12-byte hash slot at no more than half load, and the 4-byte tokens."""
    return 28 * sam.num_states + 32 * sam.num_edges + 4 * sam.num_tokens


@dataclass
class _Segment:
    """One automaton over some outputs of one tenant. ``order``: when it was sealed or last rebuilt
    (a counter over every tenant, so the oldest across tenants goes first)."""
    automaton: object
    nbytes: int
    order: int


@dataclass
class _Tenant:
    sealed: deque = field(default_factory=deque)  # _Segment, oldest first
    young_outputs: deque = field(default_factory=deque)  # int32 arrays, oldest first
    young_tokens: int = 0
    young: _Segment | None = None


class OutputMemory:
    """Past outputs as a drafting source, bounded by ``max_bytes`` (int >= 0; 0 keeps nothing) over
    every tenant, in segments of ``segment_tokens`` tokens (int >= 1). Thread-safe: :meth:`add`
    and :meth:`automata` may run on any threads.

    ``min_tokens`` (int >= 1): shorter outputs are not kept (a one-word answer drafts nothing
    useful). Tenants are any hashable keys (None is the default tenant)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, *, segment_tokens: int = DEFAULT_SEGMENT_TOKENS,
                 min_tokens: int = 4) -> None:
        self.max_bytes = check_int("max_bytes", max_bytes, 0)
        self.segment_tokens = check_int("segment_tokens", segment_tokens, 1)
        self.min_tokens = check_int("min_tokens", min_tokens, 1)
        self._tenants: dict = {}
        self._lock = threading.Lock()
        self._order = 0
        self._bytes = 0
        self.evicted_outputs = 0  # outputs dropped to stay within max_bytes (diagnostics)

    @property
    def nbytes(self) -> int:
        """The memory held now (:func:`automaton_bytes` summed), never more than ``max_bytes``."""
        return self._bytes

    def tenants(self) -> dict:
        """{tenant: (outputs' tokens kept, bytes)}."""
        with self._lock:
            return {key: (sum(s.automaton.num_tokens for s in t.sealed) + t.young_tokens,
                          sum(s.nbytes for s in t.sealed) + (t.young.nbytes if t.young else 0))
                    for key, t in self._tenants.items()}

    def add(self, tokens, tenant=None) -> None:
        """Keeps one finished output (token ids: int32 [n] or a list of int) for ``tenant``."""
        tokens = as_token_ids(tokens, "tokens")
        if len(tokens) < self.min_tokens or self.max_bytes == 0:
            return
        tokens = tokens[-self.segment_tokens:]  # an output longer than a segment keeps its end
        with self._lock:
            t = self._tenants.setdefault(tenant, _Tenant())
            full = (t.young_tokens + len(tokens) > self.segment_tokens
                    or t.young is not None and t.young.nbytes * SEGMENT_SHARE >= self.max_bytes)
            if full and t.young is not None:
                t.sealed.append(t.young)  # the young segment is full: it stays as it is
                t.young, t.young_outputs, t.young_tokens = None, deque(), 0
            t.young_outputs.append(tokens)
            t.young_tokens += len(tokens)
            self._rebuild_young(t)
            self._evict()

    def automata(self, tenant=None) -> tuple:
        """A snapshot of ``tenant``'s memory: a tuple of automata (sealed oldest first, then the
        young one) that later additions do not change; empty when nothing is kept."""
        with self._lock:
            t = self._tenants.get(tenant)
            if t is None:
                return ()
            return tuple(s.automaton for s in t.sealed) + ((t.young.automaton,) if t.young else ())

    def clear(self, tenant=None) -> None:
        """Forgets ``tenant``'s outputs."""
        with self._lock:
            t = self._tenants.pop(tenant, None)
            if t is not None:
                self._bytes -= sum(s.nbytes for s in t.sealed) + (t.young.nbytes if t.young else 0)

    # -- under the lock

    def _rebuild_young(self, t: _Tenant) -> None:
        old = t.young.nbytes if t.young else 0
        if not t.young_outputs:
            t.young = None
            self._bytes -= old
            return
        sam = _C.SuffixAutomaton()
        sam.reserve(t.young_tokens)
        for output in t.young_outputs:
            sam.add_document(output)
        self._order += 1
        t.young = _Segment(sam, automaton_bytes(sam), self._order)
        self._bytes += t.young.nbytes - old

    def _evict(self) -> None:
        """Drops the oldest sealed segment of any tenant, then young segments' oldest outputs, until
        the memory fits ``max_bytes``; a tenant left with nothing is forgotten."""
        while self._bytes > self.max_bytes:
            sealed = [(t.sealed[0].order, key) for key, t in self._tenants.items() if t.sealed]
            if sealed:
                key = min(sealed, key=lambda pair: pair[0])[1]
                t = self._tenants[key]
                segment = t.sealed.popleft()
                self._bytes -= segment.nbytes
                self.evicted_outputs += segment.automaton.num_documents
            else:
                key = min(((t.young.order, key) for key, t in self._tenants.items() if t.young),
                          key=lambda pair: pair[0])[1]
                t = self._tenants[key]
                t.young_tokens -= len(t.young_outputs.popleft())
                self.evicted_outputs += 1
                self._rebuild_young(t)
            if not t.sealed and t.young is None:
                del self._tenants[key]

    def __repr__(self) -> str:
        return (f"OutputMemory(max_bytes={self.max_bytes}, nbytes={self._bytes}, tenants={len(self._tenants)}, "
                f"evicted_outputs={self.evicted_outputs})")


def as_memory(memory, name: str = "memory") -> OutputMemory | None:
    """``memory`` checked: an :class:`OutputMemory` or None."""
    if memory is not None and not isinstance(memory, OutputMemory):
        raise ValueError(f"{name} must be a refdec.OutputMemory or None, got {type(memory).__name__}")
    return memory

