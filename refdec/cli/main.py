"""The ``refdec`` command line: a dispatcher over one module per command group."""

from __future__ import annotations

import argparse
import sys

from refdec.cli import build_llama, calibrate, edit, generate, index, serve

DESCRIPTION = ("Lossless speculative decoding for Hugging Face causal LMs and llama.cpp: generate text, edit files "
               "many tokens per pass, serve OpenAI's API with Predicted Outputs, build corpus indexes. The output is "
               "exactly what plain decoding gives.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="refdec", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"refdec {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="{index,generate,edit,serve,calibrate,build-llama}")
    index.register(commands)
    generate.register(commands)
    edit.register(commands)
    serve.register(commands)
    calibrate.register(commands)
    build_llama.register(commands)
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
