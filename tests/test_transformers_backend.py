"""Specifies refdec.transformers.backend, what the engine drives: ``TransformersBackend`` runs a transformers
model through its runner: it knows the model's vocabulary, position limit, device and generation
config; ``prefill`` gives a left-padded group's running batch and each prompt's last logits;
``verify`` runs one forward over every row's root and tree and each row's acceptance walk (the
accepted nodes and the bonus token of the model's greedy decoding; the times of laying out the
inputs, of the forward and of the lazy head within it); a tree is verified as it is
(``fit_tree``); "auto" drafting's cost curve is refdec.transformers.calibration's for its model. The llama.cpp
backend: tests/test_llama_cpp_backend.py."""

from __future__ import annotations

import time

import numpy as np
import torch

from refdec.engine.requests import Request
from refdec.engine.results import DecodingStats
from refdec.engine.stops import StopChecker
import refdec.transformers.backend as backend_module
from refdec.drafting.tree import DraftTree
from refdec.transformers.backend import TransformersBackend
from tiny_models import VOCAB, hf_greedy, repetitive_prompts


def _request(row: int, prompt: list[int]) -> Request:
    return Request(row, np.array(prompt), 40, None, stats=DecodingStats(), sampler=None,
                   stopper=StopChecker(set(), [], None), drafter=None, budget=None, started=time.perf_counter())


def test_the_backend_knows_its_model(llama):
    backend = TransformersBackend(llama)
    assert (backend.vocab_size, backend.max_positions) == (VOCAB, llama.config.max_position_embeddings)
    assert backend.device == torch.device("cpu") and backend.generation_config is llama.generation_config
    assert len(backend.new_batch()) == 0
    tree = DraftTree.chain(np.array([5, 6, 7]))
    assert backend.fit_tree(tree, rows=3) is tree


def test_prefill_then_a_verification_step_follow_the_models_greedy_tokens(llama):
    backend = TransformersBackend(llama)
    prompts = [repetitive_prompts(1, seed=5)[0], repetitive_prompts(1, seed=6)[0][:9]]  # two widths: left padding
    greedy = [hf_greedy(llama, p, 8, eos_token_id=[])[len(p):] for p in prompts]
    with torch.inference_mode():
        steps = backend.prefill_steps([_request(b, p) for b, p in enumerate(prompts)], chunk=4)
        chunks = 0
        while True:  # a chunk per next(): the widest prompt's width in chunks of 4
            try:
                next(steps)
                chunks += 1
            except StopIteration as done:
                batch, logits = done.value
                break
        assert chunks + 1 == -(-max(map(len, prompts)) // 4)
        for b, prompt in enumerate(prompts):
            alone = llama(torch.tensor([prompt])).logits[0, -1]
            assert torch.allclose(logits[b], alone, rtol=0, atol=1e-10), b
        # each row's root is its first new token; its draft: the next 4 greedy tokens, then (row 0) a wrong one
        trees = [DraftTree.chain(np.array(greedy[0][1:5] + [(greedy[0][5] + 1) % VOCAB])),
                 DraftTree.chain(np.array([(greedy[1][1] + 1) % VOCAB] + greedy[1][2:4]))]
        roots = np.array([g[0] for g in greedy])
        root_pos = np.array([len(p) for p in prompts])
        verified = backend.verify(batch, trees, roots, root_pos, [None, None])
    (accepted0, bonus0), (accepted1, bonus1) = verified.walks
    assert accepted0.tolist() == [0, 1, 2, 3] and bonus0 == greedy[0][5]
    assert accepted1.tolist() == [] and bonus1 == greedy[1][1]  # the first draft token is wrong: the model's own
    assert verified.forward_seconds > 0 and verified.prepare_seconds > 0
    assert 0 < verified.lazy_head_seconds < verified.forward_seconds  # a CPU: the lazy head's share
    assert verified.head_rows[0] >= 5 and verified.head_rows[1] >= 1


def test_auto_drafting_uses_refdec_calibrations_curve_for_the_model(llama, monkeypatch):
    asked = []
    monkeypatch.setattr(backend_module, "auto_cost_curve", lambda model: asked.append(model) or "curve")
    assert TransformersBackend(llama).auto_cost_curve() == "curve" and asked == [llama]


def test_a_prompt_that_begins_as_an_earlier_one_did_is_prefilled_on_its_entries(mask_family_model):
    """Gemma 3's sliding layers (window 8) see the reused entries through the prefill window."""
    import refdec

    _, model = mask_family_model
    rng = np.random.default_rng(3)
    first = rng.integers(3, VOCAB, 70).tolist()
    edited = first[:60] + rng.integers(3, VOCAB, 9).tolist()  # shares 60 tokens with the first
    other = rng.integers(3, VOCAB, 50).tolist()
    decoder = refdec.SpeculativeDecoder(model)
    decoder.generate(first, max_new_tokens=12, max_draft_tokens=8)
    out = decoder.generate(edited, max_new_tokens=24, max_draft_tokens=8)
    assert out.stats.cached_prompt_tokens == 60
    assert out.sequences[0].tolist() == hf_greedy(model, edited, 24)
    # in a group: the row with a kept prefix is prefilled on it, the other with none; each as alone
    batch = decoder.generate([other, first], max_new_tokens=16, max_draft_tokens=8)
    assert [row.cached_prompt_tokens for row in batch.stats.rows] == [0, 69]
    for b, prompt in enumerate((other, first)):
        assert batch.sequences[b, -(len(prompt) + 16):].tolist() == hf_greedy(model, prompt, 16)  # left-padded
    none = refdec.SpeculativeDecoder(model, prefix_cache=0)
    none.generate(first, max_new_tokens=4)
    assert none.generate(first, max_new_tokens=4).stats.cached_prompt_tokens == 0
    decoder.backend.clear_prefix_cache()
    assert decoder.generate(first, max_new_tokens=4).stats.cached_prompt_tokens == 0
