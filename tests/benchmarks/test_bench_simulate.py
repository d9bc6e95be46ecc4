"""benchmarks.simulate: the simulator's replay accounting and its baseline drafters
(benchmarks.baselines), on tiny synthetic cases (no data, no model)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import baselines, simulate, workloads
import refdec
from refdec import DraftTree


class TruthProposer:
    """Always proposes the next ``max_nodes`` true tokens as one chain."""

    def __init__(self, truth):
        self.truth = np.asarray(truth, dtype=np.int32)
        self.pos = 0

    def start(self, prompt_ids):
        self.pos = 0

    def propose(self, max_nodes):
        return DraftTree.chain(self.truth[self.pos:self.pos + max_nodes])

    def accept(self, tokens):
        assert np.array_equal(tokens, self.truth[self.pos:self.pos + len(tokens)])
        self.pos += len(tokens)


class SilentProposer:
    def start(self, prompt_ids):
        pass

    def propose(self, max_nodes):
        return DraftTree.empty()

    def accept(self, tokens):
        pass


class OverBudgetProposer(SilentProposer):
    def propose(self, max_nodes):
        return DraftTree.chain(np.zeros(max_nodes + 1, dtype=np.int32))


# ---------------------------------------------------------------- accounting

@pytest.mark.parametrize("budget", [1, 3, 8])
def test_truthful_proposer_advances_budget_plus_one_per_step(budget):
    truth = np.arange(100, 125, dtype=np.int32)  # 25 tokens
    rec = simulate.replay(TruthProposer(truth), np.array([1, 2], dtype=np.int32), truth, budget)
    pos = 0
    for acc, adv in zip(rec.accepted, rec.advanced):
        remaining = len(truth) - pos
        assert acc == min(budget, remaining)
        assert adv == min(budget + 1, remaining)
        pos += adv
    assert pos == len(truth)
    assert rec.steps == -(-len(truth) // (budget + 1))


def test_empty_proposals_advance_exactly_one_token_per_step():
    truth = np.arange(17, dtype=np.int32)
    rec = simulate.replay(SilentProposer(), np.array([5], dtype=np.int32), truth, 16)
    assert rec.steps == 17 and set(rec.advanced) == {1} and set(rec.accepted) == {0}


def test_proposal_over_the_budget_is_an_error():
    with pytest.raises(ValueError, match="over the budget"):
        simulate.replay(OverBudgetProposer(), np.array([5], dtype=np.int32), np.arange(4, dtype=np.int32), 4)


# A tree with two branches; truth continues 7 8 9 4:
#
#   root ─ 7 (0) ─ 8 (1) ─ 5 (2)
#            └──── 8 (3) ─ 9 (4) ─ 4 (5)      <- second "8" branch goes deeper
#   root ─ 6 (6) ─ 8 (7) ─ 9 (8) ─ 4 (9)      <- wrong first token: never counts
TREE_TOKENS = [7, 8, 5, 8, 9, 4, 6, 8, 9, 4]
TREE_PARENTS = [-1, 0, 1, 0, 3, 4, -1, 6, 7, 8]


def test_accepted_length_follows_the_deepest_matching_root_path():
    tree = DraftTree(np.array(TREE_TOKENS), np.array(TREE_PARENTS), np.ones(10))
    assert simulate.accepted_length(tree, [7, 8, 9, 4, 1], 0) == 4
    assert simulate.accepted_length(tree, [0, 7, 8, 9], 1) == 3  # capped by the remaining truth
    assert simulate.accepted_length(tree, [8, 9, 4], 0) == 0  # no root child matches
    assert simulate.accepted_length(DraftTree.empty(), [1, 2], 0) == 0


def test_summary_tokens_per_step_is_pooled_over_cases():
    truth_a, truth_b = np.arange(10, dtype=np.int32), np.arange(5, dtype=np.int32)
    reps = [simulate.replay(SilentProposer(), np.array([1], dtype=np.int32), t, 4) for t in (truth_a, truth_b)]
    s = simulate.summarize(reps)
    assert s["output_tokens"] == 15 and s["steps"] == 15 and s["tokens_per_step"] == 1.0


# ---------------------------------------------------------------- prompt lookup

def test_prompt_lookup_continues_after_an_earlier_3gram():
    pl = baselines.PromptLookup(max_ngram=3)
    pl.start(np.array([1, 2, 3, 4, 5, 6, 9, 1, 2, 3], dtype=np.int32))
    assert pl.propose(3).token_ids.tolist() == [4, 5, 6]


def test_prompt_lookup_falls_back_to_the_2gram_when_the_3gram_is_new():
    pl = baselines.PromptLookup(max_ngram=3)
    # trailing 3-gram (7, 2, 3) never occurred before, the 2-gram (2, 3) did
    pl.start(np.array([1, 2, 3, 4, 5, 7, 2, 3], dtype=np.int32))
    assert pl.propose(2).token_ids.tolist() == [4, 5]


def test_prompt_lookup_last_occurrence_vs_hf_first_occurrence():
    seq = np.array([1, 2, 10, 11, 1, 2, 20, 21, 1, 2], dtype=np.int32)
    last = baselines.PromptLookup(max_ngram=2, occurrence="last")
    first = baselines.PromptLookup(max_ngram=2, occurrence="first")
    last.start(seq)
    first.start(seq)
    assert last.propose(2).token_ids.tolist() == [20, 21]
    assert first.propose(2).token_ids.tolist() == [10, 11]


def test_prompt_lookup_chain_stops_at_the_end_of_the_sequence():
    pl = baselines.PromptLookup(max_ngram=1)
    pl.start(np.array([3, 3], dtype=np.int32))
    assert pl.propose(8).token_ids.tolist() == [3]


def test_prompt_lookup_sees_accepted_tokens():
    pl = baselines.PromptLookup(max_ngram=3)
    pl.start(np.array([1], dtype=np.int32))
    assert len(pl.propose(4)) == 0
    pl.accept(np.array([2, 3, 4, 1, 2], dtype=np.int32))
    assert pl.propose(4).token_ids.tolist() == [3, 4, 1, 2]


def _hf_prompt_lookup(seq, k, max_ngram):
    """transformers' PromptLookupCandidateGenerator.get_candidates, restated."""
    n_in = len(seq)
    for n in range(min(max_ngram, n_in - 1), 0, -1):
        tail = seq[n_in - n:]
        for idx in range(n_in - n + 1):
            if seq[idx:idx + n] == tail:
                start, end = idx + n, min(idx + n + k, n_in)
                if start < end:
                    return seq[start:end]
    return []


def test_hf_prompt_lookup_matches_transformers_semantics_on_random_sequences():
    rng = np.random.default_rng(0)
    for _ in range(200):
        seq = rng.integers(0, 4, size=int(rng.integers(2, 40))).tolist()
        pl = baselines.PromptLookup(max_ngram=2, occurrence="first")
        pl.start(np.array(seq[:5], dtype=np.int32))
        pl.accept(np.array(seq[5:], dtype=np.int32))
        assert pl.lookup(6) == _hf_prompt_lookup(seq, 6, 2)


# ---------------------------------------------------------------- oracle

def _oracle_brute_force(seq, truth, k):
    best = 0
    for n in range(1, min(k, len(truth)) + 1):
        if any(seq[j:j + n] == truth[:n] for j in range(len(seq) - n + 1)):
            best = n
    return best


def test_oracle_is_the_longest_copied_run_brute_force():
    rng = np.random.default_rng(1)
    for _ in range(200):
        prompt = rng.integers(0, 5, size=int(rng.integers(1, 30)))
        truth = rng.integers(0, 5, size=int(rng.integers(1, 20)))
        oracle = baselines.OracleChain(truth)
        oracle.start(prompt)
        cut = int(rng.integers(0, len(truth)))
        oracle.accept(truth[:cut])
        k = int(rng.integers(1, 10))
        seq = prompt.tolist() + truth[:cut].tolist()
        assert oracle.match_length(k)[0] == _oracle_brute_force(seq, truth[cut:].tolist(), k)


@pytest.mark.parametrize("budget", [1, 4, 16])
def test_oracle_chain_is_at_least_prompt_lookup_on_random_cases(budget):
    rng = np.random.default_rng(budget)
    for _ in range(30):
        prompt = rng.integers(0, 6, size=60).astype(np.int32)
        # outputs that copy spans of the prompt with noise in between
        parts = []
        while sum(map(len, parts)) < 50:
            s = int(rng.integers(0, 50))
            parts.append(prompt[s:s + int(rng.integers(1, 12))])
            parts.append(rng.integers(0, 6, size=int(rng.integers(0, 3))).astype(np.int32))
        truth = np.concatenate(parts)
        pl = simulate.replay(baselines.PromptLookup(), prompt, truth, budget)
        oc = simulate.replay(baselines.OracleChain(truth), prompt, truth, budget)
        # reach(p) = p + oracle run at p never decreases with p (a copied run
        # minus its first token is still a copied run), and from any position no
        # copy-based chain reaches further: so the oracle never takes more steps
        assert oc.steps <= pl.steps


def test_oracle_rejects_tokens_off_the_true_continuation():
    oracle = baselines.OracleChain(np.array([1, 2, 3]))
    oracle.start(np.array([1, 2, 3]))
    with pytest.raises(ValueError):
        oracle.accept(np.array([2]))


# ---------------------------------------------------------------- refdec through the harness

def test_refdec_proposer_copies_an_output_that_sits_in_the_prompt():
    rng = np.random.default_rng(7)
    prompt = rng.integers(0, 1000, size=300).astype(np.int32)
    truth = prompt[100:200].copy()
    rec = simulate.replay(refdec.Proposer(), prompt, truth, 8)
    # the first step has a 1-token match at best; then every step copies 8 + 1
    assert rec.steps <= 2 + -(-len(truth) // 9)


def test_cursor_lookup_prefers_the_occurrence_near_the_cursor():
    # "7 8" occurs three times in the prompt; after copying 1..6 the cursor sits
    # right before the second "7 8", so that is the one continued (30 31: not the
    # first, 20 21, nor the last, 40 41)
    prompt = np.array([7, 8, 20, 21, 0, 1, 2, 3, 4, 5, 6, 7, 8, 30, 31, 9, 7, 8, 40, 41], dtype=np.int32)
    cl = baselines.CursorLookup(ngrams=(1, 2))
    cl.start(prompt)
    cl.accept(np.array([1], dtype=np.int32))
    cl.propose(5)  # chain 2 3 4 5 6
    cl.accept(np.array([2, 3, 4, 5, 6, 7], dtype=np.int32))
    cl.propose(1)
    cl.accept(np.array([8], dtype=np.int32))
    assert cl.propose(2).token_ids.tolist() == [30, 31]


def test_anchored_oracle_copies_only_after_the_current_last_token():
    # 5 6 7 8 occurs after a 1, the context ends in 2: anchor=1 finds nothing
    truth = np.array([5, 6, 7, 8])
    free, anchored = baselines.OracleChain(truth), baselines.OracleChain(truth, anchor=1)
    for o in (free, anchored):
        o.start(np.array([1, 5, 6, 7, 8, 3, 2]))
    assert free.match_length(8)[0] == 4 and anchored.match_length(8)[0] == 0
    anchored.start(np.array([1, 5, 6, 7, 8, 3, 2, 5, 6, 9, 1]))
    assert anchored.match_length(8)[0] == 4


class FakeReader:
    """Stands in for draftretriever.Reader: fixed paths padded with -2."""

    def __init__(self, paths):
        self.paths = paths

    def search(self, tokens, choices=None):
        return self.paths, None, None, None, None


def test_draftretriever_paths_merge_into_one_trie_within_the_budget():
    # paths 5 6 7 / 5 6 -2 / 8 9 -2  ->  5 ─ 6 ─ 7,  8 ─ 9   (5 nodes)
    paths = [[5, 6, 7], [5, 6, -2], [8, 9, -2]]
    prop = baselines.DraftRetrieverProposer(FakeReader(paths))
    prop.start(np.array([1, 2], dtype=np.int32))
    tree = prop.propose(8)
    assert tree.token_ids.tolist() == [5, 6, 7, 8, 9]
    assert tree.parents.tolist() == [-1, 0, 1, -1, 3]
    assert len(prop.propose(4)) == 4


# ---------------------------------------------------------------- ceiling hybrids

def test_reference_offsets_lists_every_occurrence_relative_to_the_anchor():
    reference = [5, 6, 7, 1, 5, 6, 9, 5, 6]
    assert simulate._reference_offsets(reference, [5, 6], anchor=4) == [-4, 0, 3]
    assert simulate._reference_offsets(reference, [6, 7], anchor=0) == [1]
    assert simulate._reference_offsets(reference, [8], anchor=0) == []
    assert simulate._reference_offsets(reference, [], anchor=0) == []


def _synthetic_edit_cases(n_cases: int = 3) -> list:
    rng = np.random.default_rng(3)
    cases = []
    for _ in range(n_cases):
        reference = rng.integers(10, 60, size=300).astype(np.int32)
        # an edit: a deletion, an insertion of new text, and a block moved from behind
        output = np.concatenate([reference[:80], reference[100:150], rng.integers(60, 90, size=12),
                                 reference[20:60], reference[150:]]).astype(np.int32)
        prompt = np.concatenate([[1], reference, [2, 3]]).astype(np.int32)
        cases.append(workloads.Case(prompt=prompt, references=[reference], output=output, name="synthetic"))
    return cases


def test_diagnose_replays_refdec_as_the_decoder_runs_it():
    # With references the decoder turns the copy cursor on: the diagnosis must replay the same
    # trajectory (it once replayed suffix drafting alone, blaming the cursor-less proposer's losses).
    cases = _synthetic_edit_cases()
    budget = 16
    got = simulate.diagnose_cases(cases, budget)
    replays = [simulate.replay(refdec.Proposer(references=list(c.references), max_depth=64, cursor=True),
                               c.prompt, c.output, budget) for c in cases]
    without_cursor = [simulate.replay(refdec.Proposer(references=list(c.references), max_depth=64),
                                      c.prompt, c.output, budget) for c in cases]
    assert got["steps"] == sum(len(r.advanced) for r in replays)
    assert got["steps"] != sum(len(r.advanced) for r in without_cursor)  # the cursor changes the trajectory
    assert got["tokens"] == sum(len(c.output) for c in cases)
    assert sum(got["loss_steps"].values()) <= got["steps"]


def test_ceiling_hybrids_reproduce_refdec_alone_and_the_oracle_chain():
    cases = _synthetic_edit_cases()
    budget = 16
    got = simulate.ceiling_cases(cases, budget)

    def pooled(make):
        replays = [simulate.replay(make(c), c.prompt, c.output, budget) for c in cases]
        return simulate.summarize(replays)["tokens_per_step"]

    alone = pooled(lambda c: refdec.Proposer(references=list(c.references), max_depth=64, cursor=True))
    oracle = pooled(lambda c: baselines.OracleChain(c.output))
    assert got["refdec alone"] == pytest.approx(alone)
    assert got["oracle wherever it copies more"] == pytest.approx(oracle)
    assert oracle > alone  # the synthetic edits leave refdec a gap to close
    assert set(got) == set(simulate.CEILING_RULES) | set(simulate.CEILING_WIDE_RULES) | set(
        simulate.CEILING_CURSOR_RULES)
    cursor_pick = got[next(iter(simulate.CEILING_CURSOR_RULES))]
    assert alone <= cursor_pick <= oracle


def test_longest_candidate_copy_takes_the_best_start_and_stops_at_the_budget():
    reference = [5, 6, 7, 8, 5, 6, 9]
    truth = [0, 5, 6, 7, 8, 1]
    assert simulate._longest_candidate_copy(reference, [4, 0], truth, 1, budget=16) == 4
    assert simulate._longest_candidate_copy(reference, [4, 0], truth, 1, budget=3) == 3
    assert simulate._longest_candidate_copy(reference, [4], truth, 1, budget=16) == 2
    assert simulate._longest_candidate_copy(reference, [], truth, 1, budget=16) == 0


def test_refdec_method_options_pass_integers_and_floats_to_the_proposer():
    case = workloads.Case(prompt=np.array([1, 2, 3], dtype=np.int32), output=np.array([4], dtype=np.int32),
                          references=[np.array([7, 8], dtype=np.int32)], name="c")
    wl = workloads.Workload("w", [case])
    proposer = simulate.method_factory("refdec:cursor=1:backoff=0:loop_decay=0.7", wl)(case)
    assert proposer.backoff == 0 and isinstance(proposer.backoff, int)
    assert proposer.loop_decay == pytest.approx(0.7)
    assert proposer.cursor is not None
    assert simulate.method_factory("refdec:cursor=1", wl)(case).loop_decay == 1.0  # editing mode's default
