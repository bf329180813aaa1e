"""OLMoE (OlmoeForCausalLM): OLMoE-1B-7B.

RMSNorm over the whole q and k projections (`q_norm` [heads * head_dim],
`k_norm` [kv_heads * head_dim]); then, with `clip_qkv`, q, k and v clamped to
+-clip_qkv; top-k probabilities used as the softmax gives them
(`norm_topk_prob` false); biases on every projection with `attention_bias`.
"""
from .common import Family, GGUFNames, count, flag, number
from .qwen2_moe import QWEN_LAYOUTS
from ...errors import ConversionError
from ...file.format import Description, Feat


def describe(cfg: dict) -> Description:
    f = Feat.QK_NORM_PROJ
    if flag(cfg, "norm_topk_prob", False):
        f |= Feat.ROUTER_RENORM
    if flag(cfg, "attention_bias", False):
        f |= Feat.BIAS_QKV | Feat.BIAS_O
    # q_norm is RMSNorm(hidden_size) in the modeling file: it normalises the
    # whole query only when heads * head_dim == hidden.
    hidden, heads = count(cfg, "hidden_size"), count(cfg, "num_attention_heads")
    if cfg.get("head_dim") not in (None, hidden // heads) or hidden % heads:
        raise ConversionError(f"config.json: OLMoE's q_norm spans hidden_size {hidden}, so "
                              f"head_dim must be hidden_size / num_attention_heads")
    clip = 0.0
    if cfg.get("clip_qkv") is not None:
        clip = number(cfg, "clip_qkv")
        f |= Feat.CLIP_QKV
    return Description(features=f, clip_qkv=clip)


FAMILY = Family(
    name="olmoe", title="OLMoE",
    architectures=("OlmoeForCausalLM",), model_types=("olmoe",),
    checkpoints=("allenai/OLMoE-1B-7B-0924", "allenai/OLMoE-1B-7B-0125"),
    experts_keys=("num_experts", "num_local_experts"), intermediate_key="intermediate_size",
    layouts=QWEN_LAYOUTS, describe=describe,
    notes="q/k RMSNorm over the whole projection, optional clip_qkv, top-k not renormalised",
    # llama.cpp's olmoe never renormalises top-k; clip_qkv travels as
    # attention.clamp_kqv when the converter wrote it.
    gguf=GGUFNames(arch="olmoe", config={"num_experts": "expert_count",
                                         "intermediate_size": "feed_forward_length",
                                         "clip_qkv": "attention.clamp_kqv"},
                   implied={"norm_topk_prob": False}),
)
