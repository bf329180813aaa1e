"""The block storage types Q4_0, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K (docs/FORMAT.md section 4,
"Block types"): their byte layouts as numpy structured dtypes, packing and
unpacking of the 4- and 6-bit values, the exact values a block holds
(`dequantize`), and the block matrix-vector product of FORMAT.md section 5
(`matmul`), which the C kernels (src/kernels/) compute bit for bit.

A block tensor is a structured array [rows, nb] of one of BLOCK_DTYPES
(nb = ceil(cols / B)); its fp16 scale fields are in host order here and in
the file's order on disk (format.py swaps them). The quantisers that choose the
values live in colibri/file/kquants.py; any block is valid.

Layouts are llama.cpp's byte for byte (ggml-common.h block_q4_0, block_q5_0, block_q8_0,
block_q4_K, block_q5_K, block_q6_K, fp16 scales included): a GGUF tensor's
blocks are a .colibri section's, and the reverse. Every product reads the
scales widened to float32, which is exact.
"""
from __future__ import annotations

import numpy as np

from .quant import quantize_activations_i8
from ..errors import ColibriError

Q4_0, Q4_K, Q6_K, Q5_0, Q5_K, Q8_0 = 8, 9, 10, 11, 12, 13   # storage.DType values (storage.py names them)
# The float32-scale blocks of converters before 2026-12-05 (the same five
# types, 4 or 8 bytes a block longer): readers refuse them, "re-convert".
RETIRED = range(3, 8)

# Columns per block and the block's fields (GGUF's order: Q6_K's d is last).
BLOCK_COLS = {Q4_0: 32, Q5_0: 32, Q8_0: 32, Q4_K: 256, Q5_K: 256, Q6_K: 256}
BLOCK_DTYPES = {
    Q4_0: np.dtype([("d", "<f2"), ("qs", "u1", 16)]),
    # qh: bit 4 of column i's value is bit i % 8 of qh[i / 8] (llama.cpp's
    # uint32 qh read little-endian, kept as bytes so no reader swaps it)
    Q5_0: np.dtype([("d", "<f2"), ("qh", "u1", 4), ("qs", "u1", 16)]),
    # the 32 values as signed bytes (I8_GROUP's with an fp16 scale)
    Q8_0: np.dtype([("d", "<f2"), ("qs", "i1", 32)]),
    Q4_K: np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)]),
    # Q4_K's fields with bit 4 of every value in qh (FORMAT.md 4)
    Q5_K: np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32),
                    ("qs", "u1", 128)]),
    Q6_K: np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")]),
}
BLOCK_BYTES = {k: v.itemsize for k, v in BLOCK_DTYPES.items()}   # 18, 22, 34, 144, 176, 210
assert BLOCK_BYTES == {Q4_0: 18, Q5_0: 22, Q8_0: 34, Q4_K: 144, Q5_K: 176, Q6_K: 210}
# The largest scale an fp16 holds (a block whose d would exceed it cannot be
# stored: kquants refuses the tensor).
F16_MAX = 65504.0
# The K types with Q4_K's scale/min pairs: sub-blocks of 32, x ~ d sc q - dmin m.
AFFINE_K = (Q4_K, Q5_K)
# What the value of Q4_0 / Q5_0 / Q8_0 subtracts from the stored integer.
ZERO_OFFSET = {Q4_0: 8, Q5_0: 16, Q8_0: 0}


def is_block(dtype: int) -> bool:
    return int(dtype) in BLOCK_COLS


def n_blocks(cols: int, dtype: int) -> int:
    b = BLOCK_COLS[int(dtype)]
    return -(-cols // b)


def section_size(dtype: int, rows: int, cols: int) -> int:
    return rows * n_blocks(cols, dtype) * BLOCK_BYTES[int(dtype)]


def file_dtype(dtype: int, byte_order: str) -> np.dtype:
    """The structured dtype with its fp16 fields in byte order '<' or '>'."""
    return BLOCK_DTYPES[int(dtype)].newbyteorder(byte_order) if byte_order == ">" \
        else BLOCK_DTYPES[int(dtype)]


# --------------------------------------------------------------------------
# Q4_K scale/min packing (llama.cpp get_scale_min_k4 and its inverse)
# --------------------------------------------------------------------------

def unpack_q4k_scales(scales12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """uint8 [..., 12] -> (sc, m) uint8 [..., 8], each 0..63."""
    q = scales12.astype(np.uint8)
    sc = np.empty(q.shape[:-1] + (8,), np.uint8)
    m = np.empty_like(sc)
    sc[..., :4] = q[..., 0:4] & 63
    m[..., :4] = q[..., 4:8] & 63
    sc[..., 4:] = (q[..., 8:12] & 15) | ((q[..., 0:4] >> 6) << 4)
    m[..., 4:] = (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)
    return sc, m


def pack_q4k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """(sc, m) integers [..., 8] in 0..63 -> uint8 [..., 12] (the inverse)."""
    sc = sc.astype(np.uint8)
    m = m.astype(np.uint8)
    if np.any(sc > 63) or np.any(m > 63):
        raise ColibriError("Q4_K scales and mins are 6-bit (0..63)")
    out = np.empty(sc.shape[:-1] + (12,), np.uint8)
    out[..., 0:4] = (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6)
    out[..., 4:8] = (m[..., :4] & 63) | ((m[..., 4:] >> 4) << 6)
    out[..., 8:12] = (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4)
    return out


# --------------------------------------------------------------------------
# 4-, 5- and 6-bit values: [..., B] integers <-> the block's byte arrays
# --------------------------------------------------------------------------

def unpack_values(blocks: np.ndarray, dtype: int) -> np.ndarray:
    """The stored integers of every column, [rows, nb, B] int32: Q4_0 and
    Q4_K 0..15, Q5_0 and Q5_K 0..31, Q6_K 0..63 (before the -8 / -16 / -32
    offsets), Q8_0 -128..127."""
    dtype = int(dtype)
    if dtype == Q8_0:
        return blocks["qs"].astype(np.int32)
    if dtype == Q4_0:
        qs = blocks["qs"].astype(np.int32)                        # [..., 16]
        return np.concatenate([qs & 15, qs >> 4], axis=-1)
    if dtype == Q5_0:
        qs = blocks["qs"].astype(np.int32)                        # [..., 16]
        hi = np.unpackbits(blocks["qh"], axis=-1, bitorder="little")  # [..., 32]
        return np.concatenate([qs & 15, qs >> 4], axis=-1) | (hi.astype(np.int32) << 4)
    if dtype in AFFINE_K:
        qs = blocks["qs"].astype(np.int32).reshape(blocks.shape + (4, 32))
        out = np.stack([qs & 15, qs >> 4], axis=-2)              # [..., 4, 2, 32]
        if dtype == Q5_K:   # bit 4 of sub-block j (= 2c + half) is bit j of qh[l]
            qh = blocks["qh"].astype(np.int32)[..., None, None, :]    # [..., 1, 1, 32]
            j = np.arange(8, dtype=np.int32).reshape(4, 2, 1)
            out = out | (((qh >> j) & 1) << 4)
        return out.reshape(blocks.shape + (256,))
    if dtype == Q6_K:
        ql = blocks["ql"].astype(np.int32).reshape(blocks.shape + (2, 2, 32))  # h, s%2, l
        qh = blocks["qh"].astype(np.int32).reshape(blocks.shape + (2, 1, 32))  # h, -, l
        lo = np.concatenate([ql & 15, ql >> 4], axis=-2)          # [..., h, s(4), l]
        hi = np.concatenate([(qh >> (2 * s)) & 3 for s in range(4)], axis=-2)
        return (lo | (hi << 4)).reshape(blocks.shape + (256,))
    raise ColibriError(f"not a block type: {dtype}")


def pack_values(blocks: np.ndarray, dtype: int, q: np.ndarray) -> None:
    """Store integers q [rows, nb, B] (ranges as unpack_values) into blocks."""
    dtype = int(dtype)
    if dtype == Q8_0:
        blocks["qs"] = q.astype(np.int8)
        return
    q = q.astype(np.uint8)
    if dtype in (Q4_0, Q5_0):
        lo = q & 15
        blocks["qs"] = lo[..., :16] | (lo[..., 16:] << 4)
        if dtype == Q5_0:
            blocks["qh"] = np.packbits(q >> 4, axis=-1, bitorder="little")
    elif dtype in AFFINE_K:
        q = q.reshape(blocks.shape + (4, 2, 32))
        lo = q & 15
        blocks["qs"] = (lo[..., 0, :] | (lo[..., 1, :] << 4)).reshape(blocks.shape + (128,))
        if dtype == Q5_K:
            bits = (q >> 4).reshape(blocks.shape + (8, 32))           # [..., j, l]
            blocks["qh"] = sum((bits[..., j, :] << j) for j in range(8)).astype(np.uint8)
    elif dtype == Q6_K:
        q = q.reshape(blocks.shape + (2, 4, 32))                  # h, s, l
        lo, hi = q & 15, q >> 4
        ql = np.stack([lo[..., 0, :] | (lo[..., 2, :] << 4),
                       lo[..., 1, :] | (lo[..., 3, :] << 4)], axis=-2)  # h, s%2, l
        blocks["ql"] = ql.reshape(blocks.shape + (128,))
        qh = hi[..., 0, :] | (hi[..., 1, :] << 2) | (hi[..., 2, :] << 4) | (hi[..., 3, :] << 6)
        blocks["qh"] = qh.reshape(blocks.shape + (64,))
    else:
        raise ColibriError(f"not a block type: {dtype}")


def _sub_scales(blocks: np.ndarray, dtype: int):
    """(d*sc per column's sub-block, dmin*m or None) as float32, each
    [rows, nb, n_sub], evaluated as FORMAT.md 4 writes them."""
    d = blocks["d"].astype(np.float32)[..., None]
    if dtype in ZERO_OFFSET:
        return d, None
    if dtype in AFFINE_K:
        sc, m = unpack_q4k_scales(blocks["scales"])
        dmin = blocks["dmin"].astype(np.float32)[..., None]
        return (d * sc.astype(np.float32)).astype(np.float32), \
            (dmin * m.astype(np.float32)).astype(np.float32)
    return (d * blocks["scales"].astype(np.float32)).astype(np.float32), None


def dequantize(blocks: np.ndarray, dtype: int, cols: int) -> np.ndarray:
    """The exact float32 values [rows, cols] (what an embedding lookup reads,
    and what llama.cpp's dequantize_row_* gives for the same block)."""
    dtype = int(dtype)
    rows, nb = blocks.shape
    q = unpack_values(blocks, dtype).astype(np.float32)           # [rows, nb, B]
    d1, m1 = _sub_scales(blocks, dtype)
    if dtype in ZERO_OFFSET:
        w = (q - np.float32(ZERO_OFFSET[dtype])) * d1
    elif dtype in AFFINE_K:
        w = (np.repeat(d1, 32, axis=-1) * q) - np.repeat(m1, 32, axis=-1)
    else:
        w = np.repeat(d1, 16, axis=-1) * (q - np.float32(32))
    return w.astype(np.float32).reshape(rows, -1)[:, :cols]


# --------------------------------------------------------------------------
# The block product (FORMAT.md 5)
# --------------------------------------------------------------------------

def quantize_activations(x: np.ndarray, dtype: int) -> tuple[np.ndarray, np.ndarray]:
    """x float32 [n, cols] -> (xq int32 [n, nb, B] zero past cols, xs
    float32 [n, nb]): the I8_GROUP activation rule with group B."""
    b = BLOCK_COLS[int(dtype)]
    x = np.asarray(x, dtype=np.float32)
    n, cols = x.shape
    xq, xs = quantize_activations_i8(x, b)
    nb = n_blocks(cols, dtype)
    pad = np.zeros((n, nb * b), np.int32)
    pad[:, :cols] = xq
    return pad.reshape(n, nb, b), xs


def matmul(blocks: np.ndarray, dtype: int, x: np.ndarray) -> np.ndarray:
    """y float32 [n, rows] = the block product of FORMAT.md 5 for weights
    blocks [rows, nb] and activations x float32 [n, cols]: exact integer
    sums per block, then float32 per block in block order, the operations
    and their order as the C kernels do them."""
    dtype = int(dtype)
    rows, nb = blocks.shape
    xq, xs = quantize_activations(x, dtype)                       # [n, nb, B], [n, nb]
    n = xq.shape[0]
    q = unpack_values(blocks, dtype).astype(np.int64)             # [rows, nb, B]
    d = blocks["d"].astype(np.float32)                            # [rows, nb]
    acc = np.zeros((n, rows), np.float32)
    if dtype in ZERO_OFFSET:
        dots = np.einsum("tbk,rbk->trb", xq.astype(np.int64), q - ZERO_OFFSET[dtype])
        for b in range(nb):
            acc += dots[:, :, b].astype(np.float32) * (d[None, :, b] * xs[:, b, None])
        return acc
    sub = 32 if dtype in AFFINE_K else 16
    ns = 256 // sub
    xq_s = xq.astype(np.int64).reshape(n, nb, ns, sub)
    if dtype in AFFINE_K:
        sc, m = unpack_q4k_scales(blocks["scales"])               # [rows, nb, 8]
        dots = np.einsum("tbjk,rbjk->trbj", xq_s, q.reshape(rows, nb, ns, sub))
        isum = np.einsum("trbj,rbj->trb", dots, sc.astype(np.int64))
        bsum = xq_s.sum(axis=-1)                                  # [n, nb, 8]
        msum = np.einsum("tbj,rbj->trb", bsum, m.astype(np.int64))
        dmin = blocks["dmin"].astype(np.float32)
        for b in range(nb):
            t1 = d[None, :, b] * isum[:, :, b].astype(np.float32)
            t2 = dmin[None, :, b] * msum[:, :, b].astype(np.float32)
            acc += xs[:, b, None] * (t1 - t2)
        return acc
    sc = blocks["scales"].astype(np.int64)                        # [rows, nb, 16]
    dots = np.einsum("tbjk,rbjk->trbj", xq_s, q.reshape(rows, nb, ns, sub) - 32)
    isum = np.einsum("trbj,rbj->trb", dots, sc)
    for b in range(nb):
        acc += xs[:, b, None] * (d[None, :, b] * isum[:, :, b].astype(np.float32))
    return acc
