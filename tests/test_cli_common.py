"""Specifies refdec.cli.common, the readers the commands share: text files keep their line endings
and a non-UTF-8 file is named; a JSON-lines file splits on its line breaks only; the engine a
model runs on, and the model arguments every model command takes."""

from __future__ import annotations

import pytest


def test_cli_text_files_keep_crlf_and_name_a_non_utf8_file(tmp_path):
    from refdec.cli.common import read_text_file

    (tmp_path / "crlf.py").write_bytes(b"a = 1\r\nb = 2\r\n")
    assert read_text_file(str(tmp_path / "crlf.py")) == "a = 1\r\nb = 2\r\n"  # was converted to LF
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.txt is not UTF-8 text"):
        read_text_file(str(tmp_path / "latin1.txt"))


def test_jsonl_records_holding_unicode_line_separators_are_one_line_each(tmp_path):
    """json.dumps(ensure_ascii=False) writes U+2028 / U+2029 raw inside strings; str.splitlines split
    such a record in two (a valid --prompts-jsonl file was rejected, an index record dropped)."""
    import json

    from refdec.cli.generate import read_prompts_jsonl
    from refdec.cli.index import SourceStats, read_documents

    texts = ["first\u2028line", "second\u2029x\x85y\x0cz", "third"]
    for key in ("prompt", "text"):
        body = "\r\n".join(json.dumps({key: t}, ensure_ascii=False) for t in texts) + "\n"
        (tmp_path / f"{key}.jsonl").write_text(body, encoding="utf-8", newline="")
    assert [r["prompt"] for r in read_prompts_jsonl(str(tmp_path / "prompt.jsonl"))] == texts
    stats = SourceStats()
    assert list(read_documents([tmp_path / "text.jsonl"], "text", stats)) == texts
    assert stats.bad_records == 0


def test_the_engine_follows_the_model_and_is_never_a_silent_choice(monkeypatch, capsys):
    import refdec.cli.common as common

    monkeypatch.setattr(common, "llama_cpp_available", lambda: True)
    assert common.choose_engine("qwen2.5-coder-1.5b-instruct", None) == "llama.cpp"
    assert common.choose_engine("qwen2.5-coder-1.5b-instruct", "transformers") == "transformers"
    assert common.choose_engine("m.GGUF", None) == "llama.cpp"
    assert common.choose_engine("some/dir", None) == "transformers"
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(common, "llama_cpp_available", lambda: False)
    assert common.choose_engine("gemma-3-270m", None) == "transformers"
    assert "gemma-3-270m runs on transformers" in capsys.readouterr().err  # said, not silent
    with pytest.raises(ValueError, match="m.gguf is a GGUF file, which refdec decodes on llama.cpp"):
        common.choose_engine("m.gguf", "transformers")
    with pytest.raises(ValueError, match="--engine llama.cpp needs a GGUF file or a built-in name"):
        common.choose_engine("some/dir", "llama.cpp")
    with pytest.raises(ValueError, match="--engine must be one of llama.cpp, transformers, got 'vllm'"):
        common.choose_engine("some/dir", "vllm")


def test_no_exact_is_a_model_argument_of_each_model_command():
    from refdec.cli.main import build_parser

    parser = build_parser()
    for command in (["edit", "f.py", "--instruction", "x"], ["serve"], ["generate", "--prompt", "x"]):
        assert parser.parse_args(command).exact is None  # exact mode where it can run
        assert parser.parse_args(command + ["--no-exact"]).exact is False


@pytest.mark.llama
def test_a_gguf_model_argument_is_a_llama_with_the_asked_prefill_chunk(tiny_gguf):
    pytest.importorskip("llama_cpp")
    from refdec.cli.common import load_model_arg

    llm, tokenizer, engine = load_model_arg(str(tiny_gguf), 1, "llama.cpp", n_ctx=256, n_batch=64)
    assert engine == "llama.cpp" and llm.n_batch == 64 and llm.n_ctx() == 256
    assert tokenizer is not None
    default, _, _ = load_model_arg(str(tiny_gguf), 1, "llama.cpp", n_ctx=1024)
    assert default.n_batch == 512  # llama-cpp-python's own
