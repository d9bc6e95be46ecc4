"""The causal depthwise convolution of a recurrent layer, over a draft tree.

In plain decoding a token's convolution reads the ``K - 1`` inputs before it and itself. In a
tree, "before it" is its path: its ancestors, and above the root the cached window. Each row's
window is gathered (refdec.transformers.hybrid.paths.TreePaths.conv_columns) and convolved with
``F.conv1d``, as transformers' one-token update convolves its window. The layer's window
becomes the accepted row's (its last ``K`` inputs) when the step commits.

Replaces transformers' ``causal_conv1d_forward`` (same arguments) during a tree step
(refdec.transformers.hybrid.step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

from refdec.transformers.hybrid.paths import TreePaths

__all__ = ["tree_conv1d_forward"]


def tree_conv1d_forward(paths: TreePaths, conv1d: torch.nn.Conv1d, hidden_states: torch.Tensor, cache, layer_idx: int,
                        activation: str | None = None, state_idx: int = 0, **kwargs) -> torch.Tensor:
    """float [B, C, T]: the convolution of each tree row's window; ``hidden_states`` float [B, C, T]:
    the rows' inputs; the layer ``cache.layers[layer_idx]`` keeps its window (float [B, C, K]) until
    the step commits."""
    layer = cache.layers[layer_idx]
    window = cache.get_conv_state(layer_idx, state_idx=state_idx)
    if window is None:
        raise RuntimeError(f"layer {layer_idx} has no convolution window: a tree step needs a prefilled row")
    weight = conv1d.weight  # [C, 1, K]
    kernel = weight.shape[-1]
    if window.shape[-1] != kernel:
        raise RuntimeError(f"layer {layer_idx}: a window of {window.shape[-1]} inputs for a kernel of {kernel}")
    batch, channels, rows = hidden_states.shape
    buf = torch.cat([window[..., 1:], hidden_states.to(window.dtype)], dim=-1).to(weight.dtype)  # [B, C, K-1+T]
    columns = paths.conv_columns(kernel)  # [B, T, K]
    windows = buf.gather(2, columns.reshape(batch, 1, rows * kernel).expand(batch, channels, rows * kernel))
    windows = windows.view(batch, channels, rows, kernel).permute(0, 2, 1, 3).reshape(batch * rows, channels, kernel)
    out = F.conv1d(windows, weight, conv1d.bias, padding=0, groups=channels)  # [B*T, C, 1]
    out = out.view(batch, rows, channels).transpose(1, 2)
    if activation is not None:
        out = ACT2FN[activation](out)

    def commit(final_rows: torch.Tensor) -> None:
        kept = columns[torch.arange(batch, device=columns.device), final_rows]  # [B, K]
        new = buf.gather(2, kept[:, None, :].expand(batch, channels, kernel))
        layer.conv_states[state_idx].copy_(new.to(layer.conv_states[state_idx].dtype))

    layer.pending.append(commit)
    return out.to(hidden_states.dtype)
