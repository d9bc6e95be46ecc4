"""Specifies ``refdec serve`` (refdec.cli.serve): its arguments are checked before a model loads,
and the server it starts answers OpenAI requests with what the library gives (on the tiny
transformers Llama here; tests/test_serve_app.py runs a live server on llama.cpp)."""

from __future__ import annotations

import pytest

import refdec
from refdec.cli.main import main


@pytest.mark.parametrize("argv, message", [
    (["--max-concurrent", "0"], "--max-concurrent must be >= 1"),
    (["--ctx", "4"], "--ctx must be >= 16"),
    (["--prefix-cache", "-1"], "--prefix-cache must be >= 0"),
    (["--port", "70000"], "--port must be in"),
    (["--index", "/nonexistent.refdec"], "no such file"),
    (["--served-model-name", " "], "must not be empty"),
    (["--index", "a=/x.refdec", "--index", "a=/y.refdec"], "the name 'a' is given twice"),
    (["--index", "bad name=/x.refdec"], "corpus name"),
    (["--memory-mb", "-1"], "--memory-mb must be in"),
    (["--prefill-chunk", "8"], "--prefill-chunk must be >= 16"),
])
def test_bad_arguments_are_refused_before_anything_loads(capsys, argv, message):
    assert main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_server_answers_with_the_librarys_output(monkeypatch, capsys, tiny_model_dir):
    pytest.importorskip("fastapi")
    uvicorn = pytest.importorskip("uvicorn")
    from fastapi.testclient import TestClient

    answers = {}

    def run(app, host, port, **_settings):  # instead of serving: ask the app, as a client would
        assert (host, port) == ("127.0.0.1", 8000)
        with TestClient(app) as client:
            answers["models"] = client.get("/v1/models").json()
            answers["completion"] = client.post("/v1/completions", json={
                "model": "tiny", "prompt": "abcabcabc", "max_tokens": 12, "temperature": 0,
                "prediction": {"type": "content", "content": "abcabcabcabc"}}).json()
            answers["chat"] = client.post("/v1/chat/completions", json={
                "model": "tiny", "messages": [{"role": "user", "content": "x"}]})

    monkeypatch.setattr(uvicorn, "run", run)
    model_dir = str(tiny_model_dir())
    assert main(["serve", "--model", model_dir, "--served-model-name", "tiny", "--threads", "1", "--ctx", "128",
                 "--max-concurrent", "2"]) == 0
    assert "on transformers, 2 concurrent requests of up to 128 tokens" in capsys.readouterr().err
    assert [m["id"] for m in answers["models"]["data"]] == ["tiny"]
    model, tokenizer = refdec.models.load_model(model_dir)
    ids = tokenizer("abcabcabc")["input_ids"]
    out = refdec.generate(model, ids, max_new_tokens=12, references=["abcabcabcabc"], tokenizer=tokenizer)
    expected = tokenizer.decode(out.sequences[0, len(ids):], skip_special_tokens=True)
    completion = answers["completion"]
    assert completion["choices"][0]["text"] == expected
    assert completion["usage"]["completion_tokens"] == out.stats.new_tokens
    chat = answers["chat"]  # the character tokenizer has no chat template
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
