"""Specifies refdec.engine.processors: ``PathLogitsProcessor`` gives the scores transformers' own
processors give (repetition penalty, n-gram bans, bad words, suppressions, min length, forced eos,
length penalty, sequence bias), and in the engine each verified tree row is processed with the
sequence on its path: greedy equals model.generate with the same settings, drafts or not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    ExponentialDecayLengthPenalty, ForcedEOSTokenLogitsProcessor, MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor, NoBadWordsLogitsProcessor, NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor, SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor)

import refdec
from refdec.drafting.tree import DraftTree
from refdec.engine.processors import PathLogitsProcessor, banned_ngram_tokens, path_tokens
from tiny_models import hf_greedy, repetitive_prompts, tiers, tiny_gemma3, tiny_llama

NEW = 40


def hf_processed(logits_row, sequence, penalty, ngram, prompt_len=0, eos=(), **more):
    """transformers' order and dtype: the step's logits cast to float32, then the processors."""
    scores = logits_row.to(torch.float32).unsqueeze(0)
    ids = torch.tensor([sequence], dtype=torch.long)
    if more.get("sequence_bias"):
        scores = SequenceBiasLogitsProcessor(more["sequence_bias"])(ids, scores)
    if penalty is not None:
        scores = RepetitionPenaltyLogitsProcessor(penalty)(ids, scores)
    if ngram is not None:
        scores = NoRepeatNGramLogitsProcessor(ngram)(ids, scores)
    if more.get("bad_words_ids"):
        scores = NoBadWordsLogitsProcessor(more["bad_words_ids"], list(eos) or None)(ids, scores)
    if more.get("min_length") and eos:
        scores = MinLengthLogitsProcessor(more["min_length"], list(eos))(ids, scores)
    if more.get("min_new_tokens") and eos:
        scores = MinNewTokensLengthLogitsProcessor(prompt_len, more["min_new_tokens"], list(eos))(ids, scores)
    if more.get("forced_eos_token_id") is not None:
        scores = ForcedEOSTokenLogitsProcessor(prompt_len + more["max_new_tokens"], more["forced_eos_token_id"])(ids,
                                                                                                                scores)
    if more.get("exponential_decay_length_penalty") and eos:
        scores = ExponentialDecayLengthPenalty(more["exponential_decay_length_penalty"], list(eos), prompt_len)(ids,
                                                                                                              scores)
    if more.get("suppress_tokens"):
        scores = SuppressTokensLogitsProcessor(more["suppress_tokens"])(ids, scores)
    if more.get("begin_suppress_tokens"):
        scores = SuppressTokensAtBeginLogitsProcessor(more["begin_suppress_tokens"], prompt_len)(ids, scores)
    return scores[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("penalty, ngram", [(1.3, None), (0.7, None), (None, 1), (None, 2), (None, 3), (1.2, 2)])
def test_path_processor_equals_transformers_processors(dtype, penalty, ngram):
    rng = np.random.default_rng(7)
    processor = PathLogitsProcessor(repetition_penalty=penalty, no_repeat_ngram_size=ngram)
    for trial in range(60):
        vocab = 40
        sequence = rng.integers(0, 8 if trial % 2 else vocab, size=int(rng.integers(0, 30))).tolist()
        logits = torch.from_numpy(rng.normal(0, 4, size=vocab)).to(dtype)
        if trial % 7 == 0:
            logits[3] = -float("inf")
        got = processor(logits, sequence, 0)
        want = hf_processed(logits, sequence, penalty, ngram)
        assert got.dtype == torch.float32
        assert torch.equal(got, want), (sequence, penalty, ngram)
        assert int(got.argmax()) == int(want.argmax())


def test_banned_ngrams_and_path_tokens():
    assert banned_ngram_tokens([5, 6, 7, 5, 6], 3) == {7}
    assert banned_ngram_tokens([5, 6], 1) == {5, 6}
    assert banned_ngram_tokens([5], 3) == set()  # shorter than n - 1: nothing to complete
    tree = DraftTree(np.array([10, 11, 12, 13], dtype=np.int32), np.array([-1, 0, 0, 2], dtype=np.int32),
                     np.ones(4, dtype=np.float32), np.zeros(4, dtype=np.int32), ("context",))
    assert path_tokens(tree, 0) == []  # the root row
    assert path_tokens(tree, 4) == [10, 12, 13]  # row 4 = node 3, under node 2 under node 0


def test_bad_processor_settings_are_value_errors():
    with pytest.raises(ValueError, match="repetition_penalty must be a finite number > 0 or None, got 0"):
        PathLogitsProcessor(repetition_penalty=0)
    with pytest.raises(ValueError, match="no_repeat_ngram_size must be an int >= 0 or None, got 2.5"):
        PathLogitsProcessor(no_repeat_ngram_size=2.5)
    assert not PathLogitsProcessor(repetition_penalty=1.0, no_repeat_ngram_size=0).active
    assert not PathLogitsProcessor(min_new_tokens=5).active  # no eos: nothing to ban (as transformers)
    assert not PathLogitsProcessor(bad_words_ids=[[2]], eos=[2]).active  # an eos bad word is dropped
    with pytest.raises(ValueError, match="bad_words_ids must be a list of non-empty lists"):
        PathLogitsProcessor(bad_words_ids=[[]])
    with pytest.raises(ValueError, match="suppress_tokens must be a list of token ids"):
        PathLogitsProcessor(suppress_tokens=[-1])
    for bad in ({(1,): "x"}, {(1,): float("nan")}, [[[1], 1.0, 2]], {(): 1.0}, [[[1, -2], 1.0]], "x"):
        with pytest.raises(ValueError, match="sequence_bias"):
            PathLogitsProcessor(sequence_bias=bad)
    with pytest.raises(ValueError, match="sequence_bias names a token sequence twice"):
        PathLogitsProcessor(sequence_bias=[[[1], 1.0], [[1], 2.0]])
    with pytest.raises(ValueError, match=r"bad_words_ids holds token id 99, outside the model vocabulary \[0, 50\)"):
        PathLogitsProcessor(bad_words_ids=[[1, 99]]).check_vocab(50)


@pytest.mark.parametrize("more", [dict(suppress_tokens=[3, 7]), dict(begin_suppress_tokens=[1, 5]),
                                  dict(bad_words_ids=[[5], [6, 7], [1, 2, 3], [2]]), dict(min_length=12),
                                  dict(min_new_tokens=4), dict(bad_words_ids=[[4, 4]], min_new_tokens=3, penalty=1.2),
                                  dict(sequence_bias={(3,): 2.5, (4, 3): 1.1, (5, 4, 3): -0.7, (6, 4, 3): 0.3,
                                                      (1, 2): 7.0, (7, 7, 7, 2): -3.3}, penalty=1.4),
                                  dict(sequence_bias=[[[5, 5], 0.1], [[5], -9.0], [[1, 5, 5], 0.2]]),
                                  dict(forced_eos_token_id=[2, 6], max_new_tokens=3, suppress_tokens=[6]),
                                  dict(forced_eos_token_id=4, max_new_tokens=1, min_new_tokens=5),
                                  dict(exponential_decay_length_penalty=(1, 1.7), penalty=1.2),
                                  dict(exponential_decay_length_penalty=(0, 0.5), forced_eos_token_id=2,
                                       max_new_tokens=4)])
def test_bans_equal_transformers_processors(more):
    rng = np.random.default_rng(11)
    more = dict(more)
    penalty = more.pop("penalty", None)
    eos = (2,)
    processor = PathLogitsProcessor(repetition_penalty=penalty, eos=eos, **more)
    assert processor.active
    for trial in range(200):
        sequence = rng.integers(0, 8, size=int(rng.integers(1, 20))).tolist()
        prompt_len = int(rng.integers(1, len(sequence) + 1))
        logits = torch.from_numpy(rng.normal(0, 4, size=16)).to(torch.float32)
        got = processor(logits, sequence, prompt_len)
        want = hf_processed(logits, sequence, penalty, None, prompt_len=prompt_len, eos=eos, **more)
        assert torch.equal(got, want), (sequence, prompt_len, more)


# fast: a ban on a path's n-gram, a length penalty from a start position; the others in the full
# tier (each processor is also checked against transformers' above)
@pytest.mark.parametrize("kind", [pytest.param(kind, marks=pytest.mark.full) if full else kind for kind, full in [
    ("suppress_tokens", True), ("begin_suppress_tokens", True), ("bad_words_ids", False), ("min_new_tokens", True),
    ("min_length", True), ("forced_eos_token_id", True), ("exponential_decay_length_penalty", False)]])
def test_token_bans_in_the_generation_config_apply_per_tree_path_like_model_generate(kind):
    """suppress_tokens, begin_suppress_tokens, bad_words_ids, min_new_tokens, min_length,
    forced_eos_token_id (the last new token) and exponential_decay_length_penalty (eos raised
    after a start): greedy equals model.generate with drafts that run into the changed choices,
    single and batched."""
    model = tiny_llama()
    prompts = repetitive_prompts(3, seed=43)
    changed = 0
    for prompt in prompts:
        plain = hf_greedy(model, prompt, max_new_tokens=NEW, eos_token_id=None)
        new = plain[len(prompt):]
        eos = new[6]  # a token the model writes early: an eos to hold off
        if kind == "forced_eos_token_id":  # decode to the last new token, which the setting forces
            eos = next(t for t in range(3, 96) if t not in new)
        value = {"suppress_tokens": [new[2], new[9]], "begin_suppress_tokens": [new[0]],
                 "bad_words_ids": [[new[3], new[4]], [new[10]]], "min_new_tokens": 15,
                 "min_length": len(prompt) + 15, "forced_eos_token_id": [new[-1] + 1 if new[-1] + 1 < 96 else 3],
                 "exponential_decay_length_penalty": (2, 1.8)}[kind]
        setattr(model.generation_config, kind, value)
        want = hf_greedy(model, prompt, max_new_tokens=NEW, eos_token_id=eos)
        setattr(model.generation_config, kind, None)
        changed += want != hf_greedy(model, prompt, max_new_tokens=NEW, eos_token_id=eos)
        setattr(model.generation_config, kind, value)
        for budget in (0, 16, 64):
            out = refdec.generate(model, prompt, references=[plain[len(prompt) - 3:]], max_new_tokens=NEW,
                                  eos_token_id=eos, max_draft_tokens=budget)
            assert out.sequences[0].tolist() == want, (kind, budget)
        rows = refdec.generate(model, [prompt, prompts[0]], references=[plain[len(prompt) - 3:]],
                               max_new_tokens=NEW, eos_token_id=eos, max_draft_tokens=16, max_batch_size=1)
        assert rows.stats.rows[0].new_tokens == len(want) - len(prompt)
        assert rows.sequences[0, :len(want)].tolist() == want
        setattr(model.generation_config, kind, None)
    assert changed >= 2


REPETITION_SETTINGS = [dict(repetition_penalty=1.8), dict(repetition_penalty=0.6), dict(no_repeat_ngram_size=2),
                       dict(no_repeat_ngram_size=3), dict(repetition_penalty=1.3, no_repeat_ngram_size=4)]


# full: every setting on Llama and Gemma 3 (seconds each; the paths' processors against transformers' in
# the fast tier: test_path_processor_equals_transformers_processors)
@pytest.mark.parametrize("family, setting", tiers(
    [(family, setting) for family in ("llama", "gemma3") for setting in REPETITION_SETTINGS], fast=[]))
def test_repetition_penalty_and_no_repeat_ngram_apply_per_tree_path_like_model_generate(family, setting):
    """Each verified row's logits are processed with the sequence on its path (context + draft
    tokens to it): greedy equals model.generate with the same generation_config, drafts or not,
    lazy head or full logits; sampling equals refdec's plain sampler with the same seed; batch
    rows equal the same prompts decoded alone."""
    model = (tiny_llama if family == "llama" else tiny_gemma3)()
    for key, value in setting.items():
        setattr(model.generation_config, key, value)
    decoder = refdec.SpeculativeDecoder(model)
    full = refdec.SpeculativeDecoder(model)
    full.lazy_head = False
    changed, wants, plains = 0, [], []
    for prompt in repetitive_prompts(3, seed=41):
        want = hf_greedy(model, prompt, max_new_tokens=NEW, eos_token_id=None)
        for key in setting:
            setattr(model.generation_config, key, None)
        changed += want != hf_greedy(model, prompt, max_new_tokens=NEW, eos_token_id=None)
        for key, value in setting.items():
            setattr(model.generation_config, key, value)
        reference = want[len(prompt) - 3:]  # drafts that run into the processed choices
        for dec in (decoder, full):
            for budget in (0, 16, 64):
                out = dec.generate(prompt, references=[reference, prompt[1:]], max_new_tokens=NEW, eos_token_id=[],
                                   max_draft_tokens=budget)
                assert out.sequences[0].tolist() == want, (dec.backend.lazy_head, budget)
        plain = decoder.generate(prompt, max_new_tokens=NEW, eos_token_id=[], do_sample=True, temperature=0.8,
                                 seed=5, max_draft_tokens=0)
        spec = decoder.generate(prompt, references=[prompt[1:]], max_new_tokens=NEW, eos_token_id=[],
                                do_sample=True, temperature=0.8, seed=5, max_draft_tokens=32)
        assert spec.sequences.tolist() == plain.sequences.tolist()
        wants.append(want)
        plains.append(plain.sequences[0].tolist())
    assert changed >= 2  # the setting does change model.generate's tokens on these prompts
    # batches: each row as decoded alone (its own sequence, not the padded batch's), greedy and
    # sampling, all rows at once or joining as others finish, lazy head or full logits
    prompts = repetitive_prompts(3, seed=41)
    for dec in (decoder, full):
        for max_batch_size in (None, 2):
            out = dec.generate(prompts, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=16,
                               max_batch_size=max_batch_size, references=[prompts[0][1:]])
            assert [row[row != 0].tolist() for row in out.sequences] == [[t for t in w if t != 0] for w in wants]
            out = dec.generate(prompts, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=16, do_sample=True,
                               temperature=0.8, seed=[5, 5, 5], max_batch_size=max_batch_size)
            assert [row[row != 0].tolist() for row in out.sequences] == [[t for t in p if t != 0] for p in plains]


def test_forced_eos_tokens_all_suppressed_are_refused_as_generation_config_validate_refuses_them(llama):
    with pytest.raises(ValueError, match=r"every token of forced_eos_token_id \[2\] is also in suppress_tokens"):
        refdec.generate(llama, [1, 5, 6, 7, 5, 6], max_new_tokens=4, forced_eos_token_id=2, suppress_tokens=[2])
