"""Specifies refdec.transformers.runner, ``ModelRunner``: what the engine needs to know about one model (its
vocabulary, position limit, device, the name its forward takes the cache under, its mask format)
and its forwards over a refdec KV cache: the model's own forward, and for a plain-head model on a
CPU the backbone alone, whose rows the lazy head turns into the same logits (not for a hooked head);
a prompt prefilled in chunks gives the model's logits after its last token, for the last chunk
only, with Gemma 3's sliding-window layers presenting their window during the prefill and every
entry after it."""

from __future__ import annotations

import pytest
import torch

from refdec.transformers.cache import new_cache
from refdec.transformers.model_support import cache_kwarg
from refdec.transformers.runner import ModelRunner
from tiny_models import VOCAB, cached_model, tiny_llama


def _prompt(length: int = 30, seed: int = 3) -> torch.Tensor:
    return torch.randint(3, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def test_a_runner_knows_the_models_limits_and_mask_format(tiny_model_cache):
    llama, gemma3 = (cached_model(tiny_model_cache, name) for name in ("llama", "gemma3"))
    runner = ModelRunner(llama)
    assert runner.vocab_size == VOCAB and runner.max_positions == llama.config.max_position_embeddings
    assert runner.device == torch.device("cpu") and runner.cache_kw == cache_kwarg(llama)
    assert runner.mask_spec.kind == "single" and runner.sliding_layers == []
    runner = ModelRunner(gemma3)
    sliding = [i for i, kind in enumerate(gemma3.config.layer_types) if kind == "sliding_attention"]
    assert runner.mask_spec.kind == "dict" and runner.sliding_layers == sliding and sliding
    # the first key column the sliding layers show a prefill chunk starting at a column (window 8)
    assert [runner.sliding_prefill_start(begin) for begin in (0, 5, 7, 20)] == [0, 0, 0, 13]
    assert ModelRunner(llama).sliding_prefill_start(20) == 0  # no sliding layers: every column


def test_on_a_cpu_a_plain_head_model_runs_the_backbone_and_the_lazy_head_gives_its_logits(llama):
    runner = ModelRunner(llama)
    assert runner.uses_lazy_head
    ids = _prompt(12)
    with torch.inference_mode():
        logits = runner.logits(new_cache(), input_ids=ids)
        hidden = runner.hidden(new_cache(), input_ids=ids)
        assert torch.allclose(logits, llama(ids).logits, rtol=0, atol=1e-12)
        assert hidden.shape == (1, 12, llama.config.hidden_size)
        assert torch.allclose(runner.head.logits(hidden[0]), logits[0], rtol=0, atol=1e-10)


def test_a_hooked_head_is_run_by_the_models_own_forward():
    model = tiny_llama(seed=1)
    model.lm_head.register_forward_hook(lambda module, args, out: out * 2)  # what the lazy head would skip
    runner = ModelRunner(model)
    assert not runner.uses_lazy_head and runner.head is None
    ids = _prompt(10)
    with torch.inference_mode():
        last = runner.prefill_chunk(new_cache(), 0, True, input_ids=ids)
        assert torch.allclose(last, model(ids).logits[:, -1], rtol=0, atol=1e-12)  # the hook applied


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_prompt_prefilled_in_chunks_gives_the_models_logits_after_its_last_token(family, tiny_model_cache):
    model = cached_model(tiny_model_cache, family)
    runner = ModelRunner(model)
    ids = _prompt(30)
    cache = new_cache()
    with torch.inference_mode():
        outs = [runner.prefill_chunk(cache, begin, begin + 7 >= 30, input_ids=ids[:, begin:begin + 7])
                for begin in range(0, 30, 7)]
        want = model(ids).logits[:, -1]
    assert all(out is None for out in outs[:-1])
    assert outs[-1].shape == (1, VOCAB) and torch.allclose(outs[-1], want, rtol=0, atol=1e-10)
    assert all(layer.prefill_window is None for layer in cache.layers)  # every entry again for the decoding loop
