"""Near-duplicate removal and document retrieval with MinHash (datasketch).

* ``deduplicate`` drops exact and near-duplicate documents when a corpus index
  is built (``CorpusIndex.build(..., dedup_threshold=0.9)``, ``refdec index build --dedup``);
* ``Retriever.top_k`` finds the corpus documents most similar to a prompt, which
  ``generate(..., retrieve=k)`` adds to the request's references.

Both read ``DocumentSignatures``, one MinHash per document, which the corpus
index file stores in its MinHash sections (csrc/frozen_index.h), so a loaded
index retrieves without hashing its documents again.

Arrays:

    tokens / document / query_tokens   int32 [length]     token ids
    shingles(...)                      uint64 [n_unique]  sorted, unique shingle hashes
    DocumentSignatures.matrix          uint32 [num_docs, num_perm]
    DocumentSignatures.sizes           uint32 [num_docs]  distinct shingles per document
    deduplicate(...)[0]                int64 [num_kept]   kept document indices, ascending

Shingles. A document is the *set* of its token n-grams (n = ``DEFAULT_NGRAM`` =
3), each a 64-bit hash. A substituted token destroys the n shingles that cover
it, so at a fraction f of scattered substitutions Jaccard ~ (1 - n f) / (1 + n f):
with n = 3 a 1 % edit scores ~0.94 (a near-duplicate at 0.9) and 2 % ~0.89;
edits clustered in a few lines, the usual case for code, cost fewer shingles.
Below 3, token bigrams of code are dominated by ubiquitous pairs (``self .``,
``) :``). A document shorter than n tokens is one shingle (all its tokens and its
length); the empty document has none.

MinHash. datasketch's ``MinHash(num_perm=128, seed=1, scheme="affine32")`` over
the shingle hashes truncated to 32 bits (an identity ``hashfunc``): the same
signatures in every process and on every machine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from datasketch import LeanMinHash, MinHash, MinHashLSH

from refdec.tokens import as_token_ids, check_int

__all__ = ["DEFAULT_NGRAM", "DEFAULT_NUM_PERM", "DEFAULT_SEED", "DocumentSignatures", "Retriever", "deduplicate",
           "shingles"]

DEFAULT_NGRAM = 3
DEFAULT_NUM_PERM = 128
DEFAULT_SEED = 1
# Shingles per MinHash update and signatures per block of the retrieval scan: bounds the
# [rows, num_perm] temporaries (8 MiB and 2 MiB at 128 permutations).
_ROWS = 16384


def _fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer (a bijection), element-wise on uint64 (wrapping)."""
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xFF51AFD7ED558CCD)
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> np.uint64(33))


def _shingles(tokens: np.ndarray, n: int) -> np.ndarray:
    """uint64 [n_unique]: sorted unique n-gram hashes of validated int32 ``tokens``."""
    if tokens.size == 0:
        return np.zeros(0, dtype=np.uint64)
    width = min(n, tokens.size)
    count = tokens.size - width + 1
    t = tokens.astype(np.uint64)
    # The start value holds the width: a short document's one shingle is no n-gram of a longer one.
    h = np.full(count, (0x9E3779B97F4A7C15 * width) & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64)
    for j in range(width):
        h = _fmix64(h ^ t[j : j + count])
    return np.unique(h)


def shingles(tokens, n: int = DEFAULT_NGRAM) -> np.ndarray:
    """The shingle set of a document: uint64 [n_unique], sorted hashes of its token n-grams.

    ``tokens``: int32 [length] token ids (empty: an empty set; 0 < length < n: one shingle)."""
    return _shingles(as_token_ids(tokens, "tokens"), check_int("n (shingle length)", n, 1, 64))


def _jaccard(x: np.ndarray, y: np.ndarray) -> float:
    """Jaccard similarity of two non-empty shingle sets."""
    inter = np.intersect1d(x, y, assume_unique=True).size
    return inter / (x.size + y.size - inter)


def _identity(value):
    return value


def _minhash(empty: MinHash, hashes: np.ndarray) -> np.ndarray:
    """uint32 [num_perm]: the signature of a shingle set, from ``empty`` (a MinHash of no values)."""
    minhash = empty.copy()
    low = hashes.astype(np.uint32)  # affine32 takes 32-bit hash values
    for start in range(0, low.size, _ROWS):
        minhash.update_batch(low[start : start + _ROWS])
    return minhash.hashvalues


def _checked_params(num_perm, seed, ngram) -> tuple[int, int, int]:
    """(num_perm, seed, ngram) as ints, each checked (ValueError naming it)."""
    return (check_int("num_perm", num_perm, 2, 4096), check_int("seed", seed, 0, 2**32 - 1),
            check_int("ngram", ngram, 1, 64))


def _empty_minhash(num_perm: int, seed: int) -> MinHash:
    """A MinHash of no values with these parameters, over 32-bit shingle hashes taken as they are."""
    return MinHash(num_perm=num_perm, seed=seed, scheme="affine32", hashfunc=_identity)


def _read_only(array: np.ndarray) -> np.ndarray:
    if array.flags.writeable:  # a private copy, frozen (an array from an index file is read-only already)
        array = array.copy()
        array.flags.writeable = False
    return array


class DocumentSignatures:
    """MinHash signatures of a list of documents, row ``doc_idx`` for document ``doc_idx``.

    Attributes:
        matrix: uint32 [num_docs, num_perm], read-only (all 0xFFFFFFFF for an empty document).
        sizes: uint32 [num_docs], read-only: each document's distinct shingles (turns an
            estimated Jaccard into an estimated containment).
        num_perm, seed: the datasketch MinHash parameters.
        ngram: the shingle length.
    """

    def __init__(self, matrix: np.ndarray, sizes: np.ndarray, *, num_perm: int, seed: int, ngram: int) -> None:
        self.num_perm, self.seed, self.ngram = _checked_params(num_perm, seed, ngram)
        matrix, sizes = np.asarray(matrix), np.asarray(sizes)
        if matrix.dtype != np.uint32 or matrix.ndim != 2 or matrix.shape[1] != self.num_perm:
            raise ValueError(f"matrix must be uint32 [num_docs, {self.num_perm}], got {matrix.dtype} {matrix.shape}")
        if sizes.dtype != np.uint32 or sizes.shape != matrix.shape[:1]:
            raise ValueError(f"sizes must be uint32 [{matrix.shape[0]}], got {sizes.dtype} {sizes.shape}")
        self.matrix, self.sizes = _read_only(matrix), _read_only(sizes)
        self._empty = _empty_minhash(self.num_perm, self.seed)

    @classmethod
    def from_documents(cls, documents: Sequence, *, num_perm: int = DEFAULT_NUM_PERM, seed: int = DEFAULT_SEED,
                       ngram: int = DEFAULT_NGRAM) -> DocumentSignatures:
        """Signatures of ``documents``, a sequence of int32 [length] token arrays."""
        num_perm, seed, ngram = _checked_params(num_perm, seed, ngram)
        empty = _empty_minhash(num_perm, seed)
        matrix = np.empty((len(documents), num_perm), dtype=np.uint32)
        sizes = np.empty(len(documents), dtype=np.uint32)
        for doc_idx in range(len(documents)):
            hashes = _shingles(as_token_ids(documents[doc_idx], f"documents[{doc_idx}]"), ngram)
            matrix[doc_idx], sizes[doc_idx] = _minhash(empty, hashes), hashes.size
        matrix.flags.writeable = sizes.flags.writeable = False
        return cls(matrix, sizes, num_perm=num_perm, seed=seed, ngram=ngram)

    @classmethod
    def concatenate(cls, parts: Sequence[DocumentSignatures]) -> DocumentSignatures:
        """The rows of ``parts`` in order; ValueError when their parameters differ (naming them)."""
        first = parts[0]
        for i, part in enumerate(parts):
            if (part.num_perm, part.seed, part.ngram) != (first.num_perm, first.seed, first.ngram):
                raise ValueError(f"parts[{i}] has (num_perm, seed, ngram) = {(part.num_perm, part.seed, part.ngram)}, "
                                 f"parts[0] {(first.num_perm, first.seed, first.ngram)}")
        return cls(np.concatenate([p.matrix for p in parts]), np.concatenate([p.sizes for p in parts]),
                   num_perm=first.num_perm, seed=first.seed, ngram=first.ngram)

    def _signature_of(self, hashes: np.ndarray) -> np.ndarray:
        """uint32 [num_perm]: the signature of a shingle set (``shingles``) under these parameters."""
        return _minhash(self._empty, hashes)

    def take(self, doc_indices) -> DocumentSignatures:
        """The rows ``doc_indices`` (int [m]) in that order, e.g. the documents ``deduplicate`` kept."""
        idx = np.asarray(doc_indices, dtype=np.int64)
        return DocumentSignatures(self.matrix[idx], self.sizes[idx], num_perm=self.num_perm, seed=self.seed,
                                  ngram=self.ngram)

    def __len__(self) -> int:
        return self.matrix.shape[0]

    def __repr__(self) -> str:
        return f"DocumentSignatures(num_docs={len(self)}, num_perm={self.num_perm}, seed={self.seed}, ngram={self.ngram})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DocumentSignatures):
            return NotImplemented
        return ((self.num_perm, self.seed, self.ngram) == (other.num_perm, other.seed, other.ngram)
                and np.array_equal(self.matrix, other.matrix) and np.array_equal(self.sizes, other.sizes))

    __hash__ = None  # type: ignore[assignment]


def _band_params(threshold: float, num_perm: int, min_recall: float = 0.999) -> tuple[int, int]:
    """LSH (bands, rows) with the longest rows for which a pair at Jaccard == threshold becomes
    a candidate with probability >= ``min_recall`` (1 - (1 - t^r)^b). Candidates are verified
    exactly, so a missed pair is a missed duplicate and a false candidate only costs time;
    ``MinHashLSH(threshold=0.9, num_perm=128)``'s own choice finds a pair at 0.9 with
    probability 0.31 (0.98 with ``weights=(0.01, 0.99)``)."""
    best = (num_perm, 1)
    for r in range(1, num_perm // 2 + 1):
        b = num_perm // r
        if 1.0 - (1.0 - threshold**r) ** b >= min_recall:
            best = (b, r)
    return best


def deduplicate(documents: Sequence, threshold: float = 0.9, *,
                signatures: DocumentSignatures | None = None) -> tuple[np.ndarray, int]:
    """Drop exact and near-duplicate documents, keeping the first occurrence.

    A document is dropped when the exact Jaccard similarity of its shingle set with an
    already *kept* document is >= ``threshold`` (in (0, 1]); identical documents always
    are, and so are empty ones after the first. Greedy in document order (a document
    similar only to a dropped one is kept) and deterministic. datasketch's ``MinHashLSH``
    (bands for >= 99.9 % recall at ``threshold``) proposes the kept documents to compare
    with; their shingles are hashed again from ``documents[i]`` for the exact check.

    Args:
        documents: a sequence of int32 [length] token arrays.
        signatures: ``DocumentSignatures.from_documents(documents)``, if already made
            (the corpus index keeps the kept rows: ``signatures.take(kept)``).

    Returns:
        (kept document indices, int64 [num_kept] ascending; number of documents dropped).
    """
    try:
        threshold = float(threshold)
    except (TypeError, ValueError):
        raise ValueError(f"threshold must be a number in (0, 1], got {threshold!r}") from None
    if not 0.0 < threshold <= 1.0:  # also NaN
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    if signatures is None:
        signatures = DocumentSignatures.from_documents(documents)
    elif not isinstance(signatures, DocumentSignatures) or len(signatures) != len(documents):
        raise ValueError(f"signatures must be the DocumentSignatures of the {len(documents)} documents, "
                         f"got {signatures!r}")

    def shingles_of(doc_idx: int) -> np.ndarray:
        return _shingles(as_token_ids(documents[doc_idx], f"documents[{doc_idx}]"), signatures.ngram)

    lsh = MinHashLSH(num_perm=signatures.num_perm, params=_band_params(threshold, signatures.num_perm))
    kept: list[int] = []
    kept_empty = False
    for doc_idx in range(len(documents)):
        if signatures.sizes[doc_idx] == 0:
            if not kept_empty:
                kept.append(doc_idx)
                kept_empty = True
            continue
        minhash = LeanMinHash(seed=signatures.seed, hashvalues=signatures.matrix[doc_idx], scheme="affine32")
        candidates = sorted(lsh.query(minhash))
        if candidates:
            hashes = shingles_of(doc_idx)
            if any(_jaccard(hashes, shingles_of(other)) >= threshold for other in candidates):
                continue
        lsh.insert(doc_idx, minhash, check_duplication=False)
        kept.append(doc_idx)
    return np.array(kept, dtype=np.int64), len(documents) - len(kept)


class Retriever:
    """The k documents most similar to a query token sequence, by exact shingle overlap.

    Step 1 estimates every document's similarity from the signatures (one comparison of
    the uint32 matrix with the query's signature) and keeps the best ``max(4 k, 32)``;
    step 2 scores those exactly from their tokens, ``fetch(doc_idx)``. The scan costs time
    linear in the corpus (about a millisecond per 10,000 documents); datasketch's LSH
    Forest, sublinear, put the source document of a 256-token window in the top 5 for
    105 of 150 windows where the scan did for 140 (benchmarks/retrieval_bench.py, 5,000 files).

    Args:
        signatures: the documents' ``DocumentSignatures``; ``doc_idx`` is the row.
        fetch: ``fetch(doc_idx) -> int32 [length]``, a document's tokens (a corpus
            index's ``document``).
    """

    def __init__(self, signatures: DocumentSignatures, fetch: Callable[[int], np.ndarray]) -> None:
        if not isinstance(signatures, DocumentSignatures):
            raise ValueError(f"signatures must be a DocumentSignatures, got {type(signatures).__name__}")
        if not callable(fetch):
            raise ValueError(f"fetch must be callable (doc_idx -> int32 tokens), got {type(fetch).__name__}")
        self.signatures, self.fetch = signatures, fetch

    @classmethod
    def from_documents(cls, documents: Sequence, **signature_kwargs) -> Retriever:
        """A retriever over in-memory int32 [length] documents (``signature_kwargs``: num_perm, seed, ngram)."""
        return cls(DocumentSignatures.from_documents(documents, **signature_kwargs), documents.__getitem__)

    def __len__(self) -> int:
        return len(self.signatures)

    def __repr__(self) -> str:
        return f"Retriever({self.signatures!r})"

    def top_k(self, query_tokens, k: int, *, score: str = "jaccard") -> list[tuple[int, float]]:
        """The k documents most similar to ``query_tokens`` (int32 [length], length >= 1).

        ``score``: ``"jaccard"`` (|q & d| / |q | d| over shingle sets) or ``"containment"``
        (|q & d| / |q|: how much of the query a document covers, which does not penalise a long
        document quoting a short prompt; ties broken by Jaccard).

        Returns up to k ``(doc_idx, score)``, best first (ties: lower doc_idx first), only
        documents sharing a shingle with the query. A document is missed only when it shares
        no MinHash value with the query: at a fraction J of shared shingles, with probability
        (1 - J)^num_perm (J = 0.05 at 128 permutations: 0.14 %).
        """
        k = check_int("k", k, 1)
        if score not in ("jaccard", "containment"):
            raise ValueError(f"score must be 'jaccard' or 'containment', got {score!r}")
        query = as_token_ids(query_tokens, "query_tokens")
        if query.size == 0:
            raise ValueError("query_tokens must not be empty")
        sigs = self.signatures
        q_hashes = _shingles(query, sigs.ngram)
        q_sig = sigs._signature_of(q_hashes)
        # Step 1. MinHash values in common with every signature (in blocks: the bool temporary stays small).
        matches = np.zeros(len(sigs), dtype=np.int64)
        for start in range(0, len(sigs), _ROWS):
            matches[start : start + _ROWS] = np.count_nonzero(sigs.matrix[start : start + _ROWS] == q_sig, axis=1)
        matches[sigs.sizes == 0] = 0
        doc_ids = np.flatnonzero(matches)
        estimate = matches[doc_ids] / sigs.num_perm  # Jaccard; then containment J (|q| + |d|) / (|q| (1 + J))
        if score == "containment":
            estimate = estimate * (q_hashes.size + sigs.sizes[doc_ids]) / (q_hashes.size * (1.0 + estimate))
        candidates = doc_ids[np.lexsort((doc_ids, -estimate))[: max(4 * k, 32)]]
        # Step 2. Exact scores.
        ranked = []
        for doc_idx in candidates.tolist():
            d_hashes = _shingles(as_token_ids(self.fetch(doc_idx), f"fetch({doc_idx})"), sigs.ngram)
            inter = np.intersect1d(q_hashes, d_hashes, assume_unique=True).size
            if inter:
                jaccard = inter / (q_hashes.size + d_hashes.size - inter)
                ranked.append((inter / q_hashes.size if score == "containment" else jaccard, jaccard, doc_idx))
        ranked.sort(key=lambda t: (-t[0], -t[1], t[2]))
        return [(doc_idx, s) for s, _, doc_idx in ranked[:k]]
