"""GraniteMoeShared (GraniteMoeSharedForCausalLM): GraniteMoE plus a shared
SwiGLU expert of width `shared_intermediate_size` added to every token with
no gate; stored fused as `shared_mlp.input_linear` [2S, H] (gate rows, then
up) and `shared_mlp.output_linear` [H, S]. A size of 0 means no shared
expert (plain GraniteMoE).
"""
from .common import Family, Fused, GGUFNames, count
from .granitemoe import GRANITE_GGUF_CONFIG, GRANITE_LAYOUTS
from .granitemoe import describe as granite_describe


def describe(cfg: dict):
    return granite_describe(cfg, shared=count(cfg, "shared_intermediate_size", 0, minimum=0))


FAMILY = Family(
    name="granitemoe_shared", title="GraniteMoeShared",
    architectures=("GraniteMoeSharedForCausalLM",), model_types=("granitemoeshared",),
    checkpoints=("ibm-research/moe-7b-1b-active-shared-experts",),
    experts_keys=("num_local_experts",), intermediate_key="intermediate_size",
    layouts=GRANITE_LAYOUTS, describe=describe,
    shared=(Fused("shared_mlp.input_linear.weight", 0), Fused("shared_mlp.input_linear.weight", 1),
            "shared_mlp.output_linear.weight"),
    notes="GraniteMoE plus an ungated shared expert",
    # llama.cpp files it as granitemoe with a shared expert width.
    gguf=GGUFNames(arch="granitemoe", config={
        **GRANITE_GGUF_CONFIG, "shared_intermediate_size": "expert_shared_feed_forward_length"},
        permuted_qk=True, selected_by="expert_shared_feed_forward_length"),
)
