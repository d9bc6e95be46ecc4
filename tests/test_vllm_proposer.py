"""refdec.vllm without vLLM: the tree -> chain choice, option and request validation, and the
per-request bookkeeping of the proposer against a stand-in for vLLM's runner (batch slots that
move, requests that finish, are preempted or come back under the same id). The engine tests
are in test_vllm_engine.py (they need vLLM)."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import numpy as np
import pytest

import refdec
from refdec import vllm as rv
from refdec.acceptance import AcceptanceTable
from refdec.vllm import chain as vllm_chain, options as vllm_options


def _tree(token_ids, parents, scores):
    return (np.asarray(token_ids, np.int32), np.asarray(parents, np.int32), np.asarray(scores, np.float32))


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
    rv.walk_trees(*tree, src, np.array([0, n]), np.array([max_len]), rates, price, *out)
    length = int(out[3][0])
    return out[0][0, :length].tolist(), out[1][0, :length].tolist(), out[2][0, :length].tolist()


def test_chain_walk_prices_nodes_by_the_tables_rates_not_their_scores(chain_impl):
    """A table that learnt the weak-looking branch is accepted (rate 0.9 in its cells) makes the
    walk take it; the probabilities it reports are the table's, held non-increasing."""
    table = AcceptanceTable(1)
    scores, parents = TWO_BRANCHES[2], TWO_BRANCHES[1]
    cells = table.cells(scores, parents, np.zeros(8, np.int32))
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
    flat = [np.concatenate([t[i] for t in trees]) for i in range(3)]
    n = len(flat[0])
    out = (np.zeros((3, 8), np.int32), np.zeros((3, 8)), np.zeros((3, 8), np.int64), np.zeros(3, np.int64))
    rv.walk_trees(*flat, np.zeros(n, np.int32), np.array([0, 8, 10, 18]), np.array(max_lens), None, 0.0, *out)
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
        tokens = rng.integers(-1, 50, n).astype(np.int32)
        scores = rng.random(n).astype(np.float32)
        sources = rng.integers(0, 3, n).astype(np.int32)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        max_lens = rng.integers(0, 10, len(sizes)).astype(np.int64)
        rates = table.rates if trial % 2 else vllm_chain._NO_RATES
        price = float(rng.choice([-1.0, 0.0, 0.1, 0.4]))  # -1: priced by the batch (token_price)
        outs = [(np.zeros((len(sizes), 10), np.int32), np.zeros((len(sizes), 10)),
                 np.zeros((len(sizes), 10), np.int64), np.zeros(len(sizes), np.int64)) for _ in range(2)]
        args = (tokens, parents, scores, sources, offsets, max_lens, rates, vllm_chain._SCORE_EDGES,
                vllm_chain._DEPTH_EDGES, price, 0.05, len(sizes) + 2)
        prices = (vllm_chain._choose_py(*args, *outs[0]), compiled(*args, *outs[1]))
        assert prices[0] == prices[1]
        if price < 0:  # the price is token_price's of the candidates at no cost, to the bit
            cand = (np.zeros((len(sizes), 10), np.int32), np.zeros((len(sizes), 10)),
                    np.zeros((len(sizes), 10), np.int64), np.zeros(len(sizes), np.int64))
            compiled(*args[:9], 0.0, 0.05, len(sizes) + 2, *cand)
            assert prices[0] == rv.token_price(cand[1], cand[3], len(sizes) + 2, 0.05)
        for a, b in zip(*outs):
            assert a.tolist() == b.tolist()
        if trial % 2:  # the cells the walk reports are AcceptanceTable.cells of the chain's nodes
            for r in range(len(sizes)):
                tree_cells = table.cells(scores[offsets[r]:offsets[r + 1]], parents[offsets[r]:offsets[r + 1]],
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


# ---------------------------------------------------------------------------------------------
# Request options


def test_request_options_accept_a_string_or_a_list_of_strings():
    assert rv.parse_request_options({"refdec_references": "abc"}).references == ("abc",)
    assert rv.parse_request_options({"refdec_references": ["a", "b"], "other_plugin": 1}).references == ("a", "b")
    assert rv.parse_request_options(None) == rv.RequestOptions()


@pytest.mark.parametrize("value, message", [
    (5, "refdec_references must be a string or a list of strings, got int 5"),
    (["ok", 3], "refdec_references must be a string or a list of strings"),
    ({"a": "b"}, "refdec_references must be a string or a list of strings, got dict"),
    ("", r"refdec_references\[0\] is an empty string"),
    (["x", ""], r"refdec_references\[1\] is an empty string"),
])
def test_request_options_refuse_bad_references_naming_the_key(value, message):
    with pytest.raises(ValueError, match=message):
        rv.parse_request_options({"refdec_references": value})


def test_request_options_refuse_a_huge_reference():
    with pytest.raises(ValueError, match=r"refdec_references holds 10,000,000 characters, more than .* 1,000,000"):
        rv.parse_request_options({"refdec_references": "x" * 10_000_000})
    assert rv.parse_request_options({"refdec_references": "x" * 50}, max_reference_chars=50).references


def test_request_options_refuse_unknown_refdec_keys():
    with pytest.raises(ValueError, match=r"unknown refdec request option\(s\) \['refdec_referenc'\]"):
        rv.parse_request_options({"refdec_referenc": "typo"})


@pytest.mark.parametrize("value, expected", [(False, False), (0, False), ("off", False), ("true", True), (1, True)])
def test_request_draft_switch(value, expected):
    assert rv.parse_request_options({"refdec_draft": value}).draft is expected


def test_request_draft_switch_refuses_other_values():
    with pytest.raises(ValueError, match="refdec_draft must be true or false"):
        rv.parse_request_options({"refdec_draft": "maybe"})


def test_prediction_text_forms():
    assert rv.prediction_text({"type": "content", "content": "abc"}) == "abc"
    assert rv.prediction_text({"type": "content", "content": [{"type": "text", "text": "a"},
                                                              {"type": "text", "text": "b"}]}) == "ab"
    with pytest.raises(ValueError, match="prediction.type must be 'content'"):
        rv.prediction_text({"type": "image", "content": "abc"})
    with pytest.raises(ValueError, match=r"prediction.content\[0\] must be"):
        rv.prediction_text({"type": "content", "content": [{"type": "image_url"}]})
    with pytest.raises(ValueError, match="prediction must be an object"):
        rv.prediction_text("abc")
    with pytest.raises(ValueError, match="prediction.content must be a string"):
        rv.prediction_text({"type": "content", "content": 3})


# ---------------------------------------------------------------------------------------------
# Server options


def test_server_options_defaults_and_values(tmp_path):
    assert rv.ServerOptions.from_env({}) == rv.ServerOptions()
    a, b = tmp_path / "a.refdec", tmp_path / "b.refdec"
    a.write_bytes(b"x")
    b.write_bytes(b"x")
    opts = rv.ServerOptions.from_env({"REFDEC_VLLM_INDEX": f"{a}:{b}", "REFDEC_VLLM_TREE_NODES": "40",
                                      "REFDEC_VLLM_DRAFT_COST": "0.25", "REFDEC_VLLM_TOKEN_COST": "0.01",
                                      "REFDEC_VLLM_DRAFT": "off", "REFDEC_VLLM_MAX_REFERENCE_CHARS": "10",
                                      "REFDEC_VLLM_DRAFT_THREADS": "2"})
    assert opts == rv.ServerOptions(index_paths=(str(a), str(b)), tree_nodes=40, draft_cost=0.25, token_cost=0.01,
                                    draft_by_default=False, max_reference_chars=10, draft_threads=2)


@pytest.mark.parametrize("env, message", [
    ({"REFDEC_VLLM_INDX": "x"}, r"unknown refdec vLLM option\(s\) \['REFDEC_VLLM_INDX'\]"),
    ({"REFDEC_VLLM_INDEX": "/no/such.refdec"}, "REFDEC_VLLM_INDEX: '/no/such.refdec' is not a file"),
    ({"REFDEC_VLLM_TREE_NODES": "0"}, "REFDEC_VLLM_TREE_NODES must be an integer >= 1, got '0'"),
    ({"REFDEC_VLLM_DRAFT_COST": "-1"}, "REFDEC_VLLM_DRAFT_COST must be a finite number >= 0"),
    ({"REFDEC_VLLM_DRAFT_COST": "nan"}, "REFDEC_VLLM_DRAFT_COST must be a finite number >= 0"),
    ({"REFDEC_VLLM_DRAFT": "sometimes"}, "REFDEC_VLLM_DRAFT must be 'on' or 'off'"),
    ({"REFDEC_VLLM_DRAFT_THREADS": "0"}, "REFDEC_VLLM_DRAFT_THREADS must be an integer >= 1, got '0'"),
])
def test_server_options_refuse_bad_values_naming_the_variable(env, message):
    with pytest.raises(ValueError, match=message):
        rv.ServerOptions.from_env(env)


def test_speculative_config():
    assert rv.speculative_config(8) == {"method": "custom_class", "model": "refdec.vllm.VllmProposer",
                                        "num_speculative_tokens": 8}
    with pytest.raises(ValueError, match="num_speculative_tokens must be an int >= 1, got 0"):
        rv.speculative_config(0)


@pytest.mark.parametrize("dotted_path", [vllm_options.PROPOSER_CLASS, "refdec.vllm.Proposer",
                                        "refdec.vllm.proposer.Proposer"])
def test_the_proposer_class_resolves_by_its_name_and_by_its_old_name(dotted_path):
    # vLLM imports a custom_class by its dotted path; configs written before the rename name
    # refdec.vllm.Proposer (not refdec.Proposer, the per-request drafter)
    module, name = dotted_path.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name) is rv.VllmProposer
    assert rv.VllmProposer is not refdec.Proposer


# ---------------------------------------------------------------------------------------------
# The proposer against a stand-in runner (no vLLM)


class FakeTokenizer:
    """Characters are token ids (ord % 96): references are text, as vLLM requests bring them."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 96 for c in text]}


def _ids(text):
    return [ord(c) % 96 for c in text]


class FakeRunner:
    """What the runner hook hands the proposer: ``req_ids`` per batch slot, the request states,
    ``token_ids_cpu`` rows (prompt + outputs) and ``num_tokens_no_spec``."""

    def __init__(self, proposer, max_slots=4, max_len=256):
        self.proposer = proposer
        self.token_ids_cpu = np.zeros((max_slots, max_len), np.int32)
        self.num_tokens = np.zeros(max_slots, np.int32)
        self.req_ids: list[str] = []
        self.requests: dict[str, SimpleNamespace] = {}

    def add(self, req_id, prompt, extra_args=None, max_tokens=1000):
        slot = len(self.req_ids)
        self.req_ids.append(req_id)
        self.requests[req_id] = SimpleNamespace(
            num_prompt_tokens=len(prompt), output_token_ids=[],
            sampling_params=SimpleNamespace(extra_args=extra_args, max_tokens=max_tokens))
        self.token_ids_cpu[slot, :len(prompt)] = prompt
        self.num_tokens[slot] = len(prompt)

    def emit(self, req_id, tokens):
        slot = self.req_ids.index(req_id)
        n = self.num_tokens[slot]
        self.token_ids_cpu[slot, n:n + len(tokens)] = tokens
        self.num_tokens[slot] += len(tokens)
        self.requests[req_id].output_token_ids.extend(tokens)

    def finish(self, req_id):
        """The request leaves; the last slot moves into its place (as vLLM's condense does)."""
        slot = self.req_ids.index(req_id)
        last = len(self.req_ids) - 1
        self.token_ids_cpu[slot] = self.token_ids_cpu[last]
        self.num_tokens[slot] = self.num_tokens[last]
        self.req_ids[slot] = self.req_ids[last]
        self.req_ids.pop()
        del self.requests[req_id]
        return {req_id}

    def step(self, finished=(), preempted=()):
        self.proposer.bind_batch(list(self.req_ids), self.requests, set(finished), set(preempted))
        sampled = [[1]] * len(self.req_ids)
        return dict(zip(self.req_ids, self.proposer.propose(sampled, self.num_tokens, self.token_ids_cpu)))


@pytest.fixture
def make_proposer(monkeypatch):
    from refdec.vllm import proposer as vllm_proposer

    monkeypatch.setattr(vllm_proposer, "install_runner_hook", lambda: None)
    for name in vllm_options.ENV_NAMES:
        monkeypatch.delenv(name, raising=False)

    def make(k=8, **env):
        env.setdefault("REFDEC_VLLM_DRAFT_COST", "0")  # every drafted token pays: whole chains, exact tests
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                                 model_config=SimpleNamespace(max_model_len=256, tokenizer=None))
        proposer = rv.VllmProposer(config)
        proposer._tokenizer = FakeTokenizer()
        return proposer
    return make


REF_A = "the quick brown fox jumps over the lazy dog"
REF_B = "pack my box with five dozen liquor jugs now"


def test_each_request_drafts_from_its_own_reference_while_slots_move(make_proposer):
    proposer = make_proposer()
    runner = FakeRunner(proposer)
    runner.add("short", _ids("x: "), {"refdec_references": "zzzzzzzzzzzz"})
    runner.add("a", _ids("A: "), {"refdec_references": REF_A})
    runner.add("b", _ids("B: "), {"refdec_references": [REF_B]})
    runner.emit("a", _ids("the quick"))
    runner.emit("b", _ids("pack my"))
    drafts = runner.step()
    assert drafts["a"] == _ids(" brown f")      # k = 8 tokens of A's reference after "the quick"
    assert drafts["b"] == _ids(" box wit")
    # "short" finishes: "b" moves from slot 2 to slot 0; each request keeps its own proposer
    finished = runner.finish("short")
    assert runner.req_ids == ["b", "a"]
    runner.emit("a", _ids(" brown fox"))
    runner.emit("b", _ids(" box with"))
    drafts = runner.step(finished=finished)
    assert drafts["a"] == _ids(" jumps o")
    assert drafts["b"] == _ids(" five do")
    assert set(proposer.request_stats()) == {"a", "b"}
    stats = proposer.request_stats()
    assert stats["a"]["drafted"] == 16 and stats["a"]["accepted"] == 8   # " brown f" accepted, "ox" new


def test_a_loaded_batch_drafts_shorter_chains_than_one_request(make_proposer, monkeypatch):
    """Same request, same tree: alone it gets the deep chain; in a batch of 8 a shorter one; among
    60 requests (a verified token then costs nearly what plain decoding yields per token) no
    draft from a weak match, while a strong match still drafts."""
    monkeypatch.delenv("REFDEC_VLLM_DRAFT_COST", raising=False)
    lengths = {}
    for prompt in ("A: the", "A: the quick brown fox jumps over"):
        for batch in (1, 8, 60):
            proposer = make_proposer(k=32, REFDEC_VLLM_DRAFT_COST="")
            runner = FakeRunner(proposer, max_slots=batch)
            for i in range(batch):
                runner.add(f"r{i}", _ids(prompt), {"refdec_references": REF_A})
            lengths[prompt, batch] = len(runner.step()["r0"])
    # a short match ("the"): the copy's probabilities fall with depth (0.6, 0.41, 0.26, ... at the
    # table's prior): alone 8 tokens pay, among 8 fewer, among 60 none
    weak = [lengths["A: the", b] for b in (1, 8, 60)]
    assert weak[0] >= 8 and 0 < weak[1] < weak[0] and weak[2] == 0, weak
    # a long match: the rest of the reference (" the lazy dog", 13 tokens; 0.9 and more) still drafts among 60
    strong = [lengths["A: the quick brown fox jumps over", b] for b in (1, 8, 60)]
    assert strong[0] == 13 and strong[0] >= strong[1] >= strong[2] >= 1, strong


def test_the_table_learns_what_vllm_accepted_of_each_chain(make_proposer):
    """The next step counts last step's chain: every node verified, the accepted prefix accepted
    (vLLM emitted it + 1 token), in the cells the walk reported; a rejected draft lowers its
    cells' rates, an accepted one raises them."""
    proposer = make_proposer()
    runner = FakeRunner(proposer)
    runner.add("a", _ids("A: "), {"refdec_references": REF_A})
    runner.add("b", _ids("B: "), {"refdec_references": REF_B})
    runner.emit("a", _ids("the quick"))
    runner.emit("b", _ids("pack my"))
    drafts = runner.step()
    cells_a = proposer._requests["a"].last_cells.copy()
    cells_b = proposer._requests["b"].last_cells.copy()
    assert len(cells_a) == len(drafts["a"]) == 8 and len(cells_b) == 8
    before = proposer.acceptance.rates.copy()
    runner.emit("a", drafts["a"] + _ids("X"))       # all 8 accepted, then vLLM's own token
    runner.emit("b", _ids("Y"))                     # none accepted
    runner.step()
    table = proposer.acceptance
    assert table.verified.sum() == pytest.approx(16) and table.accepted.sum() == pytest.approx(8)
    assert table.accepted[np.unique(cells_a)].sum() == pytest.approx(8)
    assert table.accepted[np.setdiff1d(np.unique(cells_b), cells_a)].sum() == 0
    assert all(table.rates[c] > before[c] for c in np.setdiff1d(cells_a, cells_b))
    assert all(table.rates[c] < before[c] for c in np.setdiff1d(cells_b, cells_a))


def test_finished_and_vanished_requests_are_freed(make_proposer):
    proposer = make_proposer()
    runner = FakeRunner(proposer)
    runner.add("a", _ids("hello hello hello "))
    runner.add("b", _ids("world world world "))
    runner.step()
    assert set(proposer.request_stats()) == {"a", "b"}
    runner.step(finished=runner.finish("a"))
    assert set(proposer.request_stats()) == {"b"}
    runner.finish("b")          # gone from vLLM's requests without a finished id: freed on the next step
    runner.step()
    assert proposer.request_stats() == {}


def test_a_preempted_request_restarts_from_its_prompt_and_outputs(make_proposer):
    proposer = make_proposer()
    runner = FakeRunner(proposer)
    runner.add("a", _ids("A: "), {"refdec_references": REF_A})
    runner.emit("a", _ids("the quick"))
    first = runner.step()["a"]
    runner.step(preempted={"a"})  # freed, then started again in the same step from the whole row
    assert runner.step()["a"] == first


def test_a_new_request_under_a_finished_ones_id_starts_afresh(make_proposer):
    proposer = make_proposer()
    runner = FakeRunner(proposer)
    runner.add("a", _ids("A: "), {"refdec_references": REF_A})
    runner.emit("a", _ids("the quick"))
    runner.step()
    runner.finish("a")
    runner.add("a", _ids("B: "), {"refdec_references": REF_B})   # same id, a new request state object
    runner.emit("a", _ids("pack my"))
    assert runner.step()["a"] == _ids(" box wit")


def test_drafting_off_per_request_and_by_default(make_proposer):
    proposer = make_proposer()
    runner = FakeRunner(proposer)
    runner.add("off", _ids("A: "), {"refdec_references": REF_A, "refdec_draft": False})
    runner.add("on", _ids("A: "), {"refdec_references": REF_A})
    runner.emit("off", _ids("the quick"))
    runner.emit("on", _ids("the quick"))
    drafts = runner.step()
    assert drafts["off"] == [] and drafts["on"] == _ids(" brown f")

    proposer = make_proposer(REFDEC_VLLM_DRAFT="off")
    runner = FakeRunner(proposer)
    runner.add("default", _ids("A: "), {"refdec_references": REF_A})
    runner.add("asks", _ids("A: "), {"refdec_references": REF_A, "refdec_draft": "on"})
    runner.emit("default", _ids("the quick"))
    runner.emit("asks", _ids("the quick"))
    drafts = runner.step()
    assert drafts["default"] == [] and drafts["asks"] == _ids(" brown f")


def test_a_bad_request_that_reaches_the_worker_drafts_nothing_and_others_go_on(make_proposer):
    proposer = make_proposer()
    runner = FakeRunner(proposer)
    runner.add("bad", _ids("A: "), {"refdec_references": 5})
    runner.add("good", _ids("A: "), {"refdec_references": REF_A})
    runner.emit("bad", _ids("the quick"))
    runner.emit("good", _ids("the quick"))
    drafts = runner.step()
    assert drafts == {"bad": [], "good": _ids(" brown f")}


def test_drafts_stop_at_max_tokens_and_max_model_len(make_proposer):
    proposer = make_proposer()
    runner = FakeRunner(proposer)
    runner.add("a", _ids("A: "), {"refdec_references": REF_A}, max_tokens=12)
    runner.emit("a", _ids("the quick"))                     # 9 of 12 output tokens: 2 drafts + 1 bonus
    assert runner.step()["a"] == _ids(" b")


def test_proposer_without_the_runner_hook_says_so_and_drafts_nothing(make_proposer, caplog):
    proposer = make_proposer()
    with caplog.at_level("ERROR", logger="refdec.vllm"):
        assert proposer.propose([[1], [2]], np.array([3, 3]), np.zeros((2, 8), np.int32)) == [[], []]
    assert "without the batch's request ids" in caplog.text


def test_a_request_whose_drafting_fails_goes_on_without_drafts(make_proposer, monkeypatch):
    proposer = make_proposer()
    runner = FakeRunner(proposer)
    runner.add("a", _ids("A: "), {"refdec_references": REF_A})
    runner.add("b", _ids("A: "), {"refdec_references": REF_A})
    runner.emit("a", _ids("the quick"))
    runner.emit("b", _ids("the quick"))
    real_start = proposer._start

    def failing_start(req_id, *args):
        if req_id == "a":
            raise RuntimeError("boom")
        return real_start(req_id, *args)

    monkeypatch.setattr(proposer, "_start", failing_start)
    assert runner.step() == {"a": [], "b": _ids(" brown f")}
    runner.emit("a", _ids(" brown"))
    runner.emit("b", _ids(" brown"))
    drafts = runner.step()
    assert drafts["a"] == [] and drafts["b"] == _ids(" fox jum")
    assert proposer.request_stats()["a"]["drafting"] is False


def test_a_token_the_batch_refuses_stops_only_its_request(make_proposer):
    # a negative id (never from vLLM, but a corrupt row must not stop the batch): the batch call
    # checks every token before any proposer accepts one, so the others are drafted one by one
    proposer = make_proposer()
    runner = FakeRunner(proposer)
    runner.add("a", _ids("A: "), {"refdec_references": REF_A})
    runner.add("b", _ids("A: "), {"refdec_references": REF_A})
    runner.step()
    runner.emit("a", [-3])
    runner.emit("b", _ids("the quick"))
    assert runner.step() == {"a": [], "b": _ids(" brown f")}
    assert proposer.request_stats()["a"]["drafting"] is False
    runner.emit("a", _ids("x"))
    runner.emit("b", _ids(" brown"))
    assert runner.step() == {"a": [], "b": _ids(" fox jum")}


def test_a_failing_batch_call_stops_its_requests_and_the_worker_goes_on(make_proposer, monkeypatch, caplog):
    proposer = make_proposer()
    runner = FakeRunner(proposer)
    runner.add("a", _ids("A: "), {"refdec_references": REF_A})
    runner.step()

    def failing(*args, **kwargs):
        raise MemoryError("no room")

    monkeypatch.setattr(refdec.Proposer, "propose_batch", staticmethod(failing))
    runner.emit("a", _ids("the quick"))
    with caplog.at_level("ERROR", logger="refdec.vllm"):
        assert runner.step() == {"a": []}
    assert "its 1 requests continue without drafts" in caplog.text
    assert proposer.request_stats()["a"]["drafting"] is False  # its proposer may have accepted or not


def test_drafting_threads_give_the_same_drafts(make_proposer):
    drafts = []
    for threads in ("1", "2"):  # 40 requests: two threads of 20
        proposer = make_proposer(REFDEC_VLLM_DRAFT_THREADS=threads)
        runner = FakeRunner(proposer, max_slots=40)
        for i in range(40):
            runner.add(f"r{i}", _ids(f"{i}: "), {"refdec_references": REF_A if i % 2 else REF_B})
        runner.step()
        for i in range(40):
            runner.emit(f"r{i}", _ids((REF_A if i % 2 else REF_B)[:5 + i % 7]))
        drafts.append(runner.step())
    assert drafts[0] == drafts[1]
    assert sum(len(d) for d in drafts[0].values()) >= 40 * 6


def _saved_char_tokenizer(path):
    from tiny_models import char_tokenizer

    tok = char_tokenizer()
    tok.save_pretrained(path)
    return tok


def _index_proposer(make_proposer, monkeypatch, tmp_path, index_paths):
    """A proposer whose model_config.tokenizer is a saved char tokenizer directory."""
    from refdec.vllm import proposer as vllm_proposer

    monkeypatch.setattr(vllm_proposer, "install_runner_hook", lambda: None)
    monkeypatch.setenv("REFDEC_VLLM_INDEX", ":".join(str(p) for p in index_paths))
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=8),
                             model_config=SimpleNamespace(max_model_len=256, tokenizer=str(tmp_path / "tok")))
    return rv.VllmProposer(config)


def test_corpus_index_drafts_for_requests_without_references(make_proposer, monkeypatch, tmp_path):
    tok = _saved_char_tokenizer(tmp_path / "tok")
    refdec.CorpusIndex.build(["def add(a, b):\n    return a + b\n"], tokenizer=tok).save(tmp_path / "c.refdec")
    proposer = _index_proposer(make_proposer, monkeypatch, tmp_path, [tmp_path / "c.refdec"])
    runner = FakeRunner(proposer)
    prompt = tok("x = 1\ndef add(a, b):\n    ret")["input_ids"]
    runner.add("a", prompt)
    assert tok.decode(runner.step()["a"]) == "urn a + "


def test_index_from_another_tokenizer_is_refused_at_start(make_proposer, monkeypatch, tmp_path):
    from tiny_models import byte_tokenizer

    _saved_char_tokenizer(tmp_path / "tok")
    refdec.CorpusIndex.build(["some text"], tokenizer=byte_tokenizer()).save(tmp_path / "other.refdec")
    with pytest.raises(refdec.IndexFormatError, match="other.refdec.*was built with tokenizer fingerprint"):
        _index_proposer(make_proposer, monkeypatch, tmp_path, [tmp_path / "other.refdec"])


def test_several_index_files_are_one_sharded_index(make_proposer, monkeypatch, tmp_path):
    """Several files load as a ShardedIndex and are passed through to refdec.Proposer: it drafts
    from every shard once refdec.Proposer takes a ShardedIndex; until then start-up says so."""
    tok = _saved_char_tokenizer(tmp_path / "tok")
    refdec.CorpusIndex.build(["def add(a, b):\n    return a + b\n"], tokenizer=tok).save(tmp_path / "s0.refdec")
    refdec.CorpusIndex.build(["def mul(a, b):\n    return a * b\n"], tokenizer=tok).save(tmp_path / "s1.refdec")
    paths = [tmp_path / "s0.refdec", tmp_path / "s1.refdec"]
    try:
        refdec.Proposer(index=refdec.ShardedIndex.load_many([str(p) for p in paths], tokenizer=tok))
    except ValueError:
        with pytest.raises(ValueError, match="REFDEC_VLLM_INDEX: refdec.Proposer does not take this index"):
            _index_proposer(make_proposer, monkeypatch, tmp_path, paths)
        return
    proposer = _index_proposer(make_proposer, monkeypatch, tmp_path, paths)
    assert isinstance(proposer.index, refdec.ShardedIndex)
    runner = FakeRunner(proposer)
    runner.add("add", tok("def add(a, b):\n    ret")["input_ids"])
    runner.add("mul", tok("def mul(a, b):\n    ret")["input_ids"])
    drafts = runner.step()
    assert tok.decode(drafts["add"]).startswith("urn a +")
    assert tok.decode(drafts["mul"]).startswith("urn a *")


# ---------------------------------------------------------------------------------------------
# refdec.models.vllm_model_dir: the checkpoint layout vLLM loads


def test_vllm_model_dir_names_the_architecture_and_the_tied_embedding(tmp_path):
    import json

    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from refdec.models import vllm_model_dir

    source = tmp_path / "tied"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": True}))
    (source / "tokenizer.json").write_text("{}")
    matrix = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    save_file({"lm_head.weight": matrix, "model.norm.weight": torch.ones(3)}, str(source / "model.safetensors"))
    target = vllm_model_dir(source)
    assert target == tmp_path / "tied-vllm"
    assert json.loads((target / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        assert sorted(f.keys()) == ["model.embed_tokens.weight", "model.norm.weight"]
        assert torch.equal(f.get_tensor("model.embed_tokens.weight"), matrix)
    assert (target / "tokenizer.json").exists()
    assert vllm_model_dir(source) == target  # written once


def test_vllm_model_dir_links_weights_that_need_no_renaming(tmp_path):
    import json

    import torch
    from safetensors.torch import save_file

    from refdec.models import vllm_model_dir

    source = tmp_path / "ok"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                    "tie_word_embeddings": True}))
    save_file({"model.embed_tokens.weight": torch.ones(2, 2)}, str(source / "model.safetensors"))
    target = vllm_model_dir(source, tmp_path / "out")
    assert (target / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()


def test_vllm_model_dir_refuses_what_it_cannot_write(tmp_path):
    import json

    from refdec.models import vllm_model_dir

    with pytest.raises(ValueError, match="is not a model directory"):
        vllm_model_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-type"}))
    with pytest.raises(ValueError, match="model_type 'no-such-type' has no causal LM class"):
        vllm_model_dir(tmp_path)
