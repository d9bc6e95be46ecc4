"""Specifies refdec.edit_prompt: the edit prompt's fence is longer than any backtick run in the
file, so the model's closing fence (the stop string) cannot occur inside the file."""

from __future__ import annotations

import pytest


def test_edit_prompt_fence_is_longer_than_any_backtick_run_in_the_file():
    from refdec.edit_prompt import build_edit_prompt

    p = build_edit_prompt("a = '```'\nb = '````'\n", "change a")
    assert p.stop == "`````"
    assert p.text.endswith("`````\n") and "{" not in p.text
    assert p.extract("x = 1\n`````\nmore") == "x = 1\n" and p.complete("x = 1\n`````\nmore")
    assert p.extract("x = 1\n") == "x = 1\n" and not p.complete("x = 1\n")  # cut before the closing fence
    with pytest.raises(ValueError, match="instruction"):
        build_edit_prompt("x", "  ")
    with pytest.raises(ValueError, match="template"):
        build_edit_prompt("x", "y", template="no fields here")


def test_a_chat_edit_prompt_needs_a_chat_template_and_begins_the_reply_with_the_fence():
    from refdec.edit_prompt import EDITOR_SYSTEM_MESSAGE, build_chat_edit_prompt

    class NoTemplate:
        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            raise ValueError("no chat template")

    class Echo:
        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    class NoSystemRole(Echo):  # as Gemma's template: a system message raises a template error
        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            if messages[0]["role"] == "system":
                raise RuntimeError("System role not supported")
            return super().apply_chat_template(messages, add_generation_prompt, tokenize)

    with pytest.raises(ValueError, match="--prompt-template chat: the model has no chat template"):
        build_chat_edit_prompt("x = 1\n", "rename x", NoTemplate())
    with pytest.raises(ValueError, match="instruction"):
        build_chat_edit_prompt("x = 1\n", " ", Echo())
    user = "```\nx = 1\n```\n\nrename x\n\nReply with the whole updated file in one code block."
    prompt = build_chat_edit_prompt("x = 1", "rename x", Echo())
    assert prompt.text == f"<system>{EDITOR_SYSTEM_MESSAGE}<user>{user}<assistant>```\n" and prompt.stop == "```"
    prompt = build_chat_edit_prompt("a = '```'\n", "rename a", NoSystemRole())
    assert prompt.text.startswith(f"<user>{EDITOR_SYSTEM_MESSAGE}\n\n````\na = '```'\n````") and prompt.stop == "````"
    assert prompt.text.endswith("<assistant>````\n")
