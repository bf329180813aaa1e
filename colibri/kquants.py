"""Quantisers for the block types (colibri/blocks.py): float weights [rows,
cols] -> blocks [rows, nb]. Not part of the format: any block is valid and
the runtime computes what the block says; these choose good blocks.

Rows are zero-padded to whole blocks (FORMAT.md 4: the writer quantises
zeros past `cols`). `importance` (optional, float [cols], >= 0) weights the
squared error per column, llama.cpp's imatrix idea: columns that see large
activations matter more.
"""
from __future__ import annotations

import numpy as np

from . import blocks as B
from .errors import ColibriError


def _padded(w: np.ndarray, dtype: int) -> np.ndarray:
    """[rows, cols] -> [rows, nb, B] float32, zeros past cols."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ColibriError(f"expected a 2-D weight matrix, got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ColibriError("weights contain NaN or infinity")
    rows, cols = w.shape
    b = B.BLOCK_COLS[dtype]
    nb = B.n_blocks(cols, dtype)
    out = np.zeros((rows, nb * b), np.float32)
    out[:, :cols] = w
    return out.reshape(rows, nb, b)


def _padded_importance(importance, cols: int, dtype: int, rows: int) -> np.ndarray:
    b = B.BLOCK_COLS[dtype]
    nb = B.n_blocks(cols, dtype)
    imp = np.ones(nb * b, np.float32)
    if importance is not None:
        importance = np.asarray(importance, dtype=np.float32).reshape(-1)
        if importance.shape[0] != cols or not np.all(np.isfinite(importance)) \
                or np.any(importance < 0):
            raise ColibriError(f"importance must be {cols} finite values >= 0")
        imp[:cols] = importance
    imp[cols:] = 0
    return np.broadcast_to(imp.reshape(1, nb, b), (rows, nb, b))


def _safe_div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b != 0, a / np.where(b != 0, b, 1), 0).astype(np.float32)


def quantize_q4_0(w: np.ndarray, importance=None) -> np.ndarray:
    """Q4_0: per block of 32, d = (value of largest magnitude) / -8, q =
    round(x / d) + 8 in 0..15 (llama.cpp quantize_row_q4_0_ref), then a
    refinement of d by weighted least squares on the chosen q."""
    x = _padded(w, B.Q4_0)
    rows, nb, _ = x.shape
    imp = _padded_importance(importance, w.shape[1], B.Q4_0, rows)
    idx = np.argmax(np.abs(x), axis=-1)
    mx = np.take_along_axis(x, idx[..., None], axis=-1)[..., 0]
    d = (mx / np.float32(-8)).astype(np.float32)
    q = np.clip(np.rint(_safe_div(x, d[..., None])) + 8, 0, 15)
    d = _refine_scale(x, q - 8, imp, d)
    q = np.clip(np.rint(_safe_div(x, d[..., None])) + 8, 0, 15)
    out = np.zeros((rows, nb), B.BLOCK_DTYPES[B.Q4_0])
    out["d"] = d
    B.pack_values(out, B.Q4_0, q)
    return out


def _refine_scale(x, qv, imp, d):
    """The least-squares scale for fixed integer values qv: sum(w x q) /
    sum(w q q), kept where it lowers the weighted error."""
    num = np.sum(imp * x * qv, axis=-1)
    den = np.sum(imp * qv * qv, axis=-1)
    d2 = _safe_div(num, den)
    err = lambda s: np.sum(imp * (x - s[..., None] * qv) ** 2, axis=-1)
    return np.where(err(d2) < err(d), d2, d).astype(np.float32)


def quantize_q4_k(w: np.ndarray, importance=None) -> np.ndarray:
    """Q4_K: per sub-block of 32 an affine scale and min (x ~ s*q - m, q in
    0..15), then the 8 scales and 8 mins of a block quantised to 6 bits
    against d = max(s)/63 and dmin = max(m)/63."""
    x = _padded(w, B.Q4_K)
    rows, nb, _ = x.shape
    imp = _padded_importance(importance, w.shape[1], B.Q4_K, rows)
    xs = x.reshape(rows, nb, 8, 32)
    ws = imp.reshape(rows, nb, 8, 32)
    lo = np.minimum(xs.min(axis=-1), 0)
    hi = xs.max(axis=-1)
    scale = ((hi - lo) / np.float32(15)).astype(np.float32)       # [rows, nb, 8]
    mins = (-lo).astype(np.float32)
    # One refinement: the weighted least-squares (scale, min) for the
    # rounded values, kept when it lowers the error.
    q = np.clip(np.rint(_safe_div(xs + mins[..., None], scale[..., None])), 0, 15)
    scale, mins = _refine_affine(xs, ws, q, scale, mins)
    d = (scale.max(axis=-1) / np.float32(63)).astype(np.float32)
    dmin = (mins.max(axis=-1) / np.float32(63)).astype(np.float32)
    sc = np.clip(np.rint(_safe_div(scale, d[..., None])), 0, 63)
    m = np.clip(np.rint(_safe_div(mins, dmin[..., None])), 0, 63)
    d1 = (d[..., None] * sc.astype(np.float32)).astype(np.float32)
    m1 = (dmin[..., None] * m.astype(np.float32)).astype(np.float32)
    q = np.clip(np.rint(_safe_div(xs + m1[..., None], d1[..., None])), 0, 15)
    out = np.zeros((rows, nb), B.BLOCK_DTYPES[B.Q4_K])
    out["d"] = d
    out["dmin"] = dmin
    out["scales"] = B.pack_q4k_scales(sc, m)
    B.pack_values(out, B.Q4_K, q.reshape(rows, nb, 256))
    return out


def _refine_affine(x, w, q, scale, mins):
    """Weighted least squares of x ~ s*q - m over each sub-block, with m >= 0
    (Q4_K stores -min as an unsigned 6-bit value)."""
    sw = w.sum(-1)
    sq = (w * q).sum(-1)
    sqq = (w * q * q).sum(-1)
    sx = (w * x).sum(-1)
    sqx = (w * q * x).sum(-1)
    det = sw * sqq - sq * sq
    s2 = _safe_div(sw * sqx - sq * sx, det)
    m2 = _safe_div(sq * sqx - sqq * sx, det)          # x = s q - m  => m = (sq s - sx)/sw
    ok = (det > 0) & (m2 >= 0) & (s2 > 0)
    err = lambda s, m: (w * (x - (s[..., None] * q - m[..., None])) ** 2).sum(-1)
    better = ok & (err(s2, m2) < err(scale, mins))
    return np.where(better, s2, scale).astype(np.float32), \
        np.where(better, m2, mins).astype(np.float32)


def quantize_q6_k(w: np.ndarray, importance=None) -> np.ndarray:
    """Q6_K: per sub-block of 16 a signed scale (x ~ s*(q-32), q in 0..63),
    then the 16 scales of a block quantised to int8 against d = max|s|/127."""
    x = _padded(w, B.Q6_K)
    rows, nb, _ = x.shape
    imp = _padded_importance(importance, w.shape[1], B.Q6_K, rows)
    xs = x.reshape(rows, nb, 16, 16)
    ws = imp.reshape(rows, nb, 16, 16)
    idx = np.argmax(np.abs(xs), axis=-1)
    mx = np.take_along_axis(xs, idx[..., None], axis=-1)[..., 0]
    scale = (mx / np.float32(-32)).astype(np.float32)
    qv = np.clip(np.rint(_safe_div(xs, scale[..., None])), -32, 31)
    scale = _refine_scale(xs, qv, ws, scale)
    amax = np.abs(scale).max(axis=-1)
    d = (amax / np.float32(127)).astype(np.float32)
    sc = np.clip(np.rint(_safe_div(scale, d[..., None])), -128, 127)
    d1 = (d[..., None] * sc.astype(np.float32)).astype(np.float32)
    q = np.clip(np.rint(_safe_div(xs, d1[..., None])), -32, 31) + 32
    out = np.zeros((rows, nb), B.BLOCK_DTYPES[B.Q6_K])
    out["d"] = d
    out["scales"] = sc.astype(np.int8)
    B.pack_values(out, B.Q6_K, q.reshape(rows, nb, 256))
    return out


QUANTIZERS = {B.Q4_0: quantize_q4_0, B.Q4_K: quantize_q4_k, B.Q6_K: quantize_q6_k}


def quantize(w: np.ndarray, dtype: int, importance=None) -> np.ndarray:
    return QUANTIZERS[int(dtype)](w, importance)
