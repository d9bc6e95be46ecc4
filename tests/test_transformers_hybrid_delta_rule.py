"""Specifies refdec.transformers.hybrid.delta_rule: every tree row's gated delta rule output equals
transformers' one-token recurrence run along the row's path from the cached state, and the
committed state is the accepted row's (grouped value heads, q/k normalised in the kernel)."""

from __future__ import annotations

import torch

from hybrid_trees import path_of, paths_of
from refdec.transformers.hybrid.delta_rule import tree_gated_delta_rule


def test_each_row_equals_the_recurrence_along_its_path():
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

    torch.manual_seed(0)
    paths, parent_rows = paths_of()
    rows = len(parent_rows)
    q, k = torch.randn(1, rows, 2, 8), torch.randn(1, rows, 2, 8)
    v = torch.randn(1, rows, 4, 8)
    g, beta = -torch.rand(1, rows, 4), torch.rand(1, rows, 4)
    state = torch.randn(1, 4, 8, 8)
    layer_state = state.clone()
    out, commit = tree_gated_delta_rule(paths, q, k, v, g, beta, initial_state=layer_state,
                                        use_qk_l2norm_in_kernel=True)
    assert torch.equal(layer_state, state)  # nothing written before the commit
    for row in range(rows):
        path = path_of(parent_rows, row)
        want, final = torch_recurrent_gated_delta_rule(q[:, path], k[:, path], v[:, path], g[:, path], beta[:, path],
                                                       initial_state=state.clone(), output_final_state=True,
                                                       use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(out[:, row], want[:, -1], rtol=1e-5, atol=1e-5)
        layer_state.copy_(state)
        commit(torch.tensor([row]))
        torch.testing.assert_close(layer_state, final, rtol=1e-5, atol=1e-5)
