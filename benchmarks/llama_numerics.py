"""How far llama.cpp's batched evaluation is from its one-token evaluation (why refdec on llama.cpp
can part from plain decoding at a near-tie).

    python -m benchmarks.llama_numerics --models gemma,coder --rows 2,5,9,17,33,65

For each model: a context of random token ids, then a chain of ``max(rows)`` random tokens
evaluated one ``llama_decode`` per token (as plain decoding does) and, for each ``n`` in
``--rows``, its first ``n`` tokens in one ``llama_decode`` with every row's logits (as a draft is
verified). Prints, per ``n``, the largest |logit difference| of any row against the same row
evaluated alone and how many rows keep their argmax.
"""

from __future__ import annotations

import argparse

import numpy as np


from refdec.gguf_files import chat_model_gguf, default_model_gguf, editor_model_gguf, small_editor_model_gguf

# the models these tools take by name: a function returning each one's GGUF path
MODEL_FILES = {"gemma": default_model_gguf, "coder": editor_model_gguf, "coder-0.5b": small_editor_model_gguf,
               "chat": chat_model_gguf}


def compare(path: str, rows: list[int], threads: int, context: int, seed: int) -> list[tuple[int, float, int]]:
    import llama_cpp

    from refdec.llama_cpp.api import TreeContext

    llm = llama_cpp.Llama(path, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
    rng = np.random.default_rng(seed)
    prompt = rng.integers(100, 20000, context).astype(np.int32)
    chain = rng.integers(100, 20000, max(rows)).astype(np.int32)

    def fresh() -> TreeContext:
        ctx = TreeContext(llm, n_seq_max=2, n_batch=max(rows))
        for begin in range(0, context, ctx.prefill_chunk):
            part = prompt[begin: begin + ctx.prefill_chunk]
            ctx.decode(part, np.arange(begin, begin + len(part)), [[0]] * len(part), np.zeros(len(part), bool))
        return ctx

    ctx = fresh()
    alone = []
    for i, token in enumerate(chain):
        ctx.decode(chain[i: i + 1], np.array([context + i]), [[0]], np.ones(1, bool))
        alone.append(ctx.logits(0).copy())
    ctx.close()
    out = []
    for n in rows:
        ctx = fresh()
        ctx.decode(chain[:n], context + np.arange(n), [[0]] * n, np.ones(n, bool))
        diff = max(float(np.abs(ctx.logits(i) - alone[i]).max()) for i in range(n))
        same = sum(int(ctx.logits(i).argmax() == alone[i].argmax()) for i in range(n))
        out.append((n, diff, same))
        ctx.close()
    return out


def main(argv=None) -> int:
    files = MODEL_FILES
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gemma,coder", help=f"comma-separated, of {', '.join(files)}")
    ap.add_argument("--rows", default="2,5,9,17,33,65")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    print("| model | rows in one decode | max abs logit difference | rows with the same argmax |")
    print("|---|---|---|---|")
    for name in args.models.split(","):
        if name not in files:
            ap.error(f"--models: unknown {name!r}; choose from {', '.join(files)}")
        for n, diff, same in compare(str(files[name]()), rows, args.threads, args.context, args.seed):
            print(f"| {name} | {n} | {diff:.2f} | {same}/{n} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
