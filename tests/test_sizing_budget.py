"""Specifies refdec.sizing.budget, the draft-size policies: ``FixedBudget`` verifies what it asked for;
``AutoBudget`` ("auto") verifies the prefix of the drafted tree that maximises expected tokens per
second under the model's cost curve, learns each node cell's acceptance from what was verified,
and prices a batch's rows together (``batch_prefix_sizes``); from the steps' measured time it refits
its cost curve (refdec.sizing.cost_model.LearntCost) and stops drafting for a request where drafting does
not pay, probing on a fixed schedule to come back (``PlainGuard``)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from refdec.sizing.acceptance import AcceptanceTable
from refdec.sizing.budget import (AutoBudget, FixedBudget, PlainGuard, StepTime, batch_prefix_sizes, make_budget,
                           packed_prefix_sizes, path_products, step_scores)
from refdec.drafting.tree import MAX_NODES, DraftTree
from refdec.sizing.cost_curve import CostCurve, flat_curve
from refdec.sizing.cost_model import LearntCost

# A steep CPU-like curve: every node adds 10% of a one-token forward.
STEEP = CostCurve((0, 64), (1.0, 7.4))
# Verification cost (relative) measured on a 2-core CPU, Gemma 3 270M.
CPU = CostCurve((0, 1, 16, 64), (0.100, 0.105, 0.280, 0.500))
# The lazy-head form of a CPU curve: backbone seconds per tree size + one head chunk of 4 rows.
LAZY = CostCurve((0, 4, 16, 64), (0.030, 0.041, 0.057, 0.119), head_chunk_seconds=0.018)


# A linear curve, 1 + 0.3 n seconds for n nodes, without and with a lazy head (1 s a chunk of 4 rows).
LINEAR = CostCurve((0, 10), (1.0, 4.0))
LINEAR_LAZY = CostCurve((0, 10), (1.0, 4.0), head_chunk_seconds=1.0)


def sure_chain(n, score=0.97):
    """A chain of n nodes whose scores say "certainly accepted"."""
    tree = DraftTree.chain(np.arange(10, 10 + n))
    return DraftTree(tree.token_ids, tree.parents, np.full(n, score, np.float32))


def unsure_bush(n, score=0.01):
    """n children of the root, each unlikely."""
    return DraftTree(np.arange(10, 10 + n), np.full(n, -1), np.full(n, score, np.float32))


def half_sure_chain(n):
    """A chain whose scores fall with depth: worth a few nodes on a steep curve, not all."""
    tree = DraftTree.chain(np.arange(10, 10 + n))
    return DraftTree(tree.token_ids, tree.parents, (0.9 ** np.arange(1, n + 1)).astype(np.float32))


class KnownAcceptance:
    """An AutoBudget stand-in for batch_prefix_sizes: its cost curve and, for its row's tree, the
    expected accepted lengths E(0..len(tree)) given as literals."""

    def __init__(self, cost: CostCurve, expected: list[float]) -> None:
        self.cost = cost
        self.expected = np.asarray(expected, dtype=np.float64)

    def expected_accepted(self, tree: DraftTree, cells=None) -> np.ndarray:
        assert len(self.expected) == len(tree) + 1
        return self.expected


def test_flat_curve_verifies_the_whole_tree():
    budget = AutoBudget(flat_curve(), max_nodes=64)
    assert budget.max_nodes == 64  # asked of the drafter every step
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
    assert cut.depths.tolist() == [1, 2, 1]  # the tree's, carried along


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


def test_a_chain_accepted_whole_teaches_its_deep_steps():
    """Cells learn step rates: a chain of sure steps accepted whole at its first prefix tells the
    budget that the steps past it are sure too, so the next prefix is the whole chain."""
    budget = AutoBudget(STEEP, explore_every=0)
    verified = budget.select(sure_chain(64))
    assert 4 <= len(verified) < 32
    budget.observe(verified, np.arange(len(verified), dtype=np.int64))
    assert len(budget.select(sure_chain(64))) == 64


def stepped_chain(steps):
    """A chain whose node scores are the products of ``steps`` (each node's step score)."""
    tree = DraftTree.chain(np.arange(10, 10 + len(steps)))
    return DraftTree(tree.token_ids, tree.parents, np.cumprod(steps).astype(np.float32))


def test_prefixes_accepted_whole_explore_twice_as_many_nodes_and_learn_that_they_pay():
    """Nodes whose steps score lower than the shallow ones' sit in cells of their own, whose
    prior prices them out on a steep curve: a chain accepted whole at 16 nodes would stay at 16.
    Every ``explore_every``-th prefix accepted whole doubles the next one (at most the tree),
    whose acceptance teaches those cells."""
    steps = np.r_[np.full(16, 0.97), np.full(48, 0.5)]
    budget = AutoBudget(STEEP, explore_every=4)
    sizes = []
    for _ in range(16):
        verified = budget.select(stepped_chain(steps))
        sizes.append(len(verified))
        budget.observe(verified, np.arange(len(verified), dtype=np.int64))
    # doubled after the 4th; the next prefixes, priced by what the deep cells learnt, grow to 64
    assert sizes[:5] == [16] * 4 + [32] and 16 < sizes[5] < 32 and sizes[-4:] == [64] * 4, sizes
    # a prefix not accepted whole does not count; the doubled prefix stops at the tree's size
    budget = AutoBudget(STEEP, explore_every=1)
    verified = budget.select(stepped_chain(steps))
    budget.observe(verified, np.arange(len(verified) - 1, dtype=np.int64))
    assert len(verified) == 16 and len(budget.select(stepped_chain(steps))) <= 16  # not doubled
    budget = AutoBudget(STEEP, explore_every=1)
    verified = budget.select(stepped_chain(steps[:20]))
    budget.observe(verified, np.arange(len(verified), dtype=np.int64))
    assert len(verified) == 16 and len(budget.select(stepped_chain(steps[:20]))) == 20


def test_step_scores_and_path_products():
    # root -> a (0.8) -> b (0.4), root -> c (0.5), a -> d (0.9: above its parent, clipped to 1)
    tree = DraftTree([1, 2, 3, 4], [-1, 0, -1, 0], [0.8, 0.4, 0.5, 0.9])
    assert np.allclose(step_scores(tree), [0.8, 0.5, 0.5, 1.0])
    assert np.allclose(path_products(np.array([0.5, 0.5, 0.9, 0.2]), tree.parents), [0.5, 0.25, 0.9, 0.1])
    zero_parent = DraftTree([1, 2], [-1, 0], [0.0, 0.0])
    assert step_scores(zero_parent).tolist() == [0.0, 0.0]


def test_only_nodes_the_walk_reached_teach_their_cells():
    """A node whose parent was rejected was never compared with the model's token: it counts in no
    cell. root -> a -> b, root -> c; flat curve, so all three are verified."""
    tree = DraftTree([1, 2, 3], [-1, 0, -1], [0.9, 0.8, 0.3])
    for accepted, reached in (([], [0, 2]), ([0], [0, 1, 2]), ([2], [0, 2]), ([0, 1], [0, 1, 2])):
        budget = AutoBudget(flat_curve(), explore_every=0)
        cells = budget.cells(tree)
        verified = budget.select(tree)
        assert len(verified) == 3
        budget.observe(verified, np.array(accepted, dtype=np.int64))
        table = budget.acceptance
        assert np.allclose(table.verified, np.bincount(cells[reached], minlength=len(table.verified)))
        assert np.allclose(table.accepted, np.bincount(cells[accepted], minlength=len(table.accepted)))


def test_empty_tree_stays_empty():
    assert len(AutoBudget(CPU).select(DraftTree.empty())) == 0


def test_make_budget():
    assert isinstance(make_budget(16), FixedBudget)
    assert isinstance(make_budget("auto"), AutoBudget)
    custom = AutoBudget(flat_curve())
    assert make_budget(custom) is custom
    with pytest.raises(ValueError):
        make_budget("big")


def test_best_prefix_of_a_hand_computed_case():
    """E = 0, .6, .9, 1.1 (nodes accepted with .6, .3, .2). Value (1 + E(n)) / cost(n):

        n               0      1      2      3
        1 + E(n)        1.0    1.6    1.9    2.1
        LINEAR          1.0    1.3    1.6    1.9     value 1.000  1.231* 1.188  1.105
        LINEAR_LAZY     2.0    2.3    2.6    2.9     value 0.500  0.696  0.731* 0.724

    A lazy head costs one chunk (1 s) whatever n (E + 2.5 <= 4 rows): a fixed cost that makes a
    deeper prefix pay."""
    expected = np.array([0.0, 0.6, 0.9, 1.1])
    assert AutoBudget(LINEAR, max_nodes=64).best_prefix(expected) == 1
    assert AutoBudget(LINEAR_LAZY, max_nodes=64).best_prefix(expected) == 2
    assert AutoBudget(LINEAR, max_nodes=2).best_prefix(np.array([0.0, 0.6, 1.5, 2.4])) == 2  # capped at max_nodes


def test_auto_budget_with_a_lazy_head_verifies_larger_trees_for_the_same_acceptance():
    """A lazy head makes unaccepted nodes cheap (only the backbone pays for them), so the
    budget keeps more of a tree than under a curve where every node pays its head row."""
    lazy = CostCurve((0, 16, 64), (0.030, 0.055, 0.120), None, 0.016, 4)
    # the same model with the head on every row (4 ms a row)
    full = CostCurve((0, 16, 64), (0.046, 0.055 + 0.004 * 17, 0.120 + 0.004 * 65))
    # every first-depth node scores 0.6 (its cell's prior acceptance), decaying with depth
    tree = DraftTree(np.arange(3, 67), np.arange(-1, 63), np.full(64, 0.6, np.float32))
    sizes = [len(AutoBudget(curve, acceptance=AcceptanceTable(prior_weight=1e9)).select(tree)) for curve in (lazy, full)]
    assert sizes[0] > sizes[1] > 0, sizes


def test_batch_prefix_of_one_row_is_the_single_row_choice():
    for curve in (STEEP, CPU, flat_curve(), LAZY):
        for tree in (sure_chain(64), unsure_bush(20), half_sure_chain(40)):
            budget = AutoBudget(curve, max_nodes=64)
            assert batch_prefix_sizes([budget], [tree]) == [budget.best_prefix(budget.expected_accepted(tree))]


def test_batch_prefix_prices_the_padded_batch_forward():
    """Eight rows pay for 8 * (1 + n) rows: they verify fewer nodes than one row would, all the same
    number (clipped to each row's own tree), and on a flat curve everything."""
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


def test_batch_prefix_of_a_hand_computed_case_prices_the_rows_backbone_together_and_each_rows_head():
    """Two rows, each a chain with E = 0, .6, .9, 1.1, on LINEAR_LAZY: the backbone runs
    2 * (1 + n) rows (2n + 1 nodes: 1 + 0.3 (2n + 1) s) and each row's walk one head chunk (1 s):

        n                          0      1      2      3
        sum_b (1 + E_b(n))         2.0    3.2    3.8    4.2
        backbone + 2 heads         3.3    3.9    4.5    5.1     value 0.606  0.821  0.844* 0.824

    Priced as one row (backbone 1 + 0.3 n) it would take 3; with one head for the batch, or none, 1.

    A row whose tree is shorter holds its E flat past its end (it verifies its whole tree): rows
    E = 0, .6, 1.5, 1.7 and E = 0, .8 (one node; 1.7 + 2.5 rows make 1.05 head chunks):

        n                          0      1      2      3
        sum_b (1 + E_b(n))         2.0    3.4    4.3    4.5
        backbone + heads           3.3    3.9    4.5    5.15    value 0.606  0.872  0.956* 0.874

    so the rows take 2 and 1 nodes (with the short row's E taken as 0 past its end, n = 1)."""
    chain = sure_chain(3)
    rows = [KnownAcceptance(LINEAR_LAZY, [0.0, 0.6, 0.9, 1.1]) for _ in range(2)]
    assert batch_prefix_sizes(rows, [chain, chain]) == [2, 2]
    long, short = KnownAcceptance(LINEAR_LAZY, [0.0, 0.6, 1.5, 1.7]), KnownAcceptance(LINEAR_LAZY, [0.0, 0.8])
    assert batch_prefix_sizes([long, short], [chain, sure_chain(1)]) == [2, 1]
    assert batch_prefix_sizes([], []) == []


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
    before = np.diff(budget.expected_accepted(tree))  # each node's estimated acceptance
    budget.observe(verified, np.array([0, 1], dtype=np.int64))  # the cells of the 5 verified nodes learn
    after = np.diff(budget.expected_accepted(tree))
    assert (after[:2] > before[:2]).all()  # nodes 0, 1 accepted: their cells' rates rise
    assert (after[2:5] < before[2:5]).all()  # nodes 2-4 verified and rejected: theirs fall
    assert budget.steps == 3
    budget.observe(verified, np.array([0], dtype=np.int64))  # observed once: a second call changes nothing
    assert np.array_equal(np.diff(budget.expected_accepted(tree)), after)


def test_the_diagnostic_of_chosen_sizes_is_bounded(monkeypatch):
    import refdec.sizing.budget

    monkeypatch.setattr(refdec.sizing.budget, "CHOSEN_KEPT", 3)
    budget = AutoBudget(flat_curve(), max_nodes=4)
    for n in range(10):
        budget.select(sure_chain(1 + n % 4))
    assert 3 <= len(budget.chosen) <= 6 and budget.chosen[-1] == 2  # the latest kept, the oldest gone


# ---------------------------------------------------------------------------------------------
# The steps' measured time (observe_step): the curve refit from it, drafting stopped where it does
# not pay (PlainGuard). Synthetic StepTimes only.


def one_row_step(budget, tree, accepted, seconds, propose=0.0):
    """The engine's report of one single-row step that verified ``tree`` (its first ``accepted``
    nodes accepted) and took ``seconds`` to verify, ``propose`` to draft."""
    nodes = np.arange(accepted, dtype=np.int64)
    AutoBudget.observe_step([budget], [tree], [nodes], StepTime(1, len(tree), propose, seconds))


def test_a_steep_curve_measured_flat_verifies_whole_trees_after_a_few_steps():
    """The calibration says 64 nodes cost 7.4 one-node steps; the steps take 1 s whatever their
    size (a GPU, or a curve measured under load): the refit curve is flat, unlikely nodes are
    verified too. With learn=False the calibrated curve stays."""
    budget = AutoBudget(STEEP, explore_every=0, guard=False)
    fixed = AutoBudget(STEEP, explore_every=0, guard=False, learn=False)
    assert len(budget.select(unsure_bush(64))) == 0
    for n in (0, 1, 2, 4, 8, 16, 24, 32, 48, 64):
        for _ in range(4):  # the calibration counts as 3 steps in each bucket
            one_row_step(budget, unsure_bush(n), 0, 1.0)
            one_row_step(fixed, unsure_bush(n), 0, 1.0)
    assert budget.cost.table(64) == pytest.approx(np.ones(65))
    assert len(budget.select(unsure_bush(64))) == 64
    assert fixed.cost is STEEP and fixed.learnt is None and len(fixed.select(unsure_bush(64))) == 0


def test_the_step_is_measured_without_the_lm_head_as_the_curve_prices_it():
    """A lazy-head curve: the learnt table gets the verify seconds less the head chunks of the walk
    that accepted what the row accepted (k = 6: (6 + 2.5) / 4 chunks of 0.018 s)."""
    budget = AutoBudget(LAZY, guard=False)
    one_row_step(budget, sure_chain(16), 6, 0.5)
    learnt = budget.learnt
    j = learnt.bucket(16)
    assert np.exp(learnt._log_ratios[j, 0]) * LAZY.table(16)[16] == pytest.approx(0.5 - 0.018 * 8.5 / 4)


def test_copies_of_a_budget_share_one_learnt_cost_fed_once_per_step():
    shared = LearntCost(CPU)
    rows = [AutoBudget(shared), AutoBudget(shared)]
    rows.append(copy.deepcopy(rows[0]))
    assert all(row.learnt is shared for row in rows)
    AutoBudget.observe_step(rows, [sure_chain(4)] * 3, [np.zeros(0, np.int64)] * 3, StepTime(3, 14, 0.0, 0.3))
    assert shared.version == 1 and shared.observations()[shared.bucket(14)] == 1
    with pytest.raises(ValueError, match="learn=False takes a CostCurve"):
        AutoBudget(shared, learn=False)
    with pytest.raises(ValueError, match="cost must be"):
        AutoBudget("fast")


def test_the_guard_stops_drafting_that_does_not_pay_and_probes_to_come_back():
    """Plain steps take 0.1 s (the curve's t(0)); drafted steps take 0.25 s and emit 2 tokens: 8
    tokens/s against plain's 10. After its window of 4 drafted steps the guard stops drafting; after
    `probe_every` = 3 plain steps, 2 steps probe; they do not pay, so the wait doubles (6, then 12,
    at most). When drafted steps emit 4 tokens (16 tokens/s) the next probe pays: drafting resumes."""
    guard = PlainGuard(window=4, probe_every=3, probe_steps=2, max_probe_every=12)
    budget = AutoBudget(flat_curve(0.1), max_nodes=16, guard=guard, learn=False)
    tree = sure_chain(16)
    drafted = []
    for step in range(48):
        tokens = 2 if step < 36 else 4
        drafted.append(budget.max_nodes > 0)
        verified = tree if budget.max_nodes else DraftTree.empty()
        one_row_step(budget, verified, tokens - 1 if len(verified) else 0, 0.25 if len(verified) else 0.1)
    marks = "".join("d" if d else "." for d in drafted)
    assert marks == ("dddd" + "..." + "dd" + "......" + "dd" + "............" + "dd" + "............"
                     + "dd" + "ddd")
    assert guard.pauses == 1 and not guard.paused and budget.max_nodes == 16
    # a new request starts drafting, whatever the last one learnt
    for _ in range(4):
        one_row_step(budget, tree, 0, 0.25)
    assert budget.max_nodes == 0
    budget.new_request()
    assert budget.max_nodes == 16


def test_the_guard_compares_a_batch_rows_tokens_with_a_plain_step_of_the_whole_batch():
    """Two rows share each 0.3 s step; a plain step of both would cost t(1 node) = 0.2 s on this
    curve. The row that emits 2 tokens a step (6.7 tokens/s against plain's 5) keeps drafting;
    the row that emits 1 (3.3) stops."""
    curve = CostCurve((0, 1, 64), (0.1, 0.2, 1.0))
    rows = [AutoBudget(curve, guard=PlainGuard(window=4), learn=False) for _ in range(2)]
    for _ in range(4):
        AutoBudget.observe_step(rows, [sure_chain(4)] * 2, [np.zeros(1, np.int64), np.zeros(0, np.int64)],
                                StepTime(2, 9, 0.05, 0.25))
    assert [row.max_nodes for row in rows] == [MAX_NODES, 0]


def test_unmeasured_steps_never_stop_drafting_and_the_guard_is_bounded():
    guard = PlainGuard(window=8)
    for _ in range(10_000):
        guard.step(1, 0.0, 0.1)  # a clock that did not move
    assert guard.drafting and len(guard._steps) == 0
    for _ in range(10_000):
        guard.step(100, 0.1, 0.1)  # drafting pays
    assert guard.drafting and len(guard._steps) == 8
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        PlainGuard(window=0)
    with pytest.raises(ValueError, match="max_probe_every must be an int >= 16"):
        PlainGuard(probe_every=16, max_probe_every=8)
    with pytest.raises(ValueError, match="guard must be"):
        AutoBudget(CPU, guard="off")
    assert AutoBudget(CPU, guard=None).guard is None and AutoBudget(CPU, guard=False).max_nodes == MAX_NODES


def test_fixed_budgets_ignore_the_steps_time():
    budget = FixedBudget(8)
    FixedBudget.observe_step([budget], [sure_chain(8)], [np.zeros(0, np.int64)], StepTime(1, 8, 1.0, 1.0))
    assert budget.max_nodes == 8


class KnownProbabilities(KnownAcceptance):
    """A stand-in for packed_prefix_sizes: each node's acceptance probability given as literals."""

    def node_probabilities_of(self, tree: DraftTree, cells=None) -> np.ndarray:
        assert len(self.expected) == len(tree)
        return self.expected


def test_packed_rows_each_take_their_own_size():
    """On LINEAR (t = 1 + 0.3 (entries - 1)) a sure row (p .9 .9 .9) and an unlikely one (.1 .1 .1):
    packed, each entry is paid once: adding the sure row's nodes gives 2/1.3, 2.9/1.6, 3.8/1.9,
    4.7/2.2 = 2.14*, then the unlikely row's first 4.8/2.5: [3, 0]. Padded to one size the
    unlikely row's nodes come with the sure row's (n = 3: 5.0/3.1 = 1.61 beats n = 0..2): [3, 3]."""
    chain = sure_chain(3)
    rows = [KnownProbabilities(LINEAR, [0.9, 0.9, 0.9]), KnownProbabilities(LINEAR, [0.1, 0.1, 0.1])]
    assert packed_prefix_sizes(rows, [chain, chain]) == [3, 0]
    padded = [KnownAcceptance(LINEAR, [0.0, 0.9, 1.8, 2.7]), KnownAcceptance(LINEAR, [0.0, 0.1, 0.2, 0.3])]
    assert batch_prefix_sizes(padded, [chain, chain]) == [3, 3]
    assert packed_prefix_sizes([KnownProbabilities(LINEAR, [])], [DraftTree.empty()]) == [0]
    assert packed_prefix_sizes([], []) == []
    with pytest.raises(ValueError, match="differ in length"):
        packed_prefix_sizes(rows, [chain])
