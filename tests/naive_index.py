"""A naive, obviously-correct reference for the index queries.

Everything here is brute force over the stored documents (every start
position, every length), so it is only fit for the tiny inputs that the
property tests draw. It states the query contract of ``refdec.drafting.index``:

- an *occurrence* of a token run ``q`` is a pair ``(doc_idx, token_pos)`` with
  ``doc[token_pos : token_pos + len(q)] == q``: it lies inside ONE document;
- ``match_length(q)``: the length of the longest suffix of ``q`` that occurs;
- ``count(q)``: the number of occurrences of ``q``;
- ``next_tokens(q, k)``: for each token ``t``, ``count(q + [t])``; the ``k``
  largest, most frequent first, ties by smaller token id; zero counts omitted;
- ``continuation(q, length)``: ``doc[token_pos + len(q) :][:length]`` for ONE
  occurrence (so it never crosses a document end); empty if ``q`` never occurs.

The empty run ``[]`` occurs at every position ``0 <= token_pos <= len(doc)``
of every document, so ``next_tokens([], k)`` is the token frequency table;
by convention ``count([])`` is the number of token positions, ``len(index)``.

``NaiveContext`` is the live-context variant: the context is one document that
grows, and ``current_match_length`` is the longest suffix of the context that
occurred *earlier with a continuation*, i.e. the longest suffix of
``context`` occurring in ``context[:-1]``.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence


def _as_list(tokens: Iterable[int]) -> list[int]:
    return [int(t) for t in tokens]


class NaiveIndex:
    """Brute-force reference over a list of documents (lists of token ids)."""

    def __init__(self, documents: Iterable[Sequence[int]] = ()) -> None:
        self.documents: list[list[int]] = [_as_list(doc) for doc in documents]

    # -- bookkeeping ---------------------------------------------------------
    def __len__(self) -> int:
        return sum(len(doc) for doc in self.documents)

    @property
    def num_documents(self) -> int:
        return len(self.documents)

    def add_documents(self, documents: Iterable[Sequence[int]]) -> None:
        self.documents.extend(_as_list(doc) for doc in documents)

    # -- occurrences ---------------------------------------------------------
    def occurrences(self, tokens: Sequence[int]) -> list[tuple[int, int]]:
        """Every ``(doc_idx, token_pos)`` where ``tokens`` starts, in document order."""
        query = _as_list(tokens)
        m = len(query)
        found = []
        for doc_idx, doc in enumerate(self.documents):
            for token_pos in range(len(doc) - m + 1):
                if doc[token_pos : token_pos + m] == query:
                    found.append((doc_idx, token_pos))
        return found

    def occurs(self, tokens: Sequence[int]) -> bool:
        return bool(self.occurrences(tokens))

    # -- the queries ---------------------------------------------------------
    def match_length(self, tokens: Sequence[int]) -> int:
        query = _as_list(tokens)
        for length in range(len(query), 0, -1):
            if self.occurs(query[len(query) - length :]):
                return length
        return 0

    def count(self, tokens: Sequence[int]) -> int:
        if not len(tokens):
            return len(self)  # convention: the empty run counts once per token position
        return len(self.occurrences(tokens))

    def next_counts(self, tokens: Sequence[int]) -> Counter:
        """Counter token -> number of occurrences of ``tokens`` followed by it."""
        query = _as_list(tokens)
        m = len(query)
        counts: Counter = Counter()
        for doc_idx, token_pos in self.occurrences(query):
            doc = self.documents[doc_idx]
            if token_pos + m < len(doc):
                counts[doc[token_pos + m]] += 1
        return counts

    def next_tokens(self, tokens: Sequence[int], k: int) -> list[tuple[int, int]]:
        ranked = sorted(self.next_counts(tokens).items(), key=lambda item: (-item[1], item[0]))
        return [(int(token), int(n)) for token, n in ranked[: max(k, 0)]]

    def continuations(self, tokens: Sequence[int], length: int) -> list[list[int]]:
        """Every valid answer of ``continuation(tokens, length)``: one per occurrence."""
        query = _as_list(tokens)
        m = len(query)
        answers = []
        for doc_idx, token_pos in self.occurrences(query):
            doc = self.documents[doc_idx]
            answers.append(doc[token_pos + m : token_pos + m + max(length, 0)])
        return answers

    def is_valid_continuation(self, tokens: Sequence[int], length: int, answer: Sequence[int]) -> bool:
        answer = _as_list(answer)
        valid = self.continuations(tokens, length)
        if not valid:
            return answer == []
        return answer in valid


class NaiveContext(NaiveIndex):
    """The live context: one growing document."""

    def __init__(self, tokens: Iterable[int] = ()) -> None:
        super().__init__([_as_list(tokens)])

    @property
    def tokens(self) -> list[int]:
        return self.documents[0]

    def extend(self, tokens: Iterable[int]) -> None:
        self.documents[0].extend(_as_list(tokens))

    @property
    def current_match_length(self) -> int:
        """Longest suffix of the context that occurs earlier followed by some token."""
        context = self.tokens
        earlier = NaiveIndex([context[:-1]])
        return earlier.match_length(context)


def occurs_in(haystack: Sequence[int], needle: Sequence[int]) -> bool:
    """Whether ``needle`` is a contiguous run of ``haystack``."""
    haystack = _as_list(haystack)
    needle = _as_list(needle)
    m = len(needle)
    return any(haystack[i : i + m] == needle for i in range(len(haystack) - m + 1))


def assert_loaded_like_built(loaded, built, docs) -> None:
    """A loaded index file holds what the index it was saved from held: the body checksum
    verifies, and the sizes, vocabulary, tokenizer fingerprint and every document are equal."""
    assert loaded.verify()
    assert len(loaded) == len(built)
    assert loaded.num_documents == built.num_documents
    assert loaded.vocab_size == built.vocab_size
    assert loaded.fingerprint == built.fingerprint
    for doc_idx, doc in enumerate(docs):
        assert loaded.document(doc_idx).tolist() == doc
