"""Tree verification on hybrid models against an attention model of the same size, on transformers.

    python -m benchmarks.hybrid [--threads 2] [--models qwen3_5-0.8b,lfm2-350m,qwen2_5-0.5b]
        [--cache-len 256] [--new 48] [--depth 16] [--json OUT]

No hybrid model's weights are on PyPI, so the models are real-size with random weights, built
from published configurations (:data:`CONFIGS`; float32, the LM head scaled so that greedy
decoding is not a flat distribution's argmax): the mechanics are measured, not a model's
acceptance. For each model:

* the cost of verifying ``k`` nodes against one plain step (``k`` = 0, the engine's one-token
  step, to 64): refdec.transformers.calibration.measure, a chain over a cache of
  ``--cache-len`` tokens, median of rounds alternating in order;
* tokens/s decoding ``--new`` tokens after a random prompt of ``--cache-len`` tokens: plain
  (``model.generate``, and refdec's loop without drafts), then refdec with drafts taken from the
  model's own plain output (:class:`OracleDrafter`: chains of ``--depth`` nodes, and trees with a
  wrong sibling at each of the chain's first ``--depth / 2`` depths), every draft token right,
  then 90% and 70% of them. Every run's tokens are checked against ``model.generate``'s.

The speed-up at equal acceptance of each hybrid is reported beside the attention model's (the
issue's target: within 0.8x of it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

import refdec
from refdec import DraftTree
from refdec.transformers.calibration import measure

# Published configurations (the fields that shape compute; the rest are transformers' defaults).
CONFIGS = {
    # Qwen3.5-0.8B: 24 layers, three Gated DeltaNet layers to one gated attention layer
    "qwen3_5-0.8b": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(
        vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
        num_attention_heads=8, num_key_value_heads=2, head_dim=256,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 6,
        linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, tie_word_embeddings=True)),
    # LFM2-350M: 16 layers, 10 short convolutions and 6 attention layers
    "lfm2-350m": ("Lfm2Config", "Lfm2ForCausalLM", dict(
        vocab_size=65536, hidden_size=1024, intermediate_size=6656, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=8, conv_L_cache=3, block_auto_adjust_ff_dim=True,
        block_ffn_dim_multiplier=1.0, block_multiple_of=256,
        layer_types=["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv", "conv",
                     "full_attention", "conv", "full_attention", "conv", "full_attention", "conv", "full_attention",
                     "conv"], tie_word_embeddings=True)),
    # Qwen2.5-0.5B: the attention-only model of about the same size
    "qwen2_5-0.5b": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True)),
}
ATTENTION_MODEL = "qwen2_5-0.5b"
SIZES = (0, 1, 2, 4, 8, 16, 32, 64)


def build(name: str, seed: int = 0):
    """The random-weight float32 model ``name`` of :data:`CONFIGS`."""
    import transformers

    config_cls, model_cls, fields = CONFIGS[name]
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(**fields, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = getattr(transformers, model_cls)(config).to(torch.float32).eval()
    with torch.no_grad():  # a sharper head: random weights otherwise give a near-flat distribution
        model.get_output_embeddings().weight.mul_(4.0)
    model.generation_config.pad_token_id = 0
    return model


class OracleDrafter:
    """Drafts the model's own plain output (``want``: the prompt and the tokens ``model.generate``
    gives), each draft token at output position ``j`` replaced when a draw keyed by ``j`` exceeds
    ``right`` (so every model sees the same corruptions): a chain of ``depth`` tokens, or with
    ``tree=True`` the chain plus a wrong sibling at each of its first ``depth // 2`` depths."""

    source_names = ("oracle",)

    def __init__(self, want: list[int], depth: int, right: float, vocab: int, tree: bool = False) -> None:
        self.want, self.depth, self.tree = want, depth, tree
        rng = np.random.default_rng(0)
        self.wrong = rng.random(len(want)) > right
        self.vocab = vocab
        self.pos = 0

    def start(self, prompt_ids) -> None:
        self.pos = len(prompt_ids)

    def accept(self, tokens) -> None:
        self.pos += len(tokens)

    def _token(self, j: int, wrong: bool) -> int:
        return (self.want[j] + 1) % self.vocab if wrong else self.want[j]

    def propose(self, max_nodes: int) -> DraftTree:
        n = min(self.depth, max_nodes, len(self.want) - self.pos)
        tokens = [self._token(self.pos + i, bool(self.wrong[self.pos + i])) for i in range(max(0, n))]
        parents = list(range(-1, len(tokens) - 1))
        if self.tree:
            for d in range(min(len(tokens), self.depth // 2, max_nodes - len(tokens))):
                tokens.append((self.want[self.pos + d] + 2) % self.vocab)  # never the model's token
                parents.append(d - 1)
            order = np.argsort(np.array([(p + 1) for p in parents]), kind="stable")  # parents before children
            remap = {int(old): new for new, old in enumerate(order)}
            tokens = [tokens[i] for i in order]
            parents = [-1 if parents[i] < 0 else remap[parents[i]] for i in order]
        return DraftTree(np.array(tokens, dtype=np.int32), np.array(parents, dtype=np.int32),
                         np.ones(len(tokens), dtype=np.float32), source_names=self.source_names)


def decode_rates(model, prompt: list[int], new: int, depth: int) -> dict:
    """tokens/s after the first token (the prompt's prefill, which gives it, apart) of plain decoding
    and of refdec with oracle drafts (:class:`OracleDrafter`: chains and trees, 100%, 90% and 70%
    of draft tokens right)."""
    vocab = int(model.config.vocab_size)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        t0 = time.perf_counter()
        model.generate(ids[:, :-1], max_new_tokens=1, do_sample=False)  # the prefill alone, to subtract
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        want = model.generate(ids, max_new_tokens=new, do_sample=False, eos_token_id=None)[0].tolist()
        hf_seconds = time.perf_counter() - t0 - prefill
    rates = {"hf_generate": (new - 1) / hf_seconds}  # the first token comes with the prefill
    runs = [("refdec_plain", 0, None)] + [(f"refdec_{shape}_{int(r * 100)}", depth, (r, shape == "tree"))
                                          for shape in ("chain", "tree") for r in (1.0, 0.9, 0.7)]
    for label, max_draft, oracle in runs:
        factory = None
        if oracle is not None:
            right, tree = oracle
            factory = (lambda index, refs, max_depth, right=right, tree=tree:
                       OracleDrafter(want, depth, right, vocab, tree))
        decoder = refdec.SpeculativeDecoder(model, proposer_factory=factory)
        out = decoder.generate(prompt, max_new_tokens=new, eos_token_id=[],
                               max_draft_tokens=max_draft if not (oracle and oracle[1]) else depth + depth // 2)
        if out.sequences[0].tolist() != want:
            raise AssertionError(f"{label}: refdec's tokens differ from model.generate's")
        stats = out.stats
        rates[label] = (stats.new_tokens - 1) / (stats.wall_seconds - stats.prefill_seconds)
        rates[label + "_tokens_per_pass"] = stats.tokens_per_pass
        rates[label + "_accepted"] = stats.accepted_tokens / max(1, stats.proposed_tokens)
    return rates


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default=",".join(CONFIGS))
    ap.add_argument("--cache-len", type=int, default=256)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = args.models.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        ap.error(f"--models: unknown {unknown} (known: {sorted(CONFIGS)})")
    results = {}
    for name in names:
        model = build(name)
        rng = np.random.default_rng(1)
        prompt = [1] + rng.integers(3, 30000, size=args.cache_len - 1).tolist()
        with torch.inference_mode():
            curve = measure(model, SIZES, cache_len=args.cache_len, repeats=args.repeats)
        cost = dict(zip(curve.nodes, curve.seconds))
        rates = decode_rates(model, prompt, args.new, args.depth)
        results[name] = {"step_seconds": {str(k): v for k, v in cost.items()},
                         "head_chunk_seconds": curve.head_chunk_seconds, "rates": rates}
        print(f"{name}: verify k nodes / one step: " + ", ".join(
            f"{k}: {cost[k] / cost[0]:.2f}" for k in SIZES if k), file=sys.stderr)
        print(f"{name}: " + ", ".join(f"{k} {v:.3g}" for k, v in rates.items()), file=sys.stderr)
        del model
    print_step_costs(results, [k for k in SIZES if k])
    print()
    print_oracle_table(results, "hf_generate", ["HF generate tok/s", "refdec, no drafts"],
                       lambda rates: [f"{rates['hf_generate']:.1f}", f"{rates['refdec_plain']:.1f}"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    return 0


def print_step_costs(results: dict, sizes) -> None:
    """Prints the verify-cost table: each model's one-token step and its ``k``-node verifications over
    it, for each ``k`` of ``sizes`` ("–" where not measured)."""
    print("| model | " + " | ".join(f"k={k}" for k in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for name, r in results.items():
        steps = r["step_seconds"]
        base = steps["0"]
        print(f"| {name} (1 step {base * 1e3:.0f} ms) | " + " | ".join(
            f"{steps[str(k)] / base:.2f}" if str(k) in steps else "–" for k in sizes) + " |")


def print_oracle_table(results: dict, baseline: str, lead_columns: list[str], lead, tail_column: str = "",
                       tail=None) -> None:
    """Prints the oracle-draft table: for each model and draft shape (chain, tree), the rates at 100 /
    90 / 70 % right, their speed-ups over ``baseline``'s rate and over the attention model's. ``lead``
    gives a model's first cells (headed ``lead_columns``) from its rates; ``tail``, when given, one last
    cell (headed ``tail_column``) from its rates and the three rate keys."""
    columns = ["model", *lead_columns, "drafts", "100% right", "90%", "70%", "speed-up, 100 / 90 / 70",
               "/ the attention model's"] + ([tail_column] if tail else [])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    attn = results.get(ATTENTION_MODEL, {}).get("rates")
    for name, r in results.items():
        rates = r["rates"]
        for shape in ("chain", "tree"):
            keys = [f"refdec_{shape}_{p}" for p in (100, 90, 70)]
            ups = [rates[k] / rates[baseline] for k in keys]
            rel = "–" if attn is None or name == ATTENTION_MODEL else " / ".join(
                f"{up / (attn[k] / attn[baseline]):.2f}" for up, k in zip(ups, keys))
            cells = [name, *lead(rates), shape,
                     *(f"{rates[k]:.1f} ({rates[k + '_tokens_per_pass']:.1f}/pass)" for k in keys),
                     " / ".join(f"{u:.2f}" for u in ups), rel] + ([tail(rates, keys)] if tail else [])
            print("| " + " | ".join(cells) + " |")

if __name__ == "__main__":
    sys.exit(main())
