/*
 * avx512.c - AVX-512 kernels for x86-64 (the table "avx512-vnni", kernels.h).
 *
 * Build: like avx2.c, inside `#if COLIBRI_USE_AVX2` (the x86 kernel set:
 * colibri/buildsteps/sources.py lists both files), every function that uses
 * AVX-512 carries a target attribute, so the library is compiled with the
 * default x86-64 flags and colibri_kernels_avx512() picks at run time: NULL
 * on a CPU without AVX-512 F/BW/VL/VNNI (or whose OS does not save the
 * zmm state), and NULL when built with COLIBRI_AVX2_NO_VNNI (scons vnni=0:
 * the stand-in for an AVX2-only CPU must not pick this table either).
 *
 * What is 512-bit here, and why (profile of the small bench Mixtral's
 * decode on Zen 4, bench/results/FINDINGS.md section 7): a decode token
 * streams every weight once, and the AVX2 int8 form spent 4 instructions
 * (load, vpabsb, vpsignb, vpdpbusd) per 32 weight bytes plus a hadd tree and
 * a dependent float add per group and 4 rows; the core, not the memory, was
 * the limit. The forms below take 64 bytes an instruction and need no
 * per-row sign fix-up:
 * - matmul_i8, few tokens (decode): weights biased to unsigned (q ^ 0x80 =
 *   q + 128) against the signed activations in vpdpbusd, so one xor and one
 *   vpdpbusd per 64 weight bytes; the bias is 128 * (sum of the group's
 *   activations), a per-token value computed once per call and subtracted
 *   from the exact int32 group dots. Bit-identical to ref (kernels.h): the
 *   group dots are exact int32, the float work per group ref's, in order.
 * - attend (ref.c's flash-attention schedule, bit for bit): 16 positions'
 *   scores and exps in one zmm.
 * Everything else (float matmuls, prefill GEMMs, quantisation, int16, the
 * block types) is avx2.c's EVEX-VNNI table, called through its pointers:
 * a 512-bit f32 decode form (8 rows x 16 columns an FMA step) measured no
 * faster (test_kernels --bench: 18-21 against 21-24 GB/s, memory-bound), the
 * prefill forms already lead llama.cpp, and with float matmuls shared this
 * table differs from "avx2-vnni" only where both equal ref bit for bit
 * (matmul_i8, attend), so their logits are the same bits.
 */
#include "kernels.h"

#if defined(COLIBRI_USE_AVX2) && !defined(COLIBRI_AVX2_NO_VNNI) && \
    defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define TGT512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
/* COLIBRI_KERNELS_PLAIN: ordinary functions and loops for sanitizer builds
 * (avx2.c says why). */
#ifdef COLIBRI_KERNELS_PLAIN
#define BLOCK512 static TGT512
#define UNROLL
#else
#define BLOCK512 static inline __attribute__((always_inline)) TGT512
#define UNROLL _Pragma("GCC unroll 16")
#endif

/* avx2.c's table with EVEX vpdpbusd (form 2): the forms this file does not
 * replace. Declared here, not in kernels.h: only this file needs it. */
const colibri_kernels *clb_avx2_form_table(int form);

static const colibri_kernels *base(void)
{
    return clb_avx2_form_table(2);
}

/* Sum of the 16 lanes: lane j + j+8, then + j+4, + j+2, + j+1 (the
 * halving tree of ref.c's attend). */
BLOCK512 float hsum16(__m512 v)
{
    __m256 s = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* ------------------------------------------------------------------------ */
/* matmul_i8, decode form (group 32).
 *
 * Per token: xc[g] = 128 * sum of xq over group g (exact int32), once.
 * Per block of 4 rows and chunk of 8 groups (256 columns, 4 zmm a row):
 *   P[r][j] = vpdpbusd(0, Q[r, 64j ..] ^ 0x80, xq[64j ..]): lanes 0-7 hold
 *   group 2j's partial sums (+ bias), lanes 8-15 group 2j+1's;
 *   an exact reduction tree (unpack/add within 128-bit lanes, then across)
 *   gives C0 = [g0: r0 r1 r2 r3 | g1: .. | g2 | g3], C1 = the same for g4..7,
 *   and the bias xc[g] is subtracted per 128-bit lane;
 *   the scale products S[r, g] * XS[g] in the same layout (two permutes of
 *   the 4 rows' 8 scales), F = float(C) * P lane by lane, and the 4 rows'
 *   running sums (one xmm) add F's 128-bit lanes in group order: ref's
 *   acc += float(dot) * (s * xs), unfused, groups in order.
 * Groups past the last whole chunk go one at a time (i8_group_tail).
 */
enum { ZG = 32, Z_MAXG = 2048 }; /* group size of this form; groups a row at most */
/* Rows ahead that i8z_rows4 prefetches (into L2): 8, two blocks ahead.
 * End to end on the shared Zen 4 (decode, int8 small model, CPU time, 3
 * alternations each): 4 rows ahead 5-12 % slower than avx2-vnni, 8 rows
 * ahead level with it (0.93-1.03x); in cache the form is 1.7-2.2x faster. */
enum { Z_PF_ROWS = 8 };

/* 128 * sum of x[0 .. len) (len <= 32, masked-out bytes never read). */
BLOCK512 int32_t bias_of(const int8_t *x, uint32_t len)
{
    const __mmask32 m = len >= 32 ? 0xffffffffu : (__mmask32)((1u << len) - 1u);
    const __m256i xv = _mm256_maskz_loadu_epi8(m, x);
    const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), xv);
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
    return 128 * _mm_cvtsi128_si32(h);
}

/* Exact int32 dot of q[0 .. len) and x[0 .. len), len <= 32: biased form,
 * masked loads (zeros beyond len contribute (0 + 128) * 0). */
BLOCK512 int32_t dot_tail(const int8_t *q, const int8_t *x, uint32_t len, int32_t bias)
{
    const __mmask32 m = len >= 32 ? 0xffffffffu : (__mmask32)((1u << len) - 1u);
    const __m256i qu = _mm256_xor_si256(_mm256_maskz_loadu_epi8(m, q), _mm256_set1_epi8((char)0x80));
    const __m256i qv = _mm256_maskz_mov_epi8(m, qu);
    const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), qv, _mm256_maskz_loadu_epi8(m, x));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(h) - bias;
}

/* a, b -> per 128-bit lane [a0+a2, b0+b2, a1+a3, b1+b3] (exact). */
BLOCK512 __m512i pair32(__m512i a, __m512i b)
{
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}

/* a, b (from pair32) -> per 128-bit lane [sum a-lo-row, sum a-hi-row, sum b-lo, sum b-hi]. */
BLOCK512 __m512i pair64(__m512i a, __m512i b)
{
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}

/* B_j, B_k (each: 128-bit lanes 0,1 = halves of group 2j, lanes 2,3 = of
 * group 2j+1, 4 rows a lane) -> [group 2j | 2j+1 | 2k | 2k+1], 4 rows each. */
BLOCK512 __m512i pair128(__m512i a, __m512i b)
{
    return _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The 4 rows' dots of groups 4h .. 4h + 3 of the chunk at column c (h = 0, 1):
 * [g: r0 r1 r2 r3] per 128-bit lane, bias included. */
BLOCK512 __m512i dots4x4(const int8_t *const q[4], const __m512i xv[2], uint32_t c)
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512i p[4][2];
    UNROLL
    for (int r = 0; r < 4; r++)
        UNROLL
        for (int j = 0; j < 2; j++)
            p[r][j] = _mm512_dpbusd_epi32(
                _mm512_setzero_si512(),
                _mm512_xor_si512(_mm512_loadu_si512((const void *)(q[r] + c + 64 * j)), flip),
                xv[j]);
    __m512i b[2];
    UNROLL
    for (int j = 0; j < 2; j++)
        b[j] = pair64(pair32(p[0][j], p[1][j]), pair32(p[2][j], p[3][j]));
    return pair128(b[0], b[1]);
}

/* Y[r0 .. r0 + 4) for one token with group 32: see the comment above. */
BLOCK512 void i8z_rows4(float *y, const int8_t *Q, const float *S, const int8_t *xq,
                        const float *xs, const int32_t *xc, uint32_t cols, uint32_t ng,
                        uint32_t r0, int prefetch)
{
    const int8_t *q[4];
    const float *s[4];
    UNROLL
    for (int r = 0; r < 4; r++) {
        q[r] = Q + (size_t)(r0 + r) * cols;
        s[r] = S + (size_t)(r0 + r) * ng;
    }
    const size_t qnext = (size_t)Z_PF_ROWS * cols, snext = (size_t)Z_PF_ROWS * ng;
    /* lane 4g + r of a scale vector <- [s0 g0..7 | s1 g0..7] (idx < 16) or
     * [s2 | s3] (idx 16..31); of the bias / xs vectors <- element g */
    const __m512i sidx_lo = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
    const __m512i sidx_hi = _mm512_add_epi32(sidx_lo, _mm512_set1_epi32(4));
    const __m512i gidx_lo = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i gidx_hi = _mm512_add_epi32(gidx_lo, _mm512_set1_epi32(4));
    __m128 acc = _mm_setzero_ps();
    uint32_t g = 0;
    for (; g + 8 <= ng && (g + 8) * ZG <= cols; g += 8) {
        const uint32_t c = g * ZG;
        if (prefetch) {
            UNROLL
            for (int r = 0; r < 4; r++)
                UNROLL
                for (int l = 0; l < 4; l++)
                    _mm_prefetch((const char *)(q[r] + qnext + c + 64 * l), _MM_HINT_T1);
            if (g % 16 == 0)
                UNROLL
                for (int r = 0; r < 4; r++)
                    _mm_prefetch((const char *)(s[r] + snext + g), _MM_HINT_T1);
        }
        const __m512i x0[2] = {_mm512_loadu_si512((const void *)(xq + c)),
                               _mm512_loadu_si512((const void *)(xq + c + 64))};
        const __m512i x1[2] = {_mm512_loadu_si512((const void *)(xq + c + 128)),
                               _mm512_loadu_si512((const void *)(xq + c + 192))};
        const __m512i cb = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(xc + g)));
        const __m512i d0 = _mm512_sub_epi32(dots4x4(q, x0, c), _mm512_permutexvar_epi32(gidx_lo, cb));
        const __m512i d1 = _mm512_sub_epi32(dots4x4(q, x1, c + 128), _mm512_permutexvar_epi32(gidx_hi, cb));
        /* scale products S[r, g] * XS[g], laid out as d0 / d1 */
        const __m512 s01 = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(s[0] + g)),
                                              _mm256_loadu_ps(s[1] + g), 1);
        const __m512 s23 = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(s[2] + g)),
                                              _mm256_loadu_ps(s[3] + g), 1);
        const __m512 xsv = _mm512_castps256_ps512(_mm256_loadu_ps(xs + g));
        const __m512 p0 = _mm512_mul_ps(_mm512_permutex2var_ps(s01, sidx_lo, s23),
                                        _mm512_permutexvar_ps(gidx_lo, xsv));
        const __m512 p1 = _mm512_mul_ps(_mm512_permutex2var_ps(s01, sidx_hi, s23),
                                        _mm512_permutexvar_ps(gidx_hi, xsv));
        const __m512 f0 = _mm512_mul_ps(_mm512_cvtepi32_ps(d0), p0);
        const __m512 f1 = _mm512_mul_ps(_mm512_cvtepi32_ps(d1), p1);
        acc = _mm_add_ps(acc, _mm512_castps512_ps128(f0));
        acc = _mm_add_ps(acc, _mm512_extractf32x4_ps(f0, 1));
        acc = _mm_add_ps(acc, _mm512_extractf32x4_ps(f0, 2));
        acc = _mm_add_ps(acc, _mm512_extractf32x4_ps(f0, 3));
        acc = _mm_add_ps(acc, _mm512_castps512_ps128(f1));
        acc = _mm_add_ps(acc, _mm512_extractf32x4_ps(f1, 1));
        acc = _mm_add_ps(acc, _mm512_extractf32x4_ps(f1, 2));
        acc = _mm_add_ps(acc, _mm512_extractf32x4_ps(f1, 3));
    }
    float a[4];
    _mm_storeu_ps(a, acc);
    for (; g < ng; g++) { /* the rest, group by group (the last may be short) */
        const uint32_t c0 = g * ZG, len = cols - c0 < ZG ? cols - c0 : ZG;
        UNROLL
        for (int r = 0; r < 4; r++)
            a[r] += (float)dot_tail(q[r] + c0, xq + c0, len, xc[g]) * (s[r][g] * xs[g]);
    }
    memcpy(y + r0, a, sizeof a);
}

/* One row (rows past the last block of 4): ref's loop with exact dots. */
BLOCK512 void i8z_row1(float *y, const int8_t *Q, const float *S, const int8_t *xq,
                       const float *xs, const int32_t *xc, uint32_t cols, uint32_t ng,
                       uint32_t r)
{
    const int8_t *q = Q + (size_t)r * cols;
    const float *s = S + (size_t)r * ng;
    float acc = 0.0f;
    for (uint32_t g = 0; g < ng; g++) {
        const uint32_t c0 = g * ZG, len = cols - c0 < ZG ? cols - c0 : ZG;
        acc += (float)dot_tail(q + c0, xq + c0, len, xc[g]) * (s[g] * xs[g]);
    }
    y[r] = acc;
}

/* Tokens at which avx2.c's GEMM form takes over (its I8G_MIN_N). */
enum { Z_GEMM_N = 8 };

TGT512 static void z_matmul_i8(float *Y, const int8_t *Q, const float *S, const int8_t *XQ,
                               const float *XS, uint32_t n, uint32_t rows, uint32_t cols,
                               uint32_t group)
{
    const uint32_t ng = (cols + group - 1) / group;
    if (n >= Z_GEMM_N || group != ZG || ng > Z_MAXG) {
        base()->matmul_i8(Y, Q, S, XQ, XS, n, rows, cols, group);
        return;
    }
    int32_t xc[Z_MAXG]; /* 8 KiB of stack at most (kernels.h allows 32) */
    for (uint32_t t = 0; t < n; t++) {
        float *y = Y + (size_t)t * rows;
        const int8_t *xq = XQ + (size_t)t * cols;
        const float *xs = XS + (size_t)t * ng;
        for (uint32_t g = 0; g < ng; g++)
            xc[g] = bias_of(xq + g * ZG, cols - g * ZG < ZG ? cols - g * ZG : ZG);
        uint32_t r = 0;
        for (; r + 4 <= rows; r += 4)
            i8z_rows4(y, Q, S, xq, xs, xc, cols, ng, r, r + 4 + Z_PF_ROWS <= rows);
        for (; r < rows; r++)
            i8z_row1(y, Q, S, xq, xs, xc, cols, ng, r);
    }
}

/* ------------------------------------------------------------------------ */
/* attend: ref.c's clb_ref_attend (the flash-attention schedule), its float
 * operations lane by lane in the same order, so the same bits. Scores and
 * exps of a block of 16 positions go in one zmm (lane = position); the
 * output update runs along head_dim (lane = c % 16).                     */

/* Mask of the first k (0..16) lanes. */
BLOCK512 __mmask16 lanes16(uint32_t k)
{
    return k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << k) - 1u);
}

/* clb_att_exp for 16 lanes: the same operations (kernels.h). */
BLOCK512 __m512 att_exp16(__m512 x)
{
    const __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(CLB_EXP_MIN), _CMP_GE_OQ);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512 big = _mm512_set1_ps(12582912.0f);
    __m512 n = _mm512_mul_ps(x, _mm512_set1_ps(CLB_EXP_LOG2E));
    n = _mm512_sub_ps(_mm512_add_ps(n, big), big);
    __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(CLB_EXP_LN2_HI)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(CLB_EXP_LN2_LO)));
    __m512 p = _mm512_set1_ps(CLB_EXP_C7);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(CLB_EXP_C6));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(CLB_EXP_C5));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(CLB_EXP_C4));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(CLB_EXP_C3));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(CLB_EXP_C2));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
    /* out-of-range lanes hold garbage in n: their exponent is not used */
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(
        _mm512_cvtps_epi32(_mm512_maskz_mov_ps(ok, n)), _mm512_set1_epi32(127)), 23);
    const __m512 v = _mm512_maskz_mul_ps(ok, p, _mm512_castsi512_ps(e));
    return _mm512_mask_mov_ps(v, nan, x);
}

/* The scores of the block's positions `keep` (lane bits; others 0):
 * lane i = ref's att_score of position b + i. K is gathered along c, 16
 * positions a lane each, so every lane sums its products in c order, as
 * ref does; int8 K gathers the 4 bytes c .. c + 3 of each row at once
 * (whole rows only: d % 4 == 0, else ref's loop per position). */
BLOCK512 __m512 att_scores16(const clb_att_args *a, uint32_t b, __mmask16 keep)
{
    const uint32_t d = a->d;
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                              11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)a->ld));
    __m512 acc = _mm512_setzero_ps();
    if (a->K) {
        const float *base = a->K + (size_t)b * a->ld;
        for (uint32_t c = 0; c < d; c++) {
            const __m512 k = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), keep, rows, base + c, 4);
            acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(a->q[c]), k));
        }
        return _mm512_mul_ps(acc, _mm512_set1_ps(a->scale));
    }
    const __m512i srows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                               11, 12, 13, 14, 15),
                                             _mm512_set1_epi32((int)a->lds));
    const __m512 ks = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), keep, srows,
                                               a->Ks + (size_t)b * a->lds, 4);
    if (d % 4 == 0) {
        const int8_t *base = a->Kq + (size_t)b * a->ld;
        for (uint32_t c = 0; c < d; c += 4) {
            const __m512i w = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), keep, rows,
                                                          base + c, 1);
            UNROLL
            for (int j = 0; j < 4; j++) {
                const __m512 k = _mm512_cvtepi32_ps(_mm512_srai_epi32(
                    _mm512_slli_epi32(w, 24 - 8 * j), 24));
                acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(a->q[c + (uint32_t)j]), k));
            }
        }
    } else {
        float s[16] = {0};
        for (uint32_t i = 0; i < 16; i++) {
            if (!(keep >> i & 1u))
                continue;
            const int8_t *k = a->Kq + (size_t)(b + i) * a->ld;
            float dot = 0.0f;
            for (uint32_t c = 0; c < d; c++)
                dot = dot + a->q[c] * (float)k[c];
            s[i] = dot;
        }
        acc = _mm512_loadu_ps(s);
    }
    return _mm512_mul_ps(_mm512_mul_ps(acc, ks), _mm512_set1_ps(a->scale));
}

TGT512 static void z_attend(float *out, const clb_att_args *a)
{
    const uint32_t d = a->d;
    float m = -INFINITY, l = 0.0f;
    int any = 0;
    memset(out, 0, (size_t)d * sizeof(float));
    for (uint32_t b = 0; b < a->n; b += CLB_ATT_BLOCK) {
        const uint32_t nb = a->n - b < CLB_ATT_BLOCK ? a->n - b : CLB_ATT_BLOCK;
        uint32_t keep = 0; /* lane bits of the unmasked positions */
        for (uint32_t i = 0; i < nb; i++)
            keep |= (uint32_t)(a->mask[b + i] != 0) << i;
        if (!keep)
            continue;
        float s[CLB_ATT_BLOCK];
        _mm512_storeu_ps(s, att_scores16(a, b, (__mmask16)keep));
        float mb = -INFINITY; /* ref's max, in position order */
        int live = 0;
        for (uint32_t i = 0; i < nb; i++)
            if (keep >> i & 1u) {
                mb = !live || s[i] > mb ? s[i] : mb;
                live = 1;
            }
        if (!live)
            continue;
        const float mn = !any || mb > m ? mb : m;
        const float alpha = any ? clb_att_exp(m - mn) : 0.0f;
        const __m512 pv = _mm512_maskz_mov_ps((__mmask16)keep,
            att_exp16(_mm512_sub_ps(_mm512_loadu_ps(s), _mm512_set1_ps(mn))));
        float pr[CLB_ATT_BLOCK];
        _mm512_storeu_ps(pr, pv);
        l = l * alpha + hsum16(pv);
        const __m512 al = _mm512_set1_ps(alpha);
        for (uint32_t c = 0; c < d; c += 16) {
            const __mmask16 mk = lanes16(d - c);
            __m512 o = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, out + c), al);
            for (uint32_t i = 0; i < nb; i++) {
                if (!(keep >> i & 1u))
                    continue;
                const size_t at = (size_t)(b + i) * a->ld + c;
                __m512 v, w;
                if (a->V) {
                    v = _mm512_maskz_loadu_ps(mk, a->V + at);
                    w = _mm512_set1_ps(pr[i]);
                } else {
                    v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mk, a->Vq + at)));
                    w = _mm512_set1_ps(pr[i] * a->Vs[(size_t)(b + i) * a->lds]);
                }
                o = _mm512_add_ps(o, _mm512_mul_ps(w, v));
            }
            _mm512_mask_storeu_ps(out + c, mk, o);
        }
        m = mn;
        any = 1;
    }
    if (!any)
        return;
    const __m512 lv = _mm512_set1_ps(l);
    for (uint32_t c = 0; c < d; c += 16) {
        const __mmask16 mk = lanes16(d - c);
        _mm512_mask_storeu_ps(out + c, mk, _mm512_div_ps(_mm512_maskz_loadu_ps(mk, out + c), lv));
    }
}

/* ------------------------------------------------------------------------ */
/* The forms shared with avx2.c's EVEX-VNNI table.                          */

static void z_quantize_act_i8(int8_t *XQ, float *XS, const float *X, uint32_t n,
                              uint32_t cols, uint32_t group)
{
    base()->quantize_act_i8(XQ, XS, X, n, cols, group);
}

static void z_matmul_i16(float *Y, const int16_t *Q, const float *S, const float *X,
                         uint32_t n, uint32_t rows, uint32_t cols)
{
    base()->matmul_i16(Y, Q, S, X, n, rows, cols);
}

static void z_quantize_act_blk(int8_t *XQ, float *XS, int16_t *XB, const float *X,
                               uint32_t n, uint32_t cols, uint32_t block)
{
    base()->quantize_act_blk(XQ, XS, XB, X, n, cols, block);
}

static void z_matmul_q4_0(float *Y, const uint8_t *W, const int8_t *XQ, const float *XS,
                          const int16_t *XB, uint32_t n, uint32_t rows, uint32_t cols)
{
    base()->matmul_q4_0(Y, W, XQ, XS, XB, n, rows, cols);
}

static void z_matmul_q4_k(float *Y, const uint8_t *W, const int8_t *XQ, const float *XS,
                          const int16_t *XB, uint32_t n, uint32_t rows, uint32_t cols)
{
    base()->matmul_q4_k(Y, W, XQ, XS, XB, n, rows, cols);
}

static void z_matmul_q6_k(float *Y, const uint8_t *W, const int8_t *XQ, const float *XS,
                          const int16_t *XB, uint32_t n, uint32_t rows, uint32_t cols)
{
    base()->matmul_q6_k(Y, W, XQ, XS, XB, n, rows, cols);
}

static void z_matmul_f32(float *Y, const float *W, const float *X, uint32_t n,
                         uint32_t rows, uint32_t cols)
{
    base()->matmul_f32(Y, W, X, n, rows, cols);
}

static const colibri_kernels avx512_vnni_kernels = {
    "avx512-vnni",
    z_matmul_f32,
    z_quantize_act_i8,
    z_matmul_i8,
    z_matmul_i16,
    z_quantize_act_blk,
    z_matmul_q4_0,
    z_matmul_q4_k,
    z_matmul_q6_k,
    z_attend,
};

const colibri_kernels *colibri_kernels_avx512(void)
{
    __builtin_cpu_init();
    /* libgcc's checks include the OS saving the zmm / opmask state (XCR0) */
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
        !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq") ||
        !__builtin_cpu_supports("avx512vnni"))
        return NULL;
    return &avx512_vnni_kernels;
}

#else /* not built with the x86 kernels, or with vnni=0, or not x86-64 */

const colibri_kernels *colibri_kernels_avx512(void)
{
    return NULL;
}

#endif
