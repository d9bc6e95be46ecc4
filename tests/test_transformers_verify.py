"""Specifies refdec.transformers.verify: the target tokens of a verification step do not depend on how
the logits are computed -- with the lazy head (the backbone on every row, the head on the rows the
walks visit) a single prompt or a batch gets the tokens of the model's full forward, greedy and
sampled, with fewer head rows; with the full head, rows sampled with top-p on the device get the
tokens the walks on the host draw."""

from __future__ import annotations

import numpy as np
import pytest

import refdec
import refdec.engine.sampling as sampling
import tiny_models
from tiny_models import batch_row, tiers

NEW = 30
# every family, greedy and sampled (fast: Llama each way)
CASES = [(family, do_sample) for family in tiny_models.FAMILIES for do_sample in (False, True)]


@pytest.mark.parametrize("family, do_sample", tiers(CASES, fast=[("llama", True), ("llama", False)]))
def test_decoder_output_is_the_same_with_and_without_the_lazy_head(tiny_model_cache, family, do_sample):
    model = tiny_models.cached_model(tiny_model_cache, family)
    decoder = refdec.SpeculativeDecoder(model)
    assert decoder.backend.lazy_head  # CPU + a plain head
    prompts = tiny_models.repetitive_prompts(8, seed=21)
    lazy_rows = full_rows = accepted = 0
    kwargs = dict(max_new_tokens=30, eos_token_id=[], max_draft_tokens=16, do_sample=do_sample, seed=7)
    for prompt in prompts:
        decoder.backend.lazy_head = False
        plain = decoder.generate(prompt, **kwargs).sequences[0].tolist()
        # a reference holding the output (one token corrupted) makes long drafts to accept and reject
        reference = plain[len(prompt) - 2:]
        reference[12] = (reference[12] + 1) % tiny_models.VOCAB
        outs = []
        for lazy in (True, False):
            decoder.backend.lazy_head = lazy
            out = decoder.generate(prompt, references=[reference], **kwargs)
            outs.append(out.sequences[0].tolist())
            if lazy:
                lazy_rows += out.stats.head_rows
                accepted += out.stats.accepted_tokens
            else:
                full_rows += out.stats.head_rows
        assert outs[0] == outs[1] == plain, (family, prompt)
    assert accepted > 20
    # the lazy head ran on fewer rows than the whole trees (a chunk of 4 per visited run)
    assert lazy_rows < full_rows, (lazy_rows, full_rows)


def corrupted_references(decoder, prompts, kwargs, corrupt_at=(7, 19)):
    """Per row, a reference holding that row's own output with tokens corrupted: long drafts accepted up to a
    corrupted token, then rejected."""
    refs = []
    for b, prompt in enumerate(prompts):
        out = decoder.generate(prompt, max_draft_tokens=0, **{**kwargs, "seed": kwargs["seed"] + b})
        cont = out.sequences[0].tolist()[len(prompt) - 2:]
        for j in corrupt_at:
            cont[j] = (cont[j] + 1) % tiny_models.VOCAB
        refs.append([cont])
    return refs


@pytest.mark.parametrize("family, do_sample", tiers(CASES, fast=[("llama", False), ("llama", True)]))
def test_batched_lazy_head_equals_the_full_head_and_single_rows(tiny_model_cache, family, do_sample):
    model = tiny_models.cached_model(tiny_model_cache, family)
    decoder = refdec.SpeculativeDecoder(model)
    assert decoder.backend.lazy_head  # CPU + a plain head
    rng = np.random.default_rng(5)
    prompts = tiny_models.repetitive_prompts(4, seed=23)
    prompts.insert(1, [1] + rng.integers(3, 96, size=9).tolist())  # no reference: drafts from the prompt only
    kwargs = dict(max_new_tokens=NEW, eos_token_id=[], do_sample=do_sample, seed=7, temperature=0.8)
    refs = corrupted_references(decoder, prompts, kwargs)
    refs[1] = None
    singles = [decoder.generate(p, references=refs[b], max_draft_tokens=12, **{**kwargs, "seed": 7 + b})
               .sequences[0].tolist() for b, p in enumerate(prompts)]
    outs = {}
    for lazy in (True, False):
        decoder.backend.lazy_head = lazy
        outs[lazy] = decoder.generate(prompts, references=refs, max_draft_tokens=12, **kwargs)
    decoder.backend.lazy_head = True
    for b, p in enumerate(prompts):
        assert batch_row(outs[True], b, len(p)) == batch_row(outs[False], b, len(p)) == singles[b], (family, b)
    lazy_rows, full_rows = outs[True].stats.rows, outs[False].stats.rows
    assert sum(r.accepted_tokens for r in lazy_rows) > 30
    assert sum(r.proposed_tokens - r.accepted_tokens for r in lazy_rows) > 10
    assert [r.accepted_tokens for r in lazy_rows] == [r.accepted_tokens for r in full_rows]
    # the head ran on fewer rows than the whole padded trees, for the batch and for every row
    assert outs[True].stats.head_rows == sum(r.head_rows for r in lazy_rows)
    assert outs[True].stats.head_rows < outs[False].stats.head_rows
    assert all(lz.head_rows < full.head_rows for lz, full in zip(lazy_rows, full_rows))
    # the head's time counts as forward time, not accept time: test_engine_engine.py (a fake clock)


TOP_P_SETTINGS = [dict(temperature=1.3, top_p=0.9), dict(temperature=0.9, top_k=30, top_p=0.8, min_p=0.02)]


@pytest.mark.parametrize("family, candidates", tiers([(family, candidates) for family in tiny_models.FAMILIES
                                                       for candidates in (1024, 8)],
                                                      fast=[("llama", 8)]))
def test_top_p_sampling_on_the_device_gives_the_host_walks_tokens(monkeypatch, tiny_model_cache, family, candidates):
    """Top-p sampling with the full head (every tree row drawn on the device, refdec.transformers.verify.
    device_choice) gives the tokens of the lazy head (the walks on the host drawing one row at a
    time), for a batch and a single prompt, several seeds, top-k and min-p with it or not; with 8
    candidates top-p keeps more than them and ranks the whole row."""
    monkeypatch.setattr(sampling, "_TOP_P_CANDIDATES", candidates)
    most_kept, device_rows = [0], [0]
    real_kept_mask = sampling.kept_mask

    def recording_kept_mask(scores, *args, **kwargs):
        mask = real_kept_mask(scores, *args, **kwargs)
        if not kwargs.get("read_rows"):  # the device's draw of many rows
            device_rows[0] += scores.shape[0]
            most_kept[0] = max(most_kept[0], int(mask.sum(dim=-1).max()))
        return mask

    monkeypatch.setattr(sampling, "kept_mask", recording_kept_mask)
    model = tiny_models.cached_model(tiny_model_cache, family)
    decoder = refdec.SpeculativeDecoder(model)
    prompts = tiny_models.repetitive_prompts(4, seed=31)
    accepted = rejected = 0
    for setting in TOP_P_SETTINGS:
        for seed in (3, 11):
            kwargs = dict(max_new_tokens=NEW, eos_token_id=[], do_sample=True, seed=seed, **setting)
            refs = corrupted_references(decoder, prompts, kwargs)
            outs = {}
            for lazy in (True, False):
                decoder.backend.lazy_head = lazy
                outs[lazy] = [decoder.generate(prompts, references=refs, max_draft_tokens=12, **kwargs),
                              decoder.generate(prompts[0], references=refs[0], max_draft_tokens=12, **kwargs)]
            decoder.backend.lazy_head = True
            for b, p in enumerate(prompts):
                assert batch_row(outs[True][0], b, len(p)) == batch_row(outs[False][0], b, len(p)), (setting, seed, b)
            assert outs[True][1].sequences.tolist() == outs[False][1].sequences.tolist(), (setting, seed)
            accepted += outs[False][0].stats.accepted_tokens
            rejected += outs[False][0].stats.proposed_tokens - outs[False][0].stats.accepted_tokens
    assert accepted > 40 and rejected > 10, (accepted, rejected)
    assert device_rows[0] > 200  # the full head's rows were drawn on the device
    assert most_kept[0] > candidates or candidates > tiny_models.VOCAB


def test_batched_lazy_head_runs_no_full_forward(monkeypatch):
    """With the lazy head the model's own forward (the head on every row) never runs."""
    model = tiny_models.tiny_llama()
    decoder = refdec.SpeculativeDecoder(model)
    monkeypatch.setattr(decoder.backend.runner, "logits", lambda *a, **k: pytest.fail("the full forward ran"))
    prompts = tiny_models.repetitive_prompts(3, seed=2)
    out = decoder.generate(prompts, max_new_tokens=12, eos_token_id=[], max_draft_tokens=8)
    assert out.stats.new_tokens == 36
    # the head ran on at least one row per batch row and verification step (the walk's first row)
    assert out.stats.head_rows >= sum(r.forward_passes - 1 for r in out.stats.rows) > 0


@pytest.mark.parametrize("chunk, settings", [(4, {}), pytest.param(16, {}, marks=pytest.mark.full),
                                             (4, {"repetition_penalty": 1.3})], ids=["greedy-4", "greedy-16", "logits-settings"])
def test_greedy_with_the_full_head_never_holds_more_than_a_chunk_of_logits(monkeypatch, llama, chunk, settings):
    """Greedy with the full head (a GPU's path) runs the head ``head_chunk_rows`` rows at a time and
    keeps their argmax: no verification step makes logits for all ``B * T`` rows at once. With logits
    settings (the walks on the host) the head runs on the rows the walks visit, a few per walk a round."""
    from refdec.transformers.plain_head import PlainHead

    decoder = refdec.SpeculativeDecoder(llama)
    decoder.backend.lazy_head = False
    decoder.backend.runner.head_chunk_rows = chunk
    shapes = []
    real_logits = PlainHead.logits

    def recording_logits(self, hidden):
        out = real_logits(self, hidden)
        shapes.append(tuple(out.shape))
        return out

    monkeypatch.setattr(PlainHead, "logits", recording_logits)
    hook = llama.get_output_embeddings().register_forward_hook(lambda m, i, out: shapes.append(tuple(out.shape)))
    prompts = tiny_models.repetitive_prompts(8, seed=2)
    try:
        out = decoder.generate(prompts, max_new_tokens=16, eos_token_id=[], max_draft_tokens=16, **settings)
    finally:
        hook.remove()
    for b, p in enumerate(prompts):
        assert batch_row(out, b, len(p)) == tiny_models.hf_greedy(llama, p, max_new_tokens=16, **settings)
    rows = [int(np.prod(shape[:-1])) for shape in shapes]
    assert shapes and all(shape[-1] == tiny_models.VOCAB for shape in shapes)
    assert max(rows) <= max(chunk, len(prompts))  # the prefill: one row per prompt
    assert out.stats.head_rows > 8 * chunk  # the trees had many more rows than a chunk
