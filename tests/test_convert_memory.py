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


# The same sizes as GraniteMoeShared stores them: each layer's experts in two
# fused 3-D tensors (input_linear [E, 2I, H] = 64 MiB bf16, 128 MiB as
# float32, output_linear [E, H, I]) and a shared expert with stacked gate/up
# rows. The converter must read one expert's slice at a time.
GRANITE_CONFIG = {
    **{k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")},
    "architectures": ["GraniteMoeSharedForCausalLM"], "model_type": "granitemoeshared",
    "shared_intermediate_size": INTER, "embedding_multiplier": 12.0,
    "attention_multiplier": 0.015625, "residual_multiplier": 0.22, "logits_scaling": 6.0,
}


def make_big_checkpoint(d: Path, layout: str = "mixtral") -> int:
    """Write the checkpoint as one shard per layer plus an index; returns its
    size in bytes. Memory: one layer's tensors at a time."""
    d.mkdir()
    fused = layout == "granite"
    (d / "config.json").write_text(json.dumps(GRANITE_CONFIG if fused else CONFIG))
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
        }
        if fused:
            t[L + "block_sparse_moe.router.layer.weight"] = ("BF16", _bf16(rng, (EXPERTS, HIDDEN), 0.06))
            t[L + "block_sparse_moe.input_linear.weight"] = (
                "BF16", _bf16(rng, (EXPERTS, 2 * INTER, HIDDEN), 0.03))
            t[L + "block_sparse_moe.output_linear.weight"] = (
                "BF16", _bf16(rng, (EXPERTS, HIDDEN, INTER), 0.02))
            t[L + "shared_mlp.input_linear.weight"] = ("BF16", _bf16(rng, (2 * INTER, HIDDEN), 0.03))
            t[L + "shared_mlp.output_linear.weight"] = ("BF16", _bf16(rng, (HIDDEN, INTER), 0.02))
        else:
            t[L + "block_sparse_moe.gate.weight"] = ("BF16", _bf16(rng, (EXPERTS, HIDDEN), 0.06))
        for e in range(EXPERTS if not fused else 0):
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


@pytest.fixture(scope="module")
def big_fused_checkpoint(tmp_path_factory):
    src = tmp_path_factory.mktemp("big-fused") / "hf"
    return src, make_big_checkpoint(src, "granite")


# The child reports its own peak RSS on its last stdout line: VmHWM of
# /proc/self/status, the high-water mark of the child's own address space.
# Not ru_maxrss: Linux carries it across execve, so a child forked from this
# (torch-laden) pytest process would report the parent's peak.
_CHILD = """
import sys
import numpy
import colibri.cli, colibri.model.convert, colibri.file.format, colibri.model.hf
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
@pytest.mark.parametrize("quant, jobs", [("int8", 1), ("f32", 1), ("q4", 2)])
def test_conversion_peak_memory_follows_largest_tensor(big_checkpoint, tmp_path, quant, jobs):
    """With --jobs 2 the q4 mix's expert tensors are searched on two worker
    processes (colibri/file/encode_pool.py); this process then holds up to
    jobs + 1 of them at once, read and not yet written."""
    src, model_bytes = big_checkpoint
    assert model_bytes >= 200e6
    out = tmp_path / "big.colibri"
    baseline, _ = _peak_rss([])
    start = time.monotonic()
    peak, proc = _peak_rss(["convert", str(src), "-o", str(out), "--quant", quant,
                            "--jobs", str(jobs)])
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
    # model_bytes * 2 (bf16 -> float32) = 400 MB. With workers, add the
    # tensors in flight (measured: 6.9x the largest tensor for int8, 8.6x
    # for q4 with two workers).
    in_flight = 0 if jobs == 1 else jobs + 1
    bound = (6 + in_flight) * LARGEST_F32 + 32 * 2**20
    assert extra < bound, f"extra {extra} bytes, bound {bound}"
    assert extra < model_bytes / (3 if jobs == 1 else 2)

    # The output is right: spot-check a few tensors against the bf16 source.
    from colibri.file import format as F
    from colibri.model import hf
    from colibri.file.format import Kind
    cf = F.read_file(out, check_crc=False)
    ck = hf.Checkpoint(src)
    for kind, layer, expert, name in [
            (Kind.EXPERT_W2, 1, 7, "model.layers.1.block_sparse_moe.experts.7.w2.weight"),
            (Kind.ROUTER, 0, None, "model.layers.0.block_sparse_moe.gate.weight")]:
        w = hf.read_tensor(ck.info(name)).reshape(F.expected_shape(cf.shape, kind))
        # int8 steps are at most amax / 127 over the whole tensor; f32 is
        # exact; Q4_K's 15 steps span at most 2 amax in a sub-block (the
        # router is int16 in the q4 mix)
        tol = {"int8": np.abs(w).max() / 127, "f32": 0, "q4": np.abs(w).max() / 7}[quant]
        assert np.abs(cf.dequantized(kind, layer, expert) - w).max() <= tol
    assert not cf.verify()


@pytest.mark.slow
def test_fused_expert_layout_streams_one_expert_at_a_time(big_fused_checkpoint, tmp_path):
    """GraniteMoeShared's fused experts (input_linear [E, 2I, H] is 128 MiB as
    float32): the converter reads one expert's rows of it at a time, so the
    peak stays at the same bound as for per-expert tensors."""
    src, model_bytes = big_fused_checkpoint
    out = tmp_path / "big.colibri"
    baseline, _ = _peak_rss([])
    peak, proc = _peak_rss(["convert", str(src), "-o", str(out), "--quant", "int8"])
    extra = peak - baseline
    print(f"\nfused {model_bytes / 1e6:.0f} MB bf16 -> int8: peak extra "
          f"{extra / 2**20:.1f} MiB = {extra / LARGEST_F32:.2f} x largest tensor")
    assert extra < 6 * LARGEST_F32 + 32 * 2**20, extra
    from colibri.file import format as F
    from colibri.model import hf
    from colibri.file.format import Kind
    cf = F.read_file(out, check_crc=False)
    ck = hf.Checkpoint(src)
    fused = hf.read_tensor(ck.info("model.layers.1.block_sparse_moe.input_linear.weight"),
                           7 * 2 * INTER * HIDDEN + INTER * HIDDEN, INTER * HIDDEN)
    w3 = fused.reshape(INTER, HIDDEN)  # expert 7's up rows
    assert np.abs(cf.dequantized(Kind.EXPERT_W3, 1, 7) - w3).max() <= np.abs(w3).max() / 127
    up = hf.read_tensor(ck.info("model.layers.0.shared_mlp.input_linear.weight"),
                        INTER * HIDDEN, INTER * HIDDEN).reshape(INTER, HIDDEN)
    assert np.abs(cf.dequantized(Kind.SHARED_W3, 0) - up).max() <= np.abs(up).max() / 127
    assert cf.desc.has(F.Feat.SHARED_EXPERT) and cf.desc.embed_scale == 12.0
    assert not cf.verify()
