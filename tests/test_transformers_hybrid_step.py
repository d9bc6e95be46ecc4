"""Specifies refdec.transformers.hybrid.step, a hybrid model's own forward with its recurrent kernels
swapped for refdec's tree forms: every recurrent family refdec handles -- Gated DeltaNet (Qwen3.5,
Qwen3.5-MoE, Qwen3-Next), the Mamba2 mixers (Mamba2, GraniteMoeHybrid, Bamba, Falcon-H1,
Nemotron-H, Zamba2) and LFM2's short convolution (LFM2, LFM2-MoE) -- decodes through refdec to
``model.generate``'s greedy tokens, with drafts accepted whole, in part and not at all, from trees
that branch at several depths; same-seed sampling gives refdec's plain sampler's tokens; a batch
of prompts of different lengths, a chunked prefill and a prompt reusing a finished request's
entries and state give each prompt's own tokens; outside
refdec's step the wrapped kernels are transformers' own.

transformers computes the recurrent kernels in float32 whatever the model's dtype, so plain
decoding's own chunked prefill and one-token steps already round differently: the comparisons
are exact token equality, and a failure reports the smallest argmax margin of the plain decoding
it compared against (a margin far above float32's rounding means equality is not luck).
"""

from __future__ import annotations

import sys

import pytest
import torch

import refdec
from refdec.transformers.hybrid.step import TREE_FORMS, install
from tiny_hybrids import BUILDERS, corrupted_reference, hybrid, plain_greedy
from tiny_models import batch_row, lookup_factory, repetitive_prompts

NEW = 40
FAST = ("qwen3_5", "lfm2", "granitemoehybrid")  # one model per recurrent family in the fast tier


def _params(names=tuple(BUILDERS)):
    return [name if name in FAST else pytest.param(name, marks=pytest.mark.full) for name in names]


@pytest.mark.parametrize("name", _params())
def test_greedy_equals_generate_with_trees_accepted_in_part(name):
    model = hybrid(name)
    accepted = rejected = long_steps = 0
    for prompt in repetitive_prompts(3, seed=5):
        want, margin = plain_greedy(model, prompt, NEW)
        reference = corrupted_reference(want, len(prompt))
        for max_draft, shape, refs in [(16, "cxx", [reference]), (64, "tree", [reference]), ("auto", "wide", None),
                                       (4, "cxx", None)]:
            factory = None if shape == "cxx" else lookup_factory(shape)
            out = refdec.generate(model, prompt, max_new_tokens=NEW, eos_token_id=[], references=refs,
                                  max_draft_tokens=max_draft, proposer_factory=factory)
            assert out.sequences[0].tolist() == want, (name, max_draft, shape, f"smallest plain margin {margin:.3g}")
            accepted += out.stats.accepted_tokens
            rejected += out.stats.proposed_tokens - out.stats.accepted_tokens
            long_steps += out.stats.tokens_per_pass > 3
    assert accepted > 30 and rejected > 30 and long_steps, (accepted, rejected, long_steps)


@pytest.mark.parametrize("name", _params(("qwen3_5", "lfm2", "bamba")))
def test_the_full_head_path_gives_the_same_tokens(name):
    model = hybrid(name)
    prompt = repetitive_prompts(1, seed=8)[0]
    want, _ = plain_greedy(model, prompt, NEW)
    decoder = refdec.SpeculativeDecoder(model)
    decoder.backend.lazy_head = False  # every row's logits from the model's own forward
    out = decoder.generate(prompt, max_new_tokens=NEW, eos_token_id=[],
                           references=[corrupted_reference(want, len(prompt))], max_draft_tokens=16)
    assert out.sequences[0].tolist() == want
    assert out.stats.accepted_tokens > 5


@pytest.mark.parametrize("name", _params())
def test_same_seed_sampling_equals_plain_sampling(name):
    model = hybrid(name)
    for i, prompt in enumerate(repetitive_prompts(2, seed=9)):
        seed = 300 + i
        plain = refdec.generate(model, prompt, max_new_tokens=NEW, do_sample=True, temperature=0.8, seed=seed,
                                eos_token_id=[], max_draft_tokens=0)
        reference = corrupted_reference(plain.sequences[0].tolist(), len(prompt))
        out = refdec.generate(model, prompt, max_new_tokens=NEW, do_sample=True, temperature=0.8, seed=seed,
                              eos_token_id=[], references=[reference], max_draft_tokens=16)
        assert out.sequences.tolist() == plain.sequences.tolist(), (name, i)
        assert out.stats.accepted_tokens > 5


@pytest.mark.parametrize("name", _params())
def test_a_batch_of_prompts_of_different_lengths(name):
    model = hybrid(name)
    prompts = repetitive_prompts(4, seed=3)
    assert len({len(p) for p in prompts}) > 1
    wants = [plain_greedy(model, prompt, NEW)[0] for prompt in prompts]
    refs = [[corrupted_reference(want, len(prompt))] for want, prompt in zip(wants, prompts)]
    out = refdec.generate(model, prompts, max_new_tokens=NEW, eos_token_id=[], references=refs, max_draft_tokens=16)
    for b, (prompt, want) in enumerate(zip(prompts, wants)):
        assert batch_row(out, b, len(prompt)) == want, (name, b)
    assert out.stats.accepted_tokens > 20


@pytest.mark.parametrize("name", _params(("qwen3_5", "lfm2", "granitemoehybrid", "falcon_h1", "zamba2")))
def test_a_chunked_prefill_gives_the_same_tokens(name):
    model = hybrid(name)
    prompt = repetitive_prompts(1, seed=17)[0] * 3
    want, _ = plain_greedy(model, prompt, NEW)
    decoder = refdec.SpeculativeDecoder(model, prefill_chunk=7)
    out = decoder.generate(prompt, max_new_tokens=NEW, eos_token_id=[],
                           references=[corrupted_reference(want, len(prompt))], max_draft_tokens=16)
    assert out.sequences[0].tolist() == want


@pytest.mark.parametrize("name", _params(("qwen3_5", "lfm2", "granitemoehybrid", "falcon_h1", "zamba2", "mamba2")))
def test_a_prompt_that_extends_a_finished_one_reuses_its_entry_and_state(name):
    """A chat's next turn: the prompt begins with the whole of an earlier request's prompt and reply.
    Its KV entries and its recurrent state after them are reused, the rest prefilled on top; a
    prompt sharing only part of an entry cannot take the state (it is past that part) and is
    prefilled whole."""
    model = hybrid(name)
    first, more = repetitive_prompts(2, seed=21)
    decoder = refdec.SpeculativeDecoder(model)
    done = decoder.generate(first, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=16).sequences[0].tolist()
    follow_up = done + more[:9]
    want, margin = plain_greedy(model, follow_up, NEW)
    out = decoder.generate(follow_up, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=16,
                           references=[corrupted_reference(want, len(follow_up))])
    assert out.stats.cached_prompt_tokens == len(done) - 1  # the reply's last token was never run
    assert out.sequences[0].tolist() == want, (name, f"smallest plain margin {margin:.3g}")
    assert out.stats.accepted_tokens > 5
    part = first[:-2] + more[:5]  # shares all but the first prompt's last two tokens
    want, _ = plain_greedy(model, part, NEW)
    out = decoder.generate(part, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=16,
                           references=[corrupted_reference(want, len(part))])
    assert out.stats.cached_prompt_tokens == 0 and out.sequences[0].tolist() == want


def test_a_request_that_ends_inside_an_accepted_draft_is_kept_to_its_last_token():
    """An end-of-sequence token in the middle of an accepted chain: the entries past it are dropped
    with the step (refdec.engine.engine), so the row's state is its last kept token's and the row
    goes to the prefix cache; a follow-up prompt reuses it."""
    model = hybrid("qwen3_5")
    prompt, more = repetitive_prompts(2, seed=21)
    prompt = prompt * 2  # long enough to be worth reusing (refdec.transformers.backend.MIN_REUSED_TOKENS)
    want, _ = plain_greedy(model, prompt, NEW)
    eos = want[len(prompt) + 6]
    decoder = refdec.SpeculativeDecoder(model)
    out = decoder.generate(prompt, max_new_tokens=NEW, eos_token_id=[eos], max_draft_tokens=16,
                           references=[want[len(prompt) - 3:]])
    done = out.sequences[0].tolist()
    assert done[-1] == eos and out.stats.accepted_tokens > len(done) - len(prompt)  # drafts ran past it
    assert [entry.tokens.tolist() for entry in decoder.backend.prefix_cache.entries] == [done[:-1]]
    follow_up = done + more[:5]
    want, margin = plain_greedy(model, follow_up, 16)
    out = decoder.generate(follow_up, max_new_tokens=16, eos_token_id=[], max_draft_tokens=16)
    assert out.stats.cached_prompt_tokens == len(done) - 1
    assert out.sequences[0].tolist() == want, f"smallest plain margin {margin:.3g}"


def test_outside_a_tree_step_a_wrapped_kernel_is_transformers_own_and_wrapped_once():
    model = hybrid("lfm2")
    refdec.SpeculativeDecoder(model)  # installs the wrappers
    conv = model.model.layers[0].conv.conv  # the mixer's depthwise nn.Conv1d
    module = sys.modules[type(model.model.layers[0].conv).__module__]
    wrapped = module.causal_conv1d_forward
    assert wrapped.__refdec_tree_form__ is TREE_FORMS["causal_conv1d_forward"]
    x = torch.randn(1, conv.in_channels, 5, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(wrapped(conv, x, None, 0), wrapped.__wrapped_original__(conv, x, None, 0))
    install({module.__name__})
    assert module.causal_conv1d_forward is wrapped
