"""Specifies refdec.decode.inputs: a prompt (a list, a 1-D or [1, L] tensor), a list of prompts or
a left-padded batch, references (shared or per row, text or ids), seeds and eos ids are normalised
to one form; every malformed input is a ValueError naming it."""

from __future__ import annotations

import pytest
import torch

import refdec
from refdec.decode.inputs import split_references
from tiny_models import batch_row, hf_greedy, mixed_batch, repetitive_prompts

NEW = 40


@pytest.mark.parametrize("input_ids", [[1, 5, 6, 7], torch.tensor([1, 5, 6, 7]), torch.tensor([[1, 5, 6, 7]])])
def test_input_ids_forms_are_equivalent(llama, input_ids):
    out = refdec.generate(llama, input_ids, max_new_tokens=5, eos_token_id=[], max_draft_tokens=4)
    assert out.sequences.shape == (1, 9) and out.sequences.dtype == torch.long
    assert out.sequences[0, :4].tolist() == [1, 5, 6, 7]


def test_left_padded_tensor_with_attention_mask_equals_the_list_form(batch_family_model):
    name, model = batch_family_model
    prompts = mixed_batch()
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):] = torch.tensor(p)
        mask[b, width - len(p):] = 1
    a = refdec.generate(model, prompts, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=8)
    b = refdec.generate(model, ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=8)
    assert a.sequences.tolist() == b.sequences.tolist()
    assert a.sequences.shape == (len(prompts), width + NEW)
    # model.generate's layout: the padded prompt as given, then the new tokens
    assert torch.equal(b.sequences[:, :width], ids)
    # a list of [1, L] tensors (tokenizer(text, return_tensors="pt").input_ids, as the README builds ids)
    c = refdec.generate(model, [torch.tensor([p]) for p in prompts], max_new_tokens=NEW, eos_token_id=[],
                        max_draft_tokens=8)
    assert c.sequences.tolist() == a.sequences.tolist()


def test_a_single_padded_row_and_max_new_tokens_zero_and_one(llama):
    model = llama
    p = repetitive_prompts(1, seed=3)[0]
    ids = torch.tensor([[0, 0] + p])
    out = refdec.generate(model, ids, attention_mask=torch.tensor([[0, 0] + [1] * len(p)]), max_new_tokens=NEW,
                          eos_token_id=[], max_draft_tokens=16)
    assert out.sequences[0].tolist() == [0, 0] + hf_greedy(model, p)
    prompts = repetitive_prompts(3, seed=3)
    zero = refdec.generate(model, prompts, max_new_tokens=0)
    assert zero.sequences.shape == (3, max(len(q) for q in prompts)) and zero.stats.new_tokens == 0
    one = refdec.generate(model, prompts, max_new_tokens=1, eos_token_id=[])
    for b, q in enumerate(prompts):
        assert batch_row(one, b, len(q)) == hf_greedy(model, q, max_new_tokens=1)


@pytest.mark.parametrize("input_ids, message", [
    (torch.tensor([[[1, 2], [3, 4]]]), r"input_ids must have shape \[1, L\] or \[L\], got shape \(1, 2, 2\)"),
    ([], r"input_ids is empty"),
    (torch.zeros(1, 0, dtype=torch.long), r"input_ids is empty"),
    (torch.tensor([[1.0, 2.0]]), r"input_ids must hold integer token ids"),
    ([1, "a"], r"input_ids must be a list of ints; found 'a'"),
    ([1, 500], r"token id 500, outside the model vocabulary \[0, 96\)"),
    (list(range(3, 90)) * 6, r"prompt has 522 tokens, more than the model's max_position_embeddings=512"),
])
def test_bad_prompts_raise_clear_errors(llama, input_ids, message):
    with pytest.raises(ValueError, match=message):
        refdec.generate(llama, input_ids, max_new_tokens=3)


def test_batched_input_errors_name_the_problem(llama):
    model = llama
    prompts = repetitive_prompts(2, seed=1)
    from transformers.generation.streamers import BaseStreamer

    with pytest.raises(ValueError, match="streamer needs a single prompt"):
        refdec.generate(model, prompts, streamer=BaseStreamer(), max_new_tokens=4)
    with pytest.raises(ValueError, match="not left-padded"):
        refdec.generate(model, torch.tensor([[5, 6, 0], [5, 6, 7]]),
                        attention_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]), max_new_tokens=4)
    with pytest.raises(ValueError, match="per-row lists for a batch of 2"):
        refdec.generate(model, prompts, references=[[[5, 6]], [[7]], None], max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        refdec.generate(model, [[5, 6], []], max_new_tokens=4)
    with pytest.raises(ValueError, match="seed must be"):
        refdec.generate(model, prompts, do_sample=True, seed=[1], max_new_tokens=4)


def test_shared_references_serve_every_row(llama):
    model = llama
    prompts = repetitive_prompts(3, seed=4)
    refs = [hf_greedy(model, p)[len(p) - 3:] for p in prompts]  # one shared list: every row's continuation
    out = refdec.generate(model, prompts, references=refs, max_new_tokens=NEW, eos_token_id=[],
                          max_draft_tokens=32)
    for b, p in enumerate(prompts):
        assert batch_row(out, b, len(p)) == hf_greedy(model, p)
        assert out.stats.rows[b].accepted_by_source.get("reference", 0) > 10


def test_shared_references_of_empty_documents_are_not_taken_for_per_row_lists(llama):
    """[[]] or [[], []]: an empty list is an empty row or an empty token-list document; it was read
    as per-row lists, so a batch of another size was refused ("references has 1 per-row lists")."""
    assert split_references([[]], 2) == [[[]], [[]]]  # one shared (empty) document
    assert split_references([[], []], 3) == [[[], []]] * 3
    assert split_references([[], []], 2) == [[], []]  # counts agree: one (empty) list per row
    assert split_references([None, ["doc"]], 2) == [None, ["doc"]]
    with pytest.raises(ValueError, match="references has 2 per-row lists for a batch of 3"):
        split_references([None, ["doc"]], 3)
    model = llama
    prompts = repetitive_prompts(2, seed=5)
    out = refdec.generate(model, prompts, references=[[]], max_new_tokens=6, eos_token_id=[])
    for b, p in enumerate(prompts):
        assert batch_row(out, b, len(p)) == hf_greedy(model, p, max_new_tokens=6)


def test_text_references_are_tokenized_with_the_tokenizer(family_model, tiny_tokenizer):
    name, model = family_model
    prompt = repetitive_prompts(1, seed=9)[0]
    want = hf_greedy(model, prompt)
    text = tiny_tokenizer.decode(want[len(prompt) - 3:])
    out = refdec.generate(model, prompt, tokenizer=tiny_tokenizer, references=[text], max_new_tokens=NEW,
                            eos_token_id=[], max_draft_tokens=64)
    assert out.sequences[0].tolist() == want
    assert out.stats.accepted_by_source.get("reference", 0) > 10


def test_an_eos_token_id_outside_the_vocabulary_is_an_error(llama):
    with pytest.raises(ValueError, match=r"eos_token_id 1000 is outside the model vocabulary \[0, 96\)"):
        refdec.generate(llama, [1, 5, 6], max_new_tokens=2, eos_token_id=[2, 1000])
