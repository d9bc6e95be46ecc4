"""The ``refdec`` command line: a dispatcher over one module per command group."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DESCRIPTION = ("Lossless speculative decoding for Hugging Face causal LMs: generate text, edit files many "
               "tokens per pass, build corpus indexes. The output is exactly what plain decoding gives.")


def read_text_file(path: str) -> str:
    """A UTF-8 text file named on the command line, line endings kept as they are (CRLF stays
    CRLF); FileNotFoundError names a missing one, ValueError one that is not UTF-8."""
    check_input_file(path)
    try:
        return Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def check_input_file(path: str, flag: str | None = None) -> None:
    """``path`` (given as ``flag``, when named) must be an existing file."""
    named = f"{flag} {path}" if flag else path
    if Path(path).is_dir():
        raise ValueError(f"{named} is a directory, not a file")
    if not Path(path).is_file():
        raise FileNotFoundError(f"{named}: no such file")


def jsonl_lines(text: str) -> list[str]:
    """The lines of a JSON Lines text: split at "\n" only (str.splitlines also splits at U+2028,
    U+2029, U+0085 and form feeds, which json.dumps(ensure_ascii=False) leaves raw inside strings)."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def check_output_path(path: str, flag: str = "--out", replaced: bool = False) -> None:
    """Before any work: ``path`` must be writable as a file (its directory exists, it is not a
    directory; with ``replaced``, for an atomic save that renames a new file over it, an existing
    one must be a regular file, not a device such as /dev/null)."""
    out = Path(path)
    if out.is_dir():
        raise ValueError(f"{flag} {path} is a directory; give a file path")
    if replaced and os.path.lexists(out) and not out.is_file():
        raise ValueError(f"{flag} {path} exists and is not a regular file (the index is saved by renaming a new "
                         f"file over it)")
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

    parser = argparse.ArgumentParser(prog="refdec", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"refdec {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="{index,generate,edit}")
    cli_index.register(commands)
    cli_generate.register(commands)
    cli_edit.register(commands)
    _set_parser_defaults(commands)
    return parser


def _set_parser_defaults(subparsers_action) -> None:
    """Each (sub)command's parser as ``args.parser``, the innermost one the user reached."""
    for sub_parser in subparsers_action.choices.values():
        sub_parser.set_defaults(parser=sub_parser)
        for action in sub_parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                _set_parser_defaults(action)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("refdec")
    except PackageNotFoundError:
        return "(not installed)"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    # errors and help at the level the user typed: "refdec generate --bogus" shows generate's usage
    command_parser = getattr(args, "parser", None)
    if unknown:
        (command_parser or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if getattr(args, "handler", None) is None:  # "refdec" or "refdec index" alone: show what to choose
        (command_parser or parser).print_help(sys.stderr)
        return 2
    try:
        return int(args.handler(args) or 0)
    except (ValueError, ImportError, OSError) as exc:  # OSError: missing, unreadable or unwritable paths
        print(f"refdec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        sys.stdout.flush()
        print("\nrefdec: interrupted", file=sys.stderr)  # after any partial streamed line
        return 130


if __name__ == "__main__":
    sys.exit(main())
