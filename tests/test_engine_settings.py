"""Specifies refdec.engine.settings: one request's decoding settings, checked once when made (each bad
value a ValueError naming the setting), normalised (a seed list, a stop string, an int budget) and
read-only; made from ``generate``'s keywords, or given whole and overridden by them, with the same
tokens either way through ``refdec.generate``, ``SpeculativeDecoder.generate`` and
``DecodingService.submit``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import refdec
from refdec.engine.defaults import MAX_NEW_TOKENS
from refdec.engine.service import DecodingService
from refdec.engine.settings import DecodeSettings
from refdec.sizing.budget import FixedBudget
from tiny_models import tiny_llama


def test_defaults_and_normalised_values():
    settings = DecodeSettings()
    assert (settings.max_new_tokens, settings.do_sample, settings.temperature, settings.stop_strings,
            settings.max_draft_tokens) == (MAX_NEW_TOKENS, False, 1.0, (), "auto")
    made = DecodeSettings(do_sample=True, seed=[3, 4], stop_strings="END", max_draft_tokens=8,
                          logits_settings={"repetition_penalty": 1.2})
    assert made.seed == (3, 4) and made.stop_strings == ("END",)
    assert isinstance(made.max_draft_tokens, FixedBudget) and made.max_draft_tokens.max_nodes == 8
    with pytest.raises(TypeError):
        made.logits_settings["repetition_penalty"] = 2.0  # read-only
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.temperature = 0.5


@pytest.mark.parametrize("bad, message", [
    ({"max_new_tokens": -1}, "max_new_tokens"), ({"max_new_tokens": 2.5}, "max_new_tokens"),
    ({"do_sample": "yes"}, "do_sample must be True or False"), ({"temperature": float("nan")}, "temperature"),
    ({"do_sample": True, "temperature": 0}, "temperature must be > 0 when do_sample=True"),
    ({"top_k": 0}, "top_k"), ({"top_p": 1.5}, "top_p"), ({"min_p": -0.1}, "min_p"), ({"seed": -1}, "seed"),
    ({"seed": [1, "x"]}, "seed"), ({"stop_strings": ["ok", ""]}, "stop_strings"),
    ({"max_draft_tokens": -3}, "max_draft_tokens"), ({"logits_settings": [1]}, "logits_settings"),
])
def test_a_bad_value_is_a_value_error_naming_the_setting(bad, message):
    with pytest.raises(ValueError, match=message):
        DecodeSettings(**bad)


def test_keywords_make_settings_and_override_given_ones():
    base = DecodeSettings(max_new_tokens=10, do_sample=True, temperature=0.7, seed=1)
    assert DecodeSettings.of(base) is base
    over = DecodeSettings.of(base, temperature=0.9, repetition_penalty=1.1)
    assert (over.max_new_tokens, over.temperature, over.seed) == (10, 0.9, 1)
    assert dict(over.logits_settings) == {"repetition_penalty": 1.1}  # a keyword that is no field
    assert DecodeSettings.of(max_new_tokens=5).max_new_tokens == 5
    with pytest.raises(ValueError, match="settings must be a refdec.DecodeSettings or None, got dict"):
        DecodeSettings.of({"max_new_tokens": 5})


def test_generate_gives_the_same_tokens_from_settings_or_keywords():
    torch.manual_seed(0)
    model = tiny_llama(seed=3)
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5]])
    keywords = dict(max_new_tokens=16, do_sample=True, temperature=0.8, seed=5, max_draft_tokens=4)
    by_keywords = refdec.generate(model, ids, **keywords).sequences
    settings = refdec.DecodeSettings(**keywords)
    assert torch.equal(refdec.generate(model, ids, settings=settings).sequences, by_keywords)
    decoder = refdec.SpeculativeDecoder(model)
    assert torch.equal(decoder.generate(ids, settings=settings).sequences, by_keywords)
    # a keyword beside settings overrides that field
    shorter = decoder.generate(ids, settings=settings, max_new_tokens=6).sequences
    assert shorter.shape[1] == ids.shape[1] + 6 and torch.equal(shorter, by_keywords[:, :shorter.shape[1]])


def test_the_service_takes_settings_or_keywords():
    model = tiny_llama(seed=3)
    prompt = [5, 6, 7, 5, 6, 7, 5]
    expected = refdec.generate(model, torch.tensor([prompt]), max_new_tokens=12).sequences[0, len(prompt):].tolist()
    with DecodingService(refdec.SpeculativeDecoder(model)) as service:
        for ticket in (service.submit(prompt, DecodeSettings(max_new_tokens=12)), service.submit(prompt, max_new_tokens=12)):
            assert ticket.result(timeout=60)[0] == expected
        with pytest.raises(ValueError, match="max_new_tokens"):
            service.submit(prompt, max_new_tokens=-2)
