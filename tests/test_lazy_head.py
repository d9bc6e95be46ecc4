"""The lazy LM head (refdec.verify.LazyRowLogits): the verifier computes logits only for
the tree rows the acceptance walk visits, with the same tokens as the whole-tree head."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import refdec
import tiny_models
from refdec.budget import AutoBudget
from refdec.calibration import CostCurve, measure
from refdec.decode.accept import accept_walk, accept_walk_lazy, first_child_rows
from refdec.decode.cache import new_cache
from refdec.decode.head import LazyRowLogits, PlainHead, split_forward_fn
from refdec.decode.masks import build_tree_inputs
from refdec.decode.model_support import cache_kwarg, mask_spec_for
from refdec.tree import DraftTree

# root -> 20 -> 21 -> 23, root -> 22 -> 24, 21 -> 25 (nodes best-first: first child = best)
TREE = DraftTree(np.array([20, 21, 22, 23, 24, 25]), np.array([-1, 0, -1, 1, 2, 1]), np.ones(6, np.float32))


def test_first_child_rows_follow_the_best_child():
    # rows: 0 root, 1 node0(20), 2 node1(21), 3 node2(22), 4 node3(23), 5 node4(24), 6 node5(25)
    assert first_child_rows(TREE).tolist() == [1, 2, 4, 5, -1, -1, -1]
    assert first_child_rows(DraftTree.empty()).tolist() == [-1]


def _tree_hidden(model, tree):
    backbone_forward, head = split_forward_fn(model)
    spec = mask_spec_for(model)
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]])
    inputs = build_tree_inputs(tree, 17, prompt.shape[1], spec)
    with torch.inference_mode():
        cache = new_cache()
        model(input_ids=prompt, use_cache=True, **{cache_kwarg(model): cache})
        hidden = backbone_forward(cache, input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                                  attention_mask=inputs.attention_mask)[0]
        cache = new_cache()
        model(input_ids=prompt, use_cache=True, **{cache_kwarg(model): cache})
        full = model(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                     attention_mask=inputs.attention_mask, use_cache=True, **{cache_kwarg(model): cache}).logits[0]
    return hidden, head, full


@pytest.mark.parametrize("make", [tiny_models.tiny_llama, tiny_models.tiny_gemma3, tiny_models.tiny_gpt2])
def test_lazy_rows_equal_the_model_logits_and_compute_chunks_along_the_best_path(make):
    model = make()
    hidden, head, full = _tree_hidden(model, TREE)
    lazy = LazyRowLogits(TREE, hidden, head, chunk=3)
    assert lazy.argmax(0) == int(full[0].argmax())
    # the first chunk is the root and its best-child chain: rows 0, 1, 2
    assert lazy.rows_computed == 3 and sorted(lazy._argmax) == [0, 1, 2]
    torch.testing.assert_close(lazy.row_logits(1), full[1], rtol=1e-10, atol=1e-10)
    assert lazy.rows_computed == 3  # already there
    # a row off the path starts a new chunk: row 3, its child row 5, then the next row by index (4)
    torch.testing.assert_close(lazy.row_logits(3), full[3], rtol=1e-10, atol=1e-10)
    assert lazy.rows_computed == 6 and sorted(lazy._argmax) == [0, 1, 2, 3, 4, 5]
    for row in range(len(TREE) + 1):
        assert lazy.argmax(row) == int(full[row].argmax())
    assert lazy.rows_computed == 7


def test_plain_head_pads_a_single_row_and_matches_linear():
    model = tiny_models.tiny_llama()
    _, head = split_forward_fn(model)
    h = torch.randn(1, model.config.hidden_size, dtype=torch.float64)
    torch.testing.assert_close(head.logits(h), torch.nn.functional.linear(h, model.lm_head.weight),
                               rtol=1e-10, atol=1e-10)
    assert head.logits(h).shape == (1, model.config.vocab_size)


def test_lazy_walk_equals_the_full_walk_for_random_targets():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(0, 12))
        parents = np.array([int(rng.integers(-1, i)) for i in range(n)], dtype=np.int32)
        tokens = rng.integers(0, 3, size=n)
        tree = DraftTree(tokens, parents, np.ones(n, np.float32))
        targets = rng.integers(0, 3, size=n + 1)
        full = accept_walk(tree, targets)
        lazy = accept_walk_lazy(tree, lambda row, depth: int(targets[row]))
        assert full[0].tolist() == lazy[0].tolist() and full[1] == lazy[1]


@pytest.mark.parametrize("do_sample", [False, True])
def test_decoder_output_is_the_same_with_and_without_the_lazy_head(family_model, do_sample):
    name, model = family_model
    decoder = refdec.SpeculativeDecoder(model)
    assert decoder.lazy_head  # CPU + a plain head
    prompts = tiny_models.repetitive_prompts(8, seed=21)
    lazy_rows = full_rows = accepted = 0
    kwargs = dict(max_new_tokens=30, eos_token_id=[], max_draft_tokens=16, do_sample=do_sample, seed=7)
    for prompt in prompts:
        decoder.lazy_head = False
        plain = decoder.generate(prompt, **kwargs).sequences[0].tolist()
        # a reference holding the output (one token corrupted) makes long drafts to accept and reject
        reference = plain[len(prompt) - 2:]
        reference[12] = (reference[12] + 1) % tiny_models.VOCAB
        outs = []
        for lazy in (True, False):
            decoder.lazy_head = lazy
            out = decoder.generate(prompt, references=[reference], **kwargs)
            outs.append(out.sequences[0].tolist())
            if lazy:
                lazy_rows += out.stats.head_rows
                accepted += out.stats.accepted_tokens
            else:
                full_rows += out.stats.head_rows
        assert outs[0] == outs[1] == plain, (name, prompt)
    assert accepted > 20
    # the lazy head ran on fewer rows than the whole trees (a chunk of 4 per visited run)
    assert lazy_rows < full_rows, (lazy_rows, full_rows)


def test_lazy_cost_curve_json_round_trip_and_head_cost():
    curve = CostCurve((0, 64), (0.03, 0.12), None, 0.016, 4)
    assert curve.lazy_head
    again = CostCurve.from_json(curve.to_json())
    assert again == curve and again.head_chunk_seconds == 0.016
    assert curve(0) == pytest.approx(0.03 + 0.016)
    assert curve(64, 13.5) == pytest.approx(0.12 + 0.016 * 4)
    with pytest.raises(ValueError, match="head_chunk_seconds"):
        CostCurve((0, 1), (1.0, 1.0), None, -1.0)
    with pytest.raises(ValueError, match="head_chunk_rows"):
        CostCurve((0, 1), (1.0, 1.0), None, 0.1, 0)


def test_auto_budget_with_a_lazy_head_verifies_larger_trees_for_the_same_acceptance():
    """A lazy head makes unaccepted nodes cheap (only the backbone pays for them), so the
    budget keeps more of a tree than under a curve where every node pays its head row."""
    lazy = CostCurve((0, 16, 64), (0.030, 0.055, 0.120), None, 0.016, 4)
    # the same model with the head on every row (4 ms a row)
    full = CostCurve((0, 16, 64), (0.046, 0.055 + 0.004 * 17, 0.120 + 0.004 * 65))
    tree = DraftTree.chain(np.arange(3, 67))
    sizes = []
    for curve in (lazy, full):
        budget = AutoBudget(curve, prior_weight=1e9)
        budget._first_prior[:] = 0.6  # every first-depth node: 60%, decaying with depth
        budget._update_rates()
        sizes.append(len(budget.select(tree)))
    assert sizes[0] > sizes[1] > 0, sizes


def test_measure_times_the_backbone_and_one_head_chunk():
    model = tiny_models.tiny_llama()
    curve = measure(model, nodes=(0, 4), cache_len=16, repeats=1, warmup=0)
    assert curve.lazy_head and curve.head_chunk_rows == 4 and curve.head_chunk_seconds > 0
    assert curve.nodes == (0, 4)
    full = measure(model, nodes=(0, 4), cache_len=16, repeats=1, warmup=0, lazy_head=False)
    assert not full.lazy_head
    model.lm_head.register_forward_hook(lambda module, inputs, output: output)
    with pytest.raises(ValueError, match="lazy_head"):
        measure(model, nodes=(0,), cache_len=16, repeats=1, warmup=0, lazy_head=True)
