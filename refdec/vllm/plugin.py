"""The ``vllm.general_plugins`` entry point of refdec, and the hooks it installs.

vLLM runs :func:`register` in each of its processes (front end, engine core, workers);
``pip install 'refdec[vllm]'`` registers it. What it adds, each only where its vLLM module
exists (a vLLM version without one logs a warning and goes on without that part):

* request validation (front end, ``InputProcessor._validate_params``): the ``refdec_*`` keys
  of ``SamplingParams.extra_args`` are checked as each request arrives, so a bad reference is
  that request's error (HTTP 400 on the server, ValueError from ``LLM.generate``), never a
  worker's;
* Predicted Outputs (OpenAI server): ``prediction={"type": "content", "content": ...}`` on
  chat and completions requests becomes the request's ``refdec_references``;
* usage (OpenAI server, non-streaming responses): when vLLM reports per-request
  speculative-decoding metrics (``--per-request-spec-decode-metrics summary``), the response's
  ``usage.completion_tokens_details`` gets OpenAI's ``accepted_prediction_tokens`` (draft
  tokens vLLM accepted) and ``rejected_prediction_tokens`` (draft tokens it rejected).

:func:`refdec.vllm.proposer.install_runner_hook` (installed by :class:`refdec.vllm.VllmProposer`
itself, in the worker that builds it) hands the proposer the batch's request ids before each
``propose``: vLLM's ``custom_class`` interface passes batch slots only.
"""

from __future__ import annotations

import logging

from refdec.vllm.hooks import wrap_once
from refdec.prediction import prediction_text
from refdec.vllm.options import REFERENCES_KEY, ServerOptions, parse_request_options

logger = logging.getLogger(__name__)


def register() -> None:
    """Entry point: installs the front-end hooks (idempotent; cheap where they are not needed)."""
    for install in (install_validation_hook, install_prediction_hooks, install_usage_hooks):
        try:
            install()
        except (ImportError, AttributeError) as exc:  # another vLLM layout: go on without this part
            logger.warning("refdec vLLM plugin: %s not installed (%s)", install.__name__, exc)


# -- front end: validation --------------------------------------------------------------------


def install_validation_hook() -> None:
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    options = ServerOptions.from_env()

    def make(original):
        def _validate_params(self, params, *args, **kwargs):
            result = original(self, params, *args, **kwargs)
            if isinstance(params, SamplingParams) and params.extra_args:
                try:
                    parse_request_options(params.extra_args, max_reference_chars=options.max_reference_chars)
                except ValueError as exc:
                    key = str(exc).split(" ", 1)[0]
                    raise VLLMValidationError(str(exc), parameter=key if key.startswith("refdec_") else None) from exc
            return result
        return _validate_params

    wrap_once(InputProcessor, "_validate_params", make)


# -- front end: Predicted Outputs ---------------------------------------------------------------


def _add_prediction(request, params):
    """``request.prediction`` (an extra field of the OpenAI request) -> the params' references."""
    from vllm.exceptions import VLLMValidationError

    prediction = (getattr(request, "model_extra", None) or {}).get("prediction")
    if prediction is None or not hasattr(params, "extra_args"):
        return params
    try:
        text = prediction_text(prediction)
    except ValueError as exc:
        raise VLLMValidationError(str(exc), parameter="prediction") from exc
    if not text:
        return params  # an empty prediction predicts nothing
    extra = dict(params.extra_args or {})
    given = extra.get(REFERENCES_KEY)
    extra[REFERENCES_KEY] = [text] if given is None else ([given] if isinstance(given, str) else list(given)) + [text]
    params.extra_args = extra
    return params


def install_prediction_hooks() -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    def make(original):
        def to_sampling_params(self, *args, **kwargs):
            return _add_prediction(self, original(self, *args, **kwargs))
        return to_sampling_params

    for cls in (ChatCompletionRequest, CompletionRequest):
        wrap_once(cls, "to_sampling_params", make)


# -- front end: usage -------------------------------------------------------------------------


def add_prediction_usage(response):
    """OpenAI's ``accepted_prediction_tokens`` / ``rejected_prediction_tokens`` in
    ``usage.completion_tokens_details``, from vLLM's per-request speculative-decoding metrics
    (present when the server runs with ``--per-request-spec-decode-metrics summary``)."""
    metrics = getattr(response, "metrics", None)
    spec = getattr(metrics, "speculative_decoding", None) if metrics is not None else None
    usage = getattr(response, "usage", None)
    if spec is None or usage is None:
        return response
    from vllm.entrypoints.serve.engine.protocol import CompletionTokenUsageInfo

    accepted = int(spec.num_accepted_draft_tokens)
    details = usage.completion_tokens_details or CompletionTokenUsageInfo()
    details.accepted_prediction_tokens = accepted
    details.rejected_prediction_tokens = int(spec.num_draft_tokens) - accepted
    usage.completion_tokens_details = details
    return response


def install_usage_hooks() -> None:
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion

    def make_async(original):
        async def chat_completion_full_generator(self, *args, **kwargs):
            return add_prediction_usage(await original(self, *args, **kwargs))
        return chat_completion_full_generator

    def make_sync(original):
        def request_output_to_completion_response(self, *args, **kwargs):
            return add_prediction_usage(original(self, *args, **kwargs))
        return request_output_to_completion_response

    wrap_once(OpenAIServingChat, "chat_completion_full_generator", make_async)
    wrap_once(OpenAIServingCompletion, "request_output_to_completion_response", make_sync)
