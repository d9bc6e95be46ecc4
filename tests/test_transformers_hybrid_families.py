"""Specifies refdec.transformers.hybrid.families: each hybrid family's layers are recognised (the
cache layer each one gets, the recurrent families found, whether the model attends at all), an
attention-only model is no hybrid, and a recurrent layer refdec does not handle is refused before
decoding with an error naming its family or layer type."""

from __future__ import annotations

import pytest

import refdec
from refdec.transformers.hybrid.families import find_hybrid
from refdec.transformers.model_support import text_config
from tiny_hybrids import hybrid, tiny_hybrid
from tiny_models import tiny_gemma3

EXPECTED = {  # family: (cache layer types, recurrent families)
    "qwen3_5": (("linear_attention", "linear_attention", "full_attention", "linear_attention"), ("gated_deltanet",)),
    "qwen3_next": (("linear_attention", "full_attention"), ("gated_deltanet",)),
    "lfm2": (("conv", "full_attention", "conv"), ("short_conv",)),
    "mamba2": (("linear_attention", "linear_attention"), ("mamba2",)),
    "granitemoehybrid": (("linear_attention", "full_attention", "linear_attention"), ("mamba2",)),
    "falcon_h1": (("hybrid", "hybrid"), ("mamba2",)),
    "nemotron_h": (("linear_attention", "full_attention", "dummy", "linear_attention"), ("mamba2",)),
    "zamba2": (("linear_attention", "hybrid", "linear_attention", "hybrid"), ("mamba2",)),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_familys_layers_are_recognised(name):
    model = hybrid(name)
    layout = find_hybrid(model, text_config(model))
    types, families = EXPECTED[name]
    assert layout.cache_layer_types == types
    assert layout.families == families
    assert layout.has_attention == (name != "mamba2")


def test_an_attention_only_model_is_no_hybrid():
    model = tiny_gemma3()
    assert find_hybrid(model, text_config(model)) is None


def test_mamba_v1_is_refused_before_decoding_naming_the_family():
    model = tiny_hybrid("mamba")
    with pytest.raises(ValueError, match="MambaMixer.*Mamba \\(v1\\)"):
        refdec.generate(model, [1, 5, 6, 7], max_new_tokens=4)


def test_an_unknown_recurrent_layer_type_is_refused_naming_it():
    model = tiny_hybrid("qwen3_5")
    config = model.config
    types = list(config.layer_types)
    types[2] = "lightning_attention"  # a layer whose mixer refdec does not know
    config.layer_types = types
    with pytest.raises(ValueError, match="'lightning_attention' \\(layer 2\\) is not supported"):
        refdec.generate(model, [1, 5, 6, 7], max_new_tokens=4)
