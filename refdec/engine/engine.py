"""The decoding loop: propose → verify → accept, for a batch of requests (one request is a
batch of one), on any engine: a backend (refdec.engine.interface; transformers in
refdec.transformers.backend, llama.cpp in refdec.llama_cpp.backend) verifies the trees and
keeps the cache; drafting, budgets, walks and stops are the same for all.

Invariant between steps, per row: the KV cache holds every token of the row's
sequence but the last one, the *root*; the root's position equals the row's cache
length. A step:

1. **propose** — each row's drafter drafts a tree of the size its budget chooses
   (refdec.engine.drafts), cut to what the backend verifies at once (``fit_tree``); the
   budgets pick the prefixes to verify, the rows of a batch together
   (refdec.sizing.budget.Budget.select_batch);
2. **prepare** — the backend lays the trees out as one forward's inputs: ``[root] + nodes``
   per row at positions ``root_pos + depth``, each node seeing its ancestors (a tree mask,
   refdec.transformers.masks; llama.cpp: sequence ids);
3. **verify** — ONE forward for all rows, then each row's acceptance walk picks the
   target token of the rows it visits (its target rule, refdec.engine.interface);
4. **accept** — each row emits its accepted tokens plus the bonus token (stops and
   limits honoured, refdec.engine.requests), its budget and drafter learn what was accepted, the
   budgets learn what the step cost (``observe_step``: the curve refit, drafting stopped where it
   does not pay), the cache keeps the root and accepted nodes of each row (``keep_accepted``) and
   finished rows leave.

Before its first step a request is prefilled with the group it joins in
(``backend.prefill_steps``, refdec.engine.scheduler); the prefill yields its first token. The
prefill runs one forward (a chunk) per engine step, each followed by a step of the rows already
decoding, so a long prompt joining does not stall them; a group whose requests are all finished
from outside (cancelled) stops at the next chunk and releases what it took.
Times (``DecodingStats``): ``prefill``, ``propose`` (1), ``prepare`` (2), ``forward``
(the forward and the LM head of the visited rows), ``accept`` (the walks, step 4,
joining the batch).
"""

from __future__ import annotations

import time

import numpy as np

from refdec.drafting.tree import DraftTree
from refdec.engine.drafts import draft_for_step
from refdec.engine.interface import Backend, PrefillCancelled, PrefillSteps, RunningBatch, target_rule
from refdec.engine.requests import Request
from refdec.engine.results import DecodingStats
from refdec.engine.scheduler import Scheduler
from refdec.sizing.budget import Budget, StepTime

__all__ = ["Engine", "run"]


class Engine:
    """The loop's state between steps: the backend's running batch, the waiting requests and the
    batch's stats. Requests may be added while it runs (:meth:`add`: they join the running batch
    at the next step, as rows leave room) and finished from outside (``request.finish(reason)``,
    a cancelled request: it leaves the batch, with its cache entries, at the next step), so one
    engine can serve requests as they come.

    Each request brings its own settings (sampling, logits settings, stops, limits: its
    ``sampler``, ``processor`` and ``stopper``), so rows of one batch may differ in all of them.

    ``capacity``: the most rows decoding together (and at most the backend's ``row_limit``, where it
    has one: the others wait, as past the capacity); ``joint_budget``: the rows' verified prefixes
    are chosen together (else each row's budget selects alone). ``backend``: what verifies the
    trees and keeps the cache (refdec.engine.interface.Backend)."""

    def __init__(self, backend: Backend, *, capacity: int, prefill_chunk: int | None, max_depth: int,
                 joint_budget: bool = True) -> None:
        self.backend = backend
        limit = getattr(backend, "row_limit", None)
        self.capacity = capacity if limit is None else min(capacity, limit)
        self.prefill_chunk = prefill_chunk
        self.max_depth = max_depth
        self.joint_budget = joint_budget
        self.stats = DecodingStats()
        self.scheduler = Scheduler([], self.capacity)
        self.batch = backend.new_batch()
        self.joining: _Joining | None = None  # the group being prefilled, a chunk per step

    def add(self, requests: list[Request]) -> None:
        """Queues ``requests`` (those not already done), in order, after the waiting ones."""
        self.scheduler.extend(request for request in requests if not request.done)

    def __bool__(self) -> bool:
        """Whether rows decode, a group is prefilled or requests wait."""
        return bool(len(self.batch) or self.joining is not None or self.scheduler)

    def step(self) -> None:
        """One step: rows finished from outside leave; a waiting group starts its prefill if there
        is room and none is under way; the prefill under way runs one forward (after its last,
        each request's first token is emitted and the group joins the batch); then the running
        rows make one propose -> verify -> accept step."""
        self.batch.drop_finished()
        if self.joining is None:
            group = self.scheduler.next_group(len(self.batch))
            if group:
                self.joining = _Joining(group, self.backend.prefill_steps(group, self.prefill_chunk))
        if self.joining is not None:
            decoding = len(self.batch)
            joined = self.joining.advance(self.stats)
            if joined is not None or self.joining.abandoned:
                self.joining = None
            if joined is not None:
                t0 = time.perf_counter()
                joined.drop_finished()
                self.batch.join(joined)
                self.stats.accept_seconds += time.perf_counter() - t0  # joining is bookkeeping
            if not decoding:
                return
        if len(self.batch):
            _step(self.backend, self.batch, self.stats, self.max_depth, self.joint_budget)

    def close(self) -> None:
        """Stops a prefill under way (its backend releases what it took)."""
        if self.joining is not None:
            self.joining.steps.close()
            self.joining = None


def run(backend: Backend, requests: list[Request], **settings) -> DecodingStats:
    """Decodes ``requests`` (those not already done) to the end with an :class:`Engine` made with
    ``settings``; returns the batch's stats (each request fills its own)."""
    engine = Engine(backend, **settings)
    engine.add(requests)
    try:
        while engine:
            engine.step()
    finally:
        engine.close()
    return engine.stats


class _Joining:
    """A group being prefilled: ``steps`` the backend's prefill (refdec.engine.interface.PrefillSteps),
    ``seconds`` the time its forwards took so far."""

    def __init__(self, group: list[Request], steps: PrefillSteps) -> None:
        self.group = group
        self.steps = steps
        self.seconds = 0.0
        self.abandoned = False  # every request finished from outside: the prefill was stopped

    def advance(self, stats: DecodingStats) -> RunningBatch | None:
        """One forward of the prefill; after the last, each request's first token (by its own
        logits settings and sampler) is emitted and the group's batch returned."""
        if all(request.done for request in self.group):
            self.steps.close()
            self.abandoned = True
            return None
        t0 = time.perf_counter()
        try:
            next(self.steps)
        except PrefillCancelled:  # every request was cancelled during the forward: the backend stopped it
            stats.prefill_seconds += time.perf_counter() - t0
            self.abandoned = True
            return None
        except StopIteration as done:
            batch, last = done.value  # last: [G, V]
        else:
            self.seconds += time.perf_counter() - t0
            stats.prefill_seconds += time.perf_counter() - t0
            return None
        firsts = []
        for i, request in enumerate(self.group):
            logits = last[i]
            if request.processor.active:
                logits = request.processor(logits, request.seq, request.prompt_len)
            firsts.append(request.sampler.sample(logits, request.prompt_len) if request.sampler.do_sample
                          else int(logits.argmax()))
        t1 = time.perf_counter()
        self.seconds += t1 - t0
        stats.prefill_seconds += t1 - t0
        stats.count_pass(0)
        for request, first in zip(self.group, firsts):
            request.stats.prefill_seconds = self.seconds  # its group's prefill
            stats.cached_prompt_tokens += request.stats.cached_prompt_tokens
            request.stats.count_pass(0)
            if not request.done:  # one finished from outside while its group was prefilled emits nothing
                request.emit([int(first)])
        stats.accept_seconds += time.perf_counter() - t1
        return batch


def _select(budgets: list[Budget], trees: list[DraftTree], joint: bool, packed: bool) -> list[DraftTree]:
    """The prefixes to verify: chosen together by the budgets' policy (``packed``: the backend
    packs the rows of a forward, pads none), or each row alone."""
    if joint:
        return type(budgets[0]).select_batch(budgets, trees, packed=packed)
    return [budget.select(tree) for budget, tree in zip(budgets, trees)]


def _step(backend: Backend, batch: RunningBatch, stats: DecodingStats, max_depth: int, joint_budget: bool) -> None:
    requests = batch.requests
    rows = len(requests)  # the trees share the step: each row's is fitted to the rows decoding now
    # -- 1. propose
    t0 = time.perf_counter()
    trees = [DraftTree.empty() if request.drafter is None else
             backend.fit_tree(draft_for_step(request.drafter, request.budget, request.room - 1, max_depth,
                                             backend.vocab_size), rows)
             for request in requests]
    drafted = [b for b, request in enumerate(requests) if request.drafter is not None]
    if drafted:
        selected = _select([requests[b].budget for b in drafted], [trees[b] for b in drafted], joint_budget,
                           backend.packed_rows)
        for b, tree in zip(drafted, selected):
            trees[b] = tree
    t1 = time.perf_counter()
    # -- 2. prepare and 3. verify (the backend lays the trees out as its forward's inputs)
    root_pos = np.array([request.root_pos for request in requests], dtype=np.int64)
    roots = np.array([request.seq[-1] for request in requests], dtype=np.int64)
    rules = [target_rule(request, tree) for request, tree in zip(requests, trees)]
    verified = backend.verify(batch, trees, roots, root_pos, rules)
    t2 = t1 + verified.prepare_seconds
    # -- 4. accept
    accepted_rows = []
    for b, (request, tree, (accepted, bonus), head_rows) in enumerate(
            zip(requests, trees, verified.walks, verified.head_rows)):
        emitted = tree.token_ids[accepted].tolist() + [bonus]
        accepted_rows.append(accepted)
        request.stats.head_rows += head_rows
        stats.head_rows += head_rows
        request.stats.count_pass(int(accepted.shape[0]))
        request.stats.count_draft(tree, accepted)
        stats.count_draft(tree, accepted)
        if request.drafter is not None and len(tree):
            request.budget.observe(tree, accepted)
        request.emit(emitted)
        if request.done:  # no entry past the last token it kept: a hybrid's state must be that token's
            accepted_rows[-1] = accepted[:max(0, len(request.seq) - 2 - int(root_pos[b]))]
    stats.count_pass(int(max(accepted.shape[0] for accepted, _ in verified.walks)))
    if drafted:  # the budgets learn what the step cost (refdec.sizing.budget.StepTime)
        entries = (sum(1 + len(tree) for tree in trees) if backend.packed_rows
                   else len(trees) * (1 + max(len(tree) for tree in trees)))  # padded to the longest tree
        timing = StepTime(len(trees), entries - 1, t1 - t0, verified.prepare_seconds + verified.forward_seconds)
        kinds: dict[type, list[int]] = {}  # rows may bring budgets of different kinds: each its own
        for b in drafted:
            kinds.setdefault(type(requests[b].budget), []).append(b)
        for kind, rows_of_kind in kinds.items():
            kind.observe_step([requests[b].budget for b in rows_of_kind], [trees[b] for b in rows_of_kind],
                              [accepted_rows[b] for b in rows_of_kind], timing)
    batch.keep_accepted(root_pos, accepted_rows)
    batch.drop_finished()
    t4 = time.perf_counter()
    stats.propose_seconds += t1 - t0
    stats.prepare_seconds += t2 - t1
    stats.forward_seconds += verified.forward_seconds
    stats.accept_seconds += t4 - t2 - verified.forward_seconds
