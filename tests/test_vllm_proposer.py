"""Specifies refdec.vllm.proposer (no vLLM): ``VllmProposer``'s per-request bookkeeping against a
stand-in for vLLM's runner (batch slots that move, requests that finish, are preempted or come
back under the same id), each request drafting from its own references or the server's corpus
index, chains priced by the batch and learnt from what vLLM accepted, failures confined to their
request; the class resolves by its dotted names. The engine tests are in test_vllm.py (they need
vLLM)."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import numpy as np
import pytest

import refdec
from refdec import vllm as rv
from refdec.vllm import options as vllm_options


def test_the_proposer_class_resolves_by_its_dotted_name():
    # vLLM imports a custom_class by its dotted path; the old alias refdec.vllm.Proposer is gone (0.1.0
    # was never released with it), so the per-request drafter refdec.Proposer is the only Proposer
    module, name = vllm_options.PROPOSER_CLASS.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name) is rv.VllmProposer
    assert not hasattr(rv, "Proposer") and rv.VllmProposer is not refdec.Proposer



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


def test_a_finished_requests_output_drafts_for_a_later_request_with_the_memory_on(make_proposer):
    text = "the memory keeps what an earlier request wrote"
    for memory_mb, drafts in (("0", False), ("1", True)):
        proposer = make_proposer(REFDEC_VLLM_MEMORY_MB=memory_mb)
        runner = FakeRunner(proposer)
        runner.add("first", _ids("q: "))
        runner.step()
        runner.emit("first", _ids(text))
        runner.step()
        runner.step(finished=runner.finish("first"))
        runner.add("second", _ids("q: the memory"))  # its prompt ends as the first output went on
        chain = runner.step()["second"]
        assert (chain[:5] == _ids(" keep")) is drafts, chain
