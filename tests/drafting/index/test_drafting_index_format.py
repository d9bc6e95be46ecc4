"""Specifies refdec.drafting.index's on-disk index file: round trip, corruption, foreign files, atomic save.

Specification:
- ``save`` then ``load`` (mmap) answers every query exactly as the built index;
- a file that is not a complete refdec index of this format version (empty,
  truncated, random bytes, text, another version, any header field corrupted)
  raises ``refdec.IndexFormatError`` whose message names the file and the
  problem; a missing file raises ``FileNotFoundError``;
- every flipped body byte is caught by ``verify()``;
- without ``verify()``, no corruption of the file crashes or hangs the
  process: queries on corrupted files run in a subprocess whose exit code
  must be 0;
- a tokenizer fingerprint mismatch raises ``IndexFormatError`` naming both;
- ``save`` is atomic: a failed save leaves the previous file intact.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import refdec
from naive_index import NaiveIndex, assert_loaded_like_built
from refdec.drafting.index import CorpusIndex, tokenizer_fingerprint

# Header layout (csrc/frozen_index.h, struct FileHeader; little-endian, 512 bytes):
# name -> (offset, struct format).
HEADER_SIZE = 512
NUM_SECTIONS = 9
HEADER_FIELDS = {
    "magic": (0, "8s"),
    "version": (8, "<I"),
    "header_size": (12, "<I"),
    "fingerprint": (16, "64s"),
    "vocab_size": (80, "<I"),
    "reserved0": (84, "<I"),
    "num_tokens": (88, "<Q"),
    "num_documents": (96, "<Q"),
    "num_internal": (104, "<Q"),
    "num_edges": (112, "<Q"),
    "file_size": (120, "<Q"),
    "checksum": (128, "<Q"),
}
for _sec in range(NUM_SECTIONS):
    HEADER_FIELDS[f"section{_sec}.offset"] = (136 + 16 * _sec, "<Q")
    HEADER_FIELDS[f"section{_sec}.size"] = (144 + 16 * _sec, "<Q")
HEADER_FIELDS["header_checksum"] = (136 + 16 * NUM_SECTIONS, "<Q")
# The optional MinHash signatures (all zero without them).
HEADER_FIELDS.update({
    "minhash_num_perm": (288, "<I"),
    "minhash_seed": (292, "<I"),
    "minhash_ngram": (296, "<I"),
    "reserved1": (300, "<I"),
    "minhash_values.offset": (304, "<Q"),
    "minhash_values.size": (312, "<Q"),
    "minhash_sizes.offset": (320, "<Q"),
    "minhash_sizes.size": (328, "<Q"),
})
MINHASH_FIELDS = [name for name in HEADER_FIELDS if name.startswith("minhash") or name == "reserved1"]
PADDING = (336, HEADER_SIZE)

_M64 = (1 << 64) - 1
_P1, _P2, _P3, _P4, _P5 = (11400714785074694791, 14029467366897019727, 1609587929392839161,
                           9650029242287828579, 2870177450012600261)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _round(acc: int, word: int) -> int:
    return (_rotl((acc + word * _P2) & _M64, 31) * _P1) & _M64


def body_checksum(data: bytes) -> int:
    """Python port of csrc/frozen_index.cc body_checksum (to forge consistent headers)."""
    size = len(data)
    v = [(_P1 + _P2) & _M64, _P2, 0, (-_P1) & _M64]
    i = 0
    while i + 32 <= size:
        for lane in range(4):
            v[lane] = _round(v[lane], struct.unpack_from("<Q", data, i + 8 * lane)[0])
        i += 32
    h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M64
    for lane in range(4):
        h = ((h ^ _round(0, v[lane])) * _P1 + _P4) & _M64
    h = (h + size) & _M64
    while i + 8 <= size:
        h = (_rotl(h ^ _round(0, struct.unpack_from("<Q", data, i)[0]), 27) * _P1 + _P4) & _M64
        i += 8
    while i < size:
        h = (_rotl(h ^ ((data[i] * _P5) & _M64), 11) * _P1) & _M64
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M64
    h ^= h >> 29
    h = (h * _P3) & _M64
    h ^= h >> 32
    return h


def reseal(data: bytes) -> bytes:
    """``data`` with the header checksum recomputed, so a corrupted header passes that check."""
    offset, fmt = HEADER_FIELDS["header_checksum"]
    header = bytearray(data[:HEADER_SIZE])
    struct.pack_into(fmt, header, offset, 0)
    struct.pack_into(fmt, header, offset, body_checksum(bytes(header)))
    return bytes(header) + data[HEADER_SIZE:]


# A corpus with lots of repetition (many internal states and edges), ids that
# need more than 16 bits, an empty document and a one-token document.
RNG = np.random.default_rng(1234)
DOCS = [
    RNG.integers(0, 4, size=300).tolist(),
    [],
    (RNG.integers(0, 3, size=200) + 262_140).tolist(),
    [7],
    RNG.integers(0, 6, size=150).tolist(),
]
QUERIES = [[], [0], [1, 2], [0, 1, 2, 3], [262_141, 262_142], [7], [5, 5, 5], [9, 9], [3, 2, 1, 0, 1, 2, 3]]


def read_field(data: bytes, name: str):
    offset, fmt = HEADER_FIELDS[name]
    return struct.unpack_from(fmt, data, offset)[0]


def with_field(data: bytes, name: str, value, *, resealed: bool = False) -> bytes:
    """``data`` with one header field set to ``value`` (and the header checksum fixed if ``resealed``)."""
    offset, fmt = HEADER_FIELDS[name]
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return reseal(bytes(out)) if resealed else bytes(out)


@pytest.fixture(scope="module")
def built():
    return CorpusIndex.build(DOCS, show_progress=False)


@pytest.fixture()
def index_file(tmp_path, built):
    path = tmp_path / "corpus.refdec"
    built.save(path)
    return path


def _subprocess_env() -> dict:
    """Environment for a child Python that imports refdec and these tests' helpers."""
    here = Path(__file__).resolve().parent  # tests/drafting/index/ (this module), tests/ (the helper modules)
    paths = [str(here.parents[2]), str(here.parents[1]), str(here), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))


def answers(index):
    out = []
    for query in QUERIES:
        out.append(
            (
                index.match_length(query),
                index.count(query) if query else None,
                index.next_tokens(query, 10),
                index.continuation(query, 20).tolist(),
            )
        )
    return out


def assert_format_error(path, pattern: str, **load_kwargs):
    """Loading ``path`` raises IndexFormatError naming the file and matching ``pattern``."""
    with pytest.raises(refdec.IndexFormatError) as info:
        CorpusIndex.load(path, **load_kwargs)
    message = str(info.value)
    assert str(path) in message, f"the message does not name the file: {message!r}"
    assert re.search(pattern, message, re.IGNORECASE), f"the message does not say {pattern!r}: {message!r}"
    return message


# ---------------------------------------------------------------------------
# Round trip


def test_index_format_error_is_a_value_error_exported_from_the_package():
    assert issubclass(refdec.IndexFormatError, ValueError)
    from refdec.drafting.index import IndexFormatError

    assert IndexFormatError is refdec.IndexFormatError


def test_header_layout_matches_this_test(index_file, built):
    data = index_file.read_bytes()
    assert read_field(data, "magic") == b"REFDECIX"
    assert read_field(data, "header_size") == HEADER_SIZE
    assert read_field(data, "num_tokens") == len(built) == sum(len(d) for d in DOCS)
    assert read_field(data, "num_documents") == built.num_documents == len(DOCS)
    assert read_field(data, "file_size") == len(data)
    assert read_field(data, "vocab_size") == built.vocab_size
    assert read_field(data, "reserved0") == 0
    assert all(read_field(data, name) == 0 for name in MINHASH_FIELDS)  # built without signatures
    assert data[PADDING[0] : PADDING[1]] == bytes(PADDING[1] - PADDING[0])
    assert reseal(data) == data, "the Python port of the header checksum disagrees with the C++ one"
    assert read_field(data, "checksum") == body_checksum(data[HEADER_SIZE:])


def test_save_then_load_answers_every_query_identically(index_file, built):
    loaded = CorpusIndex.load(index_file)
    assert_loaded_like_built(loaded, built, DOCS)
    assert answers(loaded) == answers(built)
    naive = NaiveIndex(DOCS)
    for query in QUERIES:
        assert loaded.match_length(query) == naive.match_length(query)
        assert loaded.next_tokens(query, 10) == naive.next_tokens(query, 10)


def test_save_accepts_str_and_pathlike_and_saving_twice_gives_identical_bytes(tmp_path, built):
    built.save(str(tmp_path / "a.refdec"))
    built.save(tmp_path / "b.refdec")
    assert (tmp_path / "a.refdec").read_bytes() == (tmp_path / "b.refdec").read_bytes()


def test_a_loaded_index_saved_again_gives_identical_bytes(index_file, tmp_path):
    loaded = CorpusIndex.load(index_file)
    loaded.save(tmp_path / "again.refdec")
    assert (tmp_path / "again.refdec").read_bytes() == index_file.read_bytes()


def test_index_with_documents_added_after_build_round_trips(tmp_path):
    index = CorpusIndex.build(DOCS[:2], show_progress=False)
    index.add_documents(DOCS[2:])
    index.save(tmp_path / "grown.refdec")
    loaded = CorpusIndex.load(tmp_path / "grown.refdec")
    assert loaded.num_documents == len(DOCS)
    assert answers(loaded) == answers(CorpusIndex.build(DOCS, show_progress=False))


def test_load_keeps_the_file_mapped_not_copied(index_file):
    # The loaded index stays valid while the path is replaced (mmap of the old inode).
    loaded = CorpusIndex.load(index_file)
    expected = answers(loaded)
    os.replace(index_file, index_file.with_suffix(".moved"))
    assert answers(loaded) == expected


# ---------------------------------------------------------------------------
# Files that are not an index


def test_missing_file_raises_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        CorpusIndex.load(tmp_path / "nope.refdec")


@pytest.mark.parametrize(
    "name, content",
    [
        ("empty", b""),
        ("random", np.random.default_rng(7).integers(0, 256, size=4096, dtype=np.uint8).tobytes()),
        ("text", b"this is a text file, not an index\n" * 64),
        ("npy", b"\x93NUMPY" + bytes(1000)),
        ("one_byte", b"R"),
        ("magic_only", b"REFDECIX"),
    ],
)
def test_foreign_file_raises_index_format_error_naming_it(tmp_path, name, content):
    path = tmp_path / f"{name}.refdec"
    path.write_bytes(content)
    assert_format_error(path, r"magic|not a refdec|empty|too small|short|truncat|header")


@pytest.mark.parametrize("keep", ["0", "8", "100", "511", "512", "513", "half", "minus_1", "minus_64"])
def test_truncated_file_raises_index_format_error_naming_it(tmp_path, index_file, keep):
    data = index_file.read_bytes()
    n = {"half": len(data) // 2, "minus_1": len(data) - 1, "minus_64": len(data) - 64}.get(keep)
    n = int(keep) if n is None else n
    path = tmp_path / f"truncated-{keep}.refdec"
    path.write_bytes(data[:n])
    assert_format_error(path, r"truncat|size|short|empty|magic|header|small")


def test_file_with_trailing_bytes_raises_index_format_error(tmp_path, index_file):
    path = tmp_path / "long.refdec"
    path.write_bytes(index_file.read_bytes() + b"\0" * 64)
    assert_format_error(path, r"size|length|trailing|long")


@pytest.mark.parametrize("version", [0, 2, 99, 2**32 - 1])
def test_other_format_version_raises_index_format_error_naming_both_versions(tmp_path, index_file, version):
    path = tmp_path / "version.refdec"
    data = index_file.read_bytes()
    current = read_field(data, "version")
    path.write_bytes(with_field(data, "version", version))
    message = assert_format_error(path, r"version")
    assert str(version) in message and str(current) in message, message


def _corruptions(name: str, value):
    """Bad values for one header field."""
    if name == "magic":
        return [b"REFDECIY", b"\0" * 8, b"refdecix"]
    if name == "fingerprint":
        flipped = bytearray(value)
        flipped[0] ^= 0x01
        return [bytes(flipped), b"\xff" * 64]
    if name == "checksum":
        return [value ^ 1, 0]
    if name == "reserved0":
        return [1, 2**32 - 1]
    if name == "vocab_size":
        return [1, value + 1, 2**32 - 1]
    limit = 2**32 - 1 if HEADER_FIELDS[name][1] == "<I" else 2**64 - 1
    candidates = [value + 1, value - 1 if value > 0 else 2, value + 64, limit, limit // 2 + 1]
    return [c for c in candidates if 0 <= c <= limit and c != value]


HEADER_FIELD_PROBLEMS = {
    "magic": r"magic|not a refdec",
    "version": r"version",
    "header_size": r"header",
    "fingerprint": r"fingerprint|header|checksum",
    "vocab_size": r"vocab|header|checksum",
    "reserved0": r"reserved|header|checksum",
    "num_tokens": r"token|size|section|header|checksum",
    "num_documents": r"document|size|section|header|checksum",
    "num_internal": r"state|internal|size|section|header|checksum",
    "num_edges": r"edge|size|section|header|checksum",
    "file_size": r"size|truncat|header|checksum",
    "checksum": r"checksum|header",
    "header_checksum": r"checksum|header",
    "minhash_num_perm": r"minhash|section|header|checksum",
}


@pytest.mark.parametrize("name", list(HEADER_FIELDS))
def test_each_corrupted_header_field_raises_index_format_error_naming_file_and_problem(tmp_path, index_file, name):
    data = index_file.read_bytes()
    original = read_field(data, name)
    pattern = HEADER_FIELD_PROBLEMS.get(name, r"section|offset|size|header|checksum")
    for bad_idx, bad in enumerate(_corruptions(name, original)):
        path = tmp_path / f"{name.replace('.', '_')}-{bad_idx}.refdec"
        path.write_bytes(with_field(data, name, bad))
        assert_format_error(path, pattern)


# Fields whose bad values the loader can see without the header checksum: every
# size, offset and count must agree with the others and with the file size.
STRUCTURAL_FIELDS = [
    name for name in HEADER_FIELDS if name not in ("fingerprint", "vocab_size", "checksum", "header_checksum")
]


@pytest.mark.parametrize("name", STRUCTURAL_FIELDS)
def test_each_structural_header_field_is_validated_even_behind_a_valid_header_checksum(tmp_path, index_file, name):
    # Defence in depth: a header written by a buggy writer (consistent checksum,
    # inconsistent sizes) must not be trusted either.
    data = index_file.read_bytes()
    original = read_field(data, name)
    pattern = HEADER_FIELD_PROBLEMS.get(name, r"section|offset|size|header")
    for bad_idx, bad in enumerate(_corruptions(name, original)):
        path = tmp_path / f"{name.replace('.', '_')}-{bad_idx}.refdec"
        path.write_bytes(with_field(data, name, bad, resealed=True))
        assert_format_error(path, pattern)


def test_non_hex_fingerprint_behind_a_valid_header_checksum_raises_index_format_error(tmp_path, index_file):
    data = index_file.read_bytes()
    for bad_idx, bad in enumerate([b"\xff" * 64, b"zz" + bytes(62), b"ab" + bytes(2) + b"cd" + bytes(58)]):
        path = tmp_path / f"fingerprint-{bad_idx}.refdec"
        path.write_bytes(with_field(data, "fingerprint", bad, resealed=True))
        assert_format_error(path, r"fingerprint")


def test_nonzero_header_padding_raises_index_format_error(tmp_path, index_file):
    data = bytearray(index_file.read_bytes())
    data[PADDING[1] - 1] = 0x01
    path = tmp_path / "padding.refdec"
    path.write_bytes(bytes(data))
    assert_format_error(path, r"padding|reserved|header|checksum")


# ---------------------------------------------------------------------------
# MinHash signatures (refdec.drafting.retrieval) in the index file


@pytest.fixture()
def signed_file(tmp_path):
    path = tmp_path / "signed.refdec"
    CorpusIndex.build(DOCS, show_progress=False, signatures=True).save(path)
    return path


def test_signatures_are_two_sections_after_the_others_named_in_the_header(signed_file):
    data = signed_file.read_bytes()
    num_docs, num_perm = len(DOCS), read_field(data, "minhash_num_perm")
    assert (num_perm, read_field(data, "minhash_seed"), read_field(data, "minhash_ngram")) == (128, 1, 3)
    values, sizes = read_field(data, "minhash_values.offset"), read_field(data, "minhash_sizes.offset")
    last_end = read_field(data, f"section{NUM_SECTIONS - 1}.offset") + read_field(data, f"section{NUM_SECTIONS - 1}.size")
    assert last_end <= values and values % 64 == 0 and sizes % 64 == 0
    assert read_field(data, "minhash_values.size") == 4 * num_docs * num_perm
    assert read_field(data, "minhash_sizes.size") == 4 * num_docs and sizes + 4 * num_docs <= len(data)
    sigs = CorpusIndex.load(signed_file).signatures
    assert sigs.matrix.tobytes() == data[values : values + 4 * num_docs * num_perm]
    assert sigs.sizes.tobytes() == data[sizes : sizes + 4 * num_docs]
    assert read_field(data, "checksum") == body_checksum(data[HEADER_SIZE:])


def test_a_loaded_index_with_signatures_saved_again_gives_identical_bytes(signed_file, tmp_path):
    CorpusIndex.load(signed_file).save(tmp_path / "again.refdec")
    assert (tmp_path / "again.refdec").read_bytes() == signed_file.read_bytes()


@pytest.mark.parametrize("name", [n for n in MINHASH_FIELDS if n not in ("minhash_seed", "minhash_ngram")])
def test_each_structural_minhash_field_of_a_signed_file_is_validated(tmp_path, signed_file, name):
    data = signed_file.read_bytes()
    for bad_idx, bad in enumerate(_corruptions(name, read_field(data, name))):
        path = tmp_path / f"{name.replace('.', '_')}-{bad_idx}.refdec"
        path.write_bytes(with_field(data, name, bad, resealed=True))
        assert_format_error(path, r"minhash|section|offset|size|header|reserved")


def test_verify_catches_a_flipped_byte_in_the_signatures(signed_file):
    data = signed_file.read_bytes()
    start = read_field(data, "minhash_values.offset")
    end = read_field(data, "minhash_sizes.offset") + read_field(data, "minhash_sizes.size")
    missed = _undetected_flips(signed_file, range(start, end, 13))
    assert not missed, f"verify() missed flipped bytes at offsets {missed[:20]} (of {len(missed)})"


def test_an_invalid_shingle_length_in_a_signed_file_is_an_index_format_error_on_first_use(tmp_path, signed_file):
    path = tmp_path / "ngram.refdec"
    path.write_bytes(with_field(signed_file.read_bytes(), "minhash_ngram", 0, resealed=True))
    index = CorpusIndex.load(path)  # the shingle length means nothing to the C++ core
    with pytest.raises(refdec.IndexFormatError, match=rf"{re.escape(str(path))}.*ngram must be an int in \[1, 64\]"):
        index.signatures


def test_freezing_with_signatures_of_another_document_count_is_refused():
    sam = refdec._C.SuffixAutomaton()
    sam.add_document(np.array([1, 2, 3], dtype=np.int32))
    with pytest.raises(ValueError, match="minhash signatures have 2 rows, the index 1 documents"):
        refdec._C.FrozenIndex.freeze(sam, "", 0, minhash_values=np.zeros((2, 4), np.uint32),
                                     minhash_sizes=np.zeros(2, np.uint32))


# ---------------------------------------------------------------------------
# Body corruption


SMALL_DOCS = [[0, 1, 2, 0, 1, 3, 0, 1, 2, 2, 1, 0] * 3, [], [262_141, 262_142, 262_141, 262_142, 5], [1, 2]]


def _undetected_flips(path: Path, offsets) -> list[int]:
    data = path.read_bytes()
    flipped_path = path.with_name("flipped.refdec")
    missed = []
    for offset in offsets:
        corrupted = bytearray(data)
        corrupted[offset] ^= (1 << (offset % 8)) if offset % 3 else 0xFF
        flipped_path.write_bytes(bytes(corrupted))
        try:
            index = CorpusIndex.load(flipped_path)
        except refdec.IndexFormatError:
            continue  # caught even earlier
        if index.verify():
            missed.append(offset)
        del index
    return missed


def test_verify_catches_a_flipped_byte_at_every_body_offset(tmp_path):
    path = tmp_path / "small.refdec"
    CorpusIndex.build(SMALL_DOCS, show_progress=False).save(path)
    size = path.stat().st_size
    missed = _undetected_flips(path, range(HEADER_SIZE, size))
    assert not missed, f"verify() missed flipped bytes at offsets {missed[:20]} (of {len(missed)})"


def test_verify_catches_flipped_bytes_across_a_larger_file(index_file):
    size = index_file.stat().st_size
    missed = _undetected_flips(index_file, range(HEADER_SIZE, size, 37))
    assert not missed, f"verify() missed flipped bytes at offsets {missed[:20]} (of {len(missed)})"


def test_every_flipped_header_byte_is_caught_on_load(tmp_path, index_file):
    data = index_file.read_bytes()
    path = tmp_path / "header-flip.refdec"
    for offset in range(HEADER_SIZE):
        corrupted = bytearray(data)
        corrupted[offset] ^= 1 << (offset % 8)
        path.write_bytes(bytes(corrupted))
        with pytest.raises(refdec.IndexFormatError):
            CorpusIndex.load(path)


def test_verify_catches_two_compensating_flips(tmp_path, index_file):
    # Swapping two 8-byte words keeps a plain sum of words unchanged.
    data = bytearray(index_file.read_bytes())
    a, b = HEADER_SIZE, HEADER_SIZE + 64
    if data[a : a + 8] == data[b : b + 8]:
        b += 8
    data[a : a + 8], data[b : b + 8] = data[b : b + 8], data[a : a + 8]
    path = tmp_path / "swapped.refdec"
    path.write_bytes(bytes(data))
    try:
        assert not CorpusIndex.load(path).verify()
    except refdec.IndexFormatError:
        pass


_CRASH_SCRIPT = textwrap.dedent(
    """
    import os, struct, sys
    import numpy as np
    from refdec.drafting.index import CorpusIndex
    import refdec
    from test_drafting_index_format import reseal

    source, workdir, queries = sys.argv[1], sys.argv[2], eval(sys.argv[3])
    data = open(source, "rb").read()
    header_size = 512
    # Body: every 4-byte word set to extreme values; header: every 4-byte word too.
    plans = []
    for offset in range(0, len(data) - 3, 4):
        for value in (0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0x00000000, 0x00010001):
            plans.append((offset, value))
    # And single bit flips at a spread of offsets.
    flips = [(offset, 1 << (offset % 8)) for offset in range(0, len(data), 7)]
    # Header words again, behind a recomputed header checksum (reaches the structural checks).
    sealed = [(offset, value) for offset, value in plans if offset < header_size]
    done = 0
    unexpected = []
    for kind, items in (("word", plans), ("bit", flips), ("sealed", sealed)):
        for offset, value in items:
            corrupted = bytearray(data)
            if kind == "bit":
                corrupted[offset] ^= value
            else:
                struct.pack_into("<I", corrupted, offset, value)
            if kind == "sealed":
                corrupted = bytearray(reseal(bytes(corrupted)))
            if corrupted == data:
                continue
            path = os.path.join(workdir, "c%d.refdec" % (done % 2))
            with open(path, "wb") as f:
                f.write(bytes(corrupted))
            sys.stdout.write("%s %d %#x\\n" % (kind, offset, value)); sys.stdout.flush()
            try:
                index = CorpusIndex.load(path)
            except refdec.IndexFormatError:
                done += 1
                continue
            except Exception as exc:  # the wrong exception type: noted, not fatal
                unexpected.append("%s %d %#x: load raised %s: %s" % (kind, offset, value, type(exc).__name__, exc))
                done += 1
                continue
            try:
                len(index); index.num_documents; index.vocab_size; index.fingerprint
                for doc_idx in range(min(index.num_documents, 8)):
                    index.document(doc_idx)
                for q in queries:
                    index.match_length(q)
                    if q:
                        index.count(q)
                    index.next_tokens(q, 8)
                    index.continuation(q, 64)
                proposer = refdec.Proposer(index=index, max_depth=16)
                proposer.start(queries[-1])
                proposer.propose(16)
                proposer.accept([0, 1])
                proposer.propose(16)
            except (ValueError, IndexError, RuntimeError, OverflowError, MemoryError) as exc:
                pass  # a Python exception is a clean failure; a crash or a hang is not
            del index
            done += 1
    for line in unexpected[:20]:
        print("UNEXPECTED", line)
    print("DONE", done)
    """
)


@pytest.mark.full  # many corrupted files queried in a child process (the fuzz tier: tests/drafting/index/test_drafting_index_fuzz.py)
def test_queries_on_corrupted_files_without_verify_never_crash_or_hang(tmp_path):
    # A smaller corpus keeps the number of corruptions (5 per 4-byte word) manageable.
    source = tmp_path / "small.refdec"
    CorpusIndex.build(SMALL_DOCS, show_progress=False).save(source)
    script = tmp_path / "crash.py"
    script.write_text(_CRASH_SCRIPT)
    queries = [[0, 1], [0, 1, 2, 0], [262_141, 262_142], [1, 2, 2, 1, 0, 1, 2]]
    try:
        proc = subprocess.run(
            [sys.executable, str(script), str(source), str(tmp_path), repr(queries)],
            capture_output=True,
            text=True,
            timeout=240,
            env=_subprocess_env(),
        )
    except subprocess.TimeoutExpired as exc:
        last = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        tail = last.strip().splitlines()[-1:] if last else []
        pytest.fail(f"queries on a corrupted file hung; last corruption tried: {tail}")
    last = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    assert proc.returncode == 0, (
        f"the process died with exit code {proc.returncode} on the corruption {last} "
        f"(kind offset value of {source.stat().st_size} bytes)\nstderr: {proc.stderr[-3000:]}"
    )
    assert last and last[0].startswith("DONE"), proc.stdout[-500:]
    unexpected = [line for line in proc.stdout.splitlines() if line.startswith("UNEXPECTED")]
    assert not unexpected, "loading a corrupted file raised something other than IndexFormatError:\n" + "\n".join(
        unexpected
    )


# ---------------------------------------------------------------------------
# Tokenizer fingerprint


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    from test_cli_index import make_tiny_tokenizer

    root = tmp_path_factory.mktemp("tokenizers")
    return make_tiny_tokenizer(root), make_tiny_tokenizer(root, extra_text=("zzz qqq zzz qqq xyzzy " * 5,))


@pytest.mark.full  # trains two tokenizers
def test_tokenizer_fingerprint_is_stable_and_tells_tokenizers_apart(tokenizers, tmp_path):
    first, second = tokenizers
    fp = tokenizer_fingerprint(first)
    assert isinstance(fp, str) and fp
    assert tokenizer_fingerprint(first) == fp
    assert tokenizer_fingerprint(second) != fp
    # The same tokenizer saved and reloaded (and in another process) has the same fingerprint.
    first.save_pretrained(tmp_path / "copy")
    from transformers import AutoTokenizer

    assert tokenizer_fingerprint(AutoTokenizer.from_pretrained(str(tmp_path / "copy"))) == fp
    code = (
        "import sys; from transformers import AutoTokenizer; from refdec.drafting.index import tokenizer_fingerprint; "
        "print(tokenizer_fingerprint(AutoTokenizer.from_pretrained(sys.argv[1])))"
    )
    env = dict(_subprocess_env(), PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "copy")], capture_output=True, text=True,
                         env=env, check=True)
    assert out.stdout.strip() == fp


def test_index_built_with_a_tokenizer_records_its_fingerprint(tokenizers, tmp_path):
    first, second = tokenizers
    index = CorpusIndex.build(["def f(x):\n    return x\n"], first, show_progress=False)
    assert index.fingerprint == tokenizer_fingerprint(first)
    path = tmp_path / "fp.refdec"
    index.save(path)
    assert CorpusIndex.load(path, first).fingerprint == tokenizer_fingerprint(first)
    assert CorpusIndex.load(path).fingerprint == tokenizer_fingerprint(first)


def test_fingerprint_mismatch_raises_index_format_error_naming_both(tokenizers, tmp_path):
    first, second = tokenizers
    path = tmp_path / "fp.refdec"
    CorpusIndex.build(["import os\nprint('hello world')\n"], first, show_progress=False).save(path)
    message = assert_format_error(path, r"fingerprint|tokenizer", tokenizer=second)
    assert tokenizer_fingerprint(first) in message and tokenizer_fingerprint(second) in message, message


def test_index_of_token_ids_without_a_tokenizer_loads_with_any_tokenizer(tokenizers, tmp_path):
    # No fingerprint recorded: nothing to compare against.
    first, _ = tokenizers
    path = tmp_path / "ids.refdec"
    CorpusIndex.build([[1, 2, 3]], show_progress=False).save(path)
    assert len(CorpusIndex.load(path, first)) == 3


# ---------------------------------------------------------------------------
# Atomic save

_FAILING_SAVE_SCRIPT = textwrap.dedent(
    """
    import resource, signal, sys
    import numpy as np
    from refdec.drafting.index import CorpusIndex

    path, limit = sys.argv[1], int(sys.argv[2])
    big = CorpusIndex.build([np.arange(20000, dtype=np.int32) % 97], show_progress=False)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        big.save(path)
    except Exception as exc:
        print("FAILED", type(exc).__name__, exc)
        sys.exit(0)
    print("SAVED")
    """
)


def test_a_failing_save_over_an_existing_index_leaves_it_intact(tmp_path, index_file):
    before = index_file.read_bytes()
    expected = answers(CorpusIndex.load(index_file))
    script = tmp_path / "fail_save.py"
    script.write_text(_FAILING_SAVE_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(index_file), str(len(before) + 1000)],
        capture_output=True, text=True, timeout=120, env=_subprocess_env(),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("FAILED"), f"the save should fail past the file size limit: {proc.stdout}"
    assert index_file.read_bytes() == before, "a failed save changed the existing file"
    assert answers(CorpusIndex.load(index_file)) == expected
    leftovers = sorted(p.name for p in index_file.parent.iterdir() if p.name not in (index_file.name, script.name))
    assert leftovers == [], f"a failed save left temporary files behind: {leftovers}"


def test_save_into_a_missing_directory_raises_and_writes_nothing(tmp_path, built):
    with pytest.raises((FileNotFoundError, OSError)):
        built.save(tmp_path / "no" / "such" / "dir" / "x.refdec")
    assert not (tmp_path / "no").exists()


_SAVE_OVER_MAPPED_SCRIPT = textwrap.dedent(
    """
    import sys
    from refdec.drafting.index import CorpusIndex

    path = sys.argv[1]
    a = CorpusIndex.load(path)
    before = [a.match_length([0, 1, 2]), a.count([0, 1]), a.next_tokens([1], 5), a.continuation([0], 50).tolist()]
    # Another, smaller index saved over the file that `a` maps.
    CorpusIndex.build([[9, 9, 9]], show_progress=False).save(path)
    after = [a.match_length([0, 1, 2]), a.count([0, 1]), a.next_tokens([1], 5), a.continuation([0], 50).tolist()]
    assert before == after, (before, after)
    assert CorpusIndex.load(path).count([9, 9]) == 2
    # A mapped index saved onto its own path.
    b = CorpusIndex.load(path)
    b.save(path)
    assert CorpusIndex.load(path).verify() and b.count([9]) == 3
    print("OK")
    """
)


def test_saving_over_a_mapped_index_leaves_its_readers_intact(tmp_path, index_file):
    # Save writes a new file and renames it: a reader mapping the old file keeps
    # its answers (an in-place overwrite would change them or raise SIGBUS).
    script = tmp_path / "over.py"
    script.write_text(_SAVE_OVER_MAPPED_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(index_file)], capture_output=True, text=True,
                          timeout=120, env=_subprocess_env())
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", (proc.returncode, proc.stdout, proc.stderr[-2000:])


def test_add_documents_with_another_tokenizer_raises_naming_both_fingerprints(tokenizers):
    first, second = tokenizers
    index = CorpusIndex.build(["x = 1\n"], first, show_progress=False)
    with pytest.raises(ValueError) as info:
        index.add_documents(["y = 2\n"], second)
    message = str(info.value)
    assert tokenizer_fingerprint(first) in message and tokenizer_fingerprint(second) in message, message
    assert index.num_documents == 1
