"""Index memory benchmark: peak RSS while building, RSS after loading and querying.

Corpus: the Python standard library (``data.read_stdlib(tests=True)``) tokenised once with
the Gemma 3 tokenizer (token ids cached under benchmarks/cache/), repeated until ``--tokens`` tokens.
Copy r >= 1 maps every id through its own random permutation of the
vocabulary and shuffles the document order: a plain repeat would cost the
automaton nothing (a generalised suffix automaton adds no state for a
document it already holds), while permuted copies share no n-grams and cost
what the same amount of new text would. The corpus is written to a flat
``.npy`` and memory-mapped by the build process (its pages, 4 bytes/token,
are part of the build's RSS).

Each phase runs in a fresh child process:

* build: ``CorpusIndex.build(..., growable=False)`` then ``save``; peak RSS
  from ``getrusage`` (and a 20 ms psutil sampler for the timeline);
* load: RSS before and right after ``CorpusIndex.load`` (mmap: nothing is
  read yet), after 1,000 queries (match_length + next_tokens + continuation
  of n-grams drawn from the corpus), load time.

    python -m benchmarks.memory_bench                  # 50M tokens
    python -m benchmarks.memory_bench --tokens 5e6     # quick

Prints a summary (and the largest corpus whose build fits in 24 GiB); writes
benchmarks/out/memory_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import data, report, tokens
from benchmarks.paths import REPO_DIR

GIB = 2**30
VOCAB = 262_144

_BUILD_CHILD = r"""
import json, resource, sys, threading, time
import numpy as np, psutil
from refdec import CorpusIndex

flat_path, offsets_path, out_path = sys.argv[1:4]
proc = psutil.Process()
samples = []
stop = threading.Event()
def sample():
    t0 = time.perf_counter()
    while not stop.is_set():
        samples.append((time.perf_counter() - t0, proc.memory_info().rss))
        time.sleep(0.02)
flat = np.load(flat_path, mmap_mode="r")
offsets = np.load(offsets_path)
docs = [flat[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
rss_before = proc.memory_info().rss
sampler = threading.Thread(target=sample, daemon=True); sampler.start()
t0 = time.perf_counter()
index = CorpusIndex.build(docs, show_progress=False, vocab_size=%(vocab)d, growable=False)
build_s = time.perf_counter() - t0
rss_after_build = proc.memory_info().rss
t0 = time.perf_counter()
index.save(out_path)
save_s = time.perf_counter() - t0
stop.set(); sampler.join()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
step = max(1, len(samples) // 60)
print(json.dumps({"rss_before": rss_before, "peak_rss": peak, "rss_after_build": rss_after_build,
                  "build_s": build_s, "save_s": save_s, "num_states": index.num_states,
                  "timeline": [(round(t, 2), r) for t, r in samples[::step]]}))
""" % {"vocab": VOCAB}

_LOAD_CHILD = r"""
import json, sys, time
import numpy as np, psutil
proc = psutil.Process()
from refdec import CorpusIndex
flat_path, index_path, n_queries = sys.argv[1], sys.argv[2], int(sys.argv[3])
def rss_parts():
    # (anonymous, file-backed) resident bytes: mapped index pages are file-backed page cache.
    fields = dict(line.split(":", 1) for line in open("/proc/self/status") if line.startswith("Rss"))
    return tuple(int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssFile"))
flat = np.load(flat_path, mmap_mode="r")
rng = np.random.default_rng(0)
starts = rng.integers(0, len(flat) - 16, size=n_queries)
queries = [np.array(flat[s:s + int(rng.integers(1, 12))], dtype=np.int32) for s in starts]
rss_before = proc.memory_info().rss
t0 = time.perf_counter()
index = CorpusIndex.load(index_path)
load_ms = (time.perf_counter() - t0) * 1e3
rss_after_load = proc.memory_info().rss
t0 = time.perf_counter()
for q in queries:
    index.match_length(q); index.next_tokens(q, 8); index.continuation(q, 32)
query_s = time.perf_counter() - t0
rss_after_queries = proc.memory_info().rss
anon, file_backed = rss_parts()
print(json.dumps({"rss_anon_after_queries": anon, "rss_file_after_queries": file_backed, "rss_before_load": rss_before, "rss_after_load": rss_after_load,
                  "rss_after_queries": rss_after_queries, "load_ms": load_ms,
                  "query_us_mean": query_s / n_queries * 1e6}))
"""


def stdlib_token_arrays() -> list[np.ndarray]:
    documents, _ = data.read_stdlib(tests=True)
    return tokens.token_ids([doc.text for doc in documents], tag="stdlib")


def make_corpus(base: list[np.ndarray], n_tokens: int, directory: Path) -> tuple[Path, Path, int, int]:
    """Writes ``directory/corpus.npy`` (int32) and ``offsets.npy``; returns their paths, tokens, documents."""
    rng = np.random.default_rng(0)
    base = [a for a in base if len(a)]
    base_tokens = sum(len(a) for a in base)
    copies = -(-n_tokens // base_tokens)
    total = copies * base_tokens
    flat = np.lib.format.open_memmap(directory / "corpus.npy", mode="w+", dtype=np.int32, shape=(total,))
    lengths = []
    pos = 0
    for copy in range(copies):
        perm = np.arange(VOCAB, dtype=np.int32) if copy == 0 else rng.permutation(VOCAB).astype(np.int32)
        for doc_idx in rng.permutation(len(base)):
            doc = base[doc_idx]
            flat[pos : pos + len(doc)] = perm[doc]
            pos += len(doc)
            lengths.append(len(doc))
    flat.flush()
    del flat
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    np.save(directory / "offsets.npy", offsets)
    return directory / "corpus.npy", directory / "offsets.npy", total, len(lengths)


def run_child(code: str, *args) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO_DIR), os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"child failed with exit code {out.returncode}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=float, default=50e6, help="corpus size in tokens (default 50M)")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--workdir", default=None, help="where to write the corpus and the index (default: a temp dir)")
    parser.add_argument("--budget-gib", type=float, default=24.0)
    args = parser.parse_args(argv)

    base = stdlib_token_arrays()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        flat_path, offsets_path, n_tokens, n_docs = make_corpus(base, int(args.tokens), tmp)
        print(f"corpus: {n_tokens:,} tokens, {n_docs:,} documents ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
        index_path = tmp / "index.refdec"
        build = run_child(_BUILD_CHILD, flat_path, offsets_path, index_path)
        file_bytes = index_path.stat().st_size
        load = run_child(_LOAD_CHILD, flat_path, index_path, args.queries)

    build_bytes = build["peak_rss"] - build["rss_before"]
    per_token = build_bytes / n_tokens
    # Largest build within the budget: the interpreter's own RSS plus the per-token peak.
    largest = int((args.budget_gib * GIB - build["rss_before"]) / per_token)
    # Format limit: state ids (internal states + one leaf per token) are int32.
    format_limit = int((2**31 - 1) / (build["num_states"] / n_tokens))
    result = {
        "tokens": n_tokens,
        "documents": n_docs,
        "build_s": build["build_s"],
        "save_s": build["save_s"],
        "build_tokens_per_s": n_tokens / build["build_s"],
        "rss_before_build_mb": build["rss_before"] / 2**20,
        "peak_rss_build_mb": build["peak_rss"] / 2**20,
        "peak_build_bytes_per_token": per_token,
        "rss_after_build_mb": build["rss_after_build"] / 2**20,
        "file_bytes": file_bytes,
        "file_bytes_per_token": file_bytes / n_tokens,
        "load_ms": load["load_ms"],
        "rss_before_load_mb": load["rss_before_load"] / 2**20,
        "rss_after_load_mb": load["rss_after_load"] / 2**20,
        "rss_after_queries_mb": load["rss_after_queries"] / 2**20,
        "query_us_mean": load["query_us_mean"],
        "rss_anon_after_queries_mb": load["rss_anon_after_queries"] / 2**20,
        "rss_file_after_queries_mb": load["rss_file_after_queries"] / 2**20,
        "queries": args.queries,
        "largest_corpus_tokens_in_budget": min(largest, format_limit),
        "largest_by_memory": largest,
        "largest_by_format": format_limit,
        "budget_gib": args.budget_gib,
        "timeline_s_rss": build["timeline"],
    }
    path = report.write_result(report.result_path(None, "memory_bench", timestamp=False), result, argv=argv)
    print(f"tokens                     {n_tokens:,} ({n_docs:,} documents)")
    print(f"build                      {build['build_s']:.1f} s ({result['build_tokens_per_s'] / 1e6:.2f} M tokens/s), "
          f"save {build['save_s']:.1f} s")
    print(f"peak RSS during build      {result['peak_rss_build_mb']:.0f} MiB "
          f"({per_token:.1f} bytes/token above the {result['rss_before_build_mb']:.0f} MiB interpreter)")
    print(f"index file                 {file_bytes / 2**20:.0f} MiB ({result['file_bytes_per_token']:.1f} bytes/token)")
    print(f"load                       {load['load_ms']:.2f} ms; RSS {result['rss_before_load_mb']:.0f} -> "
          f"{result['rss_after_load_mb']:.0f} MiB after load -> {result['rss_after_queries_mb']:.0f} MiB after "
          f"{args.queries} queries ({load['query_us_mean']:.0f} us/query; file-backed "
          f"{result['rss_file_after_queries_mb']:.0f} MiB, anonymous {result['rss_anon_after_queries_mb']:.0f} MiB)")
    print(f"largest corpus in {args.budget_gib:g} GiB   {result['largest_corpus_tokens_in_budget'] / 1e6:.0f} M tokens "
          f"(memory: {largest / 1e6:.0f} M, format: {format_limit / 1e6:.0f} M)")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
