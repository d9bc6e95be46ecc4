"""Tiny random hybrid models (recurrent layers beside attention), built from configs, one per
family refdec verifies trees on: Gated DeltaNet (Qwen3.5, Qwen3.5-MoE, Qwen3-Next), the Mamba2
mixers (Mamba2, GraniteMoeHybrid, Bamba, Falcon-H1, Nemotron-H, Zamba2), LFM2's short
convolution (LFM2, LFM2-MoE); and Mamba (v1), which refdec refuses.

float64 like tiny_models' (transformers computes the recurrent kernels in float32 whatever the
dtype: tests/test_transformers_hybrid.py reports each comparison's argmax margin). The output
projection is scaled as in tiny_models so that greedy decoding loops on repetitive prompts.
"""

from __future__ import annotations

import torch

from tiny_models import INIT, VOCAB, _finish

_COMMON = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, max_position_embeddings=512,
               bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False, initializer_range=INIT)
_ATTN = dict(num_attention_heads=4, num_key_value_heads=2)
_DELTANET = dict(linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                 linear_conv_kernel_dim=4)  # Gated DeltaNet layers (Qwen3.5's dense model: 4 value heads)
_QWEN_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)


def _qwen3_5(seed):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    cfg = Qwen3_5TextConfig(**_COMMON, **_ATTN, **{**_DELTANET, "linear_num_value_heads": 4}, head_dim=16,
                            num_hidden_layers=4,
                            layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"])
    return Qwen3_5ForCausalLM(cfg)


def _qwen3_5_moe(seed):
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    torch.manual_seed(seed)
    cfg = Qwen3_5MoeTextConfig(**_COMMON, **_ATTN, **_DELTANET, **_QWEN_MOE, head_dim=16, num_hidden_layers=2,
                               layer_types=["linear_attention", "full_attention"])
    return Qwen3_5MoeForCausalLM(cfg)


def _qwen3_next(seed):
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3NextConfig(**_COMMON, **_ATTN, **_DELTANET, **_QWEN_MOE, head_dim=16, num_hidden_layers=2,
                          layer_types=["linear_attention", "full_attention"], decoder_sparse_step=1)
    return Qwen3NextForCausalLM(cfg)


def _lfm2(seed):
    from transformers import Lfm2Config, Lfm2ForCausalLM

    torch.manual_seed(seed)
    common = dict(_COMMON)
    common.pop("intermediate_size")
    cfg = Lfm2Config(**common, **_ATTN, num_hidden_layers=3, intermediate_size=96, block_auto_adjust_ff_dim=False,
                     layer_types=["conv", "full_attention", "conv"], conv_L_cache=3)
    return Lfm2ForCausalLM(cfg)


def _lfm2_moe(seed):
    from transformers import Lfm2MoeConfig, Lfm2MoeForCausalLM

    torch.manual_seed(seed)
    cfg = Lfm2MoeConfig(**_COMMON, **_ATTN, num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"],
                        conv_L_cache=3, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        num_dense_layers=1)
    return Lfm2MoeForCausalLM(cfg)


_MAMBA2 = dict(mamba_n_heads=4, mamba_d_head=24, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4,
               mamba_expand=2, mamba_chunk_size=16)


def _mamba2(seed):
    from transformers import Mamba2Config, Mamba2ForCausalLM

    torch.manual_seed(seed)
    cfg = Mamba2Config(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_heads=4, head_dim=24, n_groups=1,
                       state_size=16, conv_kernel=4, expand=2, chunk_size=16, bos_token_id=1, eos_token_id=2,
                       pad_token_id=0, tie_word_embeddings=False, initializer_range=INIT)
    return Mamba2ForCausalLM(cfg)


def _granitemoehybrid(seed):
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    torch.manual_seed(seed)
    cfg = GraniteMoeHybridConfig(**_COMMON, **_ATTN, num_hidden_layers=3,
                                 layer_types=["mamba", "attention", "mamba"], num_local_experts=4,
                                 num_experts_per_tok=2, shared_intermediate_size=32, **_MAMBA2)
    return GraniteMoeHybridForCausalLM(cfg)


def _bamba(seed):
    from transformers import BambaConfig, BambaForCausalLM

    torch.manual_seed(seed)
    cfg = BambaConfig(**_COMMON, **_ATTN, num_hidden_layers=3, attn_layer_indices=[1],
                      mamba_n_heads=4, mamba_d_head=24, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4,
                      mamba_expand=2, mamba_chunk_size=16)
    return BambaForCausalLM(cfg)


def _falcon_h1(seed):
    from transformers import FalconH1Config, FalconH1ForCausalLM

    torch.manual_seed(seed)
    cfg = FalconH1Config(**_COMMON, **_ATTN, head_dim=16, num_hidden_layers=2, mamba_n_heads=4, mamba_d_head=24,
                         mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16,
                         mamba_d_ssm=96)
    return FalconH1ForCausalLM(cfg)


def _nemotron_h(seed):
    from transformers import NemotronHConfig, NemotronHForCausalLM

    torch.manual_seed(seed)
    cfg = NemotronHConfig(**_COMMON, **_ATTN, head_dim=16, num_hidden_layers=4, hybrid_override_pattern="M*-M",
                          mamba_num_heads=4, mamba_head_dim=24, n_groups=1, ssm_state_size=16, conv_kernel=4,
                          expand=2, chunk_size=16)
    return NemotronHForCausalLM(cfg)


def _zamba2(seed):
    from transformers import Zamba2Config, Zamba2ForCausalLM

    torch.manual_seed(seed)
    cfg = Zamba2Config(**_COMMON, **_ATTN, num_hidden_layers=4, layers_block_type=["mamba", "hybrid", "mamba", "hybrid"],
                       mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_ngroups=1, mamba_headdim=24,
                       n_mamba_heads=4, attention_head_dim=12, num_mem_blocks=1, use_shared_attention_adapter=False,
                       use_mem_rope=True, chunk_size=16)
    return Zamba2ForCausalLM(cfg)


def _mamba(seed):
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(seed)
    cfg = MambaConfig(vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, state_size=8, expand=2, conv_kernel=4,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    return MambaForCausalLM(cfg)


# family name -> builder(seed) of an untrained model (before _finish)
BUILDERS = {
    "qwen3_5": _qwen3_5, "qwen3_5_moe": _qwen3_5_moe, "qwen3_next": _qwen3_next,
    "lfm2": _lfm2, "lfm2_moe": _lfm2_moe,
    "mamba2": _mamba2, "granitemoehybrid": _granitemoehybrid, "bamba": _bamba, "falcon_h1": _falcon_h1,
    "nemotron_h": _nemotron_h, "zamba2": _zamba2,
}
REFUSED = {"mamba": _mamba}


def tiny_hybrid(name: str, seed: int = 0, scale: float = 3.0):
    """The tiny float64 model of hybrid family ``name`` (a key of :data:`BUILDERS` or :data:`REFUSED`)."""
    builder = BUILDERS.get(name) or REFUSED[name]
    return _finish(builder(seed), scale)


_MOE = ("qwen3_5_moe", "qwen3_next", "lfm2_moe", "granitemoehybrid")  # grouped_mm takes no float64
_models: dict = {}


def hybrid(name: str):
    """:func:`tiny_hybrid` ``name`` built once per test session (MoE experts run eagerly: float64)."""
    if name not in _models:
        model = tiny_hybrid(name)
        if name in _MOE:
            model.set_experts_implementation("eager")
        _models[name] = model
    return _models[name]


def plain_greedy(model, prompt: list[int], new: int) -> tuple[list[int], float]:
    """``model.generate`` greedy (the prompt and ``new`` tokens) and the smallest top-1 / top-2 logit
    margin over its steps."""
    ids = torch.tensor([prompt])
    with torch.no_grad():  # the mask given: generate would take a prompt's token 0 (the pad id) for padding
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                             eos_token_id=None, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    margin = min(float(step[0].topk(2).values[0] - step[0].topk(2).values[1]) for step in out.scores)
    return out.sequences[0].tolist(), margin


def corrupted_reference(sequence: list[int], prompt_len: int, every: int = 9) -> list[int]:
    """The tail of ``sequence`` from 3 tokens before its prompt's end, one token in ``every`` replaced:
    drafts copied from it are accepted up to each corruption."""
    reference = sequence[prompt_len - 3:]
    for j in range(6, len(reference), every):
        reference[j] = (reference[j] + 1) % VOCAB
    return reference
