"""The transformers backend of the engine (refdec.engine.interface.Backend): a batch of draft
trees verified in one forward with a tree attention mask over refdec's own KV cache.

Its settings, beyond the interface: ``lazy_head`` (the LM head runs only on the tree rows the
acceptance walks visit; default on a CPU for a plain-head model, refdec.transformers.lazy_head)
and ``static_shapes`` (verification forwards at fixed shapes, refdec.transformers.static_step;
``cuda_graphs=True`` sets it and replays each shape as a CUDA graph).

Finished rows' KV entries go to a prefix cache (refdec.engine.prefix_cache): a prompt that
begins with at least :data:`MIN_REUSED_TOKENS` of an entry's tokens is prefilled on top of them
(refdec.transformers.prefill.prefill_reusing), apart from the rest of its group. The entries are
copies (at most :data:`PREFIX_CACHE_BYTES` in all).
"""

from __future__ import annotations

import numpy as np
import torch

from refdec.drafting.tree import DraftTree
from refdec.engine.defaults import PREFIX_CACHE_ENTRIES
from refdec.engine.interface import TargetRule, Verified
from refdec.engine.prefix_cache import PrefixCache
from refdec.sizing.cost_curve import CostCurve
from refdec.transformers.batch import RunningBatch
from refdec.transformers.calibration import auto_cost_curve
from refdec.transformers.prefill import prefill_reusing, prefill_steps
from refdec.transformers.runner import ModelRunner
from refdec.transformers.selfcheck import ensure_lossless_tree_verification
from refdec.transformers.static_step import StaticStep
from refdec.transformers.verify import verify_step

__all__ = ["MIN_REUSED_TOKENS", "PREFIX_CACHE_BYTES", "TransformersBackend"]

# Fewer kept tokens than this are prefilled again: a prompt that reuses entries is prefilled alone,
# and a few tokens saved do not pay for leaving its group's batched prefill.
MIN_REUSED_TOKENS = 32
# The most bytes of keys and values the prefix cache holds (on the model's devices).
PREFIX_CACHE_BYTES = 1 << 30


class TransformersBackend:
    """A transformers model through :class:`~refdec.transformers.runner.ModelRunner`. Made for a
    model type refdec has not verified, it first checks that tree verification is lossless for it
    (refdec.transformers.selfcheck; once per model object, a ValueError if not).
    ``cuda_graphs``: fixed-shape verification forwards, each captured once as a CUDA graph.
    ``prefix_cache``: finished rows whose entries are kept for later prompts (0: none)."""

    tokenizer = None  # a transformers model brings none: the caller passes its tokenizer
    packed_rows = False  # the rows' query slots are padded to the longest tree
    row_limit = None  # rows are limited by memory only

    def __init__(self, model, *, cuda_graphs: bool = False, prefix_cache: int = PREFIX_CACHE_ENTRIES) -> None:
        if not isinstance(cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be True or False, got {cuda_graphs!r}")
        self.model = model
        self.runner = ModelRunner(model)
        ensure_lossless_tree_verification(self.runner)  # a model type refdec has not verified: checked once
        self.vocab_size = self.runner.vocab_size
        self.max_positions = self.runner.max_positions
        self.device = self.runner.device
        self.generation_config = getattr(model, "generation_config", None)
        if self.runner.hybrid is not None:
            if cuda_graphs:
                raise ValueError("cuda_graphs=True does not go with a hybrid model (recurrent layers): its tree "
                                 "step's kernels are refdec's own torch code, not captured")
        # an entry: (KV entries, a hybrid's recurrent states or None); a hybrid's state is that after the
        # entry's last token, so a later prompt reuses the entry whole or not at all
        self.prefix_cache: PrefixCache[tuple] = PrefixCache(prefix_cache, max_size=PREFIX_CACHE_BYTES,
                                                            whole=self.runner.hybrid is not None)
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
            if self.runner.hybrid is not None:
                raise ValueError("static_shapes=True does not go with a hybrid model (recurrent layers)")
            self._set_static_step(cuda_graphs=False)

    def _set_static_step(self, cuda_graphs: bool) -> None:
        self.runner.static_step = StaticStep(self.runner.device, self.runner.mask_spec, cuda_graphs=cuda_graphs)
        self.runner.lazy_head = False

    # -- the engine's calls

    def new_batch(self) -> RunningBatch:
        batch = RunningBatch.empty(self.device)
        batch.retire = self._retire
        return batch

    def clear_prefix_cache(self) -> None:
        self.prefix_cache.clear()

    def _retire(self, request, n: int, entries: list, states: list | None) -> None:
        """A finished row's entries for its first ``n`` tokens (refdec.transformers.cache.row_entries;
        a hybrid's recurrent states, refdec.transformers.hybrid.state.row_states) into the prefix cache."""
        if self.prefix_cache.max_entries:
            size = sum(keys.nbytes + values.nbytes for keys, values in entries)
            size += sum(state.nbytes for state in states or ())
            self.prefix_cache.add((entries, states), np.asarray(request.seq[:n], dtype=np.int64), size)

    def prefill_steps(self, group: list, chunk: int | None):
        """The group's prompts (refdec.transformers.prefill), a chunk per ``next()``: those that
        begin with at least :data:`MIN_REUSED_TOKENS` tokens of a prefix-cache entry each on top of
        its entries (``request.stats.cached_prompt_tokens``), the others as one padded group."""
        reused = {}
        if len(self.prefix_cache):
            for i, request in enumerate(group):
                entry, cached = self.prefix_cache.longest(request.prompt)
                cached = min(cached, request.prompt_len - 1)
                if self.prefix_cache.whole and entry is not None and cached < entry.tokens.shape[0]:
                    continue  # the prompt is the entry itself: a hybrid's state cannot give its last logits
                if cached >= MIN_REUSED_TOKENS:
                    reused[i] = (entry.handle, cached)
        parts = []  # (group indices, batch, logits [g, V])
        rest = [i for i in range(len(group)) if i not in reused]
        # a hybrid model's prompts are prefilled one by one: left padding would run through its recurrent layers
        together = ([rest] if rest else []) if self.runner.hybrid is None else [[i] for i in rest]
        for indices in together:
            if parts:
                yield  # the forwards of the parts before this one were a step's
            parts.append((indices, *(yield from prefill_steps(self.runner, [group[i] for i in indices], chunk))))
        for i, (entries, cached) in reused.items():
            if parts:
                yield  # the forwards of the parts before this one were a step's
            group[i].stats.cached_prompt_tokens = cached
            parts.append(([i], *(yield from prefill_reusing(self.runner, group[i], *entries, cached, chunk))))
        batch = parts[0][1]
        batch.retire = self._retire
        last = torch.empty((len(group), parts[0][2].shape[-1]), dtype=parts[0][2].dtype, device=parts[0][2].device)
        for indices, part, logits in parts:
            if part is not batch:
                batch.join(part)
            last[indices] = logits
        return batch, last

    def fit_tree(self, tree: DraftTree, rows: int) -> DraftTree:
        return tree

    def verify(self, batch: RunningBatch, trees: list[DraftTree], roots: np.ndarray, root_pos: np.ndarray,
               rules: list[TargetRule | None]) -> Verified:
        """With the lazy head (a CPU) the inputs are built on the host; else on the device, and
        greedy and plain sampling verify there too (refdec.transformers.verify.verify_step)."""
        return verify_step(self.runner, batch, trees, roots, root_pos, rules)

    def auto_cost_curve(self) -> CostCurve:
        return auto_cost_curve(self.model)
