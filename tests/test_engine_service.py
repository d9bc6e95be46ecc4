"""Specifies refdec.engine.service.DecodingService: requests submitted from many threads join one
running batch and each gets what ``generate`` gives its prompt alone (float64 tiny Llama); a
cancelled request leaves at the next step; a full queue refuses; a failed step fails only the
rows it held, and the service decodes on; closing fails what is left."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import refdec
from refdec.engine.service import DecodingService, ServiceBusy, ServiceClosed
from tiny_models import hf_greedy, repetitive_prompts

NEW = 24


@pytest.fixture
def decoder(llama):
    return refdec.SpeculativeDecoder(llama)


def test_requests_from_many_threads_each_get_their_solo_output(decoder):
    prompts = repetitive_prompts(6, seed=5)
    sampled = {1: 11, 4: 44}  # row -> seed
    expected = []
    for b, prompt in enumerate(prompts):
        settings = dict(do_sample=True, temperature=0.9, seed=sampled[b]) if b in sampled else {}
        out = decoder.generate(prompt, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=8, **settings)
        expected.append(out.sequences[0, len(prompt):].tolist())
    with DecodingService(decoder, max_concurrent=3) as service:
        def ask(b):
            settings = dict(do_sample=True, temperature=0.9, seed=sampled[b]) if b in sampled else {}
            ticket = service.submit(prompts[b], max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=8, **settings)
            return ticket.result(60)[0]

        with ThreadPoolExecutor(len(prompts)) as pool:
            got = list(pool.map(ask, range(len(prompts))))
        assert service.steps > 0 and service.pending == 0
    assert got == expected
    assert expected[0] == hf_greedy(decoder.model, prompts[0], NEW, eos_token_id=None)[len(prompts[0]):]


def test_streamed_runs_add_up_to_the_result(decoder):
    prompt = repetitive_prompts(1, seed=8)[0]
    with DecodingService(decoder, max_concurrent=2) as service:
        ticket = service.submit(prompt, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=8)
        runs = list(ticket.tokens(timeout=60))
        tokens, stats = ticket.result(1)
    assert sum(runs, []) == tokens and len(tokens) == NEW == stats.new_tokens
    assert stats.stop_reason == "max_new_tokens" and len(runs) < NEW  # drafts: several tokens a run


def test_a_cancelled_request_stops_at_the_next_step_and_the_others_go_on(decoder):
    prompts = repetitive_prompts(2, seed=3)
    gate = threading.Event()
    with DecodingService(decoder, max_concurrent=2) as service:
        def stall(event):  # the long request's first run: cancel it, then let the loop go on
            if event.kind == "tokens" and not gate.is_set():
                gate.set()
                long.cancel()

        long = service.submit(prompts[0], max_new_tokens=200, eos_token_id=[], max_draft_tokens=8, on_event=stall)
        short = service.submit(prompts[1], max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=8)
        long.finished.wait(60)
        tokens, stats = long.result(1)
        assert stats.stop_reason == "cancelled" and 0 < len(tokens) < 200 and service.cancelled == 1
        assert short.result(60)[0] == decoder.generate(prompts[1], max_new_tokens=NEW, eos_token_id=[],
                                                       max_draft_tokens=8).sequences[0, len(prompts[1]):].tolist()


def test_a_full_queue_refuses_and_bad_arguments_raise_on_the_callers_thread(decoder):
    prompt = repetitive_prompts(1, seed=2)[0]
    release = threading.Event()
    with DecodingService(decoder, max_concurrent=1, max_waiting=1) as service:
        held = service.submit(prompt, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=8,
                              on_event=lambda event: release.wait(30))
        waiting = service.submit(prompt, max_new_tokens=4, eos_token_id=[])
        with pytest.raises(ServiceBusy, match="queue is full"):
            service.submit(prompt, max_new_tokens=4)
        with pytest.raises(ValueError, match="max_new_tokens"):
            service.submit(prompt, max_new_tokens=-1)
        release.set()
        assert held.finished.wait(60) and waiting.result(60)[1].new_tokens == 4


def test_a_failed_step_fails_its_rows_only_and_the_service_decodes_on(decoder, monkeypatch):
    prompt = repetitive_prompts(1, seed=4)[0]
    backend = decoder.backend
    verify = backend.verify
    calls = {"n": 0}

    def failing_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected failure")
        return verify(*args, **kwargs)

    monkeypatch.setattr(backend, "verify", failing_once)
    with DecodingService(decoder, max_concurrent=1) as service:
        first = service.submit(prompt, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=8)
        second = service.submit(prompt, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=8)  # waits
        with pytest.raises(RuntimeError, match="injected"):
            first.result(60)
        assert service.failures == 1
        tokens, _ = second.result(60)
    monkeypatch.undo()
    assert tokens == decoder.generate(prompt, max_new_tokens=NEW, eos_token_id=[],
                                      max_draft_tokens=8).sequences[0, len(prompt):].tolist()


def test_closing_fails_the_unfinished_and_refuses_new_requests(decoder):
    prompt = repetitive_prompts(1, seed=6)[0]
    release = threading.Event()
    service = DecodingService(decoder, max_concurrent=1)
    held = service.submit(prompt, max_new_tokens=NEW, eos_token_id=[], on_event=lambda event: release.wait(5))
    waiting = service.submit(prompt, max_new_tokens=NEW, eos_token_id=[])
    closer = threading.Thread(target=service.close)
    closer.start()
    release.set()
    closer.join(30)
    with pytest.raises(ServiceClosed):
        waiting.result(5)
    assert held.finished.is_set()
    with pytest.raises(ServiceClosed):
        service.submit(prompt, max_new_tokens=4)


@pytest.mark.parametrize("setting, value", [("max_concurrent", 0), ("max_waiting", -1)])
def test_settings_are_checked(decoder, setting, value):
    with pytest.raises(ValueError, match=setting):
        DecodingService(decoder, **{setting: value})


def test_rows_with_budgets_of_different_kinds_each_report_their_steps_time_to_their_own(decoder):
    """One request "auto", one a fixed 8 nodes, in one batch (priced row by row): the engine hands each
    kind of budget its own rows' step times (refdec.sizing.budget.Budget.observe_step), so the "auto" row
    feeds the decoder's learnt cost and the fixed row is left alone; both get their solo output."""
    prompts = repetitive_prompts(2, seed=9)
    expected = [decoder.generate(p, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=budget)
                .sequences[0, len(p):].tolist() for p, budget in zip(prompts, ("auto", 8))]
    learnt = decoder._learnt_cost
    before = learnt.version
    decoder.joint_batch_budget = False  # the two kinds cannot be priced as one forward
    with DecodingService(decoder, max_concurrent=2) as service:
        tickets = [service.submit(p, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=budget)
                   for p, budget in zip(prompts, ("auto", 8))]
        got = [ticket.result(60)[0] for ticket in tickets]
    assert got == expected
    assert decoder._learnt_cost is learnt and learnt.version > before


def test_each_request_starts_from_the_acceptance_the_earlier_ones_learnt(decoder):
    """Every "auto" request of a decoder reads and teaches one acceptance table (a server's requests
    would otherwise each start from the priors and draft small trees until they relearn them): the
    same edit asked twice verifies larger trees the second time, in fewer passes, and the same tokens."""
    from refdec.sizing.cost_curve import CALIBRATED_SIZES, CostCurve
    from refdec.sizing.cost_model import LearntCost

    decoder.timed_budget = False  # sizes then depend on the tokens and the table only
    # a compute-bound machine's curve (every row costs a tenth of a plain step): unproven deep nodes do not pay
    decoder._learnt_cost = LearntCost(CostCurve(CALIBRATED_SIZES, tuple(1.0 + 0.1 * n for n in CALIBRATED_SIZES)))
    prompt = repetitive_prompts(1, seed=9)[0]
    reference = hf_greedy(decoder.model, prompt, 48, eos_token_id=None)[len(prompt):]
    with DecodingService(decoder, max_concurrent=1) as service:
        first = service.submit(prompt, references=[reference], max_new_tokens=48, eos_token_id=[])
        tokens, stats = first.result(60)
        assert first.request.budget.acceptance is decoder.acceptance
        learnt = decoder.acceptance.verified.sum()
        second = service.submit(prompt, references=[reference], max_new_tokens=48, eos_token_id=[])
        again, stats_again = second.result(60)
    assert learnt > 0 and tokens == again == reference
    assert stats_again.forward_passes < stats.forward_passes


def test_the_service_answers_what_a_front_end_needs_of_its_model(decoder):
    service = DecodingService(decoder)
    try:
        eos = decoder.backend.generation_config.eos_token_id
        assert service.eos_token_ids == ({eos} if isinstance(eos, int) else set(eos or ()))
        assert service.tokenizer is decoder.tokenizer and service.index is decoder.index
    finally:
        service.close()
