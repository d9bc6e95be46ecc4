"""``refdec build-llama``: llama-cpp-python built from its source with refdec's patch to ggml's CPU
backend, and installed into the running Python.

The patch (``patches/ggml-cpu-batch-invariant.patch``, written against the llama.cpp that
llama-cpp-python's sdist vendors, to be offered upstream) adds one process-wide switch,
``ggml_cpu_set_batch_invariant(bool)``: while on, every row of a matrix product is computed with the
kernels a one-row product uses (no llamafile sgemm, no tiled kernel, repacked weights through
``gemv`` only). Off, llama.cpp computes exactly what it computes unpatched. refdec turns it on for
its verification decodes alone (refdec.llama_cpp.backend, exact mode), which then give every row
the logits plain one-token decoding gives: refdec's output on llama.cpp is plain decoding's, bit
for bit (docs/llama_cpp.md).

The built wheel is kept under ``$REFDEC_LLAMA_WHEELS/<version>-<patch hash>/`` (default
``$REFDEC_CACHE/llama-cpp-python``; a folder shared by a team or a CI's runs): a second run
installs it without building.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from refdec.gguf_files import cache_dir

__all__ = ["LLAMA_CPP_PYTHON_VERSION", "PATCH", "build_llama", "cached_wheel"]

# The llama-cpp-python the patch applies to: pyproject.toml's [llama] extra pins the same version.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
PATCH = Path(__file__).resolve().parent / "patches" / "ggml-cpu-batch-invariant.patch"


def _wheel_dir() -> Path:
    digest = hashlib.sha256(PATCH.read_bytes()).hexdigest()[:12]
    root = os.environ.get("REFDEC_LLAMA_WHEELS") or cache_dir() / "llama-cpp-python"
    return Path(root) / f"{LLAMA_CPP_PYTHON_VERSION}-{digest}"


def cached_wheel() -> Path | None:
    """The patched wheel an earlier build left, or None."""
    wheels = sorted(_wheel_dir().glob("llama_cpp_python-*.whl"))
    return wheels[-1] if wheels else None


def _run(command: list[str], what: str, **kwargs) -> None:
    print(f"refdec build-llama: {what}", file=sys.stderr, flush=True)
    done = subprocess.run(command, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {' '.join(command)}")


def build_llama(*, jobs: int | None = None, install: bool = True, rebuild: bool = False,
                sdist: Path | None = None) -> Path:
    """Builds the patched wheel (or takes the cached one) and, with ``install``, installs it into
    this Python (replacing any llama-cpp-python there). ``jobs``: parallel compile jobs (default: the
    CPU count); ``sdist``: a llama-cpp-python sdist already on disk (default: downloaded with pip).
    Returns the wheel's path. RuntimeError naming the step that failed; nothing is installed then."""
    if jobs is not None and (not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1):
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
    if sdist is not None and not Path(sdist).is_file():
        raise ValueError(f"sdist {str(sdist)!r} is not a file")
    if shutil.which("patch") is None:
        raise RuntimeError("refdec build-llama needs the `patch` program (GNU patch)")
    wheel = None if rebuild else cached_wheel()
    if wheel is None:
        out = _wheel_dir()
        with tempfile.TemporaryDirectory(prefix="refdec-build-llama-") as tmp:
            tmp = Path(tmp)
            if sdist is None:
                # its source only: its build's own dependencies (cmake, scikit-build-core) come as wheels
                _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                      "-d", str(tmp), f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"],
                     f"downloading llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}'s source")
                found = sorted(tmp.glob("llama_cpp_python-*.tar.gz"))
                if not found:
                    raise RuntimeError(f"pip downloaded no llama_cpp_python sdist into {tmp}")
                sdist = found[0]
            with tarfile.open(sdist) as archive:
                if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: no member may escape the folder
                    archive.extractall(tmp / "src", filter="data")
                else:  # pragma: no cover - older Pythons
                    archive.extractall(tmp / "src")
            roots = [p for p in (tmp / "src").iterdir() if p.is_dir()]
            if len(roots) != 1 or not (roots[0] / "vendor" / "llama.cpp").is_dir():
                raise RuntimeError(f"{sdist} is not a llama-cpp-python sdist with vendor/llama.cpp")
            source = roots[0]
            with open(PATCH, "rb") as patch:
                _run(["patch", "-p1", "--forward", "--batch", "-d", str(source / "vendor" / "llama.cpp")],
                     f"patching ggml's CPU backend ({PATCH.name})", stdin=patch)
            env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=str(jobs or os.cpu_count() or 1))
            staging = tmp / "wheel"
            _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(staging), str(source)],
                 "building llama-cpp-python (about 10 minutes on 2 cores)", env=env)
            built = sorted(staging.glob("llama_cpp_python-*.whl"))
            if not built:
                raise RuntimeError(f"pip built no llama_cpp_python wheel into {staging}")
            out.mkdir(parents=True, exist_ok=True)
            wheel = out / built[0].name
            shutil.copy2(built[0], wheel.with_suffix(".part"))
            os.replace(wheel.with_suffix(".part"), wheel)  # whole or absent: a later run may take it
    if install:
        _run([sys.executable, "-m", "pip", "install", "--force-reinstall", "--no-deps", str(wheel)],
             f"installing {wheel.name}")
        _run([sys.executable, "-m", "pip", "install", str(wheel)], "installing llama-cpp-python's dependencies")
    return wheel
