"""What refdec knows about model types, in one place.

Tree verification feeds a draft tree in one forward, with ``position_ids`` and a
4D mask saying where each node sits, and later keeps only the accepted path's
KV entries. That is plain decoding's computation only if the model takes every
position-dependent quantity from ``position_ids`` and the mask, never from the
KV cache's slot indices. So a model type is one of:

* **refused** (:func:`check_supported`): ALiBi models that build their biases over
  KV slots (Bloom, MPT, Falcon with ``alibi=True``) and GPT-Neo with local layers
  (its window is cut by slot);
* **verified** (:data:`VERIFIED_MODEL_TYPES`): tree verification equals plain
  decoding in refdec's tests or in a randomized comparison against
  ``model.generate``;
* **hybrid** (refdec.transformers.hybrid): recurrent layers (Gated DeltaNet, Mamba2 mixers, short
  convolutions) beside attention, or alone; a recurrent family refdec cannot verify is refused,
  by name (refdec.transformers.hybrid.families.hybrid_layout);
* **anything else**: checked once, when its first decoder is made
  (refdec.transformers.selfcheck).

Also here: how a model wants its attention mask (:func:`mask_spec_for`), which
types have a plain linear LM head the verifier may run on chosen rows only
(:data:`PLAIN_HEAD_MODEL_TYPES`), and the name its forward takes the cache under
(:func:`cache_kwarg`).
"""

from __future__ import annotations

import inspect

import torch

from refdec.transformers.hybrid.families import find_hybrid
from refdec.transformers.masks import MaskSpec

__all__ = ["PLAIN_HEAD_MODEL_TYPES", "VERIFIED_MODEL_TYPES", "cache_kwarg", "check_supported", "mask_spec_for",
           "model_type", "text_config"]

# Model types whose tree verification equals plain decoding in refdec's tests or in a
# randomized comparison against model.generate (greedy, single prompts and batches).
VERIFIED_MODEL_TYPES = frozenset({
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text", "gpt2", "phi", "phi3",
    "starcoder2", "olmo2", "smollm3", "gpt_neox", "opt", "gptj", "codegen", "falcon", "gpt_bigcode", "biogpt",
    "gpt_neo",
})

# Model types whose causal-LM head is exactly ``lm_head(last_hidden_state)`` (then Gemma's optional
# final logit soft-capping): the verifier may compute those logits itself (refdec.transformers.plain_head).
PLAIN_HEAD_MODEL_TYPES = frozenset({"gemma", "gemma2", "gemma3_text", "llama", "mistral", "qwen2", "qwen3", "gpt2",
                                    # hybrids (refdec.transformers.hybrid)
                                    "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "lfm2", "lfm2_moe", "bamba"})


def text_config(model):
    """The config of ``model``'s text decoder (the model's own config for a text-only model)."""
    config = model.config
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def model_type(model) -> str:
    return str(getattr(text_config(model), "model_type", ""))


def cache_kwarg(module: torch.nn.Module) -> str:
    """The name ``module.forward`` takes the KV cache under: ``cache`` in newer transformers,
    ``past_key_values`` (deprecated there, removed in 5.40) before."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def check_supported(model) -> None:
    """Raise ValueError for a model type whose tree verification can never be lossless."""
    config = text_config(model)
    kind = getattr(config, "model_type", "")
    if kind in ("bloom", "mpt") or (kind == "falcon" and getattr(config, "alibi", False)):
        raise ValueError(
            f"model type {kind!r} with ALiBi position biases is not supported: it builds the biases "
            "from the KV cache's slots or a 2D padding mask, not from position_ids, so a tree's nodes (and a "
            "compacted cache) would get other biases than in plain decoding"
        )
    if kind == "gpt_neo" and "local" in (getattr(config, "attention_layers", None) or []):
        raise ValueError(
            "model type 'gpt_neo' with local attention layers is not supported: it cuts its local window by "
            "KV cache slot, not by position, so a tree's nodes would see another window than in plain decoding"
        )


def mask_spec_for(model) -> MaskSpec:
    """Inspect ``model.config`` to decide the mask format (raises for unsupported models)."""
    config = text_config(model)
    attn_impl = getattr(config, "_attn_implementation", None) or "sdpa"
    if attn_impl not in ("sdpa", "eager"):
        raise ValueError(
            f"model attention implementation {attn_impl!r} is not supported: tree verification needs an "
            "explicit 4D mask; load the model with attn_implementation='sdpa' or 'eager'"
        )
    check_supported(model)
    layout = find_hybrid(model, config)  # raises, naming the family, for a layer refdec cannot verify
    if layout is not None:
        return MaskSpec(kind="hybrid" if layout.has_attention else "none", window=None,
                        additive=attn_impl == "eager", dtype=model.dtype)
    layer_types = list(getattr(config, "layer_types", None) or [])
    window = getattr(config, "sliding_window", None)
    unsupported = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
    if unsupported:
        raise ValueError(f"model layer types {unsupported} are not supported by tree verification")
    if "sliding_attention" in layer_types:
        if not window:
            raise ValueError("model has sliding_attention layers but config.sliding_window is not set")
        kind = "dict"
    elif layer_types:
        kind, window = "single", None  # all full attention (e.g. Qwen2 with use_sliding_window=False)
    else:
        kind = "single"  # e.g. Llama/GPT-2 (window None), Mistral (every layer slides)
    sliding_layers = tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention") if kind == "dict" else ()
    return MaskSpec(kind=kind, window=int(window) if window else None, additive=attn_impl == "eager",
                    dtype=model.dtype, sliding_layers=sliding_layers)
