"""Specifies how often a decoding step would make the host wait for a GPU (issue 27), counted on the
CPU with tests/sync_counter.py: the calls that would be host syncs with the engine on a GPU (device
-> host reads, data-dependent ops, blocking copies), per engine step, with the full LM head (the
GPU's code path: ``decoder.backend.lazy_head = False``).

Measured before the device path, tiny Llama, drafts of 4 and 64 nodes (the tree size does not
change the count): greedy 6 per step at B = 1 (input ids, positions, mask, compaction src and dst:
5 blocking copies; ``argmax().cpu()``) and 6-7 at B = 8 (a ``torch.tensor(..., device=)`` when a
row finishes); sampling the 5 copies and one read per row the walks visit (up to 19 per step at
B = 1 with 64-node drafts, 27 at B = 8).
The issue's target: at most 2 per greedy step and 3 per sampling step, at any B and tree size.
With the inputs, masks, targets and walks on the device (refdec.transformers.masks.device_tree_inputs,
refdec.transformers.verify.verify_on_device) and the host's arrays sent with non-blocking copies
(refdec.transformers.transfer), a greedy or sampling step makes one: the walks' result comes to the
host; sampling with top-p too, its kept set found for every row at once on the device
(refdec.engine.sampling.kept_mask; found row by row on the host, it cost three or four reads per
visited row: up to 56 per step at B = 1 with 64-node drafts, 360 at B = 8). Not on the
device, so still one read per visited row: logits settings (repetition penalty etc., applied with
each path's tokens on the host). The assertions below are the counts achieved, so that they guard
against regressions.
"""

from __future__ import annotations

import pytest

import refdec
import refdec.engine.sampling as sampling
import tiny_models
from sync_counter import count_step_syncs

NEW = 24
# per step, the count achieved (the target: 2 per greedy step, 3 per sampling step)
MAX_SYNCS = {"greedy": 1, "sampling": 1, "top-p": 1, "top-k-top-p": 1}
SETTINGS = {"greedy": {}, "sampling": dict(temperature=0.8, top_k=20), "top-p": dict(temperature=0.8, top_p=0.9),
            "top-k-top-p": dict(temperature=1.2, top_k=40, top_p=0.9, min_p=0.01)}


def references(decoder, prompts, kwargs):
    """Per row, a reference holding the row's own output with one token corrupted: long drafts
    accepted up to it, then rejected."""
    refs = []
    for b, prompt in enumerate(prompts):  # row b samples with seed + b
        out = decoder.generate(prompt, max_draft_tokens=0, **{**kwargs, "seed": kwargs["seed"] + b})
        out = out.sequences[0].tolist()[len(prompt) - 2:]
        out[9] = (out[9] + 1) % tiny_models.VOCAB
        refs.append([out])
    return refs


def step_syncs(monkeypatch, model, batch: int, max_draft: int, do_sample: bool, static: bool = False, **settings):
    decoder = refdec.SpeculativeDecoder(model)
    decoder.backend.lazy_head = False  # the GPU's code path
    decoder.backend.static_shapes = static  # fixed shapes (refdec.transformers.static_step), as with cuda_graphs=True
    prompts = tiny_models.repetitive_prompts(batch, seed=21)
    kwargs = dict(max_new_tokens=NEW, eos_token_id=[], do_sample=do_sample, seed=7, **settings)
    refs = references(decoder, prompts, kwargs)
    outs = []

    def run():
        outs.append(decoder.generate(prompts, references=refs, max_draft_tokens=max_draft, **kwargs))

    steps = count_step_syncs(monkeypatch, run)
    assert outs[0].stats.accepted_tokens > 2 * batch  # drafts were accepted: the walks went deep
    return steps


# fast: 8 rows, drafts of 4, greedy and every logits setting at once; full: the rest
@pytest.mark.parametrize("mode", [pytest.param(mode, marks=() if mode in ("greedy", "top-k-top-p") else pytest.mark.full)
                                  for mode in SETTINGS])
@pytest.mark.parametrize("batch", [pytest.param(1, marks=pytest.mark.full), 8])
@pytest.mark.parametrize("max_draft", [4, pytest.param(64, marks=pytest.mark.full)])
def test_a_step_syncs_at_most_the_budget(monkeypatch, llama, batch, max_draft, mode):
    # top-p ranks the top 8 tokens of the 96, then the whole row: both on the device
    monkeypatch.setattr(sampling, "_TOP_P_CANDIDATES", 8)
    steps = step_syncs(monkeypatch, llama, batch, max_draft, mode != "greedy", **SETTINGS[mode])
    worst = max(steps, key=lambda counts: sum(counts.values()))
    assert sum(worst.values()) <= MAX_SYNCS[mode], dict(worst)


@pytest.mark.parametrize("mode", ["greedy", "top-k-top-p"])
@pytest.mark.parametrize("batch", [1, pytest.param(8, marks=pytest.mark.full)])
def test_a_fixed_shape_step_syncs_no_more(monkeypatch, llama, batch, mode):
    """The fixed-shape step (refdec.transformers.static_step) sets its write slots and refills its buffers
    on the device: as many syncs as the other step, B = 8 including rows that finish."""
    steps = step_syncs(monkeypatch, llama, batch, 64, mode != "greedy", static=True, **SETTINGS[mode])
    worst = max(steps, key=lambda counts: sum(counts.values()))
    assert sum(worst.values()) <= MAX_SYNCS[mode], dict(worst)
