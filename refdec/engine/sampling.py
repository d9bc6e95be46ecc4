"""Target tokens for verification: greedy argmax, or position-keyed Gumbel-max sampling.

Sampling is made lossless *by equality*: the token at absolute output position
``p`` is ``argmax(process(logits) + G(seed, p))`` where ``G(seed, p)[v]`` is
Gumbel noise that depends only on ``(seed, p, v)``, computed with a
counter-based hash (splitmix64 finaliser on int64 tensors). Gumbel-max draws
exactly from ``softmax(process(logits))``, and since the noise does not depend
on how the step was batched or speculated, speculative decoding returns exactly
the tokens of non-speculative decoding with the same seed.

``process`` follows transformers' logits warpers, in generate's order:
temperature, then top-k (ties at the threshold kept), then top-p (the most probable
tokens while the mass ranked above one is < ``top_p``, at least one), then min-p
(tokens less probable than ``min_p`` times the most probable one are dropped).
:func:`process_logits` applies them as transformers writes them; the sampler keeps the
same tokens (:func:`kept_mask`, tokens tied at the top-p cut ranked by id) with
arithmetic whose result for a row depends on that row alone, so that a row drawn on
the host (:meth:`TargetSampler.sample`, one row) and a batch drawn on the device
(:meth:`TargetSampler.sample_rows`, every tree row, no host sync) give the same tokens.
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


# Ranks the top-p cut examines before it ranks the whole row, and the block size it sums the
# whole row's ranks in.
_TOP_P_CANDIDATES = 1024


def kept_tokens(scores: torch.Tensor, top_k: int | None, top_p: float | None,
                min_p: float | None = None) -> torch.Tensor | None:
    """int64 indices, in vocabulary order, of the tokens top-k / top-p / min-p keep in one row
    ``scores`` float64 [V] (temperature applied), or None when every token is kept: the row of
    :func:`kept_mask` (with ``read_rows``: the host's path). The sets of ``process_logits`` (up
    to rounding at the top-p boundary and which of the tokens tied there it keeps)."""
    mask = kept_mask(scores.unsqueeze(0), top_k, top_p, min_p, read_rows=True)
    return None if mask is None else torch.nonzero(mask[0]).flatten()


def kept_mask(scores: torch.Tensor, top_k: int | None, top_p: float | None, min_p: float | None = None,
              *, read_rows: bool = False) -> torch.Tensor | None:
    """bool [R, V]: the tokens top-k, then top-p, then min-p keep in each row of ``scores``
    float64 [R, V] (temperature applied); None when they keep every token.

    * top-k: the tokens scoring at least the k-th highest score (ties at the threshold kept);
    * top-p: rank the tokens top-k keeps by score, ties by token id (lowest first), their
      probabilities renormalised over them; keep the ranks up to the last whose probability mass
      ranked above it is < ``top_p`` (so at least the top token);
    * min-p: of those, the tokens scoring at least ``max + log(min_p)``.

    A row's result depends on that row alone, on any device and for any number of rows: the
    top-p arithmetic is elementwise with sums in a fixed order (:func:`_pairwise_sum`,
    :func:`_mass_above`) where torch's reductions and scans change their order with the shape
    and the device. Without top-k, top-p ranks the first ``_TOP_P_CANDIDATES`` tokens, and the
    whole row (a sort) for the rows where the mass above the last of them is < ``top_p``: the
    whole row of every row, selected with ``torch.where`` (no host sync), or, with ``read_rows``,
    only if a row needs it (reads of the device, which also skip the ranks of tied tokens when
    none is cut off). The result is the same.
    """
    vocab = scores.shape[-1]
    top_k = top_k if top_k is not None and top_k < vocab else None
    keep = None
    if top_p is not None and top_p < 1.0:
        keep = _top_p_mask(scores, top_k, top_p, read_rows)
    elif top_k is not None:
        keep = scores >= torch.topk(scores, top_k, dim=-1).values[:, -1:]
    if min_p is not None and min_p > 0.0:
        above = scores >= _min_p_threshold(scores.max(dim=-1, keepdim=True).values, min_p)
        keep = above if keep is None else keep & above
    return keep


def _top_p_mask(scores: torch.Tensor, top_k: int | None, top_p: float, read_rows: bool) -> torch.Tensor:
    """bool [R, V]: top-k (``top_k < V`` or None) then top-p, as :func:`kept_mask` defines them."""
    vocab = scores.shape[-1]
    ranks = top_k if top_k is not None else min(_TOP_P_CANDIDATES, vocab)
    whole = top_k is None and ranks < vocab and not read_rows  # every row ranked: no data-dependent branch
    ranked = (torch.sort(scores, dim=-1, descending=True).values if whole
              else torch.topk(scores, ranks, dim=-1).values)  # descending; the values do not depend on ties' order
    top = ranked[:, :1]
    if top_k is None:
        total = _pairwise_sum(torch.exp(scores - top))
    else:  # top-k's tokens: the k highest, then those tied with the k-th past them
        tied = (scores >= ranked[:, -1:]).sum(dim=-1, keepdim=True) - top_k  # [R, 1]
        total = _pairwise_sum(torch.exp(ranked - top)) + tied[:, 0] * torch.exp(ranked[:, -1] - top[:, 0])
    lse = top + torch.log(total)[:, None]  # [R, 1]
    probs = torch.exp(ranked[:, :ranks] - lse)
    mass_above = _mass_above(probs)
    last = _last_under(mass_above, top_p)  # [R, 1]: the last kept rank
    if top_k is not None:
        last = last + _tied_ranks_kept(probs, mass_above, top_p, torch.where(last == top_k - 1, tied, 0))
    elif ranks < vocab:
        past = last == ranks - 1  # the cut may lie past the candidates: rank the whole row
        if whole or bool(past.any()):
            if not whole:
                ranked = torch.sort(scores, dim=-1, descending=True).values
            last = torch.where(past, _whole_row_cut(ranked, lse, top_p), last)
    cut = ranked.gather(1, last.clamp(max=ranked.shape[-1] - 1))  # [R, 1]: the score of the last kept rank
    at_least = scores >= cut
    if read_rows and bool((at_least.sum(dim=-1, keepdim=True) == last + 1).all()):
        return at_least  # the last kept rank is the last at the cut's score: the mask below
    above_cut, at_cut = scores > cut, scores == cut
    ties_kept = last + 1 - above_cut.sum(dim=-1, keepdim=True)  # ranks kept at the cut's score: >= 1
    return above_cut | (at_cut & (at_cut.cumsum(dim=-1) <= ties_kept))  # the lowest ids among the ties


def _tied_ranks_kept(probs: torch.Tensor, mass_above: torch.Tensor, top_p: float, tied: torch.Tensor) -> torch.Tensor:
    """int64 [R, 1]: how many of the ``tied`` int64 [R, 1] ranks past top-k's k-th (tokens tied
    with it beyond the k; 0 where top-p does not keep the k-th) top-p keeps. ``probs`` and
    ``mass_above`` float64 [R, k]: the probabilities of the k highest scores and the mass above
    each. The mass above the i-th such rank is ``first + i * prob`` (the mass above the first of
    them, their probability), < ``top_p`` for the ``ceil((top_p - first) / prob)`` first of them."""
    first, prob = mass_above[:, -1:] + probs[:, -1:], probs[:, -1:]
    room = top_p - first
    count = torch.where(room > 0, torch.ceil(room / prob), 0.0)  # inf where prob underflowed to 0
    return torch.minimum(count, tied.to(count.dtype)).to(torch.int64)


def _whole_row_cut(ranked: torch.Tensor, lse: torch.Tensor, top_p: float) -> torch.Tensor:
    """int64 [R, 1]: the last rank of the whole row whose probability mass ranked above it is
    < ``top_p`` (``ranked`` float64 [R, V], each row's scores in descending order; ``lse`` float64
    [R, 1], the row's logsumexp). The mass above a rank is the sum of the blocks of
    ``_TOP_P_CANDIDATES`` ranks before its block (:func:`_pairwise_sum` of each, summed by
    :func:`_mass_above`) plus the ranks before it in its block; the first block's are the
    candidates' masses, bit for bit."""
    rows, vocab = ranked.shape
    block = _TOP_P_CANDIDATES
    padded = torch.nn.functional.pad(ranked, (0, -vocab % block), value=float("-inf"))
    probs = torch.exp(padded - lse).view(rows, -1, block)  # [R, blocks, block]
    offsets = _mass_above(_pairwise_sum(probs))  # [R, blocks]: the mass above each block
    last_block = _last_under(offsets, top_p)  # [R, 1]: the mass above its first rank is < top_p
    inner = probs.gather(1, last_block[:, :, None].expand(rows, 1, block))[:, 0]  # [R, block]
    last = _last_under(offsets.gather(1, last_block) + _mass_above(inner), top_p)
    return (last_block * block + last).clamp(max=vocab - 1)  # past the row's end: the padding


def _pairwise_sum(x: torch.Tensor) -> torch.Tensor:
    """float64 [...]: the sum over the last dimension of ``x`` float64 [..., n], in a fixed order
    (zero-padded to a power of two, its first half added to its second until one entry is left):
    elementwise adds only, so a row's sum is the same in any batch and on any device."""
    n = x.shape[-1]
    x = torch.nn.functional.pad(x, (0, (1 << (n - 1).bit_length()) - n))
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def _mass_above(probs: torch.Tensor) -> torch.Tensor:
    """float64 like ``probs`` [R, n]: entry j the sum of ``probs[:, :j]`` (0 for j = 0), by a
    Hillis-Steele scan (elementwise adds in a fixed order: the same in any batch and on any
    device, and entry j the same for any n > j)."""
    x = torch.nn.functional.pad(probs[:, :-1], (1, 0))
    shift = 1
    while shift < x.shape[-1]:
        x = torch.cat([x[:, :shift], x[:, shift:] + x[:, :-shift]], dim=1)
        shift *= 2
    return x


def _last_under(mass_above: torch.Tensor, top_p: float) -> torch.Tensor:
    """int64 [R, 1]: the last entry of each row of ``mass_above`` float64 [R, n] that is < ``top_p``
    (entry 0 is 0: at least it)."""
    ranks = torch.arange(mass_above.shape[-1], device=mass_above.device)
    return torch.where(mass_above < top_p, ranks, 0).amax(dim=-1, keepdim=True)


class TargetSampler:
    """Chooses the target token the model emits after a verified row.

    Sampling: Gumbel-max with noise keyed by ``(seed, position, token)`` over the tokens
    :func:`kept_mask` keeps (greedy is an argmax, refdec.transformers.verify). :meth:`sample` draws one
    row (the acceptance walk on the host asks only for the rows on its path, so each emitted token
    costs one row); :meth:`sample_rows` draws many rows on their device, the same tokens.
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
        """True when :meth:`sample_rows` gives :meth:`sample`'s tokens: when sampling."""
        return self.do_sample

    @property
    def settings(self) -> tuple:
        """What :meth:`sample_rows` reads besides the seed: rows whose samplers agree on it are
        sampled together."""
        return self.temperature, self.top_k, self.top_p, self.min_p

    def sample_rows(self, logits: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """int64 [R]: :meth:`sample` of each row of ``logits`` float [R, V] on their device, without a
        host sync (:attr:`samples_rows` only). ``keys`` int64 [R]: each row's (seed, position)
        key (:func:`position_keys`; the seeds may differ, the settings are this sampler's).
        The same arithmetic element by element: the kept tokens (:func:`kept_mask`, whose rows do
        not depend on each other), their noisy scores, the first maximum (the kept tokens in
        vocabulary order)."""
        scores = logits.to(torch.float64)
        if self.temperature != 1.0:
            scores = scores / self.temperature
        noisy = scores + gumbel_keyed(keys, scores.shape[-1])
        keep = kept_mask(scores, self.top_k, self.top_p, self.min_p)
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
