"""Specifies ``refdec edit FILE --server URL`` (refdec.cli.edit_remote): the edit goes to an
OpenAI-compatible server as chat messages with the file as ``prediction``, greedy; the reply's
code block is written only when the reply closed it. The server here is a stand-in that records
the request and answers a set reply (tests/test_serve_app.py specifies refdec's own server)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

from fastapi import FastAPI, Request  # noqa: E402

from live_server import serving  # noqa: E402
from refdec.cli.main import main  # noqa: E402

ORIGINAL = "def add(a, b):\n    return a + b\n"
EDITED = "def add(a, b):\n    return b + a\n"


def stand_in(reply: str, seen: list, status: int = 200):
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "editor", "object": "model", "created": 0, "owned_by": "x"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        seen.append((dict(request.headers), await request.json()))
        if status != 200:
            from fastapi.responses import JSONResponse

            return JSONResponse({"error": {"message": "nope", "type": "invalid_request_error", "param": None,
                                           "code": None}}, status_code=status)
        return {"id": "c", "object": "chat.completion", "created": 0, "model": "editor",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42,
                          "completion_tokens_details": {"accepted_prediction_tokens": 9,
                                                        "rejected_prediction_tokens": 2}}}

    return app


def test_the_edit_is_sent_with_its_prediction_and_the_reply_written(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("REFDEC_API_KEY", raising=False)
    source = tmp_path / "a.py"
    source.write_text(ORIGINAL)
    seen = []
    with serving(stand_in(f"Here it is:\n```python\n{EDITED}```\n", seen)) as url:
        assert main(["edit", str(source), "--instruction", "swap the operands", "--server", url, "--in-place",
                     "--api-key", "k3y"]) == 0
    assert source.read_text() == EDITED
    headers, body = seen[0]
    assert headers["authorization"] == "Bearer k3y"
    assert body["model"] == "editor" and body["temperature"] == 0
    assert body["prediction"] == {"type": "content", "content": ORIGINAL}
    assert ORIGINAL in body["messages"][-1]["content"] and "swap the operands" in body["messages"][-1]["content"]
    err = capsys.readouterr().err
    assert "prediction tokens accepted 9, rejected 2" in err


def test_a_reply_without_a_closed_block_writes_nothing(tmp_path, capsys):
    source = tmp_path / "a.py"
    source.write_text(ORIGINAL)
    out = tmp_path / "b.py"
    with serving(stand_in(f"```python\n{EDITED}", [])) as url:
        assert main(["edit", str(source), "--instruction", "swap", "--server", url, "--out", str(out)]) == 1
    assert not out.exists() and source.read_text() == ORIGINAL
    assert "nothing was written" in capsys.readouterr().err


def test_a_server_error_and_local_only_flags_are_named(tmp_path, capsys):
    source = tmp_path / "a.py"
    source.write_text(ORIGINAL)
    with serving(stand_in("", [], status=400)) as url:
        assert main(["edit", str(source), "--instruction", "swap", "--server", url, "--model", "editor"]) == 2
        assert "answered 400: nope" in capsys.readouterr().err
        assert main(["edit", str(source), "--instruction", "swap", "--server", url, "--compare"]) == 2
        assert "--compare: a flag of the local decode" in capsys.readouterr().err
    assert main(["edit", str(source), "--instruction", "swap", "--api-key", "k"]) == 2
    assert "--api-key goes with --server" in capsys.readouterr().err
