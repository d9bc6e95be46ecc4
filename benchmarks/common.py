"""Shared helpers for the benchmarks: data paths, the stdlib corpus, a token-id cache.

Token ids are cached as ``.npy`` under ``benchmarks/cache/`` (git-ignored),
keyed by the tokenizer fingerprint and a digest of the documents, so a rerun
skips tokenisation. Results go to ``benchmarks/out/`` (git-ignored).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
CACHE_DIR = Path(os.environ.get("REFDEC_BENCH_CACHE", BENCH_DIR / "cache"))
OUT_DIR = BENCH_DIR / "out"
SHARED_DATA_DIR = Path(os.environ.get("REFDEC_SHARED_DATA", "/work/shared/data"))


def data_path(name: str) -> Path:
    """A file of the shared data sets (``edits-click.jsonl``, ``humaneval.jsonl.gz``, ...)."""
    path = SHARED_DATA_DIR / name
    if not path.exists():
        raise FileNotFoundError(f"benchmark data file not found: {path} (set REFDEC_SHARED_DATA)")
    return path


# ---------------------------------------------------------------------------
# The Python standard library as a corpus


@dataclass(frozen=True)
class Document:
    name: str  # path relative to the corpus root
    text: str


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def read_stdlib_corpus(pattern: str = "*.py") -> tuple[list[Document], list[str]]:
    """The standard library's sources (site-packages excluded), sorted by path.

    Returns (documents, names of files skipped because they are not UTF-8).
    """
    root = stdlib_root()
    documents, skipped = [], []
    for path in sorted(root.rglob(pattern)):
        rel = path.relative_to(root)
        if "site-packages" in rel.parts or "dist-packages" in rel.parts or not path.is_file():
            continue
        try:
            documents.append(Document(str(rel), path.read_bytes().decode("utf-8")))
        except UnicodeDecodeError:
            skipped.append(str(rel))
    return documents, skipped


def held_out_split(documents: Sequence[Document], every: int = 50) -> tuple[list[int], list[int]]:
    """Deterministic split by a hash of the name: (corpus doc indices, held-out doc indices)."""
    corpus, held_out = [], []
    for doc_idx, doc in enumerate(documents):
        bucket = int(hashlib.sha1(doc.name.encode()).hexdigest()[:8], 16) % every
        (held_out if bucket == 0 else corpus).append(doc_idx)
    return corpus, held_out


# ---------------------------------------------------------------------------
# Tokenisation cache


def _digest(documents: Sequence[Document]) -> str:
    h = hashlib.sha1()
    for doc in documents:
        h.update(doc.name.encode())
        h.update(b"\0")
        h.update(hashlib.sha1(doc.text.encode()).digest())
    return h.hexdigest()[:16]


def tokenize_cached(
    documents: Sequence[Document], tokenizer, *, tag: str = "corpus", batch: int = 64, verbose: bool = True
) -> list[np.ndarray]:
    """Token ids (int32 arrays, no special tokens) of each document, cached on disk."""
    from refdec.index import tokenizer_fingerprint

    key = f"{tag}-{tokenizer_fingerprint(tokenizer)[:16]}-{_digest(documents)}"
    tokens_path = CACHE_DIR / f"{key}.tokens.npy"
    offsets_path = CACHE_DIR / f"{key}.offsets.npy"
    if tokens_path.exists() and offsets_path.exists():
        flat = np.load(tokens_path)
        offsets = np.load(offsets_path)
        return [flat[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]

    t0 = time.perf_counter()
    arrays: list[np.ndarray] = []
    texts = [doc.text for doc in documents]
    for start in range(0, len(texts), batch):
        encoded = tokenizer(texts[start : start + batch], add_special_tokens=False, verbose=False)["input_ids"]
        arrays.extend(np.asarray(ids, dtype=np.int32) for ids in encoded)
        if verbose:
            print(f"\rtokenising {min(start + batch, len(texts))}/{len(texts)} documents", end="", file=sys.stderr)
    if verbose:
        print(f" ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int32)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    # Write under temporary names, then rename: a killed run leaves no half cache.
    for path, array in ((tokens_path, flat), (offsets_path, offsets)):
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, array)
        os.replace(tmp, path)
    return [flat[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]


# ---------------------------------------------------------------------------
# Reporting


def percentile_us(samples_s: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples_s, dtype=np.float64), q) * 1e6)


def machine_info() -> dict:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }


def write_json(name: str, payload: dict) -> Path:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    return path


def markdown_table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
