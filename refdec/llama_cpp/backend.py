"""The llama.cpp backend of the decoding engine: a batch of draft trees verified in ONE
``llama_decode``.

KV layout (one unified llama.cpp KV cache, refdec.llama_cpp.api.TreeContext):

* each running request (batch row) owns a *base* sequence id; its cells hold every token of
  the row's sequence but the last one, the root (the engine's invariant,
  refdec.engine.engine);
* a step gives each leaf of the row's tree a *branch* sequence id, copies the row's context
  into it (``seq_cp``: the cells gain the id, nothing is recomputed), and decodes
  ``[root] + nodes``: the root in the base and every branch sequence, each node at position
  ``root + depth`` in the branch sequences of the leaves below it. llama.cpp masks attention
  by sequence id (a node reads the cells of its first sequence), so a node attends to exactly
  the context, its ancestors and itself;
* after the walk the accepted nodes' cells join the base sequence (``seq_cp`` of the accepted
  leaf's branch over their positions) and every branch sequence is removed: cells no sequence
  holds are free again. No token is evaluated twice, but for the case below.

A finished row's base sequence is kept, not freed, in the backend's prefix cache
(refdec.engine.prefix_cache; ``prefix_cache`` entries, least recently used evicted first): a
later prompt that begins with the same tokens copies those cells into its own base sequence
(``seq_cp``) and is prefilled from the first token that differs. An entry gives its sequence id
back when the trees need more sequences, and its cells when a decode finds no free slot.

A model with recurrent layers (a hybrid: Qwen3.5, LFM2, Granite 4, Nemotron-H; or Mamba) keeps one
recurrent state per sequence, which ``seq_cp`` shares between sequences and llama.cpp cannot split
by tree branch, nor cut back past the last ``n_rs_seq`` tokens it keeps states for. On such a
model a row verifies a *chain* (its tree's best path, at most :data:`MAX_RECURRENT_CHAIN` nodes)
in its base sequence alone, in a decode of its own, and the rejected tail is rolled back with
``seq_rm`` (the context keeps ``1 + MAX_RECURRENT_CHAIN`` states per sequence). Where llama.cpp
keeps no such states (``scratch_chains``: Mamba2, Granite 4, Falcon-H1, Qwen3-Next in 0.3.36), the
chain runs in a scratch copy of the row's sequence (``seq_cp`` shares the state, the decode copies
it): accepted whole, the copy becomes the row's sequence; else it is dropped and the root and the
accepted nodes are decoded again on the row's sequence (one more decode). A kept sequence's
state is that of its last token, so its prefix-cache entry is reused whole or not at all: by a
prompt that begins with all its tokens (a chat's next turn), whose base sequence then shares its
state (llama.cpp copies it on the first decode). docs/llama_cpp.md has the measured cost.

Exact mode (``exact``; on by default where llama.cpp has ggml's batch-invariant matrix products,
``refdec build-llama``, and the model is an attention model without flash attention): a row's
tokens come out as llama.cpp's plain one-token decoding gives them, bit for bit. Each sequence has
a KV stream of its own, its cells at its positions as in plain decoding's cache; a row verifies a
chain (its tree's best path) in its base sequence, every row in one decode with batch-invariant
products (each row computes what a one-token decode computes), the rejected tail removed with
``seq_rm``; prompts are prefilled in the Llama's ``n_batch`` chunks with llama.cpp's usual kernels,
as ``Llama.eval`` feeds them, and a prefix-cache entry is reused only up to the last whole chunk of
its prompt, so that every cell holds what a fresh plain decode computes there. docs/llama_cpp.md
says what it costs.

Every entry asks for logits: a leaf's are read only if it is accepted, but without them an
accepted leaf would yield no bonus token. (A policy that skipped the logits of leaves unlikely to
be accepted was measured no faster, and removed; CHANGELOG.md.)
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import torch

from refdec.drafting.tree import MAX_NODES, DraftTree, keep_nodes
from refdec.engine.accept import accept_walk_steps
from refdec.engine.defaults import PREFIX_CACHE_ENTRIES
from refdec.engine.interface import PrefillCancelled, Verified
from refdec.engine.prefix_cache import PrefixCache
from refdec.llama_cpp.api import (MAX_SEQUENCES, LlamaDecodeError, TreeContext, batch_invariant_switch,
                                  flash_attention_on, is_recurrent)
from refdec.llama_cpp.calibration import auto_cost_curve
from refdec.llama_cpp.tokenizer import GgufTokenizer

__all__ = ["MAX_RECURRENT_CHAIN", "LlamaCppBackend", "LlamaRunningBatch", "best_path",
           "exact_default", "exact_mode_refusal", "tree_layout"]

# The longest chain a row verifies on a model with recurrent layers: llama.cpp keeps one recurrent
# state per token of a sequence's last 1 + this many (n_rs_seq), so that a rejected tail can be rolled
# back; each costs a copy of every recurrent layer's state per decoded token (docs/llama_cpp.md).
MAX_RECURRENT_CHAIN = 16



def exact_mode_refusal(llm) -> str | None:
    """Why exact mode cannot run on ``llm`` (None: it can)."""
    if batch_invariant_switch() is None:
        return ("this llama-cpp-python has no batch-invariant matrix products (ggml_cpu_set_batch_invariant): "
                "build it with `refdec build-llama`")
    if is_recurrent(llm.model):
        return "the model has recurrent layers, whose batched kernels refdec has not checked row by row"
    if flash_attention_on(llm):
        return ("the Llama uses flash attention, whose CPU kernels differ by batch size: "
                "create it with flash_attn=False (llama-cpp-python's default)")
    return None


def _require_chain(tree: DraftTree, who: str) -> None:
    """ValueError unless ``tree`` is a chain (each node the child of the one before), which ``who``
    verifies on llama.cpp (fit_tree makes them)."""
    if len(tree) and not np.array_equal(tree.parents, np.arange(-1, len(tree) - 1)):
        raise ValueError(f"{who} verifies chains on llama.cpp: fit_tree makes them")


def exact_default(llm, exact: bool | None) -> bool:
    """Exact mode for ``llm``: ``exact`` itself (True where :func:`exact_mode_refusal` refuses is a
    ValueError with its reason), or, when None, whether it can run."""
    why = exact_mode_refusal(llm)
    if exact is None:
        return why is None
    if exact and why is not None:
        raise ValueError(f"exact=True: {why}")
    return bool(exact)


def tree_layout(tree: DraftTree) -> tuple[list[list[int]], np.ndarray]:
    """``(leaves_below[i] (node indices of the leaves in node i's subtree, the first one on its
    best path), leaves int64 [L])`` (a node's position is the root's plus its ``tree.depths``)."""
    n = len(tree)
    parents = tree.parents
    below: list[list[int]] = [[] for _ in range(n)]
    has_child = np.zeros(n, dtype=bool)
    has_child[parents[parents >= 0]] = True
    for node in range(n - 1, -1, -1):  # children come after their parent
        if not has_child[node]:
            below[node].insert(0, node)
        parent = int(parents[node])
        if parent >= 0:
            below[parent][:0] = below[node]  # the lower-index (better) child's leaves first
    return below, np.flatnonzero(~has_child)


def best_path(tree: DraftTree) -> np.ndarray:
    """int64 [d]: the node indices of ``tree``'s best path (best-first: the lowest-index child of the
    root, then of each node on it), root to leaf."""
    path = []
    parent = -1
    for node, node_parent in enumerate(tree.parents.tolist()):
        if node_parent == parent:
            path.append(node)
            parent = node
    return np.asarray(path, dtype=np.int64)


def prefix_with_leaves(tree: DraftTree, max_leaves: int) -> DraftTree:
    """The longest prefix of ``tree`` (best-first: a prefix is a subtree) with at most
    ``max_leaves`` leaves."""
    if max_leaves < 1:
        return DraftTree.empty()
    parents = tree.parents
    is_leaf = np.zeros(len(tree), dtype=bool)
    leaves = 0
    for node in range(len(tree)):
        parent = int(parents[node])
        if parent >= 0 and is_leaf[parent]:
            is_leaf[parent] = False  # the parent stops being a leaf; its child takes its place
        else:
            leaves += 1
        if leaves > max_leaves:
            return keep_nodes(tree, np.arange(node))
        is_leaf[node] = True
    return tree


class LlamaRunningBatch:
    """The rows decoding together on llama.cpp: ``requests`` in batch order, ``base_seqs[b]``
    row b's base sequence id. ``pending`` holds the last step's branch bookkeeping until
    :meth:`keep_accepted` commits it."""

    def __init__(self, backend: "LlamaCppBackend", requests: list, base_seqs: list[int]) -> None:
        self.backend = backend
        self.requests = requests
        self.base_seqs = base_seqs
        self.pending: list | None = None  # per row: (leaf seq of each node, the step's branch seqs)

    def __len__(self) -> int:
        return len(self.requests)

    def join(self, other: "LlamaRunningBatch") -> None:
        self.requests = self.requests + other.requests
        self.base_seqs = self.base_seqs + other.base_seqs

    def keep_accepted(self, root_pos: np.ndarray, accepted_rows: list[np.ndarray]) -> None:
        """Row b's accepted nodes (``accepted_rows[b]`` int64 [k_b], root-to-leaf) join its base
        sequence; every branch sequence of the step is removed. ``root_pos`` int64 [B]."""
        ctx = self.backend.ctx
        pending, self.pending = self.pending, None
        if self.backend.scratch_chains:  # each row's chain ran in a scratch copy of its base sequence
            for b, accepted in enumerate(accepted_rows):
                tokens, scratch = pending[b]
                if scratch is None:
                    continue  # no drafts: the root went into the base sequence itself
                k = int(accepted.shape[0])
                if k == len(tokens) - 1:  # all accepted: the copy becomes the row's sequence
                    self.backend.release_seq(self.base_seqs[b])
                    self.base_seqs[b] = scratch
                    continue
                self.backend.release_seq(scratch)
                kept = tokens[:1 + k]  # the root and the accepted nodes, run again on the base sequence
                self.backend._decode(kept, int(root_pos[b]) + np.arange(1 + k, dtype=np.int32),
                                     [[self.base_seqs[b]]] * (1 + k), np.zeros(1 + k, dtype=bool))
            return
        if self.backend.chains:  # each row's chain sits in its base sequence: cut the rejected tail
            for b, accepted in enumerate(accepted_rows):
                if int(accepted.shape[0]) < pending[b]:
                    ctx.seq_remove(self.base_seqs[b], int(root_pos[b]) + 1 + int(accepted.shape[0]), -1)
            return
        for b, accepted in enumerate(accepted_rows):
            node_seq, branch_seqs = pending[b]
            k = int(accepted.shape[0])
            if k:
                p0 = int(root_pos[b]) + 1
                ctx.seq_copy(node_seq[int(accepted[-1])], self.base_seqs[b], p0, p0 + k)
            for seq in branch_seqs:
                ctx.seq_remove(seq)

    def drop_finished(self) -> None:
        keep = [b for b, request in enumerate(self.requests) if not request.done]
        if len(keep) == len(self.requests):
            return
        for b, request in enumerate(self.requests):
            if request.done:
                self.backend.retire_seq(self.base_seqs[b], request.seq, len(request.prompt))
        self.requests = [self.requests[b] for b in keep]
        self.base_seqs = [self.base_seqs[b] for b in keep]


class LlamaCppBackend:
    """Runs the engine on a ``llama_cpp.Llama`` (refdec.engine.interface.Backend).

    ``max_tree``: the most nodes a row's tree holds; ``n_seq_max``: llama.cpp sequences of the
    verification context (base sequences of the rows + branch sequences of the leaves; at most
    llama.cpp's limit); ``max_rows``: the rows one verification is sized for, each with a whole
    tree (its logits rows: ``max_rows * (1 + max_tree)``; more rows share them, with smaller
    trees); ``prefix_cache``: the finished rows' sequences kept for the prompts that begin the
    same way (0: none; module docstring). The Llama's own context is not touched: refdec keeps a
    context of its own on the same weights (refdec.llama_cpp.api.TreeContext), of the Llama's
    ``n_ctx``, which every running row and kept sequence shares. ``exact``: exact mode (module
    docstring; None: on where it can run, :func:`exact_mode_refusal`); its cache has a stream per
    sequence, ``max_rows + prefix_cache`` of them by default, each of ``n_ctx / max_rows`` cells (a
    row's share of the Llama's context, as in the shared cache: ``1 + prefix_cache / max_rows`` times
    its memory)."""

    def __init__(self, llm, *, max_tree: int = MAX_NODES, n_seq_max: int | None = None, max_rows: int = 1,
                 prefix_cache: int = PREFIX_CACHE_ENTRIES, exact: bool | None = None) -> None:
        self.llm = llm
        # recurrent layers: one chain per row in its base sequence, its rejected tail rolled back (module docstring)
        self.recurrent = is_recurrent(llm.model)
        self.exact = exact_default(llm, exact)
        self.chains = self.recurrent or self.exact  # a row verifies its tree's best path
        self.max_tree = min(int(max_tree), MAX_RECURRENT_CHAIN) if self.recurrent else int(max_tree)
        n_batch = 1 + self.max_tree
        # llama.cpp reserves a logits row per sequence: more sequences than batch entries cost memory
        # (a row is the vocabulary's size) and buy nothing, as a tree has fewer leaves than entries
        chosen = n_seq_max
        if n_seq_max is None:
            if self.exact:  # a KV stream per sequence: the rows and the kept entries, no branches
                n_seq_max = min(MAX_SEQUENCES, int(max_rows) + int(prefix_cache))
            else:
                n_seq_max = min(MAX_SEQUENCES, int(max_rows) + 1 if self.recurrent else n_batch)
        self.ctx = TreeContext(llm, n_seq_max=int(n_seq_max), n_batch=int(max_rows) * n_batch,
                               rollback=n_batch if self.recurrent else 0, exact=self.exact,
                               sequence_cells=int(llm.n_ctx()) // int(max_rows) if self.exact else None)
        # an architecture whose state llama.cpp cannot roll back (Mamba2, Granite 4, Falcon-H1, Qwen3-Next
        # in 0.3.36): each row verifies its chain in a scratch copy of its sequence (module docstring)
        self.scratch_chains = self.recurrent and self.ctx.rollback < n_batch
        if self.scratch_chains and chosen is None:
            self.ctx.close()
            self.ctx = TreeContext(llm, n_seq_max=min(MAX_SEQUENCES, 2 * int(max_rows) + 1),
                                   n_batch=int(max_rows) * n_batch)
        self.vocab_size = self.ctx.n_vocab
        self.max_positions = self.ctx.n_ctx - 1  # positions 0 .. n_ctx - 1; the last token is never fed
        self.device = torch.device("cpu")
        self.packed_rows = True  # one llama_decode of every row's entries, nothing padded
        # exact mode: a KV stream per row (the prefix cache's entries give theirs back); trees: no limit of their own
        self.row_limit = self.ctx.n_seq_max if self.exact else None
        eos = sorted(self.ctx.eos_ids())
        self.generation_config = SimpleNamespace(eos_token_id=eos or None, pad_token_id=None)
        self.tokenizer = GgufTokenizer(llm)
        # a kept sequence's recurrent state is its last token's: reused whole or not at all
        self.prefix_cache: PrefixCache[int] = PrefixCache(prefix_cache, whole=self.recurrent)
        self._free_all_seqs()
        self._cost_curve = None

    # -- sequences

    def _free_all_seqs(self) -> None:
        kept = set(self.prefix_cache.handles())
        # pop() gives the lowest id
        self._free_seqs = [seq for seq in range(self.ctx.n_seq_max - 1, -1, -1) if seq not in kept]

    def take_seq(self) -> int:
        """A free sequence id (the prefix cache's oldest entry gives its id back when none is)."""
        if not self._free_seqs:
            oldest = self.prefix_cache.pop_oldest()
            if oldest is None:
                more = (f" (exact mode: a KV stream per sequence, max_rows + prefix_cache of them; decode at most "
                        f"that many prompts together, or make the decoder with a larger max_rows)"
                        if self.exact else "")
                raise LlamaDecodeError(f"all {self.ctx.n_seq_max} llama.cpp sequences are in use{more}")
            self.release_seq(oldest)
        return self._free_seqs.pop()

    def release_seq(self, seq: int) -> None:
        self.ctx.seq_remove(seq)
        self._free_seqs.append(seq)
        self._free_seqs.sort(reverse=True)

    def retire_seq(self, seq: int, tokens: list[int], prompt_length: int | None = None) -> None:
        """A finished row's base sequence ``seq``, whose row emitted ``tokens`` (prompt + new; the
        prompt its first ``prompt_length``), into the prefix cache: its cells up to the last token
        fed that the row kept (a stop string may have cut emitted tokens whose cells exist), the rest
        removed; in exact mode up to the last whole prefill chunk of the prompt (module docstring).
        Freed when the cache keeps nothing of it."""
        held = self.ctx.seq_pos_range(seq)[1] + 1
        n = min(len(tokens) - 1, held)
        if self.exact:
            chunk = self.ctx.prefill_chunk
            n = min(n, (len(tokens) if prompt_length is None else int(prompt_length)) // chunk * chunk)
        if self.prefix_cache.max_entries == 0 or n <= 0:
            self.release_seq(seq)
            return
        if n < held:
            if self.recurrent and held - n > self.ctx.rollback:  # its state is past what can be restored
                self.release_seq(seq)
                return
            self.ctx.seq_remove(seq, n, -1)
        for freed in self.prefix_cache.add(seq, np.asarray(tokens[:n], dtype=np.int64)):
            self.release_seq(freed)

    def clear_prefix_cache(self) -> None:
        """Frees every kept sequence (the calibration measures over an otherwise empty cache)."""
        for seq in self.prefix_cache.clear():
            self.release_seq(seq)

    def _decode(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: list, want_logits: np.ndarray,
                invariant: bool = False) -> None:
        """``ctx.decode``; when no KV slot is free, the prefix cache's entries give their cells back,
        oldest first, until the batch fits (LlamaDecodeError when it does not with none left)."""
        while True:
            try:
                self.ctx.decode(tokens, positions, seq_ids, want_logits, invariant=invariant)
                return
            except LlamaDecodeError as error:
                if error.code != 1 or not len(self.prefix_cache):
                    raise
                self.release_seq(self.prefix_cache.pop_oldest())

    # -- the engine's calls

    def new_batch(self) -> LlamaRunningBatch:
        """An empty batch, on a cache that holds the prefix cache's entries only: a decode (one
        ``generate`` call) starts afresh, whatever an earlier one that raised left behind."""
        kept = set(self.prefix_cache.handles())
        for seq in range(self.ctx.n_seq_max):
            if seq not in kept:
                self.ctx.seq_remove(seq)
        self._free_all_seqs()
        return LlamaRunningBatch(self, [], [])

    def fit_tree(self, tree: DraftTree, rows: int) -> DraftTree:
        """This row's share of one decode when ``rows`` rows decode together: at most
        ``n / rows - 1`` nodes (n: the entries one decode takes and gives logits for; and
        ``max_tree``), and no more leaves than its share of the branch sequences (what the rows'
        base sequences leave)."""
        most = min(self.max_tree, min(self.ctx.n_batch, self.ctx.n_outputs) // max(1, rows) - 1)
        if self.chains:  # a chain: the tree's best path
            return keep_nodes(tree, best_path(tree)[:most if self.exact else self.max_tree])
        if len(tree) > most:
            tree = keep_nodes(tree, np.arange(max(0, most)))
        share = (self.ctx.n_seq_max - rows) // max(1, rows)
        return prefix_with_leaves(tree, share) if len(tree) > share else tree

    def prefill_steps(self, group: list, chunk: int | None):
        """Each prompt into a base sequence of its own, one ``llama_decode`` per ``next()``: the
        longest prefix a prefix-cache entry holds copied (``request.stats.cached_prompt_tokens``;
        never the last token, whose logits give the first new token), the rest fed in chunks of
        the Llama's ``n_batch`` (as ``Llama.eval`` feeds it, prefix reuse included). ``chunk``
        (refdec's transformers setting) is not used. Returns the batch and float32 [G, V]; closed
        early, it releases its sequences. A decode stops part-way when every request of the group is
        cancelled (``request.cancel_requested``, llama.cpp's abort callback): PrefillCancelled."""
        ctx = self.ctx
        seqs, last = [], []

        def cancelled() -> bool:
            return all(request.done or getattr(request, "cancel_requested", False) for request in group)

        try:
            for request in group:
                seq = self.take_seq()  # first: it may evict the entry the lookup would find
                seqs.append(seq)
                tokens = request.prompt
                entry, cached = self.prefix_cache.longest(tokens)
                cached = min(cached, len(tokens) - 1)
                if self.recurrent and entry is not None and cached < entry.tokens.shape[0]:
                    cached = 0  # the prompt is the entry itself: its state is past the last prompt token
                if self.exact:  # whole prefill chunks only, as a fresh Llama.eval computes them
                    cached -= cached % ctx.prefill_chunk
                if cached > 0 and self.exact:  # another stream: llama.cpp copies the entry's whole stream
                    ctx.seq_copy(entry.handle, seq)
                    ctx.seq_remove(seq, cached, -1)
                elif cached > 0:
                    ctx.seq_copy(entry.handle, seq, 0, cached)
                request.stats.cached_prompt_tokens = max(0, cached)
                step = ctx.prefill_chunk
                for begin in range(max(0, cached), len(tokens), step):
                    part = tokens[begin: begin + step]
                    want = np.zeros(len(part), dtype=bool)
                    want[-1] = begin + step >= len(tokens)
                    ctx.set_abort(cancelled)
                    try:
                        self._decode(part, np.arange(begin, begin + len(part)), [[seq]] * len(part), want)
                    except LlamaDecodeError as error:
                        if error.code == 2 and cancelled():
                            raise PrefillCancelled(f"every request of the group was cancelled: {error}") from None
                        raise
                    finally:
                        ctx.set_abort(None)
                    if not want[-1]:
                        yield
                last.append(torch.from_numpy(ctx.logits(len(part) - 1).copy()))  # the last chunk's last entry
                if request is not group[-1]:
                    yield
        except BaseException:
            for seq in seqs:
                self.release_seq(seq)
            raise
        return LlamaRunningBatch(self, list(group), seqs), torch.stack(last)

    def verify(self, batch: LlamaRunningBatch, trees: list[DraftTree], roots: np.ndarray, root_pos: np.ndarray,
               rules: list) -> Verified:
        """One ``llama_decode`` of every row's ``[root] + tree`` (module docstring), then each row's
        walk. ``roots`` int64 [B], ``root_pos`` int64 [B]; ``rules[b]`` the row's target rule
        (None: greedy)."""
        if self.exact:
            return self._verify_exact_chains(batch, trees, roots, root_pos, rules)
        if self.recurrent:
            return self._verify_chains(batch, trees, roots, root_pos, rules)
        t0 = time.perf_counter()
        ctx = self.ctx
        tokens, positions, seq_ids, starts = [], [], [], []
        pending, branch_used = [], []
        try:
            for b, tree in enumerate(trees):
                base = batch.base_seqs[b]
                n = len(tree)
                starts.append(len(tokens))
                node_seq = np.full(n, base, dtype=np.int64)
                branch_seqs: list[int] = []
                if n:
                    below, leaves = tree_layout(tree)
                    leaf_seq = {}
                    for leaf in leaves:
                        seq = self.take_seq()
                        branch_used.append(seq)
                        branch_seqs.append(seq)
                        leaf_seq[int(leaf)] = seq
                        ctx.seq_copy(base, seq)
                    node_seqs = [[leaf_seq[leaf] for leaf in below[i]] for i in range(n)]
                    node_seq = np.array([s[0] for s in node_seqs], dtype=np.int64)
                # the root, in the base sequence and every branch, then the nodes
                tokens.append(int(roots[b]))
                positions.append(int(root_pos[b]))
                seq_ids.append([base] + branch_seqs)
                if n:
                    tokens.extend(tree.token_ids.tolist())
                    positions.extend((int(root_pos[b]) + tree.depths).tolist())
                    seq_ids.extend(node_seqs)
                pending.append((node_seq, branch_seqs))
            t1 = time.perf_counter()
            self._decode(np.asarray(tokens, dtype=np.int32), np.asarray(positions, dtype=np.int32), seq_ids,
                         np.ones(len(tokens), dtype=bool))
        except BaseException:
            for seq in branch_used:
                self.release_seq(seq)
            raise
        for seq in branch_used:  # removed from the cache by keep_accepted; free to reuse from here
            self._free_seqs.append(seq)
        self._free_seqs.sort(reverse=True)
        batch.pending = pending
        t2 = time.perf_counter()
        walks, head_rows = [], []
        for b, tree in enumerate(trees):
            walks.append(self._walk(tree, starts[b], rules[b]))
            head_rows.append(1 + len(tree))
        return Verified(walks, head_rows, forward_seconds=t2 - t1, prepare_seconds=t1 - t0)

    def _verify_chains(self, batch: LlamaRunningBatch, trees: list[DraftTree], roots: np.ndarray,
                       root_pos: np.ndarray, rules: list) -> Verified:
        """:meth:`verify` on a model with recurrent layers: each row's ``[root] + chain`` (``fit_tree``
        made every tree a chain) decoded in its base sequence, a decode per row (llama.cpp splits a
        batch of recurrent sequences into equal-length parts), its walk read before the next."""
        forward = 0.0
        walks, head_rows, pending = [], [], []
        for b, tree in enumerate(trees):
            _require_chain(tree, "a model with recurrent layers")
            base = batch.base_seqs[b]
            tokens = np.concatenate([[int(roots[b])], tree.token_ids]).astype(np.int32)
            seq, scratch = base, None
            if self.scratch_chains and len(tree):  # the state cannot be rolled back: run the chain on a copy
                scratch = seq = self.take_seq()
                self.ctx.seq_copy(base, scratch)
            t0 = time.perf_counter()
            self._decode(tokens, int(root_pos[b]) + np.arange(len(tokens), dtype=np.int32), [[seq]] * len(tokens),
                         np.ones(len(tokens), dtype=bool))
            forward += time.perf_counter() - t0
            walks.append(self._walk(tree, 0, rules[b]))
            head_rows.append(len(tokens))
            pending.append((tokens, scratch) if self.scratch_chains else len(tree))
        batch.pending = pending
        return Verified(walks, head_rows, forward_seconds=forward)

    def _verify_exact_chains(self, batch: LlamaRunningBatch, trees: list[DraftTree], roots: np.ndarray,
                             root_pos: np.ndarray, rules: list) -> Verified:
        """:meth:`verify` in exact mode: every row's ``[root] + chain`` (``fit_tree`` made each tree a
        chain) in its base sequence, in one decode with batch-invariant products; the rejected
        tails are cut by ``keep_accepted``. The rows are laid out in the order of their sequence
        ids: llama.cpp splits a batch over several KV streams into micro-batches of streams with
        consecutive, increasing ids (``split_equal``), each a pass over the weights of its own
        (benchmarks/llama_packed.py measures what an out-of-order batch costs)."""
        t0 = time.perf_counter()
        tokens, positions, seq_ids = [], [], []
        starts = [0] * len(trees)
        for b in sorted(range(len(trees)), key=lambda row: batch.base_seqs[row]):
            tree = trees[b]
            _require_chain(tree, "exact mode")
            starts[b] = len(tokens)
            tokens.append(int(roots[b]))
            tokens.extend(tree.token_ids.tolist())
            positions.extend(range(int(root_pos[b]), int(root_pos[b]) + 1 + len(tree)))
            seq_ids.extend([[batch.base_seqs[b]]] * (1 + len(tree)))
        t1 = time.perf_counter()
        self._decode(np.asarray(tokens, dtype=np.int32), np.asarray(positions, dtype=np.int32), seq_ids,
                     np.ones(len(tokens), dtype=bool), invariant=True)
        t2 = time.perf_counter()
        batch.pending = [len(tree) for tree in trees]
        walks = [self._walk(tree, starts[b], rules[b]) for b, tree in enumerate(trees)]
        return Verified(walks, [1 + len(tree) for tree in trees], forward_seconds=t2 - t1, prepare_seconds=t1 - t0)

    def _walk(self, tree: DraftTree, start: int, rule) -> tuple[np.ndarray, int]:
        """The acceptance walk (refdec.engine.accept) over the rows of the last decode from
        ``start`` (row 0 the root)."""
        walk = accept_walk_steps(tree)
        row, depth = next(walk)
        try:
            while True:
                logits = self.ctx.logits(start + row)
                target = int(logits.argmax()) if rule is None else int(rule(torch.from_numpy(logits.copy()), row,
                                                                             depth))
                row, depth = walk.send(target)
        except StopIteration as done:
            return done.value

    def auto_cost_curve(self):
        if self._cost_curve is None:
            self._cost_curve = auto_cost_curve(self)
        return self._cost_curve
