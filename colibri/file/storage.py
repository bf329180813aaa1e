"""The storage types of docs/FORMAT.md section 4 (the tensor table's dtype
field) and the way between float weights and each type's stored values.

`DType` names them; `encode` turns float weights [rows, cols] into what a
section of that type holds and `decode` turns it back into float32. The
arithmetic is the types' own: I8_GROUP and I16_ROW in colibri/file/quant.py,
the block types' layouts and values in colibri/file/blocks.py and their
quantisers in colibri/file/kquants.py. format.py (the file's layout) imports
this module; nothing here knows the file.
"""
from __future__ import annotations

import enum

import numpy as np

from . import blocks, kquants, quant
from ..errors import ColibriError


class DType(enum.IntEnum):
    F32 = 0
    I8_GROUP = 1
    I16_ROW = 2
    Q4_0 = blocks.Q4_0   # llama.cpp's blocks, fp16 scales (colibri/file/blocks.py)
    Q4_K = blocks.Q4_K
    Q6_K = blocks.Q6_K
    Q5_0 = blocks.Q5_0
    Q5_K = blocks.Q5_K
    Q8_0 = blocks.Q8_0


BLOCK_TYPES = (DType.Q4_0, DType.Q5_0, DType.Q8_0, DType.Q4_K, DType.Q5_K, DType.Q6_K)


def encode(w: np.ndarray, dtype: int, group_size: int,
           importance: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Encode float weights [rows, cols] for storage type `dtype`: returns
    (values, scales or None). Block types return their blocks [rows, nb] as
    values (colibri/file/blocks.py), chosen with the optional per-column
    `importance` (colibri/file/kquants.py)."""
    if blocks.is_block(dtype):
        return kquants.quantize(w, dtype, importance), None
    if dtype == DType.F32:
        w = np.asarray(w, dtype=np.float32)
        quant.check_2d(w)
        return np.ascontiguousarray(w), None
    if dtype == DType.I8_GROUP:
        return quant.quantize_i8_group(w, group_size)
    if dtype == DType.I16_ROW:
        return quant.quantize_i16_row(w)
    raise ColibriError(f"unknown storage type {dtype!r}")


def decode(values: np.ndarray, scales: np.ndarray | None, dtype: int,
           group_size: int, cols: int | None = None) -> np.ndarray:
    """Inverse of encode: float32 [rows, cols] (block types need `cols`)."""
    if blocks.is_block(dtype):
        if cols is None:
            raise ColibriError("decoding blocks needs the matrix's column count")
        return blocks.dequantize(values, dtype, cols)
    if dtype == DType.F32:
        return values.astype(np.float32, copy=False)
    if dtype == DType.I8_GROUP:
        return quant.dequantize_i8_group(values, scales, group_size)
    if dtype == DType.I16_ROW:
        return quant.dequantize_i16_row(values, scales)
    raise ColibriError(f"unknown storage type {dtype!r}")
