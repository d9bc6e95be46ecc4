"""The ``refdec`` command line: a dispatcher over one module per command group."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def read_text_file(path: str) -> str:
    """A UTF-8 text file named on the command line; FileNotFoundError names a missing one."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    return file.read_text(encoding="utf-8")


def build_parser() -> argparse.ArgumentParser:
    from refdec import cli_edit, cli_generate, cli_index

    parser = argparse.ArgumentParser(prog="refdec", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    cli_index.register(commands)
    cli_generate.register(commands)
    cli_edit.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"refdec: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
