"""Specifies refdec.transformers.plain_head: the backbone plus the verifier's own head (``W @ h.T``) give
the model's logits (``split_forward_fn``; a hooked head falls back to the model's forward); a single
row, padded to the head's minimum, gives ``F.linear``'s logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tiny_models
from tiny_models import one_tree_inputs
from refdec.drafting.tree import DraftTree
from refdec.transformers.cache import new_cache
from refdec.transformers.model_support import cache_kwarg, mask_spec_for
from refdec.transformers.plain_head import split_forward_fn


@pytest.mark.parametrize("name", tiny_models.family_params())
def test_tree_forward_equals_the_model_forward_on_a_tree(tiny_model_cache, name):
    model = tiny_models.cached_model(tiny_model_cache, name)
    split = split_forward_fn(model)
    assert split is not None
    backbone, head = split

    def forward(cache, **inputs):
        return head.logits(backbone(cache, **inputs)[0])

    spec = mask_spec_for(model)
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]])
    # root -> 20 -> 21, root -> 22
    tree = DraftTree(np.array([20, 21, 22]), np.array([-1, 0, -1]), np.ones(3, np.float32))
    inputs = one_tree_inputs(tree, 17, prompt.shape[1], spec)
    logits = []
    with torch.inference_mode():
        for use_fast in (True, False):
            cache = new_cache()
            model(input_ids=prompt, use_cache=True, **{cache_kwarg(model): cache})
            kwargs = dict(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                          attention_mask=inputs.attention_mask)
            if use_fast:
                logits.append(forward(cache, **kwargs))
            else:
                logits.append(model(use_cache=True, **{cache_kwarg(model): cache}, **kwargs).logits[0])
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-10, atol=1e-10)


def test_hooked_head_falls_back_to_the_model_forward():
    model = tiny_models.tiny_llama()
    model.lm_head.register_forward_hook(lambda module, inputs, output: output * 2)
    assert split_forward_fn(model) is None


def test_plain_head_pads_a_single_row_and_matches_linear():
    model = tiny_models.tiny_llama()
    _, head = split_forward_fn(model)
    h = torch.randn(1, model.config.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(head.logits(h), torch.nn.functional.linear(h, model.lm_head.weight),
                               rtol=1e-10, atol=1e-10)
    assert head.logits(h).shape == (1, model.config.vocab_size)
