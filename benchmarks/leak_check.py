"""Memory over many consecutive ``generate`` calls on ONE SpeculativeDecoder (``e2e.py --long-run``).

A tiny random float64 model (``tiny_model.py``, built as the tests build theirs), short repetitive
prompts, a small corpus index with signatures (so ``retrieve`` runs too, every 4th call),
max_new_tokens 4, draft budgets cycling over "auto", 0, 8, 64. Reports RSS (/proc/self/statm) at
start, after the warm-up calls and at the end, and the Python heap growth (tracemalloc) over the
measured calls when asked.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import tracemalloc

import numpy as np

from benchmarks.tiny_model import VOCAB, repetitive_prompts, tiny_llama

BUDGETS = ("auto", 0, 8, 64)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_setup(seed: int = 0):
    """(decoder, prompts): a tiny Llama, 64 repetitive prompts, an index over 32 documents with signatures."""
    from refdec import CorpusIndex, SpeculativeDecoder

    model = tiny_llama(seed=seed)
    prompts = repetitive_prompts(64, seed=seed)
    rng = np.random.default_rng(seed)
    docs = [rng.integers(3, VOCAB, size=200).astype(np.int32) for _ in range(32)]
    docs += [np.asarray(p * 4, dtype=np.int32) for p in prompts[:8]]
    index = CorpusIndex.build(docs, vocab_size=VOCAB, signatures=True, show_progress=False)
    return SpeculativeDecoder(model, index=index), prompts


def run_calls(decoder, prompts, start: int, count: int) -> int:
    """``count`` generate calls (call i uses prompt i % len, budget i % 4, retrieve on every 4th); new tokens."""
    new = 0
    for i in range(start, start + count):
        out = decoder.generate(prompts[i % len(prompts)], max_new_tokens=4, eos_token_id=[],
                               max_draft_tokens=BUDGETS[i % len(BUDGETS)], retrieve=1 if i % 4 == 1 else 0)
        new += out.stats.new_tokens
    return new


def run(calls: int, warmup: int, heap: bool) -> dict:
    """``warmup`` calls, then ``calls`` more measured in ten steps; ``heap``: trace the Python heap too."""
    rss_start = rss_bytes()
    decoder, prompts = make_setup()
    t0 = time.time()
    run_calls(decoder, prompts, 0, warmup)
    gc.collect()
    rss_warm = rss_bytes()
    if heap:
        tracemalloc.start()
        heap_warm = tracemalloc.get_traced_memory()[0]
    samples = []
    done, step = 0, max(1, calls // 10)
    t1 = time.time()
    while done < calls:
        n = min(step, calls - done)
        run_calls(decoder, prompts, warmup + done, n)
        done += n
        gc.collect()
        samples.append((done, rss_bytes()))
        print(f"{done:>6} calls: RSS {samples[-1][1] / 2**20:.1f} MiB ({time.time() - t1:.0f}s)", file=sys.stderr)
    heap_growth = None
    if heap:
        heap_growth = tracemalloc.get_traced_memory()[0] - heap_warm
        tracemalloc.stop()
    rss_end = rss_bytes()
    return {
        "calls": calls, "warmup": warmup,
        "rss_start_mib": rss_start / 2**20, "rss_after_warmup_mib": rss_warm / 2**20, "rss_end_mib": rss_end / 2**20,
        "rss_growth_after_warmup_mib": (rss_end - rss_warm) / 2**20,
        "tracemalloc_heap_growth_kib": None if heap_growth is None else heap_growth / 1024,
        "seconds": time.time() - t0, "samples": [(c, r / 2**20) for c, r in samples],
    }
