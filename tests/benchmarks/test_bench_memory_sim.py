"""benchmarks.memory_sim: the agent stream's requests and the stream replay with a memory, on
synthetic cases (no data, no model)."""

from __future__ import annotations

import json

import numpy as np

from benchmarks import memory_sim, workloads


def test_the_agent_stream_asks_three_calls_per_task_each_prompt_holding_the_calls_before():
    rows = [{"path": "a.py", "message": "Fix it\n\nbody", "before": "x = 1\n", "after": "x = 2\n"}]
    (task, read), (seen, write), (last, done) = memory_sim.agent_requests(rows)
    assert json.loads(read) == {"tool": "read_file", "path": "a.py"}
    assert json.loads(write) == {"tool": "write_file", "path": "a.py", "content": "x = 2\n"}
    assert json.loads(done) == {"tool": "done", "summary": "Fix it"}
    assert seen.startswith(task + read) and "x = 1\n" in seen and last.startswith(seen + write)


def stream(n_requests: int, seed: int = 0) -> list:
    """Requests whose outputs repeat a shared 60-token block between unrelated prompts' tokens."""
    rng = np.random.default_rng(seed)
    block = rng.integers(1000, 2000, 60).astype(np.int32)
    cases = []
    for _ in range(n_requests):
        prompt = rng.integers(0, 1000, 30).astype(np.int32)
        fresh = rng.integers(2000, 3000, 20).astype(np.int32)
        cases.append(workloads.Case(prompt=prompt, output=np.concatenate([fresh, block])))
    return cases


def test_the_memory_drafts_an_output_seen_only_in_earlier_requests():
    cases = stream(5)
    off = memory_sim.replay_stream("refdec", cases, budget=16)
    on = memory_sim.replay_stream("refdec+memory", cases, budget=16)
    assert off["accepted_by_source"].get("memory", 0) == 0
    assert on["accepted_by_source"]["memory"] >= 4 * 50  # the block, in every request after the first
    assert on["tokens_per_step_after_first"] > 2 * off["tokens_per_step_after_first"]
    assert on["per_request_tokens_per_step"][0] == off["per_request_tokens_per_step"][0]  # nothing to remember yet


def test_a_bounded_memory_keeps_within_its_bytes_and_counts_what_it_kept():
    cases = stream(12, seed=1)
    full = memory_sim.replay_stream("refdec+memory", cases, budget=16)
    bounded = memory_sim.replay_stream("refdec+memory", cases, budget=16, memory_bytes=full["memory_bytes"] // 3)
    assert bounded["memory_bytes"] <= full["memory_bytes"] // 3
    assert 0 < bounded["memory_outputs_kept"] < full["memory_outputs_kept"] == len(cases)
