"""Attention masks and model inputs: the one place they are built.

A verification step feeds, per batch row, the root (the last accepted token, not
yet in the KV cache) followed by the row's ``n`` draft nodes, padded to one query
length ``T = 1 + max n``. Row 0 of a tree is the root, row ``1 + node_idx`` draft
node ``node_idx``:

    input_ids     int64 [B, T]            root token, then tree.token_ids (padding: the root again)
    position_ids  int64 [B, T]            root_pos + depth (root depth 0, a node its tree.depths;
                                          padding: root_pos)
    mask          bool  [B, 1, T, S + T]  row r may see the row's valid cached slots, its
                                          ancestors in the tree (the root included) and itself;
                                          a padding row sees only itself

``S`` is the number of cache slots; ``key_pos`` int64 [B, S] gives the absolute
position of each slot (-1 for a hole: a left-padding slot, or one past a row's
length in a batch whose rows accepted different numbers of tokens).

Sliding-window layers (transformers ``sliding_window_overlay``: key position ``k``
is visible from query position ``q`` iff ``q - k < window``) get the same mask
ANDed with that window, computed on *positions* (a node at depth ``d`` sits at
``root_pos + d``), so a tree row sees exactly what the same token would see in a
plain left-to-right forward of its branch. A model with sliding and full layers
(Gemma 3) takes a dict ``{"full_attention": m, "sliding_attention": m_window}``.
With the full LM head (a GPU) the masks are built on the device from the trees' parents
(:func:`device_tree_inputs`); with the lazy head (a CPU) on the host (:func:`tree_step_inputs`).
No attention row is ever fully masked (SDPA would return NaN there, and the NaN
would reach other rows through 0 * NaN in the value product).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from refdec.drafting.tree import DraftTree
from refdec.transformers.transfer import to_device

__all__ = ["DeviceTrees", "MASK_ROW_ALIGN", "MaskSpec", "TreeInputs", "ancestor_matrix", "attention_masks",
           "device_tree_inputs", "masks_from_visible", "tree_step_inputs"]


@dataclass(frozen=True)
class MaskSpec:
    """How a model wants its attention mask (refdec.transformers.model_support.mask_spec_for).

    kind: ``"single"`` (one mask for every layer), ``"dict"`` (a mapping from
    layer type to mask, as Gemma 3 / Qwen2 with sliding layers take it), ``"hybrid"`` (a hybrid
    model's mapping: the tree mask for ``full_attention``, None for its recurrent layer types,
    which read the tree's paths instead: refdec.transformers.hybrid), ``"none"`` (a model without
    attention layers takes no mask and no positions).
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


@dataclass
class TreeInputs:
    """Tensors for one verification forward (shapes in the module docstring); ``paths``: a hybrid
    model's tree paths for its recurrent layers (refdec.transformers.hybrid.paths.TreePaths), None
    for an attention-only model."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | dict | None
    paths: object = None

    def model_kwargs(self) -> dict:
        """The keyword arguments of refdec.transformers.runner.ModelRunner's forwards."""
        return dict(input_ids=self.input_ids, position_ids=self.position_ids, attention_mask=self.attention_mask,
                    paths=self.paths)


def ancestor_matrix(parents: np.ndarray) -> np.ndarray:
    """Ancestor-or-self relation of the tree *with its root*: bool [1+n, 1+n], ``anc[r, c]``
    true iff row ``c`` is row ``r`` or one of its ancestors (row 0 = root, row 1+i = node i).

    ``parents``: int32 array of shape (n,), -1 for children of the root (a tree's depths are
    its ``depths``, not derived here)."""
    n = int(parents.shape[0])
    anc = np.zeros((n + 1, n + 1), dtype=bool)
    anc[0, 0] = True
    parent_rows = parents.astype(np.int64) + 1  # parent row index, root = 0
    for row in range(1, n + 1):  # topological order: a parent's row is complete before its children
        p = parent_rows[row - 1]
        anc[row] = anc[p]
        anc[row, row] = True
    return anc


# The layer types a hybrid model looks its recurrent layers' masks up under (transformers: a 2D
# padding mask, None when there is none; refdec's rows have no padding).
_RECURRENT_MASK_KEYS = ("linear_attention", "conv", "hybrid", "mamba")


def _finish(mask: torch.Tensor, spec: MaskSpec) -> torch.Tensor:
    """A bool mask as the model's attention takes it (float 0 / dtype-min for eager attention)."""
    if not spec.additive:
        return mask
    return torch.where(mask, torch.zeros((), dtype=spec.dtype, device=mask.device), torch.finfo(spec.dtype).min)


# The row stride of a mask built on the device, in elements: a multiple of 16 (a mask whose rows are
# not 16-byte aligned is copied into an aligned one by SDPA's memory-efficient kernel, in every layer).
MASK_ROW_ALIGN = 16


def _additive_aligned(mask: torch.Tensor, spec: MaskSpec) -> torch.Tensor:
    """``mask`` bool [B, T, S] as an additive mask in the model's dtype (0 where visible, dtype-min
    elsewhere: SDPA adds a float mask as it is, where a bool one is converted in every layer), a
    view [B, T, S] of rows ``MASK_ROW_ALIGN``-element aligned."""
    batch, t, width = mask.shape
    stride = -(-width // MASK_ROW_ALIGN) * MASK_ROW_ALIGN
    out = torch.full((batch, t, stride), torch.finfo(spec.dtype).min, dtype=spec.dtype, device=mask.device)
    out[:, :, :width].masked_fill_(mask, 0.0)
    return out[:, :, :width]


def _assemble(full: torch.Tensor, windowed: torch.Tensor | None, spec: MaskSpec, sliding_from: int,
              finish=_finish):
    """The model's mask(s) [B, 1, T, S] from ``full`` / ``windowed`` bool [B, T, S] (before / after the
    window; ``windowed`` None without one), each made by ``finish(mask, spec)``."""
    if spec.kind == "none":
        return None
    if spec.kind == "hybrid":
        return {"full_attention": finish(full, spec)[:, None], **dict.fromkeys(_RECURRENT_MASK_KEYS)}
    if spec.kind == "dict":
        return {"full_attention": finish(full, spec)[:, None],
                "sliding_attention": finish(windowed[:, :, sliding_from:], spec)[:, None]}
    return finish(full if windowed is None else windowed, spec)[:, None]


def masks_from_visible(full: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, spec: MaskSpec):
    """The model's mask(s) [B, 1, T, S] on ``full``'s device from ``full`` bool [B, T, S] (which key
    slots each query may see, before any window); ``q_pos`` int64 [B, T], ``k_pos`` int64 [B, S]
    on the same device (see :func:`attention_masks`). Additive, in the model's dtype, rows
    aligned (:func:`_additive_aligned`), whatever the attention: the same model outputs as
    :func:`attention_masks`'s (every row sees at least one key, so dtype-min and a bool mask's
    -inf both weigh exactly 0 after the softmax)."""
    windowed = None
    if spec.window is not None:  # q - k < window, as k > q - window (one broadcast op fewer)
        windowed = full & (k_pos[:, None, :] > (q_pos - spec.window)[:, :, None])
    return _assemble(full, windowed, spec, 0, _additive_aligned)


def attention_masks(visible: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray, spec: MaskSpec, device,
                    sliding_from: int = 0):
    """The model's mask(s) [B, 1, T, S] from ``visible`` bool [B, T, S] (which key slots each
    query may see, before any window), built on the host and copied to ``device``.

    ``q_pos`` int64 [B, T], ``k_pos`` int64 [B, S]: positions of the query and key slots
    (sliding layers see a key only if ``q_pos - k_pos < window``). ``sliding_from``: with a
    per-layer-type mask (``spec.kind == "dict"``), the sliding layers' mask keeps key columns
    ``[sliding_from, S)`` only (their windowed prefill, refdec.transformers.prefill)."""
    full = torch.from_numpy(np.ascontiguousarray(visible))
    windowed = None
    if spec.window is not None:
        windowed = full & torch.from_numpy((q_pos[:, :, None] - k_pos[:, None, :]) < spec.window)
    masks = _assemble(full, windowed, spec, sliding_from)
    if isinstance(masks, dict):
        return {name: None if mask is None else mask.to(device) for name, mask in masks.items()}
    return None if masks is None else masks.to(device)


def tree_step_inputs(trees: list[DraftTree], roots: np.ndarray, root_pos: np.ndarray, valid: np.ndarray,
                     key_pos: np.ndarray, spec: MaskSpec, device) -> TreeInputs:
    """Inputs of one verification forward over a batch of trees.

    ``trees[b]``: row b's draft tree; ``roots`` int64 [B]: its root token; ``root_pos``
    int64 [B]: the root's absolute position; ``valid`` bool [B, S] / ``key_pos`` int64 [B, S]:
    which cache slots hold the row's tokens and their positions (-1 for holes)."""
    batch, slots = valid.shape
    t = 1 + max(len(tree) for tree in trees)
    ids = np.empty((batch, t), dtype=np.int64)
    q_pos = np.empty((batch, t), dtype=np.int64)
    tree_part = np.zeros((batch, t, t), dtype=bool)
    tree_part[:] = np.eye(t, dtype=bool)  # padding query rows see themselves only
    for b, tree in enumerate(trees):
        m = 1 + len(tree)
        ids[b, 0] = roots[b]
        ids[b, 1:m] = tree.token_ids
        ids[b, m:] = roots[b]
        q_pos[b] = root_pos[b]  # the root and padding rows
        q_pos[b, 1:m] += tree.depths
        tree_part[b, :m, :m] = ancestor_matrix(tree.parents)
    visible = np.concatenate([np.broadcast_to(valid[:, None, :], (batch, t, slots)), tree_part], axis=2)
    k_pos = np.concatenate([key_pos, q_pos], axis=1)
    return TreeInputs(input_ids=torch.from_numpy(ids).to(device), position_ids=torch.from_numpy(q_pos).to(device),
                      attention_mask=attention_masks(visible, q_pos, k_pos, spec, device))


@dataclass
class DeviceTrees:
    """A batch's trees as :func:`device_tree_inputs` lays them out on the device, for the walks
    there (refdec.engine.accept.accept_walks_on_device): ``token_rows`` int64 [B, T] (row 0 the
    root, row ``1 + node_idx`` node ``node_idx``; padding: the root again), ``parent_rows`` int64
    [B, T] (a row's parent row; the root and padding rows: themselves), ``ancestors`` bool [B, T, T]
    (ancestor-or-self, as :func:`ancestor_matrix`; a padding row: itself only), ``depth`` int64
    [B, T] (padding: 0)."""

    token_rows: torch.Tensor
    parent_rows: torch.Tensor
    ancestors: torch.Tensor
    depth: torch.Tensor


def device_tree_inputs(trees: list[DraftTree], roots: np.ndarray, root_pos: np.ndarray, key_pos: torch.Tensor,
                       spec: MaskSpec, device, *, rows: int | None = None,
                       width: int | None = None) -> tuple[TreeInputs, DeviceTrees]:
    """:func:`tree_step_inputs` built on the device: the host sends one int32 array (each row's
    tokens, parent rows and root position; refdec.transformers.transfer.to_device, no host sync) and the
    device derives the ancestor relation (repeated squaring of the parent relation), the depths (the
    ancestors counted: nothing more to send), the positions and the masks from it and from the cache
    slots' positions kept there.

    ``trees[b]``: row b's draft tree; ``roots`` int64 [B]; ``root_pos`` int64 [B]; ``key_pos``
    int64 [B, S] on ``device`` (refdec.transformers.batch.RunningBatch.key_pos): the absolute position
    of each cache slot, -1 for a hole (a slot is valid iff its position is >= 0). Same tensors as
    :func:`tree_step_inputs`, and the trees as the walks on the device read them.

    Fixed shapes (refdec.transformers.static_step): ``rows`` pads T to that many query rows (padding rows
    as any: the root again, seeing only themselves); ``width`` makes the masks [B, 1, T, width]
    (the cache's whole capacity), the tree's columns at ``S .. S + T`` and every column past them
    hidden."""
    batch, slots = key_pos.shape
    t = 1 + max(len(tree) for tree in trees)
    if rows is not None:
        if rows < t:
            raise ValueError(f"rows={rows} is fewer than the {t} rows of the largest tree")
        t = rows
    if width is not None and width < slots + t:
        raise ValueError(f"width={width} is less than the cache's {slots} slots plus {t} query rows")
    host = np.empty((batch, 2 * t + 1), dtype=np.int32)
    ids, parents = host[:, :t], host[:, t:2 * t]
    parents[:] = np.arange(t, dtype=np.int32)  # the root and padding rows are their own parents
    for b, tree in enumerate(trees):
        n = len(tree)
        ids[b, 0] = roots[b]
        ids[b, 1:n + 1] = tree.token_ids
        ids[b, n + 1:] = roots[b]
        parents[b, 1:n + 1] = tree.parents + 1
    host[:, -1] = root_pos
    sent = to_device(host, device).to(torch.int64)
    token_rows, parent_rows, root = sent[:, :t], sent[:, t:2 * t], sent[:, -1:]
    rows = torch.arange(t, device=sent.device)
    # reach[b, r, c]: c is r, r's parent, ..., within 2^j generations after j squarings
    reach = (parent_rows[:, :, None] == rows) | (rows[:, None] == rows)
    for _ in range(max(0, t - 2).bit_length()):  # depth <= t - 1 generations
        step = reach.to(torch.float32)
        reach = torch.bmm(step, step) > 0
    depth = reach.sum(dim=2) - 1
    q_pos = root + depth
    visible = [(key_pos >= 0)[:, None, :].expand(batch, t, slots), reach]
    k_pos = [key_pos, q_pos]
    if width is not None and width > slots + t:
        visible.append(torch.zeros((batch, t, width - slots - t), dtype=torch.bool, device=sent.device))
        k_pos.append(torch.full((batch, width - slots - t), -1, dtype=torch.int64, device=sent.device))
    masks = masks_from_visible(torch.cat(visible, dim=2), q_pos, torch.cat(k_pos, dim=1), spec)
    return (TreeInputs(input_ids=token_rows, position_ids=q_pos, attention_mask=masks),
            DeviceTrees(token_rows, parent_rows, reach, depth))
