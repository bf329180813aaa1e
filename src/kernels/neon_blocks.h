/*
 * neon_blocks.h - NEON kernels for the block-quantised weights (kernels.h
 * matmul_q4_0, matmul_q5_0, matmul_q8_0, matmul_q4_k, matmul_q5_k, matmul_q6_k), included by neon.c (the "neon"
 * table, ARMv7-A and AArch64) and by neon_dotprod.c (AArch64
 * "neon-dotprod"). The one difference between the includers is the integer
 * dot-product step, chosen by __ARM_FEATURE_DOTPROD (defined only in
 * neon_dotprod.c, by its target pragma): SDOT, or vmull/vmlal + vpadal.
 *
 * Result: bit-identical to ref.c on every ISA, for any n, rows, cols and
 * any token x row tiling of a call (kernels.h). Per output element ref
 * computes, block by block in order, one exact int32 sum (or two for
 * Q4_K) and then a few float32 operations in a fixed order (FORMAT.md 5):
 *   Q4_0, Q5_0, Q8_0: acc = acc + float(dot) * (d * xs)
 *   Q4_K, Q5_K: acc = acc + xs * (d * float(isum) - dmin * float(msum))
 *   Q6_K: acc = acc + xs * (d * float(isum))
 * Here the integer sums are exact (every partial sum is an int32 or a
 * non-overflowing int16, see nb_dot16 / nb_dot32), and an exact integer
 * converts to the same float whatever order produced it. d and dmin are
 * the blocks' fp16 fields widened to float32 by clb_blk_f16 (exact, the
 * same code as ref's; ARMv7 NEON has no fp16 conversion). The float part
 * is those operations, each rounded once (no vmla/vfma; -ffp-contract=off
 * keeps GCC from fusing the A64 vector operators):
 * - AArch64: 4 weight rows in the 4 lanes of a vector; A64 vector float
 *   arithmetic is IEEE with subnormals, as scalar code.
 * - ARMv7-A: scalar VFP code per element. ARMv7 NEON float arithmetic
 *   flushes subnormals to zero, which a product such as d * xs could be;
 *   the float part is a handful of operations per block, cheap next to
 *   the 32 or 256 multiply-adds of the integer part.
 *
 * Loop structure:
 * - Q4_0, Q5_0 and Q8_0 (32 columns, 18, 22 or 34 bytes a block): the weights stay in
 *   registers.
 *   A tile of 4V rows x T tokens unpacks each row's block once into two
 *   int8 vectors and uses them for all T tokens (prefill: 4 rows x NB_TP
 *   tokens; decode: 4 * NB_DV rows in flight for one token).
 * - Q4_K, Q6_K (256 columns): a block is unpacked once into int8 values
 *   in column order plus integer scales (nb_kblock, on the stack) for a
 *   group of NB_G rows, then used by every token of a chunk of NB_TT
 *   tokens; weight bytes are read once per chunk (once per call when
 *   n <= NB_TT, e.g. decode).
 *
 * Contract: static functions (each includer gets its own copy); no
 * allocation, no alignment assumption (vld1 takes any address; blocks are
 * 2-byte aligned at best and the fp16 fields go through memcpy), no access
 * outside the arguments; at most ~5 KiB of stack.
 */
#ifndef COLIBRI_NEON_BLOCKS_H
#define COLIBRI_NEON_BLOCKS_H

#include <arm_neon.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

#define NB_INLINE static inline __attribute__((always_inline))
/* The (row, token) loops must be unrolled completely for the accumulators
 * to live in registers. */
#define NB_UNROLL _Pragma("GCC unroll 16")

#ifdef __aarch64__
/* 32 q registers: 4 rows x 4 tokens in prefill (16 int32 accumulators),
 * 8 rows in decode. */
enum { NB_TP = 4, NB_DV = 2 };
#else
/* 16 q registers: 4 rows x 2 tokens in prefill, 4 rows in decode. */
enum { NB_TP = 2, NB_DV = 1 };
#endif
enum {
    NB_MAXV = 2,        /* row vectors (of 4 rows) in a tile */
    NB_MAXT = 4,        /* tokens in a tile */
    NB_G = 4 * NB_DV,   /* K-quant rows unpacked together */
    NB_TT = 32,         /* K-quant tokens per chunk (float accumulators) */
};

/* ------------------------------------------------------------------------ */
/* Exact integer dot products. */

/* p + the products of the high 8 int8 pairs of w and x, as int16. */
NB_INLINE int16x8_t nb_mlal_high(int16x8_t p, int8x16_t w, int8x16_t x)
{
#ifdef __aarch64__
    return vmlal_high_s8(p, w, x); /* smlal2: no move of the high halves */
#else
    return vmlal_s8(p, vget_high_s8(w), vget_high_s8(x));
#endif
}

/* The 16 products w[i] * x[i], summed into 4 int32 lanes. Without SDOT
 * the products of pairs are summed in int16 first: exact when |w| <= 32
 * and |x| <= 127 (2 * 32 * 127 = 8128). */
NB_INLINE int32x4_t nb_dot16(int8x16_t w, int8x16_t x)
{
#ifdef __ARM_FEATURE_DOTPROD
    return vdotq_s32(vdupq_n_s32(0), w, x);
#else
    int16x8_t p = vmull_s8(vget_low_s8(w), vget_low_s8(x));
    return vpaddlq_s16(nb_mlal_high(p, w, x));
#endif
}

/* The 32 products of (w0, w1) and (x0, x1), summed into 4 int32 lanes.
 * Without SDOT four products per int16 lane: exact when |w| <= 32 and
 * |x| <= 127 (4 * 32 * 127 = 16256 < 32767): Q4_0 |q - 8| <= 8, Q5_0
 * |q - 16| <= 16, Q4_K q <= 15, Q5_K q <= 31. */
NB_INLINE int32x4_t nb_dot32(int8x16_t w0, int8x16_t w1, int8x16_t x0, int8x16_t x1)
{
#ifdef __ARM_FEATURE_DOTPROD
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, x0), w1, x1);
#else
    int16x8_t p = vmull_s8(vget_low_s8(w0), vget_low_s8(x0));
    p = nb_mlal_high(p, w0, x0);
    p = vmlal_s8(p, vget_low_s8(w1), vget_low_s8(x1));
    return vpaddlq_s16(nb_mlal_high(p, w1, x1));
#endif
}

/* nb_dot32 for any int8 weights (Q8_0's, to -128): without SDOT each
 * product widened to int16 (<= 128 * 127 = 16256) and pairs added into
 * int32 lanes (vpadal), exact. */
NB_INLINE int32x4_t nb_dot32_i8(int8x16_t w0, int8x16_t w1, int8x16_t x0, int8x16_t x1)
{
#ifdef __ARM_FEATURE_DOTPROD
    return nb_dot32(w0, w1, x0, x1);
#else
    int32x4_t a = vpaddlq_s16(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)));
    a = vpadalq_s16(a, vmull_s8(vget_high_s8(w0), vget_high_s8(x0)));
    a = vpadalq_s16(a, vmull_s8(vget_low_s8(w1), vget_low_s8(x1)));
    return vpadalq_s16(a, vmull_s8(vget_high_s8(w1), vget_high_s8(x1)));
#endif
}

/* [lane sum of a, of b, of c, of d]: integer adds, exact. */
NB_INLINE int32x4_t nb_hsum4(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d)
{
#ifdef __aarch64__
    return vpaddq_s32(vpaddq_s32(a, b), vpaddq_s32(c, d));
#else
    int32x2_t ab = vpadd_s32(vadd_s32(vget_low_s32(a), vget_high_s32(a)),
                             vadd_s32(vget_low_s32(b), vget_high_s32(b)));
    int32x2_t cd = vpadd_s32(vadd_s32(vget_low_s32(c), vget_high_s32(c)),
                             vadd_s32(vget_low_s32(d), vget_high_s32(d)));
    return vcombine_s32(ab, cd);
#endif
}

/* ------------------------------------------------------------------------ */
/* The float part of 4 rows (one token): ref's operations per element. */

#ifdef __aarch64__
typedef float32x4_t nb_acc4; /* row i in lane i */

NB_INLINE nb_acc4 nb_acc_zero(void)
{
    return vdupq_n_f32(0.0f);
}

/* acc + float(dot) * (d * xs) */
NB_INLINE nb_acc4 nb_step_q4_0(nb_acc4 acc, int32x4_t dot, const float d[4], float xs)
{
    const float32x4_t scale = vmulq_n_f32(vld1q_f32(d), xs);
    return vaddq_f32(acc, vmulq_f32(vcvtq_f32_s32(dot), scale));
}

/* acc + xs * (d * float(isum) - dmin * float(msum)) */
NB_INLINE nb_acc4 nb_step_q4_k(nb_acc4 acc, int32x4_t isum, int32x4_t msum,
                               const float d[4], const float dmin[4], float xs)
{
    const float32x4_t dd = vmulq_f32(vld1q_f32(d), vcvtq_f32_s32(isum));
    const float32x4_t mm = vmulq_f32(vld1q_f32(dmin), vcvtq_f32_s32(msum));
    return vaddq_f32(acc, vmulq_n_f32(vsubq_f32(dd, mm), xs));
}

/* acc + xs * (d * float(isum)) */
NB_INLINE nb_acc4 nb_step_q6_k(nb_acc4 acc, int32x4_t isum, const float d[4], float xs)
{
    const float32x4_t dd = vmulq_f32(vld1q_f32(d), vcvtq_f32_s32(isum));
    return vaddq_f32(acc, vmulq_n_f32(dd, xs));
}

/* y[0 .. count) = the first count (1..4) rows. */
NB_INLINE void nb_acc_store(float *y, nb_acc4 acc, uint32_t count)
{
    if (count == 4) {
        vst1q_f32(y, acc);
    } else {
        float tmp[4];
        vst1q_f32(tmp, acc);
        for (uint32_t i = 0; i < count; i++)
            y[i] = tmp[i];
    }
}
#else /* ARMv7: scalar VFP, subnormals honoured (see the header comment) */
typedef struct {
    float v[4];
} nb_acc4;

NB_INLINE nb_acc4 nb_acc_zero(void)
{
    nb_acc4 a = {{0.0f, 0.0f, 0.0f, 0.0f}};
    return a;
}

NB_INLINE nb_acc4 nb_step_q4_0(nb_acc4 acc, int32x4_t dot, const float d[4], float xs)
{
    int32_t k[4];
    vst1q_s32(k, dot);
    for (int i = 0; i < 4; i++)
        acc.v[i] += (float)k[i] * (d[i] * xs);
    return acc;
}

NB_INLINE nb_acc4 nb_step_q4_k(nb_acc4 acc, int32x4_t isum, int32x4_t msum,
                               const float d[4], const float dmin[4], float xs)
{
    int32_t is[4], ms[4];
    vst1q_s32(is, isum);
    vst1q_s32(ms, msum);
    for (int i = 0; i < 4; i++) {
        const float dd = d[i] * (float)is[i];
        const float mm = dmin[i] * (float)ms[i];
        acc.v[i] += xs * (dd - mm);
    }
    return acc;
}

NB_INLINE nb_acc4 nb_step_q6_k(nb_acc4 acc, int32x4_t isum, const float d[4], float xs)
{
    int32_t is[4];
    vst1q_s32(is, isum);
    for (int i = 0; i < 4; i++)
        acc.v[i] += xs * (d[i] * (float)is[i]);
    return acc;
}

NB_INLINE void nb_acc_store(float *y, nb_acc4 acc, uint32_t count)
{
    for (uint32_t i = 0; i < count; i++)
        y[i] = acc.v[i];
}
#endif

/* Row r0 + i of a tile, clamped to the last row: a tile's rows past the
 * matrix are computed on a copy of the last row and not stored. */
NB_INLINE uint32_t nb_row(uint32_t r0, int i, uint32_t rows)
{
    return r0 + (uint32_t)i < rows ? r0 + (uint32_t)i : rows - 1;
}

/* Store the tile's accumulator of rows r .. r+3 of token row y (Y + t *
 * rows), only the rows that exist. */
NB_INLINE void nb_store_rows(float *y, nb_acc4 acc, uint32_t r, uint32_t rows)
{
    if (r < rows)
        nb_acc_store(y + r, acc, rows - r < 4 ? rows - r : 4);
}

/* ------------------------------------------------------------------------ */
/* Q4_0: 32 columns a block, {fp16 d; uint8 qs[16]} (qs at 2), column
 * i < 16 in the low nibble of qs[i], column 16 + i in its high nibble;
 * value q - 8. */

/* The block's 32 values q - 8 (-8..7) in column order: lo = columns
 * 0..15, hi = 16..31. */
NB_INLINE void nb_unpack_q4_0(const uint8_t *blk, int8x16_t *lo, int8x16_t *hi)
{
    const uint8x16_t q = vld1q_u8(blk + CLB_Q4_0_QS);
    const int8x16_t eight = vdupq_n_s8(8);
    *lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(15))), eight);
    *hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), eight);
}

/* Q5_0: {fp16 d; uint8 qh[4]; uint8 qs[16]}, Q4_0's nibbles (at offset 6)
 * with bit 4 of column i in bit i of the little-endian qh (at 2); value
 * q - 16. */
NB_INLINE uint8x16_t nb_q5_0_high16(const uint8_t *qh2)
{
    /* byte j: 16 if bit j % 8 of qh2[j / 8] is set (vtst against a one-bit mask) */
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t v = vcombine_u8(vdup_n_u8(qh2[0]), vdup_n_u8(qh2[1]));
    return vandq_u8(vtstq_u8(v, vld1q_u8(bit)), vdupq_n_u8(16));
}

/* The block's 32 values q - 16 (-16..15) in column order: lo = columns
 * 0..15, hi = 16..31. */
NB_INLINE void nb_unpack_q5_0(const uint8_t *blk, int8x16_t *lo, int8x16_t *hi)
{
    const uint8x16_t q = vld1q_u8(blk + CLB_Q5_0_QS);
    const int8x16_t sixteen = vdupq_n_s8(16);
    const uint8x16_t l = vorrq_u8(vandq_u8(q, vdupq_n_u8(15)), nb_q5_0_high16(blk + CLB_Q5_0_QH));
    const uint8x16_t h = vorrq_u8(vshrq_n_u8(q, 4), nb_q5_0_high16(blk + CLB_Q5_0_QH + 2));
    *lo = vsubq_s8(vreinterpretq_s8_u8(l), sixteen);
    *hi = vsubq_s8(vreinterpretq_s8_u8(h), sixteen);
}

/* Q8_0: {fp16 d; int8 qs[32]} (qs at 2), the values as stored. */

/* Y[t0 .. t0+T, r0 .. r0+4V) of a Q4_0, Q5_0 or Q8_0 matrix (dt) W [rows,
 * nb blocks]. Per block: 4V rows unpacked into registers (2 vectors each),
 * each used by T tokens (2 activation vectors each); per (4 rows, token)
 * one vector of 4 exact dots and the float step. */
NB_INLINE void nb_q4_0_tile(const unsigned dt, const int V, const int T, float *Y,
                            const uint8_t *W, const int8_t *XQ, const float *XS, uint32_t nb,
                            uint32_t rows, uint32_t r0, uint32_t t0)
{
    const size_t bytes = clb_block_bytes(dt);
    const uint8_t *w[4 * NB_MAXV];
    const int8_t *x[NB_MAXT];
    const float *xs[NB_MAXT];
    nb_acc4 acc[NB_MAXV][NB_MAXT];
    NB_UNROLL
    for (int i = 0; i < 4 * V; i++)
        w[i] = W + (size_t)nb_row(r0, i, rows) * nb * bytes;
    NB_UNROLL
    for (int t = 0; t < T; t++) {
        x[t] = XQ + (size_t)(t0 + t) * nb * CLB_Q4_0_COLS;
        xs[t] = XS + (size_t)(t0 + t) * nb;
        NB_UNROLL
        for (int v = 0; v < V; v++)
            acc[v][t] = nb_acc_zero();
    }
    for (uint32_t b = 0; b < nb; b++) {
        int8x16_t lo[4 * NB_MAXV], hi[4 * NB_MAXV];
        float d[4 * NB_MAXV];
        NB_UNROLL
        for (int i = 0; i < 4 * V; i++) {
            const uint8_t *blk = w[i] + (size_t)b * bytes;
            if (dt == COLIBRI_DTYPE_Q8_0) {
                lo[i] = vld1q_s8((const int8_t *)(const void *)(blk + CLB_Q8_0_QS));
                hi[i] = vld1q_s8((const int8_t *)(const void *)(blk + CLB_Q8_0_QS + 16));
            } else if (dt == COLIBRI_DTYPE_Q5_0) {
                nb_unpack_q5_0(blk, &lo[i], &hi[i]);
            } else {
                nb_unpack_q4_0(blk, &lo[i], &hi[i]);
            }
            d[i] = clb_blk_f16(blk, 0);
        }
        NB_UNROLL
        for (int t = 0; t < T; t++) {
            const int8x16_t x0 = vld1q_s8(x[t] + (size_t)b * CLB_Q4_0_COLS);
            const int8x16_t x1 = vld1q_s8(x[t] + (size_t)b * CLB_Q4_0_COLS + 16);
            NB_UNROLL
            for (int v = 0; v < V; v++) {
                const int i = 4 * v;
#define NB_DOT(j) (dt == COLIBRI_DTYPE_Q8_0 ? nb_dot32_i8(lo[j], hi[j], x0, x1) \
                                            : nb_dot32(lo[j], hi[j], x0, x1))
                const int32x4_t dots = nb_hsum4(NB_DOT(i), NB_DOT(i + 1), NB_DOT(i + 2), NB_DOT(i + 3));
#undef NB_DOT
                acc[v][t] = nb_step_q4_0(acc[v][t], dots, d + i, xs[t][b]);
            }
        }
    }
    NB_UNROLL
    for (int t = 0; t < T; t++)
        NB_UNROLL
        for (int v = 0; v < V; v++)
            nb_store_rows(Y + (size_t)(t0 + t) * rows, acc[v][t], r0 + 4u * (uint32_t)v, rows);
}

/* Tiles of 4 rows x NB_TP tokens while NB_TP tokens are left, then single
 * tokens with 4 * NB_DV rows in flight (two tile shapes only: code size). */
NB_INLINE void nb_matmul_q4_0(const unsigned dt, float *Y, const uint8_t *W, const int8_t *XQ,
                              const float *XS, uint32_t n, uint32_t rows, uint32_t cols)
{
    const uint32_t nb = (cols + CLB_Q4_0_COLS - 1) / CLB_Q4_0_COLS;
    uint32_t t = 0;
    for (; t + NB_TP <= n; t += NB_TP)
        for (uint32_t r = 0; r < rows; r += 4)
            nb_q4_0_tile(dt, 1, NB_TP, Y, W, XQ, XS, nb, rows, r, t);
    for (; t < n; t++)
        for (uint32_t r = 0; r < rows; r += 4 * NB_DV)
            nb_q4_0_tile(dt, NB_DV, 1, Y, W, XQ, XS, nb, rows, r, t);
}

/* ------------------------------------------------------------------------ */
/* Q4_K, Q5_K and Q6_K: 256 columns a block, unpacked per row into nb_kblock. */

enum { NB_Q4_K, NB_Q6_K, NB_Q5_K }; /* nb_matmul_kq's kq */

typedef struct {
    int8_t q[256];   /* values in column order: Q4_K q (0..15), Q5_K q (0..31),
                        Q6_K q - 32 */
    int32_t sc[16];  /* sub-block scales: Q4_K 8 (0..63, 32 columns each),
                        Q6_K 16 (-128..127, 16 columns each) */
    int32_t m[8];    /* Q4_K sub-block mins (0..63) */
    float d, dmin;   /* the block's fp16 fields, widened (dmin: Q4_K only) */
} nb_kblock;

/* Q4_K's 8 scales and 8 mins (clb_q4k_scale_min) from the 12 bytes
 * s = a[4] b[4] c[4], bytewise for all j at once: j < 4: sc = a & 63,
 * m = b & 63; j >= 4: sc = (c & 15) | (a >> 6) << 4, m = (c >> 4) | (b >> 6)
 * << 4 (a, b, c indexed j - 4). */
NB_INLINE void nb_q4_k_scales(nb_kblock *u, const uint8_t *s)
{
    static const uint8_t low_half[8] = {255, 255, 255, 255, 0, 0, 0, 0};
    const uint8x8_t ab = vld1_u8(s);     /* a | b */
    const uint8x8_t bc = vld1_u8(s + 4); /* b | c */
    /* c & 15 | c >> 4: c is bc's high half and vext(bc, bc, 4)'s low half */
    const uint8x8_t cn = vbsl_u8(vld1_u8(low_half), vand_u8(vext_u8(bc, bc, 4), vdup_n_u8(15)),
                                 vshr_n_u8(bc, 4));
    const uint16x8_t lo = vmovl_u8(vand_u8(ab, vdup_n_u8(63)));               /* sc0..3 m0..3 */
    const uint16x8_t hi = vmovl_u8(vorr_u8(cn, vshl_n_u8(vshr_n_u8(ab, 6), 4))); /* sc4..7 m4..7 */
    vst1q_s32(u->sc, vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(lo))));
    vst1q_s32(u->sc + 4, vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(hi))));
    vst1q_s32(u->m, vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(lo))));
    vst1q_s32(u->m + 4, vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(hi))));
}

/* Q4_K {fp16 d, dmin; uint8 scales[12]; uint8 qs[128]} (scales at 4, qs at
 * 16): sub-block j's 32 values are the low (j even) or high (j odd)
 * nibbles of qs[32 (j/2) .. 32 (j/2) + 32). */
NB_INLINE void nb_unpack_q4_k(nb_kblock *u, const uint8_t *blk)
{
    const uint8_t *qs = blk + CLB_Q4_K_QS;
    const uint8x16_t m4 = vdupq_n_u8(15);
    for (int k = 0; k < 4; k++) {
        const uint8x16_t q0 = vld1q_u8(qs + 32 * k), q1 = vld1q_u8(qs + 32 * k + 16);
        vst1q_u8((uint8_t *)u->q + 64 * k, vandq_u8(q0, m4));
        vst1q_u8((uint8_t *)u->q + 64 * k + 16, vandq_u8(q1, m4));
        vst1q_u8((uint8_t *)u->q + 64 * k + 32, vshrq_n_u8(q0, 4));
        vst1q_u8((uint8_t *)u->q + 64 * k + 48, vshrq_n_u8(q1, 4));
    }
    nb_q4_k_scales(u, blk + CLB_QK_SCALES);
    u->d = clb_blk_f16(blk, 0);
    u->dmin = clb_blk_f16(blk, 2);
}

/* Q5_K: Q4_K's fields then qh[32] at 16 and qs at 48; bit 4 of sub-block
 * j's value l is bit j of qh[l]. */
NB_INLINE void nb_unpack_q5_k(nb_kblock *u, const uint8_t *blk)
{
    const uint8_t *qs = blk + CLB_Q5_K_QS, *qh = blk + CLB_Q5_K_QH;
    const uint8x16_t m4 = vdupq_n_u8(15), b4 = vdupq_n_u8(16);
    const uint8x16_t h0 = vld1q_u8(qh), h1 = vld1q_u8(qh + 16);
    for (int k = 0; k < 4; k++) {
        /* bit 2k (low nibbles) and 2k + 1 (high) of qh moved to bit 4 */
        const int8x16_t lo_sh = vdupq_n_s8((int8_t)(4 - 2 * k)), hi_sh = vdupq_n_s8((int8_t)(3 - 2 * k));
        const uint8x16_t q0 = vld1q_u8(qs + 32 * k), q1 = vld1q_u8(qs + 32 * k + 16);
        uint8_t *q = (uint8_t *)u->q + 64 * k;
        vst1q_u8(q, vorrq_u8(vandq_u8(q0, m4), vandq_u8(vshlq_u8(h0, lo_sh), b4)));
        vst1q_u8(q + 16, vorrq_u8(vandq_u8(q1, m4), vandq_u8(vshlq_u8(h1, lo_sh), b4)));
        vst1q_u8(q + 32, vorrq_u8(vshrq_n_u8(q0, 4), vandq_u8(vshlq_u8(h0, hi_sh), b4)));
        vst1q_u8(q + 48, vorrq_u8(vshrq_n_u8(q1, 4), vandq_u8(vshlq_u8(h1, hi_sh), b4)));
    }
    nb_q4_k_scales(u, blk + CLB_QK_SCALES);
    u->d = clb_blk_f16(blk, 0);
    u->dmin = clb_blk_f16(blk, 2);
}

/* Q6_K {uint8 ql[128]; uint8 qh[64]; int8 scales[16]; fp16 d}: column
 * 128 h + 32 s + l (h < 2, s < 4, l < 32) has its low 4 bits in
 * ql[64 h + 32 (s % 2) + l] (low nibble for s < 2, high for s >= 2) and
 * its high 2 bits at bit 2 s of qh[32 h + l]. */
NB_INLINE void nb_unpack_q6_k(nb_kblock *u, const uint8_t *blk)
{
    const uint8_t *ql = blk, *qh = blk + CLB_Q6_K_QH;
    const uint8x16_t m4 = vdupq_n_u8(15), m30 = vdupq_n_u8(0x30);
    const int8x16_t off = vdupq_n_s8(32);
    for (int h = 0; h < 2; h++)
        for (int half = 0; half < 2; half++) { /* l in [16 half, 16 half + 16) */
            const int l = 16 * half;
            const uint8x16_t a = vld1q_u8(ql + 64 * h + l);      /* s = 0, 2 */
            const uint8x16_t b = vld1q_u8(ql + 64 * h + 32 + l); /* s = 1, 3 */
            const uint8x16_t hb = vld1q_u8(qh + 32 * h + l);
            /* bits 2s, 2s+1 of hb moved to bits 4, 5 */
            const uint8x16_t v0 = vorrq_u8(vandq_u8(a, m4), vandq_u8(vshlq_n_u8(hb, 4), m30));
            const uint8x16_t v1 = vorrq_u8(vandq_u8(b, m4), vandq_u8(vshlq_n_u8(hb, 2), m30));
            const uint8x16_t v2 = vorrq_u8(vshrq_n_u8(a, 4), vandq_u8(hb, m30));
            const uint8x16_t v3 = vorrq_u8(vshrq_n_u8(b, 4), vandq_u8(vshrq_n_u8(hb, 2), m30));
            int8_t *q = u->q + 128 * h + l;
            vst1q_s8(q, vsubq_s8(vreinterpretq_s8_u8(v0), off));
            vst1q_s8(q + 32, vsubq_s8(vreinterpretq_s8_u8(v1), off));
            vst1q_s8(q + 64, vsubq_s8(vreinterpretq_s8_u8(v2), off));
            vst1q_s8(q + 96, vsubq_s8(vreinterpretq_s8_u8(v3), off));
        }
    const int8_t *sc = (const int8_t *)(blk + CLB_Q6_K_SC);
    for (int j = 0; j < 16; j++)
        u->sc[j] = sc[j];
    u->d = clb_blk_f16(blk, CLB_Q6_K_D);
    u->dmin = 0.0f;
}

/* msum of 4 rows and one token: sum_j m_j * (bsum of sub-block j), with
 * xb the token's 16 sums of 16 (sub-block j = xb[2j] + xb[2j+1]). Exact:
 * |msum| <= 8 * 63 * 4064. */
/* Row u's m_j * bsum_j in 4 lanes (j and j + 4 added). */
NB_INLINE int32x4_t nb_q4_k_mrow(const nb_kblock *u, int32x4_t b0, int32x4_t b1)
{
    return vmlaq_s32(vmulq_s32(vld1q_s32(u->m), b0), vld1q_s32(u->m + 4), b1);
}

NB_INLINE int32x4_t nb_q4_k_msum(const nb_kblock *u, const int16_t *xb)
{
    const int32x4_t b0 = vpaddlq_s16(vld1q_s16(xb));     /* j = 0..3 */
    const int32x4_t b1 = vpaddlq_s16(vld1q_s16(xb + 8)); /* j = 4..7 */
    return nb_hsum4(nb_q4_k_mrow(&u[0], b0, b1), nb_q4_k_mrow(&u[1], b0, b1),
                    nb_q4_k_mrow(&u[2], b0, b1), nb_q4_k_mrow(&u[3], b0, b1));
}

/* One block of the rows u[4 v0 .. 4 (v0 + V)) and tokens 0 .. T: the
 * exact isum of each (row, token) (sum_j sc_j * dot_j; Q6_K 16 sub-blocks
 * of 16 columns, Q4_K 8 of 32), then the dtype's float step into
 * acc[t][v0 + v]. x[t]: the token's 256 activations of the block, xb[t]
 * its 16 sums, xs[t] its scale. */
NB_INLINE void nb_kq_tile(const int q6, const int V, const int T,
                          nb_acc4 acc[][NB_MAXV], int v0, const nb_kblock *u,
                          const int8_t *const x[], const int16_t *const xb[],
                          const float xs[])
{
    u += 4 * v0;
    int32x4_t is[4 * NB_MAXV][NB_MAXT];
    NB_UNROLL
    for (int i = 0; i < 4 * V; i++)
        NB_UNROLL
        for (int t = 0; t < T; t++)
            is[i][t] = vdupq_n_s32(0);
    if (q6) {
        for (int j = 0; j < 16; j++) {
            int8x16_t wv[4 * NB_MAXV];
            NB_UNROLL
            for (int i = 0; i < 4 * V; i++)
                wv[i] = vld1q_s8(u[i].q + 16 * j);
            NB_UNROLL
            for (int t = 0; t < T; t++) {
                const int8x16_t xv = vld1q_s8(x[t] + 16 * j);
                NB_UNROLL
                for (int i = 0; i < 4 * V; i++)
                    is[i][t] = vmlaq_n_s32(is[i][t], nb_dot16(wv[i], xv), u[i].sc[j]);
            }
        }
    } else {
        for (int j = 0; j < 8; j++) {
            int8x16_t w0[4 * NB_MAXV], w1[4 * NB_MAXV];
            NB_UNROLL
            for (int i = 0; i < 4 * V; i++) {
                w0[i] = vld1q_s8(u[i].q + 32 * j);
                w1[i] = vld1q_s8(u[i].q + 32 * j + 16);
            }
            NB_UNROLL
            for (int t = 0; t < T; t++) {
                const int8x16_t x0 = vld1q_s8(x[t] + 32 * j);
                const int8x16_t x1 = vld1q_s8(x[t] + 32 * j + 16);
                NB_UNROLL
                for (int i = 0; i < 4 * V; i++)
                    is[i][t] = vmlaq_n_s32(is[i][t], nb_dot32(w0[i], w1[i], x0, x1),
                                           u[i].sc[j]);
            }
        }
    }
    NB_UNROLL
    for (int v = 0; v < V; v++) {
        const nb_kblock *u4 = u + 4 * v;
        const float d[4] = {u4[0].d, u4[1].d, u4[2].d, u4[3].d};
        const float dmin[4] = {u4[0].dmin, u4[1].dmin, u4[2].dmin, u4[3].dmin};
        NB_UNROLL
        for (int t = 0; t < T; t++) {
            const int i = 4 * v;
            const int32x4_t isum = nb_hsum4(is[i][t], is[i + 1][t], is[i + 2][t], is[i + 3][t]);
            if (q6)
                acc[t][v0 + v] = nb_step_q6_k(acc[t][v0 + v], isum, d, xs[t]);
            else
                acc[t][v0 + v] = nb_step_q4_k(acc[t][v0 + v], isum, nb_q4_k_msum(u4, xb[t]), d, dmin,
                                         xs[t]);
        }
    }
}

/* Y[t0 .. t0+nt, r0 .. r0+NB_G) (the rows that exist), nt <= NB_TT: per
 * block, the group's rows unpacked once, then every token of the chunk in
 * tiles of 4 rows x NB_TP tokens, the last tokens one at a time with all
 * NB_G rows in flight (rows past the matrix: copies of the last row,
 * computed, not stored; two tile shapes only: code size). */
NB_INLINE void nb_kq_chunk(const int kq, float *Y, const uint8_t *W, const int8_t *XQ,
                           const float *XS, const int16_t *XB, uint32_t nb,
                           uint32_t rows, uint32_t r0, uint32_t t0, uint32_t nt)
{
    const int q6 = kq == NB_Q6_K;
    const size_t bytes = q6 ? CLB_Q6_K_BYTES : kq == NB_Q5_K ? CLB_Q5_K_BYTES : CLB_Q4_K_BYTES;
    /* row groups of 4 that hold a real row: the prefill tiles skip the
     * others */
    const int nv = rows - r0 >= NB_G ? NB_G / 4 : (int)((rows - r0 + 3) / 4);
    nb_acc4 acc[NB_TT][NB_MAXV];
    for (uint32_t t = 0; t < nt; t++)
        for (int v = 0; v < NB_DV; v++)
            acc[t][v] = nb_acc_zero();
    for (uint32_t b = 0; b < nb; b++) {
        nb_kblock u[NB_G];
        for (int i = 0; i < NB_G; i++) {
            const uint8_t *blk = W + ((size_t)nb_row(r0, i, rows) * nb + b) * bytes;
            if (q6)
                nb_unpack_q6_k(&u[i], blk);
            else if (kq == NB_Q5_K)
                nb_unpack_q5_k(&u[i], blk);
            else
                nb_unpack_q4_k(&u[i], blk);
        }
        const int8_t *x[NB_TT];
        const int16_t *xb[NB_TT];
        float xs[NB_TT];
        for (uint32_t t = 0; t < nt; t++) {
            const size_t tok = t0 + t;
            x[t] = XQ + (tok * nb + b) * CLB_QK_COLS;
            xb[t] = XB + (tok * nb + b) * (CLB_QK_COLS / 16);
            xs[t] = XS[tok * nb + b];
        }
        uint32_t t = 0;
        for (; t + NB_TP <= nt; t += NB_TP)
            for (int v = 0; v < nv; v++)
                nb_kq_tile(q6, 1, NB_TP, acc + t, v, u, x + t, xb + t, xs + t);
        for (; t < nt; t++)
            nb_kq_tile(q6, NB_DV, 1, acc + t, 0, u, x + t, xb + t, xs + t);
    }
    for (uint32_t t = 0; t < nt; t++)
        for (int v = 0; v < nv; v++)
            nb_store_rows(Y + (size_t)(t0 + t) * rows, acc[t][v], r0 + 4u * (uint32_t)v, rows);
}

/* Q4_K, Q5_K or Q6_K (kq = NB_Q4_K, ...): row groups of NB_G, token chunks
 * of NB_TT. */
NB_INLINE void nb_matmul_kq(const int kq, float *Y, const uint8_t *W, const int8_t *XQ,
                            const float *XS, const int16_t *XB, uint32_t n,
                            uint32_t rows, uint32_t cols)
{
    const uint32_t nb = (cols + CLB_QK_COLS - 1) / CLB_QK_COLS;
    for (uint32_t r0 = 0; r0 < rows; r0 += NB_G)
        for (uint32_t t0 = 0; t0 < n; t0 += NB_TT)
            nb_kq_chunk(kq, Y, W, XQ, XS, XB, nb, rows, r0, t0,
                        n - t0 < NB_TT ? n - t0 : NB_TT);
}

#ifdef __aarch64__
/* The "neon-dotprod" block kernels, defined in neon_dotprod.c (compiled
 * for armv8.2-a+dotprod). Call them only on a CPU with the extension. */
void colibri_neon_dotprod_matmul_q4_0(float *Y, const uint8_t *W, const int8_t *XQ,
                                      const float *XS, const int16_t *XB, uint32_t n,
                                      uint32_t rows, uint32_t cols);
void colibri_neon_dotprod_matmul_q4_k(float *Y, const uint8_t *W, const int8_t *XQ,
                                      const float *XS, const int16_t *XB, uint32_t n,
                                      uint32_t rows, uint32_t cols);
void colibri_neon_dotprod_matmul_q6_k(float *Y, const uint8_t *W, const int8_t *XQ,
                                      const float *XS, const int16_t *XB, uint32_t n,
                                      uint32_t rows, uint32_t cols);
void colibri_neon_dotprod_matmul_q5_0(float *Y, const uint8_t *W, const int8_t *XQ,
                                      const float *XS, const int16_t *XB, uint32_t n,
                                      uint32_t rows, uint32_t cols);
void colibri_neon_dotprod_matmul_q8_0(float *Y, const uint8_t *W, const int8_t *XQ,
                                      const float *XS, const int16_t *XB, uint32_t n,
                                      uint32_t rows, uint32_t cols);
#endif

#endif /* COLIBRI_NEON_BLOCKS_H */
