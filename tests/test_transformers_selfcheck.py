"""Specifies refdec.transformers.selfcheck: a model type refdec has not verified is checked once, when
its first decoder is made (through the model's runner as the engine steps: a branching tree
verified, the cache keeping its accepted path, a second tree, against plain forwards); lossless
models pass, with the lazy head's inputs and with the device's, models whose trees give other
logits or whose forward fails on a tree are refused naming the model type."""

from __future__ import annotations

import pytest
import torch
import transformers as T

import refdec
import refdec.transformers.runner as runner
import refdec.transformers.selfcheck as selfcheck
import tiny_models
from refdec.transformers.masks import MaskSpec
from refdec.transformers.model_support import VERIFIED_MODEL_TYPES, model_type
from refdec.transformers.runner import ModelRunner
from refdec.transformers.selfcheck import check_tree_verification


def slot_positioned_models():
    """MPT (ALiBi over KV slots) and GPT-Neo with a local window cut by slot: not lossless under trees."""
    torch.manual_seed(0)
    mpt = T.MptForCausalLM(T.MptConfig(vocab_size=96, d_model=32, n_heads=4, n_layers=2, max_seq_len=64)).eval()
    neo = T.GPTNeoForCausalLM(T.GPTNeoConfig(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4, window_size=6,
                                             attention_types=[[["global", "local"], 1]], max_position_embeddings=64,
                                             bos_token_id=1, eos_token_id=2)).eval()
    return [mpt, neo]


def one_plain_mask_for_every_model(monkeypatch) -> None:
    """Runners made after this give every model one plain mask (the name-based refusal in mask_spec_for bypassed)."""
    monkeypatch.setattr(runner, "mask_spec_for",
                        lambda model: MaskSpec(kind="single", window=None, additive=False, dtype=model.dtype))


@pytest.mark.parametrize("name", tiny_models.family_params(fast=tiny_models.MASK_FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("lazy_head", [True, False])
def test_the_check_passes_models_whose_trees_are_lossless(name, dtype, lazy_head):
    model_runner = ModelRunner(tiny_models.MODEL_BUILDERS[name]().to(dtype))
    model_runner.lazy_head = lazy_head  # the inputs laid out on the host, or on the device
    check_tree_verification(model_runner)


def test_the_check_catches_models_that_take_positions_from_cache_slots(monkeypatch):
    one_plain_mask_for_every_model(monkeypatch)
    for model in slot_positioned_models():
        with pytest.raises(ValueError, match=rf"model type '{model_type(model)}': verifying a draft tree gives other "
                                             "logits than plain decoding"):
            check_tree_verification(ModelRunner(model))


def test_an_unverified_model_type_is_checked_when_a_decoder_is_made(monkeypatch):
    """A model type outside VERIFIED_MODEL_TYPES: checked once; a lossless one decodes as
    model.generate does, one that fails the check is refused (here MPT, with the name-based
    refusal in mask_spec_for bypassed)."""
    torch.manual_seed(0)
    olmo = T.OlmoForCausalLM(T.OlmoConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                          pad_token_id=0, bos_token_id=1, eos_token_id=2)).to(torch.float64).eval()
    assert model_type(olmo) not in VERIFIED_MODEL_TYPES
    calls = []
    monkeypatch.setattr(selfcheck, "check_tree_verification",
                        lambda *a, **k: calls.append(1) or check_tree_verification(*a, **k))
    prompt = [1, 5, 6, 7, 5, 6, 7, 5, 6]
    with torch.no_grad():
        want = olmo.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             do_sample=False, max_new_tokens=16, eos_token_id=None, pad_token_id=0)[0].tolist()
    for _ in range(2):
        out = refdec.generate(olmo, prompt, max_new_tokens=16, eos_token_id=[], references=[want[3:]],
                              max_draft_tokens=16)
        assert out.sequences[0].tolist() == want
    assert calls == [1]  # once per model object, not per call
    mpt = slot_positioned_models()[0]
    one_plain_mask_for_every_model(monkeypatch)
    with pytest.raises(ValueError, match="model type 'mpt': verifying a draft tree gives other logits"):
        refdec.SpeculativeDecoder(mpt)


def test_a_model_whose_forward_fails_on_a_tree_is_refused_with_the_reason(monkeypatch):
    """Bloom builds ALiBi from a 2D padding mask: on a 4D tree mask its forward raises. With the
    name-based refusal bypassed, the self-check turns that into an error naming the model type."""
    bloom = T.BloomForCausalLM(T.BloomConfig(vocab_size=96, hidden_size=32, n_layer=1, n_head=4)).eval()
    one_plain_mask_for_every_model(monkeypatch)
    with pytest.raises(ValueError, match="model type 'bloom': verifying a draft tree fails"):
        refdec.SpeculativeDecoder(bloom)
