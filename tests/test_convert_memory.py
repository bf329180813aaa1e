"""The converter streams: its peak memory follows the largest tensor, not the
model. A ~200 MB bf16 checkpoint (numpy-generated, fixed seed, two shards) is
converted in a fresh subprocess, which reports its own peak RSS; a baseline
subprocess that only imports colibri and numpy is subtracted.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(),
                                reason="peak RSS is read from Linux's /proc/self/status")

from test_hf import write_safetensors

# Wide experts, few layers: 2 layers x 8 experts x 3 x [2048, 1024] bf16 =
# 201 MB of experts; the largest tensor is [2048, 1024] = 8 MiB as float32.
HIDDEN, INTER, LAYERS, EXPERTS, VOCAB = 1024, 2048, 2, 8, 1024
HEADS, KV_HEADS, HEAD_DIM = 8, 2, 128
LARGEST_F32 = INTER * HIDDEN * 4

CONFIG = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
    "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTER,
    "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "num_local_experts": EXPERTS,
    "num_experts_per_tok": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"},
    "tie_word_embeddings": False, "hidden_act": "silu", "dtype": "bfloat16",
}


def _bf16(rng, shape, std):
    """Random bf16 bit patterns (truncated float32: fast, and exact to test)."""
    x = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def make_big_checkpoint(d: Path) -> int:
    """Write the checkpoint as one shard per layer plus an index; returns its
    size in bytes. Memory: one layer's tensors at a time."""
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIG))
    rng = np.random.default_rng(1234)
    weight_map = {}
    for layer in range(LAYERS):
        L = f"model.layers.{layer}."
        t = {
            L + "input_layernorm.weight": ("BF16", _bf16(rng, (HIDDEN,), 1)),
            L + "post_attention_layernorm.weight": ("BF16", _bf16(rng, (HIDDEN,), 1)),
            L + "self_attn.q_proj.weight": ("BF16", _bf16(rng, (HEADS * HEAD_DIM, HIDDEN), 0.03)),
            L + "self_attn.k_proj.weight": ("BF16", _bf16(rng, (KV_HEADS * HEAD_DIM, HIDDEN), 0.03)),
            L + "self_attn.v_proj.weight": ("BF16", _bf16(rng, (KV_HEADS * HEAD_DIM, HIDDEN), 0.03)),
            L + "self_attn.o_proj.weight": ("BF16", _bf16(rng, (HIDDEN, HEADS * HEAD_DIM), 0.03)),
            L + "block_sparse_moe.gate.weight": ("BF16", _bf16(rng, (EXPERTS, HIDDEN), 0.06)),
        }
        for e in range(EXPERTS):
            E = f"{L}block_sparse_moe.experts.{e}."
            t[E + "w1.weight"] = ("BF16", _bf16(rng, (INTER, HIDDEN), 0.03))
            t[E + "w3.weight"] = ("BF16", _bf16(rng, (INTER, HIDDEN), 0.03))
            t[E + "w2.weight"] = ("BF16", _bf16(rng, (HIDDEN, INTER), 0.02))
        if layer == 0:
            t["model.embed_tokens.weight"] = ("BF16", _bf16(rng, (VOCAB, HIDDEN), 1))
        if layer == LAYERS - 1:
            t["model.norm.weight"] = ("BF16", _bf16(rng, (HIDDEN,), 1))
            t["lm_head.weight"] = ("BF16", _bf16(rng, (VOCAB, HIDDEN), 0.03))
        shard = f"model-{layer + 1:05d}-of-{LAYERS:05d}.safetensors"
        write_safetensors(d / shard, t)
        weight_map.update(dict.fromkeys(t, shard))
        del t
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return sum(p.stat().st_size for p in d.glob("*.safetensors"))


@pytest.fixture(scope="module")
def big_checkpoint(tmp_path_factory):
    src = tmp_path_factory.mktemp("big") / "hf"
    return src, make_big_checkpoint(src)


# The child reports its own peak RSS on its last stdout line: VmHWM of
# /proc/self/status, the high-water mark of the child's own address space.
# Not ru_maxrss: Linux carries it across execve, so a child forked from this
# (torch-laden) pytest process would report the parent's peak.
_CHILD = """
import sys
import numpy
import colibri.cli, colibri.convert, colibri.format, colibri.hf
argv = sys.argv[1:]
rc = colibri.cli.main(argv) if argv else 0
with open("/proc/self/status") as f:
    print([line.split()[1] for line in f if line.startswith("VmHWM:")][0])
sys.exit(rc)
"""


def _peak_rss(args: list[str]) -> tuple[int, subprocess.CompletedProcess]:
    proc = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.split()[-1]) * 1024, proc


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["int8", "f32"])
def test_conversion_peak_memory_follows_largest_tensor(big_checkpoint, tmp_path, quant):
    src, model_bytes = big_checkpoint
    assert model_bytes >= 200e6
    out = tmp_path / "big.colibri"
    baseline, _ = _peak_rss([])
    start = time.monotonic()
    peak, proc = _peak_rss(["convert", str(src), "-o", str(out), "--quant", quant])
    elapsed = time.monotonic() - start
    extra = peak - baseline
    print(f"\n{model_bytes / 1e6:.0f} MB bf16 checkpoint -> {quant}: {elapsed:.1f} s, "
          f"peak RSS {peak / 2**20:.1f} MiB, baseline {baseline / 2**20:.1f} MiB, "
          f"extra {extra / 2**20:.1f} MiB = {extra / LARGEST_F32:.2f} x largest "
          f"tensor ({LARGEST_F32 / 2**20:.0f} MiB as float32)")
    # One progress line per layer for a checkpoint this size.
    assert proc.stderr.count("colibri convert: layer ") == LAYERS, proc.stderr
    # Quantising one tensor takes a few float32 temporaries of its size
    # (|w|, w / scale, rint); a converter holding the model would need
    # model_bytes * 2 (bf16 -> float32) = 400 MB.
    bound = 6 * LARGEST_F32 + 32 * 2**20
    assert extra < bound, f"extra {extra} bytes, bound {bound}"
    assert extra < model_bytes / 3

    # The output is right: spot-check a few tensors against the bf16 source.
    from colibri import format as F, hf
    from colibri.format import Kind
    cf = F.read_file(out, check_crc=False)
    ck = hf.Checkpoint(src)
    for kind, layer, expert, name in [
            (Kind.EXPERT_W2, 1, 7, "model.layers.1.block_sparse_moe.experts.7.w2.weight"),
            (Kind.ROUTER, 0, None, "model.layers.0.block_sparse_moe.gate.weight")]:
        w = hf.read_tensor(ck.info(name)).reshape(F.expected_shape(cf.shape, kind))
        # int8 steps are at most amax / 127 over the whole tensor; f32 is exact
        tol = np.abs(w).max() / 127 if quant == "int8" else 0
        assert np.abs(cf.dequantized(kind, layer, expert) - w).max() <= tol
    assert not cf.verify()
