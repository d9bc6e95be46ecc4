"""Corpus indexes the workloads draft from, built once and cached.

One corpus today, ``"stdlib"``: the Python standard library without its test suites
(``data.read_stdlib(tests=False)``), tokenised with the default model's tokenizer. Its
``refdec.CorpusIndex`` (with MinHash signatures, so ``retrieve=k`` and ``retrieval_sim.py``
work) and, for the simulator's REST baseline, a ``draftretriever`` datastore over the same
token ids are cached in ``paths.CACHE_DIR`` under names keyed by a digest of the ids, so a
changed corpus or tokenizer is rebuilt, never read stale.
"""

from __future__ import annotations

import hashlib
import os
import sys

import numpy as np

from benchmarks import data, tokens
from benchmarks.paths import CACHE_DIR

CORPORA = ("stdlib",)
DRAFTRETRIEVER_VOCAB = 262_144  # Gemma 3's vocabulary


def corpus_token_ids(name: str) -> list[np.ndarray]:
    """The documents of corpus ``name`` as int32 arrays of shape (n_i,), no special tokens."""
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; expected one of {CORPORA}")
    documents, _ = data.read_stdlib(tests=False)
    return tokens.token_ids([doc.text for doc in documents], tag="stdlib-notests")


def _ids_digest(arrays: list[np.ndarray]) -> str:
    h = hashlib.sha1()
    for arr in arrays:
        h.update(np.int64(arr.size).tobytes())
        h.update(np.ascontiguousarray(arr, dtype=np.int32).tobytes())
    return h.hexdigest()[:16]


def corpus_index(name: str, *, show_progress: bool = False):
    """The ``refdec.CorpusIndex`` of corpus ``name`` (with signatures), built once and cached."""
    import refdec

    ids = corpus_token_ids(name)
    path = CACHE_DIR / f"{name}-{_ids_digest(ids)}.refdec"
    if path.exists():
        try:
            index = refdec.CorpusIndex.load(str(path), tokens.tokenizer())
            if index.signatures is not None:
                return index
            print(f"rebuilding {path}: no MinHash signatures (written before the index file held them)",
                  file=sys.stderr)
        except refdec.IndexFormatError as exc:  # e.g. written by an older format version
            print(f"rebuilding {path}: {exc}", file=sys.stderr)
    index = refdec.CorpusIndex.build(ids, tokens.tokenizer(), show_progress=show_progress, signatures=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    index.save(str(path))
    return refdec.CorpusIndex.load(str(path), tokens.tokenizer())


def draftretriever_reader(name: str):
    """The PyPI ``draftretriever.Reader`` over corpus ``name`` (the same token ids as
    :func:`corpus_index`), its datastore built once and cached."""
    import draftretriever

    ids = corpus_token_ids(name)
    path = CACHE_DIR / f"{name}-{_ids_digest(ids)}.draftretriever.idx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        writer = draftretriever.Writer(str(tmp), DRAFTRETRIEVER_VOCAB)
        for arr in ids:
            writer.add_entry(arr.tolist())
        writer.finalize()
        os.replace(tmp, path)
    return draftretriever.Reader(str(path))
