"""``python -m benchmarks``: every runnable benchmark of the package, one line each (the first sentence
of its docstring), and how to run one. A runnable benchmark is a module with a ``main``; the
others are the shared modules the package docstring lists."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def runnable() -> dict[str, str]:
    """{module name: the first sentence of its docstring} for each module that defines ``main``."""
    found = {}
    for path in sorted(PACKAGE.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        tree = ast.parse(path.read_text())
        if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
            found[path.stem] = summary(ast.get_docstring(tree) or "")
    return found


def summary(docstring: str, width: int = 100) -> str:
    """The first sentence of a docstring's first paragraph, on one line, at most ``width`` characters."""
    first = " ".join(docstring.strip().split("\n\n")[0].split())
    end = first.find(". ")
    first = first if end < 0 else first[:end + 1]
    return first if len(first) <= width else first[:width - 3].rstrip() + "..."


def main() -> int:
    scripts = runnable()
    width = max(map(len, scripts))
    print("refdec's benchmarks (python -m benchmarks.NAME --help for each one's flags; results: "
          "benchmarks/RESULTS.md):")
    for name, line in scripts.items():
        print(f"  {name:<{width}}  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
