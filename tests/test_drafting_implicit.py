"""Specifies refdec.serve.implicit: the implicit reference of a request without ``prediction`` is
the file an editing tool put in its messages, found in the request shapes real tools send (aider's
whole-file and diff formats, Continue's apply prompt, Obsidian Smart Composer's apply request), and
none for a chat without code."""

from __future__ import annotations

import pytest

from refdec.serve.implicit import MIN_REFERENCE_CHARS, fenced_blocks, implicit_reference

FILE = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(12))  # a 380-character file
assert len(FILE) > MIN_REFERENCE_CHARS

AIDER_SYSTEM = ("Act as an expert software developer.\nOnce you understand the request you MUST:\n"
                "1. Determine if any code changes are needed.\n2. Explain any needed changes.\n"
                "3. If changes are needed, output a copy of each file that needs changes.\n"
                "To suggest changes to a file you MUST return the entire content of the updated file.\n"
                "You MUST use this *file listing* format:\n\npath/to/filename.js\n```\n"
                "// entire file content ...\n// ... goes in between\n```\n")


def aider_whole_file() -> list[str]:
    return [AIDER_SYSTEM,
            f"I have *added these files to the chat* so you can go ahead and edit them.\n\nmod.py\n```\n{FILE}```\n",
            "Ok, any changes I propose will be to those files.",
            "Rename f3 to g3."]


def aider_diff() -> list[str]:
    example = ("mathweb/flask/app.py\n```python\n<<<<<<< SEARCH\nfrom flask import Flask\n=======\n"
               "import math\nfrom flask import Flask\n>>>>>>> REPLACE\n```\n")
    return ["Act as an expert software developer. Describe each change with a *SEARCH/REPLACE block* per "
            "the examples below.\n" + example,
            f"mod.py\n```python\n{FILE}```\n",
            "Rename f3 to g3."]


def continue_apply() -> list[str]:
    new_code = "def f3(x):\n    return x + 33\n"
    return [f"ORIGINAL CODE:\n```python mod.py\n{FILE}```\n\nNEW CODE:\n```python\n{new_code}```\n\n"
            "Apply the NEW CODE to the ORIGINAL CODE and reply with the whole updated file in one code block."]


def smart_composer_apply() -> list[str]:
    return ["You are an intelligent assistant helping a user apply changes to a markdown file.",
            f"## Original File\n\n~~~~markdown\n{FILE}~~~~\n\n## Changes\n\n```\nonly f3 changes\n```\n\n"
            "Rewrite the whole file with the changes applied."]


@pytest.mark.parametrize("shape", [aider_whole_file, aider_diff, continue_apply, smart_composer_apply],
                         ids=lambda shape: shape.__name__)
def test_the_file_in_a_tools_request_is_its_implicit_reference(shape):
    assert implicit_reference(shape()) == FILE


def test_a_chat_without_code_or_with_a_short_snippet_has_none():
    assert implicit_reference(["What is the capital of France?", "Paris.", "And of Italy?"]) is None
    assert implicit_reference(["Why does ```x = 1``` fail?", "In Python:\n```python\nx = 1\n```\nworks."]) is None
    assert implicit_reference([]) is None and implicit_reference([None, ""]) is None


def test_the_largest_block_wins_and_the_last_of_equals():
    small, large = "a = 1\n" * 40, "b = 2\n" * 60
    assert implicit_reference([f"```\n{small}```", f"```py\n{large}```", f"```\n{small}```"]) == large
    twin = "c = 3\n" * 60
    assert implicit_reference([f"```\n{large}```\n\n```\n{twin}```"]) == twin


def test_fences_close_with_their_own_kind_and_length():
    inner = "```python\nprint(1)\n```\n"
    text = f"````markdown\n# Title\n{inner}more\n````\n"
    assert fenced_blocks(text) == [f"# Title\n{inner}more\n"]
    assert fenced_blocks("```\nnever closed\n") == []
    assert fenced_blocks("~~~\nx\n```\n~~~\n") == ["x\n```\n"]
