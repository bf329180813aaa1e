/*
 * avx2.c - AVX2+FMA kernels for x86-64 (the table "avx2", kernels.h).
 *
 * Build: the whole file is inside `#if COLIBRI_USE_AVX2`; every function that
 * uses AVX2 carries __attribute__((target("avx2,fma"))), so the library is
 * compiled with the default x86-64 flags (no -mavx2 needed) and
 * colibri_kernels_avx2() picks at run time: it returns NULL on a CPU without
 * AVX2 and FMA. Without COLIBRI_USE_AVX2 (or off x86) the getter still exists
 * and returns NULL, so every target links the same set of getters.
 *
 * Arithmetic: docs/FORMAT.md section 5, checked against ref.c by
 * tests/c/test_kernels.c. quantize_act_i8 and matmul_i8 are bit-identical to
 * ref (the I8 group dot products exact int32, the float sum over groups in
 * ref's order); the float kernels' sums may run in another order than
 * ref's, so F32 and I16 results agree to float rounding.
 *
 * Float activations (matmul_f32, matmul_i16): dot-product form. W rows and
 * X rows are both contiguous along cols, so a block of R weight rows x T
 * tokens keeps R*T vector accumulators over the columns and sums each
 * horizontally at the end; each weight vector loaded is used for T tokens.
 * With several tokens the rows go in L1-sized strips that every token passes
 * over before the next strip, so each weight is read from memory once per
 * call (see fx_matmul).
 * Int8 (matmul_i8), two forms picked by the number of tokens n:
 * - Dot-product form (decode, few tokens): 4 rows at a time, their group
 *   dots reduced exactly into the 4 lanes of one vector (i8_rows4), row
 *   panels that fit in L2 so every token finds the panel's weights in cache.
 * - Outer-product (GEMM) form (prefill, from I8G_MIN_N tokens): the weights
 *   are repacked into a 12 KiB stack buffer so vector lanes run along rows,
 *   and no horizontal sums are needed. See the comment at i8_gemm. Q4_0
 *   and Q5_0 prefill runs in it too: their blocks are int8 groups of 32
 *   once unpacked (i8g_src).
 * The K types (Q4_K, Q5_K, Q6_K) have a GEMM of their own from
 * CLB_KG_MIN_N tokens (clb_avx2_k_gemm, "The K types, GEMM form"), whose
 * driver avx512.c shares; fewer tokens run one-row x 8-token tiles.
 * The table "avx2-vnni" uses vpdpbusd for the int8 products (DPBUSD) on
 * CPUs with AVX-VNNI or AVX512-VNNI + AVX512VL; "avx2" never does.
 *
 * No allocation, no alignment assumption on the arguments (unaligned loads;
 * tails use masked loads, which never touch the masked-out elements, or a
 * scalar loop), no read or write outside the arguments' extents.
 */
#include "kernels.h"
#include "x86_gemm.h"

#if defined(COLIBRI_USE_AVX2) && (defined(__x86_64__) || defined(__i386__)) && \
    (defined(__GNUC__) || defined(__clang__))

#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define TGT __attribute__((target("avx2,fma,f16c")))
/* The block kernels take R and T as arguments and are always inlined with
 * constants, so each (R, T) pair becomes its own fully unrolled code with the
 * accumulator arrays in registers (a C11 stand-in for templates). */
/* The (R, T) loops must be unrolled completely for the accumulators to live
 * in registers; GCC's own heuristics stop short for the larger blocks.
 *
 * COLIBRI_KERNELS_PLAIN (cbuild defines it for sanitizer builds): ordinary
 * functions and loops instead. The same operations on the same elements in
 * the same order, so the sanitizers check every access the fast build makes,
 * but gcc compiles this file under ASan+UBSan in 6 s instead of 180 s (the
 * instrumented, fully unrolled copies of each (R, T) pair are what cost).
 * tests/test_kernels.py still sanitizes the unrolled form itself, at -O1. */
#ifdef COLIBRI_KERNELS_PLAIN
#define BLOCK static TGT
#define UNROLL
#else
#define BLOCK static inline __attribute__((always_inline)) TGT
#define UNROLL _Pragma("GCC unroll 16")
#endif

enum { MAXR = 8, MAXT = 4 };

/* Weight bytes per row panel: the panel stays in L2 while all the token
 * blocks of a prefill pass over it. 128 KiB is under every AVX2 CPU's L2. */
#define PANEL_BYTES (128u * 1024u)

/* STREAMS (decode): a one-token matmul reads each weight once, so it is as
 * fast as the memory feeds it. One core of a Zen 3 reads 21.5 GB/s from
 * four far-apart sequential streams (bench/c/bandwidth.c) but 14 GB/s from
 * one: the hardware prefetchers keep more lines in flight for more
 * streams. A decode block of 4 or 8 rows therefore takes one row from each
 * quarter (eighth) of W, not adjacent rows, so each of its rows walks its
 * own sequential stream, and requests its stream's bytes CLB_STREAM_PFB
 * ahead (kernels.h):
 * int8 decode 11 -> 19 GB/s at 2816 x 1024 (bench/c/i8_matmul.c), small
 * model int8 decode 53 -> 88 tokens/s (bench/results/FINDINGS.md 14).
 * Every row is still computed by ref's operations in ref's order: which
 * rows share a block changes no bit. */

/* mask_tab + 8 - k gives a load mask whose first k int32 lanes are set. */
static const int32_t mask_tab[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                     0,  0,  0,  0,  0,  0,  0,  0};

TGT static inline __m256i tail_mask(uint32_t k) /* 1 <= k <= 7 */
{
    return _mm256_loadu_si256((const __m256i *)(const void *)(mask_tab + 8 - k));
}

/* Sum of each of a, b, c, d -> [sum a, sum b, sum c, sum d]. */
TGT static inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d)
{
    __m256 ab = _mm256_hadd_ps(a, b);
    __m256 cd = _mm256_hadd_ps(c, d);
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

TGT static inline float hsum1(__m256 a)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* y[r0 + r * stride] = lane r of acc (r < 4). */
BLOCK void store_rows4(float *y, __m128 acc, uint32_t r0, uint32_t stride)
{
    if (stride == 1) {
        _mm_storeu_ps(y + r0, acc);
        return;
    }
    __attribute__((aligned(16))) float v[4];
    _mm_store_ps(v, acc);
    UNROLL
    for (int r = 0; r < 4; r++)
        y[r0 + (uint32_t)r * stride] = v[r];
}

/* Store acc[r][t] horizontally summed (times scale[r * stride] when scale is
 * given) into Y[t0 + t, r0 + r * stride], or add it there when `add` (a
 * later column chunk). Rows are adjacent (stride 1) or one per stream of a
 * decode (stride > 1, one token, no add: see CLB_STREAM_PFB). */
BLOCK void store_block(const int R, const int T, __m256 acc[MAXR][MAXT],
                       float *Y, uint32_t rows, uint32_t r0, uint32_t t0,
                       const float *scale, int add, uint32_t stride)
{
    UNROLL
    for (int t = 0; t < T; t++) {
        float *y = Y + (size_t)(t0 + t) * rows + r0;
        int r = 0;
        UNROLL
        for (; r + 4 <= R; r += 4) {
            __m128 v = hsum4(acc[r][t], acc[r + 1][t], acc[r + 2][t], acc[r + 3][t]);
            if (stride != 1) {
                if (scale)
                    v = _mm_mul_ps(v, _mm_setr_ps(scale[(uint32_t)r * stride],
                                                  scale[(uint32_t)(r + 1) * stride],
                                                  scale[(uint32_t)(r + 2) * stride],
                                                  scale[(uint32_t)(r + 3) * stride]));
                store_rows4(y, v, (uint32_t)r * stride, stride);
                continue;
            }
            if (scale)
                v = _mm_mul_ps(v, _mm_loadu_ps(scale + r));
            if (add)
                v = _mm_add_ps(_mm_loadu_ps(y + r), v);
            _mm_storeu_ps(y + r, v);
        }
        UNROLL
        for (; r < R; r++) {
            const size_t i = (size_t)r * stride;
            float v = hsum1(acc[r][t]);
            v = scale ? scale[i] * v : v;
            y[i] = add ? y[i] + v : v;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Float activations: matmul_f32 (W float) and matmul_i16 (W int16 -> float). */

/* 8 weights of row w from column c as floats; `i16` selects the int16 form. */
BLOCK __m256 load_w8(const int i16, const void *w, uint32_t c)
{
    if (i16)
        return _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(
            _mm_loadu_si128((const __m128i *)(const void *)((const int16_t *)w + c))));
    return _mm256_loadu_ps((const float *)w + c);
}

/* The last k (1..7) weights of row w from column c, zero beyond. */
BLOCK __m256 load_w_tail(const int i16, const void *w, uint32_t c, uint32_t k,
                         __m256i mask)
{
    if (i16) {
        int16_t tmp[8] = {0};
        memcpy(tmp, (const int16_t *)w + c, k * sizeof(int16_t));
        return _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(
            _mm_loadu_si128((const __m128i *)(void *)tmp)));
    }
    return _mm256_maskload_ps((const float *)w + c, mask);
}

/* acc[r][t] += W[r, c..c+8) * X[t, c..c+8) lane by lane: R weight loads,
 * T activation loads, R*T FMAs. */
BLOCK void fx_step(const int i16, const int R, const int T, __m256 acc[MAXR][MAXT],
                   const char *const w[MAXR], const float *const x[MAXT], uint32_t c)
{
    __m256 xv[MAXT];
    UNROLL
    for (int t = 0; t < T; t++)
        xv[t] = _mm256_loadu_ps(x[t] + c);
    UNROLL
    for (int r = 0; r < R; r++) {
        __m256 wv = load_w8(i16, w[r], c);
        UNROLL
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
    }
}

/* Y[t0..t0+T, r0..r0+R] (+)= the products over columns [c0, c1) for float
 * activations X [n, cols] and weights W [rows, cols] (float, or int16 with
 * per-row scales S when i16); `add` for every column chunk after the first.
 * One accumulator per (row, token). Row r of the block is r0 + r * stride
 * (1: adjacent rows; a decode takes one row per stream, STREAMS). With
 * `prefetch`, the same columns of the next R rows (stride 1) or each row's
 * own stream CLB_STREAM_PFB bytes on are requested into L2 at the pace this
 * block reads its own (one line per row per 64 bytes), so the next strip's
 * pages are walked and its lines on their way before the strip starts
 * (fx_strip). */
BLOCK void fx_block(const int i16, const int R, const int T, float *Y,
                    const void *W, const float *S, const float *X, uint32_t rows,
                    uint32_t cols, uint32_t r0, uint32_t stride, uint32_t t0,
                    uint32_t c0, uint32_t c1, int add, int prefetch)
{
    const size_t esz = i16 ? sizeof(int16_t) : sizeof(float);
    const uint32_t line_cols = 64 / (uint32_t)esz; /* 16 float or 32 int16 */
    const char *w[MAXR];
    const float *x[MAXT];
    __m256 acc[MAXR][MAXT];
    UNROLL
    for (int r = 0; r < R; r++)
        w[r] = (const char *)W + (size_t)(r0 + (uint32_t)r * stride) * cols * esz;
    UNROLL
    for (int t = 0; t < T; t++)
        x[t] = X + (size_t)(t0 + t) * cols;
    UNROLL
    for (int r = 0; r < R; r++)
        UNROLL
        for (int t = 0; t < T; t++)
            acc[r][t] = _mm256_setzero_ps();

    uint32_t c = c0;
    if (prefetch) {
        /* stride 1: the same columns of row r + R; else CLB_STREAM_PFB on */
        const size_t next = stride == 1 ? (size_t)R * cols * esz : (size_t)CLB_STREAM_PFB;
        for (; c + line_cols <= c1; c += line_cols) {
            UNROLL
            for (int r = 0; r < R; r++)
                _mm_prefetch(w[r] + next + (size_t)c * esz, _MM_HINT_T1);
            UNROLL
            for (uint32_t h = 0; h < line_cols; h += 8)
                fx_step(i16, R, T, acc, w, x, c + h);
        }
    }
    for (; c + 8 <= c1; c += 8)
        fx_step(i16, R, T, acc, w, x, c);
    if (c < c1) {
        uint32_t k = c1 - c;
        __m256i mask = tail_mask(k);
        __m256 xv[MAXT];
        UNROLL
        for (int t = 0; t < T; t++)
            xv[t] = _mm256_maskload_ps(x[t] + c, mask);
        UNROLL
        for (int r = 0; r < R; r++) {
            __m256 wv = load_w_tail(i16, w[r], c, k, mask);
            UNROLL
            for (int t = 0; t < T; t++)
                acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    store_block(R, T, acc, Y, rows, r0, t0, i16 ? S + r0 : NULL, add, stride);
}

/* Rows per panel: a multiple of 8 whose weights fit in PANEL_BYTES. */
static uint32_t panel_rows(uint32_t rows, size_t row_bytes)
{
    size_t p = PANEL_BYTES / (row_bytes ? row_bytes : 1);
    p = p < 8 ? 8 : p - p % 8;
    return p > rows ? rows : (uint32_t)p;
}

/* Weight bytes per row of a strip: 4 rows x 4 KiB (1024 float or 2048 int16
 * columns) = 16 KiB, which stays in L1 while every token passes over it. */
#define STRIP_ROW_BYTES 4096u

/* The tokens of the call over rows [r, r + R), columns [c0, c1): 3 at a time
 * (R = 4: 12 accumulators, 7 loads per 12 FMAs), then the last 2 or 1. The
 * first block prefetches the next strip (when there is a whole one). */
BLOCK void fx_strip(const int i16, const int R, float *Y, const void *W,
                    const float *S, const float *X, uint32_t n, uint32_t rows,
                    uint32_t cols, uint32_t r, uint32_t c0, uint32_t c1, int add)
{
    const int prefetch = r + 2 * (uint32_t)R <= rows;
    uint32_t t = 0;
    for (; t + 3 <= n; t += 3)
        fx_block(i16, R, 3, Y, W, S, X, rows, cols, r, 1, t, c0, c1, add, prefetch && t == 0);
    if (n - t == 2)
        fx_block(i16, R, 2, Y, W, S, X, rows, cols, r, 1, t, c0, c1, add, prefetch && t == 0);
    else if (n - t == 1)
        fx_block(i16, R, 1, Y, W, S, X, rows, cols, r, 1, t, c0, c1, add, prefetch && t == 0);
}

/* Y[n, rows] = X W^T for float activations, in one of two orders:
 * - One token (decode): 8 rows at a time (8 independent FMA chains hide the
 *   FMA latency); every weight is used once, so the order is the file's.
 * - Several tokens (prefill, batches): strips of 4 rows x STRIP_ROW_BYTES of
 *   columns, every token passing over a strip before the next one. Each
 *   weight is then read from memory exactly once per call, and the reading
 *   is spread evenly over the arithmetic, so the hardware prefetchers and
 *   out-of-order execution overlap the two; the activations (n x 4 KiB) stay
 *   in L2. This beat an outer-product GEMM with packed activations (the
 *   previous form, 16-token blocks over L2-sized weight panels) by 1.25x on
 *   the expert shapes of a 128-token prefill with weights that are not in
 *   cache (bench/results/FINDINGS.md): there the first token
 *   block of every panel waited for memory with no arithmetic to overlap.
 *   Later column chunks add into Y. */
BLOCK void fx_matmul(const int i16, float *Y, const void *W, const float *S,
                     const float *X, uint32_t n, uint32_t rows, uint32_t cols)
{
    if (n == 1) { /* 8 rows, one from each eighth of W (CLB_STREAM_PFB) */
        const uint32_t eighth = rows / 8;
        uint32_t r = 0;
        for (; r < eighth; r++)
            fx_block(i16, 8, 1, Y, W, S, X, rows, cols, r, eighth, 0, 0, cols, 0, r + 1 < eighth);
        for (r = 8 * eighth; r + 4 <= rows; r += 4)
            fx_block(i16, 4, 1, Y, W, S, X, rows, cols, r, 1, 0, 0, cols, 0, 0);
        for (; r < rows; r++)
            fx_block(i16, 1, 1, Y, W, S, X, rows, cols, r, 1, 0, 0, cols, 0, 0);
        return;
    }
    const uint32_t chunk = STRIP_ROW_BYTES / (i16 ? 2u : 4u);
    for (uint32_t c0 = 0; c0 < cols; c0 += chunk) {
        const uint32_t c1 = cols - c0 < chunk ? cols : c0 + chunk;
        uint32_t r = 0;
        for (; r + 4 <= rows; r += 4)
            fx_strip(i16, 4, Y, W, S, X, n, rows, cols, r, c0, c1, c0 > 0);
        for (; r < rows; r++)
            fx_strip(i16, 1, Y, W, S, X, n, rows, cols, r, c0, c1, c0 > 0);
    }
}

TGT static void avx2_matmul_f32(float *Y, const float *W, const float *X,
                                uint32_t n, uint32_t rows, uint32_t cols)
{
    fx_matmul(0, Y, W, NULL, X, n, rows, cols);
}

TGT static void avx2_matmul_i16(float *Y, const int16_t *Q, const float *S,
                                const float *X, uint32_t n, uint32_t rows,
                                uint32_t cols)
{
    fx_matmul(1, Y, Q, S, X, n, rows, cols);
}

/* ------------------------------------------------------------------------ */
/* quantize_act_i8: bit-identical to ref (same float32 operations). */

/* Largest |x| of x[0..len) as the bit pattern of a non-negative float. For
 * non-negative floats the integer order of the bits is the numeric order, so
 * an integer max gives ref's amax exactly, and a NaN shows as a pattern above
 * +inf (0x7f800000) instead of being silently dropped or kept by max_ps. */
TGT static uint32_t amax_bits(const float *x, uint32_t len)
{
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    __m256i m = _mm256_setzero_si256();
    uint32_t c = 0;
    for (; c + 8 <= len; c += 8)
        m = _mm256_max_epi32(m, _mm256_and_si256(
            _mm256_loadu_si256((const __m256i *)(const void *)(x + c)), abs_mask));
    if (c < len)
        m = _mm256_max_epi32(m, _mm256_and_si256(
            _mm256_maskload_epi32((const int *)(const void *)(x + c), tail_mask(len - c)),
            abs_mask));
    __m128i h = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    h = _mm_max_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
    return (uint32_t)_mm_cvtsi128_si32(h);
}

/* clip(rint(x * inv), -127, 127) for 8 floats, as int32. Clamping a value
 * before or after rounding to an integer gives the same integer, and
 * _MM_FROUND_TO_NEAREST_INT is ties-to-even like rintf. */
TGT static inline __m256i q8(__m256 x, __m256 inv)
{
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    __m256 v = _mm256_round_ps(_mm256_mul_ps(x, inv),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
}

/* Groups whose amax is below this (including all-zero ones), infinite or
 * NaN go to ref: there 127/amax may overflow or NaN appear, cases whose exact
 * ref behaviour is not worth mirroring in vector code. Above it, inv is finite
 * and every product x*inv is at most 127 in magnitude. */
#define QA_MIN_BITS 0x04800000u /* 2^-118 */

TGT static void avx2_quantize_act_i8(int8_t *XQ, float *XS, const float *X,
                                     uint32_t n, uint32_t cols, uint32_t group)
{
    const uint32_t ng = (cols + group - 1) / group;
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
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
            const __m256 inv = _mm256_set1_ps(127.0f / amax);
            const float *xg = x + c0;
            int8_t *qg = xq + c0;
            uint32_t c = 0;
            for (; c + 32 <= len; c += 32) {
                /* 4 x 8 int32 -> 32 int8: the packs work per 128-bit lane,
                 * the final permute restores column order. Values are within
                 * [-127, 127], so the saturating packs are exact. */
                __m256i a = q8(_mm256_loadu_ps(xg + c), inv);
                __m256i b = q8(_mm256_loadu_ps(xg + c + 8), inv);
                __m256i d = q8(_mm256_loadu_ps(xg + c + 16), inv);
                __m256i e = q8(_mm256_loadu_ps(xg + c + 24), inv);
                __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b),
                                               _mm256_packs_epi32(d, e));
                _mm256_storeu_si256((__m256i *)(void *)(qg + c),
                                    _mm256_permutevar8x32_epi32(p, perm));
            }
            for (; c < len; c += 8) {
                const uint32_t k = len - c < 8 ? len - c : 8;
                __m256 v = k == 8 ? _mm256_loadu_ps(xg + c)
                                  : _mm256_maskload_ps(xg + c, tail_mask(k));
                int32_t tmp[8];
                _mm256_storeu_si256((__m256i *)(void *)tmp, q8(v, inv));
                for (uint32_t i = 0; i < k; i++)
                    qg[c + i] = (int8_t)tmp[i];
            }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* matmul_i8: integer dot products, never dequantising the weights; every
 * form below is bit-identical to ref's matmul_i8 (kernels.h).
 *
 * Instruction sequence (the anchor is llama.cpp's AVX2 Q8_0 dot,
 * ggml_vec_dot_q8_0_q8_0 / mul_sum_i8_pairs_float): vpmaddubsw needs one
 * unsigned operand, so per 32 columns it multiplies |q| (vpsignb q,q or
 * vpabsb; as u8 |-128| = 128 is right) by xq * sign(q) (vpsignb, s8); each
 * int16 pair sum is at most 2 * 128 * 127 = 32512, no saturation. This needs
 * xq != -128, which quantize_act_i8 guarantees (its range is [-127, 127]);
 * weights may hold -128. vpmaddwd with ones widens the pairs to int32 lanes.
 * We keep that sequence (abs, sign, maddubs, madd: 4 ops per 32 products, the
 * cheapest exact form without VNNI: making xq unsigned with +128 instead
 * would saturate the int16 pair sums), and with VNNI replace maddubs + madd +
 * add by one vpdpbusd.
 *
 * Where we part from llama.cpp is the float side. llama.cpp converts the 8
 * int32 lanes of each block to float and FMAs them with the block's scale
 * product, lane by lane, summing the lanes at the end: each lane is rounded
 * separately, and the result depends on how rows and blocks were split. We
 * instead sum a group's lanes as integers (exact), so the float work per
 * group is ref's: y += float(dot) * (S[r,g] * XS[t,g]), an unfused multiply
 * then add, groups in order. To do that without a horizontal float chain per
 * row, vector lanes run along weight ROWS (as on AArch64, neon_a64_i8.h): a
 * block of 4 rows computes the 4 rows' lane vectors of one group, one hadd
 * tree turns them into [dot of row 0..3], and the float accumulator holds
 * the 4 rows' running sums. The scale products of 4 rows x 8 groups are
 * formed along groups (contiguous in S) and transposed once per 8 groups.
 * This costs a hadd tree per row block and group on top of the 4 integer
 * ops per row and 32 columns; decode streams the weights from memory and
 * reads them as fast as the previous, inexact form (bench/results/
 * FINDINGS.md section 6). */

/* Exact int32 dot of q[0..k) and x[0..k), k < 16, for the group tails. */
static inline int32_t dot_tail(const int8_t *q, const int8_t *x, uint32_t k)
{
    int32_t s = 0;
    for (uint32_t i = 0; i < k; i++)
        s += (int32_t)q[i] * (int32_t)x[i];
    return s;
}

/* acc += u8 u times s8 s, 4 adjacent products summed per int32 lane, exact
 * (the non-saturating vpdpbusd). vnni = 1: VEX encoding (AVX-VNNI); vnni = 2:
 * EVEX encoding on ymm registers (AVX512-VNNI + AVX512VL: Cascade Lake, Ice
 * Lake, Sapphire Rapids under hypervisors that hide AVX-VNNI, Zen 4). Inline
 * asm, so this file needs no avxvnni/avx512 target attribute (whose
 * intrinsics could not be inlined into the plain AVX2 instances); it only
 * runs after the CPUID checks in colibri_kernels_avx2. */
#ifdef COLIBRI_AVX512_EMULATED
/* test builds only (avx512.c says why): the instruction's emulation */
#define DPBUSD(vnni, acc, u, s) ((void)(vnni), (acc) = _mm256_dpbusd_epi32(acc, u, s))
#else
#define DPBUSD(vnni, acc, u, s)                                                     \
    do {                                                                            \
        if ((vnni) == 2)                                                            \
            __asm__("%{evex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));  \
        else                                                                        \
            __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));   \
    } while (0)
#endif

/* acc + the int32 lane sums of 4 adjacent products |q| * (xq * sign(q)). */
BLOCK __m256i dot_acc(const int vnni, __m256i acc, __m256i qa, __m256i qraw,
                      __m256i xv)
{
    const __m256i sx = _mm256_sign_epi8(xv, qraw);
    if (vnni) {
        DPBUSD(vnni, acc, qa, sx);
        return acc;
    }
    return _mm256_add_epi32(
        acc, _mm256_madd_epi16(_mm256_maddubs_epi16(qa, sx), _mm256_set1_epi16(1)));
}

/* Sum of the 8 int32 lanes of v (exact). */
TGT static inline int32_t hsum_epi32(__m256i v)
{
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(h);
}

/* Exact int32 dot products of columns [c, c1) (one group) for R rows and
 * one token x, as lane vectors (their lane sum is the dot), into d[r]. */
BLOCK void i8_group(const int vnni, const int R, __m256i d[MAXR],
                    const int8_t *const q[MAXR], const int8_t *x, uint32_t c,
                    uint32_t c1)
{
    __m256i iacc[MAXR];
    UNROLL
    for (int r = 0; r < R; r++)
        iacc[r] = _mm256_setzero_si256();
    for (; c + 32 <= c1; c += 32) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(x + c));
        UNROLL
        for (int r = 0; r < R; r++) {
            const __m256i qraw = _mm256_loadu_si256((const __m256i *)(const void *)(q[r] + c));
            iacc[r] = dot_acc(vnni, iacc[r], _mm256_abs_epi8(qraw), qraw, xv);
        }
    }
    if (c + 16 <= c1) { /* 16 columns in the low half, zeros above */
        const __m256i xv = _mm256_zextsi128_si256(
            _mm_loadu_si128((const __m128i *)(const void *)(x + c)));
        UNROLL
        for (int r = 0; r < R; r++) {
            const __m256i qraw = _mm256_zextsi128_si256(
                _mm_loadu_si128((const __m128i *)(const void *)(q[r] + c)));
            iacc[r] = dot_acc(vnni, iacc[r], _mm256_abs_epi8(qraw), qraw, xv);
        }
        c += 16;
    }
    if (c < c1) /* under 16 columns: scalar, added into lane 0 */
        UNROLL
        for (int r = 0; r < R; r++)
            iacc[r] = _mm256_add_epi32(iacc[r], _mm256_zextsi128_si256(
                _mm_cvtsi32_si128(dot_tail(q[r] + c, x + c, c1 - c))));
    UNROLL
    for (int r = 0; r < R; r++)
        d[r] = iacc[r];
}

/* Groups per chunk of scale products (pv below). */
enum { I8R_GCH = 256 };

/* pv[g] = the 4 rows' scale products S[r, gc + g] * XS[gc + g] (g < nch),
 * formed along groups (contiguous in S) and transposed to one 4-float
 * vector per group. With `prefetch`, the scales 4 rows on in each row's
 * stream (STREAMS) are requested into L2. */
BLOCK void scale_products4(float pv[I8R_GCH][4], const float *const s[MAXR],
                           const float *xs, uint32_t gc, uint32_t nch, uint32_t ng,
                           int prefetch)
{
    for (uint32_t gb = 0; gb < nch; gb += 8) {
        const uint32_t nb = nch - gb < 8 ? nch - gb : 8;
        const __m256i m = nb == 8 ? _mm256_set1_epi32(-1) : tail_mask(nb);
        const __m256 xsv = _mm256_maskload_ps(xs + gc + gb, m);
        __m256 p[4];
        UNROLL
        for (int r = 0; r < 4; r++) {
            p[r] = _mm256_mul_ps(_mm256_maskload_ps(s[r] + gc + gb, m), xsv);
            if (prefetch && gb % 16 == 0)
                _mm_prefetch((const char *)(s[r] + (size_t)4 * ng + gc + gb), _MM_HINT_T1);
        }
        /* 4 rows x 8 groups -> per group the 4 rows (groups j, j + 4 in
         * the two 128-bit halves) */
        const __m256 t0 = _mm256_unpacklo_ps(p[0], p[1]), t1 = _mm256_unpackhi_ps(p[0], p[1]);
        const __m256 t2 = _mm256_unpacklo_ps(p[2], p[3]), t3 = _mm256_unpackhi_ps(p[2], p[3]);
        const __m256 u[4] = {_mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)),
                             _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2))};
        UNROLL
        for (int j = 0; j < 4; j++) {
            _mm_store_ps(pv[gb + (uint32_t)j], _mm256_castps256_ps128(u[j]));
            _mm_store_ps(pv[gb + 4 + (uint32_t)j], _mm256_extractf128_ps(u[j], 1));
        }
    }
}

/* q[r], s[r] = the weights and scales of row r0 + r * stride (r < 4). */
BLOCK void rows4_at(const int8_t *q[MAXR], const float *s[MAXR], const int8_t *Q,
                    const float *S, uint32_t cols, uint32_t ng, uint32_t r0,
                    uint32_t stride)
{
    UNROLL
    for (int r = 0; r < 4; r++) {
        q[r] = Q + (size_t)(r0 + (uint32_t)r * stride) * cols;
        s[r] = S + (size_t)(r0 + (uint32_t)r * stride) * ng;
    }
}

/* acc + the 4 rows' group dots d[0..3] (exact hadd tree) times their scale
 * products p: ref's multiply then add, one group, 4 rows in the lanes. */
BLOCK __m128 add_group4(__m128 acc, const __m256i d[MAXR], const float p[4])
{
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]),
                                        _mm256_hadd_epi32(d[2], d[3]));
    const __m128 dots = _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h),
                                                      _mm256_extracti128_si256(h, 1)));
    return _mm_add_ps(acc, _mm_mul_ps(dots, _mm_load_ps(p)));
}

/* Y[t, r0 + k * stride] (k < 4) for one token (xq [cols], xs [ng]): lanes
 * are the 4 rows, one from each stream (STREAMS), each lane the row's
 * ref-order sum over groups. Groups go in chunks of
 * I8R_GCH: first the chunk's scale products (scale_products4, 4 KiB of stack
 * at most), then one simple loop per group does the integer dots, an exact
 * hadd tree over the 4 rows' lane vectors and ref's multiply and add. With
 * `prefetch`, each row's stream CLB_STREAM_PFB bytes on is requested into L2 at
 * the pace this block reads its own (PREFETCH at i8_matmul). 8 rows a block
 * (lanes of a 256-bit vector) did the same work with fewer instructions but
 * read memory slower: decode 10.2 against 12.4 GB/s at 2816 x 1024. */
BLOCK void i8_rows4(const int vnni, float *y, const int8_t *Q, const float *S,
                    const int8_t *xq, const float *xs, uint32_t cols,
                    uint32_t group, uint32_t ng, uint32_t r0, uint32_t stride, int prefetch)
{
    const int8_t *q[MAXR];
    const float *s[MAXR];
    rows4_at(q, s, Q, S, cols, ng, r0, stride);
    __attribute__((aligned(32))) float pv[I8R_GCH][4];
    __m128 acc = _mm_setzero_ps();
    for (uint32_t gc = 0; gc < ng; gc += I8R_GCH) {
        const uint32_t nch = ng - gc < I8R_GCH ? ng - gc : I8R_GCH;
        scale_products4(pv, s, xs, gc, nch, ng, prefetch);
        for (uint32_t g = gc; g < gc + nch; g++) {
            const uint32_t c0 = g * group;
            const uint32_t c1 = cols - c0 < group ? cols : c0 + group;
            if (prefetch)
                for (uint32_t c = (c0 + 63) & ~63u; c < c1; c += 64)
                    UNROLL
                    for (int r = 0; r < 4; r++)
                        _mm_prefetch((const char *)(q[r] + CLB_STREAM_PFB + c), _MM_HINT_T1);
            __m256i d[MAXR];
            i8_group(vnni, 4, d, q, xq, c0, c1);
            acc = add_group4(acc, d, pv[g - gc]);
        }
    }
    store_rows4(y, acc, r0, stride);
}

/* i8_rows4 for the converter's group of 32 columns with cols a multiple of
 * 32 (every matrix of a converted model): the same bits, one 32-byte load
 * per row a group, and each group's weights loaded into registers while the
 * group before is computed. In i8_rows4 each group's integer ops take their
 * weights straight from memory, so the vector scheduler fills with ops that
 * wait on loads and few groups overlap: in L2 (test_kernels-like shape 256 x
 * 1024, bench/c/i8_matmul.c) 20 -> 28 GB/s on Zen 3 (AVX2 only); decode,
 * small int8 model, interleaved: 1 thread +4-7 %, 2 threads +1-10 %
 * (bench/results/FINDINGS.md 13). */
BLOCK void i8_rows4_g32(const int vnni, float *y, const int8_t *Q, const float *S,
                        const int8_t *xq, const float *xs, uint32_t cols, uint32_t ng,
                        uint32_t r0, uint32_t stride, int prefetch)
{
    const int8_t *q[MAXR];
    const float *s[MAXR];
    rows4_at(q, s, Q, S, cols, ng, r0, stride);
    __attribute__((aligned(32))) float pv[I8R_GCH][4];
    __m128 acc = _mm_setzero_ps();
    for (uint32_t gc = 0; gc < ng; gc += I8R_GCH) {
        const uint32_t nch = ng - gc < I8R_GCH ? ng - gc : I8R_GCH;
        scale_products4(pv, s, xs, gc, nch, ng, prefetch);
        uint32_t c = gc * 32;
        __m256i qn[MAXR], xn = _mm256_loadu_si256((const __m256i *)(const void *)(xq + c));
        UNROLL
        for (int r = 0; r < 4; r++)
            qn[r] = _mm256_loadu_si256((const __m256i *)(const void *)(q[r] + c));
        for (uint32_t g = 0; g < nch; g++, c += 32) {
            const __m256i xv = xn;
            __m256i qv[MAXR], d[MAXR];
            UNROLL
            for (int r = 0; r < 4; r++)
                qv[r] = qn[r];
            if (g + 1 < nch) { /* the next group's bytes, loaded ahead */
                UNROLL
                for (int r = 0; r < 4; r++)
                    qn[r] = _mm256_loadu_si256((const __m256i *)(const void *)(q[r] + c + 32));
                xn = _mm256_loadu_si256((const __m256i *)(const void *)(xq + c + 32));
            }
            if (prefetch && c % 64 == 0)
                UNROLL
                for (int r = 0; r < 4; r++)
                    _mm_prefetch((const char *)(q[r] + CLB_STREAM_PFB + c), _MM_HINT_T1);
            UNROLL
            for (int r = 0; r < 4; r++)
                d[r] = dot_acc(vnni, _mm256_setzero_si256(), _mm256_abs_epi8(qv[r]), qv[r], xv);
            acc = add_group4(acc, d, pv[g]);
        }
    }
    store_rows4(y, acc, r0, stride);
}

/* Y[t, r] for a single row (the rows past the last whole block of 8):
 * ref's loop with the group dots from i8_group. */
BLOCK void i8_row1(const int vnni, float *y, const int8_t *Q, const float *S,
                   const int8_t *xq, const float *xs, uint32_t cols,
                   uint32_t group, uint32_t ng, uint32_t r)
{
    const int8_t *q[MAXR] = {Q + (size_t)r * cols};
    const float *s = S + (size_t)r * ng;
    float acc = 0.0f;
    for (uint32_t g = 0; g < ng; g++) {
        const uint32_t c0 = g * group;
        const uint32_t c1 = cols - c0 < group ? cols : c0 + group;
        __m256i d[MAXR];
        i8_group(vnni, 1, d, q, xq, c0, c1);
        acc += (float)hsum_epi32(d[0]) * (s[g] * xs[g]);
    }
    y[r] = acc;
}

/* ---- matmul_i8 with many tokens: outer-product form ----------------------
 *
 * The dot-product form pays a horizontal reduction per group and (row,
 * token). With many tokens, the weights of 16 rows are instead repacked so
 * that one 32-byte vector holds consecutive columns of 8 rows, and a
 * token's activations for those columns are broadcast to all lanes; the
 * products taken lane by lane give int32 lanes that are already per-row
 * sums, so each lane holds the exact group dot of its row at the end of a
 * group, with no reduction.
 *
 * With VNNI: wp[s][16][4], 4 columns of a row per lane (4-column step s),
 * vpdpbusd. It multiplies unsigned by signed bytes, so the activations are
 * made unsigned as xq + 128 (xor 0x80) and 128 * (sum of the group's
 * weights), computed once per chunk, is subtracted again: exact, no
 * saturation.
 * Without VNNI: w16[p][16][2], the weights widened to int16, 2 columns of a
 * row per lane (column pair p), the activations widened likewise, and one
 * vpmaddwd + vpaddd per 2 products a lane. The byte form it replaced
 * (vpsignb + vpmaddubsw + vpmaddwd + vpaddd for 4 products a lane;
 * vpmaddubsw's int16 pairs rule out the + 128 offset) issued 3/4 of a
 * multiply-port uop a product against vpmaddwd's 1/2 on Intel, which runs
 * vpsignb on the same two ports: 128 x 2816 x 1024, group 32, on a Xeon
 * 9.3 -> 7.9 ms. AMD Zen 3 should gain less: there both forms issue two
 * multiply uops per 32 products, and sign and add have pipes of their own.
 * Q4_0 and Q5_0 without VNNI: their values are small (|q - z| <= 16), so
 * vpmaddubsw takes the + 128 offset after all, and runs of its int16 pairs
 * add up exactly before one vpmaddwd (I8G_BYTE_RUN): the VNNI layout and
 * correction, 2.25 operations for 32 products; 128 x 2816 x 1024 on a
 * Xeon 6.0 -> 4.6 ms (Q4_0), 6.2 -> 4.7-4.8 (Q5_0).
 *
 * Each group term is float(dot) * (S[r,g] * XS[t,g]), added to the row's
 * float sum group after group in order, unfused (mul, then add), and Y is
 * reloaded at the next column chunk: the same float operations in the same
 * order as ref, so this path is bit-identical to ref. It needs group % 4 == 0
 * (whole groups per 4-column step) and group <= the chunk (I8G_KC columns
 * with VNNI, I8G_KC16 without). */

/* I8G_MIN_N: from 8 tokens the packing pays off (test_kernels --bench: at 4
 * tokens the dot-product form is 1.3-1.4x faster, at 8 the GEMM form is up
 * to 1.3x faster with VNNI and about even without). */
/* I8G_KC16: the int16 form's column chunk, 8 KiB of packed weights as the
 * int8 form's 512 columns are (the worker's stack, colibri.h). */
enum { I8G_KC = CLB_I8G_KC, I8G_KC16 = 256, I8G_MIN_N = CLB_I8G_MIN_N };

/* Q4_0 and Q5_0 without VNNI: their values q - z (z = 8, 16; |q - z| <=
 * 8, 16) against the biased activations (x + 128 <= 255) are vpmaddubsw's
 * operands, exact in int16 pairs, and a run of I8G_BYTE_RUN column quads
 * of pair sums is added in int16 before one vpmaddwd: 8 products a lane,
 * at most 8 x 255 x 16 = 32640 (Q5_0; Q4_0 half that). Then, as with VNNI,
 * less 128 x the weights' sum. Against the int16 pairs, 2.25 operations
 * for 32 products instead of 4 for 16. Runs of a whole Q4_0 block (8
 * quads, also exact) measured the same (128 x 2816 x 1024: 4.63-4.65
 * against 4.59 ms) and took another 3 KiB of code. */
enum { I8G_BYTE_RUN = 4 };

/* The column chunk of the GEMM form that runs, `bytes` when its weights
 * are packed as int8 (VNNI, or Q4_0 / Q5_0's byte runs), else int16: the
 * largest group it takes. */
static inline uint32_t i8g_chunk(const int bytes)
{
    return bytes ? (uint32_t)I8G_KC : (uint32_t)I8G_KC16;
}

/* 8x8 transpose of int32 elements: v[i] holds row i; afterwards v[j] holds
 * element j of rows 0..7. Inlined and unrolled: the K GEMM's pack
 * (kg_pack_body) calls it 16 times a block, and as a call with loops it
 * made 12 to 32 tokens of Q4_K / Q6_K 10-20 % slower. */
BLOCK void transpose8x8(__m256i v[8])
{
    __m256i t[8], u[8];
    UNROLL
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);     /* e0 e1 | e4 e5 of 2 rows */
        t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]); /* e2 e3 | e6 e7 */
    }
    UNROLL
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);         /* e0 | e4 of 4 rows */
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);     /* e1 | e5 */
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]); /* e2 | e6 */
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]); /* e3 | e7 */
    }
    UNROLL
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x20);
        v[j + 4] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x31);
    }
}

/* What the GEMM form multiplies: int8 rows Q [rows, cols] with a float
 * scale per group S [rows, ng] (I8_GROUP: dt 0), or the Q4_0 / Q5_0 / Q8_0
 * blocks W [rows, cols / 32] (dt COLIBRI_DTYPE_Q4_0 / _Q5_0 / _Q8_0), which
 * are groups of 32 in another dress: ref's block term float(sum (q - 8) x) *
 * (d * xs) is the group term float(dot) * (S * XS) with the value q - 8
 * (Q5_0: q - 16, Q8_0: q) and S = d, added block after block in the same order,
 * and quantize_act_blk's XQ / XS are quantize_act_i8's for group 32 over
 * the padded columns (zeros past cols). So the blocks, unpacked into the
 * packed layout a chunk at a time (unpack_q_0), give ref's bits. */
typedef struct {
    unsigned dt;
    const int8_t *q;  /* dt 0 */
    const float *s;   /* dt 0 */
    const uint8_t *w; /* Q4_0 / Q5_0 / Q8_0 */
} i8g_src;

/* Bytes of a source's row of `cols` columns, and the byte of column c (a
 * multiple of 32 for the block types). */
static inline size_t i8g_row_bytes(const i8g_src *src, uint32_t cols)
{
    return src->dt ? (size_t)(cols / 32) * clb_block_bytes(src->dt) : cols;
}

static inline size_t i8g_col_byte(const i8g_src *src, uint32_t c)
{
    return src->dt ? (size_t)(c / 32) * clb_block_bytes(src->dt) : c;
}

/* wp[s][16][4] = Q[r0 + i, kc + 4s + k] for i < nr and column < kl, zero
 * padding elsewhere (rows past nr, columns past kl up to a multiple of 4),
 * Q the int8 values of src: I8_GROUP's rows (q8 = 0), or (q8 = 1) Q8_0's
 * blocks read in place (column c at byte 34 (c / 32) + 2 + c % 32 of its
 * row) rather than through unpack_q_0's copy: the bench model's Q8_0 GGUF
 * prefilled 128 tokens 10-13 % faster on Zen 5 (567 -> 623-645 tokens/s).
 * q8 a constant in each instance, and the two in functions of their own:
 * with the addressing decided at run time int8's prefill 128 lost 3-10 %,
 * with both instances in one function 2-3 %. */
BLOCK void pack_q16_form(const int q8, int8_t *wp, const i8g_src *src, uint32_t cols,
                         uint32_t r0, uint32_t nr, uint32_t kc, uint32_t kl)
{
    const int8_t *base = q8 ? (const int8_t *)(const void *)(src->w + CLB_Q8_0_QS) : src->q;
    const size_t stride = q8 ? (size_t)(cols / 32) * CLB_Q8_0_BYTES : cols;
#define PACK_Q16_AT(r, c) (base + (size_t)(r) * stride + \
                           (q8 ? (size_t)((c) / 32u) * CLB_Q8_0_BYTES + (c) % 32u : (size_t)(c)))
    const uint32_t kl4 = (kl + 3) & ~3u;
    uint32_t c = 0;
    if (nr == 16 && (!q8 || kc % 32 == 0)) /* a Q8_0 run: one block */
        for (; c + 32 <= kl; c += 32)
            for (int h = 0; h < 2; h++) {
                __m256i v[8];
                for (int i = 0; i < 8; i++)
                    v[i] = _mm256_loadu_si256((const __m256i *)(const void *)PACK_Q16_AT(
                        r0 + 8 * (uint32_t)h + (uint32_t)i, kc + c));
                transpose8x8(v);
                for (int j = 0; j < 8; j++)
                    _mm256_store_si256((__m256i *)(void *)(wp + (c / 4 + j) * 64 + 32 * h), v[j]);
            }
    for (; c < kl4; c++)
        for (uint32_t i = 0; i < 16; i++)
            wp[(c / 4) * 64 + i * 4 + c % 4] = i < nr && c < kl ? *PACK_Q16_AT(r0 + i, kc + c) : 0;
#undef PACK_Q16_AT
}

/* pack_q16_form for int8 rows (pack_q16) and for Q8_0's blocks (pack_q80). */
TGT static void pack_q16(int8_t *wp, const i8g_src *src, uint32_t cols, uint32_t r0,
                         uint32_t nr, uint32_t kc, uint32_t kl)
{
    pack_q16_form(0, wp, src, cols, r0, nr, kc, kl);
}
TGT static void pack_q80(int8_t *wp, const i8g_src *src, uint32_t cols, uint32_t r0,
                         uint32_t nr, uint32_t kc, uint32_t kl)
{
    pack_q16_form(1, wp, src, cols, r0, nr, kc, kl);
}

/* tmp[i] = block b of row r0 + i (i < nr) as 32 int8 values, q less the
 * type's zero; with the block types' code below. */
static void unpack_q_0(int8_t tmp[16][32], const i8g_src *src, size_t row_bytes, uint32_t r0,
                       uint32_t nr, uint32_t b);

/* pack_q16's layout for the columns [c, c + n) (n <= 32) of the source's
 * rows r0 .. r0 + nr, at wp. */
TGT static void pack_slice(int8_t *wp, const i8g_src *src, uint32_t cols, uint32_t r0,
                           uint32_t nr, uint32_t c, uint32_t n)
{
    if (!src->dt) {
        pack_q16(wp, src, cols, r0, nr, c, n);
        return;
    }
    __attribute__((aligned(32))) int8_t tmp[16][32];
    unpack_q_0(tmp, src, i8g_row_bytes(src, cols), r0, nr, c / 32);
    const i8g_src rows = {0, &tmp[0][0], NULL, NULL};
    pack_q16(wp, &rows, 32, 0, nr, 0, 32);
}

/* w16[p][16][2] (int16, column pair p: 2 columns of a row per int32 lane,
 * rows 0-7 in the first vector, 8-15 in the second) from the rows and
 * columns pack_q16 takes, with the same zero padding; through pack_q16's
 * layout 32 columns at a time. */
TGT static void pack_w16(int16_t *w16, const i8g_src *src, uint32_t cols, uint32_t r0,
                         uint32_t nr, uint32_t kc, uint32_t kl)
{
    __attribute__((aligned(32))) int8_t wp[16 * 32];
    for (uint32_t c0 = 0; c0 < kl; c0 += 32) {
        const uint32_t n = kl - c0 < 32 ? kl - c0 : 32;
        pack_slice(wp, src, cols, r0, nr, kc + c0, n);
        for (uint32_t s = 0; s < (n + 3) / 4; s++)
            for (int h = 0; h < 2; h++) {
                /* v: 8 rows x 4 columns. Widened, lo holds rows 0-3 and hi
                 * rows 4-7, a row's columns 0-1 in an even int32 lane and
                 * 2-3 in the odd one after it. */
                const __m256i v = _mm256_load_si256((const __m256i *)(const void *)(wp + s * 64 + 32 * h));
                const __m256 lo = _mm256_castsi256_ps(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)));
                const __m256 hi = _mm256_castsi256_ps(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)));
                /* the even (odd) lanes of lo and hi come out as rows 0 1 4 5
                 * | 2 3 6 7; the 64-bit permute puts them in order */
                const __m256i a = _mm256_permute4x64_epi64(
                    _mm256_castps_si256(_mm256_shuffle_ps(lo, hi, 0x88)), 0xD8);
                const __m256i b = _mm256_permute4x64_epi64(
                    _mm256_castps_si256(_mm256_shuffle_ps(lo, hi, 0xDD)), 0xD8);
                int16_t *o = w16 + (size_t)(c0 / 2 + 2 * s) * 32 + 16 * h;
                _mm256_store_si256((__m256i *)(void *)o, a);
                _mm256_store_si256((__m256i *)(void *)(o + 32), b);
            }
    }
}

/* x16[t][0 .. kl rounded up to 4) = token t0 + t's activations kc .. kc +
 * kl as int16, zeros past kl (where the packed weights are zero too). */
TGT static void widen_x16(int16_t (*x16)[I8G_KC16], const int8_t *XQ, uint32_t cols,
                          uint32_t t0, int T, uint32_t kc, uint32_t kl)
{
    for (int t = 0; t < T; t++) {
        const int8_t *x = XQ + (size_t)(t0 + (uint32_t)t) * cols + kc;
        uint32_t c = 0;
        for (; c + 16 <= kl; c += 16)
            _mm256_store_si256((__m256i *)(void *)(x16[t] + c),
                               _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(x + c))));
        for (; c < ((kl + 3) & ~3u); c++)
            x16[t][c] = c < kl ? x[c] : 0;
    }
}

/* *acc += madd(w, x) (int16 pairs into int32 lanes), the add in asm on
 * the accumulator in place. As C, GCC reassociated the tile's chains and
 * spilled one; with scaled_acc's empty-asm pin it kept them in registers
 * but copied each sum after its add, 8 vmovdqa among a pass's 24 vector
 * instructions. scaled_acc keeps its pin: with this asm add instead, the
 * K types' tiles (Q4_K, Q5_K, Q6_K without VNNI) were no faster at 1-128
 * tokens (test_kernels --bench, alternated, within the host's noise) and
 * avx2.o grew by 1.5 KB. */
BLOCK void madd_acc(__m256i *acc, __m256i w, __m256i x)
{
    const __m256i p = _mm256_madd_epi16(w, x);
    __m256i a = *acc;
    __asm__("vpaddd %1, %0, %0" : "+x"(a) : "x"(p));
    *acc = a;
}

/* xu[t][0 .. kl rounded up to 4) = token t0 + t's activations kc .. kc +
 * kl, biased to unsigned (x + 128, xor 0x80: vpdpbusd's unsigned operand),
 * 0x80 (x = 0) past kl, where the packed weights are zero. Once per tile
 * instead of an xor per token, column quad and 16 rows. */
TGT static void bias_x8(uint8_t (*xu)[I8G_KC], const int8_t *XQ, uint32_t cols, uint32_t t0,
                        int T, uint32_t kc, uint32_t kl)
{
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int t = 0; t < T; t++) {
        const int8_t *x = XQ + (size_t)(t0 + (uint32_t)t) * cols + kc;
        uint32_t c = 0;
        for (; c + 32 <= kl; c += 32)
            _mm256_store_si256((__m256i *)(void *)(xu[t] + c),
                               _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + c)),
                                                bias));
        for (; c < ((kl + 3) & ~3u); c++)
            xu[t][c] = (uint8_t)(c < kl ? (uint8_t)x[c] ^ 0x80u : 0x80u);
    }
}

/* Y[t0 + t, r0 .. r0 + 16) for T tokens over the chunk's groups. With VNNI
 * wp is pack_q16's and the activations are the tile's biased bytes xu
 * (bias_x8); without, wp is pack_w16's (int16) and they are read from x16
 * (widen_x16). x86_gemm.h's contract, in ymm registers. */
BLOCK void i8g_micro(const int vnni, const uint32_t run, const int T, float *Y, const void *wp,
                     const int32_t *csum, const float *sp, const uint8_t (*xu)[I8G_KC],
                     const int16_t (*x16)[I8G_KC16], const float *XS, uint32_t rows,
                     uint32_t ng, uint32_t r0, uint32_t nr,
                     uint32_t t0, uint32_t kc, uint32_t kl, uint32_t g0, uint32_t group)
{
    const int8_t *w8 = (const int8_t *)wp;
    const int16_t *w16 = (const int16_t *)wp;
    const __m256i m0 = nr >= 8 ? _mm256_set1_epi32(-1) : tail_mask(nr);
    const __m256i m1 = nr >= 16 ? _mm256_set1_epi32(-1)
                                : nr <= 8 ? _mm256_setzero_si256() : tail_mask(nr - 8);
    const float *xs[MAXT];
    __m256 facc[2][MAXT];
    UNROLL
    for (int t = 0; t < T; t++) {
        xs[t] = XS + (size_t)(t0 + t) * ng + g0;
        float *y = Y + (size_t)(t0 + t) * rows + r0;
        if (kc == 0) {
            facc[0][t] = _mm256_setzero_ps();
            facc[1][t] = _mm256_setzero_ps();
        } else { /* continue the running sum of the previous chunks */
            facc[0][t] = _mm256_maskload_ps(y, m0);
            facc[1][t] = _mm256_maskload_ps(y + 8, m1);
        }
    }
    for (uint32_t gl = 0, cs = 0; cs < kl; gl++, cs += group) {
        const uint32_t ce = kl - cs < group ? kl : cs + group;
        __m256i iacc[2][MAXT];
        UNROLL
        for (int t = 0; t < T; t++)
            iacc[0][t] = iacc[1][t] = _mm256_setzero_si256();
        if (run) { /* the group's quads in runs of I8G_BYTE_RUN (group % 16 == 0) */
            for (uint32_t c = cs; c < ce; c += 4 * run) {
                __m256i a16[2][MAXT];
                UNROLL
                for (int t = 0; t < T; t++)
                    a16[0][t] = a16[1][t] = _mm256_setzero_si256();
                UNROLL
                for (uint32_t u = 0; u < run; u++) {
                    const __m256i w0 = _mm256_load_si256((const __m256i *)(const void *)(w8 + (c + 4 * u) * 16));
                    const __m256i w1 = _mm256_load_si256((const __m256i *)(const void *)(w8 + (c + 4 * u) * 16 + 32));
                    UNROLL
                    for (int t = 0; t < T; t++) {
                        int32_t quad;
                        memcpy(&quad, xu[t] + c + 4 * u, 4);
                        const __m256i xb = _mm256_set1_epi32(quad);
                        a16[0][t] = _mm256_add_epi16(a16[0][t], _mm256_maddubs_epi16(xb, w0));
                        a16[1][t] = _mm256_add_epi16(a16[1][t], _mm256_maddubs_epi16(xb, w1));
                    }
                }
                const __m256i one16 = _mm256_set1_epi16(1);
                UNROLL
                for (int t = 0; t < T; t++) {
                    madd_acc(&iacc[0][t], a16[0][t], one16);
                    madd_acc(&iacc[1][t], a16[1][t], one16);
                }
            }
        } else {
            for (uint32_t c = cs; c < ce; c += 4) {
                if (vnni) {
                    const __m256i w0 = _mm256_load_si256((const __m256i *)(const void *)(w8 + c * 16));
                    const __m256i w1 = _mm256_load_si256((const __m256i *)(const void *)(w8 + c * 16 + 32));
                    UNROLL
                    for (int t = 0; t < T; t++) {
                        int32_t quad;
                        memcpy(&quad, xu[t] + c, 4); /* folded into vpbroadcastd */
                        const __m256i xb = _mm256_set1_epi32(quad);
                        DPBUSD(vnni, iacc[0][t], xb, w0);
                        DPBUSD(vnni, iacc[1][t], xb, w1);
                    }
                    continue;
                }
                /* two column pairs; past kl both buffers hold zeros up to the
                 * next multiple of 4 */
                UNROLL
                for (int h = 0; h < 2; h++) {
                    const int16_t *wc = w16 + c * 16 + 32 * h;
                    const __m256i w0 = _mm256_load_si256((const __m256i *)(const void *)wc);
                    const __m256i w1 = _mm256_load_si256((const __m256i *)(const void *)(wc + 16));
                    UNROLL
                    for (int t = 0; t < T; t++) {
                        int32_t pair;
                        memcpy(&pair, x16[t] + c + 2 * h, 4); /* folded into vpbroadcastd */
                        const __m256i xb = _mm256_set1_epi32(pair);
                        madd_acc(&iacc[0][t], w0, xb);
                        madd_acc(&iacc[1][t], w1, xb);
                    }
                }
            }
        }
        const __m256 s0 = _mm256_load_ps(sp + gl * 16), s1 = _mm256_load_ps(sp + gl * 16 + 8);
        __m256i corr0 = _mm256_setzero_si256(), corr1 = _mm256_setzero_si256();
        if (vnni || run) {
            corr0 = _mm256_slli_epi32(_mm256_load_si256((const __m256i *)(const void *)(csum + gl * 16)), 7);
            corr1 = _mm256_slli_epi32(_mm256_load_si256((const __m256i *)(const void *)(csum + gl * 16 + 8)), 7);
        }
        UNROLL
        for (int t = 0; t < T; t++) {
            const __m256 xsv = _mm256_set1_ps(xs[t][gl]);
            __m256i d0 = iacc[0][t], d1 = iacc[1][t];
            if (vnni || run) {
                d0 = _mm256_sub_epi32(d0, corr0);
                d1 = _mm256_sub_epi32(d1, corr1);
            }
            facc[0][t] = _mm256_add_ps(facc[0][t], _mm256_mul_ps(_mm256_cvtepi32_ps(d0), _mm256_mul_ps(s0, xsv)));
            facc[1][t] = _mm256_add_ps(facc[1][t], _mm256_mul_ps(_mm256_cvtepi32_ps(d1), _mm256_mul_ps(s1, xsv)));
        }
    }
    UNROLL
    for (int t = 0; t < T; t++) {
        float *y = Y + (size_t)(t0 + t) * rows + r0;
        _mm256_maskstore_ps(y, m0, facc[0][t]);
        _mm256_maskstore_ps(y + 8, m1, facc[1][t]);
    }
}

/* The weights of the chunk after the one at (r0, kend) (the next row
 * block's first after a row's last) requested into L2 while this chunk
 * computes. A prefill chunk of tokens finds each expert's weights in
 * memory, and the pack's loads stalled on them: 14 % of a 2048-token int8
 * prefill's samples (avx2, Xeon) were its loads. The first chunk of a call
 * still waits: the next rows belong to another call. */
TGT static void i8g_prefetch_next(const i8g_src *src, uint32_t rows, uint32_t cols, uint32_t r0,
                                  uint32_t kend, uint32_t chunk)
{
    if (kend >= cols) {
        r0 += 16;
        kend = 0;
    }
    if (r0 >= rows)
        return;
    const uint32_t nr = rows - r0 < 16 ? rows - r0 : 16;
    const uint32_t kl = cols - kend < chunk ? cols - kend : chunk;
    const size_t row_bytes = i8g_row_bytes(src, cols), at = i8g_col_byte(src, kend),
                 len = i8g_col_byte(src, kend + kl) - at;
    const char *base = src->dt ? (const char *)src->w : (const char *)src->q;
    for (uint32_t i = 0; i < nr; i++) {
        const char *row = base + (size_t)(r0 + i) * row_bytes + at;
        for (size_t c = 0; c < len; c += 64)
            _mm_prefetch(row + c, _MM_HINT_T1);
    }
}

/* A block's fp16 field at p as float32 (F16C: exact, as clb_blk_f16). */
TGT static inline float blk_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* sp[gl * 16 + i] = the scale of group g0 + gl of row r0 + i (0 from nr
 * on): S's, or a block's d (its first field). */
TGT static void i8g_scales(float *sp, const i8g_src *src, uint32_t cols, uint32_t ng,
                           uint32_t r0, uint32_t nr, uint32_t g0, uint32_t ngc)
{
    const size_t row_bytes = i8g_row_bytes(src, cols), bytes = src->dt ? clb_block_bytes(src->dt) : 0;
    for (uint32_t i = 0; i < 16; i++)
        for (uint32_t gl = 0; gl < ngc; gl++)
            sp[gl * 16 + i] = i >= nr ? 0.0f
                              : src->dt ? blk_f16(src->w + (size_t)(r0 + i) * row_bytes +
                                                  (size_t)(g0 + gl) * bytes)
                                        : src->s[(size_t)(r0 + i) * ng + g0 + gl];
}

/* Not inlined into i8_matmul (GCC clones it per constant vnni instead): as
 * one function with the decode form the register allocation of the GEMM
 * loop came out worse, prefill 128 x 2816 x 1024 without VNNI 10.1 ms
 * against 9.2 ms (in the byte form this replaced). */
/* micro: another micro-kernel for the VNNI tiles (x86_gemm.h: avx512.c's),
 * or NULL for i8g_micro. */
static __attribute__((noinline)) TGT void i8_gemm(const int vnni, clb_i8g_micro_fn *micro,
                   float *Y, const i8g_src *src,
                   const int8_t *XQ, const float *XS, uint32_t n, uint32_t rows,
                   uint32_t cols, uint32_t group)
{
    enum { TB = 4, GMAX = I8G_KC / 4 };
    /* Q4_0 / Q5_0 without VNNI: byte runs (I8G_BYTE_RUN), int8 weights and
     * biased activations as with VNNI; int8 rows and Q8_0 (values to 128,
     * too large for the runs): int16 pairs */
    const uint32_t run = vnni || !src->dt || src->dt == COLIBRI_DTYPE_Q8_0 ? 0u
                                                                          : (uint32_t)I8G_BYTE_RUN;
    const int bytes = vnni || run;
    /* the packed weights: int8 with VNNI (pack_q16), int16 without (pack_w16) */
    __attribute__((aligned(32))) int8_t wp[16 * I8G_KC]; /* = 16 x I8G_KC16 int16 */
    /* the tile's activations: int16 without VNNI (widen_x16), biased bytes
     * with (bias_x8, through xu); I8G_KC16 int16 = I8G_KC bytes */
    __attribute__((aligned(32))) int16_t x16[TB][I8G_KC16];
    uint8_t(*xu)[I8G_KC] = (uint8_t(*)[I8G_KC])(void *)x16;
    __attribute__((aligned(32))) float sp[GMAX * 16];
    __attribute__((aligned(32))) int32_t csum[GMAX * 16]; /* with VNNI */
    const uint32_t ng = (cols + group - 1) / group;
    const uint32_t gpc = i8g_chunk(bytes) / group; /* whole groups per column chunk */
    for (uint32_t r0 = 0; r0 < rows; r0 += 16) {
        const uint32_t nr = rows - r0 < 16 ? rows - r0 : 16;
        for (uint32_t g0 = 0; g0 < ng; g0 += gpc) {
            const uint32_t kc = g0 * group;
            const uint32_t kl = cols - kc < gpc * group ? cols - kc : gpc * group;
            const uint32_t ngc = (kl + group - 1) / group;
            if (!bytes)
                pack_w16((int16_t *)(void *)wp, src, cols, r0, nr, kc, kl);
            else if (!src->dt)
                pack_q16(wp, src, cols, r0, nr, kc, kl);
            else if (src->dt == COLIBRI_DTYPE_Q8_0)
                pack_q80(wp, src, cols, r0, nr, kc, kl);
            else
                for (uint32_t c0 = 0; c0 < kl; c0 += 32)
                    pack_slice(wp + c0 * 16, src, cols, r0, nr, kc + c0, 32);
            i8g_prefetch_next(src, rows, cols, r0, kc + kl, gpc * group);
            i8g_scales(sp, src, cols, ng, r0, nr, g0, ngc);
            if (bytes) /* per row and group: the sum of the weights, by lanes */
                for (uint32_t gl = 0, cs = 0; gl < ngc; gl++, cs += group) {
                    const uint32_t ce = kl - cs < group ? kl : cs + group;
                    const __m256i one8 = _mm256_set1_epi8(1), one16 = _mm256_set1_epi16(1);
                    __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
                    for (uint32_t c = cs; c < ce; c += 4) {
                        const int8_t *w8 = wp + c * 16;
                        __m256i w0 = _mm256_load_si256((const __m256i *)(const void *)w8);
                        __m256i w1 = _mm256_load_si256((const __m256i *)(const void *)(w8 + 32));
                        if (vnni) {
                            DPBUSD(vnni, a0, one8, w0);
                            DPBUSD(vnni, a1, one8, w1);
                        } else { /* a block's 32 values of at most 16 in magnitude */
                            a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_maddubs_epi16(one8, w0), one16));
                            a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_maddubs_epi16(one8, w1), one16));
                        }
                    }
                    _mm256_store_si256((__m256i *)(void *)(csum + gl * 16), a0);
                    _mm256_store_si256((__m256i *)(void *)(csum + gl * 16 + 8), a1);
                }
            const int16_t(*xw)[I8G_KC16] = (const int16_t(*)[I8G_KC16])x16;
            const uint8_t(*xr)[I8G_KC] = (const uint8_t(*)[I8G_KC])xu;
            uint32_t t = 0;
/* i8g_micro for T tokens in the form at hand, its run a constant */
#define I8G_MICRO_RUNS(T)                                                                       \
    do {                                                                                        \
        if (run)                                                                                \
            i8g_micro(0, I8G_BYTE_RUN, T, Y, wp, csum, sp, xr, xw, XS, rows, ng, r0, nr, t, kc,  \
                      kl, g0, group);                                                           \
        else                                                                                    \
            i8g_micro(vnni, 0, T, Y, wp, csum, sp, xr, xw, XS, rows, ng, r0, nr, t, kc, kl, g0,   \
                      group);                                                                   \
    } while (0)
            for (uint32_t T; t < n; t += T) {
                T = n - t >= TB ? (uint32_t)TB : 1u;
                if (bytes)
                    bias_x8(xu, XQ, cols, t, (int)T, kc, kl);
                else
                    widen_x16(x16, XQ, cols, t, (int)T, kc, kl);
                if (micro)
                    micro((int)T, Y, wp, csum, sp, &xr[0][0], XS, rows, ng, r0, nr, t, kc, kl, g0, group);
                else if (T == TB)
                    I8G_MICRO_RUNS(TB);
                else
                    I8G_MICRO_RUNS(1);
            }
#undef I8G_MICRO_RUNS
        }
    }
}

/* Few tokens (decode): the dot-product form, token after token over row
 * panels that fit in L2 (so tokens after the first find the panel's weights
 * in cache; one token: the whole matrix), 4 rows at a time, one from each
 * quarter of the panel (STREAMS; i8_rows4, or i8_rows4_g32 for the
 * converter's group 32), the last rows % 4 one by one.
 * PREFETCH (decode): one token reads every weight once, and the hardware
 * prefetchers stop at page boundaries and start again only after a few
 * misses, so without help each block waited for memory (int8 decode read 7
 * GB/s of the machine's 13). Each block therefore requests its streams'
 * bytes CLB_STREAM_PFB ahead into L2 as it goes: small-model int8 decode 34 ->
 * 46 tokens/s with adjacent rows (bench/results/FINDINGS.md), and 53 -> 88
 * with four streams on Zen 3 (FINDINGS.md 14). fx_matmul and blk_matmul do
 * the same for one token.
 * Many tokens (prefill, from I8G_MIN_N): the GEMM form (i8_gemm). Both are
 * bit-identical to ref, so which one runs, and how a caller splits rows or
 * tokens between calls, never changes a bit of Y. */
BLOCK void i8_matmul(const int vnni, float *Y, const int8_t *Q, const float *S,
                     const int8_t *XQ, const float *XS, uint32_t n,
                     uint32_t rows, uint32_t cols, uint32_t group)
{
    if (n >= I8G_MIN_N && group % 4 == 0 && group <= i8g_chunk(vnni)) {
        const i8g_src src = {0, Q, S, NULL};
        i8_gemm(vnni, NULL, Y, &src, XQ, XS, n, rows, cols, group);
        return;
    }
    const uint32_t ng = (cols + group - 1) / group;
    const uint32_t pr = n == 1 ? rows : panel_rows(rows, cols);
    for (uint32_t p0 = 0; p0 < rows; p0 += pr) {
        const uint32_t pe = rows - p0 < pr ? rows : p0 + pr;
        for (uint32_t t = 0; t < n; t++) {
            float *y = Y + (size_t)t * rows;
            const int8_t *xq = XQ + (size_t)t * cols;
            const float *xs = XS + (size_t)t * ng;
            /* block i: rows p0 + i + k * quarter, k < 4 (STREAMS) */
            const uint32_t quarter = (pe - p0) / 4;
            for (uint32_t i = 0; i < quarter; i++) {
                const int prefetch = i + 1 < quarter;
                if (group == 32 && cols % 32 == 0)
                    i8_rows4_g32(vnni, y, Q, S, xq, xs, cols, ng, p0 + i, quarter, prefetch);
                else
                    i8_rows4(vnni, y, Q, S, xq, xs, cols, group, ng, p0 + i, quarter, prefetch);
            }
            uint32_t r = p0 + 4 * quarter;
            for (; r < pe; r++)
                i8_row1(vnni, y, Q, S, xq, xs, cols, group, ng, r);
        }
    }
}

TGT static void avx2_matmul_i8(float *Y, const int8_t *Q, const float *S,
                               const int8_t *XQ, const float *XS, uint32_t n,
                               uint32_t rows, uint32_t cols, uint32_t group)
{
    i8_matmul(0, Y, Q, S, XQ, XS, n, rows, cols, group);
}

TGT static void avx2_vnni_matmul_i8(float *Y, const int8_t *Q, const float *S,
                                    const int8_t *XQ, const float *XS, uint32_t n,
                                    uint32_t rows, uint32_t cols, uint32_t group)
{
    i8_matmul(1, Y, Q, S, XQ, XS, n, rows, cols, group);
}

TGT static void avx2_evex_vnni_matmul_i8(float *Y, const int8_t *Q, const float *S,
                                         const int8_t *XQ, const float *XS, uint32_t n,
                                         uint32_t rows, uint32_t cols, uint32_t group)
{
    i8_matmul(2, Y, Q, S, XQ, XS, n, rows, cols, group);
}

/* ------------------------------------------------------------------------ */
/* Block types (FORMAT.md 4-5: Q4_0, Q5_0, Q4_K, Q5_K, Q6_K): quantize_act_blk
 * and the five block matmuls, bit-identical to ref.c's for every n, rows, cols and
 * tiling (kernels.h).
 *
 * Exactness: per (row, token, block) the integer results (Q4_0 dot, Q4_K
 * isum and msum, Q6_K isum) are exact int32, however the SIMD forms group
 * the products; the float work per block is ref's, one unfused operation at
 * a time in FORMAT.md 5's order, blocks in order.
 *
 * Tiles: a tile is R rows x T tokens (R * T <= 8 "combos"), and every vector
 * of per-combo values has lane k = t * R + r. Per block, each combo's
 * products go into its own 8 x int32 accumulator (the lane sum is the
 * integer result); lane_sums turns the R * T accumulators into one vector
 * with combo k's sum in lane k (an exact hadd tree), and the block's float
 * update then runs for all combos in one vector: the d / dmin of the rows
 * and the xs of the tokens are laid out in the same lanes. Each weight
 * block is loaded and unpacked once per tile, i.e. once for T tokens; the
 * activations are loaded once per row.
 *
 * Integer forms (q = the stored unsigned value, x = xq in [-127, 127]):
 * - vpmaddubsw (u8 q x s8 x, int16 pair sums) takes the unsigned weights
 *   directly: pairs <= 2 * 63 * 127 = 16002, no saturation.
 * - Q4_K / Q6_K multiply the int16 pair sums by the sub-block scale with
 *   vpmaddwd (scale broadcast as int16 over the sub-block's lanes), which
 *   also widens to int32; with VNNI vpdpwssd does multiply, widen and add.
 * - Offsets: Q4_0's q - 8 (Q5_0's q - 16) and Q6_K's q - 32 are applied as
 *   8 (16) * (sum of xq) and 32 * sum_j sc_j * bsum_j from XB (the sums of
 *   16 that quantize_act_blk provides); Q4_K's mins likewise use XB.
 * - Q4_0 with VNNI: vpdpbusd (u8 q x s8 x, 4 products per int32 lane).
 * Bounds (int32 exact): Q4_K lanes <= 8 * 2 * 3810 * 63, Q6_K <= 8 * 2 *
 * 16002 * 128 and the correction <= 32 * 16 * 128 * 2032. */

enum { BT_MAXT = 8 }; /* tokens per tile at most (R = 1, T = 8) */

/* How far past the next tile blk_tile's prefetches run ahead, in bytes. A
 * tile reads all its R rows in step, so "the next tile" alone is one tile's
 * time ahead: for a decode tile of 8 short rows (8 x 592 bytes for 1024
 * Q4_K columns) too little to hide the memory latency. Measured on Zen 4
 * (test_kernels --bench 1x, weights from memory): +4 KiB took Q4_K decode
 * from 12 to 16.5 GB/s and Q6_K from 16 to 18.5; +0 / 2 KiB were worse, 6
 * KiB equal; prefill unchanged. */
enum { BT_PF_AHEAD = 4096 };

/* acc + madd(p, s): the int16 products p times int16 scales s, pairs summed
 * into int32 lanes. VNNI: one vpdpwssd (vnni = 1 VEX, 2 EVEX, as DPBUSD).
 * Without VNNI the empty asm pins the sum to acc's register: GCC otherwise
 * reassociates a tile's chains (integer adds are associative), computes
 * every madd first and spills them all to the stack, a store and a load per
 * product (the Q4_K 4 x 2 tile had a 1.8 KiB frame). With the pin, 128 x
 * 2816 x 1024 without VNNI on a Xeon: Q4_K 10.9 -> 8.7 ms, Q6_K 11.7 ->
 * 10.5, Q5_K 12.2 -> 10.7; the integers, so the bits, are the same. */
BLOCK __m256i scaled_acc(const int vnni, __m256i acc, __m256i p, __m256i s)
{
#ifdef COLIBRI_AVX512_EMULATED
    if (vnni)
        return _mm256_dpwssd_epi32(acc, p, s);
#endif
    if (vnni == 2) {
        __asm__("%{evex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(p), "x"(s));
        return acc;
    }
    if (vnni) {
        __asm__("%{vex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(p), "x"(s));
        return acc;
    }
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
    __asm__("" : "+x"(acc));
    return acc;
}

/* a[k] for the NK = R * T combos of a tile -> lane k = the exact int32 sum
 * of a[k]'s 8 lanes (lanes from NK on: 0 or don't care). */
BLOCK __m256i lane_sums(const int NK, const __m256i a[8])
{
    if (NK == 8) {
        /* hadd pairs within 128-bit halves: g0 = [a0..a3 low-half sums |
         * a0..a3 high-half sums], g1 the same for a4..a7 */
        const __m256i g0 = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]),
                                             _mm256_hadd_epi32(a[2], a[3]));
        const __m256i g1 = _mm256_hadd_epi32(_mm256_hadd_epi32(a[4], a[5]),
                                             _mm256_hadd_epi32(a[6], a[7]));
        return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20),
                                _mm256_permute2x128_si256(g0, g1, 0x31));
    }
    const __m256i z = _mm256_setzero_si256();
    const __m256i g = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], NK > 1 ? a[1] : z),
                                        _mm256_hadd_epi32(NK > 2 ? a[2] : z, NK > 3 ? a[3] : z));
    return _mm256_zextsi128_si256(_mm_add_epi32(_mm256_castsi256_si128(g),
                                                _mm256_extracti128_si256(g, 1)));
}

/* Lane k = v[k % R]: a per-row value (a block's d) for each of the tile's
 * combos. */
BLOCK __m256 lanes_of_rows(const int R, const float v[MAXR])
{
    return _mm256_setr_ps(v[0 % R], v[1 % R], v[2 % R], v[3 % R], v[4 % R], v[5 % R],
                          v[6 % R], v[7 % R]);
}

/* Lane k = v[k / R] (0 from R * T on): a per-token value (xs) per combo. */
BLOCK __m256 lanes_of_tokens(const int R, const int T, const float v[BT_MAXT])
{
#define BT_TOK(k) ((k) < R * T ? v[(k) / R] : 0.0f)
    return _mm256_setr_ps(BT_TOK(0), BT_TOK(1), BT_TOK(2), BT_TOK(3), BT_TOK(4), BT_TOK(5),
                          BT_TOK(6), BT_TOK(7));
#undef BT_TOK
}

BLOCK __m256i lanes_of_tokens_i(const int R, const int T, const int32_t v[BT_MAXT])
{
#define BT_TOK(k) ((k) < R * T ? v[(k) / R] : 0)
    return _mm256_setr_epi32(BT_TOK(0), BT_TOK(1), BT_TOK(2), BT_TOK(3), BT_TOK(4), BT_TOK(5),
                             BT_TOK(6), BT_TOK(7));
#undef BT_TOK
}

/* Q5_0's bit 4 of the 16 values at columns 16h .. 16h + 15 of the blocks at
 * lo_blk (low 128-bit half) and hi_blk (high half): byte j of a half = 16
 * if bit 16h + j of the block's little-endian qh[4] (CLB_Q5_0_QH) is set, else
 * 0. Each half's two qh bytes spread over 8 lanes each (pshufb), a lane
 * keeping its own bit (and, cmpeq). */
BLOCK __m256i q5_0_high16(const uint8_t *lo_blk, const uint8_t *hi_blk, const int h)
{
    uint32_t a, c;
    memcpy(&a, lo_blk + CLB_Q5_0_QH, 4);
    memcpy(&c, hi_blk + CLB_Q5_0_QH, 4);
    const __m256i v = _mm256_setr_epi32((int)a, 0, 0, 0, (int)c, 0, 0, 0);
    const __m256i spread = h ? _mm256_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3)
                             : _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, spread), bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

/* The GEMM form's unpack (i8g_src): the 32 values of block b of each row,
 * low nibbles (columns 0..15) then high (16..31), Q5_0's fifth bit or-ed
 * in, less the zero; values in [-8, 7] ([-16, 15]); Q8_0's qs as stored. */
static TGT void unpack_q_0(int8_t tmp[16][32], const i8g_src *src, size_t row_bytes, uint32_t r0,
                           uint32_t nr, uint32_t b)
{
    if (src->dt == COLIBRI_DTYPE_Q8_0) {
        for (uint32_t i = 0; i < nr; i++)
            memcpy(tmp[i], src->w + (size_t)(r0 + i) * row_bytes + (size_t)b * CLB_Q8_0_BYTES +
                               CLB_Q8_0_QS, 32);
        return;
    }
    const int five = src->dt == COLIBRI_DTYPE_Q5_0;
    const size_t at = (size_t)b * (five ? CLB_Q5_0_BYTES : CLB_Q4_0_BYTES);
    const size_t qo = five ? CLB_Q5_0_QS : CLB_Q4_0_QS;
    const __m256i m4 = _mm256_set1_epi8(15), zero = _mm256_set1_epi8(five ? 16 : 8);
    for (uint32_t i = 0; i < nr; i++) {
        const uint8_t *bp = src->w + (size_t)(r0 + i) * row_bytes + at;
        const __m128i qs = _mm_loadu_si128((const __m128i *)(const void *)(bp + qo));
        __m256i q = _mm256_and_si256(
            _mm256_inserti128_si256(_mm256_castsi128_si256(qs), _mm_srli_epi16(qs, 4), 1), m4);
        if (five)
            q = _mm256_or_si256(q, _mm256_permute2x128_si256(q5_0_high16(bp, bp, 0),
                                                             q5_0_high16(bp, bp, 1), 0x20));
        _mm256_store_si256((__m256i *)(void *)tmp[i], _mm256_sub_epi8(q, zero));
    }
}

/* The 32 products of the unsigned bytes u and the signed bytes s, 4 to an
 * int32 lane: vpdpbusd, or vpmaddubsw then vpmaddwd (exact where the pairs
 * fit int16: the callers' values keep them to 32512). */
BLOCK __m256i dot_u8s8(const int vnni, __m256i u, __m256i s)
{
    if (vnni) {
        __m256i a = _mm256_setzero_si256();
        DPBUSD(vnni, a, u, s);
        return a;
    }
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* Q4_0 (Q5_0, Q8_0) block b of R rows x T tokens: lane k = dot = sum_i
 * (q_i - 8) * x_i (q_i - 16; Q8_0 q_i) over the block's 32 columns: the
 * 4-bit values of qs (Q5_0: with bit 4 from qh, q5_0_high16), the offset
 * taken out after. Q8_0's 32 signed values, one 32-byte load a row, go
 * through the one-row-a-vector form below: the unsigned operand is |q| (at
 * most 128) and the signed one x with q's sign (vpsignb; x is in [-127,
 * 127], so its negation is exact): pairs <= 2 * 128 * 127 = 32512, exact
 * in vpmaddubsw, and no offset. Q4_0's and Q5_0's blocks are small (18 or
 * 22 bytes), so the
 * per-block work around the products matters: with R even, one vector
 * holds two rows, [row p | row p + R/2] (16 + 16 bytes of qs), against the
 * token's x halves broadcast to both 128-bit halves; the int16 pair sums of
 * the low and high nibbles are added (<= 4 * 15 * 127, exact), so a tile
 * needs R * T / 2 vectors and a 3-hadd tree, then one permute to lane
 * order t * R + r. */
BLOCK __m256i q4_0_dots(const int vnni, const unsigned dt, const int R, const int T,
                        const uint8_t *const w[MAXR], const int8_t *const x[BT_MAXT],
                        const int16_t *const xb[BT_MAXT], uint32_t b)
{
    const int five = dt == COLIBRI_DTYPE_Q5_0, eight = dt == COLIBRI_DTYPE_Q8_0;
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    /* block bytes, the offset of qs in a block, the values' zero */
    const size_t bytes = clb_block_bytes(dt);
    const size_t qo = five ? CLB_Q5_0_QS : eight ? CLB_Q8_0_QS : CLB_Q4_0_QS;
    const int32_t zero = five ? 16 : 8; /* Q8_0 has none: it returns first */
    __m256i sums;
    if (R % 2 == 0 && !eight) {
        const int H = R / 2;
        __m256i xlo[BT_MAXT], xhi[BT_MAXT], v[4];
        UNROLL
        for (int t = 0; t < T; t++) { /* columns 0..15 and 16..31, in both halves */
            const int8_t *xt = x[t] + (size_t)b * CLB_Q4_0_COLS;
            xlo[t] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)xt));
            xhi[t] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(xt + 16)));
        }
        UNROLL
        for (int p = 0; p < H; p++) {
            const uint8_t *bp = w[p] + (size_t)b * bytes, *bq = w[p + H] + (size_t)b * bytes;
            const __m256i qs = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(bp + qo))),
                _mm_loadu_si128((const __m128i *)(const void *)(bq + qo)), 1);
            __m256i lo = _mm256_and_si256(qs, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4);
            if (five) { /* values to 31: pairs <= 4 * 31 * 127, still exact */
                lo = _mm256_or_si256(lo, q5_0_high16(bp, bq, 0));
                hi = _mm256_or_si256(hi, q5_0_high16(bp, bq, 1));
            }
            UNROLL
            for (int t = 0; t < T; t++) {
                __m256i a;
                if (vnni) {
                    a = _mm256_setzero_si256();
                    DPBUSD(vnni, a, lo, xlo[t]);
                    DPBUSD(vnni, a, hi, xhi[t]);
                } else {
                    a = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo[t]),
                                                           _mm256_maddubs_epi16(hi, xhi[t])), ones);
                }
                v[t * H + p] = a;
            }
        }
        /* low half lane j = vector j's row p, high half its row p + H */
        const __m256i z = _mm256_setzero_si256();
        const int NV = R * T / 2;
        const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], NV > 1 ? v[1] : z),
                                            _mm256_hadd_epi32(NV > 2 ? v[2] : z, NV > 3 ? v[3] : z));
        if (H == 4) {
            sums = s; /* R = 8, T = 1: already rows 0..7 */
        } else {
            /* combo k = (t, r) sits in lane t * H + r (r < H) or 4 + t * H + r - H */
#define Q40_SRC(k) ((k) % R < H ? (k) / R * H + (k) % R : 4 + (k) / R * H + (k) % R - H)
            sums = _mm256_permutevar8x32_epi32(s, _mm256_setr_epi32(
                Q40_SRC(0), Q40_SRC(1), Q40_SRC(2), Q40_SRC(3), Q40_SRC(4) & 7, Q40_SRC(5) & 7,
                Q40_SRC(6) & 7, Q40_SRC(7) & 7));
#undef Q40_SRC
        }
    } else {
        __m256i acc[8]; /* all 8 zeroed: as q4k_sums */
        UNROLL
        for (int k = 0; k < 8; k++)
            acc[k] = _mm256_setzero_si256();
        UNROLL
        for (int r = 0; r < R; r++) {
            const uint8_t *bp = w[r] + (size_t)b * bytes;
            __m256i q;
            if (eight) { /* the 32 signed values, in column order */
                q = _mm256_loadu_si256((const __m256i *)(const void *)(bp + qo));
            } else { /* qs[16] -> [low nibbles = columns 0..15 | high nibbles = 16..31] */
                const __m128i qs = _mm_loadu_si128((const __m128i *)(const void *)(bp + qo));
                q = _mm256_and_si256(
                    _mm256_inserti128_si256(_mm256_castsi128_si256(qs), _mm_srli_epi16(qs, 4), 1), m4);
            }
            if (five) /* bit 4 of columns 0..15 | of 16..31 */
                q = _mm256_or_si256(q, _mm256_permute2x128_si256(q5_0_high16(bp, bp, 0),
                                                                 q5_0_high16(bp, bp, 1), 0x20));
            UNROLL
            for (int t = 0; t < T; t++) {
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(
                    x[t] + (size_t)b * CLB_Q4_0_COLS));
                acc[t * R + r] = eight ? dot_u8s8(vnni, _mm256_sign_epi8(q, q), _mm256_sign_epi8(xv, q))
                                       : dot_u8s8(vnni, q, xv);
            }
        }
        sums = lane_sums(R * T, acc);
    }
    if (eight)
        return sums;
    /* sum (q - z) x = sum q x - z * (sum of the block's 32 xq = XB 2b, 2b+1) */
    int32_t off[BT_MAXT] = {0}; /* lanes_of_tokens_i reads T of them */
    UNROLL
    for (int t = 0; t < T; t++)
        off[t] = zero * ((int32_t)xb[t][2 * b] + xb[t][2 * b + 1]);
    return _mm256_sub_epi32(sums, lanes_of_tokens_i(R, T, off));
}

/* A Q4_K block's 8 6-bit scales and mins (clb_q4k_scale_min) as bytes
 * [sc0..sc7 | m0..m7]; q4k_scales_mins below widens them for the tiles
 * (*scb: both halves, for the per-sub-block broadcasts; *mdup lined up with
 * the block's 16 XB sums: sub-block j is XB 2j, 2j+1). In bytes, with s = scales[0..11] (a 16-byte
 * load from the block's CLB_QK_SCALES; bytes 12..15 are qs or qh, unused):
 *   lanes 0-3   sc0..3 = s[0..3] & 63
 *   lanes 4-7   sc4..7 = (s[8..11] & 15) | (s[0..3] >> 6) << 4
 *   lanes 8-11  m0..3  = s[4..7] & 63
 *   lanes 12-15 m4..7  = (s[8..11] >> 4) | (s[4..7] >> 6) << 4
 * i.e. a = s[0..3, 8..11, 4..7, 8..11], b = s[-, 0..3, -, 4..7]; vector
 * ops instead of the scalar word arithmetic (~12 fewer instructions a
 * row-block; 16-bit shifts, then masks keeping bits of the same byte). */
/* The same for each 128-bit lane of s (q4k_scm2: the decode form's two
 * rows a ymm). */
TGT static inline __m256i q4k_scm_lanes(__m256i s)
{
#define SCM_LANES(...) _mm256_broadcastsi128_si256(_mm_setr_epi8(__VA_ARGS__))
    const __m256i a = _mm256_shuffle_epi8(s, SCM_LANES(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m256i b = _mm256_shuffle_epi8(s, SCM_LANES(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    const __m256i lo = _mm256_and_si256(a, SCM_LANES(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(a, 4), SCM_LANES(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                                           15, 15, 15, 15));
#undef SCM_LANES
    const __m256i top = _mm256_and_si256(_mm256_srli_epi16(b, 2), _mm256_set1_epi8(0x30));
    return _mm256_or_si256(_mm256_or_si256(lo, hi), top); /* [sc0..7 | m0..7] u8 a lane */
}

TGT static inline __m128i q4k_scm(const uint8_t *sc12)
{
    const __m128i s = _mm_loadu_si128((const __m128i *)(const void *)sc12);
    return _mm256_castsi256_si128(q4k_scm_lanes(_mm256_zextsi128_si256(s)));
}

/* q4k_scm of two blocks, a (low 128 bits) and b (high). */
TGT static inline __m256i q4k_scm2(const uint8_t *a, const uint8_t *b)
{
    return q4k_scm_lanes(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)a)),
        _mm_loadu_si128((const __m128i *)(const void *)b), 1));
}

/* q4k_scm's bytes for the tiles: *scb = [sc0..sc7 | sc0..sc7] int16, *mdup
 * = [m0 m0 m1 m1 .. m7 m7] int16 (see above). */
TGT static inline void q4k_scales_mins(const uint8_t *sc12, __m256i *scb, __m256i *mdup)
{
    const __m128i scm = q4k_scm(sc12);
    *scb = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm));
    *mdup = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
        scm, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
}

/* Q4_K (five: Q5_K) block b of R rows x T tokens: lane k of *isum = sum_j
 * sc_j * dot_j, of *msum = sum_j m_j * bsum_j. Q5_K's values have bit 4 of
 * sub-block j at bit j of qh[l] (FORMAT.md 4); values to 31 keep the pair
 * sums exact (2 * 31 * 127). */
BLOCK void q4k_sums(const int vnni, const int five, const int R, const int T, __m256i *isum,
                    __m256i *msum, const uint8_t *const w[MAXR], const int8_t *const x[BT_MAXT],
                    const int16_t *const xb[BT_MAXT], uint32_t b)
{
    const size_t bytes = five ? CLB_Q5_K_BYTES : CLB_Q4_K_BYTES;
    /* all 8 zeroed, though lane_sums reads only the first R * T: the
     * compiler drops the rest, and the analysers need not follow NK */
    __m256i acc[8], macc[8];
    UNROLL
    for (int k = 0; k < 8; k++)
        acc[k] = macc[k] = _mm256_setzero_si256();
    UNROLL
    for (int r = 0; r < R; r++) {
        const uint8_t *blk = w[r] + (size_t)b * bytes;
        __m256i scb, mdup;
        q4k_scales_mins(blk + CLB_QK_SCALES, &scb, &mdup);
        /* lo: sub-block 2c (columns 64c .. + 32), hi: sub-block 2c + 1 */
        UNROLL
        for (int c = 0; c < 4; c++) {
            __m256i lo, hi;
            clb_kg_unpack64(five ? COLIBRI_DTYPE_Q5_K : COLIBRI_DTYPE_Q4_K, blk, c, &lo, &hi);
            /* int16 lane pattern (2j, 2j+1) picks sc_j into every int16 */
            const __m256i slo = _mm256_shuffle_epi8(scb, _mm256_set1_epi16((short)(0x0100 * (4 * c + 1) + 4 * c)));
            const __m256i shi = _mm256_shuffle_epi8(scb, _mm256_set1_epi16((short)(0x0100 * (4 * c + 3) + 4 * c + 2)));
            UNROLL
            for (int t = 0; t < T; t++) {
                const int8_t *xc = x[t] + (size_t)b * CLB_QK_COLS + 64 * c;
                const __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)xc);
                const __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)(xc + 32));
                acc[t * R + r] = scaled_acc(vnni, acc[t * R + r], _mm256_maddubs_epi16(lo, x0), slo);
                acc[t * R + r] = scaled_acc(vnni, acc[t * R + r], _mm256_maddubs_epi16(hi, x1), shi);
            }
        }
        UNROLL
        for (int t = 0; t < T; t++)
            macc[t * R + r] = _mm256_madd_epi16(mdup, _mm256_loadu_si256(
                (const __m256i *)(const void *)(xb[t] + (size_t)b * 16)));
    }
    *isum = lane_sums(R * T, acc);
    *msum = lane_sums(R * T, macc);
}

/* q4k_sums for the decode tile (8 rows, one token): the scales and mins
 * of two rows a ymm (q4k_scm2, one 128-bit lane a row), the rows' msums
 * from them in four vpmaddwd and a 3-hadd tree, and each row's sub-block
 * scales picked from its lane zero-extended (no widening). q4k_sums
 * decodes a row's scales alone and keeps a msum vector per row until the
 * block's end: 8 of them beside the 8 isum accumulators, more than the 16
 * ymm registers. test_kernels --bench 1 x 2816 x 1024 on a Xeon, plain
 * avx2: Q4_K 23.5 -> 27.0 GB/s, Q5_K 21.0 -> 24.3 (FINDINGS.md 28). The
 * integers are q4k_sums', exactly. */
BLOCK void q4k_sums8(const int vnni, const int five, __m256i *isum, __m256i *msum,
                     const uint8_t *const w[MAXR], const int8_t *x, const int16_t *xb, uint32_t b)
{
    const size_t bytes = five ? CLB_Q5_K_BYTES : CLB_Q4_K_BYTES, o = (size_t)b * bytes;
    __m256i scm[4]; /* rows 2i | 2i + 1: [sc0..7 | m0..7] u8 a lane */
    UNROLL
    for (int i = 0; i < 4; i++)
        scm[i] = q4k_scm2(w[2 * i] + o + CLB_QK_SCALES, w[2 * i + 1] + o + CLB_QK_SCALES);
    /* bsum_j = XB 2j + XB 2j+1 (|.| <= 32 x 127, int16), j = 0..7 in both lanes */
    const __m256i bsum = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(xb + (size_t)b * 16)),
                                           _mm256_set1_epi16(1));
    const __m256i bs = _mm256_permute4x64_epi64(_mm256_packs_epi32(bsum, bsum), _MM_SHUFFLE(2, 0, 2, 0));
    /* mins as int16 (byte 8 + j, zero-extended) times bsum: a lane's four
     * int32 add up to its row's msum */
    const __m256i mpick = _mm256_setr_epi8(8, -128, 9, -128, 10, -128, 11, -128, 12, -128, 13, -128, 14, -128, 15, -128,
                                           8, -128, 9, -128, 10, -128, 11, -128, 12, -128, 13, -128, 14, -128, 15, -128);
    __m256i mv[4];
    UNROLL
    for (int i = 0; i < 4; i++)
        mv[i] = _mm256_madd_epi16(_mm256_shuffle_epi8(scm[i], mpick), bs);
    /* [r0 r2 r4 r6 | r1 r3 r5 r7] -> rows in order */
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(mv[0], mv[1]), _mm256_hadd_epi32(mv[2], mv[3]));
    *msum = _mm256_permutevar8x32_epi32(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    __m256i acc[8];
    UNROLL
    for (int r = 0; r < 8; r++) {
        const uint8_t *blk = w[r] + o;
        /* the row's lane in both halves */
        const __m256i sr = r % 2 ? _mm256_permute4x64_epi64(scm[r / 2], _MM_SHUFFLE(3, 2, 3, 2))
                                 : _mm256_permute4x64_epi64(scm[r / 2], _MM_SHUFFLE(1, 0, 1, 0));
        acc[r] = _mm256_setzero_si256();
        UNROLL
        for (int c = 0; c < 4; c++) {
            __m256i lo, hi;
            clb_kg_unpack64(five ? COLIBRI_DTYPE_Q5_K : COLIBRI_DTYPE_Q4_K, blk, c, &lo, &hi);
            /* sc_2c (sc_2c+1), zero-extended, in every int16 */
            const __m256i slo = _mm256_shuffle_epi8(sr, _mm256_set1_epi16((short)(0x8000 | (2 * c))));
            const __m256i shi = _mm256_shuffle_epi8(sr, _mm256_set1_epi16((short)(0x8000 | (2 * c + 1))));
            const int8_t *xc = x + (size_t)b * CLB_QK_COLS + 64 * c;
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)xc);
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)(xc + 32));
            acc[r] = scaled_acc(vnni, acc[r], _mm256_maddubs_epi16(lo, x0), slo);
            acc[r] = scaled_acc(vnni, acc[r], _mm256_maddubs_epi16(hi, x1), shi);
        }
    }
    *isum = lane_sums(8, acc);
}

/* Q6_K block b of R rows x T tokens: lane k = isum = sum_j sc_j * dot_j
 * with dot_j over (q - 32) * x. The 6-bit q of columns 32i..32i+32 (i =
 * 4h + s): low 4 bits from ql[64h + 32(s%2) ..] (low nibbles for s < 2,
 * high for s >= 2), high 2 bits from qh[32h ..] bits 2s, 2s+1 (FORMAT.md
 * 4). Byte shifts do not exist, so 16-bit shifts then masks that keep
 * only bits of the same byte. */
BLOCK __m256i q6k_sums(const int vnni, const int R, const int T,
                       const uint8_t *const w[MAXR], const int8_t *const x[BT_MAXT],
                       const int16_t *const xb[BT_MAXT], uint32_t b)
{
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    __m256i acc[8]; /* all 8 zeroed: as q4k_sums */
    UNROLL
    for (int k = 0; k < 8; k++)
        acc[k] = _mm256_setzero_si256();
    UNROLL
    for (int r = 0; r < R; r++) {
        const uint8_t *blk = w[r] + (size_t)b * CLB_Q6_K_BYTES;
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)(const void *)(blk + CLB_Q6_K_SC));
        /* sc0..7 and sc8..15 as int16, in both halves: each 32-column
         * scale pair below is then one in-lane shuffle */
        const __m256i sclo = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(sc8));
        const __m256i schi = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(sc8, 8)));
        UNROLL
        for (int h = 0; h < 2; h++) {
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 64 * h));
            const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 32 + 64 * h));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)(blk + CLB_Q6_K_QH + 32 * h));
            UNROLL
            for (int s = 0; s < 4; s++) {
                const __m256i l4 = s == 0 ? _mm256_and_si256(ql0, m4)
                                 : s == 1 ? _mm256_and_si256(ql1, m4)
                                 : s == 2 ? _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4)
                                          : _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4);
                const __m256i h2 = s == 0 ? _mm256_slli_epi16(qh, 4)
                                 : s == 1 ? _mm256_slli_epi16(qh, 2)
                                 : s == 2 ? qh : _mm256_srli_epi16(qh, 2);
                const __m256i q = _mm256_or_si256(l4, _mm256_and_si256(h2, m30));
                /* [sc_2i x 8 | sc_2i+1 x 8] int16: the two 16-column
                 * sub-blocks of these 32 columns */
                const int i = 4 * h + s;
                const int k = (2 * i) % 8; /* int16 lane of sc_2i in sclo / schi */
                const __m256i scv = _mm256_shuffle_epi8(
                    h == 0 ? sclo : schi,
                    _mm256_setr_m128i(_mm_set1_epi16((short)(0x0100 * (2 * k + 1) + 2 * k)),
                                      _mm_set1_epi16((short)(0x0100 * (2 * k + 3) + 2 * k + 2))));
                UNROLL
                for (int t = 0; t < T; t++) {
                    const __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(
                        x[t] + (size_t)b * CLB_QK_COLS + 32 * i));
                    acc[t * R + r] = scaled_acc(vnni, acc[t * R + r], _mm256_maddubs_epi16(q, xv), scv);
                }
            }
        }
        /* - 32 * sum_j sc_j * bsum_j (bsum_j = XB entry j of the block) */
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        UNROLL
        for (int t = 0; t < T; t++) {
            const __m256i corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256(
                (const __m256i *)(const void *)(xb[t] + (size_t)b * 16)));
            acc[t * R + r] = _mm256_sub_epi32(acc[t * R + r], _mm256_slli_epi32(corr, 5));
        }
    }
    return lane_sums(R * T, acc);
}

/* The two fp16 at byte offsets o and o + 2 of 8 rows w[0..7] (a Q4_K or
 * Q5_K block's d and dmin at the block's offset) -> *dv = [the first of
 * rows 0..7], *dmv = [the second]: one 4-byte load a row, a pack and one
 * F16C conversion each (exact). Every block type's d is in such a window:
 * the decode tile (blk_tile) takes all of them this way. */
BLOCK void rows8_d_dmin(const uint8_t *const w[MAXR], size_t o, __m256 *dv, __m256 *dmv)
{
    int32_t dd[MAXR]; /* row r: d | dmin << 16 */
    UNROLL
    for (int r = 0; r < MAXR; r++)
        memcpy(&dd[r], w[r] + o, 4);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)dd);
    /* [d0..d3 dm0..dm3 | d4..d7 dm4..dm7] u16 -> [d0..d7 | dm0..dm7] */
    const __m256i p = _mm256_permute4x64_epi64(
        _mm256_packus_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xffff)), _mm256_srli_epi32(v, 16)),
        _MM_SHUFFLE(3, 1, 2, 0));
    *dv = _mm256_cvtph_ps(_mm256_castsi256_si128(p));
    *dmv = _mm256_cvtph_ps(_mm256_extracti128_si256(p, 1));
}

/* Y[t0 + t, r0 + r] = lane t * R + r of v. */
BLOCK void store_tile(const int R, const int T, __m256 v, float *Y, uint32_t rows,
                      uint32_t r0, uint32_t t0, uint32_t stride)
{
    if (T == 1 && R == 8 && stride == 1) {
        _mm256_storeu_ps(Y + (size_t)t0 * rows + r0, v);
        return;
    }
    float l[8];
    _mm256_storeu_ps(l, v);
    if (T == 1 && stride != 1) { /* row r of the tile is r0 + r * stride */
        UNROLL
        for (int r = 0; r < R; r++)
            Y[(size_t)t0 * rows + r0 + (size_t)r * stride] = l[r];
        return;
    }
    UNROLL
    for (int t = 0; t < T; t++)
        memcpy(Y + (size_t)(t0 + t) * rows + r0, l + t * R, (size_t)R * sizeof(float));
}

/* Bytes and columns of a block of dtype dt (a compile-time constant). */
#define BT_BYTES(dt) ((dt) == COLIBRI_DTYPE_Q4_0 ? CLB_Q4_0_BYTES \
                      : (dt) == COLIBRI_DTYPE_Q5_0 ? CLB_Q5_0_BYTES \
                      : (dt) == COLIBRI_DTYPE_Q8_0 ? CLB_Q8_0_BYTES \
                      : (dt) == COLIBRI_DTYPE_Q4_K ? CLB_Q4_K_BYTES \
                      : (dt) == COLIBRI_DTYPE_Q5_K ? CLB_Q5_K_BYTES : CLB_Q6_K_BYTES)
/* Q4_K or Q5_K: sub-block scales and mins, d and dmin */
#define BT_AFFINE(dt) ((dt) == COLIBRI_DTYPE_Q4_K || (dt) == COLIBRI_DTYPE_Q5_K)
#define BT_COLS(dt) ((dt) == COLIBRI_DTYPE_Q4_0 || (dt) == COLIBRI_DTYPE_Q5_0 || \
                     (dt) == COLIBRI_DTYPE_Q8_0 ? CLB_Q4_0_COLS : CLB_QK_COLS)

/* The lines that start in [w[r] + off, + n) of each of the R rows into L2:
 * over a row's consecutive blocks, each line of the stream once. Q6_K's
 * decode tile takes it every block (BT_PF_LINES); the other decode tiles
 * request nothing and leave their streams to the hardware prefetchers (the
 * avx512-vnni table decodes Q4_0, Q4_K, Q5_K and Q6_K with avx512.c's
 * tiles, which request theirs inline). Measured, not derived
 * (bench/results/FINDINGS.md 29 and 33): on Zen 3, from memory, 1 x 1024
 * x 2816, Q6_K reads 15.5-17.5 GB/s with it against 10.8-10.9 without,
 * and Q4_0, Q5_0, Q4_K and Q5_K were 6-12 % slower with it every block
 * than without. (Section 29's other arm, "a request every 64 bytes of each
 * block", was never called: GCC had deleted it, CLB_PREFETCH_HELPER.) */
static TGT CLB_PREFETCH_HELPER void prefetch_lines(const uint8_t *const w[MAXR], int R, size_t off,
                                                   uint32_t n)
{
    for (int r = 0; r < R; r++) {
        const uintptr_t at = (uintptr_t)(w[r] + off);
        for (uintptr_t l = (at + 63u) & ~(uintptr_t)63u; l < at + n; l += 64u)
            _mm_prefetch((const char *)l, _MM_HINT_T1);
    }
}
#define BT_PF_LINES(dt) ((dt) == COLIBRI_DTYPE_Q6_K)

/* Tile shapes. Decode (one token): BT_DEC_R rows a tile, one from each
 * eighth of W (STREAMS), lanes along rows.
 * Several tokens, Q4_0 / Q5_0: BT_R rows x BT_T tokens, each weight block
 * unpacked once per BT_T tokens.
 * Several tokens, the K types (Q4_K, Q5_K, Q6_K), below CLB_KG_MIN_N: one
 * row x BT_MAXT tokens (blk_panels), a block's scales and unpacked values
 * serving 8 tokens. */
/* (Measured on Zen 4, test_kernels --bench: decode R = 8 beat R = 4 by
 * 1.3-1.8x on Q4_0 and Q6_K; for prefill 4 x 2 beat 2 x 4 and 8 x 1 on Q4_0
 * and Q4_K, 2 x 4 was within noise on Q6_K. A gather for the rows' d lanes
 * was slower than the scalar loads: Q4_0 prefill 100 -> 78 GOPS. Those
 * tiles still spilled every product (scaled_acc); see blk_panels for the
 * K types' 1 x 8.) */
enum { BT_DEC_R = 8, BT_R = 4, BT_T = 2 };

/* Q4_0 / Q5_0 from CLB_Q0_GEMM_MIN_N tokens: the int8 GEMM form
 * (i8g_src), whose unpack and pack of each 16 rows x chunk the tokens must
 * pay for. test_kernels --bench on a Xeon, n x 2816 x 1024, tiles -> GEMM,
 * ms: with VNNI Q4_0 at 12 tokens 0.65 -> 0.70-0.78, 16 0.86 -> 0.87-0.90,
 * 24 1.30 -> 1.07-1.14, 128 6.9 -> 3.6; Q5_0 (more work a block in the
 * tiles) gains from 12-16 tokens. Without VNNI, in the int16 form, Q4_0
 * waited for 24 tokens (1.49 -> 1.48-1.49 ms there); in the byte runs
 * (I8G_BYTE_RUN) it is level with the tiles at 16 (1.00-1.01 against
 * 1.02 ms), Q5_0 gains there (1.29-1.31 -> 1.13). */

/* Rows of a K-type panel (blk_panels): its weights, at most this many
 * bytes, stay in L2 while every 8-token tile of the call passes over them. */
enum { BT_PANEL_BYTES = 128 << 10 };

/* Y[t0 .. t0 + T, r0 .. r0 + R) for blocks of dtype dt: per block the
 * integer results of all combos (q4_0_dots, q4k_sums, q6k_sums), then ref's
 * float update in lanes, blocks in order. Row r of the tile is r0 + r *
 * stride (a decode tile takes one row per stream, STREAMS). With
 * `prefetch`, adjacent rows (stride 1) request the R rows' worth of bytes
 * from BT_PF_AHEAD past this tile (the next tile's weights onward,
 * contiguous; none past W's end), and a Q6_K decode tile each row's
 * stream CLB_STREAM_PFB bytes on (prefetch_lines), into L2 at the pace this
 * tile reads its own: one tile's rows are a few KiB, and the hardware
 * prefetchers restart at every 4 KiB page (PREFETCH at i8_matmul). */
BLOCK void blk_tile(const int vnni, const unsigned dt, const int R, const int T, float *Y,
                    const uint8_t *W, const int8_t *XQ, const float *XS, const int16_t *XB,
                    uint32_t rows, uint32_t nb, uint32_t r0, uint32_t stride, uint32_t t0,
                    int prefetch)
{
    const uint32_t bytes = BT_BYTES(dt), B = BT_COLS(dt);
    const size_t row_bytes = (size_t)nb * bytes;
    const uint8_t *w[MAXR];
    const int8_t *x[BT_MAXT];
    const int16_t *xb[BT_MAXT];
    const float *xs[BT_MAXT];
    /* a decode tile (a compile-time shape) is the only one with streams */
    const int streams = R == BT_DEC_R && T == 1;
    UNROLL
    for (int r = 0; r < R; r++)
        w[r] = W + (size_t)(r0 + (uint32_t)r * (streams ? stride : 1u)) * row_bytes;
    UNROLL
    for (int t = 0; t < T; t++) {
        x[t] = XQ + (size_t)(t0 + t) * nb * B;
        xb[t] = XB + (size_t)(t0 + t) * nb * (B / 16);
        xs[t] = XS + (size_t)(t0 + t) * nb;
    }
    /* prefetch stream: byte offsets into W, stopping at W's end */
    const size_t pf = (size_t)(r0 + R) * row_bytes + BT_PF_AHEAD, w_bytes = (size_t)rows * row_bytes;
    unsigned d_at; /* d's byte in a block: a constant of dt */
    (void)clb_block_scales(dt, &d_at);
    __m256 acc = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        if (prefetch && streams) {
            if (BT_PF_LINES(dt))
                prefetch_lines(w, R, (size_t)b * bytes + CLB_STREAM_PFB, bytes);
        } else if (prefetch && pf + (size_t)(b + 1) * R * bytes <= w_bytes)
            for (uint32_t o = 0; o < (uint32_t)R * bytes; o += 64)
                _mm_prefetch((const char *)(W + pf + (size_t)b * R * bytes + o), _MM_HINT_T1);
        float xsb[BT_MAXT] = {0.0f}, d[MAXR]; /* xsb: lanes_of_tokens reads T of them */
        UNROLL
        for (int t = 0; t < T; t++)
            xsb[t] = xs[t][b];
        __m256 dv, dmv = _mm256_setzero_ps();
        if (R == 8 && T == 1) {
            /* the 4 bytes from d_at (Q6_K: from d_at - 2, its last scales
             * then d, the block's last 4 bytes): d in the low (high) half */
            const size_t at = dt == COLIBRI_DTYPE_Q6_K ? d_at - 2u : d_at;
            rows8_d_dmin(w, (size_t)b * bytes + at, &dv, &dmv);
            if (dt == COLIBRI_DTYPE_Q6_K)
                dv = dmv;
        } else {
            UNROLL
            for (int r = 0; r < R; r++)
                d[r] = blk_f16(w[r] + (size_t)b * bytes + d_at);
            dv = lanes_of_rows(R, d);
            if (BT_AFFINE(dt)) {
                float dm[MAXR];
                UNROLL
                for (int r = 0; r < R; r++)
                    dm[r] = blk_f16(w[r] + (size_t)b * bytes + 2);
                dmv = lanes_of_rows(R, dm);
            }
        }
        const __m256 xsv = lanes_of_tokens(R, T, xsb);
        if (BT_COLS(dt) == CLB_Q4_0_COLS) {
            /* acc += float(dot) * (d * xs) */
            const __m256i dot = q4_0_dots(vnni, dt, R, T, w, x, xb, b);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dv, xsv)));
        } else if (BT_AFFINE(dt)) {
            /* acc += xs * (d * float(isum) - dmin * float(msum)) */
            __m256i isum, msum;
            if (R == 8 && T == 1)
                q4k_sums8(vnni, dt == COLIBRI_DTYPE_Q5_K, &isum, &msum, w, x[0], xb[0], b);
            else
                q4k_sums(vnni, dt == COLIBRI_DTYPE_Q5_K, R, T, &isum, &msum, w, x, xb, b);
            const __m256 dd = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(isum));
            const __m256 mm = _mm256_mul_ps(dmv, _mm256_cvtepi32_ps(msum));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(xsv, _mm256_sub_ps(dd, mm)));
        } else {
            /* acc += xs * (d * float(isum)) */
            const __m256i isum = q6k_sums(vnni, R, T, w, x, xb, b);
            acc = _mm256_add_ps(acc, _mm256_mul_ps(xsv, _mm256_mul_ps(dv, _mm256_cvtepi32_ps(isum))));
        }
    }
    store_tile(R, T, acc, Y, rows, r0, t0, streams ? stride : 1u);
}

/* Y[n, rows) from row r0 on, for a K type: tiles of one row x 8 tokens.
 * One row's block (144-210 bytes) is unpacked, its scales decoded, once
 * for 8 tokens, against 4 rows x 2 tokens' once per 2 (fewer operations
 * per product: a Q4_K row-block's unpacking costs about two tokens'
 * products). A one-row tile reads its 8 tokens' activations (8 x 1-3 KiB)
 * for every row, so rows go in panels of BT_PANEL_BYTES: each 8-token tile
 * passes over a whole panel, its activations staying in L1 from row to row
 * and the panel's weights in L2 from tile to tile; each weight is read from
 * memory once per call (the first pass over the panel prefetches ahead).
 * Tokens past the last 8 (all of them below 8) use BT_R x BT_T and BT_R x
 * 1 tiles, rows past the last panel's last BT_R 1 x 1: the shapes of the
 * Q4_0 strips, each inlined once per instance.
 * test_kernels --bench without VNNI on a Xeon, Q4_K / Q6_K, against 4 x 2:
 * 32 x 2816 x 1024 2.35 -> 1.74 / 2.72 -> 1.80 ms, 128 tokens 9.0 -> 6.8 /
 * 10.5 -> 7.5 ms (bench/results/FINDINGS.md 18). */
BLOCK void blk_panels(const int vnni, const unsigned dt, float *Y, const uint8_t *W,
                      const int8_t *XQ, const float *XS, const int16_t *XB, uint32_t n,
                      uint32_t rows, uint32_t nb, uint32_t r0)
{
    const size_t row_bytes = (size_t)nb * BT_BYTES(dt);
    /* a multiple of BT_R, so only the last panel has rows past its strips */
    const uint32_t pr = row_bytes * BT_R >= BT_PANEL_BYTES
                            ? BT_R : (uint32_t)(BT_PANEL_BYTES / row_bytes) / BT_R * BT_R;
    for (uint32_t p0 = r0; p0 < rows; p0 += pr) {
        const uint32_t pe = rows - p0 < pr ? rows : p0 + pr;
        uint32_t t = 0;
        for (; t + BT_MAXT <= n; t += BT_MAXT)
            for (uint32_t r = p0; r < pe; r++)
                blk_tile(vnni, dt, 1, BT_MAXT, Y, W, XQ, XS, XB, rows, nb, r, 1, t,
                         t == 0 && r + 2 <= rows);
        /* the last n % 8 tokens (all of them below 8) as the Q4_0 strips
         * take tokens: pairs, then one */
        for (const uint32_t t1 = t; t < n; t += BT_T) {
            const int pair = t + BT_T <= n, prefetch = t == t1;
            uint32_t r = p0;
            for (; r + BT_R <= pe; r += BT_R) {
                if (pair)
                    blk_tile(vnni, dt, BT_R, BT_T, Y, W, XQ, XS, XB, rows, nb, r, 1, t,
                             prefetch && r + 2 * BT_R <= rows);
                else
                    blk_tile(vnni, dt, BT_R, 1, Y, W, XQ, XS, XB, rows, nb, r, 1, t,
                             prefetch && r + 2 * BT_R <= rows);
            }
            for (; r < pe; r++)
                for (uint32_t k = t; k < n && k < t + BT_T; k++)
                    blk_tile(vnni, dt, 1, 1, Y, W, XQ, XS, XB, rows, nb, r, 1, k, 0);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* The K types, GEMM form (prefill of Q4_K, Q5_K, Q6_K from CLB_KG_MIN_N
 * tokens).
 *
 * Why: the one-row x 8-token tiles above multiply every int16 product pair
 * by its scale (vpmaddwd) and sum it into int32 one vector at a time, and
 * unpack and reduce a row's block for every 8 tokens: 128 x 2816 x 1024 ran
 * at 135-146 GOPS without VNNI on a Xeon, against 230-400 for the GEMMs
 * (FINDINGS.md 27). Here avx512.c's GEMM (x86_gemm.h: a pack of 16 rows x
 * CLB_KG_KB blocks, then every token over it) runs with a pack and a
 * micro-kernel in ymm registers, 8 rows a vector, the strip's two halves
 * one after the other.
 *
 * Without VNNI the stored values are vpmaddubsw's unsigned operand against
 * the signed activations, and the int16 pair sums of KG_RUN(dt) column
 * quads of a sub-block are added in int16 before one vpmaddwd by the rows'
 * scale pairs: exact while the run's 2 KG_RUN products per int16 lane stay
 * within int16 (|x| <= 128: Q4_K 16 x 15 x 128 = 30720, Q5_K 8 x 31 x 128
 * = 31744, Q6_K 4 x 63 x 128 = 32256). With VNNI one vpdpbusd a quad into
 * the sub-block's int32 dot, then times the scales (vpmulld), as avx512.c.
 * Both give each row's isum = sum_j sc_j * dot_j exactly, so the float
 * operations after it are avx512.c's, ref's in ref's order. */

/* Column quads whose int16 pair sums add up exactly (see above). */
#define KG_RUN(dt) ((dt) == COLIBRI_DTYPE_Q4_K ? 8u : (dt) == COLIBRI_DTYPE_Q5_K ? 4u : 2u)

const uint8_t clb_kg_zero_block[CLB_Q6_K_BYTES] = {0};

/* 16 x 16 transpose of bytes: v[i] holds row i; afterwards v[j] holds
 * byte j of rows 0..15 (four perfect shuffles of the row index's bits). */
BLOCK void kg_transpose16_u8(__m128i v[16])
{
    UNROLL
    for (int round = 0; round < 4; round++) {
        __m128i y[16];
        UNROLL
        for (int i = 0; i < 8; i++) {
            y[2 * i] = _mm_unpacklo_epi8(v[i], v[i + 8]);
            y[2 * i + 1] = _mm_unpackhi_epi8(v[i], v[i + 8]);
        }
        UNROLL
        for (int i = 0; i < 16; i++)
            v[i] = y[i];
    }
}

/* p's block bl <- block b of rows r0 .. r0 + nr (x86_gemm.h's pack): the
 * values 8 rows at a time by clb_kg_unpack64 and transpose8x8; the
 * scales (and mins) a row's 16 bytes (q4k_scm), kg_transpose16_u8 making
 * them the rows' lanes; d and dmin by F16C. */
BLOCK void kg_pack_body(const unsigned dt, clb_kg_pack *p, uint32_t bl, const uint8_t *W,
                        size_t row_bytes, uint32_t r0, uint32_t nr, uint32_t b)
{
    const int affine = dt != COLIBRI_DTYPE_Q6_K;
    const uint8_t *blk[16];
    for (uint32_t i = 0; i < 16; i++)
        blk[i] = i < nr ? W + (size_t)(r0 + i) * row_bytes + (size_t)b * BT_BYTES(dt) : clb_kg_zero_block;
    _Pragma("GCC unroll 1")
    for (int gh = 0; gh < 8; gh++) { /* columns 64g .. 64g + 63 of rows 8h .. 8h + 7 */
        const int g = gh / 2, h = gh % 2;
        __m256i lo[8], hi[8];
        UNROLL
        for (int i = 0; i < 8; i++)
            clb_kg_unpack64(dt, blk[8 * h + i], g, &lo[i], &hi[i]);
        transpose8x8(lo);
        transpose8x8(hi);
        for (int q = 0; q < 8; q++) {
            _mm256_store_si256((__m256i *)(void *)&p->w[bl][16 * g + q][32 * h], lo[q]);
            _mm256_store_si256((__m256i *)(void *)&p->w[bl][16 * g + 8 + q][32 * h], hi[q]);
        }
    }
    /* row i's 16 scale bytes (Q4_K / Q5_K [sc0..7 | m0..7], Q6_K sc0..15),
     * then byte j of the 16 rows in s[j] */
    __m128i s[16];
    uint16_t d[2][16];
    UNROLL
    for (uint32_t i = 0; i < 16; i++) {
        s[i] = affine ? q4k_scm(blk[i] + CLB_QK_SCALES)
                      : _mm_loadu_si128((const __m128i *)(const void *)(blk[i] + CLB_Q6_K_SC));
        memcpy(&d[0][i], blk[i] + (affine ? 0u : CLB_Q6_K_D), 2);
        memcpy(&d[1][i], blk[i] + 2, 2); /* dmin (Q6_K: unused) */
    }
    kg_transpose16_u8(s);
    for (int h = 0; h < 2; h++) {
        UNROLL
        for (int j = 0; j < 8; j++) {
            const __m128i a0 = s[affine ? j : 2 * j], c0 = s[affine ? 8 + j : 2 * j + 1];
            const __m128i a = h ? _mm_unpackhi_epi64(a0, a0) : a0, c = h ? _mm_unpackhi_epi64(c0, c0) : c0;
            if (affine) { /* sc_j; XB 2j, 2j + 1 both by m_j */
                const __m256i m = _mm256_cvtepu8_epi32(c);
                _mm256_store_si256((__m256i *)(void *)&p->sc[bl][j][8 * h], _mm256_cvtepu8_epi32(a));
                _mm256_store_si256((__m256i *)(void *)&p->cp[bl][j][8 * h],
                                   _mm256_or_si256(m, _mm256_slli_epi32(m, 16)));
            } else { /* sc 2j, 2j + 1; their int16 pair */
                const __m256i lo = _mm256_cvtepi8_epi32(a), hi = _mm256_cvtepi8_epi32(c);
                _mm256_store_si256((__m256i *)(void *)&p->sc[bl][2 * j][8 * h], lo);
                _mm256_store_si256((__m256i *)(void *)&p->sc[bl][2 * j + 1][8 * h], hi);
                _mm256_store_si256((__m256i *)(void *)&p->cp[bl][j][8 * h],
                                   _mm256_blend_epi16(lo, _mm256_slli_epi32(hi, 16), 0xAA));
            }
        }
    }
    for (int h = 0; h < 2; h++) { /* F16C: exact, as clb_f16_to_f32 */
        _mm256_store_ps(&p->d[bl][8 * h], _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)&d[0][8 * h])));
        if (affine)
            _mm256_store_ps(&p->dmin[bl][8 * h],
                            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)&d[1][8 * h])));
    }
}

/* One instance a type, the 8 rows' unpack unrolled (their loads in
 * flight together), as avx512.c's zk_pack_block. */
static __attribute__((noinline)) TGT void kg_pack_block(const unsigned dt, clb_kg_pack *p, uint32_t bl,
                                                        const uint8_t *W, size_t row_bytes,
                                                        uint32_t r0, uint32_t nr, uint32_t b)
{
    if (dt == COLIBRI_DTYPE_Q4_K)
        kg_pack_body(COLIBRI_DTYPE_Q4_K, p, bl, W, row_bytes, r0, nr, b);
    else if (dt == COLIBRI_DTYPE_Q5_K)
        kg_pack_body(COLIBRI_DTYPE_Q5_K, p, bl, W, row_bytes, r0, nr, b);
    else
        kg_pack_body(COLIBRI_DTYPE_Q6_K, p, bl, W, row_bytes, r0, nr, b);
}

/* The 4 bytes at p as one int32 in every lane. */
BLOCK __m256i kg_bcast4(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Y[t0 + t, r0 + 8h ..) for T tokens, the strip's rows 8h .. 8h + 7 (those
 * below nr), over the pack's nbc blocks from block b0, added to Y's running
 * sum when b0 > 0 (x86_gemm.h's micro-kernel contract, for one half). */
BLOCK void kg_micro_t(const int vnni, const int T, const unsigned dt, float *Y, const clb_kg_pack *p,
                      uint32_t nbc, const int8_t *XQ, const float *XS, const int16_t *XB,
                      uint32_t rows, uint32_t nb, uint32_t r0, uint32_t nr, uint32_t t0, uint32_t b0,
                      int h)
{
    const int affine = dt != COLIBRI_DTYPE_Q6_K;
    const uint32_t subs = affine ? 8u : 16u, quads = 64u / subs, run = KG_RUN(dt);
    const uint32_t rh = nr - 8u * (uint32_t)h >= 8u ? 8u : nr - 8u * (uint32_t)h;
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rh), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const size_t xq_stride = (size_t)nb * CLB_QK_COLS, xb_stride = (size_t)nb * 16;
    float *y = Y + (size_t)t0 * rows + r0 + 8u * (uint32_t)h;
    __m256 facc[MAXT];
    UNROLL
    for (int t = 0; t < T; t++)
        facc[t] = b0 == 0 ? _mm256_setzero_ps() : _mm256_maskload_ps(y + (size_t)t * rows, m);
    for (uint32_t bl = 0; bl < nbc; bl++) {
        const uint32_t b = b0 + bl;
        const int8_t *x = XQ + (size_t)t0 * xq_stride + (size_t)b * CLB_QK_COLS;
        const int16_t *xb = XB + (size_t)t0 * xb_stride + (size_t)b * 16;
        __m256i isum[MAXT], corr[MAXT];
        UNROLL
        for (int t = 0; t < T; t++)
            isum[t] = corr[t] = _mm256_setzero_si256();
        for (uint32_t j = 0; j < subs; j++) {
            const __m256i sc = _mm256_load_si256((const __m256i *)(const void *)&p->sc[bl][j][8 * h]);
            if (vnni) {
                __m256i dot[MAXT];
                UNROLL
                for (int t = 0; t < T; t++)
                    dot[t] = _mm256_setzero_si256();
                UNROLL
                for (uint32_t q = j * quads; q < (j + 1) * quads; q++) {
                    const __m256i w = _mm256_load_si256((const __m256i *)(const void *)&p->w[bl][q][32 * h]);
                    UNROLL
                    for (int t = 0; t < T; t++)
                        DPBUSD(vnni, dot[t], w, kg_bcast4(x + (size_t)t * xq_stride + 4 * q));
                }
                UNROLL
                for (int t = 0; t < T; t++)
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(dot[t], sc));
            } else {
                /* (sc, sc) int16 in each row's lane: vpmaddwd's scale pair */
                const __m256i scp = _mm256_blend_epi16(sc, _mm256_slli_epi32(sc, 16), 0xAA);
                for (uint32_t q0 = j * quads; q0 < (j + 1) * quads; q0 += run) {
                    __m256i acc[MAXT];
                    UNROLL
                    for (int t = 0; t < T; t++)
                        acc[t] = _mm256_setzero_si256();
                    UNROLL
                    for (uint32_t q = q0; q < q0 + run; q++) {
                        const __m256i w = _mm256_load_si256((const __m256i *)(const void *)&p->w[bl][q][32 * h]);
                        UNROLL
                        for (int t = 0; t < T; t++)
                            acc[t] = _mm256_add_epi16(acc[t], _mm256_maddubs_epi16(
                                w, kg_bcast4(x + (size_t)t * xq_stride + 4 * q)));
                    }
                    UNROLL
                    for (int t = 0; t < T; t++)
                        isum[t] = scaled_acc(0, isum[t], acc[t], scp);
                }
            }
        }
        for (int k = 0; k < 8; k++) {
            const __m256i c = _mm256_load_si256((const __m256i *)(const void *)&p->cp[bl][k][8 * h]);
            UNROLL
            for (int t = 0; t < T; t++)
                corr[t] = scaled_acc(vnni, corr[t], c, kg_bcast4(xb + (size_t)t * xb_stride + 2 * k));
        }
        const __m256 d = _mm256_load_ps(&p->d[bl][8 * h]), dmin = _mm256_load_ps(&p->dmin[bl][8 * h]);
        UNROLL
        for (int t = 0; t < T; t++) {
            const __m256 xs = _mm256_set1_ps(XS[(size_t)(t0 + (uint32_t)t) * nb + b]);
            __m256 f;
            if (affine) /* xs * (d * float(isum) - dmin * float(msum)) */
                f = _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(isum[t])),
                                  _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(corr[t])));
            else /* xs * (d * float(isum - 32 corr)) */
                f = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[t], _mm256_slli_epi32(corr[t], 5))));
            facc[t] = _mm256_add_ps(facc[t], _mm256_mul_ps(xs, f));
        }
    }
    UNROLL
    for (int t = 0; t < T; t++)
        _mm256_maskstore_ps(y + (size_t)t * rows, m, facc[t]);
}

/* x86_gemm.h's micro-kernel for T = 8 (two passes of 4), 4 or 1 tokens
 * and the strip's halves, integer form vnni, type dt. */
BLOCK void kg_micro_dt(const int vnni, int T, const unsigned dt, float *Y, const clb_kg_pack *p,
                       uint32_t nbc, const int8_t *XQ, const float *XS, const int16_t *XB,
                       uint32_t rows, uint32_t nb, uint32_t r0, uint32_t nr, uint32_t t0, uint32_t b0)
{
    for (int h = 0; h < 2 && nr > 8u * (uint32_t)h; h++) {
        if (T == 1)
            kg_micro_t(vnni, 1, dt, Y, p, nbc, XQ, XS, XB, rows, nb, r0, nr, t0, b0, h);
        else
            for (int t = 0; t < T; t += 4)
                kg_micro_t(vnni, 4, dt, Y, p, nbc, XQ, XS, XB, rows, nb, r0, nr, t0 + (uint32_t)t, b0, h);
    }
}

/* kg_micro_dt with the type a constant (the sub-block's quads unrolled):
 * one instance a type and integer form. */
BLOCK void kg_micro(const int vnni, int T, const unsigned dt, float *Y, const clb_kg_pack *p,
                    uint32_t nbc, const int8_t *XQ, const float *XS, const int16_t *XB,
                    uint32_t rows, uint32_t nb, uint32_t r0, uint32_t nr, uint32_t t0, uint32_t b0)
{
    if (dt == COLIBRI_DTYPE_Q4_K)
        kg_micro_dt(vnni, T, COLIBRI_DTYPE_Q4_K, Y, p, nbc, XQ, XS, XB, rows, nb, r0, nr, t0, b0);
    else if (dt == COLIBRI_DTYPE_Q5_K)
        kg_micro_dt(vnni, T, COLIBRI_DTYPE_Q5_K, Y, p, nbc, XQ, XS, XB, rows, nb, r0, nr, t0, b0);
    else
        kg_micro_dt(vnni, T, COLIBRI_DTYPE_Q6_K, Y, p, nbc, XQ, XS, XB, rows, nb, r0, nr, t0, b0);
}

#define KG_MICRO(name, vnni)                                                                   \
    static __attribute__((noinline)) TGT void name(                                           \
        int T, const unsigned dt, float *Y, const clb_kg_pack *p, uint32_t nbc,                \
        const int8_t *XQ, const float *XS, const int16_t *XB, uint32_t rows, uint32_t nb,      \
        uint32_t r0, uint32_t nr, uint32_t t0, uint32_t b0)                                    \
    {                                                                                          \
        kg_micro(vnni, T, dt, Y, p, nbc, XQ, XS, XB, rows, nb, r0, nr, t0, b0);                \
    }
KG_MICRO(kg_micro_plain, 0)
KG_MICRO(kg_micro_vex, 1)

/* KG_PF_CHUNKS: how many chunks ahead the weights are requested into L2.
 * At few tokens a chunk's work is short next to its 16 rows' bytes
 * arriving, so two, not the int8 GEMM's one; end to end (Q5_K_M import,
 * prefill 128, avx512-vnni) one, two and four chunks, and L1 instead of
 * L2, measured the same within the host's noise (FINDINGS.md 25). */
enum { KG_PF_CHUNKS = 2 };

/* Chunk ci's bytes (strip ci / chunks a strip, its blocks from CLB_KG_KB *
 * (ci % chunks)) into L2; nothing past the last. */
static TGT void kg_prefetch_chunk(const unsigned dt, const uint8_t *W, uint32_t rows, uint32_t nb,
                                  uint32_t ci)
{
    const uint32_t chunks = (nb + CLB_KG_KB - 1) / CLB_KG_KB, r0 = ci / chunks * 16,
                   b0 = ci % chunks * CLB_KG_KB;
    if (r0 >= rows)
        return;
    const uint32_t nr = rows - r0 < 16 ? rows - r0 : 16, bytes = BT_BYTES(dt);
    const size_t row_bytes = (size_t)nb * bytes,
                 len = (size_t)(nb - b0 < CLB_KG_KB ? nb - b0 : CLB_KG_KB) * bytes;
    for (uint32_t i = 0; i < nr; i++) {
        const char *row = (const char *)W + (size_t)(r0 + i) * row_bytes + (size_t)b0 * bytes;
        for (size_t c = 0; c < len; c += 64)
            _mm_prefetch(row + c, _MM_HINT_T1);
    }
}

void clb_avx2_k_gemm(clb_kg_pack_fn *pack, clb_kg_micro_fn *micro, unsigned dt, float *Y,
                     const uint8_t *W, const int8_t *XQ, const float *XS, const int16_t *XB,
                     uint32_t n, uint32_t rows, uint32_t cols)
{
    const uint32_t nb = (cols + CLB_QK_COLS - 1) / CLB_QK_COLS;
    const size_t row_bytes = (size_t)nb * BT_BYTES(dt);
    clb_kg_pack p;
    for (uint32_t ci = 0; ci < KG_PF_CHUNKS; ci++)
        kg_prefetch_chunk(dt, W, rows, nb, ci);
    for (uint32_t r0 = 0, ci = 0; r0 < rows; r0 += 16) {
        const uint32_t nr = rows - r0 < 16 ? rows - r0 : 16;
        for (uint32_t b0 = 0; b0 < nb; b0 += CLB_KG_KB, ci++) {
            const uint32_t nbc = nb - b0 < CLB_KG_KB ? nb - b0 : CLB_KG_KB;
            for (uint32_t bl = 0; bl < nbc; bl++)
                pack(dt, &p, bl, W, row_bytes, r0, nr, b0 + bl);
            kg_prefetch_chunk(dt, W, rows, nb, ci + KG_PF_CHUNKS);
            for (uint32_t t = 0, T; t < n; t += T) {
                T = n - t >= 8 ? 8u : n - t >= 4 ? 4u : 1u;
                micro((int)T, dt, Y, &p, nbc, XQ, XS, XB, rows, nb, r0, nr, t, b0);
            }
        }
    }
}

/* Y[n, rows] for blocks of dtype dt. One token: decode tiles (STREAMS),
 * then the rows past the last eighth as below. The K types: from
 * CLB_KG_MIN_N tokens their GEMM (clb_avx2_k_gemm), below it blk_panels.
 * Q4_0 and Q5_0 from CLB_Q0_GEMM_MIN_N tokens: the int8 GEMM (i8g_src); below
 * it, rows in strips of BT_R (whose weights, a few KiB, stay in L1 while
 * every token of the call passes over them), so each weight is read from
 * memory once per call; the activations (n x padded cols) come from L2.
 * Rows past the last whole strip (rows % 4 of them) go one row and token
 * at a time: a wider tile there cost 1.6 KiB of code an instance. Every
 * tile computes each of its outputs with ref's operations in ref's order,
 * so no tiling, here or by the caller, changes a bit. */
BLOCK void blk_matmul(const int vnni, const unsigned dt, float *Y, const uint8_t *W,
                      const int8_t *XQ, const float *XS, const int16_t *XB, uint32_t n,
                      uint32_t rows, uint32_t cols)
{
    const uint32_t nb = (cols + BT_COLS(dt) - 1) / BT_COLS(dt);
    uint32_t r = 0;
    if (n == 1) {
        const uint32_t eighth = rows / BT_DEC_R;
        for (; r < eighth; r++)
            blk_tile(vnni, dt, BT_DEC_R, 1, Y, W, XQ, XS, XB, rows, nb, r, eighth, 0,
                     r + 1 < eighth);
        r = BT_DEC_R * eighth;
    }
    if (BT_COLS(dt) == CLB_QK_COLS) {
        /* test_kernels --bench on a Xeon, n x 2816 x 1024, ms, tiles ->
         * GEMM, without VNNI: at 8 tokens Q4_K 0.33-0.35 -> 0.34-0.35,
         * Q6_K 0.35-0.37 -> 0.39-0.43; at 12 Q4_K 0.55-0.56 -> 0.46-0.48,
         * Q6_K 0.60-0.61 -> 0.49-0.52; at 128 Q4_K 5.2-5.6 -> 3.8-4.0,
         * Q5_K and Q6_K 5.5-5.6 -> 3.8-3.9 (with VNNI Q4_K 4.9-5.1 ->
         * 3.1-3.4; FINDINGS.md 27). */
        /* The EVEX form (this table forced on Zen 4 or Ice Lake, whose
         * avx512-vnni table has a GEMM of its own) runs the plain
         * micro-kernel: the same bits, 6 KiB of code fewer, and still
         * faster than its tiles (3.8 against 4.9-5.1 ms at 128 tokens). */
        if (n >= CLB_KG_MIN_N)
            clb_avx2_k_gemm(kg_pack_block, vnni == 1 ? kg_micro_vex : kg_micro_plain,
                            dt, Y, W, XQ, XS, XB, n, rows, cols);
        else
            blk_panels(vnni, dt, Y, W, XQ, XS, XB, n, rows, nb, r);
        return;
    }
    if (n >= CLB_Q0_GEMM_MIN_N) { /* Q4_0 / Q5_0 / Q8_0 as the int8 GEMM's groups */
        const i8g_src src = {dt, NULL, NULL, W};
        i8_gemm(vnni, NULL, Y, &src, XQ, XS, n, rows, nb * CLB_Q4_0_COLS, CLB_Q4_0_COLS);
        return;
    }
    for (; r + BT_R <= rows; r += BT_R) {
        const int prefetch = r + 2 * BT_R <= rows;
        uint32_t t = 0;
        for (; t + BT_T <= n; t += BT_T)
            blk_tile(vnni, dt, BT_R, BT_T, Y, W, XQ, XS, XB, rows, nb, r, 1, t, prefetch && t == 0);
        for (; t < n; t++)
            blk_tile(vnni, dt, BT_R, 1, Y, W, XQ, XS, XB, rows, nb, r, 1, t, prefetch && t == 0);
    }
    for (; r < rows; r++)
        for (uint32_t t = 0; t < n; t++)
            blk_tile(vnni, dt, 1, 1, Y, W, XQ, XS, XB, rows, nb, r, 1, t, 0);
}

/* The three dtypes x three integer forms (0 plain AVX2, 1 VEX VNNI, 2 EVEX
 * VNNI), each its own instance. */
#define BT_ENTRY(name, vnni, dt)                                                        \
    static __attribute__((noinline)) TGT void name(                                    \
        float *Y, const uint8_t *W, const int8_t *XQ, const float *XS,                  \
        const int16_t *XB, uint32_t n, uint32_t rows, uint32_t cols)                    \
    {                                                                                   \
        blk_matmul(vnni, dt, Y, W, XQ, XS, XB, n, rows, cols);                          \
    }
BT_ENTRY(avx2_matmul_q4_0, 0, COLIBRI_DTYPE_Q4_0)
BT_ENTRY(avx2_matmul_q4_k, 0, COLIBRI_DTYPE_Q4_K)
BT_ENTRY(avx2_matmul_q6_k, 0, COLIBRI_DTYPE_Q6_K)
BT_ENTRY(avx2_matmul_q5_0, 0, COLIBRI_DTYPE_Q5_0)
/* Q5_K (GGUF imports, --experts q5_k, the q4 mix's embedding and LM head):
 * one instance, the plain AVX2 one, in all three tables: the same bits, and
 * 2 x 17 KiB less code than a VNNI form each (its decode is bound by the
 * memory anyway; avx512.c has its own prefill tiles). */
BT_ENTRY(avx2_matmul_q5_k, 0, COLIBRI_DTYPE_Q5_K)
BT_ENTRY(avx2_vnni_matmul_q4_0, 1, COLIBRI_DTYPE_Q4_0)
BT_ENTRY(avx2_vnni_matmul_q4_k, 1, COLIBRI_DTYPE_Q4_K)
BT_ENTRY(avx2_vnni_matmul_q6_k, 1, COLIBRI_DTYPE_Q6_K)
BT_ENTRY(avx2_vnni_matmul_q5_0, 1, COLIBRI_DTYPE_Q5_0)
BT_ENTRY(avx2_evex_vnni_matmul_q4_0, 2, COLIBRI_DTYPE_Q4_0)
BT_ENTRY(avx2_evex_vnni_matmul_q4_k, 2, COLIBRI_DTYPE_Q4_K)
BT_ENTRY(avx2_evex_vnni_matmul_q6_k, 2, COLIBRI_DTYPE_Q6_K)
BT_ENTRY(avx2_evex_vnni_matmul_q5_0, 2, COLIBRI_DTYPE_Q5_0)
#undef BT_ENTRY

/* Q8_0 (GGUF Q8_0 imports, --experts q8_0): one instance of the tiles, the
 * plain AVX2 ones (vpsignb and vpmaddubsw are exact for its values, and
 * its decode is bound by the memory), and from CLB_Q0_GEMM_MIN_N tokens
 * the int8 GEMM in the table's integer form (`gemm`, as BT_ENTRY's vnni:
 * i8_gemm takes it at run time): 2 x 3.2 KiB of code less than an
 * instance per form, the same bits. */
static __attribute__((noinline)) TGT void q8_0_matmul(const int gemm, float *Y, const uint8_t *W,
                                                      const int8_t *XQ, const float *XS,
                                                      const int16_t *XB, uint32_t n,
                                                      uint32_t rows, uint32_t cols)
{
    if (n >= CLB_Q0_GEMM_MIN_N) {
        const i8g_src src = {COLIBRI_DTYPE_Q8_0, NULL, NULL, W};
        const uint32_t padded = (cols + CLB_Q4_0_COLS - 1) / CLB_Q4_0_COLS * CLB_Q4_0_COLS;
        i8_gemm(gemm, NULL, Y, &src, XQ, XS, n, rows, padded, CLB_Q4_0_COLS);
        return;
    }
    blk_matmul(0, COLIBRI_DTYPE_Q8_0, Y, W, XQ, XS, XB, n, rows, cols);
}
#define Q8_ENTRY(name, gemm)                                                            \
    static void name(float *Y, const uint8_t *W, const int8_t *XQ, const float *XS,     \
                     const int16_t *XB, uint32_t n, uint32_t rows, uint32_t cols)       \
    {                                                                                   \
        q8_0_matmul(gemm, Y, W, XQ, XS, XB, n, rows, cols);                             \
    }
Q8_ENTRY(avx2_matmul_q8_0, 0)
Q8_ENTRY(avx2_vnni_matmul_q8_0, 1)
Q8_ENTRY(avx2_evex_vnni_matmul_q8_0, 2)
#undef Q8_ENTRY

/* The sums of each 16 consecutive xq[0 .. len) (len a multiple of 32) into
 * xb: vpsadbw sums 8 unsigned bytes exactly, so the bytes are biased by
 * +128 (xor 0x80) and 16 * 128 taken off again. */
TGT static void sums16(int16_t *xb, const int8_t *xq, size_t len)
{
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (size_t c = 0; c < len; c += 32) {
        const __m256i v = _mm256_sad_epu8(
            _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(const void *)(xq + c)), bias),
            _mm256_setzero_si256());
        /* 64-bit lanes: sums of bytes 0-7, 8-15 | 16-23, 24-31 */
        const __m256i s = _mm256_add_epi64(v, _mm256_bsrli_epi128(v, 8));
        xb[c / 16] = (int16_t)(_mm256_extract_epi32(s, 0) - 16 * 128);
        xb[c / 16 + 1] = (int16_t)(_mm256_extract_epi32(s, 4) - 16 * 128);
    }
}

/* ref's quantize_act_blk: the real columns as quantize_act_i8 with group
 * `block` (avx2_quantize_act_i8 is bit-identical to ref's), zeros to the
 * padded width, then the sums of 16. */
TGT static void avx2_quantize_act_blk(int8_t *XQ, float *XS, int16_t *XB, const float *X,
                                      uint32_t n, uint32_t cols, uint32_t block)
{
    const uint32_t nb = (cols + block - 1) / block;
    const size_t padded = (size_t)nb * block;
    for (uint32_t t = 0; t < n; t++) {
        int8_t *xq = XQ + (size_t)t * padded;
        avx2_quantize_act_i8(xq, XS + (size_t)t * nb, X + (size_t)t * cols, 1, cols, block);
        memset(xq + cols, 0, padded - cols);
        sums16(XB + (size_t)t * (padded / 16), xq, padded);
    }
}

/* ------------------------------------------------------------------------ */
/* attend and attend_rows (kernels.h): ref.c's flash-attention schedule, its
 * float operations lane by lane in the same order, so the same bits; the
 * tiles of avx512.c in 256-bit registers. A block's 16 positions are two
 * vectors (lanes 0-7 and 8-15); per block its keys are loaded once,
 * transposed (8 x 8 in registers) into kt, lane = position, and the
 * tile's YA_T queries sum their products from kt in c order as ref does
 * (fused multiply-adds), 2 YA_T independent chains; the output update
 * runs along head_dim. A query the block does not reach is left as it
 * was (alpha 1, no add).
 *
 * attend_rows runs up to YA_G tiles as a group, block by block: each
 * block's keys are transposed once for the group (and an int8 cache's
 * values widened to float once) instead of once per tile. A prefill
 * chunk's tiles all read the same cache rows, so this is most of the
 * transposing gone; each query still sees its blocks in order, so its bits
 * do not change. A lone tile (a decode step) and heads wider than YA_C
 * columns transpose per tile. */
enum { YA_T = 4, YA_C = 256, YA_G = 8 };

typedef clb_att_tile ya_tile; /* kernels.h; YA_T of its queries */
_Static_assert(YA_T <= CLB_ATT_TILE, "a tile holds YA_T queries");

/* Lane i all ones where bit i of bits is set (8 lanes). */
BLOCK __m256 ya_lanes(uint32_t bits)
{
    const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(
        _mm256_and_si256(_mm256_set1_epi32((int)bits), sel), sel));
}

/* a * b + c fused, or a multiply and an add each rounded (kernels.h
 * clb_madd); x - n * c the same way. */
BLOCK __m256 madd8(__m256 a, __m256 b, __m256 c, int fused)
{
    return fused ? _mm256_fmadd_ps(a, b, c) : _mm256_add_ps(_mm256_mul_ps(a, b), c);
}
BLOCK __m256 nmadd8(__m256 n, __m256 c, __m256 x, int fused)
{
    return fused ? _mm256_fnmadd_ps(n, c, x) : _mm256_sub_ps(x, _mm256_mul_ps(n, c));
}

/* clb_exp_neg_form for 8 lanes: the same operations (kernels.h; fused,
 * -n * c + x is fma(-n, c, x): the negation is exact; unfused, x - n * c
 * is (-n) * c + x). */
BLOCK __m256 exp_neg8_form(__m256 x, int fused)
{
    const __m256 ok = _mm256_cmp_ps(x, _mm256_set1_ps(CLB_EXP_MIN), _CMP_GE_OQ);
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256 big = _mm256_set1_ps(12582912.0f);
    __m256 n = _mm256_mul_ps(x, _mm256_set1_ps(CLB_EXP_LOG2E));
    n = _mm256_sub_ps(_mm256_add_ps(n, big), big);
    __m256 r = nmadd8(n, _mm256_set1_ps(CLB_EXP_LN2_HI), x, fused);
    r = nmadd8(n, _mm256_set1_ps(CLB_EXP_LN2_LO), r, fused);
    __m256 p = _mm256_set1_ps(CLB_EXP_C7);
    p = madd8(p, r, _mm256_set1_ps(CLB_EXP_C6), fused);
    p = madd8(p, r, _mm256_set1_ps(CLB_EXP_C5), fused);
    p = madd8(p, r, _mm256_set1_ps(CLB_EXP_C4), fused);
    p = madd8(p, r, _mm256_set1_ps(CLB_EXP_C3), fused);
    p = madd8(p, r, _mm256_set1_ps(CLB_EXP_C2), fused);
    p = madd8(p, r, _mm256_set1_ps(1.0f), fused);
    p = madd8(p, r, _mm256_set1_ps(1.0f), fused);
    /* out-of-range lanes hold garbage in n: their exponent is not used */
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(
        _mm256_cvtps_epi32(_mm256_and_ps(n, ok)), _mm256_set1_epi32(127)), 23);
    const __m256 v = _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), ok);
    return _mm256_blendv_ps(v, x, nan);
}

BLOCK __m256 exp_neg8(__m256 x)
{
    return exp_neg8_form(x, 1);
}

/* ref's running max of s[i] over the lanes i of bits (at least one), in
 * position order, as a vector max: the same value whatever the order but
 * for the sign of a zero (which changes no result: s - m of equal values
 * is a zero either way, whose exp is exactly 1, and comparisons take the
 * two zeros as equal) and for a NaN (which makes that lane's weight NaN,
 * so the query's sum and output are NaN whatever the max). */
BLOCK float ya_max16(const float *s, uint32_t bits)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const __m256 m = _mm256_max_ps(_mm256_blendv_ps(ninf, _mm256_loadu_ps(s), ya_lanes(bits)),
                                   _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + 8), ya_lanes(bits >> 8)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* ref's halving tree over 16 lanes (lo = lanes 0-7, hi = 8-15). */
BLOCK float ya_sum16(__m256 lo, __m256 hi)
{
    const __m256 s = _mm256_add_ps(lo, hi);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* Rows r0..r7 -> r[c] = column c (lane i = row i's c); the rows passed by
 * value and the code straight-line, so the analysers see every element
 * written before it is read. */
BLOCK void transpose8(__m256 r[8], __m256 r0, __m256 r1, __m256 r2, __m256 r3, __m256 r4,
                      __m256 r5, __m256 r6, __m256 r7)
{
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* 8 int8 values q[0 .. k) (k <= 8; the rest 0) as float (exact). A whole
 * 8 is one 64-bit load: a byte loop here was a third of the int8 KV
 * cache's attention on Zen 3 (perf), where it ran slower than the float
 * cache. */
BLOCK __m256 ya_i8x8(const int8_t *q, uint32_t k)
{
    __m128i v;
    if (k >= 8) {
        v = _mm_loadl_epi64((const __m128i *)(const void *)q);
    } else {
        int8_t b8[16] = {0};
        for (uint32_t c = 0; c < k; c++)
            b8[c] = q[c];
        memcpy(&v, b8, sizeof v);
    }
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

/* 8 columns (k of them, 1..8; the rest 0) of a key row, as float. */
BLOCK __m256 ya_key8(const clb_att_args *a, size_t at, uint32_t k)
{
    if (a->K)
        return k >= 8 ? _mm256_loadu_ps(a->K + at)
                      : _mm256_maskload_ps(a->K + at, tail_mask(k));
    return ya_i8x8(a->Kq + at, k);
}

/* Key b + row's columns c .. c + k (k <= 8) as float, 0 if row is not in keep. */
BLOCK __m256 ya_row(const clb_att_args *a, uint32_t b, uint32_t keep, uint32_t row, uint32_t c,
                    uint32_t k)
{
    return (keep >> row & 1u) ? ya_key8(a, (size_t)(b + row) * a->ld + c, k) : _mm256_setzero_ps();
}

/* kt[c - c0][lane] = key (b + lane)'s column c (int8: as float), for c in
 * c0 .. c0 + cn and the lanes in keep (others 0). */
/* (one out-of-line copy, as avx512.c's za_keys) */
static TGT __attribute__((noinline)) void ya_keys(float *kt, const clb_att_args *a, uint32_t b,
                                                  uint32_t keep, uint32_t c0, uint32_t cn)
{
    for (uint32_t c = 0; c < cn; c += 8) {
        const uint32_t k = cn - c < 8 ? cn - c : 8;
        for (uint32_t h = 0; h < 2; h++) {
            __m256 r[8];
            transpose8(r, ya_row(a, b, keep, 8 * h, c0 + c, k), ya_row(a, b, keep, 8 * h + 1, c0 + c, k),
                       ya_row(a, b, keep, 8 * h + 2, c0 + c, k), ya_row(a, b, keep, 8 * h + 3, c0 + c, k),
                       ya_row(a, b, keep, 8 * h + 4, c0 + c, k), ya_row(a, b, keep, 8 * h + 5, c0 + c, k),
                       ya_row(a, b, keep, 8 * h + 6, c0 + c, k), ya_row(a, b, keep, 8 * h + 7, c0 + c, k));
            UNROLL
            for (int i = 0; i < 8; i++)
                _mm256_storeu_ps(kt + 16 * (c + (uint32_t)i) + 8 * h, r[i]);
        }
    }
}

/* vf[i * d + c] = value row (b + i)'s column c as float (int8 cache), for
 * the rows i in keep: widened once for a group of tiles (exact). */
static TGT __attribute__((noinline)) void ya_vals(float *vf, const clb_att_args *a, uint32_t b,
                                                  uint32_t nb, uint32_t keep)
{
    for (uint32_t i = 0; i < nb; i++) {
        if (!(keep >> i & 1u))
            continue;
        const int8_t *vq = a->Vq + (size_t)(b + i) * a->ld;
        for (uint32_t c = 0; c < a->d; c += 8) {
            const uint32_t k = a->d - c < 8 ? a->d - c : 8;
            _mm256_maskstore_ps(vf + (size_t)i * a->d + c, tail_mask(k), ya_i8x8(vq + c, k));
        }
    }
}

/* One block b of the tile (avx512.c za_block). shared: kt already holds
 * the block's keys for every column (d <= YA_C) and, for an int8 cache,
 * vf its values as float (ya_run's group); otherwise the tile transposes
 * its own and reads the values from the cache. */
BLOCK void ya_block(const int T, ya_tile *t, const clb_att_args *a, uint32_t b, uint32_t nb, uint32_t keep,
                    const uint32_t *kj, float *kt, int shared, const float *vf)
{
    const uint32_t d = a->d;
    __m256 acc[YA_T][2];
    UNROLL
    for (int j = 0; j < T; j++)
        acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    for (uint32_t c0 = 0; c0 < d; c0 += YA_C) {
        const uint32_t cn = d - c0 < YA_C ? d - c0 : YA_C;
        if (!shared)
            ya_keys(kt, a, b, keep, c0, cn);
        for (uint32_t c = 0; c < cn; c++) {
            const __m256 k0 = _mm256_loadu_ps(kt + 16 * c), k1 = _mm256_loadu_ps(kt + 16 * c + 8);
            UNROLL
            for (int j = 0; j < T; j++) {
                const __m256 qc = _mm256_broadcast_ss(t->q[j] + c0 + c);
                acc[j][0] = _mm256_fmadd_ps(qc, k0, acc[j][0]);
                acc[j][1] = _mm256_fmadd_ps(qc, k1, acc[j][1]);
            }
        }
    }
    float ks[CLB_ATT_BLOCK] = {0}, vs[CLB_ATT_BLOCK] = {0};
    if (!a->K)
        for (uint32_t i = 0; i < nb; i++)
            if (keep >> i & 1u) {
                ks[i] = a->Ks[(size_t)(b + i) * a->lds];
                vs[i] = a->Vs[(size_t)(b + i) * a->lds];
            }
    const __m256 sc = _mm256_set1_ps(a->scale);
    float alpha[YA_T], w[YA_T][CLB_ATT_BLOCK], sj[YA_T][CLB_ATT_BLOCK];
    UNROLL
    for (int j = 0; j < T; j++)
        for (int h = 0; h < 2; h++) {
            const __m256 sv = a->K ? _mm256_mul_ps(acc[j][h], sc)
                : _mm256_mul_ps(_mm256_mul_ps(acc[j][h], _mm256_loadu_ps(ks + 8 * h)), sc);
            _mm256_storeu_ps(sj[j] + 8 * h, sv);
        }
    for (int j = 0; j < T; j++)
        clb_att_add_bias(sj[j], t->bias[j], a->bias_step, b, kj[j]);
    /* the new running maxima, and alpha = exp(m - m') for the T queries
     * in one vector exp (lane j: query j) */
    float mn[YA_T], dm[8] = {0}, ex[8];
    for (int j = 0; j < T; j++) {
        mn[j] = t->m[j];
        if (!kj[j])
            continue;
        mn[j] = clb_att_new_max(t->m[j], ya_max16(sj[j], kj[j]), t->any[j], dm + j);
    }
    _mm256_storeu_ps(ex, exp_neg8(_mm256_loadu_ps(dm)));
    for (int j = 0; j < T; j++) {
        alpha[j] = 1.0f;
        if (!kj[j])
            continue;
        const float *s = sj[j];
        alpha[j] = t->any[j] ? ex[j] : 0.0f;
        /* p_i for lanes 0-7 and 8-15 (straight-line: the analysers see
         * both written) */
        const __m256 mv = _mm256_set1_ps(mn[j]);
        const __m256 p0 = _mm256_and_ps(ya_lanes(kj[j]),
                                        exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(s), mv)));
        const __m256 p1 = _mm256_and_ps(ya_lanes(kj[j] >> 8),
                                        exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(s + 8), mv)));
        /* the weight of v_i: p_i (int8: p_i * vs_i, ref's product) */
        _mm256_storeu_ps(w[j], a->K ? p0 : _mm256_mul_ps(p0, _mm256_loadu_ps(vs)));
        _mm256_storeu_ps(w[j] + 8, a->K ? p1 : _mm256_mul_ps(p1, _mm256_loadu_ps(vs + 8)));
        t->l[j] = t->l[j] * alpha[j] + ya_sum16(p0, p1);
        t->m[j] = mn[j];
        t->any[j] = 1;
    }
    /* The values: float rows at vr + i * vld (the f32 cache, or vf), or
     * the int8 cache widened here. full: every query of the tile takes
     * all 16 positions (a block away from the causal edge and the mask's
     * holes), so the loop needs no test of a lane. */
    const float *vr = a->V ? a->V + (size_t)b * a->ld : shared ? vf : NULL;
    const size_t vld = a->V ? a->ld : d;
    int full = keep == 0xffffu;
    for (int j = 0; j < T; j++)
        full = full && kj[j] == 0xffffu;
    /* A full block goes 16 columns at a time: 2T chains of fused
     * multiply-adds, enough to cover an FMA's latency (T = 4: 8 in
     * flight; 8 columns at a time left the FMA ports half idle). */
    uint32_t c = 0;
    if (full)
        for (; c + 16 <= d; c += 16) {
            __m256 o0[YA_T], o1[YA_T];
            UNROLL
            for (int j = 0; j < T; j++) {
                o0[j] = _mm256_mul_ps(_mm256_loadu_ps(t->o[j] + c), _mm256_set1_ps(alpha[j]));
                o1[j] = _mm256_mul_ps(_mm256_loadu_ps(t->o[j] + c + 8), _mm256_set1_ps(alpha[j]));
            }
            for (uint32_t i = 0; i < CLB_ATT_BLOCK; i++) {
                __m256 v0, v1;
                if (vr) {
                    v0 = _mm256_loadu_ps(vr + i * vld + c);
                    v1 = _mm256_loadu_ps(vr + i * vld + c + 8);
                } else {
                    v0 = ya_i8x8(a->Vq + (size_t)(b + i) * a->ld + c, 8);
                    v1 = ya_i8x8(a->Vq + (size_t)(b + i) * a->ld + c + 8, 8);
                }
                UNROLL
                for (int j = 0; j < T; j++) {
                    const __m256 wv = _mm256_set1_ps(w[j][i]);
                    o0[j] = _mm256_fmadd_ps(wv, v0, o0[j]);
                    o1[j] = _mm256_fmadd_ps(wv, v1, o1[j]);
                }
            }
            UNROLL
            for (int j = 0; j < T; j++) {
                _mm256_storeu_ps(t->o[j] + c, o0[j]);
                _mm256_storeu_ps(t->o[j] + c + 8, o1[j]);
            }
        }
    for (; c < d; c += 8) {
        const uint32_t k = d - c < 8 ? d - c : 8;
        const __m256i mk = tail_mask(k);
        __m256 o[YA_T];
        UNROLL
        for (int j = 0; j < T; j++)
            o[j] = kj[j] ? _mm256_mul_ps(_mm256_maskload_ps(t->o[j] + c, mk),
                                         _mm256_set1_ps(alpha[j])) : _mm256_setzero_ps();
        for (uint32_t i = 0; i < nb; i++) {
            if (!(keep >> i & 1u))
                continue;
            const __m256 v = vr ? _mm256_maskload_ps(vr + i * vld + c, mk)
                                : ya_i8x8(a->Vq + (size_t)(b + i) * a->ld + c, k);
            UNROLL
            for (int j = 0; j < T; j++)
                if (kj[j] >> i & 1u)
                    o[j] = _mm256_fmadd_ps(_mm256_set1_ps(w[j][i]), v, o[j]);
        }
        UNROLL
        for (int j = 0; j < T; j++)
            if (kj[j])
                _mm256_maskstore_ps(t->o[j] + c, mk, o[j]);
    }
}

/* The queries of the nt tiles t (n[j] positions each, outputs zeroed) to
 * the end, block by block for the group. */
BLOCK void ya_run(const int T, ya_tile *t, uint32_t nt, const clb_att_args *a)
{
    float kt[YA_C * CLB_ATT_BLOCK], vf[YA_C * CLB_ATT_BLOCK];
    const int shared = nt > 1 && a->d <= YA_C; /* one tile: nothing to share */
    const uint32_t nmax = clb_att_tiles_start(t, nt, (uint32_t)T);
    for (uint32_t b = 0; b < nmax; b += CLB_ATT_BLOCK) {
        const uint32_t nb = nmax - b < CLB_ATT_BLOCK ? nmax - b : CLB_ATT_BLOCK;
        clb_att_prefetch_ahead(a, b, nmax);
        uint32_t reach[YA_G], kj[YA_G][CLB_ATT_TILE]; /* lane bits of the unmasked positions */
        const uint32_t all = clb_att_block_lanes(a, t, nt, (uint32_t)T, b, nb, reach, kj);
        if (!all)
            continue;
        if (shared) {
            ya_keys(kt, a, b, all, 0, a->d);
            if (!a->V)
                ya_vals(vf, a, b, nb, all);
        }
        for (uint32_t k = 0; k < nt; k++)
            if (reach[k])
                ya_block(T, t + k, a, b, nb, reach[k], kj[k], kt, shared, vf);
    }
    for (uint32_t k = 0; k < nt; k++)
        for (int j = 0; j < T; j++) {
            if (!t[k].any[j])
                continue;
            const __m256 lv = _mm256_set1_ps(t[k].l[j]);
            for (uint32_t c = 0; c < a->d; c += 8) {
                const __m256i mk = tail_mask(a->d - c < 8 ? a->d - c : 8);
                _mm256_maskstore_ps(t[k].o[j] + c, mk,
                                    _mm256_div_ps(_mm256_maskload_ps(t[k].o[j] + c, mk), lv));
            }
        }
}

/* The nt tiles t at tile width T (1, 2, 4): a constant in each inlined
 * copy, so a tile's chains stay in registers and few queries (a decode
 * step's GQA group) pay for no padding queries. */
TGT static void ya_run_width(int T, ya_tile *t, uint32_t nt, const clb_att_args *a)
{
    switch (T) {
    case 1:
        ya_run(1, t, nt, a);
        break;
    case 2:
        ya_run(2, t, nt, a);
        break;
    default:
        ya_run(4, t, nt, a);
        break;
    }
}

TGT static void avx2_attend_rows(const clb_att_rows *r, const clb_att_args *a)
{
    const uint32_t nq = r->nr * r->nh;
    const int T = nq >= 4u ? 4 : nq > 2u ? 4 : (int)nq;
    for (uint32_t g0 = 0; g0 < nq; g0 += (uint32_t)T * YA_G) {
        ya_tile t[YA_G];
        uint32_t nt = 0;
        for (uint32_t t0 = g0; t0 < nq && nt < YA_G; t0 += (uint32_t)T, nt++)
            clb_att_tile_queries(r, a->d, t0, (uint32_t)T, t + nt);
        ya_run_width(T, t, nt, a);
    }
}

TGT static void avx2_attend(float *out, const clb_att_args *a)
{
    ya_tile t;
    clb_att_tile_one(a, out, &t);
    ya_run_width(1, &t, 1, a);
}

/* silu_mul: clb_silu lane by lane (kernels.h; its exp unfused): -|v| by
 * the sign bit, the select by v >= 0 (false for NaN, as in C). The last
 * len % 8 through ref, the same operations on one lane. */
TGT static void avx2_silu_mul(float *h, const float *g, size_t len)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        const __m256 v = _mm256_loadu_ps(h + i);
        const __m256 e = exp_neg8_form(_mm256_or_ps(v, sign), 0);
        const __m256 pos = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GE_OQ);
        const __m256 s = _mm256_div_ps(_mm256_blendv_ps(e, one, pos), _mm256_add_ps(one, e));
        _mm256_storeu_ps(h + i, _mm256_mul_ps(_mm256_mul_ps(v, s), _mm256_loadu_ps(g + i)));
    }
    clb_ref_silu_mul(h + i, g + i, len - i);
}

/* ------------------------------------------------------------------------ */

static const colibri_kernels avx2_kernels = {
    "avx2",
    avx2_matmul_f32,
    avx2_quantize_act_i8,
    avx2_matmul_i8,
    avx2_matmul_i16,
    avx2_quantize_act_blk,
    avx2_matmul_q4_0,
    avx2_matmul_q4_k,
    avx2_matmul_q6_k,
    avx2_matmul_q5_0,
    avx2_matmul_q5_k,
    avx2_matmul_q8_0,
    avx2_attend,
    avx2_attend_rows,
    avx2_silu_mul,
};

/* The same with vpdpbusd for the int8 dot products ("avx2-vnni"): VEX
 * encoded on CPUs with AVX-VNNI (CPUID.(EAX=7,ECX=1):EAX bit 4: Alder Lake,
 * Sapphire Rapids, Zen 5), else EVEX encoded on ymm registers on CPUs with
 * AVX512-VNNI + AVX512VL (Cascade Lake, Ice Lake, Zen 4, and Sapphire Rapids
 * guests whose hypervisor hides AVX-VNNI). Same results as "avx2" (both are
 * bit-identical to ref); vpdpbusd makes the prefill GEMM ~2x faster.
 * COLIBRI_AVX2_NO_VNNI (`scons vnni=0`) leaves both out, so the plain AVX2
 * table runs as on an AVX2-only CPU (Zen 2/3, Haswell..Comet Lake). */
static const colibri_kernels avx2_vnni_kernels = {
    "avx2-vnni",
    avx2_matmul_f32,
    avx2_quantize_act_i8,
    avx2_vnni_matmul_i8,
    avx2_matmul_i16,
    avx2_quantize_act_blk,
    avx2_vnni_matmul_q4_0,
    avx2_vnni_matmul_q4_k,
    avx2_vnni_matmul_q6_k,
    avx2_vnni_matmul_q5_0,
    avx2_matmul_q5_k,
    avx2_vnni_matmul_q8_0,
    avx2_attend,
    avx2_attend_rows,
    avx2_silu_mul,
};

static const colibri_kernels avx2_evex_vnni_kernels = {
    "avx2-vnni",
    avx2_matmul_f32,
    avx2_quantize_act_i8,
    avx2_evex_vnni_matmul_i8,
    avx2_matmul_i16,
    avx2_quantize_act_blk,
    avx2_evex_vnni_matmul_q4_0,
    avx2_evex_vnni_matmul_q4_k,
    avx2_evex_vnni_matmul_q6_k,
    avx2_evex_vnni_matmul_q5_0,
    avx2_matmul_q5_k,
    avx2_evex_vnni_matmul_q8_0,
    avx2_attend,
    avx2_attend_rows,
    avx2_silu_mul,
};

/* F16C (the blocks' fp16 scales): CPUID leaf 1, ECX bit 29. Every AVX2 CPU
 * has it; clang's __builtin_cpu_supports does not know the name. */
static int cpu_f16c(void)
{
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && ((ecx >> 29) & 1u);
}

/* 1: AVX-VNNI (VEX), 2: AVX512-VNNI with AVX512VL (EVEX; libgcc's
 * __builtin_cpu_supports also checks the OS saves the AVX-512 state), 0:
 * neither, or built with COLIBRI_AVX2_NO_VNNI. */
static int cpu_vnni_form(void)
{
#if defined(COLIBRI_AVX2_NO_VNNI)
    return 0;
#elif defined(COLIBRI_AVX512_EMULATED)
    return 2; /* test builds only: the EVEX form, emulated (DPBUSD) */
#else
    unsigned eax, ebx, ecx, edx;
    if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && ((eax >> 4) & 1u))
        return 1;
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl"))
        return 2;
    return 0;
#endif
}

/* The table of integer form `form` (0 plain, 1 VEX VNNI, 2 EVEX VNNI) with
 * no CPU check: avx512.c's table forwards the forms it does not replace to
 * form 2, and only exists on CPUs that have it. */
void clb_avx2_i8_gemm(clb_i8g_micro_fn *micro, unsigned dt, const void *W, const float *S,
                      float *Y, const int8_t *XQ, const float *XS, uint32_t n, uint32_t rows,
                      uint32_t cols, uint32_t group)
{
    const i8g_src src = {dt, dt ? NULL : (const int8_t *)W, S, dt ? (const uint8_t *)W : NULL};
    i8_gemm(2, micro, Y, &src, XQ, XS, n, rows, cols, group);
}

const colibri_kernels *clb_avx2_form_table(int form);
const colibri_kernels *clb_avx2_form_table(int form)
{
    return form == 2 ? &avx2_evex_vnni_kernels : form == 1 ? &avx2_vnni_kernels : &avx2_kernels;
}

const colibri_kernels *colibri_kernels_avx2_plain(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !cpu_f16c())
        return NULL;
    return &avx2_kernels;
}

const colibri_kernels *colibri_kernels_avx2(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !cpu_f16c())
        return NULL;
    switch (cpu_vnni_form()) {
    case 1:
        return &avx2_vnni_kernels;
    case 2:
        return &avx2_evex_vnni_kernels;
    default:
        return &avx2_kernels;
    }
}

#else /* not built with COLIBRI_USE_AVX2, or not x86 */

const colibri_kernels *colibri_kernels_avx2(void)
{
    return NULL;
}

const colibri_kernels *colibri_kernels_avx2_plain(void)
{
    return NULL;
}

#endif
