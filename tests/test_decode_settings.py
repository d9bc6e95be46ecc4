"""Specifies refdec.decode.settings: the logits settings of ``model.generate`` (from the model's
generation_config or as arguments) are applied where refdec can apply them per tree path and
refused, naming them, where it cannot; sampling arguments greedy decoding does not read warn."""

from __future__ import annotations

import numpy as np
import pytest

import refdec
from tiny_models import hf_greedy, repetitive_prompts, tiny_gpt2, tiny_llama

NEW = 40


@pytest.mark.parametrize("field", ["guidance_scale"])
def test_a_logits_setting_in_the_generation_config_is_an_error_naming_it(field):
    """model.generate(do_sample=False) applies these to the logits; refdec does not, so it refuses
    rather than return other tokens, whether the model's generation_config or an argument sets
    it. Reset to None (or passed as None), refdec equals model.generate again."""
    model = tiny_llama()
    prompt = [1, 5, 6, 7, 5, 6]
    plain = hf_greedy(model, prompt, max_new_tokens=12, eos_token_id=None)
    first = plain[len(prompt)]
    value = {"guidance_scale": 3.0}[field]  # classifier-free guidance: a second, unconditional forward
    setattr(model.generation_config, field, value)
    assert hf_greedy(model, prompt, max_new_tokens=12, eos_token_id=None) != plain  # the setting changes the tokens
    with pytest.raises(ValueError, match=rf"model.generation_config sets {field}=.*generation_config.{field} = None"):
        refdec.generate(model, prompt, max_new_tokens=12, eos_token_id=[])
    with pytest.raises(ValueError, match=field):  # batches too
        refdec.generate(model, [prompt, prompt[:4]], max_new_tokens=12, eos_token_id=[])
    kwargs = {field: None}  # an argument overrides the config, as in model.generate
    assert refdec.generate(model, prompt, max_new_tokens=12, eos_token_id=[], **kwargs).sequences[0].tolist() == plain
    setattr(model.generation_config, field, None)
    assert refdec.generate(model, prompt, max_new_tokens=12, eos_token_id=[]).sequences[0].tolist() == plain
    with pytest.raises(ValueError, match=rf"argument {field}=.*drop the argument {field}"):
        refdec.generate(model, prompt, max_new_tokens=12, eos_token_id=[], **{field: value})


def test_logits_settings_as_arguments_override_the_generation_config_like_model_generate():
    """repetition_penalty=..., sequence_bias=... etc. as generate's keyword arguments: the same tokens as
    model.generate with the same arguments, over the model's generation_config, single and batched;
    a misspelt one is a TypeError naming it."""
    model = tiny_llama()
    prompts = repetitive_prompts(3, seed=45)
    model.generation_config.repetition_penalty = 1.5
    decoder = refdec.SpeculativeDecoder(model)
    changed = 0
    for prompt in prompts:
        plain = hf_greedy(model, prompt, max_new_tokens=NEW, eos_token_id=None, repetition_penalty=1.0)
        new = plain[len(prompt):]
        # the bias raises a token after the model's own bigram and sinks one of its choices
        bias = {(new[4], new[5] + 1 if new[5] + 1 < 96 else 3): 30.0, (new[8],): -50.0, (new[1], new[2]): -0.5}
        for settings in (dict(repetition_penalty=1.0, sequence_bias=bias), dict(repetition_penalty=None),
                         dict(sequence_bias=[[list(k), v] for k, v in bias.items()], no_repeat_ngram_size=3),
                         dict(repetition_penalty=0.7, sequence_bias=bias)):
            hf_settings = {k: (1.0 if k == "repetition_penalty" and v is None else v) for k, v in settings.items()}
            want = hf_greedy(model, prompt, max_new_tokens=NEW, eos_token_id=None, **hf_settings)
            changed += want != plain
            for budget in (0, 16, 64):
                out = decoder.generate(prompt, references=[plain[len(prompt) - 3:]], max_new_tokens=NEW,
                                       eos_token_id=[], max_draft_tokens=budget, **settings)
                assert out.sequences[0].tolist() == want, (settings, budget)
            rows = decoder.generate([prompt, prompts[0]], references=[plain[len(prompt) - 3:]], max_new_tokens=NEW,
                                    eos_token_id=[], max_draft_tokens=16, max_batch_size=1, **settings)
            assert rows.sequences[0, -len(want):].tolist() == want, settings  # left-padded, no eos: NEW tokens each
    assert changed >= 6
    # the generation_config's own sequence_bias applies too
    model.generation_config.repetition_penalty = None
    model.generation_config.sequence_bias = {(prompts[0][-1],): -100.0}
    want = hf_greedy(model, prompts[0], max_new_tokens=NEW, eos_token_id=None)
    assert refdec.generate(model, prompts[0], max_new_tokens=NEW, eos_token_id=[],
                           max_draft_tokens=32).sequences[0].tolist() == want
    with pytest.raises(TypeError, match="unexpected keyword argument.*'repetition_penalti'"):
        refdec.generate(model, prompts[0], max_new_tokens=4, repetition_penalti=1.2)
    with pytest.raises(ValueError, match="sequence_bias holds token id 500, outside the model vocabulary"):
        refdec.generate(model, prompts[0], max_new_tokens=4, sequence_bias={(500,): 1.0})
    with pytest.raises(ValueError, match="sequence_bias entries must pair a non-empty list of token ids"):
        refdec.generate(model, [prompts[0], prompts[1]], max_new_tokens=4, sequence_bias={(): 1.0})


def test_no_op_values_in_the_generation_config_are_accepted():
    prompt = [1, 5, 6, 7]
    model = tiny_llama()
    for field, value in [("repetition_penalty", 1.0), ("no_repeat_ngram_size", 0), ("min_length", 0),
                         ("min_new_tokens", 0), ("suppress_tokens", []), ("guidance_scale", 1.0)]:
        setattr(model.generation_config, field, value)
    assert refdec.generate(model, prompt, max_new_tokens=5, eos_token_id=[]).sequences[0].tolist() == \
        hf_greedy(model, prompt, max_new_tokens=5, eos_token_id=None)


def test_min_new_tokens_overrides_min_length_as_in_model_generate():
    """model.generate sets min_length = prompt length + min_new_tokens whenever min_new_tokens is
    set, 0 included: with both in the generation_config, eos was banned until min_length."""
    model = tiny_gpt2()
    prompt = [78]
    plain = hf_greedy(model, prompt, max_new_tokens=24, eos_token_id=None)
    eos = plain[15]  # a token the model writes as its 15th new token: an eos inside min_length=17
    for min_new_tokens in (5, 0, None):
        model.generation_config.min_new_tokens = min_new_tokens
        model.generation_config.min_length = 17
        want = hf_greedy(model, prompt, max_new_tokens=24, eos_token_id=eos)
        for budget in (0, 16):
            got = refdec.generate(model, prompt, max_new_tokens=24, eos_token_id=eos, max_draft_tokens=budget,
                                  references=[plain[1:]])
            assert got.sequences[0].tolist() == want, (min_new_tokens, budget)
        assert (len(want) < 17) == (min_new_tokens is not None)  # the case at stake: min_length not applied


def test_logits_settings_given_as_numpy_arrays_apply_as_in_model_generate(llama):
    """Settings given as numpy arrays, as model.generate takes them."""
    prompt = [1, 5, 6, 7, 5, 6]
    plain = hf_greedy(llama, prompt, max_new_tokens=8, eos_token_id=None)
    for settings in (dict(suppress_tokens=np.array([plain[len(prompt) + 2]])),
                     dict(forced_eos_token_id=np.array([3, 4])),
                     dict(exponential_decay_length_penalty=np.array([1, 2.0]))):
        eos = plain[len(prompt) + 5]
        want = hf_greedy(llama, prompt, max_new_tokens=8, eos_token_id=eos, **settings)
        got = refdec.generate(llama, prompt, max_new_tokens=8, eos_token_id=eos, references=[plain[3:]],
                              max_draft_tokens=8, **settings)
        assert got.sequences[0].tolist() == want, settings


def test_greedy_decoding_warns_about_sampling_arguments_it_does_not_read(llama):
    with pytest.warns(UserWarning, match=r"do_sample=False \(greedy decoding\), so temperature=0.5, seed=3 has no"):
        refdec.generate(llama, [1, 5, 6], max_new_tokens=2, temperature=0.5, seed=3)


def test_an_index_built_with_another_tokenizer_is_refused(llama, tiny_tokenizer):
    """Its drafts would be ids that mean other text; with the index's own tokenizer it is accepted."""
    from refdec.index import CorpusIndex
    from tiny_models import byte_tokenizer

    index = CorpusIndex.build(["abc abc abd"], tokenizer=byte_tokenizer(), show_progress=False)
    message = (r"index was built with another tokenizer \(fingerprint [0-9a-f]{12}\.\.\., the tokenizer given has "
               r"[0-9a-f]{12}\.\.\.\): its drafts would be other text")
    with pytest.raises(ValueError, match=message):
        refdec.generate(llama, [1, 5, 6], tokenizer=tiny_tokenizer, index=index, max_new_tokens=2)
    with pytest.raises(ValueError, match=message):
        refdec.SpeculativeDecoder(llama, tokenizer=tiny_tokenizer, index=index).generate([1, 5, 6], max_new_tokens=2)
    own = CorpusIndex.build(["abc abc abd"], tokenizer=tiny_tokenizer, show_progress=False)
    assert refdec.generate(llama, [1, 5, 6], tokenizer=tiny_tokenizer, index=own, max_new_tokens=2,
                           eos_token_id=[]).stats.new_tokens == 2
