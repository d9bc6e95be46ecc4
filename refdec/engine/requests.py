"""One request of a decoding batch: its sequence, stop state, drafter and budget."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from refdec.drafting.proposer import Drafter
from refdec.engine.processors import PathLogitsProcessor
from refdec.engine.results import DecodingStats
from refdec.engine.sampling import TargetSampler
from refdec.engine.stops import StopChecker
from refdec.sizing.budget import Budget

__all__ = ["Request"]


class Request:
    """A prompt being decoded (``batch_row``: its index in the caller's batch).

    ``seq``: the prompt's token ids followed by the tokens emitted so far; decoding ends at
    ``max_total`` tokens (the prompt's plus ``max_new_tokens``, capped by the model's
    positions), at an eos or a stop string (``stopper``). ``sampler`` picks its tokens (greedy or
    sampled) after ``processor`` (its logits settings, may be inactive). ``drafter`` / ``budget`` are None
    when nothing is drafted (``max_draft_tokens=0``). ``on_tokens(batch_row, tokens)``
    receives each run of kept tokens (streaming), ``on_done(batch_row, new_tokens, stats)``
    the row's result once it is finished."""

    def __init__(self, batch_row: int, prompt: np.ndarray, max_new_tokens: int, max_positions: int | None, *,
                 stats: DecodingStats, sampler: TargetSampler, stopper: StopChecker, drafter: Drafter | None,
                 budget: Budget | None, started: float,
                 on_tokens: Callable[[int, list[int]], None] | None = None,
                 on_done: Callable[[int, list[int], DecodingStats], None] | None = None,
                 processor: PathLogitsProcessor | None = None) -> None:
        self.batch_row = batch_row
        self.prompt = prompt  # int64 [prompt_len]
        self.prompt_len = int(prompt.shape[0])
        self.seq: list[int] = prompt.tolist()
        self.max_new_tokens = max_new_tokens
        self.max_total = self.prompt_len + max_new_tokens
        if max_positions is not None:
            self.max_total = min(self.max_total, max_positions + 1)  # the last token is emitted, never fed
        self.stats = stats
        self.sampler = sampler
        self.processor = processor if processor is not None else PathLogitsProcessor()
        self.stopper = stopper
        self.drafter = drafter
        self.budget = budget
        self.started = started  # perf_counter at the call's start: the row's wall time runs from it
        self.on_tokens = on_tokens
        self.on_done = on_done
        self.done = False
        # set from any thread to ask for the request to stop (a server's client went away): the loop
        # finishes it between two steps; a backend may stop the prefill forward it is in (PrefillCancelled)
        self.cancel_requested = False

    @property
    def root_pos(self) -> int:
        """Position of the last token, the root of the next tree (== the row's cache length)."""
        return len(self.seq) - 1

    @property
    def room(self) -> int:
        """Tokens that may still be emitted."""
        return self.max_total - len(self.seq)

    def emit(self, tokens: list[int]) -> None:
        """Appends an accepted run, honouring the length limit and stops; finishes the request
        when one is reached, else tells the drafter what was emitted."""
        seq = self.seq
        tokens = tokens[: self.room]
        seq.extend(tokens)
        keep, reason = self.stopper.cut(seq, len(tokens))
        if keep < len(tokens):
            del seq[len(seq) - len(tokens) + keep:]
        kept = tokens[:keep]
        if self.on_tokens is not None and kept:
            self.on_tokens(self.batch_row, kept)
        if not reason and len(seq) >= self.max_total:
            reason = "max_new_tokens" if len(seq) >= self.prompt_len + self.max_new_tokens else "max_position_embeddings"
        if reason:
            self.finish(reason)
        elif self.drafter is not None:
            self.drafter.accept(np.asarray(kept, dtype=np.int32))

    def finish(self, reason: str) -> None:
        stats = self.stats
        stats.stop_reason = reason
        stats.wall_seconds = time.perf_counter() - self.started  # from the call's start to the row's end
        stats.new_tokens = len(self.seq) - self.prompt_len
        self.done = True
        if self.on_done is not None:
            self.on_done(self.batch_row, self.seq[self.prompt_len:], stats)
