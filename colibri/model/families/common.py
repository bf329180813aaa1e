"""What every family module shares: the `Family` record and the parts it is
made of (expert layouts, fused gate/up tensors, GGUF names), the tensor names
all families give the same way (Hugging Face and GGUF), and the readers of
config.json fields that refuse a bad value by name.

The family modules import this module; the registry (families/__init__.py)
imports the family modules. Imports: errors, file.format.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ...errors import ConversionError
from ...file.format import Description, Kind


@dataclass(frozen=True)
class Fused:
    """Rows [part * n, (part + 1) * n) of a 2-D tensor [2n, cols] that holds
    a gate and an up projection stacked (chunk(2) in the modeling file:
    part 0 the gate, part 1 the up)."""
    name: str
    part: int


@dataclass(frozen=True)
class ExpertLayout:
    """Where a layer's routed experts live, relative to `model.layers.L.`.
    `per_expert`: (gate, up, down) templates with {e}; `fused`: (gate_up,
    down) 3-D tensors [E, 2I, H] and [E, H, I] (transformers 5's layout and
    GraniteMoE's input_linear / output_linear). `marker` is a tensor whose
    presence identifies the layout."""
    router: str
    marker: str
    per_expert: tuple[str, str, str] | None = None
    fused: tuple[str, str] | None = None


@dataclass(frozen=True)
class GGUFNames:
    """How llama.cpp's GGUF files of a family say what its config.json says
    (colibri/model/gguf_in.py reads them). `arch` is `general.architecture`;
    `config` maps config.json keys to metadata keys after "ARCH." (the
    keys every family shares are GGUF_COMMON_CONFIG); `implied` are the
    config.json fields the architecture fixes in llama.cpp (e.g. whether
    top-k is renormalised: llama.cpp's graph decides it by architecture, so
    the file means that, whatever the original config said). `permuted_qk`:
    convert_hf_to_gguf.py permuted the rows of Q and K (LlamaModel.permute)
    for llama.cpp's interleaved RoPE; the reader undoes it. `selected_by`:
    for two families of one architecture, the metadata key whose presence
    (with a value > 0) picks this one."""
    arch: str
    config: dict
    implied: dict = field(default_factory=dict)
    permuted_qk: bool = False
    selected_by: str | None = None


@dataclass(frozen=True)
class Family:
    name: str                         # module name, e.g. "qwen2_moe"
    title: str                        # "Qwen2-MoE"
    architectures: tuple[str, ...]    # config.json "architectures" values
    model_types: tuple[str, ...]      # config.json "model_type" values
    checkpoints: tuple[str, ...]      # real checkpoints of the family (README)
    experts_keys: tuple[str, ...]     # config keys of the routed expert count
    intermediate_key: str             # config key of the routed expert width
    layouts: tuple[ExpertLayout, ...]  # tried in order, per layer
    describe: Callable[[dict], Description]  # config.json -> what it computes
    # Tensor names relative to "model.layers.L." for the kinds the
    # description may ask for (str, or Fused for a gate/up pair).
    shared: tuple = ()                # (SHARED_W1, SHARED_W3, SHARED_W2) sources
    shared_gate: str | None = None
    dense: tuple = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
    notes: str = ""                   # what Colibri needs for it (README)
    extra: dict = field(default_factory=dict)
    gguf: GGUFNames | None = None     # its GGUF files (colibri/model/gguf_in.py)


# Per-layer tensors every family names the same way (llama lineage).
LAYER_TENSORS = {
    Kind.ATTN_NORM: "input_layernorm.weight",
    Kind.WQ: "self_attn.q_proj.weight",
    Kind.WK: "self_attn.k_proj.weight",
    Kind.WV: "self_attn.v_proj.weight",
    Kind.WO: "self_attn.o_proj.weight",
    Kind.BQ: "self_attn.q_proj.bias",
    Kind.BK: "self_attn.k_proj.bias",
    Kind.BV: "self_attn.v_proj.bias",
    Kind.BO: "self_attn.o_proj.bias",
    Kind.Q_NORM: "self_attn.q_norm.weight",
    Kind.K_NORM: "self_attn.k_norm.weight",
    Kind.FFN_NORM: "post_attention_layernorm.weight",
}


# GGUF metadata keys (after "ARCH.") of the config.json fields every family
# has (llama.cpp's LLM_KV_* names, gguf-py constants.Keys).
GGUF_COMMON_CONFIG = {
    "hidden_size": "embedding_length",
    "num_hidden_layers": "block_count",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "max_position_embeddings": "context_length",
    "rope_theta": "rope.freq_base",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "num_experts_per_tok": "expert_used_count",
    "head_dim": "attention.key_length",
}

# GGUF tensor names (llama.cpp's gguf-py TENSOR_NAMES) per .colibri kind:
# per layer after "blk.L.", then the global ones. Routed experts are one
# 3-D tensor per matrix [E, rows, cols] (GGUF's ne reversed). (The pinned
# convert_hf_to_gguf.py's --fuse-gate-up-exps, ffn_gate_up_exps, exists for
# none of these architectures; such a tensor is refused as unexpected.)
GGUF_LAYER_TENSORS = {
    Kind.ATTN_NORM: "attn_norm.weight",
    Kind.WQ: "attn_q.weight",
    Kind.WK: "attn_k.weight",
    Kind.WV: "attn_v.weight",
    Kind.WO: "attn_output.weight",
    Kind.BQ: "attn_q.bias",
    Kind.BK: "attn_k.bias",
    Kind.BV: "attn_v.bias",
    Kind.BO: "attn_output.bias",
    Kind.Q_NORM: "attn_q_norm.weight",
    Kind.K_NORM: "attn_k_norm.weight",
    Kind.FFN_NORM: "ffn_norm.weight",
    Kind.ROUTER: "ffn_gate_inp.weight",
    Kind.EXPERT_W1: "ffn_gate_exps.weight",
    Kind.EXPERT_W3: "ffn_up_exps.weight",
    Kind.EXPERT_W2: "ffn_down_exps.weight",
    Kind.SHARED_W1: "ffn_gate_shexp.weight",
    Kind.SHARED_W3: "ffn_up_shexp.weight",
    Kind.SHARED_W2: "ffn_down_shexp.weight",
    Kind.SHARED_GATE: "ffn_gate_inp_shexp.weight",
    Kind.DENSE_W1: "ffn_gate.weight",
    Kind.DENSE_W3: "ffn_up.weight",
    Kind.DENSE_W2: "ffn_down.weight",
}
GGUF_GLOBAL_TENSORS = {
    Kind.EMBED: "token_embd.weight",
    Kind.FINAL_NORM: "output_norm.weight",
    Kind.LM_HEAD: "output.weight",
}


# --- config.json readers the family modules share -----------------------------

def flag(cfg: dict, key: str, default: bool) -> bool:
    v = cfg.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ConversionError(f"config.json: {key} = {v!r}, expected true or false")
    return v


def number(cfg: dict, key: str, default: float | None = None, positive: bool = True) -> float:
    v = cfg.get(key, default)
    if v is None:
        raise ConversionError(f"config.json: missing field {key!r}")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (positive and not v > 0):
        raise ConversionError(f"config.json: {key} = {v!r}, expected a positive number")
    return float(v)


def count(cfg: dict, key: str, default: int | None = None, minimum: int = 1) -> int:
    v = cfg.get(key, default)
    if v is None:
        raise ConversionError(f"config.json: missing field {key!r}")
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConversionError(f"config.json: {key} = {v!r}, expected an integer >= {minimum}")
    return v


def sparse_layers_rule(cfg: dict) -> tuple[int, ...]:
    """Qwen2-MoE / Qwen3-MoE: the dense layers, as the decoder layer decides
    (`layer not in mlp_only_layers and (layer + 1) % decoder_sparse_step ==
    0` is MoE)."""
    n = count(cfg, "num_hidden_layers")
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                             for x in only):
        raise ConversionError(f"config.json: mlp_only_layers = {only!r}, expected a list of "
                              "layer indices")
    step = count(cfg, "decoder_sparse_step", 1)
    return tuple(l for l in range(n) if l in only or (l + 1) % step != 0)


def refuse_sliding_window(cfg: dict) -> None:
    if cfg.get("use_sliding_window"):
        raise ConversionError("config.json: use_sliding_window is true; colibri's attention "
                              "has no sliding window")
