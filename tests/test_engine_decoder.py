"""Specifies refdec.engine.decoder, the front end: ``refdec.generate`` and ``SpeculativeDecoder``
(whose ``prefill_chunk`` is checked; generate's arguments are tests/test_engine_arguments.py's)
stream to transformers streamers, survive a raising streamer, are reusable across calls (without
growing memory), and call ``on_row_done`` as rows finish; ``retrieve=k`` adds the k corpus-index
documents most similar to the prompt to its references (output unchanged, drafts from them); the
one-time calibration of ``max_draft_tokens="auto"`` is reported as ``stats.calibration_seconds``,
not in ``wall_seconds``."""

from __future__ import annotations

import gc
import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import TextIteratorStreamer

import refdec
import refdec.engine.decoder as decoder_module
from refdec.drafting.index import CorpusIndex
from refdec.drafting.proposer import Proposer
from refdec.transformers import calibration
import refdec.transformers.backend as backend_module
from tiny_models import (VOCAB, FakeClock, RecordingStreamer, batch_row, hf_greedy, mixed_batch, repetitive_prompts,
                         tiny_llama)

NEW = 40


@pytest.fixture(scope="module")
def llama4():
    return tiny_llama(seed=4)


def test_text_iterator_streamer_yields_the_returned_text(llama, tiny_tokenizer):
    prompt = repetitive_prompts(1, seed=34)[0]
    streamer = TextIteratorStreamer(tiny_tokenizer, skip_prompt=True)
    out = refdec.generate(llama, prompt, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=16, streamer=streamer)
    text = "".join(streamer)
    assert text == tiny_tokenizer.decode(out.sequences[0, len(prompt):])


def test_streamer_gets_the_prompt_as_a_batch_first_then_runs(llama):
    prompt = repetitive_prompts(1, seed=35)[0]
    streamer = RecordingStreamer()
    out = refdec.generate(llama, prompt, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=16, streamer=streamer)
    assert streamer.first_shape == (1, len(prompt))
    assert sum(streamer.puts, []) == out.sequences[0].tolist()
    assert len(streamer.puts) - 1 == out.stats.forward_passes  # one put per pass (accepted run + bonus)


def test_max_new_tokens_zero_returns_the_prompt(llama):
    streamer = RecordingStreamer()
    out = refdec.generate(llama, torch.tensor([[1, 5, 6]]), max_new_tokens=0, streamer=streamer)
    assert out.sequences.tolist() == [[1, 5, 6]] and out.stats.new_tokens == 0
    assert streamer.puts == [[1, 5, 6]] and streamer.ended == 1


def test_speculative_decoder_is_reusable_and_matches_one_shot_generate(llama):
    decoder = refdec.SpeculativeDecoder(llama)
    for prompt in repetitive_prompts(3, seed=36):
        a = decoder.generate(prompt, max_new_tokens=20, eos_token_id=[])
        b = refdec.generate(llama, prompt, max_new_tokens=20, eos_token_id=[])
        assert a.sequences.tolist() == b.sequences.tolist()


@pytest.mark.parametrize("bad", [0, -3, 2.5, "1024", True])
def test_prefill_chunk_must_be_a_positive_int_or_none(llama, bad):
    with pytest.raises(ValueError, match="prefill_chunk"):
        refdec.SpeculativeDecoder(llama, prefill_chunk=bad)


class _FailingStreamer:
    def __init__(self, fail_at: int, in_end: bool = False) -> None:
        self.puts = 0
        self.fail_at, self.in_end = fail_at, in_end

    def put(self, value) -> None:
        self.puts += 1
        if not self.in_end and self.puts == self.fail_at:
            raise RuntimeError("streamer broke")

    def end(self) -> None:
        if self.in_end:
            raise RuntimeError("streamer broke at end")


@pytest.mark.parametrize("max_draft", [pytest.param("auto", marks=pytest.mark.full), 16])
@pytest.mark.parametrize("fail", [(1, False), (2, False), (4, False), (0, True)], ids=["prompt", "first", "mid", "end"])
def test_a_raising_streamer_propagates_and_leaves_the_decoder_usable(llama4, max_draft, fail):
    model = llama4
    prompts = repetitive_prompts(3, seed=24)
    decoder = refdec.SpeculativeDecoder(model)
    with pytest.raises(RuntimeError, match="streamer broke"):
        decoder.generate(prompts[0], max_new_tokens=20, eos_token_id=[], max_draft_tokens=max_draft,
                         streamer=_FailingStreamer(*fail))
    for prompt in prompts:  # the same decoder, the same and other prompts
        out = decoder.generate(prompt, max_new_tokens=20, eos_token_id=[], max_draft_tokens=max_draft)
        assert out.sequences[0].tolist() == hf_greedy(model, prompt, 20)


def test_on_row_done_reports_each_row_as_it_finishes(llama):
    """on_row_done(batch_row, new_tokens, row_stats): once per row, as the row finishes (one at a
    time: in order), with exactly the row's new tokens and final stats."""
    prompts = repetitive_prompts(3, seed=47)
    calls = []
    out = refdec.generate(llama, prompts, max_new_tokens=12, max_draft_tokens=8, max_batch_size=1,
                          on_row_done=lambda b, tokens, stats: calls.append((b, list(tokens), stats.new_tokens,
                                                                             stats.stop_reason)))
    assert [c[0] for c in calls] == [0, 1, 2]
    for b, tokens, new_tokens, reason in calls:
        alone = refdec.generate(llama, prompts[b], max_new_tokens=12, max_draft_tokens=8)
        assert tokens == alone.sequences[0, len(prompts[b]):].tolist()
        assert (new_tokens, reason) == (out.stats.rows[b].new_tokens, out.stats.rows[b].stop_reason)
    calls.clear()
    refdec.generate(llama, prompts, max_new_tokens=0, on_row_done=lambda b, t, s: calls.append((b, t)))
    assert sorted(calls) == [(0, []), (1, []), (2, [])]


def test_on_row_done_is_called_for_a_one_row_batch_with_an_all_ones_mask(llama):
    """on_row_done with a [1, L] batch and an all-ones mask (a one-string tokenizer batch)."""
    prompt = [1, 5, 6, 7, 5, 6]
    calls = []
    out = refdec.generate(llama, torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=5, eos_token_id=[], on_row_done=lambda b, t, s: calls.append((b, list(t))))
    assert calls == [(0, out.sequences[0, len(prompt):].tolist())]


def test_auto_learns_one_cost_per_decoder_and_timed_budget_false_keeps_the_calibrated_curve(llama, monkeypatch):
    """"auto" prices every call and batch row with one LearntCost on the backend's curve (measured
    once per decoder), each call's request starting its guard over; ``timed_budget = False`` gives
    budgets on the calibrated curve, without learning or a guard (pass counts from tokens only)."""
    asked = []
    monkeypatch.setattr(backend_module, "auto_cost_curve", lambda model: asked.append(model) or calibration.DEFAULT_CPU_CURVE)
    decoder = refdec.SpeculativeDecoder(llama)
    prompts = repetitive_prompts(2)
    single = decoder._budgets("auto", True, 1)[0]
    single.guard.paused = True  # as if the last request stopped drafting
    assert decoder._budgets("auto", True, 1) == [single] and single.max_nodes > 0  # a new request drafts
    rows = decoder._budgets("auto", False, 2)
    assert all(row.learnt is single.learnt is decoder._learnt_cost for row in rows) and len(asked) == 1
    assert decoder._learnt_cost.prior is calibration.DEFAULT_CPU_CURVE
    out = decoder.generate(prompts[0], max_new_tokens=8, eos_token_id=[])
    assert decoder._learnt_cost.version == out.stats.forward_passes - 1  # every step fed it
    decoder.timed_budget = False
    fixed = decoder._budgets("auto", True, 1)[0]
    assert fixed is not single and fixed.learnt is None and fixed.guard is None
    assert fixed.cost is calibration.DEFAULT_CPU_CURVE
    assert all(row.learnt is None and row.guard is None for row in decoder._budgets("auto", False, 2))
    out = decoder.generate(prompts[0], max_new_tokens=8, eos_token_id=[])
    assert out.sequences[0].tolist() == hf_greedy(llama, prompts[0], max_new_tokens=8)


def test_an_autobudget_instance_serves_each_row_with_its_own_copy():
    """max_draft_tokens=AutoBudget(...): every row learns on its own copy (one shared policy
    mixed the rows' node cells up) and the rows' prefixes are chosen together."""
    from refdec.sizing.budget import AutoBudget
    from refdec.transformers.calibration import CostCurve

    model = tiny_llama()
    prompts = mixed_batch()
    policy = AutoBudget(CostCurve((0, 64), (1.0, 2.0)), max_nodes=16)
    out = refdec.generate(model, prompts, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=policy)
    for b, p in enumerate(prompts):
        assert batch_row(out, b, len(p)) == hf_greedy(model, p)
    assert out.stats.accepted_tokens > 0
    assert policy.steps == 0  # the caller's object is the template, not a row's policy


@pytest.mark.full
def test_hundreds_of_generate_calls_on_one_decoder_do_not_grow_memory():
    from benchmarks import leak_check

    decoder, prompts = leak_check.make_setup(seed=1)
    leak_check.run_calls(decoder, prompts, 0, 60)  # warm-up: allocator pools, lazy imports, calibration
    gc.collect()
    rss_warm = leak_check.rss_bytes()
    tracemalloc.start()
    try:
        heap_warm = tracemalloc.get_traced_memory()[0]
        leak_check.run_calls(decoder, prompts, 60, 300)
        gc.collect()
        heap_growth = tracemalloc.get_traced_memory()[0] - heap_warm
    finally:
        tracemalloc.stop()
    rss_growth = leak_check.rss_bytes() - rss_warm
    # measured: ~0.4 MiB RSS, ~90 KiB Python heap over 300 calls (noise; 10,000: e2e --long-run)
    assert rss_growth < 24 * 2**20, rss_growth
    assert heap_growth < 2 * 2**20, heap_growth


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


# ---------------------------------------------------------------------------------------------
# generate(retrieve=k): the k index documents most similar to the prompt join its references


@pytest.fixture(scope="module")
def llama3():
    return tiny_llama(seed=3)


def _retrieval_documents(count: int = 6, length: int = 300, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, size=length).astype(np.int32) for _ in range(count)]


def test_retrieve_k_gives_greedy_output_and_the_retrieved_document_feeds_drafts(llama3):
    docs = _retrieval_documents(6, seed=5)
    index = CorpusIndex.build(docs, vocab_size=VOCAB, signatures=True, show_progress=False)
    seen_refs = []

    def factory(index_, references, max_depth):
        seen_refs.append(list(references))
        return Proposer(index=index_, references=references or None, max_depth=max_depth)

    decoder = refdec.SpeculativeDecoder(llama3, index=index, proposer_factory=factory)
    for j in (1, 4):
        prompt = [1] + docs[j][30:90].tolist()  # a slice of document j
        want = hf_greedy(llama3, prompt, 24)
        plain = decoder.generate(prompt, max_new_tokens=24, eos_token_id=[], max_draft_tokens=16)
        out = decoder.generate(prompt, max_new_tokens=24, eos_token_id=[], max_draft_tokens=16, retrieve=2)
        assert plain.sequences[0].tolist() == want
        assert out.sequences[0].tolist() == want
        assert out.stats.retrieved_documents[0] == j and len(out.stats.retrieved_documents) <= 2
        assert plain.stats.retrieved_documents == []
        # the retrieved document is a reference of the request's proposer ...
        assert any(np.array_equal(r, docs[j]) for r in seen_refs[-1])
        # ... and drafts its continuation of the prompt from the reference source
        proposer = factory(index, seen_refs[-1], 64)
        proposer.start(np.asarray(prompt, dtype=np.int32))
        tree = proposer.propose(16)
        names = [tree.source_names[s] for s in tree.source_ids]
        chain = tree.token_ids[tree.parents < 0]
        assert "reference" in names and docs[j][90] in chain.tolist()


def test_retrieve_through_the_module_level_generate(llama3):
    docs = _retrieval_documents(4, seed=6)
    index = CorpusIndex.build(docs, vocab_size=VOCAB, signatures=True, show_progress=False)
    prompt = [1] + docs[2][10:50].tolist()
    out = refdec.generate(llama3, prompt, index=index, max_new_tokens=12, eos_token_id=[], retrieve=1)
    assert out.sequences[0].tolist() == hf_greedy(llama3, prompt, 12)
    assert out.stats.retrieved_documents == [2]
