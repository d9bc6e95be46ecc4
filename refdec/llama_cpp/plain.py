"""llama.cpp's own plain greedy decoding (``Llama.generate`` at temperature 0), the baseline a
llama.cpp user has: refdec's ``--compare`` and the benchmarks time it, and the tests compare
refdec's tokens with it."""

from __future__ import annotations

import time

__all__ = ["plain_greedy"]


def plain_greedy(llm, prompt_ids: list[int], max_new_tokens: int, eos: set[int] | None = None,
                 stop=None) -> tuple[list[int], float]:
    """``(new token ids, seconds)`` of greedy decoding with ``llm.generate`` (its own sampler at
    temperature 0, one token per ``llama_decode``) from a fresh state: at most ``max_new_tokens``,
    up to and including an ``eos`` id; ``stop(new_ids) -> bool`` ends it early (stop strings)."""
    eos = set(eos or ())
    out: list[int] = []
    llm.reset()
    t0 = time.perf_counter()
    if max_new_tokens > 0:
        for token in llm.generate(list(prompt_ids), temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                  reset=True):
            out.append(int(token))
            if len(out) >= max_new_tokens or int(token) in eos or (stop is not None and stop(out)):
                break
    return out, time.perf_counter() - t0
