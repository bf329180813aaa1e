"""Deterministic tiny .colibri models for firmware builds and the target
matrix, written straight from seeded numpy weights (no torch, no download),
with the weight scales of tests/golden_configs.py (logits of order one, so
errors show).

`python -m colibri.buildsteps.testmodel OUT.colibri [f32|int8] [SEED]`
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ..file import format as cformat
from ..file.format import Kind, ModelShape

# Small enough for qemu-ppc (about 65x slower than native) to run two
# prompts in well under a second, big enough for real routing: 4 experts
# top-2, grouped-query attention, two int8 groups per row.
FW_TINY = ModelShape(vocab=96, hidden=32, intermediate=64, max_seq_len=16,
                     n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                     n_experts=4, top_k=2, max_batch=1, group_size=16,
                     rope_theta=10000.0, rms_eps=1e-5)

PRESETS = {"f32": cformat.PRESET_F32, "int8": cformat.PRESET_INT8}


def make_model(path: str | Path, quant: str = "f32", seed: int = 0,
               shape: ModelShape = FW_TINY, byte_order: str = "little") -> Path:
    """Write a model of `shape` with seeded random weights: norms around 1,
    matrices std 1/sqrt(fan_in), embedding std 1, routers 2/sqrt(fan_in)."""
    if quant not in PRESETS:
        raise ValueError(f"quant {quant!r}: expected one of {', '.join(PRESETS)}")
    rng = np.random.default_rng(seed)
    with cformat.ColibriWriter(path, shape, PRESETS[quant], byte_order) as w:
        for kind, layer, expert in cformat.tensor_order(shape):
            rows, cols = cformat.expected_shape(shape, kind)
            if kind in (Kind.ATTN_NORM, Kind.FFN_NORM, Kind.FINAL_NORM):
                wt = 1.0 + 0.1 * rng.standard_normal((rows, cols))
            else:
                std = 1.0 / np.sqrt(cols)
                if kind == Kind.EMBED:
                    std = 1.0
                elif kind == Kind.ROUTER:
                    std = 2.0 / np.sqrt(cols)
                wt = std * rng.standard_normal((rows, cols))
            w.add(kind, layer, expert, wt.astype(np.float32))
    return Path(path)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(f"usage: python -m colibri.buildsteps.testmodel OUT.colibri [f32|int8] [SEED]")
    make_model(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "f32",
               int(sys.argv[3]) if len(sys.argv) > 3 else 0)
