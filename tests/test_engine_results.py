"""Specifies refdec.engine.results, what a ``generate`` call returns: ``GenerateOutput`` (the
sequences and the stats) and ``DecodingStats``: the histogram of draft tokens accepted per pass
(the prefill counted as a pass), proposed and accepted draft tokens with the accepted ones per
draft source, the rates derived from them (tokens per pass, per second, bookkeeping time) and the
one-line summary; an engine run's stats add up."""

from __future__ import annotations

import numpy as np
import pytest

import refdec
from refdec.drafting.tree import DraftTree
from refdec.engine.results import DecodingStats, GenerateOutput
from tiny_models import lookup_factory, repetitive_prompts


def test_count_pass_keeps_the_histogram_of_accepted_draft_tokens_per_pass():
    stats = DecodingStats()
    for accepted in (0, 3, 3, 1):
        stats.count_pass(accepted)
    assert stats.forward_passes == 4 and stats.accepted_per_pass == [1, 1, 0, 2]


def test_count_draft_counts_proposed_and_accepted_tokens_per_source():
    # root ─ 0 (corpus) ─ 1 (corpus) ─ 2 (reference)
    #      └ 3 (reference)
    tree = DraftTree(np.array([5, 6, 7, 8]), np.array([-1, 0, 1, -1]), np.ones(4), np.array([0, 0, 1, 1]),
                     ("corpus", "reference"))
    stats = DecodingStats()
    stats.count_draft(tree, np.array([0, 1, 2], dtype=np.int64))
    stats.count_draft(tree, np.array([3], dtype=np.int64))
    stats.count_draft(tree, np.zeros(0, dtype=np.int64))  # nothing accepted
    assert (stats.proposed_tokens, stats.accepted_tokens) == (12, 4)
    assert stats.accepted_by_source == {"corpus": 2, "reference": 2}
    assert stats.proposed_by_source == {"corpus": 6, "reference": 6}  # every verified node, accepted or not
    unnamed = DraftTree(np.array([5]), np.array([-1]), np.ones(1), np.array([3]), ("corpus",))
    stats.count_draft(unnamed, np.array([0], dtype=np.int64))
    assert stats.accepted_by_source["3"] == 1  # a source id without a name is counted under its number


def test_rates_and_the_summary_line():
    stats = DecodingStats(new_tokens=30, forward_passes=12, wall_seconds=2.0, propose_seconds=0.25,
                          prepare_seconds=0.125, forward_seconds=1.5, accept_seconds=0.0625, prefill_seconds=0.5)
    assert stats.tokens_per_pass == 2.5 and stats.tokens_per_second == 15.0
    assert stats.bookkeeping_seconds == 0.4375  # propose + prepare + accept: outside the model's forward
    assert stats.summary() == "30 tokens, 12 passes, 2.50 tokens/pass, 15.0 tokens/s"
    empty = DecodingStats()
    assert empty.tokens_per_pass == 0.0 and empty.tokens_per_second == 0.0
    assert empty.summary() == "0 tokens, 0 passes, 0.00 tokens/pass, 0.0 tokens/s"


@pytest.mark.parametrize("batched", [False, True])
def test_an_engine_runs_stats_add_up(llama, batched):
    prompts = repetitive_prompts(2, seed=21)
    out = refdec.generate(llama, prompts if batched else prompts[0], max_new_tokens=30, eos_token_id=[],
                          max_draft_tokens=8, proposer_factory=lookup_factory())
    assert isinstance(out, GenerateOutput) and isinstance(out.stats, DecodingStats)
    rows = out.stats.rows if batched else [out.stats]
    assert len(rows) == (2 if batched else 1)
    for stats in rows:
        assert stats.new_tokens == 30 and stats.stop_reason == "max_new_tokens"
        assert sum(stats.accepted_per_pass) == stats.forward_passes
        assert sum(k * n for k, n in enumerate(stats.accepted_per_pass)) == stats.accepted_tokens > 0
        assert sum(stats.accepted_by_source.values()) == stats.accepted_tokens <= stats.proposed_tokens
        assert sum(stats.proposed_by_source.values()) == stats.proposed_tokens
        assert all(stats.accepted_by_source[name] <= stats.proposed_by_source[name] for name in stats.accepted_by_source)
        # a pass gives its accepted draft tokens and one more (the last pass may be cut at max_new_tokens)
        assert stats.forward_passes + stats.accepted_tokens >= stats.new_tokens
