"""Target tokens for verification: greedy argmax, or position-keyed Gumbel-max sampling.

Sampling is made lossless *by equality*: the token at absolute output position
``p`` is ``argmax(process(logits) + G(seed, p))`` where ``G(seed, p)[v]`` is
Gumbel noise that depends only on ``(seed, p, v)``, computed with a
counter-based hash (splitmix64 finaliser on int64 tensors). Gumbel-max draws
exactly from ``softmax(process(logits))``, and since the noise does not depend
on how the step was batched or speculated, speculative decoding returns exactly
the tokens of non-speculative decoding with the same seed.

``process`` follows transformers' logits warpers, in generate's order:
temperature, then top-k (ties at the threshold kept), then sort-based top-p
(keeping at least one token).
"""

from __future__ import annotations

import random

import torch

_MASK64 = (1 << 64) - 1


def _s64(x: int) -> int:
    """An unsigned 64-bit constant as the signed int64 torch stores."""
    x &= _MASK64
    return x - (1 << 64) if x >= (1 << 63) else x


_GOLDEN = _s64(0x9E3779B97F4A7C15)
_MIX1 = _s64(0xBF58476D1CE4E5B9)
_MIX2 = _s64(0x94D049BB133111EB)


def _srl(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _splitmix64(z: torch.Tensor) -> torch.Tensor:
    z = z + _GOLDEN
    z = (z ^ _srl(z, 30)) * _MIX1
    z = (z ^ _srl(z, 27)) * _MIX2
    return z ^ _srl(z, 31)


def _splitmix64_int(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def random_seed() -> int:
    """A fresh seed for ``seed=None`` (recorded in the stats so a run can be replayed)."""
    return random.SystemRandom().randrange(0, 1 << 63)


def gumbel_row(seed: int, position: int, vocab_size: int, device="cpu") -> torch.Tensor:
    """float64 [vocab_size]: Gumbel(0, 1) noise for absolute position ``position``.

    A pure function of ``(seed, position, vocab index)``.
    """
    key = _splitmix64_int((_splitmix64_int(seed & _MASK64) ^ (position & _MASK64)) & _MASK64)
    counters = torch.arange(vocab_size, dtype=torch.int64, device=device) * _GOLDEN + _s64(key)
    bits = _srl(_splitmix64(counters), 11)  # 53 uniform bits
    u = (bits.to(torch.float64) + 0.5) * (1.0 / (1 << 53))  # in (0, 1)
    return -torch.log(-torch.log(u))


class GumbelNoise:
    """Per-position noise rows, computed once per position and reused across steps.

    Rows below the lowest position still needed are dropped (``forget_below``), so
    memory stays bounded by the speculation depth.
    """

    def __init__(self, seed: int, vocab_size: int, device="cpu") -> None:
        self.seed = int(seed)
        self.vocab_size = int(vocab_size)
        self.device = device
        self._rows: dict[int, torch.Tensor] = {}

    def rows(self, positions: list[int]) -> torch.Tensor:
        """float64 [len(positions), vocab_size]."""
        out = []
        for p in positions:
            row = self._rows.get(p)
            if row is None:
                row = gumbel_row(self.seed, p, self.vocab_size, self.device)
                self._rows[p] = row
            out.append(row)
        return torch.stack(out)

    def forget_below(self, position: int) -> None:
        for p in [p for p in self._rows if p < position]:
            del self._rows[p]


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> torch.Tensor:
    """Temperature → top-k → top-p on ``logits`` [rows, vocab] (float), as transformers' warpers."""
    scores = logits
    if temperature != 1.0:
        scores = scores / temperature
    if top_k is not None and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_scores, sorted_idx = torch.sort(scores, descending=False, dim=-1)
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - top_p)
        remove_sorted[..., -1:] = False
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores


class TargetSampler:
    """Chooses the target token at each verified position.

    ``greedy`` when ``noise`` is None, else Gumbel-max over processed logits.
    """

    def __init__(self, vocab_size: int, *, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 device="cpu") -> None:
        self.do_sample = do_sample
        self.temperature = float(temperature)
        self.top_k = top_k
        self.top_p = top_p
        self.vocab_size = vocab_size
        self.noise = GumbelNoise(seed, vocab_size, device) if do_sample else None

    def targets(self, logits: torch.Tensor, depth, first_position: int) -> torch.Tensor:
        """int64 [rows]: target token for each row of ``logits`` [rows, vocab].

        Row ``r`` predicts the token at absolute position ``first_position + depth[r]``.
        """
        if self.noise is None:
            return logits.argmax(dim=-1)
        scores = process_logits(logits.to(torch.float64), self.temperature, self.top_k, self.top_p)
        depth_list = [int(d) for d in depth]
        uniq = sorted(set(depth_list))
        rows = self.noise.rows([first_position + d for d in uniq])
        if len(uniq) == len(depth_list) and uniq == depth_list:
            noise = rows
        else:
            where = {d: i for i, d in enumerate(uniq)}
            noise = rows[torch.tensor([where[d] for d in depth_list])]
        return (scores + noise).argmax(dim=-1)

    def forget_below(self, position: int) -> None:
        if self.noise is not None:
            self.noise.forget_below(position)

