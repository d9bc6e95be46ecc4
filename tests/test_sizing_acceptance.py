"""Specifies refdec.sizing.acceptance: a draft node's cell (source, score bucket, depth bucket) and the
table of acceptance rates learnt per cell, shrunk towards a prior that deep cells inherit from
shallow ones."""

from __future__ import annotations

import numpy as np
import pytest

from refdec.sizing.acceptance import AcceptanceTable


def test_cells_bucket_score_depth_and_source():
    table = AcceptanceTable(3)
    scores = np.array([0.01, 0.02, 0.5, 0.99], np.float32)
    depths = np.array([1, 2, 3, 4], np.int32)               # a chain
    sources = np.array([0, 1, 2, 7], np.int32)              # 7 is clipped to the last source
    # cell = (source * 10 + score bucket) * 7 + depth bucket; score buckets' upper edges
    # 0.02, 0.05, ... (0.02 is in bucket 1), depth buckets start at depths 2, 3, 5, 9, 17, 33
    assert table.cells(scores, depths, sources).tolist() == [
        (0 * 10 + 0) * 7 + 0, (1 * 10 + 1) * 7 + 1, (2 * 10 + 6) * 7 + 2, (2 * 10 + 9) * 7 + 2]
    deep = np.array([8, 9, 16, 17, 32, 33, 500], np.int32)
    assert (table.cells(np.full(7, 0.01, np.float32), deep, np.zeros(7, np.int32)) % 7).tolist() == [
        3, 4, 4, 5, 5, 6, 6]


def test_rates_start_at_the_prior_and_follow_the_counts():
    table = AcceptanceTable(1, prior_weight=3.0, prior_depth_decay=0.5, decay=1.0)
    rates = table.rates.reshape(table.shape)
    # depth bucket 0: the score bucket's centre; deeper: the shallower bucket's rate times
    # 0.5 ** (gap between depth centres 1, 2, 3.5, ...)
    assert rates[0, 5, 0] == pytest.approx(0.42)
    assert rates[0, 5, 1] == pytest.approx(0.42 * 0.5)
    assert rates[0, 5, 2] == pytest.approx(0.42 * 0.5 * 0.5 ** 1.5)
    cell = (0 * 10 + 5) * 7 + 0
    table.observe(np.array([cell] * 5), np.array([cell] * 5))       # 5 verified, 5 accepted
    assert table.rates[cell] == pytest.approx((5 + 3 * 0.42) / (5 + 3))
    # the deeper bucket of the same score learns from it (its prior moved)
    assert table.rates[cell + 1] == pytest.approx((5 + 3 * 0.42) / 8 * 0.5)
    table.observe(np.array([cell] * 4), np.zeros(0, np.int64))      # 4 more verified, none accepted
    assert table.rates[cell] == pytest.approx((5 + 3 * 0.42) / (9 + 3))


def test_counts_decay_per_draft():
    table = AcceptanceTable(1, decay=0.5)
    table.observe(np.array([0, 0]), np.array([0]))
    table.observe(np.array([1]), np.zeros(0, np.int64), num_drafts=2)   # old counts * 0.25
    assert table.verified[0] == pytest.approx(0.5) and table.accepted[0] == pytest.approx(0.25)
    assert table.verified[1] == pytest.approx(1.0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(n_sources=0), "n_sources must be an int >= 1, got 0"),
    (dict(decay=0.0), "decay must be in (0, 1], got 0.0"),
    (dict(prior_weight=0.0), "prior_weight must be > 0, got 0.0"),
])
def test_bad_arguments_name_themselves(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        AcceptanceTable(**{"n_sources": 3, **kwargs})
