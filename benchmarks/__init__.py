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
    backends    the models (default, chat, editor) by name on transformers or llama.cpp

and the parts of the two drivers, ``e2e`` (end to end) and ``engine_ab`` (one checkout against another):

    methods     e2e's methods on transformers (hf-greedy, refdec-auto, ...): how each decodes a prompt
    per_prompt  e2e's default run: every method on every prompt, the ratios, the identity check
    batching    e2e --batch: batched and continuous batching against HF's batched greedy
    llama_runs  e2e --backend llama.cpp: plain, prompt lookup and refdec on llama.cpp
    leak_check  e2e --long-run: memory over many generate calls on one decoder
    step_replay engine_ab --step: the drafting-step replay a build runs in a child process

The benchmarks themselves: ``python -m benchmarks`` lists them (benchmarks/__main__.py).

The benchmarks import refdec's public names only (a few ablations set a private attribute,
each marked where it does).
"""
