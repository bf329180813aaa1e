"""The block types (colibri/file/blocks.py, docs/FORMAT.md 4) against llama.cpp's
own reading of the same bytes: gguf-py (llama.cpp's Python package, pinned)
dequantises GGUF Q4_0 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K blocks, and its Q8_0
quantiser (llama.cpp's quantize_row_q8_0_ref in numpy) judges ours byte for byte. A Colibri block whose float32
scales are fp16 values is a GGUF block with the scales widened, so both
readers must give the same floats, bit for bit (elementwise float32
arithmetic: no BLAS, no CPU dependence).

Also: pack/unpack round trips, the quantisers' error bounds, and the block
product (blocks.matmul) against a float64 product of the dequantised values.
"""
from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import quants as gq  # noqa: E402

from colibri.file import blocks as B  # noqa: E402
from colibri.file import kquants  # noqa: E402

GGML = {B.Q4_0: gguf.GGMLQuantizationType.Q4_0, B.Q5_0: gguf.GGMLQuantizationType.Q5_0,
        B.Q4_K: gguf.GGMLQuantizationType.Q4_K, B.Q5_K: gguf.GGMLQuantizationType.Q5_K,
        B.Q6_K: gguf.GGMLQuantizationType.Q6_K, B.Q8_0: gguf.GGMLQuantizationType.Q8_0}
ALL = [B.Q4_0, B.Q5_0, B.Q4_K, B.Q5_K, B.Q6_K, B.Q8_0]


def random_blocks(dtype: int, rows: int, nb: int, rng) -> np.ndarray:
    """Blocks with random bytes and random fp16-representable scales."""
    dt = B.BLOCK_DTYPES[dtype]
    raw = rng.integers(0, 256, size=rows * nb * dt.itemsize, dtype=np.uint8)
    blk = raw.view(dt).reshape(rows, nb).copy()
    blk["d"] = rng.standard_normal((rows, nb)).astype(np.float16).astype(np.float32)
    if "dmin" in dt.names:
        blk["dmin"] = rng.standard_normal((rows, nb)).astype(np.float16).astype(np.float32)
    return blk


def to_gguf_bytes(blk: np.ndarray, dtype: int) -> np.ndarray:
    """The GGUF block bytes: llama.cpp's field order, fp16 scales."""
    rows, nb = blk.shape
    h = lambda f: blk[f].astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    if dtype == B.Q4_0:
        parts = [h("d"), blk["qs"]]
    elif dtype == B.Q5_0:
        parts = [h("d"), blk["qh"], blk["qs"]]
    elif dtype == B.Q8_0:
        parts = [h("d"), blk["qs"].view(np.uint8)]
    elif dtype == B.Q4_K:
        parts = [h("d"), h("dmin"), blk["scales"], blk["qs"]]
    elif dtype == B.Q5_K:
        parts = [h("d"), h("dmin"), blk["scales"], blk["qh"], blk["qs"]]
    else:
        parts = [blk["ql"], blk["qh"], blk["scales"].view(np.uint8), h("d")]
    return np.concatenate(parts, axis=-1).reshape(rows, -1)


@pytest.mark.parametrize("dtype", ALL)
def test_values_equal_llama_cpp_dequantize(dtype):
    rng = np.random.default_rng(dtype)
    blk = random_blocks(dtype, 5, 3, rng)
    cols = 3 * B.BLOCK_COLS[dtype]
    ours = B.dequantize(blk, dtype, cols)
    theirs = gq.dequantize(to_gguf_bytes(blk, dtype), GGML[dtype]).astype(np.float32)
    assert theirs.shape == ours.shape
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("dtype", ALL)
def test_pack_unpack_round_trip(dtype):
    rng = np.random.default_rng(10 + dtype)
    blk = random_blocks(dtype, 4, 2, rng)
    if dtype == B.Q8_0:      # 512 random bytes need not hold both ends
        blk["qs"][0, 0, :2] = (-128, 127)
    q = B.unpack_values(blk, dtype)
    top = {B.Q6_K: 63, B.Q5_0: 31, B.Q5_K: 31, B.Q8_0: 127}.get(dtype, 15)
    bottom = -128 if dtype == B.Q8_0 else 0
    assert q.min() == bottom and q.max() == top     # random bytes reach both ends
    again = blk.copy()
    for f in again.dtype.names:
        if f not in ("d", "dmin", "scales"):
            again[f] = 0
    B.pack_values(again, dtype, q)
    assert again.tobytes() == blk.tobytes()


def test_q4k_scale_packing_round_trip():
    rng = np.random.default_rng(3)
    sc = rng.integers(0, 64, size=(50, 8))
    m = rng.integers(0, 64, size=(50, 8))
    sc2, m2 = B.unpack_q4k_scales(B.pack_q4k_scales(sc, m))
    np.testing.assert_array_equal(sc2, sc)
    np.testing.assert_array_equal(m2, m)


# Relative RMS error of the quantisers on Gaussian weights: bounds a little
# above what they reach (Q4_0 ~0.085, Q5_0 ~0.042, Q4_K ~0.075, Q5_K ~0.036,
# Q6_K ~0.019 measured), so a broken packing or scale choice fails.
RMS_BOUND = {B.Q4_0: 0.10, B.Q5_0: 0.05, B.Q4_K: 0.09, B.Q5_K: 0.045, B.Q6_K: 0.025,
             B.Q8_0: 0.006}   # Q8_0 ~0.0045


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("cols", [256, 300, 37])
def test_quantiser_error(dtype, cols):
    rng = np.random.default_rng(cols)
    w = rng.standard_normal((16, cols)).astype(np.float32)
    blk = kquants.quantize(w, dtype)
    assert blk.shape == (16, B.n_blocks(cols, dtype))
    err = B.dequantize(blk, dtype, cols) - w
    assert np.sqrt(np.mean(err ** 2)) < RMS_BOUND[dtype]


@pytest.mark.parametrize("dtype", ALL)
def test_block_product_close_to_dequantised_product(dtype):
    """matmul = W_dequantised . x up to the int8 activation rounding: within
    |x - x_int8| . |W| (the rounding's own bound) plus float32 sums'."""
    rng = np.random.default_rng(20 + ALL.index(dtype))
    cols = 300
    w = rng.standard_normal((9, cols)).astype(np.float32)
    x = rng.standard_normal((4, cols)).astype(np.float32)
    blk = kquants.quantize(w, dtype)
    y = B.matmul(blk, dtype, x)
    wd = B.dequantize(blk, dtype, cols).astype(np.float64)
    exact = x.astype(np.float64) @ wd.T
    xq, xs = B.quantize_activations(x, dtype)                 # [4, nb, B], [4, nb]
    x8 = (xq * xs[..., None].astype(np.float64)).reshape(4, -1)[:, :cols]
    bound = np.abs(x - x8) @ np.abs(wd).T + 1e-4 * (np.abs(x) @ np.abs(wd).T)
    assert np.all(np.abs(y - exact) <= bound)
    # and the bound is not vacuous: the rounding moves the product
    assert np.max(np.abs(y - exact)) > 1e-3


@pytest.mark.parametrize("cols", [256, 96])
def test_q8_0_quantiser_is_llama_cpps(cols):
    """Our Q8_0 blocks are the ones llama.cpp writes for the same weights
    (gguf-py's quantize is its quantize_row_q8_0_ref: d = amax / 127 stored
    as fp16, q = roundf(x * (1 / d))), byte for byte; with exact halves
    (x * (1 / d) at k + 0.5, roundf's away from zero) and zero blocks."""
    rng = np.random.default_rng(cols)
    w = rng.standard_normal((33, cols)).astype(np.float32)
    # x * (1 / d) at k + 0.5: per block amax 63.5, d 0.5; the others (k + 0.5) / 2
    halves = ((np.arange(cols) % 127 + np.float32(0.5)) / np.float32(2)).astype(np.float32)
    halves[31::32] = np.float32(63.5)
    w[0], w[2] = halves, -halves
    w[1, :32] = 0
    ours = kquants.quantize(w, B.Q8_0)
    theirs = gq.quantize(w, GGML[B.Q8_0])
    assert ours.tobytes() == theirs.tobytes()


def test_zero_rows_quantise_to_zero():
    for dtype in ALL:
        blk = kquants.quantize(np.zeros((2, 256), np.float32), dtype)
        assert not np.any(B.dequantize(blk, dtype, 256))
