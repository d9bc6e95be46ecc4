"""Specifies refdec.transformers.masks: a draft tree becomes (input_ids, position_ids = root position +
depth, attention mask) where a node sees the whole prefix, its ancestors and itself (and, for a
sliding-window layer, only what lies in its window); a tree forward then gives every row the
logits a plain forward over its branch gives. Built on the device from the trees' parents (the full
head's path), the inputs are those built on the host.

The trees are drawn in tests/drawn_trees.py (rows: R = root = row 0, node i = row i+1).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from drawn_trees import (CHAIN3_ANC, CHAIN3_PARENTS, FORK_ANC, FORK_DEPTH, FORK_PARENTS, WIDE_ANC, WIDE_PARENTS,
                         random_tree)
from refdec.transformers.cache import new_cache
from refdec.transformers.masks import (MASK_ROW_ALIGN, MaskSpec, ancestor_matrix, device_tree_inputs,
                                 tree_step_inputs)
from refdec.drafting.tree import DraftTree
from refdec.transformers.model_support import mask_spec_for
from tiny_models import FAMILIES, one_tree_inputs


@pytest.mark.parametrize("parents, anc", [
    (CHAIN3_PARENTS, CHAIN3_ANC),
    (FORK_PARENTS, FORK_ANC),
    (WIDE_PARENTS, WIDE_ANC),
    ([], [[1]]),
])
def test_ancestor_matrix_matches_drawn_tree(parents, anc):
    assert ancestor_matrix(np.asarray(parents, dtype=np.int32)).astype(int).tolist() == anc


def test_full_mask_sees_whole_prefix_then_ancestors_and_positions_are_prefix_plus_depth():
    tree = DraftTree(np.array([10, 11, 12, 13, 14]), np.array(FORK_PARENTS), np.ones(5))
    spec = MaskSpec(kind="single", window=None, additive=False, dtype=torch.float64)
    inp = one_tree_inputs(tree, root_token=7, root_pos=4, spec=spec)
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
    inp = one_tree_inputs(tree, root_token=9, root_pos=5, spec=spec)
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
    inp = one_tree_inputs(tree, root_token=0, root_pos=0, spec=spec)
    assert inp.attention_mask[0, 0].int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [0, 1, 1, 0],
        [0, 0, 1, 1],
    ]


def test_eager_attention_gets_an_additive_float_mask():
    spec = MaskSpec(kind="single", window=None, additive=True, dtype=torch.float64)
    inp = one_tree_inputs(DraftTree.chain([3]), root_token=1, root_pos=2, spec=spec)
    m = inp.attention_mask[0, 0]
    assert m.dtype == torch.float64
    assert m[0, 3] == torch.finfo(torch.float64).min and m[1, 3] == 0 and m[0, 0] == 0


def _plain_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].to(torch.float64)


@pytest.mark.parametrize("shape, seed", [("fork", 1), ("wide", 2), ("long_chain", 3)])
def test_tree_forward_logits_equal_plain_forward_per_branch(mask_family_model, shape, seed):
    """Every tree row's logits equal the logits of a plain forward over its branch (prefix cached)."""
    name, model = mask_family_model
    rng = np.random.default_rng([seed, FAMILIES.index(name)])  # fixed per case (was hash(): other every run)
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
        inp = one_tree_inputs(tree, prefix[-1], len(prefix) - 1, mask_spec_for(model))
        logits = model(input_ids=inp.input_ids, position_ids=inp.position_ids,
                       attention_mask=inp.attention_mask, cache=cache, use_cache=True).logits[0]
    anc = ancestor_matrix(tree.parents)
    for row in range(anc.shape[0]):
        path_rows = np.flatnonzero(anc[row])  # root first, then ancestors in order, then the row
        branch = prefix + [int(tokens[r - 1]) for r in path_rows[1:]]
        expected = _plain_logits(model, branch)[-1]
        torch.testing.assert_close(logits[row], expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("spec", [MaskSpec("single", None, False, torch.float64), MaskSpec("single", 3, True, torch.float32),
                                  MaskSpec("dict", 4, False, torch.float64)], ids=["plain", "window-additive", "dict"])
def test_masks_built_on_the_device_equal_those_built_on_the_host(spec):
    rng = np.random.default_rng(3)
    for _ in range(20):
        batch, slots = int(rng.integers(1, 5)), int(rng.integers(1, 12))
        trees = [random_tree(rng, int(rng.integers(0, 20)), n_tokens=96) for _ in range(batch)]
        key_pos = np.where(rng.random((batch, slots)) < 0.8, rng.integers(0, 50, (batch, slots)), -1)
        roots, root_pos = rng.integers(0, 96, batch), rng.integers(50, 60, batch)
        host = tree_step_inputs(trees, roots, root_pos, key_pos >= 0, key_pos, spec, "cpu")
        device, on_device = device_tree_inputs(trees, roots, root_pos, torch.from_numpy(key_pos), spec, "cpu")
        assert torch.equal(device.input_ids, host.input_ids) and torch.equal(device.position_ids, host.position_ids)
        want, got = host.attention_mask, device.attention_mask
        for name in (want if isinstance(want, dict) else [None]):
            w, g = (want[name], got[name]) if name else (want, got)
            visible = w if w.dtype == torch.bool else w == 0
            assert g.dtype == spec.dtype and torch.equal(g == 0, visible), name  # additive in the model's dtype
            assert torch.equal(g != 0, g == torch.finfo(spec.dtype).min), name
            assert g.stride(-2) % MASK_ROW_ALIGN == 0, name  # rows aligned for SDPA's kernels
        for b, tree in enumerate(trees):
            anc = ancestor_matrix(tree.parents)
            m = anc.shape[0]
            assert torch.equal(on_device.ancestors[b, :m, :m], torch.from_numpy(anc))
            assert on_device.depth[b, :m].tolist() == [0] + tree.depths.tolist()  # the root at 0


@pytest.mark.parametrize("spec", [MaskSpec("single", 3, True, torch.float32), MaskSpec("dict", 4, False, torch.float64)],
                         ids=["window-additive", "dict"])
def test_fixed_shape_inputs_pad_the_rows_and_hide_every_column_past_the_trees(spec):
    """``rows`` pads T (padding rows: the root, at the root's position, seeing only themselves) and
    ``width`` widens the masks to the cache's capacity, every column past S + T hidden; the rest as without."""
    rng = np.random.default_rng(5)
    trees = [random_tree(rng, n, n_tokens=96) for n in (3, 9)]
    key_pos = torch.from_numpy(np.where(rng.random((2, 7)) < 0.8, rng.integers(0, 50, (2, 7)), -1))
    roots, root_pos = np.array([4, 5]), np.array([51, 55])
    plain, plain_trees = device_tree_inputs(trees, roots, root_pos, key_pos, spec, "cpu")
    fixed, fixed_trees = device_tree_inputs(trees, roots, root_pos, key_pos, spec, "cpu", rows=16, width=40)
    t = plain.input_ids.shape[1]
    assert t > 4
    assert fixed.input_ids.shape == (2, 16) and torch.equal(fixed.input_ids[:, :t], plain.input_ids)
    assert torch.equal(fixed.input_ids[:, t:], torch.tensor(roots)[:, None].expand(2, 16 - t))
    assert torch.equal(fixed.position_ids[:, t:], torch.tensor(root_pos)[:, None].expand(2, 16 - t))
    assert torch.equal(fixed_trees.depth[:, :t], plain_trees.depth)
    want, got = plain.attention_mask, fixed.attention_mask
    for name in (want if isinstance(want, dict) else [None]):
        w, g = (want[name], got[name]) if name else (want, got)
        assert g.shape == (2, 1, 16, 40)
        assert torch.equal(g[:, :, :t, :7], w[:, :, :, :7])  # the cache's slots
        assert torch.equal(g[:, :, :t, 7:7 + t], w[:, :, :, 7:])  # the tree's own columns
        visible = g == 0
        assert not visible[:, :, :, 7 + 16:].any()  # past S + T: hidden
        assert torch.equal(visible[:, 0, t:, 7:7 + 16], torch.eye(16, dtype=torch.bool)[t:].expand(2, -1, -1))
    with pytest.raises(ValueError, match=f"rows={t - 1} is fewer than the {t} rows of the largest tree"):
        device_tree_inputs(trees, roots, root_pos, key_pos, spec, "cpu", rows=t - 1)
    with pytest.raises(ValueError, match="width=20 is less than the cache's 7 slots plus 16 query rows"):
        device_tree_inputs(trees, roots, root_pos, key_pos, spec, "cpu", rows=16, width=20)
