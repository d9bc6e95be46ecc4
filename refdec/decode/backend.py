"""What differs per inference engine: how a batch of draft trees is verified and the cache kept.

The decoding loop (refdec.decode.engine) is written once; it drives a :class:`Backend`:

* ``new_batch()`` -- an empty running batch (``requests``, ``join``, ``drop_finished``,
  ``keep_accepted(root_pos, accepted_rows)``; see refdec.decode.batch.RunningBatch);
* ``prefill(group, chunk)`` -- the group's prompts into a new running batch, and float [G, V]
  (a torch tensor) the logits after each prompt's last token;
* ``fit_tree(tree, capacity)`` -- the draft as this engine can verify it (a prefix of it) when
  ``capacity`` rows decode together;
* ``verify(batch, trees, roots, root_pos, rules, node_probs)`` -- ONE forward over every row's
  ``[root] + tree`` and each row's acceptance walk (refdec.decode.verify.Verified);
* ``auto_cost_curve()`` -- this engine's measured cost per tree size, for ``"auto"``;
* ``uses_node_probs`` -- whether ``verify`` reads ``node_probs`` (each node's estimated
  probability of acceptance; else None is passed), and ``observe_step(seconds, tokens)``
  after each step (its wall time, the tokens a row emitted on average).

:class:`TransformersBackend` runs a transformers model (a tree attention mask over refdec's
own KV cache); refdec.llama_cpp.backend.LlamaCppBackend runs a ``llama_cpp.Llama`` (one
``llama_decode`` whose entries carry sequence ids).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from refdec.calibration import auto_cost_curve
from refdec.decode.batch import RunningBatch
from refdec.decode.prefill import prefill
from refdec.decode.runner import ModelRunner
from refdec.decode.selfcheck import ensure_lossless_tree_verification
from refdec.decode.verify import Verified, verify_step
from refdec.tree import DraftTree

__all__ = ["Backend", "TransformersBackend"]


class Backend(Protocol):
    vocab_size: int
    max_positions: int | None
    device: object
    uses_node_probs: bool

    def new_batch(self): ...

    def prefill(self, group: list, chunk: int | None): ...

    def fit_tree(self, tree: DraftTree, capacity: int) -> DraftTree: ...

    def verify(self, batch, trees: list[DraftTree], roots: np.ndarray, root_pos: np.ndarray, rules: list,
               node_probs: list | None) -> Verified: ...

    def auto_cost_curve(self): ...

    def observe_step(self, seconds: float, tokens_per_row: float) -> None: ...


class TransformersBackend:
    """A transformers model through :class:`~refdec.decode.runner.ModelRunner`. Made for a model type
    refdec has not verified, it first checks that tree verification is lossless for it
    (refdec.decode.selfcheck; once per model object, a ValueError if not)."""

    uses_node_probs = False

    def __init__(self, model) -> None:
        self.model = model
        self.runner = ModelRunner(model)
        ensure_lossless_tree_verification(self.runner)  # a model type refdec has not verified: checked once
        self.vocab_size = self.runner.vocab_size
        self.max_positions = self.runner.max_positions
        self.device = self.runner.device
        self.generation_config = getattr(model, "generation_config", None)

    def new_batch(self) -> RunningBatch:
        return RunningBatch.empty(self.device)

    def prefill(self, group: list, chunk: int | None):
        return prefill(self.runner, group, chunk)

    def fit_tree(self, tree: DraftTree, capacity: int) -> DraftTree:
        return tree

    def verify(self, batch: RunningBatch, trees: list[DraftTree], roots: np.ndarray, root_pos: np.ndarray,
               rules: list, node_probs: list | None) -> Verified:
        """``roots`` int64 [B] each row's last token, ``root_pos`` int64 [B] its position;
        ``node_probs`` is not used (every row's logits come from the forward or the lazy head).
        With the lazy head (a CPU) the inputs are built on the host; else on the device, and greedy
        and plain sampling verify there too (refdec.decode.verify.verify_step)."""
        return verify_step(self.runner, batch, trees, roots, root_pos, rules)

    def auto_cost_curve(self):
        return auto_cost_curve(self.model)

    def observe_step(self, seconds: float, tokens_per_row: float) -> None:
        pass
