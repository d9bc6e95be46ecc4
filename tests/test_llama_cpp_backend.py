"""Specifies refdec.llama_cpp.backend, refdec on llama.cpp, with a tiny random GGUF model
(benchmarks/random_gguf.py): its tree path, as it runs on stock llama-cpp-python (exact mode off
here; tests/test_llama_cpp_exact.py specifies exact mode).

llama.cpp's batched evaluation is not bit-identical to its one-token evaluation (shown and
measured in benchmarks/llama_cpp.py), so greedy identity with llama.cpp's plain decoding is
asserted where the plain decoding has no near-tie (its top two logits further apart than the
batched/one-token difference can bridge), and measured elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp")

import refdec  # noqa: E402
from refdec.drafting.tree import DraftTree  # noqa: E402
from refdec.llama_cpp.api import LlamaDecodeError  # noqa: E402
from refdec.llama_cpp.backend import LlamaCppBackend, prefix_with_leaves, tree_layout  # noqa: E402
from refdec.llama_cpp.plain import plain_greedy  # noqa: E402
from benchmarks.random_gguf import VOCAB  # noqa: E402

pytestmark = pytest.mark.llama

PROMPTS = [b"def add(a, b):\n    return", b"The quick brown fox", b"hello world, hello", b"import os\nimport sys\n"]


@pytest.fixture
def gguf_path(tiny_gguf):
    return tiny_gguf


@pytest.fixture
def llm(tiny_llm):
    return tiny_llm


@pytest.fixture(autouse=True)
def stock_llama_cpp(monkeypatch, tiny_llm):
    """Backends made here run as on stock llama-cpp-python (no batch-invariant switch: trees, not
    exact mode), whatever this llama.cpp build has; the one-shot backend kept on the shared Llama is
    dropped before and after, so that no other module's mode leaks in or out."""
    monkeypatch.setattr("refdec.llama_cpp.backend.batch_invariant_switch", lambda: None)
    tiny_llm.__dict__.pop("_refdec_backend", None)
    yield
    tiny_llm.__dict__.pop("_refdec_backend", None)


@pytest.fixture(autouse=True)
def calibration_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("REFDEC_CACHE", str(tmp_path))  # "auto" calibrates into a fresh cache


def _ids(llm, text: bytes) -> list[int]:
    return [int(t) for t in llm.tokenize(text, add_bos=True)]


def _margins(llm, prompt: list[int], new: list[int]) -> list[float]:
    """The top-1 minus top-2 logit of plain one-token decoding before each new token."""
    ctx = LlamaCppBackend(llm, n_seq_max=2).ctx
    seq = list(prompt)
    for begin in range(0, len(seq), ctx.n_batch):  # the prompt in decodes of at most n_batch tokens
        part = seq[begin:begin + ctx.n_batch]
        ctx.decode(np.array(part), np.arange(begin, begin + len(part)), [[0]] * len(part),
                   np.arange(begin, begin + len(part)) == len(seq) - 1)
    last_entry = (len(seq) - 1) % ctx.n_batch
    out = []
    for token in new:
        top2 = np.sort(ctx.logits(0 if len(seq) > len(prompt) else last_entry))[-2:]
        out.append(float(top2[1] - top2[0]))
        ctx.decode(np.array([token]), np.array([len(seq)]), [[0]], np.ones(1, dtype=bool))
        seq.append(token)
    ctx.close()
    return out


@pytest.mark.parametrize("max_draft_tokens", [1, 8, 32, "auto"])
def test_greedy_equals_llama_cpp_plain_decoding_up_to_a_near_tie(llm, max_draft_tokens):
    compared = 0
    for text in PROMPTS:
        prompt = _ids(llm, text)
        plain, _ = plain_greedy(llm, prompt, 48)
        out = refdec.generate(llm, prompt, max_new_tokens=48, max_draft_tokens=max_draft_tokens,
                              references=[plain[5:]])  # a reference the model follows: drafts are accepted
        new = out.sequences[0, len(prompt):].tolist()
        assert out.sequences[0, :len(prompt)].tolist() == prompt
        margins = _margins(llm, prompt, plain)
        clear = next((i for i, m in enumerate(margins) if m < 1e-3), len(plain))  # up to the first near-tie
        assert new[:clear] == plain[:clear], (text, clear)
        compared += clear
    assert compared >= 100  # most of the outputs have no near-tie: the assertion compares tokens


def check_each_keep(monkeypatch, backend, check) -> list:
    """Wraps the backend's batches' ``keep_accepted``: after each call, ``check(batch, base_seq,
    kept)`` for every row (``kept``: the positions the row keeps, its root and accepted nodes).
    Returns the list that gets one entry per call."""
    batch_type = type(backend.new_batch())
    original_keep = batch_type.keep_accepted
    calls = []

    def keep_and_check(self, root_pos, accepted_rows):
        original_keep(self, root_pos, accepted_rows)
        for b, base in enumerate(self.base_seqs):
            check(self, base, int(root_pos[b]) + 1 + int(accepted_rows[b].shape[0]))
        calls.append(len(accepted_rows))

    monkeypatch.setattr(batch_type, "keep_accepted", keep_and_check)
    return calls


def test_one_llama_decode_per_step_and_the_cache_holds_exactly_the_sequence(llm, monkeypatch):
    decoder = refdec.SpeculativeDecoder(llm)
    ctx = decoder.backend.ctx

    def check(batch, base, kept):  # the root and the accepted nodes, nothing else
        assert ctx.seq_pos_range(base) == (0, kept - 1)
        others = [s for s in range(ctx.n_seq_max) if s not in batch.base_seqs]
        assert all(ctx.seq_pos_range(s) == (-1, -1) for s in others[:64])  # no branch cell is left behind

    checked = check_each_keep(monkeypatch, decoder.backend, check)
    prompt = _ids(llm, PROMPTS[0])
    plain, _ = plain_greedy(llm, prompt, 40)
    before = ctx.decodes
    out = decoder.generate(prompt, max_new_tokens=40, max_draft_tokens=16, references=[plain])
    steps = out.stats.forward_passes - 1  # the prefill pass yields the first token
    assert ctx.decodes - before == 1 + steps  # one prompt chunk (64 >= prompt) + one decode a step
    assert len(checked) == steps and steps < 40  # drafts were accepted: fewer steps than tokens
    assert out.stats.accepted_by_source.get("reference", 0) > 0


def test_batch_of_prompts_matches_each_prompt_alone(llm):
    prompts = [_ids(llm, text) for text in PROMPTS[:3]]
    alone = [refdec.generate(llm, p, max_new_tokens=24, max_draft_tokens=8).sequences[0, len(p):].tolist()
             for p in prompts]
    done = {}
    out = refdec.generate(llm, prompts, max_new_tokens=24, max_draft_tokens=8, max_batch_size=2,
                          on_row_done=lambda b, new, stats: done.__setitem__(b, new))
    assert out.sequences.shape[0] == 3
    assert [done[b] for b in range(3)] == alone


@pytest.mark.parametrize("max_rows", [1, 3])
def test_rows_with_whole_trees_fit_the_logits_rows_llama_cpp_reserves(gguf_path, monkeypatch, max_rows):
    """Three rows of 64-node trees ask one decode for 195 logits rows: a decoder sized for one row
    (65) gives each row a third of them (llama.cpp aborts the process past its n_outputs_max; a
    Llama's n_batch of 512 once let the rows ask for more); one sized for three rows gives each its
    whole tree. Outputs are each row's solo."""
    import llama_cpp

    llm = llama_cpp.Llama(str(gguf_path), n_ctx=1024, n_threads=1, n_batch=512, verbose=False)
    decoder = refdec.SpeculativeDecoder(llm, max_rows=max_rows)
    ctx = decoder.backend.ctx
    assert ctx.n_outputs == max(ctx.n_seq_max, max_rows * 65)
    prompts = [_ids(llm, text) for text in PROMPTS[:3]]
    plains = [plain_greedy(llm, p, 120)[0] for p in prompts]
    widest = []
    decode = type(ctx).decode

    def counting(self, tokens, positions, seq_ids, want_logits, **kwargs):
        widest.append(int(np.count_nonzero(want_logits)))
        return decode(self, tokens, positions, seq_ids, want_logits, **kwargs)

    monkeypatch.setattr(type(ctx), "decode", counting)
    alone = [decoder.generate(p, max_new_tokens=120, max_draft_tokens=64, references=[plain]).sequences[0, len(p):]
             for p, plain in zip(prompts, plains)]
    widest.clear()
    done = {}
    decoder.generate(prompts, max_new_tokens=120, max_draft_tokens=64, references=[[plain] for plain in plains],
                     on_row_done=lambda b, new, stats: done.__setitem__(b, new))
    assert max(widest) <= ctx.n_outputs
    assert max(widest) > (65 if max_rows == 3 else 60)  # the rows' trees filled what the context holds
    assert [done[b] for b in range(3)] == [solo.tolist() for solo in alone]


def test_one_shot_generate_makes_the_tree_context_once_per_llama(gguf_path):
    """refdec.generate(llm, ...) keeps its backend on the Llama: the second call pays no new
    context (KV cache, logits buffer) and decodes the same."""
    import llama_cpp

    llm = llama_cpp.Llama(str(gguf_path), n_ctx=256, n_threads=1, n_batch=64, verbose=False)
    prompt = _ids(llm, PROMPTS[0])
    first = refdec.generate(llm, prompt, max_new_tokens=24, max_draft_tokens=8)
    ctx = llm._refdec_backend.ctx
    second = refdec.generate(llm, prompt, max_new_tokens=24, max_draft_tokens=8)
    assert llm._refdec_backend.ctx is ctx
    assert second.sequences.tolist() == first.sequences.tolist()
    assert refdec.SpeculativeDecoder(llm).backend.ctx is not ctx  # a decoder of the user's own has its own


def test_sampling_with_a_seed_repeats_and_differs_with_another(llm):
    prompt = _ids(llm, PROMPTS[1])
    runs = [refdec.generate(llm, prompt, max_new_tokens=32, do_sample=True, temperature=1.5, seed=seed,
                            max_draft_tokens=8).sequences[0].tolist() for seed in (7, 7, 8)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_streaming_and_stop_strings(llm):
    prompt = _ids(llm, PROMPTS[2])
    plain, _ = plain_greedy(llm, prompt, 40)
    tok = refdec.SpeculativeDecoder(llm).tokenizer
    text = tok.decode(plain)
    stop = text[10:13]

    class Streamer:
        def __init__(self):
            self.chunks = []

        def put(self, value):
            self.chunks.append(value.reshape(-1).tolist())

        def end(self):
            self.chunks.append("end")

    streamer = Streamer()
    out = refdec.generate(llm, prompt, max_new_tokens=40, stop_strings=[stop], streamer=streamer, references=[plain],
                          max_draft_tokens=8)
    new = out.sequences[0, len(prompt):].tolist()
    assert out.stats.stop_reason == "stop_string"
    assert stop in tok.decode(new) and stop not in tok.decode(new[:-1])
    assert streamer.chunks[0] == prompt and streamer.chunks[-1] == "end"
    assert sum(streamer.chunks[1:-1], []) == new


def test_eos_from_the_gguf_vocabulary_ends_the_decode(llm):
    backend = refdec.SpeculativeDecoder(llm).backend
    assert backend.generation_config.eos_token_id == [2]


def test_bad_input_is_a_clear_error(llm, gguf_path):
    with pytest.raises(ValueError, match="input_ids"):
        refdec.generate(llm, [1, 5, VOCAB + 3], max_new_tokens=4)
    small = llama_cpp.Llama(str(gguf_path), n_ctx=64, n_threads=1, verbose=False)
    decoder = refdec.SpeculativeDecoder(small)
    n_ctx = decoder.max_positions + 1  # llama.cpp may round n_ctx up
    with pytest.raises(ValueError, match=f"prompt has {n_ctx + 1} tokens, more than the model's "
                                         f"max_position_embeddings={n_ctx - 1}"):
        decoder.generate([4 + i % 200 for i in range(n_ctx + 1)], max_new_tokens=4)


def test_an_index_of_another_tokenizer_is_refused(llm, monkeypatch):
    from refdec.llama_cpp.tokenizer import GgufTokenizer

    monkeypatch.setattr(GgufTokenizer, "fingerprint", lambda self: "a" * 64)

    class Index:  # what the check reads of a refdec.CorpusIndex
        fingerprint = "b" * 64

    from refdec.engine.arguments import check_index_tokenizer

    with pytest.raises(ValueError, match="another tokenizer"):
        check_index_tokenizer(Index(), refdec.SpeculativeDecoder(llm).tokenizer)


def test_a_full_context_is_a_clear_error(gguf_path):
    small = llama_cpp.Llama(str(gguf_path), n_ctx=64, n_threads=1, verbose=False)
    decoder = refdec.SpeculativeDecoder(small)
    half = (decoder.max_positions + 1) // 2 + 8  # the rows share the context's cells: two halves do not fit
    prompts = [[4 + (i + r) % 200 for i in range(half)] for r in range(2)]
    decoder.generate(prompts[0], max_new_tokens=4, max_draft_tokens=0)  # one fits
    with pytest.raises(LlamaDecodeError, match="n_ctx"):
        decoder.generate(prompts, max_new_tokens=4, max_draft_tokens=0)
    decoder.generate(prompts[1], max_new_tokens=4, max_draft_tokens=0)  # the failed call left no cells behind


def test_tree_layout_gives_each_node_the_leaves_below_it():
    # root -> 0 -> 1 -> 3 ; 0 -> 2 ; root -> 4
    tree = DraftTree(np.array([5, 6, 7, 8, 9]), np.array([-1, 0, 0, 1, -1]), np.ones(5))
    below, leaves = tree_layout(tree)
    assert below == [[3, 2], [3], [2], [3], [4]]
    assert leaves.tolist() == [2, 3, 4]


def test_prefix_with_leaves_keeps_the_best_first_prefix():
    tree = DraftTree(np.array([5, 6, 7, 8, 9]), np.array([-1, 0, 0, 1, -1]), np.ones(5))
    assert len(prefix_with_leaves(tree, 3)) == 5
    assert prefix_with_leaves(tree, 2).parents.tolist() == [-1, 0, 0, 1]
    assert prefix_with_leaves(tree, 1).parents.tolist() == [-1, 0]
    assert len(prefix_with_leaves(tree, 0)) == 0


def _pages_with_llama_blocks() -> list[str]:
    from test_readme import PAGES, REPO, needs_llama, readme_blocks

    return [page for page in PAGES if any(needs_llama(b) for b in readme_blocks(REPO / page))]


@pytest.mark.parametrize("page", _pages_with_llama_blocks())
def test_the_readmes_llama_blocks_run(page, gguf_path, tmp_path, monkeypatch, capsys):
    """The llama.cpp blocks of README.md and docs/ (tests/test_readme.py leaves them here) on the
    tiny model: the Python snippets (the tiny GGUF stands in for the default model's and for
    ``model.gguf``), and ``refdec edit ... --model x.gguf --compare --diff`` (the tiny random model
    never closes the file's fence: the command says so and writes nothing)."""
    import shlex

    import refdec.gguf_files
    from refdec.cli import main as refdec_main
    from test_readme import REPO, _command_lines, needs_llama, readme_blocks

    monkeypatch.setattr(refdec.gguf_files, "default_model_gguf", lambda: gguf_path)
    blocks = [b for b in readme_blocks(REPO / page) if needs_llama(b)]
    assert blocks
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fib.py").write_text("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n")
    (tmp_path / "file.py").write_text("x = 1\nprint(x)\n")
    for block in blocks:
        text = block.text.replace('"model.gguf"', repr(str(gguf_path)))
        if block.language == "python":
            exec(compile(text, block.where, "exec"), {})
            continue
        for command in _command_lines(text):
            if command.startswith("pip install"):
                continue
            args = shlex.split(command.replace("path/to/model.gguf", str(gguf_path))
                               .replace("path/to/file.py", "file.py").replace(" FILE ", " file.py "))
            assert args[0] == "refdec", command
            code = refdec_main(args[1:] + ["--max-new-tokens", "24"])
            err = capsys.readouterr().err
            assert code in (0, 1), err
            if code == 1:
                assert "before the closing fence" in err and "nothing was written" in err
            assert (tmp_path / "file.py").read_text() == "x = 1\nprint(x)\n"


@pytest.mark.slow
def test_the_default_models_gguf_agrees_with_llama_cpps_plain_decoding():
    """Gemma 3 270M Q4_K_M (the [demo] package's GGUF): refdec's greedy tokens against llama.cpp's plain
    decoding on code with its file as the reference. Identity holds up to the first near-tie (a top-two
    logit gap below 0.5, the size of llama.cpp's batched/one-token difference on this model), and
    the copied file is verified many tokens a pass."""
    from refdec.gguf_files import default_model_gguf

    try:
        path = default_model_gguf()
    except ImportError as exc:
        pytest.skip(str(exc))
    llm = llama_cpp.Llama(str(path), n_ctx=2048, n_threads=2, verbose=False)
    source = Path(refdec.drafting.tree.__file__).read_text()[:1500]
    prompt = _ids(llm, ("Original file:\n```\n" + source + "```\n\nThe same file:\n```\n").encode())
    plain, _ = plain_greedy(llm, prompt, 96)
    out = refdec.generate(llm, prompt, max_new_tokens=96, references=[source])
    new = out.sequences[0, len(prompt):].tolist()
    margins = _margins(llm, prompt, plain)
    clear = next((i for i, m in enumerate(margins) if m < 0.5), len(plain))
    assert new[:clear] == plain[:clear]
    assert out.stats.accepted_tokens > 0 and out.stats.tokens_per_pass > 2  # the file is copied many tokens a pass




def test_a_prompt_that_begins_as_an_earlier_one_did_reuses_its_cells_and_decodes_the_same(llm):
    fresh = refdec.SpeculativeDecoder(llm, prefix_cache=0)
    reusing = refdec.SpeculativeDecoder(llm)
    first = _ids(llm, b"def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return")
    edited = first[:-4] + _ids(llm, b" mul(a, b):")[1:]  # shares all but its end with the first prompt
    for prompt, cached in ((first, 0), (first, len(first) - 1), (edited, len(first) - 4)):
        expected = fresh.generate(prompt, max_new_tokens=24, max_draft_tokens=8)
        assert expected.stats.cached_prompt_tokens == 0
        out = reusing.generate(prompt, max_new_tokens=24, max_draft_tokens=8)
        assert out.stats.cached_prompt_tokens == cached
        assert out.stats.rows == [] or out.stats.rows[0].cached_prompt_tokens == cached
        assert out.sequences.tolist() == expected.sequences.tolist()


def test_a_finished_row_keeps_the_cells_of_the_tokens_it_kept_only(llm):
    decoder = refdec.SpeculativeDecoder(llm)
    backend = decoder.backend
    backend.prefix_cache.clear()
    backend.new_batch()
    prompt = _ids(llm, b"hello world, hello")
    out = decoder.generate(prompt, max_new_tokens=30, max_draft_tokens=16, stop_strings=["o"])
    (entry,) = backend.prefix_cache.entries
    seq = out.sequences[0].tolist()
    assert entry.tokens.tolist() == seq[:len(entry.tokens)] and len(entry.tokens) == len(seq) - 1
    low, high = backend.ctx.seq_pos_range(entry.handle)
    assert (low, high + 1) == (0, len(entry.tokens))  # no cell of a token the stop cut away


def test_kept_sequences_give_back_their_ids_and_cells_when_rows_need_them(gguf_path):
    small = llama_cpp.Llama(str(gguf_path), n_ctx=128, n_threads=1, n_batch=64, verbose=False)
    decoder = refdec.SpeculativeDecoder(small, prefix_cache=4)
    backend = decoder.backend
    third = backend.ctx.n_ctx // 3 - 12  # three rows' cells fill the context
    prompts = [[4 + (i * (r + 3)) % 200 for i in range(third)] for r in range(4)]
    expected = [refdec.SpeculativeDecoder(small, prefix_cache=0).generate(p, max_new_tokens=8).sequences.tolist()
                for p in prompts]
    for prompt, want in zip(prompts, expected):  # each needs cells the kept ones hold
        assert decoder.generate(prompt, max_new_tokens=8).sequences.tolist() == want
    assert 1 <= len(backend.prefix_cache) < 4
    free = len(backend._free_seqs)
    taken = [backend.take_seq() for _ in range(free + len(backend.prefix_cache))]  # every id, the kept ones too
    assert len(backend.prefix_cache) == 0 and len(set(taken)) == backend.ctx.n_seq_max
    for seq in taken:
        backend.release_seq(seq)
    with pytest.raises(LlamaDecodeError, match="sequences are in use"):
        for _ in range(backend.ctx.n_seq_max + 1):
            backend.take_seq()


def test_prefix_cache_is_checked(llm):
    with pytest.raises(ValueError, match="prefix_cache"):
        refdec.SpeculativeDecoder(llm, prefix_cache=-1)


def test_a_prefill_runs_a_decode_per_step_and_closed_early_releases_its_sequence(llm):
    from refdec.engine.interface import run_steps

    backend = refdec.SpeculativeDecoder(llm, prefix_cache=0).backend
    backend.new_batch()
    free = len(backend._free_seqs)
    prompt = np.array([4 + i % 150 for i in range(200)])  # 4 chunks of the Llama's n_batch (64)

    def request():
        return SimpleNamespace(prompt=prompt, stats=SimpleNamespace(cached_prompt_tokens=0), done=False,
                               cancel_requested=False)

    steps = backend.prefill_steps([request()], None)
    decodes = backend.ctx.decodes
    next(steps)
    assert backend.ctx.decodes == decodes + 1 and len(backend._free_seqs) == free - 1
    steps.close()
    assert len(backend._free_seqs) == free and backend.ctx.seq_pos_range(0) == (-1, -1)
    batch, last = run_steps(backend.prefill_steps([request(), request()], None))
    assert backend.ctx.decodes == decodes + 1 + 8 and len(batch) == 2 and last.shape == (2, backend.vocab_size)
    # the same prompt in two sequences: the same logits, up to llama.cpp's rounding where the two sit at
    # KV cells of another alignment (without flash attention, softmax and KQV sum a row over the cells in
    # SIMD lanes: docs/llama_cpp.md, "Where plain and refdec part"); a stale cell of the closed prefill
    # left in either sequence's attention would move them by far more
    assert torch.allclose(last[0], last[1], rtol=0, atol=1e-4), float((last[0] - last[1]).abs().max())


def test_a_prefill_whose_requests_are_all_cancelled_stops_inside_its_decode(llm):
    """llama.cpp polls the group's cancellation between the operations of a prefill's decode (its
    abort callback): the decode stops part-way, the sequence is released, and the callback is unset
    for the decodes after it."""
    from refdec.engine.interface import PrefillCancelled

    class Request:  # asks to be cancelled once the decode has polled it a few times
        prompt = np.array([4 + i % 150 for i in range(60)])
        stats = SimpleNamespace(cached_prompt_tokens=0)
        done = False
        polls = 0

        @property
        def cancel_requested(self):
            self.polls += 1
            return self.polls > 5

    decoder = refdec.SpeculativeDecoder(llm, prefix_cache=0)
    backend = decoder.backend
    backend.new_batch()
    free = len(backend._free_seqs)
    request = Request()
    with pytest.raises(PrefillCancelled):
        next(backend.prefill_steps([request], None))  # one chunk: it never finishes
    assert request.polls > 5 and len(backend._free_seqs) == free and backend.ctx.seq_pos_range(0) == (-1, -1)
    prompt = _ids(llm, PROMPTS[0])
    assert decoder.generate(prompt, max_new_tokens=8).sequences.tolist() == \
        refdec.SpeculativeDecoder(llm, prefix_cache=0).generate(prompt, max_new_tokens=8).sequences.tolist()


# -- models with recurrent layers (benchmarks.random_gguf: LFM2's short convolutions, Qwen3.5's Gated DeltaNet,
# Mamba2): chains, the rejected tail rolled back or the chain run on a copy

@pytest.fixture(params=["tiny_lfm2_llm", "tiny_qwen35_llm", "tiny_mamba2_llm"])
def hybrid_llm(request):
    """LFM2 and Qwen3.5 roll a rejected tail back (n_rs_seq); Mamba2's chains run on a scratch copy."""
    return request.getfixturevalue(request.param)


def _hybrid_prompts(llm):
    return [_ids(llm, text) for text in (b"abc abc abc abc abc", b"def add(a, b):\n    return a")]


@pytest.mark.parametrize("max_draft_tokens", [4, 16, "auto"])
def test_a_hybrid_gguf_gives_llama_cpps_plain_tokens_up_to_a_near_tie(hybrid_llm, max_draft_tokens):
    llm = hybrid_llm
    compared = accepted = rejected = 0
    for prompt in _hybrid_prompts(llm):
        plain, _ = plain_greedy(llm, prompt, 48)
        reference = list(plain)
        for j in range(5, len(reference), 9):  # drafts accepted up to each corruption
            reference[j] = (reference[j] + 1) % VOCAB
        out = refdec.generate(llm, prompt, max_new_tokens=48, max_draft_tokens=max_draft_tokens,
                              references=[prompt[-3:] + reference], eos_token_id=[])
        new = out.sequences[0, len(prompt):].tolist()
        margins = _margins(llm, prompt, plain)
        clear = next((i for i, m in enumerate(margins) if m < 1e-3), len(plain))
        assert new[:clear] == plain[:clear], (prompt, clear)
        compared += clear
        accepted += out.stats.accepted_tokens
        rejected += out.stats.proposed_tokens - out.stats.accepted_tokens
    assert compared >= 60 and accepted > 10 and rejected > 5, (compared, accepted, rejected)


def test_a_hybrid_row_verifies_a_chain_and_keeps_exactly_its_sequence(hybrid_llm, monkeypatch):
    decoder = refdec.SpeculativeDecoder(hybrid_llm)
    backend = decoder.backend
    assert backend.recurrent and backend.max_tree <= 16 and backend.prefix_cache.whole
    branchy = DraftTree(np.array([5, 6, 7, 8]), np.array([-1, -1, 0, 2]), np.ones(4, np.float32))
    chain = backend.fit_tree(branchy, 1)
    assert chain.token_ids.tolist() == [5, 7, 8] and chain.parents.tolist() == [-1, 0, 1]
    ctx = backend.ctx

    def check(batch, base, kept):  # the rejected tail rolled back (a recurrent cell holds the last position only)
        assert ctx.seq_pos_range(base)[1] == kept - 1

    checked = check_each_keep(monkeypatch, backend, check)
    prompt = _hybrid_prompts(hybrid_llm)[0]
    plain, _ = plain_greedy(hybrid_llm, prompt, 40)
    reference = list(plain)
    for j in range(4, len(reference), 7):
        reference[j] = (reference[j] + 1) % VOCAB
    out = decoder.generate(prompt, max_new_tokens=40, max_draft_tokens=8, references=[prompt[-3:] + reference],
                           eos_token_id=[])
    assert checked and out.stats.forward_passes < 40
    assert out.stats.accepted_tokens < out.stats.proposed_tokens  # tails were rolled back


def test_a_batch_on_a_hybrid_gguf_matches_each_prompt_alone(hybrid_llm):
    llm = hybrid_llm
    prompts = _hybrid_prompts(llm) + [_ids(llm, b"hello world, hello")]
    alone = [refdec.generate(llm, p, max_new_tokens=24, max_draft_tokens=8, eos_token_id=[])
             .sequences[0, len(p):].tolist() for p in prompts]
    done = {}
    refdec.generate(llm, prompts, max_new_tokens=24, max_draft_tokens=8, max_batch_size=2, eos_token_id=[],
                    on_row_done=lambda b, new, stats: done.__setitem__(b, new))
    assert [done[b] for b in range(3)] == alone


def test_a_hybrid_prompt_that_extends_a_finished_one_reuses_its_sequence(hybrid_llm):
    """A chat's next turn begins with all of the last request's prompt and reply: its base sequence
    takes that kept sequence's cells and recurrent state; a prompt sharing only part of it cannot
    (the state is past that part) and is prefilled whole."""
    llm = hybrid_llm
    prompt = _hybrid_prompts(llm)[0]
    decoder = refdec.SpeculativeDecoder(llm)
    first = decoder.generate(prompt, max_new_tokens=24, max_draft_tokens=8, eos_token_id=[])
    done = first.sequences[0].tolist()
    follow_up = done + _ids(llm, b"more text")[1:]
    plain, _ = plain_greedy(llm, follow_up, 24)
    out = decoder.generate(follow_up, max_new_tokens=24, max_draft_tokens=8, eos_token_id=[],
                           references=[follow_up[-3:] + plain])
    assert out.stats.cached_prompt_tokens == len(done) - 1  # the reply's last token was never fed
    new = out.sequences[0, len(follow_up):].tolist()
    margins = _margins(llm, follow_up, plain)
    clear = next((i for i, m in enumerate(margins) if m < 1e-3), len(plain))
    assert clear >= 8 and new[:clear] == plain[:clear]
    part = prompt[:-2] + _ids(llm, b"xyz")[1:]
    out = decoder.generate(part, max_new_tokens=8, max_draft_tokens=8, eos_token_id=[])
    assert out.stats.cached_prompt_tokens == 0


def test_rolling_a_hybrid_sequence_back_too_far_says_why(hybrid_llm):
    backend = LlamaCppBackend(hybrid_llm)
    ctx = backend.ctx
    tokens = np.arange(3, 43, dtype=np.int32)
    ctx.decode(tokens, np.arange(40), [[0]] * 40, np.zeros(40, bool))
    if backend.scratch_chains:  # Mamba2: llama.cpp keeps no earlier state at all
        assert ctx.rollback == 0
        with pytest.raises(RuntimeError, match="recurrent layers.*cannot restore.*n_rs_seq is 0"):
            ctx.seq_remove(0, 39, -1)
        return
    ctx.seq_remove(0, 40 - backend.max_tree, -1)  # within the states llama.cpp keeps
    with pytest.raises(RuntimeError, match="recurrent layers.*last 17 tokens"):
        ctx.seq_remove(0, 5, -1)
