"""Stops inside accepted runs (eos, stop strings, max_new_tokens), streaming, argument validation."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import TextIteratorStreamer
from transformers.generation.streamers import BaseStreamer

import refdec
from refdec.decode.stops import StopChecker
from tiny_models import byte_tokenizer, repetitive_prompts, tiny_gemma3, tiny_llama

NEW = 40


class RecordingStreamer(BaseStreamer):
    def __init__(self):
        self.puts: list[list[int]] = []
        self.first_shape = None
        self.ended = 0

    def put(self, value):
        if self.first_shape is None:
            self.first_shape = tuple(value.shape)
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ended += 1


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


def hf(model, prompt, **kw):
    with torch.no_grad():
        return model.generate(torch.tensor([prompt]), do_sample=False, pad_token_id=0, **kw)[0].tolist()


def continuation_reference(model, prompt):
    """The greedy continuation (with the prompt's last tokens), so drafts are accepted in long runs."""
    full = hf(model, prompt, max_new_tokens=NEW, eos_token_id=None)
    return full, full[len(prompt) - 3:]


def test_eos_inside_an_accepted_run_stops_there_and_streams_nothing_after(llama):
    for prompt in repetitive_prompts(5, seed=31):
        full, ref = continuation_reference(llama, prompt)
        eos = full[len(prompt) + 9]
        want = hf(llama, prompt, max_new_tokens=NEW, eos_token_id=eos)
        streamer = RecordingStreamer()
        out = refdec.generate(llama, prompt, references=[ref], max_new_tokens=NEW, eos_token_id=eos,
                              max_draft_tokens=64, streamer=streamer)
        assert out.sequences[0].tolist() == want
        assert want[-1] == eos and out.stats.stop_reason == "eos"
        # the draft held tokens past the eos: the run was cut inside a pass
        assert out.stats.forward_passes < out.stats.new_tokens
        assert streamer.puts[0] == prompt and sum(streamer.puts[1:], []) == want[len(prompt):]
        assert streamer.ended == 1


def test_eos_default_comes_from_generation_config(llama):
    prompt = repetitive_prompts(1, seed=31)[0]
    full, ref = continuation_reference(llama, prompt)
    eos = full[len(prompt) + 5]
    old = llama.generation_config.eos_token_id
    try:
        llama.generation_config.eos_token_id = [95, eos]
        out = refdec.generate(llama, prompt, references=[ref], max_new_tokens=NEW, max_draft_tokens=64)
    finally:
        llama.generation_config.eos_token_id = old
    assert out.sequences[0, -1].item() == eos and out.stats.new_tokens <= 6


@pytest.mark.parametrize("max_new_tokens", [1, 3, 7, 12])
def test_max_new_tokens_cuts_an_accepted_run(llama, max_new_tokens):
    prompt = repetitive_prompts(1, seed=32)[0]
    full, ref = continuation_reference(llama, prompt)
    streamer = RecordingStreamer()
    out = refdec.generate(llama, prompt, references=[ref], max_new_tokens=max_new_tokens, eos_token_id=[],
                          max_draft_tokens=64, streamer=streamer)
    assert out.sequences[0].tolist() == full[: len(prompt) + max_new_tokens]
    assert out.stats.new_tokens == max_new_tokens and out.stats.stop_reason == "max_new_tokens"
    assert sum(streamer.puts[1:], []) == full[len(prompt): len(prompt) + max_new_tokens]
    assert out.stats.forward_passes <= 2


def test_stop_strings_match_transformers_stop_string_criteria(tiny_tokenizer):
    """Stop strings completed inside an accepted run stop exactly where model.generate stops."""
    for model in (tiny_llama(), tiny_gemma3()):
        checked = 0
        for prompt in repetitive_prompts(6, seed=33):
            full = hf(model, prompt, max_new_tokens=NEW, eos_token_id=None)
            new = full[len(prompt):]
            for start, length in [(8, 2), (15, 3), (4, 1)]:
                stop = tiny_tokenizer.decode(new[start:start + length])
                if not stop.strip():
                    continue
                want = hf(model, prompt, max_new_tokens=NEW, eos_token_id=None, stop_strings=[stop, "never-there"],
                          tokenizer=tiny_tokenizer)
                streamer = RecordingStreamer()
                out = refdec.generate(model, prompt, tokenizer=tiny_tokenizer, references=[full[len(prompt) - 3:]],
                                      stop_strings=[stop, "never-there"], max_new_tokens=NEW, eos_token_id=[],
                                      max_draft_tokens=64, streamer=streamer)
                assert out.sequences[0].tolist() == want, (stop, new)
                assert sum(streamer.puts[1:], []) == want[len(prompt):]
                assert out.stats.stop_reason == ("stop_string" if len(want) < len(full) else "max_new_tokens")
                checked += len(want) < len(full)
        assert checked >= 6


def test_stop_string_split_across_tokens_and_overhanging_the_last_token(tiny_tokenizer):
    """The token that completes the stop string is emitted, even with extra text after the stop."""
    checker = StopChecker(set(), ["xyz"], tiny_tokenizer)
    ids = tiny_tokenizer("ab xyzw", add_special_tokens=False)["input_ids"]
    keep, reason = checker.cut(ids, len(ids))
    assert reason == "stop_string" and tiny_tokenizer.decode(ids[:keep]) == "ab xyz"
    # a stop string sitting wholly in the prompt does not stop the generation
    keep, reason = checker.cut(ids, 1)
    assert reason == "" and keep == 1


def test_a_stop_string_in_the_prompt_does_not_stop_when_a_token_completes_a_utf8_character(llama):
    """Byte-level tokenizers: the token completing "é" turns the tail's "\ufffd" into "é", so the
    tail's text with and without it differ before the final token. Only occurrences past their
    common prefix overlap the final token; "ab" at the prompt's end does not (it used to stop
    here, where model.generate goes on)."""
    tok = byte_tokenizer({62: 0xC3, 44: 0xA9, 40: ord("a"), 50: ord("b")})  # 62 44 = the bytes of "é"
    prompt = [1, 10, 20, 30, 40, 50]  # text ending with "ab"
    checker = StopChecker(set(), ["ab"], tok)
    assert tok.decode([62, 44]) == "é" and tok.decode(prompt[1:]).endswith("ab")
    assert checker.cut(prompt + [62, 44, 40], 3) == (3, "")
    assert checker.cut(prompt + [62, 44, 40, 50], 4) == (4, "stop_string")  # a new "ab" does stop
    assert StopChecker(set(), ["é"], tok).cut(prompt + [62, 44, 40], 3) == (2, "stop_string")
    # end to end, against transformers' StopStringCriteria (the tiny Llama writes 62 44 first)
    want = hf(llama, prompt, max_new_tokens=8, eos_token_id=None, stop_strings=["ab"], tokenizer=tok)
    out = refdec.generate(llama, prompt, tokenizer=tok, stop_strings=["ab"], max_new_tokens=8, eos_token_id=[],
                          max_draft_tokens=0)
    assert want[len(prompt):len(prompt) + 2] == [62, 44]
    assert out.sequences[0].tolist() == want


def test_stop_strings_with_a_sentencepiece_byte_fallback_tokenizer():
    """SentencePiece byte fallback (Llama-2, Mistral, Gemma) decodes a run of byte tokens that is
    not valid UTF-8 as one "\ufffd" per byte: a window starting inside a character hid a stop
    string completed at its end, and a final byte completing a character made the whole run,
    prompt included, look new."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in ["\u2581", "a", "b", "ab", "x"]:
        vocab[piece] = len(vocab)
    model = models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True)
    tok = Tokenizer(model)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")

    def byte_tokens(text):
        return [vocab[f"<0x{b:02X}>"] for b in text.encode()]

    emoji = "\U0001F600"
    # "中" + emoji: 7 byte tokens; the 6-token window for a 1-character stop starts inside "中"
    out = byte_tokens("中" + emoji)
    assert StopChecker(set(), [emoji], tok).cut([vocab["a"]] + out, len(out)) == (7, "stop_string")
    # "éé" only in the prompt; the output "€x" must not stop on it
    prompt, out = [vocab["ab"]] + byte_tokens("éé"), byte_tokens("€") + [vocab["x"]]
    assert tok.decode(prompt + out) == "abéé€x"
    assert StopChecker(set(), ["éé"], tok).cut(prompt + out, len(out)) == (4, "")
    assert StopChecker(set(), ["é€"], tok).cut(prompt + out, len(out)) == (3, "stop_string")


def test_text_iterator_streamer_yields_the_returned_text(llama, tiny_tokenizer):
    prompt = repetitive_prompts(1, seed=34)[0]
    streamer = TextIteratorStreamer(tiny_tokenizer, skip_prompt=True)
    out = refdec.generate(llama, prompt, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=16, streamer=streamer)
    text = "".join(streamer)
    assert text == tiny_tokenizer.decode(out.sequences[0, len(prompt):])


def test_streamer_gets_the_prompt_as_a_batch_first_then_runs(llama):
    prompt = repetitive_prompts(1, seed=35)[0]
    streamer = RecordingStreamer()
    out = refdec.generate(llama, prompt, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=16, streamer=streamer)
    assert streamer.first_shape == (1, len(prompt))
    assert sum(streamer.puts, []) == out.sequences[0].tolist()
    assert len(streamer.puts) - 1 == out.stats.forward_passes  # one put per pass (accepted run + bonus)


def test_max_new_tokens_zero_returns_the_prompt(llama):
    streamer = RecordingStreamer()
    out = refdec.generate(llama, torch.tensor([[1, 5, 6]]), max_new_tokens=0, streamer=streamer)
    assert out.sequences.tolist() == [[1, 5, 6]] and out.stats.new_tokens == 0
    assert streamer.puts == [[1, 5, 6]] and streamer.ended == 1


@pytest.mark.parametrize("input_ids", [[1, 5, 6, 7], torch.tensor([1, 5, 6, 7]), torch.tensor([[1, 5, 6, 7]])])
def test_input_ids_forms_are_equivalent(llama, input_ids):
    out = refdec.generate(llama, input_ids, max_new_tokens=5, eos_token_id=[], max_draft_tokens=4)
    assert out.sequences.shape == (1, 9) and out.sequences.dtype == torch.long
    assert out.sequences[0, :4].tolist() == [1, 5, 6, 7]


def test_speculative_decoder_is_reusable_and_matches_one_shot_generate(llama):
    decoder = refdec.SpeculativeDecoder(llama)
    for prompt in repetitive_prompts(3, seed=36):
        a = decoder.generate(prompt, max_new_tokens=20, eos_token_id=[])
        b = refdec.generate(llama, prompt, max_new_tokens=20, eos_token_id=[])
        assert a.sequences.tolist() == b.sequences.tolist()


BAD_ARGUMENTS = [
    (dict(max_new_tokens=-1), r"max_new_tokens must be an int >= 0, got -1"),
    (dict(max_new_tokens=2.5), r"max_new_tokens .* got 2.5"),
    (dict(max_draft_tokens=-3), r"max_draft_tokens must be >= 0, got -3"),
    (dict(max_draft_tokens="many"), r"max_draft_tokens must be an int >= 0 or 'auto', got 'many'"),
    (dict(max_draft_tokens=1.5), r"max_draft_tokens .* got 1.5"),
    (dict(do_sample=True, temperature=0.0), r"temperature must be > 0 when do_sample=True, got 0.0"),
    (dict(do_sample=True, temperature=-1), r"temperature must be > 0 .* got -1"),
    (dict(do_sample="yes"), r"do_sample must be True or False, got 'yes'"),
    (dict(top_p=0.0), r"top_p must be None or a number in \(0, 1\], got 0.0"),
    (dict(top_p=1.5), r"top_p .* got 1.5"),
    (dict(top_k=0), r"top_k must be None or an int >= 1, got 0"),
    (dict(min_p=1.5), r"min_p must be None or a number in \[0, 1\], got 1.5"),
    (dict(min_p="0.1"), r"min_p .* got '0.1'"),
    (dict(seed=-2), r"seed must be None or an int >= 0, got -2"),
    (dict(eos_token_id="x"), r"eos_token_id must be .* got 'x'"),
    (dict(stop_strings=["stop"]), r"stop_strings needs a tokenizer"),
    (dict(stop_strings=[""]), r"stop_strings must be"),
    (dict(references=["some text"]), r"references\[0\] is a str; text references need tokenizer"),
    (dict(references="text"), r"references must be a list"),
    (dict(streamer=object()), r"streamer must have put\(\) and end\(\)"),
    (dict(index="corpus.idx"), r"index must be a refdec.CorpusIndex, a refdec.ShardedIndex or None, got str"),
    (dict(attention_mask=torch.tensor([[0, 1, 1]])), r"attention_mask for a single prompt must be all ones"),
    (dict(attention_mask=[1, 1]), r"attention_mask for a single prompt must be all ones of its length 3"),
]


@pytest.mark.parametrize("kwargs, message", BAD_ARGUMENTS, ids=[str(k) for k, _ in BAD_ARGUMENTS])
def test_bad_arguments_raise_value_errors_naming_them(llama, kwargs, message):
    with pytest.raises(ValueError, match=message):
        refdec.generate(llama, [1, 5, 6], **kwargs)


@pytest.mark.parametrize("field", ["guidance_scale"])
def test_a_logits_setting_in_the_generation_config_is_an_error_naming_it(field):
    """model.generate(do_sample=False) applies these to the logits; refdec does not, so it refuses
    rather than return other tokens, whether the model's generation_config or an argument sets
    it. Reset to None (or passed as None), refdec equals model.generate again."""
    model = tiny_llama()
    prompt = [1, 5, 6, 7, 5, 6]
    plain = hf(model, prompt, max_new_tokens=12, eos_token_id=None)
    first = plain[len(prompt)]
    value = {"guidance_scale": 3.0}[field]  # classifier-free guidance: a second, unconditional forward
    setattr(model.generation_config, field, value)
    assert hf(model, prompt, max_new_tokens=12, eos_token_id=None) != plain  # the setting changes the tokens
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
        plain = hf(model, prompt, max_new_tokens=NEW, eos_token_id=None, repetition_penalty=1.0)
        new = plain[len(prompt):]
        # the bias raises a token after the model's own bigram and sinks one of its choices
        bias = {(new[4], new[5] + 1 if new[5] + 1 < 96 else 3): 30.0, (new[8],): -50.0, (new[1], new[2]): -0.5}
        for settings in (dict(repetition_penalty=1.0, sequence_bias=bias), dict(repetition_penalty=None),
                         dict(sequence_bias=[[list(k), v] for k, v in bias.items()], no_repeat_ngram_size=3),
                         dict(repetition_penalty=0.7, sequence_bias=bias)):
            hf_settings = {k: (1.0 if k == "repetition_penalty" and v is None else v) for k, v in settings.items()}
            want = hf(model, prompt, max_new_tokens=NEW, eos_token_id=None, **hf_settings)
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
    want = hf(model, prompts[0], max_new_tokens=NEW, eos_token_id=None)
    assert refdec.generate(model, prompts[0], max_new_tokens=NEW, eos_token_id=[],
                           max_draft_tokens=32).sequences[0].tolist() == want
    with pytest.raises(TypeError, match="unexpected keyword argument.*'repetition_penalti'"):
        refdec.generate(model, prompts[0], max_new_tokens=4, repetition_penalti=1.2)
    with pytest.raises(ValueError, match="sequence_bias holds token id 500, outside the model vocabulary"):
        refdec.generate(model, prompts[0], max_new_tokens=4, sequence_bias={(500,): 1.0})
    with pytest.raises(ValueError, match="sequence_bias entries must pair a non-empty list of token ids"):
        refdec.generate(model, [prompts[0], prompts[1]], max_new_tokens=4, sequence_bias={(): 1.0})


@pytest.mark.parametrize("kind", ["suppress_tokens", "begin_suppress_tokens", "bad_words_ids", "min_new_tokens",
                                  "min_length", "forced_eos_token_id", "exponential_decay_length_penalty"])
def test_token_bans_in_the_generation_config_apply_per_tree_path_like_model_generate(kind):
    """suppress_tokens, begin_suppress_tokens, bad_words_ids, min_new_tokens, min_length,
    forced_eos_token_id (the last new token) and exponential_decay_length_penalty (eos raised
    after a start): greedy equals model.generate with drafts that run into the changed choices,
    single and batched."""
    model = tiny_llama()
    prompts = repetitive_prompts(3, seed=43)
    changed = 0
    for prompt in prompts:
        plain = hf(model, prompt, max_new_tokens=NEW, eos_token_id=None)
        new = plain[len(prompt):]
        eos = new[6]  # a token the model writes early: an eos to hold off
        if kind == "forced_eos_token_id":  # decode to the last new token, which the setting forces
            eos = next(t for t in range(3, 96) if t not in new)
        value = {"suppress_tokens": [new[2], new[9]], "begin_suppress_tokens": [new[0]],
                 "bad_words_ids": [[new[3], new[4]], [new[10]]], "min_new_tokens": 15,
                 "min_length": len(prompt) + 15, "forced_eos_token_id": [new[-1] + 1 if new[-1] + 1 < 96 else 3],
                 "exponential_decay_length_penalty": (2, 1.8)}[kind]
        setattr(model.generation_config, kind, value)
        want = hf(model, prompt, max_new_tokens=NEW, eos_token_id=eos)
        setattr(model.generation_config, kind, None)
        changed += want != hf(model, prompt, max_new_tokens=NEW, eos_token_id=eos)
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


@pytest.mark.parametrize("setting", [dict(repetition_penalty=1.8), dict(repetition_penalty=0.6),
                                     dict(no_repeat_ngram_size=2), dict(no_repeat_ngram_size=3),
                                     dict(repetition_penalty=1.3, no_repeat_ngram_size=4)])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_repetition_penalty_and_no_repeat_ngram_apply_per_tree_path_like_model_generate(setting, family):
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
        want = hf(model, prompt, max_new_tokens=NEW, eos_token_id=None)
        for key in setting:
            setattr(model.generation_config, key, None)
        changed += want != hf(model, prompt, max_new_tokens=NEW, eos_token_id=None)
        for key, value in setting.items():
            setattr(model.generation_config, key, value)
        reference = want[len(prompt) - 3:]  # drafts that run into the processed choices
        for dec in (decoder, full):
            for budget in (0, 16, 64):
                out = dec.generate(prompt, references=[reference, prompt[1:]], max_new_tokens=NEW, eos_token_id=[],
                                   max_draft_tokens=budget)
                assert out.sequences[0].tolist() == want, (dec.lazy_head, budget)
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


def test_no_op_values_in_the_generation_config_are_accepted():
    prompt = [1, 5, 6, 7]
    model = tiny_llama()
    for field, value in [("repetition_penalty", 1.0), ("no_repeat_ngram_size", 0), ("min_length", 0),
                         ("min_new_tokens", 0), ("suppress_tokens", []), ("guidance_scale", 1.0)]:
        setattr(model.generation_config, field, value)
    assert refdec.generate(model, prompt, max_new_tokens=5, eos_token_id=[]).sequences[0].tolist() == \
        hf(model, prompt, max_new_tokens=5, eos_token_id=None)


@pytest.mark.parametrize("input_ids, message", [
    (torch.tensor([[[1, 2], [3, 4]]]), r"input_ids must have shape \[1, L\] or \[L\], got shape \(1, 2, 2\)"),
    ([], r"input_ids is empty"),
    (torch.zeros(1, 0, dtype=torch.long), r"input_ids is empty"),
    (torch.tensor([[1.0, 2.0]]), r"input_ids must hold integer token ids"),
    ([1, "a"], r"input_ids must be a list of ints; found 'a'"),
    ([1, 500], r"token id 500, outside the model vocabulary \[0, 96\)"),
    (list(range(3, 90)) * 6, r"prompt has 522 tokens, more than the model's max_position_embeddings=512"),
])
def test_bad_prompts_raise_clear_errors(llama, input_ids, message):
    with pytest.raises(ValueError, match=message):
        refdec.generate(llama, input_ids, max_new_tokens=3)


def test_generation_stops_at_max_position_embeddings(llama):
    prompt = list(range(3, 90)) * 5 + list(range(3, 80))  # 512 tokens = max_position_embeddings
    out = refdec.generate(llama, prompt, max_new_tokens=10, eos_token_id=[], max_draft_tokens=8)
    assert out.stats.new_tokens == 1 and out.stats.stop_reason == "max_position_embeddings"


@pytest.mark.parametrize("flags, settings", [
    ([], {}),
    (["--repetition-penalty", "0.05", "--no-repeat-ngram-size", "3"],
     dict(repetition_penalty=0.05, no_repeat_ngram_size=3)),
    (["--sample", "--seed", "3", "--min-p", "0.2", "--temperature", "1.5"],
     dict(do_sample=True, seed=3, min_p=0.2, temperature=1.5)),
])
def test_cli_generate_streams_the_text_and_prints_stats(tmp_path, tiny_tokenizer, capsys, flags, settings):
    from refdec.cli.generate import register
    import argparse

    model = tiny_llama()
    model.save_pretrained(tmp_path / "m")
    tiny_tokenizer.save_pretrained(tmp_path / "m")
    ref_file = tmp_path / "ref.txt"
    ref_file.write_text("abc abc abc", encoding="utf-8")
    parser = argparse.ArgumentParser(prog="refdec")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["generate", "--prompt", "abc abc ab", "--model", str(tmp_path / "m"),
                              "--reference", str(ref_file), "--max-new-tokens", "12", "--max-draft-tokens", "8",
                              *flags])
    assert args.handler(args) == 0
    captured = capsys.readouterr()
    loaded = model.to(torch.float32)
    ids = tiny_tokenizer("abc abc ab", add_special_tokens=True)["input_ids"]
    out = refdec.generate(loaded, ids, max_new_tokens=12, max_draft_tokens=0, **settings)
    want = tiny_tokenizer.decode(out.sequences[0, len(ids):], skip_special_tokens=True)
    assert captured.out.rstrip("\n") == want.rstrip("\n")
    if settings:  # the flags reach the decoder: the text differs from plain greedy's
        plain = refdec.generate(loaded, ids, max_new_tokens=12, max_draft_tokens=0)
        assert plain.sequences.tolist() != out.sequences.tolist()
    assert "tokens/pass" in captured.err and "passes" in captured.err


def test_cli_rejects_a_bad_max_draft_tokens():
    from refdec.cli.generate import register
    import argparse

    parser = argparse.ArgumentParser(prog="refdec")
    register(parser.add_subparsers(dest="command", required=True))
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "--prompt", "x", "--max-draft-tokens", "-1"])


def test_cli_generate_prompts_jsonl_writes_each_completion_in_order(tmp_path, tiny_tokenizer, capsys):
    """--prompts-jsonl: every prompt decoded in one batch, 2 rows at a time, one JSON line each,
    in input order, each completion the prompt's plain greedy continuation."""
    import argparse
    import json

    from refdec.cli.generate import register

    model = tiny_llama()
    model.save_pretrained(tmp_path / "m")
    tiny_tokenizer.save_pretrained(tmp_path / "m")
    prompts = ["abc abc ab", "b", "ca ca ca cab", "abc"]
    lines = [json.dumps({"prompt": p}) for p in prompts]
    lines[2] = json.dumps({"prompt": prompts[2], "references": ["ca ca cab cab"]})
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    parser = argparse.ArgumentParser(prog="refdec")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["generate", "--prompts-jsonl", str(tmp_path / "in.jsonl"), "--model",
                              str(tmp_path / "m"), "--max-new-tokens", "10", "--max-batch-size", "2"])
    assert args.handler(args) == 0
    captured = capsys.readouterr()
    rows = [json.loads(x) for x in captured.out.splitlines()]
    loaded = model.to(torch.float32)
    assert [r["line"] for r in rows] == [0, 1, 2, 3]
    for row, text in zip(rows, prompts):
        ids = tiny_tokenizer(text)["input_ids"]
        out = refdec.generate(loaded, ids, max_new_tokens=10, max_draft_tokens=0)
        assert row["completion"] == tiny_tokenizer.decode(out.sequences[0, len(ids):], skip_special_tokens=True)
        assert row["new_tokens"] == out.stats.new_tokens and row["stop_reason"] == out.stats.stop_reason
    assert "4 prompts, at most 2 together" in captured.err

    # each line is written as soon as it and the lines before it are done: a run interrupted
    # while line 2 is written has already written lines 0 and 1
    real_dumps = json.dumps

    def interrupt_at_line_2(obj, *a, **kw):
        if isinstance(obj, dict) and obj.get("line") == 2:
            raise KeyboardInterrupt
        return real_dumps(obj, *a, **kw)

    import refdec.cli.generate as cli_generate

    args = parser.parse_args(["generate", "--prompts-jsonl", str(tmp_path / "in.jsonl"), "--model",
                              str(tmp_path / "m"), "--max-new-tokens", "10", "--max-batch-size", "1"])
    cli_generate.json.dumps, saved = interrupt_at_line_2, cli_generate.json.dumps
    try:
        with pytest.raises(KeyboardInterrupt):
            args.handler(args)
    finally:
        cli_generate.json.dumps = saved
    assert [json.loads(x) for x in capsys.readouterr().out.splitlines()] == rows[:2]


def test_on_row_done_reports_each_row_as_it_finishes(llama):
    """on_row_done(batch_row, new_tokens, row_stats): once per row, as the row finishes (one at a
    time: in order), with exactly the row's new tokens and final stats."""
    prompts = repetitive_prompts(3, seed=47)
    calls = []
    out = refdec.generate(llama, prompts, max_new_tokens=12, max_draft_tokens=8, max_batch_size=1,
                          on_row_done=lambda b, tokens, stats: calls.append((b, list(tokens), stats.new_tokens,
                                                                             stats.stop_reason)))
    assert [c[0] for c in calls] == [0, 1, 2]
    for b, tokens, new_tokens, reason in calls:
        alone = refdec.generate(llama, prompts[b], max_new_tokens=12, max_draft_tokens=8)
        assert tokens == alone.sequences[0, len(prompts[b]):].tolist()
        assert (new_tokens, reason) == (out.stats.rows[b].new_tokens, out.stats.rows[b].stop_reason)
    calls.clear()
    refdec.generate(llama, prompts, max_new_tokens=0, on_row_done=lambda b, t, s: calls.append((b, t)))
    assert sorted(calls) == [(0, []), (1, []), (2, [])]
    with pytest.raises(ValueError, match="on_row_done applies to batches"):
        refdec.generate(llama, prompts[0], max_new_tokens=3, on_row_done=print)
    with pytest.raises(ValueError, match="on_row_done must be callable or None, got int"):
        refdec.generate(llama, prompts, max_new_tokens=3, on_row_done=3)


@pytest.mark.parametrize("content,message", [
    ('{"prompt": "a"}\nnot json\n', r"in.jsonl:2: not a JSON object"),
    ('{"text": "a"}\n', r'in.jsonl:1: expected an object with a "prompt" string'),
    ('{"prompt": "a", "references": "x"}\n', r'in.jsonl:1: "references" must be a list of strings'),
    ('{"prompt": "a", "seed": 3}\n', r"in.jsonl:1: unknown keys \['seed'\]"),
    ("\n\n", r"no prompts"),
])
def test_cli_generate_prompts_jsonl_errors_name_the_line_before_loading_a_model(tmp_path, capsys, content, message):
    from refdec.cli import main

    (tmp_path / "in.jsonl").write_text(content, encoding="utf-8")
    code = main(["generate", "--prompts-jsonl", str(tmp_path / "in.jsonl"), "--model", str(tmp_path / "missing")])
    assert code == 2
    assert re.search(message, capsys.readouterr().err)


def test_cli_generate_max_batch_size_must_be_positive(tmp_path, capsys):
    from refdec.cli import main

    (tmp_path / "in.jsonl").write_text('{"prompt": "a"}\n', encoding="utf-8")
    assert main(["generate", "--prompts-jsonl", str(tmp_path / "in.jsonl"), "--max-batch-size", "0"]) == 2
    assert "--max-batch-size must be >= 1, got 0" in capsys.readouterr().err
    assert main(["generate", "--prompt", "a", "--max-batch-size", "2"]) == 2
    assert "--max-batch-size applies to --prompts-jsonl" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["generate", "edit"])
def test_cli_threads_must_be_positive(tmp_path, capsys, command):
    from refdec.cli import main

    (tmp_path / "f.py").write_text("x = 1\n", encoding="utf-8")
    args = ["--prompt", "a"] if command == "generate" else [str(tmp_path / "f.py"), "--instruction", "x"]
    assert main([command, *args, "--threads", "0"]) == 2
    assert "--threads must be >= 1, got 0" in capsys.readouterr().err


def test_cli_text_files_keep_crlf_and_name_a_non_utf8_file(tmp_path):
    from refdec.cli.common import read_text_file

    (tmp_path / "crlf.py").write_bytes(b"a = 1\r\nb = 2\r\n")
    assert read_text_file(str(tmp_path / "crlf.py")) == "a = 1\r\nb = 2\r\n"  # was converted to LF
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.txt is not UTF-8 text"):
        read_text_file(str(tmp_path / "latin1.txt"))


def test_jsonl_records_holding_unicode_line_separators_are_one_line_each(tmp_path):
    """json.dumps(ensure_ascii=False) writes U+2028 / U+2029 raw inside strings; str.splitlines split
    such a record in two (a valid --prompts-jsonl file was rejected, an index record dropped)."""
    import json

    from refdec.cli.generate import read_prompts_jsonl
    from refdec.cli.index import SourceStats, read_documents

    texts = ["first\u2028line", "second\u2029x\x85y\x0cz", "third"]
    for key in ("prompt", "text"):
        body = "\r\n".join(json.dumps({key: t}, ensure_ascii=False) for t in texts) + "\n"
        (tmp_path / f"{key}.jsonl").write_text(body, encoding="utf-8", newline="")
    assert [r["prompt"] for r in read_prompts_jsonl(str(tmp_path / "prompt.jsonl"))] == texts
    stats = SourceStats()
    assert list(read_documents([tmp_path / "text.jsonl"], "text", stats)) == texts
    assert stats.bad_records == 0


def test_cli_user_mistakes_are_errors_before_any_work_not_tracebacks(tmp_path, capsys):
    from refdec.cli import main

    (tmp_path / "f.py").write_text("x = 1\n", encoding="utf-8")
    # --out in a missing directory / a directory: refused before the model or tokenizer loads
    assert main(["edit", str(tmp_path / "f.py"), "--instruction", "x", "--model", str(tmp_path / "no-model"),
                 "--out", str(tmp_path / "missing" / "new.py")]) == 2
    err = capsys.readouterr().err
    assert "new.py: directory" in err and "does not exist" in err
    assert main(["index", "build", str(tmp_path), "--tokenizer", str(tmp_path / "no-tok"), "--out", str(tmp_path)]) == 2
    assert "is a directory; give a file path" in capsys.readouterr().err
    # an OSError (here: a directory given as the index file) is a message, not a traceback
    assert main(["index", "info", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("refdec: error:")
    # sampling flags without --sample were silently ignored
    assert main(["generate", "--prompt", "a", "--temperature", "0.5", "--seed", "1"]) == 2
    assert "--temperature, --seed need --sample" in capsys.readouterr().err


def test_cli_errors_name_the_flag_the_file_and_show_the_command_usage(tmp_path, capsys):
    """Second round of user mistakes: each is one line naming what was typed, exit status 2."""
    from refdec.cli import main

    (tmp_path / "f.py").write_text("x = 1\n", encoding="utf-8")
    (tmp_path / "d").mkdir()
    cases = [
        (["generate", "--prompt-file", str(tmp_path / "d")], "is a directory, not a file"),
        (["generate", "--prompt", "a", "--sample", "--temperature", "0"], "--temperature must be > 0"),
        (["generate", "--prompt", "a", "--sample", "--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
        (["generate", "--prompt", "a", "--max-new-tokens", "-5"], "--max-new-tokens must be >= 0, got -5"),
        (["generate", "--prompt", "a", "--repetition-penalty", "0"], "--repetition-penalty must be > 0"),
        (["generate", "--prompt", "a", "--stop", ""], "--stop must be a non-empty string"),
        (["generate", "--prompt", "a", "--seed", "3"], "--seed needs --sample"),
        (["generate", "--prompt", "a", "--index", str(tmp_path / "none.refdec")], "--index"),
        (["generate", "--prompt", "a", "--model", str(tmp_path / "d")], "is not a model directory (it has no config.json)"),
        (["generate", "--prompt", "a", "--model", "no-such-model-name"], "refdec does not download"),
        (["edit", str(tmp_path / "f.py"), "--instruction", " "], "--instruction must be a non-empty text"),
        (["edit", str(tmp_path / "f.py"), "--instruction", "x", "--prompt-template", "nosuch"],
         "neither a template name"),
        (["index", "info", str(tmp_path / "d")], "is a directory, not a file"),
        (["index", "build", str(tmp_path / "f.py"), "--out", "/dev/null"], "is not a regular file"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)
    (tmp_path / "tpl.txt").write_text("{original} {instruction.upper}", encoding="utf-8")
    assert main(["edit", str(tmp_path / "f.py"), "--instruction", "x", "--prompt-template",
                 str(tmp_path / "tpl.txt")]) == 2
    assert "template field {instruction.upper} is not one of" in capsys.readouterr().err
    # an unknown flag shows the subcommand's usage; no subcommand shows the help
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--prompt", "a", "--bogus"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: refdec generate") and "unrecognized arguments: --bogus" in err
    assert main(["index"]) == 2 and "{build,info}" in capsys.readouterr().err
    assert main([]) == 2 and "{index,generate,edit}" in capsys.readouterr().err


def test_atomic_write_names_the_target_and_never_replaces_a_special_file(tmp_path):
    import os
    import stat

    from refdec.atomic import atomic_write

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="pipe: it exists and is not a regular file"):
        atomic_write(fifo, [b"x"])
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still the FIFO (a rename would have replaced it)
    with pytest.raises(FileNotFoundError, match=r"cannot write .*missing/i.refdec: No such file") as info:
        atomic_write(tmp_path / "missing" / "i.refdec", [b"x"])
    assert ".tmp-" not in str(info.value)
    link = tmp_path / "link"
    (tmp_path / "target").write_bytes(b"old")
    link.symlink_to(tmp_path / "target")
    atomic_write(link, [b"new"])  # a link to a regular file is replaced, as before
    assert link.read_bytes() == b"new"


def test_greedy_decoding_warns_about_sampling_arguments_it_does_not_read(llama):
    with pytest.warns(UserWarning, match=r"do_sample=False \(greedy decoding\), so temperature=0.5, seed=3 has no"):
        refdec.generate(llama, [1, 5, 6], max_new_tokens=2, temperature=0.5, seed=3)
    with pytest.raises(ValueError, match=r"eos_token_id 1000 is outside the model vocabulary \[0, 96\)"):
        refdec.generate(llama, [1, 5, 6], max_new_tokens=2, eos_token_id=[2, 1000])


def test_min_new_tokens_overrides_min_length_as_in_model_generate():
    """model.generate sets min_length = prompt length + min_new_tokens whenever min_new_tokens is
    set, 0 included: with both in the generation_config, eos was banned until min_length."""
    from tiny_models import tiny_gpt2

    model = tiny_gpt2()
    prompt = [78]
    plain = hf(model, prompt, max_new_tokens=24, eos_token_id=None)
    eos = plain[15]  # a token the model writes as its 15th new token: an eos inside min_length=17
    for min_new_tokens in (5, 0, None):
        model.generation_config.min_new_tokens = min_new_tokens
        model.generation_config.min_length = 17
        want = hf(model, prompt, max_new_tokens=24, eos_token_id=eos)
        for budget in (0, 16):
            got = refdec.generate(model, prompt, max_new_tokens=24, eos_token_id=eos, max_draft_tokens=budget,
                                  references=[plain[1:]])
            assert got.sequences[0].tolist() == want, (min_new_tokens, budget)
        assert (len(want) < 17) == (min_new_tokens is not None)  # the case at stake: min_length not applied


def test_second_fuzz_round_inputs(llama, tmp_path, capsys, tiny_tokenizer):
    """on_row_done with a [1, L] batch and an all-ones mask (a one-string tokenizer batch); settings
    given as numpy arrays, as model.generate takes them; forced_eos_token_id all suppressed is refused
    as GenerationConfig.validate refuses it; an empty --prompts-jsonl prompt names its line."""
    import numpy as np

    prompt = [1, 5, 6, 7, 5, 6]
    calls = []
    out = refdec.generate(llama, torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=5, eos_token_id=[], on_row_done=lambda b, t, s: calls.append((b, list(t))))
    assert calls == [(0, out.sequences[0, len(prompt):].tolist())]
    plain = hf(llama, prompt, max_new_tokens=8, eos_token_id=None)
    for settings in (dict(suppress_tokens=np.array([plain[len(prompt) + 2]])),
                     dict(forced_eos_token_id=np.array([3, 4])),
                     dict(exponential_decay_length_penalty=np.array([1, 2.0]))):
        eos = plain[len(prompt) + 5]
        want = hf(llama, prompt, max_new_tokens=8, eos_token_id=eos, **settings)
        got = refdec.generate(llama, prompt, max_new_tokens=8, eos_token_id=eos, references=[plain[3:]],
                              max_draft_tokens=8, **settings)
        assert got.sequences[0].tolist() == want, settings
    with pytest.raises(ValueError, match=r"every token of forced_eos_token_id \[2\] is also in suppress_tokens"):
        refdec.generate(llama, prompt, max_new_tokens=4, forced_eos_token_id=2, suppress_tokens=[2])
    from refdec.cli import main

    llama.save_pretrained(tmp_path / "m")
    tiny_tokenizer.save_pretrained(tmp_path / "m")
    (tmp_path / "in.jsonl").write_text('{"prompt": "abc"}\n{"prompt": ""}\n', encoding="utf-8")
    assert main(["generate", "--prompts-jsonl", str(tmp_path / "in.jsonl"), "--model", str(tmp_path / "m")]) == 2
    assert "in.jsonl:2: the prompt is empty" in capsys.readouterr().err
