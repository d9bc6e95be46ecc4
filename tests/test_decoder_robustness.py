"""The decoder against awkward inputs and long use.

* drafts holding token ids the model has no embedding for (an index or
  references over a larger vocabulary) never reach the model;
* references longer than the model's window only draft (never fed); a prompt
  longer than the window is a clear error;
* bad ``max_draft_tokens`` values are a ValueError naming the argument;
* a streamer that raises: the exception propagates, and the same
  SpeculativeDecoder decodes correctly afterwards;
* hundreds of consecutive ``generate`` calls on one decoder do not grow memory
  (the 10,000-call version is benchmarks/long_run.py).
"""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest
import torch

import refdec
from refdec.decode.drafts import drop_out_of_vocab
from refdec.index import CorpusIndex
from refdec.tree import DraftTree
from tiny_models import VOCAB, repetitive_prompts, tiny_gemma3, tiny_llama


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=4)


def _hf_greedy(model, prompt, max_new_tokens):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new_tokens,
                             eos_token_id=None, pad_token_id=0, attention_mask=None)
    return out[0].tolist()


class _FedIds:
    """Records every input_ids tensor the model's embedding receives."""

    def __init__(self, model) -> None:
        self.calls: list[torch.Tensor] = []
        self.handle = model.get_input_embeddings().register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.calls.append(args[0].detach().clone())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


# --------------------------------------------------------------------------- vocabulary


# A tree with out-of-vocabulary nodes (vocab 96):
#
#   root ─┬─ 0: 10 ── 1: 200 ── 2: 11      node 1 is out of vocabulary: 1 and 2 go
#         ├─ 3: 500                        node 3 out of vocabulary
#         └─ 4: 12 ─┬─ 5: 13               kept: 0, 4, 5, 6
#                   └─ 6: 14
OOV_TREE = DraftTree(np.array([10, 200, 11, 500, 12, 13, 14], dtype=np.int32),
                     np.array([-1, 0, 1, -1, -1, 4, 4], dtype=np.int32),
                     np.linspace(1.0, 0.4, 7).astype(np.float32), np.zeros(7, dtype=np.int32), ("context",))


def test_out_of_vocabulary_nodes_are_dropped_with_their_subtrees():
    tree = drop_out_of_vocab(OOV_TREE, VOCAB)
    assert tree.token_ids.tolist() == [10, 12, 13, 14]
    assert tree.parents.tolist() == [-1, -1, 1, 1]
    assert np.allclose(tree.scores, OOV_TREE.scores[[0, 4, 5, 6]])
    assert len(drop_out_of_vocab(OOV_TREE, 10)) == 0


def test_an_index_over_a_larger_vocabulary_never_feeds_an_unknown_token_to_the_model(model):
    # The index continues each prompt with ids >= the model's vocabulary (96): drafts would hold them.
    prompts = repetitive_prompts(6, seed=21)
    docs = [np.asarray(p[1:] + [150, 151, 152] + p[1:] + [VOCAB + 7] * 5, dtype=np.int32) for p in prompts]
    index = CorpusIndex.build(docs, vocab_size=4 * VOCAB, show_progress=False)
    assert index.vocab_size > model.config.vocab_size
    from refdec.proposer import Proposer

    # backoff=0: the context's shorter matches would otherwise outrank the index's drafts
    decoder = refdec.SpeculativeDecoder(
        model, index=index, proposer_factory=lambda index, references, max_depth: Proposer(
            index=index, references=references, max_depth=max_depth, backoff=0))
    for prompt in prompts:
        with _FedIds(model) as fed:
            out = decoder.generate(prompt, max_new_tokens=16, eos_token_id=[], max_draft_tokens=32)
        assert out.sequences[0].tolist() == _hf_greedy(model, prompt, 16)
        assert max(int(ids.max()) for ids in fed.calls) < VOCAB
    # the drafts really did hold such ids before the filter
    proposer = Proposer(index=index, backoff=0)
    proposer.start(np.asarray(prompts[0] + prompts[0][1:], dtype=np.int32))
    assert int(proposer.propose(32).token_ids.max()) >= VOCAB


def test_negative_draft_ids_from_a_corrupt_index_never_reach_the_model(model, tmp_path):
    """An index whose body is corrupt loads (loading checks the structure, ``verify()`` the
    checksum) and can draft negative token ids; they are dropped like ids past the vocabulary
    (they used to reach the embedding: IndexError on a CPU, a device assert on CUDA)."""
    import struct

    from refdec.proposer import Proposer

    prompt = repetitive_prompts(1, seed=23)[0]
    doc = prompt[1:] + list(range(20, 60))
    path = tmp_path / "corrupt.refdec"
    CorpusIndex.build([doc], vocab_size=VOCAB, show_progress=False).save(path)
    data = bytearray(path.read_bytes())
    sections = 8 + 4 + 4 + 64 + 4 + 4 + 8 * 6  # header: magic, version, size, fingerprint, vocab, 6 x u64
    tokens_offset, _ = struct.unpack_from("<QQ", data, sections)  # section 0: the tokens
    for token_pos in range(len(prompt) - 1, len(doc)):  # everything after the prompt's copy
        struct.pack_into("<i", data, tokens_offset + 4 * token_pos, -3)
    path.write_bytes(bytes(data))
    index = CorpusIndex.load(path)
    assert not index.verify()
    proposer = Proposer(index=index, backoff=0)
    proposer.start(np.asarray(prompt, dtype=np.int32))
    assert int(proposer.propose(16).token_ids.min()) < 0  # the drafts do hold them
    with _FedIds(model) as fed:
        out = refdec.SpeculativeDecoder(model, index=index).generate(prompt, max_new_tokens=16, eos_token_id=[],
                                                                      max_draft_tokens=16)
    assert out.sequences[0].tolist() == _hf_greedy(model, prompt, 16)
    assert min(int(ids.min()) for ids in fed.calls) >= 0


def test_references_with_unknown_token_ids_only_draft(model):
    prompt = repetitive_prompts(1, seed=22)[0]
    reference = [5000, 6000] + prompt[1:] + [VOCAB, VOCAB + 1, 2**30]
    with _FedIds(model) as fed:
        out = refdec.SpeculativeDecoder(model).generate(prompt, references=[reference], max_new_tokens=12,
                                                          eos_token_id=[], max_draft_tokens=16)
    assert out.sequences[0].tolist() == _hf_greedy(model, prompt, 12)
    assert max(int(ids.max()) for ids in fed.calls) < VOCAB


# --------------------------------------------------------------------------- the model's window


@pytest.mark.parametrize("builder", [tiny_llama, tiny_gemma3], ids=["llama", "gemma3-window8"])
def test_references_longer_than_the_window_only_draft_and_are_never_fed(builder):
    model = builder(seed=5)
    window = model.config.max_position_embeddings  # 512
    prompt = repetitive_prompts(1, seed=23)[0]
    want = _hf_greedy(model, prompt, 24)
    rng = np.random.default_rng(0)
    # 3 x window tokens: noise around the true continuation, so drafts from it are accepted
    reference = rng.integers(3, VOCAB, size=3 * window).tolist()
    reference[window: window + len(want)] = want
    with _FedIds(model) as fed:
        out = refdec.SpeculativeDecoder(model).generate(prompt, references=[reference], max_new_tokens=24,
                                                          eos_token_id=[], max_draft_tokens=16)
    assert out.sequences[0].tolist() == want
    assert out.stats.accepted_by_source.get("reference", 0) > 0
    assert fed.calls[0][0].tolist() == prompt  # the prefill is the prompt alone
    assert all(ids.shape[-1] <= 1 + 16 for ids in fed.calls[1:])  # then root + at most 16 draft nodes
    assert sum(ids.shape[-1] for ids in fed.calls) < window


def test_a_prompt_longer_than_the_window_is_a_clear_error(model):
    window = model.config.max_position_embeddings
    decoder = refdec.SpeculativeDecoder(model)
    with pytest.raises(ValueError, match=rf"{window + 1} tokens.*max_position_embeddings={window}"):
        decoder.generate([3] * (window + 1), max_new_tokens=4)
    # at the window exactly: one token is emitted (it is never fed back), stop reason says why
    out = decoder.generate([3] * window, max_new_tokens=4, eos_token_id=[])
    assert out.stats.new_tokens == 1 and out.stats.stop_reason == "max_position_embeddings"


# --------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("bad", [-1, -64, 1.5, 8.0, "many", "", None, True, [4], object()])
def test_bad_max_draft_tokens_is_a_value_error_naming_it(model, bad):
    with pytest.raises(ValueError, match="max_draft_tokens"):
        refdec.SpeculativeDecoder(model).generate([1, 5, 6, 5, 6], max_new_tokens=3, max_draft_tokens=bad)


# --------------------------------------------------------------------------- streamer errors


class _FailingStreamer:
    def __init__(self, fail_at: int, in_end: bool = False) -> None:
        self.puts = 0
        self.fail_at, self.in_end = fail_at, in_end

    def put(self, value) -> None:
        self.puts += 1
        if not self.in_end and self.puts == self.fail_at:
            raise RuntimeError("streamer broke")

    def end(self) -> None:
        if self.in_end:
            raise RuntimeError("streamer broke at end")


@pytest.mark.parametrize("max_draft", ["auto", 16])
@pytest.mark.parametrize("fail", [(1, False), (2, False), (4, False), (0, True)], ids=["prompt", "first", "mid", "end"])
def test_a_raising_streamer_propagates_and_leaves_the_decoder_usable(model, max_draft, fail):
    prompts = repetitive_prompts(3, seed=24)
    decoder = refdec.SpeculativeDecoder(model)
    with pytest.raises(RuntimeError, match="streamer broke"):
        decoder.generate(prompts[0], max_new_tokens=20, eos_token_id=[], max_draft_tokens=max_draft,
                         streamer=_FailingStreamer(*fail))
    for prompt in prompts:  # the same decoder, the same and other prompts
        out = decoder.generate(prompt, max_new_tokens=20, eos_token_id=[], max_draft_tokens=max_draft)
        assert out.sequences[0].tolist() == _hf_greedy(model, prompt, 20)


# --------------------------------------------------------------------------- long use


def test_hundreds_of_generate_calls_on_one_decoder_do_not_grow_memory():
    from benchmarks import long_run

    decoder, prompts = long_run.make_setup(seed=1)
    long_run.run_calls(decoder, prompts, 0, 60)  # warm-up: allocator pools, lazy imports, calibration
    gc.collect()
    rss_warm = long_run.rss_bytes()
    tracemalloc.start()
    try:
        heap_warm = tracemalloc.get_traced_memory()[0]
        long_run.run_calls(decoder, prompts, 60, 300)
        gc.collect()
        heap_growth = tracemalloc.get_traced_memory()[0] - heap_warm
    finally:
        tracemalloc.stop()
    rss_growth = long_run.rss_bytes() - rss_warm
    # measured: ~0.4 MiB RSS, ~90 KiB Python heap over 300 calls (noise; 10,000 calls: benchmarks/long_run.py)
    assert rss_growth < 24 * 2**20, rss_growth
    assert heap_growth < 2 * 2**20, heap_growth
