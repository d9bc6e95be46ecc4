"""Benchmark refdec.drafting.retrieval on ~5,000 real source files (this Python's stdlib, then site-packages;
``data.read_stdlib`` / ``data.read_site_packages``).

Measures: signature throughput, deduplicate time and how much it drops, the index file
with and without the signatures (size, save, load), top_k latency per request, and
candidate quality: how often the source document of a query is in the top-k, and recall of
the true top-k (exact Jaccard against every document, by brute force for a sample).

Tokenizer: a regex splitting words, single punctuation marks and whitespace
runs, mapped to ids in order of first appearance. A BPE tokenizer gives
shorter ids per word but the same kind of n-gram statistics.

    python -m benchmarks.retrieval_bench [--docs 5000] [--max-tokens 4096] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import statistics
import tempfile
import time

import numpy as np

import refdec
from benchmarks import data, report
from refdec.drafting.retrieval import DocumentSignatures, Retriever, deduplicate, shingles

_TOKEN = re.compile(r"\w+|[^\w\s]|\s+")


def load_corpus(num_docs: int, max_tokens: int) -> tuple[list[np.ndarray], list[str]]:
    """The first ``num_docs`` non-empty files of the stdlib (tests included), then of
    site-packages (``data.py``'s reader), as int32 arrays of at most ``max_tokens`` regex
    tokens (ids in order of first appearance); and their names."""
    vocab: dict[str, int] = {}
    docs, names = [], []
    for doc in itertools.chain(data.read_stdlib(tests=True)[0], data.read_site_packages()):
        if len(docs) == num_docs:
            break
        ids = [vocab.setdefault(tok, len(vocab)) for tok in _TOKEN.findall(doc.text)[:max_tokens]]
        if ids:
            docs.append(np.array(ids, dtype=np.int32))
            names.append(doc.name)
    return docs, names


def exact_jaccard(x: np.ndarray, y: np.ndarray) -> float:
    """Jaccard similarity of two shingle sets (sorted unique uint64 arrays, ``shingles``); 0.0 if
    either is empty: the brute-force truth the retriever is scored against."""
    if x.size == 0 or y.size == 0:
        return 0.0
    inter = np.intersect1d(x, y, assume_unique=True).size
    return inter / (x.size + y.size - inter)


def percentiles(samples_s: list[float]) -> str:
    ms = sorted(1e3 * s for s in samples_s)
    p = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]  # noqa: E731
    return f"p50 {p(0.5):.2f} ms  p95 {p(0.95):.2f} ms  max {ms[-1]:.2f} ms"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=5000)
    ap.add_argument("--max-tokens", type=int, default=4096, help="tokens kept per file")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--exact-queries", type=int, default=30, help="queries checked against brute-force top-k")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args(argv)
    out: dict[str, object] = {}

    docs, _names = load_corpus(args.docs, args.max_tokens)
    total = int(sum(d.size for d in docs))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (wall times inflate under load)")
    print(f"corpus: {len(docs)} .py files (stdlib, site-packages), {total:,} tokens (<= {args.max_tokens} per file)")
    out.update(num_docs=len(docs), num_tokens=total)

    t, c = time.perf_counter(), time.process_time()
    sigs = DocumentSignatures.from_documents(docs)
    dt, dc = time.perf_counter() - t, time.process_time() - c
    print(
        f"signatures: {dt:.2f} s wall, {dc:.2f} s cpu ({total / dc / 1e6:.2f} M tokens per cpu-second, "
        f"num_perm={sigs.num_perm}, ngram={sigs.ngram})"
    )
    out["signatures_s"] = dt

    for threshold in (0.9, 0.7):
        t = time.perf_counter()
        kept, dropped = deduplicate(docs, threshold, signatures=sigs)
        dt = time.perf_counter() - t
        print(f"deduplicate(threshold={threshold}) with signatures: {dt:.2f} s, dropped {dropped} of {len(docs)}")
        out[f"dedup_{threshold}_s"], out[f"dedup_{threshold}_dropped"] = dt, int(dropped)
    t = time.perf_counter()
    deduplicate(docs, 0.9)
    dt = time.perf_counter() - t
    print(f"deduplicate(threshold=0.9) from tokens (signatures included): {dt:.2f} s")
    out["dedup_from_tokens_s"] = dt

    with tempfile.TemporaryDirectory() as tmp:
        sizes = {}
        for signed in (False, True):
            index = refdec.CorpusIndex.build(docs, show_progress=False, signatures=signed)
            path = os.path.join(tmp, f"corpus-{signed}.refdec")
            t = time.perf_counter()
            index.save(path)
            t_save = time.perf_counter() - t
            t = time.perf_counter()
            loaded = refdec.CorpusIndex.load(path)
            loaded.signatures
            t_load = time.perf_counter() - t
            sizes[signed] = os.path.getsize(path)
            print(f"index file {'with' if signed else 'without'} signatures: {sizes[signed] / 2**20:.2f} MiB, "
                  f"save {1e3 * t_save:.1f} ms, load {1e3 * t_load:.1f} ms")
            out[f"index_{'signed' if signed else 'plain'}"] = {"bytes": sizes[signed], "save_s": t_save,
                                                               "load_s": t_load}
            del index, loaded

    t = time.perf_counter()
    retriever = Retriever(sigs, docs.__getitem__)
    print(f"Retriever construction: {1e3 * (time.perf_counter() - t):.1f} ms")

    # Queries: a 30-50 % slice of document j (files shorter than 64 tokens skipped), and a
    # 256-token window, closer to a prompt that quotes part of a long file.
    rng = np.random.default_rng(0)
    eligible = [i for i, d in enumerate(docs) if d.size >= 64]
    queries = []
    for qi in range(args.queries):
        j = int(rng.choice(eligible))
        doc = docs[j]
        length = int(round(rng.uniform(0.3, 0.5) * doc.size)) if qi % 2 == 0 else min(256, doc.size)
        start = int(rng.integers(0, doc.size - length + 1))
        queries.append((j, doc[start : start + length], "slice" if qi % 2 == 0 else "window256"))

    for score in ("jaccard", "containment"):
        times, cpu, hits = [], [], {"slice": [0, 0], "window256": [0, 0]}
        for j, q, kind in queries:
            t, c = time.perf_counter(), time.process_time()
            res = retriever.top_k(q, args.k, score=score)
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            hits[kind][0] += j in [d for d, _ in res]
            hits[kind][1] += 1
        hit_txt = ", ".join(f"{kind} {h}/{n}" for kind, (h, n) in hits.items())
        print(f"top_k(k={args.k}, {score}): wall {percentiles(times)}; cpu p50 {1e3 * statistics.median(cpu):.2f} ms; "
              f"source doc in top-k: {hit_txt}")
        out[f"top_k_{score}_ms"] = {
            "p50": 1e3 * statistics.median(times),
            "p95": 1e3 * sorted(times)[int(0.95 * len(times))],
            "cpu_p50": 1e3 * statistics.median(cpu),
        }
        out[f"hits_{score}"] = hits

    # Recall of the true top-k (brute force exact Jaccard over every document).
    doc_shingles = [shingles(d) for d in docs]
    recall, top1, shortfall = [], 0, []  # shortfall: sum of true top-k scores minus sum of returned
    for j, q, _ in queries[: args.exact_queries]:
        qh = shingles(q)
        exact = np.array([exact_jaccard(qh, h) for h in doc_shingles])
        order = np.lexsort((np.arange(exact.size), -exact))
        truth = [int(i) for i in order[: args.k] if exact[i] > 0]
        kth = exact[truth[-1]] if truth else 0.0
        got = retriever.top_k(q, args.k)
        # a returned doc tied with the k-th true score counts as correct
        recall.append(sum(1 for d, s in got if s >= kth - 1e-12) / max(1, len(truth)))
        top1 += int(bool(got) and bool(truth) and got[0][1] >= exact[truth[0]] - 1e-12)
        shortfall.append(float(exact[truth].sum()) - sum(s for _, s in got))
    print(f"vs brute force ({len(recall)} queries): recall of exact top-{args.k} {np.mean(recall):.3f}, "
          f"top-1 correct {top1}/{len(recall)}, "
          f"mean (sum of true top-{args.k} Jaccard - sum returned) {np.mean(shortfall):.4f}")
    out["recall"], out["top1"] = float(np.mean(recall)), top1

    if args.json:
        report.write_result(args.json, out, argv=argv)


if __name__ == "__main__":
    main()
