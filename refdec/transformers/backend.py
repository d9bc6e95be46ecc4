"""The transformers backend of the engine (refdec.engine.interface.Backend): a batch of draft
trees verified in one forward with a tree attention mask over refdec's own KV cache.

Its settings, beyond the interface: ``lazy_head`` (the LM head runs only on the tree rows the
acceptance walks visit; default on a CPU for a plain-head model, refdec.transformers.lazy_head)
and ``static_shapes`` (verification forwards at fixed shapes, refdec.transformers.static_step;
``cuda_graphs=True`` sets it and replays each shape as a CUDA graph).
"""

from __future__ import annotations

import numpy as np

from refdec.cost_curve import CostCurve
from refdec.engine.interface import TargetRule, Verified
from refdec.transformers.batch import RunningBatch
from refdec.transformers.calibration import auto_cost_curve
from refdec.transformers.prefill import prefill
from refdec.transformers.runner import ModelRunner
from refdec.transformers.selfcheck import ensure_lossless_tree_verification
from refdec.transformers.static_step import StaticStep
from refdec.transformers.verify import verify_step
from refdec.tree import DraftTree

__all__ = ["TransformersBackend"]


class TransformersBackend:
    """A transformers model through :class:`~refdec.transformers.runner.ModelRunner`. Made for a
    model type refdec has not verified, it first checks that tree verification is lossless for it
    (refdec.transformers.selfcheck; once per model object, a ValueError if not).
    ``cuda_graphs``: fixed-shape verification forwards, each captured once as a CUDA graph."""

    tokenizer = None  # a transformers model brings none: the caller passes its tokenizer

    def __init__(self, model, *, cuda_graphs: bool = False) -> None:
        if not isinstance(cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be True or False, got {cuda_graphs!r}")
        self.model = model
        self.runner = ModelRunner(model)
        ensure_lossless_tree_verification(self.runner)  # a model type refdec has not verified: checked once
        self.vocab_size = self.runner.vocab_size
        self.max_positions = self.runner.max_positions
        self.device = self.runner.device
        self.generation_config = getattr(model, "generation_config", None)
        if cuda_graphs:
            self._set_static_step(cuda_graphs=True)

    # -- settings

    @property
    def lazy_head(self) -> bool:
        """Whether the LM head runs only on the rows the walks visit (refdec.transformers.lazy_head)."""
        return self.runner.lazy_head

    @lazy_head.setter
    def lazy_head(self, value: bool) -> None:
        if value and self.runner.static_step is not None:
            raise ValueError("lazy_head=True does not go with fixed-shape steps (static_shapes / cuda_graphs): "
                             "those run the head on every row")
        self.runner.lazy_head = bool(value)

    @property
    def static_shapes(self) -> bool:
        """Whether verification forwards run at fixed shapes (refdec.transformers.static_step): set by
        ``cuda_graphs=True`` (and then replayed as CUDA graphs); settable on any device, without
        graphs, to run the same fixed-shape forwards eagerly (the head then runs on every row)."""
        return self.runner.static_step is not None

    @static_shapes.setter
    def static_shapes(self, value: bool) -> None:
        if not value:
            self.runner.static_step = None
        elif self.runner.static_step is None:
            self._set_static_step(cuda_graphs=False)

    def _set_static_step(self, cuda_graphs: bool) -> None:
        self.runner.static_step = StaticStep(self.runner.device, self.runner.mask_spec, cuda_graphs=cuda_graphs)
        self.runner.lazy_head = False

    # -- the engine's calls

    def new_batch(self) -> RunningBatch:
        return RunningBatch.empty(self.device)

    def prefill(self, group: list, chunk: int | None):
        return prefill(self.runner, group, chunk)

    def fit_tree(self, tree: DraftTree, rows: int) -> DraftTree:
        return tree

    def verify(self, batch: RunningBatch, trees: list[DraftTree], roots: np.ndarray, root_pos: np.ndarray,
               rules: list[TargetRule | None]) -> Verified:
        """With the lazy head (a CPU) the inputs are built on the host; else on the device, and
        greedy and plain sampling verify there too (refdec.transformers.verify.verify_step)."""
        return verify_step(self.runner, batch, trees, roots, root_pos, rules)

    def auto_cost_curve(self) -> CostCurve:
        return auto_cost_curve(self.model)
