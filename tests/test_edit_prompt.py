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


def test_a_chat_reply_gives_its_first_closed_code_block():
    from refdec.edit_prompt import ChatEditPrompt

    prompt = ChatEditPrompt(text="...")
    assert prompt.stop is None
    assert prompt.extract("Here it is:\n```python\nx = 1\n```\nDone.") == "x = 1\n"
    assert prompt.extract("````\na ``` b\n````") == "a ``` b\n"
    assert prompt.extract("```python\nx = 1\n") is None  # cut before the closing fence
    assert prompt.extract("no block at all") is None


def test_a_chat_edit_prompt_needs_a_chat_template():
    from refdec.edit_prompt import build_chat_edit_prompt

    class NoTemplate:
        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            raise ValueError("no chat template")

    class Echo:
        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            return "<user>" + messages[0]["content"] + "<assistant>"

    with pytest.raises(ValueError, match="--prompt-template chat: the model has no chat template"):
        build_chat_edit_prompt("x = 1\n", "rename x", NoTemplate())
    text = build_chat_edit_prompt("x = 1", "rename x", Echo()).text
    assert text == "<user>```\nx = 1\n```\n\nrename x\n\nReply with the whole updated file in one code block.<assistant>"
