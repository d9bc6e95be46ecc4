"""Greedy speculative decoding is token-identical to ``model.generate(do_sample=False)``.

Tiny float64 models of four families; 20 repetitive prompts each (so drafts are
partly accepted); several draft-tree shapes and budgets; 40 new tokens, which
takes Gemma 3's sequences well past its sliding window of 8.
"""

from __future__ import annotations

import pytest
import torch

import refdec.decoding as decoding
from tiny_models import lookup_factory, repetitive_prompts

NEW_TOKENS = 40
N_PROMPTS = 20

# (max_draft_tokens, stand-in tree shape)
CONFIGS = [(0, "chain"), (1, "chain"), (4, "tree"), (16, "wide"), (64, "tree"), (64, "chain"), ("auto", "wide")]

_reference_cache: dict = {}


def hf_greedy(model, prompt, max_new_tokens=NEW_TOKENS, eos_token_id=None):
    key = (id(model), tuple(prompt), max_new_tokens, eos_token_id)
    if key not in _reference_cache:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new_tokens,
                                 eos_token_id=eos_token_id, pad_token_id=0, attention_mask=None)
        _reference_cache[key] = out[0].tolist()
    return _reference_cache[key]


def test_greedy_matches_generate_for_all_prompts_and_tree_shapes(family_model):
    name, model = family_model
    prompts = repetitive_prompts(N_PROMPTS, seed=11)
    accepted = rejected = 0
    for max_draft, shape in CONFIGS:
        decoder = decoding.SpeculativeDecoder(model, proposer_factory=lookup_factory(shape))
        for prompt in prompts:
            want = hf_greedy(model, prompt)
            out = decoder.generate(prompt, max_new_tokens=NEW_TOKENS, eos_token_id=[],
                                   max_draft_tokens=max_draft)
            assert out.sequences[0].tolist() == want, (name, max_draft, shape, prompt)
            assert out.stats.new_tokens == NEW_TOKENS
            if max_draft == 0:
                assert out.stats.forward_passes == NEW_TOKENS and out.stats.proposed_tokens == 0
            accepted += out.stats.accepted_tokens
            rejected += out.stats.proposed_tokens - out.stats.accepted_tokens
    # the comparison is not vacuous: drafts were both accepted and rejected
    assert accepted > 50 and rejected > 50, (accepted, rejected)


def test_greedy_matches_generate_with_eos_inside_a_run(family_model):
    """With an eos id the output stops exactly where generate stops (eos included)."""
    name, model = family_model
    prompts = repetitive_prompts(6, seed=5)
    stopped_early = 0
    for prompt in prompts:
        free = hf_greedy(model, prompt)
        eos = free[len(prompt) + 12]  # a token the model really emits
        want = hf_greedy(model, prompt, eos_token_id=eos)
        out = decoding.generate(model, prompt, max_new_tokens=NEW_TOKENS, eos_token_id=eos, max_draft_tokens=16,
                                proposer_factory=lookup_factory("tree"))
        assert out.sequences[0].tolist() == want
        stopped_early += len(want) < len(prompt) + NEW_TOKENS
    assert stopped_early == len(prompts)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7])
def test_greedy_short_generations_match(family_model, max_new_tokens):
    name, model = family_model
    for prompt in repetitive_prompts(3, seed=2):
        want = hf_greedy(model, prompt, max_new_tokens=max_new_tokens)
        out = decoding.generate(model, prompt, max_new_tokens=max_new_tokens, eos_token_id=[], max_draft_tokens=64,
                                proposer_factory=lookup_factory("chain"))
        assert out.sequences[0].tolist() == want


def test_references_holding_the_continuation_are_accepted_in_long_runs(family_model):
    """A reference that contains the true greedy continuation gives long accepted runs, same tokens."""
    name, model = family_model
    for prompt in repetitive_prompts(4, seed=8):
        want = hf_greedy(model, prompt)
        reference = want[len(prompt) - 3:]  # the last prompt tokens, then the continuation
        out = decoding.generate(model, prompt, references=[reference], max_new_tokens=NEW_TOKENS, eos_token_id=[],
                                max_draft_tokens=64, proposer_factory=lookup_factory("tree"))
        assert out.sequences[0].tolist() == want
        assert out.stats.tokens_per_pass > 2.0
        assert out.stats.accepted_by_source.get("references", 0) > 0 or \
            out.stats.accepted_by_source.get("context", 0) > 0
