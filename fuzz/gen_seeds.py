"""Write the fuzzer's seed inputs: valid tiny .colibri files of every
quantisation, each followed by the harness's 16-byte control tail
(fuzz/fuzz_init_infer.c explains the tail).

    .venv/bin/python fuzz/gen_seeds.py OUT_DIR

Seeds: f32, int8, mixed per-kind dtypes (I16 embedding and router, I8
experts, F32 attention and lm_head, and the converse), big-endian f32 and
int8 (loaded through colibri_init, which swaps them), odd shapes (hidden 10,
group 4, 3 experts top-3, 5 heads over 1 KV head), a file carrying an
optional section of an unknown kind, and format version 2 files whose
descriptions cover every feature flag (biases, both q/k norms, clip_qkv,
shared expert with and without gate, the multipliers, a dense layer), and
encoder-decoder (ENC_DEC, RELU_FFN) files in both byte orders, and the block
types: `--quant q4`'s mix on narrow rows (Q5_0 with int8 fallbacks) and a
file holding Q4_0, Q5_0, Q4_K, Q5_K and Q6_K in both byte orders (BLOCKS_Q4: K blocks on
rows narrower than 256 columns, each row one padded block, so the file stays
under the fuzzer's -max_len). Weights are seeded random numbers; the files
are a few KB (the block ones about 16 KB) so the fuzzer runs thousands of
executions a second.
"""
from __future__ import annotations

import dataclasses
import struct
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from colibri.file import format as F  # noqa: E402
from colibri.file import storage  # noqa: E402
from colibri.file.format import DType, Kind, ModelShape  # noqa: E402

# Control-tail flags (fuzz_init_infer.c FL_*).
FIX_CRCS, MASK, RAW_IDS, DECODE, VIA_FILE, VERIFY, REWIND, NULL_MASK_DECODE = (
    1, 2, 4, 8, 16, 32, 64, 128)
TAIL = 16

TINY = ModelShape(vocab=17, hidden=16, intermediate=8, max_seq_len=8, n_layers=2,
                  n_heads=2, n_kv_heads=1, head_dim=4, n_experts=3, top_k=2,
                  max_batch=2, group_size=8, rope_theta=1e4, rms_eps=1e-5)
ODD = ModelShape(vocab=11, hidden=10, intermediate=6, max_seq_len=6, n_layers=1,
                 n_heads=5, n_kv_heads=1, head_dim=2, n_experts=3, top_k=3,
                 max_batch=3, group_size=4, rope_theta=1e6, rms_eps=1e-6)

# An encoder-decoder (Switch Transformers): 2 encoder + 2 decoder layers,
# n_kv_heads = n_heads, top-1, layers 1 and 3 MoE with capacity 2.
ENCDEC = ModelShape(vocab=19, hidden=12, intermediate=10, max_seq_len=8, n_layers=4,
                    n_heads=2, n_kv_heads=2, head_dim=4, n_experts=3, top_k=1,
                    max_batch=2, group_size=4, rope_theta=1e4, rms_eps=1e-6)
ENCDEC_DESC = F.Description(
    features=F.Feat.ENC_DEC | F.Feat.RELU_FFN | F.Feat.DENSE_LAYERS, dense_intermediate=10,
    attn_scale=1.0, dense_layers=(0, 2), encoder_layers=2, expert_capacity=2,
    decoder_start=0, lm_scale=12 ** -0.5)

MIXED_A = {**F.PRESET_F32, Kind.EMBED: DType.I16_ROW, Kind.ROUTER: DType.I16_ROW,
           **{k: DType.I8_GROUP for k in F.EXPERT_KINDS}}
# Format version 2: every feature flag in at least one seed.
V2_DESCRIPTIONS = {
    "qwen2": F.Description(features=F.Feat.BIAS_QKV | F.Feat.SHARED_EXPERT | F.Feat.SHARED_GATE
                           | F.Feat.DENSE_LAYERS, shared_intermediate=12, dense_intermediate=10,
                           dense_layers=(1,)),
    "qwen3": F.Description(features=F.Feat.ROUTER_RENORM | F.Feat.QK_NORM_HEAD | F.Feat.BIAS_QKV
                           | F.Feat.BIAS_O),
    "olmoe": F.Description(features=F.Feat.QK_NORM_PROJ | F.Feat.CLIP_QKV, clip_qkv=2.0),
    "granite": F.Description(features=F.Feat.ROUTER_RENORM | F.Feat.SHARED_EXPERT,
                             shared_intermediate=6, embed_scale=4.0, attn_scale=0.2,
                             residual_scale=0.5, logits_divisor=3.0),
    # the LM head is the embedding: no LM_HEAD entry
    "tied": F.Description(features=F.Feat.ROUTER_RENORM | F.Feat.TIED_LM_HEAD),
}
# A tied embedding in int8 groups (what a tied model's int8 file holds).
TIED_I8 = {**F.PRESET_INT8, Kind.EMBED: DType.I8_GROUP}

# Every block type in one small file: the K types (256 columns a block) on
# 16-column rows are one padded block a row, valid (FORMAT.md 4) though not
# what the converter chooses, so the fuzzer reaches Q4_K and Q6_K in a file
# of ~16 KB. ONE_LAYER keeps it small: one layer, two experts.
BLOCKS_Q4 = {**F.PRESET_INT8, Kind.EMBED: DType.Q4_K, Kind.WQ: DType.Q5_K, Kind.WK: DType.Q6_K,
             Kind.WV: DType.Q4_0, Kind.WO: DType.Q5_0, Kind.EXPERT_W1: DType.Q4_K,
             Kind.EXPERT_W3: DType.Q8_0, Kind.EXPERT_W2: DType.Q4_0, Kind.LM_HEAD: DType.Q6_K}
ONE_LAYER = dataclasses.replace(TINY, n_layers=1, n_experts=2)

MIXED_B = {**F.PRESET_INT8, Kind.EMBED: DType.F32, Kind.ROUTER: DType.F32,
           Kind.LM_HEAD: DType.F32, **{k: DType.F32 for k in F.EXPERT_KINDS}}


def model_bytes(shape: ModelShape, preset, byte_order: str = "little", seed: int = 0,
                desc: F.Description | None = None, exact_dtypes: bool = False) -> bytes:
    """A valid file with seeded weights (scaled so logits are O(1)); with
    `desc`, the version 2 file of that description. `exact_dtypes`: every
    tensor in its preset dtype, without the writer's narrow-row fallback of
    the K block types (format.fit_dtype)."""
    rng = np.random.default_rng(seed)
    tensors = []
    rd = None if desc is None else desc.resolved(shape)
    order = [o for o in F.tensor_order(shape, rd) if o[0] != Kind.DESC]
    for kind, layer, expert in order:
        rows, cols = F.expected_shape(shape, kind, rd)
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        if kind in (Kind.ATTN_NORM, Kind.FFN_NORM, Kind.FINAL_NORM, Kind.Q_NORM, Kind.K_NORM,
                    Kind.XATTN_NORM, Kind.ENC_FINAL_NORM):
            w = 1 + 0.1 * w
        elif kind != Kind.EMBED:
            w /= np.sqrt(cols)
        tensors.append((kind, layer, expert, w.astype(np.float32)))
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.colibri"
        with F.ColibriWriter(path, shape, preset, byte_order, desc) as wr:
            for kind, layer, expert, w in tensors:
                if exact_dtypes:
                    dt = preset[kind]
                    wr.add_encoded(kind, layer, expert, dt,
                                   *storage.encode(w, dt, shape.group_size))
                else:
                    wr.add(kind, layer, expert, w)
        return path.read_bytes()


def block_bytes(byte_order: str = "little", seed: int = 0) -> bytes:
    """ONE_LAYER with BLOCKS_Q4: Q4_0, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K in one file of ~16 KB."""
    return model_bytes(ONE_LAYER, BLOCKS_Q4, byte_order, seed=seed, exact_dtypes=True)


def with_unknown_section(raw: bytes) -> bytes:
    """Insert an optional (CRITICAL clear) entry of kind 200 after EMBED,
    F32 [1, 8], so its stored size also equals the derived one."""
    cf = F.parse(raw)
    payload = np.arange(8, dtype="<f4").tobytes()
    extra = F.Entry(kind=200, dtype=0, flags=0, layer=F.NO_INDEX, expert=F.NO_INDEX,
                    rows=1, cols=8, offset=0, size=len(payload), crc=zlib.crc32(payload))
    entries = [cf.entries[0], extra] + cf.entries[1:]
    n = len(entries)
    body = bytearray(F.align64(64 + 40 * n))
    placed = []
    for e in entries:
        data = payload if e is extra else raw[e.offset:e.offset + e.size]
        placed.append(dataclasses.replace(e, offset=len(body)))
        body += data + bytes(F.align64(len(data)) - len(data))
    table = b"".join(F.pack_entry(e, "<") for e in placed)
    body[64:64 + len(table)] = table
    body[:64] = F.pack_header(cf.shape, n, zlib.crc32(table), "<")
    return bytes(body)


def tail(flags: int, batch: int = 0, seq: int = 3, mask: int = 0xFF,
         tokens=(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)) -> bytes:
    t = bytes([flags, batch, seq, mask]) + bytes(tokens)
    assert len(t) == TAIL
    return t


def seeds() -> dict[str, bytes]:
    """name -> seed input (model bytes + control tail)."""
    base = FIX_CRCS | DECODE | VERIFY
    f32 = model_bytes(TINY, F.PRESET_F32)
    int8 = model_bytes(TINY, F.PRESET_INT8, seed=1)
    out = {
        "seed-f32": f32 + tail(base),
        "seed-f32-masked-batch2": f32 + tail(base | MASK, batch=1, seq=5, mask=0b10110110),
        "seed-int8": int8 + tail(base | REWIND, seq=6),
        "seed-int8-raw-ids": int8 + tail(base | RAW_IDS,
                                         tokens=(0x80, 0xFF, 0, 1, 0x3F, 0x40, 0x7F, 3, 4, 5, 6, 7)),
        "seed-mixed-a": model_bytes(TINY, MIXED_A, seed=2) + tail(base | MASK, batch=1, mask=0b01),
        "seed-mixed-b": model_bytes(TINY, MIXED_B, seed=3) + tail(base | NULL_MASK_DECODE | MASK,
                                                                  mask=0),
        "seed-be-f32": model_bytes(TINY, F.PRESET_F32, "big", seed=4) + tail(base | VIA_FILE),
        "seed-be-int8": model_bytes(TINY, F.PRESET_INT8, "big", seed=5) + tail(base | VIA_FILE,
                                                                              batch=1),
        "seed-odd-int8": model_bytes(ODD, F.PRESET_INT8, seed=6) + tail(base | MASK, batch=2,
                                                                        seq=4, mask=0b1100),
        "seed-odd-f32-file": model_bytes(ODD, F.PRESET_F32, seed=7) + tail(base | VIA_FILE),
        "seed-unknown-section": with_unknown_section(f32) + tail(base),
        "seed-no-fix-crc": int8 + tail(DECODE | VERIFY),
        "seed-v2-qwen2-int8": model_bytes(TINY, F.PRESET_INT8, seed=8,
                                          desc=V2_DESCRIPTIONS["qwen2"]) + tail(base | MASK, batch=1,
                                                                                mask=0b110),
        "seed-v2-qwen3-f32": model_bytes(TINY, F.PRESET_F32, seed=9,
                                         desc=V2_DESCRIPTIONS["qwen3"]) + tail(base | REWIND, seq=6),
        "seed-v2-olmoe-be-f32": model_bytes(TINY, F.PRESET_F32, "big", seed=10,
                                            desc=V2_DESCRIPTIONS["olmoe"]) + tail(base | VIA_FILE),
        "seed-v2-granite-int8": model_bytes(ODD, F.PRESET_INT8, seed=11,
                                            desc=V2_DESCRIPTIONS["granite"]) + tail(base | MASK,
                                                                                    batch=2, seq=4,
                                                                                    mask=0b1100),
        "seed-v2-tied-int8": model_bytes(TINY, TIED_I8, seed=17, desc=V2_DESCRIPTIONS["tied"])
        + tail(base | MASK, batch=1, mask=0b101),
        "seed-v2-tied-be-int8": model_bytes(TINY, TIED_I8, "big", seed=18,
                                            desc=V2_DESCRIPTIONS["tied"]) + tail(base | VIA_FILE),
        "seed-v2-encdec-int8": model_bytes(ENCDEC, F.PRESET_INT8, seed=12, desc=ENCDEC_DESC)
        + tail(base | MASK, batch=1, seq=6, mask=0b0111111),
        "seed-v2-encdec-be-f32": model_bytes(ENCDEC, F.PRESET_F32, "big", seed=13,
                                             desc=ENCDEC_DESC) + tail(base | VIA_FILE, seq=5),
        # The block types: --quant q4 on narrow rows (Q5_0, int8), and all
        # five block types in both byte orders (the big-endian one through
        # colibri_init, which swaps only the blocks' fp16 scale fields).
        "seed-q4-mix": model_bytes(TINY, F.PRESET_Q4, seed=14) + tail(base | MASK, batch=1,
                                                                       mask=0b110),
        "seed-q4-blocks": block_bytes(seed=15) + tail(base | REWIND, seq=6),
        "seed-q4-blocks-be": block_bytes("big", seed=16) + tail(base | VIA_FILE, batch=1),
    }
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, data in seeds().items():
        (out / name).write_bytes(data)
    print(f"wrote {len(seeds())} seeds to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
