"""Token indexes: a frozen corpus index on disk and the live context index.

Both are suffix automata over int32 token ids (C++ core ``refdec._C``):

* :class:`CorpusIndex` -- built once from many documents, saved to one file
  and memory-mapped on load (no copy; milliseconds even for 100M tokens).
  A match or a continuation never crosses a document boundary.
* :class:`ContextIndex` -- the growing context of one request (prompt plus
  accepted tokens), one open document extended in O(1) amortised per token.

Queries (on both):

* ``match_length(tokens) -> int``: length of the longest suffix of ``tokens``
  that occurs in the index.
* ``count(tokens) -> int``: occurrences of ``tokens`` as a contiguous run inside
  one document; ``count([])`` is the number of token positions, ``len(index)``.
* ``next_tokens(tokens, k) -> list[(token, count)]``: up to ``k`` tokens that
  follow occurrences of ``tokens``, most frequent first, ties by smaller id.
* ``continuation(tokens, length) -> int32 array``: the tokens that follow one
  occurrence of ``tokens`` (the most frequent branch at each step), at most
  ``length``, never crossing a document end; empty when ``tokens`` does not
  occur or only ends documents.

Token ids must be in ``[0, 2**31)``, else ``ValueError`` naming the value; ids
at or above the index's ``vocab_size`` are simply not found.

An empty corpus (no documents, or only empty ones) is a valid index that
answers "no match" everywhere (``match_length`` 0, ``count`` 0, no next
tokens, empty continuations); it saves and loads. ``refdec index build``
refuses to write one (an error naming why no document was read).

Thread-safety:

* :class:`CorpusIndex` and :class:`ShardedIndex` -- thread-safe for queries.
  ``build`` and ``add_documents`` freeze the index before returning; queries
  then read the frozen arrays only (no cache, nothing mutable), so any number
  of threads may query one index and share it between Proposers. The C++
  calls (queries, build, freeze, verify, load) release the GIL.
  ``add_documents`` must not run concurrently with anything else on the
  same index.
* :class:`ContextIndex` -- NOT thread-safe: it grows, and its occurrence
  counts are recomputed lazily inside queries. One per request.
* :class:`refdec.Proposer` -- NOT thread-safe (it owns a ContextIndex and
  matcher state): one per request; the CorpusIndex it reads may be shared.

Limits: fewer than 2**31 - 1 tokens per index, and internal states + tokens
< 2**31 (about 1.4 billion tokens of text); beyond that, shard
(:class:`ShardedIndex`, docs/SHARDING.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import weakref
from collections.abc import Iterable

import numpy as np
from tqdm.auto import tqdm

from refdec import _C
from refdec.atomic import atomic_write
from refdec.drafting.retrieval import DocumentSignatures, Retriever, deduplicate
from refdec.tokens import MAX_TOKEN_ID, as_token_ids, check_int, is_int

__all__ = ["IndexFormatError", "tokenizer_fingerprint", "CorpusIndex", "ContextIndex", "ShardedIndex"]


# An index file is not valid (a ValueError): declared in C++ (csrc/frozen_index.h), raised by
# FrozenIndex.load and by CorpusIndex.load for a tokenizer mismatch.
IndexFormatError = _C.IndexFormatError


_FINGERPRINTS: dict[int, tuple] = {}  # id(tokenizer) -> (weakref, len(tokenizer), fingerprint)


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 hex (64 chars) of the tokenizer's sorted vocabulary (token, id) items
    and its special tokens; stable across processes and machines. Memoised per
    tokenizer object (and its length) since hashing a 262k vocabulary takes ~1 s. A tokenizer
    with a ``fingerprint()`` method (a GGUF model's, refdec.llama_cpp.tokenizer) gives its own."""
    own = getattr(tokenizer, "fingerprint", None)
    if callable(own):
        return own()
    key = id(tokenizer)
    cached = _FINGERPRINTS.get(key)
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else None
    if cached is not None and cached[0]() is tokenizer and cached[1] == size:
        return cached[2]
    fingerprint = _compute_fingerprint(tokenizer)
    try:
        _FINGERPRINTS[key] = (weakref.ref(tokenizer), size, fingerprint)
    except TypeError:  # not weak-referenceable: no memo
        pass
    return fingerprint


def _compute_fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: (item[1], item[0]))
    special = sorted(str(t) for t in getattr(tokenizer, "all_special_tokens", []) or [])
    payload = json.dumps({"vocab": vocab, "special": special}, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _stored_signatures(frozen, path: str | None):
    """The MinHash signatures stored in a frozen index (``DocumentSignatures`` over read-only
    views of its image), or None."""
    info = frozen.minhash
    if info is None:
        return None
    try:
        return DocumentSignatures(info["values"], info["sizes"], num_perm=info["num_perm"], seed=info["seed"],
                                  ngram=info["ngram"])
    except ValueError as err:
        raise IndexFormatError(f"index file {path!r}: invalid MinHash signatures: {err}") from None


class _Queries:
    """The four queries over ``self._view()`` (an ``_C.AutomatonView``)."""

    def _view(self):  # pragma: no cover - overridden
        raise NotImplementedError

    def match_length(self, tokens) -> int:
        """Length of the longest suffix of ``tokens`` that occurs in the index."""
        return int(self._view().match_length(as_token_ids(tokens)))

    def count(self, tokens) -> int:
        """Occurrences of ``tokens`` inside one document; ``count([]) == len(self)``."""
        return int(self._view().count(as_token_ids(tokens)))

    def next_tokens(self, tokens, k: int) -> list[tuple[int, int]]:
        """Up to ``k`` (token, count) pairs following ``tokens``; most frequent first, ties by smaller token."""
        return [(int(t), int(c)) for t, c in self._view().next_tokens(as_token_ids(tokens), check_int("k", k, 0))]

    def continuation(self, tokens, length: int) -> np.ndarray:
        """int32 array of shape (<= length,): tokens that follow one occurrence of ``tokens``."""
        return self._view().continuation(as_token_ids(tokens), check_int("length", length, 0))


_TOKENIZE_BATCH = 256


def _tokenize_documents(documents, tokenizer, vocab_size: int, show_progress: bool):
    """Yields int32 arrays, one per document (str documents are tokenised in
    batches of 256 with ``add_special_tokens=False``)."""
    progress = None
    if show_progress:
        total = len(documents) if hasattr(documents, "__len__") else None
        progress = tqdm(total=total, desc="indexing", unit="doc")

    def check(doc_idx, ids):
        arr = as_token_ids(ids, f"documents[{doc_idx}]")
        if vocab_size and arr.size and int(arr.max()) >= vocab_size:
            bad = int(np.nonzero(arr >= vocab_size)[0][0])
            raise ValueError(
                f"documents[{doc_idx}][{bad}] = {int(arr[bad])} is not below the vocabulary size {vocab_size}"
            )
        return arr

    def flush(batch):
        texts = [doc for _, doc in batch if isinstance(doc, str)]
        encoded = iter(tokenizer(texts, add_special_tokens=False)["input_ids"]) if texts else iter(())
        for doc_idx, doc in batch:
            yield check(doc_idx, next(encoded) if isinstance(doc, str) else doc)
        if progress is not None:
            progress.update(len(batch))

    try:
        batch = []
        for doc_idx, doc in enumerate(documents):
            if isinstance(doc, str) and tokenizer is None:
                raise ValueError(
                    f"documents[{doc_idx}] is a str but no tokenizer was given: pass tokenizer=... "
                    "or give token id sequences"
                )
            batch.append((doc_idx, doc))
            if len(batch) >= _TOKENIZE_BATCH:
                yield from flush(batch)
                batch = []
        yield from flush(batch)
    finally:
        if progress is not None:
            progress.close()


class CorpusIndex(_Queries):
    """A corpus of documents indexed by a suffix automaton, frozen into one
    memory-mappable file.

    Build with :meth:`build` (and grow with :meth:`add_documents`), then
    :meth:`save`; open with :meth:`load`. See the module docstring for the
    queries and thread-safety.
    """

    def __init__(self, *, _sam=None, _frozen=None, fingerprint: str | None = None, vocab_size: int = 0,
                 path: str | None = None) -> None:
        self._sam = _sam          # _C.SuffixAutomaton while the index can grow (built), else None
        self._frozen = _frozen    # _C.FrozenIndex answering queries (None while stale)
        self._fingerprint = fingerprint or None
        self._vocab_size = int(vocab_size or 0)
        self._path = path
        self.dropped_documents = 0  # near-duplicates dropped by build(dedup_threshold=...)
        self._signatures = None     # refdec.drafting.retrieval.DocumentSignatures, one row per document
        self._retriever = None      # refdec.drafting.retrieval.Retriever, made on first use
        self._lazy_lock = threading.RLock()  # guards the lazy _signatures / _retriever (shared between threads)

    # ------------------------------------------------------------------ build / load

    @classmethod
    def build(cls, documents: Iterable, tokenizer=None, *, show_progress: bool = True,
              vocab_size: int | None = None, growable: bool = True, dedup_threshold: float | None = None,
              signatures: bool | None = None) -> "CorpusIndex":
        """Indexes ``documents``: str (tokenised with ``tokenizer``,
        ``add_special_tokens=False``) or sequences / int arrays of token ids.
        ``vocab_size`` defaults to ``len(tokenizer)`` (0 = unknown).

        ``growable=False`` frees the build structures while freezing (peak
        memory about the automaton alone instead of automaton plus frozen
        image, and afterwards only the frozen image stays resident);
        :meth:`add_documents` then raises. Use it to build an index to save.

        Memory (``growable=False``, source code): about 92 bytes per token at
        the peak (56M stdlib tokens: 5.2 GiB; benchmarks/memory_bench.py), so
        about 280M tokens per 24 GiB; the saved file is about 24 bytes per
        token and is memory-mapped on load (nothing resident until queried).

        Retrieval (``refdec.drafting.retrieval``): ``dedup_threshold`` (a float in
        (0, 1], e.g. 0.9) drops exact and near-duplicate documents (shingle
        Jaccard >= threshold with an earlier kept one) before indexing; their
        number is ``dropped_documents``. ``signatures`` (default: True when
        de-duplicating) keeps the kept documents' MinHash signatures, which
        :meth:`save` stores in the index file and :meth:`retriever` serves to
        ``generate(..., retrieve=k)``. Both hold the tokenised documents in
        memory once (4 bytes per token) and cost about 0.2 s per million
        tokens (benchmarks/retrieval_bench.py)."""
        if vocab_size is None:
            vocab_size = len(tokenizer) if tokenizer is not None else 0
        vocab_size = check_int("vocab_size", vocab_size, 0, MAX_TOKEN_ID + 1)
        if isinstance(documents, (str, bytes)):
            raise ValueError("documents must be an iterable of documents, got a single str")
        fingerprint = tokenizer_fingerprint(tokenizer) if tokenizer is not None else None
        index = cls(_sam=_C.SuffixAutomaton(), fingerprint=fingerprint, vocab_size=vocab_size)
        if signatures is None:
            signatures = dedup_threshold is not None
        if dedup_threshold is not None or signatures:
            documents = list(_tokenize_documents(documents, tokenizer, vocab_size, show_progress))
            sigs = DocumentSignatures.from_documents(documents)
            if dedup_threshold is not None:
                kept, index.dropped_documents = deduplicate(documents, dedup_threshold, signatures=sigs)
                documents = [documents[i] for i in kept.tolist()]
                sigs = sigs.take(kept)
            index._signatures = sigs if signatures else None
            show_progress = False
        index._add(documents, tokenizer, show_progress, release=not growable)
        return index

    def add_documents(self, documents: Iterable, tokenizer=None, *, show_progress: bool = False) -> None:
        """Adds documents to an index built in this process (a loaded index is read-only).

        All or nothing: every document is tokenised and checked first, so a bad
        one (ValueError naming it) leaves the index as it was."""
        if self._sam is None:
            where = f"loaded from {self._path!r}" if self._frozen is not None and self._frozen.is_mapped else (
                "built with growable=False")
            raise ValueError(
                f"cannot add documents to an index {where}: it is frozen (read-only); "
                "rebuild it with CorpusIndex.build"
            )
        if isinstance(documents, (str, bytes)):
            raise ValueError("documents must be an iterable of documents, got a single str")
        if tokenizer is not None and self._fingerprint is not None:
            fp = tokenizer_fingerprint(tokenizer)
            if fp != self._fingerprint:
                raise ValueError(f"tokenizer fingerprint {fp} differs from the index's {self._fingerprint}")
        documents = list(_tokenize_documents(documents, tokenizer, self._vocab_size, show_progress))
        if self._signatures is not None:  # keep one signature row per document (no de-duplication here)
            old = self._signatures
            new = DocumentSignatures.from_documents(documents, num_perm=old.num_perm, seed=old.seed, ngram=old.ngram)
            self._signatures = DocumentSignatures.concatenate([old, new])
            self._retriever = None
        self._add(documents, tokenizer, False)

    def _add(self, documents, tokenizer, show_progress: bool, release: bool = False) -> None:
        self._frozen = None
        # Token ids given as arrays: reserve for the total once (address space
        # only), instead of growing (and copying) the arrays geometrically.
        if isinstance(documents, (list, tuple)) and all(isinstance(d, np.ndarray) for d in documents):
            self._sam.reserve(int(sum(d.size for d in documents)))
        for arr in _tokenize_documents(documents, tokenizer, self._vocab_size, show_progress):
            self._sam.add_document(arr)
        # Freeze now: queries then only read immutable arrays (safe from several threads).
        if release:
            try:
                self._frozen = self._freeze(release=True)
            finally:
                self._sam = None  # released by the freeze, even when it fails
        else:
            self._frozen_index()

    @classmethod
    def load(cls, path, tokenizer=None) -> "CorpusIndex":
        """Memory-maps an index file (no copy). Raises IndexFormatError for an
        invalid file, or when ``tokenizer``'s fingerprint differs from the one
        stored in the file (a file without a fingerprint is accepted).

        Load validates the header and every section's bounds (O(documents));
        the body is checksummed only by :meth:`verify` (O(file)): a corrupt
        body gives wrong answers, never a crash or a read outside the file.
        Replace an index file that others may have mapped by renaming a new
        file over it (as :meth:`save` and ``refdec index build`` do): readers
        keep the old file. Never overwrite it in place (``cp new old``,
        ``open(old, "wb")``): a mapped reader would then see the bytes change
        under it, and reading a page past a shrunken end raises SIGBUS."""
        path = os.fspath(path)
        with open(path, "rb"):  # FileNotFoundError / PermissionError / IsADirectoryError as usual
            pass
        frozen = _C.FrozenIndex.load(path)
        stored = frozen.fingerprint or None
        if tokenizer is not None and stored is not None:
            fp = tokenizer_fingerprint(tokenizer)
            if fp != stored:
                raise IndexFormatError(
                    f"index file {path!r} was built with tokenizer fingerprint {stored}, "
                    f"but the given tokenizer has fingerprint {fp}"
                )
        return cls(_frozen=frozen, fingerprint=stored, vocab_size=frozen.vocab_size, path=path)

    def save(self, path) -> None:
        """Writes the index to ``path`` atomically (temporary file, fsync, rename,
        fsync of the folder; temporaries left by a killed save of the same path
        more than an hour ago are removed), with its MinHash signatures, if any."""
        path = os.fspath(path)
        atomic_write(path, [self._frozen_index().buffer()])
        self._path = path

    @property
    def signatures(self):
        """The documents' MinHash signatures (``refdec.drafting.retrieval.DocumentSignatures``),
        or None: kept by ``build(signatures=True)`` / de-duplication, or a loaded
        index file's (read-only views of the mapped file)."""
        if self._signatures is None and self._sam is None and self._frozen is not None:
            with self._lazy_lock:
                if self._signatures is None:
                    self._signatures = _stored_signatures(self._frozen, self._path)
        return self._signatures

    def retriever(self):
        """The ``refdec.drafting.retrieval.Retriever`` over this index's documents (made once).
        Raises ValueError when the index has no signatures."""
        if self._retriever is not None:
            return self._retriever
        with self._lazy_lock:  # made once even when several threads ask at the same time
            signatures = self.signatures
            if signatures is None:
                old = f"{self._path}.minhash" if self._path else None
                if old is not None and os.path.exists(old):  # written by refdec before the MinHash sections
                    raise ValueError(f"{old}: this index's MinHash signatures are in a separate file, which "
                                     "refdec no longer reads (they are stored in the index file now); rebuild "
                                     f"{self._path} with `refdec index build` and delete {old}")
                where = f"index file {self._path!r}" if self._path else "built without them"
                raise ValueError(f"this corpus index has no MinHash signatures for retrieval ({where}); rebuild it "
                                 "with `refdec index build` (writes them by default) or "
                                 "CorpusIndex.build(..., signatures=True) and save it")
            if self._retriever is None:
                self._retriever = Retriever(signatures, self.document)
        return self._retriever

    def _freeze(self, release: bool = False):
        """The automaton frozen with the signatures (``release``: see build's ``growable``)."""
        sigs, minhash = self._signatures, {}
        if sigs is not None:
            minhash = dict(minhash_values=sigs.matrix, minhash_sizes=sigs.sizes, minhash_seed=sigs.seed,
                           minhash_ngram=sigs.ngram)
        return _C.FrozenIndex.freeze(self._sam, self._fingerprint or "", self._vocab_size, release=release, **minhash)

    def verify(self) -> bool:
        """Recomputes the body checksum; False when the file is corrupt."""
        return bool(self._frozen_index().verify())

    # ------------------------------------------------------------------ properties

    @property
    def automaton(self):
        """The frozen automaton that answers queries and drafts (``refdec._C.FrozenIndex``, an
        ``AutomatonView``; the index freezes first if it grew). Read-only and shared: the
        Proposer matches against it."""
        return self._frozen_index()

    def _frozen_index(self):
        if self._frozen is None:
            self._frozen = self._freeze()
        return self._frozen

    def _view(self):
        return self._frozen_index()

    def __len__(self) -> int:
        """Tokens indexed."""
        return int(self._sam.num_tokens if self._sam is not None else self._frozen.num_tokens)

    @property
    def num_documents(self) -> int:
        return int(self._sam.num_documents if self._sam is not None else self._frozen.num_documents)

    @property
    def num_states(self) -> int:
        """States of the frozen automaton (internal states + one leaf id per token)."""
        return int(self._frozen_index().num_states)

    @property
    def vocab_size(self) -> int:
        """Vocabulary size the index was built for (0 = unknown)."""
        return self._vocab_size

    @property
    def fingerprint(self) -> str | None:
        """Tokenizer fingerprint (64 hex chars), None when built from ids without a tokenizer."""
        return self._fingerprint

    @property
    def path(self) -> str | None:
        """File the index was loaded from or last saved to, or None."""
        return self._path

    @property
    def nbytes(self) -> int:
        """Size in bytes of the frozen image (= the file size)."""
        return int(self._frozen_index().nbytes)

    @property
    def is_frozen(self) -> bool:
        """True for a loaded index (read-only)."""
        return self._sam is None

    def document(self, doc_idx: int) -> np.ndarray:
        """int32 array: the tokens of document ``doc_idx``."""
        doc_idx = check_int("doc_idx", doc_idx)
        n = self.num_documents
        if doc_idx < 0:
            doc_idx += n
        if not 0 <= doc_idx < n:
            raise ValueError(f"doc_idx must be in [0, {n}), got {doc_idx}")
        view = self._sam if self._sam is not None else self._frozen
        return view.document(doc_idx)

    def __repr__(self) -> str:
        where = f"path={self._path!r}" if self._path else ("in memory" if self._sam is not None else "")
        fp = (self._fingerprint[:12] + "…") if self._fingerprint else None
        return (f"CorpusIndex({len(self)} tokens, {self.num_documents} documents, vocab_size={self._vocab_size}, "
                f"fingerprint={fp}, {where})")


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


class ContextIndex(_Queries):
    """The live context of one request: one document that grows by
    :meth:`extend` in O(1) amortised per token. Not thread-safe."""

    def __init__(self, tokens=None) -> None:
        self._sam = _C.SuffixAutomaton()
        self._sam.start_document()
        if tokens is not None:
            self._sam.extend_many(as_token_ids(tokens))

    def _view(self):
        return self._sam

    @property
    def automaton(self):
        """The live automaton over the context (``refdec._C.SuffixAutomaton``, an
        ``AutomatonView``); it grows with :meth:`extend` (and a Proposer's ``accept``)."""
        return self._sam

    def extend(self, tokens) -> None:
        """Appends tokens (an int, or a sequence / int array of token ids)."""
        if is_int(tokens):
            tokens = [tokens]
        self._sam.extend_many(as_token_ids(tokens))

    def __len__(self) -> int:
        return int(self._sam.num_tokens)

    def tokens(self) -> np.ndarray:
        """int32 array: the whole context."""
        return self._sam.tokens()

    def match_state(self) -> tuple[int, int]:
        """(state, length): the longest suffix of the context that occurred
        earlier with a continuation (``link(last)`` of the automaton)."""
        state = int(self._sam.match_state())
        return state, int(self._sam.length(state))

    @property
    def current_match_length(self) -> int:
        """Length of that suffix (0: the last token never occurred before)."""
        return self.match_state()[1]

    def __repr__(self) -> str:
        return f"ContextIndex({len(self)} tokens, current_match_length={self.current_match_length})"
