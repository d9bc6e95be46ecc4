"""Specifies refdec.engine.sampling: sampling is lossless. The draw at an output position depends
only on (seed, position) (Gumbel-max with counter-based noise), so speculative sampling gives the
tokens of non-speculative sampling with the same seed, for single prompts and every batch row;
the processed logits equal transformers' warpers, the sampler keeps their tokens (those tied at
the top-p cut by lowest id), the draws follow their softmax, and a batch of rows drawn on the
device gives each row's draw on the host, top-p included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import (LogitsProcessorList, MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper,
                          TopPLogitsWarper)

import refdec
import refdec.engine.sampling as sampling
from refdec.engine.sampling import gumbel_at, gumbel_row, kept_mask, kept_tokens, process_logits
from tiny_models import batch_row, cached_model, lookup_factory, mixed_batch, repetitive_prompts, tiny_llama

NEW = 40


SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=8),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=0.5, top_k=20, top_p=0.9),
    dict(temperature=0.9, top_p=0.95, min_p=0.08),
]


def chi_square_p_value(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit; bins with small expectation are pooled."""
    expected = probs * counts.sum()
    order = np.argsort(expected)
    obs_bins, exp_bins, acc_o, acc_e = [], [], 0.0, 0.0
    for i in order:
        acc_o += counts[i]
        acc_e += expected[i]
        if acc_e >= min_expected:
            obs_bins.append(acc_o)
            exp_bins.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0 or acc_o > 0:
        obs_bins[-1] += acc_o
        exp_bins[-1] += acc_e
    obs, exp = np.array(obs_bins), np.array(exp_bins)
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1
    if df <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def setting_id(setting: dict) -> str:
    return "-".join(f"{k}{v}" for k, v in setting.items())


# fast: top-k + top-p on Llama with the lazy head; full: every family x setting x head (min-p's kept
# tokens: test_kept_tokens_...)
FAST_SAMPLING = [("llama", 3, "lazy")]


# head "lazy": the LM head on the rows the walks visit (the CPU's default); "full": every row's
# target (a GPU's path: drawn on the device, top-p included)
@pytest.mark.parametrize("name, setting, head", [
    pytest.param(name, setting, head, id=f"{name}-{setting_id(setting)}-{head}",
                 marks=() if (name, i, head) in FAST_SAMPLING else pytest.mark.full)
    for name in ("gemma3", "gpt2", "llama", "qwen2") for i, setting in enumerate(SETTINGS)
    for head in ("lazy", "full") if head == "lazy" or name in ("gemma3", "llama")])
def test_same_seed_gives_the_tokens_of_plain_sampling(tiny_model_cache, monkeypatch, name, setting, head):
    model = cached_model(tiny_model_cache, name)
    if head == "full":  # every decoder of this test (refdec.generate makes its own)
        real_init = refdec.SpeculativeDecoder.__init__

        def full_head_init(self, *args, **kwargs):
            real_init(self, *args, **kwargs)
            self.backend.lazy_head = False

        monkeypatch.setattr(refdec.SpeculativeDecoder, "__init__", full_head_init)
    accepted = rejected = 0
    for i, prompt in enumerate(repetitive_prompts(6, seed=21)):
        seed = 1000 + i
        plain = refdec.generate(model, prompt, max_new_tokens=40, do_sample=True, seed=seed, eos_token_id=[],
                                  max_draft_tokens=0, **setting)
        # a reference holding the sampled continuation with a few corrupted tokens: drafts from it are
        # accepted up to each corruption, so acceptance and rejection both happen whatever the model
        sampled = plain.sequences[0].tolist()
        reference = sampled[len(prompt) - 3:]
        for j in range(6, len(reference), 9):
            reference[j] = (reference[j] + 1) % 96
        # "cxx": refdec.drafting.proposer.Proposer; other shapes: the pure-Python stand-in
        for max_draft, shape, refs in [(4, "cxx", None), (16, "wide", None), (64, "tree", [reference]),
                                       (8, "cxx", [reference]), ("auto", "cxx", [reference])]:
            factory = None if shape == "cxx" else lookup_factory(shape)
            out = refdec.generate(model, prompt, max_new_tokens=40, do_sample=True, seed=seed, eos_token_id=[],
                                    references=refs, max_draft_tokens=max_draft, proposer_factory=factory,
                                    **setting)
            assert out.sequences.tolist() == plain.sequences.tolist(), (name, setting, max_draft, shape)
            assert out.stats.seed == seed
            accepted += out.stats.accepted_tokens
            rejected += out.stats.proposed_tokens - out.stats.accepted_tokens
    assert accepted > 20 and rejected > 20, (accepted, rejected)


@pytest.mark.parametrize("setting", [dict(temperature=1.0),
                                     pytest.param(dict(temperature=0.7, top_k=8, top_p=0.9), marks=pytest.mark.full)])
def test_sampling_rows_equal_single_row_runs_with_their_seed(llama, setting):
    model = llama
    prompts = mixed_batch()
    refs = []
    for b, p in enumerate(prompts):  # per-row references holding the row's own sampled continuation
        plain = refdec.generate(model, p, max_new_tokens=NEW, do_sample=True, seed=50 + b, eos_token_id=[],
                                  max_draft_tokens=0, **setting)
        cont = plain.sequences[0].tolist()[len(p) - 3:]
        for j in range(7, len(cont), 9):
            cont[j] = (cont[j] + 1) % 96
        refs.append([cont])
    out = refdec.generate(model, prompts, references=refs, max_new_tokens=NEW, do_sample=True, seed=50,
                          eos_token_id=[], max_draft_tokens=16, **setting)
    listed = refdec.generate(model, prompts, max_new_tokens=NEW, do_sample=True, seed=[50 + b for b in range(6)],
                             eos_token_id=[], max_draft_tokens=16, **setting)
    for b, p in enumerate(prompts):
        single = refdec.generate(model, p, max_new_tokens=NEW, do_sample=True, seed=50 + b, eos_token_id=[],
                                   max_draft_tokens=0, **setting).sequences[0].tolist()
        assert batch_row(out, b, len(p)) == single
        assert batch_row(listed, b, len(p)) == single
        assert out.stats.rows[b].seed == 50 + b
    assert sum(r.accepted_tokens for r in out.stats.rows) > 20
    assert sum(r.proposed_tokens - r.accepted_tokens for r in out.stats.rows) > 5


def test_different_seeds_give_different_samples():
    model = tiny_llama(scale=1.0)
    prompt = repetitive_prompts(1, seed=3)[0]
    outs = {tuple(refdec.generate(model, prompt, max_new_tokens=8, do_sample=True, seed=s,
                                    max_draft_tokens=0, eos_token_id=[]).sequences[0].tolist()) for s in range(6)}
    assert len(outs) > 1


def test_seed_none_draws_a_seed_and_records_it_so_the_run_replays():
    model = tiny_llama(scale=1.0)
    prompt = repetitive_prompts(1, seed=3)[0]
    first = refdec.generate(model, prompt, max_new_tokens=10, do_sample=True, max_draft_tokens=0, eos_token_id=[])
    assert first.stats.seed is not None
    again = refdec.generate(model, prompt, max_new_tokens=10, do_sample=True, seed=first.stats.seed,
                              max_draft_tokens=16, eos_token_id=[])
    assert again.sequences.tolist() == first.sequences.tolist()


def test_process_logits_matches_transformers_warpers():
    torch.manual_seed(0)
    logits = torch.randn(5, 96, dtype=torch.float64) * 3
    logits[0, :10] = 1.0  # ties at the top-k threshold
    for s in SETTINGS:
        procs = LogitsProcessorList()
        procs.append(TemperatureLogitsWarper(s["temperature"]))
        if "top_k" in s:
            procs.append(TopKLogitsWarper(s["top_k"]))
        if "top_p" in s:
            procs.append(TopPLogitsWarper(s["top_p"]))
        if "min_p" in s:
            procs.append(MinPLogitsWarper(s["min_p"]))
        want = procs(torch.zeros(5, 1, dtype=torch.long), logits.clone())
        got = process_logits(logits, s["temperature"], s.get("top_k"), s.get("top_p"), s.get("min_p"))
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        torch.testing.assert_close(got[~torch.isinf(got)], want[~torch.isinf(want)], rtol=0, atol=0)


def test_gumbel_noise_is_a_pure_function_of_seed_position_and_index():
    a = gumbel_row(7, 123, 1000)
    assert torch.equal(a, gumbel_row(7, 123, 1000))
    assert not torch.equal(a, gumbel_row(7, 124, 1000))
    assert not torch.equal(a, gumbel_row(8, 123, 1000))
    assert torch.equal(gumbel_row(7, 123, 64), a[:64])  # independent of the vocabulary size
    idx = torch.tensor([999, 3, 500])
    assert torch.equal(gumbel_at(7, 123, idx), a[idx])  # noise at chosen tokens = the row's entries


@pytest.mark.parametrize("candidates", [1024, 4])
@pytest.mark.parametrize("vocab", [96, 5000])
def test_kept_tokens_are_the_tokens_process_logits_keeps(monkeypatch, candidates, vocab):
    """kept_tokens (one row, in vocabulary order) and kept_mask (a batch) keep exactly the unfiltered
    tokens of process_logits on rows without ties, including when the top-p set reaches past the
    first candidates (the whole row ranked)."""
    monkeypatch.setattr(sampling, "_TOP_P_CANDIDATES", candidates)
    gen = torch.Generator().manual_seed(vocab + candidates)
    for sharp in (0.5, 3.0):
        logits = torch.randn(6, vocab, generator=gen, dtype=torch.float64) * sharp
        for s in SETTINGS + [dict(temperature=1.0, top_p=0.99), dict(temperature=1.0, top_k=3),
                             dict(temperature=1.0, min_p=0.3), dict(temperature=1.0, top_k=50, min_p=0.02)]:
            scores = logits / s["temperature"]
            want = process_logits(scores, 1.0, s.get("top_k"), s.get("top_p"), s.get("min_p"))
            mask = kept_mask(scores, s.get("top_k"), s.get("top_p"), s.get("min_p"))  # every row at once
            assert torch.equal(torch.ones_like(want, dtype=torch.bool) if mask is None else mask, torch.isfinite(want))
            for row in range(logits.shape[0]):
                kept = kept_tokens(scores[row], s.get("top_k"), s.get("top_p"), s.get("min_p"))
                expected = torch.nonzero(torch.isfinite(want[row])).flatten()
                got = torch.arange(vocab) if kept is None else kept
                assert torch.equal(got, expected), (s, row)


def test_gumbel_noise_is_standard_gumbel():
    g = gumbel_row(3, 5, 200_000)
    u = torch.exp(-torch.exp(-g))  # Gumbel CDF → uniform
    counts = np.histogram(u.numpy(), bins=50, range=(0, 1))[0]
    assert chi_square_p_value(counts, np.full(50, 1 / 50)) > 1e-3
    assert abs(float(g.mean()) - 0.5772156649) < 0.01


# fast: top-k over 1000 seeds; full: every setting over 3000 seeds
@pytest.mark.parametrize("setting, n", [
    pytest.param(SETTINGS[1], 1000, id=f"{setting_id(SETTINGS[1])}-1000"),
    *(pytest.param(setting, 3000, id=f"{setting_id(setting)}-3000", marks=pytest.mark.full) for setting in SETTINGS)])
def test_first_token_distribution_over_seeds_is_the_processed_softmax(setting, n):
    """Chi-square over n fixed seeds: plain and speculative sampling draw from softmax(process(logits))."""
    model = tiny_llama(seed=4, scale=6.0)  # a peaked distribution (top token ~0.12)
    prompt = [1, 5, 9, 12, 5, 9]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1:].to(torch.float64)
    probs = torch.softmax(process_logits(logits, setting["temperature"], setting.get("top_k"),
                                         setting.get("top_p"), setting.get("min_p")), dim=-1)[0].numpy()
    counts = np.zeros(probs.shape[0])
    decoder = refdec.SpeculativeDecoder(model)
    for s in range(n):
        out = decoder.generate(prompt, max_new_tokens=1, do_sample=True, seed=s, max_draft_tokens=0,
                               eos_token_id=[], **setting)
        counts[out.sequences[0, -1].item()] += 1
    assert counts[probs == 0].sum() == 0  # filtered tokens are never drawn
    assert chi_square_p_value(counts, probs) > 1e-3
    # the test has power: the same counts reject the distribution at a doubled temperature
    wrong = torch.softmax(process_logits(logits, setting["temperature"] * 2.0, setting.get("top_k"),
                                         setting.get("top_p"), setting.get("min_p")), dim=-1)[0].numpy()
    assert chi_square_p_value(counts, np.where(probs > 0, wrong, 0) / wrong[probs > 0].sum()) < 1e-3
    # the speculative path draws the same tokens (checked on a subset of seeds, where drafts exist)
    for s in range(0, n, 100):
        a = decoder.generate(prompt, max_new_tokens=6, do_sample=True, seed=s, max_draft_tokens=0,
                             eos_token_id=[], **setting)
        b = decoder.generate(prompt, max_new_tokens=6, do_sample=True, seed=s, max_draft_tokens=8,
                             eos_token_id=[], **setting)
        assert a.sequences.tolist() == b.sequences.tolist()
        assert int(a.sequences[0, len(prompt)]) == int(
            decoder.generate(prompt, max_new_tokens=1, do_sample=True, seed=s, max_draft_tokens=0,
                             eos_token_id=[], **setting).sequences[0, -1])


@pytest.mark.parametrize("setting", [dict(temperature=1.0), dict(temperature=0.7), dict(top_k=5),
                                     dict(temperature=1.3, top_k=1), dict(min_p=0.2), dict(temperature=0.6, top_k=9, min_p=0.05),
                                     dict(top_p=0.9), dict(temperature=0.8, top_k=20, top_p=0.7, min_p=0.05)],
                         ids=setting_id)
def test_sampling_rows_on_the_device_gives_each_rows_draw(setting):
    """TargetSampler.sample_rows (every tree row at once, no host sync) draws what sample draws row by
    row, whatever the row's seed and position, ties at the top-k threshold included."""
    rng = np.random.default_rng(4)
    logits = torch.from_numpy(rng.normal(size=(12, 96)) * 3)
    logits[3, :20] = logits[3, 20]  # a tie across the top-k threshold
    logits[5] = 0.0  # a flat row
    seeds, positions = rng.integers(0, 1 << 62, 12), rng.integers(0, 5000, 12)
    samplers = [sampling.TargetSampler(96, do_sample=True, seed=int(seed), **setting) for seed in seeds]
    assert samplers[0].samples_rows
    keys = sampling.position_keys(torch.tensor([sampling.seed_key(int(s)) for s in seeds]), torch.from_numpy(positions))
    got = samplers[0].sample_rows(logits, keys).tolist()
    assert got == [sampler.sample(logits[r], int(positions[r])) for r, sampler in enumerate(samplers)]


def test_top_p_keeps_the_lowest_ids_of_the_tokens_tied_at_its_cut():
    """Tokens tied at the top-p cut are ranked by id: as many are kept as transformers' warper keeps
    (which ones it keeps depends on its sort), the lowest ids, also past top-k's k-th rank."""
    flat = torch.zeros(1, 5, dtype=torch.float64)  # five tokens of probability 0.2
    tied_at_top_k = torch.tensor([[3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -9.0]], dtype=torch.float64)
    for scores, top_k, top_p, want in [(flat, None, 0.5, [0, 1, 2]), (flat, None, 0.1, [0]), (flat, None, 0.9, [0, 1, 2, 3, 4]),
                                       (flat.flip(-1), 3, 0.5, [0, 1, 2]),  # top-k keeps all five (ties)
                                       (tied_at_top_k, 2, 0.7, [0, 1, 2]), (tied_at_top_k, 2, 0.75, [0, 1, 2, 3]),
                                       (tied_at_top_k, 2, 0.5, [0])]:
        mask = kept_mask(scores, top_k, top_p)
        assert torch.nonzero(mask[0]).flatten().tolist() == want, (scores, top_k, top_p)
        assert kept_tokens(scores[0], top_k, top_p).tolist() == want
        assert len(want) == int(torch.isfinite(process_logits(scores, 1.0, top_k, top_p)).sum())


def top_p_rows(rng: np.random.Generator, vocab: int, setting: dict) -> torch.Tensor:
    """float64 [R, vocab] logits of every kind top-p meets: peaked, nearly flat (top-p keeps most of
    the vocabulary), flat (every token tied), quantised (ties everywhere, as in bfloat16 logits),
    tied at the top, tied across top-k's threshold, and near-ties: rows whose probability mass above
    some rank is ``top_p`` up to rounding, so that one rounding more or less changes the kept set."""
    temperature, top_p, top_k = setting.get("temperature", 1.0), setting.get("top_p") or 1.0, setting.get("top_k")
    top_p = top_p if top_p < 1.0 else 0.5
    rows = [rng.normal(size=vocab) * 4, rng.normal(size=vocab) * 0.01, np.zeros(vocab),
            np.round(rng.normal(size=vocab) * 16) / 8]
    top = rng.normal(size=vocab) * 2
    top[rng.permutation(vocab)[:4]] = top.max() + 1  # four tokens tied at the top
    rows.append(top)
    k = min(top_k or 40, vocab // 3)
    tied = np.sort(rng.normal(size=vocab))[::-1].copy()
    tied[k - 3:3 * k] = tied[k - 3]  # tokens tied from the (k-3)-th rank to past the 3k-th
    rows.append(rng.permutation(tied) * 0.5)
    n = min(top_k or 50, 50)
    for m in (1, 2, n // 2, n - 1):  # masses: top_p on m tokens, the rest on the other n - m
        q = np.sort(rng.random(n) + 0.1)[::-1]
        q[:m] *= top_p / q[:m].sum()
        q[m:] *= (1 - top_p) / q[m:].sum()
        row = np.full(vocab, np.log(1e-30))
        row[rng.permutation(vocab)[:n]] = np.log(q)
        rows.append(row)
    return torch.from_numpy(np.stack(rows) * temperature)


TOP_P_SETTINGS = [dict(top_p=0.9), dict(temperature=0.7, top_p=0.5), dict(temperature=1.5, top_p=0.95),
                  dict(top_p=1e-9), dict(top_p=1.0), dict(top_k=40, top_p=0.9),
                  dict(temperature=0.8, top_k=2000, top_p=0.95), dict(top_k=5, top_p=0.99),
                  dict(top_p=0.8, min_p=0.05), dict(temperature=1.3, top_k=64, top_p=0.95, min_p=0.02)]


@pytest.mark.parametrize("vocab, candidates, threads", [pytest.param(3000, 1024, 1, marks=pytest.mark.full), (3000, 16, 4),
                                                        (96, 1024, 4)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_top_p_sampling_rows_on_the_device_gives_each_rows_draw(monkeypatch, vocab, candidates, threads, dtype):
    """sample_rows (a batch, no host sync) keeps the tokens sample keeps row by row (kept_mask and
    kept_tokens, element for element) and draws the same token, for every kind of row, seed,
    position and setting, near-ties at the top-p cut included; also where top-p keeps more than
    the candidates (the whole row ranked) and on several threads (torch's own reductions of a row
    differ there between a batch and the row alone)."""
    monkeypatch.setattr(sampling, "_TOP_P_CANDIDATES", candidates)
    rng = np.random.default_rng(vocab + candidates)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    most_kept = 0
    try:
        for setting in TOP_P_SETTINGS:
            rows = top_p_rows(rng, vocab, setting)
            logits = rows.repeat(3, 1).to(dtype)  # each row drawn at three (seed, position)s
            seeds, positions = rng.integers(0, 1 << 62, len(logits)), rng.integers(0, 1 << 20, len(logits))
            samplers = [sampling.TargetSampler(vocab, do_sample=True, seed=int(seed), **setting) for seed in seeds]
            keys = sampling.position_keys(torch.tensor([sampling.seed_key(int(s)) for s in seeds]),
                                          torch.from_numpy(positions))
            got = samplers[0].sample_rows(logits, keys).tolist()
            want = [sampler.sample(logits[r], int(positions[r])) for r, sampler in enumerate(samplers)]
            assert got == want, setting
            scores = logits.to(torch.float64) / setting.get("temperature", 1.0)
            mask = kept_mask(scores, setting.get("top_k"), setting.get("top_p"), setting.get("min_p"))
            mask = torch.ones_like(scores, dtype=torch.bool) if mask is None else mask
            for r in range(len(rows)):
                kept = kept_tokens(scores[r], setting.get("top_k"), setting.get("top_p"), setting.get("min_p"))
                assert torch.equal(torch.nonzero(mask[r]).flatten(), torch.arange(vocab) if kept is None else kept), \
                    (setting, r)
            if setting.get("top_p", 1.0) < 1.0 and "top_k" not in setting:
                most_kept = max(most_kept, int(mask.sum(dim=-1).max()))
    finally:
        torch.set_num_threads(threads_before)
    assert most_kept > candidates or vocab <= candidates  # top-p kept more than the candidates: the whole row ranked


@pytest.mark.parametrize("setting", [pytest.param(dict(top_p=0.95), marks=pytest.mark.full),
                                     dict(temperature=0.8, top_k=64, top_p=0.95, min_p=0.01)], ids=setting_id)
def test_top_p_sampling_rows_gives_each_rows_draw_over_gemmas_vocabulary(setting):
    """The same over a vocabulary of 262,144 tokens (Gemma 3's), on four threads (where torch's sum
    of such a row differs between a batch and the row alone): every kind of row of
    :func:`top_p_rows`."""
    vocab = 262_144
    rng = np.random.default_rng(9)
    logits = top_p_rows(rng, vocab, setting).to(torch.float32)
    seeds, positions = rng.integers(0, 1 << 62, len(logits)), rng.integers(0, 1 << 20, len(logits))
    samplers = [sampling.TargetSampler(vocab, do_sample=True, seed=int(seed), **setting) for seed in seeds]
    keys = sampling.position_keys(torch.tensor([sampling.seed_key(int(s)) for s in seeds]), torch.from_numpy(positions))
    scores = logits.to(torch.float64) / setting.get("temperature", 1.0)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        got = samplers[0].sample_rows(logits, keys).tolist()
        assert got == [sampler.sample(logits[r], int(positions[r])) for r, sampler in enumerate(samplers)]
        mask = kept_mask(scores, setting.get("top_k"), setting["top_p"], setting.get("min_p"))
        for r in range(len(logits)):
            assert torch.equal(torch.nonzero(mask[r]).flatten(),
                               kept_tokens(scores[r], setting.get("top_k"), setting["top_p"], setting.get("min_p"))), r
    finally:
        torch.set_num_threads(threads_before)
