"""Specifies refdec.drafting.index's side of retrieval (refdec.drafting.retrieval wired into the corpus index):
``CorpusIndex.build(dedup_threshold=...)`` drops near-duplicates, keeps MinHash signatures one row
per kept document, ``save`` stores them in the index file and ``load`` reads them from it;
``add_documents`` extends them. ``generate(..., retrieve=k)``: tests/test_engine_decoder.py;
``refdec index build --dedup`` and ``refdec generate --retrieve``: tests/test_cli_index.py and
tests/test_cli_generate.py.
"""

from __future__ import annotations

import gc
import os
import re

import numpy as np
import pytest

from refdec.drafting.index import CorpusIndex
from refdec.drafting.retrieval import DocumentSignatures
from tiny_models import VOCAB


def _documents(count: int = 6, length: int = 300, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, size=length).astype(np.int32) for _ in range(count)]


def _near_copy(doc: np.ndarray) -> np.ndarray:
    """One token of 300 substituted: shingle Jaccard ~0.98."""
    out = doc.copy()
    out[150] = 3 if out[150] != 3 else 4
    return out


# --------------------------------------------------------------------------- build, save, load


def test_dedup_at_build_drops_a_near_duplicate_and_an_exact_copy_and_keeps_distinct_documents():
    a, c, d = _documents(3)
    index = CorpusIndex.build([a, _near_copy(a), c, a.copy(), d], vocab_size=VOCAB, dedup_threshold=0.9,
                              show_progress=False)
    assert index.dropped_documents == 2
    assert index.num_documents == 3
    for doc_idx, want in enumerate([a, c, d]):
        assert np.array_equal(index.document(doc_idx), want)
    assert index.signatures == DocumentSignatures.from_documents([a, c, d])


def test_build_without_dedup_keeps_every_document_and_no_signatures_unless_asked():
    docs = _documents(3)
    plain = CorpusIndex.build(docs + [docs[0]], vocab_size=VOCAB, show_progress=False)
    assert plain.num_documents == 4 and plain.dropped_documents == 0 and plain.signatures is None
    signed = CorpusIndex.build(docs, vocab_size=VOCAB, signatures=True, show_progress=False)
    assert signed.num_documents == 3 and signed.signatures == DocumentSignatures.from_documents(docs)


def test_signatures_survive_save_and_load_in_the_index_file(tmp_path):
    docs = _documents(4)
    index = CorpusIndex.build(docs, vocab_size=VOCAB, dedup_threshold=0.9, show_progress=False)
    path = tmp_path / "corpus.idx"
    index.save(path)
    assert os.listdir(tmp_path) == ["corpus.idx"]
    loaded = CorpusIndex.load(path)
    assert loaded.signatures == index.signatures and not loaded.signatures.matrix.flags.writeable
    hits = loaded.retriever().top_k(docs[2][40:100], 2, score="containment")
    assert hits[0] == (2, 1.0)
    loaded.save(tmp_path / "again.idx")  # a loaded index saved again keeps them
    assert CorpusIndex.load(tmp_path / "again.idx").signatures == index.signatures


def test_signatures_of_a_loaded_index_outlive_the_index_object(tmp_path):
    # They view the mapped file: the views keep it mapped (a view of an unmapped file crashed).
    docs = _documents(3)
    CorpusIndex.build(docs, vocab_size=VOCAB, signatures=True, show_progress=False).save(tmp_path / "c.idx")
    sigs = CorpusIndex.load(tmp_path / "c.idx").signatures
    gc.collect()
    assert sigs == DocumentSignatures.from_documents(docs)


def test_an_index_saved_without_signatures_over_one_with_them_has_none(tmp_path):
    path = tmp_path / "corpus.idx"
    CorpusIndex.build(_documents(3), vocab_size=VOCAB, signatures=True, show_progress=False).save(path)
    CorpusIndex.build(_documents(2, seed=1), vocab_size=VOCAB, show_progress=False).save(path)
    assert CorpusIndex.load(path).signatures is None
    with pytest.raises(ValueError, match="no MinHash signatures"):
        CorpusIndex.load(path).retriever()


def test_a_signature_file_of_the_old_format_beside_the_index_is_named_with_the_fix(tmp_path):
    # refdec wrote the signatures to <index>.minhash before the index file had MinHash sections
    path = tmp_path / "corpus.idx"
    CorpusIndex.build(_documents(3), vocab_size=VOCAB, show_progress=False).save(path)
    (tmp_path / "corpus.idx.minhash").write_bytes(b"RDMINHSH" + bytes(56))
    where = re.escape(str(path))
    with pytest.raises(ValueError, match=rf"{where}\.minhash: .*separate file.*rebuild {where} "):
        CorpusIndex.load(path).retriever()


def test_add_documents_extends_the_signatures_one_row_per_document():
    docs = _documents(4)
    index = CorpusIndex.build(docs[:2], vocab_size=VOCAB, signatures=True, show_progress=False)
    index.add_documents(docs[2:])
    assert index.signatures == DocumentSignatures.from_documents(docs)
    assert index.retriever().top_k(docs[3][:50], 1)[0][0] == 3
