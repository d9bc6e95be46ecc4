"""The HTTP side of ``refdec serve``: OpenAI's completion endpoints over a DecodingService.

    app = create_app(service, model_names=["qwen2.5-coder-1.5b-instruct"], context_length=8192)

Routes: ``POST /v1/chat/completions`` (the model's chat template), ``POST /v1/completions``,
``GET /v1/models``, ``GET /health``. A request's ``prediction`` is its reference (editing mode:
the copy cursor follows the completion through it); without one, the largest fenced code block of
its messages is (refdec.drafting.implicit: the file an editing tool put in the prompt). Greedy when
``temperature`` is 0, else sampled with its ``seed``. Each request decodes as one row of the service's running batch and
gives what a ``SpeculativeDecoder.generate`` call alone gives. Errors come in OpenAI's shape
(refdec.serve.protocol.ApiError); a failure mid-stream as a ``data: {"error": ...}`` chunk. A
client that goes away cancels its request at the next step. One log line per request, without
its text.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from refdec.drafting.implicit import implicit_reference
from refdec.drafting.index import CorpusIndex
from refdec.drafting.proposer import CORPUS, MEMORY, REFERENCE, SOURCE_NAMES
from refdec.engine.service import CANCELLED, DecodingService, ServiceBusy, ServiceClosed
from refdec.engine.settings import DecodeSettings
from refdec.serve.corpora import CorpusRegistry
from refdec.serve.protocol import (ApiError, ChatCompletionRequest, CompletionRequest, CorpusCreateRequest,
                                   api_error_from_validation)
from refdec.serve.text import TextStream

__all__ = ["DEFAULT_MAX_BODY_BYTES", "create_app"]

DEFAULT_MAX_BODY_BYTES = 8 << 20  # a request body's limit: a large source file and its prediction fit
PREDICTION_SOURCE = SOURCE_NAMES[REFERENCE]  # the draft source that a request's prediction feeds
MEMORY_SOURCE = SOURCE_NAMES[MEMORY]  # earlier requests' outputs (refdec.drafting.memory)
CORPUS_SOURCE = SOURCE_NAMES[CORPUS]  # the request's corpus (refdec.serve.corpora)
FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "max_new_tokens": "length",
                  "max_position_embeddings": "length"}
DISCONNECT_POLL_SECONDS = 0.25  # how often a non-streaming request checks that its client is still there

log = logging.getLogger("refdec.serve")


def create_app(service: DecodingService, *, model_names: list[str], context_length: int,
               api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               implicit_references: bool = True, shared_memory: bool = False,
               corpora: CorpusRegistry | None = None) -> FastAPI:
    """The server's app. ``model_names``: the ids it answers to (the first is the one it reports);
    ``context_length``: the most tokens a request's prompt and completion hold together;
    ``api_key``: when given, every /v1 route needs ``Authorization: Bearer <key>``;
    ``implicit_references``: a request without ``prediction`` drafts from the largest fenced code
    block of its messages (refdec.drafting.implicit). When the decoder has a memory of past outputs
    (``SpeculativeDecoder(memory=)``), each request drafts from and joins its tenant's: the API key's where
    the server has one, else the request's ``user`` (requests without one share a tenant);
    ``shared_memory``: one memory for every request. Per tenant by default because the speed of a
    reply would show whether its text was in another client's output. ``corpora``: the named
    corpora (refdec.serve.corpora; default: the decoder's index, if any, as ``default``); adding
    or removing one over HTTP needs ``api_key``."""
    if not model_names:
        raise ValueError("model_names must name at least one model")
    app = FastAPI(title="refdec", docs_url=None, redoc_url=None, openapi_url=None)
    tokenizer = service.tokenizer
    eos_ids = service.eos_token_ids
    created = int(time.time())
    if corpora is None:
        corpora = CorpusRegistry()
        if service.index is not None:
            corpora.add("default", service.index, "file")

    @app.exception_handler(ApiError)
    async def _api_error(_request, error: ApiError):
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request, error: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        return JSONResponse(ApiError(error.status_code, str(error.detail), code=code).body(),
                            status_code=error.status_code)

    @app.exception_handler(Exception)
    async def _internal_error(_request, error: Exception):
        log.exception("internal error")
        return JSONResponse(ApiError(500, f"internal error: {type(error).__name__}", kind="server_error",
                                     code="internal_error").body(), status_code=500)

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")

    async def read_json(request: Request) -> dict:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            raise ApiError(413, f"the request body is {declared} bytes; the limit is {max_body_bytes}",
                           code="request_too_large")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body_bytes:
                raise ApiError(413, f"the request body is over the limit of {max_body_bytes} bytes",
                               code="request_too_large")
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ApiError(400, f"the body is not valid JSON: {error}", code="invalid_json") from None
        if not isinstance(data, dict):
            raise ApiError(400, "the body must be a JSON object", code="invalid_json")
        return data

    def parse(model_class, data: dict):
        try:
            body = model_class.model_validate(data)
        except ValidationError as error:
            raise api_error_from_validation(error) from None
        body.refuse_unsupported()
        if body.model not in model_names:
            raise ApiError(404, f"The model '{body.model}' does not exist; this server serves "
                                f"{', '.join(model_names)}", param="model", code="model_not_found")
        return body

    @app.get("/health")
    async def health():
        return {"status": "ok", "pending": service.pending}

    @app.get("/v1/models")
    async def models(request: Request):
        check_key(request)
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "refdec"}
                                           for name in model_names]}

    @app.get("/v1/corpora")
    async def list_corpora(request: Request):
        check_key(request)
        return {"object": "list", "data": corpora.describe()}

    def check_corpus_changes_allowed() -> None:
        if api_key is None:
            raise ApiError(403, "adding or removing corpora needs an API key: start refdec serve with --api-key",
                           code="api_key_required")

    @app.post("/v1/corpora")
    async def add_corpus(request: Request):
        check_key(request)
        check_corpus_changes_allowed()
        try:
            body = CorpusCreateRequest.model_validate(await read_json(request))
        except ValidationError as error:
            raise api_error_from_validation(error) from None
        if body.name in corpora:
            raise ApiError(409, f"a corpus named '{body.name}' exists: remove it first", param="name",
                           code="corpus_exists")
        index = await run_in_threadpool(CorpusIndex.build, body.documents, tokenizer, show_progress=False)
        try:
            corpus = corpora.add(body.name, index, "request")
        except KeyError:
            raise ApiError(409, f"a corpus named '{body.name}' exists: remove it first", param="name",
                           code="corpus_exists") from None
        except OverflowError as error:
            raise ApiError(409, str(error), code="too_many_corpora") from None
        log.info("corpus %s added: %d documents, %d tokens", body.name, index.num_documents, len(index))
        return JSONResponse(corpus.describe(False), status_code=201)

    @app.delete("/v1/corpora/{name}")
    async def remove_corpus(name: str, request: Request):
        check_key(request)
        check_corpus_changes_allowed()
        try:
            corpora.remove(name)
        except KeyError:
            raise ApiError(404, f"The corpus '{name}' does not exist", param="name", code="corpus_not_found") from None
        log.info("corpus %s removed", name)
        return {"id": name, "object": "corpus.deleted", "deleted": True}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        check_key(request)
        body = parse(ChatCompletionRequest, await read_json(request))
        messages = [message.for_template() for message in body.messages]
        try:
            prompt = _token_ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
        except ValueError as error:
            raise ApiError(400, f"the chat template could not render the messages: {error}", param="messages",
                           code="invalid_value") from None
        return await complete(request, body, prompt, chat=True, texts=[m["content"] for m in messages])

    @app.post("/v1/completions")
    async def completions(request: Request):
        check_key(request)
        body = parse(CompletionRequest, await read_json(request))
        prompt = body.prompt
        if isinstance(prompt, list) and isinstance(prompt[0], int):
            ids = list(prompt)
        else:
            text = prompt[0] if isinstance(prompt, list) else prompt
            ids = _token_ids(tokenizer(text, add_special_tokens=True)["input_ids"])
        if not ids:
            raise ApiError(400, "the prompt holds no token", param="prompt", code="invalid_value")
        texts = [] if isinstance(prompt, list) and isinstance(prompt[0], int) else [text]
        return await complete(request, body, ids, chat=False, texts=texts)

    async def complete(request: Request, body, prompt: list[int], chat: bool, texts: list[str]):
        limit = body.token_limit
        room = context_length - len(prompt)
        if room < 1 or (limit is not None and limit > room):
            asked = len(prompt) + (limit or 1)
            raise ApiError(400, f"This model's maximum context length is {context_length} tokens. However, you "
                                f"requested {asked} tokens ({len(prompt)} in the prompt, {limit or 1} for the "
                                f"completion). Please reduce the prompt or the completion's length.",
                           param="messages" if chat else "prompt", code="context_length_exceeded")
        stops = body.stop or []
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def on_event(event) -> None:  # on the engine's thread
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the event loop has closed (shutdown): nobody is listening
                pass

        predicted = bool(body.prediction)
        # without a prediction, the file the prompt holds, if any (refdec.drafting.implicit): same output
        reference = (body.prediction if predicted
                     else implicit_reference(texts) if implicit_references else None)
        try:  # the request's decoding settings, checked once, here
            settings = DecodeSettings(
                max_new_tokens=limit if limit is not None else room, do_sample=body.temperature > 0,
                temperature=body.temperature if body.temperature > 0 else 1.0,
                top_p=body.top_p if body.top_p < 1.0 else None, seed=body.seed, stop_strings=tuple(stops))
        except ValueError as error:
            raise ApiError(400, str(error), code="invalid_value") from None
        tenant = None if shared_memory else ("api-key",) if api_key is not None else ("user", body.user or "")
        try:
            index = corpora.index_for(body.corpus)
        except KeyError:
            raise ApiError(404, f"The corpus '{body.corpus}' does not exist (GET /v1/corpora lists them)",
                           param="corpus", code="corpus_not_found") from None
        try:
            ticket = await run_in_threadpool(service.submit, prompt, settings, on_event=on_event, tenant=tenant,
                                             index=index, references=[reference] if reference else [])
        except ServiceBusy as error:
            raise ApiError(503, f"the server is busy ({error}); retry shortly", kind="server_error",
                           code="server_busy", headers={"Retry-After": "1"}) from None
        except ServiceClosed as error:
            raise ApiError(503, str(error), kind="server_error", code="server_closed") from None
        except ValueError as error:
            raise ApiError(400, str(error), code="invalid_value") from None
        text = TextStream(tokenizer, stops, eos_ids)
        reply = _Reply(body, chat, body.model, len(prompt), predicted)
        if body.stream:
            return StreamingResponse(_stream(reply, ticket, events, text), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        while True:
            try:
                event = await asyncio.wait_for(events.get(), DISCONNECT_POLL_SECONDS)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    ticket.cancel()
                    reply.log(ticket.stats, "client gone")
                    return JSONResponse({}, status_code=499)
                continue
            if event.kind == "tokens":
                text.push(event.tokens)
            elif event.kind == "error":
                reply.log(None, f"error: {event.error}")
                raise ApiError(500, f"decoding failed: {event.error}", kind="server_error", code="decode_failed")
            else:
                text.finish()
                reply.log(event.stats, "")
                return reply.whole(text.text, event.stats)

    return app


def _token_ids(ids) -> list[int]:
    """Token ids from a tokenizer's answer (a list, a tensor, or a dict holding ``input_ids``)."""
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return [int(t) for t in ids]


async def _stream(reply: "_Reply", ticket, events: asyncio.Queue, text: TextStream):
    """The SSE chunks of a streamed reply. A closed connection cancels the task reading this
    generator; ``finally`` then cancels the request (a no-op once it is done)."""
    try:
        if reply.chat:
            yield reply.chunk({"role": "assistant", "content": ""}, None)
        while True:
            event = await events.get()
            if event.kind == "tokens":
                delta = text.push(event.tokens)
                if delta:
                    yield reply.chunk(delta, None)
            elif event.kind == "error":
                reply.log(None, f"error: {event.error}")
                error = ApiError(500, f"decoding failed: {event.error}", kind="server_error", code="decode_failed")
                yield f"data: {json.dumps(error.body())}\n\n"
                return
            else:
                delta = text.finish()
                if delta:
                    yield reply.chunk(delta, None)
                yield reply.chunk(None, reply.finish_reason(event.stats))
                if reply.body.include_usage:
                    yield reply.usage_chunk(event.stats)
                yield "data: [DONE]\n\n"
                reply.log(event.stats, "")
                return
    finally:
        if not ticket.finished.is_set():
            ticket.cancel()
            reply.log(None, "client gone")


class _Reply:
    """One request's answer in OpenAI's shapes (whole, or as SSE chunks)."""

    def __init__(self, body, chat: bool, model: str, prompt_tokens: int, predicted: bool) -> None:
        self.body = body
        self.predicted = predicted  # the request sent a prediction (its drafts are its prediction tokens)
        self.chat = chat
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.started = time.perf_counter()

    def finish_reason(self, stats) -> str:
        return FINISH_REASONS.get(stats.stop_reason, stats.stop_reason)

    def usage(self, stats) -> dict:
        """OpenAI's usage; accepted prediction tokens: drafted from the prediction and emitted;
        rejected: drafted from it and thrown away by verification (0 without a prediction: drafts
        from an implicit reference are not the client's); cached tokens: prompt tokens an earlier
        request's KV entries held (not prefilled again)."""
        completion = stats.new_tokens
        proposed = stats.proposed_by_source.get(PREDICTION_SOURCE, 0) if self.predicted else 0
        accepted = stats.accepted_by_source.get(PREDICTION_SOURCE, 0) if self.predicted else 0
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion,
                "prompt_tokens_details": {"cached_tokens": stats.cached_prompt_tokens},
                "completion_tokens_details": {"accepted_prediction_tokens": min(accepted, completion),
                                              "rejected_prediction_tokens": proposed - accepted,
                                              "reasoning_tokens": 0}}

    def whole(self, text: str, stats) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": self.finish_reason(stats)}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish_reason(stats)}
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice], "usage": self.usage(stats),
                "system_fingerprint": None}

    def chunk(self, delta, finish_reason: str | None) -> str:
        """One SSE chunk: ``delta`` new text (chat: a dict, the role's chunk), or the last one with
        ``finish_reason``."""
        if self.chat:
            content = delta if isinstance(delta, dict) else {} if delta is None else {"content": delta}
            choice = {"index": 0, "delta": content, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish_reason}
        data = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice], "system_fingerprint": None}
        if self.body.include_usage:
            data["usage"] = None
        return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"

    def usage_chunk(self, stats) -> str:
        data = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [], "usage": self.usage(stats),
                "system_fingerprint": None}
        return f"data: {json.dumps(data)}\n\n"

    def log(self, stats, outcome: str) -> None:
        """One line per request: sizes, passes, prediction tokens and speed; never the text."""
        seconds = time.perf_counter() - self.started
        if stats is None:
            log.info("%s %s: %s after %.2f s", self.id, "chat" if self.chat else "completion", outcome or "failed",
                     seconds)
            return
        proposed = stats.proposed_by_source.get(PREDICTION_SOURCE, 0)
        accepted = min(stats.accepted_by_source.get(PREDICTION_SOURCE, 0), stats.new_tokens)
        log.info("%s %s: prompt %d (%d cached, prefill %.2f s), completion %d tokens in %d passes, %s "
                 "accepted %d rejected %d, memory accepted %d, corpus accepted %d, %.1f tokens/s, %s%s", self.id,
                 "chat" if self.chat else "completion", self.prompt_tokens, stats.cached_prompt_tokens,
                 stats.prefill_seconds, stats.new_tokens, stats.forward_passes,
                 "prediction" if self.predicted else "implicit reference", accepted, proposed - accepted,
                 stats.accepted_by_source.get(MEMORY_SOURCE, 0), stats.accepted_by_source.get(CORPUS_SOURCE, 0),
                 stats.new_tokens / seconds if seconds > 0 else 0.0,
                 self.finish_reason(stats) if stats.stop_reason != CANCELLED else CANCELLED,
                 f" ({outcome})" if outcome else "")
