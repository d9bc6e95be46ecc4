"""The ``custom_class`` proposer vLLM builds in each worker (see the package docstring)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from transformers import AutoTokenizer

import refdec
from refdec.drafting.index import CorpusIndex, ShardedIndex
from refdec.drafting.tree import DraftBatch, DraftTree
from refdec.sizing.acceptance import AcceptanceTable
from refdec.vllm.chain import choose_chains
from refdec.vllm.hooks import wrap_once
from refdec.vllm.options import ENV_INDEX, RequestOptions, ServerOptions, parse_request_options

__all__ = ["VllmProposer", "install_runner_hook", "load_index"]

logger = logging.getLogger(__name__)

_NO_TOKENS = np.zeros(0, np.int32)

def load_index(paths, tokenizer=None):
    """One :class:`refdec.CorpusIndex` (one path) or a :class:`refdec.ShardedIndex` (several),
    memory-mapped; an index built with another tokenizer than ``tokenizer`` is an error naming
    the file. None for no path."""
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
    last_cells: np.ndarray | None = None  # int64: its nodes' AcceptanceTable cells
    num_drafted: int = 0
    num_accepted: int = 0


class VllmProposer:
    """vLLM's ``custom_class`` proposer: ``VllmProposer(vllm_config)``, then each step
    ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`` -> one list of at most
    ``num_speculative_tokens`` token ids per batch slot (see the module docstring).

    ``sampled_token_ids``: one list per batch slot, the tokens vLLM emitted for it this step
    (empty: a partial prefill, no draft). ``num_tokens_no_spec``: int (max_num_reqs,), tokens
    per slot. ``token_ids_cpu``: int32 (max_num_reqs, max_model_len), each slot's prompt +
    output tokens. Which request a slot holds comes from :meth:`bind_batch`, which the runner
    hook calls before each ``propose``.
    """

    def __init__(self, vllm_config) -> None:
        spec = vllm_config.speculative_config
        self.num_speculative_tokens = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.options = ServerOptions.from_env()
        self.tree_nodes = self.options.tree_nodes or max(self.num_speculative_tokens, 8)
        # how often each kind of node is accepted, learnt from vLLM's verifications (one table
        # per worker: every request's drafts teach it). A node's score already is its path's
        # probability, so deep cells' prior is not lowered further (prior_depth_decay=1): a cap
        # there would never lift, since nodes under the price are never verified.
        self.acceptance = AcceptanceTable(len(refdec.Proposer.source_names), prior_depth_decay=1.0)
        self._verified_cells: list[np.ndarray] = []  # this step's observations for the table
        self._accepted_cells: list[np.ndarray] = []
        self.last_price = 0.0  # the last step's price of a verified token (diagnostics)
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
        # past outputs of this worker's requests, drafting for later ones (shared by every request: vLLM
        # gives the proposer no tenant; docs/vllm.md says why it is off by default)
        self.memory = (refdec.OutputMemory(int(self.options.memory_mb * (1 << 20)))
                       if self.options.memory_mb > 0 else None)
        self._requests: dict[str, _RequestDraft] = {}
        self._batch_req_ids: list[str] | None = None
        self._vllm_requests: Mapping[str, object] = {}
        self._warned_unbound = False
        k = self.num_speculative_tokens
        one = np.zeros(1, np.int32)
        choose_chains(one, np.full(1, -1, np.int32), np.ones(1, np.float32), one, np.ones(1, np.int32),
                      np.array([0, 1]), np.ones(1, np.int64), self.acceptance.rates, None, 0.1, 1, np.zeros((1, k), np.int32),
                      np.zeros((1, k)), np.zeros((1, k), np.int64), np.zeros(1, np.int64))  # compiles (numba) now
        install_runner_hook()
        price = self.options.draft_cost
        logger.info("refdec proposer: k=%d, tree nodes %d, price of a drafted token %s, index %s",
                    self.num_speculative_tokens, self.tree_nodes,
                    f"fixed {price:g}" if price is not None else
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
            state = self._requests.pop(req_id, None)
            if state is not None and self.memory is not None:
                outputs = getattr(state.req_state, "output_token_ids", None)
                if outputs:
                    self.memory.add(np.asarray(outputs, dtype=np.int32))
        for req_id in preempted_req_ids or ():
            self._requests.pop(req_id, None)

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings=None, **kwargs) -> list[list[int]]:
        req_ids = self._batch_req_ids
        if req_ids is None:  # only if vLLM drafts past the hooked method: no drafts, never a wrong request's
            if not self._warned_unbound:
                logger.error("refdec.vllm.VllmProposer.propose was called without the batch's request ids (the runner "
                             "hook refdec.vllm.proposer.install_runner_hook did not run): no drafts")
                self._warned_unbound = True
            return [[] for _ in sampled_token_ids]
        # 1. each request: what vLLM emitted for it since its last step (and what it accepted of
        # its last chain); a new request starts its proposer
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        num_rows = 0
        drafting = []  # (batch_slot, state, max_len) of the requests that draft
        new_tokens = []  # their tokens to accept (int32 views of token_ids_cpu rows)
        num_tokens_of = num_tokens_no_spec[:len(sampled_token_ids)].tolist()
        for batch_slot, sampled in enumerate(sampled_token_ids):
            if not sampled:  # a partial prefill, or a discarded row
                continue
            num_rows += 1
            req_id = req_ids[batch_slot]
            try:
                found = self._advance(req_id, batch_slot, num_tokens_of[batch_slot], token_ids_cpu)
            except Exception:  # never take the worker down: this request goes on without drafts
                self._drafting_failed(req_id, num_tokens_of[batch_slot])
                continue
            if found is not None:
                drafting.append((batch_slot, found[0], found[2]))
                new_tokens.append(found[1])
        # 2. their trees in one C++ call, then their chains, priced together
        batch = None
        if drafting:
            try:
                batch = self._propose_batch(drafting, new_tokens)
            except Exception:  # never take the worker down: these requests go on without drafts
                logger.exception("refdec: drafting this step's batch failed; its %d requests continue without "
                                 "drafts", len(drafting))
                for _, state, _ in drafting:  # their proposers may have accepted this step's tokens or not
                    state.proposer = None
        if batch is not None:
            try:
                self._choose_chains(drafting, batch, num_rows, drafts)
            except Exception:  # never take the worker down: no drafts this step
                logger.exception("refdec: choosing this step's chains failed; no drafts this step")
                drafts = [[] for _ in sampled_token_ids]
                for _, state, _ in drafting:
                    state.last_chain = []
        # 3. what vLLM accepted of last step's chains teaches the table
        if self._verified_cells:
            self.acceptance.observe(np.concatenate(self._verified_cells), np.concatenate(self._accepted_cells),
                                    num_drafts=len(self._verified_cells))
            self._verified_cells.clear()
            self._accepted_cells.clear()
        if len(self._requests) > len(self._vllm_requests):  # requests vLLM no longer holds
            for req_id in [r for r in self._requests if r not in self._vllm_requests]:
                del self._requests[req_id]
        self._batch_req_ids = None  # a stale slot -> request map is never reused
        return drafts

    def _propose_batch(self, drafting: list, new_tokens: list) -> DraftBatch:
        """Each drafting request accepts its new tokens and drafts its tree: one
        :meth:`refdec.Proposer.propose_batch` call. Tokens it refuses (checked before any
        proposer changes) are found request by request; those requests stop drafting."""
        proposers = [state.proposer for _, state, _ in drafting]
        try:
            return refdec.Proposer.propose_batch(proposers, self.tree_nodes, new_tokens,
                                                 num_threads=self.options.draft_threads)
        except ValueError:  # nothing was accepted: each request alone, the failing ones without drafts
            trees = []
            for (_, state, _), proposer, tokens in zip(drafting, proposers, new_tokens):
                try:
                    proposer.accept(tokens)
                    trees.append(proposer.propose(self.tree_nodes))
                except Exception:
                    logger.exception("refdec: drafting failed for a request; it continues without drafts")
                    state.proposer = None
                    trees.append(DraftTree.empty())
            offsets = np.zeros(len(trees) + 1, np.int64)
            np.cumsum([len(tree) for tree in trees], out=offsets[1:])
            return DraftBatch(*(np.concatenate([getattr(tree, name) for tree in trees])
                                for name in ("token_ids", "parents", "scores", "source_ids", "depths")),
                              offsets=offsets, source_names=refdec.Proposer.source_names)

    def _choose_chains(self, drafting: list, batch: DraftBatch, num_rows: int, drafts: list[list[int]]) -> None:
        """The chains of the drafting requests' trees (``batch``, tree r of ``drafting[r]``), each
        tree's best path at this step's price of a verified token: the fixed price (one walk of
        the whole batch), or :func:`token_price` of the candidates a first walk at no cost finds.
        Fills ``drafts[batch_slot]``."""
        max_lens = np.array([max_len for _, _, max_len in drafting], np.int64)
        k = self.num_speculative_tokens
        num_trees = len(drafting)
        tokens = np.zeros((num_trees, k), np.int32)
        probs = np.zeros((num_trees, k), np.float64)
        cells = np.zeros((num_trees, k), np.int64)
        lengths = np.zeros(num_trees, np.int64)
        self.last_price = choose_chains(batch.token_ids, batch.parents, batch.scores, batch.source_ids,
                                        batch.depths, batch.offsets, max_lens, self.acceptance.rates,
                                        self.options.draft_cost, self.options.token_cost, num_rows, tokens, probs,
                                        cells, lengths)
        chains = tokens.tolist()
        for row, ((batch_slot, state, _), chain, length) in enumerate(zip(drafting, chains, lengths.tolist())):
            del chain[length:]
            state.last_chain = chain
            state.last_cells = cells[row, :length]  # a view: this step's arrays are new each step
            state.num_drafted += length
            drafts[batch_slot] = chain

    def _drafting_failed(self, req_id: str, num_tokens: int) -> None:
        logger.exception("refdec: drafting failed for request %s; it continues without drafts", req_id)
        self._requests[req_id] = _RequestDraft(self._vllm_requests.get(req_id), None, num_tokens_fed=num_tokens)

    # -- one request ------------------------------------------------------------------------

    def _advance(self, req_id: str, batch_slot: int, num_tokens: int, token_ids_cpu):
        """Brings the request's state to vLLM's ``num_tokens`` tokens (counting what vLLM accepted
        of its last chain): (state, the tokens its proposer has yet to accept (int32 view), max
        chain length) when it drafts this step, else None (its proposer, if any, accepted them)."""
        state = self._requests.get(req_id)
        req_state = self._vllm_requests.get(req_id)
        new_tokens = _NO_TOKENS
        if state is None or state.req_state is not req_state or state.num_tokens_fed > num_tokens:
            state = self._start(req_id, req_state, token_ids_cpu[batch_slot], num_tokens)
        elif state.num_tokens_fed < num_tokens:
            new_tokens = token_ids_cpu[batch_slot, state.num_tokens_fed:num_tokens]
            if state.last_chain:  # one verification: the accepted draft prefix + 1 token of vLLM's
                num_accepted = min(len(new_tokens) - 1, len(state.last_chain))
                state.num_accepted += num_accepted
                self._verified_cells.append(state.last_cells)
                self._accepted_cells.append(state.last_cells[:num_accepted])
            state.num_tokens_fed = num_tokens
        state.last_chain = []
        if state.proposer is None:
            return None
        max_len = min(self.num_speculative_tokens, self.max_model_len - num_tokens - 1)
        max_tokens = state.max_tokens
        if max_tokens is not None:  # no drafts past the request's last token
            max_len = min(max_len, max_tokens - len(req_state.output_token_ids) - 1)
        if max_len <= 0:
            state.proposer.accept(new_tokens)
            return None
        return state, new_tokens, max_len

    def _start(self, req_id: str, req_state, row_tokens: np.ndarray, num_tokens: int) -> _RequestDraft:
        """A new (or resumed) request: its proposer over the prompt, then its outputs so far. O(context), once."""
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
                                   cursor=bool(references),
                                   memory=self.memory.automata() if self.memory is not None else None)
        proposer.start(row_tokens[:num_prompt])
        if num_prompt < num_tokens:
            proposer.accept(row_tokens[num_prompt:num_tokens])
        state.proposer = proposer
        return state

    def _get_tokenizer(self):
        if self._tokenizer is None:
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


# -- worker: the batch's request ids ----------------------------------------------------------


def install_runner_hook() -> None:
    """Before vLLM's runner asks the drafter for drafts, give a refdec proposer the batch's
    request ids (``input_batch.req_ids``, one per batch slot), vLLM's per-request states, and the
    requests that finished or were preempted. Raises RuntimeError naming the vLLM version if its
    runner has no such method (the proposer then cannot tell requests apart)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # vLLM is optional: imported where it runs

    if not hasattr(GPUModelRunner, "propose_draft_token_ids"):
        import vllm

        raise RuntimeError(f"refdec.vllm.VllmProposer needs vLLM's GPUModelRunner.propose_draft_token_ids, which vLLM "
                           f"{vllm.__version__} does not have (refdec is tested with vLLM 0.32)")

    def make(original):
        def propose_draft_token_ids(self, scheduler_output, *args, **kwargs):
            drafter = getattr(self, "drafter", None)
            if isinstance(drafter, VllmProposer):
                drafter.bind_batch(self.input_batch.req_ids, self.requests,
                                   getattr(scheduler_output, "finished_req_ids", ()),
                                   getattr(scheduler_output, "preempted_req_ids", None) or ())
            return original(self, scheduler_output, *args, **kwargs)
        return propose_draft_token_ids

    wrap_once(GPUModelRunner, "propose_draft_token_ids", make)
