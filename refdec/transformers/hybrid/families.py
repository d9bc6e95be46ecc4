"""Which recurrent layer families refdec verifies trees on, and how a model is recognised.

A model is *hybrid* when its text config lists a cache layer type other than attention
(``config.layer_types``: ``linear_attention``, ``conv``, ``hybrid``, ...; the Mamba models,
which list none, by their mixers). Each of its recurrent layers must be one of
:data:`FAMILIES`: its mixer class is recognised by name, and its modeling module must define the
kernels refdec swaps for tree forms (refdec.transformers.hybrid.step.TREE_FORMS). Anything else
is refused before decoding, naming the family (:func:`hybrid_layout` raises).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

__all__ = ["FAMILIES", "HybridLayout", "find_hybrid", "hybrid_layout", "is_hybrid_config"]

# family -> (mixer class-name suffixes, the kernels its modeling module must define)
FAMILIES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gated_deltanet": (("GatedDeltaNet",), ("causal_conv1d_forward", "torch_chunk_gated_delta_rule",
                                            "torch_recurrent_gated_delta_rule")),
    "mamba2": (("Mamba2Mixer", "BambaMixer", "FalconH1Mixer", "GraniteMoeHybridMambaLayer", "Zamba2MambaMixer"),
               ("causal_conv1d_forward", "mamba2_scan_forward")),
    "short_conv": (("ShortConv",), ("causal_conv1d_forward",)),
}

# Mixers refdec knows and does not handle, with the reason given to the user.
_REFUSED = {
    "MambaMixer": "Mamba (v1)'s selective scan decays each channel and state entry apart, so a tree's "
                  "states cannot share one masked pass; refdec handles Mamba2 (SSD) mixers",
}

_ATTENTION_TYPES = {"full_attention", "sliding_attention"}


def _layer_types(config) -> list[str]:
    return list(getattr(config, "layer_types", None) or [])


def is_hybrid_config(config) -> bool:
    """Whether ``config`` (a text config) has recurrent layers."""
    types = set(_layer_types(config))
    return bool(types - _ATTENTION_TYPES) or "mamba" in str(getattr(config, "model_type", ""))


@dataclass(frozen=True)
class HybridLayout:
    """A hybrid model's recurrent side: ``cache_layer_types`` (one per layer: ``full_attention``,
    ``linear_attention``, ``conv``, ``hybrid`` or ``dummy``; the layer refdec's cache gives it,
    refdec.transformers.hybrid.state.new_hybrid_cache), ``families`` (the recurrent families found),
    ``modules`` (the modeling modules whose kernels refdec.transformers.hybrid.step wraps) and
    ``has_attention`` (whether any layer attends: a pure recurrent model takes no mask)."""

    cache_layer_types: tuple[str, ...]
    families: tuple[str, ...]
    modules: frozenset[str]
    has_attention: bool


def _family_of(cls: type) -> str | None:
    for family, (suffixes, _) in FAMILIES.items():
        if cls.__name__.endswith(suffixes):
            return family
    return None


def hybrid_layout(model: torch.nn.Module, config) -> HybridLayout:
    """The :class:`HybridLayout` of ``model`` (``config``: its text config); ValueError naming the
    layer family if refdec cannot verify a tree on it."""
    found: dict[int, tuple[str, type]] = {}
    for module in model.modules():
        cls = type(module)
        if cls.__name__ in _REFUSED:
            raise ValueError(f"model type {getattr(config, 'model_type', '?')!r} has {cls.__name__} layers, which "
                             f"refdec does not verify trees on: {_REFUSED[cls.__name__]}")
        family = _family_of(cls)
        if family is None:
            continue
        layer_idx = getattr(module, "layer_idx", None)
        if layer_idx is None:
            raise ValueError(f"{cls.__name__} has no layer_idx: refdec cannot find its cached state")
        missing = [name for name in FAMILIES[family][1] if not callable(getattr(sys.modules[cls.__module__], name, None))]
        if missing:
            raise ValueError(f"{cls.__name__} ({family}) in {cls.__module__}: this transformers version does not "
                             f"define {missing}, the kernels refdec replaces with its tree forms")
        found[int(layer_idx)] = (family, cls)
    types = _layer_types(config)
    n_layers = int(getattr(config, "num_hidden_layers", len(types)) or len(types))
    if not types:
        types = ["linear_attention" if i in found else "full_attention" for i in range(n_layers)]
    cache_types = []
    for layer_idx, layer_type in enumerate(types):
        recurrent = layer_idx in found
        if layer_type in _ATTENTION_TYPES and not recurrent:
            if layer_type == "sliding_attention":
                raise ValueError("hybrid models with sliding-window attention layers are not supported by "
                                 "tree verification yet")
            cache_types.append("full_attention")
        elif layer_type in ("moe", "mlp", "dummy") and not recurrent:
            cache_types.append("dummy")  # a feed-forward layer (Nemotron-H): nothing cached
        elif layer_type == "hybrid" and recurrent:
            cache_types.append("hybrid")
        elif recurrent:
            cache_types.append("conv" if found[layer_idx][0] == "short_conv" else "linear_attention")
        else:
            raise ValueError(f"model layer type {layer_type!r} (layer {layer_idx}) is not supported by tree "
                             f"verification: refdec verifies trees on attention and on the recurrent families "
                             f"{sorted(FAMILIES)}")
    has_attention = any(t in ("full_attention", "hybrid") for t in cache_types)
    return HybridLayout(tuple(cache_types), tuple(sorted({family for family, _ in found.values()})),
                        frozenset(cls.__module__ for _, cls in found.values()), has_attention)


def find_hybrid(model: torch.nn.Module, config) -> HybridLayout | None:
    """:func:`hybrid_layout` for a model with recurrent layers (by its config's layer types or its
    mixers' classes), None for an attention-only model."""
    recurrent = is_hybrid_config(config) or any(
        _family_of(type(module)) is not None or type(module).__name__ in _REFUSED for module in model.modules())
    return hybrid_layout(model, config) if recurrent else None
