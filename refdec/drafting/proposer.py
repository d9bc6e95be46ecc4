"""The proposer: what the decoding loop calls once per step.

Four sources continue the current context (prompt + accepted tokens):

* ``context``   -- the live context itself (:class:`~refdec.drafting.index.ContextIndex`):
  repeated spans, loops, the original file in an edit prompt.
* ``reference`` -- per-request reference documents (one automaton over them).
* ``corpus``    -- a frozen :class:`~refdec.drafting.index.CorpusIndex`, or a
  :class:`~refdec.drafting.index.ShardedIndex` drafted as one corpus (the longest
  match over the shards; continuation counts summed over the shards where
  the text occurs: the same tree as one index over all their documents).
* ``memory``    -- earlier requests' outputs (:class:`~refdec.drafting.memory.OutputMemory`'s
  snapshot: automata drafted as one corpus).

Each source keeps the longest suffix of the context that occurs in it
(O(1) amortised per accepted token). :meth:`Proposer.propose` makes ONE C++
call that expands the most probable continuations of all sources best-first
into a merged trie (see ``csrc/draft_tree.h``):

    child score = parent score * count(child) / sum of the parent's children counts
    root score of a source = weight * L / (L + half_len), L = its match length
    a node reached by several sources: 1 - prod(1 - score_s)
    live context: a copy that runs past the context's end continues with the
    draft itself (a loop), each such token scaled by ``loop_decay`` (0.7;
    1.0 in editing mode)
    editing mode (``cursor=``): a copy cursor follows the output through the
    references and adds fixed-copy branches (see :class:`CursorParams`)

``source_ids`` index ``Proposer.source_names`` (always all four names, so ids
are stable whether or not a source is present).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from refdec import _C
from refdec._C import CursorParams, SourceParams
from refdec.drafting.index import ContextIndex, CorpusIndex, ShardedIndex
from refdec.drafting.tree import MAX_NODES, DraftBatch, DraftTree
from refdec.tokens import as_token_ids, check_int, is_int

__all__ = ["CursorParams", "Drafter", "Proposer", "SourceParams", "SOURCE_NAMES"]

# the draft sources, by id (DraftTree.source_ids): the names every report and the acceptance table use
SOURCE_NAMES = ("context", "reference", "corpus", "memory")
CONTEXT, REFERENCE, CORPUS, MEMORY = range(len(SOURCE_NAMES))

# CursorParams and SourceParams are the C++ structs (csrc/copy_cursor.h, csrc/draft_tree.h, which
# document every field, its default and its range), bound with checked read-write fields.


@runtime_checkable
class Drafter(Protocol):
    """What a decoding loop asks of a drafter, one request at a time (refdec's engine, the vLLM
    adapter and the benchmarks' baselines type against it; :class:`Proposer` is one)::

        drafter.start(prompt_ids)                  # once per request
        while ...:
            tree = drafter.propose(max_nodes)      # a DraftTree of <= max_nodes nodes
            ...verify...
            drafter.accept(accepted_and_bonus)     # the tokens emitted this step
    """

    def start(self, prompt_ids: np.ndarray) -> None:
        """Begins a request. ``prompt_ids``: int32 array of shape (prompt_len,), token ids >= 0."""

    def propose(self, max_nodes: int) -> DraftTree:
        """A draft tree continuing the context: at most ``max_nodes`` nodes (may be empty), as
        :class:`~refdec.drafting.tree.DraftTree` arrays of shape (n,): token_ids int32, parents int32
        (-1 = child of the root, the last accepted token; parents[i] < i), scores float32,
        source_ids int32 (indexes into ``source_names``), depths int32 (1 = child of the root)."""

    def accept(self, tokens: np.ndarray) -> None:
        """Appends the tokens emitted this step (the accepted path + the bonus token): int32 array
        of shape (k,), k >= 1 normally (0 is allowed and changes nothing)."""


_NO_TOKENS = np.zeros(0, np.int32)

# The defaults live in C++ (csrc/proposer_core.h, with why): {source name: SourceParams}, and the
# score factor of each draft token a context copy takes from the draft itself (a loop), without
# and with the copy cursor (editing mode).
DEFAULT_PARAMS = _C.default_source_params()
LOOP_DECAY = _C.LOOP_DECAY
EDITING_LOOP_DECAY = _C.EDITING_LOOP_DECAY


def frames_reference(prompt: np.ndarray, reference: np.ndarray, head: int = 8, tail: int = 2) -> bool:
    """Whether ``prompt`` (int32 [L]) holds the first ``head`` tokens of ``reference`` (int32 [R])
    right after its own last ``tail`` tokens: an edit prompt that shows the original file after a
    fence and ends with the same fence, so the output is about to rewrite the reference from its
    top (refdec's edit templates all do). A prompt that merely quotes a document does not."""
    head = min(head, len(reference))
    if head == 0 or len(prompt) < tail + head:
        return False
    ending = prompt[len(prompt) - tail:]
    for i in np.flatnonzero(prompt[tail:len(prompt) - head + 1] == reference[0]) + tail:
        if np.array_equal(prompt[i:i + head], reference[:head]) and np.array_equal(prompt[i - tail:i], ending):
            return True
    return False


class Proposer:
    """Per-request draft proposer over the live context, references and a corpus index.

    Usage (one request)::

        proposer = Proposer(index, references, max_depth=64)
        proposer.start(prompt_ids)              # int32 [prompt_len]
        while ...:
            tree = proposer.propose(max_nodes)  # DraftTree, <= max_nodes nodes, maybe empty
            ...verify...
            proposer.accept(accepted_and_bonus) # int32 [k]

    ``cursor`` (editing mode, off by default): a :class:`CursorParams` or True
    adds the copy cursor to the reference source: drafts continue at the
    occurrence nearest where the output is copying from and re-join the
    reference after an insertion or replacement. Its branches are copies of
    the reference that need not follow a suffix match.

    ``loop_decay`` (None = 0.7, or 1.0 with the cursor on): the score factor of
    each draft token a context copy takes from the draft itself (a loop).

    ``memory``: a snapshot of past outputs (:meth:`refdec.OutputMemory.automata`, a tuple of
    automata; empty or None: no memory source).

    ``backoff`` (default 1): each source also expands the continuations of up
    to this many shorter suffix matches (suffix links, down to
    ``min_backoff_len`` tokens), each scored by its own length. A corpus's
    longest match is often specific to one file, its shorter suffix general.
    End to end 7-14% fewer verify passes on RAG, HumanEval and MT-Bench with the
    default model (benchmarks/RESULTS.md section 4). 0 = only the longest match.

    Not thread-safe: one Proposer per concurrent request (the CorpusIndex may be shared).
    """

    source_names: tuple[str, ...] = SOURCE_NAMES

    def __init__(self, index: CorpusIndex | ShardedIndex | None = None, references: list[np.ndarray] | None = None, *,
                 max_depth: int = MAX_NODES, params: dict[str, SourceParams] | None = None,
                 backoff: int = 1, min_backoff_len: int = 1, loop_decay: float | None = None,
                 cursor: CursorParams | bool | None = None, memory: tuple | None = None) -> None:
        if index is not None and not isinstance(index, (CorpusIndex, ShardedIndex)):
            raise ValueError(f"index must be a refdec.CorpusIndex, a refdec.ShardedIndex or None, "
                             f"got {type(index).__name__}")
        self.max_depth = check_int("max_depth", max_depth, 1)
        self.backoff = check_int("backoff", backoff, 0)
        self.min_backoff_len = check_int("min_backoff_len", min_backoff_len, 1)
        self.index = index
        if isinstance(cursor, bool) or is_int(cursor):
            cursor = CursorParams() if cursor else None  # refdec:cursor=1 in the simulator
        if not (cursor is None or isinstance(cursor, CursorParams)):
            raise ValueError(f"cursor must be a refdec.CursorParams, True, False or None, got {cursor!r}")
        self.cursor = None if cursor is None else cursor.replace()  # a copy: the caller may change theirs
        if loop_decay is None:
            loop_decay = EDITING_LOOP_DECAY if cursor is not None else LOOP_DECAY
        if (isinstance(loop_decay, bool) or not isinstance(loop_decay, (int, float, np.integer, np.floating))
                or not 0.0 <= loop_decay <= 1.0):
            raise ValueError(f"loop_decay must be a number in [0, 1] or None, got {loop_decay!r}")
        self.loop_decay = float(loop_decay)
        params = params or {}
        unknown = set(params) - set(self.source_names)
        if unknown:
            raise ValueError(f"params has unknown source names {sorted(unknown)}; known: {self.source_names}")
        for name, value in params.items():
            if not isinstance(value, SourceParams):
                raise ValueError(f"params[{name!r}] must be a refdec.drafting.proposer.SourceParams, got {value!r}")
        # copies: SourceParams are mutable, and DEFAULT_PARAMS is shared
        self.params = {name: params.get(name, DEFAULT_PARAMS[name]).replace() for name in self.source_names}
        self._references = [as_token_ids(r, f"references[{i}]") for i, r in enumerate(references or [])]
        if not isinstance(memory, (tuple, type(None))) or not all(
                isinstance(sam, _C.AutomatonView) for sam in memory or ()):
            raise ValueError(f"memory must be a tuple of automata (refdec.OutputMemory.automata()) or None, "
                             f"got {memory!r}")
        self._memory = memory or ()
        self._context: ContextIndex | None = None
        self._reference_sam = None
        self._core = None

    def start(self, prompt_ids: np.ndarray) -> None:
        """New request: indexes the prompt (live context) and the references, positions the matchers."""
        prompt = as_token_ids(prompt_ids, "prompt_ids")
        core = _C.ProposerCore(self.max_depth)
        core.set_backoff(self.backoff, self.min_backoff_len)
        self._context = ContextIndex()
        core.set_context(self._context.automaton, self.params["context"], CONTEXT, self.loop_decay)
        self._reference_sam = None
        if self._references:
            sam = _C.SuffixAutomaton()
            for ref in self._references:
                sam.add_document(ref)
            self._reference_sam = sam
            core.add_matcher_source(sam, self.params["reference"], REFERENCE)
            if self.cursor is not None and sam.num_tokens > 0:
                cursor = self.cursor
                first = next(ref for ref in self._references if len(ref))
                if cursor.start_run > 0 and not frames_reference(prompt, first):
                    cursor = cursor.replace(start_run=0)
                core.set_cursor(REFERENCE, cursor)
        if isinstance(self.index, ShardedIndex):
            core.add_matcher_source(self.index.automata, self.params["corpus"], CORPUS)
        elif self.index is not None:
            core.add_matcher_source(self.index.automaton, self.params["corpus"], CORPUS)
        if self._memory:
            core.add_matcher_source(self._memory, self.params["memory"], MEMORY)
        core.feed(prompt)
        core.start_output()
        self._core = core

    def _require_started(self):
        if self._core is None:
            raise ValueError("Proposer.start(prompt_ids) must be called before propose/accept")
        return self._core

    def propose(self, max_nodes: int) -> DraftTree:
        """Best-first draft tree of at most ``max_nodes`` nodes continuing the context (may be empty)."""
        core = self._require_started()
        draft = core.propose(check_int("max_nodes", max_nodes, 0))  # refdec._C.DraftArrays
        return DraftTree._trusted(draft.token_ids, draft.parents, draft.scores, draft.source_ids, draft.depths,
                                  self.source_names)

    @staticmethod
    def propose_batch(proposers: Sequence[Proposer], max_nodes: int, new_tokens: Sequence[np.ndarray] | None = None,
                      *, num_threads: int = 1) -> DraftBatch:
        """One drafting step for R requests in ONE C++ call (no Python, and the GIL released,
        per request): the same trees as ::

            for proposer, tokens in zip(proposers, new_tokens):
                proposer.accept(tokens)
                trees.append(proposer.propose(max_nodes))

        as one :class:`~refdec.drafting.tree.DraftBatch`. ``proposers``: started :class:`Proposer` objects
        (a serving engine's requests; 1,000 trees of 32 nodes take a few ms). ``new_tokens``:
        None (accept nothing) or R C-contiguous int32 arrays of shape (k_r,), the tokens each
        request emitted since its last step. Every token is checked before any proposer changes:
        a negative id is a ValueError naming the request and the position, and no proposer has
        accepted anything.

        ``num_threads`` > 1 drafts contiguous runs of at least 16 requests on that many threads
        (the same trees; the proposers must then be distinct objects). Threads pay where cores
        are idle while the batch drafts (a GPU server); on a CPU that also runs the model, 1."""
        max_nodes = check_int("max_nodes", max_nodes, 0)
        num_threads = check_int("num_threads", num_threads, 1)
        cores = []
        for r, proposer in enumerate(proposers):
            core = proposer._core if isinstance(proposer, Proposer) else None
            if core is None:
                raise ValueError(f"proposers[{r}] must be a started refdec.Proposer (call start(prompt_ids) first), "
                                 f"got {proposer!r}")
            cores.append(core)
        if new_tokens is None:
            new_tokens = [_NO_TOKENS] * len(cores)
        elif not isinstance(new_tokens, list):
            new_tokens = list(new_tokens)
        if len(new_tokens) != len(cores):
            raise ValueError(f"new_tokens must hold one array per proposer ({len(cores)}), got {len(new_tokens)}")
        try:
            arrays = _C.step_batch(cores, new_tokens, max_nodes, num_threads)
        except TypeError:  # not all C-contiguous int32 arrays: checked and converted, each named
            new_tokens = [as_token_ids(t, f"new_tokens[{r}]") for r, t in enumerate(new_tokens)]
            arrays = _C.step_batch(cores, new_tokens, max_nodes, num_threads)
        return DraftBatch(*arrays, source_names=Proposer.source_names)

    def accept(self, tokens: np.ndarray) -> None:
        """Appends the tokens emitted this step (accepted + bonus): O(len(tokens)) amortised."""
        core = self._require_started()
        try:
            core.feed(tokens)  # an int32 array, as the decoder passes; a negative id: ValueError naming it
        except TypeError:  # anything else: checked and converted
            core.feed(as_token_ids(tokens))

    def last_match_lengths(self) -> dict[str, int]:
        """Current match length per source name (0 for an absent source)."""
        out = dict.fromkeys(self.source_names, 0)
        if self._core is not None:
            for source_id, length in self._core.match_lengths().items():
                out[self.source_names[source_id]] = length
        return out

    def cursor_state(self) -> dict[str, int]:
        """Editing mode: ``{"align", "run", "anchor"}`` of the reference copy cursor
        (token positions in the concatenated references; -1 = none)."""
        state = self._require_started().cursor_state(REFERENCE)
        return {"align": state.align, "run": state.run, "anchor": state.anchor}

    def cursor_candidates(self) -> list[tuple[int, int, float]]:
        """Editing mode: the cursor's candidates ``(token_pos, match, weight)``, best first."""
        return [(c.pos, c.match, c.weight) for c in self._require_started().cursor_candidates(REFERENCE)]

    @property
    def context(self) -> ContextIndex | None:
        """The live context index of the current request."""
        return self._context
