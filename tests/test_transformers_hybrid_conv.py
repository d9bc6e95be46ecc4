"""Specifies refdec.transformers.hybrid.conv: the tree convolution of every row equals transformers'
one-token convolution run along the row's path from the cached window, and the committed window is
the accepted row's last inputs."""

from __future__ import annotations

import pytest
import torch

from hybrid_trees import path_of, paths_of
from refdec.transformers.hybrid.conv import tree_conv1d_forward
from refdec.transformers.hybrid.state import new_hybrid_cache


@pytest.mark.parametrize("activation", [None, "silu"])
def test_each_row_equals_the_one_token_convolution_along_its_path(activation):
    from transformers.models.lfm2.modeling_lfm2 import causal_conv1d_update

    torch.manual_seed(0)
    paths, parent_rows = paths_of()
    rows, channels, kernel = len(parent_rows), 6, 4
    conv = torch.nn.Conv1d(channels, channels, kernel, groups=channels, bias=True, padding=kernel - 1).double()
    window = torch.randn(1, channels, kernel, dtype=torch.float64)
    x = torch.randn(1, channels, rows, dtype=torch.float64)
    cache = new_hybrid_cache(["conv"])
    cache.layers[0].update_conv_state(window.clone(), conv_kernel_size=kernel)
    cache.layers[0].has_previous_state[0] = True
    cache.layers[0].conv_states[0].copy_(window)
    with torch.no_grad():
        out = tree_conv1d_forward(paths, conv, x, cache, 0, activation=activation)
        for row in range(rows):
            state = window.clone()
            for step in path_of(parent_rows, row):
                want = causal_conv1d_update(x[:, :, step:step + 1], state, conv.weight.squeeze(1), conv.bias,
                                            activation=activation)
            torch.testing.assert_close(out[:, :, row], want[:, :, 0], rtol=0, atol=1e-12)
            cache.layers[0].conv_states[0].copy_(window)
            cache.layers[0].pending[0](torch.tensor([row]))
            assert torch.equal(cache.layers[0].conv_states[0], state), row
