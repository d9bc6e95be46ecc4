"""refdec as the speculative proposer inside vLLM.

vLLM loads :class:`Proposer` through its ``custom_class`` speculative method::

    vllm serve MODEL --speculative-config \\
        '{"method": "custom_class", "model": "refdec.vllm.Proposer", "num_speculative_tokens": 16}'
    vllm.LLM(model=..., speculative_config=refdec.vllm.speculative_config(16))

vLLM owns the loop (continuous batching, tensor/pipeline parallelism) and verifies ONE chain
per request. Each step it calls ``propose(sampled_token_ids, num_tokens_no_spec,
token_ids_cpu)`` with one row per *batch slot*; slots move as requests finish, so this adapter
keys its state by *request id*, which the runner hook in :mod:`refdec.vllm_plugin` hands it
before each call (the batch's ``req_ids`` and vLLM's per-request states). Per request it keeps
one :class:`refdec.Proposer` (live context, the request's references with the copy cursor, the
server's corpus index), started from the prompt, advanced with the tokens vLLM accepted
(O(new tokens) a step), and freed when the request finishes or is preempted. refdec's draft
tree becomes the chain of highest expected accepted length less a cost per drafted token
(:func:`best_chain`), so a draft that will not pay is cut short or not sent.

Options (read from the environment in every vLLM process, validated at start-up):

==================================== ========================================================
``REFDEC_VLLM_INDEX``                a corpus index file, or several separated by ``:``
                                     (a :class:`refdec.ShardedIndex`); mmap, once per worker
``REFDEC_VLLM_TREE_NODES``           refdec's tree size before the chain is chosen
                                     (default num_speculative_tokens, at least 8)
``REFDEC_VLLM_TOKEN_COST``           the time of verifying one more token, as a fraction of a
                                     step's fixed time (default 0.05, the default model on this
                                     project's CPU, benchmarks/RESULTS.md section 6): sets each
                                     step's draft cost from the batch (:func:`draft_cost`)
``REFDEC_VLLM_DRAFT_COST``           a fixed draft cost instead (accepted tokens a drafted token
                                     must be worth): the chain ends where a token's estimated
                                     acceptance probability is below it
``REFDEC_VLLM_DRAFT``                ``on`` (default) or ``off``: drafting for requests that
                                     do not say (``refdec_draft``)
``REFDEC_VLLM_MAX_REFERENCE_CHARS``  the most characters of references one request may bring
                                     (default 1,000,000)
==================================== ========================================================

Per request (``SamplingParams(extra_args={...})``; over HTTP ``vllm_xargs``; on the OpenAI
server also Predicted Outputs' ``prediction={"type": "content", "content": "..."}``):
``refdec_references`` (a string or a list of strings: text to draft from, e.g. the file being
edited) and ``refdec_draft`` (false / 0 / "off": no drafts for this request). Other
``refdec_*`` keys are an error naming the key.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "Proposer", "ServerOptions", "RequestOptions", "best_chain", "draft_cost", "load_index", "parse_request_options",
    "prediction_text", "speculative_config", "PROPOSER_CLASS", "REFERENCES_KEY", "DRAFT_KEY",
]

logger = logging.getLogger(__name__)

PROPOSER_CLASS = "refdec.vllm.Proposer"
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
ENV_NAMES = (ENV_INDEX, ENV_TREE_NODES, ENV_TOKEN_COST, ENV_DRAFT_COST, ENV_DRAFT, ENV_MAX_REFERENCE_CHARS)

DEFAULT_TOKEN_COST = 0.05
DEFAULT_MAX_REFERENCE_CHARS = 1_000_000

_ON = ("1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")


def speculative_config(num_speculative_tokens: int = 16) -> dict:
    """The ``speculative_config`` that makes vLLM draft with refdec (``vllm.LLM(...,
    speculative_config=...)``; the same dict as JSON for ``vllm serve --speculative-config``)."""
    if isinstance(num_speculative_tokens, bool) or not isinstance(num_speculative_tokens, int) \
            or num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {num_speculative_tokens!r}")
    return {"method": "custom_class", "model": PROPOSER_CLASS, "num_speculative_tokens": num_speculative_tokens}


# ---------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True)
class ServerOptions:
    """The server-wide options (see the module docstring), one set per vLLM process."""

    index_paths: tuple[str, ...] = ()
    tree_nodes: int | None = None  # None: num_speculative_tokens (at least 8)
    draft_cost: float | None = None  # None: from the batch each step (token_cost)
    token_cost: float = DEFAULT_TOKEN_COST
    draft_by_default: bool = True
    max_reference_chars: int = DEFAULT_MAX_REFERENCE_CHARS

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "ServerOptions":
        """Reads and validates the ``REFDEC_VLLM_*`` variables; an unknown one (a typo) or a bad
        value is a ValueError naming the variable and the value."""
        environ = os.environ if environ is None else environ
        unknown = sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in ENV_NAMES)
        if unknown:
            raise ValueError(f"unknown refdec vLLM option(s) {unknown}; known: {list(ENV_NAMES)}")
        index_paths: tuple[str, ...] = ()
        raw = environ.get(ENV_INDEX, "").strip()
        if raw:
            index_paths = tuple(p for p in raw.split(os.pathsep) if p)
            for path in index_paths:
                if not os.path.isfile(path):
                    raise ValueError(f"{ENV_INDEX}: {path!r} is not a file (give one index path, or several "
                                     f"separated by {os.pathsep!r})")
        tree_nodes = _env_int(environ, ENV_TREE_NODES, None, lowest=1)
        draft_cost = _env_float(environ, ENV_DRAFT_COST, None)
        token_cost = _env_float(environ, ENV_TOKEN_COST, DEFAULT_TOKEN_COST)
        max_chars = _env_int(environ, ENV_MAX_REFERENCE_CHARS, DEFAULT_MAX_REFERENCE_CHARS, lowest=1)
        draft = environ.get(ENV_DRAFT, "on").strip().lower()
        if draft not in _ON + _OFF:
            raise ValueError(f"{ENV_DRAFT} must be 'on' or 'off', got {environ.get(ENV_DRAFT)!r}")
        return cls(index_paths, tree_nodes, draft_cost, token_cost, draft in _ON, max_chars)


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


def parse_request_options(extra_args: Mapping | None, *, max_reference_chars: int = DEFAULT_MAX_REFERENCE_CHARS,
                          draft_by_default: bool = True) -> RequestOptions:
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
            raise ValueError(f"{REFERENCES_KEY} must be a string or a list of strings, got {_describe(raw)}")
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
    raise ValueError(f"{name} must be true or false (or 1/0, 'on'/'off'), got {_describe(value)}")


def _describe(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def prediction_text(prediction) -> str:
    """The text of an OpenAI Predicted Outputs ``prediction``: ``{"type": "content", "content":
    str}`` or ``content`` as a list of ``{"type": "text", "text": str}`` parts (joined). Raises
    ValueError naming what is wrong."""
    if hasattr(prediction, "model_dump"):
        prediction = prediction.model_dump()
    if not isinstance(prediction, Mapping):
        raise ValueError(f"prediction must be an object {{'type': 'content', 'content': ...}}, got {_describe(prediction)}")
    if prediction.get("type", "content") != "content":
        raise ValueError(f"prediction.type must be 'content', got {prediction.get('type')!r}")
    content = prediction.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = []
        for i, part in enumerate(content):
            if not (isinstance(part, Mapping) and part.get("type", "text") == "text" and isinstance(part.get("text"), str)):
                raise ValueError(f"prediction.content[{i}] must be {{'type': 'text', 'text': str}}, got {_describe(part)}")
            parts.append(part["text"])
        return "".join(parts)
    raise ValueError(f"prediction.content must be a string or a list of text parts, got {_describe(content)}")


# ---------------------------------------------------------------------------------------------
# Tree -> chain


def draft_cost(token_cost: float, num_requests: int, emitted_per_request: float, drafted_per_request: float) -> float:
    """The acceptance probability a drafted token needs to pay for its verification, this step.

    A step verifies B requests' last tokens and drafts and takes ``a + b * (B + drafted)`` time
    (a: the fixed part, weights and scheduling; b: one more token); it emits E tokens a request
    (accepted drafts + 1). One more drafted token, accepted with probability s, adds s tokens for
    b more time: it raises throughput when ``s / b > B * E / (a + b * B * (1 + D))``, i.e. when

        s > x * B * E / (1 + x * B * (1 + D)),    x = b / a = ``token_cost``,

    with D the tokens drafted a request. With the default x = 0.05, E = 15, D = 22: 0.35 for one
    request, 0.51 for eight; as the batch grows the bound tends to E / (1 + D), the batch's own
    yield per verified token: a loaded server drafts only what is likelier than its average to be
    accepted. Measured on this CPU (benchmarks/RESULTS.md section 6): at eight clients this beats
    a fixed 0.1 by 9-22%; at one client a fixed 0.1 (``REFDEC_VLLM_DRAFT_COST=0.1``) is ~6% faster
    (x = 0.01, ~0.1 for one request, was slower at both)."""
    b = num_requests * token_cost
    return b * emitted_per_request / (1.0 + b * (1.0 + drafted_per_request))



def _best_chain_py(token_ids, parents, scores, max_len: int, draft_cost: float, out: np.ndarray) -> int:
    n = len(token_ids)
    value = [0.0] * n
    depth = [0] * n
    tokens = token_ids.tolist()
    par = parents.tolist()
    sc = scores.tolist()
    best, best_value = -1, 0.0
    for i in range(n):
        p = par[i]
        v, d = (0.0, 0) if p < 0 else (value[p], depth[p])
        v = v + sc[i] - draft_cost if tokens[i] >= 0 else float("-inf")
        d += 1
        value[i], depth[i] = v, d
        if d <= max_len and v > best_value:
            best, best_value = i, v
    if best < 0:
        return 0
    length = depth[best]
    i = best
    for j in range(length - 1, -1, -1):
        out[j] = tokens[i]
        i = par[i]
    return length


def _best_chain_nb_source(token_ids, parents, scores, max_len, draft_cost, out):  # pragma: no cover - compiled
    n = token_ids.shape[0]
    value = np.empty(n, np.float64)
    depth = np.empty(n, np.int32)
    best = -1
    best_value = 0.0
    for i in range(n):
        p = parents[i]
        v = 0.0
        d = 0
        if p >= 0:
            v = value[p]
            d = depth[p]
        if token_ids[i] >= 0:
            v += scores[i] - draft_cost
        else:
            v = -np.inf
        d += 1
        value[i] = v
        depth[i] = d
        if d <= max_len and v > best_value:
            best = i
            best_value = v
    if best < 0:
        return 0
    length = depth[best]
    i = best
    for j in range(length - 1, -1, -1):
        out[j] = token_ids[i]
        i = parents[i]
    return length


_best_chain_impl = None


def _chain_impl():
    """numba's compiled walk where numba is installed (vLLM depends on it), else the Python one.
    Imported on first use, never at import: vLLM's CPU worker scans every loaded module's
    attributes while it starts, and llvmlite's objects break that scan (vLLM 0.32)."""
    global _best_chain_impl
    if _best_chain_impl is None:
        try:
            from numba import njit
        except ImportError:  # pragma: no cover - depends on the environment
            _best_chain_impl = _best_chain_py
        else:
            _best_chain_impl = njit(cache=False, nogil=True)(_best_chain_nb_source)
    return _best_chain_impl


def best_chain(token_ids: np.ndarray, parents: np.ndarray, scores: np.ndarray, max_len: int,
               draft_cost: float = 0.0, out: np.ndarray | None = None) -> np.ndarray:
    """The chain vLLM verifies, from a refdec draft tree.

    ``token_ids`` int32 (n,), ``parents`` int32 (n,) (-1 = child of the root, topological order),
    ``scores`` float32 (n,) (estimated probability that the path to the node is accepted).
    Returns the tokens (int32, root first) of the root path ending at the node of depth
    <= ``max_len`` that maximises ``sum over the path of (score - draft_cost)``: with no cost,
    the path of highest expected accepted length (the expected number of accepted tokens of a
    chain is the sum of its nodes' scores); with a cost, the chain stops where a further token's
    expected gain falls below its cost, and is empty when no token pays. Ties go to the node
    first in the tree (refdec builds best first). Nodes with a negative token id (a corrupt
    index body) and their subtrees are never chosen. ``out`` (int32, length >= max_len) is
    reused when given; the result is a view of it."""
    n = token_ids.shape[0]
    if out is None:
        out = np.empty(max(max_len, 1), dtype=np.int32)
    if n == 0 or max_len <= 0:
        return out[:0]
    length = (_best_chain_impl or _chain_impl())(token_ids, parents, scores, int(max_len), float(draft_cost), out)
    return out[:length]


# ---------------------------------------------------------------------------------------------
# Corpus index


def load_index(paths, tokenizer=None):
    """One :class:`refdec.CorpusIndex` (one path) or a :class:`refdec.ShardedIndex` (several),
    memory-mapped; an index built with another tokenizer than ``tokenizer`` is an error naming
    the file. None for no path."""
    from refdec.index import CorpusIndex, ShardedIndex

    paths = [os.fspath(p) for p in (paths or ())]
    if not paths:
        return None
    shards = [CorpusIndex.load(p, tokenizer=tokenizer) for p in paths]
    return shards[0] if len(shards) == 1 else ShardedIndex(shards)


# ---------------------------------------------------------------------------------------------
# The vLLM proposer


@dataclass
class _RequestDraft:
    """refdec's state for one request (keyed by request id, never by batch slot)."""

    req_state: object  # vLLM's CachedRequestState: a new object under the same id is a new request
    proposer: object | None  # refdec.Proposer, or None: no drafts for this request
    num_tokens_fed: int = 0  # prompt + output tokens the proposer has seen
    max_tokens: int | None = None  # the request's SamplingParams.max_tokens
    last_chain: list = field(default_factory=list)  # the chain sent last step (token ids)
    num_drafted: int = 0
    num_accepted: int = 0


class Proposer:
    """vLLM's ``custom_class`` proposer: ``Proposer(vllm_config)``, then each step
    ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`` -> one list of at most
    ``num_speculative_tokens`` token ids per batch slot (see the module docstring).

    ``sampled_token_ids``: one list per batch slot, the tokens vLLM emitted for it this step
    (empty: a partial prefill, no draft). ``num_tokens_no_spec``: int (max_num_reqs,), tokens
    per slot. ``token_ids_cpu``: int32 (max_num_reqs, max_model_len), each slot's prompt +
    output tokens. Which request a slot holds comes from :meth:`bind_batch`, which the runner
    hook calls before each ``propose``.
    """

    def __init__(self, vllm_config) -> None:
        import refdec
        from refdec import vllm_plugin

        spec = vllm_config.speculative_config
        self.num_speculative_tokens = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.options = ServerOptions.from_env()
        self.tree_nodes = self.options.tree_nodes or max(self.num_speculative_tokens, 8)
        self._emitted_avg = 2.0  # tokens emitted a request a step (running mean)
        self._drafted_avg = 0.0  # tokens drafted a request a step (running mean)
        self._step_emitted = self._step_drafted = self._step_fed = self._step_drafting = 0
        self._step_cost = 0.0
        self._model_config = vllm_config.model_config
        self._tokenizer = None
        if self._model_config.tokenizer is not None:  # at start-up, not in the first request's step
            self._get_tokenizer()
        self.index = None
        if self.options.index_paths:
            self.index = load_index(self.options.index_paths, tokenizer=self._get_tokenizer())
            try:  # the index object is passed through: refdec.Proposer says what it accepts
                refdec.Proposer(index=self.index, max_depth=self.num_speculative_tokens)
            except ValueError as exc:
                raise ValueError(f"{ENV_INDEX}: refdec.Proposer does not take this index ({exc}); with several "
                                 "files it needs ShardedIndex support in refdec.Proposer: give one file") from exc
        self._requests: dict[str, _RequestDraft] = {}
        self._batch_req_ids: list[str] | None = None
        self._vllm_requests: Mapping[str, object] = {}
        self._chain_buf = np.empty(self.num_speculative_tokens, dtype=np.int32)
        self._warned_unbound = False
        best_chain(np.zeros(1, np.int32), np.full(1, -1, np.int32), np.ones(1, np.float32), 1, 0.0)  # compile
        vllm_plugin.install_runner_hook()
        logger.info("refdec proposer: k=%d, tree nodes %d, draft cost %s, index %s", self.num_speculative_tokens,
                    self.tree_nodes, self.options.draft_cost if self.options.draft_cost is not None else
                    f"from the batch (token cost {self.options.token_cost:g})", list(self.options.index_paths) or None)

    # -- vLLM's interface ----------------------------------------------------------------

    def load_model(self, *args, **kwargs) -> None:
        """No model: refdec drafts from indexes."""

    def bind_batch(self, req_ids: list[str], vllm_requests: Mapping[str, object],
                   finished_req_ids=(), preempted_req_ids=()) -> None:
        """Called by the runner hook before each ``propose``: ``req_ids[batch_slot]`` is the request
        in that slot this step; ``vllm_requests`` maps request id -> vLLM's CachedRequestState
        (prompt, sampling params, outputs). Frees the state of finished and preempted requests."""
        self._batch_req_ids = req_ids
        self._vllm_requests = vllm_requests
        for req_id in finished_req_ids or ():
            self._requests.pop(req_id, None)
        for req_id in preempted_req_ids or ():
            self._requests.pop(req_id, None)

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings=None, **kwargs) -> list[list[int]]:
        req_ids = self._batch_req_ids
        if req_ids is None:  # only if vLLM drafts past the hooked method: no drafts, never a wrong request's
            if not self._warned_unbound:
                logger.error("refdec.vllm.Proposer.propose was called without the batch's request ids (the runner "
                             "hook refdec.vllm_plugin.install_runner_hook did not run): no drafts")
                self._warned_unbound = True
            return [[] for _ in sampled_token_ids]
        drafts: list[list[int]] = []
        if self.options.draft_cost is not None:
            self._step_cost = self.options.draft_cost
        else:
            num_requests = sum(1 for sampled in sampled_token_ids if sampled)
            self._step_cost = draft_cost(self.options.token_cost, num_requests, self._emitted_avg, self._drafted_avg)
        self._step_emitted = self._step_drafted = self._step_fed = self._step_drafting = 0
        for batch_slot, sampled in enumerate(sampled_token_ids):
            if not sampled:  # a partial prefill, or a discarded row
                drafts.append([])
                continue
            req_id = req_ids[batch_slot]
            try:
                drafts.append(self._propose_one(req_id, batch_slot, num_tokens_no_spec, token_ids_cpu))
            except Exception:  # never take the worker down: this request goes on without drafts
                logger.exception("refdec: drafting failed for request %s; it continues without drafts", req_id)
                self._requests[req_id] = _RequestDraft(self._vllm_requests.get(req_id), None,
                                                       num_tokens_fed=int(num_tokens_no_spec[batch_slot]))
                drafts.append([])
        if self._step_fed:  # running means over the last ~10 steps
            self._emitted_avg += 0.1 * (self._step_emitted / self._step_fed - self._emitted_avg)
        if self._step_drafting:
            self._drafted_avg += 0.1 * (self._step_drafted / self._step_drafting - self._drafted_avg)
        if len(self._requests) > len(self._vllm_requests):  # requests vLLM no longer holds
            for req_id in [r for r in self._requests if r not in self._vllm_requests]:
                del self._requests[req_id]
        self._batch_req_ids = None  # a stale slot -> request map is never reused
        return drafts

    # -- one request ------------------------------------------------------------------------

    def _propose_one(self, req_id: str, batch_slot: int, num_tokens_no_spec, token_ids_cpu) -> list[int]:
        num_tokens = int(num_tokens_no_spec[batch_slot])
        state = self._requests.get(req_id)
        req_state = self._vllm_requests.get(req_id)
        if state is None or state.req_state is not req_state or state.num_tokens_fed > num_tokens:
            state = self._start(req_id, req_state, token_ids_cpu[batch_slot], num_tokens)
        elif state.num_tokens_fed < num_tokens:
            new_tokens = token_ids_cpu[batch_slot, state.num_tokens_fed:num_tokens]
            if state.last_chain:  # one verification: the accepted draft prefix + 1 token of vLLM's
                state.num_accepted += min(len(new_tokens) - 1, len(state.last_chain))
            self._step_emitted += len(new_tokens)
            self._step_fed += 1
            if state.proposer is not None:
                state.proposer.accept(new_tokens)
            state.num_tokens_fed = num_tokens
        state.last_chain = []
        if state.proposer is None:
            return []
        max_len = min(self.num_speculative_tokens, self.max_model_len - num_tokens - 1)
        max_tokens = state.max_tokens
        if max_tokens is not None:  # no drafts past the request's last token
            max_len = min(max_len, max_tokens - len(req_state.output_token_ids) - 1)
        if max_len <= 0:
            return []
        tree = state.proposer.propose(self.tree_nodes)
        chain = best_chain(tree.token_ids, tree.parents, tree.scores, max_len, self._step_cost,
                           out=self._chain_buf).tolist()
        self._step_drafted += len(chain)
        self._step_drafting += 1
        state.last_chain = chain
        state.num_drafted += len(chain)
        return chain

    def _start(self, req_id: str, req_state, row_tokens: np.ndarray, num_tokens: int) -> _RequestDraft:
        """A new (or resumed) request: its proposer over the prompt, then its outputs so far. O(context), once."""
        import refdec

        params = getattr(req_state, "sampling_params", None)
        extra_args = getattr(params, "extra_args", None)
        try:
            options = parse_request_options(extra_args, max_reference_chars=self.options.max_reference_chars,
                                            draft_by_default=self.options.draft_by_default)
        except ValueError as exc:  # the front end refuses these; a request that got here anyway drafts nothing
            logger.warning("refdec: request %s: %s; it continues without drafts", req_id, exc)
            options = RequestOptions(draft=False)
        max_tokens = getattr(params, "max_tokens", None)
        state = _RequestDraft(req_state, None, num_tokens_fed=num_tokens,
                              max_tokens=None if max_tokens is None else int(max_tokens))
        self._requests[req_id] = state
        if not options.draft:
            return state
        references = None
        if options.references:
            tokenizer = self._get_tokenizer()
            references = [np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int32)
                          for text in options.references]
        num_prompt = getattr(req_state, "num_prompt_tokens", None)
        num_prompt = num_tokens if num_prompt is None else min(int(num_prompt), num_tokens)
        proposer = refdec.Proposer(index=self.index, references=references, max_depth=self.num_speculative_tokens,
                                   cursor=bool(references))
        proposer.start(row_tokens[:num_prompt])
        if num_prompt < num_tokens:
            proposer.accept(row_tokens[num_prompt:num_tokens])
        state.proposer = proposer
        return state

    def _get_tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            mc = self._model_config
            self._tokenizer = AutoTokenizer.from_pretrained(
                mc.tokenizer, revision=getattr(mc, "tokenizer_revision", None),
                trust_remote_code=bool(getattr(mc, "trust_remote_code", False)))
        return self._tokenizer

    # -- introspection (tests, benchmarks) -------------------------------------------------

    def request_stats(self) -> dict[str, dict[str, int]]:
        """Per live request id: drafted and accepted draft tokens so far, and whether it drafts."""
        return {req_id: {"drafted": s.num_drafted, "accepted": s.num_accepted, "drafting": s.proposer is not None}
                for req_id, s in self._requests.items()}
