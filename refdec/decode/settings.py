"""``generate``'s settings, validated: sampling arguments, the logits settings ``model.generate``
would apply (from the model's generation_config or as arguments), stop strings and retrieval."""

from __future__ import annotations

import numbers
import warnings

import numpy as np
import torch

from refdec.decode.processors import PathLogitsProcessor
from refdec.index import tokenizer_fingerprint
from refdec.tokens import is_int

__all__ = ["check_index_tokenizer", "check_retrieve", "logits_processor", "normalize_stop_strings",
           "validate_sampling"]

# Fields of a model's generation_config that make model.generate(do_sample=False) change the
# logits, with their no-op values. refdec applies those that depend only on the sequence so far
# and the position (_PATH_PROCESSED) per tree path (refdec.decode.processors); a model carrying any
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


def validate_sampling(do_sample, temperature, top_k, top_p, seed, min_p=None) -> None:
    if not isinstance(do_sample, bool):
        raise ValueError(f"do_sample must be True or False, got {do_sample!r}")
    if not isinstance(temperature, numbers.Real) or isinstance(temperature, bool) or not np.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number, got {temperature!r}")
    if do_sample and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when do_sample=True, got {temperature!r} "
                         "(use do_sample=False for greedy decoding)")
    if top_k is not None and (not is_int(top_k) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (not isinstance(top_p, numbers.Real) or isinstance(top_p, bool)
                              or not 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")
    if min_p is not None and (not isinstance(min_p, numbers.Real) or isinstance(min_p, bool)
                              or not 0.0 <= min_p <= 1.0):
        raise ValueError(f"min_p must be None or a number in [0, 1], got {min_p!r}")
    if seed is not None and (not is_int(seed) or seed < 0):
        raise ValueError(f"seed must be None or an int >= 0, got {seed!r}")
    if not do_sample:
        unused = [f"{name}={value!r}" for name, value, off in (
            ("temperature", temperature, 1.0), ("top_k", top_k, None), ("top_p", top_p, None), ("min_p", min_p, None),
            ("seed", seed, None)) if value != off]
        if unused:  # as model.generate warns: greedy decoding does not read them
            warnings.warn(f"do_sample=False (greedy decoding), so {', '.join(unused)} has no effect; pass "
                          f"do_sample=True to sample", UserWarning, stacklevel=4)


def normalize_stop_strings(stop_strings, tokenizer) -> list[str]:
    if stop_strings is None:
        return []
    if isinstance(stop_strings, str):
        stop_strings = [stop_strings]
    if not isinstance(stop_strings, (list, tuple)) or not all(isinstance(s, str) and s for s in stop_strings):
        raise ValueError(f"stop_strings must be a non-empty string or a list of them, got {stop_strings!r}")
    if stop_strings and tokenizer is None:
        raise ValueError("stop_strings needs a tokenizer: pass tokenizer=... to generate()")
    return list(stop_strings)


def check_retrieve(retrieve, index) -> int:
    if not is_int(retrieve) or retrieve < 0:
        raise ValueError(f"retrieve must be an int >= 0 (documents to retrieve from the index), got {retrieve!r}")
    if retrieve and index is None:
        raise ValueError(f"retrieve={retrieve} needs a corpus index (index=...) to retrieve documents from")
    if retrieve:
        index.retriever()  # ValueError when the index has no MinHash signatures
    return int(retrieve)
