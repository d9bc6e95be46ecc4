"""The gated delta rule (Gated DeltaNet: Qwen3.5, Qwen3.6, Qwen3-Next) over a draft tree, in one
parallel pass.

Plain decoding advances the state ``S`` (float [H, dk, dv]) token by token:
``S <- exp(g_t) S``, ``delta_t = beta_t (v_t - S^T k_t)``, ``S <- S + k_t delta_t^T``,
``o_t = S^T q_t``. Unrolled along a path from the cached state ``S0``, with ``G_t`` the sum of
``g`` over the path up to ``t`` and ``anc(t)`` the rows on it:

    delta_t + sum_{s in anc(t), s != t} beta_t exp(G_t - G_s) (k_t . k_s) delta_s
            = beta_t (v_t - exp(G_t) S0^T k_t)
    o_t     = exp(G_t) S0^T q_t + sum_{s in anc(t)} exp(G_t - G_s) (q_t . k_s) delta_s
    S_t     = exp(G_t) S0 + sum_{s in anc(t)} exp(G_t - G_s) k_s delta_s^T

This is transformers' chunked form (``torch_chunk_gated_delta_rule``, one chunk) with the
causal mask replaced by the ancestor mask: the system is still unit lower triangular (a
tree's rows are in topological order), so one triangular solve gives every ``delta``. Only the
accepted row's ``S_t`` is ever formed, when the step commits. Computed in float32, as
transformers computes the rule whatever the model's dtype.
"""

from __future__ import annotations

import torch

from refdec.transformers.hybrid.paths import TreePaths

__all__ = ["tree_gated_delta_rule"]


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def tree_gated_delta_rule(paths: TreePaths, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          g: torch.Tensor, beta: torch.Tensor, initial_state: torch.Tensor | None = None,
                          output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False, **kwargs):
    """transformers' ``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule`` over the
    tree rows: ``query``, ``key`` float [B, T, Hk, dk]; ``value`` float [B, T, Hv, dv]; ``g``, ``beta``
    float [B, T, Hv]; ``initial_state`` float [B, Hv, dk, dv] (the cached state). Returns the
    output float [B, T, Hv, dv] and, for the final state, the step's pending commit (the cache
    layer records it: refdec.transformers.hybrid.state.RecurrentLayer)."""
    if initial_state is None:
        raise RuntimeError("a tree step needs a prefilled row: the gated delta rule got no cached state")
    out_dtype = query.dtype
    batch, rows, k_heads, _ = key.shape
    v_heads = value.shape[2]
    if k_heads != v_heads:
        query = query.repeat_interleave(v_heads // k_heads, dim=2)
        key = key.repeat_interleave(v_heads // k_heads, dim=2)
    query, key, value, beta, g = (x.transpose(1, 2).to(torch.float32) for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        query, key = _l2norm(query), _l2norm(key)
    query = query * query.shape[-1] ** -0.5
    state0 = initial_state.to(torch.float32)  # [B, H, dk, dv]

    on_path = paths.ancestors[:, None]  # [B, 1, T, T]
    strict = on_path & ~torch.eye(rows, dtype=torch.bool, device=on_path.device)
    cum = torch.einsum("bts,bhs->bht", paths.ancestors.to(torch.float32), g)  # G [B, H, T]
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~on_path, float("-inf")).exp()  # [B, H, T, T]
    system = (beta[..., None] * (key @ key.transpose(-1, -2)) * decay).masked_fill(~strict, 0.0)
    system = system + torch.eye(rows, dtype=system.dtype, device=system.device)
    rhs = beta[..., None] * (value - cum.exp()[..., None] * (key @ state0))
    delta = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)  # [B, H, T, dv]
    out = cum.exp()[..., None] * (query @ state0) + ((query @ key.transpose(-1, -2)) * decay) @ delta

    def commit(final_rows: torch.Tensor, layer_state: torch.Tensor) -> None:
        pick = torch.arange(batch, device=final_rows.device)
        weights = decay[pick, :, final_rows]  # [B, H, T]: exp(G_f - G_s) on f's path, 0 elsewhere
        new = cum[pick, :, final_rows].exp()[..., None, None] * state0 + \
            (key * weights[..., None]).transpose(-1, -2) @ delta
        layer_state.copy_(new.to(layer_state.dtype))

    return out.transpose(1, 2).contiguous().to(out_dtype), _StateCommit(commit, initial_state)


class _StateCommit:
    """A pending commit of one layer's recurrent state (``state``: the layer's tensor, written in place)."""

    def __init__(self, commit, state: torch.Tensor) -> None:
        self._commit, self._state = commit, state

    def __call__(self, final_rows: torch.Tensor) -> None:
        self._commit(final_rows, self._state)
