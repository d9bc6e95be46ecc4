"""Specifies refdec.engine.scheduler, continuous batching: at most ``max_batch_size`` rows decode
together; waiting prompts join, in order, as rows finish (their cache rows appended to the running
batch's); every row's output is the same as decoded alone, greedy or sampled with its seed."""

from __future__ import annotations

import time

import numpy as np
import pytest

import refdec
from refdec.engine.scheduler import Scheduler
import refdec.transformers.batch as batch
from tiny_models import FakeClock, batch_row, cached_model, hf_greedy, mixed_batch, repetitive_prompts, tiers

NEW = 40


def test_waiting_requests_join_in_order_as_far_as_capacity_allows():
    scheduler = Scheduler(["a", "b", "c", "d", "e"], capacity=3)
    assert scheduler and scheduler.next_group(0) == ["a", "b", "c"]
    assert scheduler.next_group(3) == []  # full
    assert scheduler.next_group(2) == ["d"]  # one row finished: one joins
    assert scheduler.next_group(0) == ["e"] and not scheduler
    assert scheduler.next_group(0) == []
    one = Scheduler(["a", "b"], capacity=1)
    assert one.next_group(0) == ["a"] and one.next_group(1) == [] and one.next_group(0) == ["b"]


def test_requests_queued_later_wait_behind_the_others_and_finished_ones_never_join():
    class Waiting:
        def __init__(self, name):
            self.name, self.done = name, False

        def __repr__(self):
            return self.name

    a, b, c = Waiting("a"), Waiting("b"), Waiting("c")
    scheduler = Scheduler([a], capacity=2)
    scheduler.extend([b, c])
    b.done = True  # cancelled while waiting
    assert scheduler.next_group(0) == [a, c] and not scheduler
    c2 = Waiting("c2")
    scheduler.extend([c2])
    c2.done = True
    assert not scheduler and scheduler.next_group(0) == []


# fast: two rows at a time on Llama without the lazy head; full: every family x setting
@pytest.mark.parametrize("family, max_batch_size, lazy_head", tiers(
    [(family, *setting) for family in ("gemma3", "gpt2", "llama") for setting in [(1, True), (2, True), (2, False),
                                                                                 (4, True)]],
    fast=[("llama", 2, False)]))
def test_continuous_batching_keeps_every_row_exact(tiny_model_cache, monkeypatch, family, max_batch_size, lazy_head):
    """max_batch_size rows at most decode together; waiting rows join as rows finish, their
    cache rows appended to the running batch's (prompts longer and shorter than the running
    cache), and every row still equals generate on that row alone, EOS stops included."""
    model = cached_model(tiny_model_cache, family)
    rng = np.random.default_rng(5)
    # a long prompt joins early (longer than the running cache) and a longer one last (longer than
    # any running cache: a prompt of <= 71 tokens plus NEW); the short ones join after it
    prompts = mixed_batch()
    prompts.insert(2, [1] + rng.integers(3, 96, size=70).tolist())
    prompts.append([1] + rng.integers(3, 96, size=120).tolist())
    eos = hf_greedy(model, prompts[1])[len(prompts[1]) + 5]  # row 1 stops early, freeing its place
    want = [hf_greedy(model, p, eos_token_id=eos) for p in prompts]
    decoder = refdec.SpeculativeDecoder(model, prefill_chunk=16)  # joining prompts prefill in chunks too
    decoder.backend.lazy_head = lazy_head and decoder.backend.lazy_head
    forward_rows, appended = [], []
    hook = model.get_input_embeddings().register_forward_hook(
        lambda module, args, out: forward_rows.append(int(args[0].shape[0])))
    append_rows = batch.append_rows

    def recording_append(cache, other):
        keys, other_keys = cache.layers[0].keys, other.layers[0].keys  # [B, H, S, D]
        appended.append((keys.shape[2], other_keys.shape[2], keys.shape[0], other_keys.shape[0]))
        return append_rows(cache, other)

    monkeypatch.setattr(batch, "append_rows", recording_append)
    try:
        out = decoder.generate(prompts, max_new_tokens=NEW, eos_token_id=eos, max_draft_tokens=8,
                               max_batch_size=max_batch_size)
    finally:
        hook.remove()
    for b, p in enumerate(prompts):
        assert batch_row(out, b, len(p)) == want[b], (family, b)
    assert max(forward_rows) == max_batch_size
    assert all(r.stop_reason in ("eos", "max_new_tokens") for r in out.stats.rows)
    assert out.stats.new_tokens == sum(r.new_tokens for r in out.stats.rows)
    if max_batch_size > 1:
        # rows joined a running batch, from shorter and from longer caches than its own
        assert appended and all(n_running + n_joining <= max_batch_size for _, _, n_running, n_joining in appended)
        assert any(joining > running for running, joining, _, _ in appended)
        assert any(joining < running for running, joining, _, _ in appended)
    else:
        assert not appended  # one row at a time: each starts a batch of its own


def test_continuous_batching_with_sampling_keeps_each_rows_seed(monkeypatch, llama):
    model = llama
    prompts = mixed_batch()
    joins = []
    append_rows = batch.append_rows
    monkeypatch.setattr(batch, "append_rows", lambda *args: (joins.append(1), append_rows(*args))[1])
    out = refdec.generate(model, prompts, max_new_tokens=NEW, do_sample=True, seed=70, eos_token_id=[],
                          max_draft_tokens=8, max_batch_size=2, temperature=0.8)
    assert joins  # rows joined a running batch
    for b, p in enumerate(prompts):
        single = refdec.generate(model, p, max_new_tokens=NEW, do_sample=True, seed=70 + b, eos_token_id=[],
                                   max_draft_tokens=0, temperature=0.8).sequences[0].tolist()
        assert batch_row(out, b, len(p)) == single, b


@pytest.mark.parametrize("max_new_tokens", [0, 1, 2])
def test_continuous_batching_with_few_new_tokens(llama, max_new_tokens):
    model = llama
    prompts = mixed_batch()
    out = refdec.generate(model, prompts, max_new_tokens=max_new_tokens, eos_token_id=[], max_batch_size=2)
    for b, p in enumerate(prompts):
        want = hf_greedy(model, p, max_new_tokens=max_new_tokens) if max_new_tokens else list(p)
        assert batch_row(out, b, len(p)) == want, b
        assert out.stats.rows[b].stop_reason == "max_new_tokens"


def test_continuous_batching_stats_count_every_groups_prefill(monkeypatch, llama):
    """One row at a time: every row is its own group, so the batch's passes and prefill time
    are the sums of the rows' (each row's passes include its prefill). With a clock that moves
    one second per model forward: each row's prefill is its own group's one forward, and each
    row's wall time stops at its own last token."""
    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    prompts = repetitive_prompts(3, seed=21)
    hook = llama.get_input_embeddings().register_forward_hook(clock.tick)
    try:
        out = refdec.generate(llama, prompts, max_new_tokens=12, eos_token_id=[], max_draft_tokens=4,
                              max_batch_size=1)
    finally:
        hook.remove()
    rows = out.stats.rows
    assert out.stats.forward_passes == sum(r.forward_passes for r in rows)
    assert out.stats.prefill_seconds == sum(r.prefill_seconds for r in rows) == 3
    assert [r.prefill_seconds for r in rows] == [1, 1, 1]
    ends = [r.wall_seconds for r in rows]  # each row's clock stops at its own last token
    assert ends == np.cumsum([r.forward_passes for r in rows]).tolist() and ends[-1] == out.stats.wall_seconds
