"""refdec's options inside vLLM: the server's (environment, validated at start-up) and each
request's (``SamplingParams.extra_args``; Predicted Outputs' ``prediction``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from refdec.prediction import describe
from refdec.tokens import check_int

__all__ = ["DRAFT_KEY", "PROPOSER_CLASS", "REFERENCES_KEY", "RequestOptions", "ServerOptions",
           "parse_request_options", "speculative_config"]

PROPOSER_CLASS = "refdec.vllm.VllmProposer"
REFERENCES_KEY = "refdec_references"
DRAFT_KEY = "refdec_draft"
REQUEST_KEYS = (REFERENCES_KEY, DRAFT_KEY)

ENV_PREFIX = "REFDEC_VLLM_"
ENV_INDEX = "REFDEC_VLLM_INDEX"
ENV_TREE_NODES = "REFDEC_VLLM_TREE_NODES"
ENV_DRAFT_COST = "REFDEC_VLLM_DRAFT_COST"
ENV_TOKEN_COST = "REFDEC_VLLM_TOKEN_COST"
ENV_DRAFT = "REFDEC_VLLM_DRAFT"
ENV_MAX_REFERENCE_CHARS = "REFDEC_VLLM_MAX_REFERENCE_CHARS"
ENV_THREADS = "REFDEC_VLLM_DRAFT_THREADS"
ENV_MEMORY_MB = "REFDEC_VLLM_MEMORY_MB"
ENV_NAMES = (ENV_INDEX, ENV_TREE_NODES, ENV_TOKEN_COST, ENV_DRAFT_COST, ENV_DRAFT, ENV_MAX_REFERENCE_CHARS,
             ENV_THREADS, ENV_MEMORY_MB)

_ON = ("1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")


def speculative_config(num_speculative_tokens: int = 16) -> dict:
    """The ``speculative_config`` that makes vLLM draft with refdec (``vllm.LLM(...,
    speculative_config=...)``; the same dict as JSON for ``vllm serve --speculative-config``)."""
    num_speculative_tokens = check_int("num_speculative_tokens", num_speculative_tokens, 1)
    return {"method": "custom_class", "model": PROPOSER_CLASS, "num_speculative_tokens": num_speculative_tokens}


# ---------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True)
class ServerOptions:
    """The server-wide options (see the module docstring), one set per vLLM process. The defaults
    here are the only ones: the environment's are read from them, and docs/vllm.md's list is
    checked against them (tests/test_vllm_options.py)."""

    index_paths: tuple[str, ...] = ()
    tree_nodes: int | None = None  # None: num_speculative_tokens (at least 8)
    draft_cost: float | None = None  # a fixed price of a drafted token; None: priced by the batch each step
    token_cost: float = 0.05  # one more verified token / a step's fixed time (refdec.vllm.token_price)
    draft_by_default: bool = True
    max_reference_chars: int = 1_000_000
    draft_threads: int = 1  # threads drafting a step's batch (refdec.Proposer.propose_batch's num_threads)
    memory_mb: float = 0.0  # past outputs kept to draft later requests (refdec.OutputMemory), MiB; 0: none

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "ServerOptions":
        """Reads and validates the ``REFDEC_VLLM_*`` variables; an unknown one (a typo) or a bad
        value is a ValueError naming the variable and the value."""
        environ = os.environ if environ is None else environ
        default = cls()
        unknown = sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in ENV_NAMES)
        if unknown:
            raise ValueError(f"unknown refdec vLLM option(s) {unknown}; known: {list(ENV_NAMES)}")
        index_paths = default.index_paths
        raw = environ.get(ENV_INDEX, "").strip()
        if raw:
            index_paths = tuple(p for p in raw.split(os.pathsep) if p)
            for path in index_paths:
                if not os.path.isfile(path):
                    raise ValueError(f"{ENV_INDEX}: {path!r} is not a file (give one index path, or several "
                                     f"separated by {os.pathsep!r})")
        tree_nodes = _env_int(environ, ENV_TREE_NODES, default.tree_nodes, lowest=1)
        draft_cost = _env_float(environ, ENV_DRAFT_COST, default.draft_cost)
        token_cost = _env_float(environ, ENV_TOKEN_COST, default.token_cost)
        max_chars = _env_int(environ, ENV_MAX_REFERENCE_CHARS, default.max_reference_chars, lowest=1)
        draft = environ.get(ENV_DRAFT, "").strip().lower()
        if draft and draft not in _ON + _OFF:
            raise ValueError(f"{ENV_DRAFT} must be 'on' or 'off', got {environ.get(ENV_DRAFT)!r}")
        draft_by_default = draft in _ON if draft else default.draft_by_default
        threads = _env_int(environ, ENV_THREADS, default.draft_threads, lowest=1)
        memory_mb = _env_float(environ, ENV_MEMORY_MB, default.memory_mb)
        return cls(index_paths, tree_nodes, draft_cost, token_cost, draft_by_default, max_chars, threads, memory_mb)


def _env_int(environ, name: str, default, *, lowest: int):
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < lowest:
        raise ValueError(f"{name} must be an integer >= {lowest}, got {environ.get(name)!r}")
    return value


def _env_float(environ, name: str, default):
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (0.0 <= value < float("inf")):
        raise ValueError(f"{name} must be a finite number >= 0, got {environ.get(name)!r}")
    return value


@dataclass(frozen=True)
class RequestOptions:
    """One request's refdec options, parsed from ``SamplingParams.extra_args``."""

    references: tuple[str, ...] = ()
    draft: bool = True


def parse_request_options(extra_args: Mapping | None, *,
                          max_reference_chars: int = ServerOptions.max_reference_chars,
                          draft_by_default: bool = ServerOptions.draft_by_default) -> RequestOptions:
    """Validates the ``refdec_*`` keys of a request's ``extra_args`` (other keys belong to others
    and are left alone). Raises ValueError naming the key and the bad value: references that are
    not a string or a list of strings, an empty one, more than ``max_reference_chars`` characters
    in all, a ``refdec_draft`` that is not a boolean, or an unknown ``refdec_*`` key."""
    if not extra_args:
        return RequestOptions(draft=draft_by_default)
    unknown = sorted(k for k in extra_args if isinstance(k, str) and k.startswith("refdec_") and k not in REQUEST_KEYS)
    if unknown:
        raise ValueError(f"unknown refdec request option(s) {unknown}; known: {list(REQUEST_KEYS)}")
    references: tuple[str, ...] = ()
    raw = extra_args.get(REFERENCES_KEY)
    if raw is not None:
        items = [raw] if isinstance(raw, str) else raw
        if not isinstance(items, (list, tuple)) or not all(isinstance(r, str) for r in items):
            raise ValueError(f"{REFERENCES_KEY} must be a string or a list of strings, got {describe(raw)}")
        total = 0
        for i, ref in enumerate(items):
            if not ref:
                raise ValueError(f"{REFERENCES_KEY}[{i}] is an empty string; give text to draft from or leave it out")
            total += len(ref)
        if total > max_reference_chars:
            raise ValueError(f"{REFERENCES_KEY} holds {total:,} characters, more than the server's limit of "
                             f"{max_reference_chars:,} ({ENV_MAX_REFERENCE_CHARS})")
        references = tuple(items)
    draft = draft_by_default
    if DRAFT_KEY in extra_args:
        draft = _parse_bool(extra_args[DRAFT_KEY], DRAFT_KEY)
    return RequestOptions(references, draft)


def _parse_bool(value, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _ON + _OFF:
        return value.strip().lower() in _ON
    raise ValueError(f"{name} must be true or false (or 1/0, 'on'/'off'), got {describe(value)}")


# ---------------------------------------------------------------------------------------------
# Tree -> chain
