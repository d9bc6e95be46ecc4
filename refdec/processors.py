"""Logits processors that depend on the tokens before a position, applied per tree path.

``model.generate`` applies the processors a model's ``generation_config`` sets to every
step's logits. Two of them depend on the sequence so far: ``repetition_penalty`` (every
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

from refdec.tree import DraftTree

__all__ = ["PathLogitsProcessor", "path_tokens"]


class PathLogitsProcessor:
    """``repetition_penalty`` (float > 0, None = off) and ``no_repeat_ngram_size`` (int >= 1,
    None or 0 = off), in transformers' order and arithmetic."""

    def __init__(self, repetition_penalty: float | None = None, no_repeat_ngram_size: int | None = None) -> None:
        if repetition_penalty is not None and not (isinstance(repetition_penalty, (int, float))
                                                   and not isinstance(repetition_penalty, bool)
                                                   and np.isfinite(repetition_penalty) and repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be a finite number > 0 or None, got {repetition_penalty!r}")
        if no_repeat_ngram_size is not None and (isinstance(no_repeat_ngram_size, bool)
                                                 or not isinstance(no_repeat_ngram_size, (int, np.integer))
                                                 or no_repeat_ngram_size < 0):
            raise ValueError(f"no_repeat_ngram_size must be an int >= 0 or None, got {no_repeat_ngram_size!r}")
        self.repetition_penalty = None if repetition_penalty in (None, 1.0) else float(repetition_penalty)
        self.no_repeat_ngram_size = int(no_repeat_ngram_size) if no_repeat_ngram_size else None

    @property
    def active(self) -> bool:
        return self.repetition_penalty is not None or self.no_repeat_ngram_size is not None

    def __call__(self, logits_row: torch.Tensor, sequence: list[int]) -> torch.Tensor:
        """A processed float32 copy of ``logits_row`` (float [V], any float dtype) for the position
        after ``sequence`` (the token ids before it, prompt included). float32 as transformers'
        generate, which casts each step's logits to float32 before its processors: a penalty
        divided in bfloat16 rounds and can tie or flip the top token."""
        scores = logits_row.to(dtype=torch.float32, copy=True)
        if self.repetition_penalty is not None and sequence:
            ids = torch.tensor(sorted(set(sequence)), dtype=torch.long, device=scores.device)
            picked = scores[ids]
            scores[ids] = torch.where(picked < 0, picked * self.repetition_penalty, picked / self.repetition_penalty)
        if self.no_repeat_ngram_size is not None:
            banned = banned_ngram_tokens(sequence, self.no_repeat_ngram_size)
            if banned:
                scores[torch.tensor(sorted(banned), dtype=torch.long, device=scores.device)] = -float("inf")
        return scores


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
