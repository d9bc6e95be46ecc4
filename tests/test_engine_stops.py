"""Specifies refdec.engine.stops (StopChecker) and how a stop ends a run in the engine: an eos id,
max_new_tokens or a stop string reached inside an accepted run stops there, as model.generate
stops; the stopping token is emitted and streamed, nothing after it."""

from __future__ import annotations

import pytest

import refdec
from refdec.engine.stops import StopChecker
from tiny_models import RecordingStreamer, batch_row, byte_tokenizer, cached_model, hf_greedy, repetitive_prompts

NEW = 40


def continuation_reference(model, prompt):
    """The greedy continuation (with the prompt's last tokens), so drafts are accepted in long runs."""
    full = hf_greedy(model, prompt, max_new_tokens=NEW)
    return full, full[len(prompt) - 3:]


def test_eos_inside_an_accepted_run_stops_there_and_streams_nothing_after(llama):
    for prompt in repetitive_prompts(5, seed=31):
        full, ref = continuation_reference(llama, prompt)
        eos = full[len(prompt) + 9]
        want = hf_greedy(llama, prompt, max_new_tokens=NEW, eos_token_id=eos)
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


def test_greedy_matches_generate_with_eos_inside_a_run(family_model):
    """With an eos id the output stops exactly where generate stops (eos included)."""
    name, model = family_model
    prompts = repetitive_prompts(6, seed=5)
    stopped_early = 0
    for prompt in prompts:
        free = hf_greedy(model, prompt)
        eos = free[len(prompt) + 12]  # a token the model really emits
        want = hf_greedy(model, prompt, eos_token_id=eos)
        out = refdec.generate(model, prompt, max_new_tokens=NEW, eos_token_id=eos, max_draft_tokens=16)
        assert out.sequences[0].tolist() == want
        stopped_early += len(want) < len(prompt) + NEW
    assert stopped_early == len(prompts)


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


@pytest.mark.full  # many stop strings, each against transformers' generate (one row's: the tests below)
def test_stop_strings_match_transformers_stop_string_criteria(tiny_tokenizer, tiny_model_cache):
    """Stop strings completed inside an accepted run stop exactly where model.generate stops."""
    for model in (cached_model(tiny_model_cache, "llama"), cached_model(tiny_model_cache, "gemma3")):
        checked = 0
        for prompt in repetitive_prompts(6, seed=33):
            full = hf_greedy(model, prompt, max_new_tokens=NEW, eos_token_id=None)
            new = full[len(prompt):]
            for start, length in [(8, 2), (15, 3), (4, 1)]:
                stop = tiny_tokenizer.decode(new[start:start + length])
                if not stop.strip():
                    continue
                want = hf_greedy(model, prompt, max_new_tokens=NEW, eos_token_id=None,
                                 stop_strings=[stop, "never-there"], tokenizer=tiny_tokenizer)
                streamer = RecordingStreamer()
                out = refdec.generate(model, prompt, tokenizer=tiny_tokenizer, references=[full[len(prompt) - 3:]],
                                      stop_strings=[stop, "never-there"], max_new_tokens=NEW, eos_token_id=[],
                                      max_draft_tokens=64, streamer=streamer)
                assert out.sequences[0].tolist() == want, (stop, new)
                assert sum(streamer.puts[1:], []) == want[len(prompt):]
                assert out.stats.stop_reason == ("stop_string" if len(want) < len(full) else "max_new_tokens")
                checked += len(want) < len(full)
        assert checked >= 6


def test_stop_strings_stop_each_row_where_its_own_run_stops(llama, tiny_tokenizer):
    model = llama
    prompts = repetitive_prompts(4, seed=12)
    texts = [tiny_tokenizer.decode(hf_greedy(model, p)[len(p):]) for p in prompts]
    stop = texts[0][5:7]  # a string row 0 emits; other rows may or may not emit it
    singles = [refdec.generate(model, p, tokenizer=tiny_tokenizer, stop_strings=stop, max_new_tokens=NEW,
                                 eos_token_id=[], max_draft_tokens=16).sequences[0].tolist() for p in prompts]
    out = refdec.generate(model, prompts, tokenizer=tiny_tokenizer, stop_strings=stop, max_new_tokens=NEW,
                          eos_token_id=[], max_draft_tokens=16)
    for b, p in enumerate(prompts):
        assert batch_row(out, b, len(p)) == singles[b]
    assert out.stats.rows[0].stop_reason == "stop_string"


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
    want = hf_greedy(llama, prompt, max_new_tokens=8, eos_token_id=None, stop_strings=["ab"], tokenizer=tok)
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
