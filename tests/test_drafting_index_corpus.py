"""Specifies refdec.drafting.index.corpus: the corpus index built, grown, saved atomically, loaded
memory-mapped, checked (format errors naming the file, the tokenizer's fingerprint on load) and
verified. tests/drafting/index/ has the file format byte by byte, fuzzing and retrieval."""

from __future__ import annotations

import numpy as np
import pytest

from refdec import CorpusIndex, IndexFormatError
from refdec.drafting.index import tokenizer_fingerprint
from word_tokenizer import WordTokenizer


def test_add_documents_grows_a_built_index():
    index = CorpusIndex.build([[1, 2, 3]], show_progress=False)
    assert index.count([2, 3]) == 1
    index.add_documents([[2, 3, 4]])
    assert index.count([2, 3]) == 2
    assert index.num_documents == 2
    assert len(index) == 6
    assert index.next_tokens([2, 3], 5) == [(4, 1)]


def test_add_documents_on_a_loaded_index_raises_value_error(tmp_path):
    path = tmp_path / "a.refdec"
    CorpusIndex.build([[1, 2, 3]], show_progress=False).save(path)
    index = CorpusIndex.load(path)
    with pytest.raises(ValueError, match="loaded"):
        index.add_documents([[4]])


def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 5, size=n).tolist() for n in (50, 0, 120, 1, 30)]
    built = CorpusIndex.build(docs, show_progress=False, vocab_size=5)
    path = tmp_path / "round.refdec"
    built.save(path)
    loaded = CorpusIndex.load(path)
    assert loaded.path == str(path) and built.path == str(path)
    assert (len(loaded), loaded.num_documents, loaded.vocab_size) == (len(built), 5, 5)
    assert loaded.nbytes == path.stat().st_size == built.nbytes
    assert loaded.verify()
    for doc_idx, doc in enumerate(docs):
        assert loaded.document(doc_idx).tolist() == doc
    for _ in range(200):
        q = rng.integers(0, 6, size=rng.integers(0, 5)).tolist()
        assert loaded.match_length(q) == built.match_length(q)
        assert loaded.count(q) == built.count(q)
        assert loaded.next_tokens(q, 3) == built.next_tokens(q, 3)
        assert loaded.continuation(q, 7).tolist() == built.continuation(q, 7).tolist()
    assert "5 documents" in repr(loaded)


def test_save_leaves_no_temporary_file(tmp_path):
    CorpusIndex.build([[1]], show_progress=False).save(tmp_path / "x.refdec")
    assert [p.name for p in tmp_path.iterdir()] == ["x.refdec"]


def test_truncated_file_raises_index_format_error_naming_the_file(tmp_path):
    path = tmp_path / "t.refdec"
    CorpusIndex.build([[1, 2, 3] * 50], show_progress=False).save(path)
    path.write_bytes(path.read_bytes()[:-64])
    with pytest.raises(IndexFormatError, match=r"t\.refdec.*(truncated|size)"):
        CorpusIndex.load(path)


def test_foreign_file_raises_index_format_error(tmp_path):
    path = tmp_path / "foreign.bin"
    path.write_bytes(b"PK\x03\x04" + bytes(1000))
    with pytest.raises(IndexFormatError, match=r"foreign\.bin.*magic"):
        CorpusIndex.load(path)
    assert issubclass(IndexFormatError, ValueError)


def test_other_version_raises_index_format_error_naming_the_version(tmp_path):
    path = tmp_path / "v.refdec"
    CorpusIndex.build([[1, 2]], show_progress=False).save(path)
    data = bytearray(path.read_bytes())
    data[8:12] = (7).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match="version 7"):
        CorpusIndex.load(path)


def test_flipped_body_byte_fails_verify_but_queries_still_answer(tmp_path):
    path = tmp_path / "f.refdec"
    CorpusIndex.build([[1, 2, 3, 1, 2, 4]], show_progress=False).save(path)
    data = bytearray(path.read_bytes())
    data[600] ^= 0xFF
    path.write_bytes(bytes(data))
    index = CorpusIndex.load(path)
    assert not index.verify()
    index.match_length([1, 2, 3])  # degraded answers allowed, no crash


def test_str_documents_are_tokenised_and_the_fingerprint_is_checked_on_load(tmp_path):
    tok = WordTokenizer(["a", "b", "c", "d"])
    index = CorpusIndex.build(["a b c", [1, 2], "b c d"], tok, show_progress=False)
    assert [index.document(i).tolist() for i in range(3)] == [[0, 1, 2], [1, 2], [1, 2, 3]]
    assert index.vocab_size == 4
    assert index.fingerprint == tokenizer_fingerprint(tok) and len(index.fingerprint) == 64
    assert index.count([1, 2]) == 3
    path = tmp_path / "tok.refdec"
    index.save(path)
    assert CorpusIndex.load(path, tok).fingerprint == index.fingerprint
    other = WordTokenizer(["a", "b", "c", "e"])
    with pytest.raises(IndexFormatError) as info:
        CorpusIndex.load(path, other)
    assert index.fingerprint in str(info.value) and tokenizer_fingerprint(other) in str(info.value)
