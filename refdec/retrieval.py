"""Document retrieval and near-duplicate removal with MinHash (datasketch).

Two jobs, one representation:

* ``deduplicate`` drops exact and near-duplicate documents when a corpus index
  is built (``CorpusIndex.build(..., dedup_threshold=0.9)``);
* ``Retriever.top_k`` finds the corpus documents most similar to a prompt, so
  the proposer can put them in the per-request reference index (``retrieve=k``).

Arrays crossing this module's boundary:

    tokens / document / query_tokens   int32 [length]     token ids >= 0 (any integer
                                                           dtype is accepted and
                                                           converted if it fits int32)
    shingles(...)                      uint64 [n_unique]  sorted, unique shingle hashes
    DocumentSignatures.matrix          uint32 [num_docs, num_perm]
    DocumentSignatures.sizes           uint32 [num_docs]  distinct shingles per document
    deduplicate(...)[0]                int64 [num_kept]   kept document indices, ascending

Wiring into a corpus index (doc_idx = position in the index):

    sigs = DocumentSignatures.from_documents(docs)
    kept, dropped = deduplicate(docs, 0.9, signatures=sigs)    # index only docs[kept]
    sigs.take(kept).save(signature_path(index_path))            # atomic sibling file
    ...
    retriever = Retriever.load(signature_path(index_path), index.document, num_docs=n)
    retriever.top_k(prompt_ids, k)  # -> [(doc_idx, score)], best first

Shingles. A document is the *set* of its token n-grams (n = ``DEFAULT_NGRAM``
= 3), each n-gram represented by a 64-bit hash computed with numpy over the
whole document at once. Why 3: a substituted token destroys the n shingles
that cover it, so for scattered edits Jaccard ~ (1 - n f) / (1 + n f) at a
fraction f of changed tokens. With n = 3, a 1 % scattered edit still scores
~0.94 (a near-duplicate at 0.9; 2 % scattered scores ~0.89 and is kept), and edits clustered in a few lines (the usual
case for code) cost far fewer shingles; with n = 5 a 1 % scattered edit already
falls to ~0.90. Below 3, token bigrams of code are dominated by ubiquitous
pairs (``self .``, ``) :``) and unrelated files look alike. A document shorter
than n tokens has one shingle: the hash of all its tokens and its length. The
empty document has none. "Exact" Jaccard below means over these 64-bit hashes
(two distinct n-grams collide with probability 2^-64).

MinHash. datasketch 2.0's ``affine32`` scheme with a fixed seed: each shingle
hash is truncated to 32 bits, pre-mixed with the MurmurHash3 finalizer and
permuted by ``a * h + b mod 2^32``; the signature is the column-wise minimum.
This module computes it for all documents in vectorised numpy blocks, bit-for-
bit what ``datasketch.MinHash(num_perm, seed, scheme="affine32",
hashfunc=identity).update_batch(...)`` produces (tested), so signatures can be
handed to ``MinHashLSH`` / ``MinHashLSHForest`` as ``LeanMinHash``. The seed
is fixed, so signatures are identical across processes and machines.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Union

import numpy as np

from refdec.atomic import atomic_write
from refdec.tokens import as_token_ids

try:
    from datasketch import LeanMinHash, MinHash, MinHashLSH, MinHashLSHForest

    MinHash(num_perm=2, scheme="affine32")
except TypeError as err:  # datasketch < 2.0 has no ``scheme`` argument
    raise ImportError("refdec.retrieval needs datasketch >= 2.0 (the 'affine32' MinHash scheme)") from err

__all__ = [
    "DEFAULT_NGRAM",
    "DEFAULT_NUM_PERM",
    "DEFAULT_SEED",
    "DocumentSignatures",
    "Retriever",
    "deduplicate",
    "shingles",
    "signature_path",
]

DEFAULT_NGRAM = 3
DEFAULT_NUM_PERM = 128
DEFAULT_SEED = 1
# One MinHash block is at most this many shingle rows x num_perm uint32 (8 MiB at 128).
_BLOCK_ROWS = 16384
# Documents are hashed in batches of about this many tokens, so building signatures or
# de-duplicating never holds more than one batch of shingle sets (8 bytes per shingle).
_BATCH_TOKENS = 1 << 20
# Bound on the kept documents' shingle sets deduplicate holds (re-hashed when evicted).
_DEDUP_CACHE_BYTES = 256 << 20
_EMPTY = np.uint32(0xFFFFFFFF)  # datasketch's empty-signature value for affine32

PathLike = Union[str, "os.PathLike[str]"]


# ---------------------------------------------------------------------------
# Validation and hashing helpers
# ---------------------------------------------------------------------------


def _check_ngram(n) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= int(n) <= 64:
        raise ValueError(f"n (shingle length) must be an int in [1, 64], got {n!r}")
    return int(n)


def _check_num_perm(num_perm) -> int:
    if isinstance(num_perm, bool) or not isinstance(num_perm, (int, np.integer)) or not 2 <= int(num_perm) <= 4096:
        raise ValueError(f"num_perm must be an int in [2, 4096], got {num_perm!r}")
    return int(num_perm)


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**32:
        raise ValueError(f"seed must be an int in [0, 2^32), got {seed!r}")
    return int(seed)


def _check_threshold(threshold) -> float:
    try:
        t = float(threshold)
    except (TypeError, ValueError):
        raise ValueError(f"threshold must be a number in (0, 1], got {threshold!r}") from None
    if not 0.0 < t <= 1.0:  # also rejects NaN
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    return t


def _fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3 64-bit finalizer (a bijection), element-wise on uint64 arrays (wraps)."""
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xFF51AFD7ED558CCD)
    h = h ^ (h >> np.uint64(33))
    h = h * np.uint64(0xC4CEB9FE1A85EC53)
    return h ^ (h >> np.uint64(33))


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3 32-bit finalizer, element-wise on uint32 arrays; the pre-mix of datasketch's affine32."""
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _shingle_hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """uint64 [n_unique] sorted unique n-gram hashes of validated int32 ``tokens``."""
    length = tokens.shape[0]
    if length == 0:
        return np.zeros(0, dtype=np.uint64)
    width = min(n, length)  # a document shorter than n is one shingle of all its tokens
    count = length - width + 1
    t = tokens.astype(np.uint64)
    # The start value encodes the shingle width, so a short document's single
    # shingle never equals an n-gram of a longer one.
    h = np.full(count, (0x9E3779B97F4A7C15 * width) & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64)
    for j in range(width):
        h = _fmix64(h ^ t[j : j + count])
    return np.unique(h)


def shingles(tokens, n: int = DEFAULT_NGRAM) -> np.ndarray:
    """The shingle set of a document: sorted, unique 64-bit hashes of its token n-grams.

    Args:
        tokens: int32 [length] token ids (>= 0). Empty gives an empty set.
        n: shingle length in tokens (default 3; see the module docstring).

    Returns:
        uint64 [n_unique], sorted ascending. A document with 0 < length < n has
        exactly one shingle.
    """
    return _shingle_hashes(as_token_ids(tokens, "tokens"), _check_ngram(n))


def _permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's affine32 permutation parameters (a, b), each uint32 [num_perm]."""
    a, b = MinHash(num_perm=num_perm, seed=seed, scheme="affine32").permutations
    return np.asarray(a, dtype=np.uint32), np.asarray(b, dtype=np.uint32)


def _signatures(hash_sets: Sequence[np.ndarray], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """uint32 [len(hash_sets), num_perm] MinHash signatures of uint64 shingle-hash sets.

    Documents are grouped into blocks of at most ``_BLOCK_ROWS`` shingles; each
    block is permuted at once and reduced per document with ``minimum.reduceat``.
    A document larger than a block is reduced block by block.
    """
    num_docs, num_perm = len(hash_sets), a.shape[0]
    out = np.full((num_docs, num_perm), _EMPTY, dtype=np.uint32)

    def permuted(h64: np.ndarray) -> np.ndarray:
        # Step 1. truncate to the 32-bit input hash; Step 2. fmix32; Step 3. a*h+b mod 2^32.
        return _fmix32(h64.astype(np.uint32))[:, None] * a[None, :] + b[None, :]

    group: list[int] = []
    group_rows = 0

    def flush() -> None:
        nonlocal group, group_rows
        if group:
            parts = [hash_sets[i] for i in group]
            starts = np.cumsum([0] + [p.shape[0] for p in parts[:-1]])
            out[group] = np.minimum.reduceat(permuted(np.concatenate(parts)), starts, axis=0)
        group, group_rows = [], 0

    for doc_idx, hs in enumerate(hash_sets):
        size = hs.shape[0]
        if size == 0:
            continue  # empty set: stays at the empty value
        if size > _BLOCK_ROWS:
            row = out[doc_idx]
            for start in range(0, size, _BLOCK_ROWS):
                np.minimum(row, permuted(hs[start : start + _BLOCK_ROWS]).min(axis=0), out=row)
            continue
        if group_rows + size > _BLOCK_ROWS:
            flush()
        group.append(doc_idx)
        group_rows += size
    flush()
    return out


def _exact_jaccard(x: np.ndarray, y: np.ndarray) -> float:
    """Jaccard similarity of two sorted unique uint64 arrays; 0.0 if either is empty."""
    if x.size == 0 or y.size == 0:
        return 0.0
    inter = np.intersect1d(x, y, assume_unique=True).size
    return inter / (x.size + y.size - inter)


class _ShingleCache:
    """Shingle sets of documents fetched by index, in an LRU cache bounded in bytes.

    Thread-safe: the cache is locked, hashing and ``fetch`` run outside the lock.
    """

    def __init__(self, fetch: Callable[[int], np.ndarray], ngram: int, max_bytes: int, name: str) -> None:
        self.fetch, self.ngram, self.max_bytes, self.name = fetch, ngram, max_bytes, name
        self.sets: OrderedDict[int, np.ndarray] = OrderedDict()  # doc_idx -> shingle set, LRU order
        self.nbytes = 0
        self._lock = threading.Lock()

    def get(self, doc_idx: int) -> np.ndarray:
        with self._lock:
            hs = self.sets.get(doc_idx)
            if hs is not None:
                self.sets.move_to_end(doc_idx)
                return hs
        hs = _shingle_hashes(as_token_ids(self.fetch(doc_idx), f"{self.name}({doc_idx})"), self.ngram)
        self.put(doc_idx, hs)
        return hs

    def put(self, doc_idx: int, hs: np.ndarray) -> None:
        with self._lock:
            if doc_idx in self.sets:
                self.nbytes -= self.sets.pop(doc_idx).nbytes
            self.sets[doc_idx] = hs
            self.nbytes += hs.nbytes
            while self.nbytes > self.max_bytes and self.sets:
                self.nbytes -= self.sets.popitem(last=False)[1].nbytes

    def clear(self) -> None:
        with self._lock:
            self.sets.clear()
            self.nbytes = 0


def _batches(documents: Sequence):
    """Yield (first doc_idx, list of validated int32 token arrays) of about ``_BATCH_TOKENS`` tokens each."""
    max_tokens = _BATCH_TOKENS
    batch: list[np.ndarray] = []
    first, tokens = 0, 0
    for doc_idx in range(len(documents)):
        arr = as_token_ids(documents[doc_idx], f"documents[{doc_idx}]")
        batch.append(arr)
        tokens += arr.shape[0]
        if tokens >= max_tokens:
            yield first, batch
            first, batch, tokens = doc_idx + 1, [], 0
    if batch:
        yield first, batch


# ---------------------------------------------------------------------------
# Signatures and their file format
# ---------------------------------------------------------------------------

# File layout (little-endian): a 64-byte header, the uint32 matrix in C order, then
# the uint32 sizes [num_docs].
#   magic      8s   b"RDMINHSH"
#   version    u32  1
#   ngram      u32
#   num_perm   u32
#   seed       u32
#   num_docs   u64
#   crc32      u32  zlib.crc32 of the matrix and sizes bytes
#   header_crc u32  zlib.crc32 of the header bytes before this field
#   padding    24x
_MAGIC = b"RDMINHSH"
_VERSION = 1
_HEADER = struct.Struct("<8sIIIIQII24x")
_HEADER_FIELDS = struct.Struct("<8sIIIIQI")  # the prefix covered by header_crc
assert _HEADER.size == 64 and _HEADER_FIELDS.size == 36


def signature_path(index_path: PathLike) -> str:
    """The sibling file holding a corpus index's MinHash signatures: ``<index path>.minhash``."""
    return os.fspath(index_path) + ".minhash"



class DocumentSignatures:
    """MinHash signatures of a list of documents.

    Attributes:
        matrix: uint32 [num_docs, num_perm], row ``doc_idx`` is document ``doc_idx``'s
            signature (all 0xFFFFFFFF for an empty document). Read-only.
        sizes: uint32 [num_docs], number of distinct shingles of each document (turns an
            estimated Jaccard into an estimated containment). Read-only.
        num_perm: number of permutations (columns).
        seed: datasketch permutation seed.
        ngram: shingle length the signatures were computed with.
    """

    __slots__ = ("matrix", "sizes", "num_perm", "seed", "ngram", "_perm")

    def __init__(self, matrix: np.ndarray, sizes: np.ndarray, *, num_perm: int, seed: int, ngram: int) -> None:
        self.num_perm = _check_num_perm(num_perm)
        self.seed = _check_seed(seed)
        self.ngram = _check_ngram(ngram)
        matrix = np.asarray(matrix)
        if matrix.dtype != np.uint32 or matrix.ndim != 2 or matrix.shape[1] != self.num_perm:
            raise ValueError(
                f"matrix must be uint32 of shape (num_docs, {self.num_perm}), got {matrix.dtype} {matrix.shape}"
            )
        if matrix.flags.writeable or not matrix.flags.c_contiguous:
            matrix = np.array(matrix, order="C")  # own a private copy, then freeze it
            matrix.flags.writeable = False
        self.matrix = matrix
        sizes = np.asarray(sizes)
        if sizes.shape != (matrix.shape[0],) or (sizes.size and (sizes.dtype.kind not in "iu" or sizes.min() < 0)):
            raise ValueError(
                f"sizes must be non-negative integers of shape ({matrix.shape[0]},), got {sizes.dtype} {sizes.shape}"
            )
        sizes = np.array(sizes, dtype=np.uint32)
        sizes.flags.writeable = False
        self.sizes = sizes
        self._perm: tuple[np.ndarray, np.ndarray] | None = None

    # -- construction ------------------------------------------------------

    @classmethod
    def from_documents(
        cls,
        documents: Sequence,
        *,
        num_perm: int = DEFAULT_NUM_PERM,
        seed: int = DEFAULT_SEED,
        ngram: int = DEFAULT_NGRAM,
    ) -> DocumentSignatures:
        """Signatures of ``documents`` (a sequence of int32 [length] arrays), hashed in batches
        of about a million tokens (memory does not grow with the corpus beyond the matrix)."""
        num_perm, seed, ngram = _check_num_perm(num_perm), _check_seed(seed), _check_ngram(ngram)
        a, b = _permutations(num_perm, seed)
        matrix = np.empty((len(documents), num_perm), dtype=np.uint32)
        sizes = np.empty(len(documents), dtype=np.uint32)
        for first, batch in _batches(documents):
            hash_sets = [_shingle_hashes(tokens, ngram) for tokens in batch]
            matrix[first : first + len(batch)] = _signatures(hash_sets, a, b)
            sizes[first : first + len(batch)] = [hs.shape[0] for hs in hash_sets]
        matrix.flags.writeable = False  # hand over without a copy
        sigs = cls(matrix, sizes, num_perm=num_perm, seed=seed, ngram=ngram)
        sigs._perm = (a, b)
        return sigs

    @classmethod
    def from_shingles(
        cls, hash_sets: Sequence[np.ndarray], *, num_perm: int, seed: int, ngram: int
    ) -> DocumentSignatures:
        """Signatures of already computed shingle sets (each uint64 [n_unique], from ``shingles``)."""
        for doc_idx, hs in enumerate(hash_sets):
            if not isinstance(hs, np.ndarray) or hs.dtype != np.uint64 or hs.ndim != 1:
                raise ValueError(f"hash_sets[{doc_idx}] must be a uint64 [n] array from shingles(), got {hs!r:.60}")
        a, b = _permutations(_check_num_perm(num_perm), _check_seed(seed))
        sizes = np.array([hs.shape[0] for hs in hash_sets], dtype=np.uint32)
        matrix = _signatures(hash_sets, a, b)
        matrix.flags.writeable = False
        sigs = cls(matrix, sizes, num_perm=num_perm, seed=seed, ngram=ngram)
        sigs._perm = (a, b)
        return sigs

    def signature(self, tokens) -> np.ndarray:
        """uint32 [num_perm] signature of one token sequence under these parameters."""
        return self._signature_of(_shingle_hashes(as_token_ids(tokens, "tokens"), self.ngram))

    def _signature_of(self, hash_set: np.ndarray) -> np.ndarray:
        if self._perm is None:
            self._perm = _permutations(self.num_perm, self.seed)
        return _signatures([hash_set], *self._perm)[0]

    # -- access --------------------------------------------------------------

    def __len__(self) -> int:
        return self.matrix.shape[0]

    def __repr__(self) -> str:
        return f"DocumentSignatures(num_docs={len(self)}, num_perm={self.num_perm}, seed={self.seed}, ngram={self.ngram})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DocumentSignatures):
            return NotImplemented
        return (
            (self.num_perm, self.seed, self.ngram) == (other.num_perm, other.seed, other.ngram)
            and self.matrix.shape == other.matrix.shape
            and bool(np.array_equal(self.matrix, other.matrix))
            and bool(np.array_equal(self.sizes, other.sizes))
        )

    __hash__ = None  # type: ignore[assignment]

    def minhash(self, doc_idx: int) -> LeanMinHash:
        """Document ``doc_idx``'s signature as a datasketch ``LeanMinHash``."""
        return LeanMinHash(seed=self.seed, hashvalues=self.matrix[doc_idx], scheme="affine32")

    def estimate(self, signature: np.ndarray) -> np.ndarray:
        """float64 [num_docs]: MinHash-estimated Jaccard of every document with ``signature`` (uint32 [num_perm])."""
        signature = np.asarray(signature)
        if signature.dtype != np.uint32 or signature.shape != (self.num_perm,):
            raise ValueError(
                f"signature must be uint32 of shape ({self.num_perm},), got {signature.dtype} {signature.shape}"
            )
        if len(self) == 0:
            return np.zeros(0, dtype=np.float64)
        return np.count_nonzero(self.matrix == signature[None, :], axis=1) / self.num_perm

    def take(self, doc_indices) -> DocumentSignatures:
        """The signatures of ``doc_indices`` (int [m]) in that order, e.g. the documents ``deduplicate`` kept."""
        idx = np.asarray(doc_indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise ValueError(f"doc_indices must be a 1-D integer array, got {idx.dtype} {idx.shape}")
        idx = idx.astype(np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            bad = int(idx.min()) if idx.min() < 0 else int(idx.max())
            raise ValueError(f"doc_indices must be in [0, {len(self)}), got {bad}")
        out = DocumentSignatures(
            self.matrix[idx], self.sizes[idx], num_perm=self.num_perm, seed=self.seed, ngram=self.ngram
        )
        out._perm = self._perm
        return out

    # -- persistence --------------------------------------------------------

    def save(self, path: PathLike) -> None:
        """Write to ``path`` atomically (refdec.atomic: temporary file in the same folder, fsync, rename)."""
        payload = np.ascontiguousarray(self.matrix, dtype="<u4").tobytes() + self.sizes.astype("<u4").tobytes()
        fields = (_MAGIC, _VERSION, self.ngram, self.num_perm, self.seed, len(self), zlib.crc32(payload))
        header = _HEADER.pack(*fields, zlib.crc32(_HEADER_FIELDS.pack(*fields)))
        atomic_write(path, [header, payload])

    @classmethod
    def load(
        cls,
        path: PathLike,
        *,
        num_perm: int | None = None,
        seed: int | None = None,
        ngram: int | None = None,
        num_docs: int | None = None,
    ) -> DocumentSignatures:
        """Read signatures written by ``save``.

        The expected ``num_perm``, ``seed``, ``ngram`` and ``num_docs`` are checked when
        given (pass the corpus index's document count as ``num_docs`` to catch a stale
        sibling file). Raises ValueError naming ``path`` on a mismatch, a truncated or
        corrupted file, or a file that is not a signature file; FileNotFoundError if absent.
        """
        path = os.fspath(path)
        with open(path, "rb") as f:
            data = f.read()
        if len(data) < _HEADER.size:
            raise ValueError(f"{path}: not a refdec MinHash signature file (truncated: {len(data)} bytes)")
        magic, version, f_ngram, f_num_perm, f_seed, f_num_docs, crc, header_crc = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise ValueError(f"{path}: not a refdec MinHash signature file (magic {magic!r})")
        if header_crc != zlib.crc32(data[: _HEADER_FIELDS.size]):
            raise ValueError(f"{path}: corrupted signature file (header checksum mismatch)")
        if version != _VERSION:
            raise ValueError(f"{path}: unsupported signature file version {version} (expected {_VERSION})")
        expected_size = _HEADER.size + 4 * f_num_docs * (f_num_perm + 1)
        if len(data) != expected_size:
            raise ValueError(
                f"{path}: truncated or corrupted signature file ({len(data)} bytes, expected {expected_size} "
                f"for {f_num_docs} docs x {f_num_perm} permutations)"
            )
        if zlib.crc32(memoryview(data)[_HEADER.size :]) != crc:
            raise ValueError(f"{path}: corrupted signature file (payload checksum mismatch)")
        for name, want, got in (
            ("num_perm", num_perm, f_num_perm),
            ("seed", seed, f_seed),
            ("ngram", ngram, f_ngram),
            ("num_docs", num_docs, f_num_docs),
        ):
            if want is not None and int(want) != got:
                raise ValueError(f"{path}: signature file has {name}={got}, expected {name}={want}")
        values = np.frombuffer(data, dtype="<u4", offset=_HEADER.size).astype(np.uint32, copy=False)
        matrix = values[: f_num_docs * f_num_perm].reshape(f_num_docs, f_num_perm)
        sizes = values[f_num_docs * f_num_perm :]
        try:
            return cls(matrix, sizes, num_perm=f_num_perm, seed=f_seed, ngram=f_ngram)
        except ValueError as err:
            raise ValueError(f"{path}: invalid signature file ({err})") from None


# ---------------------------------------------------------------------------
# De-duplication
# ---------------------------------------------------------------------------


def _band_params(threshold: float, num_perm: int, min_recall: float = 0.999) -> tuple[int, int]:
    """LSH (bands, rows) with the longest rows such that a pair at Jaccard == threshold
    becomes a candidate with probability >= ``min_recall`` (1 - (1 - t^r)^b).

    Candidates are verified with exact Jaccard afterwards, so false positives cost
    time, false negatives cost correctness: favour recall.
    """
    best = (num_perm, 1)
    for r in range(1, num_perm // 2 + 1):
        b = num_perm // r
        if 1.0 - (1.0 - threshold**r) ** b >= min_recall:
            best = (b, r)
    return best


def deduplicate(
    documents: Sequence,
    threshold: float = 0.9,
    num_perm: int = DEFAULT_NUM_PERM,
    *,
    seed: int = DEFAULT_SEED,
    ngram: int = DEFAULT_NGRAM,
    signatures: DocumentSignatures | None = None,
) -> tuple[np.ndarray, int]:
    """Drop exact and near-duplicate documents; the first occurrence is kept.

    Args:
        documents: sequence of int32 [length] token arrays.
        threshold: a document is dropped when the exact Jaccard similarity of its
            shingle set with an already *kept* document is >= threshold, in (0, 1].
            Identical token sequences are always dropped, whatever the threshold.
        num_perm, seed, ngram: MinHash parameters (ignored when ``signatures`` is given).
        signatures: precomputed ``DocumentSignatures.from_documents(documents, ...)``
            to reuse (the corpus index keeps them for retrieval: ``signatures.take(kept)``).

    Returns:
        (kept_indices int64 [num_kept] ascending, number of dropped documents).

    Memory: documents are hashed in batches of about a million tokens; shingle sets of
    kept documents are re-hashed from ``documents[i]`` when an LSH candidate needs them
    (256 MiB LRU), so a corpus larger than memory works through a lazy sequence.

    MinHash LSH (bands chosen for >= 99.9 % recall at ``threshold``) proposes
    candidate pairs; each is verified with exact Jaccard, so no document is dropped
    below the threshold. Greedy in document order: a document similar only to a
    dropped one is kept. Deterministic.
    """
    threshold = _check_threshold(threshold)
    num_docs = len(documents)
    if signatures is not None:
        if not isinstance(signatures, DocumentSignatures):
            raise ValueError(f"signatures must be a DocumentSignatures, got {type(signatures).__name__}")
        if len(signatures) != num_docs:
            raise ValueError(f"signatures has {len(signatures)} rows but documents has {num_docs}")
        num_perm, seed, ngram = signatures.num_perm, signatures.seed, signatures.ngram
    else:
        num_perm, seed, ngram = _check_num_perm(num_perm), _check_seed(seed), _check_ngram(ngram)
        a, b = _permutations(num_perm, seed)

    lsh = MinHashLSH(num_perm=num_perm, params=_band_params(threshold, num_perm))
    # Kept documents' shingle sets: the current batch's are put here, earlier ones re-hashed on demand.
    kept_sets = _ShingleCache(documents.__getitem__, ngram, _DEDUP_CACHE_BYTES, "documents.__getitem__")
    first_by_digest: dict[bytes, int] = {}  # content digest -> first document with that content
    keep = np.zeros(num_docs, dtype=bool)
    for first, batch in _batches(documents):
        # Step 1. exact duplicates: same digest, confirmed token by token.
        unique: list[tuple[int, np.ndarray]] = []
        for doc_idx, tokens in enumerate(batch, start=first):
            digest = hashlib.blake2b(tokens.tobytes(), digest_size=16).digest()
            earlier = first_by_digest.setdefault(digest, doc_idx)
            if earlier != doc_idx and np.array_equal(
                as_token_ids(documents[earlier], f"documents[{earlier}]"), tokens
            ):
                continue
            unique.append((doc_idx, _shingle_hashes(tokens, ngram)))
        if signatures is None:
            rows = _signatures([hs for _, hs in unique], a, b)
        # Step 2. greedy, in document order: LSH candidates among kept documents, verified exactly.
        for row, (doc_idx, hs) in enumerate(unique):
            if hs.size == 0:  # the first empty document: nothing to compare, keep it
                keep[doc_idx] = True
                continue
            if signatures is None:
                mh = LeanMinHash(seed=seed, hashvalues=rows[row], scheme="affine32")
            else:
                mh = signatures.minhash(doc_idx)
            if not any(_exact_jaccard(hs, kept_sets.get(other)) >= threshold for other in sorted(lsh.query(mh))):
                keep[doc_idx] = True
                lsh.insert(doc_idx, mh, check_duplication=False)
                kept_sets.put(doc_idx, hs)
    kept = np.flatnonzero(keep).astype(np.int64)
    return kept, num_docs - int(kept.size)


# ---------------------------------------------------------------------------
# Retrieval
# ---------------------------------------------------------------------------


class Retriever:
    """Top-k most similar documents (exact shingle Jaccard) for a query token sequence.

    Step 1 proposes candidates from the MinHash signatures, step 2 re-ranks them
    by exact Jaccard over shingle sets, computed from the tokens ``fetch(doc_idx)``
    returns (the corpus index supplies ``index.document``) and kept in a bounded
    LRU cache. Candidate generation (``candidates``):

    * ``"forest"``: a datasketch ``MinHashLSHForest`` (rebuilt from the
      signatures, never serialised) is asked for ``oversample * want`` keys, which
      are ranked by MinHash-estimated Jaccard and cut to ``want``. When fewer than
      k of them share a shingle with the query, the signature scan tops up.
    * ``"scan"``: MinHash-estimated Jaccard of the query against every
      signature (one vectorised comparison of the uint32 matrix), best ``want``.
    * ``"auto"`` (default): ``"scan"`` up to ``scan_limit`` documents, else ``"forest"``.

    Why a scan at all: the forest's top-k query walks prefix lengths down and stops
    as soon as it holds enough keys, so at short prefixes it returns an arbitrary
    subset of a large tie and can miss the best document (measured in
    ``benchmarks/retrieval_bench.py``: 25/30 top-1 correct against 30/30 for the
    scan on 5,000 files), while the scan ranks every document by its estimate (its cost per
    query against the corpus size: benchmarks/RESULTS.md). Jaccard of a short prompt
    with a long document is small, which is where banded LSH recall is worst.

    Args:
        signatures: the documents' ``DocumentSignatures``; ``doc_idx`` is the row.
        fetch: ``fetch(doc_idx) -> int32 [length]`` tokens of a document.
        candidates: ``"auto"``, ``"scan"`` or ``"forest"``.
        trees: number of LSH Forest prefix trees (``l``), <= num_perm.
        candidates_per_k, min_candidates: ``want = max(candidates_per_k * k, min_candidates, k)``
            candidates are re-ranked exactly.
        oversample: the forest is asked for ``oversample * want`` keys.
        scan_limit: the largest corpus ``"auto"`` scans.
        cache_bytes: bound on the memory of cached shingle sets (8 bytes per shingle).
    """

    _MODES = ("auto", "scan", "forest")

    def __init__(
        self,
        signatures: DocumentSignatures,
        fetch: Callable[[int], np.ndarray],
        *,
        candidates: str = "auto",
        trees: int = 8,
        candidates_per_k: int = 4,
        min_candidates: int = 32,
        oversample: int = 4,
        scan_limit: int = 100_000,
        cache_bytes: int = 64 << 20,
    ) -> None:
        if not isinstance(signatures, DocumentSignatures):
            raise ValueError(f"signatures must be a DocumentSignatures, got {type(signatures).__name__}")
        if not callable(fetch):
            raise ValueError(f"fetch must be callable (doc_idx -> int32 tokens), got {type(fetch).__name__}")
        if candidates not in self._MODES:
            raise ValueError(f"candidates must be one of {self._MODES}, got {candidates!r}")
        for name, value, low in (
            ("trees", trees, 1),
            ("candidates_per_k", candidates_per_k, 1),
            ("min_candidates", min_candidates, 0),
            ("oversample", oversample, 1),
            ("scan_limit", scan_limit, 0),
            ("cache_bytes", cache_bytes, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if trees > signatures.num_perm:
            raise ValueError(f"trees must be <= num_perm ({signatures.num_perm}), got {trees}")
        self.signatures = signatures
        self.fetch = fetch
        self.mode = candidates if candidates != "auto" else ("scan" if len(signatures) <= scan_limit else "forest")
        self.candidates_per_k = candidates_per_k
        self.min_candidates = min_candidates
        self.oversample = oversample
        self._cache = _ShingleCache(fetch, signatures.ngram, cache_bytes, "fetch")
        self._nonempty = ~np.all(signatures.matrix == _EMPTY, axis=1)  # bool [num_docs]: has shingles
        self.forest: MinHashLSHForest | None = None
        if self.mode == "forest":
            self.forest = MinHashLSHForest(num_perm=signatures.num_perm, l=trees)
            for doc_idx in np.flatnonzero(self._nonempty).tolist():
                self.forest.add(doc_idx, signatures.minhash(doc_idx))
            self.forest.index()

    @classmethod
    def from_documents(
        cls,
        documents: Sequence,
        *,
        num_perm: int = DEFAULT_NUM_PERM,
        seed: int = DEFAULT_SEED,
        ngram: int = DEFAULT_NGRAM,
        **kwargs,
    ) -> Retriever:
        """A retriever over an in-memory list of int32 [length] documents (``kwargs`` as in ``__init__``)."""
        sigs = DocumentSignatures.from_documents(documents, num_perm=num_perm, seed=seed, ngram=ngram)
        return cls(sigs, documents.__getitem__, **kwargs)

    def save(self, path: PathLike) -> None:
        """Write the signatures atomically to ``path`` (for a corpus index: ``signature_path(index_path)``)."""
        self.signatures.save(path)

    @classmethod
    def load(
        cls,
        path: PathLike,
        fetch: Callable[[int], np.ndarray],
        *,
        num_docs: int | None = None,
        spot_checks: int = 3,
        **kwargs,
    ) -> Retriever:
        """Load signatures from ``path`` (the forest, if used, is rebuilt).

        Against a stale sibling file: ``num_docs`` (the index's document count) is checked
        when given, and the signatures of ``spot_checks`` documents spread over the corpus
        (first, last, between) are recomputed from ``fetch`` and compared with the file.
        Raises ValueError naming ``path`` on a bad or stale file."""
        if isinstance(spot_checks, bool) or not isinstance(spot_checks, int) or spot_checks < 0:
            raise ValueError(f"spot_checks must be an int >= 0, got {spot_checks!r}")
        sigs = DocumentSignatures.load(path, num_docs=num_docs)
        if len(sigs) and spot_checks:
            for doc_idx in sorted({int(i) for i in np.linspace(0, len(sigs) - 1, spot_checks).round()}):
                if not np.array_equal(sigs.signature(fetch(doc_idx)), sigs.matrix[doc_idx]):
                    raise ValueError(
                        f"{os.fspath(path)}: stale signature file: document {doc_idx} does not match its "
                        "stored signature (rebuild the signatures for this index)"
                    )
        return cls(sigs, fetch, **kwargs)

    def __len__(self) -> int:
        return len(self.signatures)

    def __repr__(self) -> str:
        return f"Retriever({self.signatures!r}, candidates={self.mode!r})"

    def clear_cache(self) -> None:
        """Forget the cached shingle sets (e.g. after the documents behind ``fetch`` changed)."""
        self._cache.clear()

    def _best_by_estimate(
        self, q_sig: np.ndarray, doc_ids: np.ndarray | None, want: int, q_size: int | None = None
    ) -> list[int]:
        """The ``want`` documents among ``doc_ids`` (int64 [m]; None = all) with at least one MinHash
        value equal to the query's, best estimate first (ties: lower doc_idx first). The estimate is
        Jaccard (matching values / num_perm), or, given the query's shingle count ``q_size``, the
        containment of the query in the document, J (|q| + |d|) / (|q| (1 + J))."""
        matrix = self.signatures.matrix
        if doc_ids is None:  # full scan, in row blocks so the bool temporary stays small
            counts = np.empty(len(self), dtype=np.uint16)
            for start in range(0, len(self), _BLOCK_ROWS):
                block = matrix[start : start + _BLOCK_ROWS]
                counts[start : start + block.shape[0]] = (block == q_sig[None, :]).sum(axis=1, dtype=np.uint16)
            counts[~self._nonempty] = 0
            doc_ids = np.flatnonzero(counts)
            counts = counts[doc_ids]
        else:
            doc_ids = doc_ids[self._nonempty[doc_ids]]
            counts = (matrix[doc_ids] == q_sig[None, :]).sum(axis=1, dtype=np.uint16)
            doc_ids, counts = doc_ids[counts > 0], counts[counts > 0]
        if q_size is None:
            key = counts.astype(np.int64) * (len(self) + 1) - doc_ids  # unique: count desc, doc_idx asc
            if key.size > want:
                top = np.argpartition(-key, want - 1)[:want]
                doc_ids, key = doc_ids[top], key[top]
            return doc_ids[np.argsort(-key)].tolist()
        j = counts / self.signatures.num_perm
        est = j * (q_size + self.signatures.sizes[doc_ids].astype(np.float64)) / (q_size * (1.0 + j))
        order = np.lexsort((doc_ids, -est))[:want]
        return doc_ids[order].tolist()

    def top_k(self, query_tokens, k: int, *, score: str = "jaccard") -> list[tuple[int, float]]:
        """The k documents most similar to ``query_tokens``.

        Args:
            query_tokens: int32 [length] token ids, length >= 1.
            k: number of documents wanted, >= 1.
            score: ``"jaccard"`` (|q & d| / |q | d| over shingle sets) or ``"containment"``
                (|q & d| / |q|: how much of the query the document covers, which does not
                penalise a long document that quotes a short prompt; ties broken by Jaccard).

        Returns:
            Up to k ``(doc_idx, score)`` pairs, by exact score descending (ties: lower
            doc_idx first). Only documents sharing a shingle with the query appear. Fewer than k only when fewer than k documents have a MinHash value in
            common with the query: a document sharing a fraction J of shingles is missed
            with probability (1 - J)^num_perm (J = 0.05 at 128 permutations: 0.14 %).
        """
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        k = int(k)
        if score not in ("jaccard", "containment"):
            raise ValueError(f"score must be 'jaccard' or 'containment', got {score!r}")
        query = as_token_ids(query_tokens, "query_tokens")
        if query.size == 0:
            raise ValueError("query_tokens must not be empty")
        q_hashes = _shingle_hashes(query, self.signatures.ngram)
        q_sig = self.signatures._signature_of(q_hashes)
        want = max(self.candidates_per_k * k, self.min_candidates, k)
        q_size = q_hashes.size if score == "containment" else None
        scores: dict[int, tuple[float, float]] = {}  # doc_idx -> (score, jaccard)

        def rate(doc_ids: list[int]) -> None:
            for doc_idx in doc_ids:
                if doc_idx not in scores:
                    d_hashes = self._cache.get(doc_idx)
                    inter = np.intersect1d(q_hashes, d_hashes, assume_unique=True).size if d_hashes.size else 0
                    jaccard = inter / (q_hashes.size + d_hashes.size - inter)
                    scores[doc_idx] = (inter / q_hashes.size if q_size else jaccard, jaccard)

        # Step 1. candidates: LSH Forest keys ranked by estimate, or the best estimates overall.
        if self.forest is not None and self.forest.keys:
            q_mh = LeanMinHash(seed=self.signatures.seed, hashvalues=q_sig, scheme="affine32")
            keys = np.array(sorted(self.forest.query(q_mh, self.oversample * want)), dtype=np.int64)
            rate(self._best_by_estimate(q_sig, keys, want, q_size))
        # Step 2. scan mode, or the forest left fewer than k matches: scan every signature.
        if self.forest is None or sum(1 for s, _ in scores.values() if s > 0.0) < k:
            rate(self._best_by_estimate(q_sig, None, want, q_size))
        # Step 3. exact re-ranking.
        ranked = sorted(((d, s, j) for d, (s, j) in scores.items() if s > 0.0), key=lambda t: (-t[1], -t[2], t[0]))
        return [(int(d), float(s)) for d, s, _ in ranked[:k]]
