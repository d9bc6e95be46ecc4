"""Specifies refdec.drafting.index's loader under fuzzing: ``CorpusIndex.load`` with mutated index files
(hypothesis).

Property: whatever the bytes of a file, ``CorpusIndex.load`` either raises
``IndexFormatError`` or returns an index that answers every query
(``match_length``, ``count``, ``next_tokens``, ``continuation``, ``document``,
``Proposer.propose``/``accept``) without crashing or hanging; and when the
body differs from the saved one, ``verify()`` says so.

Mutations drawn: truncation at every section boundary (and one byte either
side) and at random points; bit flips at random offsets (header and body,
with or without a recomputed header checksum); oversized counts in the
header; section offsets outside the file or overlapping a neighbour; 4-byte
words of the body set to extreme values.

Loading and querying run in one long-lived worker process: a segfault or an
abort fails the example (and is restarted for the next one) instead of
killing pytest, and a query that runs for more than 30 s counts as a hang.
The sanitizer step of ``.ci/run`` runs this file under ASan + UBSan; debug
builds also put inaccessible guard pages around the mapping, so a read
outside the file faults there.

``REFDEC_HYPOTHESIS_SCALE=N`` multiplies the number of examples.
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from refdec.drafting.index import CorpusIndex
from test_drafting_index_format import HEADER_FIELDS, HEADER_SIZE, NUM_SECTIONS, reseal

_SCALE = max(1, int(os.environ.get("REFDEC_HYPOTHESIS_SCALE", "1")))
FUZZ = settings(deadline=None, max_examples=150 * _SCALE, derandomize=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

RNG = np.random.default_rng(11)
DOCS = [
    ([0, 1, 2, 0, 1, 3, 0, 1, 2, 2, 1, 0] * 4),
    [],
    [262_141, 262_142, 262_141, 262_142, 5, 2**31 - 1],
    RNG.integers(0, 5, size=120).tolist(),
    [7],
]
# Queries: real n-grams of the documents (deep paths) and foreign ones.
QUERIES = [[], [0], [0, 1], [0, 1, 2, 0, 1], [262_141, 262_142], [2**31 - 1], [9, 9], [1, 2, 2, 1, 0, 1, 2]]
QUERIES += [DOCS[3][i : i + n] for i, n in ((0, 6), (30, 12), (100, 3))]

_WORKER = textwrap.dedent(
    """
    import json, sys, traceback
    import refdec
    from refdec.drafting.index import CorpusIndex

    queries = json.loads(sys.argv[1])
    for line in sys.stdin:
        path = line.strip()
        out = {}
        try:
            index = CorpusIndex.load(path)
        except refdec.IndexFormatError as exc:
            out = {"outcome": "format_error", "message": str(exc)}
        except Exception as exc:
            out = {"outcome": "unexpected", "message": "%s: %s" % (type(exc).__name__, exc)}
        else:
            out = {"outcome": "loaded", "verify": bool(index.verify())}
            try:
                len(index); index.num_documents; index.num_states; repr(index)
                for doc_idx in range(min(index.num_documents, 16)):
                    index.document(doc_idx)
                for q in queries:
                    index.match_length(q); index.count(q); index.next_tokens(q, 8); index.continuation(q, 64)
                proposer = refdec.Proposer(index=index, max_depth=16)
                proposer.start(queries[3])
                proposer.propose(24)
                proposer.accept([0, 1, 2])
                proposer.propose(24)
            except (ValueError, IndexError, OverflowError, MemoryError) as exc:
                out["query_error"] = "%s: %s" % (type(exc).__name__, exc)
            except Exception as exc:
                out["outcome"] = "unexpected"
                out["message"] = "query raised %s: %s" % (type(exc).__name__, exc)
            del index
        sys.stdout.write(json.dumps(out) + "\\n")
        sys.stdout.flush()
    """
)


class WorkerDied(Exception):
    pass


class Worker:
    """A child Python that loads and queries the files it is sent, one per line."""

    def __init__(self, tmp_dir: Path) -> None:
        self.tmp_dir = tmp_dir
        self.proc = None

    def _start(self) -> None:
        here = Path(__file__).resolve().parent  # tests/drafting/index/ (its modules), tests/ (the helper modules)
        paths = [str(here.parents[2]), str(here.parents[1]), str(here), os.environ.get("PYTHONPATH", "")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
        script = self.tmp_dir / "fuzz_worker.py"
        script.write_text(_WORKER)
        self.proc = subprocess.Popen(
            [sys.executable, str(script), json.dumps(QUERIES)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )

    def check(self, path: Path, timeout: float = 30.0) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.proc.stdin.write(f"{path}\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            if ready:
                self.proc.wait(timeout=30)
            else:
                self.proc.kill()
                self.proc.wait()
            stderr = self.proc.stderr.read()[-3000:]
            code = self.proc.returncode
            self.proc = None
            raise WorkerDied(f"{'hung' if not ready else 'died with exit code %s' % code}\n{stderr}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "original.refdec"
    CorpusIndex.build(DOCS, show_progress=False).save(path)
    return path.read_bytes()


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    w = Worker(tmp_path_factory.mktemp("worker"))
    yield w
    w.close()


def _field(name):
    return HEADER_FIELDS[name]


def _section_boundaries(data: bytes) -> list[int]:
    out = {0, HEADER_SIZE, len(data)}
    for sec in range(NUM_SECTIONS):
        offset = struct.unpack_from("<Q", data, _field(f"section{sec}.offset")[0])[0]
        size = struct.unpack_from("<Q", data, _field(f"section{sec}.size")[0])[0]
        out |= {offset, offset + size}
    return sorted(b for b in out if 0 <= b <= len(data))


def _check(worker, tmp_path, data: bytes, original: bytes) -> dict:
    path = tmp_path / "mutated.refdec"
    path.write_bytes(data)
    try:
        result = worker.check(path)
    except WorkerDied as exc:
        pytest.fail(f"loading or querying a mutated file crashed the process: {exc}")
    assert result["outcome"] != "unexpected", result["message"]
    try:
        event(result["outcome"])
    except Exception:  # noqa: BLE001 - outside a hypothesis test (the exhaustive cases)
        pass
    if result["outcome"] == "loaded":
        body_changed = len(data) != len(original) or data[HEADER_SIZE:] != original[HEADER_SIZE:]
        if body_changed:
            assert not result["verify"], "verify() missed a mutation of the body"
    return result


# ---------------------------------------------------------------------------
# Truncation


def test_truncation_at_every_section_boundary_and_one_byte_either_side_raises(worker, tmp_path, original):
    for boundary in _section_boundaries(original):
        for cut in {boundary - 1, boundary, boundary + 1}:
            if 0 <= cut < len(original):
                result = _check(worker, tmp_path, original[:cut], original)
                assert result["outcome"] == "format_error", f"a file cut to {cut} bytes loaded"


@FUZZ
@given(st.data())
def test_truncation_at_a_random_point_raises(worker, tmp_path, original, data):
    cut = data.draw(st.integers(0, len(original) - 1), label="cut")
    assert _check(worker, tmp_path, original[:cut], original)["outcome"] == "format_error"


# ---------------------------------------------------------------------------
# Bit flips and word overwrites


@FUZZ
@given(st.data())
def test_random_bit_flips_are_rejected_at_load_or_caught_by_verify(worker, tmp_path, original, data):
    where = data.draw(st.sampled_from(["header", "body", "anywhere"]), label="where")
    lo, hi = {"header": (0, HEADER_SIZE), "body": (HEADER_SIZE, len(original)), "anywhere": (0, len(original))}[where]
    flips = data.draw(st.lists(st.tuples(st.integers(lo, hi - 1), st.integers(0, 7)), min_size=1, max_size=4),
                      label="flips")
    mutated = bytearray(original)
    for offset, bit in flips:
        mutated[offset] ^= 1 << bit
    sealed = data.draw(st.booleans(), label="reseal header checksum")
    mutated = reseal(bytes(mutated)) if sealed else bytes(mutated)
    if mutated == original:
        return
    result = _check(worker, tmp_path, mutated, original)
    if not sealed and mutated[:HEADER_SIZE] != original[:HEADER_SIZE]:
        assert result["outcome"] == "format_error", "a header with a wrong checksum loaded"


@FUZZ
@given(st.data())
def test_body_words_set_to_extreme_values_never_crash_and_fail_verify(worker, tmp_path, original, data):
    words = data.draw(st.lists(st.tuples(st.integers(HEADER_SIZE // 4, len(original) // 4 - 1),
                                         st.sampled_from([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0x00010001,
                                                          0x7FFFFFFE, 0xFFFFFFFE])),
                               min_size=1, max_size=6), label="words")
    mutated = bytearray(original)
    for word_idx, value in words:
        struct.pack_into("<I", mutated, 4 * word_idx, value)
    if bytes(mutated) != original:
        _check(worker, tmp_path, bytes(mutated), original)


# ---------------------------------------------------------------------------
# Header fields behind a valid header checksum (a buggy or hostile writer)

COUNT_FIELDS = ["num_tokens", "num_documents", "num_internal", "num_edges", "file_size"]


@FUZZ
@given(st.data())
def test_oversized_counts_in_the_header_raise(worker, tmp_path, original, data):
    name = data.draw(st.sampled_from(COUNT_FIELDS), label="field")
    offset, fmt = _field(name)
    value = struct.unpack_from(fmt, original, offset)[0]
    bad = data.draw(st.one_of(st.integers(value + 1, value + 4096), st.integers(2**31 - 2, 2**33),
                              st.integers(2**62, 2**64 - 1)), label="value")
    mutated = bytearray(original)
    struct.pack_into(fmt, mutated, offset, bad)
    assert _check(worker, tmp_path, reseal(bytes(mutated)), original)["outcome"] == "format_error"


@FUZZ
@given(st.data())
def test_section_offsets_outside_the_file_or_overlapping_raise(worker, tmp_path, original, data):
    sec = data.draw(st.integers(0, NUM_SECTIONS - 1), label="section")
    off_pos, fmt = _field(f"section{sec}.offset")
    size = struct.unpack_from("<Q", original, _field(f"section{sec}.size")[0])[0]
    current = struct.unpack_from(fmt, original, off_pos)[0]
    others = [struct.unpack_from("<Q", original, _field(f"section{s}.offset")[0])[0]
              for s in range(NUM_SECTIONS) if s != sec]
    kind = data.draw(st.sampled_from(["outside", "straddles_end", "overlap_neighbour", "inside_header", "huge"]),
                     label="kind")
    if kind == "outside":
        bad = len(original) + 64 * data.draw(st.integers(0, 1000))
    elif kind == "straddles_end":
        bad = (len(original) - size // 2) // 64 * 64 + 64
    elif kind == "overlap_neighbour":
        bad = data.draw(st.sampled_from(others))
    elif kind == "inside_header":
        bad = 64 * data.draw(st.integers(0, HEADER_SIZE // 64 - 1))
    else:
        bad = data.draw(st.integers(2**63, 2**64 - 1)) // 64 * 64
    if bad == current:
        return
    mutated = bytearray(original)
    struct.pack_into(fmt, mutated, off_pos, bad)
    result = _check(worker, tmp_path, reseal(bytes(mutated)), original)
    # Sections may only move without overlapping; a zero-size section may sit anywhere inside the file.
    if size > 0:
        assert result["outcome"] == "format_error", f"section {sec} moved to {bad} ({kind}) loaded"


def test_every_section_swapped_with_the_next_raises(worker, tmp_path, original):
    for sec in range(NUM_SECTIONS - 1):
        a, b = _field(f"section{sec}.offset")[0], _field(f"section{sec + 1}.offset")[0]
        mutated = bytearray(original)
        mutated[a : a + 16], mutated[b : b + 16] = original[b : b + 16], original[a : a + 16]
        result = _check(worker, tmp_path, reseal(bytes(mutated)), original)
        assert result["outcome"] == "format_error", f"sections {sec} and {sec + 1} swapped loaded"


def test_a_cycle_of_suffix_links_in_a_corrupt_body_neither_hangs_nor_crashes(worker, tmp_path, original):
    # The body is not checked on load (verify() is O(file)): a corrupt state_link
    # section may point two states at each other. Every walk up the links must end.
    link_offset = struct.unpack_from("<Q", original, _field("section4.offset")[0])[0]
    num_internal = struct.unpack_from("<Q", original, _field("num_internal")[0])[0]
    for a in range(1, min(num_internal, 8)):
        for b in (a, a % (num_internal - 1) + 1):
            mutated = bytearray(original)
            struct.pack_into("<i", mutated, link_offset + 4 * a, b)
            struct.pack_into("<i", mutated, link_offset + 4 * b, a)
            if bytes(mutated) != original:
                result = _check(worker, tmp_path, bytes(mutated), original)
                assert result["outcome"] == "loaded"
