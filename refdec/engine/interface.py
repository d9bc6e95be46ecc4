"""What the engine asks of an inference backend, documented once.

The loop (refdec.engine.engine) is written once and drives a :class:`Backend`; each backend
package implements it: refdec.transformers.backend.TransformersBackend (a tree attention mask over
refdec's own KV cache) and refdec.llama_cpp.backend.LlamaCppBackend (one ``llama_decode`` whose
entries carry sequence ids). vLLM verifies with its own loop; refdec only drafts there
(refdec.vllm).

A step's contract, per batch row ``b``: the backend verifies ``[root] + tree`` (the root is the
row's last token, at position ``root_pos[b]``; node ``i`` at ``root_pos[b] + depths[i]``, seeing
its ancestors), chooses the *target* token after each row it visits by the row's
:data:`TargetRule`, and returns each row's acceptance walk (:class:`Verified`). Its batch then
keeps, per row, the root and the accepted nodes' cache entries (:meth:`RunningBatch.keep_accepted`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generator, Protocol

import numpy as np
import torch

from refdec.drafting.tree import DraftTree
from refdec.engine.processors import path_tokens
from refdec.engine.requests import Request
from refdec.engine.sampling import TargetSampler
from refdec.sizing.cost_curve import CostCurve

__all__ = ["Backend", "PrefillCancelled", "PrefillSteps", "RunningBatch", "SampledRule", "TargetRule", "Verified",
           "run_steps", "target_rule"]

# (logits_row float [V], tree row, depth below the root) -> the target token
TargetRule = Callable[[torch.Tensor, int, int], int]
# a prefill, one forward per next(); returns (the group's running batch, float [G, V] last logits)
PrefillSteps = Generator[None, None, tuple["RunningBatch", torch.Tensor]]


class PrefillCancelled(Exception):
    """A backend stopped a prefill's forward part-way because every request of its group was
    cancelled (``request.cancel_requested`` or done); it released what the group had taken."""


def run_steps(steps: Generator):
    """Runs ``steps`` (a generator such as :data:`PrefillSteps`) to its end; returns its value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


@dataclass
class Verified:
    """What a verification step gives.

    ``walks[b] = (accepted_nodes int64 [k_b], bonus token)``: row b's accepted tree nodes,
    root to leaf, and the target token after the last one (the root's when none is accepted);
    ``head_rows[b]``: the tree rows the LM head ran on for row b; ``forward_seconds``: the
    forward's and the head's time (the walks' own time is not counted); ``prepare_seconds``: the
    time spent laying the trees out as the forward's inputs; ``lazy_head_seconds``: the lazy
    head's part of ``forward_seconds`` (0 when the forward computes every row's target)."""

    walks: list[tuple[np.ndarray, int]]
    head_rows: list[int]
    forward_seconds: float
    prepare_seconds: float = 0.0
    lazy_head_seconds: float = 0.0


class SampledRule:
    """The target rule of a row sampled without logits settings: ``sampler.sample`` of the row's
    logits at its absolute position (``root_pos + 1 + depth``). A backend may sample such rows
    all at once instead (refdec.transformers.verify.device_choice), with the same tokens."""

    def __init__(self, sampler: TargetSampler, root_pos: int) -> None:
        self.sampler = sampler
        self.root_pos = root_pos

    def __call__(self, logits_row: torch.Tensor, row: int, depth: int) -> int:
        return self.sampler.sample(logits_row, self.root_pos + 1 + depth)


def target_rule(request: Request, tree: DraftTree) -> TargetRule | None:
    """The target rule of one row this step: None for plain greedy (the backend takes the argmax
    of every row at once); a :class:`SampledRule` for plain sampling; with logits settings
    (``request.processor.active``) a rule that applies them to each row's logits with the sequence
    on the row's path, then picks greedily or samples (``request.sampler``)."""
    root_pos = request.root_pos
    processor = request.processor
    if processor.active:
        return lambda logits_row, row, depth: processor.target(
            logits_row, request.seq + path_tokens(tree, row), request.prompt_len, request.sampler,
            root_pos + 1 + depth)
    if request.sampler.do_sample:
        return SampledRule(request.sampler, root_pos)
    return None


class RunningBatch(Protocol):
    """The rows decoding together and their cache entries, as a backend keeps them."""

    requests: list[Request]  # the active rows, in batch order

    def __len__(self) -> int: ...

    def join(self, other: "RunningBatch") -> None:
        """Appends the rows of ``other`` (a group the backend prefilled on its own)."""

    def keep_accepted(self, root_pos: np.ndarray, accepted_rows: list[np.ndarray]) -> None:
        """After a step: row b keeps its root (at ``root_pos[b]``, int64 [B]) and the tree nodes
        ``accepted_rows[b]`` (int64 [k_b], root to leaf) in its cache; the other nodes go."""

    def drop_finished(self) -> None:
        """Removes the rows whose request is done, with their cache entries."""


class Backend(Protocol):
    """An inference engine as the loop drives it."""

    vocab_size: int  # token ids >= this are never fed to the model (drafts are cut there)
    max_positions: int | None  # the model's position limit (None: none known)
    device: torch.device  # where the sampling keys and the returned sequences live
    tokenizer: object | None  # the model's own tokenizer when it brings one (llama.cpp), else None
    generation_config: object | None  # transformers' GenerationConfig (eos, pad, logits settings) or None
    packed_rows: bool  # a forward of several rows costs their entries' sum (True) or is padded to the longest tree
    row_limit: int | None  # the most rows it holds at once (None: no limit of its own; llama.cpp's exact mode)

    def new_batch(self) -> RunningBatch:
        """An empty running batch."""

    def prefill_steps(self, group: list[Request], chunk: int | None) -> PrefillSteps:
        """The group's prompts into a new running batch, one forward (a chunk of at most ``chunk``
        tokens; None: the backend's own size) per ``next()``: the generator returns (StopIteration's
        value) the batch and float [G, V], the logits after each prompt's last token; closed before
        that, it releases what it took. A backend that keeps finished rows' entries (a prefix
        cache) sets ``request.stats.cached_prompt_tokens`` to the prompt tokens it did not feed. A
        backend that can stop a forward part-way does so when every request of the group is
        cancelled (``cancel_requested``, set from another thread) and raises
        :class:`PrefillCancelled`."""

    def clear_prefix_cache(self) -> None:
        """Frees the finished rows' entries the backend keeps for later prompts (its prefix cache),
        so that the next prompt is prefilled from its first token."""

    def fit_tree(self, tree: DraftTree, rows: int) -> DraftTree:
        """The prefix of ``tree`` this backend verifies in one step when ``rows`` rows decode
        together (the tree itself where it has no limit)."""

    def verify(self, batch: RunningBatch, trees: list[DraftTree], roots: np.ndarray, root_pos: np.ndarray,
               rules: list[TargetRule | None]) -> Verified:
        """ONE forward over every row's ``[root] + trees[b]`` (``roots`` int64 [B] the rows' last
        tokens, ``root_pos`` int64 [B] their positions) and each row's acceptance walk with
        ``rules[b]`` (None: greedy)."""

    def auto_cost_curve(self) -> CostCurve:
        """This engine's measured seconds per step by tree size, for ``max_draft_tokens="auto"``
        (measured once per model and machine, then cached)."""
