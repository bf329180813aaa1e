"""Read and write .colibri files (docs/FORMAT.md is the spec; this module and
src/include/colibri_format.h must agree, which a test checks).

Writer: `ColibriWriter` streams one tensor at a time (the converter's peak
memory is one tensor), `write_file` writes pre-built tensors.
Reader: `read_file` validates every field and offset before any data is used,
then (by default) every CRC, and raises FormatError / CRCError naming the field
or tensor and the value found.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import mmap
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

import numpy as np

from . import blocks, quant, storage
# The tensor table's dtype field: the storage types (FORMAT.md 4) live in
# storage.py, with their encoding; format.DType names the same class.
from .storage import BLOCK_TYPES, DType
from ..errors import CRCError, FileReadError, FormatError, VersionError

MAGIC = b"CLBR"
VERSION = 2          # the newest version this module reads and writes
VERSION_MIN = 1      # version 1 files (Mixtral, no description) still load
BOM = 0xFEFF
HEADER_SIZE = 64
ENTRY_SIZE = 40
ALIGN = 64
NO_INDEX = 0xFFFF
FLAG_CRITICAL = 0x01
U16_MAX = 0xFFFF
U32_MAX = 0xFFFFFFFF
U64_MAX = 0xFFFFFFFFFFFFFFFF

# Header layout after the byte-order-independent magic (FORMAT.md section 2).
# The byte-order character is prepended at use: "<" or ">".
HEADER_FIELDS = (
    # (name, struct code, offset)
    ("magic", "4s", 0),
    ("version", "H", 4),
    ("bom", "H", 6),
    ("vocab", "I", 8),
    ("hidden", "I", 12),
    ("intermediate", "I", 16),
    ("max_seq_len", "I", 20),
    ("n_layers", "H", 24),
    ("n_heads", "H", 26),
    ("n_kv_heads", "H", 28),
    ("head_dim", "H", 30),
    ("n_experts", "H", 32),
    ("top_k", "H", 34),
    ("max_batch", "H", 36),
    ("group_size", "H", 38),
    ("rope_theta", "f", 40),
    ("rms_eps", "f", 44),
    ("n_tensors", "I", 48),
    ("table_crc", "I", 52),
    ("flags", "I", 56),
    ("header_crc", "I", 60),
)
HEADER_STRUCT = "".join(code for _, code, _ in HEADER_FIELDS)
ENTRY_FIELDS = (
    ("kind", "H", 0),
    ("dtype", "B", 2),
    ("flags", "B", 3),
    ("layer", "H", 4),
    ("expert", "H", 6),
    ("rows", "I", 8),
    ("cols", "I", 12),
    ("offset", "Q", 16),
    ("size", "Q", 24),
    ("crc", "I", 32),
    ("reserved", "I", 36),
)
ENTRY_STRUCT = "".join(code for _, code, _ in ENTRY_FIELDS)

# Packing is checked against the documented sizes when the module loads, the
# way MCUboot's imgtool asserts its header layout.
assert struct.calcsize("<" + HEADER_STRUCT) == HEADER_SIZE
assert struct.calcsize("<" + ENTRY_STRUCT) == ENTRY_SIZE
for _fields in (HEADER_FIELDS, ENTRY_FIELDS):
    for (_n, _c, _o), (_n2, _c2, _o2) in zip(_fields, _fields[1:]):
        assert _o + struct.calcsize("<" + _c) == _o2, (_n, _n2)


class Kind(enum.IntEnum):
    EMBED = 1
    ATTN_NORM = 2
    WQ = 3
    WK = 4
    WV = 5
    WO = 6
    FFN_NORM = 7
    ROUTER = 8
    EXPERT_W1 = 9
    EXPERT_W3 = 10
    EXPERT_W2 = 11
    FINAL_NORM = 12
    LM_HEAD = 13
    # Version 2 (FORMAT.md 3): the description, then what features need.
    DESC = 14
    BQ = 15
    BK = 16
    BV = 17
    BO = 18
    Q_NORM = 19
    K_NORM = 20
    SHARED_GATE = 21
    SHARED_W1 = 22
    SHARED_W3 = 23
    SHARED_W2 = 24
    DENSE_W1 = 25
    DENSE_W3 = 26
    DENSE_W2 = 27
    # Encoder-decoder (ENC_DEC, FORMAT.md 3): T5 relative position bias per
    # distance, the decoder's cross-attention, the encoder's final norm.
    ENC_POS_BIAS = 28
    DEC_POS_BIAS = 29
    XATTN_NORM = 30
    XWQ = 31
    XWK = 32
    XWV = 33
    XWO = 34
    ENC_FINAL_NORM = 35


# Sections that are not tensors, by their kind (FORMAT.md: optional, never
# CRITICAL): the tokenizer (colibri/text/tokenizer.py packs it).
KIND_TOKENIZER = 0x0100
OPTIONAL_SECTIONS = {KIND_TOKENIZER: "TOKENIZER"}


class Feat(enum.IntFlag):
    """Feature flags: the header's flags field in version 2 (FORMAT.md 2)."""
    ROUTER_RENORM = 0x1
    QK_NORM_HEAD = 0x2
    QK_NORM_PROJ = 0x4
    BIAS_QKV = 0x8
    BIAS_O = 0x10
    SHARED_EXPERT = 0x20
    SHARED_GATE = 0x40
    CLIP_QKV = 0x80
    DENSE_LAYERS = 0x100
    RELU_FFN = 0x200        # experts and dense layers are W2 . relu(W1 . x): no W3
    ENC_DEC = 0x400         # encoder-decoder (Switch Transformers / T5), FORMAT.md 3
    TIED_LM_HEAD = 0x800    # no LM_HEAD: the LM head is EMBED, with its dtype


FEAT_ALL = 0xFFF
# What an encoder-decoder file may combine ENC_DEC with.
FEAT_ENC_DEC_ALLOWED = Feat.ENC_DEC | Feat.RELU_FFN | Feat.DENSE_LAYERS

# DESC words (float32, FORMAT.md 3); word DESC_LAYERS + l is layer l's kind.
DESC_WORDS = ("shared_intermediate", "dense_intermediate", "embed_scale", "attn_scale",
              "residual_scale", "logits_divisor", "clip_qkv", "reserved")
DESC_LAYERS = len(DESC_WORDS)
DESC_MAX_INTERMEDIATE = 1 << 24
# With ENC_DEC, these words follow the layer words (FORMAT.md 3).
DESC_ENCDEC_WORDS = ("encoder_layers", "expert_capacity", "decoder_start", "lm_scale",
                     "reserved4", "reserved5", "reserved6", "reserved7")


def desc_cols(n_layers: int, features: int) -> int:
    """Number of float32 words of the DESC section."""
    return DESC_LAYERS + n_layers + (len(DESC_ENCDEC_WORDS) if features & Feat.ENC_DEC else 0)




GLOBAL_KINDS = (Kind.EMBED, Kind.FINAL_NORM, Kind.LM_HEAD)
LAYER_KINDS = (Kind.ATTN_NORM, Kind.WQ, Kind.WK, Kind.WV, Kind.WO, Kind.FFN_NORM, Kind.ROUTER)
EXPERT_KINDS = (Kind.EXPERT_W1, Kind.EXPERT_W3, Kind.EXPERT_W2)

# Storage types each kind may use (FORMAT.md section 3).
ALLOWED_DTYPES: dict[Kind, tuple[DType, ...]] = {
    # EMBED: every dtype with a lookup and a product (TIED_LM_HEAD uses both)
    Kind.EMBED: (DType.F32, DType.I16_ROW, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.ATTN_NORM: (DType.F32,),
    Kind.WQ: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.WK: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.WV: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.WO: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.FFN_NORM: (DType.F32,),
    Kind.ROUTER: (DType.F32, DType.I16_ROW),
    Kind.EXPERT_W1: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.EXPERT_W3: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.EXPERT_W2: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.FINAL_NORM: (DType.F32,),
    Kind.LM_HEAD: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.DESC: (DType.F32,),
    Kind.BQ: (DType.F32,),
    Kind.BK: (DType.F32,),
    Kind.BV: (DType.F32,),
    Kind.BO: (DType.F32,),
    Kind.Q_NORM: (DType.F32,),
    Kind.K_NORM: (DType.F32,),
    Kind.SHARED_GATE: (DType.F32,),
    Kind.SHARED_W1: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.SHARED_W3: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.SHARED_W2: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.DENSE_W1: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.DENSE_W3: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.DENSE_W2: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.ENC_POS_BIAS: (DType.F32,),
    Kind.DEC_POS_BIAS: (DType.F32,),
    Kind.XATTN_NORM: (DType.F32,),
    Kind.XWQ: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.XWK: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.XWV: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.XWO: (DType.F32, DType.I8_GROUP, *BLOCK_TYPES),
    Kind.ENC_FINAL_NORM: (DType.F32,),
}
SHARED_KINDS = (Kind.SHARED_W1, Kind.SHARED_W3, Kind.SHARED_W2)
DENSE_KINDS = (Kind.DENSE_W1, Kind.DENSE_W3, Kind.DENSE_W2)

# `--quant` presets (FORMAT.md section 4). Norms are always F32.
PRESET_F32 = {k: DType.F32 for k in Kind}
PRESET_INT8 = dict(PRESET_F32)
PRESET_INT8.update({
    Kind.ROUTER: DType.I16_ROW,
    Kind.EMBED: DType.I16_ROW,
    Kind.LM_HEAD: DType.I8_GROUP,
    **{k: DType.I8_GROUP for k in (Kind.WQ, Kind.WK, Kind.WV, Kind.WO, *EXPERT_KINDS,
                                   Kind.XWQ, Kind.XWK, Kind.XWV, Kind.XWO,
                                   *SHARED_KINDS, *DENSE_KINDS)},
})

# `--quant q4`: the 4-bit mix (like llama.cpp's Q4_K_M: Q4_K, with Q6_K for
# the tensors most sensitive to quantisation). Rows narrower than a K block
# fall back per tensor (fit_dtype).
PRESET_Q4 = dict(PRESET_INT8)
# Measured by bench/sensitivity.py (KL removed per extra bit, one kind at a
# time): WV, WK and WO gain 10-20x more per bit from Q6_K than the experts,
# WQ 5x, and all four are small; the LM head next. With them in Q6_K the
# bench "small" Mixtral is about 4.8 bpw, llama.cpp's Q4_K_M of it 4.97
# (whose Q6_K on ffn_down in half the layers would cost us +0.29 bpw).
# bench/quality.py, WQ Q4_K -> Q6_K: KL 0.0111 -> 0.0104 on k256 (5.10
# bpw), 0.0153 -> 0.0151 on "mid" (5.00 bpw).
#
# The embedding Q6_K, the LM head Q5_K (llama.cpp: Q4_K and Q6_K). An
# embedding error enters the residual stream whole, and a lookup reads one
# row a token, so its bits cost no decode bandwidth (only file and resident
# bytes: +0.015 bits a weight on OLMoE-1B-7B); the LM head's product reads
# all of it every token. bench/quality.py, KL of the q4 mix per model (bits
# a weight; Q4_K_M's KL):
#   embedding and LM head Q4_K / Q6_K -> Q5_K / Q5_K: "mid" 0.0141 -> 0.0081
#     (0.0142), an 8-layer random model (hidden 512, vocab 8192) 0.065 ->
#     0.048 (0.065), the same bits; the LM head's lost bit costs 6 % / 1 %.
#   embedding Q5_K -> Q6_K: mid 0.0082 -> 0.0064 (4.88 -> 5.04 bpw; 0.0142
#     at 5.13), k256 0.0057 -> 0.0043 (5.16 -> 5.17; 0.0128), tiny 0.0050
#     -> 0.0030 (6.20 -> 6.37; 0.0055), wide 0.0128 -> 0.0053 (6.10 ->
#     6.15; 0.0115 at 6.17): on wide's 64-wide rows Q6_K falls back to
#     I8_GROUP (9 bits) where Q5_K fell to Q5_0, and the embedding had been
#     most of its error. The LM head at I8_GROUP as well: wide 0.0044 at
#     6.20 bpw, over Q4_K_M's bits.
# A tied matrix serves both uses: TIED_TYPE.
PRESET_Q4.update({
    Kind.EMBED: DType.Q6_K,
    Kind.LM_HEAD: DType.Q5_K,
    **{k: DType.Q4_K for k in (*EXPERT_KINDS, *SHARED_KINDS,
                               *DENSE_KINDS)},
    **{k: DType.Q6_K for k in (Kind.WQ, Kind.WK, Kind.WV, Kind.WO, Kind.XWQ, Kind.XWK,
                               Kind.XWV, Kind.XWO)},
})

# The storage type of a tied embedding (Feat.TIED_LM_HEAD: one matrix for the
# lookup and the LM head) per `--quant` preset: the type llama.cpp's
# llama-quantize gives a tied token_embd, its output's (Q6_K in Q4_K_M),
# since the product that reads every weight at every token is the sensitive
# use. --lm-head / --embedding override it (colibri/model/export.py).
TIED_TYPE = {"f32": DType.F32, "int8": DType.I8_GROUP, "q4": DType.Q6_K}

# A K block is 256 columns: on a row of another width the last block is
# partly padding (FORMAT.md 4), so a K type may cost more bits a weight than
# a type with blocks of 32 of at least its precision. The writer stores the
# tensor in the candidate of fewest bits a weight: the K type itself
# (padded) or, as llama.cpp's llama-quantize falls back, Q5_0 for Q4_K and
# Q5_K (llama.cpp: Q5_1 for Q5_K, which Colibri does not have) and
# I8_GROUP (Q8_0's values) for Q6_K, then I8_GROUP, or I16_ROW for a kind
# that has no I8_GROUP. Not Q4_0: with its float32 scale it is 5.0 bits,
# more than Q4_K for more error. A block type must not pad a row
# further: Q5_0 needs a multiple of 32 (the demo model's 112-wide W2 takes
# I8_GROUP, whose last group may be short; llama-quantize keeps it F16).
# So a 128- or 320-wide row takes Q5_0 for Q4_K (6.0 bits against 9.25 or
# 7.4 padded) and Qwen1.5-MoE's 1408-wide W2 stays Q4_K (5.05 bits).
NARROW_FALLBACK = {DType.Q4_K: (DType.Q5_0, DType.I8_GROUP),
                   DType.Q5_K: (DType.Q5_0, DType.I8_GROUP),
                   DType.Q6_K: (DType.I8_GROUP, DType.I16_ROW)}


def bits_per_weight(dtype: DType, cols: int, group_size: int = 32) -> float:
    """Stored bits per real weight of a row of `cols` columns (scales and a
    block type's padding included)."""
    dtype = DType(dtype)
    if blocks.is_block(dtype):
        return 8.0 * blocks.n_blocks(cols, dtype) * blocks.BLOCK_BYTES[dtype] / cols
    if dtype == DType.I8_GROUP:
        return 8.0 + 32.0 * -(-cols // group_size) / cols
    return {DType.F32: 32.0, DType.I16_ROW: 16.0 + 32.0 / cols}[dtype]


def fit_dtype(dtype: DType, cols: int, kind: Kind | None = None) -> DType:
    """The storage type a tensor of `cols` columns gets for the kind's
    `dtype`: the dtype itself unless it is a K type and cols is not a
    multiple of 256; then the candidate of fewest bits a weight among the
    K type and its fallbacks (NARROW_FALLBACK) that fit the width (a block
    type of 32: cols a multiple of 32) and the kind allows."""
    dtype = DType(dtype)
    if dtype not in NARROW_FALLBACK or cols % blocks.BLOCK_COLS[dtype] == 0:
        return dtype
    allowed = ALLOWED_DTYPES.get(kind, ()) if kind is not None else None
    cands = [dtype] + [fb for fb in NARROW_FALLBACK[dtype]
                       if (not blocks.is_block(fb) or cols % blocks.BLOCK_COLS[fb] == 0)
                       and (allowed is None or fb in allowed)]
    return min(cands, key=lambda d: bits_per_weight(d, cols))   # ties: the earlier


def align64(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class ModelShape:
    """The model hyper-parameters stored in the header."""
    vocab: int
    hidden: int
    intermediate: int
    max_seq_len: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_experts: int
    top_k: int
    max_batch: int = 1
    group_size: int = 32
    rope_theta: float = 1e6
    rms_eps: float = 1e-5

    def validate(self) -> None:
        """Raise FormatError naming the first field out of its range."""
        limits = {"vocab": U32_MAX, "hidden": U32_MAX, "intermediate": U32_MAX,
                  "max_seq_len": U32_MAX, "n_layers": U16_MAX - 1, "n_heads": U16_MAX,
                  "n_kv_heads": U16_MAX, "head_dim": U16_MAX, "n_experts": U16_MAX - 1,
                  "top_k": U16_MAX, "max_batch": U16_MAX, "group_size": U16_MAX}
        for name, hi in limits.items():
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or not 1 <= v <= hi:
                raise FormatError(f"header field {name} = {v!r} is out of range 1..{hi}")
        if self.head_dim < 2 or self.head_dim % 2:
            raise FormatError(f"header field head_dim = {self.head_dim} must be even "
                              "(RoPE rotates the two halves of each head)")
        if self.n_heads % self.n_kv_heads:
            raise FormatError(f"header field n_kv_heads = {self.n_kv_heads} does not divide "
                              f"n_heads = {self.n_heads}")
        if self.top_k > self.n_experts:
            raise FormatError(f"header field top_k = {self.top_k} exceeds "
                              f"n_experts = {self.n_experts}")
        for name in ("rope_theta", "rms_eps"):
            v = float(getattr(self, name))
            f32 = float(np.float32(v))
            if not (math.isfinite(f32) and f32 > 0):
                raise FormatError(f"header field {name} = {v!r} must be finite and > 0 "
                                  "in float32")


def _f32(v: float) -> float:
    return float(np.float32(v))


@dataclass(frozen=True)
class Description:
    """What the model computes beyond its shape (FORMAT.md 2-3): feature flags
    and scalars, and which layers are dense. A family module fills one from a
    config.json; `default(shape)` is Mixtral, what every version 1 file means.
    Scalars are kept as the float32 the file stores."""
    features: int = int(Feat.ROUTER_RENORM)
    shared_intermediate: int = 0
    dense_intermediate: int = 0
    embed_scale: float = 1.0
    attn_scale: float | None = None   # None: 1/sqrt(head_dim)
    residual_scale: float = 1.0
    logits_divisor: float = 1.0
    clip_qkv: float = 0.0
    dense_layers: tuple[int, ...] = ()
    # ENC_DEC only (0 / 1.0 otherwise): layers [0, encoder_layers) are the
    # encoder, the rest the decoder; top-1 expert capacity per sequence of one
    # call; the decoder's start token; the LM head's input scale.
    encoder_layers: int = 0
    expert_capacity: int = 0
    decoder_start: int = 0
    lm_scale: float = 1.0

    def resolved(self, shape: "ModelShape") -> "Description":
        """attn_scale filled in and every scalar rounded to float32."""
        a = self.attn_scale
        if a is None:
            a = 1.0 / math.sqrt(shape.head_dim)
        return dataclasses.replace(
            self, attn_scale=_f32(a), embed_scale=_f32(self.embed_scale),
            residual_scale=_f32(self.residual_scale),
            logits_divisor=_f32(self.logits_divisor), clip_qkv=_f32(self.clip_qkv),
            dense_layers=tuple(sorted(set(int(l) for l in self.dense_layers))),
            lm_scale=_f32(self.lm_scale))

    @staticmethod
    def default(shape: "ModelShape") -> "Description":
        return Description().resolved(shape)

    def has(self, flag: Feat) -> bool:
        return bool(self.features & flag)

    def is_dense(self, layer: int) -> bool:
        return layer in self.dense_layers

    def words(self, shape: "ModelShape") -> np.ndarray:
        """The DESC section's float32 words."""
        d = self.resolved(shape)
        w = np.zeros(desc_cols(shape.n_layers, d.features), dtype=np.float32)
        w[:DESC_LAYERS - 1] = [d.shared_intermediate, d.dense_intermediate, d.embed_scale,
                               d.attn_scale, d.residual_scale, d.logits_divisor, d.clip_qkv]
        for l in d.dense_layers:
            w[DESC_LAYERS + l] = 1.0
        if d.features & Feat.ENC_DEC:
            at = DESC_LAYERS + shape.n_layers
            w[at:at + 4] = [d.encoder_layers, d.expert_capacity, d.decoder_start, d.lm_scale]
        return w

    @staticmethod
    def from_words(features: int, words: np.ndarray, shape: "ModelShape") -> "Description":
        """Parse and check DESC words (FORMAT.md 3); FormatError names the word."""
        w = [float(x) for x in words[:DESC_LAYERS]]
        names = dict(zip(DESC_WORDS, w))

        def size_word(name, flag):
            v = names[name]
            if not features & flag:
                if v != 0.0:
                    raise FormatError(f"DESC {name} = {v!r}, must be 0 without "
                                      f"{Feat(flag).name}")
                return 0
            if not (1.0 <= v <= DESC_MAX_INTERMEDIATE and v == int(v)):
                raise FormatError(f"DESC {name} = {v!r}, must be an integer 1..2^24 with "
                                  f"{Feat(flag).name}")
            return int(v)
        shared = size_word("shared_intermediate", Feat.SHARED_EXPERT)
        dense = size_word("dense_intermediate", Feat.DENSE_LAYERS)
        for name, positive in (("embed_scale", False), ("attn_scale", True),
                               ("residual_scale", False), ("logits_divisor", False)):
            v = names[name]
            if not math.isfinite(v) or v == 0.0 or (positive and v < 0):
                raise FormatError(f"DESC {name} = {v!r}, must be finite and "
                                  f"{'> 0' if positive else 'not 0'}")
        clip = names["clip_qkv"]
        if features & Feat.CLIP_QKV:
            if not (math.isfinite(clip) and clip > 0):
                raise FormatError(f"DESC clip_qkv = {clip!r}, must be finite and > 0 with "
                                  "CLIP_QKV")
        elif clip != 0.0:
            raise FormatError(f"DESC clip_qkv = {clip!r}, must be 0 without CLIP_QKV")
        if words[DESC_LAYERS - 1].view(np.uint32) != 0:
            raise FormatError("DESC reserved word must be 0")
        kinds = words[DESC_LAYERS:DESC_LAYERS + shape.n_layers]
        bits = kinds.view(np.uint32)
        bad = np.flatnonzero((bits != 0) & (bits != 0x3F800000))
        if bad.size:
            raise FormatError(f"DESC layer {int(bad[0])}'s kind is {float(kinds[bad[0]])!r}, "
                              "must be 0 (MoE) or 1 (dense)")
        dense_layers = tuple(int(l) for l in np.flatnonzero(bits))
        if bool(dense_layers) != bool(features & Feat.DENSE_LAYERS):
            raise FormatError(f"DESC lists {len(dense_layers)} dense layers but the "
                              f"DENSE_LAYERS flag is {'set' if features & Feat.DENSE_LAYERS else 'clear'}")
        enc = Description._encdec_words(features, words[DESC_LAYERS + shape.n_layers:], shape)
        return Description(features, shared, dense, names["embed_scale"], names["attn_scale"],
                           names["residual_scale"], names["logits_divisor"], clip, dense_layers,
                           **enc)

    @staticmethod
    def _encdec_words(features: int, words: np.ndarray, shape: "ModelShape") -> dict:
        """The ENC_DEC words after the layer words (FORMAT.md 3), checked."""
        if not features & Feat.ENC_DEC:
            return {}
        if features & ~FEAT_ENC_DEC_ALLOWED:
            raise FormatError(f"feature flags 0x{features:x}: ENC_DEC combines only with "
                              "RELU_FFN and DENSE_LAYERS")
        if shape.n_kv_heads != shape.n_heads or shape.top_k != 1:
            raise FormatError(f"ENC_DEC needs n_kv_heads = n_heads and top_k = 1, got "
                              f"n_kv_heads {shape.n_kv_heads}, n_heads {shape.n_heads}, "
                              f"top_k {shape.top_k}")
        w = dict(zip(DESC_ENCDEC_WORDS, (float(x) for x in words)))

        def integer(name, lo, hi):
            v = w[name]
            if not (lo <= v <= hi and v == int(v)):
                raise FormatError(f"DESC {name} = {v!r}, must be an integer {lo}..{hi}")
            return int(v)
        if shape.max_seq_len > 0x7FFFFFFF:
            raise FormatError(f"ENC_DEC max_seq_len {shape.max_seq_len} above 2^31 - 1 (the "
                              "position bias has 2 * max_seq_len - 1 columns)")
        enc = integer("encoder_layers", 1, shape.n_layers - 1)
        cap = integer("expert_capacity", 1, DESC_MAX_INTERMEDIATE)
        start = integer("decoder_start", 0, shape.vocab - 1)
        lm = w["lm_scale"]
        if not (math.isfinite(lm) and lm > 0):
            raise FormatError(f"DESC lm_scale = {lm!r}, must be finite and > 0")
        if np.any(np.asarray(words[4:8], dtype=np.float32).view(np.uint32) != 0):
            raise FormatError("DESC reserved words 4-7 after the layer words must be 0")
        return dict(encoder_layers=enc, expert_capacity=cap, decoder_start=start, lm_scale=lm)

    def is_decoder_layer(self, layer: int) -> bool:
        """ENC_DEC: layer is one of the decoder's (with cross-attention)."""
        return bool(self.features & Feat.ENC_DEC) and layer >= self.encoder_layers

    def validate(self, shape: "ModelShape") -> None:
        """Raise FormatError if the file could not state this description."""
        f = self.features
        if f & ~FEAT_ALL:
            raise FormatError(f"feature flags 0x{f:x} have unknown bits")
        if f & Feat.QK_NORM_HEAD and f & Feat.QK_NORM_PROJ:
            raise FormatError("QK_NORM_HEAD and QK_NORM_PROJ exclude each other")
        if f & Feat.SHARED_GATE and not f & Feat.SHARED_EXPERT:
            raise FormatError("SHARED_GATE needs SHARED_EXPERT")
        if any(not 0 <= l < shape.n_layers for l in self.dense_layers):
            raise FormatError(f"dense layers {self.dense_layers} outside 0..{shape.n_layers - 1}")
        Description.from_words(f, self.words(shape), shape)


@dataclass
class Tensor:
    """One stored tensor: values [rows, cols] (float32/int8/int16) and scales
    (float32 [rows, ngroups] for I8_GROUP, [rows] for I16_ROW, None for F32)."""
    kind: Kind
    layer: int | None
    expert: int | None
    dtype: DType
    rows: int
    cols: int
    values: np.ndarray
    scales: np.ndarray | None = None


@dataclass(frozen=True)
class Entry:
    """One tensor-table entry as stored (FORMAT.md section 3)."""
    kind: int
    dtype: int
    flags: int
    layer: int
    expert: int
    rows: int
    cols: int
    offset: int
    size: int
    crc: int
    reserved: int = 0

    def label(self) -> str:
        """Human name of the tensor, e.g. 'EXPERT_W2 layer 1 expert 3'."""
        try:
            name = Kind(self.kind).name
        except ValueError:
            name = OPTIONAL_SECTIONS.get(self.kind, f"unknown kind {self.kind}")
        parts = [name]
        if self.layer != NO_INDEX:
            parts.append(f"layer {self.layer}")
        if self.expert != NO_INDEX:
            parts.append(f"expert {self.expert}")
        return " ".join(parts)


def tensor_order(shape: ModelShape, desc: Description | None = None
                 ) -> list[tuple[Kind, int | None, int | None]]:
    """(kind, layer, expert) of every tensor, in file order (FORMAT.md 3, rule
    1). desc None: a version 1 file (Mixtral)."""
    d = desc
    order: list[tuple[Kind, int | None, int | None]] = []
    if d is not None:
        order.append((Kind.DESC, None, None))
    order.append((Kind.EMBED, None, None))
    encdec = d is not None and d.has(Feat.ENC_DEC)
    if encdec:
        order += [(Kind.ENC_POS_BIAS, None, None), (Kind.DEC_POS_BIAS, None, None)]
    expert_kinds = ((Kind.EXPERT_W1, Kind.EXPERT_W2) if d is not None and d.has(Feat.RELU_FFN)
                    else EXPERT_KINDS)
    for layer in range(shape.n_layers):
        if d is None:
            order += [(k, layer, None) for k in LAYER_KINDS]
            for e in range(shape.n_experts):
                order += [(k, layer, e) for k in EXPERT_KINDS]
            continue
        bias = d.has(Feat.BIAS_QKV)
        head = [Kind.ATTN_NORM, Kind.WQ, *([Kind.BQ] if bias else []), Kind.WK,
                *([Kind.BK] if bias else []), Kind.WV, *([Kind.BV] if bias else []), Kind.WO,
                *([Kind.BO] if d.has(Feat.BIAS_O) else [])]
        if d.features & (Feat.QK_NORM_HEAD | Feat.QK_NORM_PROJ):
            head += [Kind.Q_NORM, Kind.K_NORM]
        if d.is_decoder_layer(layer):
            head += [Kind.XATTN_NORM, Kind.XWQ, Kind.XWK, Kind.XWV, Kind.XWO]
        head.append(Kind.FFN_NORM)
        if d.is_dense(layer):
            head += ([Kind.DENSE_W1, Kind.DENSE_W2] if d.has(Feat.RELU_FFN)
                     else list(DENSE_KINDS))
            order += [(k, layer, None) for k in head]
            continue
        head.append(Kind.ROUTER)
        if d.has(Feat.SHARED_GATE):
            head.append(Kind.SHARED_GATE)
        if d.has(Feat.SHARED_EXPERT):
            head += list(SHARED_KINDS)
        order += [(k, layer, None) for k in head]
        for e in range(shape.n_experts):
            order += [(k, layer, e) for k in expert_kinds]
    if encdec:
        order.append((Kind.ENC_FINAL_NORM, None, None))
    order.append((Kind.FINAL_NORM, None, None))
    if not (d is not None and d.has(Feat.TIED_LM_HEAD)):
        order.append((Kind.LM_HEAD, None, None))
    return order


def expected_shape(shape: ModelShape, kind: Kind, desc: Description | None = None
                   ) -> tuple[int, int]:
    """(rows, cols) the header (and description) imply for a tensor of this kind."""
    h, q, kv = shape.hidden, shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim
    d = desc or Description()
    per_head = d.has(Feat.QK_NORM_HEAD)
    si, di = d.shared_intermediate, d.dense_intermediate
    return {
        Kind.EMBED: (shape.vocab, h),
        Kind.ATTN_NORM: (1, h),
        Kind.WQ: (q, h),
        Kind.WK: (kv, h),
        Kind.WV: (kv, h),
        Kind.WO: (h, q),
        Kind.FFN_NORM: (1, h),
        Kind.ROUTER: (shape.n_experts, h),
        Kind.EXPERT_W1: (shape.intermediate, h),
        Kind.EXPERT_W3: (shape.intermediate, h),
        Kind.EXPERT_W2: (h, shape.intermediate),
        Kind.FINAL_NORM: (1, h),
        Kind.LM_HEAD: (shape.vocab, h),
        Kind.DESC: (1, desc_cols(shape.n_layers, d.features)),
        Kind.BQ: (1, q),
        Kind.BK: (1, kv),
        Kind.BV: (1, kv),
        Kind.BO: (1, h),
        Kind.Q_NORM: (1, shape.head_dim if per_head else q),
        Kind.K_NORM: (1, shape.head_dim if per_head else kv),
        Kind.SHARED_GATE: (1, h),
        Kind.SHARED_W1: (si, h),
        Kind.SHARED_W3: (si, h),
        Kind.SHARED_W2: (h, si),
        Kind.DENSE_W1: (di, h),
        Kind.DENSE_W3: (di, h),
        Kind.DENSE_W2: (h, di),
        Kind.ENC_POS_BIAS: (shape.n_heads, 2 * shape.max_seq_len - 1),
        Kind.DEC_POS_BIAS: (shape.n_heads, shape.max_seq_len),
        Kind.XATTN_NORM: (1, h),
        Kind.XWQ: (q, h),
        Kind.XWK: (kv, h),
        Kind.XWV: (kv, h),
        Kind.XWO: (h, q),
        Kind.ENC_FINAL_NORM: (1, h),
    }[kind]


def section_size(dtype: int, rows: int, cols: int, group_size: int) -> int:
    """Exact section length in bytes (FORMAT.md section 4). Python integers do
    not overflow; the caller checks the result against 64-bit limits."""
    n = rows * cols
    if dtype == DType.F32:
        return 4 * n
    if dtype == DType.I8_GROUP:
        return align64(n) + 4 * rows * quant.n_groups(cols, group_size)
    if dtype == DType.I16_ROW:
        return align64(2 * n) + 4 * rows
    if blocks.is_block(dtype):
        return blocks.section_size(dtype, rows, cols)
    raise FormatError(f"unknown dtype {dtype}")


def _byte_char(byte_order: str) -> str:
    if byte_order not in ("little", "big"):
        raise FormatError(f"byte order {byte_order!r} must be 'little' or 'big'")
    return "<" if byte_order == "little" else ">"


def _section_bytes(values: np.ndarray, scales: np.ndarray | None, bc: str) -> bytes:
    """Serialise values then scales (at the next 64-byte boundary) in byte order bc."""
    v = np.ascontiguousarray(values)
    if v.dtype.names:   # blocks: only their fp16 fields have a byte order
        v = v.astype(v.dtype.newbyteorder(bc), copy=False)
    elif v.dtype.itemsize > 1:
        v = v.astype(v.dtype.newbyteorder(bc), copy=False)
    out = v.tobytes()
    if scales is not None:
        out += b"\0" * (align64(len(out)) - len(out))
        out += np.ascontiguousarray(scales, dtype=np.dtype("f4").newbyteorder(bc)).tobytes()
    return out


def pack_header(shape: ModelShape, n_tensors: int, table_crc: int, bc: str,
                flags: int = 0, version: int = 1) -> bytes:
    """The 64-byte header with its CRC."""
    values = dict(dataclasses.asdict(shape), magic=MAGIC, version=version, bom=BOM,
                  n_tensors=n_tensors, table_crc=table_crc, flags=flags, header_crc=0)
    body = struct.pack(bc + HEADER_STRUCT, *(values[name] for name, _, _ in HEADER_FIELDS))
    crc = zlib.crc32(body[:60])
    return body[:60] + struct.pack(bc + "I", crc)


def pack_entry(e: Entry, bc: str) -> bytes:
    return struct.pack(bc + ENTRY_STRUCT, *(getattr(e, name) for name, _, _ in ENTRY_FIELDS))


class ColibriWriter:
    """Streams a .colibri file: the layout (every offset and size) follows from
    the shape and the storage types, so sections are written as tensors arrive
    and the table and header are filled in at close.

        with ColibriWriter(path, shape, PRESET_INT8) as w:
            for kind, layer, expert in tensor_order(shape):
                w.add(kind, layer, expert, weights_float32_2d)

    `add_encoded` takes already-encoded values/scales (used to re-write a file
    byte for byte). Peak memory is one tensor and its encoding.
    """

    def __init__(self, path: str | os.PathLike, shape: ModelShape,
                 dtypes: dict[Kind, DType] | None = None, byte_order: str = "little",
                 desc: Description | None = None,
                 optional_sections: Iterable[tuple[int, bytes]] = ()):
        shape.validate()
        # Optional, non-critical sections (kind, bytes), e.g. the tokenizer:
        # written after the tensors, so the table knows their count up front.
        self.optional = [(int(k), bytes(d)) for k, d in optional_sections]
        self.path = Path(path)
        self.shape = shape
        # A file is written in the lowest version that states it: Mixtral's
        # computation is version 1 (no DESC), anything else version 2.
        if desc is not None:
            desc = desc.resolved(shape)
            desc.validate(shape)
            if desc == Description.default(shape):
                desc = None
        self.desc = desc
        self.version = 1 if desc is None else 2
        self.dtypes = dict(PRESET_F32 if dtypes is None else dtypes)
        for kind, dt in self.dtypes.items():
            if dt not in ALLOWED_DTYPES[kind]:
                allowed = ", ".join(d.name for d in ALLOWED_DTYPES[kind])
                raise FormatError(f"{kind.name} cannot be stored as {DType(dt).name} "
                                  f"(allowed: {allowed})")
        self.bc = _byte_char(byte_order)
        self.order = tensor_order(shape, desc)
        self.entries: list[Entry] = []
        self._offset = align64(HEADER_SIZE + ENTRY_SIZE * (len(self.order) + len(self.optional)))
        self._tmp = self.path.with_name(self.path.name + ".partial")
        self._f: BinaryIO | None = None

    def __enter__(self) -> "ColibriWriter":
        self._f = open(self._tmp, "wb")
        self._f.write(b"\0" * self._offset)  # header + table, filled at close
        if self.desc is not None:  # the description leads (FORMAT.md 3)
            self.add_encoded(Kind.DESC, None, None, DType.F32,
                             self.desc.words(self.shape).reshape(1, -1), None)
        return self

    @property
    def weights_order(self) -> list[tuple[Kind, int | None, int | None]]:
        """What the caller gives, in order: every tensor but the DESC the
        writer writes itself."""
        return [o for o in self.order if o[0] != Kind.DESC]

    def add(self, kind: Kind, layer: int | None, expert: int | None, weights: np.ndarray,
            importance: np.ndarray | None = None) -> None:
        """Encode float weights [rows, cols] with the kind's storage type
        (fit_dtype: K types fall back on narrow rows) and write them as the
        next section. `importance` [cols] weights the block quantisers'
        error per column (colibri/file/kquants.py)."""
        dt = fit_dtype(self.dtypes[kind], np.shape(weights)[-1], kind)
        values, scales = storage.encode(weights, dt, self.shape.group_size, importance)
        self.add_encoded(kind, layer, expert, dt, values, scales)

    def add_encoded(self, kind: Kind, layer: int | None, expert: int | None, dtype: DType,
                    values: np.ndarray, scales: np.ndarray | None) -> None:
        idx = len(self.entries)
        if idx >= len(self.order):
            raise FormatError(f"too many tensors: the model has {len(self.order)}")
        want = self.order[idx]
        if (kind, layer, expert) != want:
            raise FormatError(f"tensor {_label(kind, layer, expert)} given where the file "
                              f"order expects {_label(*want)}")
        if dtype not in ALLOWED_DTYPES[kind]:
            raise FormatError(f"{kind.name} cannot be stored as {DType(dtype).name}")
        rows, cols = expected_shape(self.shape, kind, self.desc)
        # Blocks are [rows, nb]; every other type's values [rows, cols].
        want_shape = (rows, blocks.n_blocks(cols, dtype)) if blocks.is_block(dtype) \
            else (rows, cols)
        if tuple(values.shape) != want_shape:
            raise FormatError(f"tensor {_label(kind, layer, expert)} has shape "
                              f"{tuple(values.shape)}, expected {want_shape}")
        data = _section_bytes(values, scales, self.bc)
        size = section_size(dtype, rows, cols, self.shape.group_size)
        if len(data) != size:
            raise FormatError(f"tensor {_label(kind, layer, expert)}: encoded {len(data)} "
                              f"bytes, the format requires {size}")
        assert self._f is not None, "use ColibriWriter as a context manager"
        self._f.write(data)
        self._f.write(b"\0" * (align64(size) - size))
        self.entries.append(Entry(
            kind=int(kind), dtype=int(dtype), flags=FLAG_CRITICAL,
            layer=NO_INDEX if layer is None else layer,
            expert=NO_INDEX if expert is None else expert,
            rows=rows, cols=cols, offset=self._offset, size=size, crc=zlib.crc32(data)))
        self._offset += align64(size)

    def __exit__(self, exc_type, exc, tb) -> None:
        f, self._f = self._f, None
        try:
            if exc_type is None and len(self.entries) != len(self.order):
                missing = self.order[len(self.entries)]
                raise FormatError(f"file incomplete: tensor {_label(*missing)} was never given")
            if exc_type is None:
                for kind, data in self.optional:
                    f.write(data)
                    f.write(b"\0" * (align64(len(data)) - len(data)))
                    self.entries.append(Entry(
                        kind=kind, dtype=0, flags=0, layer=NO_INDEX, expert=NO_INDEX, rows=1,
                        cols=len(data), offset=self._offset, size=len(data),
                        crc=zlib.crc32(data)))
                    self._offset += align64(len(data))
                table = b"".join(pack_entry(e, self.bc) for e in self.entries)
                header = pack_header(self.shape, len(self.entries), zlib.crc32(table), self.bc,
                                     0 if self.desc is None else self.desc.features,
                                     self.version)
                f.seek(0)
                f.write(header + table)
                f.close()
                os.replace(self._tmp, self.path)  # never leave a half-written OUT
        finally:
            if f is not None and not f.closed:
                f.close()
            if self._tmp.exists():
                self._tmp.unlink()


def write_file(path: str | os.PathLike, shape: ModelShape, tensors: Iterable[Tensor],
               byte_order: str = "little", desc: Description | None = None,
               optional_sections: Iterable[tuple[int, bytes]] = ()) -> Path:
    """Write already-encoded tensors (in tensor_order) to a .colibri file; the
    storage type of each comes from the tensor itself. A DESC among them is
    skipped: the writer writes `desc`'s. optional_sections: (kind, bytes)
    already encoded in `byte_order` (e.g. the tokenizer)."""
    with ColibriWriter(path, shape, None, byte_order, desc, optional_sections) as w:
        for t in tensors:
            if t.kind == Kind.DESC:
                continue
            w.add_encoded(t.kind, t.layer, t.expert, DType(t.dtype), t.values, t.scales)
    return Path(path)


def _label(kind, layer, expert) -> str:
    return Entry(int(kind), 0, 0, NO_INDEX if layer is None else layer,
                 NO_INDEX if expert is None else expert, 0, 0, 0, 0, 0).label()


# --------------------------------------------------------------------------
# Reader

# What to do, appended to the reader's messages (every error says what is
# wrong and what to do; the CLI, scons and the firmware tools show them as is).
FIX_DAMAGED = "the file is damaged: copy or convert it again"
FIX_TRUNCATED = "copy it again or re-convert"
FIX_MAKE = "make one with `colibri convert HF_DIR -o FILE.colibri`"
GGUF_MAGIC = b"GGUF"


def _too_short(size: int) -> FormatError:
    return FormatError(f"file is {size} bytes, shorter than the {HEADER_SIZE}-byte header: "
                       f"copy the file again, or {FIX_MAKE}")


def _truncated(size: int, full: int) -> str:
    return f"the file is truncated ({size} of {full} bytes): {FIX_TRUNCATED}"


class ColibriFile:
    """A validated .colibri file. Tensor data is read lazily from a memory map
    and returned as numpy arrays in native byte order."""

    def __init__(self, buf, shape: ModelShape, entries: list[Entry], byte_order: str,
                 version: int, path: Path | None = None, desc: Description | None = None):
        self._buf = buf
        self.shape = shape
        # What the model computes; a version 1 file is Mixtral.
        self.desc = desc if desc is not None else Description.default(shape)
        self.entries = entries
        self.byte_order = byte_order
        self.version = version
        self.path = path
        self._index = {(e.kind, e.layer, e.expert): e for e in entries
                       if e.kind in Kind._value2member_map_}

    @property
    def dtypes(self) -> dict[Kind, DType]:
        """Storage type per kind, as found in the file."""
        return {Kind(e.kind): DType(e.dtype) for e in self.entries
                if e.kind in Kind._value2member_map_}

    def entry(self, kind: Kind, layer: int | None = None, expert: int | None = None) -> Entry:
        key = (int(kind), NO_INDEX if layer is None else layer,
               NO_INDEX if expert is None else expert)
        try:
            return self._index[key]
        except KeyError:
            raise FormatError(f"no tensor {_label(kind, layer, expert)} in this file") from None

    def section(self, e: Entry) -> memoryview:
        return memoryview(self._buf)[e.offset:e.offset + e.size]

    def tensor(self, kind: Kind, layer: int | None = None, expert: int | None = None) -> Tensor:
        e = self.entry(kind, layer, expert)
        bc = "<" if self.byte_order == "little" else ">"
        raw = self.section(e)
        n = e.rows * e.cols
        if blocks.is_block(e.dtype):
            nb = blocks.n_blocks(e.cols, e.dtype)
            fdt = blocks.file_dtype(e.dtype, bc)
            values = np.frombuffer(raw, dtype=fdt, count=e.rows * nb).reshape(e.rows, nb)
            values = values.astype(blocks.BLOCK_DTYPES[e.dtype], copy=False)
            return Tensor(Kind(e.kind), layer, expert, DType(e.dtype), e.rows, e.cols,
                          values, None)
        vtype = {DType.F32: "f4", DType.I8_GROUP: "i1", DType.I16_ROW: "i2"}[DType(e.dtype)]
        vdt = np.dtype(vtype).newbyteorder(bc)
        values = np.frombuffer(raw, dtype=vdt, count=n).reshape(e.rows, e.cols)
        values = values.astype(vdt.newbyteorder("="), copy=False)
        scales = None
        sdt = np.dtype("f4").newbyteorder(bc)
        if e.dtype == DType.I8_GROUP:
            ng = quant.n_groups(e.cols, self.shape.group_size)
            scales = np.frombuffer(raw, dtype=sdt, count=e.rows * ng,
                                   offset=align64(n)).reshape(e.rows, ng)
        elif e.dtype == DType.I16_ROW:
            scales = np.frombuffer(raw, dtype=sdt, count=e.rows, offset=align64(2 * n))
        if scales is not None:
            scales = scales.astype(np.float32, copy=False)
        return Tensor(Kind(e.kind), layer, expert, DType(e.dtype), e.rows, e.cols, values, scales)

    def dequantized(self, kind: Kind, layer: int | None = None,
                    expert: int | None = None) -> np.ndarray:
        """The tensor as float32 [rows, cols]."""
        t = self.tensor(kind, layer, expert)
        return storage.decode(t.values, t.scales, t.dtype, self.shape.group_size, t.cols)

    def verify(self) -> list[str]:
        """Check every section's CRC; returns one message per bad section."""
        problems = []
        for e in self.entries:
            got = zlib.crc32(self.section(e))
            if got != e.crc:
                problems.append(f"CRC mismatch in {e.label()} (offset {e.offset}, {e.size} bytes):"
                                f" stored 0x{e.crc:08x}, computed 0x{got:08x}")
        return problems

    def tensors(self) -> Iterator[Tensor]:
        """Every known tensor in file order (encoded, not dequantised)."""
        for e in self.entries:
            if e.kind in Kind._value2member_map_:
                yield self.tensor(Kind(e.kind), None if e.layer == NO_INDEX else e.layer,
                                  None if e.expert == NO_INDEX else e.expert)

    def close(self) -> None:
        if isinstance(self._buf, mmap.mmap):
            self._buf.close()


def read_file(path: str | os.PathLike, check_crc: bool = True) -> ColibriFile:
    """Open, validate and (by default) CRC-check a .colibri file."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:  # mmap cannot map an empty file
                raise FormatError(f"{path}: {_too_short(0)}")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        fix = ("give the path of a .colibri file" if isinstance(exc, IsADirectoryError)
               else "check the path and permissions")
        raise FileReadError(f"{path}: cannot read: {exc.strerror}: {fix}") from None
    try:
        return parse(buf, check_crc=check_crc, path=path)
    except FormatError as exc:
        buf.close()
        raise type(exc)(f"{path}: {exc}") from None


def parse(buf, check_crc: bool = True, path: Path | None = None) -> ColibriFile:
    """Validate a whole file held in `buf` (bytes, mmap, memoryview), in the
    order FORMAT.md section 3 prescribes, and return a ColibriFile over it."""
    size = len(buf)
    if size < HEADER_SIZE:
        raise _too_short(size)
    head = bytes(buf[:HEADER_SIZE])
    if head[:4] == GGUF_MAGIC:
        raise FormatError("a GGUF file, not a .colibri file: convert it with "
                          "`colibri convert FILE.gguf -o FILE.colibri`")
    if head[:4] != MAGIC:
        raise FormatError(f"magic is {head[:4]!r}, expected {MAGIC!r}: not a .colibri file; "
                          f"{FIX_MAKE}")
    bom_bytes = head[6:8]
    if bom_bytes == b"\xff\xfe":
        bc, byte_order = "<", "little"
    elif bom_bytes == b"\xfe\xff":
        bc, byte_order = ">", "big"
    else:
        raise FormatError(f"byte-order mark is {bom_bytes.hex()}, expected fffe (little-endian)"
                          f" or feff (big-endian): {FIX_DAMAGED}")
    fields = dict(zip((n for n, _, _ in HEADER_FIELDS), struct.unpack(bc + HEADER_STRUCT, head)))
    version = fields["version"]
    if not VERSION_MIN <= version <= VERSION:
        if version > VERSION:
            raise VersionError(f"format version {version} is newer than the "
                               f"supported versions {VERSION_MIN}..{VERSION}: upgrade colibri")
        raise FormatError(f"format version {version} is not supported "
                          f"(this reader reads versions {VERSION_MIN}..{VERSION})")
    crc = zlib.crc32(head[:60])
    if crc != fields["header_crc"]:
        raise CRCError(f"header CRC mismatch: stored 0x{fields['header_crc']:08x}, "
                       f"computed 0x{crc:08x}: {FIX_DAMAGED}")
    flags = fields["flags"]
    if version == 1 and flags != 0:
        raise FormatError(f"header field flags = 0x{flags:x}, must be 0 in version 1")
    if flags & ~FEAT_ALL:
        raise FormatError(f"header field flags = 0x{flags:x}: unknown feature bits "
                          f"0x{flags & ~FEAT_ALL:x} (a newer colibri wrote the file?)")
    if flags & Feat.QK_NORM_HEAD and flags & Feat.QK_NORM_PROJ:
        raise FormatError(f"header field flags = 0x{flags:x}: QK_NORM_HEAD and QK_NORM_PROJ "
                          "exclude each other")
    if flags & Feat.SHARED_GATE and not flags & Feat.SHARED_EXPERT:
        raise FormatError(f"header field flags = 0x{flags:x}: SHARED_GATE without "
                          "SHARED_EXPERT")
    shape = ModelShape(**{f.name: fields[f.name] for f in dataclasses.fields(ModelShape)})
    shape.validate()
    n = fields["n_tensors"]
    if n == 0:
        raise FormatError("header field n_tensors = 0: the file holds no tensors")
    table_end = HEADER_SIZE + ENTRY_SIZE * n
    if table_end > size:
        raise FormatError(f"header field n_tensors = {n}: the table would end at byte "
                          f"{table_end}, past the end of the file ({size} bytes): the file "
                          f"is truncated or damaged; {FIX_TRUNCATED}")
    table = bytes(buf[HEADER_SIZE:table_end])
    crc = zlib.crc32(table)
    if crc != fields["table_crc"]:
        raise CRCError(f"tensor table CRC mismatch: stored 0x{fields['table_crc']:08x}, "
                       f"computed 0x{crc:08x}: {FIX_DAMAGED}")
    names = [name for name, _, _ in ENTRY_FIELDS]
    entries = [Entry(**dict(zip(names, struct.unpack_from(bc + ENTRY_STRUCT, table,
                                                              i * ENTRY_SIZE))))
               for i in range(n)]
    desc = _read_desc(buf, shape, entries, bc, flags, size) if version >= 2 else None
    _check_entries(shape, entries, size, desc)
    cf = ColibriFile(buf, shape, entries, byte_order, version, path, desc)
    if check_crc:
        problems = cf.verify()
        if problems:
            raise CRCError(problems[0] + (f" (and {len(problems) - 1} more)"
                                          if len(problems) > 1 else "") + f": {FIX_DAMAGED}")
        _check_finite(cf)
    return cf


def _read_desc(buf, shape: ModelShape, entries: list[Entry], bc: str, flags: int,
               size: int) -> Description:
    """A version 2 file's description: entry 0, checked in place and by its
    CRC before its words say how to read the rest (FORMAT.md 3)."""
    e = entries[0]
    cols = desc_cols(shape.n_layers, flags)
    at = align64(HEADER_SIZE + ENTRY_SIZE * len(entries))
    if (e.kind, e.dtype, e.flags, e.layer, e.expert, e.rows, e.cols, e.size, e.offset) != (
            Kind.DESC, DType.F32, FLAG_CRITICAL, NO_INDEX, NO_INDEX, 1, cols, 4 * cols, at):
        raise FormatError(f"tensor table entry 0 ({e.label()} [{e.rows}, {e.cols}]): a version 2 "
                          f"file starts with DESC, critical F32 [1, {cols}] at offset {at}")
    if at + 4 * cols > size:
        raise FormatError(f"tensor table entry 0 (DESC): section ends at byte {at + 4 * cols}, "
                          f"past the end of the file ({size} bytes): {FIX_TRUNCATED}")
    raw = bytes(buf[at:at + 4 * cols])
    crc = zlib.crc32(raw)
    if crc != e.crc:
        raise CRCError(f"CRC mismatch in DESC (offset {at}, {4 * cols} bytes): stored "
                       f"0x{e.crc:08x}, computed 0x{crc:08x}: {FIX_DAMAGED}")
    words = np.frombuffer(raw, dtype=np.dtype("f4").newbyteorder(bc)).astype(np.float32)
    return Description.from_words(flags, words, shape)


def _check_finite(cf: ColibriFile) -> None:
    """Every stored float (F32 values, I8/I16 scales, block fp16 scales) must be finite: a
    CRC-valid file can still carry NaN or infinity, which would make every
    logit NaN. Checked after the CRCs, so corruption reads as corruption."""
    for i, e in enumerate(cf.entries):
        if e.kind not in Kind._value2member_map_:
            continue
        t = cf.tensor(Kind(e.kind), None if e.layer == NO_INDEX else e.layer,
                      None if e.expert == NO_INDEX else e.expert)
        if blocks.is_block(t.dtype):   # the blocks' fp16 fields are their scales
            floats, what = np.stack([t.values[f] for f in t.values.dtype.names
                                     if t.values.dtype[f].kind == "f"], -1), "scales"
        else:
            floats, what = (t.values, "values") if t.dtype == DType.F32 else (t.scales, "scales")
        bad = np.flatnonzero(~np.isfinite(floats))
        if bad.size:
            v = floats.reshape(-1)[bad[0]]
            raise FormatError(f"tensor table entry {i} ({e.label()}): float {int(bad[0])} of "
                              f"its {what} is {'NaN' if np.isnan(v) else 'infinite'}: the "
                              "file holds non-finite weights (re-convert it)")


def _check_entries(shape: ModelShape, entries: list[Entry], file_size: int,
                   desc: Description | None = None) -> None:
    """Every entry's fields, offsets and sizes (FORMAT.md section 3)."""
    want = iter(tensor_order(shape, desc))
    next_known = next(want, None)
    offset = align64(HEADER_SIZE + ENTRY_SIZE * len(entries))
    # The size the table describes (its CRC matched: it is as written), for
    # "truncated (N of M bytes)".
    full = max(align64(e.offset + e.size) for e in entries)
    for i, e in enumerate(entries):
        where = f"tensor table entry {i} ({e.label()})"
        known = e.kind in Kind._value2member_map_
        if e.flags & ~FLAG_CRITICAL:
            raise FormatError(f"{where}: flags = 0x{e.flags:x} has unknown bits")
        if e.reserved != 0:
            raise FormatError(f"{where}: reserved = {e.reserved}, must be 0")
        if not known:
            if e.flags & FLAG_CRITICAL:
                raise FormatError(f"{where}: kind {e.kind} is unknown and marked critical: "
                                  "this file needs a newer colibri")
            if i == 0:
                raise FormatError(f"{where}: the first entry must be EMBED")
            # An optional section of a newer writer: its size is taken as
            # stored; bounds, position and CRC are still checked.
        else:
            kind = Kind(e.kind)
            layer = None if e.layer == NO_INDEX else e.layer
            expert = None if e.expert == NO_INDEX else e.expert
            if next_known is None or (kind, layer, expert) != next_known:
                expect = "no more tensors" if next_known is None else _label(*next_known)
                raise FormatError(f"{where}: out of order or out of range, expected {expect}")
            next_known = next(want, None)
            if e.dtype in blocks.RETIRED:
                raise FormatError(f"{where}: dtype {e.dtype} is a retired float32-scale "
                                  "block of an older colibri: re-convert the model")
            if e.dtype not in DType._value2member_map_:
                raise FormatError(f"{where}: dtype = {e.dtype} is unknown")
            if DType(e.dtype) not in ALLOWED_DTYPES[kind]:
                raise FormatError(f"{where}: dtype {DType(e.dtype).name} is not allowed for "
                                  f"{kind.name}")
            rows, cols = expected_shape(shape, kind, desc)
            if (e.rows, e.cols) != (rows, cols):
                raise FormatError(f"{where}: shape [{e.rows}, {e.cols}], the header implies "
                                  f"[{rows}, {cols}]")
            expect_size = section_size(e.dtype, e.rows, e.cols, shape.group_size)
            if expect_size > U64_MAX or e.size != expect_size:
                raise FormatError(f"{where}: size = {e.size}, expected {expect_size} for "
                                  f"[{e.rows}, {e.cols}] {DType(e.dtype).name}")
        if e.offset != offset:
            raise FormatError(f"{where}: offset = {e.offset}, expected {offset} (sections "
                              "follow the table in order, 64-byte aligned)")
        end = e.offset + e.size
        if end > file_size:
            raise FormatError(f"{where}: section ends at byte {end}, past the end of the "
                              f"file: {_truncated(file_size, max(full, end))}")
        offset = align64(end)
    if next_known is not None:
        raise FormatError(f"tensor {_label(*next_known)} is missing from the table")
    if file_size < offset:
        raise FormatError(_truncated(file_size, offset))
    if offset != file_size:
        raise FormatError(f"file is {file_size} bytes, the table describes {offset}: "
                          f"trailing bytes after the last section; {FIX_DAMAGED}")
