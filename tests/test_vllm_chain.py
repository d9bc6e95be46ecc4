"""Specifies refdec.vllm.chain, the tree -> chain choice (no vLLM): the chain of highest expected
accepted length less a price per drafted token (``best_chain``, ``walk_trees`` over a batch's trees,
priced by the node cells' learnt acceptance rates), the numba and Python implementations agreeing
on random batches, and ``token_price``, the price a step's batch sets."""

from __future__ import annotations

import numpy as np
import pytest

from refdec import vllm as rv
from refdec.drafting.tree import DraftTree
from refdec.sizing.acceptance import AcceptanceTable
from refdec.vllm import chain as vllm_chain


def _tree(token_ids, parents, scores):
    """A tree's (token_ids, parents, scores, depths), the depths a DraftTree of its shape derives
    (made with the ids clipped at 0: a corrupt index body drafts negative ids, which DraftTree
    refuses)."""
    token_ids = np.asarray(token_ids, np.int32)
    shape = DraftTree(np.maximum(token_ids, 0), parents, scores)
    return token_ids, shape.parents, shape.scores, shape.depths


# ---------------------------------------------------------------------------------------------
# best_chain

#   root ─ 10 (0.9) ─ 11 (0.8) ─ 12 (0.7)
#        └ 20 (0.5) ─ 21 (0.5) ─ 22 (0.5) ─ 23 (0.5) ─ 24 (0.5)
#   path sums: 10-11-12 = 2.4; 20..24 = 2.5 -> the longer, weaker chain is worth more
TWO_BRANCHES = _tree([10, 20, 11, 21, 12, 22, 23, 24], [-1, -1, 0, 1, 2, 3, 5, 6],
                     [0.9, 0.5, 0.8, 0.5, 0.7, 0.5, 0.5, 0.5])


@pytest.fixture(params=["python", "numba"])
def chain_impl(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(vllm_chain, "_choose_impl", vllm_chain._choose_py)
    else:
        pytest.importorskip("numba")
        monkeypatch.setattr(vllm_chain, "_choose_impl", None)
    return request.param


def test_best_chain_takes_the_path_of_highest_expected_accepted_length(chain_impl):
    assert rv.best_chain(*TWO_BRANCHES, max_len=8).tolist() == [20, 21, 22, 23, 24]


def test_best_chain_depth_limit_prefers_the_stronger_short_branch(chain_impl):
    # at depth <= 3: 10-11-12 = 2.4 against 20-21-22 = 1.5
    assert rv.best_chain(*TWO_BRANCHES, max_len=3).tolist() == [10, 11, 12]


def test_best_chain_cost_cuts_the_chain_where_a_token_no_longer_pays(chain_impl):
    # cost 0.6: values 10: 0.3, 11: 0.5, 12: 0.6; the 0.5 branch never pays
    assert rv.best_chain(*TWO_BRANCHES, max_len=8, draft_cost=0.6).tolist() == [10, 11, 12]
    # cost 0.75: 10 (+0.15), 11 (+0.05 -> 0.2), 12 (-0.05): stop after 11
    assert rv.best_chain(*TWO_BRANCHES, max_len=8, draft_cost=0.75).tolist() == [10, 11]


def test_best_chain_is_empty_when_no_token_pays_or_tree_is_empty(chain_impl):
    assert rv.best_chain(*TWO_BRANCHES, max_len=8, draft_cost=0.95).size == 0
    assert rv.best_chain(*_tree([], [], []), max_len=8).size == 0
    assert rv.best_chain(*TWO_BRANCHES, max_len=0).size == 0


def test_best_chain_never_takes_a_negative_token_or_its_subtree(chain_impl):
    # root ─ -5 (0.9) ─ 7 (0.9)      (a corrupt index body can yield a negative id)
    #      └ 3 (0.2)
    tree = _tree([-5, 3, 7], [-1, -1, 0], [0.9, 0.2, 0.9])
    assert rv.best_chain(*tree, max_len=4).tolist() == [3]


def _walk(tree, rates, max_len, price, source_ids=None):
    n = len(tree[0])
    src = np.zeros(n, np.int32) if source_ids is None else np.asarray(source_ids, np.int32)
    out = (np.zeros((1, max_len), np.int32), np.zeros((1, max_len)), np.zeros((1, max_len), np.int64),
           np.zeros(1, np.int64))
    rv.walk_trees(*tree[:3], src, tree[3], np.array([0, n]), np.array([max_len]), rates, price, *out)
    length = int(out[3][0])
    return out[0][0, :length].tolist(), out[1][0, :length].tolist(), out[2][0, :length].tolist()


def test_chain_walk_prices_nodes_by_the_tables_rates_not_their_scores(chain_impl):
    """A table that learnt the weak-looking branch is accepted (rate 0.9 in its cells) makes the
    walk take it; the probabilities it reports are the table's, held non-increasing."""
    table = AcceptanceTable(1)
    scores, depths = TWO_BRANCHES[2], TWO_BRANCHES[3]
    cells = table.cells(scores, depths, np.zeros(8, np.int32))
    table.rates = np.full_like(table.rates, 0.1)
    table.rates[cells[[1, 3, 5, 6, 7]]] = 0.9   # the 20-21-22-23-24 branch (score 0.5)
    tokens, probs, got_cells = _walk(TWO_BRANCHES, table.rates, 8, 0.5)
    assert tokens == [20, 21, 22, 23, 24] and probs == pytest.approx([0.9] * 5)
    assert got_cells == cells[[1, 3, 5, 6, 7]].tolist()
    # without a table: the scores; at price 0.5 the 0.5 branch never pays, 10-11-12 does
    assert _walk(TWO_BRANCHES, None, 8, 0.5)[0] == [10, 11, 12]
    # a child rated above its parent is held at the parent's probability
    table.rates[cells[3]] = 0.95
    assert _walk(TWO_BRANCHES, table.rates, 8, 0.0)[1][:3] == pytest.approx([0.9, 0.9, 0.9])


def test_walk_trees_walks_each_tree_of_a_batch_on_its_own(chain_impl):
    """Three trees in one call: each row is the tree's own chain (parents are within a tree)."""
    short = _tree([7, 8], [-1, 0], [0.9, 0.9])
    trees = [TWO_BRANCHES, short, TWO_BRANCHES]
    max_lens = [8, 8, 3]
    flat = [np.concatenate([t[i] for t in trees]) for i in range(4)]
    n = len(flat[0])
    out = (np.zeros((3, 8), np.int32), np.zeros((3, 8)), np.zeros((3, 8), np.int64), np.zeros(3, np.int64))
    rv.walk_trees(*flat[:3], np.zeros(n, np.int32), flat[3], np.array([0, 8, 10, 18]), np.array(max_lens), None, 0.0,
                  *out)
    assert out[3].tolist() == [5, 2, 3]
    assert [out[0][r, :out[3][r]].tolist() for r in range(3)] == [[20, 21, 22, 23, 24], [7, 8], [10, 11, 12]]
    assert [_walk(t, None, m, 0.0)[0] for t, m in zip(trees, max_lens)] == \
        [out[0][r, :out[3][r]].tolist() for r in range(3)]


def test_choose_chains_python_and_numba_agree_on_random_batches(monkeypatch):
    pytest.importorskip("numba")
    rng = np.random.default_rng(5)
    monkeypatch.setattr(vllm_chain, "_choose_impl", None)
    compiled = vllm_chain._compiled_choose()
    table = AcceptanceTable(3)
    table.rates = rng.random(table.rates.shape[0])
    for trial in range(100):
        sizes = rng.integers(0, 40, int(rng.integers(1, 6)))
        parents = np.concatenate([[int(rng.integers(-1, i)) if i else -1 for i in range(n)] for n in sizes] +
                                 [np.zeros(0)]).astype(np.int32)
        n = int(sizes.sum())
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        depths = np.concatenate([_tree(np.zeros(b - a), parents[a:b], np.ones(b - a))[3]
                                 for a, b in zip(offsets[:-1], offsets[1:])])
        tokens = rng.integers(-1, 50, n).astype(np.int32)
        scores = rng.random(n).astype(np.float32)
        sources = rng.integers(0, 3, n).astype(np.int32)
        max_lens = rng.integers(0, 10, len(sizes)).astype(np.int64)
        rates = table.rates if trial % 2 else vllm_chain._NO_RATES
        price = float(rng.choice([-1.0, 0.0, 0.1, 0.4]))  # -1: priced by the batch (token_price)
        outs = [(np.zeros((len(sizes), 10), np.int32), np.zeros((len(sizes), 10)),
                 np.zeros((len(sizes), 10), np.int64), np.zeros(len(sizes), np.int64)) for _ in range(2)]
        args = (tokens, parents, scores, sources, depths, offsets, max_lens, rates, vllm_chain._SCORE_EDGES,
                vllm_chain._DEPTH_EDGES, price, 0.05, len(sizes) + 2)
        prices = (vllm_chain._choose_py(*args, *outs[0]), compiled(*args, *outs[1]))
        assert prices[0] == prices[1]
        if price < 0:  # the price is token_price's of the candidates at no cost, to the bit
            cand = (np.zeros((len(sizes), 10), np.int32), np.zeros((len(sizes), 10)),
                    np.zeros((len(sizes), 10), np.int64), np.zeros(len(sizes), np.int64))
            compiled(*args[:10], 0.0, 0.05, len(sizes) + 2, *cand)
            assert prices[0] == rv.token_price(cand[1], cand[3], len(sizes) + 2, 0.05)
        for a, b in zip(*outs):
            assert a.tolist() == b.tolist()
        if trial % 2:  # the cells the walk reports are AcceptanceTable.cells of the chain's nodes
            for r in range(len(sizes)):
                tree_cells = table.cells(scores[offsets[r]:offsets[r + 1]], depths[offsets[r]:offsets[r + 1]],
                                         sources[offsets[r]:offsets[r + 1]]).tolist()
                assert set(outs[0][2][r, :outs[0][3][r]].tolist()) <= set(tree_cells)


# ---------------------------------------------------------------------------------------------
# token_price


def test_token_price_one_request_pays_little_a_loaded_batch_its_yield():
    probs = np.array([[0.9, 0.8, 0.3, 0.1]])
    # one request, x = 0.05: V(m) = (1 + sum) / (1 + 0.05 (1 + m)): m = 0..4 ->
    # 0.952, 1.727, 2.348, 2.522, 2.5 -> best m = 3, price 0.05 * 2.522 = 0.126
    assert rv.token_price(probs, np.array([4]), 1, 0.05) == pytest.approx(0.05 * 3.0 / 1.2)
    # the same chain in 60 rows: V(m) = 60 (1 + sum_per_row) / (1 + 0.05 * 60 (1 + m_per_row)) ->
    # one token per row: 114 / 7 = 16.29; two: 162 / 10 = 16.2 -> price 0.05 * 16.29 = 0.81
    many = np.repeat(probs, 60, axis=0)
    assert rv.token_price(many, np.full(60, 4), 60, 0.05) == pytest.approx(0.05 * 114 / 7)
    # no draft at all, or only worthless ones: the price of plain decoding
    assert rv.token_price(np.zeros((0, 4)), np.zeros(0, np.int64), 3, 0.05) == pytest.approx(0.05 * 3 / 1.15)
    assert rv.token_price(np.array([[0.0]]), np.array([1]), 1, 0.05) == pytest.approx(0.05 / 1.05)
    # only the first lengths[r] entries of a row count
    assert rv.token_price(np.array([[0.9, 0.99]]), np.array([1]), 1, 0.05) == pytest.approx(0.05 * 1.9 / 1.1)


def test_the_node_pass_bins_every_node_into_the_acceptance_tables_cell():
    """The numba node pass has its own copy of AcceptanceTable.cells' binning (numba compiles
    loops, not the table's searchsorted): both give every node the same cell, edges included."""
    rng = np.random.default_rng(3)
    n = 400
    edges = np.concatenate([vllm_chain._SCORE_EDGES, np.nextafter(vllm_chain._SCORE_EDGES, np.float32(0))])
    scores = np.concatenate([edges, rng.random(n - len(edges))]).astype(np.float32)
    depths = rng.integers(1, 70, n).astype(np.int32)
    depths[: len(vllm_chain._DEPTH_EDGES)] = vllm_chain._DEPTH_EDGES  # at the edges
    source_ids = rng.integers(-1, 5, n).astype(np.int32)  # out of range too: clipped by both
    table = AcceptanceTable(3)
    want = table.cells(scores, depths, source_ids)
    parents = np.full(n, -1, np.int32)  # every node a child of the root: no path holds a probability down
    prob, cell = np.zeros(n), np.zeros(n, np.int64)
    vllm_chain._node_probs(np.ones(n, np.int32), parents, scores, source_ids, depths, np.array([0, n]),
                           table.rates, vllm_chain._SCORE_EDGES, vllm_chain._DEPTH_EDGES, prob, cell)
    assert cell.tolist() == want.tolist()
    assert prob.tolist() == table.rates[want].tolist()
