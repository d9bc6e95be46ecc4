"""The target model's forwards, as the engine calls them.

:class:`ModelRunner` holds what the engine needs to know about one model (its mask
format, vocabulary, position limit, device, the name its forward takes the cache
under) and runs its three kinds of forward: a prefill chunk, a verification forward
with every row's logits, and — for models with a plain linear LM head — the
backbone alone, whose hidden states the lazy head (refdec.transformers.lazy_head) turns into
logits for the rows the acceptance walk visits.
"""

from __future__ import annotations

import torch

from refdec.transformers.cache import new_cache, set_prefill_window
from refdec.transformers.hybrid.families import find_hybrid
from refdec.transformers.hybrid.state import new_hybrid_cache
from refdec.transformers.hybrid.step import install, tree_step
from refdec.transformers.model_support import cache_kwarg, mask_spec_for, text_config
from refdec.transformers.plain_head import split_forward_fn

__all__ = ["ModelRunner"]


class ModelRunner:
    """One model's forwards over a refdec KV cache (refdec.transformers.cache.new_cache).

    ``lazy_head``: the verifier runs the backbone and then the head on the visited rows
    only (True by default on a CPU for a plain-head model; on a GPU the head of every row
    costs about as much as one row's, so every row's target is computed, :meth:`row_targets`).
    ``head_chunk_rows``: how many rows :meth:`row_targets` runs the head on at a time (None:
    as many as keep one chunk's logits within ``HEAD_CHUNK_BYTES``, at least 16).
    """

    HEAD_CHUNK_BYTES = 64 << 20

    def __init__(self, model) -> None:
        self.model = model
        self.mask_spec = mask_spec_for(model)  # raises for unsupported models
        config = text_config(model)
        # a hybrid model's recurrent side (refdec.transformers.hybrid), None for attention only
        self.hybrid = find_hybrid(model, config)
        if self.hybrid is not None:
            install(set(self.hybrid.modules))
        self.max_positions = getattr(config, "max_position_embeddings", None)
        self.vocab_size = int(config.vocab_size)
        self.device = next(model.parameters()).device
        self.cache_kw = cache_kwarg(model)
        split = split_forward_fn(model)  # None: the model's own forward computes the logits
        self.backbone, self.head = split if split is not None else (None, None)
        self.lazy_head = split is not None and self.device.type == "cpu"
        self.head_chunk_rows: int | None = None
        # refdec.transformers.static_step.StaticStep: verification forwards at fixed shapes (CUDA graphs), or None
        self.static_step = None
        # Sliding-window layers (Gemma 3): during a chunked prefill they read only the last
        # window - 1 keys plus the chunk (refdec.transformers.cache.set_prefill_window).
        self.sliding_layers = list(self.mask_spec.sliding_layers)

    @property
    def uses_lazy_head(self) -> bool:
        return self.lazy_head and self.head is not None

    def new_cache(self):
        """An empty cache for this model (refdec.transformers.cache.new_cache; a hybrid model's has
        its recurrent layers: refdec.transformers.hybrid.state.new_hybrid_cache)."""
        if self.hybrid is None:
            return new_cache()
        return new_hybrid_cache(list(self.hybrid.cache_layer_types))

    def _tree_forward(self, call, cache, inputs: dict):
        """``call(**inputs)`` with ``cache``: a tree's forward (``inputs["paths"]`` set, a hybrid
        model) inside refdec.transformers.hybrid.step.tree_step; a model without attention
        gets neither positions nor a mask."""
        paths = inputs.pop("paths", None)
        if self.mask_spec.kind == "none":
            inputs.pop("position_ids", None)
            inputs.pop("attention_mask", None)
        inputs[self.cache_kw] = cache
        if paths is None:
            return call(**inputs)
        with tree_step(cache, paths):
            return call(**inputs)

    def logits(self, cache, **inputs) -> torch.Tensor:
        """float [B, T, V]: the model's own forward over ``inputs`` (input_ids, position_ids,
        attention_mask as refdec.transformers.masks builds them; ``paths``: a hybrid model's tree
        paths, refdec.transformers.masks.TreeInputs)."""
        return self._tree_forward(lambda **kw: self.model(use_cache=True, **kw).logits, cache, inputs)

    def verify_forward(self, forward, cache, **inputs) -> torch.Tensor:
        """``forward(cache, **inputs)`` (:meth:`hidden` or :meth:`logits`) as a verification step runs
        it: through :attr:`static_step` when set (fixed shapes, maybe a replayed CUDA graph)."""
        if self.static_step is None:
            return forward(cache, **inputs)
        return self.static_step.run(forward, cache, inputs)

    def row_targets(self, cache, choose=None, **inputs) -> torch.Tensor:
        """int64 [B, T] on the model's device: every row's target after a forward over ``inputs``
        (as :meth:`logits`), ``choose(logits, start) -> int64 [r]`` of each chunk of ``r`` rows
        (``logits`` float [r, V]; ``start``: the chunk's first row in the flattened [B * T] order),
        the argmax by default. A plain-head model runs its head on ``head_chunk_rows`` rows at a
        time and keeps their targets only: no [B, T, V] logits; another model's own forward
        computes them all (``choose`` still runs by chunks)."""
        choose = choose or (lambda logits, start: logits.argmax(dim=-1))
        if self.head is None:
            logits = self.verify_forward(self.logits, cache, **inputs)
            shape, flat = logits.shape[:2], logits.reshape(-1, logits.shape[-1])
            head = None
        else:
            hidden = self.verify_forward(self.hidden, cache, **inputs)  # [B, T, D]
            shape, flat = hidden.shape[:2], hidden.reshape(-1, hidden.shape[-1])
            head = self.head
        chunk = self.head_chunk_rows
        if chunk is None:
            itemsize = torch.finfo(self.head.weight.dtype if head else flat.dtype).bits // 8
            chunk = max(16, self.HEAD_CHUNK_BYTES // (self.vocab_size * itemsize))
        targets = torch.empty(flat.shape[0], dtype=torch.int64, device=flat.device)
        for start in range(0, flat.shape[0], chunk):
            rows = flat[start:start + chunk]
            targets[start:start + chunk] = choose(rows if head is None else head.logits(rows), start)
        return targets.view(shape)

    def hidden(self, cache, **inputs) -> torch.Tensor:
        """float [B, T, D]: the backbone's last hidden states (plain-head models only)."""
        paths = inputs.pop("paths", None)
        if paths is None:
            return self.backbone(cache, **inputs)
        with tree_step(cache, paths):
            return self.backbone(cache, **inputs)

    def sliding_prefill_start(self, begin: int) -> int:
        """The first key column the sliding-window layers present to the prefill chunk that
        starts at column ``begin`` (see :meth:`prefill_chunk`); 0 = every column."""
        if not (begin and self.sliding_layers):
            return 0
        return max(0, begin - self.mask_spec.window + 1)

    def prefill_chunk(self, cache, begin: int, is_last: bool, **inputs) -> torch.Tensor | None:
        """One prefill chunk (``input_ids`` [B, T] and optional positions / mask) into ``cache``,
        the chunk starting at column ``begin``. After the first chunk the sliding-window layers
        present only their last ``window - 1`` entries plus the chunk (an explicit mask must
        cover the columns from :meth:`sliding_prefill_start`); after the last one they present
        every entry again. Returns float [B, V], the logits of each sequence's last slot, for
        the last chunk (``is_last``), else None. The head runs on that one row only."""
        if begin and self.sliding_layers:  # the layers exist after the first chunk
            set_prefill_window(cache, self.sliding_layers, self.mask_spec.window)
        if self.uses_lazy_head:
            hidden = self.hidden(cache, **inputs)  # [B, T, D]
            logits = self.head.logits(hidden[:, -1]) if is_last else None
        else:
            logits = self.logits(cache, logits_to_keep=1, **inputs)[:, -1]
            logits = logits if is_last else None
        if is_last:
            set_prefill_window(cache, self.sliding_layers, None)  # the decoding loop passes its own masks
        return logits
