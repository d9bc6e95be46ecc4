"""Specifies refdec.drafting.proposer's editing mode: the copy cursor re-synchronises drafts with the
original file.

Synthetic "files" are token lists. The true edited output is replayed through
the Proposer token by token, as the simulator does: propose, accept the
longest matching root path plus one bonus token.

    A0 BLK A1 BLK A2 BLK A3        three identical blocks BLK, distinct text Ai between

An edit inside the 2nd BLK must be followed by the rest of the 2nd BLK and A2,
not by A1 (after the 1st) or A3 (after the 3rd).
"""

from __future__ import annotations

import numpy as np
import pytest

from refdec import Proposer
from refdec.drafting.proposer import CursorParams

REFERENCE = 1


def arr(tokens):
    return np.asarray(tokens, dtype=np.int32)


def span(start, n):
    return list(range(start, start + n))


BLK = span(500, 30)
A = [span(100 + 100 * i, 40) for i in range(4)]
ORIGINAL = A[0] + BLK + A[1] + BLK + A[2] + BLK + A[3]
PROMPT = [1, 2, 3]  # the original is passed as a reference only


def main_line(tree):
    """Tokens of the path that always takes the best-scored child."""
    tokens, parents, scores = tree.token_ids.tolist(), tree.parents.tolist(), tree.scores.tolist()
    path, node = [], -1
    while True:
        kids = [i for i in range(len(tokens)) if parents[i] == node]
        if not kids:
            return path
        node = max(kids, key=lambda i: scores[i])
        path.append(tokens[node])


def accepted_length(tree, truth, pos):
    tokens, parents, depths = tree.token_ids.tolist(), tree.parents.tolist(), tree.depths.tolist()
    ok, best = {}, 0
    for i, (t, p, d) in enumerate(zip(tokens, parents, depths)):
        ok[i] = (p < 0 or ok[p]) and pos + d - 1 < len(truth) and t == truth[pos + d - 1]
        if ok[i]:
            best = max(best, d)
    return best


def replay(proposer, output, budget=64, stop_at=None):
    """Replays ``output``; returns (steps, list of accepted lengths). Stops before position stop_at."""
    proposer.start(arr(PROMPT))
    pos, accepted = 0, []
    while pos < len(output) and (stop_at is None or pos < stop_at):
        tree = proposer.propose(budget)
        acc = accepted_length(tree, output, pos)
        adv = min(acc + 1, len(output) - pos, (stop_at - pos) if stop_at is not None else len(output))
        proposer.accept(arr(output[pos:pos + adv]))
        accepted.append(acc)
        pos += adv
    return len(accepted), accepted


def feed(proposer, output):
    proposer.start(arr(PROMPT))
    proposer.accept(arr(output))


def editing(**kw):
    return Proposer(references=[arr(ORIGINAL)], max_depth=64, cursor=True, **kw)


# ---------------------------------------------------------------- right occurrence


def test_after_an_edit_inside_the_second_of_three_identical_blocks_the_draft_continues_the_second():
    # Output so far: ... A1, the first 10 tokens of the 2nd BLK, a replaced token 999, then BLK[11:15].
    second = len(A[0]) + len(BLK) + len(A[1])
    before = ORIGINAL[:second + 10] + [999] + BLK[11:15]
    for proposer in (editing(),):
        feed(proposer, before)
        line = main_line(proposer.propose(64))
        assert line[:len(BLK) - 15 + 5] == BLK[15:] + A[2][:5], line[:25]
        assert proposer.cursor_state()["align"] == second + 15


def test_without_the_cursor_the_same_situation_goes_to_the_first_block():
    # The plain suffix match "BLK[11:15]" occurs three times with equal
    # counts: the tie goes to the smallest token, A1 (the motivation for the
    # cursor, not a requirement on it).
    second = len(A[0]) + len(BLK) + len(A[1])
    before = ORIGINAL[:second + 10] + [999] + BLK[11:15]
    proposer = Proposer(references=[arr(ORIGINAL)], max_depth=64)
    feed(proposer, before)
    assert main_line(proposer.propose(64))[len(BLK) - 15] == A[1][0]


def test_a_unique_run_is_drafted_at_least_30_tokens_deep():
    proposer = editing()
    feed(proposer, ORIGINAL[:20])
    tree = proposer.propose(64)
    assert tree.depths.max() >= 30
    assert main_line(tree)[:30] == ORIGINAL[20:50]


# ---------------------------------------------------------------- edits

def test_insertion_the_draft_rejoins_where_the_copy_stopped():
    # 1000 1001 1002 inserted after A0[:25]: no suffix of the output matches the
    # original, the draft re-joins at the anchor (A0[25]).
    proposer = editing()
    feed(proposer, A[0][:25] + [1000, 1001, 1002])
    assert proposer.cursor_state()["anchor"] == 25
    # 20 deep: the diagonal and the unigram chains share the budget (survival
    # per source lets a re-join backed by no matched token go ~25 deep).
    assert main_line(proposer.propose(64))[:20] == ORIGINAL[25:45]


def test_one_token_substitution_the_draft_continues_on_the_diagonal():
    # A0[25] replaced by 1000: the original goes on at A0[26].
    proposer = editing()
    feed(proposer, A[0][:25] + [1000])
    line = main_line(proposer.propose(64))
    tree = proposer.propose(64)
    paths_first = set(tree.token_ids[tree.parents == -1].tolist())
    assert {A[0][25], A[0][26]} <= paths_first  # the insertion and the substitution readings
    assert line[:1] in ([A[0][25]], [A[0][26]])


def test_deletion_the_output_resynchronises_after_a_few_matching_tokens():
    # A1[5:25] deleted: the output jumps from A1[4] to A1[25]; once that token
    # is seen, the draft continues from A1[26].
    start = len(A[0]) + len(BLK)
    proposer = editing()
    feed(proposer, ORIGINAL[:start + 5] + [A[1][25]])
    assert main_line(proposer.propose(64))[:20] == ORIGINAL[start + 26:start + 46]


def test_moved_block_the_output_follows_the_moved_text_then_continues_at_the_anchor():
    # A2 moved before A1: A0 BLK A2 A1 BLK BLK A3 is not the point; we check
    # that copying A2 early (a jump backwards later) is still drafted once it matches.
    output = A[0] + BLK + A[2][:10]
    proposer = editing()
    feed(proposer, output)
    assert main_line(proposer.propose(64))[:20] == A[2][10:30]


def test_a_block_moved_from_far_down_the_file_is_followed_once_a_few_tokens_match():
    # Reference: A0, 600 tokens of other text, then BLOCK. The output writes
    # A0[:30] and then BLOCK's first 4 tokens (the block moved up). The jump is
    # 600+ tokens from the anchor, but the distance prior is heavy-tailed
    # (log-odds fall with log(1 + d / distance_scale), not with d): a 4-token
    # match outweighs it, and the cursor aligns inside BLOCK (a prior linear in
    # d, 2 * 4 - 600 / 32 < 0, kept the anchor).
    filler, block = span(2000, 600), span(3000, 40)
    reference = A[0] + filler + block
    proposer = Proposer(references=[arr(reference)], max_depth=64, cursor=True)
    proposer.start(arr(PROMPT))
    proposer.accept(arr(A[0][:30] + block[:4]))
    far = len(A[0]) + len(filler) + 4
    assert proposer.cursor_state()["align"] == far
    assert proposer.cursor_candidates()[0][0] == far
    assert main_line(proposer.propose(64))[:20] == block[4:24]


def test_replay_of_an_edited_file_needs_fewer_steps_with_the_cursor():
    second = len(A[0]) + len(BLK) + len(A[1])
    output = (ORIGINAL[:30] + [1000, 1001] + ORIGINAL[30:second + 10] + [999] + ORIGINAL[second + 11:]
              + [1002])
    steps_cursor, acc = replay(editing(), output)
    steps_plain, _ = replay(Proposer(references=[arr(ORIGINAL)], max_depth=64), output)
    assert steps_cursor < steps_plain
    assert max(acc) >= 40


@pytest.mark.parametrize("budget", [1, 4, 16, 64])
def test_the_tree_respects_the_budget_and_depth_with_the_cursor(budget):
    proposer = Proposer(references=[arr(ORIGINAL)], max_depth=12, cursor=True)
    feed(proposer, ORIGINAL[:50] + [1000])
    tree = proposer.propose(budget)
    assert 0 < len(tree) <= budget
    assert tree.depths.max() <= 12
    assert np.all(tree.parents < np.arange(len(tree)))


def test_cursor_params_are_passed_through_and_bad_ones_rejected():
    # confirm_run: an alignment of that many tokens becomes the anchor (start_run=0: the output's
    # first tokens are the only evidence of the alignment).
    for confirm_run, anchor in ((4, 5), (8, 0)):
        params = CursorParams(confirm_run=confirm_run, start_run=0)
        proposer = Proposer(references=[arr(ORIGINAL)], cursor=params)
        feed(proposer, ORIGINAL[:5])
        assert proposer.cursor_state() == {"align": 5, "run": 5, "anchor": anchor}
    with pytest.raises(ValueError, match="cursor"):
        Proposer(references=[arr(ORIGINAL)], cursor="yes")


FENCE = [900, 901]
EDIT_PROMPT = [1, 2] + FENCE + ORIGINAL + FENCE + [3, 4] + FENCE  # the file after a fence; ends with the fence


def test_the_first_step_drafts_the_top_of_the_reference_at_full_depth_in_an_edit_prompt():
    # An edit rewrites the file from its top: before any output the alignment is the
    # reference's first token (start_run aligned tokens of evidence), so the first tree is one
    # copy as deep as the budget, not a short chain beside root alternatives (the context
    # source offers its own continuations of the fence).
    truth = ORIGINAL[:64]
    start = Proposer(references=[arr(ORIGINAL)], max_depth=64, cursor=True)
    start.start(arr(EDIT_PROMPT))
    assert start.cursor_state() == {"align": 0, "run": 16, "anchor": 0}
    assert accepted_length(start.propose(64), truth, 0) == 64
    no_start = Proposer(references=[arr(ORIGINAL)], max_depth=64, cursor=CursorParams(start_run=0))
    no_start.start(arr(EDIT_PROMPT))
    assert no_start.cursor_state()["align"] == -1
    assert accepted_length(no_start.propose(64), truth, 0) < 64


@pytest.mark.parametrize("prompt", [PROMPT, [1, 2] + FENCE + ORIGINAL + FENCE + [3, 4], [5] + ORIGINAL + [6, 7]])
def test_a_prompt_that_does_not_frame_the_reference_as_the_file_rewritten_gets_no_start_alignment(prompt):
    # A reference that is only text to draft from (a quoted document, retrieval) is not where
    # the output starts: the top stays a weak anchor and the first tree is not spent on it.
    proposer = Proposer(references=[arr(ORIGINAL)], max_depth=64, cursor=True)
    proposer.start(arr(prompt))
    assert proposer.cursor_state() == {"align": -1, "run": 0, "anchor": 0}
    assert accepted_length(proposer.propose(64), ORIGINAL[:64], 0) < 64


def test_frames_reference_finds_the_file_after_the_prompt_s_closing_tokens():
    from refdec.drafting.proposer import frames_reference

    assert frames_reference(arr(EDIT_PROMPT), arr(ORIGINAL))
    assert frames_reference(arr(EDIT_PROMPT), arr(ORIGINAL[:3]))  # a reference shorter than the head
    assert not frames_reference(arr(EDIT_PROMPT), arr(ORIGINAL[1:]))  # not its top
    assert not frames_reference(arr(EDIT_PROMPT[:-1]), arr(ORIGINAL))  # ends otherwise
    assert not frames_reference(arr(FENCE), arr(ORIGINAL))  # too short to hold it
    assert not frames_reference(arr(EDIT_PROMPT), arr([]))


@pytest.mark.parametrize("kwargs, message", [
    (dict(match_cap=2**31), r"CursorParams.match_cap must be an int in \[1, 4096\], got 2147483648"),
    (dict(match_cap=2**31 - 1), r"CursorParams.match_cap must be an int in \[1, 4096\]"),  # an 8 GB buffer
    (dict(match_gain=1e39), r"CursorParams.match_gain must be a finite number"),  # inf as a C++ float
    (dict(decay_levels=2**31), r"CursorParams.decay_levels must be an int in \[1, 2147483647\]"),
    (dict(match_cap="16"), r"CursorParams.match_cap must be an int .* got '16'"),
    (dict(max_candidates=0), r"CursorParams.max_candidates must be an int in \[1, "),
    (dict(distance_scale=0.0), r"CursorParams.distance_scale must be a finite number in \[0.001, inf\], got 0.0"),
    (dict(null_score=float("nan")), r"CursorParams.null_score must be a finite number .* got nan"),
    (dict(copy_decay=1.5), r"CursorParams.copy_decay must be a finite number in \[0.0, 1.0\], got 1.5"),
    (dict(confirm_run=True), r"CursorParams.confirm_run must be an int"),
])
def test_bad_cursor_params_are_value_errors_naming_the_field(kwargs, message):
    # (they reached the C++ cast as "Unable to cast ... to C++ type", naming nothing, or wrapped)
    with pytest.raises(ValueError, match=message):
        CursorParams(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(weight=5.0), r"SourceParams.weight must be a finite number in \[0.0, 1.0\], got 5.0"),
    (dict(weight=float("inf")), r"SourceParams.weight .* got inf"),
    (dict(half_len=-1.0), r"SourceParams.half_len must be a finite number in \[0.0, inf\], got -1.0"),
])
def test_bad_source_params_are_value_errors_naming_the_field(kwargs, message):
    # a weight above 1 gave draft scores above 1, documented as probabilities
    from refdec.drafting.proposer import SourceParams

    with pytest.raises(ValueError, match=message):
        SourceParams(**kwargs)


def test_the_cursor_without_references_is_a_no_op():
    proposer = Proposer(cursor=True)
    proposer.start(arr([5, 6, 7, 5, 6]))
    assert proposer.cursor_state() == {"align": -1, "run": 0, "anchor": -1}
    assert proposer.propose(8).token_ids.tolist()[:1] == [7]


def test_multiple_references_never_copy_across_a_document_end():
    proposer = Proposer(references=[arr([10, 11, 12]), arr([20, 21, 22, 23])], max_depth=16, cursor=True)
    feed(proposer, [10, 11])
    tree = proposer.propose(16)
    for t, p in zip(tree.token_ids.tolist(), tree.parents.tolist()):
        if p >= 0 and tree.token_ids[p] == 12:
            assert t != 20  # 12 ends the first document


def test_cursor_candidates_are_best_first_probabilities_and_the_anchor_is_one_of_them():
    proposer = editing()
    feed(proposer, A[0][:25] + [1000, 1001])
    cands = proposer.cursor_candidates()
    weights = [w for _, _, w in cands]
    assert weights == sorted(weights, reverse=True) and 0 < sum(weights) <= 1
    assert 25 in [pos for pos, _, _ in cands]  # the anchor (insertion re-join)
    assert 27 in [pos for pos, _, _ in cands]  # the diagonal (two tokens replaced)


def test_unsure_cursor_adds_the_most_frequent_reference_tokens_as_root_children():
    # Reference: token 7 is by far the most frequent; after new text nothing
    # matches, so 7 (copied from its occurrence nearest the anchor) is a root child.
    reference = [7, 40, 7, 41, 7, 42, 7, 43, 7, 44, 50, 51, 52]
    proposer = Proposer(references=[arr(reference)], max_depth=8, cursor=True)
    proposer.start(arr(PROMPT))
    proposer.accept(arr([7, 40, 7, 41, 90, 91, 92, 93, 94]))
    tree = proposer.propose(64)
    assert 7 in tree.token_ids[tree.parents == -1].tolist()


def test_a_learnt_substitution_forks_later_copies_of_the_same_token():
    # Reference lines "4 x x x 9" (4 = an indentation token, 9 = newline); the
    # output re-indents: 4 -> 5. After one re-indented line has been seen, the
    # draft of the next line offers 5 where the reference has 4.
    lines = [[4, 60 + i, 61 + i, 62 + i, 9] for i in range(0, 30, 3)]
    reference = [t for line in lines for t in line]
    proposer = Proposer(references=[arr(reference)], max_depth=16, cursor=True)
    proposer.start(arr(PROMPT))
    out = lines[0] + lines[1] + [5] + lines[2][1:]
    proposer.accept(arr(out))
    assert proposer.cursor_state()["align"] == 15
    tree = proposer.propose(64)
    first = tree.token_ids[tree.parents == -1].tolist()
    assert 5 in first and 4 in first



# ---------------------------------------------------------------- survival per source


def chain_scores(proposer, expected):
    """Scores of the tree nodes on the root path spelling ``expected``, by depth."""
    tree = proposer.propose(64)
    tokens, parents = tree.token_ids.tolist(), tree.parents.tolist()
    out, node = [], -1
    for t in expected:
        node = next(i for i in range(len(tokens)) if parents[i] == node and tokens[i] == t)
        out.append(float(tree.scores[node]))
    return out


def test_a_fixed_copy_keeps_its_weight_times_the_survival_to_its_depth():
    # Only the cursor's copy decays (suffix sources hazard_power 0, no global
    # decay). Both are entries of the reference source, so a node scores their
    # max: max(a, w * f(d)), a = the suffix match's constant confidence
    # L / (L + 2), w = the aligned candidate's weight, f(d) =
    # ((s + e) / (s + e + d)) ** p with e = its run.
    p, s = 1.0, 1.0
    params = CursorParams(depth_decay=1.0, hazard_power=0.0, copy_hazard_power=p, copy_hazard_scale=s, start_run=0)
    proposer = Proposer(references=[arr(ORIGINAL)], max_depth=64, cursor=params)
    feed(proposer, ORIGINAL[:20])
    run = proposer.cursor_state()["run"]
    (pos, _, w), *_ = proposer.cursor_candidates()
    assert (pos, run) == (20, 20)
    length = proposer.last_match_lengths()["reference"]
    a = length / (length + 2.0)
    got = chain_scores(proposer, ORIGINAL[20:60])
    want = [max(a, w * ((s + run) / (s + run + d)) ** p) for d in range(1, 41)]
    assert want[0] > a  # the copy's own score shows near the root
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_a_copy_backed_by_a_longer_run_keeps_more_of_its_score_deep_down():
    def kept(n_fed):
        proposer = editing()
        feed(proposer, ORIGINAL[:n_fed])
        scores = chain_scores(proposer, ORIGINAL[n_fed:n_fed + 24])
        assert all(x >= y for x, y in zip(scores, scores[1:]))  # never grows with depth
        return scores[-1] / scores[0]

    assert kept(6) < kept(36) < 1.0


def test_survival_params_of_zero_power_leave_scores_undecayed_along_a_unique_copy():
    params = CursorParams(depth_decay=1.0, hazard_power=0.0, copy_hazard_power=0.0)
    proposer = Proposer(references=[arr(ORIGINAL)], max_depth=64, cursor=params)
    feed(proposer, ORIGINAL[:20])
    scores = chain_scores(proposer, ORIGINAL[20:60])
    assert max(scores) - min(scores) < 1e-6
