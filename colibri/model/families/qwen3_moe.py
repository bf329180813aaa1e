"""Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3-30B-A3B, Qwen3-235B-A22B.

RMSNorm over each head of q and of k (`q_norm`, `k_norm`, [head_dim]) before
RoPE; `head_dim` independent of hidden / heads; biases on every projection
with `attention_bias`; top-k renormalised with `norm_topk_prob` (true in the
released models); dense layers as Qwen2-MoE; no shared expert.
"""
from .common import Family, GGUFNames, count, flag, refuse_sliding_window, sparse_layers_rule
from .qwen2_moe import QWEN_LAYOUTS
from ...errors import ConversionError
from ...file.format import Description, Feat


def describe(cfg: dict) -> Description:
    refuse_sliding_window(cfg)
    f = Feat.QK_NORM_HEAD
    if flag(cfg, "norm_topk_prob", False):
        f |= Feat.ROUTER_RENORM
    if flag(cfg, "attention_bias", False):
        f |= Feat.BIAS_QKV | Feat.BIAS_O
    dense = sparse_layers_rule(cfg)
    if len(dense) == count(cfg, "num_hidden_layers"):
        raise ConversionError("config.json: mlp_only_layers / decoder_sparse_step make every "
                              "layer dense: this is not a Mixture-of-Experts model")
    if dense:
        f |= Feat.DENSE_LAYERS
    return Description(features=f,
                       dense_intermediate=count(cfg, "intermediate_size") if dense else 0,
                       dense_layers=dense)


FAMILY = Family(
    name="qwen3_moe", title="Qwen3-MoE",
    architectures=("Qwen3MoeForCausalLM",), model_types=("qwen3_moe",),
    checkpoints=("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-235B-A22B"),
    experts_keys=("num_experts", "num_local_experts"), intermediate_key="moe_intermediate_size",
    layouts=QWEN_LAYOUTS, describe=describe,
    notes="per-head q/k RMSNorm, free head_dim, optional attention_bias, dense layers",
    # llama.cpp's qwen3moe always renormalises top-k.
    gguf=GGUFNames(arch="qwen3moe", config={
        "num_experts": "expert_count", "moe_intermediate_size": "expert_feed_forward_length",
        "intermediate_size": "feed_forward_length"},
        implied={"norm_topk_prob": True}),
)
