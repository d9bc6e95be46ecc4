"""Prefill: a group of prompts into a new running batch, in chunks.

The prompts are left-padded to one width and fed in column chunks of
``chunk`` tokens (the last one shorter); each chunk's queries attend to the keys
up to its end, so a long prompt skips most of the masked-out half of a
whole-prompt attention, and after the first chunk sliding-window layers (Gemma 3)
read only their last ``window - 1`` columns plus the chunk
(refdec.transformers.runner.ModelRunner.prefill_chunk). Positions count real tokens
only. A group without padding is fed as it is (the model's own causal mask and
positions); with padding each chunk gets explicit positions and a mask in which
padding slots see only themselves. The last chunk's last logits give each row's
first new token.

:func:`prefill_reusing` prefills one prompt after the first ``n`` of its tokens, whose entries an
earlier request left (the backend's prefix cache): the rest is fed in chunks from position
``n``, as a chunked prefill feeds its later chunks.

:func:`prefill_tokens` gives a one-row batch with no request of a caller behind it, for the
code that drives the engine's steps itself (refdec.transformers.calibration, refdec.transformers.selfcheck).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from refdec.engine.interface import run_steps
from refdec.engine.requests import Request
from refdec.engine.results import DecodingStats
from refdec.engine.stops import StopChecker
from refdec.transformers.batch import RunningBatch
from refdec.transformers.cache import cache_from_entries
from refdec.transformers.hybrid.state import KV_LAYER_TYPES, restore_row_states
from refdec.transformers.masks import attention_masks
from refdec.transformers.runner import ModelRunner

__all__ = ["prefill", "prefill_reusing", "prefill_spans", "prefill_steps", "prefill_tokens"]


def prefill_spans(n_tokens: int, chunk: int | None) -> list[tuple[int, int]]:
    """[begin, end) token spans of a prompt prefill: chunks of ``chunk`` tokens
    (the last one shorter), or the whole prompt when ``chunk`` is None."""
    if chunk is None or n_tokens <= chunk:
        return [(0, n_tokens)]
    return [(begin, min(begin + chunk, n_tokens)) for begin in range(0, n_tokens, chunk)]


def prefill(runner: ModelRunner, group: list[Request], chunk: int | None) -> tuple[RunningBatch, torch.Tensor]:
    """Prefills the prompts of ``group`` as one left-padded batch. Returns the group's running
    batch and float [G, V], the logits after each prompt's last token."""
    return run_steps(prefill_steps(runner, group, chunk))


def prefill_steps(runner: ModelRunner, group: list[Request], chunk: int | None):
    """:func:`prefill` as a generator that yields after each chunk but the last (the engine runs the
    decoding rows' steps in between; refdec.engine.interface.PrefillSteps)."""
    device = runner.device
    width = max(request.prompt_len for request in group)
    ids = np.zeros((len(group), width), dtype=np.int64)
    valid = np.zeros((len(group), width), dtype=bool)
    for i, request in enumerate(group):
        ids[i, width - request.prompt_len:] = request.prompt
        valid[i, width - request.prompt_len:] = True
    key_pos = np.where(valid, np.cumsum(valid, axis=1) - 1, -1).astype(np.int64)
    padded = not valid.all()
    q_pos = np.maximum(key_pos, 0)
    cache = runner.new_cache()
    for begin, end in prefill_spans(width, chunk):
        inputs = {"input_ids": torch.from_numpy(ids[:, begin:end]).to(device)}
        if padded:
            # the chunk's query rows [begin, end) against every key up to its end: causal over real
            # keys; padding rows see themselves only (no fully masked row)
            query = np.arange(begin, end)[:, None]
            key = np.arange(end)[None, :]
            visible = (key <= query)[None] & valid[:, None, :end]
            visible |= (key == query)[None]
            # the sliding layers present only their last window - 1 columns plus the chunk: their mask
            # covers those columns only. Left padding keeps a row's columns and positions one offset
            # apart, so every key column cut is out of every real query's window
            inputs["position_ids"] = torch.from_numpy(q_pos[:, begin:end]).to(device)
            inputs["attention_mask"] = attention_masks(visible, q_pos[:, begin:end], key_pos[:, :end],
                                                       runner.mask_spec, device, runner.sliding_prefill_start(begin))
        last = runner.prefill_chunk(cache, begin, end == width, **inputs)
        if end < width:
            yield
    lengths = np.full(len(group), width, dtype=np.int64)  # valid slot count per row (left holes included)
    return RunningBatch(device, list(group), cache, lengths, key_pos), last


def prefill_reusing(runner: ModelRunner, request: Request, entries: list, states: list | None, cached: int,
                    chunk: int | None):
    """Prefills ``request``'s prompt (L tokens) on top of the first ``cached`` (1 <= cached < L) of
    ``entries`` (per layer (keys, values) float [1, H, n >= cached, D], the KV entries of a sequence
    that begins with the same ``cached`` tokens) and, for a hybrid model, ``states`` (its recurrent
    layers' states after exactly those ``cached`` tokens, refdec.transformers.hybrid.state.row_states):
    the remaining tokens in chunks of ``chunk``, yielding after each but the last. Returns the
    one-row running batch and float [1, V], the logits after the prompt's last token."""
    length = request.prompt_len
    if not 1 <= cached < length:
        raise ValueError(f"cached must be in [1, {length - 1}] for a prompt of {length} tokens, got {cached}")
    if (runner.hybrid is not None) != (states is not None):
        raise ValueError("a hybrid model's cached prefix needs its recurrent states, and only a hybrid's has them")
    if states is not None:
        if entries and int(entries[0][0].shape[2]) != cached:
            raise ValueError(f"a hybrid's recurrent states follow all {int(entries[0][0].shape[2])} tokens of its "
                             f"entry, so it is reused whole, not for {cached}")
        cache = runner.new_cache()
        kv_layers = [i for i, kind in enumerate(runner.hybrid.cache_layer_types) if kind in KV_LAYER_TYPES]
        if len(kv_layers) != len(entries):
            raise ValueError(f"{len(entries)} layers of KV entries for a model with {len(kv_layers)} attention layers")
        for layer_idx, (keys, values) in zip(kv_layers, entries):
            cache.update(keys, values, layer_idx)
        restore_row_states(cache, states, cached)
    else:
        cache = cache_from_entries(entries, cached)
    ids = torch.from_numpy(np.asarray(request.prompt, dtype=np.int64)[None]).to(runner.device)
    last = None
    for begin, end in prefill_spans(length - cached, chunk):
        last = runner.prefill_chunk(cache, cached + begin, cached + end == length,
                                    input_ids=ids[:, cached + begin:cached + end])
        if cached + end < length:
            yield
    key_pos = np.arange(length, dtype=np.int64)[None]
    return RunningBatch(runner.device, [request], cache, np.array([length], dtype=np.int64), key_pos), last


def prefill_tokens(runner: ModelRunner, tokens: np.ndarray) -> tuple[RunningBatch, torch.Tensor]:
    """``tokens`` (int64 [L]) prefilled as :func:`prefill` prefills a group, in one chunk: a running
    batch of one row, whose request is a bare one (nothing to emit: no stops, drafter or budget),
    and float [1, V], the logits after the last token. The row's next root sits at position ``L``."""
    request = Request(0, np.asarray(tokens, dtype=np.int64), 0, None, stats=DecodingStats(), sampler=None,
                      stopper=StopChecker(set(), [], None), drafter=None, budget=None, started=time.perf_counter())
    return prefill(runner, [request], None)
