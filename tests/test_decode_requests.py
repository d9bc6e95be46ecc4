"""Specifies refdec.decode.requests: a request's limits. Generation ends at max_new_tokens or at
the model's max_position_embeddings (the last position is emitted, never fed), whichever comes
first, and says which in ``stats.stop_reason``."""

from __future__ import annotations

import pytest

import refdec
from tiny_models import tiny_llama


@pytest.fixture(scope="module")
def llama4():
    return tiny_llama(seed=4)


def test_generation_stops_at_max_position_embeddings(llama):
    prompt = list(range(3, 90)) * 5 + list(range(3, 80))  # 512 tokens = max_position_embeddings
    out = refdec.generate(llama, prompt, max_new_tokens=10, eos_token_id=[], max_draft_tokens=8)
    assert out.stats.new_tokens == 1 and out.stats.stop_reason == "max_position_embeddings"


def test_a_prompt_longer_than_the_window_is_a_clear_error(llama4):
    model = llama4
    window = model.config.max_position_embeddings
    decoder = refdec.SpeculativeDecoder(model)
    with pytest.raises(ValueError, match=rf"{window + 1} tokens.*max_position_embeddings={window}"):
        decoder.generate([3] * (window + 1), max_new_tokens=4)
    # at the window exactly: one token is emitted (it is never fed back), stop reason says why
    out = decoder.generate([3] * window, max_new_tokens=4, eos_token_id=[])
    assert out.stats.new_tokens == 1 and out.stats.stop_reason == "max_position_embeddings"
