"""The corpus index: documents indexed by a suffix automaton, frozen into one memory-mapped file
(refdec.drafting.index's docstring has the queries, thread-safety and limits)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

import numpy as np

from refdec import _C
from refdec.atomic import atomic_write
from refdec.drafting.index.documents import tokenize_documents, tokenizer_fingerprint
from refdec.drafting.index.queries import AutomatonQueries
from refdec.drafting.retrieval import DocumentSignatures, Retriever, deduplicate
from refdec.tokens import MAX_TOKEN_ID, check_int

__all__ = ["CorpusIndex", "IndexFormatError"]

# An index file is not valid (a ValueError): declared in C++ (csrc/frozen_index.h), raised by
# FrozenIndex.load and by CorpusIndex.load for a tokenizer mismatch.
IndexFormatError = _C.IndexFormatError


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



class CorpusIndex(AutomatonQueries):
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
            documents = list(tokenize_documents(documents, tokenizer, vocab_size, show_progress))
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
        documents = list(tokenize_documents(documents, tokenizer, self._vocab_size, show_progress))
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
        for arr in tokenize_documents(documents, tokenizer, self._vocab_size, show_progress):
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

