"""A tiny random llama model written as a GGUF file (the ``gguf`` package), for llama.cpp tests.

Float32 weights, 2 layers, a 64-wide residual stream and a byte-level SentencePiece-style
vocabulary (260 tokens: <unk>, <s>, </s>, <pad>, then the 256 bytes), so any text tokenizes.
Seeded: the same file for the same arguments.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

VOCAB = 260
BOS, EOS = 1, 2


def write_tiny_gguf(path: Path, *, seed: int = 0, n_embd: int = 64, n_layer: int = 2, n_head: int = 4,
                    n_head_kv: int = 2, n_ff: int = 128, n_ctx: int = 2048, scale: float = 0.08) -> Path:
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("refdec tiny test llama")
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_byte_vocab(writer, gguf)

    def weight(*shape, std=scale):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(VOCAB, n_embd, std=1.0))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", weight(VOCAB, n_embd, std=0.5))
    head_dim = n_embd // n_head
    for layer in range(n_layer):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{prefix}.attn_q.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"{prefix}.attn_k.weight", weight(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"{prefix}.attn_v.weight", weight(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"{prefix}.attn_output.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"{prefix}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"{prefix}.ffn_down.weight", weight(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_lfm2_gguf(path: Path, *, seed: int = 0, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                         n_ff: int = 128, l_cache: int = 3, layers: str = "ccac", n_ctx: int = 2048,
                         scale: float = 0.08) -> Path:
    """A tiny random LFM2 model (llama.cpp's ``lfm2`` architecture: LFM2's short gated convolutions
    beside attention), same vocabulary as :func:`write_tiny_gguf`. ``layers``: one letter a layer,
    ``c`` a short convolution (``l_cache`` inputs), ``a`` attention. A hybrid: llama.cpp keeps a
    recurrent state per sequence for the convolution layers."""
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "lfm2")
    writer.add_name("refdec tiny test lfm2")
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(len(layers))
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv([n_head_kv if kind == "a" else 0 for kind in layers])
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_uint32("lfm2.shortconv.l_cache", l_cache)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_byte_vocab(writer, gguf)

    def weight(*shape, std=scale):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    head_dim = n_embd // n_head
    writer.add_tensor("token_embd.weight", weight(VOCAB, n_embd, std=1.0))
    writer.add_tensor("token_embd_norm.weight", np.ones(n_embd, dtype=np.float32))  # LFM2's output norm
    writer.add_tensor("output.weight", weight(VOCAB, n_embd, std=0.5))
    for layer, kind in enumerate(layers):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        if kind == "a":
            writer.add_tensor(f"{prefix}.attn_q_norm.weight", np.ones(head_dim, dtype=np.float32))
            writer.add_tensor(f"{prefix}.attn_k_norm.weight", np.ones(head_dim, dtype=np.float32))
            writer.add_tensor(f"{prefix}.attn_q.weight", weight(n_embd, n_embd))
            writer.add_tensor(f"{prefix}.attn_k.weight", weight(n_head_kv * head_dim, n_embd))
            writer.add_tensor(f"{prefix}.attn_v.weight", weight(n_head_kv * head_dim, n_embd))
            writer.add_tensor(f"{prefix}.attn_output.weight", weight(n_embd, n_embd))
        else:
            writer.add_tensor(f"{prefix}.shortconv.conv.weight", weight(n_embd, l_cache, std=0.5))
            writer.add_tensor(f"{prefix}.shortconv.in_proj.weight", weight(3 * n_embd, n_embd, std=0.3))
            writer.add_tensor(f"{prefix}.shortconv.out_proj.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"{prefix}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"{prefix}.ffn_down.weight", weight(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_byte_vocab(writer, gguf) -> None:
    """:func:`write_tiny_gguf`'s byte-level vocabulary and chat template."""
    writer.add_tokenizer_model("llama")
    tokens = [b"<unk>", b"<s>", b"</s>", b"<pad>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * VOCAB)
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    writer.add_token_types(types + [gguf.TokenType.BYTE] * 256)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_add_bos_token(True)
    writer.add_chat_template("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                             "{% if add_generation_prompt %}assistant: {% endif %}")
