"""Specifies refdec.transformers.batch (RunningBatch): the rows of a batch share one KV cache and one
forward per step but keep their slots apart: after a step each row keeps its root and accepted
nodes right after its own entries; a finished row leaves the batch (its cache row dropped, later
forwards carry fewer rows) and the left-padding holes every remaining row has are cut, with no
change to any remaining row's output; a joining group's rows are appended."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import refdec
import refdec.transformers.batch as batch
from kv_labels import append, labelled_cache, labels_of
from refdec.transformers.batch import RunningBatch
from tiny_models import batch_row, hf_greedy, repetitive_prompts

NEW = 40


def running(labels, valid, done=None):
    """A RunningBatch over a labelled cache (0 = a hole); ``valid`` bool [B, S]; positions count the
    valid slots; each request a stand-in with ``done``."""
    valid = np.array(valid, dtype=bool)
    key_pos = np.where(valid, np.cumsum(valid, axis=1) - 1, -1)
    lengths = np.array([int(np.flatnonzero(row)[-1]) + 1 for row in valid], dtype=np.int64)
    requests = [SimpleNamespace(done=False) for _ in labels] if done is None else \
        [SimpleNamespace(done=d) for d in done]
    return RunningBatch(torch.device("cpu"), requests, labelled_cache(True, labels), lengths, key_pos)


def test_after_a_step_each_row_keeps_its_root_and_accepted_nodes_after_its_own_entries():
    # row 0: 3 entries; row 1 lags: 2 entries and a hole. The step's 4 query slots (3..6) hold each
    # row's root and 3 draft nodes; row 0 accepts nodes 0 and 2, row 1 none.
    batch_ = running([[1, 2, 3], [101, 102, 0]], [[1, 1, 1], [1, 1, 0]])
    append(batch_.cache, [[10, 11, 12, 13], [110, 111, 112, 113]])
    batch_.keep_accepted(np.array([3, 2]), [np.array([0, 2]), np.array([], dtype=np.int64)])
    rows = labels_of(batch_.cache)  # row 1's slots past its entries are holes (stale labels)
    assert rows[0] == [1, 2, 3, 10, 11, 13] and rows[1][:3] == [101, 102, 110]
    assert batch_.lengths.tolist() == [6, 3] and batch_.slots == 6
    assert batch_.key_pos.tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 2, -1, -1, -1]]


def test_finished_rows_leave_and_the_holes_every_remaining_row_has_are_cut():
    # row 0 (the longest prompt) finishes; rows 1 and 2 both start with a hole: slot 0 is cut
    batch_ = running([[1, 2, 3, 4, 5], [0, 0, 103, 104, 0], [0, 202, 203, 204, 205]],
                     [[1, 1, 1, 1, 1], [0, 0, 1, 1, 0], [0, 1, 1, 1, 1]], done=[True, False, False])
    batch_.drop_finished()
    assert len(batch_) == 2 and labels_of(batch_.cache) == [[0, 103, 104, 0], [202, 203, 204, 205]]
    assert batch_.lengths.tolist() == [3, 4] and batch_.slots == 4
    assert batch_.lead_holes.tolist() == [1, 0]
    assert batch_.key_pos.tolist() == [[-1, 0, 1, -1], [0, 1, 2, 3]]
    for request in batch_.requests:
        request.done = True
    batch_.drop_finished()
    assert len(batch_) == 0 and batch_.cache is None


def test_a_joining_group_is_appended_after_the_running_rows():
    batch_ = running([[1, 2, 3]], [[1, 1, 1]])
    joining = running([[0, 102, 103, 104, 105], [201, 202, 203, 204, 205]], [[0, 1, 1, 1, 1], [1] * 5])
    batch_.join(joining)
    assert len(batch_) == 3 and labels_of(batch_.cache) == [[1, 2, 3, 0, 0], [0, 102, 103, 104, 105],
                                                            [201, 202, 203, 204, 205]]
    assert batch_.lengths.tolist() == [3, 5, 5]
    assert batch_.lead_holes.tolist() == [0, 1, 0]
    assert batch_.key_pos.tolist() == [[0, 1, 2, -1, -1], [-1, 0, 1, 2, 3], [0, 1, 2, 3, 4]]
    empty = RunningBatch.empty(torch.device("cpu"))
    empty.join(joining)  # an empty batch takes the group as it is
    assert empty.requests is joining.requests and empty.cache is joining.cache


@pytest.mark.parametrize("lazy_head", [True, False])
def test_finished_rows_leave_the_batch(monkeypatch, llama, lazy_head):
    """Once a row stops, the verification forwards carry fewer rows (its cache row is dropped)."""
    model = llama
    prompts = repetitive_prompts(3, seed=6)
    decoder = refdec.SpeculativeDecoder(model)
    decoder.backend.lazy_head = lazy_head
    batch_rows = []

    def recording(forward):
        def recording_forward(cache, **kwargs):
            batch_rows.append(int(kwargs["input_ids"].shape[0]))
            return forward(cache, **kwargs)
        return recording_forward

    # each forward is the backbone's (the lazy head; greedy steps with the full head, whose head runs
    # in row chunks) or the model's own (the prefill with the full head)
    monkeypatch.setattr(decoder.backend.runner, "hidden", recording(decoder.backend.runner.hidden))
    monkeypatch.setattr(decoder.backend.runner, "logits", recording(decoder.backend.runner.logits))
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
