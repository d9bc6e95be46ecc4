"""The benchmarks package's shared modules: the data root, the Python-source reader's skip rule,
the result writer, the tiny model of the long run (e2e --long-run), and the package's import
rules (no data, no model, no network; the tests that read the shared data skip without it)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks import data, report, simulate, tiny_model

BENCH_DIR = Path(data.__file__).resolve().parent


# ---------------------------------------------------------------- the data root

def test_data_root_is_REFDEC_DATA_else_shared_data_beside_the_repository(monkeypatch, tmp_path):
    monkeypatch.delenv("REFDEC_DATA", raising=False)
    assert data.data_dir() == BENCH_DIR.parent.parent / "shared" / "data"
    monkeypatch.setenv("REFDEC_DATA", str(tmp_path))
    assert data.data_dir() == tmp_path


def test_a_missing_data_file_is_an_error_naming_the_path_and_REFDEC_DATA(monkeypatch, tmp_path):
    monkeypatch.setenv("REFDEC_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"edits-click\.jsonl.*REFDEC_DATA"):
        data.edit_rows()


def test_simulate_without_the_data_says_so_and_does_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("REFDEC_DATA", str(tmp_path / "absent"))
    assert simulate.main(["--quick", "--json", str(tmp_path / "out.json")]) == 0
    assert "not found (set REFDEC_DATA)" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_chat_questions_read_first_turns_by_category(monkeypatch, tmp_path):
    monkeypatch.setenv("REFDEC_DATA", str(tmp_path))
    rows = [{"category": "rag", "turns": ["r1", "r1b"]}, {"category": "summarization", "turns": ["s1"]},
            {"category": "rag", "turns": ["r2"]}]
    (tmp_path / "specbench-question.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    (tmp_path / "mtbench-question.jsonl").write_text(json.dumps({"turns": ["m1", "m1b"]}) + "\n")
    assert data.chat_questions("rag") == ["r1", "r2"]
    assert data.chat_questions("rag", limit=1) == ["r1"]
    assert data.chat_questions("mtbench") == ["m1"]


# ---------------------------------------------------------------- the Python-source reader

def _tree(root: Path, files: dict) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


def test_source_reader_skips_installed_packages_non_utf8_files_and_test_suites_only_when_asked(tmp_path):
    _tree(tmp_path, {
        "b.py": b"b = 1\r\n",                      # CRLF kept as it is (no newline translation)
        "a/x.py": b"x = 1\n",
        "a/notes.txt": b"not python\n",
        "site-packages/pkg/y.py": b"y = 1\n",      # installed, not the library
        "dist-packages/z.py": b"z = 1\n",
        "latin1.py": "s = 'é'\n".encode("latin-1"),  # not UTF-8
        "test/test_a.py": b"t = 1\n",
        "idlelib/idle_test/t.py": b"t = 2\n",
        "pkg/tests/t.py": b"t = 3\n",
        "pkg/testing.py": b"t = 4\n",             # not a test suite
    })
    skipped: list = []
    with_tests = list(data.iter_python_sources(tmp_path, tests=True, skipped=skipped))
    assert [d.name for d in with_tests] == ["a/x.py", "b.py", "idlelib/idle_test/t.py", "pkg/testing.py",
                                            "pkg/tests/t.py", "test/test_a.py"]
    assert skipped == ["latin1.py"]
    assert with_tests[1].text == "b = 1\r\n"
    without = [d.name for d in data.iter_python_sources(tmp_path, tests=False)]
    assert without == ["a/x.py", "b.py", "pkg/testing.py"]


def test_held_out_split_is_a_deterministic_partition():
    docs = [data.Document(f"m{i}.py", "") for i in range(500)]
    corpus, held_out = data.held_out_split(docs)
    assert sorted(corpus + held_out) == list(range(500))
    assert 0 < len(held_out) < 30
    assert data.held_out_split(docs) == (corpus, held_out)


# ---------------------------------------------------------------- workloads on the shared data

@pytest.fixture(scope="module")
def shared_data_and_tokenizer():
    if not (data.data_dir() / "edits-click.jsonl").exists():
        pytest.skip(f"no shared data at {data.data_dir()} (set REFDEC_DATA)")
    from benchmarks import tokens

    try:
        tokens.tokenizer()
    except Exception as exc:  # the default model's tokenizer is not installed / converted here
        pytest.skip(f"default tokenizer unavailable: {exc}")
    return tokens


def test_edits_workload_measures_the_prompt_refdec_edit_ships(shared_data_and_tokenizer):
    from refdec.edit_prompt import build_edit_prompt

    from benchmarks import workloads

    tokens = shared_data_and_tokenizer
    rows = data.edit_rows()[:3]
    cases = workloads.load_edits(3).cases
    for row, case in zip(rows, cases):
        prompt = build_edit_prompt(row["before"], row["message"], path=row["path"]).text  # refdec edit's default
        assert case.prompt.tolist() == tokens.encode(prompt, bos=True).tolist()
        assert case.references[0].tolist() == tokens.encode(row["before"], bos=False).tolist()
        assert case.output.tolist() == tokens.encode(row["after"], bos=False).tolist()


# ---------------------------------------------------------------- the result writer

def test_write_result_adds_the_run_record(tmp_path):
    torch.set_num_threads(torch.get_num_threads())
    path = report.write_result(tmp_path / "sub" / "r.json", {"rows": [1, 2], "value": np.float32(0.5)},
                               argv=["--quick", "--limit", "2"])
    got = json.loads(path.read_text())
    assert got["rows"] == [1, 2] and got["value"] == "0.5"  # what JSON cannot hold is written as str
    assert got["argv"] == ["--quick", "--limit", "2"]
    assert got["command"].endswith(" --quick --limit 2")
    assert got["machine"]["torch_threads"] == torch.get_num_threads()
    assert got["machine"]["cpu_count"] >= 1
    assert "git_commit" in got and got["git_dirty"] in (True, False, None)
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temporary file left


def test_write_result_refuses_a_payload_holding_the_run_records_keys(tmp_path):
    with pytest.raises(ValueError, match=r"\['machine', 'argv'\]|\['argv', 'machine'\]"):
        report.write_result(tmp_path / "r.json", {"machine": {}, "argv": []})


def test_result_path_is_the_json_argument_else_a_file_in_out():
    assert report.result_path("x/y.json", "simulate") == Path("x/y.json")
    assert report.result_path(None, "index_bench", timestamp=False) == report.OUT_DIR / "index_bench.json"
    stamped = report.result_path(None, "simulate")
    assert stamped.parent == report.OUT_DIR and stamped.name.startswith("simulate-")


# ---------------------------------------------------------------- the tiny models (leak_check, gpu)

@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_tiny_models_are_the_test_suites_tiny_models_and_prompts(family):
    # leak_check.py's recorded figures were taken with tests/tiny_models.py's model and prompts;
    # gpu.py checks on a GPU the models the tests check on a CPU
    from tiny_models import MODEL_BUILDERS, repetitive_prompts

    for seed in (0, 1):
        ours, theirs = tiny_model.TINY_MODELS[family](seed), MODEL_BUILDERS[family](seed)
        assert ours.dtype == theirs.dtype == torch.float64
        assert ours.config.to_dict() == theirs.config.to_dict()
        ours_state, theirs_state = ours.state_dict(), theirs.state_dict()
        assert ours_state.keys() == theirs_state.keys()
        assert all(torch.equal(ours_state[k], theirs_state[k]) for k in ours_state)
        assert tiny_model.repetitive_prompts(64, seed=seed) == repetitive_prompts(64, seed=seed)
    assert tiny_model.TINY_MODELS[family](dtype=torch.float32).dtype == torch.float32


# ---------------------------------------------------------------- the package's import rules

# refdec modules whose public names the benchmarks may use (the engine's modules move)
PUBLIC_REFDEC_MODULES = {"refdec", "refdec.vllm", "refdec.vllm.proposer", "refdec.drafting.proposer", "refdec.sizing.budget", "refdec.transformers.calibration", "refdec.models",
                         "refdec.edit_prompt", "refdec.drafting.index", "refdec.drafting.retrieval", "refdec.sizing.acceptance",
                         "refdec.gguf_files", "refdec.llama_cpp.plain", "refdec.llama_cpp.api",
                         "refdec.llama_cpp.calibration"}
PUBLIC_FROM_SUBMODULES = {"refdec.drafting.proposer": {"CursorParams", "SourceParams"},
                          "refdec.drafting.index": {"tokenizer_fingerprint"},
                          "refdec.llama_cpp.api": {"TreeContext"},  # llama.cpp's context, for the numerics benchmark
                          "refdec.llama_cpp.calibration": {"measure"}}  # a curve measured under load (--load-curve)


def _imports(tree: ast.AST):
    """(module, names) of every import in ``tree``, nested ones included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ()
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module, tuple(alias.name for alias in node.names)


@pytest.mark.parametrize("path", sorted(BENCH_DIR.glob("*.py")), ids=lambda p: p.name)
def test_benchmark_imports_the_package_and_refdecs_public_names_without_touching_sys_path(path):
    source = path.read_text()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
            pytest.fail(f"{path.name}:{node.lineno} uses sys.path")
    local = {p.stem for p in BENCH_DIR.glob("*.py")}
    for module, names in _imports(tree):
        top = module.split(".")[0]
        assert top not in ("tests", "tiny_models", "conftest", "naive_index", "word_tokenizer"), (path.name, module)
        assert top not in local, f"{path.name} imports {module!r}: write `from benchmarks import {top}`"
        if top == "refdec":
            assert module in PUBLIC_REFDEC_MODULES, f"{path.name} imports refdec internals: {module}"
            assert not any(name.startswith("_") for name in names), (path.name, module, names)
            if module in PUBLIC_FROM_SUBMODULES:
                assert set(names) <= PUBLIC_FROM_SUBMODULES[module], (path.name, module, names)
    # the same for the code the index and memory benchmarks run in child processes
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
            assert "refdec.drafting.index import CorpusIndex" not in node.value, path.name


# ---------------------------------------------------------------- python -m benchmarks

def test_python_m_benchmarks_lists_every_runnable_benchmark_once(capsys):
    from benchmarks import __main__ as listing

    assert listing.main() == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    with_main = sorted(p.stem for p in BENCH_DIR.glob("*.py") if not p.stem.startswith("_")
                       and "\ndef main(" in p.read_text())
    assert [line.split()[0] for line in lines] == with_main
    assert all(len(line.split(None, 1)) == 2 for line in lines), "a benchmark without a docstring"
    assert listing.summary("Does X. Then Y.\n\nMore.") == "Does X."
