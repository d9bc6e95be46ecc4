"""Chunked prefill of sliding-window layers: while a prompt is prefilled in chunks, a
Gemma 3 sliding layer presents only its last ``window - 1`` entries plus the chunk to
attention (as transformers' DynamicSlidingWindowLayer), yet keeps every entry for the
decoding loop. The token-level equality with ``model.generate`` is in
test_greedy_equivalence.py (test_chunked_prefill_matches_generate)."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicSlidingWindowLayer

import refdec.decoding as decoding
from refdec.cache import GrowingLayer, new_cache, set_prefill_window
from tiny_models import repetitive_prompts, tiny_gemma3


@pytest.mark.parametrize("chunk", [1, 3, 7, 12])
def test_windowed_growing_layer_presents_what_the_sliding_layer_presents(chunk):
    window = 8
    ours, theirs = GrowingLayer(), DynamicSlidingWindowLayer(sliding_window=window)
    ours.prefill_window = window
    torch.manual_seed(0)
    stored = []
    for step in range(6):
        k, v = torch.randn(1, 2, chunk, 4), torch.randn(1, 2, chunk, 4)
        assert ours.get_mask_sizes(chunk) == theirs.get_mask_sizes(chunk), step
        ours_k, ours_v = ours.update(k, v)
        theirs_k, theirs_v = theirs.update(k, v)
        assert torch.equal(ours_k, theirs_k) and torch.equal(ours_v, theirs_v), step
        stored.append(k)
    # ... and every entry is kept: with the window off, the layer is the whole history
    ours.prefill_window = None
    assert not ours.is_sliding and torch.equal(ours.keys, torch.cat(stored, dim=-2))
    assert ours.get_mask_sizes(1) == (6 * chunk + 1, 0)


def test_set_prefill_window_validates_and_skips_missing_layers():
    cache = new_cache()
    set_prefill_window(cache, [0, 5], 8)  # no layer exists yet: nothing to set
    with pytest.raises(ValueError, match="window"):
        set_prefill_window(cache, [0], 0)


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

    monkeypatch.setattr(decoding, "set_prefill_window", spy)
    decoder = decoding.SpeculativeDecoder(model, prefill_chunk=5)
    prompt = repetitive_prompts(1, seed=13)[0]
    decoder.generate(prompt, max_new_tokens=8, eos_token_id=[], max_draft_tokens=4)
    n_chunks = -(-len(prompt) // 5)
    assert calls == [(sliding, 8)] * (n_chunks - 1) + [(sliding, None)]
    cache = caches[-1]
    assert all(layer.prefill_window is None for layer in cache.layers)  # off for the decoding loop
