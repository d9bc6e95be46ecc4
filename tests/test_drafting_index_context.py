"""Specifies refdec.drafting.index.context: the live context index of one request, one document
that grows token by token, its counts and its current match kept up to date."""

from __future__ import annotations

from refdec import ContextIndex
from refdec.drafting.index.queries import AutomatonQueries


def test_the_context_index_answers_the_shared_queries():
    ctx = ContextIndex([1, 2, 1, 3])
    assert isinstance(ctx, AutomatonQueries)
    assert (ctx.match_length([9, 1]), ctx.count([1]), ctx.next_tokens([1], 5)) == (1, 2, [(2, 1), (3, 1)])


def test_context_match_is_the_longest_suffix_that_occurred_earlier_with_a_continuation():
    ctx = ContextIndex([1, 2, 3, 1, 2])
    assert ctx.current_match_length == 2
    state, length = ctx.match_state()
    assert length == 2 and state > 0
    ctx.extend([3])
    assert ctx.current_match_length == 3
    ctx.extend(9)
    assert ctx.current_match_length == 0
    assert len(ctx) == 7
    assert ctx.tokens().tolist() == [1, 2, 3, 1, 2, 3, 9]


def test_context_counts_stay_current_while_growing():
    ctx = ContextIndex()
    stream = [1, 2, 1, 2, 3, 1, 2, 1]
    for i, token in enumerate(stream):
        ctx.extend([token])
        seen = stream[: i + 1]
        assert ctx.count([1]) == seen.count(1)
        assert ctx.count([1, 2]) == sum(seen[j : j + 2] == [1, 2] for j in range(len(seen)))


def test_context_counts_after_a_suffix_link_chain_longer_than_the_incremental_walk():
    # "7 7 7 ..." makes a suffix-link chain as long as the run, past the
    # incremental-count walk limit: counts fall back to one recomputation.
    ctx = ContextIndex([7] * 100)
    ctx.count([7])
    ctx.extend([7] * 100)
    assert ctx.count([7]) == 200
    assert ctx.count([7] * 150) == 51
    assert ctx.current_match_length == 199


def test_context_continuation_reads_up_to_the_current_end():
    ctx = ContextIndex([4, 5, 6, 7, 4, 5])
    assert ctx.continuation([4, 5], 10).tolist() == [6, 7, 4, 5]
    assert ctx.next_tokens([5], 3) == [(6, 1)]
