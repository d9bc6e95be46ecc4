"""Batched speculative decoding (refdec.batch): every row is exactly its own single-row run.

Rows of different prompt lengths share one verification forward per step and
accept different numbers of tokens; the checks are per row against
``model.generate`` on that row alone (greedy) or against a single-row refdec run
with the row's seed (sampling), on tiny float64 models whose masks differ:
Llama (rotary, one mask), Gemma 3 (a dict of masks, sliding window 8, far
exceeded by 40 new tokens) and GPT-2 (absolute position embeddings).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import refdec
import refdec.budget
import refdec.decode.batch as batch
from tiny_models import cached_model, lookup_factory, repetitive_prompts, tiny_llama

NEW = 40
FAMILIES = ["gemma3", "gpt2", "llama"]


@pytest.fixture(params=FAMILIES)
def model3(request, tiny_model_cache):
    return request.param, cached_model(tiny_model_cache, request.param)


def hf_row(model, prompt, max_new_tokens=NEW, eos_token_id=None):
    with torch.no_grad():
        return model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new_tokens,
                              eos_token_id=eos_token_id, pad_token_id=0)[0].tolist()


def row_tokens(out, b, prompt_len, pad=0):
    """Row ``b`` of a batched output without its left padding and right padding (prompt + new tokens)."""
    new = out.stats.rows[b].new_tokens
    width = out.sequences.shape[1]
    seq = out.sequences[b].tolist()
    head = width - max(r.new_tokens for r in out.stats.rows)  # the padded prompt width
    assert all(t == pad for t in seq[head + new:]), "right padding after the row's end"
    return seq[head - prompt_len: head + new]


def mixed_batch():
    """Prompts of different lengths: repetitive ones (drafts accepted) and a random one (drafts rejected)."""
    rng = np.random.default_rng(7)
    prompts = repetitive_prompts(4, seed=11)
    prompts.insert(2, [1] + rng.integers(3, 96, size=5).tolist())  # short, nothing to copy
    prompts.append([1] + rng.integers(3, 96, size=23).tolist())
    return prompts


@pytest.mark.parametrize("kind", ["cxx", "tree"])
def test_each_row_equals_generate_on_that_row_alone(model3, kind):
    name, model = model3
    prompts = mixed_batch()
    free = [hf_row(model, p) for p in prompts]
    eos = free[1][len(prompts[1]) + 6]  # row 1 stops early; rows emitting this token stop too
    want = [hf_row(model, p, eos_token_id=eos) for p in prompts]
    # row 0 has a reference holding its continuation: long accepted drafts
    references = [[free[0][len(prompts[0]) - 3:]]] + [None] * (len(prompts) - 1)
    factory = None if kind == "cxx" else lookup_factory(kind)
    out = refdec.generate(model, prompts, references=references, max_new_tokens=NEW, eos_token_id=eos,
                          max_draft_tokens=16, proposer_factory=factory)
    for b, p in enumerate(prompts):
        assert row_tokens(out, b, len(p)) == want[b], (name, b)
    rows = out.stats.rows
    assert sum(r.accepted_tokens for r in rows) > 10
    assert sum(r.proposed_tokens - r.accepted_tokens for r in rows) > 10
    assert rows[0].accepted_tokens >= 10 and rows[0].tokens_per_pass > 3  # the reference row
    assert len({r.forward_passes for r in rows}) > 1  # rows finished at different steps
    assert rows[1].stop_reason == "eos" and rows[1].new_tokens < NEW
    assert out.stats.new_tokens == sum(r.new_tokens for r in rows)
    assert out.stats.forward_passes == max(r.forward_passes for r in rows)


def test_left_padded_tensor_with_attention_mask_equals_the_list_form(model3):
    name, model = model3
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


@pytest.mark.parametrize("setting", [dict(temperature=1.0), dict(temperature=0.7, top_k=8, top_p=0.9)])
def test_sampling_rows_equal_single_row_runs_with_their_seed(setting):
    model = tiny_llama()
    prompts = mixed_batch()
    refs = []
    for b, p in enumerate(prompts):  # per-row references holding the row's own sampled continuation
        plain = refdec.generate(model, p, max_new_tokens=NEW, do_sample=True, seed=50 + b, eos_token_id=[],
                                  max_draft_tokens=0, **setting)
        cont = plain.sequences[0].tolist()[len(p) - 3:]
        for j in range(7, len(cont), 9):
            cont[j] = (cont[j] + 1) % 96
        refs.append([cont])
    out = refdec.generate(model, prompts, references=refs, max_new_tokens=NEW, do_sample=True, seed=50,
                          eos_token_id=[], max_draft_tokens=16, **setting)
    listed = refdec.generate(model, prompts, max_new_tokens=NEW, do_sample=True, seed=[50 + b for b in range(6)],
                             eos_token_id=[], max_draft_tokens=16, **setting)
    for b, p in enumerate(prompts):
        single = refdec.generate(model, p, max_new_tokens=NEW, do_sample=True, seed=50 + b, eos_token_id=[],
                                   max_draft_tokens=0, **setting).sequences[0].tolist()
        assert row_tokens(out, b, len(p)) == single
        assert row_tokens(listed, b, len(p)) == single
        assert out.stats.rows[b].seed == 50 + b
    assert sum(r.accepted_tokens for r in out.stats.rows) > 20
    assert sum(r.proposed_tokens - r.accepted_tokens for r in out.stats.rows) > 5


def test_shared_references_serve_every_row():
    model = tiny_llama()
    prompts = repetitive_prompts(3, seed=4)
    refs = [hf_row(model, p)[len(p) - 3:] for p in prompts]  # one shared list: every row's continuation
    out = refdec.generate(model, prompts, references=refs, max_new_tokens=NEW, eos_token_id=[],
                          max_draft_tokens=32)
    for b, p in enumerate(prompts):
        assert row_tokens(out, b, len(p)) == hf_row(model, p)
        assert out.stats.rows[b].accepted_by_source.get("reference", 0) > 10


def test_shared_references_of_empty_documents_are_not_taken_for_per_row_lists():
    """[[]] or [[], []]: an empty list is an empty row or an empty token-list document; it was read
    as per-row lists, so a batch of another size was refused ("references has 1 per-row lists")."""
    from refdec.decode.inputs import split_references

    assert split_references([[]], 2) == [[[]], [[]]]  # one shared (empty) document
    assert split_references([[], []], 3) == [[[], []]] * 3
    assert split_references([[], []], 2) == [[], []]  # counts agree: one (empty) list per row
    assert split_references([None, ["doc"]], 2) == [None, ["doc"]]
    with pytest.raises(ValueError, match="references has 2 per-row lists for a batch of 3"):
        split_references([None, ["doc"]], 3)
    model = tiny_llama()
    prompts = repetitive_prompts(2, seed=5)
    out = refdec.generate(model, prompts, references=[[]], max_new_tokens=6, eos_token_id=[])
    for b, p in enumerate(prompts):
        assert row_tokens(out, b, len(p)) == hf_row(model, p, max_new_tokens=6)


def test_a_single_padded_row_and_max_new_tokens_zero_and_one():
    model = tiny_llama()
    p = repetitive_prompts(1, seed=3)[0]
    ids = torch.tensor([[0, 0] + p])
    out = refdec.generate(model, ids, attention_mask=torch.tensor([[0, 0] + [1] * len(p)]), max_new_tokens=NEW,
                          eos_token_id=[], max_draft_tokens=16)
    assert out.sequences[0].tolist() == [0, 0] + hf_row(model, p)
    prompts = repetitive_prompts(3, seed=3)
    zero = refdec.generate(model, prompts, max_new_tokens=0)
    assert zero.sequences.shape == (3, max(len(q) for q in prompts)) and zero.stats.new_tokens == 0
    one = refdec.generate(model, prompts, max_new_tokens=1, eos_token_id=[])
    for b, q in enumerate(prompts):
        assert row_tokens(one, b, len(q)) == hf_row(model, q, max_new_tokens=1)


def test_batched_input_errors_name_the_problem():
    model = tiny_llama()
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


@pytest.mark.parametrize("lazy_head", [True, False])
def test_finished_rows_leave_the_batch(monkeypatch, lazy_head):
    """Once a row stops, the verification forwards carry fewer rows (its cache row is dropped)."""
    model = tiny_llama()
    prompts = repetitive_prompts(3, seed=6)
    decoder = refdec.SpeculativeDecoder(model)
    decoder.lazy_head = lazy_head
    batch_rows = []

    def recording(forward):
        def recording_forward(cache, **kwargs):
            batch_rows.append(int(kwargs["input_ids"].shape[0]))
            return forward(cache, **kwargs)
        return recording_forward

    if lazy_head:  # the backbone runs the forward, the head only the visited rows
        monkeypatch.setattr(decoder.runner, "hidden", recording(decoder.runner.hidden))
    else:
        monkeypatch.setattr(decoder.runner, "logits", recording(decoder.runner.logits))
    eos = hf_row(model, prompts[0])[len(prompts[0]) + 3]
    out = decoder.generate(prompts, max_new_tokens=NEW, eos_token_id=eos, max_draft_tokens=4)
    for b, p in enumerate(prompts):
        assert row_tokens(out, b, len(p)) == hf_row(model, p, eos_token_id=eos)
    assert batch_rows[0] == 3 and batch_rows == sorted(batch_rows, reverse=True) and batch_rows[-1] < 3
    assert len(batch_rows) == out.stats.forward_passes


def test_stop_strings_stop_each_row_where_its_own_run_stops(tiny_tokenizer):
    model = tiny_llama()
    prompts = repetitive_prompts(4, seed=12)
    texts = [tiny_tokenizer.decode(hf_row(model, p)[len(p):]) for p in prompts]
    stop = texts[0][5:7]  # a string row 0 emits; other rows may or may not emit it
    singles = [refdec.generate(model, p, tokenizer=tiny_tokenizer, stop_strings=stop, max_new_tokens=NEW,
                                 eos_token_id=[], max_draft_tokens=16).sequences[0].tolist() for p in prompts]
    out = refdec.generate(model, prompts, tokenizer=tiny_tokenizer, stop_strings=stop, max_new_tokens=NEW,
                          eos_token_id=[], max_draft_tokens=16)
    for b, p in enumerate(prompts):
        assert row_tokens(out, b, len(p)) == singles[b]
    assert out.stats.rows[0].stop_reason == "stop_string"


def test_rows_stay_exact_after_the_longest_prompt_row_leaves(model3, monkeypatch):
    """When the row with the longest prompt stops first, the left-padding holes every remaining row has
    are cut from the cache (slots renumbered); the remaining rows' outputs do not change."""
    name, model = model3
    short = repetitive_prompts(3, seed=14)
    long = [1] + np.random.default_rng(0).integers(3, 96, size=60).tolist()
    prompts = [long] + short
    free_long = hf_row(model, long)[len(long):]
    early = set(sum((hf_row(model, p)[len(p): len(p) + 12] for p in short), []))
    eos = next(t for t in free_long[:8] if t not in early)  # stops the long row, none of the others early
    want = [hf_row(model, p, eos_token_id=eos) for p in prompts]
    assert len(want[0]) - len(long) <= 8 and all(len(w) - len(p) > 10 for w, p in zip(want[1:], short)), \
        "the long row stops first"
    starts = []
    select_rows = batch.select_rows
    monkeypatch.setattr(batch, "select_rows", lambda cache, rows, start, new_len: (
        starts.append(start), select_rows(cache, rows, start, new_len)))
    out = refdec.generate(model, prompts, max_new_tokens=NEW, eos_token_id=eos, max_draft_tokens=8)
    for b, p in enumerate(prompts):
        assert row_tokens(out, b, len(p)) == want[b], (name, b)
    assert starts[0] >= len(long) - max(len(p) for p in short)  # the shared padding was cut


def test_auto_budget_gives_each_row_its_own_policy(monkeypatch):
    """max_draft_tokens="auto" (the default): one budget policy per row (its own acceptance), the
    rows' prefixes chosen together for the batched forward (batch_prefix_sizes); rows stay exact."""
    model = tiny_llama()
    prompts = mixed_batch()
    calls = []

    row_budgets = {}  # id(budget) -> row, from the first call (all rows active, in order)

    batch_prefix_sizes = refdec.budget.batch_prefix_sizes

    def spy(budgets, trees, cells=None):
        sizes = batch_prefix_sizes(budgets, trees, cells)
        if not row_budgets:
            row_budgets.update({id(budget): (b, budget) for b, budget in enumerate(budgets)})
        calls.append((len(budgets), [len(t) for t in trees], sizes))
        return sizes

    monkeypatch.setattr(refdec.budget, "batch_prefix_sizes", spy)
    out = refdec.generate(model, prompts, max_new_tokens=NEW, eos_token_id=[])
    for b, p in enumerate(prompts):
        assert row_tokens(out, b, len(p)) == hf_row(model, p)
    assert out.stats.accepted_tokens > 0
    assert calls and calls[0][0] == len(prompts)  # every active row, priced together
    # the rows verified what their policies took (take_prefix), not their whole drafts
    assert len(row_budgets) == len(prompts)
    for b, budget in row_budgets.values():
        assert sum(budget.chosen) == out.stats.rows[b].proposed_tokens, b
    for n_rows, lengths, sizes in calls:
        assert len(sizes) == n_rows and all(0 <= s <= n for s, n in zip(sizes, lengths))
        # one node count for the batch, each row clipped to its own tree
        assert len({s for s, n in zip(sizes, lengths) if s < n}) <= 1
        assert all(s == n for s, n in zip(sizes, lengths) if s < max(sizes))
    # decoder.joint_batch_budget = False: each row is priced alone again, still exact
    calls.clear()
    decoder = refdec.SpeculativeDecoder(model)
    decoder.joint_batch_budget = False
    out = decoder.generate(prompts, max_new_tokens=NEW, eos_token_id=[])
    assert not calls
    for b, p in enumerate(prompts):
        assert row_tokens(out, b, len(p)) == hf_row(model, p)


@pytest.mark.parametrize("lazy_head", [True, False])
def test_chunked_batch_prefill_keeps_every_row_exact(model3, lazy_head):
    """The left-padded batch prefilled 5 columns at a time (padding, sliding window and
    positions cut across chunks) still gives each row its own generate output, with the
    lazy head's backbone and with the model's own forward, in ceil(width / 5) forwards."""
    name, model = model3
    prompts = mixed_batch()
    decoder = refdec.SpeculativeDecoder(model, prefill_chunk=5)
    decoder.lazy_head = lazy_head and decoder.lazy_head
    forwards = []
    hook = model.get_input_embeddings().register_forward_hook(lambda module, args, out: forwards.append(1))
    try:
        out = decoder.generate(prompts, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=16)
    finally:
        hook.remove()
    width = max(len(p) for p in prompts)
    assert len(forwards) - (out.stats.forward_passes - 1) == -(-width // 5)  # stats count the prefill once
    for b, p in enumerate(prompts):
        assert row_tokens(out, b, len(p)) == hf_row(model, p), (name, b)


def test_an_autobudget_instance_serves_each_row_with_its_own_copy():
    """max_draft_tokens=AutoBudget(...): every row learns on its own copy (one shared policy
    mixed the rows' node cells up) and the rows' prefixes are chosen together."""
    from refdec.budget import AutoBudget
    from refdec.calibration import CostCurve

    model = tiny_llama()
    prompts = mixed_batch()
    policy = AutoBudget(CostCurve((0, 64), (1.0, 2.0)), max_nodes=16)
    out = refdec.generate(model, prompts, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=policy)
    for b, p in enumerate(prompts):
        assert row_tokens(out, b, len(p)) == hf_row(model, p)
    assert out.stats.accepted_tokens > 0
    assert policy.steps == 0  # the caller's object is the template, not a row's policy


# ---------------------------------------------------------------- continuous batching

@pytest.mark.parametrize("max_batch_size,lazy_head", [(1, True), (2, True), (2, False), (4, True)])
def test_continuous_batching_keeps_every_row_exact(model3, monkeypatch, max_batch_size, lazy_head):
    """max_batch_size rows at most decode together; waiting rows join as rows finish, their
    cache rows appended to the running batch's (prompts longer and shorter than the running
    cache), and every row still equals generate on that row alone, EOS stops included."""
    name, model = model3
    rng = np.random.default_rng(5)
    # a long prompt joins early (longer than the running cache) and a longer one last (longer than
    # any running cache: a prompt of <= 71 tokens plus NEW); the short ones join after it
    prompts = mixed_batch()
    prompts.insert(2, [1] + rng.integers(3, 96, size=70).tolist())
    prompts.append([1] + rng.integers(3, 96, size=120).tolist())
    eos = hf_row(model, prompts[1])[len(prompts[1]) + 5]  # row 1 stops early, freeing its place
    want = [hf_row(model, p, eos_token_id=eos) for p in prompts]
    decoder = refdec.SpeculativeDecoder(model, prefill_chunk=16)  # joining prompts prefill in chunks too
    decoder.lazy_head = lazy_head and decoder.lazy_head
    forward_rows, appended = [], []
    hook = model.get_input_embeddings().register_forward_hook(
        lambda module, args, out: forward_rows.append(int(args[0].shape[0])))
    append_rows = batch.append_rows

    def recording_append(cache, other):
        keys, other_keys = cache.layers[0].keys, other.layers[0].keys  # [B, H, S, D]
        appended.append((keys.shape[2], other_keys.shape[2], keys.shape[0], other_keys.shape[0]))
        return append_rows(cache, other)

    monkeypatch.setattr(batch, "append_rows", recording_append)
    try:
        out = decoder.generate(prompts, max_new_tokens=NEW, eos_token_id=eos, max_draft_tokens=8,
                               max_batch_size=max_batch_size)
    finally:
        hook.remove()
    for b, p in enumerate(prompts):
        assert row_tokens(out, b, len(p)) == want[b], (name, b)
    assert max(forward_rows) == max_batch_size
    assert all(r.stop_reason in ("eos", "max_new_tokens") for r in out.stats.rows)
    assert out.stats.new_tokens == sum(r.new_tokens for r in out.stats.rows)
    if max_batch_size > 1:
        # rows joined a running batch, from shorter and from longer caches than its own
        assert appended and all(n_running + n_joining <= max_batch_size for _, _, n_running, n_joining in appended)
        assert any(joining > running for running, joining, _, _ in appended)
        assert any(joining < running for running, joining, _, _ in appended)
    else:
        assert not appended  # one row at a time: each starts a batch of its own


def test_continuous_batching_with_sampling_keeps_each_rows_seed(monkeypatch):
    model = tiny_llama()
    prompts = mixed_batch()
    joins = []
    append_rows = batch.append_rows
    monkeypatch.setattr(batch, "append_rows", lambda *args: (joins.append(1), append_rows(*args))[1])
    out = refdec.generate(model, prompts, max_new_tokens=NEW, do_sample=True, seed=70, eos_token_id=[],
                          max_draft_tokens=8, max_batch_size=2, temperature=0.8)
    assert joins  # rows joined a running batch
    for b, p in enumerate(prompts):
        single = refdec.generate(model, p, max_new_tokens=NEW, do_sample=True, seed=70 + b, eos_token_id=[],
                                   max_draft_tokens=0, temperature=0.8).sequences[0].tolist()
        assert row_tokens(out, b, len(p)) == single, b


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_max_batch_size_must_be_a_positive_int_or_none(bad):
    model = tiny_llama()
    with pytest.raises(ValueError, match="max_batch_size"):
        refdec.generate(model, mixed_batch(), max_new_tokens=4, max_batch_size=bad)
    with pytest.raises(ValueError, match="max_batch_size"):
        refdec.generate(model, [5, 6, 7], max_new_tokens=4, max_batch_size=bad)


def test_continuous_batching_stats_count_every_groups_prefill():
    """One row at a time: every row is its own group, so the batch's passes and prefill time
    are the sums of the rows' (each row's passes include its prefill)."""
    model = tiny_llama()
    prompts = repetitive_prompts(3, seed=21)
    out = refdec.generate(model, prompts, max_new_tokens=12, eos_token_id=[], max_draft_tokens=4,
                          max_batch_size=1)
    rows = out.stats.rows
    assert out.stats.forward_passes == sum(r.forward_passes for r in rows)
    assert out.stats.prefill_seconds == pytest.approx(sum(r.prefill_seconds for r in rows))
    assert all(r.prefill_seconds > 0 for r in rows)
    ends = [r.wall_seconds for r in rows]  # each row's clock stops at its own last token
    assert ends == sorted(ends) and ends[-1] <= out.stats.wall_seconds


@pytest.mark.parametrize("max_new_tokens", [0, 1, 2])
def test_continuous_batching_with_few_new_tokens(max_new_tokens):
    model = tiny_llama()
    prompts = mixed_batch()
    out = refdec.generate(model, prompts, max_new_tokens=max_new_tokens, eos_token_id=[], max_batch_size=2)
    for b, p in enumerate(prompts):
        want = hf_row(model, p, max_new_tokens=max_new_tokens) if max_new_tokens else list(p)
        assert row_tokens(out, b, len(p)) == want, b
        assert out.stats.rows[b].stop_reason == "max_new_tokens"
