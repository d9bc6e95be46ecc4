"""Specifies refdec.llama_cpp.api, every call refdec makes into llama-cpp-python: ``TreeContext``, a
context of its own on the model of a user's ``Llama`` whose entries carry sequence ids (a tree's
branches share their prefix's cells and attend to their own sequence only, giving the logits a
plain decode of each branch gives), with its cells' positions per sequence, and refusals that say
what is wrong (a full context is a ``LlamaDecodeError``); ``chat_template_prompt``, the GGUF
file's chat template rendered. Tiny random GGUF model (benchmarks/random_gguf.py); marked llama.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from refdec.llama_cpp.api import (MAX_SEQUENCES, LlamaDecodeError, TreeContext,  # noqa: E402
                                  chat_template_prompt, llama_version)
from benchmarks.random_gguf import EOS  # noqa: E402

pytestmark = pytest.mark.llama

PROMPT = [1] + [4 + b for b in b"hello world, hello"]  # BOS, then the bytes (ids 4..259)


def _last_only(n: int) -> np.ndarray:
    want = np.zeros(n, dtype=bool)
    want[-1] = True
    return want


def _plain_logits(llm, tokens: list[int]) -> np.ndarray:
    """The logits after ``tokens``, decoded as one sequence in a fresh context."""
    ctx = TreeContext(llm, n_seq_max=1, n_batch=64)
    ctx.decode(np.array(tokens), np.arange(len(tokens)), [[0]] * len(tokens), _last_only(len(tokens)))
    logits = ctx.logits(len(tokens) - 1).copy()
    ctx.close()
    return logits


def test_branches_decoded_together_get_the_logits_of_each_branch_decoded_alone(tiny_llm):
    ctx = TreeContext(tiny_llm, n_seq_max=4, n_batch=64)
    n = len(PROMPT)
    ctx.decode(np.array(PROMPT), np.arange(n), [[0]] * n, _last_only(n))
    assert np.allclose(ctx.logits(n - 1), _plain_logits(tiny_llm, PROMPT), atol=1e-4)
    ctx.seq_copy(0, 1)  # the prompt's cells now belong to sequences 0 and 1
    ctx.seq_copy(0, 2)
    # three branches at position n, one per sequence, in one decode
    branches = [70, 111, 5]
    ctx.decode(np.array(branches), np.full(3, n), [[0], [1], [2]], np.ones(3, dtype=bool))
    together = [ctx.logits(i).copy() for i in range(3)]
    for token, logits in zip(branches, together):
        assert np.allclose(logits, _plain_logits(tiny_llm, PROMPT + [token]), atol=1e-4), token
    assert np.abs(together[0] - together[1]).max() > 1.0  # the branches do differ: each saw its own token


def test_cells_are_kept_per_sequence_and_removed_by_position(tiny_llm):
    ctx = TreeContext(tiny_llm, n_seq_max=2, n_batch=64)
    n = len(PROMPT)
    assert ctx.seq_pos_range(0) == (-1, -1)
    ctx.decode(np.array(PROMPT), np.arange(n), [[0]] * n, _last_only(n))
    assert ctx.seq_pos_range(0) == (0, n - 1) and ctx.seq_pos_range(1) == (-1, -1)
    ctx.seq_copy(0, 1, 0, 5)  # positions [0, 5) only
    assert ctx.seq_pos_range(1) == (0, 4)
    ctx.seq_remove(0, 10, -1)
    assert ctx.seq_pos_range(0) == (0, 9) and ctx.seq_pos_range(1) == (0, 4)
    ctx.clear()
    assert ctx.seq_pos_range(0) == (-1, -1) and ctx.seq_pos_range(1) == (-1, -1)
    assert ctx.decodes == 1


def test_a_context_takes_the_llamas_settings_and_the_models_vocabulary(tiny_llm):
    ctx = TreeContext(tiny_llm, n_seq_max=3, n_batch=100)
    assert ctx.n_ctx == tiny_llm.n_ctx() and ctx.n_vocab == 260
    assert ctx.n_batch == 100 and ctx.prefill_chunk == tiny_llm.n_batch  # prompts are fed as Llama.eval feeds them
    assert ctx.n_threads()[0] == 1
    assert ctx.eos_ids() == {EOS}
    assert llama_version() == llama_cpp.__version__


def test_bad_arguments_are_refused_naming_the_limit(tiny_llm):
    with pytest.raises(ValueError, match=rf"n_seq_max must be in \[1, {MAX_SEQUENCES}\] \(llama.cpp's limit\), got 0"):
        TreeContext(tiny_llm, n_seq_max=0, n_batch=8)
    with pytest.raises(ValueError, match=rf"n_seq_max must be in \[1, {MAX_SEQUENCES}\]"):
        TreeContext(tiny_llm, n_seq_max=MAX_SEQUENCES + 1, n_batch=8)
    ctx = TreeContext(tiny_llm, n_seq_max=1, n_batch=64)
    with pytest.raises(ValueError, match="a decode takes 1..64 tokens, got 0"):
        ctx.decode(np.zeros(0, np.int32), np.zeros(0, np.int32), [], np.zeros(0, dtype=bool))
    with pytest.raises(ValueError, match="a decode takes 1..64 tokens, got 65"):
        ctx.decode(np.full(65, 5), np.arange(65), [[0]] * 65, _last_only(65))
    assert ctx.decodes == 0


def test_a_full_context_is_a_llama_decode_error_saying_so(tiny_gguf):
    small = llama_cpp.Llama(str(tiny_gguf), n_ctx=64, n_threads=1, n_batch=64, verbose=False)
    ctx = TreeContext(small, n_seq_max=1, n_batch=64)
    for begin in range(0, ctx.n_ctx, 64):  # llama.cpp may round n_ctx up: fill every cell it has
        size = min(64, ctx.n_ctx - begin)
        ctx.decode(np.full(size, 5), np.arange(begin, begin + size), [[0]] * size, _last_only(size))
    assert ctx.seq_pos_range(0) == (0, ctx.n_ctx - 1)
    with pytest.raises(LlamaDecodeError, match="the context is full"):
        ctx.decode(np.array([5]), np.array([ctx.n_ctx]), [[0]], np.ones(1, dtype=bool))


def test_the_chat_template_of_the_gguf_file_renders_the_messages(tiny_llm):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert chat_template_prompt(tiny_llm, messages) == "<s>system: be brief\n<s>user: hi\nassistant: "
    assert chat_template_prompt(tiny_llm, messages, add_generation_prompt=False) == "<s>system: be brief\n<s>user: hi\n"
    without = SimpleNamespace(metadata={}, model_path="plain.gguf")
    with pytest.raises(ValueError, match=r"plain.gguf carries no chat template \(tokenizer.chat_template\)"):
        chat_template_prompt(without, messages)
