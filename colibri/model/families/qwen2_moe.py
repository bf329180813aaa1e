"""Qwen2-MoE (Qwen2MoeForCausalLM): Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B.

q/k/v biases (`qkv_bias`, true in every released model; o_proj has none); a
shared SwiGLU expert of width `shared_expert_intermediate_size` added to
every token, scaled by sigmoid(`shared_expert_gate` . x); routed experts of
width `moe_intermediate_size`; top-k probabilities renormalised only with
`norm_topk_prob` (false in the released models); layers in `mlp_only_layers`
or off the `decoder_sparse_step` are a dense SwiGLU of `intermediate_size`.
"""
from .common import (ExpertLayout, Family, GGUFNames, count, flag, refuse_sliding_window,
                     sparse_layers_rule)
from ...errors import ConversionError
from ...file.format import Description, Feat

QWEN_LAYOUTS = (
    ExpertLayout(router="mlp.gate.weight", marker="mlp.experts.gate_up_proj",
                 fused=("mlp.experts.gate_up_proj", "mlp.experts.down_proj")),
    ExpertLayout(router="mlp.gate.weight", marker="mlp.gate.weight",
                 per_expert=("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight",
                             "mlp.experts.{e}.down_proj.weight")),
)


def describe(cfg: dict) -> Description:
    refuse_sliding_window(cfg)
    f = Feat.SHARED_EXPERT | Feat.SHARED_GATE
    if flag(cfg, "norm_topk_prob", False):
        f |= Feat.ROUTER_RENORM
    if flag(cfg, "qkv_bias", True):  # transformers 4 configs: always biased
        f |= Feat.BIAS_QKV
    shared = count(cfg, "shared_expert_intermediate_size")
    dense = sparse_layers_rule(cfg)
    if len(dense) == count(cfg, "num_hidden_layers"):
        raise ConversionError("config.json: mlp_only_layers / decoder_sparse_step make every "
                              "layer dense: this is not a Mixture-of-Experts model")
    if dense:
        f |= Feat.DENSE_LAYERS
    return Description(features=f, shared_intermediate=shared,
                       dense_intermediate=count(cfg, "intermediate_size") if dense else 0,
                       dense_layers=dense)


FAMILY = Family(
    name="qwen2_moe", title="Qwen2-MoE",
    architectures=("Qwen2MoeForCausalLM",), model_types=("qwen2_moe",),
    checkpoints=("Qwen/Qwen1.5-MoE-A2.7B", "Qwen/Qwen2-57B-A14B"),
    experts_keys=("num_experts", "num_local_experts"), intermediate_key="moe_intermediate_size",
    layouts=QWEN_LAYOUTS, describe=describe,
    shared=("mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.up_proj.weight",
            "mlp.shared_expert.down_proj.weight"),
    shared_gate="mlp.shared_expert_gate.weight",
    notes="q/k/v biases, gated shared expert, top-k kept as softmax gave it, dense layers",
    # llama.cpp's qwen2moe never renormalises top-k and has no dense layers.
    gguf=GGUFNames(arch="qwen2moe", config={
        "num_experts": "expert_count", "moe_intermediate_size": "expert_feed_forward_length",
        "shared_expert_intermediate_size": "expert_shared_feed_forward_length",
        "intermediate_size": "feed_forward_length"},
        implied={"norm_topk_prob": False}),
)
