"""benchmarks.serve: aider's command and runs, the per-edit ratios and the aider table (a fake aider
script; no server, no model)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from benchmarks import serve


def test_aider_is_asked_for_the_file_offline_without_git_and_without_questions():
    command = serve.aider_command("aider", "http://127.0.0.1:8200", "Rename x", Path("/w/a.py"), "diff")
    assert command[0] == "aider" and command[-3:] == ["--message", "Rename x", "/w/a.py"]
    for flag in ("--no-git", "--yes-always", "--no-check-update", "--analytics-disable"):
        assert flag in command
    assert command[command.index("--edit-format") + 1] == "diff"
    assert command[command.index("--openai-api-base") + 1] == "http://127.0.0.1:8200/v1"
    assert command[command.index("--model") + 1] == f"openai/{serve.MODEL_ID}"


def test_an_aider_run_edits_a_fresh_copy_of_the_file_and_reports_the_result(tmp_path):
    fake = tmp_path / "aider"  # writes the file it is given in upper case, as an edit
    fake.write_text(f"#!{sys.executable}\nimport os, sys\nfrom pathlib import Path\n"
                    "assert os.environ['LITELLM_LOCAL_MODEL_COST_MAP'] == 'True'\n"
                    "p = Path(sys.argv[-1]); p.write_text(p.read_text().upper())\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    row = {"path": "src/a.py", "before": "x = 1\n", "message": "shout"}
    run = serve.aider_edit(str(fake), "http://127.0.0.1:1", row, "whole", tmp_path / "work")
    assert run["returncode"] == 0, run["output_tail"]
    assert run["changed"] and run["text"] == "X = 1\n" and run["format"] == "whole"
    (tmp_path / "work" / "a.py").write_text("left over")
    again = serve.aider_edit(str(fake), "http://127.0.0.1:1", row, "whole", tmp_path / "work")
    assert again["text"] == "X = 1\n"  # each run starts from the original file


def test_the_tables_compare_each_edit_with_lcps():
    def run(seconds, text):
        return {"seconds": seconds, "text": text, "changed": text != "old"}

    runs = {("refdec", "whole"): [run(10.0, "a"), run(20.0, "b")], ("lcp", "whole"): [run(15.0, "a"), run(20.0, "c")]}
    table = serve.aider_table(runs)
    assert "| refdec | whole | 2 | 15.0 | 1.25x, 1.00x | 2/2 | 2/2 |" in table
    assert "| lcp | whole | 2 | 17.5 | 1.00x, 1.00x | 2/2 | 1/2 |" in table
    answers = {"refdec": {"1": [{"tokens": 100, "seconds": 2.0}, {"tokens": 50, "seconds": 5.0}]},
               "lcp": {"1": [{"tokens": 100, "seconds": 4.0}, {"tokens": 50, "seconds": 5.0}]}}
    assert serve.per_edit_ratios(answers) == {"refdec": [2.0, 1.0], "lcp": [1.0, 1.0]}
    assert serve.per_edit_ratios({"refdec": answers["refdec"]}) == {}
