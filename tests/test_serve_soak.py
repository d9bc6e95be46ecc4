"""A bounded soak of ``refdec serve``: requests of every kind in a loop from three concurrent clients
for ``REFDEC_SOAK_SECONDS`` (default 60; the issue's run: 1200), the process's memory sampled
every few seconds, on the tiny GGUF model on llama.cpp with the timed budget on (what a server runs)
and a memory of past outputs per tenant (three ``user`` values) small enough to evict all the time.

What must hold for a server that runs for weeks: nothing grows with the number of requests or
steps. After a warm-up (the first fifth of the run: allocator pools, the learnt cost's buckets,
the interned strings of each kind of request), the resident set and the count of Python objects
stay flat (the last quarter's median is within a bound of the second quarter's), every sequence
and KV cell is free again whenever the server is idle, and every greedy answer equals that
request's first answer; the memory of past outputs never holds more than its budget, after any
request, and keeps drafting while it evicts. ``REFDEC_SOAK_OUT=F.json`` writes the samples (the run reported in
benchmarks/RESULTS.md).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import statistics
import threading
import time

import pytest

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

import refdec  # noqa: E402
from test_serve_app import CONTEXT, MODEL, PROMPTS, SLOTS, LiveServer  # noqa: E402

pytestmark = [pytest.mark.llama, pytest.mark.usefixtures("fresh_refdec_cache")]

SECONDS = float(os.environ.get("REFDEC_SOAK_SECONDS", "60"))
RSS_GROWTH_BOUND = 16 << 20  # bytes, last quarter's median over the second quarter's
OBJECT_GROWTH_BOUND = 2_000  # Python objects, the same medians
MEMORY_BUDGET = 48 << 10  # bytes of past outputs, every tenant together: a few dozen short replies


class WatchedMemory(refdec.OutputMemory):
    """An OutputMemory that records the most it held after any addition (under its own lock, so no
    addition's eviction is missed) and how many additions it saw."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes)
        self.peak_bytes = 0
        self.additions = 0

    def add(self, tokens, tenant=None) -> None:
        super().add(tokens, tenant)
        with self._lock:
            self.peak_bytes = max(self.peak_bytes, self.nbytes)
            self.additions += 1


class MemoryAccepted(logging.Handler):
    """Sums the tokens the memory drafted and the model accepted, from refdec serve's per-request log."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.tokens = 0

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"memory accepted (\d+)", record.getMessage())
        if found:
            self.tokens += int(found.group(1))


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def one_request(client, k: int) -> tuple[str, str | None]:
    """The ``k``-th request of a client's loop, its kind chosen by ``k``: (its key, its greedy text
    or None where the text is not deterministic or not the point)."""
    kind = k % 6
    prompt = PROMPTS[k % len(PROMPTS)]
    messages = [{"role": "user", "content": prompt}]
    user = f"tenant-{k % 3}"  # the memory's tenants (the server has no API key)
    if kind == 0:  # chat, a prediction that is mostly right
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, temperature=0, user=user,
                                               extra_body={"prediction": {"type": "content", "content": prompt * 3}})
        return f"chat-prediction:{prompt}", reply.choices[0].message.content
    if kind == 1:  # completion, streamed, a stop string
        chunks = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stop=["ll", "\n"],
                                           user=user,
                                           stream=True, stream_options={"include_usage": True})
        return f"completion-stream:{prompt}", "".join(c.choices[0].text for c in chunks if c.choices)
    if kind == 2:  # a stream the client closes after a few chunks (its decode stops)
        stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=200, temperature=0,
                                                stream=True)
        for i, _ in enumerate(stream):
            if i == 3:
                break
        stream.close()
        return "closed", None
    if kind == 3:  # sampling with a seed
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, temperature=0.8, top_p=0.9, seed=k,
                                  user=user)
        return "sampled", None
    if kind == 4:  # over the context limit: 400
        try:
            client.completions.create(model=MODEL, prompt=prompt, max_tokens=CONTEXT * 2)
        except openai.BadRequestError:
            return "too-long", None
        raise AssertionError("a request over the context limit was answered")
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=48, temperature=0, user=user)  # plain
    return f"completion:{prompt}", reply.choices[0].text


def test_a_soak_of_mixed_requests_keeps_memory_flat_and_answers_right(tiny_gguf):
    llm = llama_cpp.Llama(str(tiny_gguf), n_ctx=SLOTS * (CONTEXT + 65), n_threads=1, n_batch=64, verbose=False)
    memory = WatchedMemory(MEMORY_BUDGET)
    decoder = refdec.SpeculativeDecoder(llm, memory=memory)  # the timed budget on, as refdec serve runs
    server = LiveServer(decoder)
    backend = decoder.backend
    serve_log = logging.getLogger("refdec.serve")
    memory_accepted = MemoryAccepted()
    serve_log.addHandler(memory_accepted)
    serve_log_level, serve_log_propagate = serve_log.level, serve_log.propagate
    serve_log.setLevel(logging.INFO)
    # not to pytest's log capture, which keeps every record for its report: an hour's soak grew 100 MiB
    serve_log.propagate = False
    first_answers: dict[str, str] = {}
    wrong: list[str] = []
    errors: list[str] = []
    served = [0]
    stop = threading.Event()
    lock = threading.Lock()

    def client_loop(offset: int) -> None:
        client = server.client()
        k = offset
        while not stop.is_set():
            try:
                key, text = one_request(client, k)
            except Exception as error:  # noqa: BLE001 - the assertions below report it
                errors.append(f"request {k}: {error!r}")
                return
            k += 3
            with lock:
                served[0] += 1
                if text is not None and first_answers.setdefault(key, text) != text:
                    wrong.append(f"{key}: {text!r} != {first_answers[key]!r}")

    samples = []
    started = time.monotonic()
    try:
        clients = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(3)]
        for thread in clients:
            thread.start()
        while time.monotonic() - started < SECONDS:
            time.sleep(min(5.0, SECONDS / 40))
            gc.collect()
            samples.append({"t": time.monotonic() - started, "rss": resident_bytes(), "objects": len(gc.get_objects()),
                            "served": served[0], "steps": server.service.steps,
                            "memory_bytes": memory.nbytes, "memory_peak_bytes": memory.peak_bytes,
                            "memory_evicted_outputs": memory.evicted_outputs,
                            "memory_accepted_tokens": memory_accepted.tokens})
        stop.set()
        for thread in clients:
            thread.join(60)
        # a reply (or a cancel) ends the request before the loop's step gives its sequence back: wait
        # until the idle loop holds none but the kept prefixes', as a leak never would
        deadline = time.monotonic() + 30

        def idle() -> bool:
            kept = len(backend.prefix_cache)
            return not server.service.pending and len(backend._free_seqs) == backend.ctx.n_seq_max - kept

        while not idle() and time.monotonic() < deadline:
            time.sleep(0.05)
        idle_free_seqs = len(backend._free_seqs)
        gc.collect()
        samples.append({"t": time.monotonic() - started, "rss": resident_bytes(), "objects": len(gc.get_objects()),
                        "served": served[0], "steps": server.service.steps})
    finally:
        stop.set()
        server.close()
        serve_log.removeHandler(memory_accepted)
        serve_log.setLevel(serve_log_level)
        serve_log.propagate = serve_log_propagate
    if os.environ.get("REFDEC_SOAK_OUT"):
        with open(os.environ["REFDEC_SOAK_OUT"], "w") as out:
            json.dump({"seconds": SECONDS, "samples": samples, "failures": server.service.failures,
                       "cancelled": server.service.cancelled}, out, indent=1)

    assert not errors, errors
    assert not wrong, wrong[:3]
    assert server.service.failures == 0
    assert server.service.cancelled > 0  # the closed streams left early
    assert idle_free_seqs == backend.ctx.n_seq_max - len(backend.prefix_cache)  # only the kept prefixes hold any
    quarter = max(1, len(samples) // 4)
    second, last = samples[quarter:2 * quarter], samples[-quarter:]
    rss_growth = statistics.median(s["rss"] for s in last) - statistics.median(s["rss"] for s in second)
    object_growth = statistics.median(s["objects"] for s in last) - statistics.median(s["objects"] for s in second)
    requests = samples[-1]["served"] - second[0]["served"]
    assert requests > 20, f"the soak served only {requests} requests after its warm-up"
    assert rss_growth < RSS_GROWTH_BOUND, f"resident set grew {rss_growth / 2**20:.1f} MiB over {requests} requests"
    assert object_growth < OBJECT_GROWTH_BOUND, f"{object_growth} more Python objects after {requests} requests"
    assert memory.peak_bytes <= MEMORY_BUDGET, f"the memory held {memory.peak_bytes} bytes over {MEMORY_BUDGET}"
    assert memory.evicted_outputs > 0 and memory.additions > memory.evicted_outputs, repr(memory)
    assert len(memory.tenants()) > 1, memory.tenants()
    assert memory_accepted.tokens > 0  # past replies drafted later ones while the memory evicted
