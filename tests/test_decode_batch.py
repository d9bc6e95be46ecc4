"""Specifies refdec.decode.batch (RunningBatch): the rows of a batch share one KV cache and one
forward per step but keep their slots apart; a finished row leaves the batch (its cache row
dropped, later forwards carry fewer rows) and the left-padding holes every remaining row has are
cut, with no change to any remaining row's output."""

from __future__ import annotations

import numpy as np
import pytest

import refdec
import refdec.decode.batch as batch
from tiny_models import batch_row, hf_greedy, repetitive_prompts

NEW = 40


@pytest.mark.parametrize("lazy_head", [True, False])
def test_finished_rows_leave_the_batch(monkeypatch, llama, lazy_head):
    """Once a row stops, the verification forwards carry fewer rows (its cache row is dropped)."""
    model = llama
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
    eos = hf_greedy(model, prompts[0])[len(prompts[0]) + 3]
    out = decoder.generate(prompts, max_new_tokens=NEW, eos_token_id=eos, max_draft_tokens=4)
    for b, p in enumerate(prompts):
        assert batch_row(out, b, len(p)) == hf_greedy(model, p, eos_token_id=eos)
    assert batch_rows[0] == 3 and batch_rows == sorted(batch_rows, reverse=True) and batch_rows[-1] < 3
    assert len(batch_rows) == out.stats.forward_passes


def test_rows_stay_exact_after_the_longest_prompt_row_leaves(batch_family_model, monkeypatch):
    """When the row with the longest prompt stops first, the left-padding holes every remaining row has
    are cut from the cache (slots renumbered); the remaining rows' outputs do not change."""
    name, model = batch_family_model
    short = repetitive_prompts(3, seed=14)
    long = [1] + np.random.default_rng(0).integers(3, 96, size=60).tolist()
    prompts = [long] + short
    free_long = hf_greedy(model, long)[len(long):]
    early = set(sum((hf_greedy(model, p)[len(p): len(p) + 12] for p in short), []))
    eos = next(t for t in free_long[:8] if t not in early)  # stops the long row, none of the others early
    want = [hf_greedy(model, p, eos_token_id=eos) for p in prompts]
    assert len(want[0]) - len(long) <= 8 and all(len(w) - len(p) > 10 for w, p in zip(want[1:], short)), \
        "the long row stops first"
    starts = []
    select_rows = batch.select_rows
    monkeypatch.setattr(batch, "select_rows", lambda cache, rows, start, new_len: (
        starts.append(start), select_rows(cache, rows, start, new_len)))
    out = refdec.generate(model, prompts, max_new_tokens=NEW, eos_token_id=eos, max_draft_tokens=8)
    for b, p in enumerate(prompts):
        assert batch_row(out, b, len(p)) == want[b], (name, b)
    assert starts[0] >= len(long) - max(len(p) for p in short)  # the shared padding was cut
