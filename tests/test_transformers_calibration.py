"""Specifies refdec.transformers.calibration: ``measure`` times the engine's own verification step per tree size
over one cache length, without the lazy head and one head chunk apart, or with every row's target,
in a warm-up round (dropped) and interleaved rounds whose median it keeps, saying when the rounds
disagree; tiny models are not worth calibrating and get the default CPU curve without a measurement;
``calibrate`` announces a measurement on stderr once and then reads the cached curve silently, and
keeps a curve whose rounds disagree for the process only, with a warning."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

import tiny_models
from refdec.transformers import calibration
from refdec.transformers.calibration import measure
from refdec.transformers.runner import ModelRunner
from refdec.transformers.verify import verify_step
from tiny_models import SteppingTime, tiny_llama


def test_tiny_model_auto_does_not_calibrate(monkeypatch, tmp_path):
    monkeypatch.setattr(calibration, "measure", lambda *a, **k: pytest.fail("tiny models must not calibrate"))

    class Tiny:
        def parameters(self):
            return iter([_P()])

    class _P:
        def numel(self):
            return 1000

    assert calibration.auto_cost_curve(Tiny()) is calibration.DEFAULT_CPU_CURVE


@pytest.fixture
def steps(monkeypatch):
    """Records each step refdec.transformers.calibration.measure times (lazy head?, cache length, slots, nodes, root
    position); the engine's verify_step runs it, its lazy head's time set to 0.25 s."""
    seen = []

    def step(runner, batch, trees, roots, root_pos, rules):
        seen.append((runner.uses_lazy_head, batch.cache.get_seq_length(), batch.slots, len(trees[0]),
                     int(root_pos[0]), rules))
        verified = verify_step(runner, batch, trees, roots, root_pos, rules)
        verified.lazy_head_seconds = 0.25 if runner.uses_lazy_head else 0.0
        return verified

    monkeypatch.setattr(calibration, "verify_step", step)
    monkeypatch.setattr(calibration, "time", SteppingTime())
    return seen


def test_measure_times_the_engines_step_over_the_same_cache_and_the_lazy_head_apart(steps):
    """Every step is the engine's greedy verify_step over a one-row batch of cache_len slots (the
    step's rows cut after it); each second of the fake clock, less the lazy head's 0.25 s, is the
    step's time at its size, and the head's time at the largest size is the head chunk's."""
    curve = measure(tiny_models.tiny_llama(), nodes=(4, 0), cache_len=16, repeats=2, warmup=1)
    assert steps == [(True, 16, 16, n, 16, [None]) for n in (0, 4, 4, 0, 0, 4)]  # sizes interleaved, warmup first
    assert curve.nodes == (0, 4) and curve.seconds == (0.75, 0.75)
    assert curve.lazy_head and curve.head_chunk_rows == 4 and curve.head_chunk_seconds == 0.25
    assert curve.meta["samples"] == {"0": [0.75, 0.75], "4": [0.75, 0.75]} and curve.meta["head_samples"] == [0.25] * 2


def test_measure_without_the_lazy_head_computes_every_rows_target_in_the_step(steps, monkeypatch):
    model = tiny_models.tiny_llama()
    chunks = []
    row_targets = ModelRunner.row_targets
    monkeypatch.setattr(ModelRunner, "row_targets",
                        lambda self, cache, choose=None, **inputs: chunks.append(inputs["input_ids"].shape[1]) or
                        row_targets(self, cache, choose, **inputs))
    full = measure(model, nodes=(0, 4), cache_len=16, repeats=1, warmup=0, lazy_head=False)
    assert not full.lazy_head and full.seconds == (1.0, 1.0)
    assert steps == [(False, 16, 16, n, 16, [None]) for n in (0, 4)] and chunks == [1, 5]


def test_measure_refuses_the_lazy_head_for_a_model_without_a_plain_one_and_bad_arguments():
    model = tiny_models.tiny_llama()
    model.lm_head.register_forward_hook(lambda module, inputs, output: output)
    with pytest.raises(ValueError, match="lazy_head"):
        measure(model, nodes=(0,), cache_len=16, repeats=1, warmup=0, lazy_head=True)
    with pytest.raises(ValueError, match="cache_len must be an int >= 1, got 0"):
        measure(model, cache_len=0)
    with pytest.raises(ValueError, match="repeats must be an int >= 1, got 0"):
        measure(model, repeats=0)


def test_calibrate_measures_once_per_model_key_and_reads_the_cache_after(monkeypatch, tmp_path, llama):
    """The curve is saved as JSON under cache_dir()/calibration/, keyed by the model's config, dtype,
    device and thread count; later calls read it, force=True measures again, and an unreadable
    file is measured over."""
    from refdec.sizing.cost_curve import CostCurve

    measured = []

    def fake_measure(model, **kwargs):
        measured.append(kwargs)
        return CostCurve((0, 8), (1.0, 1.0 + len(measured)), head_chunk_seconds=0.5)

    monkeypatch.setattr(calibration, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(calibration, "measure", fake_measure)
    path = calibration.calibration_path(llama)
    threads = torch.get_num_threads()  # the key's thread count: the session's, whatever ran before
    assert path.parent == tmp_path / "calibration" and path.name.startswith(f"llama-float64-cpu-t{threads}-")
    first = calibration.calibrate(llama, repeats=2)
    assert path.is_file() and measured == [{"repeats": 2}]
    assert calibration.calibrate(llama) == first and len(measured) == 1  # read back, not measured
    assert calibration.load_cached(llama) == first
    again = calibration.calibrate(llama, force=True)
    assert len(measured) == 2 and again != first and calibration.load_cached(llama) == again
    path.write_text("{not json")
    assert calibration.load_cached(llama) is None
    assert calibration.calibrate(llama) != again and len(measured) == 3
    torch.set_num_threads(2)
    try:  # another thread count: another key
        assert calibration.calibration_path(llama) != path
    finally:
        torch.set_num_threads(1)


def test_measuring_the_curve_is_announced_on_stderr_once(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("REFDEC_CACHE", str(tmp_path))
    model = tiny_llama()
    kwargs = dict(nodes=(0, 1, 4), cache_len=16, repeats=1, warmup=0)
    curve = calibration.calibrate(model, **kwargs)
    err = capsys.readouterr().err
    assert "measuring this model's verification cost against draft size" in err
    assert f"{torch.get_num_threads()} threads" in err and str(calibration.calibration_path(model)) in err
    assert calibration.calibrate(model, **kwargs) == curve  # read from the cache, silently
    assert capsys.readouterr().err == ""


class ScriptedSteps:
    """Stands in for ``time`` and ``verify_step`` in refdec.transformers.calibration: each step takes
    the next of ``durations`` seconds (no forward runs, no lazy head)."""

    def __init__(self, durations) -> None:
        self.durations = list(durations)
        self.now = 0.0
        self.sizes = []

    def perf_counter(self) -> float:
        return self.now

    strftime = staticmethod(time.strftime)

    def verify_step(self, runner, batch, trees, roots, root_pos, rules):
        self.sizes.append(len(trees[0]))
        self.now += self.durations.pop(0)
        return SimpleNamespace(lazy_head_seconds=0.0)


# rounds over 0, 4, 16 nodes: the warm-up ascending, then descending, ascending, descending
WARM_UP = [9.0, 9.0, 9.0]  # the first forwards of each size: dropped


def test_measure_drops_the_warm_up_round_and_takes_each_sizes_median_over_interleaved_rounds(monkeypatch):
    steps = ScriptedSteps(WARM_UP + [3.0, 2.0, 1.0] + [1.1, 2.2, 3.3] + [3.1, 1.9, 0.9])
    monkeypatch.setattr(calibration, "time", steps)
    monkeypatch.setattr(calibration, "verify_step", steps.verify_step)
    curve = measure(tiny_llama(), nodes=(16, 0, 4), cache_len=8, repeats=3, warmup=1, lazy_head=False)
    assert steps.sizes == [0, 4, 16, 16, 4, 0, 0, 4, 16, 16, 4, 0]
    assert curve.nodes == (0, 4, 16) and curve.seconds == pytest.approx((1.0, 2.0, 3.1))
    assert curve.meta["samples"]["0"] == pytest.approx([1.0, 1.1, 0.9]) and curve.meta["warmup"] == 1
    assert curve.meta["disagreement"] is None  # each size's rounds within 25% of its median


def test_measure_says_why_when_the_rounds_of_too_many_sizes_disagree(monkeypatch):
    """Another process compiled during the second round: 0 and 4 nodes took twice as long there."""
    steps = ScriptedSteps(WARM_UP + [3.0, 2.0, 1.0] + [2.0, 4.0, 3.1] + [3.1, 2.0, 1.0])
    monkeypatch.setattr(calibration, "time", steps)
    monkeypatch.setattr(calibration, "verify_step", steps.verify_step)
    curve = measure(tiny_llama(), nodes=(0, 4, 16), cache_len=8, repeats=3, warmup=1, lazy_head=False)
    assert curve.seconds == pytest.approx((1.0, 2.0, 3.1))  # the medians are the quiet rounds'
    assert curve.meta["disagreement"].startswith("the repeats of 2 of 3 sizes differ by more than 25%")
    assert "0 nodes 1000.0 / 2000.0 / 1000.0 ms" in curve.meta["disagreement"]


def test_a_curve_whose_rounds_disagree_is_used_but_not_cached_and_said_so_once(monkeypatch, tmp_path, llama, capsys):
    from refdec.sizing.cost_curve import CostCurve

    measured = []

    def fake_measure(model, **kwargs):
        measured.append(kwargs)
        busy = len(measured) == 1
        return CostCurve((0, 8), (0.2, 0.3), {"disagreement": "the repeats of 5 of 10 sizes differ" if busy else None})

    monkeypatch.setattr(calibration, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(calibration, "measure", fake_measure)
    monkeypatch.setattr(calibration, "_UNCACHED", {})
    busy = calibration.calibrate(llama)
    err = capsys.readouterr().err
    assert "not cached: the repeats of 5 of 10 sizes differ" in err and "refdec calibrate --force" in err
    assert not calibration.calibration_path(llama).exists() and calibration.load_cached(llama) is None
    assert calibration.calibrate(llama) is busy and len(measured) == 1  # kept for the process: not measured again
    assert capsys.readouterr().err == ""
    quiet = calibration.calibrate(llama, force=True)  # measured again: its rounds agree, so it is cached
    assert len(measured) == 2 and calibration.load_cached(llama) == quiet
    assert "not cached" not in capsys.readouterr().err
