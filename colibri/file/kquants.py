"""Quantisers for the block types (colibri/file/blocks.py): float weights [rows,
cols] -> blocks [rows, nb]. Not part of the format: any block is valid and
the runtime computes what the block says; these choose good blocks.

The searches are llama.cpp's (ggml-quants.c, read for the algorithm and
rewritten here vectorised over all sub-blocks at once):

- Q4_K (Q5_K): make_qkx3_quants per sub-block of 32 (affine x ~ s*q - m, q in
  0..15 (0..31): a sweep of candidate inverse scales, each followed by a weighted
  least-squares fit of (s, m)), then make_qp_quants for the block's 8 scales
  and 8 mins (6 bits each, a sweep of candidate super-scales plus a
  coordinate refinement of the 6-bit values, weighted by the sub-block's
  total weight).
- Q6_K: make_qx_quants per sub-block of 16 (symmetric x ~ s*q, q in
  -32..31, a sweep of 19 candidate inverse scales, least-squares s), then the
  16 scales to int8 against d = max|s| / -128.
- Q4_0 and Q5_0: make_qx_quants per block of 32 (q in -8..7 / -16..15).

Weights of the squared error per column: with an importance matrix
(`importance`, float [cols] >= 0: the mean squared activation each column
sees, colibri/model/imatrix.py) llama.cpp's quantize_row_*_impl choices: imp *
sqrt(sigma2 + x^2), sigma2 the mean x^2 of the row (Q4_0, Q5_0) or twice that of
the block (Q4_K, Q5_K), and imp itself for Q6_K. Without one, the same with imp = 1
on every column: llama.cpp's reference quantisers use other heuristics
there (Q4_K: rms(sub-block) + |x|; Q6_K: x^2; Q4_0: no search at all), and
on Gaussian and Student-t weights these give a larger RMS error than the
uniform importance does (tests/test_kquants.py measures both).

One thing differs from llama.cpp: once the integer scales are fixed we refit
d (and dmin) by weighted least squares, round the fit to fp16 (the blocks'
scales are fp16, FORMAT.md 4) and re-round the values for the rounded d. A
refit is kept only where the error goes down (nearest rounding is optimal
per element for fixed scales), so it can only help.

Rows are zero-padded to whole blocks (FORMAT.md 4: the writer quantises zeros
past `cols`); padded columns get weight 0 (their activations are 0).
"""
from __future__ import annotations

import numpy as np

from . import blocks as B
from ..errors import ColibriError

# Below this a group is all zero (llama.cpp GROUP_MAX_EPS).
GROUP_MAX_EPS = np.float32(1e-15)
# Importance is floored at this fraction of the row's mean so that a column
# no calibration token reached still counts a little (llama.cpp would give it
# weight 0 and let its value go anywhere).
IMPORTANCE_FLOOR = 1e-3
# Rows per chunk: about this many weights are processed at once (the
# candidate sweeps hold a few arrays of this size).
CHUNK_WEIGHTS = 1 << 19
# Q4_K sub-block search: inverse scales (15 + RMIN + RDELTA*i) / (max - min),
# i = 0..NSTEP (llama.cpp make_qkx3_quants' arguments in quantize_row_q4_K_impl).
Q4K_RMIN, Q4K_RDELTA, Q4K_NSTEP = -0.9, 0.05, 36
# Refits of the fp16 super-scales after the integer scales are fixed.
REFITS = 2


# --------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------

def _padded(w: np.ndarray, dtype: int) -> np.ndarray:
    """[rows, cols] -> [rows, nb * B] float32, zeros past cols."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ColibriError(f"expected a 2-D weight matrix, got shape {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ColibriError("weights contain NaN or infinity")
    amax = float(np.max(np.abs(w))) if w.size else 0.0
    if amax > B.F16_MAX:
        # Blocks hold fp16 scales; past fp16's range the searches' float32
        # sums overflow too. Real checkpoints' weights are far below.
        raise ColibriError(f"a weight of magnitude {amax:.3g} is beyond fp16's range "
                           f"({B.F16_MAX:g}), which a block type's scales cannot reach: keep "
                           "this tensor int8 or f32 (a per-kind override)")
    rows, cols = w.shape
    nb = B.n_blocks(cols, dtype)
    out = np.zeros((rows, nb * B.BLOCK_COLS[dtype]), np.float32)
    out[:, :cols] = w
    return out


def _padded_importance(importance, cols: int, dtype: int) -> np.ndarray:
    """importance [cols] (or None: all 1) -> [nb * B] float32, floored at
    IMPORTANCE_FLOOR of its mean, zero past cols."""
    width = B.n_blocks(cols, dtype) * B.BLOCK_COLS[dtype]
    out = np.zeros(width, np.float32)
    imp = np.ones(cols, np.float32) if importance is None else \
        np.asarray(importance, dtype=np.float32).reshape(-1)
    if imp.shape[0] != cols or not np.all(np.isfinite(imp)) or np.any(imp < 0):
        raise ColibriError(f"importance must be {cols} finite values >= 0")
    mean = float(imp.mean()) if cols else 0.0
    if mean <= 0:
        imp = np.ones(cols, np.float32)     # no information: as without importance
        mean = 1.0
    out[:cols] = np.maximum(imp, np.float32(IMPORTANCE_FLOOR * mean))
    return out


def _row_chunks(rows: int, width: int):
    step = max(1, CHUNK_WEIGHTS // max(width, 1))
    for r0 in range(0, rows, step):
        yield slice(r0, min(rows, r0 + step))


def _dot(a, b):
    """sum(a * b) over the last axis, without the product's array: numpy's
    einsum sums a row in order, 2.7x faster than (a * b).sum(-1) on
    256-wide rows (measured on a Zen 3), whose pairwise sum rounds
    differently."""
    return np.einsum("...i,...i->...", a, b)


def _safe_div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b != 0, a / np.where(b != 0, b, 1), 0).astype(np.float32)


# --------------------------------------------------------------------------
# The searches (llama.cpp ggml-quants.c), vectorised over the leading axes
# --------------------------------------------------------------------------

def make_qx_quants(x: np.ndarray, w: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric groups x [..., n] ~ scale * l, l in -nmax..nmax-1, minimising
    sum w (x - scale l)^2 over 19 candidate inverse scales -(nmax + 0.1 i) /
    xmax (xmax the value of largest magnitude, i = -9..9), each with its
    least-squares scale. Returns (scale [...], l [..., n] int8). Searched
    on [n, ...] as make_qkx_quants is, for its sums (einsum: the products'
    sums without their arrays, in the same order as .sum(0))."""
    idx = np.argmax(np.abs(x), axis=-1)
    xmax = np.take_along_axis(x, idx[..., None], axis=-1)[..., 0]
    zero = np.abs(xmax) < GROUP_MAX_EPS
    xmax = np.where(zero, np.float32(1), xmax).astype(np.float32)
    x = np.ascontiguousarray(np.moveaxis(x, -1, 0))          # [n, ...]
    w = np.ascontiguousarray(np.moveaxis(w, -1, 0))

    def rounded(iscale):
        return np.clip(np.rint(iscale * x), -nmax, nmax - 1)

    def candidate(i):
        iscale = np.float32(-(nmax + 0.1 * i)) / xmax
        l = rounded(iscale)
        wl = w * l
        return iscale, np.einsum("i...,i...->...", wl, x), np.einsum("i...,i...->...", wl, l)

    # the loop keeps each group's best inverse scale; its values are
    # rounded once at the end, with the same arithmetic
    best_iscale, sumlx, suml2 = candidate(0)
    scale = _safe_div(sumlx, suml2)
    best = scale * sumlx                      # = sumlx^2 / suml2, the error decrease
    for i in range(-9, 10):
        if i == 0:
            continue
        iscale, slx, sl2 = candidate(i)
        better = (sl2 > 0) & (slx * slx > best * sl2)
        best_iscale = np.where(better, iscale, best_iscale)
        scale = np.where(better, _safe_div(slx, sl2), scale)
        best = scale * np.where(better, slx, sumlx)
        sumlx = np.where(better, slx, sumlx)
    scale = np.where(zero, 0, scale).astype(np.float32)
    best_l = np.where(zero, 0, rounded(best_iscale))
    return scale, np.moveaxis(best_l.astype(np.int8), 0, -1)


def make_qkx_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                    nstep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Affine groups x [..., n] ~ scale * l - mn, l in 0..nmax, mn >= 0:
    llama.cpp make_qkx2/3_quants. Start from the range (min(x, 0), max(x)),
    then for inverse scales (nmax + rmin + rdelta i) / range, i = 0..nstep,
    round, fit (scale, -mn) by weighted least squares (mn forced to 0 when
    the fit wants it negative), keep the lowest weighted squared error.
    Returns (scale [...], mn [...], l [..., n] uint8).

    Cost is what shapes this (the search is most of a K-type conversion):
    - x and w are moved to [n, ...], so each sum over a group is n - 1 adds
      of whole arrays, in order. numpy sums a short last axis row by row,
      about 9x slower per weight (measured on a Zen 3: 966 against 112 us
      for 1 M weights in groups of 32).
    - A candidate's error sum w (s l + m - x)^2 is expanded over the sums
      the fit already has (sum w l, w l^2, w x l) and two fixed ones (sum
      w x, w x^2), in float64 per group, instead of five more passes over
      the weights. float64 keeps the expansion's cancellation harmless:
      the error is about 1 % of sum w x^2 at 4 bits, and the float32 sums
      are good to about 1e-6 of it.
    - The loop keeps each group's best (inverse scale, offset), not its
      values, and rounds once at the end with the same arithmetic.
    - Products are summed by einsum, in the same order as .sum(0) but
      without the product's array.
    Against the direct float32 error these pick another candidate for
    about 0.1 % of a Q4_K tensor's bytes (near ties), at the same RMS
    error to 5 digits; with _dot in the refits they take the Q4_K
    quantiser from 5 to about 8.5 M weights/s on a Zen 3."""
    x = np.ascontiguousarray(np.moveaxis(x, -1, 0))          # [n, ...]
    w = np.ascontiguousarray(np.moveaxis(w, -1, 0))
    lo = np.minimum(x.min(axis=0), 0)
    hi = x.max(axis=0)
    rng = (hi - lo).astype(np.float32)
    flat = rng <= 0
    rng = np.where(flat, np.float32(1), rng)
    sum_w = w.sum(0)
    wx = w * x
    sum_x = wx.sum(0)
    f64 = np.float64
    sum_w64, sum_x64, sum_xx64 = sum_w.astype(f64), sum_x.astype(f64), (wx * x).sum(0).astype(f64)
    del wx
    l = np.empty_like(x)                      # the candidate's values, reused

    def rounded(iscale, the_min):
        np.subtract(x, the_min, out=l)
        np.multiply(l, iscale, out=l)
        np.rint(l, out=l)
        return np.clip(l, 0, nmax, out=l)

    def sums(l):
        wl = w * l
        return wl.sum(0), np.einsum("i...,i...->...", wl, l), np.einsum("i...,i...->...", wl, x)

    def err(scale, the_min, sum_l, sum_l2, sum_xl):
        # sum w (s l + m - x)^2 = s^2 S(wl^2) + 2 s m S(wl) - 2 s S(wxl)
        #                         + m^2 S(w) - 2 m S(wx) + S(wx^2)
        s, m = scale.astype(f64), the_min.astype(f64)
        return (s * (s * sum_l2 + 2 * m * sum_l - 2 * sum_xl)
                + m * (m * sum_w64 - 2 * sum_x64) + sum_xx64)

    # the first guess: the range in nmax steps from its low end
    best_iscale = (np.float32(nmax) / rng).astype(np.float32)
    best_from = lo.astype(np.float32)
    scale = (rng / np.float32(nmax)).astype(np.float32)
    the_min = lo.astype(np.float32)           # x ~ scale * l + the_min, the_min <= 0
    best = err(scale, the_min, *sums(rounded(best_iscale, best_from)))
    # A candidate whose fit is degenerate (det <= 0: every value rounded
    # alike) is never taken, so its scale and min may be inf or NaN: the
    # divisions need no guard.
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in range(nstep + 1):
            # As llama.cpp, the range and offset of each candidate start from
            # the best min found so far, not the first one.
            span = np.where(flat, np.float32(1), hi - the_min).astype(np.float32)
            iscale = np.float32(rmin + rdelta * i + nmax) / span
            sum_l, sum_l2, sum_xl = sums(rounded(iscale, the_min))
            det = sum_w * sum_l2 - sum_l * sum_l
            s = (sum_w * sum_xl - sum_x * sum_l) / det
            m = (sum_l2 * sum_x - sum_l * sum_xl) / det
            pos = m > 0                            # the min must stay <= 0
            s = np.where(pos, sum_xl / sum_l2, s)
            m = np.where(pos, np.float32(0), m)
            e = err(s, m, sum_l, sum_l2, sum_xl)
            better = (det > 0) & (e < best)
            best_iscale = np.where(better, iscale, best_iscale)
            best_from = np.where(better, the_min, best_from)
            scale = np.where(better, s, scale)
            the_min = np.where(better, m, the_min)
            best = np.where(better, e, best)
    best_l = np.where(flat, 0, rounded(best_iscale, best_from))
    scale = np.where(flat, 0, scale).astype(np.float32)
    return scale, (-the_min).astype(np.float32), np.moveaxis(best_l.astype(np.uint8), 0, -1)


def make_qp_quants(x: np.ndarray, w: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative values x [..., n] (the sub-block scales or mins) ~ d * l,
    l in 0..nmax: llama.cpp make_qp_quants. Candidate d = xmax / (nmax + 0.1
    i), i = -4..4, by weighted error; then up to 5 passes of coordinate
    descent moving each l to its best value for the others' fit. Returns
    (d [...], l [..., n] int32)."""
    x = np.maximum(x, 0).astype(np.float32)
    xmax = x.max(axis=-1)
    zero = xmax < GROUP_MAX_EPS
    xmax = np.where(zero, np.float32(1), xmax).astype(np.float32)

    def mse(iscale):
        l = np.minimum(nmax, np.rint(iscale[..., None] * x))
        return (w * (x - l / iscale[..., None]) ** 2).sum(-1)

    iscale = (np.float32(nmax) / xmax).astype(np.float32)
    best = mse(iscale)
    for i in range(-4, 5):
        if i == 0:
            continue
        cand = (np.float32(0.1 * i + nmax) / xmax).astype(np.float32)
        e = mse(cand)
        better = e < best
        iscale = np.where(better, cand, iscale)
        best = np.where(better, e, best)
    l = np.minimum(nmax, np.rint(iscale[..., None] * x))
    sumlx = (w * x * l).sum(-1)
    suml2 = (w * l * l).sum(-1)
    n = x.shape[-1]
    for _ in range(5):
        changed = np.zeros(x.shape[:-1], bool)
        for i in range(n):
            wi, xi, li = w[..., i], x[..., i], l[..., i]
            slx = sumlx - wi * xi * li
            sl2 = suml2 - wi * li * li
            ok = (slx > 0) & (sl2 > 0)
            new = np.minimum(nmax, np.rint(xi * _safe_div(sl2, slx)))
            slx2 = slx + wi * xi * new
            sl22 = sl2 + wi * new * new
            take = ok & (new != li) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            l[..., i] = np.where(take, new, li)
            sumlx = np.where(take, slx2, sumlx)
            suml2 = np.where(take, sl22, suml2)
            changed |= take
        if not changed.any():
            break
    d = np.where(zero | (suml2 <= 0), 0, _safe_div(sumlx, suml2)).astype(np.float32)
    return d, np.where(zero[..., None], 0, l).astype(np.int32)


# --------------------------------------------------------------------------
# Refits of the super-scales (not in llama.cpp), each rounded to fp16
# --------------------------------------------------------------------------

def _f16(d) -> np.ndarray:
    """float32 d rounded to the nearest fp16, as float32: the scale a block
    stores. Clipped to fp16's range: only a refit's least-squares candidate
    can pass it (it is kept only if its error is lower); a first guess
    cannot, since _padded refuses weights beyond fp16's range and a block's
    d is at most its largest weight / 7."""
    d = np.clip(np.asarray(d, np.float32), -B.F16_MAX, B.F16_MAX)
    return d.astype(np.float16).astype(np.float32)


def _refit_symmetric(x, w, unit, lo, hi, d):
    """x [..., n] ~ d[...] * unit[..., n] * q, q in lo..hi integers: alternate
    nearest rounding of q and the weighted least-squares d, keeping d where
    the error does not go down. Returns (d, q)."""
    def rounded(dd):
        step = dd[..., None] * unit
        return np.clip(np.rint(_safe_div(x, step)), lo, hi)

    def err(dd, q):
        r = x - dd[..., None] * unit * q
        return _dot(w * r, r)

    d = _f16(d)
    q = rounded(d)
    e = err(d, q)
    for _ in range(REFITS):
        a = unit * q
        wa = w * a
        d2 = _f16(_safe_div(_dot(wa, x), _dot(wa, a)))
        q2 = rounded(d2)
        e2 = err(d2, q2)
        better = (e2 < e) & (d2 != 0)
        d = np.where(better, d2, d).astype(np.float32)
        q = np.where(better[..., None], q2, q)
        e = np.where(better, e2, e)
    return d, q


def _refit_affine(x, w, sc, m, d, dmin, nmax=15):
    """x [..., n] ~ d * sc * q - dmin * m, q in 0..nmax (sc, m [..., n] the
    integer scale and min of each value's sub-block): alternate nearest
    rounding of q and the weighted least-squares (d, dmin) >= 0. Returns
    (d, dmin, q)."""
    def rounded(dd, dm):
        step = dd[..., None] * sc
        return np.clip(np.rint(_safe_div(x + dm[..., None] * m, step)), 0, nmax)

    def err(dd, dm, q):
        r = x - (dd[..., None] * sc * q - dm[..., None] * m)
        return _dot(w * r, r)

    d, dmin = _f16(d), _f16(dmin)
    q = rounded(d, dmin)
    e = err(d, dmin, q)
    for _ in range(REFITS):
        a = sc * q
        wa, wm = w * a, w * m
        saa, sab, sbb = _dot(wa, a), _dot(wa, m), _dot(wm, m)
        sax, sbx = _dot(wa, x), _dot(wm, x)
        det = saa * sbb - sab * sab
        # x ~ d a - dmin b: normal equations [saa -sab; -sab sbb] [d dmin] = [sax -sbx]
        d2 = _safe_div(sax * sbb - sab * sbx, det)
        m2 = _safe_div(sab * sax - saa * sbx, det)
        no_min = (det <= 0) | (m2 < 0)         # fit without the mins
        d2 = np.where(no_min, _safe_div(sax + dmin * sab, saa), d2)
        m2 = np.where(no_min, dmin, m2)
        d2, m2 = _f16(d2), _f16(m2)
        q2 = rounded(d2, m2)
        e2 = err(d2, m2, q2)
        better = (e2 < e) & (d2 > 0)
        d = np.where(better, d2, d).astype(np.float32)
        dmin = np.where(better, m2, dmin).astype(np.float32)
        q = np.where(better[..., None], q2, q)
        e = np.where(better, e2, e)
    return d, dmin, q


# --------------------------------------------------------------------------
# The five block types
# --------------------------------------------------------------------------

def _quantize_q_0(w: np.ndarray, importance, dtype: int) -> np.ndarray:
    """Q4_0 / Q5_0: per block of 32, x ~ d (q - z), q in 0..2z-1 (z = 8 / 16)."""
    z = B.ZERO_OFFSET[dtype]
    x = _padded(w, dtype)
    rows, width = x.shape
    imp = _padded_importance(importance, np.shape(w)[1], dtype)
    out = np.zeros((rows, width // 32), B.BLOCK_DTYPES[dtype])
    for rs in _row_chunks(rows, width):
        xc = x[rs]
        sigma2 = (xc * xc).sum(-1, keepdims=True) / np.float32(np.shape(w)[1])
        wt = imp * np.sqrt(sigma2 + xc * xc)
        xb, wb = xc.reshape(-1, width // 32, 32), wt.reshape(-1, width // 32, 32)
        d, l = make_qx_quants(xb, wb, z)
        d, q = _refit_symmetric(xb, wb, np.float32(1), -z, z - 1, d)
        out["d"][rs] = d
        B.pack_values(out[rs], dtype, q + z)
    return out


def quantize_q4_0(w: np.ndarray, importance=None) -> np.ndarray:
    """Q4_0: per block of 32, x ~ d (q - 8), q in 0..15."""
    return _quantize_q_0(w, importance, B.Q4_0)


def quantize_q5_0(w: np.ndarray, importance=None) -> np.ndarray:
    """Q5_0: per block of 32, x ~ d (q - 16), q in 0..31."""
    return _quantize_q_0(w, importance, B.Q5_0)


def quantize_q8_0(w: np.ndarray, importance=None) -> np.ndarray:
    """Q8_0: per block of 32, x ~ d q, q in -127..127: llama.cpp's
    quantize_row_q8_0_ref (d = amax / 127, q = round(x / d) half away from
    zero, with x * (1 / d) as it computes it; d stored as fp16). At 8 bits
    the rounding error is small enough that llama.cpp searches no scale, and
    neither does this: `importance` is not used."""
    del importance
    x = _padded(w, B.Q8_0)
    rows, width = x.shape
    out = np.zeros((rows, width // 32), B.BLOCK_DTYPES[B.Q8_0])
    for rs in _row_chunks(rows, width):
        xb = x[rs].reshape(-1, width // 32, 32)
        # d <= 65504 / 127: _padded refused larger weights
        d = (np.abs(xb).max(axis=-1) / np.float32(127)).astype(np.float32)
        v = xb * _safe_div(np.float32(1), d)[..., None]
        # roundf: half away from zero, from the exact fraction (|v| + 0.5
        # would round up just below a half)
        t = np.trunc(v)
        q = np.clip(t + np.sign(v) * (np.abs(v - t) >= np.float32(0.5)), -127, 127)
        out["d"][rs] = d
        B.pack_values(out[rs], B.Q8_0, q.astype(np.int32))
    return out


def quantize_q4_k(w: np.ndarray, importance=None) -> np.ndarray:
    """Q4_K: per sub-block of 32 x ~ s q - m (q in 0..15), s = d sc, m =
    dmin mn with the 8 sc and 8 mn of a block of 256 6-bit integers."""
    return _quantize_affine_k(w, importance, B.Q4_K, 15)


def quantize_q5_k(w: np.ndarray, importance=None) -> np.ndarray:
    """Q5_K: Q4_K with q in 0..31 (llama.cpp's quantize_row_q5_K_impl: the
    same searches with nmax 31)."""
    return _quantize_affine_k(w, importance, B.Q5_K, 31)


def _quantize_affine_k(w: np.ndarray, importance, dtype: int, nmax: int) -> np.ndarray:
    x = _padded(w, dtype)
    rows, width = x.shape
    nb = width // 256
    imp = _padded_importance(importance, np.shape(w)[1], dtype)
    out = np.zeros((rows, nb), B.BLOCK_DTYPES[dtype])
    for rs in _row_chunks(rows, width):
        xc = x[rs]
        xs = xc.reshape(-1, nb, 8, 32)
        sigma2 = 2 * (xs * xs).mean(axis=(-1, -2), keepdims=True)
        wt = imp.reshape(nb, 8, 32) * np.sqrt(sigma2 + xs * xs)
        scale, mins, _ = make_qkx_quants(xs, wt, nmax, Q4K_RMIN, Q4K_RDELTA, Q4K_NSTEP)
        sw = wt.sum(-1)                                           # [r, nb, 8]
        d, sc = make_qp_quants(scale, sw, 63)
        dmin, mn = make_qp_quants(mins, sw, 63)
        scf = np.repeat(sc.astype(np.float32), 32, axis=-1)       # [r, nb, 256]
        mnf = np.repeat(mn.astype(np.float32), 32, axis=-1)
        d, dmin, q = _refit_affine(xs.reshape(-1, nb, 256), wt.reshape(-1, nb, 256),
                                   scf, mnf, d, dmin, nmax)
        blk = out[rs]
        blk["d"] = d
        blk["dmin"] = dmin
        blk["scales"] = B.pack_q4k_scales(sc, mn)
        B.pack_values(blk, dtype, q)
        out[rs] = blk
    return out


def quantize_q6_k(w: np.ndarray, importance=None) -> np.ndarray:
    """Q6_K: per sub-block of 16 x ~ d sc (q - 32), q in 0..63, the 16 sc of
    a block of 256 int8."""
    x = _padded(w, B.Q6_K)
    rows, width = x.shape
    nb = width // 256
    imp = _padded_importance(importance, np.shape(w)[1], B.Q6_K)
    out = np.zeros((rows, nb), B.BLOCK_DTYPES[B.Q6_K])
    for rs in _row_chunks(rows, width):
        xc = x[rs]
        xs = xc.reshape(-1, nb, 16, 16)
        wt = np.broadcast_to(imp.reshape(nb, 16, 16), xs.shape)
        scale, _ = make_qx_quants(xs, wt, 32)                     # [r, nb, 16]
        idx = np.argmax(np.abs(scale), axis=-1)
        smax = np.take_along_axis(scale, idx[..., None], axis=-1)[..., 0]
        zero = np.abs(smax) < GROUP_MAX_EPS
        iscale = _safe_div(np.float32(-128), np.where(zero, 1, smax))
        sc = np.clip(np.rint(iscale[..., None] * scale), -128, 127)
        d = np.where(zero, 0, _safe_div(np.float32(1), iscale)).astype(np.float32)
        d, q = _refit_symmetric(xs.reshape(-1, nb, 256), wt.reshape(-1, nb, 256),
                                np.repeat(sc.astype(np.float32), 16, axis=-1), -32, 31, d)
        blk = out[rs]
        blk["d"] = d
        blk["scales"] = np.where(zero[..., None], 0, sc).astype(np.int8)
        B.pack_values(blk, B.Q6_K, np.where(zero[..., None], 0, q) + 32)
        out[rs] = blk
    return out


QUANTIZERS = {B.Q4_0: quantize_q4_0, B.Q5_0: quantize_q5_0, B.Q8_0: quantize_q8_0,
              B.Q4_K: quantize_q4_k,
              B.Q5_K: quantize_q5_k, B.Q6_K: quantize_q6_k}


def quantize(w: np.ndarray, dtype: int, importance=None) -> np.ndarray:
    """Blocks [rows, nb] of `dtype` for weights w [rows, cols]; `importance`
    [cols] (optional) the mean squared activation of each column."""
    return QUANTIZERS[int(dtype)](w, importance)
