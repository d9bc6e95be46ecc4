"""The Mamba2 selective scan (SSD: Mamba2, Granite 4 / GraniteMoeHybrid, Bamba, Falcon-H1,
Nemotron-H, Zamba2) over a draft tree, in its masked-attention form.

Plain decoding advances each head's state ``h`` (float [P, N]) token by token:
``h <- exp(dt_t A) h + dt_t x_t B_t^T``, ``y_t = h C_t + D x_t``. The decay is one scalar per
head and token, so along a path from the cached state ``h0``, with ``G_t`` the sum of
``dt A`` over the path up to ``t``:

    y_t = exp(G_t) h0 C_t + sum_{s in anc(t)} exp(G_t - G_s) (C_t . B_s) dt_s x_s + D x_t
    h_t = exp(G_t) h0 + sum_{s in anc(t)} exp(G_t - G_s) dt_s x_s B_s^T

SSD's own "attention" form with the ancestor mask for the causal one: one pass for every tree
row; only the accepted row's ``h_t`` is formed, when the step commits. Float32, as
transformers' scans compute.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from refdec.transformers.hybrid.paths import TreePaths

__all__ = ["tree_mamba2_scan_forward"]


def tree_mamba2_scan_forward(paths: TreePaths, module, hidden_states: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                             dt: torch.Tensor, cache, **kwargs) -> torch.Tensor:
    """transformers' ``mamba2_scan_forward`` over the tree rows: ``hidden_states`` float [B, T, H * P],
    ``B``, ``C`` float [B, T, G * N], ``dt`` float [B, T, H] (before ``dt_bias`` and softplus); the
    mixer ``module`` gives ``A_log``, ``D``, ``dt_bias`` and the geometry.
    Returns float [B, T, H * P] (the ``D`` skip included); the layer's state (float [B, H, P, N])
    changes when the step commits."""
    layer_idx = module.layer_idx
    layer = cache.layers[layer_idx]
    state0 = cache.get_recurrent_state(layer_idx, state_idx=0)
    if state0 is None:
        raise RuntimeError(f"layer {layer_idx} has no recurrent state: a tree step needs a prefilled row")
    batch, rows, _ = hidden_states.shape
    heads, head_dim, size = module.num_heads, module.head_dim, module.ssm_state_size
    groups = module.n_groups
    x = hidden_states.view(batch, rows, heads, head_dim).to(torch.float32)
    Bm = B.view(batch, rows, groups, size).to(torch.float32).repeat_interleave(heads // groups, dim=2)
    Cm = C.view(batch, rows, groups, size).to(torch.float32).repeat_interleave(heads // groups, dim=2)
    # as the one-token update (mamba2_selective_state_update) computes it: no time-step clamp
    step = F.softplus(dt + module.dt_bias.to(dt.dtype)).to(torch.float32)  # [B, T, H]
    A = -torch.exp(module.A_log.float())  # [H]
    log_decay = (step * A).transpose(1, 2)  # [B, H, T]
    on_path = paths.ancestors[:, None]  # [B, 1, T, T]
    cum = torch.einsum("bts,bhs->bht", paths.ancestors.to(torch.float32), log_decay)  # [B, H, T]
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~on_path, float("-inf")).exp()  # [B, H, T, T]
    h0 = state0.to(torch.float32)  # [B, H, P, N]
    xs = (x * step[..., None]).transpose(1, 2)  # dt_s x_s [B, H, T, P]
    Bh, Ch = Bm.transpose(1, 2), Cm.transpose(1, 2)  # [B, H, T, N]
    scores = (Ch @ Bh.transpose(-1, -2)) * decay  # [B, H, T, T]
    y = cum.exp()[..., None] * (Ch @ h0.transpose(-1, -2)) + scores @ xs  # [B, H, T, P]
    y = y + module.D.float()[None, :, None, None] * x.transpose(1, 2)

    def commit(final_rows: torch.Tensor) -> None:
        pick = torch.arange(batch, device=final_rows.device)
        weights = decay[pick, :, final_rows]  # [B, H, T]
        new = cum[pick, :, final_rows].exp()[..., None, None] * h0 + \
            (xs * weights[..., None]).transpose(-1, -2) @ Bh
        state0.copy_(new.to(state0.dtype))

    layer.pending.append(commit)
    return y.transpose(1, 2).reshape(batch, rows, heads * head_dim).to(hidden_states.dtype)
