"""Specifies refdec.drafting.proposer over a sharded index, Proposer(index=ShardedIndex): the shards drafted
as one corpus.

A corpus split into shards (disjoint documents, each shard its own index file) drafts
exactly the tree that one index over all the documents drafts: the longest match over the
shards, and at each node the continuation counts of the shards where the text occurs,
summed. Trees are drawn root-down; the root is the last context token. The corpus source
has weight 0.9 and half_len 4 (a match of length L starts at 0.9 * L / (L + 4)).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refdec import CorpusIndex, Proposer, ShardedIndex, _C
from refdec.drafting.proposer import CursorParams, SourceParams

CORPUS = 2


def arr(tokens):
    return np.asarray(tokens, dtype=np.int32)


def index(documents):
    return CorpusIndex.build([arr(d) for d in documents], show_progress=False)


def drafts(idx, prompt, budget=16, **kwargs):
    proposer = Proposer(index=idx, **kwargs)
    proposer.start(arr(prompt))
    return proposer.propose(budget), proposer.last_match_lengths()


def assert_same_tree(a, b):
    for name in ("token_ids", "parents", "scores", "source_ids"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


# Shard A: "1 2 3" twice; shard B: "1 2 3" and "1 2 4". After "9 1 2" the match "1 2" (L=2,
# 0.9 * 2/6 = 0.3) continues with 3 three times (twice in A, once in B) and 4 once: the counts
# are summed over the shards, not drafted per shard.
#
#   root(2) ─┬─ 3 (0.3 * 3/4 = 0.225)
#            └─ 4 (0.3 * 1/4 = 0.075)
#
def test_continuations_found_in_several_shards_are_scored_by_their_summed_counts():
    sharded = ShardedIndex([index([[1, 2, 3], [1, 2, 3]]), index([[1, 2, 3], [1, 2, 4]])])
    tree, matches = drafts(sharded, [9, 1, 2], backoff=0)
    assert tree.token_ids.tolist() == [3, 4] and tree.parents.tolist() == [-1, -1]
    np.testing.assert_allclose(tree.scores, [0.225, 0.075], rtol=1e-6)
    assert tree.source_ids.tolist() == [CORPUS, CORPUS]
    assert matches["corpus"] == 2
    assert_same_tree(tree, drafts(index([[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 4]]), [9, 1, 2], backoff=0)[0])


# Shard A: "5 1 2 3"; shard B: "1 2 4" twice. After "5 1 2" the longest match "5 1 2" (L=3,
# 0.9 * 3/7) is in shard A only, where "1 2" has the same single occurrence: shard A alone would
# back off to nothing. One corpus backs off to "1 2" (L=2, 0.3), which occurs three times
# (once in A, twice in B):
#
#   root(2) ─┬─ 3 (3/7 * 0.9 = 0.386; "1 2" also proposes it: max(0.386, 0.3 * 1/3))
#            └─ 4 (0.3 * 2/3 = 0.2, from the back-off match alone)
#
def test_the_back_off_match_is_the_next_shorter_one_over_all_shards():
    sharded = ShardedIndex([index([[5, 1, 2, 3]]), index([[1, 2, 4], [1, 2, 4]])])
    tree, _ = drafts(sharded, [5, 1, 2], budget=2, backoff=1)
    assert tree.token_ids.tolist() == [3, 4] and tree.parents.tolist() == [-1, -1]
    np.testing.assert_allclose(tree.scores, [0.9 * 3 / 7, 0.2], rtol=1e-6)
    assert_same_tree(tree, drafts(index([[5, 1, 2, 3], [1, 2, 4], [1, 2, 4]]), [5, 1, 2], budget=2, backoff=1)[0])


# Shard A: "7 1 2" (the match ends a document there); shard B: "1 2 6". After "7 1 2" the
# longest match "7 1 2" has no continuation anywhere, so the corpus drafts from "1 2" (L=2),
# continued in shard B.
def test_a_match_that_only_ends_documents_falls_back_to_a_shorter_one_continued_in_another_shard():
    sharded = ShardedIndex([index([[7, 1, 2]]), index([[1, 2, 6]])])
    tree, matches = drafts(sharded, [7, 1, 2], backoff=0)
    assert tree.token_ids.tolist() == [6]
    assert matches["corpus"] == 2
    assert_same_tree(tree, drafts(index([[7, 1, 2], [1, 2, 6]]), [7, 1, 2], backoff=0)[0])


# A state with more than 256 continuations proposes none (DraftTreeBuilder::kMaxFanout): over
# the shards together, as one index would. "1 t" for 128 tokens in each shard: 256 continuations
# in all are drafted; 129 in each (258) none, though each shard alone has fewer than 256.
@pytest.mark.parametrize("per_shard, drafted", [(128, 256), (129, 0)])
def test_the_fanout_cap_counts_the_continuations_of_all_shards(per_shard, drafted):
    shards = [index([[1, 1000 + s * per_shard + t] for t in range(per_shard)]) for s in range(2)]
    tree, _ = drafts(ShardedIndex(shards), [5, 1], budget=300, backoff=0)
    assert len(tree) == drafted


documents_st = st.lists(st.lists(st.integers(0, 5), max_size=30), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(documents=documents_st, cuts=st.lists(st.integers(0, 8), max_size=3),
       prompt=st.lists(st.integers(0, 6), min_size=1, max_size=12),
       output=st.lists(st.integers(0, 6), max_size=25),
       budget=st.sampled_from([1, 4, 16, 64]), backoff=st.integers(0, 2), max_depth=st.integers(1, 12))
def test_a_corpus_split_into_shards_drafts_the_trees_of_the_unsplit_corpus(documents, cuts, prompt, output, budget,
                                                                            backoff, max_depth):
    bounds = sorted({0, len(documents), *(min(c, len(documents)) for c in cuts)})
    sharded = ShardedIndex([index(documents[a:b]) for a, b in zip(bounds, bounds[1:])])
    whole = index(documents)
    one, split = (Proposer(index=i, backoff=backoff, max_depth=max_depth) for i in (whole, sharded))
    for proposer in (one, split):
        proposer.start(arr(prompt))
    for token in output + [0]:
        assert_same_tree(one.propose(budget), split.propose(budget))
        assert one.last_match_lengths() == split.last_match_lengths()
        for proposer in (one, split):
            proposer.accept(arr([token]))


def test_shards_and_the_unsplit_corpus_draft_alike_beside_references_and_the_copy_cursor():
    rng = np.random.default_rng(3)
    documents = [rng.integers(0, 8, size=int(rng.integers(5, 80))).tolist() for _ in range(12)]
    reference = rng.integers(0, 8, size=60)
    sharded = ShardedIndex([index(documents[:5]), index(documents[5:9]), index(documents[9:])])
    proposers = [Proposer(index=i, references=[reference], cursor=CursorParams(start_run=0))
                 for i in (index(documents), sharded)]
    for proposer in proposers:
        proposer.start(reference[:10])
    for token in np.concatenate([reference[10:40], rng.integers(0, 8, size=20)]):
        assert_same_tree(*(p.propose(24) for p in proposers))
        for proposer in proposers:
            proposer.accept(arr([token]))


def test_loaded_shards_stay_memory_mapped_and_are_drafted_from_in_place(tmp_path):
    paths = []
    for i, documents in enumerate([[[1, 2, 3]], [[1, 2, 4]]]):
        paths.append(tmp_path / f"shard{i}.refdec")
        index(documents).save(paths[-1])
    sharded = ShardedIndex.load_many(paths)
    assert all(automaton.is_mapped for automaton in sharded.automata)
    assert sharded.automata[1] is sharded.shards[1].automaton
    tree, _ = drafts(sharded, [1, 2], backoff=0)
    assert sorted(tree.token_ids.tolist()) == [3, 4]


def test_the_copy_cursor_needs_one_automaton_not_shards():
    core = _C.ProposerCore(8)
    a, b = index([[1, 2]]).automaton, index([[3, 4]]).automaton
    core.add_matcher_source((a, b), SourceParams(), 1)
    with pytest.raises(ValueError, match="copy cursor needs one automaton, source_id 1 has 2 shards"):
        core.set_cursor(1, CursorParams())


def test_a_proposer_refuses_an_index_of_another_type_naming_both_kinds():
    with pytest.raises(ValueError, match="index must be a refdec.CorpusIndex, a refdec.ShardedIndex or None, got list"):
        Proposer(index=[index([[1, 2]])])


# ---------------------------------------------------------------------------
# What the decoding engine asks of a ShardedIndex


def test_a_sharded_index_answers_the_engine_like_one_index(tmp_path):
    documents = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16], [1, 2, 3, 4, 20, 21, 22, 23]]
    shards = [CorpusIndex.build([arr(d) for d in documents[:2]], show_progress=False, signatures=True),
              CorpusIndex.build([arr(documents[2])], show_progress=False, signatures=True)]
    sharded = ShardedIndex(shards)
    assert sharded.document(2).tolist() == documents[2]
    hits = sharded.retriever().top_k(arr([1, 2, 3, 4, 20, 21, 22]), 1, score="containment")
    assert hits[0][0] == 2
    assert sharded.retriever() is sharded.retriever()
    assert sharded.fingerprint is None and sharded.vocab_size == 0


def test_a_sharded_retriever_names_the_shard_without_signatures():
    sharded = ShardedIndex([CorpusIndex.build([[1, 2, 3]], show_progress=False, signatures=True), index([[4, 5, 6]])])
    with pytest.raises(ValueError, match=r"shards\[1\] \(built in memory\) has no MinHash signatures"):
        sharded.retriever()


def test_decoding_with_shards_takes_the_passes_of_the_unsplit_corpus():
    # The engine drafts through Proposer: the same trees give the same verify passes and tokens.
    # The corpus holds the model's own greedy continuations, a token changed every 13.
    import refdec
    from tiny_models import repetitive_prompts, tiny_llama

    model = tiny_llama(seed=0)
    prompts = repetitive_prompts(4, seed=13)
    documents = []
    for prompt in prompts:
        out = refdec.generate(model, prompt, max_new_tokens=24, eos_token_id=[], max_draft_tokens=0)
        doc = out.sequences[0].tolist()[len(prompt) - 4:]
        documents.append(arr([(t + 7) % 96 if j % 13 == 12 else t for j, t in enumerate(doc)]))
    whole = CorpusIndex.build(documents, vocab_size=96, show_progress=False)
    sharded = ShardedIndex([CorpusIndex.build(documents[:2], vocab_size=96, show_progress=False),
                            CorpusIndex.build(documents[2:], vocab_size=96, show_progress=False)])
    from_corpus = 0
    for prompt in prompts:
        one, split = (refdec.generate(model, prompt, index=i, max_new_tokens=24, eos_token_id=[], max_draft_tokens=16)
                      for i in (whole, sharded))
        assert split.sequences[0].tolist() == one.sequences[0].tolist()
        assert (split.stats.forward_passes, split.stats.accepted_by_source) == (
            one.stats.forward_passes, one.stats.accepted_by_source)
        from_corpus += split.stats.accepted_by_source.get("corpus", 0)
    assert from_corpus > 10
