"""``generate``'s token inputs, normalised: prompts (one, a list, or a left-padded batch),
references, per-row seeds and eos ids. Every token sequence goes through
:func:`refdec.tokens.as_token_ids`."""

from __future__ import annotations

import numpy as np
import torch

from refdec.decode.sampling import random_seed
from refdec.tokens import as_token_ids, is_int

__all__ = ["eos_ids", "is_batched_input", "normalize_batch", "normalize_prompt", "normalize_references",
           "row_seeds", "split_references"]


def is_batched_input(input_ids, attention_mask=None) -> bool:
    """True for a list of prompts, a 2-D input with more than one row, or a mask with padding."""
    if isinstance(input_ids, (list, tuple)):
        return len(input_ids) > 0 and not is_int(input_ids[0])
    if isinstance(input_ids, (torch.Tensor, np.ndarray)) and input_ids.ndim == 2:
        if input_ids.shape[0] > 1:
            return True
        if attention_mask is not None:
            return bool((_as_numpy(attention_mask) == 0).any())
    return False


def _as_numpy(array) -> np.ndarray:
    return array.detach().cpu().numpy() if isinstance(array, torch.Tensor) else np.asarray(array)


def _empty_prompt_error(name: str) -> ValueError:
    return ValueError(f"{name} is empty: each prompt needs at least one token (refdec adds no BOS token; "
                      "tokenize with special tokens)")


def normalize_prompt(input_ids, vocab_size: int) -> np.ndarray:
    """int64 [L] from one prompt: a LongTensor [1, L], a 1-D tensor or array, or a list of ints."""
    if isinstance(input_ids, (torch.Tensor, np.ndarray)) and input_ids.ndim > 2:
        raise ValueError(f"input_ids must have shape [1, L] or [L], got shape {tuple(input_ids.shape)}")
    if isinstance(input_ids, (torch.Tensor, np.ndarray)) and input_ids.ndim == 2:
        if input_ids.shape[0] != 1:
            raise ValueError(f"input_ids has {input_ids.shape[0]} rows where one sequence was expected (shape "
                             "[1, L]); generate() takes batches as a list of prompts or a padded [B, L] batch")
        input_ids = input_ids[0]
    prompt = as_token_ids(input_ids, "input_ids", vocab_size=vocab_size, dtype=np.int64)
    if prompt.size == 0:
        raise _empty_prompt_error("input_ids")
    return prompt


def normalize_batch(input_ids, attention_mask, vocab_size: int) -> tuple[list[np.ndarray], np.ndarray | None]:
    """Per-row prompts (int64 [L_b], padding removed) and the caller's padded matrix (int64 [B, L],
    or None for a list of prompts)."""
    if isinstance(input_ids, (list, tuple)):
        if attention_mask is not None:
            raise ValueError("attention_mask is for a padded [B, L] input_ids; a list of prompts needs none")
        rows = []
        for b, prompt in enumerate(input_ids):
            if isinstance(prompt, (torch.Tensor, np.ndarray)) and prompt.ndim == 2 and prompt.shape[0] == 1:
                prompt = prompt[0]  # a tokenizer's return_tensors="pt" output for one prompt: [1, L]
            rows.append(as_token_ids(prompt, f"input_ids[{b}]", dtype=np.int64))
        padded = None
    else:
        if isinstance(input_ids, torch.Tensor) and (input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool):
            raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
        padded = _as_numpy(input_ids)
        if padded.size and not np.issubdtype(padded.dtype, np.integer):
            raise ValueError(f"input_ids must hold integer token ids, got dtype {padded.dtype}")
        if padded.ndim != 2:
            raise ValueError(f"batched input_ids must have shape [B, L], got {tuple(padded.shape)}")
        padded = padded.astype(np.int64)
        mask = np.ones_like(padded, dtype=bool) if attention_mask is None else _left_padding_mask(
            _as_numpy(attention_mask), padded.shape)
        rows = [padded[b][mask[b]] for b in range(padded.shape[0])]
    if not rows:
        raise ValueError("input_ids holds no prompt")
    for b, prompt in enumerate(rows):
        if prompt.size == 0:
            raise _empty_prompt_error(f"prompt {b}")
        as_token_ids(prompt, f"prompt {b}", vocab_size=vocab_size, dtype=np.int64)  # the vocabulary bound
    return rows, padded


def _left_padding_mask(mask: np.ndarray, shape: tuple) -> np.ndarray:
    """bool [B, L] from a 0/1 ``attention_mask`` that must be left-padded."""
    if mask.shape != shape:
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)}, input_ids {tuple(shape)}")
    if not np.isin(mask, (0, 1)).all():
        raise ValueError("attention_mask must hold 0 (padding) and 1 (token) only")
    mask = mask.astype(bool)
    turns_off = (np.diff(mask.astype(np.int8), axis=1) < 0).any(axis=1)  # a 0 after a 1
    if turns_off.any():
        raise ValueError(f"attention_mask row {int(np.flatnonzero(turns_off)[0])} is not left-padded (a 0 after a "
                         "1); pad on the left (tokenizer.padding_side = 'left'), as for model.generate")
    return mask


def normalize_references(references, tokenizer) -> list[np.ndarray]:
    """int32 [R_i] token ids of each reference (a str, tokenized without special tokens, or token ids)."""
    if references is None:
        return []
    if isinstance(references, (str, bytes)) or not isinstance(references, (list, tuple)):
        raise ValueError(f"references must be a list of str or of token-id lists, got {type(references).__name__}")
    out = []
    for i, ref in enumerate(references):
        if isinstance(ref, str):
            if tokenizer is None:
                raise ValueError(f"references[{i}] is a str; text references need tokenizer=...")
            ref = tokenizer(ref, add_special_tokens=False)["input_ids"]
        elif isinstance(ref, (torch.Tensor, np.ndarray)):
            ref = ref.reshape(-1)
        elif not isinstance(ref, (list, tuple)):
            raise ValueError(f"references[{i}] must be a str or a list of token ids, got {type(ref).__name__}")
        out.append(as_token_ids(ref, f"references[{i}]"))
    return out


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
        marked = any(r is None or (len(r) > 0 and not is_int(r[0])) for r in references)
        per_row = marked or len(references) == batch_size
    if per_row:
        if len(references) != batch_size:
            raise ValueError(f"references has {len(references)} per-row lists for a batch of {batch_size} "
                             "(pass one list per row, or one list of references shared by all rows)")
        return list(references)
    return [references] * batch_size


def row_seeds(seed, batch_size: int) -> list[int]:
    """Row b's seed: ``seed + b`` for an int, ``seed[b]`` for a list, a fresh base + b for None."""
    if seed is None:
        base = random_seed()
        return [base + b for b in range(batch_size)]
    if isinstance(seed, (list, tuple)):
        if len(seed) != batch_size or not all(is_int(s) and s >= 0 for s in seed):
            raise ValueError(f"seed must be an int >= 0 or a list of {batch_size} ints >= 0, got {seed!r}")
        return [int(s) for s in seed]
    return [int(seed) + b for b in range(batch_size)]


def eos_ids(eos_token_id, model, vocab_size: int) -> set[int]:
    """The eos ids as a set (None: the model's generation_config's); a given id outside the
    model's vocabulary [0, ``vocab_size``) is an error (the model could never emit it)."""
    given = eos_token_id is not None
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos_token_id is None:
            return set()
    if isinstance(eos_token_id, torch.Tensor):
        eos_token_id = eos_token_id.tolist()
    if is_int(eos_token_id):
        eos_token_id = [eos_token_id]
    if not isinstance(eos_token_id, (list, tuple, set)) or not all(is_int(e) and e >= 0 for e in eos_token_id):
        raise ValueError(f"eos_token_id must be an int >= 0 or a list of them, got {eos_token_id!r}")
    eos = {int(e) for e in eos_token_id}
    outside = sorted(e for e in eos if e >= vocab_size)
    if given and outside:
        raise ValueError(f"eos_token_id {outside[0]} is outside the model vocabulary [0, {vocab_size})")
    return eos
