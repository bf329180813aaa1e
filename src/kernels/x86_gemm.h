/*
 * x86_gemm.h - avx2.c's GEMM drivers, open to avx512.c's micro-kernels.
 *
 * avx2.c's GEMM form (i8_gemm: int8 rows, and Q4_0 / Q5_0 blocks unpacked
 * into int8 groups of 32) packs 16 rows x a column chunk of weights at a
 * time, their scales and per-group weight sums, and the activations of a
 * tile of tokens, and hands each tile to a micro-kernel. avx512.c runs the
 * same driver with its own micro-kernel in zmm registers (all 16 rows in one
 * vector), so the packing, chunking and prefetching exist once. The K
 * types' GEMM (below) is shared the same way, with a pack a table. Only
 * the x86 tables use this header.
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
 * Q4_0 / Q5_0 blocks. */
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

/* ---- The K types' GEMM (Q4_K, Q5_K, Q6_K prefill) ------------------------
 * A strip of 16 rows x CLB_KG_KB blocks is unpacked once (a "pack") and
 * every token of the call runs over it; avx2.c's driver (clb_avx2_k_gemm)
 * owns the strips, chunks and prefetching, each table brings a pack and a
 * micro-kernel for its registers (avx2.c's in ymm, avx512.c's in zmm). The
 * integers are ref's exactly and the float operations ref's in ref's order
 * (avx512.c's "Block types, GEMM form" says how), so every table and every
 * split of rows or tokens gives ref's bits. */

/* Blocks a chunk: their packed weights 8 KiB, as the int8 GEMM's. */
#define CLB_KG_KB 2u

/* Tokens from which the K types' prefill runs as this GEMM, in avx2.c and
 * avx512.c alike (their measurements: avx512.c above its zk_pack, avx2.c
 * in blk_matmul): below it the pack is not paid for. */
#define CLB_KG_MIN_N 12u

/* A chunk, unpacked: per block bl, column quad q, row i the 4 stored
 * (unsigned) values of columns 4q .. 4q + 3 at w[bl][q][4i] (a column quad
 * of the 16 rows is one zmm, or two ymm: rows 0-7, 8-15); the sub-block
 * scales by row (sc[bl][j][i], int32; Q4_K / Q5_K j < 8); the correction's
 * int16 coefficient pairs for XB dword k (XB 2k, 2k + 1) by row; d and dmin
 * (Q6_K: d only) as float32. Rows from nr on are zeros. */
typedef struct {
    __attribute__((aligned(64))) uint8_t w[CLB_KG_KB][64][64];
    __attribute__((aligned(64))) int32_t sc[CLB_KG_KB][16][16];
    __attribute__((aligned(64))) int32_t cp[CLB_KG_KB][8][16];
    __attribute__((aligned(64))) float d[CLB_KG_KB][16];
    __attribute__((aligned(64))) float dmin[CLB_KG_KB][16];
} clb_kg_pack;

/* p's block bl <- block b of rows r0 .. r0 + nr (nr <= 16; rows of
 * row_bytes bytes from W) of dtype dt. */
typedef void clb_kg_pack_fn(unsigned dt, clb_kg_pack *p, uint32_t bl, const uint8_t *W,
                            size_t row_bytes, uint32_t r0, uint32_t nr, uint32_t b);

/* Y[t0 + t, r0 .. r0 + nr) for t < T (T = 8, 4 or 1) over the pack's nbc
 * blocks, which are blocks b0 .. of the rows (nb a row), added to what Y
 * holds when b0 > 0 (the running sum of earlier chunks). XQ [n, nb * 256],
 * XS [n, nb], XB [n, nb * 16] as quantize_act_blk wrote them; Y's row
 * stride is rows. */
typedef void clb_kg_micro_fn(int T, unsigned dt, float *Y, const clb_kg_pack *p, uint32_t nbc,
                             const int8_t *XQ, const float *XS, const int16_t *XB, uint32_t rows,
                             uint32_t nb, uint32_t r0, uint32_t nr, uint32_t t0, uint32_t b0);

/* Y[n, rows] = the K-type product of W [rows, cols] (dt Q4_K, Q5_K or
 * Q6_K) and the n tokens' activations, by strips of 16 rows and chunks of
 * CLB_KG_KB blocks, `pack` once per chunk and `micro` over 8, then 4, then
 * 1 token at a time. Bit-identical to ref's matmul when pack and micro
 * keep their contracts. */
void clb_avx2_k_gemm(clb_kg_pack_fn *pack, clb_kg_micro_fn *micro, unsigned dt, float *Y,
                     const uint8_t *W, const int8_t *XQ, const float *XS, const int16_t *XB,
                     uint32_t n, uint32_t rows, uint32_t cols);

#if defined(COLIBRI_USE_AVX2) && (defined(__x86_64__) || defined(__i386__)) && \
    (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "kernels.h"

/* A block of zeros for a pack's rows past nr (values, scales and d 0, so
 * those lanes compute zeros and are never stored); the largest K block, so
 * every type's loads stay inside it. Defined in avx2.c. */
extern const uint8_t clb_kg_zero_block[CLB_Q6_K_BYTES];

/* Both packs' unpack, AVX2 only, so it inlines into avx2.c's instances
 * and avx512.c's alike (a callee's ISA a subset of its caller's). */
#define CLB_KG_INLINE static inline __attribute__((always_inline, target("avx2")))

/* Bits `from` .. of v's bytes moved to `to` .., masked: 16-bit shifts
 * whose carries the mask drops (it keeps bits of the byte's own). */
CLB_KG_INLINE __m256i clb_kg_bits(__m256i v, int from, int to, int mask)
{
    const __m256i s = to >= from ? _mm256_slli_epi16(v, to - from) : _mm256_srli_epi16(v, from - to);
    return _mm256_and_si256(s, _mm256_set1_epi8((char)mask));
}

/* The stored values of columns 64g .. 64g + 31 (*lo) and 64g + 32 ..
 * 64g + 63 (*hi) of block blk of dtype dt (Q4_K, Q5_K or Q6_K), as
 * unsigned bytes in column order (clb_qk_value; Q6_K ref.c's layout). */
CLB_KG_INLINE void clb_kg_unpack64(const unsigned dt, const uint8_t *blk, int g, __m256i *lo,
                                   __m256i *hi)
{
    if (dt == COLIBRI_DTYPE_Q6_K) {
        /* half h = g / 2; segments s, s + 1 = 2 (g % 2), + 1: nibbles of
         * ql[64h ..] and ql[64h + 32 ..] (low for s < 2), qh's bits 2s, 2s + 1 */
        const int h = g / 2, s = 2 * (g % 2);
        const __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 64 * h));
        const __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)(blk + CLB_Q6_K_QH + 32 * h));
        *lo = _mm256_or_si256(clb_kg_bits(a, 4 * (g % 2), 0, 15), clb_kg_bits(qh, 2 * s, 4, 0x30));
        *hi = _mm256_or_si256(clb_kg_bits(b, 4 * (g % 2), 0, 15), clb_kg_bits(qh, 2 * s + 2, 4, 0x30));
        return;
    }
    const int five = dt == COLIBRI_DTYPE_Q5_K;
    const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(
        blk + (five ? CLB_Q5_K_QS : CLB_Q4_K_QS) + 32 * g));
    *lo = _mm256_and_si256(v, _mm256_set1_epi8(15));
    *hi = clb_kg_bits(v, 4, 0, 15);
    if (five) { /* sub-blocks 2g, 2g + 1: bits 2g, 2g + 1 of qh[l] */
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)(blk + CLB_Q5_K_QH));
        *lo = _mm256_or_si256(*lo, clb_kg_bits(qh, 2 * g, 4, 0x10));
        *hi = _mm256_or_si256(*hi, clb_kg_bits(qh, 2 * g + 1, 4, 0x10));
    }
}
#endif

#endif
