"""A one-time self-check that tree verification is lossless for a model type refdec
has not verified (refdec.transformers.model_support).

:func:`check_tree_verification` runs the engine's own steps on a one-row running batch: a
small branching tree verified with the inputs the engine lays out for the model's runner
(refdec.transformers.verify.step_inputs), the cache keeping the accepted path, whose nodes were
not contiguous (refdec.transformers.batch.RunningBatch.keep_accepted), a second tree verified, and
the path rows' logits compared with one plain forward over the same tokens. The transformers
backend runs it (:func:`ensure_lossless_tree_verification`) once its runner is built.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from refdec.drafting.tree import DraftTree
from refdec.transformers.model_support import VERIFIED_MODEL_TYPES, model_type
from refdec.transformers.prefill import prefill_tokens
from refdec.transformers.runner import ModelRunner
from refdec.transformers.verify import step_inputs

__all__ = ["TreeVerificationError", "check_tree_verification", "ensure_lossless_tree_verification"]

# Logits of the path rows may differ from a plain forward by rounding only (other GEMM
# shapes): a tolerance relative to the logits' scale, per dtype.
_REL_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-3, torch.bfloat16: 6e-2, torch.float16: 1e-2}


class TreeVerificationError(ValueError):
    """Tree verification would not give ``model`` plain decoding's tokens."""


_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # models that passed the check


def ensure_lossless_tree_verification(runner: ModelRunner) -> None:
    """Run :func:`check_tree_verification` once per model object whose type is not in
    VERIFIED_MODEL_TYPES (raises ValueError if it fails); ``runner``: the model's runner."""
    model = runner.model
    if model_type(model) in VERIFIED_MODEL_TYPES or model in _CHECKED:
        return
    try:
        check_tree_verification(runner)
    except TreeVerificationError:
        raise
    except Exception as exc:  # the forward itself fails on a tree's 4D mask or position_ids
        raise TreeVerificationError(f"model type {model_type(model)!r}: verifying a draft tree fails "
                                    f"({type(exc).__name__}: {exc}), so refdec cannot decode it") from exc
    _CHECKED[model] = True


def check_tree_verification(runner: ModelRunner, prompt_len: int = 24) -> None:
    """Raise ValueError if verifying a tree through ``runner`` (the model's
    refdec.transformers.runner.ModelRunner, its inputs as the engine lays them out) and keeping the
    accepted path in the cache gives the model other logits than plain decoding. Costs four
    forwards of at most ``prompt_len + 7`` tokens (a plain one, the prompt's prefill, two trees)."""
    model = runner.model
    vocab = runner.vocab_size
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, max(4, min(vocab, 1000)), size=prompt_len + 9).tolist()
    prompt, root, rest = tokens[:prompt_len], tokens[prompt_len], tokens[prompt_len + 1:]
    # tree 1 below the root: a decoy branch of two nodes, then the path c -> d -> e in nodes 2..4
    first = DraftTree(np.array([(rest[0] + 1) % vocab, (rest[0] + 2) % vocab, rest[0], rest[1], rest[2]]),
                      np.array([-1, 0, -1, 2, 3]), np.ones(5, np.float32))
    # tree 2 below the next root (rest[3]): a chain of two, then a decoy
    second = DraftTree(np.array([rest[4], rest[5], (rest[4] + 1) % vocab]), np.array([-1, 0, -1]),
                       np.ones(3, np.float32))
    # (tree, root token, root position, the path kept: node indices)
    steps = [(first, root, prompt_len, np.array([2, 3, 4])), (second, rest[3], prompt_len + 4, np.array([0, 1]))]
    sequence = prompt + [root, rest[0], rest[1], rest[2], rest[3], rest[4], rest[5]]
    with torch.inference_mode():
        plain = model(input_ids=torch.tensor([sequence], device=runner.device)).logits[0].float()
        batch, _ = prefill_tokens(runner, np.array(prompt))
        got = []
        for tree, root_token, root_pos, path in steps:
            roots, root_pos = np.array([root_token]), np.array([root_pos])
            inputs, _ = step_inputs(runner, batch, [tree], roots, root_pos)
            logits = runner.logits(batch.cache, **inputs.model_kwargs())[0].float()  # [1 + n, V]
            got.append(logits[np.concatenate([[0], path + 1])])  # the root, then the path
            batch.keep_accepted(root_pos, [path])
    got = torch.cat(got)
    want = plain[prompt_len:prompt_len + 7]
    scale = float(want.abs().max()) or 1.0
    diff = float((got - want).abs().max())
    tolerance = _REL_TOLERANCE.get(model.dtype, 1e-2) * scale
    if runner.hybrid is not None:  # transformers computes the recurrent kernels in float32 whatever the dtype
        tolerance = max(tolerance, _REL_TOLERANCE[torch.float32] * scale)
    if not diff <= tolerance:
        raise TreeVerificationError(
            f"model type {model_type(model)!r}: verifying a draft tree gives other logits than plain decoding "
            f"(max difference {diff:.3g}, logits up to {scale:.3g}), so refdec cannot decode it losslessly; it "
            "probably takes positions from the KV cache's slots rather than position_ids")
