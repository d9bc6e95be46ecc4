"""Specifies refdec.drafting.proposer's Proposer.propose_batch: one C++ call for a batch step gives exactly the trees of the
per-request loop (accept, then propose), on one thread or several, and refuses bad input
before any proposer changes."""

from __future__ import annotations

import numpy as np
import pytest

from refdec import CorpusIndex, DraftBatch, Proposer, ShardedIndex

FIELDS = ("token_ids", "parents", "scores", "source_ids", "depths")


def _proposers(rng, n, index=None):
    """Two identical sets of n started proposers (one for the batch call, one for the loop):
    live context only, references, the copy cursor, and the corpus index, in turn."""
    prompts = [rng.integers(0, 24, int(rng.integers(50, 300))).astype(np.int32) for _ in range(n)]
    sets = []
    for _ in range(2):
        proposers = []
        for i, prompt in enumerate(prompts):
            references = [prompt[: len(prompt) // 2]] if i % 3 else None
            proposer = Proposer(index=index if i % 2 else None, references=references,
                                cursor=bool(references) and i % 4 == 1, max_depth=12)
            proposer.start(prompt)
            proposers.append(proposer)
        sets.append(proposers)
    return sets


def _assert_same_as_loop(batch, loop_proposers, new_tokens, max_nodes):
    assert isinstance(batch, DraftBatch) and len(batch) == len(loop_proposers)
    assert batch.offsets.dtype == np.int64 and batch.offsets[0] == 0
    assert batch.token_ids.dtype == np.int32 and batch.scores.dtype == np.float32
    for r, (proposer, tokens) in enumerate(zip(loop_proposers, new_tokens)):
        proposer.accept(tokens)
        tree = proposer.propose(max_nodes)
        got = batch.tree(r)
        assert got.source_names == tree.source_names
        for name in FIELDS:
            assert getattr(got, name).tolist() == getattr(tree, name).tolist(), (r, name)


@pytest.mark.parametrize("num_threads", [1, 3])
def test_the_batch_call_gives_the_loops_trees(num_threads):
    rng = np.random.default_rng(7)
    index = CorpusIndex.build([rng.integers(0, 24, 3000).astype(np.int32) for _ in range(2)], vocab_size=24,
                              show_progress=False)
    batch_set, loop_set = _proposers(rng, 48, index)  # 48 requests: 3 threads of 16
    total_nodes = 0
    for step in range(25):
        new_tokens = [rng.integers(0, 24, int(rng.integers(0, 6))).astype(np.int32) for _ in batch_set]
        batch = Proposer.propose_batch(batch_set, 16, new_tokens, num_threads=num_threads)
        _assert_same_as_loop(batch, loop_set, new_tokens, 16)
        total_nodes += int(batch.offsets[-1])
    assert total_nodes > 25 * 48 * 4  # the trees are not trivially empty


def test_a_sharded_index_and_no_new_tokens():
    rng = np.random.default_rng(3)
    shards = ShardedIndex([CorpusIndex.build([rng.integers(0, 24, 1500).astype(np.int32)], vocab_size=24,
                                             show_progress=False) for _ in range(2)])
    batch_set, loop_set = _proposers(rng, 32, shards)
    for num_threads in (1, 2):
        batch = Proposer.propose_batch(batch_set, 10, num_threads=num_threads)  # nothing to accept
        _assert_same_as_loop(batch, loop_set, [np.zeros(0, np.int32)] * 32, 10)


def test_tokens_in_other_forms_are_converted():
    rng = np.random.default_rng(4)
    batch_set, loop_set = _proposers(rng, 3)
    new_tokens = [[1, 2, 3], np.array([4, 5], np.int64), np.arange(6, dtype=np.int32)[::2]]
    batch = Proposer.propose_batch(batch_set, 8, new_tokens)
    _assert_same_as_loop(batch, loop_set, [np.asarray(t, np.int32) for t in new_tokens], 8)


def test_a_negative_token_is_refused_before_any_proposer_accepts():
    rng = np.random.default_rng(5)
    batch_set, loop_set = _proposers(rng, 32)
    new_tokens = [np.array([1, 2], np.int32) for _ in batch_set]
    new_tokens[23] = np.array([3, -7], np.int32)
    for num_threads in (1, 2):
        with pytest.raises(ValueError, match=r"new_tokens\[23\]\[1\] = -7"):
            Proposer.propose_batch(batch_set, 8, new_tokens, num_threads=num_threads)
    with pytest.raises(ValueError, match=r"new_tokens\[1\]"):
        Proposer.propose_batch(batch_set[:2], 8, [[0], [5, -1]])
    # nothing was accepted: both sets still draft the same trees
    _assert_same_as_loop(Proposer.propose_batch(batch_set, 8), loop_set, [np.zeros(0, np.int32)] * 32, 8)


def test_the_same_proposer_twice_is_the_loop_on_one_thread_and_refused_on_several():
    rng = np.random.default_rng(6)
    (a,), (b,) = _proposers(rng, 1)
    batch = Proposer.propose_batch([a, a], 6, [np.array([1], np.int32), np.array([2], np.int32)])
    b.accept(np.array([1], np.int32))
    first = b.propose(6)
    b.accept(np.array([2], np.int32))
    second = b.propose(6)
    assert batch.tree(0).token_ids.tolist() == first.token_ids.tolist()
    assert batch.tree(1).token_ids.tolist() == second.token_ids.tolist()
    many = _proposers(rng, 16)[0]
    with pytest.raises(ValueError, match="listed twice"):
        Proposer.propose_batch(many + many, 6, num_threads=2)


def test_bad_arguments_name_themselves():
    rng = np.random.default_rng(8)
    proposers = _proposers(rng, 2)[0]
    with pytest.raises(ValueError, match=r"proposers\[1\] must be a started refdec.Proposer"):
        Proposer.propose_batch([proposers[0], Proposer()], 8)
    with pytest.raises(ValueError, match=r"proposers\[0\] must be a started refdec.Proposer"):
        Proposer.propose_batch(["not a proposer"], 8)
    with pytest.raises(ValueError, match="new_tokens must hold one array per proposer"):
        Proposer.propose_batch(proposers, 8, [np.zeros(0, np.int32)])
    with pytest.raises(ValueError, match="max_nodes must be an int >= 0, got -1"):
        Proposer.propose_batch(proposers, -1)
    with pytest.raises(ValueError, match="num_threads must be an int >= 1, got 0"):
        Proposer.propose_batch(proposers, 8, num_threads=0)
    with pytest.raises(ValueError, match=r"new_tokens\[0\] must be a 1-D array of token ids, got 2 dimensions"):
        Proposer.propose_batch(proposers, 8, [np.zeros((2, 2), np.int32), np.zeros(0, np.int32)])


def test_an_empty_batch_and_the_tree_views():
    batch = Proposer.propose_batch([], 8)
    assert len(batch) == 0 and batch.offsets.tolist() == [0] and batch.token_ids.size == 0
    rng = np.random.default_rng(9)
    proposers = _proposers(rng, 2)[0]
    batch = Proposer.propose_batch(proposers, 8)
    tree = batch.tree(1)
    assert np.shares_memory(tree.token_ids, batch.token_ids) or len(tree) == 0
    with pytest.raises(IndexError, match=r"r must be in \[0, 2\), got 2"):
        batch.tree(2)
