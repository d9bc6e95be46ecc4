"""Baseline drafters for the simulator, with the proposer interface

    start(prompt_ids)        int32 array of shape (L,)
    propose(max_nodes)       -> refdec DraftTree with at most max_nodes nodes
    accept(tokens)           int32 array of shape (k,): tokens appended to the output

    PromptLookup   n-gram lookup in prompt + output so far, one chain (HF's
                   prompt lookup decoding, with the occurrence rule selectable)
    OracleChain    the longest run of the true continuation found verbatim in
                   prompt + output so far: the upper bound of any copied chain
    ArcticSuffix   ArcticInference's SuffixDecodingCache (only if importable)
"""

from __future__ import annotations

import itertools

import numpy as np

from refdec import DraftTree

_EMPTY = DraftTree.empty()


class PromptLookup:
    """Prompt lookup decoding: find an earlier occurrence of the trailing n-gram
    (n = max_ngram down to min_ngram) of prompt + output so far and propose the
    ``max_nodes`` tokens that followed it, as one chain.

    The chain never reads past the current end of the sequence (a match ending
    just before the end gives a short chain), as in transformers.

    ``occurrence``:
      "last"  the most recent earlier occurrence (the rule DESIGN.md's reference
              numbers use, 3..1-grams).
      "first" the leftmost occurrence. This is transformers 5.24's
              PromptLookupCandidateGenerator.get_candidates exactly: it scans
              ``matches.nonzero()`` left to right and takes the first match whose
              continuation is non-empty (i.e. any occurrence but the trailing
              n-gram itself); its default max_matching_ngram_size is 2
              (``generation_config.max_matching_ngram_size or 2``), min 1.
              Use ``PromptLookup(max_ngram=2, occurrence="first")`` for HF's
              ``prompt_lookup_num_tokens`` behaviour.

    Incremental: for each n a dict maps an n-gram to its chosen start position,
    holding all n-grams except the trailing one, so a proposal is O(n + k).
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, occurrence: str = "last"):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"PromptLookup needs 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if occurrence not in ("last", "first"):
            raise ValueError(f"PromptLookup occurrence must be 'last' or 'first', got {occurrence!r}")
        self.max_ngram, self.min_ngram, self.occurrence = max_ngram, min_ngram, occurrence
        self.seq: list = []
        self._tables: dict = {}
        self._indexed_end = 0  # n-grams ending before this position are indexed

    def start(self, prompt_ids) -> None:
        self.seq = [int(t) for t in np.asarray(prompt_ids).tolist()]
        self._tables = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
        self._indexed_end = 0
        self._index()

    def accept(self, tokens) -> None:
        self.seq.extend(int(t) for t in np.asarray(tokens).tolist())
        self._index()

    def _index(self) -> None:
        # Index every n-gram whose last token is at position < len(seq) - 1: the
        # trailing n-gram is excluded (its continuation would be empty).
        seq, last = self.seq, self.occurrence == "last"
        stop = len(seq) - 1
        for end in range(self._indexed_end, stop):
            for n, table in self._tables.items():
                start = end - n + 1
                if start < 0:
                    continue
                key = tuple(seq[start:end + 1])
                if last:
                    table[key] = start
                else:
                    table.setdefault(key, start)
        self._indexed_end = max(self._indexed_end, stop)

    def lookup(self, max_tokens: int) -> list:
        """The chain of at most ``max_tokens`` tokens (a list, maybe empty)."""
        seq, length = self.seq, len(self.seq)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            start = self._tables[n].get(tuple(seq[length - n:]))
            if start is not None:
                begin = start + n
                return seq[begin:min(begin + max_tokens, length)]
        return []

    def propose(self, max_nodes: int) -> DraftTree:
        chain = self.lookup(max_nodes)
        return DraftTree.chain(chain, source_names=("prompt-lookup",)) if chain else _EMPTY


class OracleChain:
    """The best single chain a copy-based drafter could propose: the longest
    prefix (at most ``max_nodes`` tokens) of the true continuation that occurs
    verbatim, as a whole, inside prompt + output so far.

    Obviously correct rather than clever: the candidate start positions are
    those holding the continuation's first token; each further token keeps the
    candidates whose next position matches (and lies inside the sequence).

    ``anchor`` > 0 restricts the copy to sources preceded by the context's last
    ``anchor`` tokens: the bound for a drafter that continues a suffix match of
    at least that length, with unlimited width (any occurrence, any branch).
    """

    def __init__(self, truth, anchor: int = 0):
        self.truth = np.asarray(truth, dtype=np.int64)
        self.anchor = int(anchor)
        self.seq = np.zeros(0, dtype=np.int64)
        self.pos = 0  # output tokens accepted so far

    def start(self, prompt_ids) -> None:
        prompt = np.asarray(prompt_ids, dtype=np.int64)
        self.seq = np.empty(len(prompt) + len(self.truth), dtype=np.int64)
        self.seq[:len(prompt)] = prompt
        self.length = len(prompt)
        self.pos = 0

    def accept(self, tokens) -> None:
        tokens = np.asarray(tokens, dtype=np.int64)
        expected = self.truth[self.pos:self.pos + len(tokens)]
        if not np.array_equal(tokens, expected):
            raise ValueError("OracleChain.accept: tokens differ from the true continuation")
        self.seq[self.length:self.length + len(tokens)] = tokens
        self.length += len(tokens)
        self.pos += len(tokens)

    def match_length(self, max_tokens: int) -> tuple:
        """(length, start): the longest copied run and where it starts (-1: none)."""
        target = self.truth[self.pos:self.pos + max_tokens]
        seq = self.seq[:self.length]
        if len(target) == 0:
            return 0, -1
        cand = np.flatnonzero(seq == target[0])
        if self.anchor:
            a = self.anchor
            if self.length < a:
                return 0, -1
            cand = cand[cand >= a]
            for back in range(1, a + 1):
                cand = cand[seq[cand - back] == seq[self.length - back]]
        if cand.size == 0:
            return 0, -1
        best = 1
        for d in range(1, len(target)):
            still = cand[cand + d < self.length]
            still = still[seq[still + d] == target[d]]
            if still.size == 0:
                break
            cand, best = still, d + 1
        return best, int(cand[-1])

    def propose(self, max_nodes: int) -> DraftTree:
        n, _ = self.match_length(max_nodes)
        if n == 0:
            return _EMPTY
        return DraftTree.chain(self.truth[self.pos:self.pos + n], source_names=("oracle",))


# ---------------------------------------------------------------- ArcticInference

def arctic_available() -> bool:
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except Exception:
        return False
    return True


class ArcticSuffix:
    """ArcticInference's SuffixDecodingCache as a drafter: the per-request
    suffix tree over prompt + output (``start_request`` / ``add_active_response``)
    and ``speculate`` with its own defaults (max_spec_factor 1.0: the draft is at
    most as long as the matched suffix, min_token_prob 0.1) plus tree
    speculation and ``max_spec_tokens = max_nodes``.

    ``max_tree_depth`` bounds match + draft length (the context passed to
    ``speculate`` is cut to it): 64 caps drafts near 32 tokens; 128 (the default
    here) lets k = 64 drafts through. Depth 128 with ``max_spec_factor`` 1.0 drafted
    best on the edits workload (benchmarks/RESULTS.md section 3; the settings
    compared: CHANGELOG.md, "Benchmark history").
    ``global_docs`` (token arrays) are added to the global tree as finished
    responses (how Arctic learns from other requests)."""

    _next_id = 0

    def __init__(self, global_docs=(), max_tree_depth: int = 128, max_spec_factor: float = 1.0,
                 min_token_prob: float = 0.1, use_tree_spec: bool = True):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cache = SuffixDecodingCache(max_tree_depth=max_tree_depth, max_cached_requests=100000)
        self.kw = dict(max_spec_factor=max_spec_factor, min_token_prob=min_token_prob,
                       use_tree_spec=use_tree_spec)
        for doc in global_docs:
            rid = self._new_id()
            self.cache.start_request(rid, np.zeros(0, dtype=np.int32))
            self.cache.add_active_response(rid, np.asarray(doc, dtype=np.int32))
            self.cache.stop_request(rid)
        self.rid = None
        self.depth = max_tree_depth

    @classmethod
    def _new_id(cls):
        cls._next_id += 1
        return f"r{cls._next_id}"

    def start(self, prompt_ids) -> None:
        if self.rid is not None:
            self.cache.stop_request(self.rid)
        self.rid = self._new_id()
        self.seq = [int(t) for t in np.asarray(prompt_ids).tolist()]
        self.cache.start_request(self.rid, np.asarray(prompt_ids, dtype=np.int32))

    def accept(self, tokens) -> None:
        tokens = np.asarray(tokens, dtype=np.int32)
        self.seq.extend(tokens.tolist())
        self.cache.add_active_response(self.rid, tokens)

    def propose(self, max_nodes: int) -> DraftTree:
        context = np.asarray(self.seq[-self.depth:], dtype=np.int32)
        draft = self.cache.speculate(self.rid, context,
                                     max_spec_tokens=max_nodes, **self.kw)
        if not draft.token_ids:
            return _EMPTY
        return DraftTree(np.asarray(draft.token_ids), np.asarray(draft.parents),
                         np.asarray(draft.probs, dtype=np.float32), source_names=("arctic",))


class CursorLookup:
    """Experimental: n-gram lookup with a locality prior, to measure what a
    "copy cursor" would win on edits (not a published method).

    The cursor is the source position just after the last accepted copied
    token. A proposal takes the longest trailing n-gram (n in ``ngrams``) that
    occurred before, and among its occurrences the one whose continuation
    starts nearest the cursor (instead of the last or the most frequent one).
    When nothing matches, or only a short n-gram (< ``min_anchor``) matches far
    (> ``window`` tokens) from the cursor, it proposes the source text at the
    cursor itself ("skip ahead": after an insertion the original resumes there).
    One chain of ``max_nodes`` tokens.
    """

    def __init__(self, ngrams=(1, 2, 3, 4, 6, 8, 12, 16), min_anchor: int = 3, window: int = 256,
                 skip_ahead: bool = True):
        self.ngrams = tuple(sorted(ngrams, reverse=True))
        self.min_anchor, self.window, self.skip_ahead = min_anchor, window, skip_ahead

    def start(self, prompt_ids) -> None:
        self.seq = [int(t) for t in np.asarray(prompt_ids).tolist()]
        self.tables = {n: {} for n in self.ngrams}
        self.indexed_end = 0
        self.cursor = None
        self.last = None  # (continuation start, chain)
        self._index()

    def _index(self) -> None:
        seq, stop = self.seq, len(self.seq) - 1
        for end in range(self.indexed_end, stop):
            for n, table in self.tables.items():
                start = end - n + 1
                if start >= 0:
                    table.setdefault(tuple(seq[start:end + 1]), []).append(start + n)
        self.indexed_end = max(self.indexed_end, stop)

    def accept(self, tokens) -> None:
        tokens = [int(t) for t in np.asarray(tokens).tolist()]
        if self.last is not None:
            begin, chain = self.last
            acc = 0
            while acc < min(len(chain), len(tokens)) and chain[acc] == tokens[acc]:
                acc += 1
            self.cursor = begin + acc
            # the bonus token continued the source too: move past it
            if acc < len(tokens) and self.cursor < len(self.seq) and self.seq[self.cursor] == tokens[acc]:
                self.cursor += 1
        self.seq.extend(tokens)
        self._index()

    def _choose(self):
        seq, length = self.seq, len(self.seq)
        for n in self.ngrams:
            if n >= length:
                continue
            conts = self.tables[n].get(tuple(seq[length - n:]))
            if not conts:
                continue
            if self.cursor is None:
                return n, conts[-1]
            best = min(conts, key=lambda c: (abs(c - self.cursor), -c))
            if n < self.min_anchor and abs(best - self.cursor) > self.window and self.skip_ahead:
                return 0, self.cursor
            return n, best
        if self.skip_ahead and self.cursor is not None:
            return 0, self.cursor
        return 0, None

    def propose(self, max_nodes: int) -> DraftTree:
        _, begin = self._choose()
        self.last = None
        if begin is None or begin >= len(self.seq) - 1:
            return _EMPTY
        chain = self.seq[begin:min(begin + max_nodes, len(self.seq))]
        self.last = (begin, chain)
        return DraftTree.chain(chain, source_names=("cursor-lookup",)) if chain else _EMPTY


# ---------------------------------------------------------------- REST DraftRetriever

def draftretriever_available() -> bool:
    try:
        import draftretriever  # noqa: F401
    except Exception:
        return False
    return True


class DraftRetrieverProposer:
    """The PyPI ``draftretriever`` (0.1.1) Reader as a drafter, searched with the
    last ``tail`` tokens of the context. That build is not REST's suffix array
    (its binary embeds ``src/mcts_sub.rs``): its datastore is a table bigram ->
    top-12 next tokens, a search runs MCTS from the trailing bigram, and every
    search adds the query's last 16 tokens' 3-grams to the table (so the Reader
    learns from the context; share a Reader only knowingly).
    ``search(..., choices=max_nodes)`` returns paths (padded with -2), merged
    here into one trie of at most ``max_nodes`` nodes."""

    def __init__(self, reader, tail: int = 64):
        self.reader, self.tail = reader, tail
        self.seq: list = []

    def start(self, prompt_ids) -> None:
        self.seq = [int(t) for t in np.asarray(prompt_ids).tolist()]

    def accept(self, tokens) -> None:
        self.seq.extend(int(t) for t in np.asarray(tokens).tolist())

    def propose(self, max_nodes: int) -> DraftTree:
        if max_nodes <= 0:
            return _EMPTY
        paths = self.reader.search(self.seq[-self.tail:], choices=max_nodes)[0]
        paths = [list(itertools.takewhile(lambda tok: tok >= 0, path)) for path in paths]  # -1: padding
        return DraftTree.from_paths(paths, max_nodes, source_names=("draftretriever",))
