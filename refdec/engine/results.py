"""What a ``generate`` call returns: the sequences and the decoding statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from refdec.drafting.tree import DraftTree

__all__ = ["DecodingStats", "GenerateOutput"]


@dataclass
class DecodingStats:
    """What one ``generate`` call did.

    ``forward_passes`` counts the prefill pass (it yields the first token).
    ``accepted_per_pass[k]`` = number of verification passes that accepted ``k``
    draft tokens (the bonus token not counted); index 0 also counts passes without a
    draft and the prefill.
    Times are seconds (time.perf_counter): ``prefill`` (the prompt's forwards, one per chunk),
    ``propose`` (budget + proposer), ``prepare`` (tree → tensors), ``forward``
    (model forward, including the LM head of the rows the walk visits and the
    greedy argmax), ``accept`` (the acceptance walk, which for sampling includes
    drawing the token of each row on the path; KV compaction, proposer update,
    stops, streaming). ``wall_seconds`` runs from the end of validation to the end of
    the call; ``calibration_seconds`` (``max_draft_tokens="auto"``: measuring the
    model's cost curve the first time, reading it afterwards) comes before and is not
    part of it.
    """

    new_tokens: int = 0
    forward_passes: int = 0
    accepted_per_pass: list[int] = field(default_factory=list)
    proposed_tokens: int = 0
    accepted_tokens: int = 0
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    proposed_by_source: dict[str, int] = field(default_factory=dict)  # verified draft tokens per draft source
    prefill_seconds: float = 0.0
    propose_seconds: float = 0.0
    prepare_seconds: float = 0.0
    forward_seconds: float = 0.0
    accept_seconds: float = 0.0
    wall_seconds: float = 0.0
    stop_reason: str = ""
    seed: int | None = None
    retrieved_documents: list[int] = field(default_factory=list)  # retrieve=k: doc_idx in the index, best first
    retrieve_seconds: float = 0.0
    rows: list = field(default_factory=list)  # batched calls: one DecodingStats per batch row
    head_rows: int = 0  # tree rows the LM head ran on (lazy head: about the accepted path; else every row)
    calibration_seconds: float = 0.0  # "auto": finding the model's cost curve (measured once, then read); not in wall
    cached_prompt_tokens: int = 0  # prompt tokens whose KV entries an earlier request left (not prefilled)

    @property
    def tokens_per_pass(self) -> float:
        return self.new_tokens / self.forward_passes if self.forward_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def bookkeeping_seconds(self) -> float:
        """Per-step time spent outside the model forward."""
        return self.propose_seconds + self.prepare_seconds + self.accept_seconds

    def summary(self) -> str:
        return (f"{self.new_tokens} tokens, {self.forward_passes} passes, "
                f"{self.tokens_per_pass:.2f} tokens/pass, {self.tokens_per_second:.1f} tokens/s")

    def count_pass(self, accepted: int) -> None:
        self.forward_passes += 1
        while len(self.accepted_per_pass) <= accepted:
            self.accepted_per_pass.append(0)
        self.accepted_per_pass[accepted] += 1

    def count_draft(self, tree: DraftTree, accepted_nodes: np.ndarray) -> None:
        """Proposed and accepted draft tokens of one verified ``tree``, both per source too
        (``accepted_nodes``: int64 [k], the accepted node indices)."""
        self.proposed_tokens += len(tree)
        self.accepted_tokens += int(accepted_nodes.shape[0])
        _count_sources(self.proposed_by_source, tree, tree.source_ids)
        _count_sources(self.accepted_by_source, tree, tree.source_ids[accepted_nodes])


def _count_sources(counts: dict[str, int], tree: DraftTree, source_ids: np.ndarray) -> None:
    """Adds to ``counts`` (source name -> tokens) the nodes of ``tree`` whose sources are ``source_ids``
    (int32 [k], indices into ``tree.source_names``)."""
    if source_ids.shape[0]:
        for src, count in zip(*np.unique(source_ids, return_counts=True)):
            name = tree.source_names[src] if src < len(tree.source_names) else str(int(src))
            counts[name] = counts.get(name, 0) + int(count)


@dataclass
class GenerateOutput:
    sequences: torch.LongTensor  # [1, prompt_len + new]; batched: [B, max_len] (refdec.engine.decoder)
    stats: DecodingStats
