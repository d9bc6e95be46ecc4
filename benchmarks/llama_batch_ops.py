"""Which of llama.cpp's operations make a row's values depend on its batch, op by op.

    python -m benchmarks.llama_batch_ops --models gemma,coder --rows 2,4,9
    GGML_CPU_TILED_MM=0 python -m benchmarks.llama_batch_ops --models coder --rows 9

For each model and each ``n`` of ``--rows``: a context of random token ids is prefilled, then one
token is decoded alone (as plain decoding does) and, on a fresh context, as row 0 of an ``n``-row
chain (as a draft is verified; row 0 sees only the context and itself in both). llama.cpp's eval
callback hands over every tensor of both graphs. An operation is *batch-variant* when every input
it read from the graph holds the same row-0 values in both runs and its own row 0 differs; the
table lists those, grouped by operation and input types, with how many graph nodes and the largest
difference. Weights and the KV cache are not graph outputs and count as equal inputs (the cache
cells past the context are masked for row 0, so ``kq`` is compared on the context's cells and the
row's own).

The tensor layout read here is ggml's ``struct ggml_tensor`` of the ggml that llama-cpp-python
0.3.36 vendors (``GGML_MAX_DIMS`` 4, ``GGML_MAX_OP_PARAMS`` 64, ``GGML_MAX_SRC`` 10,
``GGML_MAX_NAME`` 64).
"""

from __future__ import annotations

import argparse
import ctypes

import numpy as np

GGML_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 6: "q5_0", 8: "q8_0", 10: "q2_K", 11: "q3_K", 12: "q4_K",
              13: "q5_K", 14: "q6_K", 30: "bf16"}
GGML_OPS = {2: "ADD", 7: "MUL", 25: "RMS_NORM", 29: "MUL_MAT", 46: "SOFT_MAX", 74: "FLASH_ATTN_EXT"}


class GgmlTensor(ctypes.Structure):
    """ggml's ``struct ggml_tensor`` (ggml.h), the fields read here and those before them."""
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


class GraphRecorder:
    """An eval callback that keeps, while ``on``, every graph node in order: its name, op, float32
    values (``None`` for other types) and its inputs as (index of the node that produced it or
    ``None`` for a weight or cache view, name, type name)."""

    def __init__(self) -> None:
        from llama_cpp import llama_cpp as lib

        self.on = False
        self.nodes: list[tuple[str, int, np.ndarray | None, list]] = []
        self._index: dict[int, int] = {}
        self.callback = lib.ggml_backend_sched_eval_callback(self._see)

    def start(self) -> None:
        self.on, self.nodes, self._index = True, [], {}

    def _see(self, address, ask, _user):
        if ask:
            return self.on
        t = ctypes.cast(address, ctypes.POINTER(GgmlTensor)).contents
        inputs = []
        for src in t.src:
            if src:
                s = ctypes.cast(src, ctypes.POINTER(GgmlTensor)).contents
                inputs.append((self._index.get(src), s.name.decode(), GGML_TYPES.get(s.type, str(s.type))))
        values = None
        if t.type == 0 and t.data:
            ne, nb = list(t.ne), list(t.nb)
            size = sum((ne[i] - 1) * nb[i] for i in range(4)) + 4
            raw = bytes((ctypes.c_char * size).from_address(t.data))
            values = np.ndarray(tuple(reversed(ne)), np.float32, buffer=raw, strides=tuple(reversed(nb))).copy()
        self._index[address] = len(self.nodes)
        self.nodes.append((t.name.decode(), t.op, values, inputs))
        return True


def decode_graphs(path: str, rows: int, *, context: int, threads: int, flash_attn: bool, seed: int = 0,
                  invariant: bool = False):
    """Row 0 decoded alone and as the first of ``rows`` chained rows, after the same ``context``
    random tokens: (nodes alone, nodes batched, logits alone, logits of row 0 batched).
    ``invariant``: both decodes with ggml's batch-invariant products (refdec's exact mode; a
    llama.cpp built by ``refdec build-llama``)."""
    import llama_cpp

    from refdec.llama_cpp.api import TreeContext

    recorder = GraphRecorder()
    llm = llama_cpp.Llama(path, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False,
                          flash_attn=flash_attn)
    llm.context_params.cb_eval = recorder.callback  # TreeContext copies the Llama's context settings
    rng = np.random.default_rng(seed)
    high = min(20000, llm.n_vocab())  # past the control tokens of any vocabulary
    prompt = rng.integers(min(100, high // 2), high, context).astype(np.int32)
    chain = rng.integers(min(100, high // 2), high, rows).astype(np.int32)

    def run(n: int):
        ctx = TreeContext(llm, n_seq_max=2, n_batch=max(rows, 16), exact=invariant)
        for begin in range(0, context, ctx.prefill_chunk):
            part = prompt[begin: begin + ctx.prefill_chunk]
            ctx.decode(part, np.arange(begin, begin + len(part)), [[0]] * len(part), np.zeros(len(part), bool))
        recorder.start()
        ctx.decode(chain[:n], context + np.arange(n), [[0]] * n, np.ones(n, bool), invariant=invariant)
        recorder.on = False
        logits = ctx.logits(0).copy()
        ctx.close()
        return recorder.nodes, logits

    alone, logits_alone = run(1)
    batched, logits_batched = run(rows)
    return alone, batched, logits_alone, logits_batched


def batch_variant_ops(alone: list, batched: list, context: int) -> dict:
    """{(op, input types): [(node name, max |difference|), ...]} for the nodes whose graph inputs
    agree on row 0 while their own row 0 does not."""

    def row_difference(i: int) -> float | None:
        x, y = alone[i][2], batched[i][2]
        if x is None or y is None:
            return 0.0
        if x.shape != y.shape:
            axes = [a for a in range(4) if x.shape[a] != y.shape[a]]
            if len(axes) != 1 or x.shape[axes[0]] != 1:
                return None  # not a per-row tensor (a reshaped view): not compared
            y = np.take(y, [0], axis=axes[0])
        if alone[i][0].startswith("kq-") and x.shape[-1] > context:
            x, y = x[..., :context + 1], y[..., :context + 1]
        return float(np.abs(x - y).max()) if x.size else 0.0

    found: dict = {}
    for i in range(min(len(alone), len(batched))):
        name, op, _, inputs = alone[i]
        d = row_difference(i)
        if not d:
            continue
        if all(not row_difference(j) for j, _, _ in inputs if j is not None):
            found.setdefault((GGML_OPS.get(op, str(op)), tuple(t for _, _, t in inputs)), []).append((name, d))
    return found


def main(argv=None) -> int:
    import torch  # noqa: F401  (refdec's import order: torch before llama_cpp)

    from benchmarks.llama_numerics import MODEL_FILES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gemma,coder", help=f"comma-separated, of {', '.join(MODEL_FILES)}")
    ap.add_argument("--rows", default="2,4,9", help="batch sizes to compare with one row")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flash-attn", action="store_true")
    ap.add_argument("--invariant", action="store_true",
                    help="with ggml's batch-invariant products (refdec's exact mode; needs refdec build-llama)")
    ap.add_argument("--gguf", default=None, metavar="FILE", help="this GGUF file instead of --models")
    args = ap.parse_args(argv)
    print("| model | rows | logits row 0, max abs diff | batch-variant ops (input types: nodes, max abs diff) |")
    print("|---|---|---|---|")
    for model in [args.gguf] if args.gguf else args.models.split(","):
        if not args.gguf and model not in MODEL_FILES:
            ap.error(f"--models: unknown {model!r}; choose from {', '.join(MODEL_FILES)}")
        path = args.gguf or str(MODEL_FILES[model]())
        for n in (int(r) for r in args.rows.split(",")):
            alone, batched, la, lb = decode_graphs(path, n, context=args.context, threads=args.threads,
                                                   flash_attn=args.flash_attn, invariant=args.invariant)
            ops = batch_variant_ops(alone, batched, args.context)
            cells = "; ".join(f"{op} ({', '.join(types)}): {len(rows)}, {max(d for _, d in rows):.2g} (e.g. {rows[0][0]})"
                              for (op, types), rows in ops.items()) or "none"
            print(f"| {model} | {n} | {float(np.abs(la - lb).max()):.3g} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
