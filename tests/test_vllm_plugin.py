"""Specifies refdec.vllm.plugin, refdec's ``vllm.general_plugins`` entry point, against stand-ins for
the vLLM classes it hooks (no vLLM needed; tests/test_vllm.py runs it in vLLM's server):
``register`` installs each hook once and goes on without a part whose vLLM module is missing; the
validation hook makes a bad ``refdec_*`` option that request's error naming the key (the server's
reference limit included); a Predicted Outputs ``prediction`` becomes one more of the request's
``refdec_references``; the usage hooks report OpenAI's accepted and rejected prediction tokens from
vLLM's speculative-decoding metrics."""

from __future__ import annotations

import asyncio
import logging
import sys
import types
from types import SimpleNamespace

import pytest

from refdec.vllm import options as vllm_options, plugin


def _module(monkeypatch, name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, name, module)
    return module


@pytest.fixture
def fake_vllm(monkeypatch):
    """Stand-ins for the vLLM modules and classes the plugin imports, in ``sys.modules`` for the
    test (fresh classes each time, so every test installs its own hooks)."""
    for name in vllm_options.ENV_NAMES:
        monkeypatch.delenv(name, raising=False)

    class VLLMValidationError(ValueError):
        def __init__(self, message, *, parameter=None):
            super().__init__(message)
            self.parameter = parameter

    class SamplingParams:
        def __init__(self, extra_args=None):
            self.extra_args = extra_args

    class InputProcessor:
        calls = 0

        def _validate_params(self, params, *args, **kwargs):
            InputProcessor.calls += 1
            return "validated"

    def request_class(name):
        class Request:  # an OpenAI request: fields it does not declare are in model_extra (pydantic)
            def __init__(self, extra=None, extra_args=None):
                self.model_extra = extra or {}
                self.extra_args = extra_args

            def to_sampling_params(self, *args, **kwargs):
                return SamplingParams(None if self.extra_args is None else dict(self.extra_args))
        Request.__name__ = name
        return Request

    class CompletionTokenUsageInfo:
        accepted_prediction_tokens = None
        rejected_prediction_tokens = None

    class OpenAIServingChat:
        async def chat_completion_full_generator(self, response):
            return response

    class OpenAIServingCompletion:
        def request_output_to_completion_response(self, response):
            return response

    fake = SimpleNamespace(VLLMValidationError=VLLMValidationError, SamplingParams=SamplingParams,
                           InputProcessor=InputProcessor, ChatCompletionRequest=request_class("ChatCompletionRequest"),
                           CompletionRequest=request_class("CompletionRequest"),
                           CompletionTokenUsageInfo=CompletionTokenUsageInfo, OpenAIServingChat=OpenAIServingChat,
                           OpenAIServingCompletion=OpenAIServingCompletion)
    for name in ("vllm", "vllm.v1", "vllm.v1.engine", "vllm.entrypoints", "vllm.entrypoints.openai",
                 "vllm.entrypoints.openai.chat_completion", "vllm.entrypoints.openai.completion",
                 "vllm.entrypoints.serve", "vllm.entrypoints.serve.engine"):
        _module(monkeypatch, name)
    _module(monkeypatch, "vllm.exceptions", VLLMValidationError=VLLMValidationError)
    _module(monkeypatch, "vllm.sampling_params", SamplingParams=SamplingParams)
    _module(monkeypatch, "vllm.v1.engine.input_processor", InputProcessor=InputProcessor)
    _module(monkeypatch, "vllm.entrypoints.openai.chat_completion.protocol", ChatCompletionRequest=fake.ChatCompletionRequest)
    _module(monkeypatch, "vllm.entrypoints.openai.completion.protocol", CompletionRequest=fake.CompletionRequest)
    _module(monkeypatch, "vllm.entrypoints.serve.engine.protocol", CompletionTokenUsageInfo=CompletionTokenUsageInfo)
    _module(monkeypatch, "vllm.entrypoints.openai.chat_completion.serving", OpenAIServingChat=OpenAIServingChat)
    _module(monkeypatch, "vllm.entrypoints.openai.completion.serving", OpenAIServingCompletion=OpenAIServingCompletion)
    return fake


def test_register_installs_every_hook_once(fake_vllm):
    plugin.register()
    plugin.register()  # vLLM may run the entry point again in the same process
    fake_vllm.InputProcessor()._validate_params(fake_vllm.SamplingParams({"refdec_references": "x"}))
    assert fake_vllm.InputProcessor.calls == 1  # one wrapper around the original, not two
    for owner, name in ((fake_vllm.InputProcessor, "_validate_params"),
                        (fake_vllm.ChatCompletionRequest, "to_sampling_params"),
                        (fake_vllm.CompletionRequest, "to_sampling_params"),
                        (fake_vllm.OpenAIServingChat, "chat_completion_full_generator"),
                        (fake_vllm.OpenAIServingCompletion, "request_output_to_completion_response")):
        assert getattr(getattr(owner, name), "__wrapped__", None) is not None, (owner, name)
        assert not hasattr(getattr(owner, name).__wrapped__, "__wrapped__"), (owner, name)


def test_a_missing_vllm_module_leaves_that_part_out_with_a_warning(fake_vllm, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.openai.chat_completion.protocol", None)  # not importable
    with caplog.at_level(logging.WARNING, logger="refdec.vllm.plugin"):
        plugin.register()
    assert "install_prediction_hooks not installed" in caplog.text
    assert "install_validation_hook" not in caplog.text and "install_usage_hooks" not in caplog.text
    with pytest.raises(fake_vllm.VLLMValidationError):  # the other parts are in place
        fake_vllm.InputProcessor()._validate_params(fake_vllm.SamplingParams({"refdec_references": 5}))


@pytest.mark.parametrize("extra_args, message, parameter", [
    ({"refdec_references": 5}, "refdec_references must be a string or a list of strings", "refdec_references"),
    ({"refdec_references": ["ok", ""]}, r"refdec_references\[1\] is an empty string", "refdec_references[1]"),
    ({"refdec_draft": "maybe"}, "refdec_draft must be true or false", "refdec_draft"),
    ({"refdec_refs": "typo"}, r"unknown refdec request option\(s\) \['refdec_refs'\]", None),
])
def test_a_bad_refdec_option_is_that_requests_validation_error(fake_vllm, extra_args, message, parameter):
    plugin.register()
    processor = fake_vllm.InputProcessor()
    with pytest.raises(fake_vllm.VLLMValidationError, match=message) as error:
        processor._validate_params(fake_vllm.SamplingParams(extra_args))
    assert error.value.parameter == parameter
    # good options, other plugins' keys, no extra_args, and other kinds of params pass to vLLM's own check
    for params in (fake_vllm.SamplingParams({"refdec_references": ["a", "b"], "refdec_draft": False}),
                   fake_vllm.SamplingParams({"other_plugin": 5}), fake_vllm.SamplingParams(), object()):
        assert processor._validate_params(params) == "validated"


def test_the_servers_reference_limit_is_checked_as_the_request_arrives(fake_vllm, monkeypatch):
    monkeypatch.setenv("REFDEC_VLLM_MAX_REFERENCE_CHARS", "10")
    plugin.register()
    processor = fake_vllm.InputProcessor()
    assert processor._validate_params(fake_vllm.SamplingParams({"refdec_references": "x" * 10})) == "validated"
    with pytest.raises(fake_vllm.VLLMValidationError, match="more than the server's limit of 10"):
        processor._validate_params(fake_vllm.SamplingParams({"refdec_references": ["x" * 6, "y" * 5]}))


@pytest.mark.parametrize("request_class", ["CompletionRequest", "ChatCompletionRequest"])
def test_a_prediction_becomes_one_more_reference_of_the_request(fake_vllm, request_class):
    plugin.register()
    request = getattr(fake_vllm, request_class)
    prediction = {"type": "content", "content": [{"type": "text", "text": "def f"}, {"type": "text", "text": "(x)"}]}
    assert request({"prediction": prediction}).to_sampling_params().extra_args == {"refdec_references": ["def f(x)"]}
    given = {"refdec_references": "ref", "other": 1}
    assert request({"prediction": prediction}, given).to_sampling_params().extra_args == {
        "refdec_references": ["ref", "def f(x)"], "other": 1}
    assert request({"prediction": prediction}, {"refdec_references": ["a", "b"]}).to_sampling_params().extra_args == {
        "refdec_references": ["a", "b", "def f(x)"]}
    # no prediction, or an empty one: the params as vLLM made them
    assert request().to_sampling_params().extra_args is None
    assert request({"prediction": {"type": "content", "content": ""}}).to_sampling_params().extra_args is None
    with pytest.raises(fake_vllm.VLLMValidationError, match="prediction must be an object") as error:
        request({"prediction": "just text"}).to_sampling_params()
    assert error.value.parameter == "prediction"


def _response(accepted=None, drafted=None):
    spec = None if accepted is None else SimpleNamespace(num_accepted_draft_tokens=accepted, num_draft_tokens=drafted)
    return SimpleNamespace(metrics=SimpleNamespace(speculative_decoding=spec),
                           usage=SimpleNamespace(completion_tokens_details=None))


def test_usage_reports_accepted_and_rejected_prediction_tokens(fake_vllm):
    plugin.register()
    completion = fake_vllm.OpenAIServingCompletion().request_output_to_completion_response(_response(7, 10))
    details = completion.usage.completion_tokens_details
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (7, 3)
    chat = asyncio.run(fake_vllm.OpenAIServingChat().chat_completion_full_generator(_response(4, 4)))
    details = chat.usage.completion_tokens_details
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (4, 0)
    # without vLLM's per-request metrics (--per-request-spec-decode-metrics), the usage is left alone
    plain = plugin.add_prediction_usage(_response())
    assert plain.usage.completion_tokens_details is None
    no_metrics = SimpleNamespace(usage=SimpleNamespace(completion_tokens_details=None))
    assert plugin.add_prediction_usage(no_metrics).usage.completion_tokens_details is None
