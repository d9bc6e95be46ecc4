"""The LM head of a plain-head model, split from its backbone so that the verifier computes it.

For models with a plain linear head (refdec.transformers.model_support.PLAIN_HEAD_MODEL_TYPES)
:func:`split_forward_fn` gives the model's forward without its head and the head as a
:class:`PlainHead`; the lazy head (refdec.transformers.lazy_head) then runs it only on the tree rows the
acceptance walks visit.
"""

from __future__ import annotations

import torch

from refdec.transformers.model_support import PLAIN_HEAD_MODEL_TYPES, cache_kwarg, text_config

__all__ = ["PlainHead", "split_forward_fn"]


class PlainHead:
    """The LM head of a plain-head model: ``logits = softcap(W @ h.T).T``.

    ``weight``: float [V, D] (the output embedding); ``softcap``: Gemma's final logit
    soft-capping or None. Computed as ``W @ h.T`` rather than ``F.linear(h, W)``: with
    a small number of rows and a large vocabulary, CPU GEMM kernels pack the whole
    weight for ``h @ W.T``, which costs more than the product. A single row goes to a
    memory-bound GEMV that is slower than a few rows, so ``logits`` never feeds fewer than
    ``min_rows`` rows: it pads with copies of the first row (both measured: benchmarks/RESULTS.md).
    """

    def __init__(self, weight, softcap, min_rows: int = 4) -> None:
        self.weight = weight
        self.softcap = softcap
        self.min_rows = int(min_rows)

    def logits(self, hidden):
        """float [r, V] for ``hidden`` float [r, D] (r >= 1)."""
        rows = hidden.shape[0]
        if rows < self.min_rows:
            hidden = torch.cat([hidden, hidden[:1].expand(self.min_rows - rows, -1)], dim=0)
        logits = torch.mm(self.weight, hidden.to(self.weight.dtype).T).T  # h.T: a transposed view
        if rows < self.min_rows:
            logits = logits[:rows]
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def split_forward_fn(model):
    """``(backbone_forward, head)`` for models with a plain linear LM head, or None.

    ``backbone_forward(cache, **inputs) -> hidden`` (float [B, T, D]) runs the model
    without its head; ``head`` is a :class:`PlainHead`. Splitting the two lets the
    verifier compute logits only for the tree rows its acceptance walk visits
    (refdec.transformers.lazy_head): on a CPU the head is most of a forward.
    """
    config = text_config(model)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return None
    backbone = getattr(model, getattr(model, "base_model_prefix", ""), None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if backbone is None or not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return None
    if type(head) is not torch.nn.Linear or head._forward_hooks or head._forward_pre_hooks:
        return None  # a subclass or a hooked head
    cache_kw = cache_kwarg(backbone)

    def backbone_forward(cache, **inputs):
        inputs[cache_kw] = cache
        return backbone(use_cache=True, **inputs).last_hidden_state  # [B, T, D]

    return backbone_forward, PlainHead(head.weight, getattr(config, "final_logit_softcapping", None))
