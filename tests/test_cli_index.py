"""Specifies refdec.cli.index, the ``refdec index build`` / ``refdec index info`` commands, run in-process.

A tiny byte-level BPE tokenizer is trained offline on a few strings and saved
to a temporary directory, so no test reaches a model hub.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from refdec.cli import main

TRAINING_TEXT = [
    "def f(x):\n    return x + 1\n",
    "import os\nimport sys\nprint('hello world')\n",
    "class A:\n    def __init__(self):\n        self.value = 0\n",
]


def make_tiny_tokenizer(directory, *, vocab_size: int = 300, extra_text: tuple[str, ...] = ()):
    """Train a byte-level BPE tokenizer on a few strings and return it (also saved to ``directory/tok``).

    ``extra_text`` changes the training data, hence the vocabulary and the fingerprint.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    model = Tokenizer(models.BPE(unk_token="[UNK]"))
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["[UNK]", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    model.train_from_iterator(TRAINING_TEXT + list(extra_text), trainer)
    out = Path(directory) / ("tok" if not extra_text else "tok-extra")
    PreTrainedTokenizerFast(tokenizer_object=model, unk_token="[UNK]", eos_token="<eos>").save_pretrained(out)
    return AutoTokenizer.from_pretrained(str(out))


@pytest.fixture()
def tokenizer_dir(tmp_path):
    make_tiny_tokenizer(tmp_path)
    return tmp_path / "tok"


@pytest.fixture()
def source_tree(tmp_path):
    """A directory of sources: two .py files (one nested), a .txt, a non-UTF-8 .py, a .jsonl."""
    root = tmp_path / "src"
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "a.py").write_text("def f(x):\n    return x + 1\n")
    (root / "pkg" / "sub" / "b.py").write_text("import os\nprint('hello world')\n" * 3)
    (root / "notes.txt").write_text("not python, but text\n")
    (root / "pkg" / "latin1.py").write_bytes("caf\xe9 = 1\n".encode("latin-1"))
    records = [{"text": "class A:\n    pass\n", "id": 1}, {"text": "x = 1\n", "id": 2}]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return root


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_build_indexes_matching_files_and_counts_non_utf8_files_as_skipped(capsys, tmp_path, source_tree, tokenizer_dir):
    from refdec.index import CorpusIndex

    out = tmp_path / "py.refdec"
    code, stdout, stderr = run_cli(
        capsys, "index", "build", source_tree, "--glob", "*.py", "--tokenizer", tokenizer_dir, "--out", out,
        "--no-progress",
    )
    assert code == 0, stderr
    # the summary line's figures: documents, tokens, bytes/token of the written file, the skipped file
    line = next(text for text in stdout.splitlines() if text.startswith(f"{out}: "))
    figures = re.fullmatch(rf"{re.escape(str(out))}: 2 documents, (\d+) tokens, ([\d.]+) bytes/token \((\d+) bytes\); "
                           r"tokenise [\d.]+ s, build [\d.]+ s, save [\d.]+ s; 1 file skipped \(not UTF-8\), "
                           r"MinHash signatures stored", line)
    assert figures, line
    n_tokens, per_token, n_bytes = int(figures[1]), float(figures[2]), int(figures[3])
    assert n_bytes == out.stat().st_size and per_token == round(n_bytes / n_tokens, 1)
    assert f"skipped (not UTF-8): {source_tree / 'pkg' / 'latin1.py'}" in stderr

    tokenizer = make_tiny_tokenizer(tmp_path)
    index = CorpusIndex.load(out, tokenizer)
    assert index.num_documents == 2
    texts = sorted([(source_tree / "a.py").read_text(), (source_tree / "pkg" / "sub" / "b.py").read_text()])
    expected = sorted(tokenizer.encode(t, add_special_tokens=False) for t in texts)
    got = sorted(index.document(i).tolist() for i in range(index.num_documents))
    assert got == expected
    assert len(index) == sum(len(e) for e in expected) == n_tokens


def test_build_reads_the_named_field_of_each_jsonl_line(capsys, tmp_path, tokenizer_dir):
    from refdec.index import CorpusIndex

    out = tmp_path / "j.refdec"
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps({"body": "x = 1\n"}) + "\n" + json.dumps({"body": "y = 2\n"}) + "\n")
    code, stdout, stderr = run_cli(
        capsys, "index", "build", path, "--jsonl-field", "body", "--tokenizer", tokenizer_dir, "--out", out,
        "--no-progress",
    )
    assert code == 0, stderr
    tokenizer = make_tiny_tokenizer(tmp_path)
    index = CorpusIndex.load(out, tokenizer)
    assert index.num_documents == 2
    assert index.document(1).tolist() == tokenizer.encode("y = 2\n", add_special_tokens=False)


def test_build_over_a_directory_and_a_file_together(capsys, tmp_path, source_tree, tokenizer_dir):
    out = tmp_path / "mixed.refdec"
    code, stdout, stderr = run_cli(
        capsys, "index", "build", source_tree / "pkg", tmp_path / "data.jsonl", "--glob", "*.py",
        "--tokenizer", tokenizer_dir, "--out", out, "--no-progress",
    )
    assert code == 0, stderr
    # pkg/ holds b.py (indexed) and latin1.py (skipped); data.jsonl holds 2 records.
    assert re.search(r"\b3 documents\b", stdout + stderr), stdout + stderr


def test_build_shows_a_progress_bar_unless_told_not_to(capsys, tmp_path, source_tree, tokenizer_dir):
    out = tmp_path / "p.refdec"
    code, stdout, stderr = run_cli(
        capsys, "index", "build", source_tree, "--glob", "*.py", "--tokenizer", tokenizer_dir, "--out", out
    )
    assert code == 0, stderr
    assert "documents" in stderr or "doc" in stderr  # tqdm writes to stderr
    assert re.search(r"\d+/\d+", stderr), stderr


def test_build_with_no_matching_file_is_an_error_not_an_empty_index(capsys, tmp_path, source_tree, tokenizer_dir):
    out = tmp_path / "none.refdec"
    code, stdout, stderr = run_cli(
        capsys, "index", "build", source_tree, "--glob", "*.rs", "--tokenizer", tokenizer_dir, "--out", out,
        "--no-progress",
    )
    assert code != 0
    assert "no" in stderr.lower() and "*.rs" in stderr, stderr
    assert not out.exists()


def test_build_with_a_missing_path_is_an_error_naming_it(capsys, tmp_path, tokenizer_dir):
    missing = tmp_path / "does-not-exist"
    code, stdout, stderr = run_cli(
        capsys, "index", "build", missing, "--tokenizer", tokenizer_dir, "--out", tmp_path / "x.refdec",
        "--no-progress",
    )
    assert code != 0
    assert str(missing) in stderr


def _build(capsys, tmp_path, source_tree, tokenizer_dir, name="i.refdec"):
    out = tmp_path / name
    code, _, stderr = run_cli(
        capsys, "index", "build", source_tree, "--glob", "*.py", "--tokenizer", tokenizer_dir, "--out", out,
        "--no-progress",
    )
    assert code == 0, stderr
    return out


def test_info_prints_the_header_fields(capsys, tmp_path, source_tree, tokenizer_dir):
    from refdec.index import CorpusIndex, tokenizer_fingerprint

    out = _build(capsys, tmp_path, source_tree, tokenizer_dir)
    index = CorpusIndex.load(out)
    code, stdout, stderr = run_cli(capsys, "index", "info", out)
    assert code == 0, stderr
    text = stdout.lower()
    for field in ("tokens", "documents", "states", "vocab", "fingerprint", "bytes/token"):
        assert field in text, (field, stdout)
    assert re.search(rf"\b{len(index)}\b", stdout)
    assert re.search(rf"\b{index.num_documents}\b", stdout)
    assert re.search(rf"\b{index.vocab_size}\b", stdout)
    assert tokenizer_fingerprint(make_tiny_tokenizer(tmp_path)) in stdout
    assert str(out.stat().st_size) in stdout.replace(",", "")


def test_info_verify_reports_ok_with_exit_0_and_a_corrupt_body_with_exit_1(capsys, tmp_path, source_tree, tokenizer_dir):
    out = _build(capsys, tmp_path, source_tree, tokenizer_dir)
    code, stdout, stderr = run_cli(capsys, "index", "info", out, "--verify")
    assert code == 0, stderr
    assert re.search(r"(?i)checksum[^\n]*\bok\b", stdout), stdout

    data = bytearray(out.read_bytes())
    data[-5] ^= 0x5A  # a body byte: the header is at the start
    out.write_bytes(bytes(data))
    code, stdout, stderr = run_cli(capsys, "index", "info", out, "--verify")
    assert code == 1
    assert re.search(r"(?i)corrupt|mismatch|fail", stdout + stderr), stdout + stderr


def test_info_on_a_foreign_file_is_an_error_naming_it(capsys, tmp_path):
    path = tmp_path / "foreign.bin"
    path.write_text("hello, I am not an index\n" * 40)
    code, stdout, stderr = run_cli(capsys, "index", "info", path)
    assert code != 0
    assert str(path) in stderr, stderr


def test_help_texts_describe_the_commands(capsys):
    for argv in (["index", "--help"], ["index", "build", "--help"], ["index", "info", "--help"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 0
    usage = capsys.readouterr().out
    for option in ("--tokenizer", "--out", "--glob", "--jsonl-field", "--no-progress", "--verify"):
        assert option in usage, option


def test_cli_build_dedup_reports_the_dropped_documents_and_writes_signatures(capsys, tmp_path):
    from refdec.index import CorpusIndex

    make_tiny_tokenizer(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    body = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(40))
    (src / "a.py").write_text(body)
    (src / "a_copy.py").write_text(body)
    (src / "a_edited.py").write_text(body.replace("x + 7\n", "x + 8\n"))
    (src / "b.py").write_text("import os\nprint('hello world')\n" * 5)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "corpus.idx"
    code = main(["index", "build", str(src), "--tokenizer", str(tmp_path / "tok"), "--out", str(out),
                 "--dedup", "0.9", "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "2 documents," in printed and "2 near-duplicate documents dropped (Jaccard >= 0.9)" in printed
    assert "MinHash signatures stored" in printed and os.listdir(tmp_path / "out") == ["corpus.idx"]
    assert len(CorpusIndex.load(out).signatures) == 2

    code = main(["index", "info", str(out)])
    assert code == 0 and "MinHash, 128 permutations, seed 1, 3-token shingles" in capsys.readouterr().out

    plain = tmp_path / "plain.idx"
    code = main(["index", "build", str(src), "--tokenizer", str(tmp_path / "tok"), "--out", str(plain),
                 "--no-signatures", "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0 and "4 documents," in printed and "dropped" not in printed
    assert "MinHash" not in printed and CorpusIndex.load(plain).signatures is None


def test_cli_dedup_threshold_out_of_range_is_an_argument_error(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["index", "build", str(tmp_path), "--out", str(tmp_path / "x.idx"), "--dedup", "1.5"])
    assert "(0, 1]" in capsys.readouterr().err


@pytest.mark.slow
def test_build_without_tokenizer_uses_the_default_models_tokenizer(capsys, tmp_path, source_tree):
    from refdec.index import CorpusIndex, tokenizer_fingerprint
    from refdec.models import default_model_dir, load_tokenizer

    if not (default_model_dir() / "config.json").exists():
        pytest.skip("the default model is not converted yet (it would take ~90 s)")
    out = tmp_path / "default.refdec"
    code, stdout, stderr = run_cli(capsys, "index", "build", source_tree / "a.py", "--out", out, "--no-progress")
    assert code == 0, stderr
    tokenizer = load_tokenizer()
    index = CorpusIndex.load(out, tokenizer)
    assert index.fingerprint == tokenizer_fingerprint(tokenizer)
    assert index.vocab_size == len(tokenizer)
    assert index.document(0).tolist() == tokenizer.encode((source_tree / "a.py").read_text(), add_special_tokens=False)
