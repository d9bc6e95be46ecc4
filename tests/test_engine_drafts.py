"""Specifies where drafts come from and what of them reaches the model (refdec.engine.drafts and
the engine): references, text references and a corpus index drive long accepted runs with the
output still exactly ``model.generate``'s; draft nodes holding ids outside the model's
vocabulary (negative or too large) are dropped with their subtrees; references only draft, never
feed the model, so they may be longer than its window.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import refdec
from refdec.drafting.index import CorpusIndex
from refdec.drafting.proposer import Proposer
from refdec.drafting.tree import DraftTree
from refdec.engine.drafts import drop_out_of_vocab
from tiny_models import (FAMILIES, VOCAB, cached_model, hf_greedy, lookup_factory, repetitive_prompts, tiers,
                         tiny_gemma3, tiny_llama)

NEW = 40


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=4)


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
    from refdec.drafting.proposer import Proposer

    # backoff=0: the context's shorter matches would otherwise outrank the index's drafts
    decoder = refdec.SpeculativeDecoder(
        model, index=index, proposer_factory=lambda index, references, max_depth: Proposer(
            index=index, references=references, max_depth=max_depth, backoff=0))
    for prompt in prompts:
        with _FedIds(model) as fed:
            out = decoder.generate(prompt, max_new_tokens=16, eos_token_id=[], max_draft_tokens=32)
        assert out.sequences[0].tolist() == hf_greedy(model, prompt, 16)
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

    from refdec.drafting.proposer import Proposer

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
    assert out.sequences[0].tolist() == hf_greedy(model, prompt, 16)
    assert min(int(ids.min()) for ids in fed.calls) >= 0


def test_references_with_unknown_token_ids_only_draft(model):
    prompt = repetitive_prompts(1, seed=22)[0]
    reference = [5000, 6000] + prompt[1:] + [VOCAB, VOCAB + 1, 2**30]
    with _FedIds(model) as fed:
        out = refdec.SpeculativeDecoder(model).generate(prompt, references=[reference], max_new_tokens=12,
                                                          eos_token_id=[], max_draft_tokens=16)
    assert out.sequences[0].tolist() == hf_greedy(model, prompt, 12)
    assert max(int(ids.max()) for ids in fed.calls) < VOCAB


@pytest.mark.parametrize("builder", [tiny_llama, tiny_gemma3], ids=["llama", "gemma3-window8"])
def test_references_longer_than_the_window_only_draft_and_are_never_fed(builder):
    model = builder(seed=5)
    window = model.config.max_position_embeddings  # 512
    prompt = repetitive_prompts(1, seed=23)[0]
    want = hf_greedy(model, prompt, 24)
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


@pytest.mark.parametrize("family, kind", tiers([(family, kind) for family in FAMILIES for kind in ("cxx", "tree")],
                                               fast=[("llama", "cxx"), ("llama", "tree")]))
def test_references_holding_the_continuation_are_accepted_in_long_runs(tiny_model_cache, family, kind):
    """A reference that contains the true greedy continuation (a few tokens corrupted) gives long
    accepted runs from the reference source; the output is still exactly generate's."""
    model = cached_model(tiny_model_cache, family)
    for prompt in repetitive_prompts(4, seed=8):
        want = hf_greedy(model, prompt)
        reference = want[len(prompt) - 3:]  # the last prompt tokens, then the continuation
        for j in range(15, len(reference), 16):
            reference[j] = (reference[j] + 1) % 96
        out = refdec.generate(model, prompt, references=[reference], max_new_tokens=NEW, eos_token_id=[],
                                max_draft_tokens=64, proposer_factory=None if kind == "cxx" else lookup_factory(kind))
        assert out.sequences[0].tolist() == want
        assert out.stats.tokens_per_pass > 2.0
        assert out.stats.accepted_by_source.get("reference", 0) > 10
        assert out.stats.proposed_tokens > out.stats.accepted_tokens


def test_drafts_from_a_corpus_index_built_from_token_lists(family_model):
    """A CorpusIndex over (corrupted) greedy outputs of some prompts drives drafts for them."""
    name, model = family_model
    prompts = repetitive_prompts(6, seed=13)
    documents = []
    for prompt in prompts[:4]:
        doc = hf_greedy(model, prompt)[len(prompt) - 4:]
        for j in range(11, len(doc), 13):
            doc[j] = (doc[j] + 7) % 96
        documents.append(doc)
    index = CorpusIndex.build(documents, vocab_size=96, show_progress=False)
    decoder = refdec.SpeculativeDecoder(model, index=index)
    from_corpus = 0
    for prompt in prompts:
        out = decoder.generate(prompt, max_new_tokens=NEW, eos_token_id=[], max_draft_tokens=32)
        assert out.sequences[0].tolist() == hf_greedy(model, prompt)
        from_corpus += out.stats.accepted_by_source.get("corpus", 0)
    assert from_corpus > 20


def _editing_factory(index, references, max_depth):
    return Proposer(index=index, references=references or None, max_depth=max_depth, cursor=True)


@pytest.mark.parametrize("family", ["llama", pytest.param("gemma3", marks=pytest.mark.full)])
def test_greedy_with_an_edited_reference_equals_plain_greedy(family, tiny_model_cache):
    """The reference is the true greedy continuation with edits (a substitution,
    an insertion, a deletion): drafts are accepted in long runs and rejected at
    the edits, and the output is exactly model.generate's."""
    model = cached_model(tiny_model_cache, family)
    accepted = rejected = 0
    for prompt in repetitive_prompts(4, seed=21):
        want = hf_greedy(model, prompt, max_new_tokens=48)
        cont = want[len(prompt):]
        reference = cont[:10] + [(cont[10] + 1) % 96] + cont[11:20] + [5, 6, 7] + cont[20:30] + cont[33:]
        out = refdec.generate(model, prompt, references=[reference], max_new_tokens=48, eos_token_id=[],
                              max_draft_tokens=64, proposer_factory=_editing_factory)
        assert out.sequences[0].tolist() == want
        accepted += out.stats.accepted_tokens
        rejected += out.stats.proposed_tokens - out.stats.accepted_tokens
    assert accepted > 60 and rejected > 10, (accepted, rejected)
