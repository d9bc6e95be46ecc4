"""Specifies refdec.transformers.prefill: a prompt (or a left-padded group of prompts) prefilled in
chunks gives ``model.generate``'s tokens in ceil(width / chunk) forwards; while it is prefilled,
Gemma 3's sliding-window layers present only their window (refdec.transformers.cache.GrowingLayer) and
afterwards every entry again; a token array alone gives a one-row batch of it (``prefill_tokens``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import refdec
from refdec.transformers.cache import GrowingLayer, set_prefill_window
from refdec.transformers.prefill import prefill_spans, prefill_tokens
import refdec.transformers.runner
from refdec.transformers.runner import ModelRunner
from tiny_models import (FAMILIES, batch_row, cached_model, hf_greedy, mixed_batch, repetitive_prompts, tiers,
                         tiny_gemma3)

NEW = 40


def test_prefill_spans_cover_the_prompt_in_order():
    assert prefill_spans(10, None) == [(0, 10)]
    assert prefill_spans(10, 10) == [(0, 10)]
    assert prefill_spans(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert prefill_spans(3, 1) == [(0, 1), (1, 2), (2, 3)]



def test_a_token_array_is_prefilled_as_a_one_row_batch_with_a_bare_request(llama):
    tokens = np.array(repetitive_prompts(1, seed=3)[0])
    with torch.inference_mode():
        batch, last = prefill_tokens(ModelRunner(llama), tokens)
        want = llama(torch.from_numpy(tokens)[None]).logits[:, -1]
    assert len(batch) == 1 and batch.slots == len(tokens) == batch.cache.get_seq_length()
    assert batch.lead_holes.tolist() == [0] and batch.key_pos.tolist() == [list(range(len(tokens)))]
    assert batch.requests[0].seq == tokens.tolist() and batch.requests[0].drafter is None
    assert torch.allclose(last, want, rtol=0, atol=1e-10)


# fast: chunks of 5 across Gemma 3's window of 8, chunks of 1 on Llama; full: every family x chunk
@pytest.mark.parametrize("family, chunk", tiers([(family, chunk) for family in FAMILIES for chunk in (1, 5, 16)],
                                               fast=[("gemma3", 5), ("llama", 1)]))
def test_chunked_prefill_matches_generate(tiny_model_cache, family, chunk):
    """Prompts prefilled in chunks (across Gemma 3's sliding window of 8 with chunk 5) give
    generate's tokens, and the prefill really ran ceil(prompt / chunk) forwards."""
    model = cached_model(tiny_model_cache, family)
    forwards = []
    hook = model.get_input_embeddings().register_forward_hook(lambda module, args, out: forwards.append(1))
    try:
        decoder = refdec.SpeculativeDecoder(model, prefill_chunk=chunk)
        for prompt in repetitive_prompts(4, seed=13):
            assert len(prompt) > chunk
            forwards.clear()
            out = decoder.generate(prompt, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=16)
            prefill_forwards = len(forwards) - (out.stats.forward_passes - 1)  # stats count the prefill once
            assert out.sequences[0].tolist() == hf_greedy(model, prompt), (family, chunk, prompt)
            assert prefill_forwards == -(-len(prompt) // chunk), (family, chunk, len(prompt))
    finally:
        hook.remove()


@pytest.mark.parametrize("family, lazy_head", tiers(
    [(family, lazy) for family in ("gemma3", "gpt2", "llama") for lazy in (True, False)],
    fast=[("llama", True), ("llama", False)]))
def test_chunked_batch_prefill_keeps_every_row_exact(tiny_model_cache, family, lazy_head):
    """The left-padded batch prefilled 5 columns at a time (padding, sliding window and
    positions cut across chunks) still gives each row its own generate output, with the
    lazy head's backbone and with the model's own forward, in ceil(width / 5) forwards."""
    model = cached_model(tiny_model_cache, family)
    prompts = mixed_batch()
    decoder = refdec.SpeculativeDecoder(model, prefill_chunk=5)
    decoder.backend.lazy_head = lazy_head and decoder.backend.lazy_head
    forwards = []
    hook = model.get_input_embeddings().register_forward_hook(lambda module, args, out: forwards.append(1))
    try:
        out = decoder.generate(prompts, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=16)
    finally:
        hook.remove()
    width = max(len(p) for p in prompts)
    assert len(forwards) - (out.stats.forward_passes - 1) == -(-width // 5)  # stats count the prefill once
    for b, p in enumerate(prompts):
        assert batch_row(out, b, len(p)) == hf_greedy(model, p), (family, b)


def test_the_decoder_windows_gemma3_sliding_layers_during_the_prefill_only(monkeypatch):
    model = tiny_gemma3(sliding_window=8)
    layer_types = model.config.layer_types
    sliding = [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
    assert sliding and len(sliding) < len(layer_types)
    calls, caches = [], []

    def spy(cache, layer_indices, window):
        calls.append((list(layer_indices), window))
        caches.append(cache)
        return set_prefill_window(cache, layer_indices, window)

    monkeypatch.setattr(refdec.transformers.runner, "set_prefill_window", spy)
    decoder = refdec.SpeculativeDecoder(model, prefill_chunk=5)
    prompt = repetitive_prompts(1, seed=13)[0]
    decoder.generate(prompt, max_new_tokens=8, eos_token_id=[], max_draft_tokens=4)
    n_chunks = -(-len(prompt) // 5)
    assert calls == [(sliding, 8)] * (n_chunks - 1) + [(sliding, None)]
    cache = caches[-1]
    assert all(layer.prefill_window is None for layer in cache.layers)  # off for the decoding loop


def test_the_batched_prefill_windows_gemma3_sliding_layers_and_keeps_rows_exact(monkeypatch):
    """A left-padded batch prefilled in chunks of 5: after the first chunk the sliding
    layers present only window - 1 + 5 keys (their mask cut to those columns), the full
    layer every key, and each row still equals generate on that row alone."""
    model = tiny_gemma3(sliding_window=8)
    sliding = [i for i, kind in enumerate(model.config.layer_types) if kind == "sliding_attention"]
    calls, presented = [], []

    def spy(cache, layer_indices, window):
        calls.append((list(layer_indices), window))
        return set_prefill_window(cache, layer_indices, window)

    update = GrowingLayer.update

    def recording_update(self, key_states, value_states, *args, **kwargs):
        keys, values = update(self, key_states, value_states, *args, **kwargs)
        presented.append((self.prefill_window, key_states.shape[-2], keys.shape[-2], self.keys.shape[-2]))
        return keys, values

    monkeypatch.setattr(refdec.transformers.runner, "set_prefill_window", spy)
    monkeypatch.setattr(GrowingLayer, "update", recording_update)
    prompts = repetitive_prompts(3, seed=11) + [list(range(3, 40))]  # widths 15..37: left padding
    width = max(len(p) for p in prompts)
    decoder = refdec.SpeculativeDecoder(model, prefill_chunk=5)
    out = decoder.generate(prompts, max_new_tokens=6, eos_token_id=[], max_draft_tokens=4)
    n_chunks = -(-width // 5)
    assert calls == [(sliding, 8)] * (n_chunks - 1) + [(sliding, None)]
    windowed = [(new, shown, stored) for window, new, shown, stored in presented if window is not None]
    assert len(windowed) == len(sliding) * (n_chunks - 1)
    assert all(shown == min(stored, 7 + new) for new, shown, stored in windowed)
    assert any(shown < stored for _, shown, stored in windowed)  # the window did cut
    head = out.sequences.shape[1] - 6
    for b, p in enumerate(prompts):
        with torch.no_grad():
            want = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=6, pad_token_id=0)[0].tolist()
        assert out.sequences[b, head - len(p):].tolist() == want, b
