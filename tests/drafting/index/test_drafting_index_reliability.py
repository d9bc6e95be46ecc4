"""Specifies refdec.drafting.index's reliability: bad input gives clear errors, writes are atomic, a frozen
index serves many threads, building can release its memory.

Specification:
- token ids < 0 or >= 2**31 raise ValueError naming the value, at build and at
  query time; ids >= the index's vocab_size raise at build time (naming the
  document, the position and the value) and are simply not found at query time;
- a tokenizer other than the index's: IndexFormatError at load naming both
  fingerprints, ValueError from add_documents;
- an empty corpus (no documents, or only empty ones) is a valid, empty index
  that answers "no match" everywhere, saves and loads;
- an empty document is a document: counted, never matched, round-trips;
- ``save`` writes a temporary file then renames it: a reader keeps the old
  mapping, a clean save leaves no temporary file, and temporaries of killed
  saves are cleaned up (``refdec index build`` on bad files and killed mid-way:
  tests/test_cli_index.py);
- a frozen CorpusIndex answers concurrent queries from 8 threads exactly as
  from one, and its C++ calls release the GIL;
- ``CorpusIndex.build(..., growable=False)`` answers exactly like a growable
  build, and refuses add_documents with a clear error;
- a ShardedIndex answers like one index over all the documents.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import refdec
from refdec import _C, ContextIndex, CorpusIndex, IndexFormatError, Proposer
from word_tokenizer import WordTokenizer


def _queries_of(index, queries):
    return [
        (index.match_length(q), index.count(q), index.next_tokens(q, 4), index.continuation(q, 12).tolist())
        for q in queries
    ]


# ---------------------------------------------------------------------------
# Bad token ids


@pytest.mark.parametrize("bad", [-1, -(2**31), 2**31, 2**40])
def test_build_with_an_out_of_range_token_id_raises_value_error_naming_it(bad):
    with pytest.raises(ValueError, match=str(bad)):
        CorpusIndex.build([[1, 2], [3, bad, 4]], show_progress=False)
    with pytest.raises(ValueError, match=str(bad)):
        CorpusIndex.build([np.array([1, bad], dtype=np.int64)], show_progress=False)


def test_negative_int32_array_token_raises_value_error_naming_position_and_value():
    with pytest.raises(ValueError, match=r"documents\[1\]\[2\] = -5"):
        CorpusIndex.build([np.array([1], np.int32), np.array([1, 2, -5], np.int32)], show_progress=False)


def test_token_id_at_the_vocab_size_raises_at_build_naming_document_position_and_value():
    with pytest.raises(ValueError, match=r"documents\[1\]\[1\] = 100 is not below the vocabulary size 100"):
        CorpusIndex.build([[1], [2, 100]], vocab_size=100, show_progress=False)


def test_token_id_at_or_above_the_vocab_size_is_not_found_at_query_time(tmp_path):
    index = CorpusIndex.build([[1, 2, 3, 1, 2]], vocab_size=100, show_progress=False)
    index.save(tmp_path / "v.refdec")
    for idx in (index, CorpusIndex.load(tmp_path / "v.refdec")):
        assert idx.match_length([1, 2, 100]) == 0
        assert idx.count([100]) == 0
        assert idx.next_tokens([100], 3) == []
        assert idx.continuation([2**31 - 1], 3).tolist() == []


@pytest.mark.parametrize("bad", [-1, 2**31])
def test_queries_and_proposer_with_out_of_range_ids_raise_value_error_naming_the_value(bad):
    index = CorpusIndex.build([[1, 2, 3]], show_progress=False)
    for call in (index.match_length, index.count, lambda q: index.next_tokens(q, 2),
                 lambda q: index.continuation(q, 2), ContextIndex):
        with pytest.raises(ValueError, match=str(bad)):
            call([1, bad])
    proposer = Proposer(index)
    with pytest.raises(ValueError, match=str(bad)):
        proposer.start([1, bad])
    proposer.start([1, 2])
    with pytest.raises(ValueError, match=str(bad)):
        proposer.accept([bad])


# ---------------------------------------------------------------------------
# Tokenizer mismatch


def test_loading_with_another_tokenizer_raises_index_format_error_naming_both_fingerprints(tmp_path):
    mine, other = WordTokenizer(["a", "b", "c"]), WordTokenizer(["a", "b", "d"])
    path = tmp_path / "t.refdec"
    CorpusIndex.build(["a b c a b"], mine, show_progress=False).save(path)
    with pytest.raises(IndexFormatError) as info:
        CorpusIndex.load(path, other)
    message = str(info.value)
    assert refdec.drafting.index.tokenizer_fingerprint(mine) in message
    assert refdec.drafting.index.tokenizer_fingerprint(other) in message
    assert str(path) in message
    assert len(CorpusIndex.load(path, mine)) == 5


def test_add_documents_with_another_tokenizer_raises_value_error():
    index = CorpusIndex.build(["a b"], WordTokenizer(["a", "b"]), show_progress=False)
    with pytest.raises(ValueError, match="fingerprint"):
        index.add_documents(["a"], WordTokenizer(["a", "c"]))
    assert len(index) == 2


# ---------------------------------------------------------------------------
# Empty corpus, empty documents


@pytest.mark.parametrize("documents", [[], [[]], [[], [], []]], ids=["no_documents", "one_empty", "three_empty"])
def test_an_empty_corpus_is_an_empty_index_that_answers_no_match(tmp_path, documents):
    built = CorpusIndex.build(documents, show_progress=False)
    path = tmp_path / "empty.refdec"
    built.save(path)
    loaded = CorpusIndex.load(path)
    assert loaded.verify()
    for index in (built, loaded):
        assert len(index) == 0 and index.num_documents == len(documents)
        assert _queries_of(index, [[], [0], [1, 2]]) == [(0, 0, [], [])] * 3
        proposer = Proposer(index)
        proposer.start([1, 2, 3])
        assert len(proposer.propose(8)) <= 8  # the context alone may draft; nothing from the corpus
        assert not any(tree_source == 2 for tree_source in proposer.propose(8).source_ids.tolist())


def test_an_empty_document_is_counted_never_matched_and_round_trips(tmp_path):
    docs = [[5, 6], [], [5, 6, 7]]
    index = CorpusIndex.build(docs, show_progress=False)
    index.save(tmp_path / "e.refdec")
    loaded = CorpusIndex.load(tmp_path / "e.refdec")
    for idx in (index, loaded):
        assert idx.num_documents == 3
        assert idx.document(1).tolist() == []
        assert idx.count([6, 5]) == 0  # nothing joins document 0 to document 2 across the empty one
        assert idx.count([5, 6]) == 2


# ---------------------------------------------------------------------------
# Atomic writes


def test_save_replaces_an_existing_index_atomically_and_leaves_no_temporary_file(tmp_path):
    out = tmp_path / "x.refdec"
    CorpusIndex.build([[1, 2, 3]], show_progress=False).save(out)
    old = CorpusIndex.load(out)  # a reader keeps its mapping across the replace
    CorpusIndex.build([[4, 5, 6, 7]], show_progress=False).save(out)
    assert old.match_length([1, 2, 3]) == 3
    assert CorpusIndex.load(out).match_length([4, 5, 6, 7]) == 4
    assert [p.name for p in tmp_path.iterdir()] == ["x.refdec"]


# ---------------------------------------------------------------------------
# Threads


@pytest.fixture(scope="module")
def shared_index(tmp_path_factory):
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 12, size=int(n)) .astype(np.int32) for n in rng.integers(0, 3000, size=40)]
    path = tmp_path_factory.mktemp("threads") / "shared.refdec"
    CorpusIndex.build(docs, show_progress=False, growable=False).save(path)
    return CorpusIndex.load(path), docs


def _proposer_trees(index, prompts):
    out = []
    for prompt in prompts:
        proposer = Proposer(index, max_depth=16)
        proposer.start(prompt[:-8])
        tree = proposer.propose(32)
        proposer.accept(prompt[-8:])
        tree2 = proposer.propose(32)
        out.append((tree.token_ids.tolist(), tree.parents.tolist(), tree2.token_ids.tolist()))
    return out


@pytest.mark.parametrize("threads", [4, 8])
def test_a_frozen_index_answers_concurrent_queries_like_a_single_thread(shared_index, threads):
    index, docs = shared_index
    rng = np.random.default_rng(threads)
    queries = [rng.integers(0, 13, size=int(rng.integers(0, 9))).tolist() for _ in range(300)]
    prompts = [docs[i % len(docs)][:64] for i in range(40) if len(docs[i % len(docs)]) >= 16]
    expected = (_queries_of(index, queries), _proposer_trees(index, prompts))
    results: list = [None] * threads
    errors: list = []
    barrier = threading.Barrier(threads)

    def work(slot):
        try:
            barrier.wait()
            order = list(range(len(queries)))
            np.random.default_rng(slot).shuffle(order)  # each thread in its own order
            answers = dict(zip(order, _queries_of(index, [queries[i] for i in order])))
            results[slot] = ([answers[i] for i in range(len(queries))], _proposer_trees(index, prompts))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(slot,)) for slot in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=120)
    assert not errors, errors
    assert all(r == expected for r in results)


def _python_progress_during(call) -> int:
    """Iterations a pure-Python loop in this thread makes while ``call`` runs in another thread."""
    done = threading.Event()

    def run():
        call()
        done.set()

    thread = threading.Thread(target=run)
    ticks = 0
    thread.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0)
    thread.join()
    return ticks


def test_building_freezing_and_verifying_release_the_gil():
    # Each call below runs in C++ for ~0.1-1 s. Holding the GIL all that time
    # would freeze this thread's loop (a few ticks at most); released, it spins freely.
    tokens = np.random.default_rng(0).integers(0, 50, size=1_500_000).astype(np.int32)
    sam = _C.SuffixAutomaton()
    assert _python_progress_during(lambda: sam.add_document(tokens)) > 100
    holder = {}
    assert _python_progress_during(lambda: holder.setdefault("f", _C.FrozenIndex.freeze(sam, "", 0))) > 100
    frozen = holder["f"]
    assert _python_progress_during(lambda: [frozen.verify() for _ in range(20)]) > 100


# ---------------------------------------------------------------------------
# growable=False


def test_a_non_growable_build_answers_like_a_growable_one_and_refuses_to_grow(tmp_path):
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 5, size=int(n)).astype(np.int32) for n in (300, 0, 40, 1, 200)]
    growable = CorpusIndex.build(docs, show_progress=False)
    frozen = CorpusIndex.build(docs, show_progress=False, growable=False)
    queries = [rng.integers(0, 6, size=int(rng.integers(0, 6))).tolist() for _ in range(200)]
    assert _queries_of(frozen, queries) == _queries_of(growable, queries)
    assert (len(frozen), frozen.num_documents, frozen.is_frozen) == (len(growable), 5, True)
    with pytest.raises(ValueError, match="growable=False"):
        frozen.add_documents([[1, 2]])
    frozen.save(tmp_path / "a.refdec")
    growable.save(tmp_path / "b.refdec")
    assert (tmp_path / "a.refdec").read_bytes() == (tmp_path / "b.refdec").read_bytes()


def test_a_released_automaton_refuses_to_grow_and_answers_nothing():
    sam = _C.SuffixAutomaton()
    sam.add_document(np.array([1, 2, 3], np.int32))
    _C.FrozenIndex.freeze(sam, "", 0, release=True)
    assert sam.released and sam.num_states == 0 and sam.num_tokens == 0
    assert sam.match_length(np.array([1, 2], np.int32)) == 0
    with pytest.raises(RuntimeError, match="released"):
        sam.add_document(np.array([4], np.int32))
    with pytest.raises(ValueError, match="released"):
        _C.FrozenIndex.freeze(sam, "", 0)


# ---------------------------------------------------------------------------
# Sharding


def test_the_lazy_retriever_of_a_shared_index_is_made_once_under_concurrent_first_use(tmp_path):
    rng = np.random.default_rng(2)
    docs = [rng.integers(0, 50, size=200).astype(np.int32) for _ in range(30)]
    path = tmp_path / "r.refdec"
    CorpusIndex.build(docs, show_progress=False, signatures=True).save(path)
    index = CorpusIndex.load(path)
    got: list = [None] * 8
    barrier = threading.Barrier(8)

    def first_use(slot):
        barrier.wait()
        got[slot] = index.retriever()

    pool = [threading.Thread(target=first_use, args=(slot,)) for slot in range(8)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=60)
    assert got[0] is not None and all(r is got[0] for r in got)


def test_add_documents_with_one_bad_document_changes_nothing():
    index = CorpusIndex.build([[1, 2, 3]], vocab_size=10, show_progress=False)
    before = (len(index), index.num_documents, _queries_of(index, [[1, 2], [4, 5], [7]]))
    for bad_batch in ([[4, 5, 6], [7, -1]], [[4, 5, 6], [7, 10]], [[4, 5, 6], "text without a tokenizer"]):
        with pytest.raises(ValueError):
            index.add_documents(bad_batch)
        assert (len(index), index.num_documents, _queries_of(index, [[1, 2], [4, 5], [7]])) == before
    index.add_documents([[4, 5, 6]])
    assert index.match_length([4, 5]) == 2 and index.num_documents == 2


def test_save_removes_temporaries_of_killed_saves_but_not_of_live_or_recent_ones(tmp_path):
    out = tmp_path / "x.refdec"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # exited: no such process any more (pids are not reused this fast)
    old = time.time() - 2 * 3600
    stale = tmp_path / f"x.refdec.tmp-{dead_pid}-0badc0de"
    recent = tmp_path / f"x.refdec.tmp-{dead_pid}-00000001"
    live = tmp_path / f"x.refdec.tmp-{os.getppid()}-00000002"
    other = tmp_path / f"y.refdec.tmp-{dead_pid}-00000003"
    for p in (stale, recent, live, other):
        p.write_bytes(b"partial")
    for p in (stale, live, other):
        os.utime(p, (old, old))
    CorpusIndex.build([[1, 2]], show_progress=False).save(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, recent.name, live.name, other.name])


def test_a_none_automaton_is_a_value_error_not_a_crash():
    from refdec import _C

    with pytest.raises(ValueError, match="view must be an automaton, not None"):
        _C.testing.Matcher(None)
    with pytest.raises(ValueError, match="view must be an automaton, not None"):
        _C.ProposerCore(8).add_matcher_source(None, _C.SourceParams(), 1)


def test_an_automaton_at_its_state_limit_refuses_tokens_with_a_clear_error_and_stays_usable():
    """State ids are int32 and text has 1.2-2 states per token, so the state limit comes
    before the token limit (~1.1-1.5e9 tokens): reaching it is the "full" error, not a
    wrapped id (a test hook lowers the limit)."""
    from refdec import _C

    sam = _C.SuffixAutomaton()
    _C.testing.set_limits(sam, max_states=40, max_edges=10**6)
    tokens = np.asarray([5, 6, 7, 5, 6, 8] * 20, dtype=np.int32)
    with pytest.raises(ValueError, match=r"suffix automaton is full: \d+ states.*split the corpus into shards"):
        sam.add_document(tokens)
    kept = sam.num_tokens
    assert 0 < kept < len(tokens) and sam.num_states <= 40
    with pytest.raises(ValueError, match="suffix automaton is full"):
        sam.extend(5)
    assert sam.num_tokens == kept  # nothing half-added: the automaton answers for the tokens it holds
    from naive_index import NaiveIndex

    naive = NaiveIndex([tokens[:kept].tolist()])
    for n in range(1, 6):
        for start in range(0, kept - n, 3):
            query = tokens[start:start + n]
            assert sam.count(query) == naive.count(query.tolist())


def test_continuation_with_a_huge_length_returns_the_whole_continuation():
    index = CorpusIndex.build([[1, 2, 3, 4, 5, 6, 7, 8]], show_progress=False)
    for length in (10, 2**62, 2**63 - 1):
        assert index.continuation([1, 2], length).tolist() == [3, 4, 5, 6, 7, 8]
