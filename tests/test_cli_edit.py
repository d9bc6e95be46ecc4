"""Specifies refdec.cli.edit, ``refdec edit``: the file written (or streamed to stdout) is plain
greedy decoding's output up to the closing fence, with the diff and stats printed; a missing file
is an error naming it; ``--compare`` warms both methods up before it times them."""

from __future__ import annotations

import pytest


@pytest.fixture
def tiny_model_dir_3(tiny_model_dir):
    """A tiny random Llama (seed 3) and the character tokenizer, saved like a real model directory."""
    return tiny_model_dir(3)


ORIGINAL_TEXT = "def f(x):\n    return x + 1\n\n\ndef g(y):\n    return f(y) * 2\n"


def run_cli(capsys, *argv):
    from refdec.cli import main

    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_edit_writes_out_and_prints_the_diff_and_stats(capsys, tmp_path, tiny_model_dir_3):
    import torch

    from refdec.edit_prompt import build_edit_prompt
    from refdec.models import load_model

    src = tmp_path / "m.py"
    src.write_text(ORIGINAL_TEXT)
    out = tmp_path / "new.py"
    code, stdout, stderr = run_cli(capsys, "edit", src, "--instruction", "rename g to h", "--model", tiny_model_dir_3,
                                   "--out", out, "--max-new-tokens", 24, "--diff", "--compare")
    # the tiny random model never closes the fence: a truncated reply writes nothing
    model, tokenizer = load_model(str(tiny_model_dir_3))
    prompt = build_edit_prompt(ORIGINAL_TEXT, "rename g to h", path="m.py")
    ids = tokenizer(prompt.text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        want = model.generate(ids, do_sample=False, max_new_tokens=24, pad_token_id=0, attention_mask=None)
    assert prompt.stop not in tokenizer.decode(want[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
    assert code == 1
    assert not out.exists() and src.read_text() == ORIGINAL_TEXT
    assert "stopped at --max-new-tokens 24 before the closing fence" in stderr
    assert "nothing was written" in stderr and "Raise --max-new-tokens" in stderr
    assert "--- a/m.py" not in stdout


def test_edit_streams_the_file_to_stdout_without_out(capsys, tmp_path, tiny_model_dir_3):
    src = tmp_path / "m.py"
    src.write_text(ORIGINAL_TEXT)
    code, stdout, stderr = run_cli(capsys, "edit", src, "--instruction", "add a docstring", "--model", tiny_model_dir_3,
                                   "--max-new-tokens", 16, "--prompt-template", "rewrite")
    assert stdout.strip() and "--- a/" not in stdout  # streamed as it came
    assert code == 0 and "[refdec edit] warning: stopped at --max-new-tokens 16" in stderr  # and said to be cut


def test_edit_compare_warms_both_methods_up_before_timing_them(monkeypatch, tmp_path, capsys, tiny_model_dir):
    import refdec

    calls = []
    generate = refdec.SpeculativeDecoder.generate

    def recording(self, input_ids, **kwargs):
        calls.append((kwargs["max_draft_tokens"], kwargs["max_new_tokens"]))
        return generate(self, input_ids, **kwargs)

    monkeypatch.setattr(refdec.SpeculativeDecoder, "generate", recording)
    src = tmp_path / "m.py"
    src.write_text("def f(x):\n    return x + 1\n")
    code, _, err = run_cli(capsys, "edit", src, "--instruction", "rename f", "--model", tiny_model_dir(),
                           "--max-new-tokens", "12", "--compare", "--diff")
    assert code == 0, err
    assert "warm-up before timing" in err and "outputs identical: True" in err
    # both paths run (untimed) before the timed refdec run, then the timed plain run
    assert calls == [("auto", 4), (0, 4), ("auto", 12), (0, 12)]


def test_edit_of_a_missing_file_is_an_error_naming_it(capsys, tmp_path):
    code, _, stderr = run_cli(capsys, "edit", tmp_path / "nope.py", "--instruction", "x")
    assert code == 2 and "nope.py" in stderr


def test_edit_defaults_to_the_editor_model_through_its_chat_template(capsys, tmp_path, tiny_model_dir_3, monkeypatch):
    """Without --model: the editor model (a stand-in here), on transformers when llama-cpp-python is
    missing (said on stderr), its prompt through the chat template; a reply cut before the closing
    fence writes nothing and leaves the file as it was."""
    import refdec.cli.common
    import refdec.cli.edit
    import refdec.models
    from refdec.models import load_model

    def stand_in():
        model, tokenizer = load_model(str(tiny_model_dir_3))
        tokenizer.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        return model, tokenizer

    loaded, chat_prompts = [], []
    monkeypatch.setattr(refdec.models, "load_editor", lambda **kw: loaded.append(kw) or stand_in())
    monkeypatch.setattr(refdec.cli.common, "llama_cpp_available", lambda: False)
    real_build = refdec.cli.edit.build_chat_edit_prompt
    monkeypatch.setattr(refdec.cli.edit, "build_chat_edit_prompt",
                        lambda *a: chat_prompts.append(real_build(*a)) or chat_prompts[-1])
    src = tmp_path / "m.py"
    src.write_text(ORIGINAL_TEXT)
    out = tmp_path / "new.py"
    code, _, stderr = run_cli(capsys, "edit", src, "--instruction", "rename g to h", "--out", out,
                              "--max-new-tokens", 8)
    assert loaded == [{}] and len(chat_prompts) == 1  # the editor model, through its chat template
    assert chat_prompts[0].text.startswith("<system>") and chat_prompts[0].text.endswith("```\n")
    assert "qwen2.5-coder-1.5b-instruct runs on transformers" in stderr and "pip install 'refdec[llama]'" in stderr
    assert code == 1 and "stopped at --max-new-tokens 8 before the closing fence" in stderr
    assert not out.exists() and src.read_text() == ORIGINAL_TEXT
    code, _, stderr = run_cli(capsys, "edit", src, "--instruction", "x", "--model", tiny_model_dir_3, "--engine",
                              "llama.cpp")
    assert code == 2 and "--engine llama.cpp needs a GGUF file or a built-in name" in stderr


def test_in_place_replaces_the_file_only_with_a_complete_reply(capsys, tmp_path, tiny_model_dir_3, monkeypatch):
    """--in-place: a reply that closes the fence replaces FILE (atomically, its other links as a new
    file's, its mode kept: an executable script stays executable); one cut before the fence leaves
    FILE as it was and exits 1. The decode is a stand-in that replies with a given text (a tiny
    random model never closes the fence)."""
    import os
    import stat
    from types import SimpleNamespace

    import torch

    import refdec

    src = tmp_path / "m.py"
    src.write_text(ORIGINAL_TEXT)
    src.chmod(0o755)
    edited = ORIGINAL_TEXT.replace("def g(y)", "def h(y)")

    def reply_with(text):
        def generate(decoder, input_ids, *, tokenizer, max_new_tokens, **kwargs):
            new = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][:, :max_new_tokens]
            stop = "max_new_tokens" if new.shape[1] == max_new_tokens else "stop_string"
            stats = SimpleNamespace(wall_seconds=1.0, stop_reason=stop, new_tokens=new.shape[1], forward_passes=2,
                                    tokens_per_pass=new.shape[1] / 2, accepted_tokens=0, proposed_tokens=0,
                                    prefill_seconds=0.1, cached_prompt_tokens=0)
            return SimpleNamespace(sequences=torch.cat([input_ids, new], dim=1), stats=stats)
        return generate

    monkeypatch.setattr(refdec.SpeculativeDecoder, "generate", reply_with(edited + "`````\n"))
    code, stdout, stderr = run_cli(capsys, "edit", src, "--instruction", "rename g to h", "--model", tiny_model_dir_3,
                                   "--in-place", "--prompt-template", "rewrite", "--max-new-tokens", 500)
    assert code == 0, stderr
    assert src.read_text() == edited and stdout == ""
    assert stat.S_IMODE(os.stat(src).st_mode) == 0o755
    assert [p.name for p in tmp_path.iterdir()] == ["m.py"]  # no temporary left beside it
    monkeypatch.setattr(refdec.SpeculativeDecoder, "generate", reply_with(ORIGINAL_TEXT))  # the fence never comes
    code, _, stderr = run_cli(capsys, "edit", src, "--instruction", "rename h to k", "--model", tiny_model_dir_3,
                              "--in-place", "--prompt-template", "rewrite", "--max-new-tokens", 20)
    assert code == 1 and src.read_text() == edited
    assert "stopped at --max-new-tokens 20 before the closing fence" in stderr and "nothing was written" in stderr
    with pytest.raises(SystemExit) as exit_:
        run_cli(capsys, "edit", src, "--instruction", "x", "--in-place", "--out", tmp_path / "o.py")
    assert exit_.value.code == 2 and "argument --out: not allowed with argument --in-place" in capsys.readouterr().err
