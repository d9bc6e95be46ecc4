"""Token ids of the benchmarks' texts, with the default model's tokenizer, cached on disk.

The cache lives in ``paths.CACHE_DIR`` (benchmarks/cache/): one ``.tokens.npy`` (int32, every
text's ids end to end) and one ``.offsets.npy`` (int64, len(texts) + 1) per call, keyed by a
tag, the tokenizer's fingerprint and a digest of the texts and the special-token flag, so a
rerun skips tokenisation and a change of tokenizer or text re-tokenises.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from typing import Sequence

import numpy as np

from benchmarks.paths import CACHE_DIR

_TOKENIZER = None


def tokenizer():
    """The default model's tokenizer (Gemma 3), loaded once (``refdec.models.load_tokenizer``)."""
    global _TOKENIZER
    if _TOKENIZER is None:
        from refdec.models import load_tokenizer

        _TOKENIZER = load_tokenizer()
    return _TOKENIZER


def encode(text: str, *, bos: bool) -> np.ndarray:
    """int32 array of shape (n,): the ids of ``text``, with the tokenizer's special tokens
    (BOS) when ``bos``."""
    return np.asarray(tokenizer()(text, add_special_tokens=bos).input_ids, dtype=np.int32)


def _digest(texts: Sequence[str], bos: bool) -> str:
    h = hashlib.sha1(b"bos" if bos else b"nobos")
    for text in texts:
        h.update(hashlib.sha1(text.encode("utf-8")).digest())
    return h.hexdigest()[:16]


def token_ids(texts: Sequence[str], *, tag: str, bos: bool = False, batch: int = 64,
              verbose: bool = True) -> list[np.ndarray]:
    """The ids of each of ``texts`` (int32 arrays of shape (n_i,), BOS first when ``bos``),
    tokenised once and cached under CACHE_DIR as ``<tag>-<fingerprint>-<digest>``.

    ``verbose`` prints progress to stderr while tokenising (not on a cache hit)."""
    from refdec.drafting.index import tokenizer_fingerprint

    if not tag or "/" in tag:
        raise ValueError(f"tag must be a non-empty file-name part, got {tag!r}")
    tok = tokenizer()
    key = f"{tag}-{tokenizer_fingerprint(tok)[:16]}-{_digest(texts, bos)}"
    tokens_path = CACHE_DIR / f"{key}.tokens.npy"
    offsets_path = CACHE_DIR / f"{key}.offsets.npy"
    if tokens_path.exists() and offsets_path.exists():
        flat, offsets = np.load(tokens_path), np.load(offsets_path)
        return [flat[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]

    t0 = time.perf_counter()
    arrays: list[np.ndarray] = []
    for start in range(0, len(texts), batch):
        encoded = tok(list(texts[start:start + batch]), add_special_tokens=bos, verbose=False)["input_ids"]
        arrays.extend(np.asarray(ids, dtype=np.int32) for ids in encoded)
        if verbose:
            print(f"\rtokenising {tag}: {min(start + batch, len(texts))}/{len(texts)} texts", end="",
                  file=sys.stderr)
    if verbose:
        print(f" ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int32)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    # Write under temporary names, then rename: a killed run leaves no half cache.
    for path, array in ((tokens_path, flat), (offsets_path, offsets)):
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, array)
        os.replace(tmp, path)
    return [flat[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
