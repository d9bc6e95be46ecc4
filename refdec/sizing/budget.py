"""Draft-size policy: how many tree nodes to verify at each step.

A policy is a :class:`Budget`, one per request (batch row):

* ``max_nodes``: how many nodes to ask the drafter for each step (0: plain decoding);
* ``select(tree) -> DraftTree``: the prefix of the proposed tree (its nodes come
  best-first, so any prefix is a subtree) to verify when the row is verified alone;
* ``select_batch(budgets, trees)`` (a classmethod): the prefixes of the rows that
  share one batched forward, chosen together;
* ``observe(tree, accepted_nodes)``: after verification, the tree that was verified
  and the indices of its accepted nodes (int64 [k], root-to-leaf);
* ``observe_step(budgets, trees, accepted, step)`` (a classmethod): after each step, the
  budgets of its drafting rows, their verified trees and accepted nodes, and the step's
  measured time (:class:`StepTime`).

``FixedBudget`` serves an integer ``max_draft_tokens``; ``AutoBudget`` is
``"auto"``: it asks for the largest tree, estimates the expected accepted
length of every prefix of it from the calibrated node scores, and verifies the
prefix that maximises tokens per second under the model's measured cost curve
(refdec.transformers.calibration, refdec.llama_cpp.calibration), refit from the steps it times
(refdec.sizing.cost_model.LearntCost), and stops drafting for a request where drafting does not pay
(:class:`PlainGuard`).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from refdec.drafting.tree import MAX_NODES, DraftTree
from refdec.sizing.acceptance import AcceptanceTable
from refdec.sizing.cost_curve import DEFAULT_CPU_CURVE, CostCurve
from refdec.sizing.cost_model import LearntCost
from refdec.tokens import check_int, is_int

__all__ = ["AutoBudget", "Budget", "FixedBudget", "PlainGuard", "StepTime", "batch_prefix_sizes", "make_budget",
           "packed_prefix_sizes", "path_products", "step_scores"]


@dataclass(frozen=True)
class StepTime:
    """One step's measured time, as the engine gives it to the budgets (:meth:`Budget.observe_step`).

    ``rows``: the requests decoding in the step (one forward); ``forward_nodes``: that forward's
    size as the cost curve counts it, ``rows * (1 + longest verified tree) - 1``;
    ``propose_seconds``: drafting and choosing the prefixes, all rows; ``verify_seconds``: laying
    the trees out, the forward and the LM head (refdec.engine.interface.Verified's
    ``prepare_seconds + forward_seconds``; the acceptance walks and bookkeeping not counted)."""

    rows: int
    forward_nodes: int
    propose_seconds: float
    verify_seconds: float


@runtime_checkable
class Budget(Protocol):
    """What the decoding loop asks of a draft-size policy (module docstring)."""

    max_nodes: int

    def select(self, tree: DraftTree) -> DraftTree: ...

    @classmethod
    def select_batch(cls, budgets: Sequence["Budget"], trees: Sequence[DraftTree],
                     packed: bool = False) -> list[DraftTree]: ...

    def observe(self, tree: DraftTree, accepted_nodes: np.ndarray) -> None: ...

    @classmethod
    def observe_step(cls, budgets: Sequence["Budget"], trees: Sequence[DraftTree], accepted: Sequence[np.ndarray],
                     step: StepTime) -> None: ...


class _VerifyAsProposed:
    """Verifies the proposed tree as it is; rows of a batch are independent."""

    def select(self, tree: DraftTree) -> DraftTree:
        return tree

    @classmethod
    def select_batch(cls, budgets: Sequence[Budget], trees: Sequence[DraftTree],
                     packed: bool = False) -> list[DraftTree]:
        return [budget.select(tree) for budget, tree in zip(budgets, trees)]

    @classmethod
    def observe_step(cls, budgets: Sequence[Budget], trees: Sequence[DraftTree], accepted: Sequence[np.ndarray],
                     step: StepTime) -> None:
        pass  # the step's time changes nothing


class FixedBudget(_VerifyAsProposed):
    """Always the same number of nodes (0 = plain decoding)."""

    def __init__(self, max_nodes: int) -> None:
        self.max_nodes = int(max_nodes)

    def observe(self, tree: DraftTree, accepted_nodes: np.ndarray) -> None:
        pass

    def __repr__(self) -> str:
        return f"FixedBudget({self.max_nodes})"


CHOSEN_KEPT = 100_000  # AutoBudget.chosen keeps at least this many of the latest steps, at most twice as many


class PlainGuard:
    """Never slower than plain decoding, per request: drafting stops where it does not pay, and
    probes come back to it.

    Each step of a request reports the tokens it emitted, its measured seconds (proposing,
    preparing, the forward) and what a plain step would have cost (the cost curve's, refit from
    the steps). While drafting, the last ``window`` steps are kept; once there are ``window``, if
    their tokens per second fall below the plain rate (sum tokens / sum seconds < steps / sum
    plain seconds) drafting stops: :attr:`drafting` is False and the request decodes plainly
    (no proposal, no tree). After ``probe_every`` plain steps, ``probe_steps`` steps draft again:
    if they pay, drafting resumes (they start its new window), else the wait doubles, up to
    ``max_probe_every``. The schedule counts steps, not time: the same timings give the same
    choices. Memory: ``window`` triples.
    """

    def __init__(self, *, window: int = 16, probe_every: int = 16, probe_steps: int = 4,
                 max_probe_every: int = 64) -> None:
        self.window = check_int("window", window, 1)
        self.probe_every = check_int("probe_every", probe_every, 1)
        self.probe_steps = check_int("probe_steps", probe_steps, 1)
        self.max_probe_every = check_int("max_probe_every", max_probe_every, self.probe_every)
        self.reset()

    def reset(self) -> None:
        """A new request: drafting, nothing measured."""
        self._steps: deque = deque(maxlen=self.window)  # (tokens, seconds, plain seconds) of drafted steps
        self._sums = [0, 0.0, 0.0]  # their sums
        self.paused = False  # drafting stopped (but for probes)
        self._plain_steps = 0  # plain steps since the pause or the last probe
        self._probe_left = 0  # drafted steps left in the current probe
        self._wait = self.probe_every  # plain steps before the next probe
        self.pauses = 0  # times drafting stopped (diagnostics)

    @property
    def drafting(self) -> bool:
        """Whether this step drafts: not paused, or probing."""
        return not self.paused or self._probe_left > 0

    def pays(self) -> bool:
        """Whether the kept drafted steps decoded at least as fast as plain steps would have."""
        tokens, seconds, plain = self._sums
        return tokens * plain >= len(self._steps) * seconds

    def step(self, tokens: int, seconds: float, plain_seconds: float) -> None:
        """One step of the request: ``tokens`` emitted in ``seconds``, where a plain step would take
        ``plain_seconds`` (a step whose times are not finite and > 0 counts, unmeasured)."""
        if not self.drafting:
            self._plain_steps += 1
            if self._plain_steps >= self._wait:
                self._probe_left = self.probe_steps
            return
        if math.isfinite(seconds) and math.isfinite(plain_seconds) and seconds > 0 and plain_seconds > 0:
            self._keep((int(tokens), float(seconds), float(plain_seconds)))
        if self.paused:
            self._probe_left -= 1
            if self._probe_left == 0:
                if self._steps and self.pays():
                    self.paused, self._wait = False, self.probe_every
                else:
                    self._forget()
                    self._plain_steps, self._wait = 0, min(2 * self._wait, self.max_probe_every)
        elif len(self._steps) == self.window and not self.pays():
            self.paused, self.pauses = True, self.pauses + 1
            self._forget()
            self._plain_steps, self._wait = 0, self.probe_every

    def _keep(self, measured: tuple) -> None:
        """One drafted step's (tokens, seconds, plain seconds), the oldest dropped from a full window."""
        if len(self._steps) == self.window:
            self._sums = [total - old for total, old in zip(self._sums, self._steps[0])]
        self._steps.append(measured)
        self._sums = [total + new for total, new in zip(self._sums, measured)]

    def _forget(self) -> None:
        self._steps.clear()
        self._sums = [0, 0.0, 0.0]

    def __repr__(self) -> str:
        return f"PlainGuard(window={self.window}, paused={self.paused}, pauses={self.pauses})"


class AutoBudget:
    """Hardware-aware draft size: the tree prefix that maximises expected tokens per second.

    Each step the proposer is asked for ``max_nodes`` nodes. Its nodes come in
    best-first order (parents before children), so every prefix of the node list
    is a valid subtree. Node ``i`` is accepted with an estimated probability
    ``p_i`` = ``q_i * p_parent(i)`` (``p`` of the root: 1), where ``q_i`` is the learnt step rate of
    its cell (source, bucket of its :func:`step_scores`, depth bucket; ``acceptance``: a
    :class:`~refdec.sizing.acceptance.AcceptanceTable`, its settings and their defaults documented there):
    of that cell's nodes the walk reached (their parent accepted), the share accepted, starting from
    a prior. Steps are learnt where a chain is short and priced where it is long: one chain
    accepted whole teaches the deep steps. The expected accepted length of the prefix of ``n`` nodes is
    ``E(n) = p_0 + ... + p_{n-1}`` and the verified prefix is

        argmax over n in 0..len(tree) of  (1 + E(n)) / cost(n, E(n))

    ``cost``: a :class:`~refdec.transformers.calibration.CostCurve` (seconds per forward with n
    draft nodes; with a lazy head, the backbone's seconds plus the head's chunks
    for the ``1 + E(n)`` rows the walk is expected to visit). ``n = 0`` (plain decoding) wins whenever no prefix pays for its
    extra cost. While the policy keeps choosing no draft although the proposer had
    one, every ``explore_every``-th such step verifies the top ``explore_nodes``
    nodes anyway, so that too pessimistic cells can recover. A policy whose verified prefixes
    are accepted whole learns nothing of the nodes past them (a deep node whose step scores
    lower than the shallow ones' sits in a cell of its own): every ``explore_every``-th step
    after a prefix was accepted whole verifies twice as many nodes (up to the tree's size).

    ``cost``: the calibrated curve, or a :class:`~refdec.sizing.cost_model.LearntCost` to share (one per
    model and machine: refdec.engine.decoder's). With ``learn`` (the default) the curve is refit
    from the steps the engine times (:meth:`observe_step`; a CostCurve gets a LearntCost of its
    own, which the budget's copies share); ``learn=False`` keeps the curve as given. ``guard``: a
    :class:`PlainGuard` (True: the default one, False or None: none) that stops drafting for this
    request while drafting does not pay; :meth:`new_request` resets it.
    """

    def __init__(self, cost: CostCurve | LearntCost | None = None, *, max_nodes: int = MAX_NODES,
                 acceptance: AcceptanceTable | None = None, explore_every: int = 8, explore_nodes: int = 2,
                 learn: bool = True, guard: PlainGuard | bool | None = True) -> None:
        self._max_nodes = check_int("max_nodes", max_nodes, 1)
        cost = cost if cost is not None else DEFAULT_CPU_CURVE
        if isinstance(cost, LearntCost):
            if not learn:
                raise ValueError("learn=False takes a CostCurve, not a refdec.sizing.cost_model.LearntCost")
            self.learnt = cost
        elif isinstance(cost, CostCurve):
            self.learnt = LearntCost(cost) if learn else None
        else:
            raise ValueError(f"cost must be a refdec.sizing.cost_curve.CostCurve or a refdec.sizing.cost_model.LearntCost, "
                             f"got {type(cost).__name__}")
        self._fixed_cost = cost if self.learnt is None else None
        self._heads = cost if self.learnt is None else self.learnt.prior  # prices the LM head (learnt or not)
        if guard is True:
            guard = PlainGuard()
        if guard is not None and guard is not False and not isinstance(guard, PlainGuard):
            raise ValueError(f"guard must be a refdec.sizing.budget.PlainGuard, a bool or None, got {type(guard).__name__}")
        self.guard = guard or None
        self.explore_every = int(explore_every)
        self.explore_nodes = int(explore_nodes)
        self._table_version = -1
        self._refresh()
        if acceptance is not None and not isinstance(acceptance, AcceptanceTable):
            raise ValueError(f"acceptance must be a refdec.sizing.acceptance.AcceptanceTable, got {type(acceptance).__name__}")
        self.acceptance = acceptance if acceptance is not None else AcceptanceTable()
        self._cells = None  # cells of the last selected tree
        self._parents = None  # and its parents (int32 [n])
        self._skipped = 0
        self._accepted_whole = 0  # verified prefixes accepted whole
        self._grow_next = False  # the next verified prefix is doubled (deep cells explored)
        self.steps = 0
        self.chosen: list[int] = []  # verified nodes per step, the last CHOSEN_KEPT..2*CHOSEN_KEPT (diagnostics)

    @property
    def max_nodes(self) -> int:
        """The nodes to ask the drafter for this step: the largest tree, or 0 while the guard has
        stopped drafting for this request."""
        return self._max_nodes if self.guard is None or self.guard.drafting else 0

    @property
    def cost(self) -> CostCurve:
        """The cost curve the budget prices with now: the refit one, or the fixed one."""
        return self._fixed_cost if self.learnt is None else self.learnt.curve()

    def _refresh(self) -> None:
        """The curve's table up to the largest tree, rebuilt when the refit curve changed."""
        version = 0 if self.learnt is None else self.learnt.version
        if version != self._table_version:
            self._cost = self._table(self._max_nodes)  # float64 [max_nodes + 1]
            self._inv_cost = 1.0 / self._cost
            self._table_version = version

    def _table(self, max_nodes: int) -> np.ndarray:
        """float64 [max_nodes + 1]: the cost curve's table now (:attr:`cost`'s, without building it)."""
        return self._fixed_cost.table(max_nodes) if self.learnt is None else self.learnt.table(max_nodes)

    def new_request(self) -> None:
        """The budget serves a new request: the guard starts over (the learnt acceptance and cost stay)."""
        if self.guard is not None:
            self.guard.reset()

    # ---- policy protocol

    def cells(self, tree: DraftTree) -> np.ndarray:
        """int64 [n]: the calibration cell of each node, keyed by its :func:`step_scores`."""
        return self.acceptance.cells(step_scores(tree), tree.depths, tree.source_ids)

    def expected_accepted(self, tree: DraftTree, cells: np.ndarray | None = None) -> np.ndarray:
        """float64 [n + 1]: E(0) = 0, E(k) = expected accepted nodes of the prefix of k nodes.
        ``cells``: int64 [n], the tree's :meth:`cells` when already computed."""
        out = np.zeros(len(tree) + 1)
        np.cumsum(self.node_probabilities_of(tree, cells), out=out[1:])
        return out

    def node_probabilities_of(self, tree: DraftTree, cells: np.ndarray | None = None) -> np.ndarray:
        """float64 [n]: each node's estimated probability of acceptance, the product of its path's
        step rates (``cells``: int64 [n], the tree's :meth:`cells` when already computed)."""
        return path_products(self.acceptance.rates[self.cells(tree) if cells is None else cells], tree.parents)

    def node_probabilities(self, tree: DraftTree) -> np.ndarray:
        """float64 [n]: each node's estimated probability of acceptance; for the tree
        :meth:`take_prefix` last returned, from the cells it remembered."""
        cells = self._cells if self._cells is not None and len(self._cells) == len(tree) else self.cells(tree)
        return path_products(self.acceptance.rates[cells], tree.parents)

    def best_prefix(self, expected: np.ndarray) -> int:
        """argmax over n of (1 + E(n)) / cost(n, E(n)) for ``expected`` = E(0..N)."""
        n_max = min(len(expected) - 1, self._max_nodes)
        expected = expected[: n_max + 1]
        self._refresh()
        if self._heads.lazy_head:  # the head runs on the visited rows only: its cost follows E(n)
            value = (1.0 + expected) / (self._cost[: n_max + 1] + self._heads.head_seconds(expected))
        else:
            value = (1.0 + expected) * self._inv_cost[: n_max + 1]
        return int(np.argmax(value))

    def select(self, tree: DraftTree) -> DraftTree:
        if len(tree) == 0:
            return self.take_prefix(tree, 0)
        cells = self.cells(tree)
        return self.take_prefix(tree, self.best_prefix(self.expected_accepted(tree, cells)), cells=cells)

    @classmethod
    def select_batch(cls, budgets: Sequence["AutoBudget"], trees: Sequence[DraftTree],
                     packed: bool = False) -> list[DraftTree]:
        """The rows' prefixes chosen together (:func:`batch_prefix_sizes`; ``packed``: the backend
        packs the rows, :func:`packed_prefix_sizes`): one row is :meth:`select`; an empty draft
        is no step of the policy."""
        if len(budgets) == 1:
            return [budgets[0].select(trees[0])]
        cells = [budget.cells(tree) for budget, tree in zip(budgets, trees)]  # once per row and step
        sizes = (packed_prefix_sizes if packed else batch_prefix_sizes)(budgets, trees, cells)
        return [budget.take_prefix(tree, n, cells=row_cells) if len(tree) else tree
                for budget, tree, n, row_cells in zip(budgets, trees, sizes, cells)]

    def take_prefix(self, tree: DraftTree, n: int, cells: np.ndarray | None = None) -> DraftTree:
        """Verifies the first ``n`` nodes of ``tree`` this step (``n`` > len(tree): all of
        them), remembering their cells for :meth:`observe_nodes`. ``n = 0`` with a
        non-empty tree counts as a skipped draft: every ``explore_every``-th one verifies
        the top ``explore_nodes`` nodes instead. ``cells``: int64 [len(tree)], the
        tree's :meth:`cells` when already computed."""
        n = check_int("n", n, 0)  # nodes to verify
        self.steps += 1
        size = len(tree)
        n = min(n, size)
        if n == 0 and size:
            self._skipped += 1
            if self.explore_every and self._skipped % self.explore_every == 0:
                n = min(self.explore_nodes, size)
        elif n and self._grow_next:
            n = min(2 * n, size)
        self._grow_next = False
        if size:
            self.chosen.append(n)
            if len(self.chosen) > 2 * CHOSEN_KEPT:  # a policy may live for weeks (a server's decoder)
                del self.chosen[:-CHOSEN_KEPT]
        if n == 0:
            self._cells = self._parents = None
            return DraftTree.empty() if size else tree
        self._cells = (self.cells(tree) if cells is None else cells)[:n]
        self._parents = tree.parents[:n]
        return tree if n == size else _prefix(tree, n)

    def observe(self, tree: DraftTree, accepted_nodes: np.ndarray) -> None:
        """Counts the verified nodes of ``tree`` (the prefix :meth:`take_prefix` returned) that the
        walk reached (children of the root or of an accepted node) in their cells, the
        ``accepted_nodes`` (int64 [k]) as accepted: each cell learns a step's rate, the chance a
        node is accepted once its parent was."""
        cells, parents = self._cells, self._parents
        if cells is None:
            return
        self._cells = self._parents = None
        on_path = np.zeros(len(cells) + 1, dtype=bool)  # index 0: the root; node i at i + 1
        on_path[0] = True
        on_path[np.asarray(accepted_nodes, dtype=np.int64) + 1] = True
        reached = on_path[parents + 1]
        self.acceptance.observe(cells[reached], cells[accepted_nodes])
        if len(accepted_nodes) == len(cells):
            self._accepted_whole += 1
            self._grow_next = bool(self.explore_every) and self._accepted_whole % self.explore_every == 0

    @classmethod
    def observe_step(cls, budgets: Sequence["AutoBudget"], trees: Sequence[DraftTree], accepted: Sequence[np.ndarray],
                     step: StepTime) -> None:
        """The step's measured time (``trees``: the rows' verified trees, ``accepted``: their
        accepted nodes, int64 [k_b] each): each learnt cost the rows share is fed the forward once,
        its seconds less the LM head as the curve prices it for what each row accepted; then each
        row's guard is told its tokens, the step's seconds and a plain step's (the curve at
        ``step.rows - 1`` nodes and each row's head for none accepted)."""
        seen = set()
        for budget in budgets:
            learnt = budget.learnt
            if learnt is None or id(learnt) in seen:
                continue
            seen.add(id(learnt))
            accepted_counts = np.array([len(a) for a in accepted] + [0] * (step.rows - len(budgets)), np.float64)
            head = float(learnt.prior.head_seconds(accepted_counts).sum())  # rows that do not draft accept none
            # the head as priced may exceed a step's measured time (another machine's curve): keep a floor
            learnt.observe(step.forward_nodes, max(step.verify_seconds - head, 0.05 * step.verify_seconds))
        seconds = step.propose_seconds + step.verify_seconds
        for budget, nodes in zip(budgets, accepted):
            if budget.guard is not None:
                plain = budget._table(step.rows - 1)[step.rows - 1] + step.rows * float(budget._heads.head_seconds(0.0))
                budget.guard.step(1 + len(nodes), seconds, plain)

    def __repr__(self) -> str:
        return (f"AutoBudget(max_nodes={self._max_nodes}, cost={self.cost.relative()}, learnt={self.learnt!r}, "
                f"guard={self.guard!r})")


def _check_rows(budgets: list, trees: list, cells: list | None) -> None:
    """A batch solver's rows: one budget and, when given, one cells array per tree (else ValueError)."""
    if len(budgets) != len(trees):
        raise ValueError(f"budgets and trees differ in length: {len(budgets)} != {len(trees)}")
    if cells is not None and len(cells) != len(trees):
        raise ValueError(f"cells and trees differ in length: {len(cells)} != {len(trees)}")


def batch_prefix_sizes(budgets: list, trees: list[DraftTree], cells: list | None = None) -> list[int]:
    """Batch-aware "auto": how many nodes of each row's tree to verify in one batched forward.

    The rows share the forward, whose query rows are padded to the longest tree, so
    its backbone costs about one forward of ``B * (1 + n)`` rows: ``cost.table`` at
    ``B * (1 + n) - 1`` nodes (extrapolated linearly past the curve), where n is the
    longest verified tree; each row's walk adds its own head chunks (a head GEMM's
    time grows with its rows on a CPU). One n for all rows, each row taking
    ``min(n, len(tree_b))`` nodes (padding is paid for anyway):

        argmax over n of  sum_b (1 + E_b(min(n, len_b))) / (backbone(B (1 + n) - 1) + sum_b head_b)

    ``budgets``: one :class:`AutoBudget` per row (their learnt acceptance; the first
    one's cost curve prices the forward); ``trees``: the rows' full drafts; ``cells``: each
    row's int64 [len(tree)] :meth:`AutoBudget.cells` when already computed (then passed on
    to :meth:`AutoBudget.take_prefix`). With one row this is :meth:`AutoBudget.best_prefix`.
    """
    _check_rows(budgets, trees, cells)
    if not trees:
        return []
    cost = budgets[0].cost
    longest = max(len(t) for t in trees)
    sizes = np.arange(longest + 1)
    # E_b(min(n, len_b)) for n = 0..longest: each row's curve held flat past its own tree
    expected = np.zeros((len(trees), longest + 1))
    for b, (budget, tree) in enumerate(zip(budgets, trees)):
        e = budget.expected_accepted(tree, None if cells is None else cells[b]) if len(tree) else np.zeros(1)
        expected[b] = e[np.minimum(sizes, len(tree))]
    backbone = cost.table(len(trees) * (1 + longest) - 1)[len(trees) * (1 + sizes) - 1]
    head = cost.head_seconds(expected).sum(axis=0)
    value = (1.0 + expected).sum(axis=0) / (backbone + head)
    best = int(np.argmax(value))
    return [min(best, len(t)) for t in trees]


def packed_prefix_sizes(budgets: list, trees: list[DraftTree], cells: list | None = None) -> list[int]:
    """Batch-aware "auto" for a backend that packs the rows of a forward (llama.cpp: one
    ``llama_decode`` of every row's root and nodes, nothing padded): the forward costs about one
    of ``sum_b (1 + n_b)`` entries, so each row takes its own size. The rows' nodes are added one
    at a time, each time the next node (in its row's best-first order) with the highest estimated
    acceptance, and the sizes kept are those of the best

        (B + sum_b E_b(n_b)) / (backbone(sum_b (1 + n_b) - 1) + sum_b head_b)

    along the way. Arguments as :func:`batch_prefix_sizes`."""
    _check_rows(budgets, trees, cells)
    if not trees:
        return []
    cost = budgets[0].cost
    probs = [budget.node_probabilities_of(tree, None if cells is None else cells[b]) if len(tree) else np.zeros(0)
             for b, (budget, tree) in enumerate(zip(budgets, trees))]
    rows = len(trees)
    total = sum(len(p) for p in probs)
    backbone = cost.table(rows + total - 1)
    sizes = [0] * rows
    expected = np.zeros(rows)
    best_sizes, best_value = list(sizes), -1.0
    heap = [(-float(p[0]), b) for b, p in enumerate(probs) if len(p)]
    heapq.heapify(heap)
    added = 0
    while True:
        value = (rows + expected.sum()) / (backbone[rows + added - 1] + float(cost.head_seconds(expected).sum()))
        if value > best_value:
            best_value, best_sizes = value, list(sizes)
        if not heap:
            break
        neg_p, b = heapq.heappop(heap)
        expected[b] -= neg_p
        sizes[b] += 1
        added += 1
        if sizes[b] < len(probs[b]):
            heapq.heappush(heap, (-float(probs[b][sizes[b]]), b))
    return best_sizes


def step_scores(tree: DraftTree) -> np.ndarray:
    """float32 [n]: each node's score for the step from its parent: its score (the proposer's
    estimate of its whole path) over its parent's, its own for a child of the root, in [0, 1]."""
    scores = tree.scores
    parent_scores = np.where(tree.parents >= 0, scores[np.maximum(tree.parents, 0)], np.float32(1.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(parent_scores > 0, scores / parent_scores, np.float32(0.0))
    return np.clip(ratio, 0.0, 1.0).astype(np.float32, copy=False)


def path_products(step_rates: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """float64 [n]: each node's probability of acceptance, the product of the step rates
    (float64 [n]) along its path from the root (``parents``: int32 [n], parents before children)."""
    probs = step_rates.tolist()
    for node_idx, parent in enumerate(parents.tolist()):
        if parent >= 0:
            probs[node_idx] *= probs[parent]
    return np.asarray(probs, dtype=np.float64)


def _prefix(tree: DraftTree, n: int) -> DraftTree:
    """The first ``n`` nodes of a topologically ordered tree (a valid subtree, views of its arrays)."""
    return DraftTree._trusted(tree.token_ids[:n], tree.parents[:n], tree.scores[:n], tree.source_ids[:n],
                              tree.depths[:n], tree.source_names)


def make_budget(max_draft_tokens, cost: CostCurve | None = None) -> Budget:
    """``int >= 0`` → FixedBudget; ``"auto"`` → AutoBudget on ``cost`` (a model's curve:
    refdec.transformers.calibration.auto_cost_curve); a :class:`Budget` as it is."""
    if isinstance(max_draft_tokens, str):
        if max_draft_tokens != "auto":
            raise ValueError(f"max_draft_tokens must be an int >= 0 or 'auto', got {max_draft_tokens!r}")
        return AutoBudget(cost)
    if isinstance(max_draft_tokens, Budget):
        return max_draft_tokens
    if not is_int(max_draft_tokens):
        raise ValueError(f"max_draft_tokens must be an int >= 0, 'auto' or a refdec.sizing.budget.Budget, "
                         f"got {max_draft_tokens!r}")
    if max_draft_tokens < 0:
        raise ValueError(f"max_draft_tokens must be >= 0, got {max_draft_tokens}")
    return FixedBudget(int(max_draft_tokens))
