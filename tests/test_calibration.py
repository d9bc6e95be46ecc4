"""Specifies refdec.calibration: ``measure`` times the backbone per tree size and one head chunk
(lazy head) or the whole forward; tiny models are not worth calibrating and get the default CPU
curve without a measurement."""

from __future__ import annotations

import pytest

import tiny_models
from refdec.calibration import measure


def test_tiny_model_auto_does_not_calibrate(monkeypatch, tmp_path):
    from refdec import calibration

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


