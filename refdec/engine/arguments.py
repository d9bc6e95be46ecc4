"""``generate``'s arguments, checked and normalised in one place.

:func:`parse_arguments` turns the raw arguments of ``SpeculativeDecoder.generate`` into one
:class:`GenerateArguments`: the prompts (one, a list, or a left-padded batch), each row's
references, seed and the sampling settings, the eos ids and the pad id, the logits settings
``model.generate`` would apply (from the model's generation_config or as arguments), stop strings,
the index and retrieval, the streamer and the batch's callbacks. A malformed argument is a
ValueError naming it (an unknown keyword argument a TypeError), raised before anything is decoded
and in the order of :func:`parse_arguments`. Every token sequence goes through
:func:`refdec.tokens.as_token_ids`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from refdec.drafting.implicit import implicit_reference
from refdec.drafting.index import CorpusIndex, ShardedIndex, tokenizer_fingerprint
from refdec.engine.processors import PathLogitsProcessor
from refdec.engine.sampling import random_seed
from refdec.engine.settings import DecodeSettings
from refdec.sizing.budget import Budget
from refdec.tokens import as_token_ids, check_int, is_int

__all__ = ["GenerateArguments", "check_index_tokenizer", "eos_ids", "is_batched_input", "logits_processor",
           "implicit_references", "normalize_batch", "normalize_prompt", "normalize_references",
           "normalize_stop_strings", "parse_arguments", "row_references", "row_seeds", "split_references"]


@dataclass(frozen=True)
class GenerateArguments:
    """One ``generate`` call's arguments, checked and normalised (:func:`parse_arguments`).

    ``single``: one prompt (a batch of one that may stream) rather than a batch. ``prompts``:
    int64 [L_b] per row, padding removed; ``padded``: int64 [B, L], the caller's left-padded
    batch as given (None for one prompt or a list of prompts). ``references``: per row, int32
    [R_i] token ids of each reference (a row given none: its prompt's implicit reference, if any).
    ``seeds``: row b's sampling seed (None per row when greedy). ``eos``: the eos ids;
    ``pad_token_id``: a batch's padding (None for one prompt).
    ``processor``: the logits settings applied per tree path (refdec.engine.processors).
    ``max_draft_tokens``: the draft-size policy, a :class:`~refdec.sizing.budget.Budget` (an int became
    a FixedBudget), or ``"auto"`` (the decoder makes AutoBudgets on the backend's cost curve).
    ``max_batch_size``: the rows that decode together at most (every row when None was given).
    """

    single: bool
    prompts: list[np.ndarray]
    padded: np.ndarray | None
    references: list[list[np.ndarray]]
    tokenizer: Any
    index: CorpusIndex | ShardedIndex | None
    retrieve: int
    max_new_tokens: int
    max_draft_tokens: Budget | str
    do_sample: bool
    temperature: float
    top_k: int | None
    top_p: float | None
    min_p: float | None
    seeds: list[int | None]
    eos: set[int]
    pad_token_id: int | None
    processor: PathLogitsProcessor
    stop_strings: list[str]
    streamer: Any
    max_batch_size: int
    on_row_done: Callable | None


def parse_arguments(backend, input_ids, settings: DecodeSettings, *, tokenizer, index, references, streamer,
                    attention_mask, pad_token_id, retrieve, max_batch_size, on_row_done) -> GenerateArguments:
    """``generate``'s arguments (the decoder's tokenizer and index already standing in for None)
    checked, in this order, and normalised for ``backend`` (refdec.transformers.backend: its vocabulary,
    position limit and generation_config); ``settings`` (checked when made) against the model: its
    eos ids, logits settings and stop strings' tokenizer."""
    if not isinstance(settings, DecodeSettings):
        raise ValueError(f"settings must be a refdec.DecodeSettings, got {type(settings).__name__}")
    if on_row_done is not None and not callable(on_row_done):
        raise ValueError(f"on_row_done must be callable or None, got {type(on_row_done).__name__}")
    if max_batch_size is not None and (not is_int(max_batch_size) or max_batch_size < 1):
        raise ValueError(f"max_batch_size must be an int >= 1 or None, got {max_batch_size!r}")
    check_index_tokenizer(index, tokenizer)
    one_row_batch = (on_row_done is not None and isinstance(input_ids, (torch.Tensor, np.ndarray))
                     and input_ids.ndim == 2)  # [1, L] with a callback: model.generate's batch form
    single = not (is_batched_input(input_ids, attention_mask) or one_row_batch)
    if single and on_row_done is not None:
        raise ValueError("on_row_done applies to batches (a list of prompts or a padded [B, L] batch); "
                         "stream one prompt with streamer=")
    if not single and streamer is not None:
        raise ValueError("streamer needs a single prompt (as transformers' streamers): pass it as input_ids "
                         "(a list of ints or a [1, L] tensor, not a list of prompts), or generate the rows one "
                         "at a time to stream them")
    if single:
        prompts, padded = [normalize_prompt(input_ids, backend.vocab_size)], None
        _check_single_mask(attention_mask, prompts[0])
    max_new_tokens = settings.max_new_tokens
    eos = eos_ids(settings.eos_token_id, backend, backend.vocab_size)
    processor = logits_processor(backend, eos, dict(settings.logits_settings), max_new_tokens)
    processor.check_vocab(backend.vocab_size)
    stops = normalize_stop_strings(settings.stop_strings, tokenizer)
    if single:
        refs_per_row = [row_references(references, prompts[0], tokenizer)]
    if streamer is not None and not (callable(getattr(streamer, "put", None))
                                     and callable(getattr(streamer, "end", None))):
        raise ValueError(f"streamer must have put() and end() (a transformers BaseStreamer), "
                         f"got {type(streamer).__name__}")
    if index is not None and not isinstance(index, (CorpusIndex, ShardedIndex)):
        raise ValueError(f"index must be a refdec.CorpusIndex, a refdec.ShardedIndex or None, "
                         f"got {type(index).__name__}")
    retrieve = check_retrieve(retrieve, index)
    if not single:
        pad_token_id = _pad_token_id(pad_token_id, backend, eos)
        prompts, padded = normalize_batch(input_ids, attention_mask, backend.vocab_size)
        refs_per_row = [row_references(r, prompt, tokenizer)
                        for r, prompt in zip(split_references(references, len(prompts)), prompts)]
    else:
        pad_token_id = None
    _check_prompt_lengths(prompts, backend.max_positions, single)
    seeds = row_seeds(settings.seed, len(prompts)) if settings.do_sample else [None] * len(prompts)
    return GenerateArguments(
        single=single, prompts=prompts, padded=padded, references=refs_per_row, tokenizer=tokenizer, index=index,
        retrieve=retrieve, max_new_tokens=max_new_tokens, max_draft_tokens=settings.max_draft_tokens,
        do_sample=settings.do_sample, temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p,
        min_p=settings.min_p, seeds=seeds, eos=eos,
        pad_token_id=pad_token_id, processor=processor, stop_strings=stops, streamer=streamer,
        max_batch_size=max_batch_size or len(prompts), on_row_done=on_row_done)


# ---------------------------------------------------------------------------------------------
# Prompts


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


def _check_single_mask(attention_mask, prompt: np.ndarray) -> None:
    """A single prompt's ``attention_mask`` (None, or all ones of its length: nothing to pad)."""
    if attention_mask is None:
        return
    mask = np.asarray(attention_mask.cpu() if isinstance(attention_mask, torch.Tensor) else attention_mask)
    if mask.size != prompt.size or not (mask == 1).all():
        raise ValueError(f"attention_mask for a single prompt must be all ones of its length "
                         f"{prompt.size}, got shape {tuple(mask.shape)} (pass a padded [B, L] batch, "
                         f"or a list of prompts)")


def _check_prompt_lengths(prompts: list[np.ndarray], max_positions: int | None, single: bool) -> None:
    """No prompt (int64 [L_b] each) longer than the model's positions (None: unbounded)."""
    for b, prompt in enumerate(prompts):
        if max_positions is not None and prompt.shape[0] > max_positions:
            name = "prompt" if single else f"prompt {b}"
            raise ValueError(f"{name} has {prompt.shape[0]} tokens, more than the model's "
                             f"max_position_embeddings={max_positions}")


# ---------------------------------------------------------------------------------------------
# References


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


def implicit_references(prompt: np.ndarray, tokenizer) -> list[np.ndarray]:
    """The implicit reference of a prompt given without references (refdec.drafting.implicit: the
    largest fenced code block of its text, decoded with ``tokenizer``), tokenized as a text
    reference is: ``[int32 [R]]``, or ``[]`` without a tokenizer or without such a block.
    ``prompt``: int64 [L] token ids."""
    if tokenizer is None or not callable(getattr(tokenizer, "decode", None)):
        return []
    body = implicit_reference([tokenizer.decode(prompt.tolist())])
    return [] if body is None else normalize_references([body], tokenizer)


def row_references(references, prompt: np.ndarray, tokenizer) -> list[np.ndarray]:
    """A row's references (:func:`normalize_references`); None: its prompt's implicit reference
    (:func:`implicit_references`; ``[]`` asks for none). ``prompt``: int64 [L] token ids."""
    if references is None:
        return implicit_references(prompt, tokenizer)
    return normalize_references(references, tokenizer)


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


# ---------------------------------------------------------------------------------------------
# Sampling: the settings and each row's seed


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


# ---------------------------------------------------------------------------------------------
# Token ids: eos and padding


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


def _pad_token_id(pad_token_id, backend, eos: set[int]) -> int:
    """A batch's padding: the given id, else the generation_config's, else the least eos id, else 0."""
    if pad_token_id is None:
        pad_token_id = getattr(getattr(backend, "generation_config", None), "pad_token_id", None)
        if pad_token_id is None:
            pad_token_id = min(eos) if eos else 0
    return check_int("pad_token_id", pad_token_id, 0)


# ---------------------------------------------------------------------------------------------
# The logits settings model.generate applies


# Fields of a model's generation_config that make model.generate(do_sample=False) change the
# logits, with their no-op values. refdec applies those that depend only on the sequence so far
# and the position (_PATH_PROCESSED) per tree path (refdec.engine.processors); a model carrying any
# other is an error rather than a silent difference from model.generate.
_LOGITS_CONFIG_NOOPS = {
    "repetition_penalty": (None, 1.0), "encoder_repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0), "encoder_no_repeat_ngram_size": (None, 0), "bad_words_ids": (None, []),
    "min_length": (None, 0), "min_new_tokens": (None, 0), "suppress_tokens": (None, []),
    "begin_suppress_tokens": (None, []), "forced_bos_token_id": (None,), "forced_eos_token_id": (None,),
    "exponential_decay_length_penalty": (None,), "sequence_bias": (None, {}), "guidance_scale": (None, 1.0),
    "watermarking_config": (None,),
}
_PATH_PROCESSED = ("sequence_bias", "repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "min_length",
                   "min_new_tokens", "forced_eos_token_id", "exponential_decay_length_penalty", "suppress_tokens",
                   "begin_suppress_tokens")


def _is_noop(value, noops) -> bool:
    """``value`` (arrays already made lists) leaves the logits as they are."""
    if isinstance(value, (list, tuple, dict)) and len(value) == 0:
        return True  # an empty list / tuple / dict of banned ids, biases, ...
    return any(value == v for v in noops)


def logits_processor(model, eos: set[int], settings: dict | None = None,
                     max_new_tokens: int | None = None) -> PathLogitsProcessor:
    """The processor for the logits settings refdec applies per tree path: those of
    ``model.generation_config``, each overridden by the same name in ``settings`` (generate's
    keyword arguments, as ``model.generate(ids, repetition_penalty=1.2)`` takes them; None
    switches a setting off). ``eos``: the decoding's eos ids, for the min-length bans and the
    length penalty; ``max_new_tokens``: for ``forced_eos_token_id`` (the last new token). Raise
    on an unknown setting, and on one that changes the logits but refdec does not apply."""
    settings = dict(settings or {})
    unknown = sorted(name for name in settings if name not in _LOGITS_CONFIG_NOOPS)
    if unknown:
        raise TypeError(f"generate() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; the logits "
                        f"settings it takes are {', '.join(_PATH_PROCESSED)}")
    gen_config = getattr(model, "generation_config", None)
    merged = {name: getattr(gen_config, name, None) for name in _LOGITS_CONFIG_NOOPS}
    merged.update(settings)
    for name, value in merged.items():  # arrays as model.generate takes them: token ids, a (start, factor) pair
        if isinstance(value, (np.ndarray, torch.Tensor)):
            merged[name] = value.tolist()
    if merged["min_new_tokens"] is not None:
        # model.generate sets min_length = prompt length + min_new_tokens whenever min_new_tokens is
        # set (0 included), so the configured min_length never applies then
        merged["min_length"] = None
    set_fields = {name: value for name, value in merged.items() if not _is_noop(value, _LOGITS_CONFIG_NOOPS[name])}
    refused = [(name, value) for name, value in set_fields.items() if name not in _PATH_PROCESSED]
    if refused:
        listed = ", ".join(f"argument {name}={value!r}" if name in settings
                           else f"model.generation_config sets {name}={value!r}" for name, value in refused)
        resets = "; ".join(f"drop the argument {name}" if name in settings else f"model.generation_config.{name} = None"
                           for name, _ in refused)
        raise ValueError(f"{listed}: model.generate applies it to the logits and refdec does not, so the outputs "
                         f"would differ. Decode without it: {resets}")
    return PathLogitsProcessor(**{name: value for name, value in set_fields.items() if name in _PATH_PROCESSED},
                               eos=eos, max_new_tokens=max_new_tokens)


# ---------------------------------------------------------------------------------------------
# Stop strings, the index and retrieval


def normalize_stop_strings(stop_strings, tokenizer) -> list[str]:
    """``stop_strings`` as a list of non-empty str (a single str: a list of one); matching them needs
    ``tokenizer``."""
    if stop_strings is None:
        return []
    if isinstance(stop_strings, str):
        stop_strings = [stop_strings]
    if not isinstance(stop_strings, (list, tuple)) or not all(isinstance(s, str) and s for s in stop_strings):
        raise ValueError(f"stop_strings must be a non-empty string or a list of them, got {stop_strings!r}")
    if stop_strings and tokenizer is None:
        raise ValueError("stop_strings needs a tokenizer: pass tokenizer=... to generate()")
    return list(stop_strings)


def check_index_tokenizer(index, tokenizer) -> None:
    """An index built with another tokenizer drafts ids that mean other text: refuse it (as
    ``CorpusIndex.load(path, tokenizer=...)`` does) when both are known."""
    fingerprint = getattr(index, "fingerprint", None)
    # a transformers tokenizer has get_vocab, a GGUF model's (refdec.llama_cpp.tokenizer) a fingerprint
    knows_its_vocabulary = hasattr(tokenizer, "get_vocab") or hasattr(tokenizer, "fingerprint")
    if not fingerprint or tokenizer is None or not knows_its_vocabulary:
        return
    ours = tokenizer_fingerprint(tokenizer)  # memoised per tokenizer object
    if ours != fingerprint:
        raise ValueError(f"index was built with another tokenizer (fingerprint {fingerprint[:12]}..., the "
                         f"tokenizer given has {ours[:12]}...): its drafts would be other text")


def check_retrieve(retrieve, index) -> int:
    """``retrieve`` as an int: documents to retrieve per row from ``index``, which then must have
    MinHash signatures."""
    if not is_int(retrieve) or retrieve < 0:
        raise ValueError(f"retrieve must be an int >= 0 (documents to retrieve from the index), got {retrieve!r}")
    if retrieve and index is None:
        raise ValueError(f"retrieve={retrieve} needs a corpus index (index=...) to retrieve documents from")
    if retrieve:
        index.retriever()  # ValueError when the index has no MinHash signatures
    return int(retrieve)
