"""A tiny random float64 Llama and repetitive prompts for it, built from a transformers
config (no hub, no weights, no data): a decoder to run many calls on in a second.

The same construction as the test suite's ``tiny_llama`` / ``repetitive_prompts``
(tests/tiny_models.py; tests/benchmarks/test_bench_package.py checks that both give the same weights and
prompts), so ``long_run.py`` measures the setup its recorded figures were taken with. It is
written again here rather than imported because tests/ is not a package the benchmarks may
depend on.
"""

from __future__ import annotations

import numpy as np
import torch

VOCAB = 96


def tiny_llama(seed: int = 0, scale: float = 3.0):
    """A 2-layer Llama (hidden 48, vocab VOCAB) in float64, eval mode, with the embedding and
    LM head scaled by ``scale`` so that greedy decoding falls into loops (drafts get accepted)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                      initializer_range=0.02)
    model = LlamaForCausalLM(cfg).to(torch.float64).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(scale)
        model.lm_head.weight.mul_(scale)
    model.generation_config.pad_token_id = 0
    return model


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
