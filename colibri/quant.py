"""Quantisation of weights and activations, exactly as docs/FORMAT.md sections 4
and 5 define it. The converter, the numpy reference and the tests share these
functions; the C kernels (src/kernels/) implement the same arithmetic.

All arithmetic is numpy float32 with round-half-to-even (np.rint), which is
what C's rintf does in the default rounding mode.
"""
from __future__ import annotations

import numpy as np

from .errors import ColibriError

I8_MAX = 127
I16_MAX = 32767


def n_groups(cols: int, group_size: int) -> int:
    """Groups per row: the last group of a row may be shorter."""
    return -(-cols // group_size)


def _group_view(w: np.ndarray, group_size: int) -> np.ndarray:
    """[..., cols] -> [..., ngroups, group_size], zero-padding the last group.
    Zero padding does not change a group's largest magnitude."""
    cols = w.shape[-1]
    ng = n_groups(cols, group_size)
    pad = ng * group_size - cols
    if pad:
        w = np.concatenate([w, np.zeros(w.shape[:-1] + (pad,), dtype=w.dtype)], axis=-1)
    return w.reshape(w.shape[:-1] + (ng, group_size))


def _safe_scale(amax: np.ndarray, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """scale = amax / qmax and inv = 1 / scale, both 0 where amax is 0."""
    amax = amax.astype(np.float32)
    scale = (amax / np.float32(qmax)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(scale > 0, np.float32(1.0) / np.where(scale > 0, scale, 1), 0)
    return scale, inv.astype(np.float32)


def quantize_i8_group(w: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Weights [rows, cols] float -> (q int8 [rows, cols], scales float32
    [rows, ngroups]) with q = clip(rint(w / scale), -127, 127)."""
    w = np.asarray(w, dtype=np.float32)
    _check_2d(w)
    rows, cols = w.shape
    g = _group_view(w, group_size)                       # [rows, ng, G]
    amax = np.max(np.abs(g), axis=-1)                    # [rows, ng]
    scale, _ = _safe_scale(amax, I8_MAX)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale[..., None] > 0, g / np.where(scale > 0, scale, 1)[..., None], 0)
    q = np.clip(np.rint(q), -I8_MAX, I8_MAX).astype(np.int8)
    q = q.reshape(rows, -1)[:, :cols]
    return np.ascontiguousarray(q), scale


def quantize_i16_row(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weights [rows, cols] float -> (q int16 [rows, cols], scales float32
    [rows]) with one scale per row."""
    w = np.asarray(w, dtype=np.float32)
    _check_2d(w)
    amax = np.max(np.abs(w), axis=1)
    scale, _ = _safe_scale(amax, I16_MAX)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scale[:, None] > 0, w / np.where(scale > 0, scale, 1)[:, None], 0)
    q = np.clip(np.rint(q), -I16_MAX, I16_MAX).astype(np.int16)
    return q, scale


def dequantize_i8_group(q: np.ndarray, scales: np.ndarray, group_size: int) -> np.ndarray:
    """(q int8 [rows, cols], scales [rows, ngroups]) -> float32 [rows, cols]."""
    rows, cols = q.shape
    per_col = np.repeat(scales.astype(np.float32), group_size, axis=1)[:, :cols]
    return q.astype(np.float32) * per_col


def dequantize_i16_row(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """(q int16 [rows, cols], scales [rows]) -> float32 [rows, cols]."""
    return q.astype(np.float32) * scales.astype(np.float32)[:, None]


def quantize_activations_i8(x: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Activations [..., cols] float32 -> (xq int8 [..., cols], xs float32
    [..., ngroups]), per FORMAT.md 5: xs = amax/127, inv = 127/amax (0 when amax
    is 0), xq = clip(rint(x * inv), -127, 127)."""
    x = np.asarray(x, dtype=np.float32)
    cols = x.shape[-1]
    g = _group_view(x, group_size)                       # [..., ng, G]
    amax = np.max(np.abs(g), axis=-1)                    # [..., ng]
    xs = (amax / np.float32(I8_MAX)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(I8_MAX) / np.where(amax > 0, amax, 1), 0)
    inv = inv.astype(np.float32)
    xq = np.clip(np.rint(g * inv[..., None]), -I8_MAX, I8_MAX).astype(np.int8)
    xq = xq.reshape(x.shape[:-1] + (-1,))[..., :cols]
    return np.ascontiguousarray(xq), xs


def matmul_i8(xq: np.ndarray, xs: np.ndarray, q: np.ndarray, scales: np.ndarray,
              group_size: int) -> np.ndarray:
    """The I8_GROUP product of FORMAT.md 5.

    xq int8 [n, cols], xs float32 [n, ng], q int8 [rows, cols], scales float32
    [rows, ng] -> y float32 [n, rows] with
    y[t, r] = sum_g float(int32 dot over group g) * (scales[r, g] * xs[t, g]),
    the outer sum in float32, group by group in order.
    """
    n, cols = xq.shape
    rows = q.shape[0]
    gx = _group_view(xq.astype(np.int32), group_size)    # [n, ng, G]
    gw = _group_view(q.astype(np.int32), group_size)     # [rows, ng, G]
    # Exact integer dot per (token, row, group): [n, rows, ng]
    dots = np.einsum("tgk,rgk->trg", gx, gw, dtype=np.int64).astype(np.float32)
    comb = (scales[None, :, :].astype(np.float32) * xs[:, None, :].astype(np.float32))
    terms = dots * comb                                   # [n, rows, ng]
    y = np.zeros((n, rows), dtype=np.float32)
    for g in range(terms.shape[2]):                       # float32, in group order
        y += terms[:, :, g]
    return y


def encode(w: np.ndarray, dtype: int, group_size: int,
           importance: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Encode float weights [rows, cols] for storage type `dtype` (a
    format.DType value): returns (values, scales or None). Block types
    return their blocks [rows, nb] as values (colibri/blocks.py), chosen
    with the optional per-column `importance` (colibri/kquants.py)."""
    from .format import DType  # local import: format imports this module
    from . import blocks, kquants

    if blocks.is_block(dtype):
        return kquants.quantize(w, dtype, importance), None

    if dtype == DType.F32:
        w = np.asarray(w, dtype=np.float32)
        _check_2d(w)
        return np.ascontiguousarray(w), None
    if dtype == DType.I8_GROUP:
        return quantize_i8_group(w, group_size)
    if dtype == DType.I16_ROW:
        return quantize_i16_row(w)
    raise ColibriError(f"unknown storage type {dtype!r}")


def decode(values: np.ndarray, scales: np.ndarray | None, dtype: int,
           group_size: int, cols: int | None = None) -> np.ndarray:
    """Inverse of encode: float32 [rows, cols] (block types need `cols`)."""
    from .format import DType
    from . import blocks

    if blocks.is_block(dtype):
        if cols is None:
            raise ColibriError("decoding blocks needs the matrix's column count")
        return blocks.dequantize(values, dtype, cols)

    if dtype == DType.F32:
        return values.astype(np.float32, copy=False)
    if dtype == DType.I8_GROUP:
        return dequantize_i8_group(values, scales, group_size)
    if dtype == DType.I16_ROW:
        return dequantize_i16_row(values, scales)
    raise ColibriError(f"unknown storage type {dtype!r}")


def _check_2d(w: np.ndarray) -> None:
    if w.ndim != 2:
        raise ColibriError(f"expected a 2-D weight matrix, got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ColibriError("weights contain NaN or infinity")
