"""Specifies refdec.drafting.index.queries: the four queries every token index answers, their
arguments checked once with the argument named."""

from __future__ import annotations

import pytest

from refdec import ContextIndex, CorpusIndex
from refdec.drafting.index.queries import AutomatonQueries

TOKENS = [1, 2, 3, 1, 2, 4, 1, 2, 3]


@pytest.mark.parametrize("make", [lambda: CorpusIndex.build([TOKENS], show_progress=False),
                                  lambda: ContextIndex(TOKENS)], ids=["corpus", "context"])
def test_a_corpus_and_a_context_of_one_document_answer_alike(make):
    index = make()
    assert isinstance(index, AutomatonQueries)
    assert index.match_length([9, 1, 2, 3]) == 3
    assert index.count([1, 2]) == 3 and index.count([]) == len(TOKENS)
    assert index.next_tokens([1, 2], 5) == [(3, 2), (4, 1)]
    assert index.continuation([2, 4], 3).tolist() == [1, 2, 3]


@pytest.mark.parametrize("call, name", [(lambda i: i.next_tokens([1], -1), "k"),
                                        (lambda i: i.next_tokens([1], 2.5), "k"),
                                        (lambda i: i.continuation([1], -3), "length"),
                                        (lambda i: i.continuation([1], "4"), "length")])
def test_a_bad_k_or_length_is_a_value_error_naming_it(call, name):
    with pytest.raises(ValueError, match=name):
        call(ContextIndex(TOKENS))
