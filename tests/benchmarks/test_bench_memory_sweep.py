"""benchmarks.memory_sweep: the per-request record's ratios and the tables, on synthetic decodes
(no model)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from benchmarks import memory_sweep


class FakeDecoder:
    """``generate`` that returns fixed tokens and stats, its clock moved by ``seconds`` per call."""

    def __init__(self, tokens: list[int], passes: int, prefill: float, memory: int, clock: list[float],
                 seconds: float) -> None:
        self.tokens, self.passes, self.prefill, self.memory = tokens, passes, prefill, memory
        self.clock, self.seconds = clock, seconds

    def generate(self, ids, **_):
        self.clock[0] += self.seconds
        stats = SimpleNamespace(new_tokens=len(self.tokens), forward_passes=self.passes,
                                prefill_seconds=self.prefill, accepted_by_source={"memory": self.memory})
        return SimpleNamespace(sequences=torch.tensor([ids[0] + self.tokens]), stats=stats)


def test_a_record_gives_the_end_to_end_and_the_after_prefill_speed_up(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(memory_sweep.time, "perf_counter", lambda: clock[0])
    decoders = {"off": FakeDecoder([5] * 100, 50, prefill=4.0, memory=0, clock=clock, seconds=12.0),
                "on": FakeDecoder([5] * 100, 10, prefill=4.0, memory=60, clock=clock, seconds=8.0)}
    record = memory_sweep.decode_both(decoders, [1, 2, 3], 100)
    assert record["speedup"] == 12.0 / 8.0  # same tokens: the time ratio
    assert record["decode_speedup"] == (12.0 - 4.0) / (8.0 - 4.0)  # the prefill taken off both
    assert record["identical"] and record["on"]["memory_accepted"] == 60
    record.update(prediction=False, turn=1)
    table = memory_sweep.markdown([record])
    assert "| file in the prompt only | 1 | 100 | 50 / 10 | 60 | 1.50x, 1.50x, 1.50x | 2.00x | 1/1 |" in table
    assert "| write_file call (the new file) | 1 | 100 | 50 / 10 | 60 | 1.50x, 1.50x, 1.50x | 2.00x | 1/1 |" in \
        memory_sweep.agent_markdown([record])
