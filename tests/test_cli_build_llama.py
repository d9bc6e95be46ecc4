"""refdec.cli.build_llama: ``refdec build-llama``'s arguments reach refdec.llama_cpp.build, the wheel's
path is printed, and a failed step is an error line and exit status 1."""

from __future__ import annotations

from pathlib import Path

from refdec.cli.main import main
from refdec.llama_cpp import build


def test_arguments_reach_the_builder_and_the_wheel_is_printed(monkeypatch, capsys, tmp_path):
    seen = {}

    def fake(**kwargs):
        seen.update(kwargs)
        return tmp_path / "llama_cpp_python.whl"

    monkeypatch.setattr(build, "build_llama", fake)
    assert main(["build-llama", "--jobs", "4", "--rebuild", "--no-install", "--sdist", "x.tar.gz"]) == 0
    assert seen == {"jobs": 4, "install": False, "rebuild": True, "sdist": Path("x.tar.gz")}
    assert capsys.readouterr().out.strip() == str(tmp_path / "llama_cpp_python.whl")
    assert main(["build-llama"]) == 0
    assert seen == {"jobs": None, "install": True, "rebuild": False, "sdist": None}


def test_a_failed_step_is_one_error_line(monkeypatch, capsys):
    def failing(**kwargs):
        raise RuntimeError("building llama-cpp-python failed (exit 1): pip wheel")

    monkeypatch.setattr(build, "build_llama", failing)
    assert main(["build-llama"]) == 1
    assert capsys.readouterr().err.strip() == "refdec build-llama: error: building llama-cpp-python failed (exit 1): pip wheel"
