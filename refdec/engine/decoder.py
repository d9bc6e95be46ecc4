"""``refdec.generate`` and ``SpeculativeDecoder``: the front end of the decoding engine.

It checks the call's arguments (refdec.engine.arguments), makes one
:class:`~refdec.engine.requests.Request` per prompt — its drafter, budget, sampler
and stop state — runs the loop (refdec.engine.engine) and lays the output out as
``model.generate`` does. A single prompt is a batch of one; it may stream.

Outputs: ``sequences`` is ``[1, prompt_len + new]`` for one prompt; for a batch
``[B, max_len]``, the left-padded prompt as given (a list of prompts is left-padded
with ``pad_token_id``) followed by each row's new tokens, right-padded with
``pad_token_id`` after the row's end. ``stats`` is the call's (forward passes are
batched passes, tokens/s counts every row's tokens); ``stats.rows[b]`` holds row b's
own counts for a batch. A row's ``prefill_seconds`` is its group's, its
``wall_seconds`` runs from the call's start to its last token.

Sampling: the Gumbel noise is keyed by ``(seed, absolute output position)``; row ``b``
uses ``seed + b`` when ``seed`` is an int (or ``seeds[b]`` for a list), so row ``b``
equals a single-prompt ``generate`` of that prompt with seed ``seed + b``.
``seed=None`` draws one base seed (``stats.seed``).

The prompt must hold at least one token: refdec adds no BOS token of its own
(tokenize with the tokenizer's special tokens, as for ``model.generate``).
"""

from __future__ import annotations

import copy
import inspect
import time
from dataclasses import fields

import numpy as np
import torch

from refdec.drafting.memory import OutputMemory, as_memory
from refdec.drafting.proposer import Drafter, Proposer
from refdec.drafting.tree import MAX_NODES
from refdec.engine import engine
from refdec.engine.arguments import GenerateArguments, parse_arguments
from refdec.engine.settings import DecodeSettings
from refdec.engine.defaults import MAX_NEW_TOKENS, PREFIX_CACHE_ENTRIES
from refdec.engine.interface import Backend
from refdec.engine.requests import Request
from refdec.engine.results import DecodingStats, GenerateOutput
from refdec.engine.sampling import TargetSampler
from refdec.engine.stops import StopChecker
from refdec.sizing.acceptance import AcceptanceTable
from refdec.sizing.budget import AutoBudget, Budget
from refdec.sizing.cost_model import LearntCost
from refdec.tokens import check_int, is_int

__all__ = ["SpeculativeDecoder", "generate", "make_backend"]


def make_backend(model, *, cuda_graphs: bool = False, max_rows: int = 1,
                 prefix_cache: int = PREFIX_CACHE_ENTRIES, exact: bool | None = None) -> Backend:
    """The engine backend for ``model`` (each imported only when used): a ``llama_cpp.Llama``
    runs on llama.cpp (refdec.llama_cpp.backend), anything else must be a transformers causal LM
    (refdec.transformers.backend). ``cuda_graphs``: the transformers backend's fixed-shape
    forwards replayed as CUDA graphs. ``max_rows``: llama.cpp's verification sized for that many
    rows with whole trees (more rows decode with smaller trees each). ``prefix_cache``: finished
    requests whose KV entries are kept for prompts that begin the same way (0: none). ``exact``:
    llama.cpp's exact mode (refdec.llama_cpp.backend; None: on where it can run); a transformers
    model's tokens are always plain decoding's, so False is refused there."""
    if exact is not None and not isinstance(exact, bool):
        raise ValueError(f"exact must be True, False or None, got {exact!r}")
    if _is_llama(model):
        if cuda_graphs:
            raise ValueError("cuda_graphs=True is for transformers models; llama.cpp runs its own graphs")
        from refdec.llama_cpp.backend import LlamaCppBackend

        return LlamaCppBackend(model, max_rows=max_rows, prefix_cache=prefix_cache, exact=exact)
    if exact is False:
        raise ValueError("exact=False is for llama.cpp models: on transformers refdec's tokens are always plain "
                         "decoding's")
    from refdec.transformers.backend import TransformersBackend

    return TransformersBackend(model, cuda_graphs=cuda_graphs, prefix_cache=prefix_cache)


def _keyword_settings(settings: DecodeSettings | None, **keywords) -> DecodeSettings:
    """The settings ``generate``'s keywords spell; with ``settings``, those keywords given a value
    other than their default in ``generate``'s signature (and every logits setting) override its
    fields."""
    if settings is not None:
        keywords = {name: value for name, value in keywords.items()
                    if name not in _SETTING_DEFAULTS or _differs(value, _SETTING_DEFAULTS[name])}
    return DecodeSettings.of(settings, **keywords)


def _differs(value, default) -> bool:
    """Whether a keyword was given a value other than its default (a tensor or list always differs
    from a scalar default)."""
    return value is not default and not (type(value) is type(default) and value == default)


def _is_llama(model) -> bool:
    """Whether ``model`` is a ``llama_cpp.Llama`` (or a subclass), without importing llama_cpp."""
    return any(cls.__module__.split(".")[0] == "llama_cpp" for cls in type(model).__mro__)


def kept_llama_backend(model):
    """The backend one-shot :func:`generate` calls share on a ``llama_cpp.Llama``, made by the first
    and kept on the Llama (``model._refdec_backend``): its tree context (a KV cache of the Llama's
    ``n_ctx`` cells, the logits buffer, the reserved graph) is set-up that plain decoding does not
    pay per call. Each call still starts on an empty cache. Like the Llama itself, not for two
    threads at once. None for any other model (a transformers backend holds no such state)."""
    if not _is_llama(model):
        return None
    backend = getattr(model, "_refdec_backend", None)
    if backend is None:
        backend = make_backend(model)
        model._refdec_backend = backend
    return backend


def default_proposer_factory(index, references: list[np.ndarray], max_depth: int, memory: tuple = ()) -> Drafter:
    """refdec's :class:`~refdec.drafting.proposer.Proposer`; with references (editing) the copy cursor
    follows the output through them (what it gains: benchmarks/RESULTS.md §3); ``memory``: a
    snapshot of past outputs (:meth:`refdec.OutputMemory.automata`)."""
    return Proposer(index=index, references=references or None, max_depth=max_depth, cursor=bool(references),
                    memory=memory)


def _takes_memory(factory) -> bool:
    """Whether ``factory`` accepts a ``memory=`` keyword."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "memory" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


class SpeculativeDecoder:
    """Reusable state for speculative decoding with one model.

    ``proposer_factory(index, references, max_depth) -> Drafter`` builds each request's
    drafter (default: ``refdec.drafting.proposer.Proposer``); ``max_depth`` caps the draft tree depth.

    Drafts are never fed to the model when they hold a token id >= the model's
    vocabulary size (a reference or an index built for a larger vocabulary):
    such nodes and their subtrees are dropped from the tree. References only
    draft (they are never fed to the model), so they may be longer than its
    context window.

    ``retrieve=k`` (``generate``): the k documents of the corpus index most
    similar to the prompt (``refdec.drafting.retrieval.Retriever.top_k``, containment
    score: how much of the prompt a document covers) are added to the
    per-request references, so they draft with the reference source's weight
    next to the live context and the whole-corpus index
    (``stats.retrieved_documents``). Needs an index with MinHash signatures
    (``refdec index build`` writes them). Default 0: see
    benchmarks/retrieval_sim.py for when it helps.

    ``prefill_chunk``: the prompt is prefilled in forwards of at most this many
    tokens (None: one forward; refdec.transformers.prefill): on a CPU a long prompt prefills
    faster in chunks (benchmarks/RESULTS.md; measured on a CPU only).
    The same computation up to floating-point rounding (GEMM shapes differ): identical
    tokens in the tests (float64) and in the benchmarks (float32).

    ``cuda_graphs`` (a transformers model on a CUDA device only): verification forwards at
    fixed shapes (query rows in buckets, a static KV cache), each captured once as a CUDA graph
    and replayed (refdec.transformers.static_step). The transformers backend's own settings are
    on ``decoder.backend`` (refdec.transformers.backend.TransformersBackend: ``lazy_head``,
    ``static_shapes``).
    ``backend``: an engine backend already made for ``model`` (refdec.engine.interface.Backend;
    default: :func:`make_backend`'s), e.g. one that other decoders used before (one at a time).
    ``max_rows`` (llama.cpp; default 1): the rows one verification is sized for, each with a
    whole tree (llama.cpp reserves a logits row per entry it may be asked for, each the
    vocabulary's size); rows beyond it decode together with smaller trees each (a server sets
    it to its concurrency).
    ``prefix_cache`` (int >= 0, default 4): the most finished requests whose KV entries the
    backend keeps (refdec.engine.prefix_cache): a later prompt that begins as one of them did
    (the same file edited again, the same system prompt, a chat's earlier turns) is prefilled
    from the first token that differs (``stats.cached_prompt_tokens``). The entries share the
    context with the running rows and give it back, oldest first, when a row needs the room.
    ``memory`` (a :class:`refdec.OutputMemory`, default None): every finished request's output
    joins it (for the request's tenant) and every later request drafts from what its tenant's
    memory held when it started (the ``memory`` source). Several decoders may share one.
    ``exact`` (llama.cpp only; default None: on where it can run): each row verifies a chain whose
    rows llama.cpp computes with batch-invariant products, so that the tokens are llama.cpp's plain
    decoding's bit for bit (needs ``refdec build-llama``; docs/llama_cpp.md); False: trees, equal to
    plain decoding up to llama.cpp's batched roundings; True where it cannot run: ValueError why.
    ``decoder.joint_batch_budget`` (default True): batches with
    ``max_draft_tokens="auto"`` choose the rows' verified prefixes together, priced as
    one padded batched forward (refdec.sizing.budget.batch_prefix_sizes); False prices each
    row alone on the single-row curve.
    ``decoder.timed_budget`` (default True): ``max_draft_tokens="auto"`` learns from the steps'
    measured time, its cost curve refit (refdec.sizing.cost_model.LearntCost, one per decoder) and
    drafting stopped for a request where it does not pay (refdec.sizing.budget.PlainGuard); False prices
    with the calibrated curve as it is, so that the verified sizes, and the pass counts, depend
    on the tokens only (benchmarks.engine_ab compares them between checkouts).
    """

    def __init__(self, model, tokenizer=None, index=None, *, max_depth: int = MAX_NODES, proposer_factory=None,
                 prefill_chunk: int | None = 512, cuda_graphs: bool = False, max_rows: int = 1,
                 backend: Backend | None = None, prefix_cache: int = PREFIX_CACHE_ENTRIES, memory: OutputMemory | None = None,
                 exact: bool | None = None) -> None:
        self.max_depth = check_int("max_depth", max_depth, 1)  # the engine's depth limit too, whatever the drafter
        check_int("max_rows", max_rows, 1)
        check_int("prefix_cache", prefix_cache, 0)
        if prefill_chunk is not None and (not is_int(prefill_chunk) or prefill_chunk < 1):
            raise ValueError(f"prefill_chunk must be an int >= 1 or None, got {prefill_chunk!r}")
        self.prefill_chunk = None if prefill_chunk is None else int(prefill_chunk)
        self.model = model
        self.index = index
        self.proposer_factory = proposer_factory or default_proposer_factory
        self.memory = as_memory(memory)
        if self.memory is not None and proposer_factory is not None and not _takes_memory(proposer_factory):
            raise ValueError("proposer_factory must take a memory= keyword (a tuple of automata) when memory is "
                             f"given, got {proposer_factory!r}")
        self.backend = (make_backend(model, cuda_graphs=cuda_graphs, max_rows=max_rows, prefix_cache=prefix_cache,
                                     exact=exact) if backend is None else backend)
        # a llama.cpp model brings its own tokenizer (refdec.llama_cpp.tokenizer)
        self.tokenizer = tokenizer if tokenizer is not None else self.backend.tokenizer
        self.joint_batch_budget = True
        self.timed_budget = True
        self._auto_budget = None  # single prompts: the "auto" policy persists across calls (its feedback carries over)
        # the acceptance rates every "auto" request of this decoder reads and teaches, one after another or
        # together (a server's): a request starts from what the earlier ones learnt, not from the priors
        self.acceptance = AcceptanceTable()
        self._learnt_cost = None  # "auto": the backend's cost curve, refit from the steps (all calls and rows share it)

    @property
    def vocab_size(self) -> int:
        return self.backend.vocab_size

    @property
    def max_positions(self) -> int | None:
        return self.backend.max_positions

    @property
    def device(self) -> torch.device:
        return self.backend.device

    @torch.inference_mode()
    def generate(self, input_ids, *, settings: DecodeSettings | None = None, tokenizer=None, index=None,
                 references=None, max_new_tokens: int = MAX_NEW_TOKENS,
                 do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None, eos_token_id=None, stop_strings=None,
                 streamer=None, max_draft_tokens="auto", attention_mask=None, pad_token_id=None,
                 retrieve: int = 0, max_batch_size: int | None = None, min_p: float | None = None,
                 on_row_done=None, **logits_settings) -> GenerateOutput:
        """Speculative generation of one prompt, or of a batch.

        ``settings``: how to decode, as one :class:`~refdec.engine.settings.DecodeSettings`; the
        keywords that spell its fields (``max_new_tokens`` to ``max_draft_tokens``, ``min_p`` and the
        logits settings) make one, or override its fields where both are given.

        ``logits_settings``: ``model.generate``'s sequence-dependent logits settings
        (``repetition_penalty``, ``no_repeat_ngram_size``, ``sequence_bias``, ``bad_words_ids``,
        ``suppress_tokens``, ``begin_suppress_tokens``, ``min_length``, ``min_new_tokens``,
        ``forced_eos_token_id``, ``exponential_decay_length_penalty``), each overriding the
        model's ``generation_config`` (None switches it off) and applied to every tree path as
        ``model.generate`` applies it (refdec.engine.processors).

        Batched input: a left-padded LongTensor [B, L] with ``attention_mask`` (as
        ``model.generate`` takes it) or a list of prompts of different lengths;
        ``references`` shared by all rows or one list per row; ``seed`` an int (row
        ``b`` uses ``seed + b``) or a list of per-row seeds; ``streamer`` unsupported.
        ``max_batch_size`` (int >= 1, None = all rows at once): at most that many rows
        decode together; the others wait in order and join as rows finish
        (continuous batching, refdec.engine.scheduler). ``on_row_done(batch_row,
        new_tokens, row_stats)`` (batches only): called as each row finishes, with its index
        in the batch, its new tokens (list of int) and its DecodingStats.

        ``references``: texts (with a tokenizer) or token-id lists the drafts may copy (editing: the
        file being rewritten); None (a row's None in a batch): the prompt's implicit reference, the
        largest fenced code block of its decoded text if one holds ``MIN_REFERENCE_CHARS``
        (refdec.drafting.implicit; needs a tokenizer); ``[]``: none. Only the speed depends on them.

        Returns the sequences (int64 [1, L] or [B, L], on the model's device) and the stats.
        """
        settings = _keyword_settings(settings, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                     temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                                     eos_token_id=eos_token_id, stop_strings=stop_strings,
                                     max_draft_tokens=max_draft_tokens, **logits_settings)  # checked once, here
        args = self.check_call(input_ids, settings, index=index if index is not None else self.index,
                               tokenizer=tokenizer, references=references, streamer=streamer,
                               attention_mask=attention_mask, pad_token_id=pad_token_id, retrieve=retrieve,
                               max_batch_size=max_batch_size, on_row_done=on_row_done)
        streamer = args.streamer
        on_tokens = None
        if streamer is not None:
            streamer.put(torch.from_numpy(args.prompts[0]).unsqueeze(0))
            on_tokens = lambda batch_row, tokens: streamer.put(torch.tensor(tokens, dtype=torch.long))  # noqa: E731
        requests, calibration_seconds = self.build_requests(args, on_tokens=on_tokens, on_done=args.on_row_done)
        started = requests[0].started  # the call's clock: calibration is not decoding
        stats = engine.run(self.backend, requests, capacity=args.max_batch_size, prefill_chunk=self.prefill_chunk,
                           max_depth=self.max_depth, joint_budget=self.joint_batch_budget)
        if streamer is not None:
            streamer.end()
        stats.calibration_seconds = calibration_seconds
        output = self._output(requests, stats, args, started)
        output.sequences = output.sequences.to(self.device)  # as model.generate's: on the model's device
        return output

    def check_call(self, input_ids, settings: DecodeSettings, *, index, tokenizer=None, references=None,
                   streamer=None, attention_mask=None, pad_token_id=None, retrieve: int = 0,
                   max_batch_size: int | None = None, on_row_done=None) -> GenerateArguments:
        """A call's arguments checked against this decoder: refdec.engine.arguments.parse_arguments
        with its backend and its tokenizer (unless ``tokenizer`` is given); ``index`` is the corpus
        the call drafts from (None: none). How :meth:`generate` and DecodingService.submit begin."""
        return parse_arguments(
            self.backend, input_ids, settings, tokenizer=tokenizer if tokenizer is not None else self.tokenizer,
            index=index, references=references, streamer=streamer, attention_mask=attention_mask,
            pad_token_id=pad_token_id, retrieve=retrieve, max_batch_size=max_batch_size, on_row_done=on_row_done)

    def build_requests(self, args: GenerateArguments, *, own_budgets: bool = False, on_tokens=None, on_done=None,
                       tenant=None) -> tuple[list[Request], float]:
        """The engine requests of the checked call ``args`` (:meth:`check_call`), one per prompt
        (:meth:`make_request`), and the seconds spent measuring the backend's cost curve ("auto"'s
        first use), after which the requests' clocks start. Budgets: with ``own_budgets`` (a
        service's request, decoding beside others) each request gets its own
        (:meth:`new_budget`); otherwise a single prompt uses the decoder's "auto" policy, carried
        from call to call, and a batch a copy of it per row."""
        calibrating = time.perf_counter()
        if own_budgets:
            budgets = [self.new_budget(args.max_draft_tokens) for _ in args.prompts]
        else:
            budgets = self._budgets(args.max_draft_tokens, args.single, len(args.prompts))
        started = time.perf_counter()
        requests = [self.make_request(args, b, budgets[b], started, on_tokens=on_tokens, on_done=on_done,
                                      tenant=tenant) for b in range(len(args.prompts))]
        return requests, started - calibrating

    def make_request(self, args: GenerateArguments, b: int, budget: Budget, started: float, *,
                     on_tokens=None, on_done=None, tenant=None) -> Request:
        """Row ``b`` of the checked call ``args`` as an engine request: its drafter (with the
        row's references and, ``retrieve=k``, the index documents most like its prompt, and
        ``tenant``'s memory), sampler, logits settings and stops; ``budget`` chooses its trees;
        ``started`` (perf_counter) starts its clock; its output joins ``tenant``'s memory when it
        finishes. A request with nothing to emit (``max_new_tokens=0``) is finished already."""
        prompt = args.prompts[b]
        row_stats = DecodingStats(seed=args.seeds[b])
        drafting = args.max_new_tokens > 0 and budget.max_nodes > 0
        refs = args.references[b]
        if args.retrieve and drafting:  # the row's own k most similar index documents join its references
            t0 = time.perf_counter()
            hits = args.index.retriever().top_k(prompt, args.retrieve, score="containment")
            row_stats.retrieved_documents = [doc_idx for doc_idx, _ in hits]
            refs = list(refs) + [args.index.document(doc_idx) for doc_idx in row_stats.retrieved_documents]
            row_stats.retrieve_seconds = time.perf_counter() - t0
        drafter = None
        if drafting:
            memory = self.memory.automata(tenant) if self.memory is not None else ()
            if memory:
                drafter = self.proposer_factory(args.index, refs, self.max_depth, memory=memory)
            else:
                drafter = self.proposer_factory(args.index, refs, self.max_depth)
            drafter.start(prompt.astype(np.int32))
        if self.memory is not None:
            on_done = _remembering(self.memory, tenant, on_done)
        sampler = TargetSampler(self.vocab_size, do_sample=args.do_sample, temperature=args.temperature,
                                top_k=args.top_k, top_p=args.top_p, seed=args.seeds[b], device=self.device,
                                min_p=args.min_p)
        request = Request(b, prompt, args.max_new_tokens, self.max_positions, stats=row_stats, sampler=sampler,
                          stopper=StopChecker(args.eos, args.stop_strings, args.tokenizer), drafter=drafter,
                          budget=budget if drafting else None, started=started, on_tokens=on_tokens,
                          on_done=on_done, processor=args.processor)
        if args.max_new_tokens == 0:
            request.finish("max_new_tokens")
        return request

    def new_budget(self, max_draft_tokens: Budget | str) -> Budget:
        """A budget for one request of its own: a fresh AutoBudget for ``"auto"``, pricing with the
        backend's cost curve (measured once per model and machine) refit from the steps of every
        request (one LearntCost per decoder; with ``timed_budget`` False, the curve as it is and no
        guard) and reading the decoder's acceptance rates (``decoder.acceptance``, learnt from every
        request), else ``max_draft_tokens`` itself."""
        if not isinstance(max_draft_tokens, str):
            return max_draft_tokens
        if self._learnt_cost is None:  # "auto" (refdec.engine.arguments checked it)
            self._learnt_cost = LearntCost(self.backend.auto_cost_curve())  # measured once (cached)
        if self.timed_budget:
            return AutoBudget(self._learnt_cost, acceptance=self.acceptance)
        return AutoBudget(self._learnt_cost.prior, learn=False, guard=False, acceptance=self.acceptance)

    def _budgets(self, max_draft_tokens: Budget | str, single: bool, n_rows: int) -> list[Budget]:
        """One budget per row. A single prompt uses the decoder's own "auto" policy (its feedback
        carries over between calls) or the given budget; a batch gives each row a copy of an
        AutoBudget (each row learns its own acceptance) and shares any other budget. An
        AutoBudget's guard starts over with each call's request."""
        if single and isinstance(max_draft_tokens, str):
            if self._auto_budget is None or (self._auto_budget.learnt is not None) != self.timed_budget:
                self._auto_budget = self.new_budget(max_draft_tokens)
            template = self._auto_budget
        else:
            template = self.new_budget(max_draft_tokens)
        if not isinstance(template, AutoBudget):
            return [template] * n_rows
        budgets = [template] if single else [copy.deepcopy(template) for _ in range(n_rows)]
        for budget in budgets:
            budget.new_request()
        return budgets

    @staticmethod
    def _output(requests: list[Request], stats: DecodingStats, args: GenerateArguments,
                started: float) -> GenerateOutput:
        """``model.generate``'s layout (module docstring) and the call's stats."""
        padded, pad_token_id = args.padded, args.pad_token_id
        stats.new_tokens = sum(len(r.seq) - r.prompt_len for r in requests)
        reasons = {r.stats.stop_reason for r in requests}
        stats.stop_reason = reasons.pop() if len(reasons) == 1 else "mixed"
        stats.seed = requests[0].stats.seed
        if args.single:
            request = requests[0]
            stats.retrieved_documents = request.stats.retrieved_documents
            stats.retrieve_seconds = request.stats.retrieve_seconds
            stats.wall_seconds = time.perf_counter() - started
            return GenerateOutput(torch.tensor([request.seq], dtype=torch.long), stats)
        if padded is None:
            width = max(r.prompt_len for r in requests)
            heads = [[pad_token_id] * (width - r.prompt_len) + r.seq[: r.prompt_len] for r in requests]
        else:
            heads = [padded[b].tolist() for b in range(len(requests))]
        tails = [r.seq[r.prompt_len:] for r in requests]
        sequences = torch.full((len(requests), len(heads[0]) + max(len(t) for t in tails)), pad_token_id,
                               dtype=torch.long)
        for b, (head, tail) in enumerate(zip(heads, tails)):
            sequences[b, : len(head) + len(tail)] = torch.tensor(head + tail, dtype=torch.long)
        stats.rows = [r.stats for r in requests]
        stats.wall_seconds = time.perf_counter() - started
        return GenerateOutput(sequences, stats)


# SpeculativeDecoder.generate's keywords for DecodeSettings' fields, with the defaults its signature states
_SETTING_DEFAULTS = {name: p.default for name, p in inspect.signature(SpeculativeDecoder.generate).parameters.items()
                     if p.kind is inspect.Parameter.KEYWORD_ONLY and name in {f.name for f in fields(DecodeSettings)}}


def _remembering(memory: OutputMemory, tenant, on_done):
    """An ``on_done(batch_row, new_tokens, stats)`` that keeps the output in ``memory`` for
    ``tenant``, then calls ``on_done`` (when given)."""

    def done(batch_row: int, new_tokens: list[int], stats: DecodingStats) -> None:
        memory.add(np.asarray(new_tokens, dtype=np.int32), tenant)
        if on_done is not None:
            on_done(batch_row, new_tokens, stats)

    return done


def generate(model, input_ids, *, settings: DecodeSettings | None = None, tokenizer=None, index=None, references=None,
             max_new_tokens: int = MAX_NEW_TOKENS,
             do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, seed: int | None = None, eos_token_id=None, stop_strings=None,
             streamer=None, max_draft_tokens="auto", proposer_factory=None, attention_mask=None,
             pad_token_id=None, retrieve: int = 0, max_batch_size: int | None = None, min_p: float | None = None,
             on_row_done=None, memory: OutputMemory | None = None, **logits_settings) -> GenerateOutput:
    """One-shot speculative generation (a fresh ``SpeculativeDecoder``; on a llama.cpp model, over the
    backend the Llama keeps for these calls, :func:`kept_llama_backend`); see that class for details.
    Batches: a left-padded [B, L] ``input_ids`` with ``attention_mask``, or a list of prompts;
    ``max_batch_size`` rows at most decode together, the others join as rows finish.
    ``logits_settings``: ``repetition_penalty=1.2`` etc., as SpeculativeDecoder.generate takes them.
    ``memory``: a :class:`refdec.OutputMemory` the call drafts from and adds its outputs to.
    ``settings``: a :class:`refdec.DecodeSettings` (the keywords for its fields override it)."""
    settings = _keyword_settings(  # checked once, here
        settings, max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
        top_p=top_p, min_p=min_p, seed=seed, eos_token_id=eos_token_id, stop_strings=stop_strings,
        max_draft_tokens=max_draft_tokens, **logits_settings)
    decoder = SpeculativeDecoder(model, tokenizer=tokenizer, index=index, proposer_factory=proposer_factory,
                                 backend=kept_llama_backend(model), memory=memory)
    return decoder.generate(input_ids, settings=settings, references=references, streamer=streamer,
                            attention_mask=attention_mask, pad_token_id=pad_token_id, retrieve=retrieve,
                            max_batch_size=max_batch_size, on_row_done=on_row_done)
