"""Specifies refdec.drafting.index.documents: documents into checked token ids (str tokenised in
batches, id sequences checked against the vocabulary, each bad value named with its document and
position) and the tokenizer fingerprint an index is stamped with."""

from __future__ import annotations

import numpy as np
import pytest

from refdec import CorpusIndex
from refdec.drafting.index.documents import tokenize_documents, tokenizer_fingerprint
from word_tokenizer import WordTokenizer


def test_str_documents_are_tokenised_in_batches_and_id_documents_pass_through_in_order():
    tok = WordTokenizer(["a", "b", "c"])
    docs = ["a b", np.array([2, 1], dtype=np.int64), "c"] * 200  # more than one batch of 256
    out = list(tokenize_documents(docs, tok, vocab_size=3, show_progress=False))
    assert [a.tolist() for a in out[:3]] == [[0, 1], [2, 1], [2]] and len(out) == 600
    assert all(a.dtype == np.int32 for a in out)


def test_an_id_at_or_above_the_vocabulary_is_named_with_its_document_and_position():
    with pytest.raises(ValueError, match=r"documents\[1\]\[2\] = 7 is not below the vocabulary size 5"):
        list(tokenize_documents([[1], [0, 1, 7]], None, vocab_size=5, show_progress=False))


def test_the_fingerprint_is_the_vocabularys_memoised_and_a_tokenizers_own_when_it_has_one():
    first, same, other = WordTokenizer(["a", "b"]), WordTokenizer(["a", "b"]), WordTokenizer(["a", "c"])
    fp = tokenizer_fingerprint(first)
    assert len(fp) == 64 and tokenizer_fingerprint(first) == fp == tokenizer_fingerprint(same)
    assert tokenizer_fingerprint(other) != fp

    class OwnFingerprint:
        def fingerprint(self):
            return "f" * 64

    assert tokenizer_fingerprint(OwnFingerprint()) == "f" * 64


def test_build_rejects_ids_at_or_above_the_vocab_size():
    with pytest.raises(ValueError, match="12"):
        CorpusIndex.build([[1, 12]], vocab_size=10, show_progress=False)


def test_str_document_without_a_tokenizer_raises_value_error():
    with pytest.raises(ValueError, match="tokenizer"):
        CorpusIndex.build(["some text"], show_progress=False)
