"""Specifies refdec.drafting.proposer by hand-drawn draft trees: what Proposer.propose returns in named
situations.

Trees are drawn root-down; the root is the last context token (not a node).
Default confidences: context and reference weight 1.0, half_len 2 (a match of
length L scores L / (L + 2)); corpus weight 0.9, half_len 4.
"""

from __future__ import annotations

import numpy as np
import pytest

from refdec import CorpusIndex, DraftTree, Proposer
from refdec import _C
from refdec._C import testing
from refdec.drafting.proposer import SourceParams

CONTEXT, REFERENCE, CORPUS = 0, 1, 2


def arr(tokens):
    return np.asarray(tokens, dtype=np.int32)


def assert_tree(tree, token_ids, parents, source_ids=None, scores=None):
    assert isinstance(tree, DraftTree)
    assert tree.token_ids.dtype == np.int32 and tree.parents.dtype == np.int32
    assert tree.scores.dtype == np.float32 and tree.source_ids.dtype == np.int32
    assert tree.token_ids.tolist() == token_ids
    assert tree.parents.tolist() == parents
    if source_ids is not None:
        assert tree.source_ids.tolist() == source_ids
    if scores is not None:
        np.testing.assert_allclose(tree.scores, scores, rtol=1e-6)
    assert tree.source_names == ("context", "reference", "corpus", "memory")


# Prompt 5 6 7 8 9 5 6: the suffix "5 6" (L=2) occurred at the start. Its
# continuation runs into the context's own end, so the copy overlaps itself
# (distance 5) and the draft goes on as a loop of period 5 up to max_depth,
# each token copied from the draft itself scaled by loop_decay (0.7):
#
#   root(6) ── 7 ── 8 ── 9 ── 5 ── 6 ── 7 ── 8 ── 9 ── 5 ── 6 ── 7 ...
#             .5   .5   .5   .5   .5  .35  .245 ...
#
REPEAT_PROMPT = [5, 6, 7, 8, 9, 5, 6]


def test_a_repeated_span_in_the_prompt_gives_a_chain_that_continues_it():
    proposer = Proposer(max_depth=12)
    proposer.start(arr(REPEAT_PROMPT))
    tree = proposer.propose(32)
    assert_tree(tree, [7, 8, 9, 5, 6] * 2 + [7, 8], list(range(-1, 11)), [CONTEXT] * 12,
                [0.5] * 5 + [0.5 * 0.7**k for k in range(1, 8)])
    assert proposer.last_match_lengths() == {"context": 2, "reference": 0, "corpus": 0, "memory": 0}
    assert_tree(proposer.propose(5), [7, 8, 9, 5, 6], [-1, 0, 1, 2, 3])


def test_editing_mode_does_not_decay_a_loop_by_default():
    # With the copy cursor on (editing mode) the loop's tokens are not scaled by 0.7 per looped
    # token; loop_decay= overrides; without the cursor the default stays 0.7.
    def context_scores(**kwargs):
        proposer = Proposer(max_depth=12, references=[arr([40, 41, 42, 43])], **kwargs)
        proposer.start(arr(REPEAT_PROMPT))
        tree = proposer.propose(64)
        on_context = tree.source_ids == CONTEXT
        assert tree.token_ids[on_context].tolist()[:12] == [7, 8, 9, 5, 6] * 2 + [7, 8]
        return tree.scores[on_context][:12]

    editing = context_scores(cursor=True)  # the cursor's survival decay applies to both alike
    np.testing.assert_allclose(context_scores(cursor=True, loop_decay=1.0), editing, rtol=1e-6)
    np.testing.assert_allclose(context_scores(cursor=True, loop_decay=0.7) / editing,
                               [1.0] * 5 + [0.7**k for k in range(1, 8)], rtol=1e-5)
    np.testing.assert_allclose(context_scores(cursor=None), [0.5] * 5 + [0.5 * 0.7**k for k in range(1, 8)],
                               rtol=1e-6)


@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.7", True, float("nan")])
def test_loop_decay_is_validated(bad):
    with pytest.raises(ValueError, match="loop_decay"):
        Proposer(loop_decay=bad)


def test_a_loop_is_drafted_for_many_periods():
    # A run of one token: "7" x 50, the draft is "7" to max_depth.
    proposer = Proposer(max_depth=20)
    proposer.start(arr([7] * 50))
    assert_tree(proposer.propose(64), [7] * 20, list(range(-1, 19)))


def test_accept_extends_the_context_and_advances_the_match():
    # After accepting 7 8 the suffix "5 6 7 8" (L=4) matches:
    #
    #   root(8) ── 9 ── 5 ── 6 ── 7 ── 8
    #
    proposer = Proposer()
    proposer.start(arr(REPEAT_PROMPT))
    proposer.accept(arr([7, 8]))
    tree = proposer.propose(5)
    assert_tree(tree, [9, 5, 6, 7, 8], [-1, 0, 1, 2, 3], scores=[4 / 6] * 5)
    assert proposer.last_match_lengths()["context"] == 4
    assert len(proposer.context) == 9


# Context 1 2 3 4 9 1 2 (match "1 2", L=2) and reference 7 1 2 3 5 (match "1 2", L=2),
# max_depth 5 (else the context's overlapping copy would go on 3 4 9 1 2 3 ...):
#
#   root(2) ── 3 ─┬─ 4 ── 9 ── 1 ── 2      node 0 "3": both sources, 1 - (1 - .5)(1 - .5) = .75
#                 └─ 5                     node 5 "5": reference only
#
MERGE_TOKENS = [3, 4, 9, 1, 2, 5]
MERGE_PARENTS = [-1, 0, 1, 2, 3, 0]
MERGE_SOURCES = [CONTEXT, CONTEXT, CONTEXT, CONTEXT, CONTEXT, REFERENCE]
MERGE_SCORES = [0.75, 0.5, 0.5, 0.5, 0.5, 0.5]


def test_two_sources_merge_a_common_prefix_into_one_node():
    proposer = Proposer(references=[arr([7, 1, 2, 3, 5])], max_depth=5)
    proposer.start(arr([1, 2, 3, 4, 9, 1, 2]))
    tree = proposer.propose(32)
    assert_tree(tree, MERGE_TOKENS, MERGE_PARENTS, MERGE_SOURCES, MERGE_SCORES)
    assert proposer.last_match_lengths() == {"context": 2, "reference": 2, "corpus": 0, "memory": 0}


def test_a_unique_continuation_goes_deep_up_to_max_depth():
    # 0 1 ... 99 0 1: the match "0 1" continues uniquely (2 .. 99, then the
    # overlapping copy 0 1 2 ...), so the chain is max_depth deep.
    prompt = list(range(100)) + [0, 1]
    for max_depth in (64, 10, 500):
        proposer = Proposer(max_depth=max_depth)
        proposer.start(arr(prompt))
        tree = proposer.propose(1000)
        assert tree.token_ids.tolist() == [(2 + i) % 100 for i in range(max_depth)]
        assert tree.parents.tolist() == list(range(-1, max_depth - 1))


# Context 1 2 1 2 1 3 1: the suffix "1" (L=1, confidence 1/3) was followed by
# 2 twice and 3 once (the final "1" has no continuation and is not counted):
#
#   root(1) ─┬─ 2 (2/9) ── 1 (2/9)
#            └─ 3 (1/9)
#
def test_branch_scores_are_count_ratios_of_the_children():
    proposer = Proposer(max_depth=4)
    proposer.start(arr([1, 2, 1, 2, 1, 3, 1]))
    tree = proposer.propose(2)
    assert_tree(tree, [2, 1], [-1, 0], scores=[2 / 9, 2 / 9])
    tree = proposer.propose(64)
    assert tree.token_ids[:2].tolist() == [2, 1]
    assert 3 in tree.token_ids[tree.parents == -1].tolist()
    assert np.all(np.diff(tree.scores) <= 1e-7)  # best-first: non-increasing scores


def test_max_nodes_is_respected_and_the_order_is_topological():
    # "1 x" for 100 different x, then "1": the match "1" has 100 children.
    prompt = [t for x in range(100) for t in (1, 1000 + x)] + [1]
    proposer = Proposer(max_depth=16)
    proposer.start(arr(prompt))
    for max_nodes in (0, 1, 3, 17, 64):
        tree = proposer.propose(max_nodes)
        assert len(tree) == max_nodes
        assert np.all(tree.parents < np.arange(len(tree)))
        assert tree.depths.max(initial=0) <= 16


def test_empty_tree_when_nothing_matches():
    proposer = Proposer(references=[arr([9, 9, 9])])
    proposer.start(arr([1, 2, 3]))
    tree = proposer.propose(32)
    assert len(tree) == 0
    assert proposer.last_match_lengths() == {"context": 0, "reference": 0, "corpus": 0, "memory": 0}


# Corpus documents 10 11 12 13 and 10 11 12 14; prompt ends with 10 11 (L=2,
# confidence 0.9 * 2/6 = 0.3):
#
#   root(11) ── 12 ─┬─ 13      each leaf 0.15
#                   └─ 14
#
def test_corpus_source_branches_by_counts():
    index = CorpusIndex.build([[10, 11, 12, 13], [10, 11, 12, 14]], show_progress=False)
    proposer = Proposer(index)
    proposer.start(arr([1, 10, 11]))
    tree = proposer.propose(32)
    assert_tree(tree, [12, 13, 14], [-1, 0, 0], [CORPUS] * 3, [0.3, 0.15, 0.15])
    assert proposer.last_match_lengths()["corpus"] == 2


def test_a_loaded_corpus_proposes_the_same_tree(tmp_path):
    built = CorpusIndex.build([[10, 11, 12, 13], [10, 11, 12, 14]], show_progress=False)
    built.save(tmp_path / "c.refdec")
    loaded = CorpusIndex.load(tmp_path / "c.refdec")
    trees = []
    for index in (built, loaded):
        proposer = Proposer(index)
        proposer.start(arr([1, 10, 11]))
        trees.append(proposer.propose(32))
    assert trees[0].token_ids.tolist() == trees[1].token_ids.tolist()
    assert trees[0].parents.tolist() == trees[1].parents.tolist()


def test_propose_before_start_raises_value_error():
    with pytest.raises(ValueError, match="start"):
        Proposer().propose(4)


@pytest.mark.parametrize("bad", [-1, 1.5, None])
def test_bad_max_nodes_raises_value_error_naming_it(bad):
    proposer = Proposer()
    proposer.start(arr([1, 2]))
    with pytest.raises(ValueError, match="max_nodes"):
        proposer.propose(bad)


def test_negative_accepted_token_raises_value_error_naming_it():
    proposer = Proposer()
    proposer.start(arr([1, 2]))
    with pytest.raises(ValueError, match="-5"):
        proposer.accept(np.array([3, -5]))


def test_start_resets_the_request():
    proposer = Proposer()
    proposer.start(arr(REPEAT_PROMPT))
    proposer.start(arr([1, 2, 3]))
    assert len(proposer.propose(8)) == 0
    assert len(proposer.context) == 3


def test_build_draft_combines_sources_explicitly():
    # The low-level builder used by ProposerCore, driven directly:
    #   automaton over 1 2 3 | 1 2 4, matched at "1 2" (L=2, weight 1, half_len 0: confidence 1):
    #
    #   root ─┬─ 3 (0.5)
    #         └─ 4 (0.5)
    sam = _C.SuffixAutomaton()
    sam.add_document(arr([1, 2, 3]))
    sam.add_document(arr([1, 2, 4]))
    state = sam.find_state(arr([1, 2]))
    source = testing.DraftSource(view=sam, state=state, match_len=2,
                                 params=SourceParams(weight=1.0, half_len=0.0), source_id=7)
    draft = testing.build_draft([source], max_nodes=8, max_depth=4)
    assert draft.token_ids.tolist() == [3, 4]
    assert draft.parents.tolist() == [-1, -1]
    np.testing.assert_allclose(draft.scores, [0.5, 0.5])
    assert draft.source_ids.tolist() == [7, 7]


# Context 1 2 3 9 2 4 1 2: the longest match "1 2" (L=2) continues with 3 only;
# with back-off the shorter match "2" (L=1, confidence 1/3) adds its other
# continuation 4 (1/3 * 1/2). Same source: a node takes the max of its entries.
#
#   backoff=0:  root(2) ── 3 (.5) ── 9 (.5)
#
#   backoff=1:  root(2) ─┬─ 3 (.5) ── 9 (.5)
#                        └─ 4 (1/6)
#
def test_backoff_adds_the_continuations_of_a_shorter_match():
    prompt = arr([1, 2, 3, 9, 2, 4, 1, 2])
    plain = Proposer(max_depth=2, backoff=0)
    plain.start(prompt)
    assert_tree(plain.propose(3), [3, 9], [-1, 0], scores=[0.5, 0.5])
    backoff = Proposer(max_depth=2, backoff=1)
    backoff.start(prompt)
    assert_tree(backoff.propose(3), [3, 9, 4], [-1, 0, -1], [CONTEXT] * 3, [0.5, 0.5, 1 / 6])
    default = Proposer(max_depth=2)  # back-off by one shorter match is the default
    default.start(prompt)
    assert_tree(default.propose(3), [3, 9, 4], [-1, 0, -1], [CONTEXT] * 3, [0.5, 0.5, 1 / 6])


@pytest.mark.parametrize("kwargs, name", [({"backoff": -1}, "backoff"), ({"backoff": 1.5}, "backoff"),
                                          ({"backoff": True}, "backoff"), ({"min_backoff_len": 0}, "min_backoff_len"),
                                          ({"max_depth": 0}, "max_depth"), ({"max_depth": 2.0}, "max_depth")])
def test_integer_arguments_are_validated(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Proposer(**kwargs)


# A matched state with more than 256 continuations (DraftTreeBuilder::kMaxFanout) proposes none
# of them: such near-root states say little, and a corpus's have tens of thousands. Documents
# "1 t" for n tokens t, prompt "5 1": the match "1" has n children of one occurrence each.
#
#   n = 256:  root(1) ─┬─ 1000 (1/256 of the confidence)     n = 257:  root(1)  (no node)
#                      ├─ 1001
#                      ...
@pytest.mark.parametrize("source", ["corpus", "reference"])
@pytest.mark.parametrize("n, drafted", [(256, 256), (257, 0)])
def test_a_match_with_more_than_256_continuations_proposes_none(source, n, drafted):
    documents = [arr([1, 1000 + t]) for t in range(n)]
    if source == "corpus":
        proposer = Proposer(index=CorpusIndex.build(documents, show_progress=False), backoff=0)
    else:
        proposer = Proposer(references=documents, backoff=0)
    proposer.start(arr([5, 1]))
    tree = proposer.propose(300)
    assert len(tree) == drafted
    assert sorted(tree.token_ids.tolist()) == list(range(1000, 1000 + drafted))


@pytest.mark.parametrize("tokens", [[7, 8], (7, 8), np.array([7, 8], dtype=np.int64),
                                    np.array([0, 7, 0, 8], dtype=np.int32)[1::2]],
                         ids=["list", "tuple", "int64", "strided int32"])
def test_accept_takes_any_integer_sequence_as_an_int32_array(tokens):
    expected = Proposer()
    expected.start(arr(REPEAT_PROMPT))
    expected.accept(arr([7, 8]))
    proposer = Proposer()
    proposer.start(arr(REPEAT_PROMPT))
    proposer.accept(tokens)
    assert proposer.context.tokens().tolist() == expected.context.tokens().tolist()
    assert proposer.propose(16).token_ids.tolist() == expected.propose(16).token_ids.tolist()


@pytest.mark.parametrize("tokens, message", [
    (np.array([1.5]), "integer token ids"),
    (np.array([2**31], dtype=np.int64), r"\[0, 2\*\*31\); tokens\[0\] = 2147483648"),
    (np.array([4, -3], dtype=np.int32), r"tokens\[1\] = -3"),
])
def test_accept_refuses_what_is_not_token_ids_naming_the_value(tokens, message):
    proposer = Proposer()
    proposer.start(arr(REPEAT_PROMPT))
    with pytest.raises(ValueError, match=message):
        proposer.accept(tokens)


def test_a_proposed_tree_has_every_draft_tree_field_and_passes_its_validation():
    # Proposer builds its trees with DraftTree._trusted (no re-validation): a field added to
    # DraftTree must be set there too, and the arrays must be what the validating constructor makes.
    import dataclasses

    proposer = Proposer(max_depth=12)
    proposer.start(arr(REPEAT_PROMPT))
    tree = proposer.propose(32)
    assert set(vars(tree)) == {f.name for f in dataclasses.fields(DraftTree)}
    checked = DraftTree(tree.token_ids, tree.parents, tree.scores, tree.source_ids, tree.source_names)
    for name in ("token_ids", "parents", "scores", "source_ids", "depths"):
        assert getattr(tree, name).dtype == getattr(checked, name).dtype
        np.testing.assert_array_equal(getattr(tree, name), getattr(checked, name))


def test_the_builders_depths_are_the_depths_of_the_parents_over_many_proposed_trees():
    # The C++ builder returns each node's depth with the tree (DraftTree.depths; a proposed tree
    # is not checked in Python): over random streams, every source, the cursor and the batch
    # call, the depths are those a hand-made tree derives from the same parents.
    rng = np.random.default_rng(11)
    index = CorpusIndex.build([rng.integers(0, 12, 2000).astype(np.int32) for _ in range(2)], vocab_size=12,
                              show_progress=False)
    proposers = []
    for i in range(32):
        prompt = arr(rng.integers(0, 12, int(rng.integers(20, 200))))
        references = [prompt[: len(prompt) // 2]] if i % 3 else None
        proposer = Proposer(index=index if i % 2 else None, references=references,
                            cursor=bool(references) and i % 4 == 1, max_depth=int(rng.integers(1, 40)))
        proposer.start(prompt)
        proposers.append(proposer)
    trees = []
    for _ in range(12):
        for proposer in proposers:
            proposer.accept(arr(rng.integers(0, 12, int(rng.integers(0, 4)))))
            trees.append(proposer.propose(int(rng.integers(0, 64))))
        batch = Proposer.propose_batch(proposers, 48, num_threads=2)  # 2 threads of 16 requests
        trees.extend(batch.tree(r) for r in range(len(batch)))
    for tree in trees:
        derived = DraftTree(tree.token_ids, tree.parents, tree.scores).depths
        assert tree.depths.dtype == np.int32
        np.testing.assert_array_equal(tree.depths, derived)
    assert sum(len(tree) for tree in trees) > 20 * len(trees)
    assert max(int(tree.depths.max(initial=0)) for tree in trees) >= 20  # deep trees too, not only fans
