"""Specifies refdec.cli.generate, ``refdec generate``: the text streamed to stdout and stats to
stderr (flags reaching the decoder), ``--prompts-jsonl`` (one JSON line out per line in, in input
order, each written as soon as it and the lines before it are done), and errors naming the flag
or the line before any model loads."""

from __future__ import annotations

import argparse
import json
import re

import pytest
import torch

import refdec
import refdec.cli.generate as cli_generate
from refdec.cli import main
from tiny_models import tiny_llama


def parse(*argv):
    """``refdec generate`` arguments as the command parses them (``args.handler(args)`` runs it)."""
    parser = argparse.ArgumentParser(prog="refdec")
    cli_generate.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["generate", *map(str, argv)])


@pytest.mark.parametrize("flags, settings", [
    ([], {}),
    (["--repetition-penalty", "0.05", "--no-repeat-ngram-size", "3"],
     dict(repetition_penalty=0.05, no_repeat_ngram_size=3)),
    (["--sample", "--seed", "3", "--min-p", "0.2", "--temperature", "1.5"],
     dict(do_sample=True, seed=3, min_p=0.2, temperature=1.5)),
])
def test_cli_generate_streams_the_text_and_prints_stats(tmp_path, tiny_model_dir, tiny_tokenizer, capsys, flags,
                                                        settings):
    ref_file = tmp_path / "ref.txt"
    ref_file.write_text("abc abc abc", encoding="utf-8")
    args = parse("--prompt", "abc abc ab", "--model", tiny_model_dir(), "--reference", ref_file, "--max-new-tokens", 12,
                 "--max-draft-tokens", 8, *flags)
    assert args.handler(args) == 0
    captured = capsys.readouterr()
    loaded = tiny_llama().to(torch.float32)
    ids = tiny_tokenizer("abc abc ab", add_special_tokens=True)["input_ids"]
    out = refdec.generate(loaded, ids, max_new_tokens=12, max_draft_tokens=0, **settings)
    want = tiny_tokenizer.decode(out.sequences[0, len(ids):], skip_special_tokens=True)
    assert captured.out.rstrip("\n") == want.rstrip("\n")
    if settings:  # the flags reach the decoder: the text differs from plain greedy's
        plain = refdec.generate(loaded, ids, max_new_tokens=12, max_draft_tokens=0)
        assert plain.sequences.tolist() != out.sequences.tolist()
    assert "tokens/pass" in captured.err and "passes" in captured.err


def test_cli_rejects_a_bad_max_draft_tokens():
    with pytest.raises(SystemExit):
        parse("--prompt", "x", "--max-draft-tokens", "-1")


def test_cli_generate_prompts_jsonl_writes_each_completion_in_order(tmp_path, tiny_model_dir, tiny_tokenizer, capsys):
    """--prompts-jsonl: every prompt decoded in one batch, 2 rows at a time, one JSON line each,
    in input order, each completion the prompt's plain greedy continuation."""
    prompts = ["abc abc ab", "b", "ca ca ca cab", "abc"]
    lines = [json.dumps({"prompt": p}) for p in prompts]
    lines[2] = json.dumps({"prompt": prompts[2], "references": ["ca ca cab cab"]})
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    args = parse("--prompts-jsonl", tmp_path / "in.jsonl", "--model", tiny_model_dir(), "--max-new-tokens", 10,
                 "--max-batch-size", 2)
    assert args.handler(args) == 0
    captured = capsys.readouterr()
    rows = [json.loads(x) for x in captured.out.splitlines()]
    loaded = tiny_llama().to(torch.float32)
    assert [r["line"] for r in rows] == [0, 1, 2, 3]
    for row, text in zip(rows, prompts):
        ids = tiny_tokenizer(text)["input_ids"]
        out = refdec.generate(loaded, ids, max_new_tokens=10, max_draft_tokens=0)
        assert row["completion"] == tiny_tokenizer.decode(out.sequences[0, len(ids):], skip_special_tokens=True)
        assert row["new_tokens"] == out.stats.new_tokens and row["stop_reason"] == out.stats.stop_reason
    assert "4 prompts, at most 2 together" in captured.err

    # each line is written as soon as it and the lines before it are done: a run interrupted
    # while line 2 is written has already written lines 0 and 1
    real_dumps = json.dumps

    def interrupt_at_line_2(obj, *a, **kw):
        if isinstance(obj, dict) and obj.get("line") == 2:
            raise KeyboardInterrupt
        return real_dumps(obj, *a, **kw)

    args = parse("--prompts-jsonl", tmp_path / "in.jsonl", "--model", tiny_model_dir(), "--max-new-tokens", 10,
                 "--max-batch-size", 1)
    cli_generate.json.dumps, saved = interrupt_at_line_2, cli_generate.json.dumps
    try:
        with pytest.raises(KeyboardInterrupt):
            args.handler(args)
    finally:
        cli_generate.json.dumps = saved
    assert [json.loads(x) for x in capsys.readouterr().out.splitlines()] == rows[:2]


@pytest.mark.parametrize("content,message", [
    ('{"prompt": "a"}\nnot json\n', r"in.jsonl:2: not a JSON object"),
    ('{"text": "a"}\n', r'in.jsonl:1: expected an object with a "prompt" string'),
    ('{"prompt": "a", "references": "x"}\n', r'in.jsonl:1: "references" must be a list of strings'),
    ('{"prompt": "a", "seed": 3}\n', r"in.jsonl:1: unknown keys \['seed'\]"),
    ("\n\n", r"no prompts"),
])
def test_cli_generate_prompts_jsonl_errors_name_the_line_before_loading_a_model(tmp_path, capsys, content, message):
    (tmp_path / "in.jsonl").write_text(content, encoding="utf-8")
    code = main(["generate", "--prompts-jsonl", str(tmp_path / "in.jsonl"), "--model", str(tmp_path / "missing")])
    assert code == 2
    assert re.search(message, capsys.readouterr().err)


def test_cli_generate_max_batch_size_must_be_positive(tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text('{"prompt": "a"}\n', encoding="utf-8")
    assert main(["generate", "--prompts-jsonl", str(tmp_path / "in.jsonl"), "--max-batch-size", "0"]) == 2
    assert "--max-batch-size must be >= 1, got 0" in capsys.readouterr().err
    assert main(["generate", "--prompt", "a", "--max-batch-size", "2"]) == 2
    assert "--max-batch-size applies to --prompts-jsonl" in capsys.readouterr().err


def test_cli_generate_retrieve_without_index_is_an_error_before_loading_a_model(capsys):
    code = main(["generate", "--prompt", "x", "--retrieve", "2", "--model", "/nonexistent"])
    assert code != 0 and "--retrieve 2 needs --index" in capsys.readouterr().err


def test_cli_generate_an_empty_prompt_in_prompts_jsonl_names_its_line(tmp_path, tiny_model_dir, capsys):
    (tmp_path / "in.jsonl").write_text('{"prompt": "abc"}\n{"prompt": ""}\n', encoding="utf-8")
    assert main(["generate", "--prompts-jsonl", str(tmp_path / "in.jsonl"), "--model", str(tiny_model_dir())]) == 2
    assert "in.jsonl:2: the prompt is empty" in capsys.readouterr().err
