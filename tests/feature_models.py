"""Random version-2 models that exercise every feature of the file's
description (docs/FORMAT.md 2-3), written with the format writer (no torch):
used by the feature tests of the reader, the reference and the C runtime.

Each description is one family's set of features on an awkward shape (odd
widths, one KV head, top-k of 3 among 5 experts, dense and MoE layers mixed,
multipliers far from 1); the weights are random with unit-scale activations.
"""
from __future__ import annotations

import numpy as np

from colibri.file import format as F
from colibri.file.format import Description, Feat, Kind

SHAPE = F.ModelShape(vocab=67, hidden=44, intermediate=26, max_seq_len=64, n_layers=3,
                     n_heads=4, n_kv_heads=1, head_dim=10, n_experts=5, top_k=3,
                     max_batch=4, group_size=16, rope_theta=1e4, rms_eps=1e-6)

# name -> description: the features of one family each.
DESCRIPTIONS = {
    # Qwen2-MoE: q/k/v biases, a gated shared expert, no renormalisation,
    # layer 1 dense (mlp_only_layers).
    "qwen2": Description(features=Feat.BIAS_QKV | Feat.SHARED_EXPERT | Feat.SHARED_GATE
                         | Feat.DENSE_LAYERS, shared_intermediate=34,
                         dense_intermediate=38, dense_layers=(1,)),
    # Qwen3-MoE: per-head q/k norm, head_dim free of hidden/heads, biases on
    # every projection, renormalised, layer 0 dense.
    "qwen3": Description(features=Feat.ROUTER_RENORM | Feat.QK_NORM_HEAD | Feat.BIAS_QKV
                         | Feat.BIAS_O | Feat.DENSE_LAYERS, dense_intermediate=30,
                         dense_layers=(0,)),
    # OLMoE: q/k norm over the whole projection, clip_qkv, no renormalisation.
    "olmoe": Description(features=Feat.QK_NORM_PROJ | Feat.CLIP_QKV, clip_qkv=1.5),
    # GraniteMoeShared: the four multipliers far from 1, an ungated shared
    # expert, renormalised.
    "granite": Description(features=Feat.ROUTER_RENORM | Feat.SHARED_EXPERT,
                           shared_intermediate=20, embed_scale=6.0, attn_scale=0.0625,
                           residual_scale=0.3, logits_divisor=4.0),
}


def write_model(path, desc: Description | None, shape=SHAPE, dtypes=None, seed=0,
                byte_order="little"):
    """A random model of `shape` computing `desc`; returns path."""
    rng = np.random.default_rng(seed)
    with F.ColibriWriter(path, shape, dtypes, byte_order, desc) as w:
        for kind, layer, expert in w.weights_order:
            rows, cols = F.expected_shape(shape, kind, w.desc)
            if kind in (Kind.ATTN_NORM, Kind.FFN_NORM, Kind.FINAL_NORM, Kind.Q_NORM,
                        Kind.K_NORM):
                m = 1 + 0.1 * rng.standard_normal((rows, cols))
            elif kind in (Kind.BQ, Kind.BK, Kind.BV, Kind.BO):
                m = 0.3 * rng.standard_normal((rows, cols))
            elif kind == Kind.EMBED:
                m = rng.standard_normal((rows, cols))
            else:
                m = rng.standard_normal((rows, cols)) / np.sqrt(cols)
            w.add(kind, layer, expert, m.astype(np.float32))
    return path
