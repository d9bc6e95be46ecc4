"""Specifies refdec.sizing.cost_curve.CostCurve: seconds per verification forward against draft-tree
size, linearly interpolated and extrapolated, with a lazy head's chunk cost; round-trips through
JSON and refuses malformed points; the calibrations' shared plan (a warm-up round, then rounds in
alternating order, the median of each size) and the check that refuses to cache a curve whose
rounds disagree."""

from __future__ import annotations

import json

import pytest

from refdec.sizing.cost_curve import CostCurve, calibration_order, median_seconds, repeats_disagree


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


def test_a_calibration_warms_up_then_alternates_the_order_of_its_rounds():
    assert calibration_order((8, 0, 2), repeats=3, warmup=1) == [
        (0, 0), (0, 2), (0, 8), (1, 8), (1, 2), (1, 0), (2, 0), (2, 2), (2, 8), (3, 8), (3, 2), (3, 0)]
    assert calibration_order((4,), repeats=1, warmup=0) == [(0, 4)]
    with pytest.raises(ValueError, match="repeats must be an int >= 1"):
        calibration_order((0,), repeats=0)


def test_repeats_disagree_when_more_than_a_quarter_of_the_sizes_spread_beyond_the_tolerance():
    quiet = {0: [0.100, 0.104, 0.098], 1: [0.110, 0.112, 0.111], 2: [0.120, 0.119, 0.125], 4: [0.130, 0.131, 0.129]}
    assert median_seconds(quiet) == pytest.approx((0.100, 0.111, 0.120, 0.130))
    assert repeats_disagree(quiet) is None
    one_spike = {**quiet, 1: [0.110, 0.300, 0.111]}  # one size of four: noise, the median absorbs it
    assert repeats_disagree(one_spike) is None
    busy = {**one_spike, 0: [0.195, 0.100, 0.101]}  # two of four: load during the calibration
    reason = repeats_disagree(busy)
    assert reason == ("the repeats of 2 of 4 sizes differ by more than 25% "
                      "(0 nodes 195.0 / 100.0 / 101.0 ms; 1 nodes 110.0 / 300.0 / 111.0 ms)")
    # a millisecond of slack: sub-millisecond steps jitter by more than 25% without load
    assert repeats_disagree({0: [0.0002, 0.0009], 1: [0.0003, 0.0010]}) is None
    assert repeats_disagree({n: [0.1] for n in range(4)}) is None  # one round: nothing to compare
