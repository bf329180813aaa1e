/*
 * x86_gemm.h - avx2.c's int8 GEMM driver, open to avx512.c's micro-kernel.
 *
 * avx2.c's GEMM form (i8_gemm: int8 rows, and Q4_0 / Q5_0 blocks unpacked
 * into int8 groups of 32) packs 16 rows x a column chunk of weights at a
 * time, their scales and per-group weight sums, and the activations of a
 * tile of tokens, and hands each tile to a micro-kernel. avx512.c runs the
 * same driver with its own micro-kernel in zmm registers (all 16 rows in one
 * vector), so the packing, chunking and prefetching exist once. Only the
 * x86 tables use this header.
 */
#ifndef COLIBRI_X86_GEMM_H
#define COLIBRI_X86_GEMM_H

#include <stddef.h>
#include <stdint.h>

/* Columns of a chunk with VNNI; the tile's biased activations are rows of
 * this many bytes. */
#define CLB_I8G_KC 512u

/* Tokens from which the GEMM form runs, in avx2.c and avx512.c alike (the
 * measurements behind them are at their uses in avx2.c): int8 rows, and
 * Q4_0 / Q5_0 blocks with VNNI (the plain AVX2 Q4_0 form waits for 24). */
#define CLB_I8G_MIN_N 8u
#define CLB_Q0_GEMM_MIN_N 16u

/* Y[t0 + t, r0 .. r0 + nr) for t < T (T = 4 or 1) over the chunk's groups,
 * added to what Y holds when kc > 0 (the running sum of earlier chunks),
 * with ref's float operations in ref's order (FORMAT.md 5):
 *   wp    the packed weights, 64 bytes a column quad: rows 0..15 x 4 int8
 *   csum  per group gl, the 16 rows' sums of their weights (int32)
 *   sp    per group gl, the 16 rows' scales (0 from nr on)
 *   xu    T rows of CLB_I8G_KC bytes: the tokens' activations + 128 (u8)
 *   XS    the activations' group scales [n, ng]; the chunk starts at
 *         group g0 and spans kl columns (groups of `group`, whole ones)
 * Every group's dot is exact int32: sum (x + 128) w - 128 * csum. */
typedef void clb_i8g_micro_fn(int T, float *Y, const int8_t *wp, const int32_t *csum,
                              const float *sp, const uint8_t *xu, const float *XS,
                              uint32_t rows, uint32_t ng, uint32_t r0, uint32_t nr,
                              uint32_t t0, uint32_t kc, uint32_t kl, uint32_t g0,
                              uint32_t group);

/* avx2.c's EVEX-VNNI GEMM driver with `micro` as its micro-kernel: Y [n,
 * rows] for int8 rows (dt 0: Q [rows, cols] and S [rows, ng]) or Q4_0 / Q5_0
 * blocks (dt COLIBRI_DTYPE_Q4_0 / _Q5_0: W, cols the padded columns, group
 * 32); group % 4 == 0 and group <= CLB_I8G_KC. Bit-identical to ref's
 * matmul_i8 / matmul_q4_0 / matmul_q5_0 when `micro` keeps its contract. */
void clb_avx2_i8_gemm(clb_i8g_micro_fn *micro, unsigned dt, const void *W, const float *S,
                      float *Y, const int8_t *XQ, const float *XS, uint32_t n, uint32_t rows,
                      uint32_t cols, uint32_t group);

#endif
