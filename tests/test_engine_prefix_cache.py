"""Specifies refdec.engine.prefix_cache: the longest shared prefix, what an added entry frees,
least-recently-used eviction, whole-entry reuse (a hybrid model's)."""

from __future__ import annotations

import numpy as np
import pytest

from refdec.engine.prefix_cache import PrefixCache, common_prefix


def _a(*tokens):
    return np.array(tokens, dtype=np.int64)


def test_common_prefix_counts_the_tokens_both_begin_with():
    assert common_prefix(_a(1, 2, 3), _a(1, 2, 4, 5)) == 2
    assert common_prefix(_a(1, 2), _a(1, 2, 3)) == 2
    assert common_prefix(_a(7), _a(1)) == 0
    assert common_prefix(_a(), _a(1)) == 0


def test_longest_finds_the_entry_sharing_most_and_marks_it_used():
    cache = PrefixCache(3)
    assert cache.add("a", _a(1, 2, 3, 4)) == []
    assert cache.add("b", _a(1, 2, 9)) == []
    assert cache.add("c", _a(5, 6)) == []
    entry, n = cache.longest(_a(1, 2, 3, 8))
    assert (entry.handle, n) == ("a", 3)
    assert cache.longest(_a(9, 9)) == (None, 0)
    # "a" was used last: "b" is now the oldest
    assert cache.pop_oldest() == "b"


def test_an_entry_that_adds_nothing_is_freed_and_one_it_extends_goes():
    cache = PrefixCache(4)
    cache.add("long", _a(1, 2, 3, 4))
    assert cache.add("short", _a(1, 2, 3)) == ["short"]  # all of it is held already
    assert cache.add("longer", _a(1, 2, 3, 4, 5)) == ["long"]  # it extends "long"
    assert cache.handles() == ["longer"]


def test_a_whole_cache_reuses_an_entry_only_by_a_prompt_that_begins_with_all_of_it():
    """A hybrid model's entry holds a recurrent state after its last token: no shorter prefix of it."""
    cache = PrefixCache(4, whole=True)
    cache.add("long", _a(1, 2, 3, 4))
    assert cache.longest(_a(1, 2, 3, 9)) == (None, 0)  # shares 3 of its 4 tokens: not reusable
    entry, n = cache.longest(_a(1, 2, 3, 4, 5))
    assert (entry.handle, n) == ("long", 4)
    assert cache.add("short", _a(1, 2)) == []  # held by "long", but only a prefix of it: kept
    entry, n = cache.longest(_a(1, 2, 7))
    assert (entry.handle, n) == ("short", 2)
    assert cache.add("same", _a(1, 2, 3, 4)) == ["same"]  # all of "long": nothing new
    assert sorted(cache.add("longer", _a(1, 2, 3, 4, 5))) == ["long", "short"]  # it extends both
    assert PrefixCache(2).whole is False


def test_the_oldest_entries_go_beyond_max_entries_and_zero_keeps_nothing():
    cache = PrefixCache(2)
    cache.add("a", _a(1))
    cache.add("b", _a(2))
    assert cache.add("c", _a(3)) == ["a"]
    assert sorted(cache.handles()) == ["b", "c"]
    assert cache.add("empty", _a()) == ["empty"]
    assert sorted(cache.clear()) == ["b", "c"] and len(cache) == 0 and cache.pop_oldest() is None
    none = PrefixCache(0)
    assert none.add("x", _a(1, 2)) == ["x"] and len(none) == 0


def test_max_size_bounds_what_the_entries_hold_together():
    cache = PrefixCache(8, max_size=10)
    assert cache.add("a", _a(1), size=4) == []
    assert cache.add("b", _a(2), size=4) == []
    assert cache.add("c", _a(3), size=4) == ["a"]  # 12 > 10: the oldest goes
    assert cache.size == 8
    assert cache.add("huge", _a(4), size=11) == ["huge"]  # never fits
    assert sorted(cache.handles()) == ["b", "c"]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_max_entries_and_max_size_are_checked(bad):
    with pytest.raises(ValueError, match="max_entries"):
        PrefixCache(bad)
    with pytest.raises(ValueError, match="max_size"):
        PrefixCache(1, max_size=bad)
