"""Tiny Mixtral configurations for golden tests, and a builder for their
Hugging Face checkpoints.

Every checkpoint is generated locally (no hub) from a fixed seed, with weights
re-drawn at a scale that gives logits of order one: transformers' default
initialiser (std 0.02) would give near-zero logits and hide real errors.
"""
from __future__ import annotations

import json
from pathlib import Path

# name -> MixtralConfig keyword arguments. Keep them tiny: the same models run
# under qemu-ppc (about 65x slower than native) in the target matrix.
GOLDEN_CONFIGS: dict[str, dict] = {
    # The plain case: powers of two, grouped-query attention.
    "tiny": dict(vocab_size=96, hidden_size=32, intermediate_size=64,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 num_local_experts=4, num_experts_per_tok=2,
                 max_position_embeddings=64, rope_theta=1e6, rms_norm_eps=1e-5),
    # The awkward one: hidden not a multiple of 8, 5 heads, a single KV head,
    # 6 experts with top-3, odd vocabulary and intermediate sizes.
    "awkward": dict(vocab_size=83, hidden_size=60, intermediate_size=44,
                    num_hidden_layers=2, num_attention_heads=5, num_key_value_heads=1,
                    head_dim=12, num_local_experts=6, num_experts_per_tok=3,
                    max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-6),
    # More layers and experts, head_dim different from hidden / n_heads.
    "wide": dict(vocab_size=128, hidden_size=64, intermediate_size=96,
                 num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4,
                 head_dim=16, num_local_experts=8, num_experts_per_tok=2,
                 max_position_embeddings=64, rope_theta=5e5, rms_norm_eps=1e-5),
    # For the K block types (256 columns): hidden, q/kv projections and the
    # experts' width are multiples of 256, so `--quant q4` stores Q4_K and
    # Q6_K; intermediate 320 is not, so the experts' W2 falls back to Q4_0
    # in the same expert. Not among GOLDEN_NAMES (the three above).
    "k256": dict(vocab_size=96, hidden_size=256, intermediate_size=320,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=64, num_local_experts=4, num_experts_per_tok=2,
                 max_position_embeddings=64, rope_theta=1e6, rms_norm_eps=1e-5),
}


def make_mixtral(name: str, seed: int = 0):
    """Build a transformers MixtralForCausalLM for GOLDEN_CONFIGS[name] with
    deterministic weights of unit-scale activations. Returns the model (eval
    mode, float32)."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    kwargs = dict(GOLDEN_CONFIGS[name])
    theta = kwargs.pop("rope_theta")
    config = MixtralConfig(**kwargs, tie_word_embeddings=False)
    # transformers 5 keeps rope_theta in rope_parameters; 4 in rope_theta.
    if getattr(config, "rope_parameters", None) is not None:
        config.rope_parameters["rope_theta"] = theta
    else:
        config.rope_theta = theta
    torch.manual_seed(seed)
    model = MixtralForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for pname, p in sorted(model.named_parameters()):
            if p.dim() == 1:  # norm weights: around 1
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:             # matrices: std 1/sqrt(fan_in) keeps unit scale
                fan_in = p.shape[-1]
                std = 1.0 / fan_in ** 0.5
                if "embed_tokens" in pname:
                    std = 1.0
                if ".gate." in pname or pname.endswith("gate.weight"):
                    std = 2.0 / fan_in ** 0.5  # routers with clear preferences
                p.copy_(std * torch.randn(p.shape, generator=gen))
    return model


def save_mixtral(name: str, out_dir: Path, seed: int = 0, dtype: str = "float32",
                 max_shard_size: str | None = None) -> Path:
    """Save make_mixtral(name, seed) with save_pretrained into out_dir, in
    dtype float32, float16 or bfloat16, optionally sharded. Returns out_dir."""
    import torch

    model = make_mixtral(name, seed)
    model = model.to(getattr(torch, dtype))
    out_dir = Path(out_dir)
    kwargs = {}
    if max_shard_size:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(out_dir, **kwargs)
    json.loads((out_dir / "config.json").read_text())  # written and parseable
    return out_dir


if __name__ == "__main__":
    # `python tests/golden_configs.py NAME OUT_DIR [SEED]`: write a checkpoint
    # (used by scripts/demo.sh to make a model without any download).
    import sys

    if len(sys.argv) not in (3, 4) or sys.argv[1] not in GOLDEN_CONFIGS:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(GOLDEN_CONFIGS)}}} OUT_DIR [SEED]")
    save_mixtral(sys.argv[1], Path(sys.argv[2]), seed=int(sys.argv[3]) if len(sys.argv) == 4 else 0)
    print(f"wrote {sys.argv[1]} Mixtral checkpoint to {sys.argv[2]}")
