"""Logits processors of a ``generation_config``, applied per tree path.

``model.generate`` applies the processors a model's ``generation_config`` sets to every
step's logits. Most depend on the sequence so far, e.g. ``repetition_penalty`` (every
token already in the sequence has its logit divided by the penalty when positive,
multiplied when negative: transformers' RepetitionPenaltyLogitsProcessor) and
``no_repeat_ngram_size`` n (a token that would complete an n-gram already in the sequence
is banned: NoRepeatNGramLogitsProcessor). In a draft tree every row has its own
sequence: the context plus the draft tokens on the path to it, so the verifier applies
them row by row with that sequence (:func:`path_tokens`) before choosing the row's
target; the acceptance walk asks only for the rows on the accepted path, whose
sequences are exactly what plain decoding would have seen.
"""

from __future__ import annotations

import numpy as np
import torch

from refdec.drafting.tree import DraftTree
from refdec.tokens import is_int

__all__ = ["PathLogitsProcessor", "path_tokens"]


class PathLogitsProcessor:
    """The logits settings of a ``generation_config`` that ``model.generate`` applies in greedy
    decoding, in transformers' arithmetic and order: ``sequence_bias`` (a dict {tuple of token
    ids: float bias}, or a list of [token id list, float] pairs: the bias is added to the last
    token's logit where the sequence ends with the others), ``repetition_penalty`` (float > 0, None = off),
    ``no_repeat_ngram_size`` (int, None or 0 = off), ``suppress_tokens`` and
    ``begin_suppress_tokens`` (token ids banned everywhere / at the first new position),
    ``bad_words_ids`` (token id lists: the last token is banned where the sequence ends with
    the others; a one-token word equal to an eos is dropped, as transformers does),
    ``min_length`` / ``min_new_tokens`` (the ``eos`` ids are banned while the sequence / the
    new tokens are shorter), ``forced_eos_token_id`` (an id or a list: the only choices for the
    last of ``max_new_tokens`` new tokens), ``exponential_decay_length_penalty`` ((start, factor):
    after ``start`` new tokens each ``eos`` logit gains |logit| * (factor ** steps - 1))."""

    def __init__(self, repetition_penalty: float | None = None, no_repeat_ngram_size: int | None = None, *,
                 sequence_bias=None, suppress_tokens=None, begin_suppress_tokens=None, bad_words_ids=None,
                 min_length: int | None = None, min_new_tokens: int | None = None, forced_eos_token_id=None,
                 exponential_decay_length_penalty=None, max_new_tokens: int | None = None, eos=()) -> None:
        if repetition_penalty is not None and not (isinstance(repetition_penalty, (int, float))
                                                   and not isinstance(repetition_penalty, bool)
                                                   and np.isfinite(repetition_penalty) and repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be a finite number > 0 or None, got {repetition_penalty!r}")
        for name, value in (("no_repeat_ngram_size", no_repeat_ngram_size), ("min_length", min_length),
                            ("min_new_tokens", min_new_tokens)):
            if value is not None and not _is_token_id(value):  # an int >= 0, as a token id
                raise ValueError(f"{name} must be an int >= 0 or None, got {value!r}")
        self.repetition_penalty = None if repetition_penalty in (None, 1.0) else float(repetition_penalty)
        self.no_repeat_ngram_size = int(no_repeat_ngram_size) if no_repeat_ngram_size else None
        self.suppress_tokens = _id_set(suppress_tokens, "suppress_tokens")
        self.begin_suppress_tokens = _id_set(begin_suppress_tokens, "begin_suppress_tokens")
        self.eos = {int(e) for e in eos}
        words = []
        for word in bad_words_ids or []:
            if not isinstance(word, (list, tuple)) or not word or not all(_is_token_id(t) for t in word):
                raise ValueError(f"bad_words_ids must be a list of non-empty lists of token ids >= 0, got {word!r}")
            if not (len(word) == 1 and int(word[0]) in self.eos):
                words.append(tuple(int(t) for t in word))
        self.bad_words = words
        self.sequence_bias = _sequence_bias(sequence_bias)
        # eos bans only while an eos exists (transformers adds the min-length processors only then)
        self.min_length = int(min_length) if min_length and self.eos else None
        self.min_new_tokens = int(min_new_tokens) if min_new_tokens and self.eos else None
        if _is_token_id(forced_eos_token_id):
            forced_eos_token_id = [forced_eos_token_id]
        self.forced_eos = sorted(_id_set(forced_eos_token_id, "forced_eos_token_id"))
        if self.forced_eos and set(self.forced_eos) <= self.suppress_tokens:  # as GenerationConfig.validate
            raise ValueError(f"every token of forced_eos_token_id {self.forced_eos} is also in suppress_tokens: the "
                             f"last new token would have no choice left")
        if self.forced_eos and not _is_token_id(max_new_tokens):
            raise ValueError(f"forced_eos_token_id needs max_new_tokens (an int >= 0), got {max_new_tokens!r}")
        self.max_new_tokens = max_new_tokens
        self.length_decay = None  # (start, factor): eos logits rise after `start` new tokens
        if exponential_decay_length_penalty is not None:
            pair = exponential_decay_length_penalty
            if isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], (float, np.floating)) \
                    and float(pair[0]).is_integer():
                pair = (int(pair[0]), pair[1])  # an integral start index given as a float (from an array)
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and _is_token_id(pair[0])
                    and isinstance(pair[1], (int, float, np.floating)) and not isinstance(pair[1], bool)
                    and np.isfinite(pair[1])):
                raise ValueError(f"exponential_decay_length_penalty must be (start index >= 0, finite factor), "
                                 f"got {pair!r}")
            if self.eos:  # transformers penalises the decoding's eos ids: none, nothing to raise
                self.length_decay = (int(pair[0]), float(pair[1]))

    @property
    def active(self) -> bool:
        return bool(self.sequence_bias or self.repetition_penalty is not None or self.no_repeat_ngram_size is not None
                    or self.suppress_tokens or self.begin_suppress_tokens or self.bad_words
                    or self.min_length is not None or self.min_new_tokens is not None or self.forced_eos
                    or self.length_decay is not None)

    def __call__(self, logits_row: torch.Tensor, sequence: list[int], prompt_len: int) -> torch.Tensor:
        """A processed float32 copy of ``logits_row`` (float [V], any float dtype) for the position
        after ``sequence`` (the token ids before it, the ``prompt_len`` prompt tokens included).
        float32 as transformers' generate, which casts each step's logits to float32 before its
        processors: a penalty divided in bfloat16 rounds and can tie or flip the top token."""
        scores = logits_row.to(dtype=torch.float32, copy=True)
        if self.sequence_bias:
            scores = self._add_sequence_bias(scores, sequence)
        if self.repetition_penalty is not None and sequence:
            ids = torch.tensor(sorted(set(sequence)), dtype=torch.long, device=scores.device)
            picked = scores[ids]
            scores[ids] = torch.where(picked < 0, picked * self.repetition_penalty, picked / self.repetition_penalty)
        new_index = len(sequence) - prompt_len  # the position's index among the new tokens
        banned = set()
        if self.no_repeat_ngram_size is not None:
            banned |= banned_ngram_tokens(sequence, self.no_repeat_ngram_size)
        if ((self.min_length is not None and len(sequence) < self.min_length)
                or (self.min_new_tokens is not None and new_index < self.min_new_tokens)):
            banned |= self.eos
        for word in self.bad_words:
            if _completes(sequence, word):
                banned.add(word[-1])
        _ban(scores, banned)
        if self.forced_eos and new_index == self.max_new_tokens - 1:  # the last new token: an eos
            scores = torch.full_like(scores, -float("inf"))
            scores[torch.tensor(self.forced_eos, dtype=torch.long, device=scores.device)] = 0.0
        if self.length_decay is not None and new_index > self.length_decay[0]:
            scores = self._raise_eos(scores, new_index - self.length_decay[0])
        # suppressed tokens last, as transformers orders its processors
        _ban(scores, self.suppress_tokens | (self.begin_suppress_tokens if new_index == 0 else set()))
        return scores

    def _raise_eos(self, scores: torch.Tensor, steps: int) -> torch.Tensor:
        """transformers' ExponentialDecayLengthPenalty, ``steps`` new tokens past its start: each
        eos logit + |logit| * (factor ** steps - 1), non-finite ones left as they are."""
        eos = torch.tensor(sorted(e for e in self.eos if e < scores.shape[0]), dtype=torch.long, device=scores.device)
        picked = scores[eos]
        penalty = (torch.abs(picked) * (pow(self.length_decay[1], steps) - 1)).masked_fill(~torch.isfinite(picked), 0.0)
        penalties = torch.zeros_like(scores)
        penalties[eos] = penalty
        return scores + penalties

    def check_vocab(self, vocab_size: int) -> None:
        """Raise if a setting names a token id outside [0, ``vocab_size``) (transformers raises
        on a biased one at the first step; refdec before decoding)."""
        named = [("sequence_bias", t) for word, _ in self.sequence_bias for t in word]
        named += [("bad_words_ids", t) for word in self.bad_words for t in word]
        named += [("suppress_tokens", t) for t in self.suppress_tokens]
        named += [("begin_suppress_tokens", t) for t in self.begin_suppress_tokens]
        named += [("forced_eos_token_id", t) for t in self.forced_eos]
        for name, token in named:
            if token >= vocab_size:
                raise ValueError(f"{name} holds token id {token}, outside the model vocabulary [0, {vocab_size})")

    def _add_sequence_bias(self, scores: torch.Tensor, sequence: list[int]) -> torch.Tensor:
        """``scores`` (float32 [V]) + the biases of the words the sequence completes, summed in
        transformers' order (one-token words, then the longer ones by prefix length)."""
        bias = torch.zeros_like(scores)
        for word, value in self.sequence_bias:
            if len(word) == 1:
                bias[word[0]] = value
        for word, value in self.sequence_bias:
            if len(word) > 1 and _completes(sequence, word):
                bias[word[-1]] += value
        return scores + bias

    def target(self, logits_row: torch.Tensor, sequence: list[int], prompt_len: int, sampler, position: int) -> int:
        """The token emitted after ``sequence`` from its processed ``logits_row`` (float [V]):
        ``sampler`` (refdec.engine.sampling.TargetSampler) samples it at ``position``, or argmax."""
        scores = self(logits_row, sequence, prompt_len)
        return sampler.sample(scores, position) if sampler.do_sample else int(scores.argmax())


def _completes(sequence: list[int], word: tuple[int, ...]) -> bool:
    """Whether ``sequence`` ends with ``word`` without its last token (always, for a one-token
    word; never where the prefix does not fit), as transformers matches bad words and biases."""
    prefix_len = len(word) - 1
    return prefix_len == 0 or (prefix_len <= len(sequence) and tuple(sequence[-prefix_len:]) == word[:-1])


def _ban(scores: torch.Tensor, banned: set[int]) -> None:
    """Set the logits of the ``banned`` token ids (those inside the vocabulary) to -inf, in place."""
    banned = [t for t in banned if t < scores.shape[0]]
    if banned:
        scores[torch.tensor(sorted(banned), dtype=torch.long, device=scores.device)] = -float("inf")


def _is_token_id(value) -> bool:
    """An int (not a bool) >= 0."""
    return is_int(value) and value >= 0


def _id_set(ids, name: str) -> set[int]:
    if ids is None:
        return set()
    if not isinstance(ids, (list, tuple, set)) or not all(_is_token_id(t) for t in ids):
        raise ValueError(f"{name} must be a list of token ids >= 0 or None, got {ids!r}")
    return {int(t) for t in ids}


def _sequence_bias(sequence_bias) -> list[tuple[tuple[int, ...], float]]:
    """``sequence_bias`` as (word, bias) pairs, longer words grouped by prefix length in order of
    first appearance, as transformers' SequenceBiasLogitsProcessor sums them."""
    if sequence_bias is None:
        return []
    pairs = list(sequence_bias.items()) if isinstance(sequence_bias, dict) else sequence_bias
    if not isinstance(pairs, (list, tuple)):
        raise ValueError(f"sequence_bias must be a dict {{tuple of token ids: float}} or a list of "
                         f"[token ids, float] pairs, got {sequence_bias!r}")
    checked = []
    for pair in pairs:
        ok = isinstance(pair, (list, tuple)) and len(pair) == 2
        word, value = pair if ok else (None, None)
        ok = ok and isinstance(word, (list, tuple)) and len(word) > 0 and all(_is_token_id(t) for t in word)
        ok = ok and isinstance(value, (int, float, np.floating)) and not isinstance(value, bool) and np.isfinite(value)
        if not ok:
            raise ValueError(f"sequence_bias entries must pair a non-empty list of token ids >= 0 with a finite "
                             f"float bias, got {pair!r}")
        checked.append((tuple(int(t) for t in word), float(np.float32(value))))  # transformers' float32 biases
    if len({word for word, _ in checked}) != len(checked):
        raise ValueError(f"sequence_bias names a token sequence twice: {sequence_bias!r}")
    single = [pair for pair in checked if len(pair[0]) == 1]
    by_prefix_len: dict[int, list] = {}
    for word, value in checked:
        if len(word) > 1:
            by_prefix_len.setdefault(len(word) - 1, []).append((word, value))
    return single + [pair for group in by_prefix_len.values() for pair in group]


def banned_ngram_tokens(sequence: list[int], n: int) -> set[int]:
    """Tokens that would complete an n-gram already in ``sequence`` (none while it is shorter than n - 1)."""
    if len(sequence) + 1 < n:
        return set()
    prefix = tuple(sequence[len(sequence) - n + 1:]) if n > 1 else ()
    banned = set()
    for start in range(len(sequence) - n + 1):
        if tuple(sequence[start:start + n - 1]) == prefix:
            banned.add(sequence[start + n - 1])
    return banned


def path_tokens(tree: DraftTree, row: int) -> list[int]:
    """The draft tokens on the path to tree row ``row`` (row 0 = the root, row i = node i - 1),
    root first: what the sequence holds after the context when that row is scored."""
    tokens = []
    node = row - 1
    while node >= 0:
        tokens.append(int(tree.token_ids[node]))
        node = int(tree.parents[node])
    return tokens[::-1]
