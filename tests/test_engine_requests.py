"""Specifies refdec.engine.requests: a request's limits. Generation ends at max_new_tokens or at
the model's max_position_embeddings (the last position is emitted, never fed), whichever comes
first, and says which in ``stats.stop_reason``."""

from __future__ import annotations

import time

import numpy as np
import pytest

import refdec
from refdec.engine.requests import Request
from refdec.engine.results import DecodingStats
from refdec.engine.stops import StopChecker
from tiny_models import tiny_llama


@pytest.fixture(scope="module")
def llama4():
    return tiny_llama(seed=4)


class RecordingDrafter:
    def __init__(self):
        self.accepted = []

    def accept(self, tokens):
        assert tokens.dtype == np.int32
        self.accepted.append(tokens.tolist())


def request(max_new_tokens=10, max_positions=None, eos=(), **callbacks):
    """A request for the prompt [1, 5, 6, 7], its drafter a RecordingDrafter."""
    return Request(3, np.array([1, 5, 6, 7]), max_new_tokens, max_positions, stats=DecodingStats(), sampler=None,
                   stopper=StopChecker(set(eos), [], None), drafter=RecordingDrafter(), budget=None,
                   started=time.perf_counter(), **callbacks)


def test_emitted_runs_extend_the_sequence_and_reach_the_drafter_and_the_streamer():
    streamed = []
    req = request(on_tokens=lambda row, tokens: streamed.append((row, tokens)))
    assert (req.root_pos, req.room) == (3, 10)
    req.emit([8, 9])
    req.emit([10])
    assert req.seq == [1, 5, 6, 7, 8, 9, 10] and (req.root_pos, req.room) == (6, 7) and not req.done
    assert req.drafter.accepted == [[8, 9], [10]] and streamed == [(3, [8, 9]), (3, [10])]


def test_a_run_past_max_new_tokens_is_cut_and_finishes_the_request():
    done = []
    req = request(max_new_tokens=3, on_done=lambda row, new, stats: done.append((row, new, stats.new_tokens)))
    req.emit([8, 9, 10, 11, 12])
    assert req.seq == [1, 5, 6, 7, 8, 9, 10] and req.done and req.stats.stop_reason == "max_new_tokens"
    assert done == [(3, [8, 9, 10], 3)] and req.drafter.accepted == []  # a finished request drafts no more


def test_an_eos_inside_a_run_is_kept_and_nothing_after_it():
    streamed = []
    req = request(eos=[9], on_tokens=lambda row, tokens: streamed.append(tokens))
    req.emit([8, 9, 10])
    assert req.seq == [1, 5, 6, 7, 8, 9] and streamed == [[8, 9]] and req.stats.stop_reason == "eos"
    assert req.stats.new_tokens == 2


def test_the_model_positions_cap_the_sequence_one_past_the_last_position():
    """max_positions=6: positions 0..5 are fed, the token at position 6 is emitted, never fed."""
    req = request(max_new_tokens=10, max_positions=6)
    assert req.room == 3
    req.emit([8, 9, 10, 11])
    assert req.seq == [1, 5, 6, 7, 8, 9, 10] and req.stats.stop_reason == "max_position_embeddings"
    # max_new_tokens reached at the same length: that is the reason given
    req = request(max_new_tokens=3, max_positions=6)
    req.emit([8, 9, 10])
    assert req.stats.stop_reason == "max_new_tokens"


# ---------------------------------------------------------------- through generate


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
