"""One request's decoding settings, :class:`DecodeSettings`: how to decode (the length, greedy or
sampling and its knobs, the stops, the draft budget, ``model.generate``'s logits settings), apart
from what to decode (the prompts, references, corpus and callbacks).

Checked once, where the settings enter refdec: ``generate``'s keywords (:meth:`DecodeSettings.of`),
the server's request (refdec.serve.app), ``DecodingService.submit``; then carried unchanged to
the engine's requests (refdec.engine.arguments.parse_arguments reads it). A bad value is a
ValueError naming the setting; what needs the model (eos ids in its vocabulary, a logits setting
its generation config knows, stop strings' tokenizer) is checked by parse_arguments.
"""

from __future__ import annotations

import numbers
import sys
import warnings
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from refdec.engine.defaults import MAX_NEW_TOKENS
from refdec.sizing.budget import Budget, make_budget
from refdec.tokens import check_int, is_int

__all__ = ["DecodeSettings", "validate_sampling"]


@dataclass(frozen=True)
class DecodeSettings:
    """How one request (or each row of one ``generate`` call) decodes.

    ``max_new_tokens``: the most tokens emitted; ``do_sample``, ``temperature``, ``top_k``,
    ``top_p``, ``min_p``: greedy or sampling, as ``model.generate`` takes them; ``seed``: the
    sampling seed (an int, a tuple of per-row ints, or None for a fresh one); ``eos_token_id``:
    the end-of-sequence ids (None: the model's); ``stop_strings``: a tuple of non-empty str;
    ``max_draft_tokens``: a :class:`~refdec.sizing.budget.Budget` (an int given becomes a
    FixedBudget) or ``"auto"``; ``logits_settings``: ``model.generate``'s sequence-dependent logits
    settings by name (read-only; refdec.engine.arguments.logits_processor applies them).
    """

    max_new_tokens: int = MAX_NEW_TOKENS
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | tuple[int, ...] | None = None
    eos_token_id: Any = None
    stop_strings: tuple[str, ...] = ()
    max_draft_tokens: Budget | str = "auto"
    logits_settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: each value normalised once, here
        set_(self, "max_new_tokens", check_int("max_new_tokens", self.max_new_tokens, 0))
        seed = self.seed
        if isinstance(seed, (list, tuple)):
            if not all(is_int(s) and s >= 0 for s in seed):
                raise ValueError(f"seed must be an int >= 0 or a list of ints >= 0, got {seed!r}")
            set_(self, "seed", tuple(int(s) for s in seed))
        validate_sampling(self.do_sample, self.temperature, self.top_k, self.top_p,
                          None if isinstance(self.seed, tuple) else self.seed, self.min_p)
        set_(self, "stop_strings", _stop_strings(self.stop_strings))
        if not (isinstance(self.max_draft_tokens, str) and self.max_draft_tokens == "auto"):
            set_(self, "max_draft_tokens", make_budget(self.max_draft_tokens))
        if not isinstance(self.logits_settings, Mapping):
            raise ValueError(f"logits_settings must be a mapping of setting names to values, "
                             f"got {type(self.logits_settings).__name__}")
        set_(self, "logits_settings", MappingProxyType(dict(self.logits_settings)))

    @classmethod
    def of(cls, settings: "DecodeSettings | None" = None, **keywords) -> "DecodeSettings":
        """``settings`` itself, or the settings ``generate``'s keywords spell (a keyword that is no
        field of this class is a logits setting); both: the keywords override ``settings``'
        fields. ``settings`` of another type: ValueError."""
        if settings is not None and not isinstance(settings, cls):
            raise ValueError(f"settings must be a refdec.DecodeSettings or None, got {type(settings).__name__}")
        names = {f.name for f in fields(cls)}
        given = {name: value for name, value in keywords.items() if name in names}
        logits = {name: value for name, value in keywords.items() if name not in names}
        if logits:
            base = dict(settings.logits_settings) if settings is not None else {}
            given["logits_settings"] = {**base, **logits}
        if settings is None:
            return cls(**given)
        return replace(settings, **given) if given else settings


def validate_sampling(do_sample, temperature, top_k, top_p, seed, min_p=None) -> None:
    """The sampling settings as ``model.generate`` takes them (``seed``: an int or None; a list of
    per-row seeds is checked by refdec.engine.arguments.row_seeds); greedy decoding warns about those
    it does not read."""
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
                          f"do_sample=True to sample", UserWarning, stacklevel=_caller_stacklevel())


def _caller_stacklevel() -> int:
    """warnings.warn's stacklevel, from validate_sampling, of the first frame outside refdec (and
    torch's inference-mode wrapper): the user's line that gave the setting."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in ("refdec", "torch"):
        frame, level = frame.f_back, level + 1
    return level


def _stop_strings(stop_strings) -> tuple[str, ...]:
    """``stop_strings`` as a tuple of non-empty str (None: none; a single str: a tuple of one)."""
    if stop_strings is None:
        return ()
    if isinstance(stop_strings, str):
        stop_strings = [stop_strings]
    if not isinstance(stop_strings, (list, tuple)) or not all(isinstance(s, str) and s for s in stop_strings):
        raise ValueError(f"stop_strings must be a non-empty string or a list of them, got {stop_strings!r}")
    return tuple(stop_strings)
