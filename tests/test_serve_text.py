"""Specifies refdec.serve.text.TextStream: the concatenated deltas are the final text, cut before
the first stop string; no delta ends with the beginning of a stop string or inside a character."""

from __future__ import annotations

import pytest

from refdec.serve.text import TextStream
from tiny_models import byte_tokenizer, char_tokenizer


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def deltas(stream: TextStream, token_ids: list[int], step: int = 1) -> list[str]:
    out = [stream.push(token_ids[i:i + step]) for i in range(0, len(token_ids), step)]
    return out + [stream.finish()]


@pytest.mark.parametrize("step", [1, 2, 5])
def test_a_stop_string_across_tokens_is_cut_and_never_shown_in_part(step):
    tok = char_tokenizer()
    stream = TextStream(tok, ["END", "xyz"], skip_ids={2})
    parts = deltas(stream, ids(tok, "abc EN de ENDfg"), step)
    assert "".join(parts) == stream.text == "abc EN de "
    shown = ""
    for part in parts[:-1]:  # before the end: what is shown never ends with the beginning of a stop string
        shown += part
        assert not shown.endswith(("E", "EN", "x", "xy")), shown
    assert stream.stopped and stream.push(ids(tok, "more")) == "" and stream.finish() == ""


def test_a_held_back_prefix_is_shown_once_the_text_shows_it_is_no_stop():
    tok = char_tokenizer()
    stream = TextStream(tok, ["END"], skip_ids=set())
    assert stream.push(ids(tok, "aE")) == "a"
    assert stream.push(ids(tok, "N")) == ""
    assert stream.push(ids(tok, "x")) == "ENx"
    assert stream.push(ids(tok, "EN")) == "" and stream.finish() == "EN"
    assert stream.text == "aENxEN"


def test_eos_and_special_tokens_are_not_shown():
    tok = char_tokenizer()
    stream = TextStream(tok, [], skip_ids={tok.eos_token_id})
    assert "".join(deltas(stream, ids(tok, "hi") + [tok.eos_token_id])) == "hi"


def test_an_incomplete_character_waits_for_its_last_byte():
    tok = byte_tokenizer()
    token_ids = ids(tok, "aé€b")
    stream = TextStream(tok, [], skip_ids=set())
    parts = deltas(stream, token_ids)
    assert "".join(parts) == "aé€b" and all("\ufffd" not in part for part in parts)


def test_a_character_never_completed_is_shown_at_the_end_as_the_decoder_shows_it():
    tok = byte_tokenizer()
    cut = ids(tok, "aé")[:-1]  # "a" and the first byte of "é"
    stream = TextStream(tok, [], skip_ids=set())
    assert stream.push(cut) == "a" and stream.finish() == "\ufffd"
