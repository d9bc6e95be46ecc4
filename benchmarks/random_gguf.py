"""Random models written as GGUF files (the ``gguf`` package): llama, LFM2, Qwen3.5 and Mamba2 architectures,
tiny for the llama.cpp tests (tests/conftest.py's fixtures), real-size for benchmarks/hybrid_llama_cpp.py.

Float32 weights, a few layers, a 64-wide residual stream and a byte-level SentencePiece-style
vocabulary (260 tokens: <unk>, <s>, </s>, <pad>, then the 256 bytes), so any text tokenizes.
Seeded: the same file for the same arguments. Real sizes take ``n_vocab`` (unused tokens past the
bytes) and ``q8`` (Q8_0 matrices).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

VOCAB = 260
BOS, EOS = 1, 2


def write_tiny_gguf(path: Path, *, seed: int = 0, n_embd: int = 64, n_layer: int = 2, n_head: int = 4,
                    n_head_kv: int = 2, n_ff: int = 128, n_ctx: int = 2048, scale: float = 0.08,
                    n_vocab: int = VOCAB, q8: bool = False) -> Path:
    model = _Model(path, "llama", "refdec tiny test llama", seed=seed, scale=scale, q8=q8, n_vocab=n_vocab,
                   n_ctx=n_ctx, n_embd=n_embd, n_layer=n_layer)
    writer = model.writer
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_layer_norm_rms_eps(1e-5)

    model.ends()
    head_dim = n_embd // n_head
    for layer in range(n_layer):
        prefix = f"blk.{layer}"
        model.put(f"{prefix}.attn_norm.weight", model.ones(n_embd))
        model.attention(prefix, n_embd, n_head_kv * head_dim)
        model.put(f"{prefix}.ffn_norm.weight", model.ones(n_embd))
        model.ffn(prefix, n_ff)
    return model.finish()


def write_tiny_lfm2_gguf(path: Path, *, seed: int = 0, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                         n_ff: int = 128, l_cache: int = 3, layers: str = "ccac", n_ctx: int = 2048,
                         scale: float = 0.08, n_vocab: int = VOCAB, q8: bool = False) -> Path:
    """A tiny random LFM2 model (llama.cpp's ``lfm2`` architecture: LFM2's short gated convolutions
    beside attention), same vocabulary as :func:`write_tiny_gguf`. ``layers``: one letter a layer,
    ``c`` a short convolution (``l_cache`` inputs), ``a`` attention. A hybrid: llama.cpp keeps a
    recurrent state per sequence for the convolution layers."""
    model = _Model(path, "lfm2", "refdec tiny test lfm2", seed=seed, scale=scale, q8=q8, n_vocab=n_vocab,
                   n_ctx=n_ctx, n_embd=n_embd, n_layer=len(layers))
    writer, weight = model.writer, model.weight
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv([n_head_kv if kind == "a" else 0 for kind in layers])
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_uint32("lfm2.shortconv.l_cache", l_cache)

    head_dim = n_embd // n_head
    model.ends(norm="token_embd_norm.weight")  # LFM2's output norm
    for layer, kind in enumerate(layers):
        prefix = f"blk.{layer}"
        model.put(f"{prefix}.attn_norm.weight", model.ones(n_embd))
        if kind == "a":
            model.put(f"{prefix}.attn_q_norm.weight", model.ones(head_dim))
            model.put(f"{prefix}.attn_k_norm.weight", model.ones(head_dim))
            model.attention(prefix, n_embd, n_head_kv * head_dim)
        else:
            model.put(f"{prefix}.shortconv.conv.weight", weight(n_embd, l_cache, std=0.5))
            model.put(f"{prefix}.shortconv.in_proj.weight", weight(3 * n_embd, n_embd, std=0.3))
            model.put(f"{prefix}.shortconv.out_proj.weight", weight(n_embd, n_embd))
        model.put(f"{prefix}.ffn_norm.weight", model.ones(n_embd))
        model.ffn(prefix, n_ff)
    return model.finish()


def write_tiny_qwen35_gguf(path: Path, *, seed: int = 0, n_embd: int = 64, n_layer: int = 4, n_head: int = 4,
                           n_head_kv: int = 2, head_dim: int = 16, n_ff: int = 128, d_state: int = 16,
                           n_k_heads: int = 2, n_v_heads: int = 4, d_conv: int = 4, interval: int = 4,
                           n_ctx: int = 2048, scale: float = 0.08, n_vocab: int = VOCAB,
                           q8: bool = False, rope_dim: int | None = None) -> Path:
    """A tiny random Qwen3.5 model (llama.cpp's ``qwen35`` architecture: Gated DeltaNet layers with a
    short convolution, one gated attention layer every ``interval``), same vocabulary as
    :func:`write_tiny_gguf`. A hybrid: llama.cpp keeps a convolution window and a delta-rule state per
    sequence for the linear-attention layers."""
    arch = "qwen35"
    model = _Model(path, arch, "refdec tiny test qwen35", seed=seed, scale=scale, q8=q8, n_vocab=n_vocab,
                   n_ctx=n_ctx, n_embd=n_embd, n_layer=n_layer)
    writer, weight = model.writer, model.weight
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    rope_dim = head_dim // 2 if rope_dim is None else rope_dim  # partial rotary (Qwen3.5: 64 of 256)
    writer.add_rope_dimension_count(rope_dim)
    pairs = rope_dim // 2  # Qwen3.5's interleaved M-RoPE sections ([11, 11, 10] of 32 pairs)
    writer.add_array(f"{arch}.rope.dimension_sections", [pairs - 2 * (pairs // 3), pairs // 3, pairs // 3, 0])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_uint32(f"{arch}.ssm.conv_kernel", d_conv)
    writer.add_uint32(f"{arch}.ssm.inner_size", d_state * n_v_heads)
    writer.add_uint32(f"{arch}.ssm.state_size", d_state)
    writer.add_uint32(f"{arch}.ssm.time_step_rank", n_v_heads)
    writer.add_uint32(f"{arch}.ssm.group_count", n_k_heads)
    writer.add_uint32(f"{arch}.full_attention_interval", interval)

    key_dim, value_dim = d_state * n_k_heads, d_state * n_v_heads
    model.ends()
    for layer in range(n_layer):
        prefix = f"blk.{layer}"
        model.put(f"{prefix}.attn_norm.weight", model.ones(n_embd))
        model.put(f"{prefix}.post_attention_norm.weight", model.ones(n_embd))
        if (layer + 1) % interval == 0:  # gated attention: the query projection carries the gate
            model.attention(prefix, 2 * n_head * head_dim, n_head_kv * head_dim, n_out=n_head * head_dim)
            model.put(f"{prefix}.attn_q_norm.weight", model.ones(head_dim))
            model.put(f"{prefix}.attn_k_norm.weight", model.ones(head_dim))
        else:
            model.put(f"{prefix}.attn_qkv.weight", weight(2 * key_dim + value_dim, n_embd, std=0.3))
            model.put(f"{prefix}.attn_gate.weight", weight(value_dim, n_embd))
            model.put(f"{prefix}.ssm_conv1d.weight", weight(2 * key_dim + value_dim, d_conv, std=0.5))
            model.put(f"{prefix}.ssm_dt.bias", weight(n_v_heads, std=0.5))
            model.put(f"{prefix}.ssm_a", -np.exp(weight(n_v_heads, std=0.5)))  # -exp(A_log)
            model.put(f"{prefix}.ssm_beta.weight", weight(n_v_heads, n_embd))
            model.put(f"{prefix}.ssm_alpha.weight", weight(n_v_heads, n_embd))
            model.put(f"{prefix}.ssm_norm.weight", model.ones(d_state))
            model.put(f"{prefix}.ssm_out.weight", weight(n_embd, value_dim))
        model.ffn(prefix, n_ff)
    return model.finish()


def write_tiny_mamba2_gguf(path: Path, *, seed: int = 0, n_embd: int = 64, n_layer: int = 2, d_state: int = 16,
                           n_heads: int = 8, n_group: int = 1, d_conv: int = 4, n_ctx: int = 2048,
                           scale: float = 0.08, n_vocab: int = VOCAB, q8: bool = False) -> Path:
    """A tiny random Mamba2 model (llama.cpp's ``mamba2`` architecture: recurrent throughout, a
    ``2 * n_embd``-wide SSD mixer of ``n_heads`` heads per layer), same vocabulary as
    :func:`write_tiny_gguf`. llama.cpp keeps no state snapshots for it (``n_rs_seq`` is 0)."""
    arch = "mamba2"
    d_inner = 2 * n_embd
    conv_dim = d_inner + 2 * n_group * d_state
    model = _Model(path, arch, "refdec tiny test mamba2", seed=seed, scale=scale, q8=q8, n_vocab=n_vocab,
                   n_ctx=n_ctx, n_embd=n_embd, n_layer=n_layer)
    writer, weight = model.writer, model.weight
    writer.add_head_count(0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_uint32(f"{arch}.ssm.conv_kernel", d_conv)
    writer.add_uint32(f"{arch}.ssm.inner_size", d_inner)
    writer.add_uint32(f"{arch}.ssm.state_size", d_state)
    writer.add_uint32(f"{arch}.ssm.time_step_rank", n_heads)
    writer.add_uint32(f"{arch}.ssm.group_count", n_group)

    model.ends()
    for layer in range(n_layer):
        prefix = f"blk.{layer}"
        model.put(f"{prefix}.attn_norm.weight", model.ones(n_embd))
        model.put(f"{prefix}.ssm_in.weight", weight(d_inner + conv_dim + n_heads, n_embd, std=0.3))
        model.put(f"{prefix}.ssm_conv1d.weight", weight(conv_dim, d_conv, std=0.5))
        model.put(f"{prefix}.ssm_conv1d.bias", weight(conv_dim))
        model.put(f"{prefix}.ssm_dt.bias", weight(n_heads, std=0.5))
        model.put(f"{prefix}.ssm_a", -np.exp(weight(n_heads, 1, std=0.5)))  # -exp(A_log)
        model.put(f"{prefix}.ssm_d", model.ones((n_heads, 1)))
        model.put(f"{prefix}.ssm_norm.weight", model.ones((n_group, d_inner // n_group)))
        model.put(f"{prefix}.ssm_out.weight", weight(n_embd, d_inner))
    return model.finish()


class _Model:
    """A GGUF file being written: the keys every writer sets (name, context, width, layers, file type,
    the byte vocabulary), seeded random weights and the tensors, written out by :meth:`finish`."""

    def __init__(self, path: Path, arch: str, name: str, *, seed: int, scale: float, q8: bool, n_vocab: int,
                 n_ctx: int, n_embd: int, n_layer: int) -> None:
        import gguf

        self.gguf, self.path, self.scale, self.q8 = gguf, path, scale, q8
        self.n_vocab, self.n_embd = n_vocab, n_embd
        self.rng = np.random.default_rng(seed)
        self.writer = writer = gguf.GGUFWriter(str(path), arch)
        writer.add_name(name)
        writer.add_context_length(n_ctx)
        writer.add_embedding_length(n_embd)
        writer.add_block_count(n_layer)
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.ALL_F32)
        _add_byte_vocab(writer, gguf, n_vocab)

    def weight(self, *shape, std: float | None = None) -> np.ndarray:
        """float32 ``shape``: normal draws times ``std`` (default: the writer's ``scale``)."""
        return (self.rng.standard_normal(shape) * (self.scale if std is None else std)).astype(np.float32)

    def ends(self, *, norm: str = "output_norm.weight") -> None:
        """The token embedding, the final norm (named ``norm``) and the LM head."""
        self.put("token_embd.weight", self.weight(self.n_vocab, self.n_embd, std=1.0))
        self.put(norm, self.ones(self.n_embd))
        self.put("output.weight", self.weight(self.n_vocab, self.n_embd, std=0.5))

    def attention(self, prefix: str, n_q: int, n_kv: int, *, n_out: int | None = None) -> None:
        """One layer's attention projections: query ``n_q`` rows, key and value ``n_kv`` rows each, the
        output projection back from ``n_out`` (default ``n_q``) to the residual width."""
        n_embd = self.n_embd
        self.put(f"{prefix}.attn_q.weight", self.weight(n_q, n_embd))
        self.put(f"{prefix}.attn_k.weight", self.weight(n_kv, n_embd))
        self.put(f"{prefix}.attn_v.weight", self.weight(n_kv, n_embd))
        self.put(f"{prefix}.attn_output.weight", self.weight(n_embd, n_q if n_out is None else n_out))

    def ffn(self, prefix: str, n_ff: int) -> None:
        """One layer's gated feed-forward (gate, up, down) of hidden width ``n_ff``."""
        self.put(f"{prefix}.ffn_gate.weight", self.weight(n_ff, self.n_embd))
        self.put(f"{prefix}.ffn_up.weight", self.weight(n_ff, self.n_embd))
        self.put(f"{prefix}.ffn_down.weight", self.weight(self.n_embd, n_ff))

    @staticmethod
    def ones(shape) -> np.ndarray:
        return np.ones(shape, dtype=np.float32)

    def put(self, name: str, array: np.ndarray) -> None:
        """Adds tensor ``name`` (float32), as Q8_0 when ``q8`` and it is a matrix whose rows split into
        Q8_0's 32-value blocks (the norms and vectors stay float32, as llama.cpp's quantizer keeps them)."""
        if self.q8 and array.ndim == 2 and array.shape[-1] % 32 == 0:
            kind = self.gguf.GGMLQuantizationType.Q8_0
            self.writer.add_tensor(name, self.gguf.quants.quantize(array, kind), raw_dtype=kind)
        else:
            self.writer.add_tensor(name, array)

    def finish(self) -> Path:
        self.writer.write_header_to_file()
        self.writer.write_kv_data_to_file()
        self.writer.write_tensors_to_file()
        self.writer.close()
        return self.path


def _add_byte_vocab(writer, gguf, n_vocab: int = VOCAB) -> None:
    """:func:`write_tiny_gguf`'s byte-level vocabulary and chat template; past its 260 tokens, unused
    ones up to ``n_vocab`` (a real model's vocabulary size, for its LM head's cost)."""
    writer.add_tokenizer_model("llama")
    tokens = [b"<unk>", b"<s>", b"</s>", b"<pad>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    tokens += [f"<unused{i}>".encode() for i in range(n_vocab - VOCAB)]
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * n_vocab)
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    writer.add_token_types(types + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.UNUSED] * (n_vocab - VOCAB))
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_add_bos_token(True)
    writer.add_chat_template("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                             "{% if add_generation_prompt %}assistant: {% endif %}")
