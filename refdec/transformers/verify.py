"""One verification forward over a batch of draft trees, and each row's acceptance walk.

The target token at a tree row (the token the model emits after it) is chosen by
one of three rules, the same for every row of a call:

* greedy: the argmax of the row's logits;
* sampled: a draw keyed by the output position (refdec.engine.sampling);
* processed: either, after the logits settings of ``model.generate``, applied with
  the sequence on the row's path (refdec.engine.processors).

With a lazy head (refdec.transformers.lazy_head) the forward runs the backbone over every
row and the walks, in lock-step, ask the head for the rows they visit (one head
GEMM per round for all batch rows); otherwise every row's target is computed:
for plain greedy and for sampling (temperature, top-k, top-p, min-p) without logits
settings on the device, with the walks there too and one host sync per step
(:func:`verify_on_device`), else (logits settings) the walks on the host ask the rules, the head
running on the rows they visit as with a lazy head (a model without a plain head: its own
forward's logits of every row).

:func:`verify_step` is a step of the transformers engine (refdec.transformers.backend), its inputs laid
out by :func:`step_inputs`; the calibration (refdec.transformers.calibration) times it and the self-check
(refdec.transformers.selfcheck) feeds the model the same inputs.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from refdec.drafting.tree import DraftTree
from refdec.engine.accept import accept_walk, accept_walk_lazy, accept_walks_on_device, walks_from_device
from refdec.engine.interface import SampledRule, TargetRule, Verified
from refdec.engine.sampling import position_keys, seed_key
from refdec.transformers.batch import RunningBatch
from refdec.transformers.hybrid.paths import tree_paths
from refdec.transformers.lazy_head import LockstepLazyWalks
from refdec.transformers.masks import DeviceTrees, TreeInputs, device_tree_inputs, tree_step_inputs
from refdec.transformers.runner import ModelRunner
from refdec.transformers.transfer import to_device

__all__ = ["device_choice", "step_inputs", "verify_on_device", "verify_step", "verify_trees"]


def step_inputs(runner: ModelRunner, batch: RunningBatch, trees: list[DraftTree], roots: np.ndarray,
                root_pos: np.ndarray) -> tuple[TreeInputs, DeviceTrees | None]:
    """The inputs of one verification forward over ``batch``'s cache, laid out as :func:`verify_step`
    lays them out for ``runner``: with the lazy head on the host (refdec.transformers.masks.tree_step_inputs;
    no DeviceTrees), else on the device (refdec.transformers.masks.device_tree_inputs). ``trees[b]``: row
    b's draft tree; ``roots`` int64 [B]: each row's last token; ``root_pos`` int64 [B]: its position."""
    if runner.uses_lazy_head:
        key_pos = batch.host_key_pos()
        inputs, on_device = tree_step_inputs(trees, roots, root_pos, key_pos >= 0, key_pos, runner.mask_spec,
                                             runner.device), None
    elif runner.static_step is not None:  # fixed shapes (refdec.transformers.static_step)
        inputs, on_device = runner.static_step.prepare(batch, trees, roots, root_pos)
    else:
        inputs, on_device = device_tree_inputs(trees, roots, root_pos, batch.key_pos, runner.mask_spec, runner.device)
    if runner.hybrid is not None:  # the recurrent layers read each row's path (refdec.transformers.hybrid)
        inputs.paths = tree_paths(trees, int(inputs.input_ids.shape[1]), runner.device)
    return inputs, on_device


def verify_step(runner: ModelRunner, batch: RunningBatch, trees: list[DraftTree], roots: np.ndarray,
                root_pos: np.ndarray, rules: list[TargetRule | None]) -> Verified:
    """One step's verification of ``trees`` (``roots``, ``root_pos`` as :func:`step_inputs`) over
    ``batch``'s cache, with each row's target rule (``rules[b]``, None = greedy): the inputs laid
    out (:func:`step_inputs`; their time is ``prepare_seconds``), then the forward and the walks --
    with the lazy head :func:`verify_trees`; else greedy and plain sampling on the device
    (:func:`verify_on_device`) and other rules by :func:`verify_trees` (the head on the rows the walks
    visit). The cache keeps the step's ``T`` rows per batch row after its ``S`` slots
    (refdec.transformers.batch.RunningBatch.keep_accepted keeps the accepted ones)."""
    t0 = time.perf_counter()
    inputs, on_device = step_inputs(runner, batch, trees, roots, root_pos)
    prepare_seconds = time.perf_counter() - t0
    choose = False if on_device is None else device_choice(rules, inputs.position_ids)
    if choose is not False:
        verified = verify_on_device(runner, batch.cache, inputs, on_device, choose)
    else:  # the walks on the host ask the rules: the head on the rows they visit, no [B, T, V] logits
        verified = verify_trees(runner, batch.cache, inputs, trees, rules)
    verified.prepare_seconds = prepare_seconds
    return verified


def verify_trees(runner: ModelRunner, cache, inputs: TreeInputs, trees: list[DraftTree],
                 rules: list[TargetRule | None]) -> Verified:
    """Runs the forward over ``inputs`` (refdec.transformers.masks.tree_step_inputs of ``trees``) and
    every row's walk with its target rule (``rules[b]``, None = greedy), on the host: a plain-head
    model's head runs on the rows the walks visit (lazily, whatever the device); another model's
    own forward computes every row's logits."""
    t0 = time.perf_counter()
    kwargs = inputs.model_kwargs()
    if runner.head is not None:
        hidden = runner.verify_forward(runner.hidden, cache, **kwargs)  # [B, T, D]
        forward_seconds = time.perf_counter() - t0
        walks = LockstepLazyWalks(trees, hidden, runner.head)

        def target(b: int, row: int, depth: int) -> int:
            rule = rules[b]
            return walks.lazy[b].argmax(row) if rule is None else rule(walks.lazy[b].row_logits(row), row, depth)

        results = walks.run(target)
        return Verified(results, [walk.rows_computed for walk in walks.lazy], forward_seconds + walks.seconds,
                        lazy_head_seconds=walks.seconds)
    logits = runner.verify_forward(runner.logits, cache, **kwargs)  # [B, T, V]
    targets = logits.argmax(dim=-1).cpu().numpy() if None in rules else None  # the one host sync
    forward_seconds = time.perf_counter() - t0
    results = []
    for b, (tree, rule) in enumerate(zip(trees, rules)):
        if rule is None:
            results.append(accept_walk(tree, targets[b, : 1 + len(tree)]))
        else:
            results.append(accept_walk_lazy(tree, lambda row, depth, b=b, rule=rule: rule(logits[b, row], row, depth)))
    return Verified(results, [logits.shape[1]] * len(trees), forward_seconds)


def device_choice(rules: list[TargetRule | None], position_ids: torch.Tensor):
    """How :meth:`ModelRunner.row_targets` chooses every row's target for these rows' rules without a
    host sync: None for the argmax (plain greedy), ``choose(logits, start)`` for rows all sampled
    by :class:`SampledRule` with one sampler's settings (temperature, top-k, top-p, min-p:
    :meth:`TargetSampler.sample_rows`); False otherwise (logits settings, rows whose settings
    differ, a mix: the walks on the host ask the rules). ``position_ids`` int64 [B, T] on the
    device: each row's position (a row's target is sampled at position + 1)."""
    if all(rule is None for rule in rules):
        return None
    if not all(isinstance(rule, SampledRule) and rule.sampler.samples_rows for rule in rules):
        return False
    sampler = rules[0].sampler
    if any(rule.sampler.settings != sampler.settings for rule in rules):
        return False
    seeds = to_device(np.array([seed_key(rule.sampler.seed) for rule in rules], dtype=np.int64),
                      position_ids.device)
    keys = position_keys(seeds[:, None], position_ids + 1).reshape(-1)  # [B * T]

    def choose(logits: torch.Tensor, start: int) -> torch.Tensor:
        return sampler.sample_rows(logits, keys[start:start + logits.shape[0]].to(logits.device, non_blocking=True))

    return choose


def verify_on_device(runner: ModelRunner, cache, inputs: TreeInputs, trees: DeviceTrees, choose=None) -> Verified:
    """Every row's target chosen on the device (``choose`` from :func:`device_choice`; None: the
    argmax) after the forward over ``inputs`` and ``trees`` (refdec.transformers.masks.device_tree_inputs),
    the head in row chunks (:meth:`ModelRunner.row_targets`), and the walks there too
    (refdec.engine.accept.accept_walks_on_device); their result, a few ints per row, comes to the
    host in the step's one host sync."""
    t0 = time.perf_counter()
    targets = runner.row_targets(cache, choose, **inputs.model_kwargs())  # [B, T], on the head's device
    # to the inputs' device (under device_map="auto" the first layer's, not the head's)
    targets = targets.to(trees.token_rows.device, non_blocking=True)
    result = accept_walks_on_device(trees.token_rows, trees.parent_rows, trees.ancestors, trees.depth, targets)
    walks = walks_from_device(result.cpu().numpy())  # the one host sync
    batch, t = targets.shape
    return Verified(walks, [t] * batch, time.perf_counter() - t0)
