"""Specifies refdec.transformers.hybrid.ssd: every tree row's Mamba2 scan output equals transformers'
one-token update run along the row's path from the cached state, and the committed state is the
accepted row's."""

from __future__ import annotations

import torch

from hybrid_trees import path_of, paths_of
from refdec.transformers.hybrid.ssd import tree_mamba2_scan_forward
from refdec.transformers.hybrid.state import new_hybrid_cache
from tiny_hybrids import tiny_hybrid


def test_each_row_equals_the_one_token_update_along_its_path():
    from transformers.models.mamba2.modeling_mamba2 import mamba2_scan_forward

    torch.manual_seed(1)
    mixer = tiny_hybrid("mamba2").to(torch.float32).backbone.layers[0].mixer
    paths, parent_rows = paths_of()
    rows = len(parent_rows)
    heads, head_dim, size = mixer.num_heads, mixer.head_dim, mixer.ssm_state_size
    x = torch.randn(1, rows, heads * head_dim)
    B, C = torch.randn(1, rows, size), torch.randn(1, rows, size)
    dt = torch.randn(1, rows, heads)
    state = torch.randn(1, heads, head_dim, size)

    def cache_holding(tensor):
        cache = new_hybrid_cache(["linear_attention"] * (mixer.layer_idx + 1))
        cache.layers[mixer.layer_idx].update_recurrent_state(tensor.clone())
        cache.layers[mixer.layer_idx].has_previous_state[0] = True
        return cache

    tree_cache = cache_holding(state)
    layer = tree_cache.layers[mixer.layer_idx]
    with torch.no_grad():
        out = tree_mamba2_scan_forward(paths, mixer, x, B, C, dt, tree_cache)
        assert torch.equal(layer.recurrent_states[0], state)  # nothing written before the commit
        for row in range(rows):
            plain = cache_holding(state)
            for step in path_of(parent_rows, row):  # plain decoding: one token at a time
                want = mamba2_scan_forward(mixer, x[:, step:step + 1], B[:, step:step + 1], C[:, step:step + 1],
                                           dt[:, step:step + 1], plain)
            torch.testing.assert_close(out[:, row], want[:, 0], rtol=1e-5, atol=1e-5)
            layer.recurrent_states[0].copy_(state)
            layer.pending[-1](torch.tensor([row]))
            torch.testing.assert_close(layer.recurrent_states[0], plain.layers[mixer.layer_idx].recurrent_states[0],
                                       rtol=1e-5, atol=1e-5)
