"""Exact mode on llama.cpp: refdec's tokens are llama.cpp's plain greedy decoding's, token for token,
with no near-tie left out, on a llama-cpp-python built by ``refdec build-llama`` (skipped on stock
builds, which lack ggml's batch-invariant switch).

The tiny GGUF models of benchmarks/random_gguf.py (float32, Q8_0 and Q4_K_M weights, whose batched
kernels llama.cpp picks by row count: llamafile's sgemm, repacked Q8_0 and Q4_K, Q6_K's tiles) decode prompts longer than the
Llama's ``n_batch`` (prefilled in chunks), with references the model follows (long chains
accepted), in batches of several prompts, after a prefix-cache hit, and beside other traffic. The
first test shows that the switch is what makes rows agree: without it the same decode parts from
one-token decoding.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

import refdec  # noqa: E402
from refdec.llama_cpp.api import TreeContext, batch_invariant_switch  # noqa: E402
from refdec.llama_cpp.backend import LlamaCppBackend  # noqa: E402
from refdec.llama_cpp.plain import plain_greedy  # noqa: E402
from benchmarks.random_gguf import EOS, write_tiny_gguf  # noqa: E402

pytestmark = [pytest.mark.llama,
              pytest.mark.skipif(batch_invariant_switch() is None,
                                 reason="stock llama-cpp-python: exact mode needs `refdec build-llama`")]

N_BATCH = 64  # the Llama's prefill chunk: prompts here are longer
TEXTS = [b"def add(a, b):\n    return a + b\n\n" * 3 + b"def mul(a, b):\n", b"The quick brown fox jumps over " * 4,
         b"import os\nimport sys\n\nfor name in sys.argv[1:]:\n" * 2 + b"    print(", b"hello world, " * 7]


def _quantize(source: Path, target: Path, ftype: int) -> Path:
    """llama.cpp's own quantizer (as `llama-quantize` runs it) on a GGUF."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    assert llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params)) == 0
    return target


@pytest.fixture(scope="module", params=["f32", "q8_0", "q4_k_m"])
def llm(request, tmp_path_factory):
    """A Llama on a tiny random GGUF, 256 wide (whole Q8_0 and K-quant blocks, sgemm's tiles), two
    threads (the chunks of a product split between them): float32, Q8_0, or Q4_K_M as llama.cpp
    quantizes it (Q4_K, repacked for AVX2, with Q6_K's vec_dot for the output and a layer's
    ffn_down and attn_v: the models refdec edits with)."""
    pytest.importorskip("gguf")
    folder = tmp_path_factory.mktemp("gguf")
    path = write_tiny_gguf(folder / f"tiny-{request.param}.gguf", n_embd=256, n_ff=512, q8=request.param == "q8_0")
    if request.param == "q4_k_m":
        path = _quantize(path, folder / "tiny-q4_k_m-quantized.gguf", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M)
    return llama_cpp.Llama(str(path), n_ctx=1024, n_threads=2, n_batch=N_BATCH, verbose=False)


@pytest.fixture(autouse=True)
def calibration_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("REFDEC_CACHE", str(tmp_path / "refdec-cache"))


def _plain(llm, prompt: list[int], n: int) -> list[int]:
    """llama.cpp's plain greedy tokens, up to and with the end of sequence, as refdec stops."""
    return plain_greedy(llm, prompt, n, eos={EOS})[0]


def _ids(llm, text: bytes) -> list[int]:
    return [int(t) for t in llm.tokenize(text, add_bos=True)]


def _rows_against_one_token_decodes(llm, invariant: bool) -> list[bool]:
    """Whether each row of a 12-row chain, decoded in one batch after a 100-token prompt, has the
    logits of the same token decoded alone (bit for bit)."""
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, 255, 100).astype(np.int32)
    chain = rng.integers(3, 255, 12).astype(np.int32)

    def run(batched: bool) -> list[np.ndarray]:
        ctx = TreeContext(llm, n_seq_max=1, n_batch=N_BATCH + 1, exact=True)
        try:
            for begin in range(0, len(prompt), N_BATCH):
                part = prompt[begin:begin + N_BATCH]
                ctx.decode(part, np.arange(begin, begin + len(part)), [[0]] * len(part), np.zeros(len(part), bool))
            if batched:
                ctx.decode(chain, len(prompt) + np.arange(len(chain)), [[0]] * len(chain), np.ones(len(chain), bool),
                           invariant=invariant)
                return [ctx.logits(i).copy() for i in range(len(chain))]
            out = []
            for i, token in enumerate(chain):
                ctx.decode(np.array([token]), np.array([len(prompt) + i]), [[0]], np.ones(1, bool))
                out.append(ctx.logits(0).copy())
            return out
        finally:
            ctx.close()

    return [bool(np.array_equal(a, b)) for a, b in zip(run(True), run(False))]


def test_the_switch_gives_each_row_of_a_batch_the_logits_of_a_one_token_decode(llm):
    assert all(_rows_against_one_token_decodes(llm, invariant=True))
    # the control: llama.cpp's usual kernels for the same batch part from one-token decoding
    assert not all(_rows_against_one_token_decodes(llm, invariant=False))


@pytest.mark.parametrize("max_draft_tokens", [4, 32, "auto"])
def test_greedy_is_plain_decoding_token_for_token(llm, max_draft_tokens):
    decoder = refdec.SpeculativeDecoder(llm, prefix_cache=0)
    assert decoder.backend.exact
    accepted = 0
    for text in TEXTS:
        prompt = _ids(llm, text)
        assert len(prompt) > N_BATCH
        plain = _plain(llm, prompt, 64)
        out = decoder.generate(prompt, max_new_tokens=64, max_draft_tokens=max_draft_tokens,
                               references=[plain[3:]])  # a reference the model follows: long chains accepted
        assert out.sequences[0, len(prompt):].tolist() == plain, text
        accepted += out.stats.accepted_tokens
    assert accepted > 100  # the drafts were verified, not skipped


@pytest.mark.parametrize("max_rows", [4, 2])
def test_a_batch_of_prompts_gives_each_its_plain_tokens(llm, max_rows, monkeypatch):
    """Four rows in one decode a step; or two at a time (a KV stream per row: the others wait). The
    rows here take the highest free sequence id, so that a batch's rows hold descending ids (as a
    row that joins a running batch may): each decode lays its rows out in the order of their ids
    all the same (llama.cpp splits a batch at an id out of order)."""
    prompts = [_ids(llm, text) for text in TEXTS]
    plain = [_plain(llm, p, 40) for p in prompts]
    decoder = refdec.SpeculativeDecoder(llm, prefix_cache=0, max_rows=max_rows)
    assert decoder.backend.row_limit == max_rows
    rows, entry_seqs, batch_seqs = [], [], []
    decode = type(decoder.backend.ctx).decode
    verify = type(decoder.backend)._verify_exact_chains

    def counting(self, tokens, positions, seq_ids, want_logits, invariant=False):
        if invariant:
            rows.append(len({int(ids[0]) for ids in seq_ids}))
            entry_seqs.append([int(ids[0]) for ids in seq_ids])
        return decode(self, tokens, positions, seq_ids, want_logits, invariant=invariant)

    def verifying(self, batch, *rest):
        batch_seqs.append(list(batch.base_seqs))
        return verify(self, batch, *rest)

    monkeypatch.setattr(type(decoder.backend.ctx), "decode", counting)
    monkeypatch.setattr(type(decoder.backend), "_verify_exact_chains", verifying)

    def highest_first(self):
        seq = max(self._free_seqs)
        self._free_seqs.remove(seq)
        return seq

    monkeypatch.setattr(type(decoder.backend), "take_seq", highest_first)
    done = {}
    decoder.generate(prompts, max_new_tokens=40, max_draft_tokens=16, references=[[p[2:]] for p in plain],
                     on_row_done=lambda b, new, _: done.__setitem__(b, new))
    assert [list(done[b]) for b in range(len(prompts))] == plain
    assert max(rows) == max_rows  # the rows verified together
    assert all(seqs == sorted(seqs) for seqs in entry_seqs)
    assert any(seqs != sorted(seqs) for seqs in batch_seqs)


def test_a_prefix_cache_hit_reuses_whole_chunks_and_gives_plain_tokens(llm):
    decoder = refdec.SpeculativeDecoder(llm)
    first = _ids(llm, TEXTS[0] * 2)
    extended = first + _ids(llm, b"    return a * b\n")[1:]
    assert len(first) > 2 * N_BATCH
    for prompt, cached in ((first, 0), (extended, len(first) // N_BATCH * N_BATCH), (first, (len(first) - 1)
                                                                                      // N_BATCH * N_BATCH)):
        plain = _plain(llm, prompt, 32)
        out = decoder.generate(prompt, max_new_tokens=32, max_draft_tokens=16, references=[plain[2:]])
        assert out.stats.cached_prompt_tokens == cached
        assert out.sequences[0, len(prompt):].tolist() == plain


def test_the_same_request_beside_other_traffic_gets_one_reply(llm):
    """A prompt alone, then in a batch beside others (whose drafts run in the same decodes), then
    again after them: one reply, plain decoding's."""
    decoder = refdec.SpeculativeDecoder(llm)
    prompt = _ids(llm, TEXTS[2])
    others = [_ids(llm, t) for t in (TEXTS[0], TEXTS[3])]
    plain = _plain(llm, prompt, 48)
    alone = decoder.generate(prompt, max_new_tokens=48, max_draft_tokens="auto").sequences[0].tolist()
    beside = {}
    decoder.generate([others[0], prompt, others[1]], max_new_tokens=48, max_draft_tokens="auto",
                     references=[[others[0]], [], [others[1]]], on_row_done=lambda b, new, _: beside.__setitem__(b, new))
    again = decoder.generate(prompt, max_new_tokens=48, max_draft_tokens=8).sequences[0].tolist()
    assert alone[len(prompt):] == plain
    assert list(beside[1]) == plain
    assert again == alone


def test_exact_mode_verifies_chains_in_one_decode_a_step(llm, monkeypatch):
    decoder = refdec.SpeculativeDecoder(llm, prefix_cache=0)
    ctx = decoder.backend.ctx
    calls = []
    decode = type(ctx).decode

    def counting(self, tokens, positions, seq_ids, want_logits, invariant=False):
        calls.append((len(tokens), invariant, [list(ids) for ids in seq_ids]))
        return decode(self, tokens, positions, seq_ids, want_logits, invariant=invariant)

    monkeypatch.setattr(type(ctx), "decode", counting)
    prompt = _ids(llm, TEXTS[1])
    out = decoder.generate(prompt, max_new_tokens=40, max_draft_tokens=16, references=[_ids(llm, TEXTS[1])])
    steps = [c for c in calls if c[1]]
    assert len(steps) == out.stats.forward_passes - 1  # the prefill's last chunk gives the first token
    assert all(len({tuple(ids) for ids in seq_ids}) == 1 for _, _, seq_ids in steps)  # one sequence: a chain
    assert not any(invariant for n, invariant, _ in calls if n == N_BATCH)  # the prefill: llama.cpp's usual kernels


def test_exact_true_is_refused_with_the_reason(tmp_path, monkeypatch, llm):
    flash = llama_cpp.Llama(llm.model_path, n_ctx=256, n_threads=1, n_batch=N_BATCH, flash_attn=True, verbose=False)
    assert not LlamaCppBackend(flash).exact  # default: off, where it cannot run
    with pytest.raises(ValueError, match="flash attention"):
        LlamaCppBackend(flash, exact=True)
    monkeypatch.setattr("refdec.llama_cpp.backend.batch_invariant_switch", lambda: None)
    with pytest.raises(ValueError, match="refdec build-llama"):
        refdec.SpeculativeDecoder(llm, exact=True)
    with pytest.raises(ValueError, match="exact must be True, False or None"):
        refdec.SpeculativeDecoder(llm, exact="yes")


def test_a_recurrent_model_is_not_run_in_exact_mode(tiny_lfm2_llm):
    assert not LlamaCppBackend(tiny_lfm2_llm).exact
    with pytest.raises(ValueError, match="recurrent layers"):
        LlamaCppBackend(tiny_lfm2_llm, exact=True)


def test_the_patch_is_the_one_build_llama_applies():
    from refdec.llama_cpp.build import PATCH

    text = PATCH.read_text()
    assert Path(PATCH).parent.name == "patches"
    for changed in ("ggml/include/ggml-cpu.h", "ggml/src/ggml-cpu/ggml-cpu.c", "ggml/src/ggml-cpu/repack.cpp"):
        assert f"+++ b/{changed}" in text
