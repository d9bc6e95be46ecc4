"""refdec.serve.corpora: names, the default corpus, per-request choice, and ``--index``'s forms."""

import pytest

from refdec.serve.corpora import MAX_CORPORA, CorpusRegistry, check_name, parse_index_argument
from tests.tiny_models import errors_in_threads


class FakeIndex:
    num_documents = 2
    nbytes = 100

    def __len__(self):
        return 7


def test_the_first_file_corpus_is_the_default_and_a_request_may_name_another_or_none():
    registry = CorpusRegistry()
    a, b = FakeIndex(), FakeIndex()
    registry.add("docs", a, "file")
    registry.add("code", b, "file")
    assert registry.default == "docs"
    assert registry.index_for(None) is a and registry.index_for("code") is b and registry.index_for("") is None
    with pytest.raises(KeyError):
        registry.index_for("nope")
    registry.remove("docs")
    assert registry.default is None and registry.index_for(None) is None
    assert registry.describe() == [{"id": "code", "object": "corpus", "origin": "file", "default": False,
                                    "documents": 2, "tokens": 7, "bytes": 100}]


def test_a_corpus_added_by_request_never_becomes_the_default():
    registry = CorpusRegistry()
    registry.add("mine", FakeIndex(), "request")
    assert registry.default is None and registry.index_for(None) is None


def test_names_are_checked_and_unique_and_the_count_bounded():
    registry = CorpusRegistry()
    for bad in ("", "../etc", "a b", "-x", "x" * 65, None):
        with pytest.raises(ValueError, match="corpus name"):
            registry.add(bad, FakeIndex(), "request")
    registry.add("x", FakeIndex(), "request")
    with pytest.raises(KeyError):
        registry.add("x", FakeIndex(), "request")
    for i in range(MAX_CORPORA - 1):
        registry.add(f"c{i}", FakeIndex(), "request")
    with pytest.raises(OverflowError, match="at most"):
        registry.add("one-more", FakeIndex(), "request")
    assert check_name("Ab.c_d-1") == "Ab.c_d-1"


def test_index_arguments_name_their_corpus():
    assert parse_index_argument("docs=/data/a.refdec") == ("docs", "/data/a.refdec")
    assert parse_index_argument("/data/stdlib.refdec") == ("stdlib", "/data/stdlib.refdec")
    with pytest.raises(ValueError, match="corpus name"):
        parse_index_argument("bad name=/x.refdec")


def test_adds_removes_and_reads_from_many_threads_agree():
    registry = CorpusRegistry()

    def work(k):
        for i in range(200):
            name = f"t{k}-{i % 5}"
            if name in registry:
                registry.remove(name)
            else:
                registry.add(name, FakeIndex(), "request")
            registry.describe()

    assert not errors_in_threads(work)
    assert len(registry) == len(registry.describe())
