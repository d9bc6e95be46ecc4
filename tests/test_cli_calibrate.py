"""Specifies refdec.cli.calibrate, ``refdec calibrate``: it measures the model's cost curve (the
one "auto" drafting needs) ahead of time, or reads the cached one, says which on stderr with the
file's path, and prints the curve, milliseconds per verification forward at each draft size
(the lazy head's cost in the heading); ``--force`` measures again; a curve whose rounds disagree
is printed but not saved, and it says so; without ``--model`` it is the default model's curve."""

from __future__ import annotations

import pytest

from refdec import models
from refdec.cli import main
from refdec.sizing.cost_curve import CostCurve
from refdec.transformers import calibration
from tiny_models import SteppingTime, char_tokenizer, tiny_llama


def test_refdec_calibrate_measures_then_reads_the_cached_curve(monkeypatch, tmp_path, capsys, tiny_model_dir):
    monkeypatch.setenv("REFDEC_CACHE", str(tmp_path))
    # each step takes half a second of a stand-in clock: the rounds agree whatever the machine's load
    monkeypatch.setattr(calibration, "time", SteppingTime(0.5))
    assert main(["calibrate", "--model", str(tiny_model_dir()), "--threads", "1"]) == 0
    first = capsys.readouterr()
    assert "[refdec calibrate] measured" in first.err and "measuring this model's" in first.err
    assert "ms per verification forward" in first.out and first.out.count("\n") >= 5
    assert list(tmp_path.glob("calibration/*-t1-*.json"))
    assert main(["calibrate", "--model", str(tiny_model_dir()), "--threads", "1"]) == 0
    second = capsys.readouterr()
    assert "[refdec calibrate] cached" in second.err and "measuring" not in second.err
    assert second.out == first.out


@pytest.fixture
def fake_measure(monkeypatch, tmp_path):
    """``calibration.measure`` replaced by a known curve (the calls counted); a fresh cache."""
    monkeypatch.setenv("REFDEC_CACHE", str(tmp_path))
    calls = []

    def measure(model, **kwargs):
        calls.append(model)
        return CostCurve((0, 8, 32), (0.010, 0.0125, 0.0205), head_chunk_seconds=0.0031, head_chunk_rows=4)

    monkeypatch.setattr(calibration, "measure", measure)
    return calls


def test_the_printed_curve_is_milliseconds_per_draft_size_with_the_heads_cost(fake_measure, capsys, tiny_model_dir):
    assert main(["calibrate", "--model", str(tiny_model_dir()), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == ["draft nodes: ms per verification forward; LM head 3.1 ms per 4 visited rows",
                                "    0:     10.0",
                                "    8:     12.5",
                                "   32:     20.5"]
    assert len(fake_measure) == 1


def test_force_measures_again_although_a_curve_is_cached(fake_measure, capsys, tiny_model_dir):
    model_dir = str(tiny_model_dir())
    assert main(["calibrate", "--model", model_dir, "--threads", "1"]) == 0
    assert main(["calibrate", "--model", model_dir, "--threads", "1"]) == 0
    assert len(fake_measure) == 1 and "[refdec calibrate] cached" in capsys.readouterr().err
    assert main(["calibrate", "--model", model_dir, "--threads", "1", "--force"]) == 0
    assert len(fake_measure) == 2 and "[refdec calibrate] measured" in capsys.readouterr().err


def test_without_model_it_calibrates_the_default_model(fake_measure, monkeypatch, capsys):
    model = tiny_llama()
    monkeypatch.setattr(models, "load_default", lambda: (model, char_tokenizer()))
    assert main(["calibrate", "--threads", "1"]) == 0
    assert fake_measure == [model]
    assert str(calibration.calibration_path(model)) in capsys.readouterr().err


def test_a_curve_whose_rounds_disagree_is_printed_but_not_saved(monkeypatch, tmp_path, capsys, tiny_model_dir):
    monkeypatch.setenv("REFDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(calibration, "measure", lambda model, **kwargs: CostCurve(
        (0, 8), (0.010, 0.0125), {"disagreement": "the repeats of 3 of 10 sizes differ by more than 25%"}))
    assert main(["calibrate", "--model", str(tiny_model_dir()), "--threads", "1", "--force"]) == 0
    captured = capsys.readouterr()
    assert "[refdec calibrate] measured, not saved (busy machine)" in captured.err and "not cached" in captured.err
    assert captured.out.splitlines()[1:] == ["    0:     10.0", "    8:     12.5"]
    assert not list(tmp_path.glob("calibration/*.json"))
