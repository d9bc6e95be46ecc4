"""Several corpus index files queried as one corpus (docs/SHARDING.md)."""

from __future__ import annotations

import threading

import numpy as np

from refdec.drafting.index.corpus import CorpusIndex
from refdec.drafting.retrieval import DocumentSignatures, Retriever
from refdec.tokens import as_token_ids, check_int

__all__ = ["ShardedIndex"]

_ALL = 2**62  # "every child" for next_tokens

class ShardedIndex:
    """Several :class:`CorpusIndex` shards queried as one corpus (the
    documents of shard 0, then those of shard 1, ...): for a corpus larger
    than one index file, or one machine's build memory (see docs/SHARDING.md).

    Answers equal those of one index built over all the documents:
    ``match_length`` is the maximum over shards, ``count`` the sum,
    ``next_tokens`` merges the per-token counts, ``continuation`` follows the
    most frequent merged branch (handing over to the one shard that still
    holds the text as soon as only one does). Shards must share the vocabulary
    size and tokenizer fingerprint (else ValueError naming both). Read-only and
    thread-safe like its shards.

    ``Proposer(index=sharded)`` drafts from every shard as one corpus: a matcher per
    shard, the longest match over them, and at each draft node the continuation counts
    of the shards where the text occurs summed: the same tree as one index over all the
    documents. :meth:`retriever` serves the shards' MinHash signatures as one set.
    """

    def __init__(self, shards) -> None:
        shards = list(shards)
        if not shards or not all(isinstance(s, CorpusIndex) for s in shards):
            raise ValueError("shards must be a non-empty list of CorpusIndex, got "
                             f"{[type(s).__name__ for s in shards]!r}")
        first = shards[0]
        for i, shard in enumerate(shards[1:], 1):
            if shard.fingerprint and first.fingerprint and shard.fingerprint != first.fingerprint:
                raise ValueError(f"shards[{i}] tokenizer fingerprint {shard.fingerprint} differs from "
                                 f"shards[0]'s {first.fingerprint}")
            if shard.vocab_size and first.vocab_size and shard.vocab_size != first.vocab_size:
                raise ValueError(f"shards[{i}] vocab_size {shard.vocab_size} differs from shards[0]'s "
                                 f"{first.vocab_size}")
        self.shards = shards
        self._retriever = None               # refdec.drafting.retrieval.Retriever, made on first use
        self._lazy_lock = threading.Lock()   # guards _retriever (shared between threads)

    @classmethod
    def load_many(cls, paths, tokenizer=None) -> "ShardedIndex":
        """Memory-maps every index file (IndexFormatError as :meth:`CorpusIndex.load`)."""
        return cls([CorpusIndex.load(p, tokenizer) for p in paths])

    def match_length(self, tokens) -> int:
        tokens = as_token_ids(tokens)
        return max(s.match_length(tokens) for s in self.shards)

    def count(self, tokens) -> int:
        tokens = as_token_ids(tokens)
        return sum(s.count(tokens) for s in self.shards)

    def _merged_next(self, tokens, k: int) -> list[tuple[int, int]]:
        merged: dict[int, int] = {}
        for shard in self.shards:
            for token, c in shard.next_tokens(tokens, _ALL):
                merged[token] = merged.get(token, 0) + c
        return sorted(merged.items(), key=lambda tc: (-tc[1], tc[0]))[:k]

    def next_tokens(self, tokens, k: int) -> list[tuple[int, int]]:
        return self._merged_next(as_token_ids(tokens), check_int("k", k, 0))

    def continuation(self, tokens, length: int) -> np.ndarray:
        tokens = as_token_ids(tokens)
        length = check_int("length", length, 0)
        out: list[int] = []
        while len(out) < length:
            query = np.concatenate([tokens, np.asarray(out, dtype=np.int32)])
            holders = [s for s in self.shards if s.count(query) > 0] if query.size else self.shards
            if len(holders) == 1:  # the merged counts are this shard's from here on
                out.extend(holders[0].continuation(query, length - len(out)).tolist())
                break
            best = self._merged_next(query, 1)
            if not best:
                break
            out.append(best[0][0])
        return np.asarray(out, dtype=np.int32)

    def verify(self) -> bool:
        return all(s.verify() for s in self.shards)

    def retriever(self):
        """The ``refdec.drafting.retrieval.Retriever`` over the documents of all the shards (``doc_idx``
        as :meth:`document` numbers them), from the shards' MinHash signatures (made once).
        Raises ValueError naming the shard that has no signatures, or whose signatures were
        made with other MinHash settings than shard 0's."""
        if self._retriever is not None:
            return self._retriever
        with self._lazy_lock:
            if self._retriever is None:
                self._retriever = self._make_retriever()
        return self._retriever

    def _make_retriever(self):
        signatures = []
        for i, shard in enumerate(self.shards):
            sigs = shard.signatures
            if sigs is None:
                where = f"loaded from {shard.path!r}" if shard.path else "built in memory"
                raise ValueError(f"shards[{i}] ({where}) has no MinHash signatures for retrieval; rebuild it with "
                                 "`refdec index build` (writes them by default) or CorpusIndex.build(..., "
                                 "signatures=True) and save it")
            settings = (sigs.num_perm, sigs.seed, sigs.ngram)
            if signatures and settings != (signatures[0].num_perm, signatures[0].seed, signatures[0].ngram):
                raise ValueError(f"shards[{i}] MinHash signatures have (num_perm, seed, ngram) = {settings}, "
                                 f"shards[0]'s {(signatures[0].num_perm, signatures[0].seed, signatures[0].ngram)}")
            signatures.append(sigs)
        return Retriever(DocumentSignatures.concatenate(signatures), self.document)

    @property
    def automata(self) -> tuple:
        """The shards' frozen automata (``refdec._C.FrozenIndex``), in shard order: what a
        Proposer matches and drafts from, as one corpus."""
        return tuple(s.automaton for s in self.shards)

    def document(self, doc_idx: int) -> np.ndarray:
        doc_idx = check_int("doc_idx", doc_idx)
        n = self.num_documents
        if not -n <= doc_idx < n:
            raise ValueError(f"doc_idx must be in [0, {n}), got {doc_idx}")
        doc_idx %= n
        for shard in self.shards:
            if doc_idx < shard.num_documents:
                return shard.document(doc_idx)
            doc_idx -= shard.num_documents
        raise AssertionError("unreachable")

    def __len__(self) -> int:
        return sum(len(s) for s in self.shards)

    @property
    def num_documents(self) -> int:
        return sum(s.num_documents for s in self.shards)

    @property
    def vocab_size(self) -> int:
        return max(s.vocab_size for s in self.shards)

    @property
    def fingerprint(self) -> str | None:
        return next((s.fingerprint for s in self.shards if s.fingerprint), None)

    def __repr__(self) -> str:
        return f"ShardedIndex({len(self.shards)} shards, {len(self)} tokens, {self.num_documents} documents)"

