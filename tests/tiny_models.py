"""Tiny random float64 models, a pure-Python draft proposer and the helpers the tests share.

Models are built from configs (no hub): small vocab, a few layers, so a forward
takes a millisecond. Random models give near-uniform next-token distributions,
so the output projection is scaled up (``_sharpen``) to make greedy decoding
fall into loops on repetitive prompts: then drafts copied from the context are
partly accepted and partly rejected, and the tests check both happen.

Tiers: a property checked on every model family runs on ``FAST_FAMILIES`` (Llama: rotary
positions and one mask, the cheapest to run) in the fast tier, and where the masks or the cache
are the point on ``MASK_FAMILIES`` (Gemma 3 too: sliding-window layers and a dict of masks); on
the others (GPT-2: absolute position embeddings; Qwen2) in the ``full`` tier (``family_params``;
tests/conftest.py deselects ``full`` unless ``-m`` names it).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from transformers.generation.streamers import BaseStreamer

from refdec.drafting.tree import DraftTree
from refdec.transformers.masks import tree_step_inputs

VOCAB = 96
INIT = 0.02


def _sharpen(model, scale: float) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight") or name.endswith("wte.weight") or name.endswith("lm_head.weight"):
                p.mul_(scale)


def _finish(model, scale: float):
    model = model.to(torch.float64).eval()
    _sharpen(model, scale)
    model.generation_config.pad_token_id = 0
    return model


def tiny_llama(seed: int = 0, scale: float = 3.0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                      initializer_range=INIT)
    return _finish(LlamaForCausalLM(cfg), scale)


def tiny_qwen2(seed: int = 0, scale: float = 3.0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                      initializer_range=INIT)
    return _finish(Qwen2ForCausalLM(cfg), scale)


def tiny_gemma3(seed: int = 0, scale: float = 3.0, sliding_window: int = 8):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                           sliding_window=sliding_window,
                           layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                           query_pre_attn_scalar=16, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                           tie_word_embeddings=False, initializer_range=INIT)
    return _finish(Gemma3ForCausalLM(cfg), scale)


def tiny_gpt2(seed: int = 0, scale: float = 3.0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=VOCAB, n_embd=48, n_layer=2, n_head=4, n_positions=512,
                     bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                     initializer_range=INIT)
    return _finish(GPT2LMHeadModel(cfg), scale)


MODEL_BUILDERS = {"llama": tiny_llama, "qwen2": tiny_qwen2, "gemma3": tiny_gemma3, "gpt2": tiny_gpt2}
FAMILIES = sorted(MODEL_BUILDERS)
FAST_FAMILIES = ("llama",)
MASK_FAMILIES = ("gemma3", "llama")


def family_params(families=FAMILIES, fast=FAST_FAMILIES) -> list:
    """pytest parameters over model family names: those outside ``fast`` marked ``full``."""
    return [name if name in fast else pytest.param(name, marks=pytest.mark.full) for name in families]


def cached_model(cache: dict, name: str):
    """The tiny model of family ``name``, built once per ``cache`` (a session-scoped dict)."""
    if name not in cache:
        cache[name] = MODEL_BUILDERS[name]()
    return cache[name]


def repetitive_prompts(count: int, seed: int = 0, vocab: int = VOCAB, low: int = 3) -> list[list[int]]:
    """Prompts made of a random span repeated a few times with small edits, so drafts match."""
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(count):
        span = rng.integers(low, vocab, size=int(rng.integers(4, 12))).tolist()
        reps = int(rng.integers(2, 4))
        out = [1]
        for _ in range(reps):
            piece = list(span)
            if rng.random() < 0.5:
                piece[int(rng.integers(len(piece)))] = int(rng.integers(low, vocab))
            out += piece
        out += span[: int(rng.integers(1, len(span)))]
        prompts.append(out)
    return prompts


def tiers(cases: list[tuple], fast: list[tuple]) -> list:
    """pytest parameters for ``cases`` (tuples of argument values), those not in ``fast`` marked ``full``."""
    return [pytest.param(*case, marks=() if case in fast else pytest.mark.full) for case in cases]


def hf_greedy(model, prompt, max_new_tokens: int = 40, eos_token_id=None, **kwargs) -> list[int]:
    """``model.generate(do_sample=False)`` on one prompt (a list of ids): the prompt and the new
    tokens as one list (``kwargs``: more of generate's arguments, e.g. logits settings)."""
    with torch.no_grad():
        return model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new_tokens,
                              eos_token_id=eos_token_id, pad_token_id=0, **kwargs)[0].tolist()


def batch_row(out, b: int, prompt_len: int, pad: int = 0) -> list[int]:
    """Row ``b`` of a batched ``generate`` output without its left and right padding (prompt + new
    tokens); asserts that only padding follows the row's end."""
    new = out.stats.rows[b].new_tokens
    seq = out.sequences[b].tolist()
    head = out.sequences.shape[1] - max(r.new_tokens for r in out.stats.rows)  # the padded prompt width
    assert all(t == pad for t in seq[head + new:]), "right padding after the row's end"
    return seq[head - prompt_len: head + new]


def mixed_batch() -> list[list[int]]:
    """Prompts of different lengths: repetitive ones (drafts accepted) and random ones (drafts rejected)."""
    rng = np.random.default_rng(7)
    prompts = repetitive_prompts(4, seed=11)
    prompts.insert(2, [1] + rng.integers(3, VOCAB, size=5).tolist())  # short, nothing to copy
    prompts.append([1] + rng.integers(3, VOCAB, size=23).tolist())
    return prompts


class SteppingTime:
    """Stands in for the ``time`` module of a module that times itself (monkeypatch its ``time``):
    each perf_counter() call ``step`` seconds after the last."""

    def __init__(self, step: float = 1.0) -> None:
        self.step = step
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += self.step
        return self.now

    strftime = staticmethod(time.strftime)


class FakeClock:
    """``time.perf_counter`` where time passes only when :meth:`tick` is called."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def tick(self, module=None, args=None, output=None) -> None:
        """One second (also usable as a forward hook)."""
        self.now += 1.0


class RecordingStreamer(BaseStreamer):
    """A transformers streamer that records what it is given."""

    def __init__(self):
        self.puts: list[list[int]] = []
        self.first_shape = None
        self.ended = 0

    def put(self, value):
        if self.first_shape is None:
            self.first_shape = tuple(value.shape)
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ended += 1


class PromptLookupProposer:
    """A pure-Python stand-in for refdec.drafting.proposer.Proposer (same methods).

    Drafts from the context (prompt + accepted tokens) and optional references:
    the most recent earlier occurrence of the longest trailing n-gram
    (n = max_ngram .. 1) gives a chain; the second most recent occurrence (or a
    reference match) gives a second branch, merged into one trie. ``shape``
    picks what the trees look like: "chain" (one branch), "tree" (two
    branches), "wide" (up to four occurrences as branches).
    """

    source_names = ("context", "reference")

    def __init__(self, index=None, references=None, *, max_depth: int = 64, max_ngram: int = 3,
                 shape: str = "tree") -> None:
        self.references = [list(map(int, r)) for r in (references or [])]
        self.max_depth = max_depth
        self.max_ngram = max_ngram
        self.shape = shape
        self.context: list[int] = []
        self._match = {"context": 0, "reference": 0}

    def start(self, prompt_ids: np.ndarray) -> None:
        self.context = [int(t) for t in prompt_ids]

    def accept(self, tokens: np.ndarray) -> None:
        self.context.extend(int(t) for t in tokens)

    def _occurrences(self, doc: list[int], suffix: list[int], limit_end: int) -> list[int]:
        """End indices (exclusive) of occurrences of ``suffix`` in doc[:limit_end], most recent first."""
        n = len(suffix)
        ends = []
        for end in range(limit_end, n - 1, -1):
            if doc[end - n:end] == suffix:
                ends.append(end)
        return ends

    def _find(self):
        ctx = self.context
        branches = []  # (source_id, continuation)
        self._match = {"context": 0, "reference": 0}
        for n in range(min(self.max_ngram, len(ctx)), 0, -1):
            suffix = ctx[-n:]
            ends = [e for e in self._occurrences(ctx, suffix, len(ctx) - 1) if e < len(ctx)]
            if ends:
                self._match["context"] = n
                branches += [(0, ctx[e:e + self.max_depth]) for e in ends[:4]]
                break
        for ref in self.references:
            for n in range(min(self.max_ngram, len(ctx)), 0, -1):
                ends = self._occurrences(ref, ctx[-n:], len(ref))
                if ends:
                    self._match["reference"] = max(self._match["reference"], n)
                    branches.append((1, ref[ends[0]:ends[0] + self.max_depth]))
                    break
        return [b for b in branches if b[1]]

    def propose(self, max_nodes: int) -> DraftTree:
        branches = self._find()
        keep = {"chain": 1, "tree": 2, "wide": 4}[self.shape]
        branches = branches[:keep]
        return DraftTree.from_paths([cont for _, cont in branches], max_nodes, [source for source, _ in branches],
                                    source_names=self.source_names)


def lookup_factory(shape: str = "tree", max_ngram: int = 3):
    def factory(index, references, max_depth):
        return PromptLookupProposer(index, references, max_depth=max_depth, shape=shape, max_ngram=max_ngram)

    return factory


def char_tokenizer():
    """A character-level fast tokenizer with VOCAB ids: 0 <pad>, 1 <bos>, 2 <eos>, then characters."""
    import string

    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = (" \n" + string.ascii_letters + string.digits + string.punctuation)[: VOCAB - 3]
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2}
    vocab.update({c: i + 3 for i, c in enumerate(chars)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


def byte_tokenizer(byte_of: dict[int, int] | None = None):
    """A byte-level fast tokenizer (GPT-2 style byte alphabet, no merges): ids 0 <pad>, 1 <bos>,
    2 <eos>; ids 3..VOCAB-1 are single bytes, ``byte_of[id]`` where given, else printable ASCII
    in order; the other bytes follow at ids >= VOCAB. Decoding is not concatenative: a lone
    byte of a multi-byte UTF-8 character decodes to "\ufffd" until its last byte arrives."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    alphabet, extra = {}, 0
    for b in range(256):  # bytes_to_unicode: printable bytes map to themselves, the others past 255
        alphabet[b] = chr(b) if b in printable else chr(256 + extra)
        extra += b not in printable
    byte_of = dict(byte_of or {})
    pool = [b for b in range(0x21, 0x7F) if b not in byte_of.values()]
    for i in range(3, VOCAB):
        if i not in byte_of:
            byte_of[i] = pool.pop(0)
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2}
    vocab.update({alphabet[b]: i for i, b in byte_of.items()})
    for b in range(256):
        vocab.setdefault(alphabet[b], len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


def one_tree_inputs(tree: DraftTree, root_token: int, root_pos: int, spec, device="cpu"):
    """refdec.transformers.masks.tree_step_inputs for one ``tree`` below ``root_token`` over a cache
    holding the ``root_pos`` tokens before it (positions 0 .. root_pos - 1, no holes): batch size 1."""
    return tree_step_inputs([tree], np.array([root_token]), np.array([root_pos]),
                            np.ones((1, root_pos), dtype=bool), np.arange(root_pos, dtype=np.int64)[None],
                            spec, device)


def errors_in_threads(work, count: int = 4) -> list[BaseException]:
    """Runs ``work(k)`` for k in range(``count``) on as many threads at once; the exceptions raised."""
    import threading

    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            work(k)
        except Exception as error:  # noqa: BLE001  (returned to the caller)
            errors.append(error)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors
