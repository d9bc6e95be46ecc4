"""Greedy speculative decoding is token-identical to ``model.generate(do_sample=False)``.

Tiny float64 models of four families; 20 repetitive prompts each (so drafts are
partly accepted); several draft-tree shapes and budgets; 40 new tokens, which
takes Gemma 3's sequences well past its sliding window of 8.
"""

from __future__ import annotations

import pytest
import torch

import refdec
from refdec.decode.prefill import prefill_spans
from refdec.index import CorpusIndex
from tiny_models import lookup_factory, repetitive_prompts

NEW_TOKENS = 40
N_PROMPTS = 20

# (max_draft_tokens, proposer): "cxx" = refdec.proposer.Proposer (the C++ core), else a shape of the
# pure-Python stand-in (tests/tiny_models.py) that makes chains, two-branch and four-branch trees
CONFIGS = [(0, "cxx"), (1, "cxx"), (4, "cxx"), (16, "cxx"), (64, "cxx"), ("auto", "cxx"),
           (4, "tree"), (16, "wide"), (64, "chain")]


def factory(kind):
    return None if kind == "cxx" else lookup_factory(kind)

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
        decoder = refdec.SpeculativeDecoder(model, proposer_factory=factory(shape))
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
        out = refdec.generate(model, prompt, max_new_tokens=NEW_TOKENS, eos_token_id=eos, max_draft_tokens=16)
        assert out.sequences[0].tolist() == want
        stopped_early += len(want) < len(prompt) + NEW_TOKENS
    assert stopped_early == len(prompts)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7])
def test_greedy_short_generations_match(family_model, max_new_tokens):
    name, model = family_model
    for prompt in repetitive_prompts(3, seed=2):
        want = hf_greedy(model, prompt, max_new_tokens=max_new_tokens)
        out = refdec.generate(model, prompt, max_new_tokens=max_new_tokens, eos_token_id=[], max_draft_tokens=64)
        assert out.sequences[0].tolist() == want


@pytest.mark.parametrize("kind", ["cxx", "tree"])
def test_references_holding_the_continuation_are_accepted_in_long_runs(family_model, kind):
    """A reference that contains the true greedy continuation (a few tokens corrupted) gives long
    accepted runs from the reference source; the output is still exactly generate's."""
    name, model = family_model
    for prompt in repetitive_prompts(4, seed=8):
        want = hf_greedy(model, prompt)
        reference = want[len(prompt) - 3:]  # the last prompt tokens, then the continuation
        for j in range(15, len(reference), 16):
            reference[j] = (reference[j] + 1) % 96
        out = refdec.generate(model, prompt, references=[reference], max_new_tokens=NEW_TOKENS, eos_token_id=[],
                                max_draft_tokens=64, proposer_factory=factory(kind))
        assert out.sequences[0].tolist() == want
        assert out.stats.tokens_per_pass > 2.0
        assert out.stats.accepted_by_source.get("reference", 0) > 10
        assert out.stats.proposed_tokens > out.stats.accepted_tokens


def test_text_references_are_tokenized_with_the_tokenizer(family_model, tiny_tokenizer):
    name, model = family_model
    prompt = repetitive_prompts(1, seed=9)[0]
    want = hf_greedy(model, prompt)
    text = tiny_tokenizer.decode(want[len(prompt) - 3:])
    out = refdec.generate(model, prompt, tokenizer=tiny_tokenizer, references=[text], max_new_tokens=NEW_TOKENS,
                            eos_token_id=[], max_draft_tokens=64)
    assert out.sequences[0].tolist() == want
    assert out.stats.accepted_by_source.get("reference", 0) > 10


def test_drafts_from_a_corpus_index_built_from_token_lists(family_model):
    """A CorpusIndex over (corrupted) greedy outputs of some prompts drives drafts for them."""
    name, model = family_model
    prompts = repetitive_prompts(6, seed=13)
    documents = []
    for prompt in prompts[:4]:
        doc = hf_greedy(model, prompt)[len(prompt) - 4:]
        for j in range(11, len(doc), 13):
            doc[j] = (doc[j] + 7) % 96
        documents.append(doc)
    index = CorpusIndex.build(documents, vocab_size=96, show_progress=False)
    decoder = refdec.SpeculativeDecoder(model, index=index)
    from_corpus = 0
    for prompt in prompts:
        out = decoder.generate(prompt, max_new_tokens=NEW_TOKENS, eos_token_id=[], max_draft_tokens=32)
        assert out.sequences[0].tolist() == hf_greedy(model, prompt)
        from_corpus += out.stats.accepted_by_source.get("corpus", 0)
    assert from_corpus > 20


def test_prefill_spans_cover_the_prompt_in_order():
    assert prefill_spans(10, None) == [(0, 10)]
    assert prefill_spans(10, 10) == [(0, 10)]
    assert prefill_spans(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert prefill_spans(3, 1) == [(0, 1), (1, 2), (2, 3)]


@pytest.mark.parametrize("chunk", [1, 5, 16])
def test_chunked_prefill_matches_generate(family_model, chunk):
    """Prompts prefilled in chunks (across Gemma 3's sliding window of 8 with chunk 5) give
    generate's tokens, and the prefill really ran ceil(prompt / chunk) forwards."""
    name, model = family_model
    forwards = []
    hook = model.get_input_embeddings().register_forward_hook(lambda module, args, out: forwards.append(1))
    try:
        decoder = refdec.SpeculativeDecoder(model, prefill_chunk=chunk)
        for prompt in repetitive_prompts(4, seed=13):
            assert len(prompt) > chunk
            forwards.clear()
            out = decoder.generate(prompt, max_new_tokens=NEW_TOKENS, eos_token_id=[], max_draft_tokens=16)
            prefill_forwards = len(forwards) - (out.stats.forward_passes - 1)  # stats count the prefill once
            assert out.sequences[0].tolist() == hf_greedy(model, prompt), (name, chunk, prompt)
            assert prefill_forwards == -(-len(prompt) // chunk), (name, chunk, len(prompt))
    finally:
        hook.remove()


@pytest.mark.parametrize("bad", [0, -3, 2.5, "1024", True])
def test_prefill_chunk_must_be_a_positive_int_or_none(bad):
    from tiny_models import tiny_llama

    with pytest.raises(ValueError, match="prefill_chunk"):
        refdec.SpeculativeDecoder(tiny_llama(), prefill_chunk=bad)
