"""refdec.llama_cpp.build (``refdec build-llama``): the patched llama-cpp-python, built once and
cached, each step's failure named, nothing installed after one. No network here: the sdist is a
file the test writes, and the build itself is stood in for where it would run pip."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from refdec.llama_cpp import build


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """refdec's cache in a folder of the test's own, and no shared wheel folder (REFDEC_LLAMA_WHEELS,
    which CI's README step sets): the user's wheels are never read nor written here."""
    monkeypatch.setenv("REFDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("REFDEC_LLAMA_WHEELS", raising=False)
    return tmp_path / "cache"


def _sdist(tmp_path: Path, with_vendor: bool = True) -> Path:
    """A llama-cpp-python-shaped sdist holding the three files the patch changes, as the vendored
    llama.cpp has them before it (read back from the patch's own context and removed lines)."""
    path = tmp_path / f"llama_cpp_python-{build.LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    files = _unpatched_files() if with_vendor else {"README.md": "no vendor folder\n"}
    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_python-{build.LLAMA_CPP_PYTHON_VERSION}/"
                                   + (f"vendor/llama.cpp/{name}" if with_vendor else name))
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def _unpatched_files() -> dict[str, str]:
    """{path: text} whose hunks are exactly the patch's 'before' side, each hunk at its line."""
    files: dict[str, list[str]] = {}
    current = None
    for line in build.PATCH.read_text().splitlines():
        if line.startswith("--- a/"):
            current = files.setdefault(line[len("--- a/"):], [])
        elif line.startswith("@@"):
            start = int(line.split()[1].split(",")[0].lstrip("-"))
            current.extend(["// filler\n"] * (start - 1 - len(current)))
        elif current is not None and line[:1] in (" ", "-"):
            current.append(line[1:] + "\n")
        elif current is not None and line == "":
            current.append("\n")
    return {name: "".join(lines) for name, lines in files.items()}


def test_a_cached_wheel_is_taken_without_building(cache, monkeypatch):
    calls = []
    monkeypatch.setattr(build, "_run", lambda command, what, **kw: calls.append(what))
    wheel_dir = build._wheel_dir()
    wheel_dir.mkdir(parents=True)
    wheel = wheel_dir / f"llama_cpp_python-{build.LLAMA_CPP_PYTHON_VERSION}-py3-none-linux_x86_64.whl"
    wheel.write_bytes(b"wheel")
    assert build.build_llama(install=False) == wheel
    assert calls == []
    assert build.build_llama(install=True) == wheel
    assert calls == [f"installing {wheel.name}", "installing llama-cpp-python's dependencies"]
    assert wheel_dir.name.startswith(build.LLAMA_CPP_PYTHON_VERSION + "-")  # keyed by the patch's hash
    assert wheel_dir.is_relative_to(cache)


def test_a_shared_wheel_folder_is_read_when_set(tmp_path, monkeypatch):
    monkeypatch.setenv("REFDEC_LLAMA_WHEELS", str(tmp_path / "shared"))
    assert build._wheel_dir().parent == tmp_path / "shared" and build.cached_wheel() is None


def test_the_patch_applies_to_the_vendored_source_then_pip_builds_it(tmp_path, cache, monkeypatch):
    seen = {}

    def run(command, what, **kwargs):
        if command[0] == "patch":
            subprocess.run(command, check=True, **kwargs)
            root = Path(command[command.index("-d") + 1])
            seen["patched"] = (root / "ggml/src/ggml-cpu/repack.cpp").read_text()
            seen["header"] = (root / "ggml/include/ggml-cpu.h").read_text()
        elif command[1:4] == ["-m", "pip", "wheel"]:
            out = Path(command[command.index("-w") + 1])
            out.mkdir(parents=True)
            (out / "llama_cpp_python-0.3.36-py3-none-any.whl").write_bytes(b"built")
            seen["env"] = kwargs["env"]["CMAKE_BUILD_PARALLEL_LEVEL"]
        else:
            raise AssertionError(command)

    monkeypatch.setattr(build, "_run", run)
    wheel = build.build_llama(install=False, jobs=3, sdist=_sdist(tmp_path))
    assert wheel.read_bytes() == b"built" and wheel.parent == build._wheel_dir()
    assert "ggml_cpu_get_batch_invariant()" in seen["patched"]
    assert "ggml_cpu_set_batch_invariant(bool enabled)" in seen["header"]
    assert seen["env"] == "3"
    assert build.cached_wheel() == wheel


def test_each_failing_step_is_named_and_nothing_is_installed(tmp_path, monkeypatch):
    with pytest.raises(RuntimeError, match="not a llama-cpp-python sdist"):
        build.build_llama(sdist=_sdist(tmp_path, with_vendor=False))
    installed = []
    monkeypatch.setattr(build, "_run", lambda command, what, **kw: installed.append(what) if "install" in command
                        else (_ for _ in ()).throw(RuntimeError(f"{what} failed (exit 1)")))
    with pytest.raises(RuntimeError, match="patching ggml's CPU backend"):
        build.build_llama(sdist=_sdist(tmp_path))
    assert installed == [] and build.cached_wheel() is None


def test_bad_arguments_name_themselves(tmp_path):
    with pytest.raises(ValueError, match="jobs must be a positive integer, got 0"):
        build.build_llama(jobs=0)
    with pytest.raises(ValueError, match="sdist .*nope.tar.gz.* is not a file"):
        build.build_llama(sdist=tmp_path / "nope.tar.gz")


def test_run_reports_the_step_and_exit_status():
    with pytest.raises(RuntimeError, match=r"the step failed \(exit 3\)"):
        build._run([sys.executable, "-c", "raise SystemExit(3)"], "the step")
