"""Specifies refdec.vllm.options (no vLLM): a request's ``refdec_*`` options (references, the
draft switch, OpenAI's Predicted Outputs) and the server's ``REFDEC_VLLM_*`` environment, each
validated with an error naming the key or the variable, and ``speculative_config``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from refdec import vllm as rv
from refdec.vllm import options


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
                                      "REFDEC_VLLM_DRAFT_THREADS": "2", "REFDEC_VLLM_MEMORY_MB": "1.5"})
    assert opts == rv.ServerOptions(index_paths=(str(a), str(b)), tree_nodes=40, draft_cost=0.25, token_cost=0.01,
                                    draft_by_default=False, max_reference_chars=10, draft_threads=2, memory_mb=1.5)


@pytest.mark.parametrize("env, message", [
    ({"REFDEC_VLLM_INDX": "x"}, r"unknown refdec vLLM option\(s\) \['REFDEC_VLLM_INDX'\]"),
    ({"REFDEC_VLLM_INDEX": "/no/such.refdec"}, "REFDEC_VLLM_INDEX: '/no/such.refdec' is not a file"),
    ({"REFDEC_VLLM_TREE_NODES": "0"}, "REFDEC_VLLM_TREE_NODES must be an integer >= 1, got '0'"),
    ({"REFDEC_VLLM_DRAFT_COST": "-1"}, "REFDEC_VLLM_DRAFT_COST must be a finite number >= 0"),
    ({"REFDEC_VLLM_DRAFT_COST": "nan"}, "REFDEC_VLLM_DRAFT_COST must be a finite number >= 0"),
    ({"REFDEC_VLLM_DRAFT": "sometimes"}, "REFDEC_VLLM_DRAFT must be 'on' or 'off'"),
    ({"REFDEC_VLLM_DRAFT_THREADS": "0"}, "REFDEC_VLLM_DRAFT_THREADS must be an integer >= 1, got '0'"),
    ({"REFDEC_VLLM_MEMORY_MB": "-2"}, "REFDEC_VLLM_MEMORY_MB must be a finite number >= 0"),
])
def test_server_options_refuse_bad_values_naming_the_variable(env, message):
    with pytest.raises(ValueError, match=message):
        rv.ServerOptions.from_env(env)


def test_speculative_config():
    assert rv.speculative_config(8) == {"method": "custom_class", "model": "refdec.vllm.VllmProposer",
                                        "num_speculative_tokens": 8}
    with pytest.raises(ValueError, match="num_speculative_tokens must be an int >= 1, got 0"):
        rv.speculative_config(0)


# ---------------------------------------------------------------------------------------------
# The defaults have one home: ServerOptions; docs/vllm.md's list of variables is checked against it

DOCS = Path(__file__).resolve().parents[1] / "docs" / "vllm.md"
# variable -> the ServerOptions field it sets
ENV_FIELDS = {options.ENV_INDEX: "index_paths", options.ENV_TREE_NODES: "tree_nodes",
              options.ENV_DRAFT_COST: "draft_cost", options.ENV_TOKEN_COST: "token_cost",
              options.ENV_DRAFT: "draft_by_default", options.ENV_MAX_REFERENCE_CHARS: "max_reference_chars",
              options.ENV_THREADS: "draft_threads", options.ENV_MEMORY_MB: "memory_mb"}


def _documented_defaults() -> dict[str, str | None]:
    """variable -> the default docs/vllm.md's list gives it (the text after "default"), or None."""
    found = {}
    for item in re.split(r"\n- ", DOCS.read_text()):
        match = re.match(r"`(REFDEC_VLLM_[A-Z_]+)[`=]", item)
        if match and match.group(1) not in found:
            default = re.search(r"default ([0-9][0-9,.]*[0-9]|[a-z]+\b)", item)
            found[match.group(1)] = default.group(1) if default else None
    return found


def test_every_server_option_is_documented_with_the_default_it_has():
    documented = _documented_defaults()
    assert set(ENV_FIELDS) == set(options.ENV_NAMES)
    assert set(documented) == set(options.ENV_NAMES), "docs/vllm.md lists other variables than options.py reads"
    default = rv.ServerOptions()
    numeric = {name: text for name, text in documented.items() if text and text[0].isdigit()}
    assert numeric, "docs/vllm.md gives no numeric default"
    for name, text in numeric.items():
        assert float(text.replace(",", "")) == getattr(default, ENV_FIELDS[name]), (name, text)
    assert rv.ServerOptions.from_env({}) == default  # the environment's defaults are the dataclass's
