"""The proposer: what the decoding loop calls once per step.

Three sources continue the current context (prompt + accepted tokens):

* ``context``   -- the live context itself (:class:`~refdec.index.ContextIndex`):
  repeated spans, loops, the original file in an edit prompt.
* ``reference`` -- per-request reference documents (one automaton over them).
* ``corpus``    -- a frozen :class:`~refdec.index.CorpusIndex`.

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

``source_ids`` index ``Proposer.source_names`` (always all three names, so ids
are stable whether or not a source is present).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from refdec import _C
from refdec.index import ContextIndex, CorpusIndex, _as_tokens
from refdec.tree import DraftTree

__all__ = ["CursorParams", "Proposer", "SourceParams"]


_INT32_MAX = 2**31 - 1
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _check_fields(params, ranges: dict) -> None:
    """Type and range of every field of a params dataclass: ints (not bools) in [lo, hi]
    (hi None: 2**31 - 1), floats finite, within float32, in [lo, hi] (``ranges[name] = (lo, hi)``,
    default [0, inf))."""
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        lo, hi = ranges.get(f.name, (0, float("inf")))
        if f.type in (int, "int"):
            hi = _INT32_MAX if hi is None or hi == float("inf") else hi
            ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and lo <= value <= hi
            kind = f"an int in [{lo}, {hi}]"
        else:  # the C++ side holds float32
            ok = (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
                  and np.isfinite(value) and abs(value) <= _FLOAT32_MAX and lo <= value <= hi)
            kind = f"a finite number in [{lo}, {hi}]"
        if not ok:
            raise ValueError(f"{type(params).__name__}.{f.name} must be {kind}, got {value!r}")


@dataclass(frozen=True)
class SourceParams:
    """Per-source confidence: ``weight * L / (L + half_len)`` for a match of length L."""

    weight: float = 1.0
    half_len: float = 2.0

    def __post_init__(self) -> None:
        _check_fields(self, {"weight": (0.0, 1.0)})


@dataclass(frozen=True)
class CursorParams:
    """Editing mode: the copy cursor that follows the output through the references
    (``csrc/copy_cursor.h``).

    The cursor keeps an *alignment* (where in the reference the output is
    copying from) and an *anchor* (where the last confirmed copy of at least
    ``confirm_run`` tokens stopped). When the output leaves the alignment it
    re-synchronises: for the longest suffix match and up to ``max_backoff``
    shorter ones, the occurrence whose continuation starts nearest the anchor,
    plus the anchor itself (the re-join after an insertion), each scored

        log-odds(q) = match_gain * min(l, match_cap) - distance_gain * log(1 + d / distance_scale)

    (l = trailing output tokens equal to the reference before q; d = q - anchor,
    or back_penalty * (anchor - q) before the anchor), plus ``anchor_bonus`` for
    the anchor and ``diag_bonus`` for the diagonal anchor + k, k = output tokens
    since the anchor (k reference tokens replaced by k new ones). The best
    ``max_candidates`` become fixed-copy branches of the reference source with
    weight softmax(log-odds, null_score); each copied token multiplies the score
    by ``copy_decay``. While the cursor is on, each source's path score at
    depth d is multiplied by its survival ``((s + e) / (s + e + d)) ** p`` (a
    hazard ~ p / (s + e + j) per level that falls the longer the copy held):
    e = the source's match length with ``p, s = hazard_power, hazard_scale``,
    or a cursor candidate's aligned run with ``copy_hazard_power,
    copy_hazard_scale``. A copy backed by a long match keeps its score deep
    down; weakly backed alternatives yield the budget after a few levels.
    ``depth_decay`` < 1 (1 = off, the default) also scores every node
    ``combined score * g ** min(depth, levels)`` with
    ``g = 1 - (1 - depth_decay) * 4 / (4 + r)`` (r = the best candidate's aligned
    run) and ``levels = decay_levels * max_nodes / 64``. While the best candidate's
    weight is below ``unigram_below``, the ``unigram_k`` most frequent
    reference tokens are added too, each copied from its occurrence nearest the
    anchor, with weight ``unigram_weight * (its share of the reference)``.
    Before the first output token the alignment is the top of the first
    reference with ``start_run`` aligned tokens of evidence (an edit rewrites the
    file from its top: the first step drafts one full-depth copy; 0 = the top is
    only the anchor), when the prompt frames the reference that way
    (:func:`frames_reference`: it shows the file's first tokens right after its
    own closing tokens, the fence; a prompt that only quotes a document gets 0).
    Substitutions (a reference token written as another while the copy goes on
    right after it: re-indentation, a rename) are learnt, the latest
    ``max_substitutions`` kept; a cursor chain copying such a token forks into
    both, the new one with probability hits / (hits + misses + 1).
    """

    match_gain: float = 2.0
    match_cap: int = 16
    distance_gain: float = 2.0
    distance_scale: float = 32.0
    back_penalty: float = 4.0
    null_score: float = 3.0
    anchor_bonus: float = 1.0
    diag_bonus: float = 1.0
    copy_decay: float = 1.0
    depth_decay: float = 1.0
    decay_levels: int = 16
    hazard_power: float = 1.5
    hazard_scale: float = 1.0
    copy_hazard_power: float = 1.0
    copy_hazard_scale: float = 1.0
    confirm_run: int = 8
    start_run: int = 16
    max_candidates: int = 3
    max_backoff: int = 6
    unigram_k: int = 16
    unigram_weight: float = 1.0
    unigram_below: float = 0.5
    max_substitutions: int = 8
    max_scan: int = 16384

    def __post_init__(self) -> None:
        _check_fields(self, {"match_gain": (-np.inf, np.inf), "null_score": (-np.inf, np.inf),
                             "anchor_bonus": (-np.inf, np.inf), "diag_bonus": (-np.inf, np.inf),
                             "distance_scale": (1e-3, np.inf), "copy_decay": (0.0, 1.0),
                             "depth_decay": (0.0, 1.0), "decay_levels": (1, None), "hazard_scale": (1e-3, np.inf),
                             "copy_hazard_scale": (1e-3, np.inf), "unigram_weight": (0.0, 1.0),
                             # buffers of these sizes are allocated per request
                             "match_cap": (1, 4096), "max_candidates": (1, 4096), "max_backoff": (0, 4096),
                             "unigram_k": (0, 65536), "max_substitutions": (0, 65536)})


DEFAULT_PARAMS = {
    "context": SourceParams(1.0, 2.0),
    "reference": SourceParams(1.0, 2.0),
    "corpus": SourceParams(0.9, 4.0),
}


# A context copy that runs past the context's end continues with the draft itself (a loop);
# each such token's score is scaled by the loop decay. Chat outputs: 0.7 (1.0 loses 4-12%
# tokens/step on Spec-Bench/MT-Bench, benchmarks/RESULTS.md section 3). Editing mode: 1.0,
# no decay: when a model repeats a block of the file it keeps repeating it (edits-click, the
# default model's own outputs: 389 -> 308 verify passes over the 10 e2e pairs; the true
# edited files: 41.57 -> 41.56 tokens/step at 64 nodes, neutral).
LOOP_DECAY = 0.7
EDITING_LOOP_DECAY = 1.0

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

    ``backoff`` (default 1): each source also expands the continuations of up
    to this many shorter suffix matches (suffix links, down to
    ``min_backoff_len`` tokens), each scored by its own length. A corpus's
    longest match is often specific to one file, its shorter suffix general.
    End to end 7-14% fewer verify passes on RAG, HumanEval and MT-Bench with the
    default model (benchmarks/RESULTS.md section 4). 0 = only the longest match.

    Not thread-safe: one Proposer per concurrent request (the CorpusIndex may be shared).
    """

    source_names: tuple[str, ...] = ("context", "reference", "corpus")

    def __init__(self, index: CorpusIndex | None = None, references: list[np.ndarray] | None = None, *,
                 max_depth: int = 64, params: dict[str, SourceParams] | None = None,
                 backoff: int = 1, min_backoff_len: int = 1, loop_decay: float | None = None,
                 cursor: CursorParams | bool | None = None) -> None:
        if index is not None and not isinstance(index, CorpusIndex):
            raise ValueError(f"index must be a refdec.CorpusIndex or None, got {type(index).__name__}")
        for name, value, lowest in (("max_depth", max_depth, 1), ("backoff", backoff, 0),
                                    ("min_backoff_len", min_backoff_len, 1)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lowest:
                raise ValueError(f"{name} must be an integer >= {lowest}, got {value!r}")
        self.index = index
        self.max_depth = int(max_depth)
        self.backoff = int(backoff)
        self.min_backoff_len = int(min_backoff_len)
        if isinstance(cursor, (bool, int, np.integer)) and not isinstance(cursor, CursorParams):
            cursor = CursorParams() if cursor else None  # refdec:cursor=1 in the simulator
        if not (cursor is None or isinstance(cursor, CursorParams)):
            raise ValueError(f"cursor must be a refdec.CursorParams, True, False or None, got {cursor!r}")
        self.cursor = cursor
        if loop_decay is None:
            loop_decay = EDITING_LOOP_DECAY if cursor is not None else LOOP_DECAY
        if (isinstance(loop_decay, bool) or not isinstance(loop_decay, (int, float, np.integer, np.floating))
                or not 0.0 <= loop_decay <= 1.0):
            raise ValueError(f"loop_decay must be a number in [0, 1] or None, got {loop_decay!r}")
        self.loop_decay = float(loop_decay)
        self.params = dict(DEFAULT_PARAMS)
        if params:
            unknown = set(params) - set(self.source_names)
            if unknown:
                raise ValueError(f"params has unknown source names {sorted(unknown)}; known: {self.source_names}")
            self.params.update(params)
        self._references = [_as_tokens(r, f"references[{i}]") for i, r in enumerate(references or [])]
        self._context: ContextIndex | None = None
        self._reference_sam = None
        self._core = None

    def start(self, prompt_ids: np.ndarray) -> None:
        """New request: indexes the prompt (live context) and the references, positions the matchers."""
        prompt = _as_tokens(prompt_ids, "prompt_ids")
        core = _C.ProposerCore(self.max_depth)
        core.set_backoff(self.backoff, self.min_backoff_len)
        self._context = ContextIndex()
        p = self.params["context"]
        core.set_context(self._context._sam, p.weight, p.half_len, 0, self.loop_decay)
        self._reference_sam = None
        if self._references:
            sam = _C.SuffixAutomaton()
            for ref in self._references:
                sam.add_document(ref)
            self._reference_sam = sam
            p = self.params["reference"]
            core.add_matcher_source(sam, p.weight, p.half_len, 1)
            if self.cursor is not None and sam.num_tokens > 0:
                cursor = self.cursor
                first = next(ref for ref in self._references if len(ref))
                if cursor.start_run > 0 and not frames_reference(prompt, first):
                    cursor = dataclasses.replace(cursor, start_run=0)
                core.set_cursor(1, dataclasses.asdict(cursor))
        if self.index is not None:
            p = self.params["corpus"]
            core.add_matcher_source(self.index._frozen_index(), p.weight, p.half_len, 2)
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
        if (type(max_nodes) is not int and (isinstance(max_nodes, bool) or not isinstance(max_nodes, np.integer))
                or max_nodes < 0):
            raise ValueError(f"max_nodes must be a non-negative integer, got {max_nodes!r}")
        token_ids, parents, scores, source_ids = core.propose(int(max_nodes))
        return DraftTree._trusted(token_ids, parents, scores, source_ids, self.source_names)

    def accept(self, tokens: np.ndarray) -> None:
        """Appends the tokens emitted this step (accepted + bonus): O(len(tokens)) amortised."""
        core = self._require_started()
        try:
            core.feed(tokens)  # an int32 array, as the decoder passes; a negative id: ValueError naming it
        except TypeError:  # anything else: checked and converted
            core.feed(_as_tokens(tokens))

    def last_match_lengths(self) -> dict[str, int]:
        """Current match length per source name (0 for an absent source)."""
        out = dict.fromkeys(self.source_names, 0)
        if self._core is not None:
            for source_id, length in self._core.match_lengths():
                out[self.source_names[source_id]] = int(length)
        return out

    def cursor_state(self) -> dict[str, int]:
        """Editing mode: ``{"align", "run", "anchor"}`` of the reference copy cursor
        (token positions in the concatenated references; -1 = none)."""
        align, run, anchor = self._require_started().cursor_state(1)
        return {"align": int(align), "run": int(run), "anchor": int(anchor)}

    def cursor_candidates(self) -> list[tuple[int, int, float]]:
        """Editing mode: the cursor's candidates ``(token_pos, match, weight)``, best first."""
        return [(int(p), int(m), float(w)) for p, m, w in self._require_started().cursor_candidates(1)]

    @property
    def context(self) -> ContextIndex | None:
        """The live context index of the current request."""
        return self._context
