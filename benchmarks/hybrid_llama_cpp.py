"""Chain verification on hybrid GGUFs against an attention GGUF of the same size, on llama.cpp.

    python -m benchmarks.hybrid_llama_cpp [--threads 2] [--models qwen35-0.8b,lfm2-350m,qwen2_5-0.5b]
        [--dir ~/.cache/refdec/bench-gguf] [--cache-len 256] [--new 64] [--depth 16] [--json OUT]

benchmarks/hybrid.py's measurement on llama.cpp. No hybrid model's weights are on PyPI, so the
models are GGUF files of the published shapes with random weights (Q8_0 matrices, written once into
``--dir`` by benchmarks.random_gguf's ``gguf`` writers: llama.cpp's ``qwen35``, ``lfm2`` and, for
the attention model of about the same size, ``llama`` architectures). For each model:

* the cost of one ``llama_decode`` of ``1 + k`` entries against one entry
  (refdec.llama_cpp.calibration.measure over ``--cache-len`` tokens; a hybrid's row verifies a
  chain of at most refdec.llama_cpp.backend.MAX_RECURRENT_CHAIN nodes, so larger ``k`` is not
  measured there);
* tokens/s after the prefill: llama.cpp's plain greedy decoding (``Llama.generate``, timed before
  and after refdec's runs), then refdec with benchmarks.hybrid.OracleDrafter's drafts taken from
  that plain output (chains of ``--depth`` nodes, and trees with a wrong sibling at each of the
  first ``--depth / 2`` depths, which a hybrid verifies as their best chain), every draft token
  right, then 90% and 70% of them. llama.cpp's batched kernels round differently from its
  one-token ones (docs/llama_cpp.md), and these random models amplify it: refdec's tokens part
  from plain decoding's, so each run reports how many leading tokens agree, and the oracle
  re-syncs to refdec's tokens where they part (:class:`ResyncingOracle`, its time left out).

llama.cpp's threads spin: run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import refdec
from benchmarks import random_gguf
from benchmarks.hybrid import OracleDrafter, print_oracle_table, print_step_costs
from refdec.llama_cpp.calibration import measure
from refdec.llama_cpp.plain import plain_greedy


# The published shapes (benchmarks.random_gguf writer, its arguments); weights random, scaled by 1/sqrt(width).
MODELS = {
    # Qwen3.5-0.8B: 24 layers, three Gated DeltaNet layers to one gated attention layer
    "qwen35-0.8b": ("write_tiny_qwen35_gguf", dict(
        n_embd=1024, n_layer=24, n_head=8, n_head_kv=2, head_dim=256, n_ff=3584, d_state=128, n_k_heads=16,
        n_v_heads=16, d_conv=4, interval=4, rope_dim=64, n_vocab=248320)),
    # LFM2-350M: 16 layers, 10 short convolutions and 6 attention layers (its 6656 feed-forward
    # width after LFM2's auto-adjustment: 4608)
    "lfm2-350m": ("write_tiny_lfm2_gguf", dict(
        n_embd=1024, n_head=16, n_head_kv=8, n_ff=4608, l_cache=3, layers="ccaccaccacacacac", n_vocab=65536)),
    # Qwen2.5-0.5B's shape as a llama GGUF: the attention-only model of about the same size
    "qwen2_5-0.5b": ("write_tiny_gguf", dict(
        n_embd=896, n_layer=24, n_head=14, n_head_kv=2, n_ff=4864, n_vocab=151936)),
}
SIZES = (1, 2, 4, 8, 16, 32, 64)


def gguf_file(name: str, directory: Path) -> Path:
    """The GGUF of :data:`MODELS`' ``name`` in ``directory``, written there first if missing (seeded,
    so the same file every time)."""
    path = directory / f"{name}-random-q8_0.gguf"
    if not path.is_file():
        writer, fields = MODELS[name]
        directory.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} (random weights)", file=sys.stderr, flush=True)
        partial = path.with_suffix(".partial")
        getattr(random_gguf, writer)(partial, q8=True, scale=fields["n_embd"] ** -0.5, n_ctx=4096, **fields)
        os.replace(partial, path)
    return path


class ResyncingOracle(OracleDrafter):
    """:class:`~benchmarks.hybrid.OracleDrafter` on llama.cpp, whose verification rows round
    differently from its one-token steps: random-weight models are chaotic enough that refdec's
    greedy output parts from plain decoding's within a few dozen tokens (``*_agree`` in the
    results), and an oracle still drafting plain decoding's tokens after that would measure
    nothing. When the tokens refdec emits part from what it drafts from, it continues from refdec's
    tokens with llama.cpp's plain greedy decoding (the ``Llama``'s own context; refdec's is not
    touched) and counts that time in ``resync_seconds``, which the rate leaves out."""

    def __init__(self, llm, prompt: list[int], want: list[int], depth: int, right: float, vocab: int,
                 tree: bool = False) -> None:
        super().__init__(want, depth, right, vocab, tree)
        self.llm, self.seq = llm, list(prompt)
        self.resync_seconds, self.resyncs = 0.0, 0

    def accept(self, tokens) -> None:
        tokens = [int(t) for t in tokens]
        start = len(self.seq)
        self.seq += tokens
        super().accept(tokens)
        if self.want[start:start + len(tokens)] != tokens:
            t0 = time.perf_counter()
            tail, _ = plain_greedy(self.llm, self.seq, max(1, len(self.want) - len(self.seq)))
            self.want = self.seq + tail
            self.resync_seconds += time.perf_counter() - t0
            self.resyncs += 1


def decode_rates(llm, prompt: list[int], new: int, depth: int) -> dict:
    """tokens/s after the prompt's prefill of llama.cpp's plain greedy decoding and of refdec with
    oracle drafts; ``*_agree``: the leading new tokens equal to plain decoding's."""
    _, prefill = plain_greedy(llm, prompt, 1)
    want, seconds = plain_greedy(llm, prompt, new)
    rates = {"plain_before": (new - 1) / (seconds - prefill)}
    full = list(prompt) + want
    vocab = int(llm.n_vocab())
    for shape in ("chain", "tree"):
        for right in (1.0, 0.9, 0.7):
            label = f"refdec_{shape}_{int(right * 100)}"
            made = []

            def factory(index, refs, max_depth, right=right, tree=shape == "tree"):
                made.append(ResyncingOracle(llm, prompt, full, depth, right, vocab, tree))
                return made[-1]

            decoder = refdec.SpeculativeDecoder(llm, proposer_factory=factory)
            out = decoder.generate(prompt, max_new_tokens=new, eos_token_id=[],
                                   max_draft_tokens=depth + (depth // 2 if shape == "tree" else 0))
            got = out.sequences[0, len(prompt):].tolist()
            stats = out.stats
            resync = sum(oracle.resync_seconds for oracle in made)
            rates[label] = (stats.new_tokens - 1) / (stats.wall_seconds - stats.prefill_seconds - resync)
            rates[label + "_resyncs"] = sum(oracle.resyncs for oracle in made)
            rates[label + "_tokens_per_pass"] = stats.tokens_per_pass
            rates[label + "_agree"] = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
            del decoder, out  # its llama.cpp context freed before the next one is made
    _, prefill = plain_greedy(llm, prompt, 1)
    _, seconds = plain_greedy(llm, prompt, new)
    rates["plain_after"] = (new - 1) / (seconds - prefill)
    rates["plain"] = (rates["plain_before"] + rates["plain_after"]) / 2
    return rates


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--dir", type=Path, default=refdec.gguf_files.cache_dir() / "bench-gguf")
    ap.add_argument("--cache-len", type=int, default=256)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import llama_cpp

    names = args.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"--models: unknown {unknown} (known: {sorted(MODELS)})")
    paths = {name: gguf_file(name, args.dir) for name in names}  # written before anything is timed
    results = {}
    for name in names:
        llm = llama_cpp.Llama(str(paths[name]), n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads,
                              n_batch=512, verbose=False)
        backend = refdec.SpeculativeDecoder(llm).backend
        curve = measure(backend, (0,) + SIZES, cache_len=args.cache_len, repeats=args.repeats)
        cost = dict(zip(curve.nodes, curve.seconds))
        rng = np.random.default_rng(1)
        prompt = [random_gguf.BOS] + rng.integers(random_gguf.VOCAB, 30000, size=args.cache_len - 1).tolist()
        t0 = time.perf_counter()
        rates = decode_rates(llm, prompt, args.new, args.depth)
        results[name] = {"step_seconds": {str(k): v for k, v in cost.items()}, "max_chain": backend.max_tree,
                         "recurrent": bool(backend.recurrent), "rates": rates,
                         "seconds": time.perf_counter() - t0}
        print(f"{name}: " + ", ".join(f"{k} {v:.3g}" for k, v in rates.items()), file=sys.stderr, flush=True)
        del backend, llm
    print_step_costs(results, SIZES)
    print()
    print_oracle_table(
        results, "plain", ["plain tok/s (before / after)"],
        lambda rates: [f"{rates['plain_before']:.1f} / {rates['plain_after']:.1f}"],
        "tokens equal to plain's",
        lambda rates, keys: " / ".join(str(rates[k + "_agree"]) for k in keys) + f" of {args.new}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {**vars(args), "dir": str(args.dir)}, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
