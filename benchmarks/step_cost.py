"""Proposer step cost against context length during a long run of one token.

A run of > 64 identical tokens (a degenerate loop, a ruler line) makes the
suffix-link chain of the last state long; the step cost (propose + accept) must
stay O(1) amortised, not O(context). Also times AutoBudget.select on a 64-node
tree (the per-step cost of the "auto" policy).

    python -m benchmarks.step_cost
"""

from __future__ import annotations

import time

import numpy as np
import torch

from refdec import DraftTree, Proposer
from refdec.sizing.budget import AutoBudget
from refdec.transformers.calibration import CostCurve


def median_step_us(prompt: np.ndarray, steps: int = 300) -> float:
    proposer = Proposer()
    proposer.start(prompt)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        proposer.propose(32)
        proposer.accept(np.array([7], dtype=np.int32))
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def main() -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    run = np.full(100, 7, dtype=np.int32)
    print("| context tokens | propose(32) + accept(1), median µs |")
    print("|---|---|")
    for n in (2_000, 20_000, 100_000, 200_000):
        prompt = np.concatenate([rng.integers(0, 500, n).astype(np.int32), run])
        print(f"| {n:,} | {median_step_us(prompt):.1f} |")
    budget = AutoBudget(CostCurve([0, 64], [0.1, 1.0]))
    tree = DraftTree(np.arange(64), np.arange(-1, 63), np.linspace(0.9, 0.1, 64).astype(np.float32))
    budget.select(tree)
    t0 = time.perf_counter()
    for _ in range(1000):
        budget.select(tree)
    print(f"\nAutoBudget.select on a 64-node tree: {(time.perf_counter() - t0) / 1000 * 1e6:.1f} µs per call")


if __name__ == "__main__":
    main()
