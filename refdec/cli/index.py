"""``refdec index build`` and ``refdec index info``: build a corpus index from files, inspect one.

    refdec index build PATH... [--tokenizer NAME_OR_DIR] --out FILE [--glob '*.py']
                               [--jsonl-field text] [--dedup 0.9] [--no-signatures] [--no-progress]
    refdec index info FILE [--verify]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from refdec.cli.common import check_input_file, check_output_path, jsonl_lines

# Documents are tokenised in batches of this many (fast tokenizers batch in Rust).
_TOKENIZE_BATCH = 64


def register(subparsers) -> None:
    """Add the ``index`` command group to the ``refdec`` parser."""
    index_parser = subparsers.add_parser(
        "index",
        help="build or inspect a corpus index",
        description="Build a corpus index (a frozen suffix automaton over token ids) or inspect one.",
    )
    commands = index_parser.add_subparsers(dest="index_command", metavar="{build,info}")

    build = commands.add_parser(
        "build",
        help="tokenise files and build an index file",
        description=(
            "Tokenise documents (one per file, or one per line of a .jsonl file) and write a "
            "memory-mappable corpus index. Files that are not UTF-8 are skipped and counted."
        ),
    )
    build.add_argument("paths", nargs="+", metavar="PATH", help="files or directories (searched recursively)")
    build.add_argument(
        "--tokenizer",
        metavar="NAME_OR_DIR",
        default=None,
        help="tokenizer directory or name (default: the default model's tokenizer, Gemma 3)",
    )
    build.add_argument("--out", required=True, metavar="FILE", help="index file to write (atomically)")
    build.add_argument(
        "--glob",
        default="*",
        metavar="PATTERN",
        help="file name pattern inside directories, e.g. '*.py' (default: every file)",
    )
    build.add_argument(
        "--jsonl-field",
        default="text",
        metavar="FIELD",
        help="field holding the document text in each line of a .jsonl file (default: text)",
    )
    build.add_argument(
        "--dedup",
        type=_threshold,
        default=None,
        metavar="THRESHOLD",
        help="drop exact and near-duplicate documents: shingle Jaccard >= THRESHOLD (in (0, 1], e.g. 0.9) "
        "with an earlier kept document (default: keep every document)",
    )
    build.add_argument(
        "--no-signatures",
        action="store_true",
        help="do not store the documents' MinHash signatures in the index; `refdec generate --retrieve K` "
        "needs them",
    )
    build.add_argument("--no-progress", action="store_true", help="do not show a progress bar")
    build.set_defaults(handler=run_build)

    info = commands.add_parser(
        "info",
        help="print an index file's header",
        description="Print an index file's header fields; --verify also checks the body checksum.",
    )
    info.add_argument("file", metavar="FILE", help="index file")
    info.add_argument(
        "--verify", action="store_true", help="recompute the body checksum (exit code 1 if the file is corrupt)"
    )
    info.set_defaults(handler=run_info)


def _threshold(value: str) -> float:
    try:
        t = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {value!r}") from None
    if not 0.0 < t <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {value!r}")
    return t


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# ---------------------------------------------------------------------------
# Reading documents


@dataclass
class SourceStats:
    """What reading the inputs found."""

    files: int = 0                 # files read (indexed or not)
    documents: int = 0             # documents produced
    non_utf8: list[str] = field(default_factory=list)  # files skipped: not UTF-8
    bad_records: int = 0           # .jsonl lines skipped: not JSON, or no string field
    text_bytes: int = 0            # UTF-8 bytes of the documents produced


def find_files(paths: list[str], pattern: str) -> list[Path]:
    """The files named, and the files matching ``pattern`` under the directories named (sorted);
    a file named twice, or also found under a directory named, is read once."""
    found: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob(pattern) if p.is_file()))
        elif path.is_file():
            found.append(path)
        else:
            raise FileNotFoundError(f"no such file or directory: {path}")
    seen: set[Path] = set()
    unique = []
    for path in found:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(path)
    return unique


def read_documents(files: list[Path], jsonl_field: str, stats: SourceStats) -> Iterator[str]:
    """Yield the documents of each file: its text, or the field of each line of a .jsonl file."""
    for path in files:
        stats.files += 1
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            stats.non_utf8.append(str(path))
            continue
        if path.suffix == ".jsonl":
            for line in jsonl_lines(text):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line).get(jsonl_field)
                except (json.JSONDecodeError, AttributeError):
                    value = None
                if not isinstance(value, str):
                    stats.bad_records += 1
                    continue
                stats.documents += 1
                stats.text_bytes += len(value.encode("utf-8"))
                yield value
        else:
            stats.documents += 1
            stats.text_bytes += len(text.encode("utf-8"))
            yield text


# ---------------------------------------------------------------------------
# build


def run_build(args: argparse.Namespace) -> int:
    import numpy as np
    from tqdm import tqdm

    from refdec.drafting.index import CorpusIndex, tokenizer_fingerprint
    from refdec.models import load_tokenizer

    check_output_path(args.out, replaced=True)
    files = find_files(args.paths, args.glob)
    if not files:
        raise ValueError(f"no files match {args.glob!r} under {', '.join(args.paths)}")
    tokenizer = load_tokenizer(args.tokenizer)

    # Step 1. Read every document, then tokenise them under one progress bar.
    stats = SourceStats()
    texts = list(read_documents(files, args.jsonl_field, stats))
    token_ids: list[np.ndarray] = []
    tokenize_s = 0.0
    with tqdm(total=len(texts), unit="doc", desc="tokenising documents", disable=args.no_progress,
              file=sys.stderr) as bar:
        for start in range(0, len(texts), _TOKENIZE_BATCH):
            batch = texts[start : start + _TOKENIZE_BATCH]
            t0 = time.perf_counter()
            encoded = tokenizer(batch, add_special_tokens=False, verbose=False)["input_ids"]
            token_ids.extend(np.asarray(ids, dtype=np.int32) for ids in encoded)
            tokenize_s += time.perf_counter() - t0
            bar.update(len(batch))
    if not token_ids:
        raise ValueError(
            f"no documents to index: {len(stats.non_utf8)} of {stats.files} files are not UTF-8, "
            f"{stats.bad_records} .jsonl lines have no string field {args.jsonl_field!r}"
        )
    if not any(ids.size for ids in token_ids):
        read = "the document read is" if len(token_ids) == 1 else f"all {len(token_ids)} documents read are"
        raise ValueError(f"no tokens to index: {read} empty")

    # Step 2. Build the automaton (timed apart from tokenisation and from the
    # one-off tokenizer fingerprint, which build() would otherwise compute) and
    # save it atomically.
    t0 = time.perf_counter()
    tokenizer_fingerprint(tokenizer)
    tokenize_s += time.perf_counter() - t0
    t0 = time.perf_counter()
    index = CorpusIndex.build(token_ids, tokenizer, show_progress=not args.no_progress,
                              dedup_threshold=args.dedup, signatures=not args.no_signatures)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    index.save(args.out)
    save_s = time.perf_counter() - t0

    # Step 3. Summary.
    num_tokens = len(index)
    file_bytes = os.path.getsize(args.out)
    skipped = []
    if stats.non_utf8:
        skipped.append(f"{_plural(len(stats.non_utf8), 'file')} skipped (not UTF-8)")
    if stats.bad_records:
        skipped.append(f"{_plural(stats.bad_records, '.jsonl line')} skipped (no string field {args.jsonl_field!r})")
    if args.dedup is not None:
        skipped.append(f"{_plural(index.dropped_documents, 'near-duplicate document')} dropped "
                       f"(Jaccard >= {args.dedup:g})")
    if index.signatures is not None:
        skipped.append("MinHash signatures stored")
    print(
        f"{args.out}: {_plural(index.num_documents, 'document')}, {_plural(num_tokens, 'token')}, "
        f"{file_bytes / max(num_tokens, 1):.1f} bytes/token ({file_bytes} bytes); "
        f"tokenise {tokenize_s:.2f} s, build {build_s:.2f} s, save {save_s:.2f} s"
        + ("; " + ", ".join(skipped) if skipped else "")
    )
    for path in stats.non_utf8[:10]:
        print(f"  skipped (not UTF-8): {path}", file=sys.stderr)
    if len(stats.non_utf8) > 10:
        print(f"  ... and {len(stats.non_utf8) - 10} more", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------
# info


def header_fields(index, path: str) -> list[tuple[str, object]]:
    """(name, value) pairs describing a loaded index."""
    file_bytes = os.path.getsize(path)
    num_tokens = len(index)
    fields: list[tuple[str, object]] = [
        ("file", path),
        ("tokens", num_tokens),
        ("documents", index.num_documents),
    ]
    num_states = getattr(index, "num_states", None)
    if num_states is not None:
        fields.append(("states", num_states))
    sigs = getattr(index, "signatures", None)
    fields += [
        ("signatures", f"MinHash, {sigs.num_perm} permutations, seed {sigs.seed}, {sigs.ngram}-token shingles"
         if sigs is not None else "(none)"),
        ("vocab size", index.vocab_size),
        ("fingerprint", index.fingerprint or "(none)"),
        ("file size", f"{file_bytes} bytes"),
        ("bytes/token", f"{file_bytes / max(num_tokens, 1):.2f}"),
    ]
    return fields


def run_info(args: argparse.Namespace) -> int:
    from refdec.drafting.index import CorpusIndex

    check_input_file(args.file, "index info")
    index = CorpusIndex.load(args.file)
    fields = header_fields(index, args.file)
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        print(f"{name + ':':<{width + 1}} {value}")
    if args.verify:
        ok = index.verify()
        print(f"{'checksum:':<{width + 1}} {'ok' if ok else 'MISMATCH: the file is corrupt'}")
        if not ok:
            print(f"refdec: error: {args.file}: body checksum mismatch: the file is corrupt", file=sys.stderr)
            return 1
    return 0
