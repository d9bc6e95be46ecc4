"""DraftTree → model inputs for one tree-verification forward pass.

The verifier feeds the root (the last accepted token, not yet in the KV cache)
followed by the ``n`` draft nodes, so a step has ``T = 1 + n`` query rows.
Row 0 is the root, row ``1 + node_idx`` is draft node ``node_idx``:

    input_ids     int64 [1, T]            root token, then tree.token_ids
    position_ids  int64 [1, T]            root_pos + depth (root depth 0)
    mask          bool  [1, 1, T, root_pos + T]
                  row r may see every cached key (positions 0 .. root_pos-1),
                  its ancestors in the tree (the root included) and itself.

Sliding-window layers (transformers ``sliding_window_overlay``: key position
``k`` is visible from query position ``q`` iff ``q - k < window``) get the
same mask ANDed with that window, computed on *positions* (a node at depth
``d`` sits at ``root_pos + d``), so a tree row sees exactly what the same
token would see in a plain left-to-right forward of its branch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from refdec.compat import text_config
from refdec.tree import DraftTree


def ancestor_matrix(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ancestor-or-self relation of the tree *with its root*.

    ``parents``: int32 array of shape (n,), -1 for children of the root.
    Returns ``(anc, depth)``: ``anc`` bool [1+n, 1+n] with ``anc[r, c]`` true iff
    row ``c`` is row ``r`` or one of its ancestors (row 0 = root, row 1+i = node i);
    ``depth`` int64 [1+n] with the root at depth 0.
    """
    n = int(parents.shape[0])
    anc = np.zeros((n + 1, n + 1), dtype=bool)
    depth = np.zeros(n + 1, dtype=np.int64)
    anc[0, 0] = True
    parent_rows = parents.astype(np.int64) + 1  # parent row index, root = 0
    for row in range(1, n + 1):  # topological order: a parent's row is complete before its children
        p = parent_rows[row - 1]
        anc[row] = anc[p]
        anc[row, row] = True
        depth[row] = depth[p] + 1
    return anc, depth


@dataclass
class TreeInputs:
    """Tensors for one verification forward (see module docstring for shapes)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | dict
    depth: np.ndarray  # int64 [T], root 0


@dataclass(frozen=True)
class MaskSpec:
    """How a model wants its attention mask.

    kind: ``"single"`` (one mask for every layer), ``"dict"`` (a mapping from
    layer type to mask, as Gemma 3 / Qwen2 with sliding layers take it).
    window: the sliding window (``None`` for none); with ``kind="single"`` and a
    window, every layer slides (Mistral style).
    additive: eager attention adds the mask, so it must be float (0 / dtype min).
    sliding_layers: with ``kind="dict"``, the indices of the sliding-window layers.
    """

    kind: str
    window: int | None
    additive: bool
    dtype: torch.dtype
    sliding_layers: tuple[int, ...] = ()


def mask_spec_for(model) -> MaskSpec:
    """Inspect ``model.config`` to decide the mask format (raises for unsupported ones)."""
    config = text_config(model)
    attn_impl = getattr(config, "_attn_implementation", None) or "sdpa"
    if attn_impl not in ("sdpa", "eager"):
        raise ValueError(
            f"model attention implementation {attn_impl!r} is not supported: tree verification needs an "
            "explicit 4D mask; load the model with attn_implementation='sdpa' or 'eager'"
        )
    model_type = getattr(config, "model_type", "")
    if model_type in ("bloom", "mpt") or (model_type == "falcon" and getattr(config, "alibi", False)):
        raise ValueError(
            f"model type {model_type!r} with ALiBi position biases is not supported: it builds the biases "
            "from the KV cache's slots or a 2D padding mask, not from position_ids, so a tree's nodes (and a "
            "compacted cache) would get other biases than in plain decoding"
        )
    if model_type == "gpt_neo" and "local" in (getattr(config, "attention_layers", None) or []):
        raise ValueError(
            "model type 'gpt_neo' with local attention layers is not supported: it cuts its local window by "
            "KV cache slot, not by position, so a tree's nodes would see another window than in plain decoding"
        )
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


def _finish(mask: torch.Tensor, spec: MaskSpec) -> torch.Tensor:
    if not spec.additive:
        return mask
    return torch.where(mask, torch.zeros((), dtype=spec.dtype), torch.finfo(spec.dtype).min)


def build_tree_inputs(tree: DraftTree, root_token: int, root_pos: int, spec: MaskSpec,
                      device: torch.device | str = "cpu") -> TreeInputs:
    """Input ids, positions and mask for verifying ``tree`` below ``root_token``.

    ``root_pos``: absolute position of the root = number of tokens in the KV cache.
    """
    anc, depth = ancestor_matrix(tree.parents)
    t = anc.shape[0]
    ids = np.empty(t, dtype=np.int64)
    ids[0] = root_token
    ids[1:] = tree.token_ids
    pos = depth + root_pos
    tree_part = torch.from_numpy(anc)
    full = torch.ones((t, root_pos + t), dtype=torch.bool)
    full[:, root_pos:] = tree_part
    input_ids = torch.from_numpy(ids).to(device).unsqueeze(0)
    position_ids = torch.from_numpy(pos).to(device).unsqueeze(0)

    window_mask = None
    if spec.window is not None:
        key_pos = np.concatenate([np.arange(root_pos, dtype=np.int64), pos])
        # transformers sliding_window_overlay: visible iff q - k < window
        in_window = torch.from_numpy((pos[:, None] - key_pos[None, :]) < spec.window)
        window_mask = full & in_window

    if spec.kind == "dict":
        mask = {
            "full_attention": _finish(full, spec)[None, None].to(device),
            "sliding_attention": _finish(window_mask, spec)[None, None].to(device),
        }
    elif window_mask is not None:
        mask = _finish(window_mask, spec)[None, None].to(device)
    else:
        mask = _finish(full, spec)[None, None].to(device)
    return TreeInputs(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, depth=depth)
