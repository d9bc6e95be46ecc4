"""Specifies refdec.engine.arguments: ``generate``'s arguments checked and normalised in one place.
A prompt (a list, a 1-D or [1, L] tensor), a list of prompts or a left-padded batch, references
(shared or per row, text or ids), seeds and eos ids are normalised to one form; every malformed
argument is a ValueError naming it (an unknown keyword argument a TypeError). The logits settings of
``model.generate`` (from the model's generation_config or as arguments) are applied where refdec can
apply them per tree path and refused, naming them, where it cannot; sampling arguments greedy
decoding does not read warn; an index built with another tokenizer is refused."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import refdec
from refdec.engine.arguments import (eos_ids, is_batched_input, normalize_batch, normalize_prompt,
                                     normalize_references, parse_arguments, row_seeds, split_references)
from refdec.drafting.index import CorpusIndex
from refdec.engine.settings import DecodeSettings
from tiny_models import batch_row, hf_greedy, mixed_batch, repetitive_prompts, tiny_gpt2, tiny_llama

NEW = 40
VOCAB = 96


# ---------------------------------------------------------------- the functions


def fake_backend(eos_token_id=None, pad_token_id=None):
    """What parse_arguments reads of a backend: its vocabulary, positions and generation_config."""
    config = SimpleNamespace(eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    return SimpleNamespace(vocab_size=VOCAB, max_positions=512, generation_config=config)


def parse(input_ids, backend=None, **arguments):
    """parse_arguments with generate's defaults; the keywords of the decoding settings make its
    DecodeSettings (refdec.engine.settings), as generate makes it."""
    defaults = dict(tokenizer=None, index=None, references=None, streamer=None, attention_mask=None,
                    pad_token_id=None, retrieve=0, max_batch_size=None, on_row_done=None)
    names = {f.name for f in dataclasses.fields(DecodeSettings)}
    logits = arguments.pop("logits_settings", {})
    settings = DecodeSettings.of(**{name: arguments.pop(name) for name in list(arguments) if name in names}, **logits)
    return parse_arguments(backend or fake_backend(), input_ids, settings, **{**defaults, **arguments})


def test_one_prompt_is_parsed_into_a_single_row_with_its_references_and_no_padding():
    args = parse(torch.tensor([[1, 5, 6]]), fake_backend(eos_token_id=[2, 95]), references=[[5, 6]],
                 max_new_tokens=np.int64(4))
    assert args.single and args.padded is None and args.pad_token_id is None
    assert [p.tolist() for p in args.prompts] == [[1, 5, 6]] and args.prompts[0].dtype == np.int64
    assert [[r.tolist() for r in refs] for refs in args.references] == [[[5, 6]]]
    assert args.eos == {2, 95} and args.seeds == [None] and args.max_batch_size == 1
    assert type(args.max_new_tokens) is int and args.max_new_tokens == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.max_new_tokens = 5


def test_a_batch_is_parsed_into_rows_with_their_seeds_and_a_pad_id():
    args = parse([[1, 5], [6, 7, 8]], do_sample=True, seed=7, references=[None, [[9]]])
    assert not args.single and args.padded is None and [p.tolist() for p in args.prompts] == [[1, 5], [6, 7, 8]]
    assert args.seeds == [7, 8] and args.max_batch_size == 2
    assert args.references[0] == [] and [r.tolist() for r in args.references[1]] == [[9]]
    # the pad id: the argument, else the generation_config's, else the least eos id, else 0
    assert parse([[1], [2]], fake_backend(eos_token_id=[9, 4], pad_token_id=3), pad_token_id=5).pad_token_id == 5
    assert parse([[1], [2]], fake_backend(eos_token_id=[9, 4], pad_token_id=3)).pad_token_id == 3
    assert parse([[1], [2]], fake_backend(eos_token_id=[9, 4])).pad_token_id == 4
    assert parse([[1], [2]], fake_backend()).pad_token_id == 0
    with pytest.raises(ValueError, match="pad_token_id must be an int >= 0, got -1"):
        parse([[1], [2]], pad_token_id=-1)
    assert parse([[1], [2]], max_batch_size=1).max_batch_size == 1


@pytest.mark.parametrize("input_ids, batched", [
    ([1, 5, 6], False), (torch.tensor([1, 5, 6]), False), (torch.tensor([[1, 5, 6]]), False),
    ([], False), ([[1, 5], [6]], True), ([torch.tensor([[1, 5]])], True), (np.array([[1, 5], [6, 7]]), True),
])
def test_a_list_of_prompts_or_a_matrix_of_several_rows_is_a_batch(input_ids, batched):
    assert is_batched_input(input_ids) is batched


def test_one_row_with_padding_in_its_mask_is_a_batch_and_one_without_is_a_prompt():
    ids = torch.tensor([[0, 5, 6]])
    assert is_batched_input(ids, torch.tensor([[0, 1, 1]]))
    assert not is_batched_input(ids, torch.tensor([[1, 1, 1]]))
    assert not is_batched_input(ids, [[1, 1, 1]])


@pytest.mark.parametrize("input_ids", [[1, 5, 6], (1, 5, 6), np.array([1, 5, 6], dtype=np.int32),
                                       torch.tensor([1, 5, 6]), torch.tensor([[1, 5, 6]])])
def test_a_prompt_becomes_an_int64_vector(input_ids):
    prompt = normalize_prompt(input_ids, VOCAB)
    assert prompt.dtype == np.int64 and prompt.tolist() == [1, 5, 6]


@pytest.mark.parametrize("input_ids, message", [
    (torch.tensor([[1, 2], [3, 4]]), r"input_ids has 2 rows where one sequence was expected \(shape \[1, L\]\)"),
    (np.zeros((1, 1, 2), dtype=np.int64), r"input_ids must have shape \[1, L\] or \[L\], got shape \(1, 1, 2\)"),
    (np.zeros(0, dtype=np.int64), r"input_ids is empty: each prompt needs at least one token \(refdec adds no BOS"),
    ([5, 96], r"input_ids holds token id 96, outside the model vocabulary \[0, 96\)"),
    ([5, -1], r"input_ids holds token id -1, outside the model vocabulary"),
    ("hello", r"input_ids must be a sequence of token ids, got str \(tokenize the text first\)"),
])
def test_a_malformed_prompt_is_an_error_naming_input_ids(input_ids, message):
    with pytest.raises(ValueError, match=message):
        normalize_prompt(input_ids, VOCAB)


def test_a_list_of_prompts_is_kept_as_rows_and_a_padded_matrix_loses_its_padding():
    rows, padded = normalize_batch([[1, 5], torch.tensor([[6, 7, 8]]), np.array([9])], None, VOCAB)
    assert [r.tolist() for r in rows] == [[1, 5], [6, 7, 8], [9]] and padded is None
    assert all(r.dtype == np.int64 for r in rows)
    ids = np.array([[0, 0, 5], [0, 6, 7], [8, 9, 10]], dtype=np.int32)
    rows, padded = normalize_batch(ids, torch.tensor([[0, 0, 1], [0, 1, 1], [1, 1, 1]]), VOCAB)
    assert [r.tolist() for r in rows] == [[5], [6, 7], [8, 9, 10]]
    assert padded.dtype == np.int64 and padded.tolist() == ids.tolist()
    rows, _ = normalize_batch(torch.tensor([[0, 5], [6, 7]]), None, VOCAB)  # no mask: every column is a token
    assert [r.tolist() for r in rows] == [[0, 5], [6, 7]]


@pytest.mark.parametrize("input_ids, mask, message", [
    ([[1, 5], [6]], [[1, 1], [0, 1]],
     r"attention_mask is for a padded \[B, L\] input_ids; a list of prompts needs none"),
    (torch.tensor([[1.0, 2.0], [3.0, 4.0]]), None, r"input_ids must hold integer token ids, got dtype torch.float32"),
    (np.array([[1.0, 2.0], [3.0, 4.0]]), None, r"input_ids must hold integer token ids, got dtype float64"),
    (np.zeros((2, 1, 2), dtype=np.int64), None, r"batched input_ids must have shape \[B, L\], got \(2, 1, 2\)"),
    (torch.tensor([[5, 6, 7], [5, 6, 7]]), torch.ones(2, 2), r"attention_mask has shape \(2, 2\), input_ids \(2, 3\)"),
    (torch.tensor([[5, 6], [5, 6]]), torch.tensor([[1, 2], [1, 1]]),
     r"attention_mask must hold 0 \(padding\) and 1 \(token\) only"),
    (torch.tensor([[5, 6], [5, 6]]), torch.tensor([[1, 1], [1, 0]]),
     r"attention_mask row 1 is not left-padded \(a 0 after a 1\); pad on the left"),
    ([], None, r"input_ids holds no prompt"),
    ([[5, 6], []], None, r"prompt 1 is empty: each prompt needs at least one token"),
    (torch.tensor([[0, 0], [5, 6]]), torch.tensor([[0, 0], [1, 1]]), r"prompt 0 is empty"),
    ([[5, 6], [7, "x"]], None, r"input_ids\[1\] must be a list of ints; found 'x'"),
    ([[5, 6], [7, 96]], None, r"prompt 1 holds token id 96, outside the model vocabulary \[0, 96\)"),
])
def test_a_malformed_batch_is_an_error_naming_the_row_or_the_mask(input_ids, mask, message):
    with pytest.raises(ValueError, match=message):
        normalize_batch(input_ids, mask, VOCAB)


class BosTokenizer:
    """Characters as ids 3.., with a BOS (1) first unless add_special_tokens=False."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1] * add_special_tokens + [3 + ord(c) - ord("a") for c in text]}


def test_references_become_int32_token_arrays_and_text_is_tokenized_without_special_tokens():
    refs = normalize_references([[5, 6], (7,), np.array([[8, 9]]), torch.tensor([10]), "ab"], BosTokenizer())
    assert [r.tolist() for r in refs] == [[5, 6], [7], [8, 9], [10], [3, 4]]
    assert all(r.dtype == np.int32 for r in refs)
    assert normalize_references(None, None) == [] and normalize_references([], None) == []


@pytest.mark.parametrize("references, message", [
    ("text", r"references must be a list of str or of token-id lists, got str"),
    ({"a": [1]}, r"references must be a list of str or of token-id lists, got dict"),
    (["text"], r"references\[0\] is a str; text references need tokenizer=..."),
    ([[1], 5], r"references\[1\] must be a str or a list of token ids, got int"),
    ([[1], [2, -1]], r"references\[1\] must be token ids in \[0, 2\*\*31\); references\[1\]\[1\] = -1"),
])
def test_a_malformed_reference_is_an_error_naming_its_index(references, message):
    with pytest.raises(ValueError, match=message):
        normalize_references(references, None)


def test_references_are_shared_by_every_row_unless_given_one_list_per_row():
    assert split_references(None, 2) == [None, None]
    assert split_references([[5, 6], [7]], 3) == [[[5, 6], [7]]] * 3  # token-id documents: shared
    assert split_references(["doc a", "doc b"], 2) == [["doc a", "doc b"]] * 2  # text documents: shared
    assert split_references([["doc a"], None], 2) == [["doc a"], None]  # a list (or None) per row


def test_row_b_gets_seed_plus_b_or_the_bth_listed_seed():
    assert row_seeds(7, 3) == [7, 8, 9]
    assert row_seeds([4, 0, 4], 3) == [4, 0, 4]
    drawn = row_seeds(None, 3)
    assert drawn == [drawn[0], drawn[0] + 1, drawn[0] + 2] and drawn[0] >= 0
    for bad in ([1, 2], [1, -2, 3], [1, 2.0, 3], (1, True, 3)):
        with pytest.raises(ValueError, match=r"seed must be an int >= 0 or a list of 3 ints >= 0, got"):
            row_seeds(bad, 3)


def test_eos_ids_come_from_the_argument_or_else_the_generation_config():
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[2, 95]))
    assert eos_ids(None, model, VOCAB) == {2, 95}
    assert eos_ids(7, model, VOCAB) == {7} and eos_ids([3, 4], model, VOCAB) == {3, 4}
    assert eos_ids(torch.tensor([5, 6]), model, VOCAB) == {5, 6} and eos_ids([], model, VOCAB) == set()
    model.generation_config.eos_token_id = 2
    assert eos_ids(None, model, VOCAB) == {2}
    model.generation_config.eos_token_id = None
    assert eos_ids(None, model, VOCAB) == set()
    # an id outside the vocabulary is an error when given, and kept (never emitted) from the config
    with pytest.raises(ValueError, match=r"eos_token_id 96 is outside the model vocabulary \[0, 96\)"):
        eos_ids([2, 96], model, VOCAB)
    model.generation_config.eos_token_id = [2, 200]
    assert eos_ids(None, model, VOCAB) == {2, 200}
    for bad in ("x", -1, [2, -1], True, [2.0]):
        with pytest.raises(ValueError, match=r"eos_token_id must be an int >= 0 or a list of them, got"):
            eos_ids(bad, model, VOCAB)


# ---------------------------------------------------------------- through generate


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


# ---------------------------------------------------------------- every other argument, through generate


BAD_ARGUMENTS = [
    (dict(max_new_tokens=-1), r"max_new_tokens must be an int >= 0, got -1"),
    (dict(max_new_tokens=2.5), r"max_new_tokens .* got 2.5"),
    (dict(max_draft_tokens=-3), r"max_draft_tokens must be >= 0, got -3"),
    (dict(max_draft_tokens="many"), r"max_draft_tokens must be an int >= 0 or 'auto', got 'many'"),
    (dict(max_draft_tokens=1.5), r"max_draft_tokens .* got 1.5"),
    (dict(do_sample=True, temperature=0.0), r"temperature must be > 0 when do_sample=True, got 0.0"),
    (dict(do_sample=True, temperature=-1), r"temperature must be > 0 .* got -1"),
    (dict(do_sample="yes"), r"do_sample must be True or False, got 'yes'"),
    (dict(top_p=0.0), r"top_p must be None or a number in \(0, 1\], got 0.0"),
    (dict(top_p=1.5), r"top_p .* got 1.5"),
    (dict(top_k=0), r"top_k must be None or an int >= 1, got 0"),
    (dict(min_p=1.5), r"min_p must be None or a number in \[0, 1\], got 1.5"),
    (dict(min_p="0.1"), r"min_p .* got '0.1'"),
    (dict(seed=-2), r"seed must be None or an int >= 0, got -2"),
    (dict(eos_token_id="x"), r"eos_token_id must be .* got 'x'"),
    (dict(stop_strings=["stop"]), r"stop_strings needs a tokenizer"),
    (dict(stop_strings=[""]), r"stop_strings must be"),
    (dict(references=["some text"]), r"references\[0\] is a str; text references need tokenizer"),
    (dict(references="text"), r"references must be a list"),
    (dict(streamer=object()), r"streamer must have put\(\) and end\(\)"),
    (dict(index="corpus.idx"), r"index must be a refdec.CorpusIndex, a refdec.ShardedIndex or None, got str"),
    (dict(attention_mask=torch.tensor([[0, 1, 1]])), r"attention_mask for a single prompt must be all ones"),
    (dict(attention_mask=[1, 1]), r"attention_mask for a single prompt must be all ones of its length 3"),
]


@pytest.mark.parametrize("kwargs, message", BAD_ARGUMENTS, ids=[str(k) for k, _ in BAD_ARGUMENTS])
def test_bad_arguments_raise_value_errors_naming_them(llama, kwargs, message):
    with pytest.raises(ValueError, match=message):
        refdec.generate(llama, [1, 5, 6], **kwargs)


@pytest.mark.parametrize("bad", [-1, -64, 1.5, 8.0, "many", "", None, True, [4], object()])
def test_bad_max_draft_tokens_is_a_value_error_naming_it(llama, bad):
    with pytest.raises(ValueError, match="max_draft_tokens"):
        refdec.SpeculativeDecoder(llama).generate([1, 5, 6, 5, 6], max_new_tokens=3, max_draft_tokens=bad)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_max_batch_size_must_be_a_positive_int_or_none(llama, bad):
    model = llama
    with pytest.raises(ValueError, match="max_batch_size"):
        refdec.generate(model, mixed_batch(), max_new_tokens=4, max_batch_size=bad)
    with pytest.raises(ValueError, match="max_batch_size"):
        refdec.generate(model, [5, 6, 7], max_new_tokens=4, max_batch_size=bad)


def test_on_row_done_must_be_callable_and_is_for_batches_only(llama):
    prompts = repetitive_prompts(2, seed=47)
    with pytest.raises(ValueError, match="on_row_done applies to batches"):
        refdec.generate(llama, prompts[0], max_new_tokens=3, on_row_done=print)
    with pytest.raises(ValueError, match="on_row_done must be callable or None, got int"):
        refdec.generate(llama, prompts, max_new_tokens=3, on_row_done=3)


def test_retrieve_without_index_or_without_signatures_or_negative_is_a_clear_error(llama):
    decoder = refdec.SpeculativeDecoder(llama)
    with pytest.raises(ValueError, match="needs a corpus index"):
        decoder.generate([1, 5, 6], max_new_tokens=2, retrieve=1)
    rng = np.random.default_rng(0)
    documents = [rng.integers(3, VOCAB, size=300).astype(np.int32) for _ in range(2)]
    unsigned = CorpusIndex.build(documents, vocab_size=VOCAB, show_progress=False)
    with pytest.raises(ValueError, match="no MinHash signatures"):
        decoder.generate([1, 5, 6], index=unsigned, max_new_tokens=2, retrieve=1)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="retrieve"):
            decoder.generate([1, 5, 6], index=unsigned, max_new_tokens=2, retrieve=bad)
    # retrieve=0 (the default) needs no signatures
    assert decoder.generate([1, 5, 6], index=unsigned, max_new_tokens=2, retrieve=0).stats.new_tokens == 2


# ---------------------------------------------------------------- the logits settings, sampling and the index


@pytest.mark.parametrize("field", ["guidance_scale"])
def test_a_logits_setting_in_the_generation_config_is_an_error_naming_it(field):
    """model.generate(do_sample=False) applies these to the logits; refdec does not, so it refuses
    rather than return other tokens, whether the model's generation_config or an argument sets
    it. Reset to None (or passed as None), refdec equals model.generate again."""
    model = tiny_llama()
    prompt = [1, 5, 6, 7, 5, 6]
    plain = hf_greedy(model, prompt, max_new_tokens=12, eos_token_id=None)
    first = plain[len(prompt)]
    value = {"guidance_scale": 3.0}[field]  # classifier-free guidance: a second, unconditional forward
    setattr(model.generation_config, field, value)
    assert hf_greedy(model, prompt, max_new_tokens=12, eos_token_id=None) != plain  # the setting changes the tokens
    with pytest.raises(ValueError, match=rf"model.generation_config sets {field}=.*generation_config.{field} = None"):
        refdec.generate(model, prompt, max_new_tokens=12, eos_token_id=[])
    with pytest.raises(ValueError, match=field):  # batches too
        refdec.generate(model, [prompt, prompt[:4]], max_new_tokens=12, eos_token_id=[])
    kwargs = {field: None}  # an argument overrides the config, as in model.generate
    assert refdec.generate(model, prompt, max_new_tokens=12, eos_token_id=[], **kwargs).sequences[0].tolist() == plain
    setattr(model.generation_config, field, None)
    assert refdec.generate(model, prompt, max_new_tokens=12, eos_token_id=[]).sequences[0].tolist() == plain
    with pytest.raises(ValueError, match=rf"argument {field}=.*drop the argument {field}"):
        refdec.generate(model, prompt, max_new_tokens=12, eos_token_id=[], **{field: value})


@pytest.mark.full  # every logits setting, single and batched (one: test_min_new_tokens_overrides_min_length_...)
def test_logits_settings_as_arguments_override_the_generation_config_like_model_generate():
    """repetition_penalty=..., sequence_bias=... etc. as generate's keyword arguments: the same tokens as
    model.generate with the same arguments, over the model's generation_config, single and batched;
    a misspelt one is a TypeError naming it."""
    model = tiny_llama()
    prompts = repetitive_prompts(3, seed=45)
    model.generation_config.repetition_penalty = 1.5
    decoder = refdec.SpeculativeDecoder(model)
    changed = 0
    for prompt in prompts:
        plain = hf_greedy(model, prompt, max_new_tokens=NEW, eos_token_id=None, repetition_penalty=1.0)
        new = plain[len(prompt):]
        # the bias raises a token after the model's own bigram and sinks one of its choices
        bias = {(new[4], new[5] + 1 if new[5] + 1 < 96 else 3): 30.0, (new[8],): -50.0, (new[1], new[2]): -0.5}
        for settings in (dict(repetition_penalty=1.0, sequence_bias=bias), dict(repetition_penalty=None),
                         dict(sequence_bias=[[list(k), v] for k, v in bias.items()], no_repeat_ngram_size=3),
                         dict(repetition_penalty=0.7, sequence_bias=bias)):
            hf_settings = {k: (1.0 if k == "repetition_penalty" and v is None else v) for k, v in settings.items()}
            want = hf_greedy(model, prompt, max_new_tokens=NEW, eos_token_id=None, **hf_settings)
            changed += want != plain
            for budget in (0, 16, 64):
                out = decoder.generate(prompt, references=[plain[len(prompt) - 3:]], max_new_tokens=NEW,
                                       eos_token_id=[], max_draft_tokens=budget, **settings)
                assert out.sequences[0].tolist() == want, (settings, budget)
            rows = decoder.generate([prompt, prompts[0]], references=[plain[len(prompt) - 3:]], max_new_tokens=NEW,
                                    eos_token_id=[], max_draft_tokens=16, max_batch_size=1, **settings)
            assert rows.sequences[0, -len(want):].tolist() == want, settings  # left-padded, no eos: NEW tokens each
    assert changed >= 6
    # the generation_config's own sequence_bias applies too
    model.generation_config.repetition_penalty = None
    model.generation_config.sequence_bias = {(prompts[0][-1],): -100.0}
    want = hf_greedy(model, prompts[0], max_new_tokens=NEW, eos_token_id=None)
    assert refdec.generate(model, prompts[0], max_new_tokens=NEW, eos_token_id=[],
                           max_draft_tokens=32).sequences[0].tolist() == want
    with pytest.raises(TypeError, match="unexpected keyword argument.*'repetition_penalti'"):
        refdec.generate(model, prompts[0], max_new_tokens=4, repetition_penalti=1.2)
    with pytest.raises(ValueError, match="sequence_bias holds token id 500, outside the model vocabulary"):
        refdec.generate(model, prompts[0], max_new_tokens=4, sequence_bias={(500,): 1.0})
    with pytest.raises(ValueError, match="sequence_bias entries must pair a non-empty list of token ids"):
        refdec.generate(model, [prompts[0], prompts[1]], max_new_tokens=4, sequence_bias={(): 1.0})


def test_no_op_values_in_the_generation_config_are_accepted():
    prompt = [1, 5, 6, 7]
    model = tiny_llama()
    for field, value in [("repetition_penalty", 1.0), ("no_repeat_ngram_size", 0), ("min_length", 0),
                         ("min_new_tokens", 0), ("suppress_tokens", []), ("guidance_scale", 1.0)]:
        setattr(model.generation_config, field, value)
    assert refdec.generate(model, prompt, max_new_tokens=5, eos_token_id=[]).sequences[0].tolist() == \
        hf_greedy(model, prompt, max_new_tokens=5, eos_token_id=None)


def test_min_new_tokens_overrides_min_length_as_in_model_generate():
    """model.generate sets min_length = prompt length + min_new_tokens whenever min_new_tokens is
    set, 0 included: with both in the generation_config, eos was banned until min_length."""
    model = tiny_gpt2()
    prompt = [78]
    plain = hf_greedy(model, prompt, max_new_tokens=24, eos_token_id=None)
    eos = plain[15]  # a token the model writes as its 15th new token: an eos inside min_length=17
    for min_new_tokens in (5, 0, None):
        model.generation_config.min_new_tokens = min_new_tokens
        model.generation_config.min_length = 17
        want = hf_greedy(model, prompt, max_new_tokens=24, eos_token_id=eos)
        for budget in (0, 16):
            got = refdec.generate(model, prompt, max_new_tokens=24, eos_token_id=eos, max_draft_tokens=budget,
                                  references=[plain[1:]])
            assert got.sequences[0].tolist() == want, (min_new_tokens, budget)
        assert (len(want) < 17) == (min_new_tokens is not None)  # the case at stake: min_length not applied


def test_logits_settings_given_as_numpy_arrays_apply_as_in_model_generate(llama):
    """Settings given as numpy arrays, as model.generate takes them."""
    prompt = [1, 5, 6, 7, 5, 6]
    plain = hf_greedy(llama, prompt, max_new_tokens=8, eos_token_id=None)
    for settings in (dict(suppress_tokens=np.array([plain[len(prompt) + 2]])),
                     dict(forced_eos_token_id=np.array([3, 4])),
                     dict(exponential_decay_length_penalty=np.array([1, 2.0]))):
        eos = plain[len(prompt) + 5]
        want = hf_greedy(llama, prompt, max_new_tokens=8, eos_token_id=eos, **settings)
        got = refdec.generate(llama, prompt, max_new_tokens=8, eos_token_id=eos, references=[plain[3:]],
                              max_draft_tokens=8, **settings)
        assert got.sequences[0].tolist() == want, settings


def test_greedy_decoding_warns_about_sampling_arguments_it_does_not_read(llama):
    with pytest.warns(UserWarning, match=r"do_sample=False \(greedy decoding\), so temperature=0.5, seed=3 has no"):
        refdec.generate(llama, [1, 5, 6], max_new_tokens=2, temperature=0.5, seed=3)
    with pytest.warns(UserWarning, match="greedy decoding") as warned:
        refdec.SpeculativeDecoder(llama).generate([1, 5, 6], max_new_tokens=2, top_k=3)
    assert warned[0].filename == __file__  # the warning points at the caller's line, not into refdec


def test_an_index_built_with_another_tokenizer_is_refused(llama, tiny_tokenizer):
    """Its drafts would be ids that mean other text; with the index's own tokenizer it is accepted."""
    from tiny_models import byte_tokenizer

    index = CorpusIndex.build(["abc abc abd"], tokenizer=byte_tokenizer(), show_progress=False)
    message = (r"index was built with another tokenizer \(fingerprint [0-9a-f]{12}\.\.\., the tokenizer given has "
               r"[0-9a-f]{12}\.\.\.\): its drafts would be other text")
    with pytest.raises(ValueError, match=message):
        refdec.generate(llama, [1, 5, 6], tokenizer=tiny_tokenizer, index=index, max_new_tokens=2)
    with pytest.raises(ValueError, match=message):
        refdec.SpeculativeDecoder(llama, tokenizer=tiny_tokenizer, index=index).generate([1, 5, 6], max_new_tokens=2)
    own = CorpusIndex.build(["abc abc abd"], tokenizer=tiny_tokenizer, show_progress=False)
    assert refdec.generate(llama, [1, 5, 6], tokenizer=tiny_tokenizer, index=own, max_new_tokens=2,
                           eos_token_id=[]).stats.new_tokens == 2
