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
 * - attend and attend_rows (ref.c's flash-attention schedule, bit for
 *   bit): a tile of queries over each block of 16 keys, transposed once in
 *   registers, 16 positions' scores and exps in one zmm.
 * - matmul_q4_k and matmul_q6_k (Q5_K: below) for one token (decode): 8
 *   rows a tile in the 32 zmm registers, bit-identical to ref (see "Block
 *   types, decode form" below); for several tokens (prefill) 8 rows x 4 tokens a tile
 *   (then 2, then 1), each row's unpacked weights used for all of them
 *   ("Block types, several tokens"): test_kernels --bench, 128 tokens x
 *   2816 x 1024, on a Xeon with 2 tokens a tile Q4_K 104 -> 142 GOPS and
 *   Q6_K 94 -> 124 against avx2-vnni's; on Zen 4, 4 tokens against 2: Q4_K
 *   116 -> 148, Q6_K 121-130 -> 141-153.
 * - matmul_q5_k: Q4_K's tiles with the fifth bit (the 4-bit mix's
 *   embedding and LM head, GGUF Q5_K_M imports): 128 tokens x 2816 x 1024
 *   on a Xeon 64 -> 128 GOPS against avx2.c's one plain-AVX2 form; its
 *   decode tile since the Zen 5 run (FINDINGS.md 32: test_kernels --bench
 *   24-25 -> 28-29 GB/s from memory; the bench model's q4 decode, one
 *   thread, 5.4-5.8 -> 4.5-4.9 ms a token, Q4_K's tile, now the same body,
 *   faster in it too; on a Xeon both forms had read 31 GOPS).
 * - Q4_K, Q5_K and Q6_K prefill from CLB_KG_MIN_N (12) tokens: a GEMM of their
 *   own (avx2.c's clb_avx2_k_gemm with zk_pack_block and zk_micro,
 *   "Block types, GEMM form"): 16 rows x 2 blocks unpacked
 *   once into the int8 GEMM's column-quad layout, then every token over
 *   them, one vpdpbusd a token and quad: 128 x 2816 x 1024 on a Xeon Q4_K
 *   3.8 -> 1.9-2.0 ms, Q5_K 4.4-4.7 -> 2.0-2.1, Q6_K 4.0-4.1 -> 2.3-2.5
 *   against the tiles (FINDINGS.md 25); the tiles keep 2 to 11 tokens.
 * - matmul_q4_0 for one token: 8 rows x 4 blocks a tile ("Q4_0, decode
 *   form"): test_kernels --bench, one token x 2816 x 1024 from memory, on
 *   Zen 5 29-31 -> 42-44 GB/s against avx2.c's EVEX form; the GGUF Q4_0
 *   bench model's decode 4.3 -> 3.7 ms a token (FINDINGS.md 35).
 * - matmul_q8_0 for one token: Q4_0's tile shape and float update with
 *   Q8_0's 32 signed values (FINDINGS.md 36): 42.9 GB/s from memory on
 *   Zen 5 against avx2.c's tiles' 33.
 * - the int8 GEMM's micro-kernel (prefill of int8, and of Q4_0 / Q5_0 / Q8_0
 *   from 16 tokens): avx2.c's GEMM driver (x86_gemm.h: packing, chunks,
 *   prefetch) with zg_micro, whose zmm holds a column quad of all 16 rows,
 *   one vpdpbusd a token and quad where avx2.c's ymm form takes two:
 *   128 x 2816 x 1024 on a Xeon, int8 2.99-3.02 -> 2.62-2.77 ms, Q4_0
 *   3.35-3.36 -> 2.82-2.86 (FINDINGS.md 24).
 * Everything else (float matmuls, quantisation, int16, Q4_0 and Q8_0 from
 * 2 and Q5_0 from 1 to 15 tokens, and below CLB_KG_MIN_N tokens the block
 * types' rows past the last strip of 8) is avx2.c's EVEX-VNNI table,
 * called through its pointers:
 * a 512-bit f32 decode form (8 rows x 16 columns an FMA step) measured no
 * faster (test_kernels --bench: 18-21 against 21-24 GB/s, memory-bound), the
 * float and int8 prefill forms already lead llama.cpp, and with float
 * matmuls shared this table differs from "avx2-vnni" only where both equal
 * ref bit for bit (matmul_i8, attend, the block types' forms), so their
 * logits are the same bits.
 */
#include "kernels.h"
#include "x86_gemm.h"

#if defined(COLIBRI_USE_AVX2) && !defined(COLIBRI_AVX2_NO_VNNI) && \
    defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* COLIBRI_AVX512_EMULATED (tests/c/avx512_emulation/immintrin.h, test
 * builds only): the intrinsics are SIMDe's portable AVX-512 on an AVX2 CPU,
 * so no target attribute (the compiler must not emit AVX-512 itself) and no
 * CPUID check below: the table runs, and is held to ref, on any AVX2 CPU. */
#ifdef COLIBRI_AVX512_EMULATED
#define TGT512
#else
#define TGT512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#endif
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
 * Per block of 4 lanes and chunk of 8 groups (256 columns, 4 zmm a lane):
 *   P[r][j] = vpdpbusd(0, Q[r, 64j ..] ^ 0x80, xq[64j ..]): lanes 0-7 hold
 *   group 2j's partial sums (+ bias), lanes 8-15 group 2j+1's;
 *   an exact reduction tree (unpack/add within 128-bit lanes, then across)
 *   gives C0 = [g0: r0 r1 r2 r3 | g1: .. | g2 | g3], C1 = the same for g4..7,
 *   and the bias xc[g] is subtracted per 128-bit lane;
 *   the scale products S[r, g] * XS[g] in the same layout (two permutes of
 *   the 4 rows' 8 scales), F = float(C) * P lane by lane, and the 4 rows'
 *   running sums (one xmm) add F's 128-bit lanes in group order: ref's
 *   acc += float(dot) * (s * xs), unfused, groups in order.
 * Groups past the last whole chunk go one at a time (dot_tail).
 * The 4 lanes are 4 rows, one from each quarter of W (avx2.c's STREAMS),
 * and each row's stream is requested CLB_STREAM_PFB bytes ahead into L2.
 * Measured (bench/c/i8_matmul.c at 2816 x 1024 and 1024 x 2048 from DRAM,
 * 2-core Intel Xeon, interleaved, weight GB/s; FINDINGS.md 15): adjacent
 * rows r0, r0 + 1, each in two lanes, prefetched 8 rows ahead 9.0-9.5;
 * rows i and i + rows/2, each twice, 13.0-13.4; four quarters 14.5-15.3,
 * as fast as avx2.c's streams. (On Zen 4, before streams, the two rows
 * twice had beaten 4 adjacent rows: FINDINGS.md 12.) Which rows share a
 * block changes no bit: each is ref's operations in ref's order.
 */
enum { ZG = 32, Z_MAXG = 2048 }; /* group size of this form; groups a row at most */

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

/* How far ahead of each row's stream i8z_rows4 requests: twice
 * CLB_STREAM_PFB. Measured on the bench model's int8 decode, one thread,
 * interleaved (bench/results/FINDINGS.md 34): on Zen 5, ms a token, 512 B
 * 6.9-7.1, 1 KiB 6.5-7.1, 2 KiB 6.0-6.3, 3 KiB 6.3-6.5, 4 KiB 6.5-6.6; 2
 * KiB into L1 6.5-6.6; two threads level. On an Intel Xeon 512 B and 2 KiB
 * were within 2 % of 1 KiB (section 15). */
#define ZI8_STREAM_PFB (2u * CLB_STREAM_PFB)

/* Y[i + k * quarter] (k < 4) for one token with group 32: see the
 * comment above. With `prefetch`, each row's stream ZI8_STREAM_PFB bytes on
 * (its scales one row on) is requested into L2, each line once. */
BLOCK512 void i8z_rows4(float *y, const int8_t *Q, const float *S, const int8_t *xq,
                        const float *xs, const int32_t *xc, uint32_t cols, uint32_t ng,
                        uint32_t i, uint32_t quarter, int prefetch)
{
    uint32_t row[4];
    const int8_t *q[4];
    const float *s[4];
    UNROLL
    for (int r = 0; r < 4; r++) {
        row[r] = i + (uint32_t)r * quarter;
        q[r] = Q + (size_t)row[r] * cols;
        s[r] = S + (size_t)row[r] * ng;
    }
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
                    _mm_prefetch((const char *)(q[r] + ZI8_STREAM_PFB + c + 64 * l), _MM_HINT_T1);
            if (g % 16 == 0)
                UNROLL
                for (int r = 0; r < 4; r++)
                    _mm_prefetch((const char *)(s[r] + ng + g), _MM_HINT_T1);
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
    UNROLL
    for (int r = 0; r < 4; r++)
        y[row[r]] = a[r];
}

/* One row (the last rows % 4): ref's loop with exact dots. */
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


/* The GEMM's micro-kernel (x86_gemm.h) in zmm registers: the 16 rows of a
 * column quad are one 64-byte vector, so each token's 4 activation bytes
 * (broadcast) meet all 16 rows in one vpdpbusd, where avx2.c's form takes
 * two. Per group: the dot less 128 * csum (exact int32), then ref's
 * float(dot) * (s * xs) added to the row's sum, group after group. */
BLOCK512 void zg_micro_t(const int T, float *Y, const int8_t *wp, const int32_t *csum,
                         const float *sp, const uint8_t *xu, const float *XS, uint32_t rows,
                         uint32_t ng, uint32_t r0, uint32_t nr, uint32_t t0, uint32_t kc,
                         uint32_t kl, uint32_t g0, uint32_t group)
{
    const __mmask16 m = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1u);
    __m512 facc[4];
    UNROLL
    for (int t = 0; t < T; t++)
        facc[t] = kc == 0 ? _mm512_setzero_ps()
                          : _mm512_maskz_loadu_ps(m, Y + (size_t)(t0 + (uint32_t)t) * rows + r0);
    for (uint32_t gl = 0, cs = 0; cs < kl; gl++, cs += group) {
        const uint32_t ce = kl - cs < group ? kl : cs + group;
        __m512i iacc[4];
        UNROLL
        for (int t = 0; t < T; t++)
            iacc[t] = _mm512_setzero_si512();
        for (uint32_t c = cs; c < ce; c += 4) {
            const __m512i w = _mm512_loadu_si512((const void *)(wp + (size_t)c * 16));
            UNROLL
            for (int t = 0; t < T; t++) {
                int32_t quad;
                memcpy(&quad, xu + (size_t)t * CLB_I8G_KC + c, 4);
                iacc[t] = _mm512_dpbusd_epi32(iacc[t], _mm512_set1_epi32(quad), w);
            }
        }
        const __m512 s = _mm512_loadu_ps(sp + (size_t)gl * 16);
        const __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512((const void *)(csum + (size_t)gl * 16)), 7);
        UNROLL
        for (int t = 0; t < T; t++) {
            const __m512 xs = _mm512_set1_ps(XS[(size_t)(t0 + (uint32_t)t) * ng + g0 + gl]);
            const __m512 d = _mm512_cvtepi32_ps(_mm512_sub_epi32(iacc[t], corr));
            facc[t] = _mm512_add_ps(facc[t], _mm512_mul_ps(d, _mm512_mul_ps(s, xs)));
        }
    }
    UNROLL
    for (int t = 0; t < T; t++)
        _mm512_mask_storeu_ps(Y + (size_t)(t0 + (uint32_t)t) * rows + r0, m, facc[t]);
}

TGT512 static void zg_micro(int T, float *Y, const int8_t *wp, const int32_t *csum,
                            const float *sp, const uint8_t *xu, const float *XS, uint32_t rows,
                            uint32_t ng, uint32_t r0, uint32_t nr, uint32_t t0, uint32_t kc,
                            uint32_t kl, uint32_t g0, uint32_t group)
{
    if (T == 4)
        zg_micro_t(4, Y, wp, csum, sp, xu, XS, rows, ng, r0, nr, t0, kc, kl, g0, group);
    else
        zg_micro_t(1, Y, wp, csum, sp, xu, XS, rows, ng, r0, nr, t0, kc, kl, g0, group);
}

/* The decode form (few tokens, group ZG). Its own function: its 8 KiB of
 * xc must not stay on the stack under the GEMM, which z_matmul_i8 calls
 * with too many arguments for a tail call (colibri.h's
 * COLIBRI_WORKER_STACK_BYTES: with xc in z_matmul_i8's frame a worker used
 * 50,320 bytes). */
static __attribute__((noinline)) TGT512 void z_i8_decode(float *Y, const int8_t *Q,
                                                         const float *S, const int8_t *XQ,
                                                         const float *XS, uint32_t n,
                                                         uint32_t rows, uint32_t cols,
                                                         uint32_t ng)
{
    int32_t xc[Z_MAXG]; /* 8 KiB of stack at most (kernels.h allows 32) */
    for (uint32_t t = 0; t < n; t++) {
        float *y = Y + (size_t)t * rows;
        const int8_t *xq = XQ + (size_t)t * cols;
        const float *xs = XS + (size_t)t * ng;
        for (uint32_t g = 0; g < ng; g++)
            xc[g] = bias_of(xq + g * ZG, cols - g * ZG < ZG ? cols - g * ZG : ZG);
        const uint32_t quarter = rows / 4; /* block i: rows i + k * quarter */
        for (uint32_t i = 0; i < quarter; i++)
            i8z_rows4(y, Q, S, xq, xs, xc, cols, ng, i, quarter, i + 1 < quarter);
        for (uint32_t r = 4 * quarter; r < rows; r++)
            i8z_row1(y, Q, S, xq, xs, xc, cols, ng, r);
    }
}

TGT512 static void z_matmul_i8(float *Y, const int8_t *Q, const float *S, const int8_t *XQ,
                               const float *XS, uint32_t n, uint32_t rows, uint32_t cols,
                               uint32_t group)
{
    const uint32_t ng = (cols + group - 1) / group;
    if (n >= CLB_I8G_MIN_N && group % 4 == 0 && group <= CLB_I8G_KC)
        clb_avx2_i8_gemm(zg_micro, 0, Q, S, Y, XQ, XS, n, rows, cols, group);
    else if (n >= CLB_I8G_MIN_N || group != ZG || ng > Z_MAXG)
        base()->matmul_i8(Y, Q, S, XQ, XS, n, rows, cols, group);
    else
        z_i8_decode(Y, Q, S, XQ, XS, n, rows, cols, ng);
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

/* 16 floats at p, or the lanes of m (the others 0), and 16 int8 at p
 * widened to float the same way. A full mask takes a plain load: on Zen 5
 * a masked load that misses the cache held up the loads behind it, and a
 * decode step's attention at depth 2048 read its cache at a third of the
 * speed (bench/results/FINDINGS.md 32). The lanes are the same either way. */
BLOCK512 __m512 zload_ps(__mmask16 m, const float *p)
{
    return m == (__mmask16)0xffff ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}
BLOCK512 __m512 zload_i8_ps(__mmask16 m, const int8_t *p)
{
    const __m128i q = m == (__mmask16)0xffff ? _mm_loadu_si128((const __m128i *)(const void *)p)
                                             : _mm_maskz_loadu_epi8(m, p);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
}

/* a * b + c fused, or a multiply and an add each rounded (kernels.h
 * clb_madd); x - n * c the same way. */
BLOCK512 __m512 madd16(__m512 a, __m512 b, __m512 c, int fused)
{
    return fused ? _mm512_fmadd_ps(a, b, c) : _mm512_add_ps(_mm512_mul_ps(a, b), c);
}
BLOCK512 __m512 nmadd16(__m512 n, __m512 c, __m512 x, int fused)
{
    return fused ? _mm512_fnmadd_ps(n, c, x) : _mm512_sub_ps(x, _mm512_mul_ps(n, c));
}

/* clb_exp_neg_form for 16 lanes: the same operations (kernels.h; fused,
 * -n * c + x is fma(-n, c, x): the negation is exact; unfused, x - n * c
 * is (-n) * c + x). */
BLOCK512 __m512 exp_neg16_form(__m512 x, int fused)
{
    const __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(CLB_EXP_MIN), _CMP_GE_OQ);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512 big = _mm512_set1_ps(12582912.0f);
    __m512 n = _mm512_mul_ps(x, _mm512_set1_ps(CLB_EXP_LOG2E));
    n = _mm512_sub_ps(_mm512_add_ps(n, big), big);
    __m512 r = nmadd16(n, _mm512_set1_ps(CLB_EXP_LN2_HI), x, fused);
    r = nmadd16(n, _mm512_set1_ps(CLB_EXP_LN2_LO), r, fused);
    __m512 p = _mm512_set1_ps(CLB_EXP_C7);
    p = madd16(p, r, _mm512_set1_ps(CLB_EXP_C6), fused);
    p = madd16(p, r, _mm512_set1_ps(CLB_EXP_C5), fused);
    p = madd16(p, r, _mm512_set1_ps(CLB_EXP_C4), fused);
    p = madd16(p, r, _mm512_set1_ps(CLB_EXP_C3), fused);
    p = madd16(p, r, _mm512_set1_ps(CLB_EXP_C2), fused);
    p = madd16(p, r, _mm512_set1_ps(1.0f), fused);
    p = madd16(p, r, _mm512_set1_ps(1.0f), fused);
    /* out-of-range lanes hold garbage in n: their exponent is not used */
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(
        _mm512_cvtps_epi32(_mm512_maskz_mov_ps(ok, n)), _mm512_set1_epi32(127)), 23);
    const __m512 v = _mm512_maskz_mul_ps(ok, p, _mm512_castsi512_ps(e));
    return _mm512_mask_mov_ps(v, nan, x);
}

BLOCK512 __m512 exp_neg16(__m512 x)
{
    return exp_neg16_form(x, 1);
}

/* attend_rows: tiles of up to ZA_T queries (kernels.h clb_att_rows) over
 * the same keys. Per block of 16 positions the keys are gathered once
 * into kt, lane = position, along c (ZA_C columns at a time), and every
 * query of the tile sums its products from kt in c order, as ref does
 * (fused multiply-adds): ZA_T independent chains instead of one
 * latency-bound chain per query, and one gather of a key column for ZA_T
 * queries instead of one each.
 * A query's own operations are ref's, in ref's order, whatever tile it is
 * in; a query the block does not reach (n <= b, or only masked
 * positions) is left as it was (alpha 1: o * 1 = o exactly, no add).
 * attend_rows runs up to ZA_G tiles as a group, block by block, each
 * block's keys transposed (and an int8 cache's values widened) once for
 * the group, as avx2.c's ya_run. */
enum { ZA_T = 8, ZA_C = 256, ZA_G = 4 };

typedef clb_att_tile za_tile; /* kernels.h; ZA_T of its queries */
_Static_assert(ZA_T <= CLB_ATT_TILE, "a tile holds ZA_T queries");

/* r[0..16) (row i = 16 floats) -> r[c] = column c (lane i = row i's c):
 * the 16 x 16 transpose in four rounds of pairwise shuffles. */
BLOCK512 void transpose16(__m512 r[16])
{
    __m512 t[16];
    UNROLL
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    UNROLL
    for (int i = 0; i < 16; i += 4)
        UNROLL
        for (int j = 0; j < 2; j++) {
            r[i + j] = _mm512_shuffle_ps(t[i + j], t[i + j + 2], 0x44);
            r[i + j + 2] = _mm512_shuffle_ps(t[i + j], t[i + j + 2], 0xee);
        }
    UNROLL
    for (int i = 0; i < 16; i += 8)
        UNROLL
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xdd);
        }
    UNROLL
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
    }
}

/* kt[c - c0][lane] = key (b + lane)'s column c (int8: as float), for c in
 * c0 .. c0 + cn and the lanes in keep (others 0): 16 columns of the 16
 * rows at a time, loaded and transposed in registers (a 16-lane gather per
 * column was the whole cost of a block on Zen 4). transpose16 leaves
 * column i with bits 0 and 1 swapped in r[i]. */
/* (one out-of-line copy: its 16 x 16 transposes are the bulk of the code,
 * and a call a block costs nothing next to them) */
static TGT512 __attribute__((noinline)) void za_keys(float *kt, const clb_att_args *a, uint32_t b,
                                                     __mmask16 keep,
                      uint32_t c0, uint32_t cn)
{
    for (uint32_t c = 0; c < cn; c += 16) {
        const __mmask16 mk = lanes16(cn - c);
        __m512 r[16];
        UNROLL
        for (int i = 0; i < 16; i++) {
            const __mmask16 m = (keep >> i & 1u) ? mk : 0;
            const size_t at = (size_t)(b + (uint32_t)i) * a->ld + c0 + c;
            r[i] = a->K ? zload_ps(m, a->K + at) : zload_i8_ps(m, a->Kq + at);
        }
        transpose16(r);
        UNROLL
        for (int i = 0; i < 16; i++)
            _mm512_storeu_ps(kt + 16 * (c + (uint32_t)((i & ~3) | (i & 1) << 1 | (i >> 1 & 1))), r[i]);
    }
}

/* vf[i * d + c] = value row (b + i)'s column c as float (int8 cache), for
 * the rows i in keep: widened once for a group of tiles (exact). */
static TGT512 __attribute__((noinline)) void za_vals(float *vf, const clb_att_args *a, uint32_t b,
                                                     uint32_t nb, uint32_t keep)
{
    for (uint32_t i = 0; i < nb; i++) {
        if (!(keep >> i & 1u))
            continue;
        const int8_t *vq = a->Vq + (size_t)(b + i) * a->ld;
        for (uint32_t c = 0; c < a->d; c += 16) {
            const __mmask16 mk = lanes16(a->d - c);
            _mm512_mask_storeu_ps(vf + (size_t)i * a->d + c, mk, zload_i8_ps(mk, vq + c));
        }
    }
}

/* One block b of the tile: the scores, the running max and sum, and the
 * output update of every query the block reaches (kj: its lanes). shared:
 * kt already holds the block's keys for every column (d <= ZA_C) and, for
 * an int8 cache, vf its values as float (za_run's group). */
BLOCK512 void za_block(const int T, za_tile *t, const clb_att_args *a, uint32_t b, uint32_t nb,
                       uint32_t keep, const uint32_t *kj, float *kt, int shared, const float *vf)
{
    const uint32_t d = a->d;
    __m512 acc[ZA_T];
    UNROLL
    for (int j = 0; j < T; j++)
        acc[j] = _mm512_setzero_ps();
    for (uint32_t c0 = 0; c0 < d; c0 += ZA_C) {
        const uint32_t cn = d - c0 < ZA_C ? d - c0 : ZA_C;
        if (!shared)
            za_keys(kt, a, b, (__mmask16)keep, c0, cn);
        for (uint32_t c = 0; c < cn; c++) {
            const __m512 k = _mm512_loadu_ps(kt + 16 * c);
            UNROLL
            for (int j = 0; j < T; j++)
                acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(t->q[j][c0 + c]), k, acc[j]);
        }
    }
    const __m512i srows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                               11, 12, 13, 14, 15),
                                             _mm512_set1_epi32((int)a->lds));
    __m512 ks = _mm512_setzero_ps(), vs = ks;
    if (!a->K && a->lds == 1) { /* the runtime's head-major cache: scales in a row */
        ks = zload_ps((__mmask16)keep, a->Ks + b);
        vs = zload_ps((__mmask16)keep, a->Vs + b);
    } else if (!a->K) {
        ks = _mm512_mask_i32gather_ps(ks, (__mmask16)keep, srows, a->Ks + (size_t)b * a->lds, 4);
        vs = _mm512_mask_i32gather_ps(vs, (__mmask16)keep, srows, a->Vs + (size_t)b * a->lds, 4);
    }
    float alpha[ZA_T], w[ZA_T][CLB_ATT_BLOCK];
    __m512 sv[ZA_T];
    /* the scores, the new running maxima, and alpha = exp(m - m') for the
     * T queries in one vector exp (lane j: query j) */
    float mn[ZA_T], dm[16] = {0}, ex[16];
    UNROLL
    for (int j = 0; j < T; j++)
        sv[j] = a->K ? _mm512_mul_ps(acc[j], _mm512_set1_ps(a->scale))
                     : _mm512_mul_ps(_mm512_mul_ps(acc[j], ks), _mm512_set1_ps(a->scale));
    for (int j = 0; j < T; j++)
        if (t->bias[j]) { /* T5's position bias: lane by lane, ref's adds */
            float s[CLB_ATT_BLOCK];
            _mm512_storeu_ps(s, sv[j]);
            clb_att_add_bias(s, t->bias[j], a->bias_step, b, kj[j]);
            sv[j] = _mm512_loadu_ps(s);
        }
    for (int j = 0; j < T; j++) {
        mn[j] = t->m[j];
        if (!kj[j])
            continue;
        /* ref's max, as a vector max (avx2.c ya_max16 says why that is exact) */
        mn[j] = clb_att_new_max(t->m[j], _mm512_mask_reduce_max_ps((__mmask16)kj[j], sv[j]),
                                t->any[j], dm + j);
    }
    _mm512_storeu_ps(ex, exp_neg16(_mm512_loadu_ps(dm)));
    for (int j = 0; j < T; j++) {
        alpha[j] = 1.0f;
        if (!kj[j])
            continue;
        alpha[j] = t->any[j] ? ex[j] : 0.0f;
        const __m512 pv = _mm512_maskz_mov_ps((__mmask16)kj[j],
            exp_neg16(_mm512_sub_ps(sv[j], _mm512_set1_ps(mn[j]))));
        t->l[j] = t->l[j] * alpha[j] + hsum16(pv);
        /* the weight of v_i: p_i (int8: p_i * vs_i, ref's product) */
        _mm512_storeu_ps(w[j], a->K ? pv : _mm512_mul_ps(pv, vs));
        t->m[j] = mn[j];
        t->any[j] = 1;
    }
    /* The values: float rows at vr + i * vld (the f32 cache, or vf), or
     * the int8 cache widened here. full: every query of the tile takes
     * all 16 positions, so the loop needs no test of a lane (avx2.c). */
    const float *vr = a->V ? a->V + (size_t)b * a->ld : shared ? vf : NULL;
    const size_t vld = a->V ? a->ld : d;
    int full = keep == 0xffffu;
    for (int j = 0; j < T; j++)
        full = full && kj[j] == 0xffffu;
    for (uint32_t c = 0; c < d; c += 16) {
        const __mmask16 mk = lanes16(d - c);
        __m512 o[ZA_T];
        UNROLL
        for (int j = 0; j < T; j++)
            o[j] = kj[j] ? _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, t->o[j] + c),
                                         _mm512_set1_ps(alpha[j])) : _mm512_setzero_ps();
        if (full) {
            for (uint32_t i = 0; i < CLB_ATT_BLOCK; i++) {
                const __m512 v = vr ? zload_ps(mk, vr + i * vld + c)
                                    : zload_i8_ps(mk, a->Vq + (size_t)(b + i) * a->ld + c);
                UNROLL
                for (int j = 0; j < T; j++)
                    o[j] = _mm512_fmadd_ps(_mm512_set1_ps(w[j][i]), v, o[j]);
            }
        } else {
            for (uint32_t i = 0; i < nb; i++) {
                if (!(keep >> i & 1u))
                    continue;
                const __m512 v = vr ? zload_ps(mk, vr + i * vld + c)
                                    : zload_i8_ps(mk, a->Vq + (size_t)(b + i) * a->ld + c);
                UNROLL
                for (int j = 0; j < T; j++)
                    if (kj[j] >> i & 1u)
                        o[j] = _mm512_fmadd_ps(_mm512_set1_ps(w[j][i]), v, o[j]);
            }
        }
        UNROLL
        for (int j = 0; j < T; j++)
            if (kj[j])
                _mm512_mask_storeu_ps(t->o[j] + c, mk, o[j]);
    }
}

/* The queries of the nt tiles t (n[j] positions each, outputs zeroed) to
 * the end, block by block for the group. */
BLOCK512 void za_run(const int T, za_tile *t, uint32_t nt, const clb_att_args *a)
{
    float kt[ZA_C * CLB_ATT_BLOCK], vf[ZA_C * CLB_ATT_BLOCK];
    const int shared = nt > 1 && a->d <= ZA_C; /* one tile: nothing to share */
    const uint32_t nmax = clb_att_tiles_start(t, nt, (uint32_t)T);
    for (uint32_t b = 0; b < nmax; b += CLB_ATT_BLOCK) {
        const uint32_t nb = nmax - b < CLB_ATT_BLOCK ? nmax - b : CLB_ATT_BLOCK;
        clb_att_prefetch_ahead(a, b, nmax);
        uint32_t reach[ZA_G], kj[ZA_G][CLB_ATT_TILE]; /* lane bits of the unmasked positions */
        const uint32_t all = clb_att_block_lanes(a, t, nt, (uint32_t)T, b, nb, reach, kj);
        if (!all)
            continue;
        if (shared) {
            za_keys(kt, a, b, (__mmask16)all, 0, a->d);
            if (!a->V)
                za_vals(vf, a, b, nb, all);
        }
        for (uint32_t k = 0; k < nt; k++)
            if (reach[k])
                za_block(T, t + k, a, b, nb, reach[k], kj[k], kt, shared, vf);
    }
    for (uint32_t k = 0; k < nt; k++)
        for (int j = 0; j < T; j++) {
            if (!t[k].any[j])
                continue;
            const __m512 lv = _mm512_set1_ps(t[k].l[j]);
            for (uint32_t c = 0; c < a->d; c += 16) {
                const __mmask16 mk = lanes16(a->d - c);
                _mm512_mask_storeu_ps(t[k].o[j] + c, mk,
                                      _mm512_div_ps(_mm512_maskz_loadu_ps(mk, t[k].o[j] + c), lv));
            }
        }
}

/* The nt tiles t at tile width T (1, 2, 4, 8): a constant in each inlined
 * copy, so a tile's chains stay in registers and few queries (a decode
 * step's GQA group) pay for no padding queries. */
TGT512 static void za_run_width(int T, za_tile *t, uint32_t nt, const clb_att_args *a)
{
    switch (T) {
    case 1:
        za_run(1, t, nt, a);
        break;
    case 2:
        za_run(2, t, nt, a);
        break;
    case 4:
        za_run(4, t, nt, a);
        break;
    default:
        za_run(8, t, nt, a);
        break;
    }
}

TGT512 static void z_attend_rows(const clb_att_rows *r, const clb_att_args *a)
{
    const uint32_t nq = r->nr * r->nh;
    const int T = nq >= 8u ? 8 : nq > 2u ? 4 : (int)nq;
    for (uint32_t g0 = 0; g0 < nq; g0 += (uint32_t)T * ZA_G) {
        za_tile t[ZA_G];
        uint32_t nt = 0;
        for (uint32_t t0 = g0; t0 < nq && nt < ZA_G; t0 += (uint32_t)T, nt++)
            clb_att_tile_queries(r, a->d, t0, (uint32_t)T, t + nt);
        za_run_width(T, t, nt, a);
    }
}

TGT512 static void z_attend(float *out, const clb_att_args *a)
{
    za_tile t;
    clb_att_tile_one(a, out, &t);
    za_run_width(1, &t, 1, a);
}

/* silu_mul: clb_silu lane by lane (kernels.h), as avx2.c's; the last
 * len % 16 in masked lanes (lanes past len compute on zeros, unstored). */
TGT512 static void z_silu_mul(float *h, const float *g, size_t len)
{
    const __m512 sign = _mm512_set1_ps(-0.0f), one = _mm512_set1_ps(1.0f);
    for (size_t i = 0; i < len; i += 16) {
        const __mmask16 m = lanes16(len - i < 16 ? (uint32_t)(len - i) : 16u);
        const __m512 v = _mm512_maskz_loadu_ps(m, h + i);
        const __m512 e = exp_neg16_form(_mm512_or_ps(v, sign), 0);
        const __mmask16 pos = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GE_OQ);
        const __m512 s = _mm512_div_ps(_mm512_mask_mov_ps(e, pos, one), _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(h + i, m,
                              _mm512_mul_ps(_mm512_mul_ps(v, s), _mm512_maskz_loadu_ps(m, g + i)));
    }
}

/* ------------------------------------------------------------------------ */
/* Block types, decode form (one token): matmul_q4_k, matmul_q5_k and
 * matmul_q6_k, 8 rows a tile, bit-identical to ref.c (kernels.h; FORMAT.md
 * 5).
 *
 * Why (perf of the small bench model's q4 decode on Zen 4, FINDINGS.md 8):
 * avx2.c's tiles of 8 rows ran out of its 16 ymm registers (the 8 rows'
 * accumulators and mins sums spilled to the stack every block), decoded
 * each row's 6-bit Q4_K scales alone, and ran its prefetch as a loop of its
 * own per block (avx2.c's tile now decodes two rows' scales a ymm, and
 * their mins sums at once: q4k_sums8). Here, with 32 zmm registers:
 * - the integer work per row and block is ref's exact int32 isum (and Q4_K
 *   msum), formed 64 columns a vector: vpmaddubsw (unsigned q x signed xq,
 *   int16 pairs) then vpdpwssd by the sub-block scales (int16), which also
 *   widens to int32 and accumulates;
 * - the 8 rows' accumulators reduce to one ymm (lane = row) by an exact
 *   tree, and the block's float update runs for the 8 rows at once in
 *   ref's order (unfused, d * float(isum) first, then the rest);
 * - Q4_K scales and mins are decoded for 4 rows in one zmm (a 128-bit lane
 *   a row), Q4_K's msum for 4 rows in one vpmaddwd;
 * - the prefetches are straight-line (a fixed count per block) and a call
 *   starts with a burst over its first tile and the prefetch distance, so
 *   the first rows of a call do not wait on one miss after another.
 * Zen 4 runs a 512-bit operation at the cost of two 256-bit ones, so the
 * gain here is fewer operations per block, not the width.
 * Rows past the last whole tile use avx2.c's forms: every tiling gives
 * ref's bits, so the mix changes none. */

enum { ZB_R = 8 };          /* rows a decode tile */
/* Bytes of a block of the K types with 512-bit forms here. */
/* Q4_K and Q5_K: scales and mins, d and dmin; Q5_K's fifth bits (qh at
 * CLB_Q5_K_QH) and where each type's low nibbles start. */
#define ZB_AFFINE(dt) ((dt) != COLIBRI_DTYPE_Q6_K)
#define ZB_FIVE(dt) ((dt) == COLIBRI_DTYPE_Q5_K)
#define ZB_QS(dt) (ZB_FIVE(dt) ? CLB_Q5_K_QS : CLB_Q4_K_QS)
#define ZB_BYTES(dt) ((dt) == COLIBRI_DTYPE_Q4_K ? CLB_Q4_K_BYTES \
                      : (dt) == COLIBRI_DTYPE_Q5_K ? CLB_Q5_K_BYTES \
                      : (dt) == COLIBRI_DTYPE_Q4_0 ? CLB_Q4_0_BYTES \
                      : (dt) == COLIBRI_DTYPE_Q8_0 ? CLB_Q8_0_BYTES : CLB_Q6_K_BYTES)
/* Columns of a block (Q4_0's and Q8_0's decode tiles share zb_decode). */
#define ZB_COLS(dt) ((dt) == COLIBRI_DTYPE_Q4_0 || (dt) == COLIBRI_DTYPE_Q8_0 ? CLB_Q4_0_COLS \
                                                                            : CLB_QK_COLS)
/* Bytes past the next tile that the stream prefetch runs ahead (as
 * avx2.c's BT_PF_AHEAD). */
enum { ZB_PF_AHEAD = 4096 };

/* 16 bytes repeated in the four 128-bit lanes. */
#define ZB_LANES(...) _mm512_broadcast_i32x4(_mm_setr_epi8(__VA_ARGS__))

/* [a x 16 | b x 16] int16 vpshufb pattern: byte a (b) of each 128-bit lane
 * zero-extended to int16, in the low (high) 256 bits. */
BLOCK512 __m512i pick16x2(int a, int b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)(0x8000 | a))),
                              _mm256_set1_epi16((short)(0x8000 | b)), 1);
}

/* 8 rows' 16-lane int32 accumulators -> lane r of a ymm = the exact sum
 * of a[r]'s lanes (pair32 / pair64 above, then the 128-bit lanes). */
BLOCK512 __m256i rowsums8(const __m512i a[8])
{
    const __m512i q0 = pair64(pair32(a[0], a[1]), pair32(a[2], a[3])); /* [r0..r3] a lane */
    const __m512i q1 = pair64(pair32(a[4], a[5]), pair32(a[6], a[7])); /* [r4..r7] a lane */
    const __m512i c = _mm512_add_epi32(_mm512_shuffle_i64x2(q0, q1, 0x44),
                                       _mm512_shuffle_i64x2(q0, q1, 0xEE));
    /* c = [q0 lanes 0+2, 1+3 | q1 lanes 0+2, 1+3] */
    const __m512i d = _mm512_shuffle_i64x2(c, c, 0xD8); /* lanes 0, 2, 1, 3 */
    return _mm256_add_epi32(_mm512_castsi512_si256(d), _mm512_extracti64x4_epi64(d, 1));
}

/* Lane k of the result = the 16 bytes at p[k] + o (4 rows, k = 0..3). */
BLOCK512 __m512i rows4_16(const uint8_t *const p[4], size_t o)
{
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)(p[0] + o)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(const void *)(p[1] + o)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(const void *)(p[2] + o)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(const void *)(p[3] + o)), 3);
}

/* The fp16 scales of 8 rows' blocks at o (dtype dt) as float32, exactly:
 * lanes 0-7 d of rows 0-7, lanes 8-15 dmin (Q4_K, Q5_K) or d again (Q6_K).
 * One 16-byte load a row (rows4_16) that holds them: Q4_K's and Q5_K's
 * first (d, dmin: its 16-bit lanes 0, 1), Q6_K's last (d at CLB_Q6_K_D ends
 * the block: 16 bytes from d would read past it); one vpermt2w, one
 * vcvtph2ps (its 512-bit form is AVX512F's, so no F16C to detect; exact,
 * subnormals included, as clb_f16_to_f32). */
BLOCK512 __m512 zb_d_dmin(const unsigned dt, const uint8_t *const w[ZB_R], size_t o)
{
    const uint32_t at = ZB_AFFINE(dt) ? 0u : CLB_Q6_K_BYTES - 16u;
    const short k = (short)((ZB_AFFINE(dt) ? 0u : CLB_Q6_K_D - at) / 2); /* d's 16-bit lane */
    const __m512i lo = rows4_16(w, o + at), hi = rows4_16(w + 4, o + at);
    /* word 8r + lane of [lo | hi]: row r's lane (rows 4-7 in hi) */
    const __m256i row = _mm256_setr_epi16(0, 8, 16, 24, 32, 40, 48, 56, 0, 8, 16, 24, 32, 40, 48, 56);
    const __m256i idx = _mm256_add_epi16(row, _mm256_setr_m128i(_mm_set1_epi16(k),
                                                                _mm_set1_epi16((short)(k + ZB_AFFINE(dt)))));
    return _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(lo, _mm512_zextsi256_si512(idx), hi)));
}

/* Lane k (row k of 4) of the result: 128-bit lane k broadcast to all four. */
BLOCK512 __m512i lane_bcast(__m512i v, int k)
{
    return _mm512_permutexvar_epi64(_mm512_add_epi64(_mm512_setr_epi64(0, 1, 0, 1, 0, 1, 0, 1),
                                                     _mm512_set1_epi64(2 * k)), v);
}

/* Prefetch the `lines` 64-byte lines from p into L2, unless they reach
 * past end (the stream stops at the call's last row). */
BLOCK512 void zb_prefetch(const uint8_t *p, const uint8_t *end, int lines)
{
    if (p + 64 * lines > end)
        return;
    UNROLL
    for (int l = 0; l < lines; l++)
        _mm_prefetch((const char *)(p + 64 * l), _MM_HINT_T1);
}

/* The lines that start in [w[r] + off, + bytes) of each of the 8 rows
 * into L1 (a decode tile's streams, CLB_STREAM_PFB ahead): over a row's
 * consecutive blocks, each line once. Inline: out of line (a
 * CLB_PREFETCH_HELPER, as it was, since a plain noinline one was deleted by
 * GCC) its call and loop per block cost more than the requests gained.
 * Measured on Zen 5 (FINDINGS.md 33, 35), test_kernels --bench, one token x
 * 2816 x 1024 from memory, GB/s, out of line -> inline: Q4_K 38.5-38.9 ->
 * 42.9-44.5, Q5_K 37.5-38.5 -> 42.1-43.3, Q6_K 39.5-41 -> 42.9-45.4; the
 * bench model's q4 decode at one thread 3.49-3.53 -> 3.38-3.42 ms a token.
 * Earlier, out of line (FINDINGS.md 33): no prefetch 4.5-5.1 ms, every 64
 * bytes into L2 3.9-4.1, into L1 3.8-4.0, each line once into L1 3.7-3.8;
 * 768 and 1536 bytes ahead within the noise of CLB_STREAM_PFB. */
BLOCK512 void zb_prefetch_rows(const uint8_t *const w[ZB_R], size_t off, uint32_t bytes)
{
    UNROLL
    for (int r = 0; r < ZB_R; r++) {
        const uintptr_t at = (uintptr_t)(w[r] + off);
        for (uintptr_t l = (at + 63u) & ~(uintptr_t)63u; l < at + bytes; l += 64u)
            _mm_prefetch((const char *)l, _MM_HINT_T0);
    }
}

/* The call's first tile and the prefetch distance, all at once. */
BLOCK512 void zb_prefetch_start(const uint8_t *W, size_t bytes)
{
    for (size_t o = 0; o < bytes; o += 64)
        _mm_prefetch((const char *)(W + o), _MM_HINT_T1);
}

/* Q4_K: 4 rows' scales and mins of a block (clb_q4k_scale_min), one row a
 * 128-bit lane: [sc0..sc7 | m0..m7] u8; the vector form of avx2.c's
 * q4k_scales_mins, s = the 16 bytes at the block's CLB_QK_SCALES (12..15:
 * qs or qh, unused). */
BLOCK512 __m512i q4k_scm4(const uint8_t *const p[4], size_t o)
{
    const __m512i s = rows4_16(p, o + CLB_QK_SCALES);
    const __m512i a = _mm512_shuffle_epi8(s, ZB_LANES(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m512i b = _mm512_shuffle_epi8(s, ZB_LANES(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    const __m512i lo = _mm512_and_si512(a, ZB_LANES(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    /* lo | (a >> 4 & mask) | (b >> 2 & 0x30): ternary logic A | (B & C) */
    const __m512i t = _mm512_ternarylogic_epi32(lo, _mm512_srli_epi16(a, 4),
                                                ZB_LANES(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15), 0xF8);
    return _mm512_ternarylogic_epi32(t, _mm512_srli_epi16(b, 2), _mm512_set1_epi8(0x30), 0xF8);
}

/* Q4_K: the exact msum = sum_j m_j * bsum_j of 4 rows (scm from q4k_scm4)
 * against bs = [bsum_0..7] int16 in every lane -> every int32 of lane k =
 * row k's msum. */
BLOCK512 __m512i q4k_msum4(__m512i scm, __m512i bs)
{
    const __m512i mn = _mm512_shuffle_epi8(scm, ZB_LANES(8, -128, 9, -128, 10, -128, 11, -128, 12, -128, 13,
                                                         -128, 14, -128, 15, -128));
    __m512i m = _mm512_madd_epi16(mn, bs);
    m = _mm512_add_epi32(m, _mm512_shuffle_epi32(m, _MM_PERM_BADC));
    return _mm512_add_epi32(m, _mm512_shuffle_epi32(m, _MM_PERM_CDAB));
}

/* Q5_K's 32 qh bytes in both halves (five), or nothing to read (Q4_K). */
BLOCK512 __m512i q5k_qh(const int five, const uint8_t *qh)
{
    return five ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)qh))
                : _mm512_setzero_si512();
}

/* One row's isum of a Q4_K block (qs at q) as 16 int32 lanes, the 8
 * sub-blocks' scales from br (the row's scm lane in all four lanes).
 * Vector qs[0..63]: low nibbles = sub-blocks 0 | 2 (columns 0..31 |
 * 64..95), high nibbles 1 | 3; qs[64..127] the same for 4..7; xv holds the
 * activations in that order (qk_tile). Q5_K (five): each value's fifth
 * bit, sub-block s's being bit s of qh[column % 32] (FORMAT.md 4), from
 * hv (the 32 qh bytes in both 256-bit halves) shifted per half by the
 * half's sub-block; values to 31 keep maddubs' pair sums exact
 * (2 * 31 * 127). */
BLOCK512 __m512i qk_vals(const int five, __m512i nib, __m512i hv, int a, int b)
{
    if (!five)
        return nib;
    const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16((short)a), _mm256_set1_epi16((short)b), 1);
    return _mm512_or_si512(nib, _mm512_slli_epi16(
        _mm512_and_si512(_mm512_srlv_epi16(hv, sh), _mm512_set1_epi8(1)), 4));
}

BLOCK512 __m512i qk_row(const int five, const uint8_t *q, const uint8_t *qh, __m512i br,
                        const __m512i xv[4])
{
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i q0 = _mm512_loadu_si512((const void *)q);
    const __m512i q1 = _mm512_loadu_si512((const void *)(q + 64));
    const __m512i hv = q5k_qh(five, qh);
    __m512i acc = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                      _mm512_maddubs_epi16(qk_vals(five, _mm512_and_si512(q0, m4), hv, 0, 2), xv[0]),
                                      _mm512_shuffle_epi8(br, pick16x2(0, 2)));
    acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(
                                  qk_vals(five, _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4), hv, 1, 3), xv[1]),
                              _mm512_shuffle_epi8(br, pick16x2(1, 3)));
    acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(qk_vals(five, _mm512_and_si512(q1, m4), hv, 4, 6), xv[2]),
                              _mm512_shuffle_epi8(br, pick16x2(4, 6)));
    return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(
                                   qk_vals(five, _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4), hv, 5, 7), xv[3]),
                               _mm512_shuffle_epi8(br, pick16x2(5, 7)));
}

/* Lane r = y of row w[r] for one token, rows w[0..7] of nb Q4_K (five:
 * Q5_K) blocks. Per block: acc += xs * (d * float(isum) - dmin *
 * float(msum)), 8 rows in lanes. With `prefetch`, each row's stream
 * CLB_STREAM_PFB bytes on. */
BLOCK512 __m256 qk_tile(const int five, const uint8_t *const w[ZB_R], const int8_t *xq,
                        const float *xs, const int16_t *xb, uint32_t nb, int prefetch)
{
    const uint32_t bytes = five ? CLB_Q5_K_BYTES : CLB_Q4_K_BYTES;
    const unsigned dt = five ? COLIBRI_DTYPE_Q5_K : COLIBRI_DTYPE_Q4_K;
    __m256 acc = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        const size_t o = (size_t)b * bytes;
        if (prefetch)
            zb_prefetch_rows(w, o + CLB_STREAM_PFB, bytes);
        const int8_t *x = xq + (size_t)b * CLB_QK_COLS;
        const __m512i x0 = _mm512_loadu_si512((const void *)x), x1 = _mm512_loadu_si512((const void *)(x + 64));
        const __m512i x2 = _mm512_loadu_si512((const void *)(x + 128)), x3 = _mm512_loadu_si512((const void *)(x + 192));
        /* [x 0..31 | 64..95], [32..63 | 96..127], the same + 128 */
        const __m512i xv[4] = {_mm512_shuffle_i64x2(x0, x1, 0x44), _mm512_shuffle_i64x2(x0, x1, 0xEE),
                               _mm512_shuffle_i64x2(x2, x3, 0x44), _mm512_shuffle_i64x2(x2, x3, 0xEE)};
        /* bsum_j = XB 2j + XB 2j+1, int16 in every lane */
        const __m512i bs = _mm512_broadcast_i32x4(_mm256_cvtepi32_epi16(_mm256_madd_epi16(
            _mm256_loadu_si256((const __m256i *)(const void *)(xb + (size_t)b * 16)), _mm256_set1_epi16(1))));
        const __m512i scm[2] = {q4k_scm4(w, o), q4k_scm4(w + 4, o)};
        __m512i a[ZB_R];
        UNROLL
        for (int r = 0; r < ZB_R; r++)
            a[r] = qk_row(five, w[r] + o + ZB_QS(dt), w[r] + o + CLB_Q5_K_QH, lane_bcast(scm[r / 4], r % 4), xv);
        const __m256i isum = rowsums8(a);
        const __m512i m0 = q4k_msum4(scm[0], bs), m1 = q4k_msum4(scm[1], bs);
        const __m256i msum = _mm512_castsi512_si256(_mm512_permutex2var_epi32(
            m0, _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0), m1));
        const __m512 dm = zb_d_dmin(dt, w, o);
        const __m256 dd = _mm256_mul_ps(_mm512_castps512_ps256(dm), _mm256_cvtepi32_ps(isum));
        const __m256 mm = _mm256_mul_ps(_mm512_extractf32x8_ps(dm, 1), _mm256_cvtepi32_ps(msum));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(xs[b]), _mm256_sub_ps(dd, mm)));
    }
    return acc;
}

/* The Q4_K and Q5_K decode tiles, out of line (also q6k_tile): decode and
 * prefill's odd token share one copy each. */
static TGT512 __attribute__((noinline)) __m256 q4k_tile(const uint8_t *const w[ZB_R], const int8_t *xq,
                                                       const float *xs, const int16_t *xb, uint32_t nb,
                                                       int prefetch)
{
    return qk_tile(0, w, xq, xs, xb, nb, prefetch);
}

static TGT512 __attribute__((noinline)) __m256 q5k_tile(const uint8_t *const w[ZB_R], const int8_t *xq,
                                                       const float *xs, const int16_t *xb, uint32_t nb,
                                                       int prefetch)
{
    return qk_tile(1, w, xq, xs, xb, nb, prefetch);
}

/* Q6_K: a block's scales[16] (i8 at CLB_Q6_K_SC) as int16. */
BLOCK512 __m256i q6k_sc16(const uint8_t *blk)
{
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(blk + CLB_Q6_K_SC)));
}

/* One row's isum of a Q6_K block as 16 int32 lanes. Per half h (128
 * columns): ql[64h .. 64h+63] low nibbles = columns 0..63 of the half (s =
 * 0 | 1), high nibbles 64..127 (s = 2 | 3); qh[32h ..] in both 256-bit
 * halves, shifted so that bits 2s, 2s+1 land on bits 4, 5 (16-bit shifts:
 * 4 | 2 to the left, 0 | 2 to the right; the mask keeps the bits of the
 * same byte). The int16 pair sums of 128-bit lane i are sub-block 8h + i
 * (+ 4), scaled by vpermw from sc. Then - 32 * sum_j sc_j bsum_j, as the
 * int16 pairs (32 sc_j) x (- bsum_j) (nxb), the 32 sc_j zero-extended to 512
 * bits: nxb's upper half, a cast's, is undefined, and only the zeros make
 * those lanes' products 0 (the emulated AVX-512 build found a cast there). */
/* Q6_K, half h of a block (128 columns): the 6-bit weights of its two
 * 64-column vectors (v[0]: sub-blocks 8h + i, v[1]: 8h + 4 + i per 128-bit
 * lane i) and their scales as int16 lanes (c), from the block's scales sc
 * (int16, the low 256 bits). */
BLOCK512 void q6k_half(const uint8_t *blk, int h, __m512i sc, __m512i v[2], __m512i c[2])
{
    const __m512i m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    const __m512i sl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i sr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    /* int16 lane p -> p / 8: the 128-bit lane's sub-block (+ 8h, + 4) */
    const __m512i lane = _mm512_setr_epi32(0, 0, 0, 0, 0x10001, 0x10001, 0x10001, 0x10001, 0x20002, 0x20002,
                                           0x20002, 0x20002, 0x30003, 0x30003, 0x30003, 0x30003);
    const __m512i ql = _mm512_loadu_si512((const void *)(blk + 64 * h));
    const __m512i qh = _mm512_broadcast_i64x4(
        _mm256_loadu_si256((const __m256i *)(const void *)(blk + CLB_Q6_K_QH + 32 * h)));
    /* (A & C) | B: the nibble from A, bits 4, 5 from B */
    v[0] = _mm512_ternarylogic_epi32(ql, _mm512_and_si512(_mm512_sllv_epi16(qh, sl), m30), m4, 0xEC);
    v[1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4),
                                     _mm512_and_si512(_mm512_srlv_epi16(qh, sr), m30), m4, 0xEC);
    c[0] = _mm512_permutexvar_epi16(_mm512_add_epi16(lane, _mm512_set1_epi16((short)(8 * h))), sc);
    c[1] = _mm512_permutexvar_epi16(_mm512_add_epi16(lane, _mm512_set1_epi16((short)(8 * h + 4))), sc);
}

BLOCK512 __m512i q6k_row(const uint8_t *blk, const __m512i xv[4], __m512i nxb)
{
    const __m256i sc16 = q6k_sc16(blk);
    const __m512i sc = _mm512_castsi256_si512(sc16);
    __m512i acc = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(_mm256_slli_epi16(sc16, 5)), nxb);
    UNROLL
    for (int h = 0; h < 2; h++) {
        __m512i v[2], c[2];
        q6k_half(blk, h, sc, v, c);
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(v[0], xv[2 * h]), c[0]);
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(v[1], xv[2 * h + 1]), c[1]);
    }
    return acc;
}

/* Lane r = y of row w[r] for one token, rows w[0..7] of nb Q6_K blocks.
 * Per block: acc += xs * (d * float(isum)), 8 rows in lanes. With
 * `prefetch`, each row's stream CLB_STREAM_PFB bytes on. */
static TGT512 __attribute__((noinline)) __m256 q6k_tile(const uint8_t *const w[ZB_R], const int8_t *xq, const float *xs,
                         const int16_t *xb, uint32_t nb, int prefetch)
{
    enum { BYTES = CLB_Q6_K_BYTES };
    __m256 acc = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        const size_t o = (size_t)b * BYTES;
        if (prefetch)
            zb_prefetch_rows(w, o + CLB_STREAM_PFB, BYTES);
        const int8_t *x = xq + (size_t)b * CLB_QK_COLS;
        const __m512i xv[4] = {_mm512_loadu_si512((const void *)x), _mm512_loadu_si512((const void *)(x + 64)),
                               _mm512_loadu_si512((const void *)(x + 128)),
                               _mm512_loadu_si512((const void *)(x + 192))};
        const __m512i nxb = _mm512_castsi256_si512(_mm256_sub_epi16(
            _mm256_setzero_si256(), _mm256_loadu_si256((const __m256i *)(const void *)(xb + (size_t)b * 16))));
        __m512i a[ZB_R];
        UNROLL
        for (int r = 0; r < ZB_R; r++)
            a[r] = q6k_row(w[r] + o, xv, nxb);
        const __m256i isum = rowsums8(a);
        const __m256 d = _mm512_castps512_ps256(zb_d_dmin(COLIBRI_DTYPE_Q6_K, w, o));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(xs[b]),
                                               _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum))));
    }
    return acc;
}

/* ------------------------------------------------------------------------ */
/* Block types, several tokens (prefill): 8 rows x 4 tokens a tile (the
 * last 2 or 3 tokens of a call 8 x 2, a last odd one the decode tile).
 *
 * The decode tile's integer and float work, with each row's unpacked
 * weights and scales used for four (two) tokens: the weights are unpacked
 * once per four tokens instead of once per token, and the 8 rows' d, dmin
 * and (Q4_K) scales and mins are decoded once per tile. A strip of 8 rows
 * (8 x nb blocks, a few KiB) stays in L1 while every pair of the call
 * passes over it, so the weights come from memory once per call; the
 * first pair runs the decode form's prefetch stream. Per (row, token) the
 * integer results are exact and the float update is ref's, blocks in
 * order, so the bits are ref's (and those of every other tiling).
 *
 * Q4_K's weights here are unpacked to match contiguous activations (the
 * decode form shuffles the activations instead, once per token): chunk j
 * of a block (columns 64j .. 64j + 63) is qs[32j .. 32j + 31] in both
 * 256-bit halves, the low nibbles kept in the low half (sub-block 2j) and
 * the high nibbles shifted down in the high half (sub-block 2j + 1), so
 * each token's 64 activations are one plain load. */

/* Q4_K (Q5_K): chunk j's 64 values of a row as unpacked above, from its
 * qs bytes v (broadcast to both halves) and, for Q5_K (five), the fifth
 * bits from qh (its 32 bytes in both halves): sub-block s's bit 4 is bit s
 * of qh[column % 32] (FORMAT.md 4), so the low half takes bit 2j, the high
 * half bit 2j + 1. Values to 31 keep maddubs' pair sums exact (2 * 31 * 127). */
BLOCK512 __m512i q4k_chunk(const int five, __m512i v, __m512i qh, int j)
{
    const __m512i hi = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    const __m512i w = _mm512_and_si512(_mm512_srlv_epi16(v, hi), _mm512_set1_epi8(15));
    return qk_vals(five, w, qh, 2 * j, 2 * j + 1);
}

/* Q4_K (five: Q5_K, its qh at qh): one row's isum lanes for tokens x0 and
 * x1 (block activations at x0, x1), the row's scales and mins lane
 * broadcast in br. */
BLOCK512 void q4k_row_x2(const int five, const uint8_t *q, const uint8_t *qh, __m512i br,
                         const int8_t *x0, const int8_t *x1, __m512i *a0, __m512i *a1)
{
    const __m512i h5 = q5k_qh(five, qh);
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    UNROLL
    for (int j = 0; j < 4; j++) {
        const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)(q + 32 * j)));
        const __m512i w = q4k_chunk(five, v, h5, j);
        const __m512i sc = _mm512_shuffle_epi8(br, pick16x2(2 * j, 2 * j + 1));
        s0 = _mm512_dpwssd_epi32(s0, _mm512_maddubs_epi16(w, _mm512_loadu_si512((const void *)(x0 + 64 * j))), sc);
        s1 = _mm512_dpwssd_epi32(s1, _mm512_maddubs_epi16(w, _mm512_loadu_si512((const void *)(x1 + 64 * j))), sc);
    }
    *a0 = s0;
    *a1 = s1;
}

/* Q4_K: the exact msum of 8 rows (their scm pair) for one token's block
 * sums xb -> lane r = row r's msum. */
BLOCK512 __m256i q4k_msum8(const __m512i scm[2], const int16_t *xb)
{
    /* bsum_j = XB 2j + XB 2j+1, int16 in every lane */
    const __m512i bs = _mm512_broadcast_i32x4(_mm256_cvtepi32_epi16(_mm256_madd_epi16(
        _mm256_loadu_si256((const __m256i *)(const void *)xb), _mm256_set1_epi16(1))));
    return _mm512_castsi512_si256(_mm512_permutex2var_epi32(
        q4k_msum4(scm[0], bs), _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0),
        q4k_msum4(scm[1], bs)));
}

/* Q6_K: one row's isum lanes for tokens x0 and x1 (q6k_row's work, the
 * unpacked weights and scale vectors shared). */
BLOCK512 void q6k_row_x2(const uint8_t *blk, const int8_t *x0, const int8_t *x1,
                         __m512i nxb0, __m512i nxb1, __m512i *a0, __m512i *a1)
{
    const __m256i sc16 = q6k_sc16(blk);
    const __m512i sc = _mm512_castsi256_si512(sc16);
    const __m512i sc32 = _mm512_zextsi256_si512(_mm256_slli_epi16(sc16, 5));
    __m512i s0 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), sc32, nxb0);
    __m512i s1 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), sc32, nxb1);
    UNROLL
    for (int h = 0; h < 2; h++) {
        __m512i v[2], c[2];
        q6k_half(blk, h, sc, v, c);
        UNROLL
        for (int j = 0; j < 2; j++) {
            s0 = _mm512_dpwssd_epi32(s0, _mm512_maddubs_epi16(v[j], _mm512_loadu_si512((const void *)(x0 + 128 * h + 64 * j))), c[j]);
            s1 = _mm512_dpwssd_epi32(s1, _mm512_maddubs_epi16(v[j], _mm512_loadu_si512((const void *)(x1 + 128 * h + 64 * j))), c[j]);
        }
    }
    *a0 = s0;
    *a1 = s1;
}

/* Y[t, 0 .. 8) and Y[t + 1, 0 .. 8) (y0, y1) for tokens t, t + 1 (their
 * activations xq, xs, xb at index 0 and 1): rows w[0..7] of nb blocks of
 * dtype dt. */
BLOCK512 void zb_tile2(const unsigned dt, float *y0, float *y1, const uint8_t *const w[ZB_R],
                       const int8_t *const xq[2], const float *const xs[2], const int16_t *const xb[2],
                       uint32_t nb, const uint8_t *pf, const uint8_t *pf_end)
{
    const uint32_t bytes = ZB_BYTES(dt);
    const int lines = (int)((ZB_R * bytes + 63) / 64);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        zb_prefetch(pf + (size_t)b * ZB_R * bytes, pf_end, lines);
        const size_t o = (size_t)b * bytes;
        const int8_t *x0 = xq[0] + (size_t)b * CLB_QK_COLS, *x1 = xq[1] + (size_t)b * CLB_QK_COLS;
        const int16_t *b0 = xb[0] + (size_t)b * 16, *b1 = xb[1] + (size_t)b * 16;
        __m512i a0[ZB_R], a1[ZB_R];
        const __m512 dm = zb_d_dmin(dt, w, o); /* [d | dmin (Q6_K: d)] of the 8 rows */
        const __m256 d = _mm512_castps512_ps256(dm);
        if (ZB_AFFINE(dt)) {
            const __m512i scm[2] = {q4k_scm4(w, o), q4k_scm4(w + 4, o)};
            UNROLL
            for (int r = 0; r < ZB_R; r++)
                q4k_row_x2(ZB_FIVE(dt), w[r] + o + ZB_QS(dt), w[r] + o + CLB_Q5_K_QH,
                           lane_bcast(scm[r / 4], r % 4), x0, x1, &a0[r], &a1[r]);
            const __m256 dmin = _mm512_extractf32x8_ps(dm, 1);
            /* acc += xs * (d * float(isum) - dmin * float(msum)) */
            acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(_mm256_set1_ps(xs[0][b]), _mm256_sub_ps(
                _mm256_mul_ps(d, _mm256_cvtepi32_ps(rowsums8(a0))),
                _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(q4k_msum8(scm, b0))))));
            acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(_mm256_set1_ps(xs[1][b]), _mm256_sub_ps(
                _mm256_mul_ps(d, _mm256_cvtepi32_ps(rowsums8(a1))),
                _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(q4k_msum8(scm, b1))))));
        } else {
            const __m512i n0 = _mm512_castsi256_si512(_mm256_sub_epi16(
                _mm256_setzero_si256(), _mm256_loadu_si256((const __m256i *)(const void *)b0)));
            const __m512i n1 = _mm512_castsi256_si512(_mm256_sub_epi16(
                _mm256_setzero_si256(), _mm256_loadu_si256((const __m256i *)(const void *)b1)));
            UNROLL
            for (int r = 0; r < ZB_R; r++)
                q6k_row_x2(w[r] + o, x0, x1, n0, n1, &a0[r], &a1[r]);
            /* acc += xs * (d * float(isum)) */
            acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(_mm256_set1_ps(xs[0][b]),
                                                     _mm256_mul_ps(d, _mm256_cvtepi32_ps(rowsums8(a0)))));
            acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(_mm256_set1_ps(xs[1][b]),
                                                     _mm256_mul_ps(d, _mm256_cvtepi32_ps(rowsums8(a1)))));
        }
    }
    _mm256_storeu_ps(y0, acc0);
    _mm256_storeu_ps(y1, acc1);
}

/* Q4_K (Q5_K), four tokens: the unpacked weights of a row serve four tokens (its
 * unpacking costs as much as two tokens' products: twice q4k_row_x2's
 * tokens for 1.5x its operations), 4 rows x 4 tokens of int32
 * accumulators at a time (16 zmm). One row's isum lanes for tokens x[0..3]. */
BLOCK512 void q4k_row_x4(const int five, const uint8_t *q, const uint8_t *qh, __m512i br,
                         const int8_t *const x[4], __m512i s[4])
{
    const __m512i h5 = q5k_qh(five, qh);
    UNROLL
    for (int t = 0; t < 4; t++)
        s[t] = _mm512_setzero_si512();
    UNROLL
    for (int j = 0; j < 4; j++) {
        const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)(q + 32 * j)));
        const __m512i w = q4k_chunk(five, v, h5, j);
        const __m512i sc = _mm512_shuffle_epi8(br, pick16x2(2 * j, 2 * j + 1));
        UNROLL
        for (int t = 0; t < 4; t++)
            s[t] = _mm512_dpwssd_epi32(s[t], _mm512_maddubs_epi16(w, _mm512_loadu_si512((const void *)(x[t] + 64 * j))), sc);
    }
}

/* Q6_K, four tokens: q6k_row_x2's work for x[0..3] (nxb[t]: token t's
 * negated sums of 16, FORMAT.md's -32 offset). */
BLOCK512 void q6k_row_x4(const uint8_t *blk, const int8_t *const x[4], const __m512i nxb[4],
                         __m512i s[4])
{
    const __m256i sc16 = q6k_sc16(blk);
    const __m512i sc = _mm512_castsi256_si512(sc16);
    const __m512i sc32 = _mm512_zextsi256_si512(_mm256_slli_epi16(sc16, 5));
    UNROLL
    for (int t = 0; t < 4; t++)
        s[t] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), sc32, nxb[t]);
    UNROLL
    for (int h = 0; h < 2; h++) {
        __m512i v[2], c[2];
        q6k_half(blk, h, sc, v, c);
        UNROLL
        for (int j = 0; j < 2; j++)
            UNROLL
            for (int t = 0; t < 4; t++)
                s[t] = _mm512_dpwssd_epi32(s[t], _mm512_maddubs_epi16(
                    v[j], _mm512_loadu_si512((const void *)(x[t] + 128 * h + 64 * j))), c[j]);
    }
}

/* 4 rows' 16-lane int32 accumulators -> lane r of an xmm = the exact sum
 * of a[r]'s lanes. */
BLOCK512 __m128i rowsums4(const __m512i a[4])
{
    const __m512i q = pair64(pair32(a[0], a[1]), pair32(a[2], a[3])); /* [r0..r3] a lane */
    const __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(q), _mm512_extracti64x4_epi64(q, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* Y[t + k, 0 .. 8) (y[k]) for tokens t .. t + 3 of rows w[0..7] of
 * dtype dt (zb_tile2's float update per token, so the same bits). */
BLOCK512 void zb_tile4(const unsigned dt, float *const y[4], const uint8_t *const w[ZB_R],
                       const int8_t *const xq[4], const float *const xs[4],
                       const int16_t *const xb[4], uint32_t nb, const uint8_t *pf,
                       const uint8_t *pf_end)
{
    const uint32_t bytes = ZB_BYTES(dt);
    const int lines = (int)((ZB_R * bytes + 63) / 64);
    __m256 acc[4];
    UNROLL
    for (int t = 0; t < 4; t++)
        acc[t] = _mm256_setzero_ps();
    for (uint32_t b = 0; b < nb; b++) {
        zb_prefetch(pf + (size_t)b * ZB_R * bytes, pf_end, lines);
        const size_t o = (size_t)b * bytes;
        const int8_t *x[4];
        const int16_t *xbb[4];
        __m512i nxb[4];
        UNROLL
        for (int t = 0; t < 4; t++) {
            x[t] = xq[t] + (size_t)b * CLB_QK_COLS;
            xbb[t] = xb[t] + (size_t)b * 16;
            nxb[t] = _mm512_castsi256_si512(_mm256_sub_epi16(
                _mm256_setzero_si256(), _mm256_loadu_si256((const __m256i *)(const void *)xbb[t])));
        }
        const __m512 dm = zb_d_dmin(dt, w, o); /* [d | dmin (Q6_K: d)] of the 8 rows */
        const __m512i scm[2] = {q4k_scm4(w, o), q4k_scm4(w + 4, o)}; /* Q4_K, Q5_K only */
        __m128i isum[2][4]; /* [rows 0-3 | 4-7][token] */
        UNROLL
        for (int h = 0; h < 2; h++) {
            __m512i a[4][4]; /* [token][row] */
            UNROLL
            for (int r = 0; r < 4; r++) {
                __m512i sr[4];
                if (ZB_AFFINE(dt))
                    q4k_row_x4(ZB_FIVE(dt), w[4 * h + r] + o + ZB_QS(dt), w[4 * h + r] + o + CLB_Q5_K_QH,
                               lane_bcast(scm[h], r), x, sr);
                else
                    q6k_row_x4(w[4 * h + r] + o, x, nxb, sr);
                UNROLL
                for (int t = 0; t < 4; t++)
                    a[t][r] = sr[t];
            }
            UNROLL
            for (int t = 0; t < 4; t++)
                isum[h][t] = rowsums4(a[t]);
        }
        const __m256 d = _mm512_castps512_ps256(dm);
        UNROLL
        for (int t = 0; t < 4; t++) {
            const __m256 fi = _mm256_cvtepi32_ps(
                _mm256_inserti128_si256(_mm256_castsi128_si256(isum[0][t]), isum[1][t], 1));
            if (ZB_AFFINE(dt))
                /* acc += xs * (d * float(isum) - dmin * float(msum)) */
                acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_set1_ps(xs[t][b]), _mm256_sub_ps(
                    _mm256_mul_ps(d, fi),
                    _mm256_mul_ps(_mm512_extractf32x8_ps(dm, 1), _mm256_cvtepi32_ps(q4k_msum8(scm, xbb[t]))))));
            else /* acc += xs * (d * float(isum)) */
                acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_set1_ps(xs[t][b]), _mm256_mul_ps(d, fi)));
        }
    }
    UNROLL
    for (int t = 0; t < 4; t++)
        _mm256_storeu_ps(y[t], acc[t]);
}

/* Q4_0's and Q8_0's decode tiles ("Q4_0 and Q8_0, decode form" below). */
static TGT512 __attribute__((noinline)) __m256 q40_tile(const uint8_t *const w[ZB_R], const int8_t *xq,
                                                       const float *xs, const int16_t *xb, uint32_t nb,
                                                       int prefetch);
static TGT512 __attribute__((noinline)) __m256 q80_tile(const uint8_t *const w[ZB_R], const int8_t *xq,
                                                       const float *xs, const int16_t *xb, uint32_t nb,
                                                       int prefetch);

/* The decode tile of block dtype dt (one token, 8 rows). */
BLOCK512 __m256 zb_tile1(const unsigned dt, const uint8_t *const w[ZB_R], const int8_t *xq,
                         const float *xs, const int16_t *xb, uint32_t nb, int prefetch)
{
    return dt == COLIBRI_DTYPE_Q4_0   ? q40_tile(w, xq, xs, xb, nb, prefetch)
           : dt == COLIBRI_DTYPE_Q8_0 ? q80_tile(w, xq, xs, xb, nb, prefetch)
           : dt == COLIBRI_DTYPE_Q4_K ? q4k_tile(w, xq, xs, xb, nb, prefetch)
           : dt == COLIBRI_DTYPE_Q5_K ? q5k_tile(w, xq, xs, xb, nb, prefetch)
                                      : q6k_tile(w, xq, xs, xb, nb, prefetch);
}

/* Y[n, rows] for block dtype dt (Q4_K, Q5_K or Q6_K), n > 1: strips of 8
 * rows, token quads and pairs over each strip, a last odd token by the
 * decode tile; the strip's first tile streams the bytes from ZB_PF_AHEAD past the
 * next strip on. Returns the rows done (whole strips; the caller takes the
 * rest). */
BLOCK512 uint32_t zb_strips(const unsigned dt, float *Y, const uint8_t *W, const int8_t *XQ,
                             const float *XS, const int16_t *XB, uint32_t n, uint32_t rows,
                             uint32_t cols)
{
    const uint32_t bytes = ZB_BYTES(dt);
    const uint32_t nb = (cols + CLB_QK_COLS - 1) / CLB_QK_COLS;
    const size_t row_bytes = (size_t)nb * bytes, tile = ZB_R * row_bytes;
    const size_t xq_stride = (size_t)nb * CLB_QK_COLS, xb_stride = (size_t)nb * 16;
    const uint32_t tiles = rows / ZB_R;
    const uint8_t *end = W + (size_t)tiles * tile;
    zb_prefetch_start(W, tile + ZB_PF_AHEAD < (size_t)tiles * tile ? tile + ZB_PF_AHEAD : (size_t)tiles * tile);
    for (uint32_t s = 0; s < tiles; s++) {
        const uint8_t *w[ZB_R];
        UNROLL
        for (int r = 0; r < ZB_R; r++)
            w[r] = W + (size_t)s * tile + (size_t)r * row_bytes;
        const uint8_t *pf = W + (size_t)(s + 1) * tile + ZB_PF_AHEAD;
        uint32_t t = 0;
        for (; t + 4 <= n; t += 4) {
            const int8_t *xq[4];
            const float *xs[4];
            const int16_t *xb[4];
            float *y[4];
            UNROLL
            for (int k = 0; k < 4; k++) {
                xq[k] = XQ + (size_t)(t + (uint32_t)k) * xq_stride;
                xs[k] = XS + (size_t)(t + (uint32_t)k) * nb;
                xb[k] = XB + (size_t)(t + (uint32_t)k) * xb_stride;
                y[k] = Y + (size_t)(t + (uint32_t)k) * rows + (size_t)s * ZB_R;
            }
            zb_tile4(dt, y, w, xq, xs, xb, nb, t == 0 ? pf : end, end);
        }
        for (; t + 2 <= n; t += 2) {
            const int8_t *xq[2] = {XQ + t * xq_stride, XQ + (t + 1) * xq_stride};
            const float *xs[2] = {XS + (size_t)t * nb, XS + (size_t)(t + 1) * nb};
            const int16_t *xb[2] = {XB + t * xb_stride, XB + (t + 1) * xb_stride};
            zb_tile2(dt, Y + (size_t)t * rows + (size_t)s * ZB_R, Y + (size_t)(t + 1) * rows + (size_t)s * ZB_R,
                     w, xq, xs, xb, nb, t == 0 ? pf : end, end);
        }
        if (t < n) /* the strip is in L1 by now: no prefetch */
            _mm256_storeu_ps(Y + (size_t)t * rows + (size_t)s * ZB_R,
                             zb_tile1(dt, w, XQ + t * xq_stride, XS + (size_t)t * nb, XB + t * xb_stride, nb, 0));
    }
    return tiles * ZB_R;
}

/* Y[rows] for one token (decode), block dtype dt (Q4_0 or a K type):
 * tile s takes row s of each eighth of the first 8 * (rows / 8) rows
 * (avx2.c's STREAMS), each row's stream prefetched CLB_STREAM_PFB ahead.
 * Returns the rows done. */
BLOCK512 uint32_t zb_decode(const unsigned dt, float *Y, const uint8_t *W, const int8_t *XQ,
                            const float *XS, const int16_t *XB, uint32_t rows, uint32_t cols)
{
    const uint32_t bytes = ZB_BYTES(dt);
    const uint32_t nb = (cols + ZB_COLS(dt) - 1) / ZB_COLS(dt);
    const size_t row_bytes = (size_t)nb * bytes;
    const uint32_t eighth = rows / ZB_R;
    const uint8_t *w[ZB_R];
    UNROLL
    for (int r = 0; r < ZB_R; r++)
        w[r] = W + (size_t)r * eighth * row_bytes;
    if (eighth > 0)
        zb_prefetch_rows(w, 0, CLB_STREAM_PFB);
    for (uint32_t s = 0; s < eighth; s++) {
        const int prefetch = s + 1 < eighth;
        float y[ZB_R];
        _mm256_storeu_ps(y, zb_tile1(dt, w, XQ, XS, XB, nb, prefetch));
        UNROLL
        for (int r = 0; r < ZB_R; r++) {
            Y[s + (uint32_t)r * eighth] = y[r];
            w[r] += row_bytes;
        }
    }
    return eighth * ZB_R;
}

/* A table's block matmul (kernels.h matmul_q4_0 and the like). */
typedef void (*zb_matmul_fn)(float *, const uint8_t *, const int8_t *, const float *,
                             const int16_t *, uint32_t, uint32_t, uint32_t);

/* Y[rows] for one token, block dtype dt: zb_decode's whole strips of 8,
 * the last rows % 8 by `rest` (avx2.c's form of dt). */
BLOCK512 void zb_decode_rows(const unsigned dt, zb_matmul_fn rest, float *Y, const uint8_t *W,
                             const int8_t *XQ, const float *XS, const int16_t *XB, uint32_t rows,
                             uint32_t cols)
{
    const uint32_t done = zb_decode(dt, Y, W, XQ, XS, XB, rows, cols);
    if (done < rows)
        rest(Y + done, W + (size_t)done * ((cols + ZB_COLS(dt) - 1) / ZB_COLS(dt)) * ZB_BYTES(dt),
             XQ, XS, XB, 1, rows - done, cols);
}

/* ------------------------------------------------------------------------ */
/* Q4_0 and Q8_0, decode form (one token).
 *
 * Why: Q4_0 blocks are small (18 bytes: fp16 d, then qs[16]), so the work
 * around each block's 32 products decides the speed; avx2.c's EVEX form
 * loads and reduces a block at a time in ymm halves, and read GGUF Q4_0
 * files at 4.4-4.6 ms a token where the 4-bit mix's Q4_K took 3.5-3.8.
 * Here a tile is 8 rows (one from each eighth of W, avx2.c's STREAMS) x 4
 * consecutive blocks (128 columns, 72 bytes a row):
 * - a row's 4 blocks come in with one 64-byte load at the first block (the
 *   4 d's at words 0, 9, 18, 27; qs from word 1) and one 16-byte load of
 *   its last 16 bytes; one vpermt2w places block k's qs in 128-bit lane k;
 * - low nibbles (columns 0..15 of each block) and high ones (16..31) go
 *   into vpdpbusd against the activations laid out the same way, so lane k
 *   holds block k's 4 partial sums, exact;
 * - the 8 rows reduce by an exact tree to [block k: rows 0..7] int32, then
 *   dot = that - 8 * (block's activation sum, from XB), ref's integer;
 * - the 32 d's of the tile come from the same 64-byte loads (4 vpermt2w,
 *   3 blends, 2 vcvtph2ps, exact);
 * - ref's float update per block in block order, 8 rows in lanes:
 *   acc += float(dot) * (d * xs), unfused.
 * Blocks past the last whole 4 (nb % 4) take the same path from
 * zero-padded copies, only their own lanes added. Rows past the last
 * whole 8 use avx2.c's form; every tiling gives ref's bits.
 *
 * Q8_0 (34 bytes: fp16 d, then 32 signed qs; llama.cpp's Q8_0 files, and
 * --experts q8_0) shares the tile's shape and its float update. A row's
 * 4 blocks are 136 bytes: two blocks' qs (2 x 32 bytes) make one zmm in
 * column order, xor 0x80 makes them vpdpbusd's unsigned operand (q + 128),
 * and the bias is 128 * (the block's activation sum, from XB), taken off
 * as Q4_0's 8 *; the d's come from the row's first and second 64 bytes.
 * avx2.c's tiles (one block at a time in ymm, vpsignb and vpmaddubsw) read
 * 33 GB/s from memory on Zen 5, this tile 42.9 (test_kernels --bench,
 * 1 x 2816 x 1024). */

enum { Q40_K = 4 }; /* blocks a tile */

/* Lane k (128-bit) = block k's qs[16] of the row whose 4 blocks start at a
 * (a = the 64 bytes there, t = its bytes 56..71). Block k's qs are the
 * tile's words 9k + 1 .. 9k + 8; words from 32 on are t's from word 4. */
static const int16_t Q40_QS_IDX[32] = {1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 17,
                                       19, 20, 21, 22, 23, 24, 25, 26, 28, 29, 30, 31, 36, 37, 38, 39};
BLOCK512 __m512i q40_qs(__m512i a, __m512i t)
{
    return _mm512_permutex2var_epi16(a, _mm512_loadu_si512((const void *)Q40_QS_IDX), t);
}

/* Row r's isum lanes: lane k = 4 partial sums of block k (q = 0..15
 * against the signed activations: exact). */
BLOCK512 __m512i q40_row(__m512i qs, __m512i xlo, __m512i xhi)
{
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i lo = _mm512_and_si512(qs, m4), hi = _mm512_and_si512(_mm512_srli_epi16(qs, 4), m4);
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xlo), hi, xhi);
}

/* The 8 rows' d's of the tile's 4 blocks as fp16, word 8k + r = row r's
 * block k (a[r]: row r's 64 bytes from the tile's first block; d of block
 * k is its word 9k). One vpermt2w a pair of rows 2p, 2p + 1 by the same
 * index (word 8k + c <- word 9k of the first row for c even, the second
 * for c odd), kept at words 8k + 2p, 8k + 2p + 1. */
static const int16_t Q40_D_IDX[32] = {0, 32, 0, 32, 0, 32, 0, 32, 9, 41, 9, 41, 9, 41, 9, 41,
                                      18, 50, 18, 50, 18, 50, 18, 50, 27, 59, 27, 59, 27, 59, 27, 59};
BLOCK512 __m512i q40_d16(const __m512i a[ZB_R])
{
    const __m512i idx = _mm512_loadu_si512((const void *)Q40_D_IDX);
    __m512i d = _mm512_permutex2var_epi16(a[0], idx, a[1]);
    UNROLL
    for (int p = 1; p < ZB_R / 2; p++)
        d = _mm512_mask_mov_epi16(d, (__mmask32)(0x03030303u << (2 * p)),
                                  _mm512_permutex2var_epi16(a[2 * p], idx, a[2 * p + 1]));
    return d;
}

/* acc (lane r = row r) plus ref's float update of the first `nk` (1..4)
 * of a tile's 4 blocks: s[r] (128-bit lane k = 4 partial sums of row r's
 * block k, its stored values against the activations), d16 (word 8k + r
 * = row r's block k's fp16 d), xs and xb the blocks' activation scales and
 * 16-column sums; dot = the partials' sum - (1 << zshift) * (the block's
 * activation sum): Q4_0's zero 8, Q8_0's bias 128. */
BLOCK512 __m256 q_0_update(__m256 acc, const __m512i s[ZB_R], __m512i d16, const float *xs,
                           const int16_t *xb, int zshift, uint32_t nk)
{
    /* z0 lane k = block k's [rows 0..3], z1 rows 4..7 */
    const __m512i z0 = pair64(pair32(s[0], s[1]), pair32(s[2], s[3]));
    const __m512i z1 = pair64(pair32(s[4], s[5]), pair32(s[6], s[7]));
    /* the zero times the blocks' activation sums; below [block 2h x 8 | block 2h + 1 x 8] */
    const __m512i sx8 = _mm512_castsi128_si512(_mm_sll_epi32(
        _mm_madd_epi16(_mm_loadu_si128((const __m128i *)(const void *)xb), _mm_set1_epi16(1)),
        _mm_cvtsi32_si128(zshift)));
    const __m512 xs4 = _mm512_castps128_ps512(_mm_loadu_ps(xs));
    __m512 f[2];
    UNROLL
    for (int h = 0; h < 2; h++) {
        const __m512i ih = h ? _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3)
                             : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        /* [block 2h: rows 0..7 | block 2h + 1: rows 0..7] */
        const __m512i dot = _mm512_sub_epi32(
            _mm512_permutex2var_epi64(z0, h ? _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15)
                                            : _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), z1),
            _mm512_permutexvar_epi32(ih, sx8));
        const __m512 d = _mm512_cvtph_ps(h ? _mm512_extracti64x4_epi64(d16, 1) : _mm512_castsi512_si256(d16));
        f[h] = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_permutexvar_ps(ih, xs4)));
    }
    /* ref's order: block by block, only the tile's own */
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(f[0]));
    if (nk > 1)
        acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps(f[0], 1));
    if (nk > 2)
        acc = _mm256_add_ps(acc, _mm512_castps512_ps256(f[1]));
    if (nk > 3)
        acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps(f[1], 1));
    return acc;
}

/* acc (lane r = row r) plus the first `nk` (1..4) of the 4 Q4_0 blocks at
 * o of rows w[0..7], against the token's x (their 128 activations), xs and
 * xb (the blocks' scales and 16-column sums). Reads all 4 blocks: the
 * caller passes a short tile in zero-padded copies (q_0_tile). */
BLOCK512 __m256 q40_quad(__m256 acc, const uint8_t *const w[ZB_R], size_t o, const int8_t *x,
                         const float *xs, const int16_t *xb, uint32_t nk)
{
    const __m512i x0 = _mm512_loadu_si512((const void *)x), x1 = _mm512_loadu_si512((const void *)(x + 64));
    /* [x of block k, columns 0..15] and [16..31] in lane k */
    const __m512i xlo = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i xhi = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(3, 1, 3, 1));
    __m512i a[ZB_R], s[ZB_R];
    UNROLL
    for (int r = 0; r < ZB_R; r++) {
        a[r] = _mm512_loadu_si512((const void *)(w[r] + o));
        const __m512i t = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)(w[r] + o + 56)));
        s[r] = q40_row(q40_qs(a[r], t), xlo, xhi);
    }
    return q_0_update(acc, s, q40_d16(a), xs, xb, 3, nk);
}

/* Q8_0's d's as q40_d16 lays them out (word 8k + r = row r's block k),
 * from each row's first 64 bytes a[r] (blocks 0 and 1: d at words 0 and
 * 17) and its next 64 b[r] (blocks 2 and 3: words 2 and 19 there). Per
 * pair of rows 2p, 2p + 1 one vpermt2w of each (c even: the first row,
 * odd: the second), merged at words 8k + 2p, 8k + 2p + 1. */
static const int16_t Q80_DA_IDX[32] = {0, 32, 0, 32, 0, 32, 0, 32, 17, 49, 17, 49, 17, 49, 17, 49,
                                       0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
static const int16_t Q80_DB_IDX[32] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                       2, 34, 2, 34, 2, 34, 2, 34, 19, 51, 19, 51, 19, 51, 19, 51};
BLOCK512 __m512i q80_d16(const __m512i a[ZB_R], const __m512i b[ZB_R])
{
    const __m512i ia = _mm512_loadu_si512((const void *)Q80_DA_IDX);
    const __m512i ib = _mm512_loadu_si512((const void *)Q80_DB_IDX);
    __m512i d = _mm512_setzero_si512();
    UNROLL
    for (int p = 0; p < ZB_R / 2; p++) {
        const __m512i pair = _mm512_mask_mov_epi16(_mm512_permutex2var_epi16(a[2 * p], ia, a[2 * p + 1]),
                                                   (__mmask32)0xFFFF0000u,
                                                   _mm512_permutex2var_epi16(b[2 * p], ib, b[2 * p + 1]));
        d = _mm512_mask_mov_epi16(d, (__mmask32)(0x03030303u << (2 * p)), pair);
    }
    return d;
}

/* q40_quad for Q8_0: rows w[0..7]'s 4 blocks at o (136 bytes each). */
BLOCK512 __m256 q80_quad(__m256 acc, const uint8_t *const w[ZB_R], size_t o, const int8_t *x,
                         const float *xs, const int16_t *xb, uint32_t nk)
{
    /* the activations of blocks 0, 1 and 2, 3 in column order */
    const __m512i x0 = _mm512_loadu_si512((const void *)x), x1 = _mm512_loadu_si512((const void *)(x + 64));
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512i a[ZB_R], b[ZB_R], s[ZB_R];
    UNROLL
    for (int r = 0; r < ZB_R; r++) {
        const uint8_t *p = w[r] + o;
        a[r] = _mm512_loadu_si512((const void *)p);
        b[r] = _mm512_loadu_si512((const void *)(p + 64));
        /* [qs of block 0 | block 1] and [block 2 | block 3], q + 128 */
        const __m512i q01 = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(p + CLB_Q8_0_QS))),
            _mm256_loadu_si256((const __m256i *)(const void *)(p + CLB_Q8_0_BYTES + CLB_Q8_0_QS)), 1);
        const __m512i q23 = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(
                p + 2 * CLB_Q8_0_BYTES + CLB_Q8_0_QS))),
            _mm256_loadu_si256((const __m256i *)(const void *)(p + 3 * CLB_Q8_0_BYTES + CLB_Q8_0_QS)), 1);
        /* block k's two 128-bit lanes added: lane k = its 4 partial sums */
        s[r] = pair128(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(q01, bias), x0),
                       _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(q23, bias), x1));
    }
    return q_0_update(acc, s, q80_d16(a, b), xs, xb, 7, nk);
}

/* q40_quad or q80_quad (dt Q4_0 or Q8_0). */
BLOCK512 __m256 q_0_quad(const unsigned dt, __m256 acc, const uint8_t *const w[ZB_R], size_t o,
                         const int8_t *x, const float *xs, const int16_t *xb, uint32_t nk)
{
    return dt == COLIBRI_DTYPE_Q8_0 ? q80_quad(acc, w, o, x, xs, xb, nk)
                                    : q40_quad(acc, w, o, x, xs, xb, nk);
}

/* Lane r = y of row w[r] for one token, rows w[0..7] of nb blocks of dt
 * (Q4_0 or Q8_0), 4 blocks a step; the last nb % 4 from zero-padded copies
 * (nothing read past a row). With `prefetch`, each row's stream
 * CLB_STREAM_PFB bytes on. */
BLOCK512 __m256 q_0_tile(const unsigned dt, const uint8_t *const w[ZB_R], const int8_t *xq,
                         const float *xs, const int16_t *xb, uint32_t nb, int prefetch)
{
    enum { TILE = Q40_K * CLB_Q8_0_BYTES }; /* the larger type's */
    const uint32_t bytes = ZB_BYTES(dt);
    __m256 acc = _mm256_setzero_ps();
    uint32_t b = 0;
    for (; b + Q40_K <= nb; b += Q40_K) {
        const size_t o = (size_t)b * bytes;
        if (prefetch)
            zb_prefetch_rows(w, o + CLB_STREAM_PFB, Q40_K * bytes);
        acc = q_0_quad(dt, acc, w, o, xq + (size_t)b * CLB_Q4_0_COLS, xs + b, xb + (size_t)b * 2, Q40_K);
    }
    if (b == nb)
        return acc;
    /* the short last step (a second instance of the quad: one with the
     * copies in the loop was 3-5 % slower) */
    const uint32_t nk = nb - b;
    uint8_t wt[ZB_R][TILE] = {{0}};
    int8_t xt[Q40_K * CLB_Q4_0_COLS] = {0};
    float st[Q40_K] = {0.0f};
    int16_t bt[Q40_K * 2] = {0};
    const uint8_t *wc[ZB_R];
    for (int r = 0; r < ZB_R; r++) {
        memcpy(wt[r], w[r] + (size_t)b * bytes, (size_t)nk * bytes);
        wc[r] = wt[r];
    }
    memcpy(xt, xq + (size_t)b * CLB_Q4_0_COLS, (size_t)nk * CLB_Q4_0_COLS);
    memcpy(st, xs + b, (size_t)nk * sizeof(float));
    memcpy(bt, xb + (size_t)b * 2, (size_t)nk * 2 * sizeof(int16_t));
    return q_0_quad(dt, acc, wc, 0, xt, st, bt, nk);
}

static TGT512 __attribute__((noinline)) __m256 q40_tile(const uint8_t *const w[ZB_R], const int8_t *xq,
                                                       const float *xs, const int16_t *xb, uint32_t nb,
                                                       int prefetch)
{
    return q_0_tile(COLIBRI_DTYPE_Q4_0, w, xq, xs, xb, nb, prefetch);
}

static TGT512 __attribute__((noinline)) __m256 q80_tile(const uint8_t *const w[ZB_R], const int8_t *xq,
                                                       const float *xs, const int16_t *xb, uint32_t nb,
                                                       int prefetch)
{
    return q_0_tile(COLIBRI_DTYPE_Q8_0, w, xq, xs, xb, nb, prefetch);
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

/* Q4_0 / Q5_0 / Q8_0 (dt) from CLB_Q0_GEMM_MIN_N tokens: the GEMM with
 * zg_micro over the padded columns; one token of Q4_0 or Q8_0 by
 * zb_decode_rows (q40_tile, q80_tile); the rest avx2.c's tiles (`tiles`). */
static TGT512 __attribute__((noinline)) void z_matmul_q_0(const unsigned dt, zb_matmul_fn tiles,
                                                          float *Y, const uint8_t *W,
                                                          const int8_t *XQ, const float *XS,
                                                          const int16_t *XB, uint32_t n,
                                                          uint32_t rows, uint32_t cols)
{
    if (n >= CLB_Q0_GEMM_MIN_N)
        clb_avx2_i8_gemm(zg_micro, dt, W, NULL, Y, XQ, XS, n, rows,
                         (cols + CLB_Q4_0_COLS - 1) / CLB_Q4_0_COLS * CLB_Q4_0_COLS, CLB_Q4_0_COLS);
    else if (n == 1 && dt != COLIBRI_DTYPE_Q5_0)
        zb_decode_rows(dt, tiles, Y, W, XQ, XS, XB, rows, cols);
    else
        tiles(Y, W, XQ, XS, XB, n, rows, cols);
}

TGT512 static void z_matmul_q4_0(float *Y, const uint8_t *W, const int8_t *XQ, const float *XS,
                                 const int16_t *XB, uint32_t n, uint32_t rows, uint32_t cols)
{
    z_matmul_q_0(COLIBRI_DTYPE_Q4_0, base()->matmul_q4_0, Y, W, XQ, XS, XB, n, rows, cols);
}

TGT512 static void z_matmul_q5_0(float *Y, const uint8_t *W, const int8_t *XQ, const float *XS,
                                 const int16_t *XB, uint32_t n, uint32_t rows, uint32_t cols)
{
    z_matmul_q_0(COLIBRI_DTYPE_Q5_0, base()->matmul_q5_0, Y, W, XQ, XS, XB, n, rows, cols);
}

TGT512 static void z_matmul_q8_0(float *Y, const uint8_t *W, const int8_t *XQ, const float *XS,
                                 const int16_t *XB, uint32_t n, uint32_t rows, uint32_t cols)
{
    z_matmul_q_0(COLIBRI_DTYPE_Q8_0, base()->matmul_q8_0, Y, W, XQ, XS, XB, n, rows, cols);
}

/* ------------------------------------------------------------------------ */
/* Block types, GEMM form (prefill of Q4_K, Q5_K, Q6_K from CLB_KG_MIN_N tokens).
 *
 * Why: the tiles above unpack a row's block again for every 4 tokens, and
 * llama.cpp's own Q5_K_M / Q6_K files prefilled 1.0-1.35x faster there
 * (a VNNI GEMM over unpacked K blocks; FINDINGS.md 24). Here a strip of
 * 16 rows x CLB_KG_KB blocks is unpacked once, laid out as the int8 GEMM's
 * (x86_gemm.h: a column quad of the 16 rows is one zmm), and every token
 * of the call runs over it.
 *
 * The integers are ref's, exactly (kernels.h, FORMAT.md 5): the stored
 * values are unsigned (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63), vpdpbusd's
 * unsigned operand, against the signed activations, so no bias. Per
 * sub-block (32 columns; Q6_K 16) dot_j in int32, isum += sc_j * dot_j
 * (vpmulld by the 16 rows' scales). The per-16-column activation sums XB
 * give the rest in one more exact sum, corr = sum_s c_s XB_s (vpdpwssd,
 * int16 pairs): Q4_K / Q5_K's msum (c_s = m of s's sub-block), and for
 * Q6_K, whose values are q - 32, isum - 32 * corr (c_s = sc_s). Then ref's
 * float operations for the block in ref's order, 16 rows in lanes:
 *   Q4_K / Q5_K  acc += xs * (d * float(isum) - dmin * float(msum))
 *   Q6_K         acc += xs * (d * float(isum))
 * and Y is reloaded at the next chunk, so every split of rows or tokens
 * gives ref's bits.
 */

/* From CLB_KG_MIN_N tokens (x86_gemm.h) the GEMM runs. test_kernels
 * --bench, n x 2816 x 1024 from memory, on a Xeon, ms, tiles -> GEMM: at 8
 * tokens level (Q6_K 0.25-0.26 -> 0.25-0.31); at 12 Q4_K 0.35-0.38 ->
 * 0.28-0.30, Q5_K 0.44-0.45 -> 0.31-0.34, Q6_K 0.39-0.41 -> 0.36-0.39; at
 * 32 1.2-2.0x, at 128 1.6-2.3x (FINDINGS.md 25). */

typedef clb_kg_pack zk_pack;

/* The 64 stored values of columns 64g .. 64g + 63 of block blk (dt), as
 * unsigned bytes in column order (x86_gemm.h's unpack, in one zmm). */
BLOCK512 __m512i zk_unpack64(const unsigned dt, const uint8_t *blk, int g)
{
    __m256i lo, hi;
    clb_kg_unpack64(dt, blk, g, &lo, &hi);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* 16 x 16 transpose of int32 elements: v[i] holds row i; afterwards v[q]
 * holds element q of rows 0..15. */
BLOCK512 void zk_transpose16(__m512i v[16])
{
    __m512i t[16];
    UNROLL
    for (int i = 0; i < 16; i += 2) { /* per 128-bit lane: e0 e0' e1 e1' | e2 e2' e3 e3' */
        t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    UNROLL
    for (int i = 0; i < 16; i += 4) { /* v[i + k], lane L: element 4L + k of rows i .. i + 3 */
        v[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        v[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        v[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        v[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    UNROLL
    for (int k = 0; k < 4; k++) {
        const __m512i a = _mm512_shuffle_i32x4(v[k], v[4 + k], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i b = _mm512_shuffle_i32x4(v[k], v[4 + k], _MM_SHUFFLE(3, 1, 3, 1));
        const __m512i c = _mm512_shuffle_i32x4(v[8 + k], v[12 + k], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i d = _mm512_shuffle_i32x4(v[8 + k], v[12 + k], _MM_SHUFFLE(3, 1, 3, 1));
        t[k] = _mm512_shuffle_i32x4(a, c, _MM_SHUFFLE(2, 0, 2, 0));      /* lane 0: elements k */
        t[4 + k] = _mm512_shuffle_i32x4(b, d, _MM_SHUFFLE(2, 0, 2, 0));  /* 4 + k */
        t[8 + k] = _mm512_shuffle_i32x4(a, c, _MM_SHUFFLE(3, 1, 3, 1));  /* 8 + k */
        t[12 + k] = _mm512_shuffle_i32x4(b, d, _MM_SHUFFLE(3, 1, 3, 1)); /* 12 + k */
    }
    UNROLL
    for (int i = 0; i < 16; i++)
        v[i] = t[i];
}

/* Element k (0..3) of each 128-bit lane of z[0..3] (16 rows: z[a]'s lane
 * i is row 4a + i) -> lane r = row r's. */
BLOCK512 __m512i zk_rows16(const __m512i z[4], int k)
{
    const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28),
                                         _mm512_set1_epi32(k));
    return _mm512_shuffle_i64x2(_mm512_permutex2var_epi32(z[0], idx, z[1]),
                                _mm512_permutex2var_epi32(z[2], idx, z[3]), _MM_SHUFFLE(1, 0, 1, 0));
}

/* Byte k (0..3) of each int32 lane, zero- (sign = 0) or sign-extended. */
BLOCK512 __m512i zk_byte(__m512i v, int k, int sign)
{
    const __m512i up = _mm512_slli_epi32(v, 24 - 8 * k);
    return sign ? _mm512_srai_epi32(up, 24) : _mm512_srli_epi32(up, 24);
}


/* p's block bl <- block b of rows r0 .. r0 + nr (rows of row_bytes): the
 * values by zk_unpack64 and zk_transpose16, the scales decoded 4 rows a
 * vector (q4k_scm4; Q6_K's 16 bytes as they are) and turned into 16-row
 * vectors by zk_rows16, d and dmin by zb_d_dmin. One instance a type
 * (zk_pack_block), its 16 rows' unpack unrolled (their loads in flight
 * together) and the four 64-column groups a loop. Prefill 128 of the
 * Q5_K_M import, one thread: 562-578 tokens/s with one copy for the three
 * types and rolled loops (4.2 KiB), 613-646 so (10.6 KiB), 629-633 with
 * the groups unrolled too (26 KiB). */
BLOCK512 void zk_pack_body(const unsigned dt, zk_pack *p, uint32_t bl, const uint8_t *W,
                           size_t row_bytes, uint32_t r0, uint32_t nr, uint32_t b)
{
    const uint8_t *blk[16];
    for (uint32_t i = 0; i < 16; i++)
        blk[i] = i < nr ? W + (size_t)(r0 + i) * row_bytes + (size_t)b * ZB_BYTES(dt) : clb_kg_zero_block;
    _Pragma("GCC unroll 1")
    for (int g = 0; g < 4; g++) {
        __m512i v[16];
        UNROLL
        for (uint32_t i = 0; i < 16; i++)
            v[i] = zk_unpack64(dt, blk[i], g);
        zk_transpose16(v);
        for (int q = 0; q < 16; q++)
            _mm512_store_si512((void *)p->w[bl][16 * g + q], v[q]);
    }
    __m512i z[4];
    for (int a = 0; a < 4; a++) /* Q4_K / Q5_K: [sc0..7 | m0..7] a row; Q6_K: sc[16] */
        z[a] = ZB_AFFINE(dt) ? q4k_scm4(blk + 4 * a, 0) : rows4_16(blk + 4 * a, CLB_Q6_K_SC);
    __m512i v[4];
    UNROLL
    for (int k = 0; k < 4; k++)
        v[k] = zk_rows16(z, k); /* lane r: row r's bytes 4k .. 4k + 3 */
    if (ZB_AFFINE(dt)) {
        for (int j = 0; j < 8; j++) {
            _mm512_store_si512((void *)p->sc[bl][j], zk_byte(v[j / 4], j % 4, 0));
            /* XB 2j, 2j + 1 (sub-block j) both by m_j */
            _mm512_store_si512((void *)p->cp[bl][j], _mm512_mullo_epi32(zk_byte(v[2 + j / 4], j % 4, 0),
                                                                        _mm512_set1_epi32(0x10001)));
        }
    } else {
        for (int j = 0; j < 16; j++)
            _mm512_store_si512((void *)p->sc[bl][j], zk_byte(v[j / 4], j % 4, 1));
        for (int k = 0; k < 8; k++) /* (sc 2k, sc 2k + 1) as int16 */
            _mm512_store_si512((void *)p->cp[bl][k], _mm512_or_si512(
                _mm512_and_si512(zk_byte(v[k / 2], 2 * (k % 2), 1), _mm512_set1_epi32(0xFFFF)),
                _mm512_slli_epi32(zk_byte(v[k / 2], 2 * (k % 2) + 1, 1), 16)));
    }
    /* [d rows 0-7 | dmin or d] and the same for rows 8-15 */
    const __m512 lo = zb_d_dmin(dt, blk, 0), hi = zb_d_dmin(dt, blk + 8, 0);
    _mm512_store_ps(p->d[bl], _mm512_shuffle_f32x4(lo, hi, _MM_SHUFFLE(1, 0, 1, 0)));
    _mm512_store_ps(p->dmin[bl], _mm512_shuffle_f32x4(lo, hi, _MM_SHUFFLE(3, 2, 3, 2)));
}

static __attribute__((noinline)) TGT512 void zk_pack_block(const unsigned dt, zk_pack *p, uint32_t bl,
                                                           const uint8_t *W, size_t row_bytes,
                                                           uint32_t r0, uint32_t nr, uint32_t b)
{
    if (dt == COLIBRI_DTYPE_Q4_K)
        zk_pack_body(COLIBRI_DTYPE_Q4_K, p, bl, W, row_bytes, r0, nr, b);
    else if (dt == COLIBRI_DTYPE_Q5_K)
        zk_pack_body(COLIBRI_DTYPE_Q5_K, p, bl, W, row_bytes, r0, nr, b);
    else
        zk_pack_body(COLIBRI_DTYPE_Q6_K, p, bl, W, row_bytes, r0, nr, b);
}

/* Y[t0 + t, r0 .. r0 + nr) for T tokens over the chunk's nbc blocks from
 * block b0, added to Y's running sum when b0 > 0 (see above). */
BLOCK512 void zk_micro_t(const int T, const unsigned dt, float *Y, const zk_pack *p, uint32_t nbc,
                         const int8_t *XQ, const float *XS, const int16_t *XB, uint32_t rows,
                         uint32_t nb, uint32_t r0, uint32_t nr, uint32_t t0, uint32_t b0)
{
    const __mmask16 m = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1u);
    const uint32_t subs = ZB_AFFINE(dt) ? 8u : 16u, quads = 64u / subs;
    const size_t xq_stride = (size_t)nb * CLB_QK_COLS, xb_stride = (size_t)nb * 16;
    __m512 facc[8];
    UNROLL
    for (int t = 0; t < T; t++)
        facc[t] = b0 == 0 ? _mm512_setzero_ps()
                          : _mm512_maskz_loadu_ps(m, Y + (size_t)(t0 + (uint32_t)t) * rows + r0);
    for (uint32_t bl = 0; bl < nbc; bl++) {
        const uint32_t b = b0 + bl;
        const int8_t *x = XQ + (size_t)t0 * xq_stride + (size_t)b * CLB_QK_COLS;
        const int16_t *xb = XB + (size_t)t0 * xb_stride + (size_t)b * 16;
        __m512i isum[8], corr[8];
        UNROLL
        for (int t = 0; t < T; t++)
            isum[t] = corr[t] = _mm512_setzero_si512();
        for (uint32_t j = 0; j < subs; j++) {
            __m512i dot[8];
            UNROLL
            for (int t = 0; t < T; t++)
                dot[t] = _mm512_setzero_si512();
            for (uint32_t q = j * quads; q < (j + 1) * quads; q += 4)
                UNROLL
                for (uint32_t u = 0; u < 4; u++) {
                    const __m512i w = _mm512_load_si512((const void *)p->w[bl][q + u]);
                    UNROLL
                    for (int t = 0; t < T; t++) {
                        int32_t quad;
                        memcpy(&quad, x + (size_t)t * xq_stride + 4 * (q + u), 4);
                        dot[t] = _mm512_dpbusd_epi32(dot[t], w, _mm512_set1_epi32(quad));
                    }
                }
            const __m512i sc = _mm512_load_si512((const void *)p->sc[bl][j]);
            UNROLL
            for (int t = 0; t < T; t++)
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dot[t], sc));
        }
        for (int k = 0; k < 8; k++) {
            const __m512i c = _mm512_load_si512((const void *)p->cp[bl][k]);
            UNROLL
            for (int t = 0; t < T; t++) {
                int32_t pair;
                memcpy(&pair, xb + (size_t)t * xb_stride + 2 * k, 4);
                corr[t] = _mm512_dpwssd_epi32(corr[t], c, _mm512_set1_epi32(pair));
            }
        }
        const __m512 d = _mm512_load_ps(p->d[bl]), dmin = _mm512_load_ps(p->dmin[bl]);
        UNROLL
        for (int t = 0; t < T; t++) {
            const __m512 xs = _mm512_set1_ps(XS[(size_t)(t0 + (uint32_t)t) * nb + b]);
            __m512 f;
            if (ZB_AFFINE(dt))
                f = _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(isum[t])),
                                  _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(corr[t])));
            else
                f = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[t], _mm512_slli_epi32(corr[t], 5))));
            facc[t] = _mm512_add_ps(facc[t], _mm512_mul_ps(xs, f));
        }
    }
    UNROLL
    for (int t = 0; t < T; t++)
        _mm512_mask_storeu_ps(Y + (size_t)(t0 + (uint32_t)t) * rows + r0, m, facc[t]);
}

/* zk_micro_t for T = 8, 4 or 1 tokens, the type a value (one copy of the
 * loop for the three types: avx512.o's size). */
static __attribute__((noinline)) TGT512 void zk_micro(int T, const unsigned dt, float *Y, const zk_pack *p,
                                                      uint32_t nbc, const int8_t *XQ, const float *XS,
                                                      const int16_t *XB, uint32_t rows, uint32_t nb,
                                                      uint32_t r0, uint32_t nr, uint32_t t0, uint32_t b0)
{
    if (T == 8)
        zk_micro_t(8, dt, Y, p, nbc, XQ, XS, XB, rows, nb, r0, nr, t0, b0);
    else if (T == 4)
        zk_micro_t(4, dt, Y, p, nbc, XQ, XS, XB, rows, nb, r0, nr, t0, b0);
    else
        zk_micro_t(1, dt, Y, p, nbc, XQ, XS, XB, rows, nb, r0, nr, t0, b0);
}

/* Tokens a call of the rows past the last whole strip hands avx2.c at a
 * time (its outputs go through a stack buffer: avx2.c's Y has their
 * count as its row stride). */
enum { ZB_TAIL_T = 64 };

/* Y[n, rows] for Q4_K, Q5_K or Q6_K: from CLB_KG_MIN_N tokens the GEMM (all
 * rows); below, whole strips of 8 rows here (decode and prefill forms),
 * the last rows % 8 by avx2.c's form. */
BLOCK512 void zb_matmul(const unsigned dt, float *Y, const uint8_t *W, const int8_t *XQ,
                        const float *XS, const int16_t *XB, uint32_t n, uint32_t rows,
                        uint32_t cols)
{
    if (n >= CLB_KG_MIN_N) {
        clb_avx2_k_gemm(zk_pack_block, zk_micro, dt, Y, W, XQ, XS, XB, n, rows, cols);
        return;
    }
    const colibri_kernels *k = base();
    const zb_matmul_fn mm = dt == COLIBRI_DTYPE_Q4_K ? k->matmul_q4_k
                            : ZB_FIVE(dt)            ? k->matmul_q5_k : k->matmul_q6_k;
    if (n == 1) {
        zb_decode_rows(dt, mm, Y, W, XQ, XS, XB, rows, cols);
        return;
    }
    const uint32_t bytes = ZB_BYTES(dt);
    const uint32_t nb = (cols + CLB_QK_COLS - 1) / CLB_QK_COLS;
    const uint32_t done = zb_strips(dt, Y, W, XQ, XS, XB, n, rows, cols);
    if (done == rows)
        return;
    const uint8_t *wt = W + (size_t)done * nb * bytes;
    const uint32_t left = rows - done; /* < ZB_R */
    float tmp[ZB_TAIL_T * ZB_R];
    for (uint32_t t = 0; t < n; t += ZB_TAIL_T) {
        const uint32_t nt = n - t < ZB_TAIL_T ? n - t : ZB_TAIL_T;
        mm(tmp, wt, XQ + (size_t)t * nb * CLB_QK_COLS, XS + (size_t)t * nb, XB + (size_t)t * nb * 16,
           nt, left, cols);
        for (uint32_t i = 0; i < nt; i++)
            memcpy(Y + (size_t)(t + i) * rows + done, tmp + (size_t)i * left, (size_t)left * sizeof(float));
    }
}

TGT512 static void z_matmul_q4_k(float *Y, const uint8_t *W, const int8_t *XQ, const float *XS,
                                 const int16_t *XB, uint32_t n, uint32_t rows, uint32_t cols)
{
    zb_matmul(COLIBRI_DTYPE_Q4_K, Y, W, XQ, XS, XB, n, rows, cols);
}

TGT512 static void z_matmul_q6_k(float *Y, const uint8_t *W, const int8_t *XQ, const float *XS,
                                 const int16_t *XB, uint32_t n, uint32_t rows, uint32_t cols)
{
    zb_matmul(COLIBRI_DTYPE_Q6_K, Y, W, XQ, XS, XB, n, rows, cols);
}

TGT512 static void z_matmul_q5_k(float *Y, const uint8_t *W, const int8_t *XQ, const float *XS,
                                 const int16_t *XB, uint32_t n, uint32_t rows, uint32_t cols)
{
    zb_matmul(COLIBRI_DTYPE_Q5_K, Y, W, XQ, XS, XB, n, rows, cols);
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
    z_matmul_q5_0,
    z_matmul_q5_k,
    z_matmul_q8_0,
    z_attend,
    z_attend_rows,
    z_silu_mul,
};

const colibri_kernels *colibri_kernels_avx512(void)
{
#ifdef COLIBRI_AVX512_EMULATED
    return &avx512_vnni_kernels;
#endif
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
