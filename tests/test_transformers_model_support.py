"""Specifies refdec.transformers.model_support: how each model type wants its attention mask (one mask,
or a dict of full and sliding-window masks), and the model types refused up front because they
take positions from KV cache slots (ALiBi models, GPT-Neo with local layers)."""

from __future__ import annotations

import pytest

from refdec.transformers.model_support import mask_spec_for


def test_mask_spec_of_tiny_models(mask_family_model):
    name, model = mask_family_model
    spec = mask_spec_for(model)
    if name == "gemma3":
        assert spec.kind == "dict" and spec.window == model.config.sliding_window
    else:
        assert spec.kind == "single" and spec.window is None


@pytest.mark.parametrize("family", ["bloom", "falcon-alibi", "mpt", "gpt_neo-local"])
def test_slot_positioned_models_are_rejected_up_front_with_a_clear_error(family):
    """Bloom and Falcon(alibi=True) build their position biases from a 2D padding mask
    (transformers' build_alibi_tensor): with a 4D tree mask they failed deep inside the
    forward with "too many values to unpack". MPT builds its ALiBi biases over KV slots and
    GPT-Neo cuts its local window by slot: a tree gave other tokens than model.generate.
    refdec refuses them when the decoder is made."""
    import transformers as T

    import refdec

    if family == "bloom":
        model = T.BloomForCausalLM(T.BloomConfig(vocab_size=96, hidden_size=32, n_layer=1, n_head=4))
    elif family == "falcon-alibi":
        model = T.FalconForCausalLM(T.FalconConfig(vocab_size=96, hidden_size=32, num_hidden_layers=1,
                                                   num_attention_heads=4, alibi=True))
    elif family == "mpt":
        model = T.MptForCausalLM(T.MptConfig(vocab_size=96, d_model=32, n_heads=4, n_layers=1, max_seq_len=64))
    else:
        model = T.GPTNeoForCausalLM(T.GPTNeoConfig(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4,
                                                   window_size=6, attention_types=[[["global", "local"], 1]],
                                                   max_position_embeddings=64))
    message = "with local attention layers" if family == "gpt_neo-local" else "with ALiBi position biases"
    with pytest.raises(ValueError, match=rf"model type '(bloom|falcon|mpt|gpt_neo)' {message} is not supported"):
        refdec.SpeculativeDecoder(model)
    if family == "gpt_neo-local":  # global layers only: positions come from position_ids, so it is accepted
        refdec.SpeculativeDecoder(T.GPTNeoForCausalLM(T.GPTNeoConfig(
            vocab_size=96, hidden_size=32, num_layers=1, num_heads=4, attention_types=[[["global"], 1]],
            max_position_embeddings=64)))
