"""Specifies refdec.cost_curve.CostCurve: seconds per verification forward against draft-tree
size, linearly interpolated and extrapolated, with a lazy head's chunk cost; round-trips through
JSON and refuses malformed points."""

from __future__ import annotations

import json

import pytest

from refdec.cost_curve import CostCurve


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
