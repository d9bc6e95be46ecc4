"""Specifies refdec.calibration: ``measure`` times the backbone per tree size and one head chunk
(lazy head) or the whole forward; tiny models are not worth calibrating and get the default CPU
curve without a measurement; ``calibrate`` announces a measurement on stderr once and then reads
the cached curve silently."""

from __future__ import annotations

import pytest
import torch

import tiny_models
from refdec import calibration
from refdec.calibration import measure
from tiny_models import tiny_llama


def test_tiny_model_auto_does_not_calibrate(monkeypatch, tmp_path):
    monkeypatch.setattr(calibration, "measure", lambda *a, **k: pytest.fail("tiny models must not calibrate"))

    class Tiny:
        def parameters(self):
            return iter([_P()])

    class _P:
        def numel(self):
            return 1000

    assert calibration.auto_cost_curve(Tiny()) is calibration.DEFAULT_CPU_CURVE


def test_measure_times_the_backbone_and_one_head_chunk():
    model = tiny_models.tiny_llama()
    curve = measure(model, nodes=(0, 4), cache_len=16, repeats=1, warmup=0)
    assert curve.lazy_head and curve.head_chunk_rows == 4 and curve.head_chunk_seconds > 0
    assert curve.nodes == (0, 4)
    full = measure(model, nodes=(0, 4), cache_len=16, repeats=1, warmup=0, lazy_head=False)
    assert not full.lazy_head
    model.lm_head.register_forward_hook(lambda module, inputs, output: output)
    with pytest.raises(ValueError, match="lazy_head"):
        measure(model, nodes=(0,), cache_len=16, repeats=1, warmup=0, lazy_head=True)


def test_calibrate_measures_once_per_model_key_and_reads_the_cache_after(monkeypatch, tmp_path, llama):
    """The curve is saved as JSON under cache_dir()/calibration/, keyed by the model's config, dtype,
    device and thread count; later calls read it, force=True measures again, and an unreadable
    file is measured over."""
    from refdec.cost_curve import CostCurve

    measured = []

    def fake_measure(model, **kwargs):
        measured.append(kwargs)
        return CostCurve((0, 8), (1.0, 1.0 + len(measured)), head_chunk_seconds=0.5)

    monkeypatch.setattr(calibration, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(calibration, "measure", fake_measure)
    path = calibration.calibration_path(llama)
    assert path.parent == tmp_path / "calibration" and path.name.startswith("llama-float64-cpu-t1-")
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
