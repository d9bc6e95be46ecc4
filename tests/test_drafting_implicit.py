"""Specifies refdec.drafting.implicit: the implicit reference of a request without ``prediction`` is
the file an editing tool put in its messages, found in the request shapes real tools send (aider's
whole-file and diff formats, Continue's apply prompt, Obsidian Smart Composer's apply request), and
none for a chat without code; and ``generate`` given no references finds it in the prompt's text,
drafts from it and gives the same tokens."""

from __future__ import annotations

import numpy as np
import pytest

import refdec
from refdec.drafting.implicit import MIN_REFERENCE_CHARS, fenced_blocks, implicit_reference
from refdec.engine.arguments import row_references
from tiny_models import hf_greedy, repetitive_prompts

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


# ---------------------------------------------------------------- generate(..., references=None)


def _ids(tokenizer, text: str) -> np.ndarray:
    return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)


def test_a_prompt_given_no_references_gets_its_fenced_file_tokenized_as_a_text_reference(tiny_tokenizer):
    prompt = _ids(tiny_tokenizer, aider_whole_file()[1] + "Rename f3 to g3.\n")
    file = [_ids(tiny_tokenizer, FILE).tolist()]
    assert [r.tolist() for r in row_references(None, prompt, tiny_tokenizer)] == file
    assert row_references([], prompt, tiny_tokenizer) == []  # [] asks for none
    assert row_references(None, prompt, None) == []  # no tokenizer: the text cannot be read
    assert row_references(None, _ids(tiny_tokenizer, "What is 2 + 2?"), tiny_tokenizer) == []
    given = row_references(["x = 1"], prompt, tiny_tokenizer)  # given ones are used, not the implicit one
    assert [r.tolist() for r in given] == [_ids(tiny_tokenizer, "x = 1").tolist()]


def test_each_row_of_a_batch_given_none_gets_its_own(llama, tiny_tokenizer):
    file = FILE[:FILE.index("def f7")]  # the tiny Llama holds 512 positions: a character a token
    assert len(file) >= MIN_REFERENCE_CHARS
    with_file = _ids(tiny_tokenizer, f"Rewrite it:\n```python\n{file}```\n")
    plain = _ids(tiny_tokenizer, "Say hello.")
    decoder = refdec.SpeculativeDecoder(llama, tokenizer=tiny_tokenizer)
    settings = refdec.DecodeSettings(max_new_tokens=4, eos_token_id=[])
    args = decoder.check_call([with_file, plain], settings, index=None)
    assert [[r.tolist() for r in refs] for refs in args.references] == [[_ids(tiny_tokenizer, file).tolist()], []]
    args = decoder.check_call([with_file, plain], settings, index=None, references=[[], None])
    assert [len(refs) for refs in args.references] == [0, 0]


def test_generate_drafts_from_the_file_in_the_prompt_and_gives_the_same_tokens(llama, tiny_tokenizer):
    """The file is text the tiny model writes, so that its reply follows it; given no references the
    drafts come from it (the reference source), given ``[]`` from the context alone."""
    seed = repetitive_prompts(1, seed=9)[0]
    file = tiny_tokenizer.decode(hf_greedy(llama, seed, max_new_tokens=120)[len(seed):])
    prompt = _ids(tiny_tokenizer, f"Copy this file:\n```\n{file * 2}\n```\n")
    want = hf_greedy(llama, prompt.tolist(), max_new_tokens=48)
    found = refdec.generate(llama, prompt, tokenizer=tiny_tokenizer, max_new_tokens=48, eos_token_id=[],
                            max_draft_tokens=32)
    none = refdec.generate(llama, prompt, tokenizer=tiny_tokenizer, references=[], max_new_tokens=48,
                           eos_token_id=[], max_draft_tokens=32)
    assert found.sequences[0].tolist() == want == none.sequences[0].tolist()
    assert found.stats.proposed_by_source.get("reference", 0) > 0
    assert none.stats.proposed_by_source.get("reference", 0) == 0


@pytest.mark.llama
def test_on_llama_cpp_the_gguf_tokenizer_reads_the_prompt(tiny_gguf):
    """A llama.cpp model's decoder reads the prompt's text with the GGUF file's own tokenizer."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(str(tiny_gguf), n_ctx=1024, n_threads=1, verbose=False)
    decoder = refdec.SpeculativeDecoder(llm)
    prompt = decoder.tokenizer(aider_whole_file()[1], add_special_tokens=False)["input_ids"]
    args = decoder.check_call(prompt, refdec.DecodeSettings(max_new_tokens=4), index=None)
    want = decoder.tokenizer(FILE, add_special_tokens=False)["input_ids"]
    assert [r.tolist() for r in args.references[0]] == [list(want)]
