"""Specifies refdec.llama_cpp.plain, llama.cpp's own plain greedy decoding (the baseline refdec is
compared and timed against): each token is the argmax of the logits after the ones before, from a
fresh state whatever ran before; it ends at ``max_new_tokens``, after an ``eos`` id (emitted) or
where ``stop`` says. Tiny random GGUF model (benchmarks/random_gguf.py); marked llama.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from refdec.llama_cpp.api import TreeContext  # noqa: E402
from refdec.llama_cpp.plain import plain_greedy  # noqa: E402

pytestmark = pytest.mark.llama

PROMPT = [1] + [4 + b for b in b"The quick brown fox"]


def test_each_token_is_the_argmax_after_the_tokens_before_it(tiny_llm):
    new, seconds = plain_greedy(tiny_llm, PROMPT, 12)
    assert len(new) == 12 and seconds > 0
    ctx = TreeContext(tiny_llm, n_seq_max=1, n_batch=64)
    ctx.decode(np.array(PROMPT), np.arange(len(PROMPT)), [[0]] * len(PROMPT), np.arange(len(PROMPT)) == len(PROMPT) - 1)
    for i, token in enumerate(new):
        logits = ctx.logits(0 if i else len(PROMPT) - 1)
        top2 = np.sort(logits)[-2:]
        if top2[1] - top2[0] > 1e-3:  # a near-tie may go either way between two llama.cpp contexts
            assert int(np.argmax(logits)) == token, i
        ctx.decode(np.array([token]), np.array([len(PROMPT) + i]), [[0]], np.ones(1, dtype=bool))


def test_it_starts_from_a_fresh_state_whatever_ran_before(tiny_llm):
    first, _ = plain_greedy(tiny_llm, PROMPT, 16)
    plain_greedy(tiny_llm, [1] + [4 + b for b in b"something else entirely"], 8)
    assert plain_greedy(tiny_llm, PROMPT, 16)[0] == first
    assert plain_greedy(tiny_llm, PROMPT, 5)[0] == first[:5]


def test_it_ends_at_max_new_tokens_after_an_eos_id_or_where_stop_says(tiny_llm):
    full, _ = plain_greedy(tiny_llm, PROMPT, 16)
    eos = full[6]
    cut = full.index(eos) + 1  # the first occurrence, emitted
    assert plain_greedy(tiny_llm, PROMPT, 16, eos={eos})[0] == full[:cut]
    seen = []

    def stop(new_ids):
        seen.append(list(new_ids))
        return len(new_ids) == 3

    assert plain_greedy(tiny_llm, PROMPT, 16, stop=stop)[0] == full[:3]
    assert seen == [full[:1], full[:2], full[:3]]  # asked after each token
    assert plain_greedy(tiny_llm, PROMPT, 0)[0] == []
