"""Specifies refdec.serve.protocol: OpenAI's request bodies as the server reads them, and the
settings it refuses (400 naming the field) rather than ignoring."""

from __future__ import annotations

import pytest

pytest.importorskip("pydantic")

from pydantic import ValidationError  # noqa: E402

from refdec.serve.protocol import (ApiError, ChatCompletionRequest, CompletionRequest,  # noqa: E402
                                   api_error_from_validation)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_prediction_in_both_forms_gives_its_text():
    string = ChatCompletionRequest.model_validate({**CHAT, "prediction": {"type": "content", "content": "ab"}})
    parts = ChatCompletionRequest.model_validate({**CHAT, "prediction": {"type": "content", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}})
    assert string.prediction == parts.prediction == "ab"  # the text, read by refdec.prediction


def test_defaults_and_the_length_rule():
    body = ChatCompletionRequest.model_validate(CHAT)
    assert (body.temperature, body.top_p, body.n, body.stream, body.token_limit) == (1.0, 1.0, 1, False, None)
    assert ChatCompletionRequest.model_validate({**CHAT, "max_tokens": 7}).token_limit == 7
    both = ChatCompletionRequest.model_validate({**CHAT, "max_tokens": 7, "max_completion_tokens": 7})
    both.refuse_unsupported()
    assert both.token_limit == 7
    disagree = ChatCompletionRequest.model_validate({**CHAT, "max_tokens": 7, "max_completion_tokens": 8})
    with pytest.raises(ApiError, match="disagree") as raised:
        disagree.refuse_unsupported()
    assert raised.value.status == 400 and raised.value.param == "max_completion_tokens"


def test_a_string_stop_becomes_a_list_and_bad_stops_are_refused():
    assert ChatCompletionRequest.model_validate({**CHAT, "stop": "x"}).stop == ["x"]
    for stop in ([], ["a", "b", "c", "d", "e"], [""]):
        with pytest.raises(ValidationError) as raised:
            ChatCompletionRequest.model_validate({**CHAT, "stop": stop})
        error = api_error_from_validation(raised.value)
        assert error.status == 400 and error.param == "stop"


@pytest.mark.parametrize("field, value", [("n", 2), ("logprobs", True), ("frequency_penalty", 0.5),
                                          ("presence_penalty", -0.5), ("tools", [{"type": "function"}]),
                                          ("top_logprobs", 2)])
def test_settings_the_server_does_not_honour_are_refused_by_name(field, value):
    body = ChatCompletionRequest.model_validate({**CHAT, field: value})
    with pytest.raises(ApiError) as raised:
        body.refuse_unsupported()
    assert raised.value.status == 400 and raised.value.param == field
    assert set(raised.value.body()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("field, value", [("suffix", "x"), ("echo", True), ("best_of", 2), ("prompt", ["a", "b"]),
                                          ("prompt", [])])
def test_completion_settings_the_server_does_not_honour(field, value):
    body = CompletionRequest.model_validate({"model": "m", "prompt": "x", field: value})
    with pytest.raises(ApiError) as raised:
        body.refuse_unsupported()
    assert raised.value.param == field


def test_a_prompt_of_token_ids_stays_ids_and_messages_render_as_text():
    assert CompletionRequest.model_validate({"model": "m", "prompt": [1, 2, 3]}).prompt == [1, 2, 3]
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
        {"role": "user", "content": "hi", "name": "ann"}]})
    assert [m.for_template() for m in body.messages] == [{"role": "system", "content": "be brief"},
                                                         {"role": "user", "content": "hi", "name": "ann"}]


def test_out_of_range_sampling_is_a_400_naming_the_field():
    for field, value in (("temperature", 2.5), ("top_p", 0), ("max_tokens", 0), ("n", 0)):
        with pytest.raises(ValidationError) as raised:
            ChatCompletionRequest.model_validate({**CHAT, field: value})
        assert api_error_from_validation(raised.value).param == field
