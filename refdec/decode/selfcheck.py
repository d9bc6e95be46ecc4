"""A one-time self-check that tree verification is lossless for a model type refdec
has not verified (refdec.decode.model_support).

:func:`check_tree_verification` verifies a small branching tree, compacts the
cache to a path whose nodes were not contiguous, verifies a second tree, and
compares the path rows' logits with one plain forward over the same tokens.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from refdec.decode.cache import compact, new_cache
from refdec.decode.masks import build_tree_inputs
from refdec.decode.model_support import VERIFIED_MODEL_TYPES, model_type, text_config
from refdec.tree import DraftTree

__all__ = ["TreeVerificationError", "check_tree_verification", "ensure_lossless_tree_verification"]

# Logits of the path rows may differ from a plain forward by rounding only (other GEMM
# shapes): a tolerance relative to the logits' scale, per dtype.
_REL_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-3, torch.bfloat16: 6e-2, torch.float16: 1e-2}


class TreeVerificationError(ValueError):
    """Tree verification would not give ``model`` plain decoding's tokens."""


_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # models that passed the check


def ensure_lossless_tree_verification(model, spec, cache_kw: str) -> None:
    """Run :func:`check_tree_verification` once per model object whose type is not in
    VERIFIED_MODEL_TYPES (raises ValueError if it fails)."""
    if model_type(model) in VERIFIED_MODEL_TYPES or model in _CHECKED:
        return
    try:
        check_tree_verification(model, spec, cache_kw)
    except TreeVerificationError:
        raise
    except Exception as exc:  # the forward itself fails on a tree's 4D mask or position_ids
        raise TreeVerificationError(f"model type {model_type(model)!r}: verifying a draft tree fails "
                                    f"({type(exc).__name__}: {exc}), so refdec cannot decode it") from exc
    _CHECKED[model] = True


def check_tree_verification(model, spec, cache_kw: str, prompt_len: int = 24) -> None:
    """Raise ValueError if verifying a tree (and compacting the cache to its accepted path)
    gives ``model`` other logits than plain decoding; ``spec``: its refdec.decode.masks.MaskSpec,
    ``cache_kw``: the name its forward takes the cache under. Costs three forwards of at
    most ``prompt_len + 7`` tokens."""
    vocab = int(text_config(model).vocab_size)
    device = next(model.parameters()).device
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, max(4, min(vocab, 1000)), size=prompt_len + 9).tolist()
    prompt, root, rest = tokens[:prompt_len], tokens[prompt_len], tokens[prompt_len + 1:]
    # tree 1 below the root: a decoy branch of two nodes, then the path c -> d -> e in slots 3..5
    first = DraftTree(np.array([(rest[0] + 1) % vocab, (rest[0] + 2) % vocab, rest[0], rest[1], rest[2]]),
                      np.array([-1, 0, -1, 2, 3]), np.ones(5, np.float32))
    path_nodes = [2, 3, 4]
    # tree 2 below the next root (rest[3]): a chain of two, then a decoy
    second = DraftTree(np.array([rest[4], rest[5], (rest[4] + 1) % vocab]), np.array([-1, 0, -1]),
                       np.ones(3, np.float32))
    sequence = prompt + [root, rest[0], rest[1], rest[2], rest[3], rest[4], rest[5]]
    with torch.inference_mode():
        plain = model(input_ids=torch.tensor([sequence], device=device)).logits[0].float()
        cache = new_cache()
        model(input_ids=torch.tensor([prompt], device=device), use_cache=True, **{cache_kw: cache})
        got = []
        inputs = build_tree_inputs(first, root, prompt_len, spec, device)
        out = model(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                    attention_mask=inputs.attention_mask, use_cache=True, **{cache_kw: cache}).logits[0].float()
        got.append(out[[0] + [1 + n for n in path_nodes]])  # root, c, d, e
        compact(cache, prompt_len + 1, torch.tensor(path_nodes, device=device), len(path_nodes))
        inputs = build_tree_inputs(second, rest[3], prompt_len + 4, spec, device)
        out = model(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                    attention_mask=inputs.attention_mask, use_cache=True, **{cache_kw: cache}).logits[0].float()
        got.append(out[[0, 1, 2]])  # the next root, then the chain
    got = torch.cat(got)
    want = plain[prompt_len:prompt_len + 7]
    scale = float(want.abs().max()) or 1.0
    diff = float((got - want).abs().max())
    tolerance = _REL_TOLERANCE.get(model.dtype, 1e-2) * scale
    if not diff <= tolerance:
        raise TreeVerificationError(
            f"model type {model_type(model)!r}: verifying a draft tree gives other logits than plain decoding "
            f"(max difference {diff:.3g}, logits up to {scale:.3g}), so refdec cannot decode it losslessly; it "
            "probably takes positions from the KV cache's slots rather than position_ids")
