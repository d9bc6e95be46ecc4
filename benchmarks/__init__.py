"""refdec's benchmarks, one package: run each from the repository root as a module,

    python -m benchmarks                        # lists every benchmark, one line each
    python -m benchmarks.simulate --quick       # model-free drafting replay (needs the data)
    python -m benchmarks.e2e --quick            # the real model against HF greedy / prompt lookup
    python -m benchmarks.gpu                    # on a lent GPU, < 8 min (--device cpu --quick: a check)

with the flags each prints under ``--help``. Results (JSON with the git commit, the command,
the machine and torch's thread count) go to ``benchmarks/out/``; benchmarks/RESULTS.md records
the figures with the commands that made them.

Shared modules, one job each:

    paths       where the benchmarks write: the cache (``$REFDEC_BENCH_CACHE``) and results folders
    data        the data root (``$REFDEC_DATA``, else ``../shared/data``), a reader per data file,
                the Python-source corpus reader (one skip rule)
    tokens      token ids with the default model's tokenizer, cached
    workloads   the workloads (Case, Workload, load_workload); edit prompts from refdec.edit_prompt
    corpora     the stdlib corpus index (and the draftretriever datastore), built once, cached
    report      the one result writer (write_result), markdown tables
    baselines   peer drafters (prompt lookup, oracle chain, ArcticInference, draftretriever)
    tiny_model  tiny random Llama / Qwen2 / Gemma 3 models from transformers configs (leak_check, gpu)

The benchmarks themselves: ``python -m benchmarks`` lists them (benchmarks/__main__.py).

The benchmarks import refdec's public names only (a few ablations set a private attribute,
each marked where it does).
"""
