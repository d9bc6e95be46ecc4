"""Specifies refdec.edit_prompt: the edit prompt's fence is longer than any backtick run in the
file, so the model's closing fence (the stop string) cannot occur inside the file."""

from __future__ import annotations

import pytest


def test_edit_prompt_fence_is_longer_than_any_backtick_run_in_the_file():
    from refdec.edit_prompt import build_edit_prompt

    p = build_edit_prompt("a = '```'\nb = '````'\n", "change a")
    assert p.stop == "`````"
    assert p.text.endswith("`````\n") and "{" not in p.text
    assert p.extract("x = 1\n`````\nmore") == "x = 1\n"
    with pytest.raises(ValueError, match="instruction"):
        build_edit_prompt("x", "  ")
    with pytest.raises(ValueError, match="template"):
        build_edit_prompt("x", "y", template="no fields here")
