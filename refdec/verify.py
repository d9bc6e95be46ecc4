"""Acceptance walk over a verified draft tree.

Given the target token at every tree row (row 0 = root, row ``1 + node_idx`` =
draft node ``node_idx``; the target at a row is the token the target model
emits *after* that row), start at the root and descend while some child of the
current row proposes exactly the current row's target. The accepted path is the
sequence of nodes descended into; the bonus token is the target at the last
row reached. Greedy and position-keyed sampling share this walk: only the way
targets are chosen differs (see refdec.sampling).
"""

from __future__ import annotations

import numpy as np

from refdec.tree import DraftTree


def accept_walk(tree: DraftTree, targets: np.ndarray) -> tuple[np.ndarray, int]:
    """Return ``(accepted_nodes, bonus_token)``.

    ``targets``: int64 array of shape (1 + n,), per row as in the module docstring.
    ``accepted_nodes``: int64 array (k,) of node indices along the accepted path,
    root-to-leaf (empty when nothing was accepted).
    """
    n = len(tree)
    if n == 0:
        return np.zeros(0, dtype=np.int64), int(targets[0])
    parent_rows = tree.parents.astype(np.int64) + 1
    # a node is "correct" iff it proposes its parent row's target
    correct = tree.token_ids.astype(np.int64) == targets[parent_rows]
    accepted = []
    row = 0
    candidates = np.flatnonzero(correct)
    while candidates.size:
        kids = candidates[parent_rows[candidates] == row]
        if kids.size == 0:
            break
        node = int(kids[0])  # siblings carry distinct tokens in a trie; take the first otherwise
        accepted.append(node)
        row = node + 1
        candidates = candidates[candidates > node]  # descendants come later in topological order
    return np.asarray(accepted, dtype=np.int64), int(targets[row])


def accept_walk_lazy(tree: DraftTree, target_of_row) -> tuple[np.ndarray, int]:
    """The same walk, asking ``target_of_row(row, depth) -> int`` only for the rows on the path.

    Used for sampling, where a target costs a pass over the vocabulary: a step that
    accepts ``k`` nodes computes ``k + 1`` targets, whatever the tree size.
    """
    parent_rows = tree.parents.astype(np.int64) + 1
    token_ids = tree.token_ids
    accepted = []
    row = 0
    while True:
        target = int(target_of_row(row, len(accepted)))
        kids = np.flatnonzero(parent_rows == row)
        match = kids[token_ids[kids] == target]
        if match.size == 0:
            return np.asarray(accepted, dtype=np.int64), target
        node = int(match[0])
        accepted.append(node)
        row = node + 1


# Model types whose causal-LM head is exactly ``lm_head(last_hidden_state)`` (then Gemma's optional
# final logit soft-capping): the verifier may compute those logits itself.
_PLAIN_HEAD_MODEL_TYPES = frozenset({"gemma", "gemma2", "gemma3_text", "llama", "mistral", "qwen2", "qwen3", "gpt2"})


class PlainHead:
    """The LM head of a plain-head model: ``logits = softcap(W @ h.T).T``.

    ``weight``: float [V, D] (the output embedding); ``softcap``: Gemma's final logit
    soft-capping or None. Computed as ``W @ h.T`` rather than ``F.linear(h, W)``: with
    a small number of rows and a large vocabulary, CPU GEMM kernels pack the whole
    weight for ``h @ W.T`` (Gemma 3 270M, 262k x 640 fp32, one thread: 2 rows 171 ms vs
    56 ms). A single row goes to a memory-bound GEMV that is slower than four rows
    (2 threads: 1 row 41 ms, 4 rows 16 ms), so ``logits`` never feeds fewer than
    ``min_rows`` rows: it pads with copies of the first row.
    """

    def __init__(self, weight, softcap, min_rows: int = 4) -> None:
        self.weight = weight
        self.softcap = softcap
        self.min_rows = int(min_rows)

    def logits(self, hidden):
        """float [r, V] for ``hidden`` float [r, D] (r >= 1)."""
        import torch

        rows = hidden.shape[0]
        if rows < self.min_rows:
            hidden = torch.cat([hidden, hidden[:1].expand(self.min_rows - rows, -1)], dim=0)
        logits = torch.mm(self.weight, hidden.to(self.weight.dtype).T).T  # h.T: a transposed view
        if rows < self.min_rows:
            logits = logits[:rows]
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def split_forward_fn(model):
    """``(backbone_forward, head)`` for models with a plain linear LM head, or None.

    ``backbone_forward(cache, **inputs) -> hidden`` (float [T, D], one sequence) runs the
    model without its head; ``head`` is a :class:`PlainHead`. Splitting the two lets the
    verifier compute logits only for the tree rows its acceptance walk visits
    (:class:`LazyRowLogits`): on a CPU the head is most of a forward.
    """
    import inspect

    import torch

    config = model.config
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    if getattr(config, "model_type", None) not in _PLAIN_HEAD_MODEL_TYPES:
        return None
    backbone = getattr(model, getattr(model, "base_model_prefix", ""), None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if backbone is None or not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return None
    if type(head) is not torch.nn.Linear or head._forward_hooks or head._forward_pre_hooks:
        return None  # a subclass or a hooked head
    params = inspect.signature(backbone.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"

    def backbone_forward(cache, **inputs):
        inputs[cache_kw] = cache
        return backbone(use_cache=True, **inputs).last_hidden_state[0]  # [T, D]

    return backbone_forward, PlainHead(head.weight, getattr(config, "final_logit_softcapping", None))


def tree_forward_fn(model):
    """A verification forward computing every row's logits with :class:`PlainHead`, or None.

    Returns ``forward(cache, **inputs) -> logits`` (float [T, V], one sequence). The
    logits are the model's up to float rounding.
    """
    split = split_forward_fn(model)
    if split is None:
        return None
    backbone_forward, head = split

    def forward(cache, **inputs):
        return head.logits(backbone_forward(cache, **inputs))

    return forward


def first_child_rows(tree: DraftTree) -> np.ndarray:
    """int64 [1 + n]: the row of each row's first (best) child, -1 for leaves.

    Row 0 is the root, row ``1 + node_idx`` node ``node_idx``; nodes come best-first, so
    a row's first child is its most probable one."""
    n = len(tree)
    out = np.full(n + 1, -1, dtype=np.int64)
    if n:
        parent_rows = tree.parents.astype(np.int64) + 1
        child_rows = np.arange(1, n + 1, dtype=np.int64)
        out[parent_rows[::-1]] = child_rows[::-1]  # the last write per parent is its lowest-index child
    return out


class LazyRowLogits:
    """Logits of a verified tree's rows, computed only when the acceptance walk asks.

    The backbone has produced ``hidden`` (float [1 + n, D]) for every row; the head
    (the expensive part on a CPU: Gemma 3 270M's 262k-token head costs ~4 ms a row on 2
    threads) runs ``chunk`` rows at a time: the asked-for row, then its best-child chain
    (the path the walk most likely takes next), then the next rows in best-first order
    to fill the chunk. A step that accepts ``k`` nodes computes about ``k + 1`` rows
    instead of ``1 + n``, whatever the tree size.

    ``row_logits(row)``: float [V]; ``argmax(row)``: int, the greedy target.
    ``rows_computed``: how many rows the head ran on (diagnostics).
    """

    def __init__(self, tree: DraftTree, hidden, head: PlainHead, chunk: int = 4) -> None:
        self.hidden = hidden
        self.head = head
        self.chunk = max(1, int(chunk))
        self.n_rows = len(tree) + 1
        self._first_child = first_child_rows(tree)
        self._logits: dict[int, object] = {}
        self._argmax: dict[int, int] = {}
        self.rows_computed = 0
        self.seconds = 0.0  # time spent in the head (perf_counter)

    def _chunk_rows(self, row: int) -> list[int]:
        rows = [row]
        nxt = int(self._first_child[row])
        while nxt >= 0 and len(rows) < self.chunk and nxt not in self._argmax:
            rows.append(nxt)
            nxt = int(self._first_child[nxt])
        fill = row + 1
        while len(rows) < self.chunk and fill < self.n_rows:
            if fill not in self._argmax and fill not in rows:
                rows.append(fill)
            fill += 1
        return rows

    def _compute(self, row: int) -> None:
        import time

        import torch

        t0 = time.perf_counter()
        rows = self._chunk_rows(row)
        logits = self.head.logits(self.hidden[torch.tensor(rows, dtype=torch.long, device=self.hidden.device)])
        best = logits.argmax(dim=-1).tolist()  # the one host sync of this chunk
        for i, r in enumerate(rows):
            self._logits[r] = logits[i]
            self._argmax[r] = int(best[i])
        self.rows_computed += len(rows)
        self.seconds += time.perf_counter() - t0

    def argmax(self, row: int) -> int:
        if row not in self._argmax:
            self._compute(row)
        return self._argmax[row]

    def row_logits(self, row: int):
        if row not in self._logits:
            self._compute(row)
        return self._logits[row]
