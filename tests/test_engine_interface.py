"""Specifies refdec.engine.interface, what the engine asks of a backend: the ``Backend`` and
``RunningBatch`` protocols declare every member the engine's modules use (read from their code),
the transformers backend has them all (the llama.cpp one: tests/test_llama_cpp_backend.py), and
``target_rule`` gives each row's rule: None for plain greedy, a ``SampledRule`` (the sampler's
token at the row's absolute position) for plain sampling, and with logits settings a rule that
applies them with the sequence on the row's path."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from refdec.drafting.tree import DraftTree
from refdec.engine import interface
from refdec.engine.interface import Backend, RunningBatch, SampledRule, target_rule
from refdec.engine.processors import PathLogitsProcessor
from refdec.engine.requests import Request
from refdec.engine.results import DecodingStats
from refdec.engine.sampling import TargetSampler
from refdec.engine.stops import StopChecker
from refdec.transformers.backend import TransformersBackend

ENGINE = Path(interface.__file__).resolve().parent


def _members(protocol) -> set[str]:
    """The members a Protocol class declares (annotated attributes and methods)."""
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")}
    return names | ({"__len__"} if "__len__" in vars(protocol) else set())


def _used(variable: str) -> set[str]:
    """Every ``<variable>.<member>`` the engine's modules read or call (their parameters named so)."""
    used = set()
    for path in ENGINE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value  # `backend.x`, or `self.backend.x`
            if (isinstance(owner, ast.Name) and owner.id == variable) or (
                    isinstance(owner, ast.Attribute) and owner.attr == variable):
                used.add(node.attr)
        for node in ast.walk(ast.parse(path.read_text())):  # getattr(backend, "x", ...)
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                    and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id == variable
                    and isinstance(node.args[1], ast.Constant)):
                used.add(node.args[1].value)
    return used


def test_the_protocols_declare_every_member_the_engine_uses():
    assert _used("backend") - _members(Backend) == set()
    assert _used("batch") - _members(RunningBatch) == set()
    assert {"verify", "prefill_steps", "new_batch", "fit_tree", "auto_cost_curve"} <= _used("backend")  # the read works


def test_the_transformers_backend_has_every_member_of_the_protocol(llama):
    backend = TransformersBackend(llama)
    missing = [name for name in _members(Backend) if not hasattr(backend, name)]
    assert not missing
    batch = backend.new_batch()
    assert not [name for name in _members(RunningBatch) if not hasattr(batch, name)]
    assert backend.tokenizer is None  # a transformers model brings none


def _request(seed: int | None = None, do_sample: bool = False, processor=None) -> Request:
    sampler = TargetSampler(8, do_sample=do_sample, temperature=1.0, top_k=None, top_p=None, seed=seed,
                            device=torch.device("cpu"))
    request = Request(0, np.array([1, 2, 3]), 10, None, stats=DecodingStats(), sampler=sampler,
                      stopper=StopChecker(set(), [], None), drafter=None, budget=None, started=time.perf_counter(),
                      processor=processor)
    request.emit([4])
    return request


def test_plain_greedy_rows_have_no_rule():
    assert target_rule(_request(), DraftTree.chain([5, 6])) is None


def test_a_sampled_rows_rule_draws_the_samplers_token_at_the_rows_absolute_position():
    request = _request(seed=11, do_sample=True)
    rule = target_rule(request, DraftTree.chain([5, 6]))
    assert isinstance(rule, SampledRule) and rule.root_pos == request.root_pos
    logits = torch.randn(8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for depth in range(3):
        assert rule(logits, depth, depth) == request.sampler.sample(logits, request.root_pos + 1 + depth)


def test_a_rule_with_logits_settings_sees_the_sequence_on_the_rows_path():
    seen = []

    class Recording(PathLogitsProcessor):
        active = True

        def target(self, logits_row, sequence, prompt_len, sampler, position):
            seen.append((list(sequence), prompt_len, position))
            return 0

    request = _request(processor=Recording())
    tree = DraftTree(np.array([5, 6, 7]), np.array([-1, 0, -1]), np.ones(3, np.float32))
    rule = target_rule(request, tree)
    rule(torch.zeros(8), 2, 2)  # row 2 = node 1, below node 0
    assert seen == [([1, 2, 3, 4, 5, 6], 3, request.root_pos + 3)]


@pytest.mark.parametrize("protocol", [Backend, RunningBatch])
def test_every_member_of_the_protocols_is_documented(protocol):
    source = ast.parse(Path(interface.__file__).read_text())
    cls = next(node for node in source.body if isinstance(node, ast.ClassDef) and node.name == protocol.__name__)
    lines = Path(interface.__file__).read_text().splitlines()
    for node in cls.body:
        if isinstance(node, ast.AnnAssign):  # an attribute: a comment on its line
            assert "#" in lines[node.lineno - 1], node.target.id
        elif isinstance(node, ast.FunctionDef) and node.name != "__len__":
            assert ast.get_docstring(node), node.name
