"""The benchmarks' inputs, read from disk with the standard library alone.

The data root: ``$REFDEC_DATA`` if set, else ``../shared/data`` next to the
repository (``<repo>/../shared/data``); it is read at run time, never copied.
Its files, one reader each:

    edits-click.jsonl          :func:`edit_rows`       {"path", "commit", "message", "before", "after"}
    humaneval.jsonl.gz         :func:`humaneval_rows`  {"task_id", "prompt", "canonical_solution", ...}
    specbench-question.jsonl   :func:`chat_questions`  first turns of a Spec-Bench category
    mtbench-question.jsonl     :func:`chat_questions`  ("mtbench") MT-Bench first turns

Python sources as a corpus: the standard library (:func:`read_stdlib`) and, where a
benchmark needs more files, the installed packages (:func:`read_site_packages`), by one
reader (:func:`iter_python_sources`) with one skip rule: every ``*.py`` file under the
root, sorted by relative path, read as bytes and decoded as UTF-8 (no newline
translation), except

* anything in a ``site-packages`` or ``dist-packages`` folder below the root
  (installed packages, not the standard library);
* files that are not UTF-8 or cannot be read (returned by name as skipped);
* with ``tests=False``, the test suites: ``test/``, ``idlelib/idle_test/`` and
  every ``tests/`` folder.

The drafting corpus of the simulator and the end-to-end runs (``corpora.py``)
is ``tests=False``; the index, memory and retrieval benchmarks read ``tests=True``
(more text to build from).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from benchmarks.paths import REPO_DIR

SPECBENCH_FILE = "specbench-question.jsonl"
MTBENCH_FILE = "mtbench-question.jsonl"


def data_dir() -> Path:
    """``$REFDEC_DATA``, else ``<repo>/../shared/data`` (may not exist: see :func:`data_path`)."""
    env = os.environ.get("REFDEC_DATA")
    if env:
        return Path(env)
    return REPO_DIR.parent / "shared" / "data"


def data_path(name: str) -> Path:
    """The data file ``name`` (e.g. ``"edits-click.jsonl"``); FileNotFoundError naming the
    path and ``$REFDEC_DATA`` when it is absent."""
    path = data_dir() / name
    if not path.exists():
        raise FileNotFoundError(f"benchmark data file not found: {path} (set REFDEC_DATA to the data directory)")
    return path


def _jsonl(lines) -> list[dict]:
    return [json.loads(line) for line in lines if line.strip()]


def edit_rows() -> list[dict]:
    """The edit pairs of ``edits-click.jsonl``, in file order."""
    with open(data_path("edits-click.jsonl"), encoding="utf-8") as f:
        return _jsonl(f)


def humaneval_rows() -> list[dict]:
    """The HumanEval problems of ``humaneval.jsonl.gz``, in file order."""
    with gzip.open(data_path("humaneval.jsonl.gz"), "rt", encoding="utf-8") as f:
        return _jsonl(f)


def chat_questions(category: str, limit: int | None = None) -> list[str]:
    """First-turn questions of a Spec-Bench ``category`` (e.g. ``"summarization"``, ``"rag"``),
    or of MT-Bench (``category="mtbench"``), in file order; the first ``limit`` if given."""
    with open(data_path(MTBENCH_FILE if category == "mtbench" else SPECBENCH_FILE), encoding="utf-8") as f:
        rows = _jsonl(f)
    if category != "mtbench":
        rows = [r for r in rows if r["category"] == category]
    questions = [r["turns"][0] for r in rows]
    return questions[:limit] if limit else questions


# ---------------------------------------------------------------- the stdlib corpus

@dataclass(frozen=True)
class Document:
    name: str  # path relative to the corpus root, with "/" separators
    text: str


_INSTALLED = ("site-packages", "dist-packages")
_TEST_SUITES = ("test/", "idlelib/idle_test/")


def _is_test_suite(rel: str) -> bool:
    return rel.startswith(_TEST_SUITES) or rel.startswith("tests/") or "/tests/" in rel


def iter_python_sources(root: Path, *, tests: bool, skipped: list | None = None) -> Iterator[Document]:
    """The ``*.py`` files under ``root`` by the module's skip rule, in sorted path order, read
    as they are yielded. ``tests``: keep the test suites (True) or skip them (False).
    ``skipped``: a list to which the names of files not UTF-8 or unreadable are appended."""
    root = Path(root)
    for path in sorted(root.rglob("*.py")):
        rel_path = path.relative_to(root)
        rel = rel_path.as_posix()
        if any(part in _INSTALLED for part in rel_path.parts) or not path.is_file():
            continue
        if not tests and _is_test_suite(rel):
            continue
        try:
            yield Document(rel, path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, OSError):
            if skipped is not None:
                skipped.append(rel)


def read_stdlib(*, tests: bool) -> tuple[list[Document], list[str]]:
    """The standard library's sources (``sysconfig.get_paths()["stdlib"]``), by the module's
    skip rule. Returns (documents, names of the files skipped as not UTF-8 or unreadable)."""
    skipped: list[str] = []
    documents = list(iter_python_sources(Path(sysconfig.get_paths()["stdlib"]), tests=tests, skipped=skipped))
    return documents, skipped


def read_site_packages() -> Iterator[Document]:
    """The sources of the installed packages (``sysconfig.get_paths()["purelib"]``: this
    interpreter's or virtual environment's site-packages), test suites included, read lazily
    (there are many). Which files these are depends on the environment."""
    return iter_python_sources(Path(sysconfig.get_paths()["purelib"]), tests=True)


def held_out_split(documents: Sequence[Document], every: int = 50) -> tuple[list[int], list[int]]:
    """Deterministic split by a hash of the name: (corpus doc indices, held-out doc indices),
    about one document in ``every`` held out."""
    corpus, held_out = [], []
    for doc_idx, doc in enumerate(documents):
        bucket = int(hashlib.sha1(doc.name.encode()).hexdigest()[:8], 16) % every
        (held_out if bucket == 0 else corpus).append(doc_idx)
    return corpus, held_out
