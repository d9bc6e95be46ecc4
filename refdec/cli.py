"""The ``refdec`` command line: a dispatcher over one module per command group."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def read_text_file(path: str) -> str:
    """A UTF-8 text file named on the command line, line endings kept as they are (CRLF stays
    CRLF); FileNotFoundError names a missing one, ValueError one that is not UTF-8."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    try:
        return file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def jsonl_lines(text: str) -> list[str]:
    """The lines of a JSON Lines text: split at "\n" only (str.splitlines also splits at U+2028,
    U+2029, U+0085 and form feeds, which json.dumps(ensure_ascii=False) leaves raw inside strings)."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def check_output_path(path: str, flag: str = "--out") -> None:
    """Before any work: ``path`` must be writable as a file (its directory exists, it is not a directory)."""
    out = Path(path)
    if out.is_dir():
        raise ValueError(f"{flag} {path} is a directory; give a file path")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise ValueError(f"{flag} {path}: not writable")


def set_threads(threads: int | None) -> None:
    """``--threads N``: torch's CPU threads (None: torch's default)."""
    if threads is None:
        return
    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    import torch

    torch.set_num_threads(threads)


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
    except (ValueError, ImportError, OSError) as exc:  # OSError: missing, unreadable or unwritable paths
        print(f"refdec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("refdec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
