"""The speculative decoding loop: propose a draft tree, verify it in one forward, accept.

Invariant between steps: the KV cache holds every token of the sequence but the
last one, the *root*; ``root_pos`` (the root's absolute position) equals the
cache length. One step feeds ``[root] + draft nodes`` with positions
``root_pos + depth`` and a tree mask (refdec.masks), picks the target token at
every row at once (refdec.sampling, one host sync), walks the tree
(refdec.verify), keeps the KV entries of the root and the accepted nodes
(refdec.cache) and makes the bonus token the new root.

The prompt is prefilled (in chunks of ``prefill_chunk`` tokens, counted as one
pass) and yields the first new token, so plain decoding (``max_draft_tokens=0``)
takes one forward per token after the prefill and ``stats.tokens_per_pass``
counts the prefill as one pass too.

The prompt must hold at least one token: refdec adds no BOS token of its own
(tokenize with the tokenizer's special tokens, as for ``model.generate``).
"""

from __future__ import annotations

import numbers
import os
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from refdec.budget import FixedBudget, make_budget
from refdec.cache import cache_kwarg, compact, new_cache, set_prefill_window
from refdec.compat import ensure_lossless_tree_verification, text_config
from refdec.masks import build_tree_inputs, mask_spec_for
from refdec.processors import PathLogitsProcessor, path_tokens
from refdec.sampling import TargetSampler, random_seed
from refdec.tree import DraftTree, keep_nodes, prune_to_depth
from refdec.verify import LazyRowLogits, accept_walk, accept_walk_lazy, split_forward_fn


@dataclass
class DecodingStats:
    """What one ``generate`` call did.

    ``forward_passes`` counts the prefill pass (it yields the first token).
    ``accepted_per_pass[k]`` = number of verification passes that accepted ``k``
    draft tokens (the bonus token not counted); index 0 also counts passes without a
    draft and the prefill.
    Times are seconds (time.perf_counter): ``prefill`` (the prompt's forwards, one per chunk),
    ``propose`` (budget + proposer), ``prepare`` (tree → tensors), ``forward``
    (model forward, including the LM head of the rows the walk visits and the
    greedy argmax), ``accept`` (the acceptance walk, which for sampling includes
    drawing the token of each row on the path; KV compaction, proposer update,
    stops, streaming).
    """

    new_tokens: int = 0
    forward_passes: int = 0
    accepted_per_pass: list[int] = field(default_factory=list)
    proposed_tokens: int = 0
    accepted_tokens: int = 0
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    prefill_seconds: float = 0.0
    propose_seconds: float = 0.0
    prepare_seconds: float = 0.0
    forward_seconds: float = 0.0
    accept_seconds: float = 0.0
    wall_seconds: float = 0.0
    stop_reason: str = ""
    seed: int | None = None
    retrieved_documents: list[int] = field(default_factory=list)  # retrieve=k: doc_idx in the index, best first
    retrieve_seconds: float = 0.0
    rows: list = field(default_factory=list)  # batched calls: one DecodingStats per batch row
    head_rows: int = 0  # tree rows the LM head ran on (lazy head: about the accepted path; else every row)

    @property
    def tokens_per_pass(self) -> float:
        return self.new_tokens / self.forward_passes if self.forward_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def bookkeeping_seconds(self) -> float:
        """Per-step time spent outside the model forward."""
        return self.propose_seconds + self.prepare_seconds + self.accept_seconds

    def summary(self) -> str:
        return (f"{self.new_tokens} tokens, {self.forward_passes} passes, "
                f"{self.tokens_per_pass:.2f} tokens/pass, {self.tokens_per_second:.1f} tokens/s")

    def _count_pass(self, accepted: int) -> None:
        self.forward_passes += 1
        while len(self.accepted_per_pass) <= accepted:
            self.accepted_per_pass.append(0)
        self.accepted_per_pass[accepted] += 1

    def _count_draft(self, tree: DraftTree, accepted_nodes: np.ndarray) -> None:
        """Proposed and accepted draft tokens of one verified ``tree``, accepted ones per source
        (``accepted_nodes``: int64 [k], the accepted node indices)."""
        self.proposed_tokens += len(tree)
        self.accepted_tokens += int(accepted_nodes.shape[0])
        if accepted_nodes.shape[0]:
            for src, count in zip(*np.unique(tree.source_ids[accepted_nodes], return_counts=True)):
                name = tree.source_names[src] if src < len(tree.source_names) else str(int(src))
                self.accepted_by_source[name] = self.accepted_by_source.get(name, 0) + int(count)


@dataclass
class GenerateOutput:
    sequences: torch.LongTensor  # [1, prompt_len + new]; batched: [B, max_len] (see refdec.batch)
    stats: DecodingStats


# --------------------------------------------------------------------------- validation


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _normalize_prompt(input_ids) -> np.ndarray:
    """int64 [L] from a LongTensor [1, L], a 1-D tensor, a list of ints or a numpy array."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool or input_ids.is_complex():
            raise ValueError(f"input_ids must hold integer token ids, got a tensor of dtype {input_ids.dtype}")
        arr = input_ids.detach().cpu().numpy()
    elif isinstance(input_ids, np.ndarray):
        arr = input_ids
    elif isinstance(input_ids, (list, tuple)):
        if not all(_is_int(t) for t in input_ids):
            bad = next(t for t in input_ids if not _is_int(t))
            raise ValueError(f"input_ids must be a list of ints; found {bad!r}")
        arr = np.asarray(input_ids, dtype=np.int64)
    else:
        raise ValueError(f"input_ids must be a LongTensor [1, L], a 1-D tensor or a list of ints, "
                         f"got {type(input_ids).__name__}")
    if arr.ndim == 2:
        if arr.shape[0] != 1:
            raise ValueError(f"input_ids has {arr.shape[0]} rows where one sequence was expected (shape [1, L]); "
                             "generate() takes batches as a list of prompts or a padded [B, L] batch")
        arr = arr[0]
    if arr.ndim != 1:
        raise ValueError(f"input_ids must have shape [1, L] or [L], got shape {tuple(arr.shape)}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"input_ids must hold integer token ids, got dtype {arr.dtype}")
    if arr.size == 0:
        raise ValueError("input_ids is empty: the prompt needs at least one token "
                         "(refdec adds no BOS token; tokenize with special tokens)")
    return arr.astype(np.int64)


def _normalize_eos(eos_token_id, model, vocab: int) -> set[int]:
    """The eos ids as a set (None: the model's generation_config's); a given id outside the
    model's vocabulary [0, ``vocab``) is an error (the model could never emit it)."""
    eos = _eos_ids(eos_token_id, model)
    if eos_token_id is None:
        return eos
    outside = sorted(e for e in eos if e >= vocab)
    if outside:
        raise ValueError(f"eos_token_id {outside[0]} is outside the model vocabulary [0, {vocab})")
    return eos


def _eos_ids(eos_token_id, model) -> set[int]:
    if eos_token_id is None:
        gen_config = getattr(model, "generation_config", None)
        eos_token_id = getattr(gen_config, "eos_token_id", None) if gen_config is not None else None
        if eos_token_id is None:
            return set()
    if isinstance(eos_token_id, torch.Tensor):
        eos_token_id = eos_token_id.tolist()
    if _is_int(eos_token_id):
        eos_token_id = [eos_token_id]
    if not isinstance(eos_token_id, (list, tuple, set)) or not all(_is_int(e) and e >= 0 for e in eos_token_id):
        raise ValueError(f"eos_token_id must be an int >= 0 or a list of them, got {eos_token_id!r}")
    return {int(e) for e in eos_token_id}


# Fields of a model's generation_config that make model.generate(do_sample=False) change the
# logits, with their no-op values. refdec applies those that depend only on the sequence so far
# and the position (_PATH_PROCESSED) per tree path (refdec.processors); a model carrying any
# other is an error rather than a silent difference from model.generate.
_LOGITS_CONFIG_NOOPS = {
    "repetition_penalty": (None, 1.0), "encoder_repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0), "encoder_no_repeat_ngram_size": (None, 0), "bad_words_ids": (None, []),
    "min_length": (None, 0), "min_new_tokens": (None, 0), "suppress_tokens": (None, []),
    "begin_suppress_tokens": (None, []), "forced_bos_token_id": (None,), "forced_eos_token_id": (None,),
    "exponential_decay_length_penalty": (None,), "sequence_bias": (None, {}), "guidance_scale": (None, 1.0),
    "watermarking_config": (None,),
}
_PATH_PROCESSED = ("sequence_bias", "repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "min_length",
                   "min_new_tokens", "forced_eos_token_id", "exponential_decay_length_penalty", "suppress_tokens",
                   "begin_suppress_tokens")


def _is_noop(value, noops) -> bool:
    """``value`` (arrays already made lists) leaves the logits as they are."""
    if isinstance(value, (list, tuple, dict)) and len(value) == 0:
        return True  # an empty list / tuple / dict of banned ids, biases, ...
    return any(value == v for v in noops)


def _generation_config_processor(model, eos: set[int], settings: dict | None = None,
                                 max_new_tokens: int | None = None) -> PathLogitsProcessor:
    """The processor for the logits settings refdec applies per tree path: those of
    ``model.generation_config``, each overridden by the same name in ``settings`` (generate's
    keyword arguments, as ``model.generate(ids, repetition_penalty=1.2)`` takes them; None
    switches a setting off). ``eos``: the decoding's eos ids, for the min-length bans and the
    length penalty; ``max_new_tokens``: for ``forced_eos_token_id`` (the last new token). Raise
    on an unknown setting, and on one that changes the logits but refdec does not apply."""
    settings = dict(settings or {})
    unknown = sorted(name for name in settings if name not in _LOGITS_CONFIG_NOOPS)
    if unknown:
        raise TypeError(f"generate() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; the logits "
                        f"settings it takes are {', '.join(_PATH_PROCESSED)}")
    gen_config = getattr(model, "generation_config", None)
    merged = {name: getattr(gen_config, name, None) for name in _LOGITS_CONFIG_NOOPS}
    merged.update(settings)
    for name, value in merged.items():  # arrays as model.generate takes them: token ids, a (start, factor) pair
        if isinstance(value, (np.ndarray, torch.Tensor)):
            merged[name] = value.tolist()
    if merged["min_new_tokens"] is not None:
        # model.generate sets min_length = prompt length + min_new_tokens whenever min_new_tokens is
        # set (0 included), so the configured min_length never applies then
        merged["min_length"] = None
    set_fields = {name: value for name, value in merged.items() if not _is_noop(value, _LOGITS_CONFIG_NOOPS[name])}
    refused = [(name, value) for name, value in set_fields.items() if name not in _PATH_PROCESSED]
    if refused:
        listed = ", ".join(f"argument {name}={value!r}" if name in settings
                           else f"model.generation_config sets {name}={value!r}" for name, value in refused)
        resets = "; ".join(f"drop the argument {name}" if name in settings else f"model.generation_config.{name} = None"
                           for name, _ in refused)
        raise ValueError(f"{listed}: model.generate applies it to the logits and refdec does not, so the outputs "
                         f"would differ. Decode without it: {resets}")
    return PathLogitsProcessor(**{name: value for name, value in set_fields.items() if name in _PATH_PROCESSED},
                               eos=eos, max_new_tokens=max_new_tokens)


def _check_index_tokenizer(index, tokenizer) -> None:
    """An index built with another tokenizer drafts ids that mean other text: refuse it (as
    ``CorpusIndex.load(path, tokenizer=...)`` does) when both are known."""
    fingerprint = getattr(index, "fingerprint", None)
    if not fingerprint or tokenizer is None or not hasattr(tokenizer, "get_vocab"):
        return
    from refdec.index import tokenizer_fingerprint

    ours = tokenizer_fingerprint(tokenizer)  # memoised per tokenizer object
    if ours != fingerprint:
        raise ValueError(f"index was built with another tokenizer (fingerprint {fingerprint[:12]}..., the "
                         f"tokenizer given has {ours[:12]}...): its drafts would be other text")


def _validate_sampling(do_sample, temperature, top_k, top_p, seed, min_p=None) -> None:
    if not isinstance(do_sample, bool):
        raise ValueError(f"do_sample must be True or False, got {do_sample!r}")
    if not isinstance(temperature, numbers.Real) or isinstance(temperature, bool) or not np.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number, got {temperature!r}")
    if do_sample and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when do_sample=True, got {temperature!r} "
                         "(use do_sample=False for greedy decoding)")
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (not isinstance(top_p, numbers.Real) or isinstance(top_p, bool)
                              or not 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")
    if min_p is not None and (not isinstance(min_p, numbers.Real) or isinstance(min_p, bool)
                              or not 0.0 <= min_p <= 1.0):
        raise ValueError(f"min_p must be None or a number in [0, 1], got {min_p!r}")
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise ValueError(f"seed must be None or an int >= 0, got {seed!r}")
    if not do_sample:
        unused = [f"{name}={value!r}" for name, value, off in (
            ("temperature", temperature, 1.0), ("top_k", top_k, None), ("top_p", top_p, None), ("min_p", min_p, None),
            ("seed", seed, None)) if value != off]
        if unused:  # as model.generate warns: greedy decoding does not read them
            warnings.warn(f"do_sample=False (greedy decoding), so {', '.join(unused)} has no effect; pass "
                          f"do_sample=True to sample", UserWarning, stacklevel=4)


def _normalize_stop_strings(stop_strings, tokenizer) -> list[str]:
    if stop_strings is None:
        return []
    if isinstance(stop_strings, str):
        stop_strings = [stop_strings]
    if not isinstance(stop_strings, (list, tuple)) or not all(isinstance(s, str) and s for s in stop_strings):
        raise ValueError(f"stop_strings must be a non-empty string or a list of them, got {stop_strings!r}")
    if stop_strings and tokenizer is None:
        raise ValueError("stop_strings needs a tokenizer: pass tokenizer=... to generate()")
    return list(stop_strings)


def _normalize_references(references, tokenizer) -> list[np.ndarray]:
    if references is None:
        return []
    if isinstance(references, (str, bytes)) or not isinstance(references, (list, tuple)):
        raise ValueError(f"references must be a list of str or of token-id lists, got {type(references).__name__}")
    out = []
    for i, ref in enumerate(references):
        if isinstance(ref, str):
            if tokenizer is None:
                raise ValueError(f"references[{i}] is a str; text references need tokenizer=...")
            ids = tokenizer(ref, add_special_tokens=False)["input_ids"]
        elif isinstance(ref, torch.Tensor):
            ids = ref.reshape(-1).tolist()
        elif isinstance(ref, (list, tuple, np.ndarray)):
            ids = list(np.asarray(ref).reshape(-1).tolist())
        else:
            raise ValueError(f"references[{i}] must be a str or a list of token ids, got {type(ref).__name__}")
        if not all(_is_int(t) and t >= 0 for t in ids):
            raise ValueError(f"references[{i}] must hold token ids >= 0")
        out.append(np.asarray(ids, dtype=np.int32))
    return out


def _drop_out_of_vocab(tree: DraftTree, vocab_size: int) -> DraftTree:
    """The subtree without nodes whose token is >= ``vocab_size`` or < 0 (and their descendants).

    A reference or an index built for a larger vocabulary can draft ids the model has
    no embedding for, and an index file whose body is corrupt (``CorpusIndex.verify()``
    is False; loading checks the structure, not every token) negative ones; such a node
    could never be accepted and must not reach the model."""
    parents = tree.parents
    keep = (tree.token_ids < vocab_size) & (tree.token_ids >= 0)
    for node_idx in range(len(tree)):  # parents precede children
        if keep[node_idx] and parents[node_idx] >= 0 and not keep[parents[node_idx]]:
            keep[node_idx] = False
    return keep_nodes(tree, np.flatnonzero(keep))


def draft_for_step(proposer, budget, useful_depth: int, max_depth: int, vocab_size: int,
                   select: bool = True) -> DraftTree:
    """One step's draft: as many nodes as ``budget`` chooses, cut to ``useful_depth`` (the
    tokens still allowed), without tokens the model's vocabulary lacks, then trimmed by the
    budget's optional ``select`` hook (AutoBudget: the prefix worth its forward cost) unless
    ``select`` is False (the batched loop trims all rows together)."""
    n_nodes = int(budget.choose(proposer.last_match_lengths()))
    if n_nodes <= 0:
        return DraftTree.empty()
    tree = proposer.propose(n_nodes)
    if len(tree) and (int(tree.token_ids.max()) >= vocab_size or int(tree.token_ids.min()) < 0):
        tree = _drop_out_of_vocab(tree, vocab_size)
    if len(tree) and useful_depth < max_depth:
        tree = prune_to_depth(tree, useful_depth)
    select_hook = getattr(budget, "select", None) if select else None  # optional policy hook (refdec.budget)
    if select_hook is not None and len(tree):
        tree = select_hook(tree)
    return tree


def _check_retrieve(retrieve, index) -> int:
    if not _is_int(retrieve) or retrieve < 0:
        raise ValueError(f"retrieve must be an int >= 0 (documents to retrieve from the index), got {retrieve!r}")
    if retrieve and index is None:
        raise ValueError(f"retrieve={retrieve} needs a corpus index (index=...) to retrieve documents from")
    if retrieve:
        index.retriever()  # ValueError when the index has no MinHash signatures
    return int(retrieve)


# --------------------------------------------------------------------------- stops


class _StopChecker:
    """Finds the first token of an accepted run at which generation must stop.

    eos: the eos token itself is emitted (as model.generate does). Stop strings:
    the run stops at the token that completes a stop string, with the same rule
    as transformers' StopStringCriteria (the occurrence must overlap the final
    token's text); that token is emitted, nothing after it.
    """

    def __init__(self, eos: set[int], stop_strings: list[str], tokenizer) -> None:
        self.eos = eos
        self.stop_strings = stop_strings
        self.tokenizer = tokenizer
        # enough tokens to hold any stop string: a token decodes to >= 1 character, or to >= 1 byte
        # of one (byte-fallback tokens), and a character is at most 4 UTF-8 bytes
        self.window = 4 * max((len(s) for s in stop_strings), default=0) + 2

    def _completes_stop_string(self, seq: list[int]) -> bool:
        decode = self.tokenizer.decode
        start = max(0, len(seq) - self.window)
        text = decode(seq[start:], skip_special_tokens=False)
        # A window that starts inside a character decodes to "\ufffd" there (SentencePiece's byte
        # fallback turns a whole invalid run of byte tokens into them): start up to 3 tokens earlier.
        for _ in range(3):
            if start == 0 or not text.startswith("\ufffd"):
                break
            start -= 1
            text = decode(seq[start:], skip_special_tokens=False)
        tail = seq[start:]
        # Occurrences that end inside the final token's text: past the text the tail had without it.
        # Decoding need not be concatenative: a token completing a UTF-8 character turns the
        # "\ufffd" before it into that character (byte-level tokenizers), or a whole run of byte
        # tokens (byte fallback). So "without it" is the longest text of the tail's first k tokens,
        # k < len(tail), that is a prefix of the text (the bytes of the character the final token
        # completes belong to its text); failing that, the common prefix with the text.
        unchanged, without_last = None, ""
        for k in range(len(tail) - 1, max(0, len(tail) - 5), -1):
            before = decode(tail[:k], skip_special_tokens=False)
            if k == len(tail) - 1:
                without_last = before
            if text.startswith(before):
                unchanged = len(before)
                break
        if unchanged is None:
            unchanged = len(os.path.commonprefix([without_last, text]))
        for s in self.stop_strings:
            start = max(0, unchanged - len(s) + 1)
            if s in text[start:]:
                return True
        return False

    def cut(self, seq: list[int], n_new: int) -> tuple[int, str]:
        """``seq`` ends with the ``n_new`` tokens of this run; return (tokens to keep, reason or '')."""
        first = len(seq) - n_new
        for i in range(first, len(seq)):
            if seq[i] in self.eos:
                return i - first + 1, "eos"
            if self.stop_strings and self._completes_stop_string(seq[: i + 1]):
                return i - first + 1, "stop_string"
        return n_new, ""


# --------------------------------------------------------------------------- decoder


def prefill_spans(n_tokens: int, chunk: int | None) -> list[tuple[int, int]]:
    """[begin, end) token spans of a prompt prefill: chunks of ``chunk`` tokens
    (the last one shorter), or the whole prompt when ``chunk`` is None."""
    if chunk is None or n_tokens <= chunk:
        return [(0, n_tokens)]
    return [(begin, min(begin + chunk, n_tokens)) for begin in range(0, n_tokens, chunk)]


def _default_proposer_factory(index, references, max_depth):
    from refdec.proposer import Proposer

    # With references (editing), the copy cursor follows the output through them:
    # +6.5% tokens/step at 64 nodes on edits-click (benchmarks/RESULTS.md).
    return Proposer(index=index, references=references or None, max_depth=max_depth,
                    cursor=bool(references))


class SpeculativeDecoder:
    """Reusable state for speculative decoding with one model.

    ``proposer_factory(index, references, max_depth) -> Proposer`` builds the
    per-call proposer (default: ``refdec.proposer.Proposer``); ``max_depth`` caps
    the draft tree depth.

    Drafts are never fed to the model when they hold a token id >= the model's
    vocabulary size (a reference or an index built for a larger vocabulary):
    such nodes and their subtrees are dropped from the tree. References only
    draft (they are never fed to the model), so they may be longer than its
    context window.

    ``retrieve=k`` (``generate``): the k documents of the corpus index most
    similar to the prompt (``refdec.retrieval.Retriever.top_k``, containment
    score: how much of the prompt a document covers) are added to the
    per-request references, so they draft with the reference source's weight
    next to the live context and the whole-corpus index
    (``stats.retrieved_documents``). Needs an index with MinHash signatures
    (``refdec index build`` writes them). Default 0: see
    benchmarks/retrieval_sim.py for when it helps.

    ``prefill_chunk``: the prompt is prefilled in forwards of at most this many
    tokens (None: one forward). A chunk attends only to the keys before its end,
    so a long prompt skips most of the masked-out half of a whole-prompt
    attention, and sliding-window layers (Gemma 3) read only their last
    ``window - 1`` keys plus the chunk (refdec.cache.set_prefill_window): with
    Gemma 3 270M on 2 CPU threads a 4,096-token prompt prefills in 6.4 s instead
    of 10.7 s, an 8,192-token one in 15.5 s instead of 33.6 s; a prompt of at most
    ``prefill_chunk`` tokens runs as one forward (benchmarks/RESULTS.md; measured
    on a CPU only). The same computation up to
    floating-point rounding (GEMM shapes differ): identical tokens in the tests
    (float64) and in the benchmarks (float32).

    ``decoder.joint_batch_budget`` (default True): batches with
    ``max_draft_tokens="auto"`` choose the rows' verified prefixes together, priced as
    one padded batched forward (refdec.budget.batch_prefix_sizes); False prices each
    row alone on the single-row curve.
    """

    def __init__(self, model, tokenizer=None, index=None, *, max_depth: int = 64, proposer_factory=None,
                 prefill_chunk: int | None = 512) -> None:
        if not _is_int(max_depth) or max_depth < 1:
            raise ValueError(f"max_depth must be an int >= 1, got {max_depth!r}")
        if prefill_chunk is not None and (not _is_int(prefill_chunk) or prefill_chunk < 1):
            raise ValueError(f"prefill_chunk must be an int >= 1 or None, got {prefill_chunk!r}")
        self.prefill_chunk = None if prefill_chunk is None else int(prefill_chunk)
        self.model = model
        self.tokenizer = tokenizer
        self.index = index
        self.max_depth = int(max_depth)
        self.proposer_factory = proposer_factory or _default_proposer_factory
        self.mask_spec = mask_spec_for(model)
        config = text_config(model)
        self.max_positions = getattr(config, "max_position_embeddings", None)
        self.vocab_size = int(config.vocab_size)
        self.device = next(model.parameters()).device
        self._cache_kw = cache_kwarg(model)
        ensure_lossless_tree_verification(model, self.mask_spec, self._cache_kw)  # unverified model types
        self._auto_budget = None  # the "auto" policy persists across calls (its feedback carries over)
        split = split_forward_fn(model)  # None: the model's own forward computes the logits
        self._backbone_forward, self._head = split if split is not None else (None, None)
        # Lazy head (CPU): the LM head runs only on the tree rows the acceptance walk visits
        # (refdec.verify.LazyRowLogits). On a GPU the head of every row costs about as much as
        # one row's, so the whole tree is computed in the forward.
        self.lazy_head = split is not None and self.device.type == "cpu"
        # Batches with max_draft_tokens="auto": the rows' verified prefixes are chosen together and
        # priced as one padded batched forward (refdec.budget.batch_prefix_sizes); False prices each
        # row alone on the single-row curve (the earlier behaviour, kept for comparison).
        self.joint_batch_budget = True
        # Sliding-window layers (Gemma 3): during a chunked prefill they read only the last
        # window - 1 keys plus the chunk (refdec.cache.set_prefill_window).
        self._sliding_layers = list(self.mask_spec.sliding_layers)

    def _forward(self, cache, **kwargs):
        kwargs[self._cache_kw] = cache
        return self.model(use_cache=True, **kwargs)

    def _sliding_prefill_start(self, begin: int) -> int:
        """The first key column the sliding-window layers present to the prefill chunk that
        starts at column ``begin`` (see :meth:`_prefill_forward`); 0 = every column."""
        if not (begin and self._sliding_layers):
            return 0
        return max(0, begin - self.mask_spec.window + 1)

    def _prefill_forward(self, cache, begin: int, is_last: bool, use_split: bool, **inputs):
        """One prefill chunk (``input_ids`` [B, T] and optional positions / mask) into ``cache``,
        the chunk starting at column ``begin``. After the first chunk the sliding-window layers
        (Gemma 3) present only their last ``window - 1`` entries plus the chunk
        (refdec.cache.set_prefill_window; an explicit mask must cover the columns from
        :meth:`_sliding_prefill_start`); after the last one they present every entry again.
        Returns float [B, V], the logits of each sequence's last slot, for the last chunk
        (``is_last``), else None. ``use_split``: through the backbone + verifier head (the
        head on that one row), else the model's own forward with ``logits_to_keep=1``."""
        if begin and self._sliding_layers:  # the layers exist after the first chunk
            set_prefill_window(cache, self._sliding_layers, self.mask_spec.window)
        if use_split:
            hidden = self._backbone_forward(cache, **inputs)  # [B, T, D]
            logits = self._head.logits(hidden[:, -1]) if is_last else None
        else:
            out = self._forward(cache, logits_to_keep=1, **inputs)
            logits = out.logits[:, -1] if is_last else None
        if is_last:
            set_prefill_window(cache, self._sliding_layers, None)  # the decoding loop passes its own masks
        return logits

    def _full_logits(self, cache, inputs):
        """float [1 + n, V]: every tree row's logits (verifier head when the model has a plain one)."""
        kwargs = dict(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                      attention_mask=inputs.attention_mask)
        if self._head is not None:
            return self._head.logits(self._backbone_forward(cache, **kwargs)[0])
        return self._forward(cache, **kwargs).logits[0]

    @torch.inference_mode()
    def generate(self, input_ids, *, tokenizer=None, index=None, references=None, max_new_tokens: int = 256,
                 do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None, eos_token_id=None, stop_strings=None,
                 streamer=None, max_draft_tokens="auto", attention_mask=None, pad_token_id=None,
                 retrieve: int = 0, max_batch_size: int | None = None, min_p: float | None = None,
                 on_row_done=None, **logits_settings) -> GenerateOutput:
        """Speculative generation of one prompt, or of a batch (see refdec.batch).

        ``logits_settings``: ``model.generate``'s sequence-dependent logits settings
        (``repetition_penalty``, ``no_repeat_ngram_size``, ``sequence_bias``, ``bad_words_ids``,
        ``suppress_tokens``, ``begin_suppress_tokens``, ``min_length``, ``min_new_tokens``),
        each overriding the model's ``generation_config`` (None switches it off) and applied
        to every tree path as ``model.generate`` applies it (refdec.processors).

        Batched input: a left-padded LongTensor [B, L] with ``attention_mask`` (as
        ``model.generate`` takes it) or a list of prompts of different lengths;
        ``references`` shared by all rows or one list per row; ``seed`` an int (row
        ``b`` uses ``seed + b``) or a list of per-row seeds; ``streamer`` unsupported.
        ``max_batch_size`` (int >= 1, None = all rows at once): at most that many rows
        decode together; the others wait in order and join as rows finish
        (continuous batching). A row's output does not depend on the grouping (exactly
        so in float64; in lower precision other matmul shapes may flip a near-tie, as
        for any batching). ``on_row_done(batch_row, new_tokens, row_stats)`` (batches
        only): called as each row finishes, with its index in the batch, its new tokens
        (list of int) and its DecodingStats, e.g. to write results out before the batch ends.
        """
        if on_row_done is not None and not callable(on_row_done):
            raise ValueError(f"on_row_done must be callable or None, got {type(on_row_done).__name__}")
        if max_batch_size is not None and (not _is_int(max_batch_size) or max_batch_size < 1):
            raise ValueError(f"max_batch_size must be an int >= 1 or None, got {max_batch_size!r}")
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        index = index if index is not None else self.index
        _check_index_tokenizer(index, tokenizer)
        from refdec import batch as _batch

        one_row_batch = (on_row_done is not None and isinstance(input_ids, (torch.Tensor, np.ndarray))
                         and input_ids.ndim == 2)  # [1, L] with a callback: model.generate's batch form
        if _batch.is_batched_input(input_ids, attention_mask) or one_row_batch:
            return self._generate_batch(input_ids, attention_mask, tokenizer=tokenizer, index=index,
                                        references=references, max_new_tokens=max_new_tokens,
                                        do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
                                        min_p=min_p, seed=seed, eos_token_id=eos_token_id,
                                        stop_strings=stop_strings, streamer=streamer, max_draft_tokens=max_draft_tokens,
                                        pad_token_id=pad_token_id, retrieve=retrieve,
                                        max_batch_size=max_batch_size, logits_settings=logits_settings,
                                        on_row_done=on_row_done)
        if on_row_done is not None:
            raise ValueError("on_row_done applies to batches (a list of prompts or a padded [B, L] batch); "
                             "stream one prompt with streamer=")
        wall_start = time.perf_counter()
        prompt = _normalize_prompt(input_ids)
        if attention_mask is not None:
            mask = np.asarray(attention_mask.cpu() if isinstance(attention_mask, torch.Tensor) else attention_mask)
            if mask.size != prompt.size or not (mask == 1).all():
                raise ValueError(f"attention_mask for a single prompt must be all ones of its length {prompt.size}, "
                                 f"got shape {tuple(mask.shape)} (pass a padded [B, L] batch, or a list of prompts)")
        if not _is_int(max_new_tokens) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        _validate_sampling(do_sample, temperature, top_k, top_p, seed, min_p)
        eos = _normalize_eos(eos_token_id, self.model, self.vocab_size)
        processor = _generation_config_processor(self.model, eos, logits_settings, max_new_tokens)
        processor.check_vocab(self.vocab_size)
        stops = _normalize_stop_strings(stop_strings, tokenizer)
        refs = _normalize_references(references, tokenizer)
        if streamer is not None and not (callable(getattr(streamer, "put", None))
                                         and callable(getattr(streamer, "end", None))):
            raise ValueError(f"streamer must have put() and end() (a transformers BaseStreamer), "
                             f"got {type(streamer).__name__}")
        if index is not None:
            from refdec.index import CorpusIndex

            if not isinstance(index, CorpusIndex):
                raise ValueError(f"index must be a refdec.CorpusIndex or None, got {type(index).__name__}")
        retrieve = _check_retrieve(retrieve, index)
        if max_draft_tokens == "auto":
            if self._auto_budget is None:
                self._auto_budget = make_budget("auto", model=self.model)  # calibrates once (cached)
            budget = self._auto_budget
        else:
            budget = make_budget(max_draft_tokens)
        if (prompt >= self.vocab_size).any() or (prompt < 0).any():
            bad = int(prompt[(prompt >= self.vocab_size) | (prompt < 0)][0])
            raise ValueError(f"input_ids holds token id {bad}, outside the model vocabulary [0, {self.vocab_size})")
        prompt_len = int(prompt.shape[0])
        if self.max_positions is not None and prompt_len > self.max_positions:
            raise ValueError(f"prompt has {prompt_len} tokens, more than the model's "
                             f"max_position_embeddings={self.max_positions}")

        stats = DecodingStats()
        if do_sample:
            seed = random_seed() if seed is None else int(seed)
            stats.seed = seed
        prompt_tensor = torch.from_numpy(prompt).unsqueeze(0)
        if streamer is not None:
            streamer.put(prompt_tensor)
        if max_new_tokens == 0:
            stats.stop_reason = "max_new_tokens"
            if streamer is not None:
                streamer.end()
            stats.wall_seconds = time.perf_counter() - wall_start
            return GenerateOutput(prompt_tensor.clone(), stats)

        sampler = TargetSampler(self.vocab_size, do_sample=do_sample, temperature=temperature, top_k=top_k,
                                top_p=top_p, seed=seed, device=self.device, min_p=min_p)
        stopper = _StopChecker(eos, stops, tokenizer)
        seq: list[int] = prompt.tolist()
        max_total = prompt_len + max_new_tokens
        if self.max_positions is not None:
            max_total = min(max_total, self.max_positions + 1)  # the last token is emitted, never fed

        # The proposer is only built when drafting can happen (max_draft_tokens=0 needs no proposer).
        proposer = None
        if not (isinstance(budget, FixedBudget) and budget.max_nodes == 0):
            if retrieve:
                t0 = time.perf_counter()
                hits = index.retriever().top_k(prompt, retrieve, score="containment")
                stats.retrieved_documents = [doc_idx for doc_idx, _ in hits]
                refs = refs + [index.document(doc_idx) for doc_idx in stats.retrieved_documents]
                stats.retrieve_seconds = time.perf_counter() - t0
            proposer = self.proposer_factory(index, refs, self.max_depth)
            proposer.start(prompt.astype(np.int32))

        def emit(tokens: list[int]) -> bool:
            """Append an accepted run, honouring stops; return True when generation is over."""
            room = max_total - len(seq)
            tokens = tokens[:room]
            seq.extend(tokens)
            keep, reason = stopper.cut(seq, len(tokens))
            if keep < len(tokens):
                del seq[len(seq) - len(tokens) + keep:]
            kept = tokens[:keep]
            if streamer is not None and kept:
                streamer.put(torch.tensor(kept, dtype=torch.long))
            if not reason and len(seq) >= max_total:
                reason = "max_new_tokens" if len(seq) >= prompt_len + max_new_tokens else "max_position_embeddings"
            if reason:
                stats.stop_reason = reason
                return True
            if proposer is not None:
                proposer.accept(np.asarray(kept, dtype=np.int32))
            return False

        # Prefill: the prompt, in chunks; the last chunk's last logits give the first new token.
        t0 = time.perf_counter()
        cache = new_cache()
        for begin, end in prefill_spans(prompt_len, self.prefill_chunk):
            logits = self._prefill_forward(cache, begin, end == prompt_len, self._head is not None,
                                           input_ids=prompt_tensor[:, begin:end].to(self.device))
        last_logits = logits[0]
        if processor.active:
            last_logits = processor(last_logits, seq, prompt_len)
        first = sampler.sample(last_logits, prompt_len) if do_sample else int(last_logits.argmax())
        t1 = time.perf_counter()
        stats.prefill_seconds = t1 - t0
        stats._count_pass(0)
        done = emit([first])
        stats.accept_seconds += time.perf_counter() - t1

        empty = DraftTree.empty()
        observe_nodes = getattr(budget, "observe_nodes", None)
        while not done:
            root_pos = len(seq) - 1  # == cache length
            root = seq[-1]
            # -- propose
            t0 = time.perf_counter()
            tree = empty
            if proposer is not None:
                # depth d lands at position root_pos + d; it is useful only while the run fits max_total
                tree = draft_for_step(proposer, budget, max_total - len(seq) - 1, self.max_depth,
                                      self.vocab_size)
            t1 = time.perf_counter()
            # -- prepare
            inputs = build_tree_inputs(tree, root, root_pos, self.mask_spec, self.device)
            t2 = time.perf_counter()
            # -- forward + targets
            head_seconds = 0.0
            if self.lazy_head:
                hidden = self._backbone_forward(cache, input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                                                attention_mask=inputs.attention_mask)[0]  # [1 + n, D]
                row_logits = LazyRowLogits(tree, hidden, self._head)
                t3 = time.perf_counter()
                # -- accept: the head runs on the rows the walk visits, a chunk at a time
                if processor.active:  # each row's logits with the sequence on its path
                    accepted, bonus = accept_walk_lazy(tree, lambda row, depth: processor.target(
                        row_logits.row_logits(row), seq + path_tokens(tree, row), prompt_len, sampler,
                        root_pos + 1 + depth))
                elif do_sample:
                    accepted, bonus = accept_walk_lazy(
                        tree, lambda row, depth: sampler.sample(row_logits.row_logits(row), root_pos + 1 + depth))
                else:
                    accepted, bonus = accept_walk_lazy(tree, lambda row, depth: row_logits.argmax(row))
                head_seconds = row_logits.seconds  # head time counts as forward, not as accept
                stats.head_rows += row_logits.rows_computed
                del hidden, row_logits
            else:
                logits = self._full_logits(cache, inputs)  # [1 + n, V]
                stats.head_rows += 1 + len(tree)
                if processor.active:
                    t3 = time.perf_counter()
                    # -- accept: each row on the accepted path with the sequence on its path
                    accepted, bonus = accept_walk_lazy(tree, lambda row, depth: processor.target(
                        logits[row], seq + path_tokens(tree, row), prompt_len, sampler, root_pos + 1 + depth))
                elif do_sample:
                    t3 = time.perf_counter()
                    # -- accept: sample only the rows on the accepted path
                    accepted, bonus = accept_walk_lazy(
                        tree, lambda row, depth: sampler.sample(logits[row], root_pos + 1 + depth))
                else:
                    targets = sampler.greedy_targets(logits).cpu().numpy()  # the one host sync
                    t3 = time.perf_counter()
                    # -- accept
                    accepted, bonus = accept_walk(tree, targets)
                del logits
            k = int(accepted.shape[0])
            chain_prefix = bool(k == 0 or int(accepted[-1]) == k - 1)  # nodes 0..k-1: a plain truncation
            compact(cache, root_pos + 1, None if chain_prefix else torch.from_numpy(accepted).to(self.device), k)
            run = tree.token_ids[accepted].tolist() + [bonus]
            stats._count_pass(k)
            stats._count_draft(tree, accepted)
            if proposer is not None and len(tree):
                budget.observe(len(tree), k)
                if observe_nodes is not None:
                    observe_nodes(accepted)
            done = emit(run)
            t4 = time.perf_counter()
            stats.propose_seconds += t1 - t0
            stats.prepare_seconds += t2 - t1
            stats.forward_seconds += t3 - t2 + head_seconds
            stats.accept_seconds += t4 - t3 - head_seconds

        if streamer is not None:
            streamer.end()
        stats.new_tokens = len(seq) - prompt_len
        stats.wall_seconds = time.perf_counter() - wall_start
        return GenerateOutput(torch.tensor([seq], dtype=torch.long), stats)

    def _generate_batch(self, input_ids, attention_mask, *, tokenizer, index, references, max_new_tokens,
                        do_sample, temperature, top_k, top_p, min_p, seed, eos_token_id, stop_strings, streamer,
                        max_draft_tokens, pad_token_id, retrieve, max_batch_size=None,
                        logits_settings=None, on_row_done=None) -> GenerateOutput:
        from refdec import batch as _batch

        if streamer is not None:
            raise ValueError("streamer needs a single prompt (as transformers' streamers): pass it as input_ids "
                             "(a list of ints or a [1, L] tensor, not a list of prompts), or generate the rows one "
                             "at a time to stream them")
        if not _is_int(max_new_tokens) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        _validate_sampling(do_sample, temperature, top_k, top_p, None if isinstance(seed, (list, tuple)) else seed,
                           min_p)
        eos = _normalize_eos(eos_token_id, self.model, self.vocab_size)
        stops = _normalize_stop_strings(stop_strings, tokenizer)
        if index is not None:
            from refdec.index import CorpusIndex

            if not isinstance(index, CorpusIndex):
                raise ValueError(f"index must be a refdec.CorpusIndex or None, got {type(index).__name__}")
        retrieve = _check_retrieve(retrieve, index)
        if max_draft_tokens != "auto":
            make_budget(max_draft_tokens)  # validates
        if pad_token_id is None:
            gen_config = getattr(self.model, "generation_config", None)
            pad_token_id = getattr(gen_config, "pad_token_id", None)
            if pad_token_id is None:
                pad_token_id = min(eos) if eos else 0
        if not _is_int(pad_token_id) or pad_token_id < 0:
            raise ValueError(f"pad_token_id must be an int >= 0, got {pad_token_id!r}")
        processor = _generation_config_processor(self.model, eos, logits_settings, max_new_tokens)
        processor.check_vocab(self.vocab_size)
        prompts, padded = _batch.normalize_batch(input_ids, attention_mask, self.vocab_size)
        return _batch.generate_batch(
            self, prompts, padded, tokenizer=tokenizer, index=index, references=references,
            max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
            seed=seed, eos=eos, stops=stops, max_draft_tokens=max_draft_tokens, pad_token_id=int(pad_token_id),
            retrieve=retrieve, normalize_references=_normalize_references, stop_checker_cls=_StopChecker,
            stats_cls=DecodingStats, output_cls=GenerateOutput, max_batch_size=max_batch_size,
            processor=processor, min_p=min_p, on_row_done=on_row_done)


def generate(model, input_ids, *, tokenizer=None, index=None, references=None, max_new_tokens: int = 256,
             do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, seed: int | None = None, eos_token_id=None, stop_strings=None,
             streamer=None, max_draft_tokens="auto", proposer_factory=None, attention_mask=None,
             pad_token_id=None, retrieve: int = 0, max_batch_size: int | None = None, min_p: float | None = None,
             on_row_done=None, **logits_settings) -> GenerateOutput:
    """One-shot speculative generation (a fresh ``SpeculativeDecoder``); see that class for details.
    Batches: a left-padded [B, L] ``input_ids`` with ``attention_mask``, or a list of prompts (refdec.batch);
    ``max_batch_size`` rows at most decode together, the others join as rows finish.
    ``logits_settings``: ``repetition_penalty=1.2`` etc., as SpeculativeDecoder.generate takes them."""
    decoder = SpeculativeDecoder(model, tokenizer=tokenizer, index=index, proposer_factory=proposer_factory)
    return decoder.generate(input_ids, references=references, max_new_tokens=max_new_tokens,
                            do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            seed=seed,
                            eos_token_id=eos_token_id, stop_strings=stop_strings, streamer=streamer,
                            max_draft_tokens=max_draft_tokens, attention_mask=attention_mask,
                            pad_token_id=pad_token_id, retrieve=retrieve, max_batch_size=max_batch_size,
                            on_row_done=on_row_done, **logits_settings)
