"""Mixtral (MixtralForCausalLM): the computation version 1 files describe.

Top-k router weights renormalised, no biases, no q/k norm, scores scaled by
1/sqrt(head_dim). Experts per expert (`w1` gate, `w3` up, `w2` down; other
names through `--expert-map`) under `block_sparse_moe` or `mlp`, or fused as
transformers 5 holds them in memory (`mlp.experts.gate_up_proj` [E, 2I, H],
`mlp.experts.down_proj` [E, H, I]).
"""
from .common import ExpertLayout, Family, GGUFNames
from ...file.format import Description, Feat


def describe(cfg: dict) -> Description:
    return Description(features=Feat.ROUTER_RENORM)


FAMILY = Family(
    name="mixtral", title="Mixtral",
    architectures=("MixtralForCausalLM",), model_types=("mixtral",),
    checkpoints=("mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x22B-v0.1"),
    experts_keys=("num_local_experts",), intermediate_key="intermediate_size",
    layouts=(
        ExpertLayout(router="mlp.gate.weight", marker="mlp.experts.gate_up_proj",
                     fused=("mlp.experts.gate_up_proj", "mlp.experts.down_proj")),
        ExpertLayout(router="mlp.gate.weight", marker="mlp.gate.weight",
                     per_expert=("mlp.experts.{e}.{w1}.weight", "mlp.experts.{e}.{w3}.weight",
                                 "mlp.experts.{e}.{w2}.weight")),
        ExpertLayout(router="block_sparse_moe.gate.weight",
                     marker="block_sparse_moe.gate.weight",
                     per_expert=("block_sparse_moe.experts.{e}.{w1}.weight",
                                 "block_sparse_moe.experts.{e}.{w3}.weight",
                                 "block_sparse_moe.experts.{e}.{w2}.weight")),
    ),
    describe=describe,
    notes="version 1 file; sliding_window caps max_seq_len",
    extra={"sliding_window": True},
    # llama.cpp files Mixtral as `llama` with experts (a dense Llama has no
    # expert_count and is refused by name).
    gguf=GGUFNames(arch="llama", config={"num_local_experts": "expert_count",
                                         "intermediate_size": "feed_forward_length"},
                   permuted_qk=True),
)
