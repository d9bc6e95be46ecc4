"""Specifies refdec.drafting.index by hand-written cases, each named by the situation it covers.

Every query case runs on three forms of the same corpus: the index as built
(in memory), the same index saved and memory-mapped back, and (for the live
context) a ContextIndex.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import refdec
from refdec import ContextIndex, CorpusIndex, IndexFormatError
from refdec.drafting.index import tokenizer_fingerprint
from word_tokenizer import WordTokenizer


@pytest.fixture(params=["built", "loaded"])
def make_index(request, tmp_path):
    """make_index(documents) -> CorpusIndex, built in memory or saved and loaded."""

    def make(documents, **kwargs):
        index = CorpusIndex.build(documents, show_progress=False, **kwargs)
        if request.param == "loaded":
            path = tmp_path / "index.refdec"
            index.save(path)
            index = CorpusIndex.load(path)
        return index

    return make


# ---------------------------------------------------------------------------
# Documents and boundaries


def test_match_across_a_document_boundary_is_not_allowed(make_index):
    index = make_index([[1, 2, 3], [4, 5]])
    assert index.match_length([3, 4]) == 1  # only "4"
    assert index.count([3, 4]) == 0
    assert index.next_tokens([3], 5) == []  # 3 ends its document
    assert index.continuation([2, 3], 5).tolist() == []


def test_continuation_stops_at_the_document_end(make_index):
    index = make_index([[1, 2, 3, 4], [9, 9]])
    assert index.continuation([2], 10).tolist() == [3, 4]
    assert index.continuation([2], 1).tolist() == [3]
    assert index.continuation([2], 0).tolist() == []


def test_continuation_prefers_an_occurrence_that_continues(make_index):
    # The first occurrence of [5, 6] ends document 0; the second one continues.
    index = make_index([[5, 6], [5, 6, 7, 8]])
    assert index.continuation([5, 6], 10).tolist() == [7, 8]


def test_continuation_follows_the_most_frequent_branch(make_index):
    index = make_index([[1, 2, 3], [1, 2, 3], [1, 2, 4]])
    assert index.continuation([1], 5).tolist() == [2, 3]


def test_same_prefix_in_two_documents_counts_both(make_index):
    # Generalised construction, reuse case: "1 2" of document 1 reuses the states of document 0.
    index = make_index([[1, 2], [1, 2, 3]])
    assert index.count([1, 2]) == 2
    assert index.count([2]) == 2
    assert index.count([2, 3]) == 1
    assert index.next_tokens([1, 2], 5) == [(3, 1)]


def test_clone_state_counts(make_index):
    # Within one document: "1 2" then "2" alone forces a clone of the state of "1 2".
    index = make_index([[1, 2, 3, 2, 4]])
    assert index.count([2]) == 2
    assert index.count([1, 2]) == 1
    assert index.next_tokens([2], 5) == [(3, 1), (4, 1)]


def test_clone_state_counts_across_documents(make_index):
    # Document 1 starts with "2", a state shared with "1 2" of document 0: clone on the reuse path.
    index = make_index([[1, 2, 3], [2, 3]])
    assert index.count([2]) == 2
    assert index.count([2, 3]) == 2
    assert index.count([1, 2]) == 1
    assert index.count([1, 2, 3]) == 1
    assert index.match_length([7, 2, 3]) == 2


def test_empty_document_and_empty_query(make_index):
    index = make_index([[], [4, 4, 4], []])
    assert len(index) == 3
    assert index.num_documents == 3
    assert index.count([]) == 3  # convention: one per token position
    assert index.count([4, 4]) == 2
    assert index.next_tokens([], 5) == [(4, 3)]
    assert index.document(1).tolist() == [4, 4, 4]
    assert index.document(0).tolist() == []
    assert index.document(-1).tolist() == []


def test_next_tokens_ranks_by_count_then_smaller_token(make_index):
    index = make_index([[1, 9, 1, 8, 1, 8, 1, 7, 1, 9]])
    assert index.next_tokens([1], 10) == [(8, 2), (9, 2), (7, 1)]
    assert index.next_tokens([1], 1) == [(8, 2)]
    assert index.next_tokens([1], 0) == []


def test_token_ids_above_16_bits_round_trip(make_index):
    big = [262_143, 262_142, 2**31 - 1]
    index = make_index([big + big])
    assert index.count(big) == 2
    assert index.continuation(big[:1], 3).tolist() == big[1:] + big[:1]


def test_ids_at_or_above_the_vocab_size_do_not_match(make_index):
    index = make_index([[1, 2, 3]], vocab_size=10)
    assert index.vocab_size == 10
    assert index.match_length([1, 2, 10]) == 0
    assert index.count([10]) == 0
    assert index.next_tokens([10], 3) == []


def test_build_rejects_ids_at_or_above_the_vocab_size():
    with pytest.raises(ValueError, match="12"):
        CorpusIndex.build([[1, 12]], vocab_size=10, show_progress=False)


@pytest.mark.parametrize("bad", [-1, 2**31, -(2**40)])
def test_out_of_range_token_ids_raise_value_error_naming_the_value(make_index, bad):
    index = make_index([[1, 2, 3]])
    with pytest.raises(ValueError, match=str(bad)):
        index.match_length([1, bad])
    with pytest.raises(ValueError, match=str(bad)):
        CorpusIndex.build([[bad]], show_progress=False)


def test_non_integer_tokens_raise_value_error(make_index):
    index = make_index([[1, 2, 3]])
    with pytest.raises(ValueError, match="float"):
        index.count(np.array([1.5]))
    with pytest.raises(ValueError, match="str"):
        index.count("abc")


def test_str_document_without_a_tokenizer_raises_value_error():
    with pytest.raises(ValueError, match="tokenizer"):
        CorpusIndex.build(["some text"], show_progress=False)


# ---------------------------------------------------------------------------
# Growing, saving, loading


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


def test_concurrent_queries_on_a_loaded_index_agree(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "c.refdec"
    CorpusIndex.build([rng.integers(0, 8, size=5000).tolist()], show_progress=False).save(path)
    index = CorpusIndex.load(path)
    queries = [rng.integers(0, 8, size=6).tolist() for _ in range(200)]
    expected = [(index.match_length(q), index.count(q), index.next_tokens(q, 3)) for q in queries]
    results = [None] * 4

    def work(slot):
        results[slot] = [(index.match_length(q), index.count(q), index.next_tokens(q, 3)) for q in queries]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r == expected for r in results)


# ---------------------------------------------------------------------------
# Live context


def test_context_match_is_the_longest_suffix_that_occurred_earlier_with_a_continuation():
    ctx = ContextIndex([1, 2, 3, 1, 2])
    assert ctx.current_match_length == 2
    state, length = ctx.match_state()
    assert length == 2 and state > 0
    ctx.extend([3])
    assert ctx.current_match_length == 3
    ctx.extend(9)
    assert ctx.current_match_length == 0
    assert len(ctx) == 7
    assert ctx.tokens().tolist() == [1, 2, 3, 1, 2, 3, 9]


def test_context_counts_stay_current_while_growing():
    ctx = ContextIndex()
    stream = [1, 2, 1, 2, 3, 1, 2, 1]
    for i, token in enumerate(stream):
        ctx.extend([token])
        seen = stream[: i + 1]
        assert ctx.count([1]) == seen.count(1)
        assert ctx.count([1, 2]) == sum(seen[j : j + 2] == [1, 2] for j in range(len(seen)))


def test_context_counts_after_a_suffix_link_chain_longer_than_the_incremental_walk():
    # "7 7 7 ..." makes a suffix-link chain as long as the run, past the
    # incremental-count walk limit: counts fall back to one recomputation.
    ctx = ContextIndex([7] * 100)
    ctx.count([7])
    ctx.extend([7] * 100)
    assert ctx.count([7]) == 200
    assert ctx.count([7] * 150) == 51
    assert ctx.current_match_length == 199


def test_context_continuation_reads_up_to_the_current_end():
    ctx = ContextIndex([4, 5, 6, 7, 4, 5])
    assert ctx.continuation([4, 5], 10).tolist() == [6, 7, 4, 5]
    assert ctx.next_tokens([5], 3) == [(6, 1)]


def test_package_exports():
    for name in ("CorpusIndex", "ContextIndex", "IndexFormatError", "DraftTree", "Proposer"):
        assert hasattr(refdec, name)
