"""Specifies refdec.cli.index, the ``refdec index build`` / ``refdec index info`` commands, run in-process
and, for bad files and a build killed at any moment (--out holds the old index or the whole new one,
never a partial file), in a child process.

A tiny byte-level BPE tokenizer is trained offline on a few strings and saved
to a temporary directory, so no test reaches a model hub.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from refdec.cli import main
from refdec.drafting.index import CorpusIndex

REPO = Path(__file__).resolve().parents[1]

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
    from refdec.drafting.index import CorpusIndex, tokenizer_fingerprint

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
    from refdec.drafting.index import CorpusIndex, tokenizer_fingerprint
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


# ---------------------------------------------------------------------------
# The command in a child process, on bad files


def _env() -> dict:
    paths = [str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))


@pytest.fixture(scope="module")
def module_tokenizer_dir(tmp_path_factory):
    """The tiny tokenizer, trained once for the module's tests that share it."""
    root = tmp_path_factory.mktemp("tok")
    make_tiny_tokenizer(root)
    return root / "tok"


def _cli(*argv, timeout=300):
    return subprocess.run([sys.executable, "-m", "refdec.cli", *map(str, argv)], capture_output=True, text=True,
                          env=_env(), timeout=timeout)


@pytest.mark.full  # a CLI process (the build's files read in-process: the tests above)
def test_build_in_a_child_process_skips_and_counts_non_utf8_files(tmp_path, module_tokenizer_dir):
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.py").write_text("def f(x):\n    return x + 1\n")
    (src / "latin1.py").write_bytes("caf\xe9 = 1\n".encode("latin-1"))
    (src / "binary.py").write_bytes(bytes(range(256)))
    out = tmp_path / "i.refdec"
    proc = _cli("index", "build", src, "--tokenizer", module_tokenizer_dir, "--out", out, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "2 files skipped (not UTF-8)" in proc.stdout, proc.stdout
    assert "latin1.py" in proc.stderr and "binary.py" in proc.stderr
    assert CorpusIndex.load(out).num_documents == 1


@pytest.mark.full  # two CLI processes
def test_build_reads_a_file_named_twice_once_and_refuses_a_corpus_without_tokens(tmp_path, module_tokenizer_dir):
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.py").write_text("def f(x):\n    return x + 1\n")
    out = tmp_path / "i.refdec"
    proc = _cli("index", "build", src / "good.py", src, src / "good.py", "--tokenizer", module_tokenizer_dir, "--out", out,
                "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert CorpusIndex.load(out).num_documents == 1  # was 3: the same file indexed three times
    (tmp_path / "empty.txt").write_text("")
    proc = _cli("index", "build", tmp_path / "empty.txt", "--tokenizer", module_tokenizer_dir, "--out", tmp_path / "e.refdec",
                "--no-progress")
    assert proc.returncode == 2 and "no tokens to index: the document read is empty" in proc.stderr, proc.stderr
    assert not (tmp_path / "e.refdec").exists()


@pytest.mark.full  # a CLI process
def test_build_with_only_non_utf8_files_is_a_clear_error_and_writes_nothing(tmp_path, module_tokenizer_dir):
    src = tmp_path / "src"
    src.mkdir()
    (src / "latin1.py").write_bytes("caf\xe9 = 1\n".encode("latin-1"))
    out = tmp_path / "i.refdec"
    proc = _cli("index", "build", src, "--tokenizer", module_tokenizer_dir, "--out", out, "--no-progress")
    assert proc.returncode == 2
    assert "no documents to index" in proc.stderr and "not UTF-8" in proc.stderr, proc.stderr
    assert list(tmp_path.glob("i.refdec*")) == []



# ---------------------------------------------------------------------------
# A build killed at any moment: --out is written to a temporary file, then renamed


def _write_corpus(root: Path, files: int, lines: int) -> None:
    rng = np.random.default_rng(0)
    words = ["def", "return", "self", "value", "import", "class", "print", "x", "y", "for", "in", "range"]
    root.mkdir()
    for i in range(files):
        body = "\n".join(" ".join(rng.choice(words, size=8)) + f" {rng.integers(0, 10**6)}" for _ in range(lines))
        (root / f"f{i:04d}.py").write_text(body + "\n")


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory, module_tokenizer_dir):
    """A corpus whose CLI build takes a few seconds, and the seconds a clean build takes."""
    root = tmp_path_factory.mktemp("big")
    _write_corpus(root / "src", files=200, lines=200)
    out = root / "clean.refdec"
    t0 = time.perf_counter()
    proc = _cli("index", "build", root / "src", "--tokenizer", module_tokenizer_dir, "--out", out, "--no-progress")
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    # The index (its MinHash signatures inside), nothing else.
    assert sorted(p.name for p in root.iterdir()) == ["clean.refdec", "src"], (
        "a clean run left temporary files")
    return root / "src", seconds


@pytest.mark.full  # four builds of a 200-file corpus, each killed; atomic saves: tests/test_atomic.py
@pytest.mark.parametrize("fraction", [0.5, 0.8, 0.95, "during_save"])
def test_a_build_killed_mid_way_leaves_the_previous_index_intact(tmp_path, module_tokenizer_dir, big_corpus, fraction):
    src, clean_seconds = big_corpus
    out = tmp_path / "corpus.refdec"
    CorpusIndex.build([[1, 2, 3, 1, 2, 4]], show_progress=False).save(out)
    before = out.read_bytes()
    proc = subprocess.Popen(
        [sys.executable, "-m", "refdec.cli", "index", "build", str(src), "--tokenizer", str(module_tokenizer_dir),
         "--out", str(out), "--no-progress"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
    )
    if fraction == "during_save":  # as soon as the temporary file appears (if the poll sees it)
        deadline = time.monotonic() + 10 * clean_seconds + 60
        while proc.poll() is None and time.monotonic() < deadline:
            if any(".tmp-" in p.name for p in tmp_path.iterdir()):
                break
            time.sleep(0.0005)
    else:
        time.sleep(clean_seconds * fraction)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    # The final name holds either the old index or a complete new one; never a partial file.
    data = out.read_bytes()
    index = CorpusIndex.load(out)
    assert index.verify()
    if proc.returncode == -signal.SIGKILL:
        if data != before:  # killed after the rename: the new index is complete, signatures included
            assert len(index) > 1000 and index.signatures is not None
        else:
            assert index.match_length([1, 2, 4]) == 3 and index.signatures is None
    # A temporary file may survive a SIGKILL during a write, but only under a temporary name.
    others = [p.name for p in tmp_path.iterdir() if p.name != out.name]
    assert all(".tmp-" in name or name.endswith(".tmp") for name in others), others
