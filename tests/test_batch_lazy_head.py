"""The lazy LM head in the batched loop (refdec.batch + refdec.verify.LockstepLazyWalks):
the backbone runs on every row of every tree, the head only on the rows the rows' acceptance
walks visit, one GEMM per round for all batch rows — with the tokens of the whole-tree head."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import refdec
import tiny_models
from refdec.tree import DraftTree
from refdec.decode.accept import accept_walk, accept_walk_lazy, accept_walk_steps
from refdec.decode.head import LazyRowLogits, LockstepLazyWalks, PlainHead

NEW = 30


def random_tree(rng, max_nodes: int = 12, n_tokens: int = 3) -> DraftTree:
    n = int(rng.integers(0, max_nodes + 1))
    parents = np.array([int(rng.integers(-1, i)) for i in range(n)], dtype=np.int32)
    return DraftTree(rng.integers(0, n_tokens, size=n), parents, np.ones(n, np.float32))


def one_hot_head(targets: list[np.ndarray], width: int, vocab: int = 3):
    """hidden float64 [n_walks, width, n_walks * width] and a PlainHead whose logits at
    ``hidden[walk_idx, row]`` peak at ``targets[walk_idx][row]`` (and nowhere else): a head call
    on the wrong (walk, row) pair gives another row's target.
    ``targets``: per walk an int64 array (1 + n_nodes,)."""
    n_walks = len(targets)
    dim = n_walks * width
    hidden = torch.eye(dim, dtype=torch.float64).reshape(n_walks, width, dim)
    weight = torch.zeros(vocab, dim, dtype=torch.float64)
    for walk_idx, t in enumerate(targets):
        for row, token in enumerate(t):
            weight[int(token), walk_idx * width + row] = 1.0
    return hidden, PlainHead(weight, None)


def test_walk_steps_generator_equals_the_lazy_walk():
    rng = np.random.default_rng(1)
    for _ in range(200):
        tree = random_tree(rng)
        targets = rng.integers(0, 3, size=len(tree) + 1)
        asked = []
        walk = accept_walk_steps(tree)
        row, depth = next(walk)
        try:
            while True:
                asked.append((row, depth))
                row, depth = walk.send(int(targets[row]))
        except StopIteration as end:
            accepted, bonus = end.value
        lazy_asked = []
        want = accept_walk_lazy(tree, lambda r, d: (lazy_asked.append((r, d)), int(targets[r]))[1])
        assert accepted.tolist() == want[0].tolist() and bonus == want[1]
        assert asked == lazy_asked


@pytest.mark.parametrize("adaptive", [True, False])
def test_lockstep_walks_read_each_walks_own_rows(adaptive):
    """Every walk gets the targets of its own tree rows (a one-hot head: a head call on a wrong
    (batch row, tree row) pair reads another row's target and changes the walk)."""
    rng = np.random.default_rng(2)
    for _ in range(100):
        trees = [random_tree(rng) for _ in range(int(rng.integers(1, 7)))]
        width = 1 + max(len(t) for t in trees)
        targets = [rng.integers(0, 3, size=len(t) + 1) for t in trees]
        hidden, head = one_hot_head(targets, width)
        walks = LockstepLazyWalks(trees, hidden, head, adaptive=adaptive)
        got = walks.run(lambda i, r, depth: walks.lazy[i].argmax(r))
        for walk_idx, tree in enumerate(trees):
            want = accept_walk(tree, targets[walk_idx])
            assert got[walk_idx][0].tolist() == want[0].tolist() and got[walk_idx][1] == want[1]
            lazy = walks.lazy[walk_idx]
            for row in lazy._logits:  # every stored row holds that row's logits
                torch.testing.assert_close(lazy.row_logits(row), head.logits(hidden[walk_idx, row: row + 1])[0])
            assert lazy.rows_computed == len(lazy._logits) <= 1 + len(tree)
            assert lazy.seconds == 0.0  # no head call of its own: the lock-step GEMMs filled it


def test_lockstep_walks_run_one_head_call_per_round_not_per_walk():
    # six walks, each a chain of 3 nodes all accepted (targets follow the chain)
    chain = DraftTree.chain(np.array([1, 2, 0]))
    trees = [chain] * 6
    targets = [np.array([1, 2, 0, 2])] * 6
    hidden, head = one_hot_head(targets, 4)
    calls = []
    logits = head.logits
    head.logits = lambda h: (calls.append(h.shape[0]), logits(h))[1]
    walks = LockstepLazyWalks(trees, hidden, head, adaptive=False)
    results = walks.run(lambda i, r, depth: walks.lazy[i].argmax(r))
    assert all(a.tolist() == [0, 1, 2] and bonus == 2 for a, bonus in results)
    assert calls == [24] and walks.head_calls == 1  # one chunk of 4 rows per walk, one GEMM
    # adaptive: with 6 walks waiting each computes just the asked row (4 rounds of 6 rows)
    calls.clear()
    walks = LockstepLazyWalks(trees, hidden, head)
    results = walks.run(lambda i, r, depth: walks.lazy[i].argmax(r))
    assert all(a.tolist() == [0, 1, 2] and bonus == 2 for a, bonus in results)
    assert calls == [6, 6, 6, 6]
    # two walks waiting: 2 rows each (the empty tree has only its root); then the one walk left
    # waiting takes a whole chunk along its best path (the head pads to 4 rows anyway)
    calls.clear()
    walks = LockstepLazyWalks([DraftTree.empty(), chain], hidden[:2], head)
    walks.run(lambda i, r, depth: walks.lazy[i].argmax(r))
    assert calls == [3, 2] and [lazy.rows_computed for lazy in walks.lazy] == [1, 4]


def test_lockstep_walks_reject_hidden_states_that_do_not_fit_the_trees():
    hidden, head = one_hot_head([np.zeros(2, dtype=np.int64)], 2)
    with pytest.raises(ValueError, match="hidden has 1 batch rows for 2 trees"):
        LockstepLazyWalks([DraftTree.empty(), DraftTree.empty()], hidden, head)
    with pytest.raises(ValueError, match="tree 0 has 4 rows"):
        LockstepLazyWalks([DraftTree.chain(np.array([1, 2, 0]))], hidden, head)


def test_lazy_row_logits_chunk_rows_and_store_keep_its_single_walk_behaviour():
    tree = DraftTree(np.array([20, 21, 22, 23, 24, 25]), np.array([-1, 0, -1, 1, 2, 1]), np.ones(6, np.float32))
    hidden = torch.randn(7, 5, dtype=torch.float64)
    head = PlainHead(torch.randn(30, 5, dtype=torch.float64), None)
    lazy = LazyRowLogits(tree, hidden, head, chunk=3)
    assert lazy.chunk_rows(0, 3) == [0, 1, 2] and lazy.chunk_rows(0, 1) == [0]
    assert not lazy.has(0)
    logits = head.logits(hidden[[0, 1]])
    lazy.store([0, 1], logits, logits.argmax(-1).tolist())
    assert lazy.has(1) and lazy.rows_computed == 2 and lazy.seconds == 0.0
    assert lazy.chunk_rows(0, 3) == [0, 2, 3]  # computed rows are skipped
    lazy.argmax(2)  # its own head call: row 2 and the next rows not computed
    assert lazy.rows_computed == 5 and sorted(lazy._argmax) == [0, 1, 2, 3, 4]


def corrupted_references(decoder, prompts, kwargs, corrupt_at=(7, 19)):
    """Per row, a reference holding that row's own output with tokens corrupted: long drafts accepted up to a
    corrupted token, then rejected."""
    refs = []
    for b, prompt in enumerate(prompts):
        out = decoder.generate(prompt, max_draft_tokens=0, **{**kwargs, "seed": kwargs["seed"] + b})
        cont = out.sequences[0].tolist()[len(prompt) - 2:]
        for j in corrupt_at:
            cont[j] = (cont[j] + 1) % tiny_models.VOCAB
        refs.append([cont])
    return refs


def batch_row(out, b, prompt_len):
    width = out.sequences.shape[1] - max(r.new_tokens for r in out.stats.rows)
    return out.sequences[b].tolist()[width - prompt_len: width + out.stats.rows[b].new_tokens]


@pytest.mark.parametrize("do_sample", [False, True])
def test_batched_lazy_head_equals_the_full_head_and_single_rows(family_model, do_sample):
    name, model = family_model
    decoder = refdec.SpeculativeDecoder(model)
    assert decoder.lazy_head  # CPU + a plain head
    rng = np.random.default_rng(5)
    prompts = tiny_models.repetitive_prompts(4, seed=23)
    prompts.insert(1, [1] + rng.integers(3, 96, size=9).tolist())  # no reference: drafts from the prompt only
    kwargs = dict(max_new_tokens=NEW, eos_token_id=[], do_sample=do_sample, seed=7, temperature=0.8)
    refs = corrupted_references(decoder, prompts, kwargs)
    refs[1] = None
    singles = [decoder.generate(p, references=refs[b], max_draft_tokens=12, **{**kwargs, "seed": 7 + b})
               .sequences[0].tolist() for b, p in enumerate(prompts)]
    outs = {}
    for lazy in (True, False):
        decoder.lazy_head = lazy
        outs[lazy] = decoder.generate(prompts, references=refs, max_draft_tokens=12, **kwargs)
    decoder.lazy_head = True
    for b, p in enumerate(prompts):
        assert batch_row(outs[True], b, len(p)) == batch_row(outs[False], b, len(p)) == singles[b], (name, b)
    lazy_rows, full_rows = outs[True].stats.rows, outs[False].stats.rows
    assert sum(r.accepted_tokens for r in lazy_rows) > 30
    assert sum(r.proposed_tokens - r.accepted_tokens for r in lazy_rows) > 10
    assert [r.accepted_tokens for r in lazy_rows] == [r.accepted_tokens for r in full_rows]
    # the head ran on fewer rows than the whole padded trees, for the batch and for every row
    assert outs[True].stats.head_rows == sum(r.head_rows for r in lazy_rows)
    assert outs[True].stats.head_rows < outs[False].stats.head_rows
    assert all(lz.head_rows < full.head_rows for lz, full in zip(lazy_rows, full_rows))
    # the head runs in the forward time, not the accept time
    assert outs[True].stats.forward_seconds > 0 and outs[True].stats.accept_seconds >= 0


def test_batched_lazy_head_runs_no_full_forward(monkeypatch):
    """With the lazy head the model's own forward (the head on every row) never runs."""
    model = tiny_models.tiny_llama()
    decoder = refdec.SpeculativeDecoder(model)
    monkeypatch.setattr(decoder.runner, "logits", lambda *a, **k: pytest.fail("the full forward ran"))
    prompts = tiny_models.repetitive_prompts(3, seed=2)
    out = decoder.generate(prompts, max_new_tokens=12, eos_token_id=[], max_draft_tokens=8)
    assert out.stats.new_tokens == 36 and out.stats.head_rows > 0
