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
(keeping at least one token), then min-p (tokens less probable than ``min_p`` times
the most probable one are dropped).
"""

from __future__ import annotations

import math
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


def _position_key(seed: int, position: int) -> int:
    return _s64(_splitmix64_int((seed_key(seed) & _MASK64) ^ (position & _MASK64)))


def _gumbel(counters: torch.Tensor) -> torch.Tensor:
    """float64 like ``counters`` (int64): Gumbel(0, 1) noise, a pure function of each counter."""
    bits = _srl(_splitmix64(counters), 11)  # 53 uniform bits
    u = (bits.to(torch.float64) + 0.5) * (1.0 / (1 << 53))  # in (0, 1)
    return -torch.log(-torch.log(u))


def gumbel_at(seed: int, position: int, indices: torch.Tensor) -> torch.Tensor:
    """float64 [len(indices)]: Gumbel(0, 1) noise of vocabulary ``indices`` at absolute ``position``.

    A pure function of ``(seed, position, vocab index)``: ``gumbel_at(s, p, idx)[j]`` equals
    ``gumbel_row(s, p, V)[idx[j]]``.
    """
    return _gumbel(indices.to(torch.int64) * _GOLDEN + _position_key(seed, position))


def seed_key(seed: int) -> int:
    """The int64 a row's positions are keyed with (:func:`position_keys`)."""
    return _s64(_splitmix64_int(seed & _MASK64))


def position_keys(seed_keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """int64 like ``positions``: the noise key of each (row's seed, absolute position), as
    :func:`gumbel_at` keys one. ``seed_keys`` int64 (:func:`seed_key` of each row's seed) and
    ``positions`` int64 (>= 0) broadcast together."""
    return _splitmix64(seed_keys ^ positions)


def gumbel_keyed(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """float64 [R, vocab_size]: row ``r`` is ``gumbel_row(seed, position, vocab_size)`` for the
    (seed, position) whose key (:func:`position_keys`) is ``keys[r]`` (``keys`` int64 [R])."""
    return _gumbel(torch.arange(vocab_size, dtype=torch.int64, device=keys.device) * _GOLDEN + keys[:, None])


def gumbel_row(seed: int, position: int, vocab_size: int, device="cpu") -> torch.Tensor:
    """float64 [vocab_size]: Gumbel(0, 1) noise for every token at absolute ``position``."""
    return gumbel_at(seed, position, torch.arange(vocab_size, dtype=torch.int64, device=device))


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None, min_p: float | None = None) -> torch.Tensor:
    """Temperature → top-k → top-p → min-p on ``logits`` [rows, vocab] (float), as transformers' warpers."""
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
    if min_p is not None and min_p > 0.0:
        scores = scores.masked_fill(scores < _min_p_threshold(scores.max(dim=-1, keepdim=True).values, min_p),
                                    float("-inf"))
    return scores


def _min_p_threshold(top_score: torch.Tensor, min_p: float) -> torch.Tensor:
    """The lowest score min-p keeps: p_i >= min_p * p_max  <=>  s_i >= s_max + log(min_p)
    (the softmax's normaliser cancels; the top token always stays)."""
    return top_score + math.log(min_p)


# Candidates examined by the fast top-p path before falling back to a full sort.
_TOP_P_CANDIDATES = 1024


def kept_tokens(scores: torch.Tensor, top_k: int | None, top_p: float | None,
                min_p: float | None = None) -> torch.Tensor | None:
    """int64 indices of the tokens top-k / top-p / min-p keep in one row ``scores`` [V] (float,
    temperature applied), or None when every token is kept. Same sets as ``process_logits`` (up to
    exact ties and rounding at the top-p boundary), without sorting the whole vocabulary when the
    kept set is small.
    """
    idx = _top_k_top_p_kept(scores, top_k, top_p)
    if min_p is None or min_p <= 0.0:
        return idx
    threshold = _min_p_threshold(scores.max(), min_p)  # top-k / top-p always keep the top token
    if idx is None:
        return torch.nonzero(scores >= threshold).flatten()
    return idx[scores[idx] >= threshold]


def _top_k_top_p_kept(scores: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor | None:
    vocab = scores.shape[-1]
    idx = None
    if top_k is not None and top_k < vocab:
        kth = torch.topk(scores, top_k).values[-1]
        idx = torch.nonzero(scores >= kth).flatten()  # ties at the threshold are kept, as transformers does
    if top_p is None or top_p >= 1.0:
        return idx
    if idx is not None:
        cand_scores = scores[idx]
        lse = torch.logsumexp(cand_scores, dim=0)
        order = torch.argsort(cand_scores, descending=True)
        cand_idx, cand_scores = idx[order], cand_scores[order]
    else:
        lse = torch.logsumexp(scores, dim=0)
        k = min(_TOP_P_CANDIDATES, vocab)
        cand_scores, cand_idx = torch.topk(scores, k)
    probs = torch.exp(cand_scores - lse)
    mass_above = torch.cumsum(probs, dim=0) - probs  # mass of the tokens ranked above each one
    keep = mass_above < top_p
    keep[0] = True
    if idx is None and bool(keep[-1]) and cand_idx.shape[0] < vocab:
        # the kept set may reach past the candidates: do it exactly on the whole row
        filtered = process_logits(scores.unsqueeze(0), 1.0, None, top_p)[0]
        return torch.nonzero(torch.isfinite(filtered)).flatten()
    return cand_idx[keep]


class TargetSampler:
    """Chooses the target token the model emits after a verified row.

    Sampling (``sample``; greedy is an argmax, refdec.decode.verify): one row at a time (the
    acceptance walk asks only for the rows on its path, so each emitted token costs one row), Gumbel-max with noise keyed by
    ``(seed, position, token)`` restricted to the tokens top-k / top-p / min-p keep.
    """

    def __init__(self, vocab_size: int, *, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 device="cpu", min_p: float | None = None) -> None:
        self.do_sample = bool(do_sample)
        self.temperature = float(temperature)
        self.top_k = top_k
        self.top_p = top_p
        self.min_p = min_p
        self.seed = seed
        self.vocab_size = int(vocab_size)
        self.device = device
        self._all_tokens = None

    @property
    def samples_rows(self) -> bool:
        """True when :meth:`sample_rows` gives :meth:`sample`'s tokens: sampling without top-p
        (whose kept set :func:`kept_tokens` finds row by row)."""
        return self.do_sample and (self.top_p is None or self.top_p >= 1.0)

    @property
    def settings(self) -> tuple:
        """What :meth:`sample_rows` reads besides the seed: rows whose samplers agree on it are
        sampled together."""
        return self.temperature, self.top_k, self.min_p

    def sample_rows(self, logits: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """int64 [R]: :meth:`sample` of each row of ``logits`` float [R, V] on their device, without a
        host sync (:attr:`samples_rows` only). ``keys`` int64 [R]: each row's (seed, position)
        key (:func:`position_keys`; the seeds may differ, the settings are this sampler's).
        The same arithmetic element by element: the top-k threshold and min-p's bound per row,
        the kept tokens' noisy scores, the first maximum (the kept tokens in vocabulary order)."""
        scores = logits.to(torch.float64)
        if self.temperature != 1.0:
            scores = scores / self.temperature
        noisy = scores + gumbel_keyed(keys, scores.shape[-1])
        keep = None
        if self.top_k is not None and self.top_k < scores.shape[-1]:
            keep = scores >= torch.topk(scores, self.top_k, dim=-1).values[:, -1:]
        if self.min_p is not None and self.min_p > 0.0:
            above = scores >= _min_p_threshold(scores.max(dim=-1, keepdim=True).values, self.min_p)
            keep = above if keep is None else keep & above
        if keep is not None:
            noisy = noisy.masked_fill(~keep, float("-inf"))
        return noisy.argmax(dim=-1)

    def sample(self, logits_row: torch.Tensor, position: int) -> int:
        """The sampled token at absolute ``position`` given that position's logits [vocab]."""
        scores = logits_row.to(torch.float64)
        if self.temperature != 1.0:
            scores = scores / self.temperature
        kept = kept_tokens(scores, self.top_k, self.top_p, self.min_p)
        if kept is None:
            if self._all_tokens is None or self._all_tokens.shape[0] != scores.shape[0]:
                self._all_tokens = torch.arange(scores.shape[0], dtype=torch.int64, device=scores.device)
            return int((scores + gumbel_at(self.seed, position, self._all_tokens)).argmax())
        noise = gumbel_at(self.seed, position, kept)
        return int(kept[(scores[kept] + noise).argmax()])
