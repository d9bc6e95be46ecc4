"""benchmarks.e2e and its parts: which run the flags pick, the one-prompt run's ratios, identity
column and sampling plumbing, the batched run's methods and prompts, on hand-made records and a
tiny model (no data, no real model)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tiny_models import repetitive_prompts, tiny_llama

from benchmarks import batching, e2e, methods, per_prompt, workloads


def _rec(method, case, seconds, new_tokens, identical, prefill=None):
    rec = {"method": method, "workload": "w", "case": case, "seconds": seconds, "new_tokens": new_tokens,
           "identical": identical}
    if prefill is not None:
        rec["split"] = {"prefill": prefill}
    return rec


def test_greedy_ratios_are_time_ratios_and_a_mismatch_shows():
    records = [_rec("hf-greedy", "a", 10.0, 100, True), _rec("refdec-auto", "a", 2.0, 100, True, prefill=1.0),
               _rec("hf-greedy", "b", 12.0, 100, True), _rec("refdec-auto", "b", 4.0, 100, False, prefill=2.0)]
    summary = per_prompt.summarize(records, ["hf-greedy", "refdec-auto"], ["w"])
    auto = summary["w/refdec-auto"]
    assert auto["ratio_median"] == pytest.approx((5.0 + 3.0) / 2)
    assert (auto["ratio_min"], auto["ratio_max"]) == pytest.approx((3.0, 5.0))
    # decode-only: (10 - 1) / (2 - 1) and (12 - 2) / (4 - 2)
    assert auto["decode_ratio_median"] == pytest.approx((9.0 + 5.0) / 2)
    assert auto["identical"] is False
    table = per_prompt.markdown(summary, ["hf-greedy", "refdec-auto"], ["w"])
    assert "**NO**" in table and "speed-up vs hf-greedy" in table


def test_sampling_ratios_are_in_tokens_per_second_and_hf_sample_is_not_compared():
    # HF's sampler stops at another length (its own tokens): compare tokens/s, never identity
    records = [_rec("hf-sample", "a", 10.0, 50, None), _rec("refdec-0", "a", 8.0, 100, True),
               _rec("refdec-auto", "a", 4.0, 100, True)]
    methods = ["hf-sample", "refdec-0", "refdec-auto"]
    summary = per_prompt.summarize(records, methods, ["w"], baseline="hf-sample")
    assert summary["w/refdec-0"]["ratio_median"] == pytest.approx((100 / 8) / (50 / 10))
    assert summary["w/refdec-auto"]["ratio_median"] == pytest.approx((100 / 4) / (50 / 10))
    assert summary["w/hf-sample"]["identical"] is None
    assert summary["w/refdec-auto"]["identical"] is True
    table = per_prompt.markdown(summary, methods, ["w"], baseline="hf-sample")
    assert "n/a" in table and "**NO**" not in table and "speed-up vs hf-sample" in table


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return tiny_llama(seed=2, scale=8.0).to(torch.float64)  # peaked: samples repeat the prompt


def _case():
    prompt = np.asarray(repetitive_prompts(1, seed=3)[0], dtype=np.int32)
    return workloads.Case(prompt=prompt, output=np.zeros(0, dtype=np.int32), references=[], name="tiny")


@pytest.mark.full  # several sampled decodes, refdec's and transformers'
def test_sampling_runner_gives_refdec_0_tokens_with_drafts_and_hf_samples_at_the_temperature(tiny):
    sampling = dict(temperature=0.7, top_k=None, top_p=0.9, seed=5)
    runner = methods.Runner(tiny, SimpleNamespace(pad_token_id=0), max_new_tokens=24, sampling=sampling)
    case = _case()
    plain = runner.run("refdec-0", "w", case, None, editing=False)
    drafted = runner.run("refdec-8", "w", case, None, editing=False)
    assert plain["passes"] == 24 and drafted["passes"] < 24  # the drafts were verified, several per pass
    assert drafted["tokens"] == plain["tokens"]
    greedy = methods.Runner(tiny, SimpleNamespace(pad_token_id=0), max_new_tokens=24).run(
        "refdec-0", "w", case, None, editing=False)
    assert greedy["tokens"] != plain["tokens"]  # it did sample
    hf = runner.run("hf-sample", "w", case, None, editing=False)
    assert len(hf["tokens"]) == 24
    assert runner.run("hf-sample", "w", case, None, editing=False)["tokens"] == hf["tokens"]  # seeded


# ---------------------------------------------------------------- the driver's runs

@pytest.mark.parametrize("argv, refused", [
    (["--batch", "2", "--backend", "llama.cpp"], "--batch is not for a llama.cpp run"),
    (["--continuous", "4"], "--continuous is not for a one-prompt run"),
    (["--long-run", "3", "--batch", "2"], "--batch is not for a long-run run"),
    (["--batch", "2", "--sample"], "--sample is not for a batch run"),
    (["--backend", "llama.cpp", "--methods", "refdec-auto"], "--methods is not for a llama.cpp run"),
    (["--batch", "2", "--methods", "refdec-chain"], "batched runs take"),
    (["--backend", "llama.cpp", "--workloads", "edits"], "unknown ['edits']"),
    (["--sample", "--methods", "hf-greedy,refdec-auto"], "decode greedily"),
])
def test_a_flag_of_another_run_is_refused_before_anything_loads(argv, refused, capsys):
    with pytest.raises(SystemExit) as exit_info:
        e2e.main(argv)
    assert exit_info.value.code == 2
    assert refused in capsys.readouterr().err


def test_each_run_fills_its_own_defaults():
    ap, owners = e2e.parser()
    args = ap.parse_args(["--batch", "1", "4"])
    assert e2e.resolve(ap, owners, args) == ("batch", [("refdec-8", 8, True)])
    assert (args.workloads, args.max_new_tokens) == ("edits,mtbench", 64)
    args = ap.parse_args(["--backend", "llama.cpp", "--quick"])
    assert e2e.resolve(ap, owners, args) == ("llama.cpp", None)
    assert (args.limit, args.max_new_tokens) == (2, 64)
    args = ap.parse_args(["--sample"])
    run, plan = e2e.resolve(ap, owners, args)
    assert run == "one-prompt" and plan.methods == list(per_prompt.SAMPLE_METHODS)
    assert (plan.baseline, plan.identity_ref, args.max_new_tokens) == ("hf-sample", "refdec-0", 128)


def test_method_names_give_their_draft_budgets_and_batched_pricing():
    assert [methods.draft_budget(m) for m in ("refdec-auto", "refdec-chain", "refdec-0", "refdec-64", "peer-pld")] \
        == ["auto", "auto", 0, 64, 10]
    with pytest.raises(ValueError):
        methods.draft_budget("refdec-auto-nostreak")
    assert batching.batch_methods(["hf-greedy", "refdec-auto", "refdec-auto-rowwise", "refdec-8"]) == [
        ("refdec-auto", "auto", True), ("refdec-auto-rowwise", "auto", False), ("refdec-8", 8, True)]


def test_first_difference_is_none_for_identical_outputs_else_the_first_differing_position():
    assert methods.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert methods.first_difference([1, 5, 3], [1, 2, 3]) == 1
    assert methods.first_difference([1, 2], [1, 2, 3]) == 2


def test_batched_prompts_take_the_workloads_in_turn_skipping_long_ones():
    def wl(name, lengths):
        cases = [workloads.Case(prompt=np.zeros(n, dtype=np.int32), output=np.zeros(0, dtype=np.int32),
                                references=[np.ones(2, dtype=np.int32)] if name == "edits" else [],
                                name=f"{name}/{i}") for i, n in enumerate(lengths)]
        return workloads.Workload(name, cases)

    rows = batching.mixed_rows([wl("edits", [5, 900, 6]), wl("mtbench", [3, 4, 7])], 5, max_prompt_tokens=700)
    assert [r["name"] for r in rows] == ["edits/0", "mtbench/0", "edits/2", "mtbench/1", "mtbench/2"]
    assert rows[0]["references"] == [[1, 1]] and rows[1]["references"] is None
