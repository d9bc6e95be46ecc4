"""Corpus index benchmark over the Python standard library (Gemma 3 tokenizer).

Measures, on the stdlib's *.py files (``data.read_stdlib(tests=True)``: test suites included,
site-packages excluded; ~2% of the files, chosen by a hash of their path, are held out as prompts):

* build throughput in tokens/s (automaton build + freeze, tokenisation excluded;
  the token ids are cached under benchmarks/cache/);
* file size in bytes/token;
* load time (ms): CorpusIndex.load in a fresh process (mmap) and in-process
  after dropping every reference, plus the first query after the load;
* per-step latency (p50/p99, µs) of ``Proposer.propose(budget)`` +
  ``Proposer.accept([next token])`` while replaying held-out files token by
  token after ``Proposer.start(prompt)``; also how many tokens each tree would
  have let the verifier accept (the longest tree path equal to the real text).

If ArcticInference (``arctic_inference.suffix_decoding``) or REST's
DraftRetriever (``draftretriever``) is importable, it is measured on the same
tokens (a common prefix of the corpus, ``--baseline-tokens``) and the same
replay in the same run, and the ratios are printed.

    python -m benchmarks.index_bench            # full stdlib
    python -m benchmarks.index_bench --quick    # 200 files, for a smoke test

Prints a markdown table; writes benchmarks/out/index_bench.json.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import data, report, simulate, tokens
from benchmarks.paths import BENCH_DIR, REPO_DIR
from benchmarks.report import markdown_table, percentile_us

TARGETS = {"build_tokens_per_s": 2e6, "bytes_per_token": 32.0, "load_ms": 10.0, "step_p50_us": 20.0}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def accepted_length(tree, truth: np.ndarray) -> int:
    """Tokens a verifier would accept: the longest root-to-node path equal to ``truth``'s prefix
    (``truth``: int32 array of shape (m,)); the simulator's accounting."""
    return simulate.accepted_length(tree, truth[:len(tree)].tolist(), 0)  # no path is longer than the tree


def replay_prompts(held_out: list[np.ndarray], prompt_len: int, steps: int):
    """(prompt, continuation) pairs from held-out files, until ``steps`` continuation tokens."""
    pairs, total = [], 0
    for doc in sorted(held_out, key=len, reverse=True):
        if len(doc) < 16:
            continue
        cut = min(prompt_len, len(doc) // 2)
        rest = doc[cut : cut + (steps - total)]
        pairs.append((doc[:cut], rest))
        total += len(rest)
        if total >= steps:
            break
    return pairs


# ---------------------------------------------------------------------------
# refdec


def bench_refdec_build(arrays: list[np.ndarray], vocab_size: int) -> dict:
    from refdec import CorpusIndex

    num_tokens = int(sum(len(a) for a in arrays))
    gc.collect()
    c0 = time.process_time()
    t0 = time.perf_counter()
    index = CorpusIndex.build(arrays, show_progress=False, vocab_size=vocab_size)
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    index.num_states  # build() froze the index already (the freeze is in build_s); this reads the frozen image
    t_freeze = time.perf_counter() - t0
    cpu = time.process_time() - c0
    return {
        "build_cpu_s": cpu,
        # CPU time is the fairer measure on a shared machine (wall time counts other jobs' slices).
        "build_tokens_per_cpu_s": num_tokens / cpu,
        "index": index,
        "tokens": num_tokens,
        "documents": len(arrays),
        "build_s": t_build,
        "freeze_s": t_freeze,
        "build_tokens_per_s": num_tokens / (t_build + t_freeze),
        "peak_rss_mb_after_build": peak_rss_mb(),
    }


_LOAD_SCRIPT = """
import sys, time
from refdec import CorpusIndex
path = sys.argv[1]
t0 = time.perf_counter(); index = CorpusIndex.load(path); t1 = time.perf_counter()
index.match_length([1, 2, 3]); t2 = time.perf_counter()
print((t1 - t0) * 1e3, (t2 - t1) * 1e3)
"""


def bench_refdec_load(path: str, repeats: int) -> dict:
    from refdec import CorpusIndex

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO_DIR), os.environ.get("PYTHONPATH")) if p))
    fresh, first_query = [], []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", _LOAD_SCRIPT, path], capture_output=True, text=True, env=env,
                             check=True)
        load_ms, query_ms = map(float, out.stdout.split())
        fresh.append(load_ms)
        first_query.append(query_ms)
    in_process = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        index = CorpusIndex.load(path)
        in_process.append((time.perf_counter() - t0) * 1e3)
        del index
    return {
        "load_ms_fresh_process_median": float(np.median(fresh)),
        "load_ms_fresh_process_all": fresh,
        "first_query_ms_median": float(np.median(first_query)),
        "load_ms_in_process_median": float(np.median(in_process)),
    }


def bench_refdec_steps(index, pairs, budget: int, max_depth: int) -> dict:
    from refdec import Proposer

    proposer = Proposer(index=index, max_depth=max_depth)
    step_s, start_s, accepted, nodes = [], [], [], []
    for prompt, rest in pairs:
        t0 = time.perf_counter()
        proposer.start(prompt)
        start_s.append(time.perf_counter() - t0)
        for pos in range(len(rest)):
            t0 = time.perf_counter()
            tree = proposer.propose(budget)
            proposer.accept(rest[pos : pos + 1])
            step_s.append(time.perf_counter() - t0)
            accepted.append(accepted_length(tree, rest[pos:]))
            nodes.append(len(tree))
    return {
        "steps": len(step_s),
        "step_p50_us": percentile_us(step_s, 50),
        "step_p99_us": percentile_us(step_s, 99),
        "step_mean_us": float(np.mean(step_s) * 1e6),
        "start_p50_us": percentile_us(start_s, 50),
        "mean_tree_nodes": float(np.mean(nodes)),
        "mean_accepted_if_verified": float(np.mean(accepted)),
    }


# ---------------------------------------------------------------------------
# ArcticInference SuffixDecoding (optional baseline)


def arctic_available() -> str | None:
    try:
        from arctic_inference.suffix_decoding import _C  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
        return f"{type(exc).__name__}: {exc}"
    return None


def bench_arctic(arrays: list[np.ndarray], pairs, budget: int, max_depth: int) -> dict:
    from arctic_inference.suffix_decoding._C import SuffixTree

    from refdec import DraftTree

    num_tokens = int(sum(len(a) for a in arrays))
    gc.collect()
    rss_before = peak_rss_mb()
    c0 = time.process_time()
    t0 = time.perf_counter()
    tree = SuffixTree(max_depth)
    for seq_id, arr in enumerate(arrays):
        tree.extend_ndarray(seq_id, np.ascontiguousarray(arr, dtype=np.int32))
    t_build = time.perf_counter() - t0
    build_cpu = time.process_time() - c0
    memory = tree.estimate_memory() if hasattr(tree, "estimate_memory") else None

    # Per step as SuffixDecodingCache.speculate does it: a local tree over the
    # request (prompt + accepted tokens) and the global tree; keep the better draft.
    step_s, accepted, nodes = [], [], []
    args = (budget, 1.0, 0.0, 0.1, True)  # max_spec_tokens, factor, offset, min_token_prob, tree spec
    for prompt, rest in pairs:
        local = SuffixTree(max_depth)
        local.extend_ndarray(0, np.ascontiguousarray(prompt, dtype=np.int32))
        context = list(map(int, prompt))
        for pos in range(len(rest)):
            t0 = time.perf_counter()
            ctx = np.asarray(context[-max_depth:], dtype=np.int32)
            d1 = local.speculate_ndarray(ctx, *args)
            d2 = tree.speculate_ndarray(ctx, *args)
            draft = d1 if d1.score >= d2.score else d2
            token = int(rest[pos])
            local.extend(0, [token])
            context.append(token)
            step_s.append(time.perf_counter() - t0)
            dt = DraftTree(np.asarray(draft.token_ids, dtype=np.int32), np.asarray(draft.parents, dtype=np.int32),
                           np.asarray(draft.probs, dtype=np.float32)) if len(draft.token_ids) else DraftTree.empty()
            accepted.append(accepted_length(dt, rest[pos:]))
            nodes.append(len(dt))
    return {
        "tokens": num_tokens,
        "build_s": t_build,
        "build_tokens_per_s": num_tokens / t_build,
        "build_tokens_per_cpu_s": num_tokens / build_cpu,
        "estimate_memory_bytes": memory,
        "bytes_per_token_in_memory": (memory / num_tokens) if memory else None,
        "peak_rss_growth_mb": peak_rss_mb() - rss_before,
        "steps": len(step_s),
        "step_p50_us": percentile_us(step_s, 50),
        "step_p99_us": percentile_us(step_s, 99),
        "mean_tree_nodes": float(np.mean(nodes)),
        "mean_accepted_if_verified": float(np.mean(accepted)),
    }


# ---------------------------------------------------------------------------
# REST's DraftRetriever (optional baseline): a suffix array over the datastore only


def bench_draftretriever(arrays: list[np.ndarray], pairs, budget: int, vocab_size: int, workdir: str) -> dict:
    import draftretriever

    num_tokens = int(sum(len(a) for a in arrays))
    path = os.path.join(workdir, "datastore.idx")
    c0 = time.process_time()
    t0 = time.perf_counter()
    writer = draftretriever.Writer(path, vocab_size)
    for arr in arrays:
        writer.add_entry(arr.tolist())
    writer.finalize()
    t_build = time.perf_counter() - t0
    build_cpu = time.process_time() - c0
    file_bytes = os.path.getsize(path)
    t0 = time.perf_counter()
    reader = draftretriever.Reader(path)
    load_ms = (time.perf_counter() - t0) * 1e3

    # REST drafts from the datastore alone (no live context); as in REST, search
    # the context tail (it tries suffixes of up to `long` tokens, longest first).
    step_s, accepted, nodes = [], [], []
    for prompt, rest in pairs:
        context = list(map(int, prompt))
        for pos in range(len(rest)):
            t0 = time.perf_counter()
            paths, _mask, tree_indices, _positions, _retrieve = reader.search(context[-64:], choices=budget)
            context.append(int(rest[pos]))
            step_s.append(time.perf_counter() - t0)
            truth = rest[pos:]
            best = 0
            for path in paths:
                k = 0
                while k < len(path) and k < len(truth) and path[k] == truth[k]:
                    k += 1
                best = max(best, k)
            accepted.append(best)
            nodes.append(max(len(tree_indices) - 1, 0))
    return {
        "tokens": num_tokens,
        "build_s": t_build,
        "build_tokens_per_s": num_tokens / t_build,
        "build_tokens_per_cpu_s": num_tokens / build_cpu,
        "file_bytes": file_bytes,
        "bytes_per_token": file_bytes / num_tokens,
        "load_ms_in_process": load_ms,
        "steps": len(step_s),
        "step_p50_us": percentile_us(step_s, 50),
        "step_p99_us": percentile_us(step_s, 99),
        "mean_tree_nodes": float(np.mean(nodes)),
        "mean_accepted_if_verified": float(np.mean(accepted)),
    }


# ---------------------------------------------------------------------------


def _build_rows(same: dict, peer: dict) -> list[list[str]]:
    """Build-throughput rows of a peer table: refdec on the same tokens vs the peer."""
    return [
        ["build tokens/s (wall)", f"{same['build_tokens_per_s'] / 1e6:.2f} M",
         f"{peer['build_tokens_per_s'] / 1e6:.3f} M",
         f"{same['build_tokens_per_s'] / peer['build_tokens_per_s']:.1f}×"],
        ["build tokens/CPU-s", f"{same['build_tokens_per_cpu_s'] / 1e6:.2f} M",
         f"{peer['build_tokens_per_cpu_s'] / 1e6:.3f} M",
         f"{same['build_tokens_per_cpu_s'] / peer['build_tokens_per_cpu_s']:.1f}×"],
    ]


def _replay_rows(same: dict, peer: dict) -> list[list[str]]:
    """Replay rows of a peer table: step latency, tree size, tokens a verifier would accept."""
    return [
        ["step p50 (µs)", f"{same['step_p50_us']:.1f}", f"{peer['step_p50_us']:.1f}",
         f"{peer['step_p50_us'] / same['step_p50_us']:.1f}× faster"],
        ["step p99 (µs)", f"{same['step_p99_us']:.1f}", f"{peer['step_p99_us']:.1f}",
         f"{peer['step_p99_us'] / same['step_p99_us']:.1f}× faster"],
        ["mean tree nodes", f"{same['mean_tree_nodes']:.1f}", f"{peer['mean_tree_nodes']:.1f}", ""],
        ["mean accepted if verified", f"{same['mean_accepted_if_verified']:.2f}",
         f"{peer['mean_accepted_if_verified']:.2f}",
         f"{same['mean_accepted_if_verified'] / max(peer['mean_accepted_if_verified'], 1e-9):.2f}×"],
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-files", type=int, default=None, help="use only the first N stdlib files")
    parser.add_argument("--quick", action="store_true", help="smoke test: 200 files, 2,000 steps")
    parser.add_argument("--steps", type=int, default=20_000, help="replayed tokens for the latency measure")
    parser.add_argument("--budget", type=int, default=32, help="max_nodes per propose()")
    parser.add_argument("--max-depth", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--load-repeats", type=int, default=5)
    parser.add_argument("--baseline-tokens", type=int, default=2_000_000,
                        help="tokens of the corpus prefix on which baselines and refdec are compared")
    parser.add_argument("--no-baselines", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (refdec imports torch)")
    args = parser.parse_args(argv)
    if args.quick:
        args.max_files = args.max_files or 200
        args.steps = min(args.steps, 2_000)

    from refdec.drafting.index import tokenizer_fingerprint

    # Step 1. Corpus and token ids (cached).
    documents, skipped = data.read_stdlib(tests=True)
    if args.max_files:
        documents = documents[: args.max_files]
    import torch

    torch.set_num_threads(args.threads)
    tokenizer = tokens.tokenizer()
    t0 = time.perf_counter()
    arrays = tokens.token_ids([doc.text for doc in documents], tag="stdlib")
    tokenize_or_cache_s = time.perf_counter() - t0
    corpus_idx, held_idx = data.held_out_split(documents)
    corpus = [arrays[i] for i in corpus_idx]
    held_out = [arrays[i] for i in held_idx]
    vocab_size = len(tokenizer)
    text_bytes = sum(len(documents[i].text.encode()) for i in corpus_idx)
    print(f"corpus: {len(corpus)} files ({len(held_out)} held out, {len(skipped)} not UTF-8), "
          f"{sum(len(a) for a in corpus):,} tokens, {text_bytes / 1e6:.1f} MB of text; "
          f"token ids ready in {tokenize_or_cache_s:.1f} s", file=sys.stderr)

    # Step 2. refdec: build, save, load, replay.
    build = bench_refdec_build(corpus, vocab_size)
    index = build.pop("index")
    with tempfile.TemporaryDirectory(dir=BENCH_DIR) as tmp:
        path = os.path.join(tmp, "stdlib.refdec")
        t0 = time.perf_counter()
        index.save(path)
        save_s = time.perf_counter() - t0
        file_bytes = os.path.getsize(path)
        del index
        gc.collect()
        load = bench_refdec_load(path, args.load_repeats)
        from refdec import CorpusIndex

        loaded = CorpusIndex.load(path)
        pairs = replay_prompts(held_out, args.prompt_len, args.steps)
        steps = bench_refdec_steps(loaded, pairs, args.budget, args.max_depth)
        del loaded

    refdec_result = {
        **build,
        "save_s": save_s,
        "file_bytes": file_bytes,
        "bytes_per_token": file_bytes / build["tokens"],
        **load,
        **steps,
    }

    # Step 3. Baselines on a common corpus prefix, refdec on the same prefix.
    baselines: dict = {}
    if not args.no_baselines:
        prefix, total = [], 0
        for arr in corpus:
            if total >= args.baseline_tokens:
                break
            prefix.append(arr)
            total += len(arr)
        why = arctic_available()
        if why is None:
            same = bench_refdec_build(prefix, vocab_size)
            same_index = same.pop("index")
            same_steps = bench_refdec_steps(same_index, pairs, args.budget, args.max_depth)
            arctic = bench_arctic(prefix, pairs, args.budget, args.max_depth)
            baselines["refdec_on_prefix"] = {**same, **same_steps}
            baselines["arctic_inference"] = arctic
            del same_index
        else:
            baselines["arctic_inference"] = {"unavailable": why}
        try:
            import draftretriever  # noqa: F401
        except Exception as exc:  # noqa: BLE001
            baselines["draftretriever"] = {"unavailable": f"{type(exc).__name__}: {exc}"}
        else:
            if "refdec_on_prefix" not in baselines:
                same = bench_refdec_build(prefix, vocab_size)
                same_index = same.pop("index")
                baselines["refdec_on_prefix"] = {**same, **bench_refdec_steps(same_index, pairs, args.budget,
                                                                                 args.max_depth)}
                del same_index
            with tempfile.TemporaryDirectory(dir=BENCH_DIR) as tmp:
                baselines["draftretriever"] = bench_draftretriever(prefix, pairs, args.budget, vocab_size, tmp)

    # Step 4. Report.
    r = refdec_result
    rows = [
        ["build throughput (build + freeze), wall", f"{r['build_tokens_per_s'] / 1e6:.2f} M tokens/s",
         f"≥ {TARGETS['build_tokens_per_s'] / 1e6:.0f} M tokens/s",
         "ok" if r["build_tokens_per_s"] >= TARGETS["build_tokens_per_s"] else "MISSED"],
        ["build throughput (build + freeze), CPU time", f"{r['build_tokens_per_cpu_s'] / 1e6:.2f} M tokens/CPU-s",
         "", ""],
        ["file size", f"{r['bytes_per_token']:.1f} bytes/token", f"≤ {TARGETS['bytes_per_token']:.0f}",
         "ok" if r["bytes_per_token"] <= TARGETS["bytes_per_token"] else "MISSED"],
        ["load (fresh process, median)", f"{r['load_ms_fresh_process_median']:.2f} ms", f"≤ {TARGETS['load_ms']:.0f} ms",
         "ok" if r["load_ms_fresh_process_median"] <= TARGETS["load_ms"] else "MISSED"],
        ["load (in process, median)", f"{r['load_ms_in_process_median']:.2f} ms", "", ""],
        ["first query after load", f"{r['first_query_ms_median']:.2f} ms", "", ""],
        [f"propose({args.budget}) + accept(1), p50", f"{r['step_p50_us']:.1f} µs", f"≤ {TARGETS['step_p50_us']:.0f} µs",
         "ok" if r["step_p50_us"] <= TARGETS["step_p50_us"] else "MISSED"],
        [f"propose({args.budget}) + accept(1), p99", f"{r['step_p99_us']:.1f} µs", "", ""],
        ["mean tree nodes / accepted-if-verified", f"{r['mean_tree_nodes']:.1f} / {r['mean_accepted_if_verified']:.2f}",
         "", ""],
        ["peak RSS after build", f"{r['peak_rss_mb_after_build']:.0f} MB", "", ""],
    ]
    print(f"\n### refdec corpus index: stdlib, {r['tokens']:,} tokens, {r['documents']} documents, "
          f"{r['steps']:,} replayed steps\n")
    print(markdown_table(rows, ["measure", "value", "target", ""]))

    arctic = baselines.get("arctic_inference", {})
    if "unavailable" in arctic:
        print(f"\nArcticInference: not measured ({arctic['unavailable']})")
    elif arctic:
        same = baselines["refdec_on_prefix"]
        rows = _build_rows(same, arctic) + _replay_rows(same, arctic) + [
            ["memory (bytes/token)", f"{refdec_result['bytes_per_token']:.1f} (file)",
             f"{arctic['bytes_per_token_in_memory']:.1f} (estimate_memory)" if arctic["bytes_per_token_in_memory"] else "?",
             ""],
        ]
        print(f"\n### vs ArcticInference SuffixTree (same {arctic['tokens']:,} tokens, same replay)\n")
        print(markdown_table(rows, ["measure", "refdec", "ArcticInference", "ratio"]))

    rest = baselines.get("draftretriever", {})
    if "unavailable" in rest:
        print(f"\nDraftRetriever (REST): not measured ({rest['unavailable']})")
    elif rest:
        same = baselines["refdec_on_prefix"]
        rows = _build_rows(same, rest) + [
            ["file bytes/token", f"{refdec_result['bytes_per_token']:.1f} (full corpus)",
             f"{rest['bytes_per_token']:.1f}", ""],
            ["load (in process)", f"{refdec_result['load_ms_in_process_median']:.2f} ms (full corpus)",
             f"{rest['load_ms_in_process']:.1f} ms",
             f"{rest['load_ms_in_process'] / max(refdec_result['load_ms_in_process_median'], 1e-9):.0f}×"],
        ] + _replay_rows(same, rest)
        print(f"\n### vs DraftRetriever / REST (same {rest['tokens']:,} tokens, same replay; REST has no live-context "
              "source)\n")
        print(markdown_table(rows, ["measure", "refdec", "DraftRetriever", "ratio"]))

    out = report.write_result(report.result_path(None, "index_bench", timestamp=False), {
        "args": vars(args),
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "corpus": {"files": len(corpus), "held_out_files": len(held_out), "skipped_not_utf8": skipped,
                   "text_bytes": text_bytes},
        "refdec": refdec_result,
        "baselines": baselines,
        "targets": TARGETS,
    }, argv=argv)
    print(f"\nwrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
