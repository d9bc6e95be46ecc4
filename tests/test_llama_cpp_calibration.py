"""Specifies refdec.llama_cpp.calibration, the llama.cpp backend's cost curve: ``measure`` times a
decode of ``1 + n`` entries per tree size (up to the backend's largest tree) and one more logits
row, a warm-up round first and then interleaved rounds whose medians it keeps, saying when they
disagree, leaving the context's cells as it found them; ``auto_cost_curve`` measures once per model
file and context settings, says so on stderr, caches the curve as JSON under
``$REFDEC_CACHE/calibration/`` and reads it afterwards (measuring over a damaged file), and keeps a
curve whose rounds disagree for the process only, with a warning. Tiny random GGUF model
(benchmarks/random_gguf.py); marked llama.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from refdec.llama_cpp import calibration  # noqa: E402
from refdec.llama_cpp.backend import LlamaCppBackend  # noqa: E402
from refdec.sizing.cost_curve import CostCurve  # noqa: E402

pytestmark = pytest.mark.llama


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("REFDEC_CACHE", str(tmp_path))


def test_measure_times_each_tree_size_up_to_the_largest_tree_and_one_logits_row(tiny_llm):
    backend = LlamaCppBackend(tiny_llm, max_tree=8)
    free_before = list(backend._free_seqs)
    curve = calibration.measure(backend, nodes=(0, 1, 4, 8, 16), cache_len=32, repeats=1)
    assert curve.nodes == (0, 1, 4, 8)  # 16 nodes do not fit the backend's trees
    assert all(s > 0 for s in curve.seconds) and curve.lazy_head and curve.head_chunk_rows == 1
    assert curve.head_chunk_seconds >= 0
    assert curve.meta["engine"] == "llama.cpp" and curve.meta["cache_len"] == 32
    assert curve.meta["model"] == str(tiny_llm.model_path) and len(curve.meta["all_logits_seconds"]) == 4
    # the sequence it measured on is given back, empty
    assert backend._free_seqs == free_before
    assert all(backend.ctx.seq_pos_range(s) == (-1, -1) for s in range(backend.ctx.n_seq_max))


def test_auto_cost_curve_measures_once_says_so_and_reads_the_cache_after(tiny_llm, monkeypatch, capsys):
    backend = LlamaCppBackend(tiny_llm, max_tree=8)
    measured = []

    def measure(backend_):
        measured.append(backend_)
        return CostCurve((0, 8), (0.002, 0.003), head_chunk_seconds=0.0005, head_chunk_rows=1)

    monkeypatch.setattr(calibration, "measure", measure)
    path = calibration.calibration_path(backend)
    curve = calibration.auto_cost_curve(backend)
    err = capsys.readouterr().err
    assert measured == [backend] and f"cached at {path}" in err and "one logits row 0.50 ms" in err
    assert CostCurve.from_json(json.loads(path.read_text())) == curve
    assert calibration.auto_cost_curve(backend) == curve and len(measured) == 1  # read, not measured
    assert capsys.readouterr().err == ""
    path.write_text("{not json")  # a damaged file is measured over
    assert calibration.auto_cost_curve(backend, announce=False) == curve and len(measured) == 2
    assert capsys.readouterr().err == ""


def test_the_cache_is_per_model_file_and_context_settings(tiny_llm, tiny_gguf):
    path = calibration.calibration_path(LlamaCppBackend(tiny_llm, max_tree=8))
    assert path.parent.name == "calibration" and path.name.startswith("llama-") and path.suffix == ".json"
    assert calibration.calibration_path(LlamaCppBackend(tiny_llm, max_tree=8)) == path
    assert calibration.calibration_path(LlamaCppBackend(tiny_llm, max_tree=16)) != path
    two_threads = llama_cpp.Llama(str(tiny_gguf), n_ctx=512, n_threads=2, n_batch=64, verbose=False)
    assert calibration.calibration_path(LlamaCppBackend(two_threads, max_tree=8)) != path


class ScriptedDecodes:
    """Stands in for ``time`` in refdec.llama_cpp.calibration and wraps the context's decode: each
    decode of the measured rows takes ``seconds(rows, logits rows, call)`` on this clock."""

    def __init__(self, ctx, seconds) -> None:
        self.ctx_decode, self.seconds = ctx.decode, seconds
        self.now = 0.0
        self.calls = []  # (entries, logits rows) of each timed decode

    def perf_counter(self) -> float:
        return self.now

    strftime = staticmethod(time.strftime)

    def decode(self, tokens, positions, seq_ids, want_logits, invariant=False):
        self.ctx_decode(tokens, positions, seq_ids, want_logits, invariant=invariant)
        if int(positions[0]) >= 32:  # past the context's prefill: a measured decode
            self.calls.append((len(tokens), int(np.count_nonzero(want_logits))))
            self.now += self.seconds(len(tokens), int(np.count_nonzero(want_logits)), len(self.calls))


def test_measure_warms_up_then_takes_each_sizes_median_over_interleaved_rounds(tiny_llm, monkeypatch):
    """A warm-up round of one decode per size (every logits row; its times dropped, here 10 s each),
    then 3 rounds, alternately descending and ascending, each size with one logits row then with
    all: 2 ms a decode entry, 1 ms a logits row past the first, and in the second round twice that
    (load): the medians are the quiet rounds', and with 2 sizes of 3 disturbed the rounds disagree."""
    backend = LlamaCppBackend(tiny_llm, max_tree=8)
    warm = 3  # the warm-up round's decodes

    def seconds(entries, logits, call):
        busy = 2.0 if warm + 6 < call <= warm + 12 and entries > 1 else 1.0
        return 10.0 if call <= warm else busy * (0.002 * entries + 0.001 * (logits - 1))

    script = ScriptedDecodes(backend.ctx, seconds)
    monkeypatch.setattr(calibration, "time", script)
    monkeypatch.setattr(backend.ctx, "decode", script.decode)
    curve = calibration.measure(backend, nodes=(4, 0, 8), cache_len=32, repeats=3)
    assert script.calls == ([(1, 1), (5, 5), (9, 9)]
                            + [(9, 1), (9, 9), (5, 1), (5, 5), (1, 1), (1, 1)]
                            + [(1, 1), (1, 1), (5, 1), (5, 5), (9, 1), (9, 9)]
                            + [(9, 1), (9, 9), (5, 1), (5, 5), (1, 1), (1, 1)])
    assert curve.nodes == (0, 4, 8) and curve.seconds == pytest.approx((0.002, 0.010, 0.018))
    assert curve.head_chunk_seconds == pytest.approx(0.001) and curve.meta["warmup"] == 1
    assert curve.meta["samples"]["8"] == pytest.approx([0.018, 0.036, 0.018])
    assert curve.meta["disagreement"].startswith("the repeats of 2 of 3 sizes differ by more than 25%")


def test_a_curve_whose_rounds_disagree_is_used_but_not_cached_and_said_so_once(tiny_llm, monkeypatch, capsys):
    backend = LlamaCppBackend(tiny_llm, max_tree=8)
    measured = []

    def measure(backend_):
        measured.append(backend_)
        return CostCurve((0, 8), (0.002, 0.003), {"disagreement": "the repeats of 4 of 10 sizes differ"},
                         head_chunk_seconds=0.0005, head_chunk_rows=1)

    monkeypatch.setattr(calibration, "measure", measure)
    monkeypatch.setattr(calibration, "_UNCACHED", {})
    curve = calibration.auto_cost_curve(backend)
    err = capsys.readouterr().err
    assert "not cached: the repeats of 4 of 10 sizes differ" in err and "refdec calibrate --force" in err
    assert not calibration.calibration_path(backend).exists()
    assert calibration.auto_cost_curve(backend) is curve and len(measured) == 1  # this process keeps it
    assert capsys.readouterr().err == ""
