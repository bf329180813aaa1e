"""Tiny checkpoints of every non-Mixtral family, built locally from a config
with fixed seeds (no hub), on awkward shapes: odd widths, one KV head, top-k
of 3-4 among 5-10 experts, dense and MoE layers mixed, tied embeddings,
multipliers far from 1. Weights are re-drawn at a scale that gives logits of
order one, as tests/golden_configs.py does for Mixtral.
"""
from __future__ import annotations

import json
from pathlib import Path

# name -> (transformers config class, model class, config keyword arguments).
FAMILY_CONFIGS: dict[str, tuple[str, str, dict]] = {
    # Gated shared expert, q/k/v biases, norm_topk_prob false, layer 1 dense
    # (mlp_only_layers), 7 experts top-3, one KV head.
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        vocab_size=83, hidden_size=44, intermediate_size=52, moe_intermediate_size=26,
        shared_expert_intermediate_size=34, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, num_experts=7, num_experts_per_tok=3, mlp_only_layers=[1],
        norm_topk_prob=False, max_position_embeddings=64, rms_norm_eps=1e-6,
        tie_word_embeddings=False)),
    # Per-head q/k norm, head_dim 14 (hidden 36 / 3 heads is 12), attention
    # biases, layer 0 dense, 5 experts top-4 renormalised, tied embeddings.
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        vocab_size=71, hidden_size=36, intermediate_size=40, moe_intermediate_size=22,
        num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=1, head_dim=14,
        num_experts=5, num_experts_per_tok=4, mlp_only_layers=[0], norm_topk_prob=True,
        attention_bias=True, max_position_embeddings=64, rms_norm_eps=1e-6,
        tie_word_embeddings=True)),
    # q/k norm over the whole projection, clip_qkv that clips, 6 experts
    # top-3 not renormalised.
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(
        vocab_size=79, hidden_size=48, intermediate_size=30, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, num_experts=6, num_experts_per_tok=3,
        clip_qkv=1.2, norm_topk_prob=False, max_position_embeddings=64, rms_norm_eps=1e-5,
        tie_word_embeddings=False, pad_token_id=0, eos_token_id=1, bos_token_id=None)),
    # The four multipliers far from 1, fused experts, 8 experts top-3, tied.
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM", dict(
        vocab_size=89, hidden_size=40, intermediate_size=28, num_hidden_layers=2,
        num_attention_heads=5, num_key_value_heads=1, num_local_experts=8,
        num_experts_per_tok=3, embedding_multiplier=12.0, attention_multiplier=0.05,
        residual_multiplier=0.22, logits_scaling=6.0, max_position_embeddings=64,
        rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=0, bos_token_id=None,
        eos_token_id=None)),
    # GraniteMoE plus an ungated shared expert, 10 experts top-4.
    "granitemoe_shared": ("GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM", dict(
        vocab_size=61, hidden_size=52, intermediate_size=18, shared_intermediate_size=30,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        num_local_experts=10, num_experts_per_tok=4, embedding_multiplier=4.0,
        attention_multiplier=0.1, residual_multiplier=0.5, logits_scaling=3.0,
        max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
        pad_token_id=0, bos_token_id=None, eos_token_id=None)),
}
ROPE_THETA = {"qwen2_moe": 1e6, "qwen3_moe": 1e6, "olmoe": 1e4, "granitemoe": 1e4,
              "granitemoe_shared": 5e4}


def make_family(name: str, seed: int = 0):
    """transformers model (eval, float32, eager attention) of FAMILY_CONFIGS[name]."""
    import torch
    import transformers

    cfg_cls, model_cls, kwargs = FAMILY_CONFIGS[name]
    config = getattr(transformers, cfg_cls)(**kwargs)
    theta = ROPE_THETA[name]
    if getattr(config, "rope_parameters", None) is not None:
        config.rope_parameters["rope_theta"] = theta
    else:
        config.rope_theta = theta
    config._attn_implementation = "eager"
    # The modeling file's own loop over experts: the grouped-GEMM kernel
    # refuses odd widths (strides must be multiples of 16 bytes).
    config._experts_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).float().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for pname, p in sorted(model.named_parameters()):
            if pname.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1:  # norm weights: around 1
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:               # matrices: std 1/sqrt(fan_in) keeps unit scale
                fan_in = p.shape[-1]
                std = 1.0 / fan_in ** 0.5
                if "embed_tokens" in pname:
                    std = 1.0
                if pname.endswith(("mlp.gate.weight", "router.layer.weight",
                                   "shared_expert_gate.weight")):
                    std = 2.0 / fan_in ** 0.5  # routers with clear preferences
                p.copy_(std * torch.randn(p.shape, generator=gen))
    if config.tie_word_embeddings:
        model.tie_weights()
    return model


def save_family(model, out_dir: Path) -> Path:
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    json.loads((out_dir / "config.json").read_text())
    return out_dir
