"""Documents into token ids for an index (str tokenised in batches, ids checked against the
vocabulary), and the tokenizer fingerprint an index file is stamped with."""

from __future__ import annotations

import hashlib
import json
import weakref

import numpy as np
from tqdm.auto import tqdm

from refdec.tokens import as_token_ids

__all__ = ["tokenize_documents", "tokenizer_fingerprint"]

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



_TOKENIZE_BATCH = 256


def tokenize_documents(documents, tokenizer, vocab_size: int, show_progress: bool):
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

