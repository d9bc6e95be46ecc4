"""Chunked prefill of sliding-window layers: while a prompt is prefilled in chunks, a
Gemma 3 sliding layer presents only its last ``window - 1`` entries plus the chunk to
attention (as transformers' DynamicSlidingWindowLayer), yet keeps every entry for the
decoding loop. The token-level equality with ``model.generate`` is in
test_greedy_equivalence.py (test_chunked_prefill_matches_generate)."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicSlidingWindowLayer

import refdec
import refdec.decode.runner
from refdec.decode.cache import GrowingLayer, new_cache, set_prefill_window
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

    monkeypatch.setattr(refdec.decode.runner, "set_prefill_window", spy)
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

    monkeypatch.setattr(refdec.decode.runner, "set_prefill_window", spy)
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
