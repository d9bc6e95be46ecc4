"""benchmarks/gpu.py, the prepared run for a lent GPU: on a CPU with --quick it runs every section
end to end with tiny shapes (the CUDA-only parts, the sync debug mode and CUDA events, report
"n/a" / nothing), writes one JSON holding each section, and honours --sections and the budget;
the sync counter's split into prefill, steps and the model's own syncs."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import pytest
import torch

from benchmarks import gpu, tiny_model


@pytest.mark.full  # every section of the benchmark, measured
def test_a_cpu_quick_run_writes_every_section(tmp_path, capsys):
    path = tmp_path / "gpu.json"
    assert gpu.main(["--device", "cpu", "--quick", "--threads", "1", "--json", str(path)]) == 0
    got = json.loads(path.read_text())
    sections = got["sections"]
    assert list(sections) == list(gpu.SECTIONS)
    assert not any("error" in result for result in sections.values()), sections
    assert got["argv"][:3] == ["--device", "cpu", "--quick"] and got["not_started"] == []

    eq = sections["equivalence"]
    assert {run["family"] for run in eq["runs"]} == {"llama", "qwen2", "gemma3"}
    assert eq["all_identical"] and all(run["identical"] for run in eq["runs"])
    assert any(run["tokens_per_pass"] > 1.5 for run in eq["runs"])  # drafts were accepted

    syncs = sections["syncs"]
    assert syncs["cuda_sync_debug"] is False and len(syncs["runs"]) == len(gpu.SYNC_RUNS)
    assert all(run["forwards"] == run["steps"] + 1 for run in syncs["runs"] if run["batch"] == 1)

    forward = sections["forward"]["models"]
    assert forward["llama3-8b"] == {"skipped": "not on a cpu run"}
    gemma = forward["gemma3-270m"]
    assert gemma["layers"] == 2 and list(gemma["nodes"]) == ["0", "1", "4", "16"]
    assert all(v["median_ms"] > 0 and v["event_median_ms"] is None for v in gemma["nodes"].values())
    assert gemma["hf_generate_ms_per_token"] > 0

    loop = sections["loop"]["rows"]
    assert [row["max_draft_tokens"] for row in loop] == [0, 4, 16]
    assert loop[-1]["tokens_per_step"] > 3 and all(row["loop_ms"] > 0 for row in loop)

    replay = sections["replay"]["models"]["gemma3-270m"]
    assert replay[0]["method"] == "one forward per token" and replay[0]["x_one_forward_per_token"] == 1
    ks = {(row["workload"], row["method"], row["k"]) for row in replay}
    assert ("edits", "refdec", 16) in ks and ("edits", "refdec", 32) not in ks  # no extrapolation past 16 nodes
    assert all(row["tokens_per_s"] > 0 for row in replay)
    out = capsys.readouterr().out
    assert all(f"== {name}" in out for name in gpu.SECTIONS) and "wrote" in out


def test_sections_and_the_budget_are_honoured(tmp_path, capsys):
    path = tmp_path / "gpu.json"
    assert gpu.main(["--device", "cpu", "--quick", "--threads", "1", "--sections", "loop,replay",
                     "--budget-s", "0", "--json", str(path)]) == 0
    got = json.loads(path.read_text())
    assert got["sections"] == {"loop": {"skipped": "budget"}, "replay": {"skipped": "no forward times"}}
    assert len(got["not_started"]) == 1 and "loop: not started" in got["not_started"][0]
    assert "not started" in capsys.readouterr().out


def test_unknown_sections_and_a_missing_device_are_refused(capsys):
    with pytest.raises(SystemExit):
        gpu.main(["--sections", "forward,nope"])
    if not torch.cuda.is_available():
        assert gpu.main(["--device", "cuda", "--threads", "1"]) == 2
        assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.full  # measured decodes of the benchmark's tiny model
def test_sync_counts_split_prefill_steps_and_the_models_own():
    model = tiny_model.tiny_llama(dtype=torch.float32)
    ids = torch.tensor([[1, 5, 6, 7]])
    inside = model.model.layers[0].register_forward_hook(
        lambda *args: warnings.warn("called a synchronizing CUDA operation"))

    def run():
        warnings.warn("called a synchronizing CUDA operation")  # before any forward: in no window
        for step in range(3):
            model(input_ids=ids)  # one sync inside the model's forward
            for _ in range(step + 1):
                warnings.warn("called a synchronizing CUDA operation")
            warnings.warn("something else")
        return SimpleNamespace(stats=None)

    try:
        counted = gpu.count_syncs(model, torch.device("cpu"), run)
    finally:
        inside.remove()
    assert counted["forwards"] == 3 and counted["prefill_window"] == 1
    assert counted["per_step"] == [2, 3] and counted["max_per_step"] == 3
    assert counted["model_own"] == 3 and counted["total"] == 10
    assert counted["sites"] == [("elsewhere", 7)]  # called from neither refdec nor transformers


def test_the_shapes_are_gemma_3_270m_and_llama_3_8b():
    gemma = gpu.real_config("gemma3-270m")
    assert gemma.layer_types.count("full_attention") == 3 and gemma.layer_types[5] == "full_attention"
    assert gpu.gemma_layer_types(2) == ["sliding_attention", "full_attention"]
    llama = gpu.real_config("llama3-8b")
    assert (llama.hidden_size, llama.num_hidden_layers, llama.num_key_value_heads, llama.vocab_size) == \
        (4096, 32, 8, 128256)
    check = gpu.check_gemma_config()
    assert not check["found"] or check["differences"] == {}
