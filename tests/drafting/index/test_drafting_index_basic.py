"""Specifies refdec.drafting.index by hand-written cases, each named by the situation it covers.

Every query case runs on two forms of the same corpus: the index as built (in
memory) and the same index saved and memory-mapped back. Each module's own cases
are in tests/test_drafting_index_<module>.py.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import refdec
from refdec import CorpusIndex


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


# ---------------------------------------------------------------------------
# Concurrency


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


def test_package_exports():
    for name in ("CorpusIndex", "ContextIndex", "IndexFormatError", "DraftTree", "Proposer"):
        assert hasattr(refdec, name)
