"""Helpers the ``refdec`` subcommands share: files named on the command line, --threads."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

__all__ = ["check_input_file", "check_output_path", "draft_tokens", "is_gguf", "jsonl_lines", "load_model_arg",
           "read_text_file", "set_threads"]

GGUF_CONTEXT = 8192  # --model x.gguf: the llama.cpp context (prompt + new tokens + a draft tree)


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
    import torch  # not at the top: `refdec --help` stays fast

    torch.set_num_threads(threads)


def draft_tokens(value: str):
    """``--max-draft-tokens``: an int >= 0 or "auto"."""
    if value == "auto":
        return "auto"
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0 or 'auto', got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0 or 'auto', got {value!r}")
    return n


def is_gguf(model: str | None) -> bool:
    """``--model`` names a GGUF file: the decode runs on llama.cpp."""
    return model is not None and model.lower().endswith(".gguf")


def load_model_arg(model: str | None, threads: int | None):
    """``(model, tokenizer)`` for ``--model``: a GGUF file as a ``llama_cpp.Llama`` (llama.cpp, its
    own tokenizer; ``threads`` its threads, default llama-cpp-python's), else a transformers model
    (a directory or a local Hugging Face name; None: the default model)."""
    if is_gguf(model):
        check_input_file(model, "--model")
        try:
            import llama_cpp
        except ImportError:
            raise ImportError("--model x.gguf runs on llama.cpp: pip install 'refdec[llama]'") from None
        from refdec.llama_cpp.tokenizer import GgufTokenizer

        kwargs = {} if threads is None else {"n_threads": threads, "n_threads_batch": threads}
        llm = llama_cpp.Llama(model, n_ctx=GGUF_CONTEXT, verbose=False, **kwargs)
        return llm, GgufTokenizer(llm)
    from refdec.models import load_default, load_model

    return load_default() if model is None else load_model(model)
