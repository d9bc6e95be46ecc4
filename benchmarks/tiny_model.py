"""Tiny random Llama / Qwen2 / Gemma 3 models and repetitive prompts for them, built from
transformers configs (no hub, no weights, no data): decoders to run many calls on in a second.

The same construction as the test suite's ``tiny_llama`` / ``tiny_qwen2`` / ``tiny_gemma3`` /
``repetitive_prompts`` (tests/tiny_models.py; tests/benchmarks/test_bench_package.py checks that
both give the same weights and prompts), so ``leak_check.py`` measures the setup its recorded
figures were taken with and ``gpu.py`` checks on a GPU the models the tests check on a CPU. It is
written again here rather than imported because tests/ is not a package the benchmarks may
depend on. ``dtype``: float64 as the tests build them; ``gpu.py`` asks for float32.
"""

from __future__ import annotations

import numpy as np
import torch

VOCAB = 96
INIT = 0.02


def _finish(model, scale: float, dtype: torch.dtype):
    """``model`` in ``dtype``, eval mode, with the embedding and LM head scaled by ``scale`` so that
    greedy decoding falls into loops (drafts get accepted)."""
    model = model.to(dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight"):
                p.mul_(scale)
    model.generation_config.pad_token_id = 0
    return model


# the tiny Llama's and Qwen2's configuration (as tests/tiny_models.py's)
_TWO_LAYERS = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                   tie_word_embeddings=False, initializer_range=INIT)


def tiny_llama(seed: int = 0, scale: float = 3.0, dtype: torch.dtype = torch.float64):
    """A 2-layer Llama (hidden 48, vocab VOCAB)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return _finish(LlamaForCausalLM(LlamaConfig(**_TWO_LAYERS)), scale, dtype)


def tiny_qwen2(seed: int = 0, scale: float = 3.0, dtype: torch.dtype = torch.float64):
    """A 2-layer Qwen2 (hidden 48, vocab VOCAB)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return _finish(Qwen2ForCausalLM(Qwen2Config(**_TWO_LAYERS)), scale, dtype)


def tiny_gemma3(seed: int = 0, scale: float = 3.0, sliding_window: int = 8, dtype: torch.dtype = torch.float64):
    """A 3-layer Gemma 3 (sliding, full, sliding attention; window ``sliding_window``)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                           sliding_window=sliding_window,
                           layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                           query_pre_attn_scalar=16, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                           tie_word_embeddings=False, initializer_range=INIT)
    return _finish(Gemma3ForCausalLM(cfg), scale, dtype)


TINY_MODELS = {"llama": tiny_llama, "qwen2": tiny_qwen2, "gemma3": tiny_gemma3}


def repetitive_prompts(count: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts (BOS = 1 first): a random span of 4-11 ids in [3, VOCAB) repeated 2-3
    times, each copy with one id changed half the time, then a prefix of the span."""
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(count):
        span = rng.integers(3, VOCAB, size=int(rng.integers(4, 12))).tolist()
        out = [1]
        for _ in range(int(rng.integers(2, 4))):
            piece = list(span)
            if rng.random() < 0.5:
                piece[int(rng.integers(len(piece)))] = int(rng.integers(3, VOCAB))
            out += piece
        out += span[: int(rng.integers(1, len(span)))]
        prompts.append(out)
    return prompts
