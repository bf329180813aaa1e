"""The int8 and int16 storage types' arithmetic (I8_GROUP, I16_ROW) and the
int8 activations, exactly as docs/FORMAT.md sections 4 and 5 define it. The
converter, the numpy reference and the tests share these functions; the C
kernels (src/kernels/) implement the same arithmetic. Choosing among all the
storage types (the block types too) is colibri/file/storage.py's job.

All arithmetic is numpy float32 with round-half-to-even (np.rint), which is
what C's rintf does in the default rounding mode.
"""
from __future__ import annotations

import numpy as np

from ..errors import ColibriError

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
    check_2d(w)
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
    check_2d(w)
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


def check_2d(w: np.ndarray) -> None:
    if w.ndim != 2:
        raise ColibriError(f"expected a 2-D weight matrix, got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ColibriError("weights contain NaN or infinity")
