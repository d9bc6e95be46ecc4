"""Batched speculative decoding (B > 1) with ragged acceptance.

Each row (``batch_row``: index in the caller's batch) has its own Proposer
(live context, references, draft tree), budget, sampler seed and stop state.
One step builds every active row's tree, pads the trees to one query length
``T = 1 + max_b n_b``, verifies all rows in ONE forward, walks each row's tree
and keeps what each row accepted. Rows accept different numbers of tokens.

Cache strategy: per-row compaction with a per-row valid length
----------------------------------------------------------------
The KV cache is one ``[B, H, S, D]`` tensor per layer (``S`` = cache slots,
shared by all rows). Row ``b`` keeps its entries contiguously in slots
``[0, length[b])`` (with the prompt's left-padding holes at the front); slots
``[length[b], S)`` are *holes* (stale entries), masked out. A step appends the
``T`` query rows at slots ``[S, S + T)`` for every row; afterwards the root and
the accepted nodes of row ``b`` are gathered (one advanced-index copy per
layer for all rows) into slots ``length[b] ..``, ``length[b] += 1 + k_b``, and
the cache is cut to ``S = max_b length[b]``. The alternative, *masked holes*
(leave rejected nodes in place and mask them forever), lets the cache grow by
``T`` slots per step for every row — with 64-node trees that is ~65 slots per
step of which a handful are real, so attention cost and memory would grow an
order of magnitude faster than the sequence. With compaction the holes of a
row are bounded by how far it lags the longest row (in tokens accepted so
far), and attention cost stays ~``B * max_len``.

Positions and masks are per row: ``key_pos[b, s]`` is the absolute position of
slot ``s`` of row ``b`` (-1 for a hole), position ids are ``root_pos[b] +
depth``, and the mask ``[B, 1, T, S + T]`` lets a query see the valid cached
slots of its row and its tree ancestors; sliding-window layers (Gemma 3's
``{"full_attention", "sliding_attention"}`` dict) AND it with the window
computed on positions (``q_pos - k_pos < window``), GPT-2's absolute position
embeddings just read the position ids. transformers 5 uses an explicit 4D mask
(or the dict) as given. Padding query rows (a tree shorter than ``T - 1``)
and left-padding prompt slots see only themselves, so no attention row is
fully masked (SDPA would return NaN there and the NaN would reach other rows
through 0 * NaN in the value product).

Finished rows leave the batch: their cache rows are dropped (``index_select``
on the batch dim), so they stop costing compute, and the left-padding slots
that every remaining row has (the longest prompt's row left) are cut as well.

Continuous batching (``max_batch_size``): at most that many rows decode
together; the others wait in caller order and join when rows finish. A joining
group is prefilled on its own (its own left padding and chunks), then its cache
rows are appended to the running batch's (``append_rows``): both are padded at
the end of the slot dim to the longer one, so a row's entries stay in
``[0, length[b])`` and the holes after them are where its next entries go, as
for a row that lags the longest. Each row's positions, mask and sampling keys
are its own, so its output does not depend on which rows it shares a step with
(exactly so in float64; in lower precision, as for any batching, other matmul
shapes may flip a near-tie). Stats: the batch's ``forward_passes`` and
``prefill_seconds`` count every group's prefill; a row's ``prefill_seconds`` is
its group's and its ``wall_seconds`` runs from the call's start to its last token.

LM head: with ``decoder.lazy_head`` (a CPU and a plain-head model) the verification forward
runs the model's backbone only (hidden ``[n_act, T, D]``); the acceptance walks of all rows
then advance together (refdec.verify.LockstepLazyWalks) and each round runs ONE head GEMM
over the rows the waiting walks ask for (the asked row, plus rows along its best-child path
when few walks wait), so a step computes about ``sum_b (1 + k_b)`` head rows instead of
``n_act * T``. Otherwise (a GPU, or a model whose head is not a plain linear layer) the
model's own forward computes every row's logits. ``stats.head_rows`` (and per row) counts
the rows the head ran on; head time counts as forward time.

Draft sizes: an int is one node count for every row. ``"auto"`` (or an AutoBudget,
copied per row) gives each row its own AutoBudget, which learns that row's
acceptance, and the rows' verified prefixes are chosen together
(refdec.budget.batch_prefix_sizes): a batched step costs about ``B * T`` rows for
the longest tree ``T``, so one node count is priced as a forward of that many
rows plus each row's head chunks. ``decoder.joint_batch_budget = False`` prices
each row alone on the single-row curve instead (the earlier policy, for
comparison; benchmarks/e2e_batch.py).

Prefill: the left-padded prompts in column chunks of ``decoder.prefill_chunk``
(each chunk's queries against the keys up to its end; its mask is built per
chunk), counted as one forward pass in the stats. After the first chunk,
sliding-window layers (Gemma 3) read only their last ``window - 1`` columns plus
the chunk, as in the single-row prefill, with their mask cut to those columns.

Sampling: the Gumbel noise is keyed by ``(seed, absolute output position)``;
row ``b`` uses ``seed + b`` when ``seed`` is an int (or ``seeds[b]`` when a
list is given), so row ``b`` equals a single-row ``generate`` of that prompt
with seed ``seed + b`` (resp. ``seeds[b]``). ``seed=None`` draws one base seed.

Outputs mirror ``model.generate``: ``sequences`` ``[B, max_len]`` is the
left-padded prompt as given (a list of prompts is left-padded with
``pad_token_id``) followed by each row's new tokens, right-padded with
``pad_token_id`` after the row's end. ``stats`` is the batch's (forward passes
are batched passes; tokens/s counts every row's tokens) and ``stats.rows[b]``
holds row ``b``'s own counts.
"""

from __future__ import annotations

import copy
import time

import numpy as np
import torch
import torch.nn.functional as F

from refdec.budget import AutoBudget, FixedBudget, batch_prefix_sizes, make_budget
from refdec.cache import GrowingLayer, new_cache
from refdec.decoding import _is_int
from refdec.masks import _finish, ancestor_matrix
from refdec.sampling import TargetSampler, random_seed
from refdec.processors import path_tokens
from refdec.tree import DraftTree
from refdec.verify import LockstepLazyWalks, accept_walk, accept_walk_lazy


def is_batched_input(input_ids, attention_mask=None) -> bool:
    """True for a list of prompts, a 2-D input with more than one row, or a mask with padding."""
    if isinstance(input_ids, (list, tuple)):
        return len(input_ids) > 0 and not _is_int(input_ids[0])
    if isinstance(input_ids, (torch.Tensor, np.ndarray)) and input_ids.ndim == 2:
        if input_ids.shape[0] > 1:
            return True
        if attention_mask is not None:
            m = attention_mask.detach().cpu() if isinstance(attention_mask, torch.Tensor) \
                else torch.as_tensor(np.asarray(attention_mask))
            return bool((m == 0).any())
    return False


def normalize_batch(input_ids, attention_mask, vocab_size: int) -> tuple[list[np.ndarray], np.ndarray | None]:
    """Per-row prompts (int64 [L_b], padding removed) and the caller's padded matrix (or None for a list)."""
    if isinstance(input_ids, (list, tuple)):
        if attention_mask is not None:
            raise ValueError("attention_mask is for a padded [B, L] input_ids; a list of prompts needs none")
        rows = []
        for b, p in enumerate(input_ids):
            if isinstance(p, (torch.Tensor, np.ndarray)) and p.ndim == 2 and p.shape[0] == 1:
                p = p[0]  # a tokenizer's return_tensors="pt" output for one prompt: [1, L]
            if isinstance(p, torch.Tensor):
                if p.ndim != 1 or p.dtype.is_floating_point or p.dtype == torch.bool:
                    raise ValueError(f"input_ids[{b}] must be a 1-D (or [1, L]) integer tensor, got shape "
                                     f"{tuple(p.shape)} dtype {p.dtype}")
                arr = p.detach().cpu().numpy().astype(np.int64)
            elif isinstance(p, np.ndarray):
                if p.ndim != 1 or not np.issubdtype(p.dtype, np.integer):
                    raise ValueError(f"input_ids[{b}] must be a 1-D integer array, got shape {p.shape} "
                                     f"dtype {p.dtype}")
                arr = p.astype(np.int64)
            elif isinstance(p, (list, tuple)):
                if not all(_is_int(t) for t in p):
                    raise ValueError(f"input_ids[{b}] must be a list of ints")
                arr = np.asarray(p, dtype=np.int64)
            else:
                hint = " (tokenize the text first: tokenizer(text).input_ids)" if isinstance(p, str) else ""
                raise ValueError(f"input_ids[{b}] must be a list of ints or a 1-D tensor, got "
                                 f"{type(p).__name__}{hint}")
            rows.append(arr)
        padded = None
    else:
        if isinstance(input_ids, torch.Tensor):
            if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
                raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
            padded = input_ids.detach().cpu().numpy().astype(np.int64)
        else:
            padded = np.asarray(input_ids)
            if not np.issubdtype(padded.dtype, np.integer):
                raise ValueError(f"input_ids must hold integer token ids, got dtype {padded.dtype}")
            padded = padded.astype(np.int64)
        if padded.ndim != 2:
            raise ValueError(f"batched input_ids must have shape [B, L], got {tuple(padded.shape)}")
        if attention_mask is None:
            mask = np.ones_like(padded, dtype=bool)
        else:
            m = attention_mask.detach().cpu().numpy() if isinstance(attention_mask, torch.Tensor) \
                else np.asarray(attention_mask)
            if m.shape != padded.shape:
                raise ValueError(f"attention_mask has shape {tuple(m.shape)}, input_ids {tuple(padded.shape)}")
            if not np.isin(m, (0, 1)).all():
                raise ValueError("attention_mask must hold 0 (padding) and 1 (token) only")
            mask = m.astype(bool)
            # left padding only: once a row's mask turns 1 it stays 1
            if (np.diff(mask.astype(np.int8), axis=1) < 0).any():
                b = int(np.nonzero((np.diff(mask.astype(np.int8), axis=1) < 0).any(axis=1))[0][0])
                raise ValueError(f"attention_mask row {b} is not left-padded (a 0 after a 1); pad on the left "
                                 "(tokenizer.padding_side = 'left'), as for model.generate")
        rows = [padded[b][mask[b]] for b in range(padded.shape[0])]
    if not rows:
        raise ValueError("input_ids holds no prompt")
    for b, arr in enumerate(rows):
        if arr.size == 0:
            raise ValueError(f"prompt {b} is empty: each prompt needs at least one token")
        if (arr < 0).any() or (arr >= vocab_size).any():
            bad = int(arr[(arr < 0) | (arr >= vocab_size)][0])
            raise ValueError(f"prompt {b} holds token id {bad}, outside the model vocabulary [0, {vocab_size})")
    return rows, padded


def split_references(references, batch_size: int) -> list:
    """``references`` shared by all rows, or one list per row (each a list of references or None)."""
    if references is None:
        return [None] * batch_size

    def is_ref_list(x):
        return x is None or (isinstance(x, (list, tuple)) and all(
            isinstance(r, (str, list, tuple, np.ndarray, torch.Tensor)) for r in x))

    per_row = isinstance(references, (list, tuple)) and len(references) > 0 and all(
        is_ref_list(r) for r in references)
    if per_row:
        # None or a list of documents marks per-row lists; an empty list alone could be either an
        # empty row or an empty token-list document: per-row only when the counts agree
        marked = any(r is None or (len(r) > 0 and not _is_int(r[0])) for r in references)
        per_row = marked or len(references) == batch_size
    if per_row:
        if len(references) != batch_size:
            raise ValueError(f"references has {len(references)} per-row lists for a batch of {batch_size} "
                             "(pass one list per row, or one list of references shared by all rows)")
        return list(references)
    return [references] * batch_size


def _row_seeds(seed, batch_size: int) -> list[int]:
    if seed is None:
        base = random_seed()
        return [base + b for b in range(batch_size)]
    if isinstance(seed, (list, tuple)):
        if len(seed) != batch_size or not all(_is_int(s) and s >= 0 for s in seed):
            raise ValueError(f"seed must be an int >= 0 or a list of {batch_size} ints >= 0, got {seed!r}")
        return [int(s) for s in seed]
    return [int(seed) + b for b in range(batch_size)]


# --------------------------------------------------------------------------- cache helpers


def _layers(cache):
    from transformers.cache_utils import DynamicLayer

    for layer_idx, layer in enumerate(cache.layers):
        if not layer.is_initialized:
            continue
        if type(layer) not in (GrowingLayer, DynamicLayer):
            raise TypeError(f"cache layer {layer_idx} is {type(layer).__name__}; batched verification needs "
                            "full layers (refdec.cache.new_cache())")
        yield layer


def _set_len(layer, length: int) -> None:
    if isinstance(layer, GrowingLayer):
        layer._set_length(length)
    else:
        layer.keys = layer.keys[:, :, :length]
        layer.values = layer.values[:, :, :length]


def gather_rows(cache, batch_idx: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, new_len: int) -> None:
    """Per row ``b``: slots ``dst[b, j] <- src[b, j]`` (all int64 [B, K]), then cut the cache to ``new_len``.
    Padding entries repeat a real (src, dst) pair, so duplicate writes carry the same value."""
    for layer in _layers(cache):
        keys, values = layer.keys, layer.values
        # advanced indices around a slice: [B, K, H, D]; the read copies before the write
        keys[batch_idx, :, dst] = keys[batch_idx, :, src]
        values[batch_idx, :, dst] = values[batch_idx, :, src]
        _set_len(layer, new_len)


def append_rows(cache, lengths, valid, key_pos, other, other_lengths, other_valid, other_key_pos):
    """Appends the batch rows of ``other`` (a cache of the same model) after those of ``cache``.

    ``lengths`` int64 [B], ``valid`` bool [B, S], ``key_pos`` int64 [B, S] describe ``cache``
    (S == its length), the ``other_*`` arrays ``other`` ([B2], [B2, S2]). Both are padded at the
    end to max(S, S2) slots with holes (not valid, position -1): a row's entries stay in slots
    [0, length), and the holes after them are where its next entries go, as for a row that lags
    the longest. Returns the merged (lengths [B + B2], valid, key_pos)."""
    slots, other_slots = valid.shape[1], other_valid.shape[1]
    n = max(slots, other_slots)
    for layer, extra in zip(_layers(cache), _layers(other)):
        # [B, H, S, D]: pad the slot dim at the end, then stack the rows; a growing layer gets
        # room for the next steps too (as GrowingLayer._grow), so the next update does not copy again
        capacity = 2 * n if isinstance(layer, GrowingLayer) else n
        keys = torch.cat([F.pad(layer.keys, (0, 0, 0, capacity - slots)),
                          F.pad(extra.keys, (0, 0, 0, capacity - other_slots))])
        values = torch.cat([F.pad(layer.values, (0, 0, 0, capacity - slots)),
                            F.pad(extra.values, (0, 0, 0, capacity - other_slots))])
        if isinstance(layer, GrowingLayer):
            layer._key_buf, layer._value_buf = keys, values
            layer._set_length(n)
        else:
            layer.keys, layer.values = keys, values

    def padded(a, width, fill):
        return np.pad(a, ((0, 0), (0, n - width)), constant_values=fill)

    return (np.concatenate([lengths, other_lengths]),
            np.concatenate([padded(valid, slots, False), padded(other_valid, other_slots, False)]),
            np.concatenate([padded(key_pos, slots, -1), padded(other_key_pos, other_slots, -1)]))


def select_rows(cache, rows: torch.Tensor, start: int, new_len: int) -> None:
    """Keep the batch rows ``rows`` (int64 [B']) and the slots ``[start, new_len)`` (renumbered from 0)."""
    for layer in _layers(cache):
        if isinstance(layer, GrowingLayer):
            # index_select copies; the slice past ``start`` is a view, whose capacity _grow handles
            layer._key_buf = layer._key_buf.index_select(0, rows)[:, :, start:]
            layer._value_buf = layer._value_buf.index_select(0, rows)[:, :, start:]
            layer._set_length(new_len - start)
        else:
            layer.keys = layer.keys.index_select(0, rows)[:, :, start:new_len]
            layer.values = layer.values.index_select(0, rows)[:, :, start:new_len]


# --------------------------------------------------------------------------- the loop


class _Row:
    """One request of the batch (``batch_row`` = its index in the caller's batch)."""

    def __init__(self, batch_row, prompt, max_total, stats, sampler, proposer, budget) -> None:
        self.batch_row = batch_row
        self.prompt_len = int(prompt.shape[0])
        self.seq: list[int] = prompt.tolist()
        self.max_total = max_total
        self.stats = stats
        self.sampler = sampler
        self.proposer = proposer
        self.budget = budget
        self.done = False


def generate_batch(decoder, prompts: list[np.ndarray], padded: np.ndarray | None, *, tokenizer, index, references,
                   max_new_tokens, do_sample, temperature, top_k, top_p, seed, eos, stops, max_draft_tokens,
                   pad_token_id, retrieve, normalize_references, stop_checker_cls, stats_cls, output_cls,
                   max_batch_size=None, processor=None, min_p=None, on_row_done=None):
    """The batched loop behind ``SpeculativeDecoder.generate`` (arguments already validated).
    ``on_row_done(batch_row, new_tokens, row_stats)``, optional: called as each row finishes.
    ``processor`` (refdec.processors.PathLogitsProcessor, optional): applied to each row's
    logits with that row's own sequence, as if decoded alone (``model.generate`` leaves a padded
    batch's pads out of the repetition penalty but counts them in no-repeat n-grams)."""
    wall_start = time.perf_counter()
    processing = processor is not None and processor.active
    device, spec, vocab = decoder.device, decoder.mask_spec, decoder.vocab_size
    batch = len(prompts)
    prompt_lens = [int(p.shape[0]) for p in prompts]
    for b, n in enumerate(prompt_lens):
        if decoder.max_positions is not None and n > decoder.max_positions:
            raise ValueError(f"prompt {b} has {n} tokens, more than the model's "
                             f"max_position_embeddings={decoder.max_positions}")
    refs_per_row = [normalize_references(r, tokenizer) for r in split_references(references, batch)]
    seeds = _row_seeds(seed, batch) if do_sample else [None] * batch
    stats = stats_cls()
    stopper = stop_checker_cls(eos, stops, tokenizer)
    shared_budget = None if max_draft_tokens == "auto" else make_budget(max_draft_tokens)
    # "auto": one policy per row (each learns its own acceptance), on the model's cost curve
    auto_template = None
    if isinstance(shared_budget, AutoBudget):  # a caller's AutoBudget: its copies serve the rows
        auto_template, shared_budget = shared_budget, None
    elif shared_budget is None:
        try:
            auto_template = make_budget("auto", model=decoder.model)  # the calibrated cost curve (cached)
        except TypeError:  # a make_budget without the model argument
            auto_template = make_budget("auto")
    from refdec.decoding import draft_for_step, prefill_spans

    # Lazy head (CPU, plain-head model): the backbone runs on every row of every tree, the head
    # only on the rows the acceptance walks visit, one GEMM per round for all batch rows.
    head = getattr(decoder, "_head", None)
    backbone = decoder._backbone_forward if decoder.lazy_head and head is not None else None  # -> [B, T, D]
    drafting = not (isinstance(shared_budget, FixedBudget) and shared_budget.max_nodes == 0)
    # "auto" prices the rows' drafts together (refdec.budget.batch_prefix_sizes)
    joint_auto = drafting and isinstance(auto_template, AutoBudget) and getattr(decoder, "joint_batch_budget", True)

    rows: list[_Row] = []
    for b, prompt in enumerate(prompts):
        row_stats = stats_cls()
        row_stats.seed = seeds[b]
        if retrieve and drafting:  # the row's own k most similar index documents join its references
            t0 = time.perf_counter()
            hits = index.retriever().top_k(prompt, retrieve, score="containment")
            row_stats.retrieved_documents = [doc_idx for doc_idx, _ in hits]
            refs_per_row[b] = list(refs_per_row[b]) + [index.document(d) for d in row_stats.retrieved_documents]
            row_stats.retrieve_seconds = time.perf_counter() - t0
        max_total = prompt_lens[b] + max_new_tokens
        if decoder.max_positions is not None:
            max_total = min(max_total, decoder.max_positions + 1)
        sampler = TargetSampler(decoder.vocab_size, do_sample=do_sample, temperature=temperature, top_k=top_k,
                                top_p=top_p, seed=seeds[b], device=device, min_p=min_p)
        proposer = None
        if drafting:
            proposer = decoder.proposer_factory(index, refs_per_row[b], decoder.max_depth)
            proposer.start(prompt.astype(np.int32))
        budget = shared_budget if shared_budget is not None else copy.deepcopy(auto_template)
        rows.append(_Row(b, prompt, max_total, row_stats, sampler, proposer, budget))
    stats.rows = [r.stats for r in rows]

    def emit(row: _Row, tokens: list[int]) -> None:
        seq = row.seq
        tokens = tokens[: row.max_total - len(seq)]
        seq.extend(tokens)
        keep, reason = stopper.cut(seq, len(tokens))
        if keep < len(tokens):
            del seq[len(seq) - len(tokens) + keep:]
        if not reason and len(seq) >= row.max_total:
            reason = "max_new_tokens" if len(seq) >= row.prompt_len + max_new_tokens else "max_position_embeddings"
        if reason:
            row.stats.stop_reason = reason
            row.stats.wall_seconds = time.perf_counter() - wall_start  # from the call's start to the row's end
            row.stats.new_tokens = len(seq) - row.prompt_len
            row.done = True
            if on_row_done is not None:
                on_row_done(row.batch_row, seq[row.prompt_len:], row.stats)
        elif row.proposer is not None:
            row.proposer.accept(np.asarray(tokens[:keep], dtype=np.int32))

    def prefill(group: list[int]):
        """Prefills the rows ``group`` (caller batch rows) as one left-padded batch and emits
        each row's first token. Returns the group's (cache, lengths, valid, key_pos)."""
        # -- left-padded prompts, positions count real tokens only
        t0 = time.perf_counter()
        width = max(prompt_lens[b] for b in group)
        ids = np.zeros((len(group), width), dtype=np.int64)
        valid = np.zeros((len(group), width), dtype=bool)
        for i, b in enumerate(group):
            ids[i, width - prompt_lens[b]:] = prompts[b]
            valid[i, width - prompt_lens[b]:] = True
        key_pos = np.where(valid, np.cumsum(valid, axis=1) - 1, -1).astype(np.int64)
        q_pos = np.maximum(key_pos, 0)
        cache = new_cache()
        for begin, end in prefill_spans(width, decoder.prefill_chunk):
            # the chunk's query rows [begin, end) against every key up to its end: causal over real
            # keys; padding rows see themselves only (no fully masked row)
            query = np.arange(begin, end)[:, None]
            key = np.arange(end)[None, :]
            full = (key <= query)[None] & valid[:, None, :end]
            full |= (key == query)[None]
            # after the first chunk the sliding layers present only their last window - 1 columns
            # plus the chunk (SpeculativeDecoder._prefill_forward): their mask covers those columns
            # only. Left padding keeps a row's columns and positions one offset apart, so every key
            # column cut is out of every real query's window
            sliding_from = decoder._sliding_prefill_start(begin)
            mask = _mask_for(full, q_pos[:, begin:end], key_pos[:, :end], spec, device, sliding_from)
            # [B, V] after the last chunk: every row's last slot is a token
            last = decoder._prefill_forward(cache, begin, end == width, backbone is not None,
                                            input_ids=torch.from_numpy(ids[:, begin:end]).to(device),
                                            position_ids=torch.from_numpy(q_pos[:, begin:end]).to(device),
                                            attention_mask=mask)
        if processing:
            last = torch.stack([processor(last[i], rows[b].seq, rows[b].prompt_len) for i, b in enumerate(group)])
        if do_sample:
            firsts = [rows[b].sampler.sample(last[i], prompt_lens[b]) for i, b in enumerate(group)]
        else:
            firsts = last.argmax(dim=-1).tolist()
        t1 = time.perf_counter()
        stats.prefill_seconds += t1 - t0
        stats._count_pass(0)
        for b, first in zip(group, firsts):
            rows[b].stats.prefill_seconds = t1 - t0  # its group's prefill
            rows[b].stats._count_pass(0)
            emit(rows[b], [int(first)])
        lengths = np.full(len(group), width, dtype=np.int64)  # valid slot count per row (left holes included)
        stats.accept_seconds += time.perf_counter() - t1
        return cache, lengths, valid, key_pos

    # Rows wait in caller order and join the batch while fewer than max_batch_size are active
    # (continuous batching): each joining group is prefilled on its own and its cache rows are
    # appended to the running batch's.
    capacity = batch if max_batch_size is None else min(int(max_batch_size), batch)
    pending = list(range(batch))
    if max_new_tokens == 0:
        for row in rows:
            row.stats.stop_reason = "max_new_tokens"
        pending = []
    active: list[int] = []
    cache = None
    lengths = np.zeros(0, dtype=np.int64)
    valid = np.zeros((0, 0), dtype=bool)
    key_pos = np.zeros((0, 0), dtype=np.int64)
    empty = DraftTree.empty()
    while active or pending:
        if pending and len(active) < capacity:
            group = pending[: capacity - len(active)]
            del pending[: len(group)]
            g_cache, g_lengths, g_valid, g_key_pos = prefill(group)
            t0 = time.perf_counter()
            group, g_lengths, g_valid, g_key_pos = _drop_finished(rows, group, g_cache, g_lengths, g_valid,
                                                                   g_key_pos)
            if group and active:
                lengths, valid, key_pos = append_rows(cache, lengths, valid, key_pos,
                                                      g_cache, g_lengths, g_valid, g_key_pos)
                active = active + group
            elif group:
                cache, active, lengths, valid, key_pos = g_cache, group, g_lengths, g_valid, g_key_pos
            stats.accept_seconds += time.perf_counter() - t0  # joining is bookkeeping
            continue
        n_act = len(active)
        slots = int(lengths.max())  # == cache length
        # -- propose
        t0 = time.perf_counter()
        trees = []
        for b in active:
            row = rows[b]
            tree = empty
            if row.proposer is not None:
                tree = draft_for_step(row.proposer, row.budget, row.max_total - len(row.seq) - 1,
                                      decoder.max_depth, vocab, select=not joint_auto)
            trees.append(tree)
        if joint_auto:
            # "auto": the rows' prefixes are chosen together, priced as one batched forward
            drafted = [i for i, b in enumerate(active) if rows[b].proposer is not None]
            budgets = [rows[active[i]].budget for i in drafted]
            cells = [budget.cells(trees[i]) for budget, i in zip(budgets, drafted)]  # once per row and step
            sizes = batch_prefix_sizes(budgets, [trees[i] for i in drafted], cells)
            for i, n, budget, row_cells in zip(drafted, sizes, budgets, cells):
                if len(trees[i]):  # an empty draft is no step of the policy (as in the single-row loop)
                    trees[i] = budget.take_prefix(trees[i], n, cells=row_cells)
        t1 = time.perf_counter()
        # -- prepare: [n_act, T] queries, mask [n_act, 1, T, slots + T]
        t = 1 + max(len(tr) for tr in trees)
        ids = np.zeros((n_act, t), dtype=np.int64)
        q_pos = np.zeros((n_act, t), dtype=np.int64)
        tree_part = np.zeros((n_act, t, t), dtype=bool)
        tree_part[:] = np.eye(t, dtype=bool)  # padding query rows see themselves only
        root_pos = np.zeros(n_act, dtype=np.int64)
        for i, (b, tree) in enumerate(zip(active, trees)):
            row = rows[b]
            anc, depth = ancestor_matrix(tree.parents)
            m = anc.shape[0]
            root_pos[i] = len(row.seq) - 1
            ids[i, 0] = row.seq[-1]
            ids[i, 1:m] = tree.token_ids
            ids[i, m:] = row.seq[-1]
            q_pos[i, :m] = root_pos[i] + depth
            q_pos[i, m:] = root_pos[i]
            tree_part[i, :m, :m] = anc
        full = np.concatenate([np.broadcast_to(valid[:, None, :], (n_act, t, slots)), tree_part], axis=2)
        k_pos = np.concatenate([key_pos, q_pos], axis=1)
        mask = _mask_for(full, q_pos, k_pos, spec, device)
        t2 = time.perf_counter()
        # -- forward + targets
        inputs = dict(input_ids=torch.from_numpy(ids).to(device), position_ids=torch.from_numpy(q_pos).to(device),
                      attention_mask=mask)
        head_seconds = 0.0
        if backbone is not None:
            hidden = backbone(cache, **inputs)  # [n_act, T, D]
            t3 = time.perf_counter()
            # -- accept: all rows' walks in lock-step, one head GEMM per round for the rows they visit
            walks = LockstepLazyWalks(trees, hidden, head)
            if processing:  # each row's logits with the sequence on its path
                def target(i, r, depth, walks=walks):
                    row = rows[active[i]]
                    return processor.target(walks.lazy[i].row_logits(r), row.seq + path_tokens(trees[i], r),
                                            row.prompt_len, row.sampler, int(root_pos[i]) + 1 + depth)

                walk_results = walks.run(target)
            elif do_sample:
                walk_results = walks.run(lambda i, r, depth: rows[active[i]].sampler.sample(
                    walks.lazy[i].row_logits(r), int(root_pos[i]) + 1 + depth))
            else:
                walk_results = walks.run(lambda i, r, depth: walks.lazy[i].argmax(r))
            head_seconds = walks.seconds  # head time counts as forward, not as accept
            head_rows = [lazy.rows_computed for lazy in walks.lazy]
            del hidden, walks
        else:
            logits = decoder._forward(cache, **inputs).logits  # [n_act, T, V]
            head_rows = [t] * n_act  # the model's head ran on every query row, padding included
            if not do_sample and not processing:
                targets = logits.argmax(dim=-1).cpu().numpy()  # the one host sync
            t3 = time.perf_counter()
            # -- accept
            walk_results = []
            for i, (b, tree) in enumerate(zip(active, trees)):
                if processing:
                    row, rp = rows[b], int(root_pos[i])
                    walk_results.append(accept_walk_lazy(tree, lambda r, depth, i=i, row=row, rp=rp, tree=tree: (
                        processor.target(logits[i, r], row.seq + path_tokens(tree, r), row.prompt_len, row.sampler,
                                         rp + 1 + depth))))
                elif do_sample:
                    row, rp = rows[b], int(root_pos[i])
                    walk_results.append(accept_walk_lazy(
                        tree, lambda r, depth, i=i, row=row, rp=rp: row.sampler.sample(logits[i, r], rp + 1 + depth)))
                else:
                    walk_results.append(accept_walk(tree, targets[i, : 1 + len(tree)]))
            del logits
        accepted_rows = []
        for i, (b, tree) in enumerate(zip(active, trees)):
            row = rows[b]
            accepted, bonus = walk_results[i]
            accepted_rows.append(accepted)
            k = int(accepted.shape[0])
            rs = row.stats
            rs.head_rows += head_rows[i]
            stats.head_rows += head_rows[i]
            rs._count_pass(k)
            rs._count_draft(tree, accepted)
            stats._count_draft(tree, accepted)
            if row.proposer is not None and len(tree):
                row.budget.observe(len(tree), k)
                observe_nodes = getattr(row.budget, "observe_nodes", None)
                if observe_nodes is not None:
                    observe_nodes(accepted)
            emit(row, tree.token_ids[accepted].tolist() + [bonus])
        stats._count_pass(int(max(a.shape[0] for a in accepted_rows)))
        # -- compact: row i keeps its root (slot `slots`) and accepted nodes at slots lengths[i] ..
        kmax = 1 + max(a.shape[0] for a in accepted_rows)
        src = np.empty((n_act, kmax), dtype=np.int64)
        dst = np.empty((n_act, kmax), dtype=np.int64)
        grow = max(0, int(max(lengths[i] + 1 + a.shape[0] for i, a in enumerate(accepted_rows))) - slots)
        if grow:
            valid = np.concatenate([valid, np.zeros((n_act, grow), dtype=bool)], axis=1)
            key_pos = np.concatenate([key_pos, np.full((n_act, grow), -1, dtype=np.int64)], axis=1)
        for i, a in enumerate(accepted_rows):
            kk = 1 + a.shape[0]
            s = slots + np.concatenate([[0], a + 1])
            d = lengths[i] + np.arange(kk)
            src[i, :kk], dst[i, :kk] = s, d
            src[i, kk:], dst[i, kk:] = s[-1], d[-1]
            valid[i, d] = True
            key_pos[i, d] = root_pos[i] + np.arange(kk)
            lengths[i] += kk
        new_len = int(lengths.max())
        gather_rows(cache, torch.arange(n_act, device=device)[:, None], torch.from_numpy(src).to(device),
                    torch.from_numpy(dst).to(device), new_len)
        valid, key_pos = valid[:, :new_len], key_pos[:, :new_len]
        active, lengths, valid, key_pos = _drop_finished(rows, active, cache, lengths, valid, key_pos)
        t4 = time.perf_counter()
        stats.propose_seconds += t1 - t0
        stats.prepare_seconds += t2 - t1
        stats.forward_seconds += t3 - t2 + head_seconds
        stats.accept_seconds += t4 - t3 - head_seconds

    # -- outputs, model.generate's layout
    if padded is None:
        width = max(prompt_lens)
        heads = [[pad_token_id] * (width - n) + row.seq[:n] for n, row in zip(prompt_lens, rows)]
    else:
        heads = [padded[b].tolist() for b in range(batch)]
    tails = [row.seq[row.prompt_len:] for row in rows]
    out_len = len(heads[0]) + max(len(x) for x in tails)
    seqs = torch.full((batch, out_len), pad_token_id, dtype=torch.long)
    for b in range(batch):
        line = heads[b] + tails[b]
        seqs[b, : len(line)] = torch.tensor(line, dtype=torch.long)
    wall = time.perf_counter() - wall_start
    for row in rows:
        row.stats.new_tokens = len(row.seq) - row.prompt_len
        if not row.stats.wall_seconds:  # max_new_tokens = 0: no row ran
            row.stats.wall_seconds = wall
            if on_row_done is not None:
                on_row_done(row.batch_row, [], row.stats)
    stats.new_tokens = sum(r.stats.new_tokens for r in rows)
    reasons = {r.stats.stop_reason for r in rows}
    stats.stop_reason = reasons.pop() if len(reasons) == 1 else "mixed"
    stats.seed = seeds[0] if do_sample else None
    stats.wall_seconds = wall
    return output_cls(seqs, stats)


def _drop_finished(rows, active, cache, lengths, valid, key_pos):
    """Remove finished rows from the batch (cache rows included) and cut holes no active row needs."""
    keep = [i for i, b in enumerate(active) if not rows[b].done]
    if len(keep) == len(active):
        return active, lengths, valid, key_pos
    if not keep:
        return [], lengths[:0], valid[:0], key_pos[:0]
    lengths = lengths[keep]
    new_len = int(lengths.max())
    valid = valid[keep, :new_len]
    # left-padding holes that every remaining row has (a long prompt's row left): cut them too
    start = int(valid.argmax(axis=1).min())
    device = next(iter(_layers(cache))).keys.device
    select_rows(cache, torch.tensor(keep, dtype=torch.int64, device=device), start, new_len)
    return [active[i] for i in keep], lengths - start, valid[:, start:], key_pos[keep, start:new_len]


def _mask_for(full: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray, spec, device, sliding_from: int = 0):
    """bool ``full`` [B, T, S] → the model's mask(s) [B, 1, T, S] (window on positions for sliding layers).

    ``q_pos`` int64 [B, T], ``k_pos`` int64 [B, S]: positions of the query and key slots.
    ``sliding_from``: with a per-layer-type mask (``spec.kind == "dict"``), the sliding
    layers' mask keeps key columns ``[sliding_from, S)`` only (their windowed prefill)."""
    full_t = torch.from_numpy(np.ascontiguousarray(full))
    window_t = None
    if spec.window is not None:
        in_window = (q_pos[:, :, None] - k_pos[:, None, :]) < spec.window
        window_t = full_t & torch.from_numpy(in_window)
    if spec.kind == "dict":
        return {"full_attention": _finish(full_t, spec)[:, None].to(device),
                "sliding_attention": _finish(window_t[:, :, sliding_from:], spec)[:, None].to(device)}
    if window_t is not None:
        return _finish(window_t, spec)[:, None].to(device)
    return _finish(full_t, spec)[:, None].to(device)
