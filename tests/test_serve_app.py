"""Specifies ``refdec serve``'s HTTP side (refdec.serve.app) through a live server on 127.0.0.1, answered by the
real ``openai`` client (``max_retries=0``), on the tiny GGUF model (benchmarks/random_gguf.py) on
llama.cpp.

What a client gets equals what the library gives the same prompt alone (greedy: the same text;
sampling: the same tokens for the same seed), whether it streams or not, whatever else the
server decodes at the same time; stop strings never reach a stream, not even in part; errors
come in OpenAI's shape with OpenAI's status codes, and the server answers afterwards.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

import refdec  # noqa: E402
from live_server import serving  # noqa: E402
from refdec.engine.service import DecodingService  # noqa: E402
from refdec.llama_cpp.api import batch_invariant_switch  # noqa: E402
from refdec.serve.app import create_app  # noqa: E402
from refdec.serve.text import TextStream  # noqa: E402
from refdec.sizing.cost_curve import CostCurve  # noqa: E402

pytestmark = [pytest.mark.llama, pytest.mark.usefixtures("fresh_refdec_cache")]

CONTEXT = 768  # tokens per request
SLOTS = 4
MODEL = "tiny"
PROMPTS = ["hello world, hello world", "def f(x):\n    return x", "the cat sat on the mat; the cat",
           "0123456789 0123456789", "abc abc abc", "llama llama", "one two three", "refdec serve"]


class LiveServer:
    """A refdec server on 127.0.0.1 (an ephemeral port), on its own thread."""

    def __init__(self, decoder, *, api_key=None, max_concurrent=SLOTS, max_waiting=16, max_body_bytes=1 << 20,
                 model_names=(MODEL, "gpt-4o"), shared_memory=False):
        self.service = DecodingService(decoder, max_concurrent=max_concurrent, max_waiting=max_waiting)
        app = create_app(self.service, model_names=list(model_names), context_length=CONTEXT, api_key=api_key,
                         max_body_bytes=max_body_bytes, shared_memory=shared_memory)
        self._serving = serving(app)
        self.url = self._serving.__enter__()

    def client(self, api_key="unused") -> "openai.OpenAI":
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=60)

    def post(self, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict, dict]:
        """(status, JSON body, headers) of a raw POST."""
        request = urllib.request.Request(self.url + path, data=body, method="POST",
                                         headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read()), dict(response.headers)
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read()), dict(error.headers)

    def close(self) -> None:
        self._serving.__exit__(None, None, None)
        self.service.close()


@pytest.fixture(scope="module")
def decoder(tiny_gguf):
    llm = llama_cpp.Llama(str(tiny_gguf), n_ctx=SLOTS * (CONTEXT + 65), n_threads=1, n_batch=64, verbose=False)
    decoder = refdec.SpeculativeDecoder(llm)
    # The tests compare pass-dependent counts (accepted / rejected prediction tokens) across requests:
    # price drafts with the calibrated curve as it is, not the curve refit from each step's wall time
    # (that one, and its plain guard, make the passes follow the machine's load).
    decoder.timed_budget = False
    return decoder


@pytest.fixture(scope="module")
def server(decoder):
    live = LiveServer(decoder)
    yield live
    live.close()


def fresh_decoder(decoder, exact: bool | None = None, flat_curve: bool = False):
    """A decoder of its own on the module's Llama, its acceptance rates the priors: a test that checks
    which source drafted needs them (in exact mode a row verifies one chain, its tree's best path,
    which the rates the module's decoder learnt from earlier tests may give to another source).
    ``flat_curve``: priced by a flat cost curve (another node costs nothing), so that the tree holds
    every source's chain whatever this machine's timings (a curve measured under load may not)."""
    own = refdec.SpeculativeDecoder(decoder.model, exact=exact)
    own.timed_budget = False
    if flat_curve:
        own.backend.auto_cost_curve = lambda: CostCurve((0, 64), (1.0, 1.0))
    return own


def chat_ids(decoder, content: str) -> list[int]:
    return decoder.tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                                 tokenize=True)


def library_text(decoder, ids: list[int], stops=(), **settings) -> tuple[str, object]:
    """What the library gives the prompt alone, as the server shows it: (text, stats)."""
    out = decoder.generate(ids, stop_strings=list(stops) or None, **settings)
    eos = set(decoder.backend.generation_config.eos_token_id or [])
    text = TextStream(decoder.tokenizer, list(stops), eos)
    text.push(out.sequences[0, len(ids):].tolist())
    text.finish()
    return text.text, out.stats


def streamed(stream) -> tuple[str, list]:
    """The concatenated text deltas of a stream, and its chunks."""
    chunks = list(stream)
    parts = []
    for chunk in chunks:
        for choice in chunk.choices:
            parts.append(choice.delta.content or "" if hasattr(choice, "delta") else choice.text)
    return "".join(parts), chunks


@pytest.mark.parametrize("prediction", [None, "string", "parts"])
def test_library_http_and_stream_give_the_same_text(server, decoder, prediction):
    content = PROMPTS[0]
    expected, stats = library_text(decoder, chat_ids(decoder, content), max_new_tokens=48)
    body = None
    if prediction is not None:
        text = expected[:30] + "xyz" + expected[30:]  # mostly right: drafts accepted and rejected
        body = {"prediction": {"type": "content",
                               "content": text if prediction == "string" else [{"type": "text", "text": text[:10]},
                                                                                {"type": "text", "text": text[10:]}]}}
    client = server.client()
    messages = [{"role": "user", "content": content}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=48, temperature=0,
                                           extra_body=body)
    assert whole.choices[0].message.content == expected
    assert whole.choices[0].finish_reason == ("length" if stats.stop_reason == "max_new_tokens" else "stop")
    text, chunks = streamed(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=48,
                                                           temperature=0, stream=True, extra_body=body))
    assert text == expected
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    details = whole.usage.completion_tokens_details
    if prediction is None:
        assert details.accepted_prediction_tokens == details.rejected_prediction_tokens == 0
    else:
        assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens > 0


def test_a_request_without_prediction_drafts_from_the_file_in_its_messages(decoder, caplog):
    """The fenced file is the implicit reference (refdec.drafting.implicit): the same text as the library
    gives the prompt alone, the drafts from it logged, and no prediction tokens reported (the client
    sent none). A decoder of its own (:func:`fresh_decoder`), with trees (exact mode off): a chain
    follows the context's copy of the same file as well, which takes the drafts' credit; and priced
    by a flat cost curve (another node costs nothing), so that the tree holds every source's chain
    whatever this machine's timings are (a measured curve may leave room for the context's only)."""
    seed = chat_ids(decoder, PROMPTS[0])
    file = library_text(decoder, seed, max_new_tokens=120)[0]  # text the tiny model writes
    content = f"Copy this file:\n```\n{file * 2}\n```\n"
    expected, _ = library_text(decoder, chat_ids(decoder, content), max_new_tokens=48)
    own = fresh_decoder(decoder, exact=False, flat_curve=True)
    live = LiveServer(own)
    try:
        with caplog.at_level(logging.INFO, logger="refdec.serve"):
            reply = live.client().chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=48, temperature=0)
    finally:
        live.close()
    assert reply.choices[0].message.content == expected
    details = reply.usage.completion_tokens_details
    assert details.accepted_prediction_tokens == details.rejected_prediction_tokens == 0
    line = next(record.getMessage() for record in caplog.records if "implicit reference" in record.getMessage())
    accepted, rejected = map(int, re.search(r"implicit reference accepted (\d+) rejected (\d+)", line).groups())
    assert accepted + rejected > 0, line


def memory_accepted(caplog) -> list[int]:
    return [int(re.search(r"memory accepted (\d+)", r.getMessage()).group(1)) for r in caplog.records
            if "memory accepted" in r.getMessage()]


@pytest.mark.parametrize("shared", [False, True])
def test_past_outputs_draft_only_for_their_own_tenant_unless_shared(decoder, caplog, shared):
    """A reply joins its tenant's memory (the request's ``user`` here: no API key) and drafts that
    tenant's next request; another user's request drafts nothing from it unless the memory is
    shared. The text is the library's every time."""
    memory_decoder = refdec.SpeculativeDecoder(decoder.model, backend=decoder.backend,
                                               memory=refdec.OutputMemory())
    memory_decoder.timed_budget = False
    live = LiveServer(memory_decoder, shared_memory=shared)
    content = PROMPTS[2]
    expected, _ = library_text(decoder, chat_ids(decoder, content), max_new_tokens=64)
    try:
        client = live.client()
        for user in ("alice", "bob", "alice"):
            with caplog.at_level(logging.INFO, logger="refdec.serve"):
                reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                                       max_tokens=64, temperature=0, user=user)
            assert reply.choices[0].message.content == expected
    finally:
        live.close()
    first, bob, alice_again = memory_accepted(caplog)
    assert first == 0 and alice_again > 0
    assert (bob > 0) == shared
    tenants = memory_decoder.memory.tenants()
    assert set(tenants) == ({None} if shared else {("user", "alice"), ("user", "bob")})


def test_corpora_are_added_listed_chosen_per_request_and_removed(decoder, caplog):
    """With the server's key a corpus is built from documents in the body, listed with its size,
    drafts for the requests naming it (the text is the library's) and is removed; every bad request
    gets an OpenAI-shaped 4xx and changes nothing. A decoder of its own: its acceptance rates start
    from the priors, which rank the corpus first (in exact mode a row verifies one chain, its tree's
    best path; the module's decoder has learnt other rates from the tests before), priced by a flat
    cost curve: a curve measured on a loaded machine may leave room for another source's chain only."""
    live = LiveServer(fresh_decoder(decoder, flat_curve=True), api_key="k")
    auth = {"Authorization": "Bearer k"}
    content = PROMPTS[3]
    ids = chat_ids(decoder, content)
    expected, _ = library_text(decoder, ids, max_new_tokens=48)
    try:
        status, body, _ = live.post("/v1/corpora", json.dumps({"name": "notes", "documents": [expected * 3]}).encode(),
                                    auth)
        assert status == 201 and body["id"] == "notes" and body["documents"] == 1 and body["tokens"] > 0
        for bad, code in ((json.dumps({"name": "notes", "documents": ["x"]}), 409),  # taken
                          (json.dumps({"name": "../x", "documents": ["x"]}), 400),
                          (json.dumps({"name": "y", "documents": []}), 400),
                          (json.dumps({"name": "y", "documents": ["a"], "path": "/etc/passwd"}), 400)):
            status, body, _ = live.post("/v1/corpora", bad.encode(), auth)
            assert status == code and body["error"]["message"], (bad, body)
        status, body, _ = live.post("/v1/corpora", b'{"name": "z", "documents": ["a"]}', {"Authorization": "Bearer no"})
        assert status == 401
        with urllib.request.urlopen(urllib.request.Request(live.url + "/v1/corpora", headers=auth), timeout=30) as r:
            assert [c["id"] for c in json.loads(r.read())["data"]] == ["notes"]
        client = live.client("k")
        with caplog.at_level(logging.INFO, logger="refdec.serve"):
            reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                                   max_tokens=48, temperature=0, extra_body={"corpus": "notes"})
        assert reply.choices[0].message.content == expected
        line = next(r.getMessage() for r in caplog.records if "corpus accepted" in r.getMessage())
        assert int(re.search(r"corpus accepted (\d+)", line).group(1)) > 0, line
        with pytest.raises(openai.NotFoundError, match="corpus"):
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                           max_tokens=4, extra_body={"corpus": "nope"})
        request = urllib.request.Request(live.url + "/v1/corpora/notes", method="DELETE", headers=auth)
        with urllib.request.urlopen(request, timeout=30) as r:
            assert json.loads(r.read())["deleted"] is True
        with pytest.raises(urllib.error.HTTPError) as gone:
            urllib.request.urlopen(request, timeout=30)
        assert gone.value.code == 404
    finally:
        live.close()


def test_a_corpus_removed_while_a_request_streams_from_it_leaves_that_request_whole(decoder):
    live = LiveServer(decoder, api_key="k")
    auth = {"Authorization": "Bearer k"}
    content = PROMPTS[4]
    expected, _ = library_text(decoder, chat_ids(decoder, content), max_new_tokens=96)
    try:
        status, _, _ = live.post("/v1/corpora", json.dumps({"name": "c", "documents": [expected * 2]}).encode(), auth)
        assert status == 201
        stream = live.client("k").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=96, temperature=0, stream=True,
            extra_body={"corpus": "c"})
        parts = []
        for i, chunk in enumerate(stream):
            if i == 1:  # the request has started: its corpus goes
                request = urllib.request.Request(live.url + "/v1/corpora/c", method="DELETE", headers=auth)
                with urllib.request.urlopen(request, timeout=30) as r:
                    assert json.loads(r.read())["deleted"] is True
            parts.extend(choice.delta.content or "" for choice in chunk.choices)
        assert "".join(parts) == expected
        with urllib.request.urlopen(urllib.request.Request(live.url + "/v1/corpora", headers=auth), timeout=30) as r:
            assert json.loads(r.read())["data"] == []
    finally:
        live.close()


def test_corpora_cannot_be_changed_on_a_server_without_a_key(server):
    status, body, _ = server.post("/v1/corpora", b'{"name": "x", "documents": ["a"]}')
    assert status == 403 and body["error"]["code"] == "api_key_required"


def test_completions_endpoint_agrees_with_the_library_for_text_and_token_prompts(server, decoder):
    ids = decoder.tokenizer(PROMPTS[1], add_special_tokens=True)["input_ids"]
    expected, _ = library_text(decoder, ids, max_new_tokens=40)
    client = server.client()
    by_text = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=40, temperature=0)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=40, temperature=0)
    assert by_text.choices[0].text == by_ids.choices[0].text == expected
    text, _ = streamed(client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=40, temperature=0,
                                                 stream=True))
    assert text == expected


def test_usage_adds_up_and_include_usage_sends_one_last_chunk(server, decoder):
    content = PROMPTS[2]
    expected, stats = library_text(decoder, chat_ids(decoder, content), max_new_tokens=30)
    client = server.client()
    messages = [{"role": "user", "content": content}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=30, temperature=0,
                                           extra_body={"prediction": {"type": "content", "content": expected}})
    usage = whole.usage
    assert usage.prompt_tokens == len(chat_ids(decoder, content))
    assert usage.completion_tokens == stats.new_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert 0 < usage.completion_tokens_details.accepted_prediction_tokens <= usage.completion_tokens
    # the library call just decoded this prompt: its KV entries are kept, all but the last token reused
    # (in exact mode the whole prefill chunks among them: refdec.llama_cpp.backend)
    backend = decoder.backend
    reused = usage.prompt_tokens - 1
    if backend.exact:
        reused -= reused % backend.ctx.prefill_chunk
    assert usage.prompt_tokens_details.cached_tokens == reused
    _, chunks = streamed(client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=30, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"prediction": {"type": "content", "content": expected}}))
    last = chunks[-1].usage  # the draft counts may differ: the second request starts from what the first learnt
    assert chunks[-1].choices == [] and (last.prompt_tokens, last.completion_tokens, last.total_tokens) == (
        usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)
    assert 0 < last.completion_tokens_details.accepted_prediction_tokens <= last.completion_tokens
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_a_stop_string_across_tokens_is_trimmed_and_never_streamed(server, decoder):
    ids = decoder.tokenizer(PROMPTS[3], add_special_tokens=True)["input_ids"]
    free, _ = library_text(decoder, ids, max_new_tokens=60)
    ascii_pairs = [i for i in range(10, len(free) - 2) if free[i:i + 3].isascii() and free[i:i + 3].isprintable()]
    assert ascii_pairs, f"the tiny model's text holds no printable run to stop at: {free!r}"
    stop = free[ascii_pairs[0]:ascii_pairs[0] + 3]  # three bytes: three tokens of the byte vocabulary
    expected = free[:free.find(stop)]
    client = server.client()
    whole = client.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=60, temperature=0, stop=[stop, "@@"])
    assert whole.choices[0].text == expected and whole.choices[0].finish_reason == "stop"
    text, chunks = streamed(client.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=60, temperature=0,
                                                      stop=stop, stream=True))
    assert text == expected
    shown = ""
    for chunk in chunks:  # no prefix of the stop string ever sits at the end of what was shown
        shown += chunk.choices[0].text
        assert stop not in shown
    assert shown == expected


def test_eight_concurrent_clients_each_get_their_solo_output(server, decoder):
    cases = []
    for i, content in enumerate(PROMPTS):
        sample = i % 3 == 2
        settings = dict(do_sample=True, temperature=0.8, top_p=0.9, seed=100 + i) if sample else {}
        expected, _ = library_text(decoder, chat_ids(decoder, content), max_new_tokens=40, **settings)
        request = dict(temperature=0.8, top_p=0.9, seed=100 + i) if sample else dict(temperature=0)
        cases.append((content, request, i % 2 == 0, expected))
    client = server.client()

    def ask(case):
        content, request, stream, _ = case
        messages = [{"role": "user", "content": content}]
        prediction = {"prediction": {"type": "content", "content": content * 3}}
        if stream:
            return streamed(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40,
                                                           stream=True, extra_body=prediction, **request))[0]
        return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, extra_body=prediction,
                                              **request).choices[0].message.content

    with ThreadPoolExecutor(len(cases)) as pool:
        answers = list(pool.map(ask, cases))
    assert answers == [case[3] for case in cases]


@pytest.mark.skipif(batch_invariant_switch() is None, reason="exact mode needs `refdec build-llama`")
def test_the_same_request_gets_plain_decodings_reply_whatever_runs_before_or_beside_it(server, decoder):
    """Exact mode (refdec.llama_cpp.backend): a chat request at temperature 0, sent alone, beside
    three other clients, and after them, comes back as llama.cpp's plain decoding's text each time."""
    from refdec.llama_cpp.plain import plain_greedy

    assert decoder.backend.exact
    content = PROMPTS[1]
    eos = set(decoder.backend.generation_config.eos_token_id or [])
    plain, _ = plain_greedy(decoder.model, chat_ids(decoder, content), 40, eos)
    expected = TextStream(decoder.tokenizer, [], eos)
    expected.push(plain)
    expected.finish()
    client = server.client()

    def ask(text: str, tokens: int = 40) -> str:
        return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}],
                                              max_tokens=tokens, temperature=0).choices[0].message.content

    replies = [ask(content)]
    with ThreadPoolExecutor(4) as pool:
        beside = [pool.submit(ask, other, 60) for other in (PROMPTS[0], PROMPTS[2], PROMPTS[3])]
        replies.append(pool.submit(ask, content).result())
        [f.result() for f in beside]
    replies.append(ask(content))
    assert replies == [expected.text] * 3


def test_a_closed_stream_stops_its_decode_and_the_next_request_is_right(server, decoder, monkeypatch):
    backend = decoder.backend
    verify = backend.verify

    def slow_verify(*args, **kwargs):  # the tiny model's decode outlasts the client's three chunks
        time.sleep(0.01)
        return verify(*args, **kwargs)

    monkeypatch.setattr(backend, "verify", slow_verify)
    client = server.client()
    cancelled = server.service.cancelled
    stream = client.completions.create(model=MODEL, prompt=PROMPTS[4], max_tokens=CONTEXT - 64, temperature=0,
                                       stream=True, extra_body={"prediction": {"type": "content", "content": "x"}})
    for _, _chunk in zip(range(3), stream):
        pass
    stream.close()
    deadline = time.monotonic() + 20
    while server.service.pending:  # the cancelled request leaves: nothing decodes
        assert time.monotonic() < deadline, "the closed stream's request still decodes"
        time.sleep(0.02)
    assert server.service.cancelled == cancelled + 1  # it left because the stream closed, not at its end
    steps = server.service.steps
    time.sleep(0.3)
    assert server.service.steps == steps  # the engine is idle: the decode stopped
    expected, _ = library_text(decoder, decoder.tokenizer(PROMPTS[5], add_special_tokens=True)["input_ids"],
                               max_new_tokens=20)
    started = time.monotonic()
    answer = client.completions.create(model=MODEL, prompt=PROMPTS[5], max_tokens=20, temperature=0)
    assert answer.choices[0].text == expected and time.monotonic() - started < 20


MALFORMED = [
    ("not json", b"{", 400, "invalid_json"),
    ("not an object", b"[1, 2]", 400, "invalid_json"),
    ("no messages", {"model": MODEL}, 400, "invalid_value"),
    ("empty messages", {"model": MODEL, "messages": []}, 400, "invalid_value"),
    ("bad role", {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_value"),
    ("temperature", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 3}, 400,
     "invalid_value"),
    ("max_tokens 0", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400,
     "invalid_value"),
    ("max tokens disagree", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
                             "max_completion_tokens": 6}, 400, "invalid_value"),
    ("five stops", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stop": list("abcde")}, 400,
     "invalid_value"),
    ("n > 1", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "unsupported_value"),
    ("logprobs", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "logprobs": True,
                  "prediction": {"type": "content", "content": "x"}}, 400, "unsupported_parameter"),
    ("tools", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
               "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "unsupported_parameter"),
    ("prediction type", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                         "prediction": {"type": "image", "content": "x"}}, 400, "invalid_value"),
    ("unknown model", {"model": "gpt-5", "messages": [{"role": "user", "content": "x"}]}, 404, "model_not_found"),
    ("over the context", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": CONTEXT}, 400,
     "context_length_exceeded"),
    ("prompt over the context", {"model": MODEL, "messages": [{"role": "user", "content": "y" * 2 * CONTEXT}]}, 400,
     "context_length_exceeded"),
]


@pytest.mark.parametrize("name, body, status, code", MALFORMED, ids=[case[0] for case in MALFORMED])
def test_a_malformed_request_gets_its_status_and_an_openai_error_and_the_server_answers_on(server, name, body,
                                                                                          status, code):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    got, answer, _ = server.post("/v1/chat/completions", raw)
    assert got == status, answer
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code and error["message"]
    reply = server.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "ok"}],
                                                    max_tokens=4, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_the_context_limit_error_names_the_limit(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=MODEL, prompt="abc", max_tokens=CONTEXT + 1, temperature=0)
    assert raised.value.code == "context_length_exceeded" and str(CONTEXT) in raised.value.message


def test_an_unknown_route_and_a_body_over_the_limit(decoder):
    live = LiveServer(decoder, max_body_bytes=1000)
    try:
        status, answer, _ = live.post("/v1/chat/completions", json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "x" * 2000}]}).encode())
        assert status == 413 and answer["error"]["code"] == "request_too_large"
        status, answer, _ = live.post("/v1/embeddings", b"{}")
        assert status == 404 and "error" in answer
    finally:
        live.close()


def test_an_api_key_is_required_when_set(decoder):
    live = LiveServer(decoder, api_key="s3cret")
    try:
        with pytest.raises(openai.AuthenticationError):
            live.client("wrong").models.list()
        with pytest.raises(openai.AuthenticationError):
            live.client("wrong").chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        assert [m.id for m in live.client("s3cret").models.list()] == [MODEL, "gpt-4o"]
        with urllib.request.urlopen(live.url + "/health", timeout=10) as response:  # health needs no key
            assert json.loads(response.read())["status"] == "ok"
    finally:
        live.close()


def test_a_full_queue_answers_503_with_retry_after(decoder):
    live = LiveServer(decoder, max_concurrent=1, max_waiting=0)
    release = threading.Event()
    try:
        ids = decoder.tokenizer("hold", add_special_tokens=True)["input_ids"]

        def hold(event):  # stalls the engine's thread on the first request's first tokens
            if event.kind == "tokens":
                release.wait(30)

        held = live.service.submit(ids, max_new_tokens=8, on_event=hold)
        status, answer, headers = live.post("/v1/completions", json.dumps(
            {"model": MODEL, "prompt": "x", "max_tokens": 4}).encode())
        assert status == 503 and answer["error"]["code"] == "server_busy" and headers.get("retry-after") == "1"
        release.set()
        held.finished.wait(30)
        reply = live.client().completions.create(model=MODEL, prompt="x", max_tokens=4, temperature=0)
        assert reply.choices[0].finish_reason in ("stop", "length")
    finally:
        release.set()
        live.close()


def test_models_lists_the_served_names(server):
    assert [model.id for model in server.client().models.list()] == [MODEL, "gpt-4o"]
    reply = server.client().chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}],
                                                    max_tokens=3, temperature=0)
    assert reply.model == "gpt-4o"


def test_the_serve_page_runs_against_a_live_server(decoder, tmp_path, monkeypatch, capsys):
    """docs/serve.md's client blocks, as a reader pastes them, against a server on the tiny model
    (the URL the page names stands for the live one; installs and `refdec serve` itself are not run)."""
    import re
    import shlex
    import shutil
    import subprocess
    from pathlib import Path

    from refdec import gguf_files
    from refdec.cli.main import main

    page = Path(__file__).resolve().parents[1] / "docs" / "serve.md"
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(), re.S | re.M)
    live = LiveServer(decoder, model_names=[gguf_files.EDITOR_MODEL_NAME])
    keyed = LiveServer(decoder, model_names=[gguf_files.EDITOR_MODEL_NAME], api_key="KEY")  # the $KEY lines
    monkeypatch.chdir(tmp_path)
    (tmp_path / "app.py").write_text("total = 1\nprint(total)\n")
    ran = []
    try:
        for language, text in blocks:
            text = text.replace("http://127.0.0.1:8000", live.url)
            if language == "python":
                exec(compile(text, "docs/serve.md", "exec"), {})
                ran.append("python")
                continue
            for line in text.replace("\\\n", " ").splitlines():
                command = line.split("  #", 1)[0].strip()
                if not command or command.startswith(("pip install", "refdec serve")):
                    continue
                if "$KEY" in command:
                    command = command.replace("$KEY", "KEY").replace(live.url, keyed.url)
                args = shlex.split(command)
                if args[0] == "curl":
                    if shutil.which("curl") is None:
                        continue
                    answer = json.loads(subprocess.run(args + ["-s"], capture_output=True, text=True,
                                                       check=True).stdout)
                    assert answer["object"] in ("text_completion", "list", "corpus", "corpus.deleted"), answer
                elif args[:2] == ["refdec", "edit"]:
                    code = main(args[1:])
                    err = capsys.readouterr().err
                    assert "tokens from" in err and code in (0, 1), err  # the tiny model writes no code block
                else:
                    raise AssertionError(f"docs/serve.md: no way to run {command!r}")
                ran.append(args[0] + " " + args[1])
    finally:
        live.close()
        keyed.close()
    assert "python" in ran and "refdec edit" in ran and ran.count("curl -H") == 3
