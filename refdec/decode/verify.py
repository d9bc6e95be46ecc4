"""One verification forward over a batch of draft trees, and each row's acceptance walk.

The target token at a tree row (the token the model emits after it) is chosen by
one of three rules, the same for every row of a call:

* greedy: the argmax of the row's logits;
* sampled: a draw keyed by the output position (refdec.decode.sampling);
* processed: either, after the logits settings of ``model.generate``, applied with
  the sequence on the row's path (refdec.decode.processors).

With a lazy head (refdec.decode.head) the forward runs the backbone over every
row and the walks, in lock-step, ask the head for the rows they visit (one head
GEMM per round for all batch rows); otherwise every row's target is computed:
for plain greedy on the device, with the walks there too and one host sync per step
(:func:`verify_greedy_on_device`), else from the model's own forward's logits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from refdec.decode.accept import accept_walk, accept_walk_lazy, accept_walks_on_device, walks_from_device
from refdec.decode.head import LockstepLazyWalks
from refdec.decode.masks import DeviceTrees, TreeInputs
from refdec.decode.processors import PathLogitsProcessor, path_tokens
from refdec.decode.requests import Request
from refdec.decode.runner import ModelRunner
from refdec.tree import DraftTree

__all__ = ["Verified", "target_rule", "verify_greedy_on_device", "verify_trees"]

# (logits_row float [V], tree row, depth below the root) -> the target token
TargetRule = Callable[[torch.Tensor, int, int], int]


@dataclass
class Verified:
    """What a verification step gives: ``walks[b] = (accepted_nodes int64 [k_b], bonus token)`` (bonus
    -1: the last accepted node has no logits, so no token follows it this step: it is the row's next
    root, and the cache keeps the nodes before it; refdec.llama_cpp.backend),
    ``head_rows[b]`` the tree rows the LM head ran on for row b, ``forward_seconds`` the
    backbone's and the head's time (the walks' own time is not counted), ``prepare_seconds`` the
    time spent laying the trees out as the forward's inputs."""

    walks: list[tuple[np.ndarray, int]]
    head_rows: list[int]
    forward_seconds: float
    prepare_seconds: float = 0.0


def target_rule(request: Request, tree: DraftTree, processor: PathLogitsProcessor,
                do_sample: bool) -> TargetRule | None:
    """The target rule of one row this step; None for plain greedy (an argmax of every row at once)."""
    root_pos = request.root_pos
    if processor.active:  # each row's logits with the sequence on its path
        return lambda logits_row, row, depth: processor.target(
            logits_row, request.seq + path_tokens(tree, row), request.prompt_len, request.sampler,
            root_pos + 1 + depth)
    if do_sample:
        return lambda logits_row, row, depth: request.sampler.sample(logits_row, root_pos + 1 + depth)
    return None


def verify_trees(runner: ModelRunner, cache, inputs: TreeInputs, trees: list[DraftTree],
                 rules: list[TargetRule | None]) -> Verified:
    """Runs the forward over ``inputs`` (refdec.decode.masks.tree_step_inputs of ``trees``) and
    every row's walk with its target rule (``rules[b]``, None = greedy)."""
    t0 = time.perf_counter()
    kwargs = dict(input_ids=inputs.input_ids, position_ids=inputs.position_ids, attention_mask=inputs.attention_mask)
    if runner.uses_lazy_head:
        hidden = runner.hidden(cache, **kwargs)  # [B, T, D]
        forward_seconds = time.perf_counter() - t0
        walks = LockstepLazyWalks(trees, hidden, runner.head)

        def target(b: int, row: int, depth: int) -> int:
            rule = rules[b]
            return walks.lazy[b].argmax(row) if rule is None else rule(walks.lazy[b].row_logits(row), row, depth)

        results = walks.run(target)
        return Verified(results, [lazy.rows_computed for lazy in walks.lazy], forward_seconds + walks.seconds)
    logits = runner.logits(cache, **kwargs)  # [B, T, V]
    targets = logits.argmax(dim=-1).cpu().numpy() if None in rules else None  # the one host sync
    forward_seconds = time.perf_counter() - t0
    results = []
    for b, (tree, rule) in enumerate(zip(trees, rules)):
        if rule is None:
            results.append(accept_walk(tree, targets[b, : 1 + len(tree)]))
        else:
            results.append(accept_walk_lazy(tree, lambda row, depth, b=b, rule=rule: rule(logits[b, row], row, depth)))
    return Verified(results, [logits.shape[1]] * len(trees), forward_seconds)


def verify_greedy_on_device(runner: ModelRunner, cache, inputs: TreeInputs, trees: DeviceTrees) -> Verified:
    """Plain greedy with every row's target: the forward over ``inputs`` and ``trees``
    (refdec.decode.masks.device_tree_inputs), the argmax of every row
    (:meth:`ModelRunner.greedy_targets`, the head in row chunks) and the walks
    (refdec.decode.accept.accept_walks_on_device) run on the device; their result, a few ints
    per row, comes to the host in the step's one host sync."""
    t0 = time.perf_counter()
    targets = runner.greedy_targets(cache, input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                                     attention_mask=inputs.attention_mask)  # [B, T]
    result = accept_walks_on_device(trees.token_rows, trees.parent_rows, trees.ancestors, trees.depth, targets)
    walks = walks_from_device(result.cpu().numpy())  # the one host sync
    batch, t = targets.shape
    return Verified(walks, [t] * batch, time.perf_counter() - t0)
