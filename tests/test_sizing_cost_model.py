"""Specifies refdec.sizing.cost_model.LearntCost, the cost curve refit from the steps' measured seconds:
before any step it is the calibrated curve; each size bucket follows the median of its latest
steps with the calibration counted as a few steps of its own (a wrong prior corrects itself in a
few steps, a stray slow step does not move it); unobserved sizes take the nearest observed ratio,
and below the smallest observed size nothing costs more than that size; memory is fixed however
many steps it sees. Synthetic timings only."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from refdec.sizing.cost_curve import CostCurve
from refdec.sizing.cost_model import BUCKETS, LearntCost, non_decreasing

# A CPU-like calibrated curve (seconds at 0 / 1 / 16 / 64 nodes), a lazy head of 10 ms a chunk.
PRIOR = CostCurve((0, 1, 16, 64), (0.100, 0.200, 0.300, 0.500), head_chunk_seconds=0.010)


def at(curve: CostCurve, n: int) -> float:
    """The curve's table at ``n`` nodes (what a step is measured against: no head)."""
    return float(curve.table(n)[n])


def test_before_any_step_it_is_the_calibrated_curve():
    learnt = LearntCost(PRIOR)
    assert learnt.curve() is PRIOR and learnt.version == 0
    assert np.isnan(learnt.log_ratios()).all() and learnt.observations().sum() == 0


def test_a_curve_twice_too_slow_at_one_node_corrects_itself_within_four_steps():
    """The calibration counts as 3 steps at its own value (prior_weight=3): the median of the
    bucket's steps and those 3 follows the steps from the 4th one on, exactly."""
    learnt = LearntCost(PRIOR, prior_weight=3)
    seen = []
    for _ in range(4):
        learnt.observe(1, 0.100)  # the true cost at one node: half the calibrated 0.200
        seen.append(at(learnt.curve(), 1))
    assert seen[:2] == pytest.approx([0.200, 0.200])  # one or two steps against the calibration's three: the prior
    assert seen[2] == pytest.approx(np.sqrt(0.200 * 0.100))  # three against three: halfway (in log space)
    assert seen[3] == pytest.approx(0.100)  # four against three: the steps win
    assert learnt.curve().head_chunk_seconds == PRIOR.head_chunk_seconds  # the head's terms are the prior's


def test_a_stray_slow_step_does_not_move_a_bucket():
    learnt = LearntCost(PRIOR)
    for seconds in [0.300] * 8 + [3.0] + [0.300] * 3:  # one step 10x slow (a page fault, another process)
        learnt.observe(16, seconds)
    assert at(learnt.curve(), 16) == pytest.approx(0.300)


def test_a_size_between_buckets_is_measured_against_the_prior_at_its_own_size():
    learnt = LearntCost(PRIOR, prior_weight=0)
    learnt.observe(20, 2 * at(PRIOR, 20))  # counts in bucket 24, as a ratio of 2 to the prior at 20
    assert learnt.bucket(20) == BUCKETS.index(24)
    assert learnt.log_ratios()[BUCKETS.index(24)] == pytest.approx(np.log(2))
    assert at(learnt.curve(), 24) == pytest.approx(2 * at(PRIOR, 24))


def test_a_faster_machine_seen_at_one_size_scales_the_sizes_not_seen():
    """Steps at 16 nodes take half the calibrated time: every size, seen or not, is halved (the
    nearest observed ratio holds past the observed buckets)."""
    learnt = LearntCost(PRIOR, prior_weight=0)
    learnt.observe(16, 0.150)
    curve = learnt.curve()
    for n in (0, 1, 16, 64, 200):
        assert at(curve, n) == pytest.approx(at(PRIOR, n) / 2), n


def test_between_observed_buckets_the_ratio_is_interpolated():
    learnt = LearntCost(PRIOR, prior_weight=0)
    learnt.observe(1, at(PRIOR, 1))
    learnt.observe(64, 2 * at(PRIOR, 64))
    ratio = at(learnt.curve(), 16) / at(PRIOR, 16)
    assert 1.0 < ratio < 2.0


def test_a_warm_up_inflated_first_size_is_capped_by_the_steps_above_it():
    """The calibration measured 0 nodes first and paid a warm-up: 184 ms for one entry, 96 ms for
    two. Steps at 1..16 nodes agree with the calibration there; nothing below the smallest size seen
    costs more than it, so t(0) becomes t(1)."""
    inflated = CostCurve((0, 1, 2, 16), (0.184, 0.096, 0.100, 0.150))
    learnt = LearntCost(inflated)
    for _ in range(4):
        learnt.observe(1, 0.096)
        learnt.observe(16, 0.150)
    assert learnt.curve()(0) == pytest.approx(0.096)
    # steps at 0 nodes themselves are believed, whatever the sizes above say
    for _ in range(4):
        learnt.observe(0, 0.090)
    assert learnt.curve()(0) == pytest.approx(0.090)


def test_non_decreasing_pools_adjacent_violators_by_weight():
    assert non_decreasing(np.array([1.0, 2.0, 3.0]), np.ones(3)).tolist() == [1.0, 2.0, 3.0]
    # 4 (weight 1) above 1 (weight 3): pooled to (4 + 3) / 4; then 0.5 joins them
    assert np.allclose(non_decreasing(np.array([4.0, 1.0, 5.0]), np.array([1.0, 3.0, 1.0])), [1.75, 1.75, 5.0])
    assert np.allclose(non_decreasing(np.array([3.0, 2.0, 1.0]), np.ones(3)), [2.0, 2.0, 2.0])


def test_a_larger_tree_never_looks_cheaper_than_a_smaller_one():
    """A cached curve measured in a burst of load: plain 482 ms, one node 244 ms, 32 nodes above 64.
    The steps at one node (58 ms) and one plain step (36 ms) move their buckets; the refit curve
    rises with size, plain no longer priced above a one-node tree."""
    prior = CostCurve((0, 1, 2, 4, 8, 16, 24, 32, 48, 64),
                      (0.482, 0.244, 1.051, 1.276, 2.321, 2.589, 2.567, 7.614, 6.687, 4.708))
    learnt = LearntCost(prior)
    learnt.observe(0, 0.036)
    for _ in range(16):
        learnt.observe(1, 0.058)
    table = learnt.table(64)
    assert (np.diff(table) >= -1e-12).all()
    assert table[0] <= table[1] < 0.2


def test_the_latest_steps_count_so_load_that_goes_away_is_forgotten():
    learnt = LearntCost(PRIOR, window=8)
    for _ in range(8):
        learnt.observe(16, 0.600)  # under load: twice the calibration
    assert at(learnt.curve(), 16) == pytest.approx(0.600)
    for _ in range(8):
        learnt.observe(16, 0.300)  # quiet again
    assert at(learnt.curve(), 16) == pytest.approx(0.300)


def test_memory_is_fixed_however_many_steps_it_sees():
    learnt = LearntCost(PRIOR, window=4)
    rng = np.random.default_rng(0)
    for _ in range(20_000):
        learnt.observe(int(rng.integers(0, 2000)), float(rng.uniform(0.05, 1.0)))
    assert learnt._log_ratios.shape == (len(BUCKETS), 4)
    assert (learnt.observations() <= 4).all() and learnt.version == 20_000
    assert learnt.bucket(2000) == len(BUCKETS) - 1  # past the last bucket: the last


def test_unmeasured_steps_are_ignored_and_a_prior_must_be_a_curve():
    learnt = LearntCost(PRIOR)
    for seconds in (0.0, -1.0, float("nan"), float("inf")):
        learnt.observe(4, seconds)
    assert learnt.version == 0 and learnt.curve() is PRIOR
    with pytest.raises(ValueError, match="prior must be a refdec.sizing.cost_curve.CostCurve"):
        LearntCost([0.1, 0.2])
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        LearntCost(PRIOR, window=0)


def test_copies_share_it_it_describes_the_machine():
    learnt = LearntCost(PRIOR)
    assert copy.deepcopy(learnt) is learnt
    holder = copy.deepcopy({"cost": learnt, "other": [1]})
    assert holder["cost"] is learnt
