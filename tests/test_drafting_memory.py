"""refdec.drafting.memory (OutputMemory): past outputs draft for later requests, within a byte budget, per tenant."""

from __future__ import annotations

import numpy as np
import pytest

import refdec
from refdec.drafting.memory import OutputMemory, automaton_bytes
from refdec.drafting.proposer import Proposer
from tests.tiny_models import errors_in_threads, hf_greedy


def tokens(*values) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def test_a_continuation_seen_only_in_an_earlier_output_is_drafted():
    memory = OutputMemory()
    memory.add(tokens(5, 6, 7, 8, 9, 10, 11, 12))
    proposer = Proposer(memory=memory.automata())
    proposer.start(tokens(40, 41, 5, 6, 7))  # the prompt ends as the output went on
    tree = proposer.propose(8)
    assert tree.token_ids[:5].tolist() == [8, 9, 10, 11, 12]
    assert {tree.source_names[s] for s in tree.source_ids[:5]} == {"memory"}
    # without the memory nothing in the prompt continues 5 6 7 with 8
    bare = Proposer()
    bare.start(tokens(40, 41, 5, 6, 7))
    assert 8 not in bare.propose(8).token_ids.tolist()


def test_tenants_never_draft_from_each_others_outputs():
    memory = OutputMemory()
    memory.add(tokens(5, 6, 7, 8, 9, 10), tenant="alice")
    assert memory.automata("bob") == ()
    assert len(memory.automata("alice")) == 1
    proposer = Proposer(memory=memory.automata("bob"))
    proposer.start(tokens(5, 6, 7))
    assert 8 not in proposer.propose(8).token_ids.tolist()
    memory.clear("alice")
    assert memory.automata("alice") == () and memory.nbytes == 0


def test_a_snapshot_does_not_change_when_outputs_are_added():
    memory = OutputMemory(segment_tokens=64)
    memory.add(tokens(1, 2, 3, 4, 5))
    snapshot = memory.automata()
    before = [sam.num_tokens for sam in snapshot]
    for i in range(40):
        memory.add(tokens(*range(10 + i, 20 + i)))
    assert [sam.num_tokens for sam in snapshot] == before
    assert sum(sam.num_tokens for sam in memory.automata()) > sum(before)


@pytest.mark.parametrize("seed", range(6))
def test_the_byte_budget_holds_under_any_stream_of_outputs(seed):
    rng = np.random.default_rng(seed)
    budget = int(rng.integers(2_000, 200_000))
    memory = OutputMemory(budget, segment_tokens=int(rng.integers(16, 3_000)), min_tokens=1)
    kept_last = []
    for step in range(300):
        tenant = int(rng.integers(0, 4))
        out = rng.integers(0, 1_000, int(rng.integers(1, 1_500))).astype(np.int32)
        memory.add(out, tenant=tenant)
        assert memory.nbytes <= budget
        held = sum(automaton_bytes(sam) for t in range(4) for sam in memory.automata(t))
        assert held == memory.nbytes  # the count is the automata's, not a drifting tally
        kept_last.append((tenant, out))
    # the newest output that fits is always kept whole or by its end (oldest first eviction)
    tenant, out = kept_last[-1]
    sams = memory.automata(tenant)
    if sams:
        tail = out[-min(len(out), memory.segment_tokens):]
        assert sams[-1].match_length(tail[-8:]) == min(8, len(tail))


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="max_bytes"):
        OutputMemory(-1)
    with pytest.raises(ValueError, match="segment_tokens"):
        OutputMemory(segment_tokens=0)
    with pytest.raises(ValueError, match="memory must be a tuple"):
        Proposer(memory=[1, 2])
    with pytest.raises(ValueError, match="memory must be a refdec.OutputMemory"):
        refdec.SpeculativeDecoder(None, memory={})


def test_adds_and_snapshots_from_many_threads():
    memory = OutputMemory(300_000, segment_tokens=500, min_tokens=1)

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(150):
            memory.add(rng.integers(0, 300, int(rng.integers(1, 400))).astype(np.int32), tenant=seed % 3)
            proposer = Proposer(memory=memory.automata(seed % 3))
            proposer.start(rng.integers(0, 300, 20).astype(np.int32))
            proposer.propose(16)
            assert memory.nbytes <= 300_000

    assert not errors_in_threads(work)


def test_a_decoder_remembers_its_outputs_and_drafts_them_with_the_same_tokens(llama):
    prompt = [3, 17, 42, 8, 9, 23, 61, 5]
    expected = hf_greedy(llama, prompt, max_new_tokens=40)
    memory = OutputMemory()
    decoder = refdec.SpeculativeDecoder(llama, memory=memory)
    first = decoder.generate(np.asarray([prompt]), max_new_tokens=40, max_draft_tokens=16)
    assert first.sequences[0].tolist() == expected
    assert sum(sam.num_tokens for sam in memory.automata()) == 40
    second = decoder.generate(np.asarray([prompt]), max_new_tokens=40, max_draft_tokens=16)
    assert second.sequences[0].tolist() == expected
    assert second.stats.accepted_by_source.get("memory", 0) > first.stats.accepted_by_source.get("memory", 0)
    assert second.stats.forward_passes < first.stats.forward_passes


def test_a_factory_without_memory_is_refused_when_memory_is_given(llama):
    with pytest.raises(ValueError, match="proposer_factory must take a memory="):
        refdec.SpeculativeDecoder(llama, memory=OutputMemory(),
                                  proposer_factory=lambda index, refs, depth: Proposer(index, refs))


def test_a_small_budget_stays_mostly_filled_as_segments_are_sealed_and_evicted():
    """Eviction drops whole sealed segments; a segment is sealed at an eighth of the budget, so a
    budget about one ``segment_tokens`` automaton large keeps most of its bytes (sealed by tokens
    alone, a seal then an eviction left it under 40% full)."""
    rng = np.random.default_rng(3)
    memory = OutputMemory(60_000, segment_tokens=400, min_tokens=1)  # 400 tokens: an automaton of ~60 kB
    filled = []
    for _ in range(200):
        memory.add(rng.integers(0, 1_000, 60).astype(np.int32))
        assert memory.nbytes <= 60_000
        filled.append(memory.nbytes)
    assert memory.evicted_outputs > 100
    assert min(filled[100:]) > 0.6 * 60_000
