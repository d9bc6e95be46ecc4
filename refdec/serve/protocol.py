"""The OpenAI request bodies the server takes (pydantic models) and its errors, in OpenAI's shape.

A field the server cannot honour is refused with a 400 naming it, never dropped: ``n > 1``,
``logprobs``, ``tools``, penalties, ``suffix``, ``echo``. Unknown fields are ignored, as most
OpenAI-compatible servers do (clients send vendor fields). Length rule: ``max_completion_tokens``
and ``max_tokens`` (its older name) may both be given only when they are equal; neither: up to
the context's end.
"""

from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from refdec.prediction import prediction_text
from refdec.serve.corpora import check_name

__all__ = ["ApiError", "ChatCompletionRequest", "CompletionRequest", "api_error_from_validation"]

MAX_STOP_STRINGS = 4  # OpenAI's limit


class ApiError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def api_error_from_validation(error: ValidationError) -> ApiError:
    """The first problem pydantic found, as a 400 naming the field."""
    first = error.errors()[0]
    param = ".".join(str(part) for part in first["loc"]) or None
    return ApiError(400, f"Invalid value for '{param}': {first['msg']}" if param else first["msg"], param=param,
                    code="invalid_value")


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class StreamOptions(BaseModel):
    include_usage: bool = False


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ... pass on to the chat template
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None

    def for_template(self) -> dict:
        """The message as chat templates read it: text content."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        role = "system" if self.role == "developer" else self.role
        return {**(self.model_extra or {}), "role": role, "content": content or ""}


class _Sampling(BaseModel):
    """The fields both completion endpoints share."""

    model_config = ConfigDict(extra="ignore")
    model: str
    prediction: str | None = None  # OpenAI's Predicted Outputs, read as its text (refdec.prediction)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: Union[str, list[str], None] = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    n: int = Field(default=1, ge=1)
    logprobs: Union[bool, int, None] = None
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    user: str | None = Field(default=None, max_length=256)  # OpenAI's end-user id: here, whose memory (no API key)
    corpus: str | None = Field(default=None, max_length=64)  # refdec's: the corpus to draft from (refdec.serve.corpora)

    @field_validator("prediction", mode="before")
    @classmethod
    def _prediction(cls, prediction):
        return None if prediction is None else prediction_text(prediction)

    @field_validator("stop")
    @classmethod
    def _stop(cls, stop):
        stops = [stop] if isinstance(stop, str) else stop
        if stops is not None:
            if not 1 <= len(stops) <= MAX_STOP_STRINGS:
                raise ValueError(f"give 1 to {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
            if any(not s for s in stops):
                raise ValueError("a stop string must not be empty")
        return stops

    def refuse_unsupported(self) -> None:
        """400 for each setting this server does not honour (rather than ignoring it)."""
        if self.n != 1:
            raise ApiError(400, f"n={self.n} is not supported: this server returns one choice", param="n",
                           code="unsupported_value")
        if self.logprobs:
            raise ApiError(400, "logprobs are not supported", param="logprobs", code="unsupported_parameter")
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name):
                raise ApiError(400, f"{name} is not supported (give 0)", param=name, code="unsupported_parameter")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options needs stream=true", param="stream_options", code="invalid_value")
        if self.max_tokens is not None and self.max_completion_tokens is not None \
                and self.max_tokens != self.max_completion_tokens:
            raise ApiError(400, f"max_tokens={self.max_tokens} and max_completion_tokens="
                                f"{self.max_completion_tokens} disagree: give one of them",
                           param="max_completion_tokens", code="invalid_value")

    @property
    def token_limit(self) -> int | None:
        """The most completion tokens asked for (None: up to the context's end)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    tools: list | None = None
    tool_choice: object | None = None
    functions: list | None = None
    top_logprobs: int | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        for name in ("tools", "functions"):
            if getattr(self, name):
                raise ApiError(400, f"{name} are not supported by this server", param=name,
                               code="unsupported_parameter")
        if self.top_logprobs:
            raise ApiError(400, "top_logprobs is not supported", param="top_logprobs", code="unsupported_parameter")


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int]]
    suffix: str | None = None
    echo: bool = False
    best_of: int | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.suffix:
            raise ApiError(400, "suffix (fill in the middle) is not supported", param="suffix",
                           code="unsupported_parameter")
        if self.echo:
            raise ApiError(400, "echo is not supported", param="echo", code="unsupported_parameter")
        if self.best_of not in (None, 1):
            raise ApiError(400, f"best_of={self.best_of} is not supported", param="best_of",
                           code="unsupported_value")
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str) and len(self.prompt) != 1:
            raise ApiError(400, f"one prompt per request (got {len(self.prompt)})", param="prompt",
                           code="unsupported_value")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ApiError(400, "prompt is empty", param="prompt", code="invalid_value")


class CorpusCreateRequest(BaseModel):
    """``POST /v1/corpora``: a corpus built from the documents in the body (refdec.serve.corpora)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    documents: list[str] = Field(min_length=1, max_length=1_000_000)

    @field_validator("name")
    @classmethod
    def _name(cls, name):
        return check_name(name)

    @field_validator("documents")
    @classmethod
    def _documents(cls, documents):
        if not any(document for document in documents):
            raise ValueError("the documents are all empty")
        return documents
