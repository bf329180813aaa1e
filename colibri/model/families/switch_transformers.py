"""Switch Transformers (SwitchTransformersForConditionalGeneration): the T5
encoder-decoder with top-1 MoE feed-forward layers (google/switch-base-8 ..
switch-c-2048).

What it computes is in colibri/model/reference_encdec.py. This module says where
each weight lives in the checkpoint (`hf_names`), which layers are sparse
(`sparse_layers`: `i % step == 1 or step == 1` with step = layers //
num_sparse_*_layers, exactly as SwitchTransformersStack decides), and reads
the shape from config.json (`encdec_shape`). Experts are
`...mlp.experts.expert_N.wi` / `wo` (ReLU, no gate): the .colibri kinds w1
and w2, as `set_expert_weight_mapping({"wi": "w1", "wo": "w2"})` names them.
"""
from __future__ import annotations

import numpy as np

from .common import count, flag, number
from ..reference_encdec import EncDecShape, EncDecWeights, DenseMatrix, position_bias_table
from ...errors import ConversionError

TITLE = "Switch Transformers"
ARCHITECTURES = ("SwitchTransformersForConditionalGeneration",)
MODEL_TYPES = ("switch_transformers",)
CHECKPOINTS = ("google/switch-base-8", "google/switch-base-16", "google/switch-large-128")

STACKS = ("enc", "dec")
HF_STACK = {"enc": "encoder", "dec": "decoder"}


def sparse_layers(n_layers: int, n_sparse: int) -> tuple[int, ...]:
    """The MoE layers of a stack, as SwitchTransformersConfig and
    SwitchTransformersStack place them. n_sparse 0 gives step = n_layers:
    no sparse layer, except that a 1-layer stack is then sparse (step 1),
    transformers' documented quirk, kept)."""
    step = n_layers // n_sparse if n_sparse > 0 else n_layers
    if step <= 0:
        return ()
    return tuple(i for i in range(n_layers) if i % step == 1 or step == 1)


def check_config(cfg: dict) -> None:
    """Refuse what the runtime does not compute, naming the field."""
    act = cfg.get("dense_act_fn", cfg.get("feed_forward_proj", "relu"))
    if act != "relu":
        raise ConversionError(f"config.json: dense_act_fn = {act!r}; colibri runs the "
                              "ReLU Switch Transformers (wi/wo experts), not gated-gelu")
    if flag(cfg, "router_bias", False):
        raise ConversionError("config.json: router_bias is true; colibri's router has no bias")
    if cfg.get("router_dtype", "float32") != "float32":
        raise ConversionError(f"config.json: router_dtype = {cfg.get('router_dtype')!r}; "
                              "colibri routes in float32")
    if not flag(cfg, "is_encoder_decoder", True):
        raise ConversionError("config.json: is_encoder_decoder is false")


def encdec_shape(cfg: dict, max_seq_len: int, max_batch: int) -> EncDecShape:
    check_config(cfg)
    d_model = count(cfg, "d_model")
    n_enc = count(cfg, "num_layers")
    n_dec = count(cfg, "num_decoder_layers", n_enc)
    tied = flag(cfg, "tie_word_embeddings", True)
    start = cfg.get("decoder_start_token_id", cfg.get("pad_token_id", 0))
    if start is None:
        start = 0
    return EncDecShape(
        vocab=count(cfg, "vocab_size"), d_model=d_model, d_kv=count(cfg, "d_kv"),
        n_heads=count(cfg, "num_heads"), d_ff=count(cfg, "d_ff"),
        n_experts=count(cfg, "num_experts"),
        expert_capacity=count(cfg, "expert_capacity", minimum=0),
        enc_layers=n_enc, dec_layers=n_dec,
        enc_sparse=sparse_layers(n_enc, count(cfg, "num_sparse_encoder_layers", 3, minimum=0)),
        dec_sparse=sparse_layers(n_dec, count(cfg, "num_sparse_decoder_layers", 3, minimum=0)),
        eps=number(cfg, "layer_norm_epsilon", 1e-6),
        lm_scale=float(np.float32(d_model ** -0.5)) if tied else 1.0,
        decoder_start=int(start), max_seq_len=max_seq_len, max_batch=max_batch)


def hf_names(shape: EncDecShape, tied: bool = True, wi: str = "wi", wo: str = "wo") -> dict:
    """Canonical name (reference_encdec.EncDecWeights) -> checkpoint tensor
    name. `wi`/`wo` are the experts' names in the checkpoint (the expert map).
    pos_bias entries name the bucket embedding [num_buckets, H]."""
    n = {"embed": "shared.weight",
         "lm_head": "shared.weight" if tied else "lm_head.weight"}
    for st in STACKS:
        hs = HF_STACK[st]
        n[f"{st}.pos_bias"] = f"{hs}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        n[f"{st}.final_norm"] = f"{hs}.final_layer_norm.weight"
        layers = shape.enc_layers if st == "enc" else shape.dec_layers
        sparse = shape.enc_sparse if st == "enc" else shape.dec_sparse
        for l in range(layers):
            b = f"{hs}.block.{l}.layer"
            n[f"{st}.{l}.attn_norm"] = f"{b}.0.layer_norm.weight"
            for m in ("q", "k", "v", "o"):
                n[f"{st}.{l}.w{m}"] = f"{b}.0.SelfAttention.{m}.weight"
            ff = 1
            if st == "dec":
                n[f"{st}.{l}.cross_norm"] = f"{b}.1.layer_norm.weight"
                for m in ("q", "k", "v", "o"):
                    n[f"{st}.{l}.c{m}"] = f"{b}.1.EncDecAttention.{m}.weight"
                ff = 2
            n[f"{st}.{l}.ffn_norm"] = f"{b}.{ff}.layer_norm.weight"
            if l in sparse:
                n[f"{st}.{l}.router"] = f"{b}.{ff}.mlp.router.classifier.weight"
                for e in range(shape.n_experts):
                    n[f"{st}.{l}.e{e}.wi"] = f"{b}.{ff}.mlp.experts.expert_{e}.{wi}.weight"
                    n[f"{st}.{l}.e{e}.wo"] = f"{b}.{ff}.mlp.experts.expert_{e}.{wo}.weight"
            else:
                n[f"{st}.{l}.wi"] = f"{b}.{ff}.mlp.wi.weight"
                n[f"{st}.{l}.wo_ff"] = f"{b}.{ff}.mlp.wo.weight"
    return n


def bias_tables(cfg: dict, rel_emb: dict, max_len: int) -> dict:
    """{"enc.pos_bias", "dec.pos_bias"} -> [H, 2*max_len-1] tables from the
    bucket embeddings rel_emb[st] [num_buckets, H]."""
    nb = count(cfg, "relative_attention_num_buckets", 32)
    md = count(cfg, "relative_attention_max_distance", 128)
    return {f"{st}.pos_bias": position_bias_table(rel_emb[st], st == "enc", nb, md, max_len)
            for st in STACKS}


def weights_from_state(cfg: dict, state: dict, shape: EncDecShape) -> EncDecWeights:
    """f32 weights for the reference from a checkpoint's tensors (name ->
    numpy array), e.g. a loaded model's state_dict."""
    tied = flag(cfg, "tie_word_embeddings", True)
    names = hf_names(shape, tied)
    t = {}
    for canon, hf in names.items():
        if hf not in state:
            raise ConversionError(f"checkpoint: tensor {hf} is missing")
        a = np.asarray(state[hf], dtype=np.float32)
        if canon.endswith("pos_bias"):
            continue
        t[canon] = DenseMatrix(a) if a.ndim == 2 and canon != "embed" else a
    t.update(bias_tables(cfg, {st: np.asarray(state[names[f"{st}.pos_bias"]], np.float32)
                               for st in STACKS}, shape.max_seq_len))
    return EncDecWeights(t)
