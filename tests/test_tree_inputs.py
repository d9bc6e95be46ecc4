"""Tree → (input_ids, position_ids, mask): hand-drawn trees, sliding windows, and
tree-forward logits equal to plain-forward logits on every branch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from refdec.decode.cache import compact, new_cache
from refdec.decode.masks import MaskSpec, ancestor_matrix, build_tree_inputs
from refdec.decode.model_support import mask_spec_for
from refdec.tree import DraftTree, prune_to_depth

# Rows: R = root (row 0), node i = row i+1.

#   R ─ a ─ b ─ c            a chain of three
CHAIN3_PARENTS = [-1, 0, 1]
CHAIN3_ANC = [
    # R a b c
    [1, 0, 0, 0],  # R
    [1, 1, 0, 0],  # a
    [1, 1, 1, 0],  # b
    [1, 1, 1, 1],  # c
]

#        ┌ a ─ c
#   R ───┤
#        └ b ─ d ─ e           two branches
FORK_PARENTS = [-1, -1, 0, 1, 3]
FORK_ANC = [
    # R a b c d e
    [1, 0, 0, 0, 0, 0],  # R
    [1, 1, 0, 0, 0, 0],  # a
    [1, 0, 1, 0, 0, 0],  # b
    [1, 1, 0, 1, 0, 0],  # c
    [1, 0, 1, 0, 1, 0],  # d
    [1, 0, 1, 0, 1, 1],  # e
]
FORK_DEPTH = [0, 1, 1, 2, 2, 3]

#        ┌ a ─┬ b
#   R ───┤    └ c ─ e       a wide tree, a node with two children
#        └ d
WIDE_PARENTS = [-1, 0, 0, -1, 2]
WIDE_ANC = [
    # R a b c d e
    [1, 0, 0, 0, 0, 0],  # R
    [1, 1, 0, 0, 0, 0],  # a
    [1, 1, 1, 0, 0, 0],  # b
    [1, 1, 0, 1, 0, 0],  # c
    [1, 0, 0, 0, 1, 0],  # d
    [1, 1, 0, 1, 0, 1],  # e
]
WIDE_DEPTH = [0, 1, 2, 2, 1, 3]


@pytest.mark.parametrize("parents, anc, depth", [
    (CHAIN3_PARENTS, CHAIN3_ANC, [0, 1, 2, 3]),
    (FORK_PARENTS, FORK_ANC, FORK_DEPTH),
    (WIDE_PARENTS, WIDE_ANC, WIDE_DEPTH),
    ([], [[1]], [0]),
])
def test_ancestor_matrix_matches_drawn_tree(parents, anc, depth):
    got_anc, got_depth = ancestor_matrix(np.asarray(parents, dtype=np.int32))
    assert got_anc.astype(int).tolist() == anc
    assert got_depth.tolist() == depth


def test_full_mask_sees_whole_prefix_then_ancestors_and_positions_are_prefix_plus_depth():
    tree = DraftTree(np.array([10, 11, 12, 13, 14]), np.array(FORK_PARENTS), np.ones(5))
    spec = MaskSpec(kind="single", window=None, additive=False, dtype=torch.float64)
    inp = build_tree_inputs(tree, root_token=7, root_pos=4, spec=spec)
    assert inp.input_ids.tolist() == [[7, 10, 11, 12, 13, 14]]
    assert inp.position_ids.tolist() == [[4 + d for d in FORK_DEPTH]]
    mask = inp.attention_mask
    assert mask.shape == (1, 1, 6, 4 + 6) and mask.dtype == torch.bool
    assert mask[0, 0, :, :4].all()
    assert mask[0, 0, :, 4:].int().tolist() == FORK_ANC


def test_sliding_mask_applies_window_on_positions():
    # window 3: a query at position q sees keys at q-2, q-1, q (transformers: q - k < window)
    #   prefix positions 0..4, root R at 5
    #   R(5) ─ a(6) ─ b(7)
    #   R(5) ─ c(6)
    tree = DraftTree(np.array([20, 21, 22]), np.array([-1, 0, -1]), np.ones(3))
    spec = MaskSpec(kind="dict", window=3, additive=False, dtype=torch.float64)
    inp = build_tree_inputs(tree, root_token=9, root_pos=5, spec=spec)
    full = inp.attention_mask["full_attention"][0, 0].int().tolist()
    win = inp.attention_mask["sliding_attention"][0, 0].int().tolist()
    # key columns: positions 0 1 2 3 4 | R a b c
    assert full == [
        [1, 1, 1, 1, 1, 1, 0, 0, 0],  # R (5)
        [1, 1, 1, 1, 1, 1, 1, 0, 0],  # a (6)
        [1, 1, 1, 1, 1, 1, 1, 1, 0],  # b (7)
        [1, 1, 1, 1, 1, 1, 0, 0, 1],  # c (6)
    ]
    assert win == [
        [0, 0, 0, 1, 1, 1, 0, 0, 0],  # R (5): sees 3, 4, 5
        [0, 0, 0, 0, 1, 1, 1, 0, 0],  # a (6): sees 4, R, a
        [0, 0, 0, 0, 0, 1, 1, 1, 0],  # b (7): sees R, a, b
        [0, 0, 0, 0, 1, 1, 0, 0, 1],  # c (6): sees 4, R, c
    ]


def test_window_also_cuts_inside_a_long_draft_chain():
    # window 2 and a chain deeper than the window: node at depth 3 sees only depth 2 and itself
    tree = DraftTree.chain([1, 2, 3])
    spec = MaskSpec(kind="single", window=2, additive=False, dtype=torch.float64)
    inp = build_tree_inputs(tree, root_token=0, root_pos=0, spec=spec)
    assert inp.attention_mask[0, 0].int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [0, 1, 1, 0],
        [0, 0, 1, 1],
    ]


def test_eager_attention_gets_an_additive_float_mask():
    spec = MaskSpec(kind="single", window=None, additive=True, dtype=torch.float64)
    inp = build_tree_inputs(DraftTree.chain([3]), root_token=1, root_pos=2, spec=spec)
    m = inp.attention_mask[0, 0]
    assert m.dtype == torch.float64
    assert m[0, 3] == torch.finfo(torch.float64).min and m[1, 3] == 0 and m[0, 0] == 0


def test_prune_to_depth_keeps_shallow_nodes_and_renumbers_parents():
    tree = DraftTree(np.array([10, 11, 12, 13, 14]), np.array(WIDE_PARENTS), np.ones(5))
    pruned = prune_to_depth(tree, 2)  # drops e (depth 3)
    assert pruned.token_ids.tolist() == [10, 11, 12, 13]
    assert pruned.parents.tolist() == [-1, 0, 0, -1]
    one = prune_to_depth(tree, 1)  # a, d
    assert one.token_ids.tolist() == [10, 13] and one.parents.tolist() == [-1, -1]
    assert len(prune_to_depth(tree, 0)) == 0


def test_mask_spec_of_tiny_models(family_model):
    name, model = family_model
    spec = mask_spec_for(model)
    if name == "gemma3":
        assert spec.kind == "dict" and spec.window == model.config.sliding_window
    else:
        assert spec.kind == "single" and spec.window is None


def _plain_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].to(torch.float64)


@pytest.mark.parametrize("shape", ["fork", "wide", "long_chain"])
def test_tree_forward_logits_equal_plain_forward_per_branch(family_model, shape):
    """Every tree row's logits equal the logits of a plain forward over its branch (prefix cached)."""
    name, model = family_model
    rng = np.random.default_rng(hash((name, shape)) % 2**32)
    prefix = rng.integers(3, 90, size=13).tolist()  # 12 cached + root; crosses gemma3's window of 8
    if shape == "fork":
        parents = FORK_PARENTS
    elif shape == "wide":
        parents = WIDE_PARENTS
    else:
        parents = list(range(-1, 11))  # depth 12 > window
    tokens = rng.integers(3, 90, size=len(parents))
    tree = DraftTree(tokens, np.asarray(parents), np.ones(len(parents)))
    with torch.no_grad():
        cache = new_cache()
        model(input_ids=torch.tensor([prefix[:-1]]), cache=cache, use_cache=True)
        inp = build_tree_inputs(tree, prefix[-1], len(prefix) - 1, mask_spec_for(model))
        logits = model(input_ids=inp.input_ids, position_ids=inp.position_ids,
                       attention_mask=inp.attention_mask, cache=cache, use_cache=True).logits[0]
    anc, _ = ancestor_matrix(tree.parents)
    for row in range(anc.shape[0]):
        path_rows = np.flatnonzero(anc[row])  # root first, then ancestors in order, then the row
        branch = prefix + [int(tokens[r - 1]) for r in path_rows[1:]]
        expected = _plain_logits(model, branch)[-1]
        torch.testing.assert_close(logits[row], expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("preallocate, prefix_len", [(True, 14), (True, 254), (False, 14)])
def test_compacted_cache_equals_cache_of_plain_prefill(family_model, preallocate, prefix_len):
    """After keeping the accepted nodes of a fork, the cache equals a plain prefill of that sequence
    (254: the tree step overflows the preallocated buffer's first capacity of 256)."""
    name, model = family_model
    prefix = [3 + (7 * i) % 90 for i in range(prefix_len)]
    tree = DraftTree(np.array([30, 31, 32, 33, 34]), np.array(FORK_PARENTS), np.ones(5))
    accepted = np.array([1, 3, 4])  # b ─ d ─ e
    with torch.no_grad():
        cache = new_cache(preallocate)
        model(input_ids=torch.tensor([prefix[:-1]]), cache=cache, use_cache=True)
        inp = build_tree_inputs(tree, prefix[-1], len(prefix) - 1, mask_spec_for(model))
        model(input_ids=inp.input_ids, position_ids=inp.position_ids, attention_mask=inp.attention_mask,
              cache=cache, use_cache=True)
        compact(cache, len(prefix), torch.from_numpy(accepted), 3)
        plain = new_cache()
        model(input_ids=torch.tensor([prefix + [31, 33, 34]]), cache=plain, use_cache=True)
    assert cache.get_seq_length() == len(prefix) + 3
    assert all(type(layer).__name__ == ("GrowingLayer" if preallocate else "DynamicLayer") for layer in cache.layers)
    for got, want in zip(cache.layers, plain.layers):
        torch.testing.assert_close(got.keys, want.keys, rtol=0, atol=1e-12)
        torch.testing.assert_close(got.values, want.values, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- acceptance walk

from hypothesis import given, settings, strategies as st  # noqa: E402

from refdec.decode.accept import accept_walk, accept_walk_lazy  # noqa: E402


def test_walk_descends_the_branch_that_matches_the_targets():
    #        ┌ a=10 ─ c=12
    #   R ───┤
    #        └ b=11 ─ d=13 ─ e=14
    tree = DraftTree(np.array([10, 11, 12, 13, 14]), np.array(FORK_PARENTS), np.ones(5))
    # targets per row: R→11 (take b), b→13 (take d), d→99 (no child 99): accept b, d; bonus 99
    targets = np.array([11, 0, 13, 0, 99, 0])
    accepted, bonus = accept_walk(tree, targets)
    assert accepted.tolist() == [1, 3] and bonus == 99
    # nothing matches at the root: no node accepted, the bonus is the root's target
    accepted, bonus = accept_walk(tree, np.array([42, 0, 0, 0, 0, 0]))
    assert accepted.tolist() == [] and bonus == 42
    # a whole branch accepted: the bonus is the leaf's target
    accepted, bonus = accept_walk(tree, np.array([11, 0, 13, 0, 14, 7]))
    assert accepted.tolist() == [1, 3, 4] and bonus == 7


@st.composite
def trees_and_targets(draw):
    n = draw(st.integers(0, 24))
    parents = [draw(st.integers(-1, i - 1)) for i in range(n)]
    tokens = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    targets = draw(st.lists(st.integers(0, 3), min_size=n + 1, max_size=n + 1))
    return DraftTree(np.array(tokens, dtype=np.int32), np.array(parents, dtype=np.int32), np.ones(n)), \
        np.array(targets, dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(trees_and_targets())
def test_lazy_walk_equals_vectorised_walk_and_accepts_a_root_path_of_matching_tokens(case):
    tree, targets = case
    accepted, bonus = accept_walk(tree, targets)
    asked = []

    def target_of_row(row, depth):
        asked.append(row)
        return int(targets[row])

    lazy_accepted, lazy_bonus = accept_walk_lazy(tree, target_of_row)
    assert lazy_accepted.tolist() == accepted.tolist() and lazy_bonus == bonus
    assert len(asked) == len(accepted) + 1  # one target per row on the path
    row = 0
    for node in accepted:  # a root-to-node path whose every token is its parent row's target
        assert tree.parents[node] + 1 == row and tree.token_ids[node] == targets[row]
        row = node + 1
    assert bonus == targets[row]


def test_from_paths_merges_shared_prefixes_and_stops_adding_at_max_nodes():
    tree = DraftTree.from_paths([[5, 6, 7], [5, 6, 8], [9, 5]], max_nodes=10, path_sources=[0, 1, 1],
                                source_names=("a", "b"))
    assert tree.token_ids.tolist() == [5, 6, 7, 8, 9, 5]
    assert tree.parents.tolist() == [-1, 0, 1, 1, -1, 4]
    assert tree.source_ids.tolist() == [0, 0, 0, 1, 1, 1] and tree.source_names == ("a", "b")
    # at the cap a path stops adding nodes, but a later path may still follow existing ones
    capped = DraftTree.from_paths([[5, 6, 7], [9], [5, 6, 8]], max_nodes=3)
    assert capped.token_ids.tolist() == [5, 6, 7] and capped.parents.tolist() == [-1, 0, 1]
    assert len(DraftTree.from_paths([], max_nodes=4)) == 0


def test_keep_nodes_renumbers_parents():
    from refdec.tree import keep_nodes

    tree = DraftTree(np.array([10, 11, 12, 13]), np.array([-1, 0, -1, 2]), np.ones(4, np.float32))
    sub = keep_nodes(tree, np.array([2, 3]))
    assert sub.token_ids.tolist() == [12, 13] and sub.parents.tolist() == [-1, 0]
    assert len(keep_nodes(tree, np.array([], dtype=np.int64))) == 0


@pytest.mark.parametrize("family", ["bloom", "falcon-alibi", "mpt", "gpt_neo-local"])
def test_slot_positioned_models_are_rejected_up_front_with_a_clear_error(family):
    """Bloom and Falcon(alibi=True) build their position biases from a 2D padding mask
    (transformers' build_alibi_tensor): with a 4D tree mask they failed deep inside the
    forward with "too many values to unpack". MPT builds its ALiBi biases over KV slots and
    GPT-Neo cuts its local window by slot: a tree gave other tokens than model.generate.
    refdec refuses them when the decoder is made."""
    import transformers as T

    import refdec

    if family == "bloom":
        model = T.BloomForCausalLM(T.BloomConfig(vocab_size=96, hidden_size=32, n_layer=1, n_head=4))
    elif family == "falcon-alibi":
        model = T.FalconForCausalLM(T.FalconConfig(vocab_size=96, hidden_size=32, num_hidden_layers=1,
                                                   num_attention_heads=4, alibi=True))
    elif family == "mpt":
        model = T.MptForCausalLM(T.MptConfig(vocab_size=96, d_model=32, n_heads=4, n_layers=1, max_seq_len=64))
    else:
        model = T.GPTNeoForCausalLM(T.GPTNeoConfig(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4,
                                                   window_size=6, attention_types=[[["global", "local"], 1]],
                                                   max_position_embeddings=64))
    message = "with local attention layers" if family == "gpt_neo-local" else "with ALiBi position biases"
    with pytest.raises(ValueError, match=rf"model type '(bloom|falcon|mpt|gpt_neo)' {message} is not supported"):
        refdec.SpeculativeDecoder(model)
    if family == "gpt_neo-local":  # global layers only: positions come from position_ids, so it is accepted
        refdec.SpeculativeDecoder(T.GPTNeoForCausalLM(T.GPTNeoConfig(
            vocab_size=96, hidden_size=32, num_layers=1, num_heads=4, attention_types=[[["global"], 1]],
            max_position_embeddings=64)))
