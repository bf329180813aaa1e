"""GraniteMoE (GraniteMoeForCausalLM): Granite 3.0/3.1 1B-A400M, 3B-A800M.

Embeddings times `embedding_multiplier`; attention scores times
`attention_multiplier` instead of 1/sqrt(head_dim); every residual branch
times `residual_multiplier`; logits divided by `logits_scaling`. The router
(`block_sparse_moe.router.layer`) takes the softmax of its top-k logits,
which are the renormalised top-k softmax probabilities. Experts are stored
fused: `input_linear` [E, 2I, H] (gate rows, then up) and `output_linear`
[E, H, I].
"""
from .common import ExpertLayout, Family, GGUFNames, flag, number
from ...file.format import Description, Feat

# GraniteMoE's config.json fields in its GGUF files (the four multipliers
# are llama.cpp's embedding/residual/attention/logit scales).
GRANITE_GGUF_CONFIG = {
    "num_local_experts": "expert_count", "intermediate_size": "feed_forward_length",
    "embedding_multiplier": "embedding_scale", "residual_multiplier": "residual_scale",
    "attention_multiplier": "attention.scale", "logits_scaling": "logit_scale",
}

GRANITE_LAYOUTS = (
    ExpertLayout(router="block_sparse_moe.router.layer.weight",
                 marker="block_sparse_moe.input_linear.weight",
                 fused=("block_sparse_moe.input_linear.weight",
                        "block_sparse_moe.output_linear.weight")),
    # transformers 5's in-memory names, if a checkpoint was saved that way.
    ExpertLayout(router="block_sparse_moe.router.weight",
                 marker="block_sparse_moe.experts.gate_up_proj",
                 fused=("block_sparse_moe.experts.gate_up_proj",
                        "block_sparse_moe.experts.down_proj")),
)


def describe(cfg: dict, shared: int = 0) -> Description:
    f = Feat.ROUTER_RENORM
    if flag(cfg, "attention_bias", False):
        f |= Feat.BIAS_QKV | Feat.BIAS_O
    if shared:
        f |= Feat.SHARED_EXPERT
    return Description(
        features=f, shared_intermediate=shared,
        embed_scale=number(cfg, "embedding_multiplier", 1.0),
        attn_scale=number(cfg, "attention_multiplier", 1.0),
        residual_scale=number(cfg, "residual_multiplier", 1.0),
        logits_divisor=number(cfg, "logits_scaling", 1.0))


FAMILY = Family(
    name="granitemoe", title="GraniteMoE",
    architectures=("GraniteMoeForCausalLM",), model_types=("granitemoe",),
    checkpoints=("ibm-granite/granite-3.1-1b-a400m-base", "ibm-granite/granite-3.1-3b-a800m-base"),
    experts_keys=("num_local_experts",), intermediate_key="intermediate_size",
    layouts=GRANITE_LAYOUTS, describe=describe,
    notes="embedding, attention, residual and logits multipliers; fused experts",
    gguf=GGUFNames(arch="granitemoe", config=GRANITE_GGUF_CONFIG, permuted_qk=True),
)
