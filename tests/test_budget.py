"""The "auto" draft budget: the verified prefix follows the cost curve and the calibrated scores."""

from __future__ import annotations

import json

import numpy as np
import pytest

from refdec.budget import AutoBudget, FixedBudget, make_budget, node_depths
from refdec.calibration import CostCurve, flat_curve
from refdec.tree import DraftTree

# A steep CPU-like curve: every node adds 10% of a one-token forward.
STEEP = CostCurve((0, 64), (1.0, 7.4))
# Verification cost (relative) measured on a 2-core CPU, Gemma 3 270M.
CPU = CostCurve((0, 1, 16, 64), (0.100, 0.105, 0.280, 0.500))
# The lazy-head form of a CPU curve: backbone seconds per tree size + one head chunk of 4 rows.
LAZY = CostCurve((0, 4, 16, 64), (0.030, 0.041, 0.057, 0.119), head_chunk_seconds=0.018)


def sure_chain(n, score=0.97):
    """A chain of n nodes whose scores say "certainly accepted"."""
    tree = DraftTree.chain(np.arange(10, 10 + n))
    return DraftTree(tree.token_ids, tree.parents, np.full(n, score, np.float32))


def unsure_bush(n, score=0.01):
    """n children of the root, each unlikely."""
    return DraftTree(np.arange(10, 10 + n), np.full(n, -1), np.full(n, score, np.float32))


def test_flat_curve_verifies_the_whole_tree():
    budget = AutoBudget(flat_curve(), max_nodes=64)
    assert budget.choose({"context": 0}) == 64
    assert len(budget.select(sure_chain(64))) == 64
    # even unlikely nodes are free on a flat (GPU-like) curve
    assert len(budget.select(unsure_bush(64))) == 64


def test_steep_curve_drafts_nothing_for_unlikely_nodes():
    budget = AutoBudget(STEEP, max_nodes=64, explore_every=0)
    assert len(budget.select(unsure_bush(64))) == 0


def test_steep_curve_keeps_a_likely_chain_prefix_only():
    budget = AutoBudget(STEEP, max_nodes=64)
    n = len(budget.select(sure_chain(64)))
    # the prior decays with depth: a deep sure chain pays up to some depth, not to 64
    assert 4 <= n < 64


def test_cpu_curve_prefers_more_nodes_than_steep_curve():
    tree = sure_chain(64, 0.9)
    assert len(AutoBudget(CPU).select(tree)) >= len(AutoBudget(STEEP).select(tree))


def test_prefix_is_a_valid_subtree_in_node_order():
    # root -> a -> b, root -> c, a -> d: order keeps parents before children
    tree = DraftTree([1, 2, 3, 4], [-1, 0, -1, 0], [0.9, 0.8, 0.5, 0.4])
    budget = AutoBudget(flat_curve(), max_nodes=3)
    cut = budget.select(tree)
    assert cut.token_ids.tolist() == [1, 2, 3] and cut.parents.tolist() == [-1, 0, -1]


def test_feedback_lowers_the_draft_when_nothing_is_accepted():
    budget = AutoBudget(CPU, explore_every=0)
    tree = sure_chain(64, 0.6)
    first = len(budget.select(tree))
    assert first > 0
    for _ in range(200):
        verified = budget.select(tree)
        if len(verified) == 0:
            break
        budget.observe(verified, np.zeros(0, dtype=np.int64))
    assert len(budget.select(tree)) < first


def test_feedback_raises_the_draft_when_everything_is_accepted():
    budget = AutoBudget(STEEP)
    tree = sure_chain(64, 0.6)
    first = len(budget.select(tree))
    for _ in range(100):
        verified = budget.select(tree)
        budget.observe(verified, np.arange(len(verified), dtype=np.int64))
    assert len(budget.select(tree)) > first


def test_exploration_verifies_a_few_nodes_after_skipped_steps():
    budget = AutoBudget(STEEP, explore_every=4, explore_nodes=2)
    sizes = [len(budget.select(unsure_bush(16))) for _ in range(8)]
    assert sizes == [0, 0, 0, 2, 0, 0, 0, 2]


def test_empty_tree_stays_empty():
    assert len(AutoBudget(CPU).select(DraftTree.empty())) == 0


def test_node_depths():
    assert node_depths(np.array([-1, 0, 1, -1, 3, 0], dtype=np.int32)).tolist() == [1, 2, 3, 1, 2, 2]


def test_cost_curve_interpolates_and_extrapolates():
    curve = CostCurve((0, 10, 20), (1.0, 2.0, 4.0))
    assert curve(5) == pytest.approx(1.5)
    assert curve(30) == pytest.approx(6.0)
    assert curve.table(3).shape == (4,)
    assert CostCurve.from_json(json.loads(json.dumps(curve.to_json()))) == curve


@pytest.mark.parametrize("nodes,seconds", [((0, 0), (1, 1)), ((1,), (0,)), ((0, 1), (1,))])
def test_cost_curve_rejects_bad_points(nodes, seconds):
    with pytest.raises(ValueError):
        CostCurve(nodes, seconds)


def test_make_budget():
    assert isinstance(make_budget(16), FixedBudget)
    assert isinstance(make_budget("auto"), AutoBudget)
    custom = AutoBudget(flat_curve())
    assert make_budget(custom) is custom
    with pytest.raises(ValueError):
        make_budget("big")


def test_tiny_model_auto_does_not_calibrate(monkeypatch, tmp_path):
    from refdec import calibration

    monkeypatch.setattr(calibration, "measure", lambda *a, **k: pytest.fail("tiny models must not calibrate"))

    class Tiny:
        def parameters(self):
            return iter([np.zeros(10)]) if False else iter([_P()])

    class _P:
        def numel(self):
            return 1000

    assert calibration.auto_cost_curve(Tiny()) is calibration.DEFAULT_CPU_CURVE


# ---------------------------------------------------------------- batch-aware "auto"

def half_sure_chain(n):
    """A chain whose scores fall with depth: worth a few nodes on a steep curve, not all."""
    tree = DraftTree.chain(np.arange(10, 10 + n))
    return DraftTree(tree.token_ids, tree.parents, (0.9 ** np.arange(1, n + 1)).astype(np.float32))


def test_batch_prefix_of_one_row_is_the_single_row_choice():
    from refdec.budget import batch_prefix_sizes

    for curve in (STEEP, CPU, flat_curve(), LAZY):
        for tree in (sure_chain(64), unsure_bush(20), half_sure_chain(40)):
            budget = AutoBudget(curve, max_nodes=64)
            assert batch_prefix_sizes([budget], [tree]) == [budget.best_prefix(budget.expected_accepted(tree))]


def test_batch_prefix_prices_the_padded_batch_forward():
    """Eight rows pay for 8 * (1 + n) rows: they verify fewer nodes than one row would, all the same
    number (clipped to each row's own tree), and on a flat curve everything."""
    from refdec.budget import batch_prefix_sizes

    curve = CostCurve((0, 64, 512), (1.0, 3.0, 17.0))
    one = AutoBudget(curve, max_nodes=64)
    single = one.best_prefix(one.expected_accepted(half_sure_chain(48)))
    budgets = [AutoBudget(curve, max_nodes=64) for _ in range(8)]
    trees = [half_sure_chain(48) for _ in range(7)] + [half_sure_chain(3)]
    sizes = batch_prefix_sizes(budgets, trees)
    assert 0 < sizes[0] < single
    assert sizes[:7] == [sizes[0]] * 7 and sizes[7] == min(sizes[0], 3)
    flat = [AutoBudget(flat_curve(), max_nodes=64) for _ in range(8)]
    assert batch_prefix_sizes(flat, trees) == [len(t) for t in trees]
    with pytest.raises(ValueError, match="differ in length"):
        batch_prefix_sizes(budgets, trees[:3])
    # the rows' cells computed beforehand give the same choice (the batched loop passes them on)
    assert batch_prefix_sizes(budgets, trees, [b.cells(t) for b, t in zip(budgets, trees)]) == sizes
    with pytest.raises(ValueError, match="cells and trees differ"):
        batch_prefix_sizes(budgets, trees, [budgets[0].cells(trees[0])])


def test_batch_prefix_on_a_lazy_head_curve_adds_each_rows_head_chunks():
    """Two rows: each adds its own head chunks, and the backbone is priced at 2 * (1 + n) rows."""
    from refdec.budget import batch_prefix_sizes

    budgets = [AutoBudget(LAZY, max_nodes=64) for _ in range(2)]
    trees = [half_sure_chain(40), half_sure_chain(40)]
    n = batch_prefix_sizes(budgets, trees)[0]
    e = budgets[0].expected_accepted(trees[0])
    value = lambda k: 2 * (1 + e[k]) / (LAZY.table(81)[2 * (1 + k) - 1] + 2 * LAZY.head_seconds(e[k]))
    assert all(value(n) >= value(k) for k in range(41))


def test_take_prefix_clamps_validates_and_passes_empty_trees():
    budget = AutoBudget(STEEP, max_nodes=64, explore_every=0)
    tree = half_sure_chain(6)
    assert len(budget.take_prefix(tree, 100)) == 6
    assert len(budget.take_prefix(DraftTree.empty(), 3)) == 0 and budget.chosen == [6]
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match="n must be"):
            budget.take_prefix(tree, bad)


def test_take_prefix_counts_skips_and_explores():
    budget = AutoBudget(STEEP, max_nodes=64, explore_every=2, explore_nodes=3)
    tree = half_sure_chain(10)
    assert len(budget.take_prefix(tree, 0)) == 0  # first skip
    assert len(budget.take_prefix(tree, 0)) == 3  # second skip explores the top 3
    verified = budget.take_prefix(tree, 5)
    assert len(verified) == 5 and budget.chosen == [0, 3, 5]
    before = budget._prop.sum()
    budget.observe(verified, np.array([0, 1], dtype=np.int64))  # the cells of the 5 verified nodes learn
    assert budget._prop.sum() == pytest.approx(before * budget.decay + 5)
    assert budget.steps == 3
