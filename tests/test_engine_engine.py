"""Specifies refdec.engine.engine, the propose -> verify -> accept loop: greedy decoding is
token-identical to ``model.generate(do_sample=False)`` for single prompts and for every row of a
batch, whatever the draft shapes and budgets, with drafts both accepted and rejected; with
``max_draft_tokens="auto"`` the rows of a batch choose their verified prefixes together; the
stats attribute each step's time to its phase.

Tiny float64 models (tiny_models.py); repetitive prompts, so drafts are partly accepted;
40 new tokens, which takes Gemma 3's sequences well past its sliding window of 8.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

import refdec
import refdec.sizing.budget
from tiny_models import (FAMILIES, FakeClock, batch_row, cached_model, lookup_factory, mixed_batch, repetitive_prompts,
                         tiers)

NEW = 40

# (max_draft_tokens, proposer): "cxx" = refdec.drafting.proposer.Proposer (the C++ core), else a shape of the
# pure-Python stand-in (tests/tiny_models.py) that makes chains, two-branch and four-branch trees
CONFIGS = [(0, "cxx"), (1, "cxx"), (4, "cxx"), (16, "cxx"), (64, "cxx"), ("auto", "cxx"),
           (4, "tree"), (16, "wide"), (64, "chain")]


def factory(kind):
    return None if kind == "cxx" else lookup_factory(kind)


_reference_cache: dict = {}


def hf_greedy(model, prompt, max_new_tokens=NEW, eos_token_id=None):
    """model.generate's greedy output, computed once per model object (the cache holds the model,
    so its id is never reused for another)."""
    key = (id(model), tuple(prompt), max_new_tokens, eos_token_id)
    if key not in _reference_cache:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new_tokens,
                                 eos_token_id=eos_token_id, pad_token_id=0, attention_mask=None)
        _reference_cache[key] = (model, out[0].tolist())
    return _reference_cache[key][1]


def set_head(decoder, head: str) -> None:
    """``"lazy"``: the head on the rows the walks visit (the CPU's default); ``"full"``: every row's
    target, the walks on the device (a GPU's path: the backbone, then the head in row chunks);
    ``"model"``: the full path for a model whose head refdec does not split (its own forward)."""
    decoder.backend.lazy_head = head == "lazy"
    if head == "model":
        decoder.backend.runner.head = None


# fast: the first 4 of the 20 prompts on Llama with the lazy head (the full head: the test below);
# full: Gemma 3's 4 and all 20 prompts on every family, each head
@pytest.mark.parametrize("name, n_prompts, head", tiers(
    [(name, n, head) for name, n in [("gemma3", 4), ("llama", 4)] + [(name, 20) for name in FAMILIES]
     for head in ("lazy", "full", "model")],
    fast=[("llama", 4, "lazy")]))
def test_greedy_matches_generate_for_all_prompts_and_tree_shapes(tiny_model_cache, name, n_prompts, head):
    model = cached_model(tiny_model_cache, name)
    prompts = repetitive_prompts(20, seed=11)[:n_prompts]
    accepted = rejected = 0
    for max_draft, shape in CONFIGS:
        decoder = refdec.SpeculativeDecoder(model, proposer_factory=factory(shape))
        set_head(decoder, head)
        for prompt in prompts:
            want = hf_greedy(model, prompt)
            out = decoder.generate(prompt, max_new_tokens=NEW, eos_token_id=[],
                                   max_draft_tokens=max_draft)
            assert out.sequences[0].tolist() == want, (name, max_draft, shape, prompt)
            assert out.stats.new_tokens == NEW
            if max_draft == 0:
                assert out.stats.forward_passes == NEW and out.stats.proposed_tokens == 0
            accepted += out.stats.accepted_tokens
            rejected += out.stats.proposed_tokens - out.stats.accepted_tokens
    # the comparison is not vacuous: drafts were both accepted and rejected
    assert accepted > 50 and rejected > 50, (accepted, rejected)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7])
def test_greedy_short_generations_match(family_model, max_new_tokens):
    name, model = family_model
    for prompt in repetitive_prompts(3, seed=2):
        want = hf_greedy(model, prompt, max_new_tokens=max_new_tokens)
        out = refdec.generate(model, prompt, max_new_tokens=max_new_tokens, eos_token_id=[], max_draft_tokens=64)
        assert out.sequences[0].tolist() == want


@pytest.mark.parametrize("family, kind, head", tiers(
    [(family, kind, head) for family in ("gemma3", "gpt2", "llama") for kind in ("cxx", "tree")
     for head in ("lazy", "full")],
    fast=[("llama", "tree", "lazy"), ("llama", "cxx", "full")]))
def test_each_row_equals_generate_on_that_row_alone(tiny_model_cache, family, kind, head):
    model = cached_model(tiny_model_cache, family)
    prompts = mixed_batch()
    free = [hf_greedy(model, p) for p in prompts]
    eos = free[1][len(prompts[1]) + 6]  # row 1 stops early; rows emitting this token stop too
    want = [hf_greedy(model, p, eos_token_id=eos) for p in prompts]
    # row 0 has a reference holding its continuation: long accepted drafts
    references = [[free[0][len(prompts[0]) - 3:]]] + [None] * (len(prompts) - 1)
    decoder = refdec.SpeculativeDecoder(model, proposer_factory=None if kind == "cxx" else lookup_factory(kind))
    set_head(decoder, head)
    out = decoder.generate(prompts, references=references, max_new_tokens=NEW, eos_token_id=eos,
                           max_draft_tokens=16)
    for b, p in enumerate(prompts):
        assert batch_row(out, b, len(p)) == want[b], (family, b)
    rows = out.stats.rows
    assert sum(r.accepted_tokens for r in rows) > 10
    assert sum(r.proposed_tokens - r.accepted_tokens for r in rows) > 10
    assert rows[0].accepted_tokens >= 10 and rows[0].tokens_per_pass > 3  # the reference row
    assert len({r.forward_passes for r in rows}) > 1  # rows finished at different steps
    assert rows[1].stop_reason == "eos" and rows[1].new_tokens < NEW
    assert out.stats.new_tokens == sum(r.new_tokens for r in rows)
    assert out.stats.forward_passes == max(r.forward_passes for r in rows)


def test_auto_budget_gives_each_row_its_own_policy(monkeypatch, llama):
    """max_draft_tokens="auto" (the default): one budget policy per row (its own acceptance), the
    rows' prefixes chosen together for the batched forward (batch_prefix_sizes); rows stay exact."""
    model = llama
    prompts = mixed_batch()
    calls = []

    row_budgets = {}  # id(budget) -> row, from the first call (all rows active, in order)

    batch_prefix_sizes = refdec.sizing.budget.batch_prefix_sizes

    def spy(budgets, trees, cells=None):
        sizes = batch_prefix_sizes(budgets, trees, cells)
        if not row_budgets:
            row_budgets.update({id(budget): (b, budget) for b, budget in enumerate(budgets)})
        calls.append((len(budgets), [len(t) for t in trees], sizes))
        return sizes

    monkeypatch.setattr(refdec.sizing.budget, "batch_prefix_sizes", spy)
    out = refdec.generate(model, prompts, max_new_tokens=NEW, eos_token_id=[])
    for b, p in enumerate(prompts):
        assert batch_row(out, b, len(p)) == hf_greedy(model, p)
    assert out.stats.accepted_tokens > 0
    assert calls and calls[0][0] == len(prompts)  # every active row, priced together
    # the rows verified what their policies took (take_prefix), not their whole drafts
    assert len(row_budgets) == len(prompts)
    for b, budget in row_budgets.values():
        assert sum(budget.chosen) == out.stats.rows[b].proposed_tokens, b
    for n_rows, lengths, sizes in calls:
        assert len(sizes) == n_rows and all(0 <= s <= n for s, n in zip(sizes, lengths))
        # one node count for the batch, each row clipped to its own tree
        assert len({s for s, n in zip(sizes, lengths) if s < n}) <= 1
        assert all(s == n for s, n in zip(sizes, lengths) if s < max(sizes))
    # decoder.joint_batch_budget = False: each row is priced alone again, still exact
    calls.clear()
    decoder = refdec.SpeculativeDecoder(model)
    decoder.joint_batch_budget = False
    out = decoder.generate(prompts, max_new_tokens=NEW, eos_token_id=[])
    assert not calls
    for b, p in enumerate(prompts):
        assert batch_row(out, b, len(p)) == hf_greedy(model, p)


class TickingDrafter:
    """A drafter (lookup_factory's) whose propose and accept each take one second of ``clock``."""

    def __init__(self, drafter, clock: FakeClock, calls: dict) -> None:
        self.drafter, self.clock, self.calls = drafter, clock, calls

    def start(self, prompt_ids):
        self.drafter.start(prompt_ids)

    def propose(self, max_nodes):
        self.clock.tick()
        self.calls["propose"] += 1
        return self.drafter.propose(max_nodes)

    def accept(self, tokens):
        self.clock.tick()
        self.calls["accept"] += 1
        self.drafter.accept(tokens)


def ticking_decoder(monkeypatch, model, drafter_class):
    """A decoder on ``model`` whose drafter (lookup_factory's "tree" wrapped in ``drafter_class``)
    ticks a FakeClock that stands in for time.perf_counter; returns (decoder, clock, calls)."""
    clock = FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    calls = {"propose": 0, "accept": 0}
    drafter_factory = lookup_factory("tree")
    decoder = refdec.SpeculativeDecoder(model, proposer_factory=lambda *args: drafter_class(
        drafter_factory(*args), clock, calls))
    return decoder, clock, calls


@pytest.mark.parametrize("lazy_head", [True, False])
def test_the_stats_give_each_phase_its_own_time(monkeypatch, llama, lazy_head):
    """With a clock that moves one second per model forward, LM-head call, drafter proposal and
    drafter update: the prompts' forward (and the lazy head's row for the first token) is prefill
    time, every verification forward and head call forward time, the proposals propose time, the
    updates with emitted tokens (the prefill's first token's included) accept time; preparing the
    trees takes none."""
    decoder, clock, calls = ticking_decoder(monkeypatch, llama, TickingDrafter)
    decoder.backend.lazy_head = lazy_head
    head_calls = []
    if lazy_head:
        head = decoder.backend.runner.head
        monkeypatch.setattr(head, "logits", lambda hidden, logits=head.logits: (
            clock.tick(), head_calls.append(1), logits(hidden))[-1])
    hook = llama.get_input_embeddings().register_forward_hook(clock.tick)
    try:
        prompts = repetitive_prompts(3, seed=47)
        out = decoder.generate(prompts, max_new_tokens=12, eos_token_id=[], max_draft_tokens=8)
    finally:
        hook.remove()
    stats = out.stats
    prefill = 1 + lazy_head  # one forward for the group (and the head on its last rows)
    assert stats.prefill_seconds == prefill and [r.prefill_seconds for r in stats.rows] == [prefill] * 3
    assert stats.forward_seconds == (stats.forward_passes - 1) + (len(head_calls) - lazy_head)
    assert stats.propose_seconds == calls["propose"] > 0 and stats.accept_seconds == calls["accept"] > 0
    assert stats.prepare_seconds == 0
    assert stats.wall_seconds == clock.now and max(r.wall_seconds for r in stats.rows) == clock.now
    assert lazy_head == (len(head_calls) > 0)


class SlowDrafter(TickingDrafter):
    """A TickingDrafter whose proposals take ten seconds."""

    def propose(self, max_nodes):
        for _ in range(9):
            self.clock.tick()
        return super().propose(max_nodes)


def test_the_budgets_learn_each_steps_time_and_stop_drafting_where_it_does_not_pay(monkeypatch, llama):
    """With a clock that moves one second per model forward and ten per proposal, no draft pays
    (a drafted step would need 11 tokens to match plain's one token a second). The engine reports
    each step's time to the budget (StepTime: one row, the verified tree's size, the proposal's and
    the forward's seconds); "auto" refits its curve to one second a forward, and its guard stops
    drafting after a window of drafted steps, probing on its schedule; the output is model.generate's."""
    decoder, clock, calls = ticking_decoder(monkeypatch, llama, SlowDrafter)
    steps = []
    observe_step = refdec.sizing.budget.AutoBudget.observe_step

    def spy(cls, budgets, trees, accepted, step):
        steps.append((len(trees[0]), step))
        observe_step(budgets, trees, accepted, step)

    monkeypatch.setattr(refdec.sizing.budget.AutoBudget, "observe_step", classmethod(spy))
    hook = llama.get_input_embeddings().register_forward_hook(clock.tick)
    try:
        prompt = repetitive_prompts(1, seed=5)[0]
        out = decoder.generate(prompt, max_new_tokens=100, eos_token_id=[])
    finally:
        hook.remove()
    assert out.sequences[0].tolist() == hf_greedy(llama, prompt, max_new_tokens=100)
    assert len(steps) == out.stats.forward_passes - 1  # every step but the prefill
    drafted = [step.propose_seconds == 10 for _, step in steps]
    assert sum(drafted) == calls["propose"]
    for nodes, step in steps:
        assert (step.rows, step.forward_nodes, step.verify_seconds) == (1, nodes, 1.0)
    guard = decoder._auto_budget.guard
    window = guard.window
    assert all(drafted[:window]) and not any(drafted[window: window + guard.probe_every])  # stopped
    assert all(drafted[window + guard.probe_every: window + guard.probe_every + guard.probe_steps])  # a probe
    assert guard.pauses == 1 and guard.paused
    learnt = decoder._learnt_cost
    # its plain steps: one second each (the drafted steps, their head priced off, cost less here, so
    # the refit curve, never cheaper for more rows, pools them: plain's own bucket says one second)
    assert learnt.predicted(0) * math.exp(learnt.log_ratios()[0]) == pytest.approx(1.0)
    assert (np.diff(learnt.table(64)) >= 0).all()


def test_requests_join_a_running_engine_and_a_finished_one_leaves_at_the_next_step(monkeypatch, llama):
    """An Engine serves requests as they come: rows added after it has stepped join the running
    batch, a row finished from outside (cancelled) leaves it at the next step, and every other row
    still equals model.generate on its own."""
    import refdec.engine.engine as engine_module

    prompts = repetitive_prompts(3, seed=21)
    log = []

    def staggered(backend, requests, **settings):
        engine = engine_module.Engine(backend, **settings)
        engine.add(requests[:1])
        for _ in range(3):
            engine.step()
        log.append(len(engine.batch))  # the first row alone, decoding
        engine.add(requests[1:])
        engine.step()  # the others join
        log.append(len(engine.batch))
        engine.step()
        requests[1].finish("cancelled")
        engine.step()
        log.append(len(engine.batch))  # the cancelled row has left
        while engine:
            engine.step()
        return engine.stats

    monkeypatch.setattr(engine_module, "run", staggered)
    decoder = refdec.SpeculativeDecoder(llama)
    out = decoder.generate(prompts, max_new_tokens=NEW, max_draft_tokens=8, pad_token_id=0)
    assert log == [1, 3, 2]
    for b in (0, 2):
        assert batch_row(out, b, len(prompts[b])) == hf_greedy(llama, prompts[b]), b
    assert out.stats.rows[1].stop_reason == "cancelled"
    cut = batch_row(out, 1, len(prompts[1]))
    assert len(cut) < len(prompts[1]) + NEW and cut == hf_greedy(llama, prompts[1])[:len(cut)]


def test_a_long_prompt_joining_is_prefilled_a_chunk_per_step_while_the_rows_decode(monkeypatch, llama):
    """A prompt of 9 chunks joins a running row: each engine step runs one chunk of its prefill and
    one step of the running row, so the row makes 8 passes before the joiner's first token; a
    group cancelled while it is prefilled stops there (the rest of its chunks never run); both rows
    still equal model.generate."""
    import refdec.engine.engine as engine_module

    short = repetitive_prompts(1, seed=3)[0]
    long = (repetitive_prompts(1, seed=4)[0] * 10)[:70]  # 9 chunks of 8
    log = {}

    def staggered(backend, requests, **settings):
        engine = engine_module.Engine(backend, **settings)
        engine.add(requests[:1])
        while len(requests[0].seq) == requests[0].prompt_len:
            engine.step()  # the first row's prefill
        engine.add(requests[1:])
        passes = requests[0].stats.forward_passes
        while len(requests[1].seq) == requests[1].prompt_len:
            engine.step()
        log["passes_while_joining"] = requests[0].stats.forward_passes - passes
        while engine:
            engine.step()
        cancelled = requests[1].__class__(9, requests[1].prompt, 4, None, stats=type(requests[1].stats)(),
                                          sampler=requests[1].sampler, stopper=requests[1].stopper, drafter=None,
                                          budget=None, started=0.0)
        engine.add([cancelled])
        engine.step()  # its first chunk
        cancelled.finish("cancelled")
        forwards = counted[0]
        engine.step()  # stopped here
        log["abandoned"] = (engine.joining is None, counted[0] - forwards, bool(engine))
        return engine.stats

    counted = [0]
    hook = llama.get_input_embeddings().register_forward_hook(lambda *_: counted.__setitem__(0, counted[0] + 1))
    monkeypatch.setattr(engine_module, "run", staggered)
    decoder = refdec.SpeculativeDecoder(llama, prefill_chunk=8, prefix_cache=0)
    try:
        out = decoder.generate([short, long], max_new_tokens=NEW, max_draft_tokens=8, pad_token_id=0,
                               eos_token_id=[])
    finally:
        hook.remove()
    assert log["passes_while_joining"] == 9  # one per chunk
    assert log["abandoned"] == (True, 0, False)
    assert batch_row(out, 0, len(short)) == hf_greedy(llama, short)
    assert batch_row(out, 1, len(long)) == hf_greedy(llama, long)
