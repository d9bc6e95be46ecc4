"""Specifies refdec.transformers.static_step: verification forwards at fixed shapes -- the query rows
padded to buckets, the KV cache static (one buffer of fixed capacity per layer, written at slots a
persistent tensor holds, read whole under a mask) -- give the engine's tokens (greedy as
``model.generate``, sampled and with logits settings as the engine without them, single prompts and
batches whose rows finish and join); each forward sees one of a few shapes and, while the batch
keeps its rows, one cache buffer (what CUDA graphs need; captured only on a GPU: benchmarks/gpu.py)."""

from __future__ import annotations

import pytest
import torch

import refdec
import tiny_models
from refdec.transformers.static_step import QUERY_BUCKETS, StaticStep, query_bucket
from tiny_models import batch_row, tiers

NEW = 40
CASES = [(family, do_sample) for family in tiny_models.FAMILIES for do_sample in (False, True)]


def static_decoder(model) -> refdec.SpeculativeDecoder:
    decoder = refdec.SpeculativeDecoder(model)
    decoder.backend.static_shapes = True
    assert not decoder.backend.lazy_head
    return decoder


def drafting_reference(output: list[int], prompt_len: int) -> list[int]:
    """A reference holding the output with one token changed: long drafts, accepted and rejected."""
    reference = output[prompt_len - 2:]
    reference[12] = (reference[12] + 1) % tiny_models.VOCAB
    return reference


def test_query_rows_are_padded_to_the_smallest_bucket_that_holds_them():
    assert [query_bucket(rows) for rows in (1, 2, 3, 5, 17, 33, 65, 256)] == [2, 2, 4, 8, 24, 48, 96, 256]
    assert query_bucket(257) == 320 and query_bucket(QUERY_BUCKETS[-1] + 64) == 320
    assert all(query_bucket(b) == b for b in QUERY_BUCKETS)


@pytest.mark.parametrize("family, do_sample", tiers(CASES, fast=[("llama", True), ("llama", False)]))
def test_fixed_shape_steps_give_the_engines_tokens(tiny_model_cache, family, do_sample):
    model = tiny_models.cached_model(tiny_model_cache, family)
    static, dynamic = static_decoder(model), refdec.SpeculativeDecoder(model)
    dynamic.lazy_head = False
    kwargs = dict(max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=16, do_sample=do_sample, seed=5)
    for prompt in tiny_models.repetitive_prompts(4, seed=21):
        want = tiny_models.hf_greedy(model, prompt, NEW, eos_token_id=[]) if not do_sample else \
            dynamic.generate(prompt, **kwargs).sequences[0].tolist()
        reference = drafting_reference(want, len(prompt))
        got = static.generate(prompt, references=[reference], **kwargs)
        assert got.sequences[0].tolist() == want
        assert got.stats.tokens_per_pass > 2  # the drafts were verified, not only the root
        assert dynamic.generate(prompt, references=[reference], **kwargs).sequences[0].tolist() == want


def test_a_batch_whose_rows_finish_and_join_gets_each_rows_tokens(batch_family_model):
    _, model = batch_family_model
    decoder = static_decoder(model)
    prompts = tiny_models.mixed_batch()
    out = decoder.generate(prompts, max_new_tokens=24, eos_token_id=[], max_draft_tokens=16, max_batch_size=2)
    for b, prompt in enumerate(prompts):
        want = tiny_models.hf_greedy(model, prompt, 24, eos_token_id=[])
        assert batch_row(out, b, len(prompt)) == want
    assert decoder.backend.runner.static_step.restaticised >= 3  # the first pair, then each row that joined


def test_logits_settings_walk_the_fixed_shape_logits_on_the_host(llama):
    """Logits settings need each path's sequence (the host walks): they read the fixed-shape forward's
    logits, padding rows included, and give the engine's tokens."""
    prompt = tiny_models.repetitive_prompts(1, seed=3)[0]
    kwargs = dict(max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=16, repetition_penalty=1.3)
    want = tiny_models.hf_greedy(llama, prompt, NEW, eos_token_id=[], repetition_penalty=1.3)
    got = static_decoder(llama).generate(prompt, references=[drafting_reference(want, len(prompt))], **kwargs)
    assert got.sequences[0].tolist() == want


def test_each_forward_sees_a_bucket_of_rows_the_caches_whole_capacity_and_one_buffer(llama):
    """Within a decode and across decodes of one prompt at a time (whose cache the step copies into
    the buffers it kept: graphs captured on them stay valid)."""
    decoder = static_decoder(llama)
    seen = []

    def record(module, args, kwargs):
        cache = kwargs["cache"]
        mask = kwargs["attention_mask"]
        if mask is None:  # the prompt's prefill: the model's own causal mask
            return
        seen.append((tuple(kwargs["input_ids"].shape), mask.shape[-1], mask.stride(-2),
                     cache.layers[0]._key_buf.data_ptr(), cache.layers[0]._key_buf.shape[-2]))

    passes = 0
    handle = llama.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        for seed in (8, 9):
            prompt = tiny_models.repetitive_prompts(1, seed=seed)[0]
            want = tiny_models.hf_greedy(llama, prompt, 60, eos_token_id=[])
            out = decoder.generate(prompt, references=[drafting_reference(want, len(prompt))], max_new_tokens=60,
                                   eos_token_id=[], max_draft_tokens=32)
            assert out.sequences[0].tolist() == want
            passes += out.stats.forward_passes - 1  # every pass but the prefill
    finally:
        handle.remove()
    assert len(seen) == passes >= 6
    capacity = seen[0][4]
    assert capacity % 256 == 0 and capacity >= len(prompt) + 60
    for (batch, rows), width, row_stride, buffer, buffer_slots in seen:
        assert batch == 1 and rows in QUERY_BUCKETS
        assert width == buffer_slots == capacity and row_stride % 16 == 0
        assert buffer == seen[0][3]  # the same buffer every step, both decodes
    assert decoder.backend.runner.static_step.restaticised == 2  # each decode's cache copied in once


def test_cuda_graphs_need_a_cuda_device_and_fixed_shapes_exclude_the_lazy_head(llama):
    with pytest.raises(ValueError, match="cuda_graphs=True needs the model on a CUDA device; it is on cpu"):
        refdec.SpeculativeDecoder(llama, cuda_graphs=True)
    with pytest.raises(ValueError, match="cuda_graphs must be True or False, got 1"):
        refdec.SpeculativeDecoder(llama, cuda_graphs=1)
    with pytest.raises(ValueError, match="cuda_graphs=True needs"):
        StaticStep(torch.device("cpu"), refdec.SpeculativeDecoder(llama).backend.runner.mask_spec, cuda_graphs=True)
    decoder = static_decoder(llama)
    with pytest.raises(ValueError, match="lazy_head=True does not go with fixed-shape steps"):
        decoder.backend.lazy_head = True
    decoder.backend.static_shapes = False
    decoder.backend.lazy_head = True
    assert decoder.backend.lazy_head and not decoder.backend.static_shapes
