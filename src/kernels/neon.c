/*
 * neon.c - NEON kernels for ARMv7-A and AArch64 (the tables "neon" and, on
 * AArch64, "neon-dotprod"; kernels.h).
 *
 * Build: the whole file is inside `#if COLIBRI_USE_NEON` and needs a compiler
 * targeting NEON: armv7 with -march=armv7-a -mfpu=neon -mfloat-abi=hard,
 * AArch64 with any -march (NEON is part of ARMv8-A; the library is built for
 * plain armv8-a). Without them the getter still exists and returns NULL, so
 * every target links the same set of getters. Both ISAs share the float
 * kernels' structure; where A64 has more (32 q registers instead of 16,
 * full-width pairwise adds, fused multiply-add, round-to-nearest-even
 * conversion) the code says `#ifdef __aarch64__`. The A64 int8 matmul is
 * its own code (neon_a64_i8.h), shared with neon_dotprod.c (SDOT).
 *
 * Arithmetic: docs/FORMAT.md section 5, checked against ref.c by
 * tests/c/test_kernels.c (run under qemu-arm and qemu-aarch64). Per kernel:
 * - matmul_f32, matmul_i16: agree with ref to float rounding (4 lanes, then
 *   a pairwise sum: another summation order). ARMv7-A NEON has no fused
 *   multiply-add (vmlaq_f32 rounds the product, then the sum); A64 uses
 *   vfmaq_f32, one rounding, as the AVX2 kernels' FMA does.
 * - quantize_act_i8: bit-identical to ref on both ISAs. ARMv7 NEON float
 *   arithmetic always flushes subnormals to zero: the groups where that
 *   could matter go to ref, see QA_MIN_BITS. ARMv7 has no
 *   round-to-nearest-even vector instruction (vcvtnq is ARMv8): rint is
 *   (v + 1.5*2^23) - 1.5*2^23 on the value already clamped to [-127, 127]:
 *   the sum lies in [2^23, 2^24), where the float spacing is 1, so the
 *   addition itself rounds to an integer, ties to even (1.5*2^23 is even).
 * - matmul_i8: integer group dots exact on both ISAs. On ARMv7 the float
 *   sum over groups runs in another order than ref's (agrees to rounding).
 *   On AArch64 ("neon", and "neon-dotprod" whose SDOT form lives in
 *   neon_dotprod.c) the result is bit-identical to ref: each output's float
 *   operations are ref's, in ref's order (neon_a64_i8.h).
 * - quantize_act_blk: bit-identical to ref (quantize_act_i8 per block).
 * - matmul_q4_0, matmul_q5_0, matmul_q8_0, matmul_q4_k, matmul_q5_k, matmul_q6_k: bit-identical to ref on both
 *   ISAs, for any tiling (neon_blocks.h, shared with neon_dotprod.c).
 * - attend, attend_rows: bit-identical to ref. On AArch64 16 positions in
 *   four vectors, ref's fused multiply-adds as FMLA (neon_attend.c, both
 *   tables); ARMv7 runs ref's (no fused vector multiply-add).
 *
 * Blocking (float kernels, ARMv7 int8): dot-product form as in avx2.c: R
 * weight rows x T tokens, one 4-lane accumulator per pair; weights loaded
 * once per T tokens. The A64 int8 form runs its lanes along rows instead
 * (neon_a64_i8.h). No allocation, no alignment assumption (vld1q accepts
 * any address).
 */
#include "kernels.h"

#if defined(COLIBRI_USE_NEON) && defined(__ARM_NEON)

#include <arm_neon.h>
#include <string.h>
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h> /* getauxval: the CPU's dot-product support */
#endif

#include "neon_inline.h" /* BLOCK, UNROLL */

enum { MAXR = 8, MAXT = 4 };

/* Float multiply-add of the float kernels: fused on A64, where every core
 * has it; ARMv7-A NEON only has the unfused vmla (VFPv4's vfma is not in
 * plain armv7-a). -ffp-contract has no effect on either intrinsic. */
#ifdef __aarch64__
#define MLA(acc, a, b) vfmaq_f32(acc, a, b)
#else
#define MLA(acc, a, b) vmlaq_f32(acc, a, b)
#endif

/* Horizontal sums of a, b, c, d -> [sum a, sum b, sum c, sum d]. A64 adds
 * pairs across two full vectors in one instruction (faddp). */
BLOCK float32x4_t hsum4f(float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t d)
{
#ifdef __aarch64__
    return vpaddq_f32(vpaddq_f32(a, b), vpaddq_f32(c, d));
#else
    float32x2_t ab = vpadd_f32(vadd_f32(vget_low_f32(a), vget_high_f32(a)),
                               vadd_f32(vget_low_f32(b), vget_high_f32(b)));
    float32x2_t cd = vpadd_f32(vadd_f32(vget_low_f32(c), vget_high_f32(c)),
                               vadd_f32(vget_low_f32(d), vget_high_f32(d)));
    return vcombine_f32(ab, cd);
#endif
}

BLOCK float hsum1f(float32x4_t a)
{
#ifdef __aarch64__
    return vaddvq_f32(a);
#else
    float32x2_t s = vadd_f32(vget_low_f32(a), vget_high_f32(a));
    return vget_lane_f32(vpadd_f32(s, s), 0);
#endif
}

BLOCK int32x4_t hsum4i(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d)
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

/* Store acc[r][t] horizontally summed, plus tail[r][t] (the scalar part of
 * the columns), times scale[r] when given, into Y[t0 + t, r0 + r]. */
BLOCK void store_block(const int R, const int T, float32x4_t acc[MAXR][MAXT],
                       float tail[MAXR][MAXT], float *Y, uint32_t rows,
                       uint32_t r0, uint32_t t0, const float *scale)
{
    UNROLL
    for (int t = 0; t < T; t++) {
        float *y = Y + (size_t)(t0 + t) * rows + r0;
        int r = 0;
        UNROLL
        for (; r + 4 <= R; r += 4) {
            float32x4_t v = hsum4f(acc[r][t], acc[r + 1][t], acc[r + 2][t], acc[r + 3][t]);
            float tl[4] = {tail[r][t], tail[r + 1][t], tail[r + 2][t], tail[r + 3][t]};
            v = vaddq_f32(v, vld1q_f32(tl));
            if (scale)
                v = vmulq_f32(v, vld1q_f32(scale + r));
            vst1q_f32(y + r, v);
        }
        UNROLL
        for (; r < R; r++) {
            float v = hsum1f(acc[r][t]) + tail[r][t];
            y[r] = scale ? scale[r] * v : v;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Float activations: matmul_f32 (W float) and matmul_i16 (W int16 -> float). */

/* Y[t0..t0+T, r0..r0+R] for float activations and weights W [rows, cols]
 * (float, or int16 with per-row scales S when i16). Per 8 columns: R weight
 * loads (8 int16 widen to two float vectors), 2T activation loads, 2RT
 * multiply-adds. Columns past the last multiple of 8 go through a scalar
 * loop into tail[r][t]. */
BLOCK void fx_block(const int i16, const int R, const int T, float *Y,
                    const void *W, const float *S, const float *X, uint32_t rows,
                    uint32_t cols, uint32_t r0, uint32_t t0)
{
    const float *wf[MAXR];
    const int16_t *wq[MAXR];
    const float *x[MAXT];
    float32x4_t acc[MAXR][MAXT];
    float tail[MAXR][MAXT];
    UNROLL
    for (int r = 0; r < R; r++) {
        wf[r] = (const float *)W + (size_t)(r0 + r) * cols;
        wq[r] = (const int16_t *)W + (size_t)(r0 + r) * cols;
    }
    UNROLL
    for (int t = 0; t < T; t++)
        x[t] = X + (size_t)(t0 + t) * cols;
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < T; t++) {
            acc[r][t] = vdupq_n_f32(0.0f);
            tail[r][t] = 0.0f;
        }

    uint32_t c = 0;
    for (; c + 8 <= cols; c += 8) {
        float32x4_t xl[MAXT], xh[MAXT];
        UNROLL
        for (int t = 0; t < T; t++) {
            xl[t] = vld1q_f32(x[t] + c);
            xh[t] = vld1q_f32(x[t] + c + 4);
        }
        UNROLL
        for (int r = 0; r < R; r++) {
            float32x4_t wl, wh;
            if (i16) {
                int16x8_t q = vld1q_s16(wq[r] + c);
                wl = vcvtq_f32_s32(vmovl_s16(vget_low_s16(q)));
                wh = vcvtq_f32_s32(vmovl_s16(vget_high_s16(q)));
            } else {
                wl = vld1q_f32(wf[r] + c);
                wh = vld1q_f32(wf[r] + c + 4);
            }
            UNROLL
            for (int t = 0; t < T; t++) {
                acc[r][t] = MLA(acc[r][t], wl, xl[t]);
                acc[r][t] = MLA(acc[r][t], wh, xh[t]);
            }
        }
    }
    for (; c < cols; c++)
        UNROLL
        for (int r = 0; r < R; r++) {
            float w = i16 ? (float)wq[r][c] : wf[r][c];
            UNROLL
            for (int t = 0; t < T; t++)
                tail[r][t] += w * x[t][c];
        }
    store_block(R, T, acc, tail, Y, rows, r0, t0, i16 ? S + r0 : NULL);
}

#ifdef __aarch64__
/* A64 has 32 q registers: 4 rows x 4 tokens while four tokens are left (16
 * accumulators, 8 activation and 2 weight registers: each weight load
 * serves 4 tokens), then single tokens in blocks of 8 rows, whose 8
 * independent accumulator chains cover the FMA latency in decode. */
BLOCK void fx_matmul(const int i16, float *Y, const void *W, const float *S,
                     const float *X, uint32_t n, uint32_t rows, uint32_t cols)
{
    uint32_t t = 0;
    for (; t + 4 <= n; t += 4) {
        uint32_t r = 0;
        for (; r + 4 <= rows; r += 4)
            fx_block(i16, 4, 4, Y, W, S, X, rows, cols, r, t);
        for (; r < rows; r++)
            fx_block(i16, 1, 4, Y, W, S, X, rows, cols, r, t);
    }
    for (; t < n; t++) {
        uint32_t r = 0;
        for (; r + 8 <= rows; r += 8)
            fx_block(i16, 8, 1, Y, W, S, X, rows, cols, r, t);
        for (; r + 4 <= rows; r += 4)
            fx_block(i16, 4, 1, Y, W, S, X, rows, cols, r, t);
        for (; r < rows; r++)
            fx_block(i16, 1, 1, Y, W, S, X, rows, cols, r, t);
    }
}
#else
/* ARMv7: 4 rows x 2 tokens while two tokens are left (8 accumulators + 4
 * weight and 4 activation registers of the 16 q registers), else 4 rows x 1
 * token. */
BLOCK void fx_matmul(const int i16, float *Y, const void *W, const float *S,
                     const float *X, uint32_t n, uint32_t rows, uint32_t cols)
{
    uint32_t t = 0;
    for (; t + 2 <= n; t += 2) {
        uint32_t r = 0;
        for (; r + 4 <= rows; r += 4)
            fx_block(i16, 4, 2, Y, W, S, X, rows, cols, r, t);
        for (; r < rows; r++)
            fx_block(i16, 1, 2, Y, W, S, X, rows, cols, r, t);
    }
    for (; t < n; t++) {
        uint32_t r = 0;
        for (; r + 4 <= rows; r += 4)
            fx_block(i16, 4, 1, Y, W, S, X, rows, cols, r, t);
        for (; r < rows; r++)
            fx_block(i16, 1, 1, Y, W, S, X, rows, cols, r, t);
    }
}
#endif

static void neon_matmul_f32(float *Y, const float *W, const float *X,
                            uint32_t n, uint32_t rows, uint32_t cols)
{
    fx_matmul(0, Y, W, NULL, X, n, rows, cols);
}

static void neon_matmul_i16(float *Y, const int16_t *Q, const float *S,
                            const float *X, uint32_t n, uint32_t rows,
                            uint32_t cols)
{
    fx_matmul(1, Y, Q, S, X, n, rows, cols);
}

/* ------------------------------------------------------------------------ */
/* quantize_act_i8: bit-identical to ref (same float32 operations). */

/* Largest |x| of x[0..len) as the bits of a non-negative float: for those the
 * integer order is the numeric order, so an integer max is exact, ignores
 * flush-to-zero, and shows a NaN as a pattern above +inf (0x7f800000). */
static uint32_t amax_bits(const float *x, uint32_t len)
{
    const uint32x4_t abs_mask = vdupq_n_u32(0x7fffffffu);
    uint32x4_t m = vdupq_n_u32(0);
    uint32_t c = 0;
    for (; c + 4 <= len; c += 4)
        m = vmaxq_u32(m, vandq_u32(vreinterpretq_u32_f32(vld1q_f32(x + c)), abs_mask));
#ifdef __aarch64__
    uint32_t best = vmaxvq_u32(m);
#else
    uint32x2_t h = vpmax_u32(vget_low_u32(m), vget_high_u32(m));
    uint32_t best = vget_lane_u32(vpmax_u32(h, h), 0);
#endif
    for (; c < len; c++) {
        uint32_t b;
        memcpy(&b, x + c, sizeof b);
        b &= 0x7fffffffu;
        if (b > best)
            best = b;
    }
    return best;
}

/* clip(rint(x * inv), -127, 127) for 4 floats, as int32. x * inv is the same
 * IEEE product as ref's; clamping before rounding to an integer gives the
 * same integer as after. A64 converts rounding to nearest, ties to even
 * (fcvtns), which is rint in the default rounding mode; ARMv7 rounds with
 * the 1.5 * 2^23 addition (file header). */
BLOCK int32x4_t q4(float32x4_t x, float32x4_t inv)
{
    const float32x4_t lo = vdupq_n_f32(-127.0f), hi = vdupq_n_f32(127.0f);
    float32x4_t v = vminq_f32(vmaxq_f32(vmulq_f32(x, inv), lo), hi);
#ifdef __aarch64__
    return vcvtnq_s32_f32(v);
#else
    const float32x4_t magic = vdupq_n_f32(12582912.0f); /* 1.5 * 2^23 */
    v = vsubq_f32(vaddq_f32(v, magic), magic);
    return vcvtq_s32_f32(v); /* exact: v is an integer */
#endif
}

BLOCK int8x8_t q8(const float *x, float32x4_t inv)
{
    int16x8_t h = vcombine_s16(vmovn_s32(q4(vld1q_f32(x), inv)),
                               vmovn_s32(q4(vld1q_f32(x + 4), inv)));
    return vmovn_s16(h);
}

/* Groups whose amax is below this (including all-zero ones), infinite or NaN
 * go to ref. Above it, inv = 127/amax is finite, every |x * inv| <= 127, and
 * a subnormal x (which ARMv7 NEON flushes to 0) would give |x * inv| < 127 *
 * 2^-126 * 2^118 < 0.5, which ref rounds to 0 as well. (A64 NEON honours
 * subnormals like scalar code; the bound is harmless there.) */
#define QA_MIN_BITS 0x04800000u /* 2^-118 */

static void neon_quantize_act_i8(int8_t *XQ, float *XS, const float *X,
                                 uint32_t n, uint32_t cols, uint32_t group)
{
    const uint32_t ng = (cols + group - 1) / group;
    for (uint32_t t = 0; t < n; t++) {
        const float *x = X + (size_t)t * cols;
        int8_t *xq = XQ + (size_t)t * cols;
        float *xs = XS + (size_t)t * ng;
        for (uint32_t g = 0; g < ng; g++) {
            const uint32_t c0 = g * group;
            const uint32_t len = cols - c0 < group ? cols - c0 : group;
            const uint32_t ab = amax_bits(x + c0, len);
            if (ab < QA_MIN_BITS || ab >= 0x7f800000u) {
                colibri_kernels_ref()->quantize_act_i8(xq + c0, xs + g, x + c0, 1,
                                                       len, len);
                continue;
            }
            float amax;
            memcpy(&amax, &ab, sizeof amax);
            xs[g] = amax / 127.0f;
            const float32x4_t inv = vdupq_n_f32(127.0f / amax);
            uint32_t c = 0;
            for (; c + 8 <= len; c += 8)
                vst1_s8(xq + c0 + c, q8(x + c0 + c, inv));
            if (c < len) { /* the same vector path on a zero-padded copy */
                float tmp[8] = {0};
                int8_t out[8];
                memcpy(tmp, x + c0 + c, (len - c) * sizeof(float));
                vst1_s8(out, q8(tmp, inv));
                memcpy(xq + c0 + c, out, len - c);
            }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* quantize_act_blk: bit-identical to ref. */

/* The sum of 16 int8 values (|sum| <= 2032), exact. */
BLOCK int16_t sum16_s8(const int8_t *q)
{
    const int8x16_t v = vld1q_s8(q);
#ifdef __aarch64__
    return vaddlvq_s8(v);
#else
    const int64x2_t s = vpaddlq_s32(vpaddlq_s16(vpaddlq_s8(v)));
    return (int16_t)(vgetq_lane_s64(s, 0) + vgetq_lane_s64(s, 1));
#endif
}

/* Per token: the real columns exactly as quantize_act_i8 with group
 * `block` (neon_quantize_act_i8, bit-identical to ref's), zeros up to the
 * padded row nb * block, then XB = the sums of each 16 XQ values. */
static void neon_quantize_act_blk(int8_t *XQ, float *XS, int16_t *XB, const float *X,
                                  uint32_t n, uint32_t cols, uint32_t block)
{
    const uint32_t nb = (cols + block - 1) / block;
    const size_t padded = (size_t)nb * block;
    for (uint32_t t = 0; t < n; t++) {
        int8_t *xq = XQ + (size_t)t * padded;
        int16_t *xb = XB + (size_t)t * (padded / 16);
        neon_quantize_act_i8(xq, XS + (size_t)t * nb, X + (size_t)t * cols, 1, cols, block);
        memset(xq + cols, 0, padded - cols);
        for (size_t s = 0; s < padded / 16; s++)
            xb[s] = sum16_s8(xq + 16 * s);
    }
}

/* ------------------------------------------------------------------------ */
/* Block-quantised weights (neon_blocks.h; SDOT forms in neon_dotprod.c). */

#include "neon_blocks.h" /* without SDOT here: plain ARMv7-A / ARMv8-A */

static void neon_matmul_q4_0(float *Y, const uint8_t *W, const int8_t *XQ, const float *XS,
                             const int16_t *XB, uint32_t n, uint32_t rows, uint32_t cols)
{
    (void)XB;
    nb_matmul_q4_0(COLIBRI_DTYPE_Q4_0, Y, W, XQ, XS, n, rows, cols);
}

static void neon_matmul_q5_0(float *Y, const uint8_t *W, const int8_t *XQ, const float *XS,
                             const int16_t *XB, uint32_t n, uint32_t rows, uint32_t cols)
{
    (void)XB;
    nb_matmul_q4_0(COLIBRI_DTYPE_Q5_0, Y, W, XQ, XS, n, rows, cols);
}

static void neon_matmul_q8_0(float *Y, const uint8_t *W, const int8_t *XQ, const float *XS,
                             const int16_t *XB, uint32_t n, uint32_t rows, uint32_t cols)
{
    (void)XB;
    nb_matmul_q4_0(COLIBRI_DTYPE_Q8_0, Y, W, XQ, XS, n, rows, cols);
}

static void neon_matmul_q4_k(float *Y, const uint8_t *W, const int8_t *XQ, const float *XS,
                             const int16_t *XB, uint32_t n, uint32_t rows, uint32_t cols)
{
    nb_matmul_kq(NB_Q4_K, Y, W, XQ, XS, XB, n, rows, cols);
}

static void neon_matmul_q6_k(float *Y, const uint8_t *W, const int8_t *XQ, const float *XS,
                             const int16_t *XB, uint32_t n, uint32_t rows, uint32_t cols)
{
    nb_matmul_kq(NB_Q6_K, Y, W, XQ, XS, XB, n, rows, cols);
}

static void neon_matmul_q5_k(float *Y, const uint8_t *W, const int8_t *XQ, const float *XS,
                             const int16_t *XB, uint32_t n, uint32_t rows, uint32_t cols)
{
    nb_matmul_kq(NB_Q5_K, Y, W, XQ, XS, XB, n, rows, cols);
}

/* ------------------------------------------------------------------------ */
#ifndef __aarch64__
/* matmul_i8 on ARMv7: integer dot products, never dequantising the weights.
 *
 * Per 16 columns and (row, token): vmull_s8 multiplies the low 8 bytes to
 * int16, vmlal_s8 adds the high 8 bytes' products, vpadalq_s16 adds the int16
 * pairs into int32 lanes. Each product is at most 128 * 127 = 16256 in
 * magnitude, two of them 32512: no int16 overflow as long as xq != -128,
 * which quantize_act_i8 guarantees; weights may hold -128. The 4 int32 lanes
 * of a group are summed as integers before any float (lanes that cancel
 * would otherwise lose precision): groups go in batches of 4, whose lane
 * vectors reduce pairwise into one vector of 4 exact dots, converted and
 * multiplied by S[r,g] * XS[t,g] (the product ref forms). */

BLOCK int32x4_t dot16(int32x4_t acc, int8x16_t q, int8x16_t x)
{
    int16x8_t p = vmull_s8(vget_low_s8(q), vget_low_s8(x));
    p = vmlal_s8(p, vget_high_s8(q), vget_high_s8(x));
    return vpadalq_s16(acc, p);
}

/* Exact dot products of columns [c, c1) for R rows x T tokens, as lane
 * vectors (their lane sum is the dot), into d[r][t][j]. */
BLOCK void i8_group(const int R, const int T, int32x4_t d[MAXR][MAXT][4], int j,
                    const int8_t *const q[MAXR], const int8_t *const x[MAXT],
                    uint32_t c, uint32_t c1)
{
    int32x4_t iacc[MAXR][MAXT];
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < T; t++)
            iacc[r][t] = vdupq_n_s32(0);
    for (; c + 16 <= c1; c += 16) {
        int8x16_t qv[MAXR];
        UNROLL
        for (int r = 0; r < R; r++)
            qv[r] = vld1q_s8(q[r] + c);
        UNROLL
        for (int t = 0; t < T; t++) {
            int8x16_t xv = vld1q_s8(x[t] + c);
            UNROLL
            for (int r = 0; r < R; r++)
                iacc[r][t] = dot16(iacc[r][t], qv[r], xv);
        }
    }
    if (c + 8 <= c1) {
        UNROLL
        for (int t = 0; t < T; t++) {
            int8x8_t xv = vld1_s8(x[t] + c);
            UNROLL
            for (int r = 0; r < R; r++)
                iacc[r][t] = vpadalq_s16(iacc[r][t], vmull_s8(vld1_s8(q[r] + c), xv));
        }
        c += 8;
    }
    if (c < c1) /* under 8 columns: scalar, added into lane 0 */
        UNROLL
        for (int r = 0; r < R; r++)
            UNROLL
            for (int t = 0; t < T; t++) {
                int32_t s = 0;
                for (uint32_t i = c; i < c1; i++)
                    s += (int32_t)q[r][i] * (int32_t)x[t][i];
                iacc[r][t] = vaddq_s32(iacc[r][t], vsetq_lane_s32(s, vdupq_n_s32(0), 0));
            }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < T; t++)
            d[r][t][j] = iacc[r][t];
}

BLOCK void i8_block(const int R, const int T, float *Y, const int8_t *Q,
                    const float *S, const int8_t *XQ, const float *XS,
                    uint32_t rows, uint32_t cols, uint32_t group, uint32_t ng,
                    uint32_t r0, uint32_t t0)
{
    const int8_t *q[MAXR];
    const int8_t *x[MAXT];
    const float *s[MAXR];
    const float *xs[MAXT];
    float32x4_t acc[MAXR][MAXT];
    float zero_tail[MAXR][MAXT];
    UNROLL
    for (int r = 0; r < R; r++) {
        q[r] = Q + (size_t)(r0 + r) * cols;
        s[r] = S + (size_t)(r0 + r) * ng;
    }
    UNROLL
    for (int t = 0; t < T; t++) {
        x[t] = XQ + (size_t)(t0 + t) * cols;
        xs[t] = XS + (size_t)(t0 + t) * ng;
    }
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < T; t++) {
            acc[r][t] = vdupq_n_f32(0.0f);
            zero_tail[r][t] = 0.0f;
        }

    for (uint32_t gb = 0; gb < ng; gb += 4) {
        const int nb = ng - gb < 4 ? (int)(ng - gb) : 4;
        int32x4_t d[MAXR][MAXT][4];
        for (int j = 0; j < nb; j++) {
            const uint32_t c0 = (gb + (uint32_t)j) * group;
            const uint32_t c1 = cols - c0 < group ? cols : c0 + group;
            i8_group(R, T, d, j, q, x, c0, c1);
        }
        float32x4_t sv[MAXR], xsv[MAXT];
        if (nb == 4) {
            UNROLL
            for (int r = 0; r < R; r++)
                sv[r] = vld1q_f32(s[r] + gb);
            UNROLL
            for (int t = 0; t < T; t++)
                xsv[t] = vld1q_f32(xs[t] + gb);
        } else { /* last batch: zero dots and zero scales past the row end */
            for (int j = nb; j < 4; j++)
                UNROLL
                for (int r = 0; r < R; r++)
                    UNROLL
                    for (int t = 0; t < T; t++)
                        d[r][t][j] = vdupq_n_s32(0);
            UNROLL
            for (int r = 0; r < R; r++) {
                float tmp[4] = {0};
                memcpy(tmp, s[r] + gb, (size_t)nb * sizeof(float));
                sv[r] = vld1q_f32(tmp);
            }
            UNROLL
            for (int t = 0; t < T; t++) {
                float tmp[4] = {0};
                memcpy(tmp, xs[t] + gb, (size_t)nb * sizeof(float));
                xsv[t] = vld1q_f32(tmp);
            }
        }
        UNROLL
        for (int r = 0; r < R; r++)
            UNROLL
            for (int t = 0; t < T; t++) {
                int32x4_t dots = hsum4i(d[r][t][0], d[r][t][1], d[r][t][2], d[r][t][3]);
                acc[r][t] = vmlaq_f32(acc[r][t], vcvtq_f32_s32(dots),
                                      vmulq_f32(sv[r], xsv[t]));
            }
    }
    store_block(R, T, acc, zero_tail, Y, rows, r0, t0, NULL);
}

/* 2 rows x 2 tokens while two tokens are left, else 4 rows x 1 token. */
static void neon_matmul_i8(float *Y, const int8_t *Q, const float *S,
                           const int8_t *XQ, const float *XS, uint32_t n,
                           uint32_t rows, uint32_t cols, uint32_t group)
{
    const uint32_t ng = (cols + group - 1) / group;
    uint32_t t = 0;
    for (; t + 2 <= n; t += 2) {
        uint32_t r = 0;
        for (; r + 2 <= rows; r += 2)
            i8_block(2, 2, Y, Q, S, XQ, XS, rows, cols, group, ng, r, t);
        for (; r < rows; r++)
            i8_block(1, 2, Y, Q, S, XQ, XS, rows, cols, group, ng, r, t);
    }
    for (; t < n; t++) {
        uint32_t r = 0;
        for (; r + 4 <= rows; r += 4)
            i8_block(4, 1, Y, Q, S, XQ, XS, rows, cols, group, ng, r, t);
        for (; r < rows; r++)
            i8_block(1, 1, Y, Q, S, XQ, XS, rows, cols, group, ng, r, t);
    }
}

#else /* __aarch64__: the int8 matmul shared with neon_dotprod.c */

#include "neon_a64_i8.h" /* without SDOT here: this file is plain ARMv8-A */

static void neon_matmul_i8(float *Y, const int8_t *Q, const float *S,
                           const int8_t *XQ, const float *XS, uint32_t n,
                           uint32_t rows, uint32_t cols, uint32_t group)
{
    a64_matmul_i8(Y, Q, S, XQ, XS, n, rows, cols, group);
}
#endif /* __aarch64__ */

#ifdef __aarch64__
#define NEON_ATTEND clb_neon_attend /* neon_attend.c: fused vector FMA */
#define NEON_ATTEND_ROWS clb_neon_attend_rows
#define NEON_SILU_MUL clb_neon_silu_mul
#else /* ARMv7: no fused vector multiply-add, ref's attention (the same bits) */
#define NEON_ATTEND clb_ref_attend
#define NEON_ATTEND_ROWS clb_ref_attend_rows
#define NEON_SILU_MUL clb_ref_silu_mul
#endif

/* ------------------------------------------------------------------------ */

static const colibri_kernels neon_kernels = {
    "neon",
    neon_matmul_f32,
    neon_quantize_act_i8,
    neon_matmul_i8,
    neon_matmul_i16,
    neon_quantize_act_blk,
    neon_matmul_q4_0,
    neon_matmul_q4_k,
    neon_matmul_q6_k,
    neon_matmul_q5_0,
    neon_matmul_q5_k,
    neon_matmul_q8_0,
    NEON_ATTEND,
    NEON_ATTEND_ROWS,
    NEON_SILU_MUL,
};

#ifdef __aarch64__
/* "neon" with SDOT for the int8 dot products (neon_dotprod.c): the same
 * results, bit for bit. */
static const colibri_kernels neon_dotprod_kernels = {
    "neon-dotprod",
    neon_matmul_f32,
    neon_quantize_act_i8,
    colibri_neon_dotprod_matmul_i8, /* neon_dotprod.c */
    neon_matmul_i16,
    neon_quantize_act_blk,
    colibri_neon_dotprod_matmul_q4_0, /* neon_dotprod.c */
    colibri_neon_dotprod_matmul_q4_k,
    colibri_neon_dotprod_matmul_q6_k,
    colibri_neon_dotprod_matmul_q5_0,
    neon_matmul_q5_k, /* one form in both tables (code size; the same bits) */
    colibri_neon_dotprod_matmul_q8_0,
    clb_neon_attend,
    clb_neon_attend_rows,
    clb_neon_silu_mul,
};

/* Whether this CPU executes SDOT (FEAT_DotProd, optional from ARMv8.2-A).
 * On Linux the kernel reports it in the hardware capabilities
 * (HWCAP_ASIMDDP); a build for such a CPU (-march=...+dotprod defines
 * __ARM_FEATURE_DOTPROD) may assume it. Elsewhere we cannot ask safely
 * (reading ID_AA64ISAR0_EL1 traps on kernels that do not emulate it), so
 * the answer is no: the plain "neon" table gives the same results. */
static int cpu_has_dotprod(void)
{
#if defined(__ARM_FEATURE_DOTPROD)
    return 1;
#elif defined(__linux__)
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1u << 20) /* Linux arch/arm64 uapi hwcap.h */
#endif
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
    return 0;
#endif
}
#endif

const colibri_kernels *colibri_kernels_neon(void)
{
#ifdef __aarch64__
    if (cpu_has_dotprod())
        return &neon_dotprod_kernels;
#endif
    return &neon_kernels;
}

#else /* not built with COLIBRI_USE_NEON, or no NEON */

const colibri_kernels *colibri_kernels_neon(void)
{
    return NULL;
}

#endif
