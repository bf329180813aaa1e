/*
 * neon_a64_i8.h - the AArch64 int8 matmul (kernels.h matmul_i8), included
 * by neon.c for the "neon" table and by neon_dotprod.c for "neon-dotprod".
 * The one difference is the integer dot-product step, chosen by
 * __ARM_FEATURE_DOTPROD, which GCC defines only where the code is compiled
 * for a CPU with the dot-product extension (neon_dotprod.c's pragma):
 * - without: per 16 columns vmull_s8 + vmlal_high_s8 (int16 products of
 *   pairs: at most 2 * 128 * 127 = 32512 in magnitude, so no overflow as
 *   long as xq != -128, which quantize_act_i8 guarantees; weights may hold
 *   -128), then vpadalq_s16 adds the int16 pairs into int32 lanes;
 * - with: one SDOT per 16 columns (each int32 lane += 4 int8 products,
 *   computed in 32 bits: exact for any int8 values).
 *
 * Result: bit-identical to ref (ref.c). Ref computes each output as acc =
 * 0; for each group g in order: acc += float(dot_g) * (S[r,g] * XS[t,g]).
 * Here vector lanes run along 4 weight rows, so each lane performs exactly
 * that sequence of float operations for its row: the same multiplications
 * and additions, in group order, each rounded once. The group dots are
 * exact int32 (a group's lane vector is summed as integers, pairwise with
 * addp, before the conversion), and an exact int32 converts to the same
 * float whatever order produced it. This needs -ffp-contract=off (the
 * project's COMMON_CFLAGS, as for ref.c): GCC's AArch64 vmulq_f32 and
 * vaddq_f32 are plain C operators that the compiler could otherwise fuse.
 *
 * Contract: defines static functions (each includer gets its own copy) and
 * declares neon_dotprod.c's entry point; AArch64 only. No allocation, no
 * alignment assumption, no access outside the arguments.
 */
#ifndef COLIBRI_NEON_A64_I8_H
#define COLIBRI_NEON_A64_I8_H

#if !defined(__aarch64__)
#error "neon_a64_i8.h is AArch64 code"
#endif

#include <arm_neon.h>
#include <stddef.h>
#include <stdint.h>

#define A64_BLOCK static inline __attribute__((always_inline))
/* The (V, T) loops must be unrolled completely for the accumulators to live
 * in registers. */
#define A64_UNROLL _Pragma("GCC unroll 16")

enum { A64_MAXV = 2, A64_MAXT = 4 }; /* row vectors of 4 rows, tokens */

/* acc + the products of the 16 int8 pairs of q and x, spread over 4 lanes. */
A64_BLOCK int32x4_t a64_dot16(int32x4_t acc, int8x16_t q, int8x16_t x)
{
#ifdef __ARM_FEATURE_DOTPROD
    return vdotq_s32(acc, q, x);
#else
    int16x8_t p = vmull_s8(vget_low_s8(q), vget_low_s8(x));
    p = vmlal_high_s8(p, q, x);
    return vpadalq_s16(acc, p);
#endif
}

/* The same for 8 pairs. */
A64_BLOCK int32x4_t a64_dot8(int32x4_t acc, int8x8_t q, int8x8_t x)
{
#ifdef __ARM_FEATURE_DOTPROD
    const int8x8_t z = vdup_n_s8(0);
    return vdotq_s32(acc, vcombine_s8(q, z), vcombine_s8(x, z));
#else
    return vpadalq_s16(acc, vmull_s8(q, x));
#endif
}

/* Y[t0 .. t0+T, r0 .. r0+4V). Rows past the end of the matrix (in the last
 * block) are computed on a copy of the last row and not stored. */
A64_BLOCK void a64_i8_block(const int V, const int T, float *Y, const int8_t *Q,
                            const float *S, const int8_t *XQ, const float *XS,
                            uint32_t rows, uint32_t cols, uint32_t group,
                            uint32_t ng, uint32_t r0, uint32_t t0)
{
    const int8_t *q[4 * A64_MAXV];
    const float *s[4 * A64_MAXV];
    const int8_t *x[A64_MAXT];
    const float *xs[A64_MAXT];
    float32x4_t acc[A64_MAXV][A64_MAXT];
    A64_UNROLL
    for (int i = 0; i < 4 * V; i++) {
        const uint32_t r = r0 + (uint32_t)i < rows ? r0 + (uint32_t)i : rows - 1;
        q[i] = Q + (size_t)r * cols;
        s[i] = S + (size_t)r * ng;
    }
    A64_UNROLL
    for (int t = 0; t < T; t++) {
        x[t] = XQ + (size_t)(t0 + t) * cols;
        xs[t] = XS + (size_t)(t0 + t) * ng;
    }
    A64_UNROLL
    for (int v = 0; v < V; v++)
        A64_UNROLL
        for (int t = 0; t < T; t++)
            acc[v][t] = vdupq_n_f32(0.0f);

    for (uint32_t g = 0; g < ng; g++) {
        const uint32_t c0 = g * group;
        const uint32_t c1 = cols - c0 < group ? cols : c0 + group;
        /* d[i][t]: lanes whose sum is the dot of row i and token t over
         * the group's columns so far. */
        int32x4_t d[4 * A64_MAXV][A64_MAXT];
        A64_UNROLL
        for (int i = 0; i < 4 * V; i++)
            A64_UNROLL
            for (int t = 0; t < T; t++)
                d[i][t] = vdupq_n_s32(0);
        uint32_t c = c0;
        for (; c + 16 <= c1; c += 16) {
            int8x16_t qv[4 * A64_MAXV];
            A64_UNROLL
            for (int i = 0; i < 4 * V; i++)
                qv[i] = vld1q_s8(q[i] + c);
            A64_UNROLL
            for (int t = 0; t < T; t++) {
                const int8x16_t xv = vld1q_s8(x[t] + c);
                A64_UNROLL
                for (int i = 0; i < 4 * V; i++)
                    d[i][t] = a64_dot16(d[i][t], qv[i], xv);
            }
        }
        if (c + 8 <= c1) {
            A64_UNROLL
            for (int t = 0; t < T; t++) {
                const int8x8_t xv = vld1_s8(x[t] + c);
                A64_UNROLL
                for (int i = 0; i < 4 * V; i++)
                    d[i][t] = a64_dot8(d[i][t], vld1_s8(q[i] + c), xv);
            }
            c += 8;
        }
        if (c < c1) /* under 8 columns: scalar, added into lane 0 */
            A64_UNROLL
            for (int i = 0; i < 4 * V; i++)
                A64_UNROLL
                for (int t = 0; t < T; t++) {
                    int32_t sum = 0;
                    for (uint32_t k = c; k < c1; k++)
                        sum += (int32_t)q[i][k] * (int32_t)x[t][k];
                    d[i][t] = vaddq_s32(d[i][t], vsetq_lane_s32(sum, vdupq_n_s32(0), 0));
                }
        /* acc += float(dot) * (S[r,g] * XS[t,g]) for 4 rows at a time. */
        A64_UNROLL
        for (int v = 0; v < V; v++) {
            const int i = 4 * v;
            float32x4_t sv = vdupq_n_f32(0.0f);
            sv = vld1q_lane_f32(s[i] + g, sv, 0);
            sv = vld1q_lane_f32(s[i + 1] + g, sv, 1);
            sv = vld1q_lane_f32(s[i + 2] + g, sv, 2);
            sv = vld1q_lane_f32(s[i + 3] + g, sv, 3);
            A64_UNROLL
            for (int t = 0; t < T; t++) {
                const int32x4_t dots = vpaddq_s32(vpaddq_s32(d[i][t], d[i + 1][t]),
                                                  vpaddq_s32(d[i + 2][t], d[i + 3][t]));
                const float32x4_t scale = vmulq_n_f32(sv, xs[t][g]);
                acc[v][t] = vaddq_f32(acc[v][t], vmulq_f32(vcvtq_f32_s32(dots), scale));
            }
        }
    }
    A64_UNROLL
    for (int t = 0; t < T; t++) {
        float *y = Y + (size_t)(t0 + t) * rows + r0;
        A64_UNROLL
        for (int v = 0; v < V; v++) {
            const uint32_t r = r0 + 4u * (uint32_t)v;
            if (r + 4 <= rows) {
                vst1q_f32(y + 4 * v, acc[v][t]);
            } else {
                float tmp[4];
                vst1q_f32(tmp, acc[v][t]);
                for (uint32_t k = 0; r + k < rows; k++)
                    y[4 * v + k] = tmp[k];
            }
        }
    }
}

/* 4 rows x 4 tokens while four tokens are left (16 int32 lane vectors, 4
 * weight and 1 activation register in the column loop); single tokens
 * (decode) in blocks of 8 rows. The last rows go in a block of 4 or 8 of
 * which only the rows that exist are stored. */
static inline void a64_matmul_i8(float *Y, const int8_t *Q, const float *S,
                                 const int8_t *XQ, const float *XS, uint32_t n,
                                 uint32_t rows, uint32_t cols, uint32_t group)
{
    const uint32_t ng = (cols + group - 1) / group;
    uint32_t t = 0;
    for (; t + 4 <= n; t += 4)
        for (uint32_t r = 0; r < rows; r += 4)
            a64_i8_block(1, 4, Y, Q, S, XQ, XS, rows, cols, group, ng, r, t);
    for (; t < n; t++) {
        uint32_t r = 0;
        for (; r + 4 < rows; r += 8)
            a64_i8_block(2, 1, Y, Q, S, XQ, XS, rows, cols, group, ng, r, t);
        if (r < rows)
            a64_i8_block(1, 1, Y, Q, S, XQ, XS, rows, cols, group, ng, r, t);
    }
}

/* The "neon-dotprod" matmul_i8, defined in neon_dotprod.c (compiled for
 * armv8.2-a+dotprod). Call it only on a CPU with the extension. */
void colibri_neon_dotprod_matmul_i8(float *Y, const int8_t *Q, const float *S,
                                    const int8_t *XQ, const float *XS, uint32_t n,
                                    uint32_t rows, uint32_t cols, uint32_t group);

#endif /* COLIBRI_NEON_A64_I8_H */
