"""Specifies refdec.drafting.index by property tests: the suffix-automaton indexes answer exactly like the
naive reference.

Documents are random token runs over tiny alphabets (2-5 symbols, so that
runs repeat a lot), mapped onto three id ranges: small ids, ids around 2**18
(Gemma's vocabulary is 262,144 = 2**18: ids need more than 16 bits) and ids
just below 2**31 - 1 (the largest int32). Every answer of ``CorpusIndex``,
of a saved-then-memory-mapped ``CorpusIndex`` and of ``ContextIndex`` is
compared with ``tests/naive_index.py``. Draft trees of ``Proposer`` are
checked for shape (parents before children, budget, depth, distinct siblings,
scores in (0, 1] not growing along a path), for provenance (every path follows
the matched suffix of the context in some source) and for liveness.

``REFDEC_HYPOTHESIS_SCALE=N`` multiplies the number of examples (a longer hunt).
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from naive_index import NaiveContext, NaiveIndex, assert_loaded_like_built, occurs_in
from refdec.drafting.index import ContextIndex, CorpusIndex

INT32_MAX = 2**31 - 1

# Symbol s of an alphabet of size a maps to the token id base + s. The id
# base - 1 (or base + a) is a valid id that no document holds.
ID_RANGES = {
    "small": lambda a: 0,
    "near_2_18": lambda a: 2**18 - 2,
    "near_int32_max": lambda a: INT32_MAX - a + 1,
}

# REFDEC_HYPOTHESIS_SCALE=20 multiplies the examples for a longer bug hunt.
_SCALE = max(1, int(os.environ.get("REFDEC_HYPOTHESIS_SCALE", "1")))
FAST = settings(deadline=None, max_examples=120 * _SCALE, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(deadline=None, max_examples=60 * _SCALE, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def alphabets(draw):
    """(symbols used by documents, one valid id that no document holds)."""
    size = draw(st.integers(2, 5))
    base = ID_RANGES[draw(st.sampled_from(sorted(ID_RANGES)))](size)
    symbols = [base + s for s in range(size)]
    unused = base - 1 if base > 0 else base + size
    return symbols, unused


@st.composite
def corpora(draw, max_docs=5, max_len=24, allow_empty_docs=True):
    symbols, unused = draw(alphabets())
    n_docs = draw(st.integers(1, max_docs))
    min_len = 0 if allow_empty_docs else 1
    docs = [draw(st.lists(st.sampled_from(symbols), min_size=min_len, max_size=max_len)) for _ in range(n_docs)]
    return docs, symbols, unused


def draw_queries(data, docs, symbols, unused, n=12):
    """Query runs: random ones (mostly misses) and runs cut out of the documents (hits)."""
    query_symbols = symbols + [unused]
    queries = [[]]
    for _ in range(n):
        kind = data.draw(st.sampled_from(["random", "substring", "substring+1"]))
        nonempty = [d for d in docs if d]
        if kind == "random" or not nonempty:
            queries.append(data.draw(st.lists(st.sampled_from(query_symbols), min_size=1, max_size=8)))
            continue
        doc = data.draw(st.sampled_from(nonempty))
        start = data.draw(st.integers(0, len(doc) - 1))
        stop = data.draw(st.integers(start + 1, len(doc)))
        query = list(doc[start:stop])
        if kind == "substring+1":
            query.append(data.draw(st.sampled_from(query_symbols)))
        queries.append(query)
    return queries


def as_array(query):
    return np.asarray(query, dtype=np.int32)


def check_same_answers(index, naive: NaiveIndex, queries, *, label: str) -> None:
    """Every query answer of ``index`` equals the naive reference's."""
    for query in queries:
        for form in (list(query), as_array(query)):
            got = index.match_length(form)
            assert isinstance(got, int), f"{label}: match_length returned {type(got)}"
            assert got == naive.match_length(query), f"{label}: match_length({query})"
            assert index.count(form) == naive.count(query), f"{label}: count({query})"
            for k in (1, 2, 100):
                got_next = [(int(t), int(c)) for t, c in index.next_tokens(form, k)]
                assert got_next == naive.next_tokens(query, k), f"{label}: next_tokens({query}, {k})"
            for length in (0, 1, 3, 50):
                cont = index.continuation(form, length)
                assert isinstance(cont, np.ndarray), f"{label}: continuation returned {type(cont)}"
                assert len(cont) <= length
                assert naive.is_valid_continuation(query, length, cont.tolist()), (
                    f"{label}: continuation({query}, {length}) = {cont.tolist()} is the text after no "
                    f"occurrence; valid answers: {naive.continuations(query, length)}"
                )


def check_match_length_stream(index, naive: NaiveIndex, stream, *, label: str) -> None:
    """match_length on every prefix of a query stream (the decoding access pattern)."""
    for i in range(1, len(stream) + 1):
        prefix = stream[:i]
        assert index.match_length(prefix) == naive.match_length(prefix), f"{label}: match_length({prefix})"


# ---------------------------------------------------------------------------
# CorpusIndex


@FAST
@given(corpora(), st.data())
def test_corpus_index_answers_equal_the_naive_reference(corpus, data):
    docs, symbols, unused = corpus
    index = CorpusIndex.build(docs, show_progress=False)
    naive = NaiveIndex(docs)
    assert len(index) == len(naive)
    assert index.num_documents == len(docs)
    assert index.vocab_size == 0 or index.vocab_size > max(symbols)  # 0 = unknown
    for doc_idx, doc in enumerate(docs):
        assert index.document(doc_idx).tolist() == doc
    check_same_answers(index, naive, draw_queries(data, docs, symbols, unused), label="built")
    stream = data.draw(st.lists(st.sampled_from(symbols + [unused]), max_size=30))
    check_match_length_stream(index, naive, stream, label="built")


@FAST
@given(corpora(), st.data())
def test_corpus_index_from_int32_arrays_equals_from_lists(corpus, data):
    docs, symbols, unused = corpus
    from_lists = CorpusIndex.build(docs, show_progress=False)
    from_arrays = CorpusIndex.build([np.asarray(d, dtype=np.int32) for d in docs], show_progress=False)
    naive = NaiveIndex(docs)
    assert len(from_arrays) == len(from_lists)
    for query in draw_queries(data, docs, symbols, unused, n=6):
        assert from_arrays.match_length(query) == from_lists.match_length(query)
        assert from_arrays.next_tokens(query, 10) == from_lists.next_tokens(query, 10)
        if query:
            assert from_arrays.count(query) == naive.count(query)


@SLOW
@given(corpora(), st.data())
def test_corpus_index_answers_are_unchanged_by_save_and_mmap_load(corpus, data):
    docs, symbols, unused = corpus
    built = CorpusIndex.build(docs, show_progress=False)
    naive = NaiveIndex(docs)
    queries = draw_queries(data, docs, symbols, unused)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "corpus.refdec")
        built.save(path)
        loaded = CorpusIndex.load(path)
        assert_loaded_like_built(loaded, built, docs)
        check_same_answers(loaded, naive, queries, label="loaded")
        for query in queries:
            # Deterministic: the loaded index picks the same occurrence as the built one.
            assert loaded.continuation(query, 8).tolist() == built.continuation(query, 8).tolist()
        del loaded


@SLOW
@given(corpora(max_docs=3), st.data())
def test_corpus_index_add_documents_equals_building_all_at_once(first, data):
    docs_a, symbols, unused = first
    docs_b = data.draw(st.lists(st.lists(st.sampled_from(symbols), max_size=20), min_size=1, max_size=3))
    grown = CorpusIndex.build(docs_a, show_progress=False)
    grown.add_documents(docs_b)
    naive = NaiveIndex(docs_a + docs_b)
    assert len(grown) == len(naive)
    assert grown.num_documents == len(docs_a) + len(docs_b)
    check_same_answers(grown, naive, draw_queries(data, docs_a + docs_b, symbols, unused), label="grown")


# ---------------------------------------------------------------------------
# ContextIndex


@FAST
@given(alphabets(), st.data())
def test_context_current_match_length_is_longest_suffix_seen_earlier_with_a_continuation(alphabet, data):
    symbols, _ = alphabet
    stream = data.draw(st.lists(st.sampled_from(symbols), max_size=40))
    ctx = ContextIndex()
    naive = NaiveContext()
    assert len(ctx) == 0
    assert ctx.current_match_length == 0
    for i, token in enumerate(stream):
        ctx.extend([token])
        naive.extend([token])
        assert len(ctx) == i + 1
        assert ctx.current_match_length == naive.current_match_length, f"after {stream[: i + 1]}"


@FAST
@given(alphabets(), st.data())
def test_context_index_answers_equal_the_naive_reference(alphabet, data):
    symbols, unused = alphabet
    stream = data.draw(st.lists(st.sampled_from(symbols), max_size=30))
    ctx = ContextIndex(stream)
    naive = NaiveIndex([stream])
    assert len(ctx) == len(stream)
    check_same_answers(ctx, naive, draw_queries(data, [stream], symbols, unused, n=8), label="context")


@FAST
@given(alphabets(), st.data())
def test_context_index_grown_in_chunks_equals_built_at_once(alphabet, data):
    symbols, unused = alphabet
    stream = data.draw(st.lists(st.sampled_from(symbols), max_size=40))
    at_once = ContextIndex(stream)
    grown = ContextIndex()
    naive = NaiveContext()
    pos = 0
    while pos < len(stream):
        step = data.draw(st.integers(1, 6))
        chunk = stream[pos : pos + step]
        grown.extend(np.asarray(chunk, dtype=np.int32) if step % 2 else chunk)
        naive.extend(chunk)
        pos += len(chunk)
        assert grown.current_match_length == naive.current_match_length, f"after {stream[:pos]}"
        # Queries interleaved with growth (counts must stay current).
        probe = stream[max(0, pos - 3) : pos]
        assert grown.count(probe) == naive.count(probe)
        assert grown.next_tokens(probe[-1:], 5) == naive.next_tokens(probe[-1:], 5)
    assert len(grown) == len(at_once) == len(stream)
    assert grown.current_match_length == at_once.current_match_length
    for query in draw_queries(data, [stream], symbols, unused, n=8):
        assert grown.match_length(query) == at_once.match_length(query)
        assert grown.next_tokens(query, 10) == at_once.next_tokens(query, 10)
        if query:
            assert grown.count(query) == at_once.count(query)


# ---------------------------------------------------------------------------
# Input checks


@pytest.mark.parametrize("method", ["match_length", "count", "next_tokens", "continuation"])
@pytest.mark.parametrize("make", ["corpus", "context"])
def test_negative_token_id_in_a_query_raises_value_error_naming_it(method, make):
    index = CorpusIndex.build([[1, 2, 3]], show_progress=False) if make == "corpus" else ContextIndex([1, 2, 3])
    args = {"match_length": (), "count": (), "next_tokens": (3,), "continuation": (3,)}[method]
    for query in ([1, -7], np.asarray([1, -7], dtype=np.int32)):
        with pytest.raises(ValueError, match="-7"):
            getattr(index, method)(query, *args)


def test_negative_token_id_in_a_document_raises_value_error_naming_it():
    with pytest.raises(ValueError, match="-3"):
        CorpusIndex.build([[1, 2], [4, -3, 5]], show_progress=False)
    with pytest.raises(ValueError, match="-4"):
        ContextIndex([1, -4])
    ctx = ContextIndex([1, 2])
    with pytest.raises(ValueError, match="-5"):
        ctx.extend([3, -5])
    index = CorpusIndex.build([[1, 2]], show_progress=False)
    with pytest.raises(ValueError, match="-6"):
        index.add_documents([[-6]])


@pytest.mark.parametrize("make", ["corpus", "context"])
@pytest.mark.parametrize("big", [3, 262_144, 262_145, 2**20, INT32_MAX])
def test_token_id_beyond_the_vocabulary_is_no_match_never_a_crash(make, big):
    docs = [[0, 1, 2, 0, 1]]
    index = CorpusIndex.build(docs, show_progress=False) if make == "corpus" else ContextIndex(docs[0])
    assert index.match_length([0, 1, big]) == 0
    assert index.match_length([big, 0, 1]) == 2
    assert index.count([big]) == 0
    assert index.count([0, big]) == 0
    assert index.next_tokens([big], 4) == []
    assert index.continuation([big], 4).tolist() == []


@pytest.mark.parametrize("huge", [2**31, 2**40])
def test_token_id_beyond_int32_is_no_match_or_a_value_error_naming_it(huge):
    index = CorpusIndex.build([[0, 1, 2]], show_progress=False)
    try:
        got = index.match_length([0, huge])
    except (ValueError, OverflowError) as exc:
        assert str(huge) in str(exc)
    else:
        assert got == 0


def test_explicit_vocab_size_rejects_larger_document_ids_and_answers_ids_above_as_no_match():
    index = CorpusIndex.build([[0, 1, 2]], show_progress=False, vocab_size=10)
    assert index.vocab_size == 10
    assert index.match_length([9]) == 0
    assert index.match_length([11]) == 0
    with pytest.raises(ValueError, match="12"):
        CorpusIndex.build([[0, 12]], show_progress=False, vocab_size=10)


def test_vocab_size_of_2_to_the_31_holds_the_largest_int32_id_through_save_and_load(tmp_path):
    top = INT32_MAX
    index = CorpusIndex.build([[top, top - 1, top]], show_progress=False, vocab_size=2**31)
    index.save(tmp_path / "top.refdec")
    loaded = CorpusIndex.load(tmp_path / "top.refdec")
    assert loaded.vocab_size == 2**31
    assert loaded.count([top]) == 2
    assert loaded.next_tokens([top - 1], 2) == [(top, 1)]
    with pytest.raises(ValueError, match=str(2**31 + 1)):
        CorpusIndex.build([[1]], show_progress=False, vocab_size=2**31 + 1)


def test_empty_documents_count_as_documents_and_hold_nothing():
    index = CorpusIndex.build([[], [5, 6], []], show_progress=False)
    assert index.num_documents == 3
    assert len(index) == 2
    assert index.document(0).tolist() == []
    assert index.document(1).tolist() == [5, 6]
    assert index.count([5, 6]) == 1
    assert index.next_tokens([6], 3) == []


def test_continuation_never_crosses_a_document_end():
    # "1 2" ends document 0 and is followed by "9" only across the boundary.
    index = CorpusIndex.build([[7, 1, 2], [9, 9, 9]], show_progress=False)
    assert index.continuation([1, 2], 5).tolist() == []
    assert index.next_tokens([2], 5) == []
    assert index.match_length([1, 2, 9]) == 1
    assert index.count([2, 9]) == 0


def test_add_documents_after_queries_updates_the_answers():
    # The frozen view used by queries must not go stale when documents are added.
    index = CorpusIndex.build([[1, 2, 3]], show_progress=False)
    assert index.count([2, 3]) == 1
    assert index.next_tokens([2], 5) == [(3, 1)]
    index.add_documents([[2, 3, 2, 4]])
    assert index.count([2, 3]) == 2
    assert index.next_tokens([2], 5) == [(3, 2), (4, 1)]
    assert index.num_documents == 2 and len(index) == 7


def test_build_accepts_any_iterable_of_documents():
    docs = [[1, 2, 3], [3, 2, 1]]
    from_generator = CorpusIndex.build((d for d in docs), show_progress=False)
    from_tuple = CorpusIndex.build(tuple(tuple(d) for d in docs), show_progress=False)
    from_int64 = CorpusIndex.build([np.asarray(d, dtype=np.int64) for d in docs], show_progress=False)
    for index in (from_generator, from_tuple, from_int64):
        assert index.num_documents == 2 and index.count([2]) == 2


def test_frozen_index_answers_concurrent_queries_from_threads_identically(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 5, size=400).tolist() for _ in range(5)]
    CorpusIndex.build(docs, show_progress=False).save(tmp_path / "t.refdec")
    index = CorpusIndex.load(tmp_path / "t.refdec")
    queries = [rng.integers(0, 5, size=int(rng.integers(1, 8))).tolist() for _ in range(200)]

    def run(_):
        return [(index.match_length(q), index.count(q), index.next_tokens(q, 3)) for q in queries]

    expected = run(None)
    with ThreadPoolExecutor(max_workers=4) as pool:
        for got in pool.map(run, range(8)):
            assert got == expected


def test_loaded_index_refuses_add_documents_with_a_clear_error(tmp_path):
    path = tmp_path / "a.refdec"
    CorpusIndex.build([[1, 2, 3]], show_progress=False).save(path)
    loaded = CorpusIndex.load(path)
    with pytest.raises(Exception) as info:
        loaded.add_documents([[4, 5]])
    assert isinstance(info.value, (ValueError, RuntimeError, TypeError)), type(info.value)
    message = str(info.value).lower()
    assert "load" in message or "frozen" in message or "read-only" in message, message
    assert len(loaded) == 3


def test_build_from_strings_uses_the_tokenizer(tmp_path):
    from test_cli_index import make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer(tmp_path)
    texts = ["def f(x): return x", "def g(y): return y"]
    index = CorpusIndex.build(texts, tokenizer, show_progress=False)
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    assert index.num_documents == 2
    assert len(index) == sum(len(i) for i in ids)
    assert index.document(1).tolist() == ids[1]
    assert index.count(ids[0][:3]) == NaiveIndex(ids).count(ids[0][:3])


def test_build_from_strings_without_a_tokenizer_raises_a_clear_error():
    with pytest.raises((ValueError, TypeError), match="(?i)tokenizer"):
        CorpusIndex.build(["some text"], show_progress=False)


# ---------------------------------------------------------------------------
# Proposer


def _matched_suffix_length_with_continuation(source_docs, context) -> int:
    """Longest k such that context[-k:] occurs in the source followed by some token."""
    naive = NaiveIndex(source_docs)
    for k in range(len(context), 0, -1):
        if naive.next_counts(context[len(context) - k :]):
            return k
    return 0


def check_draft_tree(tree, *, context, sources, max_nodes, max_depth, min_suffix=None):
    """The draft tree invariants; ``sources`` maps a name to its documents.

    Each path must follow the longest suffix of the context that has a
    continuation in some source or, with back-off (``min_suffix`` given), a
    suffix of at least ``min_suffix`` tokens (any suffix for the live context).
    For the live context the path may also be an overlapping copy: the matched
    suffix followed by the path occurs earlier in ``context + path``.
    """
    n = len(tree)
    assert n <= max_nodes
    assert tree.token_ids.dtype == np.int32 and tree.parents.dtype == np.int32
    assert tree.scores.dtype == np.float32 and tree.source_ids.dtype == np.int32
    for node_idx in range(n):
        assert -1 <= tree.parents[node_idx] < node_idx
    depths = tree.depths  # the builder's: 1 for a child of the root, else 1 + the parent's
    assert depths.dtype == np.int32
    assert depths.tolist() == [1 if p < 0 else int(depths[p]) + 1 for p in tree.parents.tolist()]
    assert n == 0 or depths.max() <= max_depth
    assert np.all(np.isfinite(tree.scores))
    assert np.all((tree.scores > 0) & (tree.scores <= 1.0 + 1e-6)), tree.scores
    assert np.all((tree.source_ids >= 0) & (tree.source_ids < len(tree.source_names)))
    # Siblings propose distinct tokens (identical prefixes are merged into one trie).
    siblings = set()
    for node_idx in range(n):
        key = (int(tree.parents[node_idx]), int(tree.token_ids[node_idx]))
        assert key not in siblings, f"two children of node {key[0]} propose token {key[1]}"
        siblings.add(key)
        parent = tree.parents[node_idx]
        if parent >= 0:
            assert tree.scores[node_idx] <= tree.scores[parent] + 1e-6, "score grows along a path"
    # Each root-to-node path follows the matched suffix in some source.
    matched = {
        name: _matched_suffix_length_with_continuation(docs, context)
        for name, docs in sources.items()
    }
    # Liveness: when some source continues a suffix of the context, a budget of
    # at least one node drafts something.
    if max_nodes >= 1 and any(length > 0 for length in matched.values()):
        assert n > 0, f"no draft although a source continues the context; matched lengths {matched}"
    paths = []
    for node_idx in range(n):
        parent = int(tree.parents[node_idx])
        path = (paths[parent] if parent >= 0 else []) + [int(tree.token_ids[node_idx])]
        paths.append(path)
        witnesses = [
            name
            for name, docs in sources.items()
            for length in ([matched[name]] if min_suffix is None else range(min(min_suffix, matched[name]),
                                                                            len(context) + 1))
            if length > 0 and any(occurs_in(doc, context[len(context) - length :] + path) for doc in docs)
        ]
        # The live context may be copied with overlap (a loop continues past the
        # end of the context into the draft itself): each drafted token is then
        # read from an earlier occurrence in context + draft so far.
        copy_lengths = ([matched["context"]] if min_suffix is None
                        else range(min(min_suffix, matched["context"]), len(context) + 1))
        if "context" in sources and any(
            length > 0 and occurs_in((context + path)[:-1], context[len(context) - length :] + path)
            for length in copy_lengths
        ):
            witnesses.append("context (overlapping copy)")
        assert witnesses, (
            f"node {node_idx} path {path} follows the longest matched suffix in no source; "
            f"context {context}, matched lengths {matched}"
        )
    return paths


@FAST
@given(alphabets(), st.data())
def test_proposer_tree_paths_occur_after_the_matched_suffix_in_some_source(alphabet, data):
    from refdec import Proposer

    symbols, unused = alphabet
    lists = lambda max_size: st.lists(st.sampled_from(symbols), max_size=max_size)  # noqa: E731
    corpus_docs = data.draw(st.lists(lists(20), min_size=1, max_size=3))
    references = data.draw(st.lists(lists(20), max_size=2))
    use_corpus = data.draw(st.booleans())
    max_depth = data.draw(st.integers(1, 8))
    backoff = data.draw(st.sampled_from([0, 0, 1, 3]))
    min_backoff_len = data.draw(st.integers(1, 3))
    index = CorpusIndex.build(corpus_docs, show_progress=False) if use_corpus else None
    proposer = Proposer(index=index, references=references or None, max_depth=max_depth, backoff=backoff,
                        min_backoff_len=min_backoff_len)
    context = data.draw(lists(20))
    proposer.start(context)
    for _ in range(data.draw(st.integers(1, 6))):
        max_nodes = data.draw(st.integers(0, 12))
        tree = proposer.propose(max_nodes)
        sources = {"context": [context]}
        if references:
            sources["references"] = references
        if use_corpus:
            sources["corpus"] = corpus_docs
        paths = check_draft_tree(tree, context=context, sources=sources, max_nodes=max_nodes, max_depth=max_depth,
                                 min_suffix=min_backoff_len if backoff else None)
        event("tree: empty" if not len(tree) else ("tree: depth >= 3" if tree.depths.max() >= 3 else "tree: shallow"))
        again = proposer.propose(max_nodes)  # propose() has no side effect: same tree twice
        assert again.token_ids.tolist() == tree.token_ids.tolist()
        assert again.parents.tolist() == tree.parents.tolist()
        # Accept either a drafted path (what verification usually does) plus a bonus token, or noise.
        if paths and data.draw(st.booleans()):
            accepted = list(data.draw(st.sampled_from(paths)))
        else:
            accepted = []
        accepted += data.draw(st.lists(st.sampled_from(symbols + [unused]), min_size=1, max_size=3))
        proposer.accept(accepted)
        context = context + accepted


def test_proposer_continues_a_repeated_run_from_the_context():
    from refdec import Proposer

    proposer = Proposer()
    proposer.start([10, 11, 12, 13, 14, 10, 11, 12])
    tree = proposer.propose(8)
    assert len(tree) >= 1
    roots = [int(t) for t, p in zip(tree.token_ids, tree.parents) if p < 0]
    assert roots and roots[0] == 13, tree.token_ids.tolist()
    proposer.accept([13])
    tree = proposer.propose(8)
    roots = [int(t) for t, p in zip(tree.token_ids, tree.parents) if p < 0]
    assert roots and roots[0] == 14, tree.token_ids.tolist()


def test_proposer_backs_off_when_the_longest_corpus_match_ends_a_document():
    # "1 2 3" (the longest match) only ends document 0: it has no continuation.
    # The shorter suffix "2 3" continues with "4 4" in document 1. A proposer
    # that stops at the dead-end match drafts nothing where a draft exists
    # (ContextIndex.current_match_length is defined "with a continuation" for
    # the same reason).
    from refdec import Proposer

    index = CorpusIndex.build([[5, 1, 2, 3], [7, 2, 3, 4, 4]], show_progress=False)
    proposer = Proposer(index=index)
    proposer.start([9, 1, 2, 3])
    tree = proposer.propose(8)
    assert tree.token_ids.tolist()[:2] == [4, 4], tree.token_ids.tolist()


def test_proposer_drafts_a_long_chain_inside_a_loop():
    # A model stuck in a loop repeats one line. The longest earlier match of the
    # context overlaps the end (it is the whole context but one period), so its
    # continuation is only one period long; the loop itself says what follows
    # for many periods. DESIGN: "Loops and repeated lines are cheap wins".
    from refdec import Proposer

    line = [11, 12, 13, 14, 15, 16]
    proposer = Proposer()
    proposer.start(line * 10)
    tree = proposer.propose(16)
    depth = int(tree.depths.max()) if len(tree) else 0
    assert depth >= 12, f"a loop of period 6 drafted only {depth} tokens deep: {tree.token_ids.tolist()}"
    same = Proposer()
    same.start([7] * 50)
    tree = same.propose(16)
    depth = int(tree.depths.max()) if len(tree) else 0
    assert depth >= 12, f"a run of one repeated token drafted only {depth} tokens deep"


def test_proposer_with_a_zero_budget_proposes_an_empty_tree():
    from refdec import Proposer

    proposer = Proposer()
    proposer.start([1, 2, 1, 2, 1])
    assert len(proposer.propose(0)) == 0


def test_proposer_default_arguments_work_without_any_source():
    from refdec import Proposer

    proposer = Proposer()
    proposer.start([])
    assert len(proposer.propose(16)) == 0
    proposer.accept([5])
    tree = proposer.propose(16)
    assert len(tree) == 0
