"""Specifies refdec.cli.main, the ``refdec`` dispatcher: a user mistake in any command is one line
naming the flag or file typed, exit status 2, before any model or tokenizer loads, never a
traceback; an unknown flag shows the command's usage."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("command", ["generate", "edit"])
def test_cli_threads_must_be_positive(tmp_path, capsys, command):
    from refdec.cli import main

    (tmp_path / "f.py").write_text("x = 1\n", encoding="utf-8")
    args = ["--prompt", "a"] if command == "generate" else [str(tmp_path / "f.py"), "--instruction", "x"]
    assert main([command, *args, "--threads", "0"]) == 2
    assert "--threads must be >= 1, got 0" in capsys.readouterr().err


def test_cli_user_mistakes_are_errors_before_any_work_not_tracebacks(tmp_path, capsys):
    from refdec.cli import main

    (tmp_path / "f.py").write_text("x = 1\n", encoding="utf-8")
    # --out in a missing directory / a directory: refused before the model or tokenizer loads
    assert main(["edit", str(tmp_path / "f.py"), "--instruction", "x", "--model", str(tmp_path / "no-model"),
                 "--out", str(tmp_path / "missing" / "new.py")]) == 2
    err = capsys.readouterr().err
    assert "new.py: directory" in err and "does not exist" in err
    assert main(["index", "build", str(tmp_path), "--tokenizer", str(tmp_path / "no-tok"), "--out", str(tmp_path)]) == 2
    assert "is a directory; give a file path" in capsys.readouterr().err
    # an OSError (here: a directory given as the index file) is a message, not a traceback
    assert main(["index", "info", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("refdec: error:")
    # sampling flags without --sample were silently ignored
    assert main(["generate", "--prompt", "a", "--temperature", "0.5", "--seed", "1"]) == 2
    assert "--temperature, --seed need --sample" in capsys.readouterr().err


def test_cli_errors_name_the_flag_the_file_and_show_the_command_usage(tmp_path, capsys):
    """Second round of user mistakes: each is one line naming what was typed, exit status 2."""
    from refdec.cli import main

    (tmp_path / "f.py").write_text("x = 1\n", encoding="utf-8")
    (tmp_path / "d").mkdir()
    cases = [
        (["generate", "--prompt-file", str(tmp_path / "d")], "is a directory, not a file"),
        (["generate", "--prompt", "a", "--sample", "--temperature", "0"], "--temperature must be > 0"),
        (["generate", "--prompt", "a", "--sample", "--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
        (["generate", "--prompt", "a", "--max-new-tokens", "-5"], "--max-new-tokens must be >= 0, got -5"),
        (["generate", "--prompt", "a", "--repetition-penalty", "0"], "--repetition-penalty must be > 0"),
        (["generate", "--prompt", "a", "--stop", ""], "--stop must be a non-empty string"),
        (["generate", "--prompt", "a", "--seed", "3"], "--seed needs --sample"),
        (["generate", "--prompt", "a", "--index", str(tmp_path / "none.refdec")], "--index"),
        (["generate", "--prompt", "a", "--model", str(tmp_path / "d")], "is not a model directory (it has no config.json)"),
        (["generate", "--prompt", "a", "--model", "no-such-model-name"], "refdec does not download"),
        (["edit", str(tmp_path / "f.py"), "--instruction", " "], "--instruction must be a non-empty text"),
        (["edit", str(tmp_path / "f.py"), "--instruction", "x", "--prompt-template", "nosuch"],
         "neither a template name"),
        (["index", "info", str(tmp_path / "d")], "is a directory, not a file"),
        (["index", "build", str(tmp_path / "f.py"), "--out", "/dev/null"], "is not a regular file"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)
    (tmp_path / "tpl.txt").write_text("{original} {instruction.upper}", encoding="utf-8")
    assert main(["edit", str(tmp_path / "f.py"), "--instruction", "x", "--prompt-template",
                 str(tmp_path / "tpl.txt")]) == 2
    assert "template field {instruction.upper} is not one of" in capsys.readouterr().err
    # an unknown flag shows the subcommand's usage; no subcommand shows the help
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--prompt", "a", "--bogus"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: refdec generate") and "unrecognized arguments: --bogus" in err
    assert main(["index"]) == 2 and "{build,info}" in capsys.readouterr().err
    assert main([]) == 2 and "{index,generate,edit,serve,calibrate,build-llama}" in capsys.readouterr().err
