/*
 * test_kernels.c - checks every optimised kernel table (avx2, neon,
 * neon-dotprod: whichever this build has and the CPU runs) against the
 * reference kernels (ref.c) on many odd and even shapes, and benchmarks them
 * with --bench.
 *
 * Build (tests/test_kernels.py does this):
 *   cc -std=c11 -O2 -ffp-contract=off -Isrc/kernels
 *      [-DCOLIBRI_USE_AVX2 | -DCOLIBRI_USE_NEON] tests/c/test_kernels.c
 *      src/kernels/ref.c src/kernels/avx2.c src/kernels/avx512.c src/kernels/neon.c
 *      src/kernels/neon_dotprod.c src/kernels/neon_attend.c -lm
 *   With -mavx2 -mfma -mf16c -DCOLIBRI_AVX512_EMULATED -isystem
 *   tests/c/avx512_emulation (and -DCOLIBRI_USE_AVX2), the avx512-vnni table
 *   and avx2's EVEX-VNNI one run on any AVX2 CPU, their AVX-512 intrinsics
 *   emulated (that header says how).
 * Usage:
 *   test_kernels [--require NAME]... [--exact-i8 NAME]...
 *                                     run the checks; exit 1 on any mismatch,
 *                                     or if table NAME is not available.
 *                                     --exact-i8: table NAME promises a
 *                                     matmul_i8 bit-identical to ref's
 *                                     (kernels.h), so it is held to that
 *   test_kernels --bench [FILTER]     time ref against each optimised table
 *                                     (FILTER: a kernel name or shape part)
 *
 * What "agree" means (kernels.h, docs/FORMAT.md 5):
 * - matmul_f32 / matmul_i16: |y - y_ref| <= 1e-5 * sum_c |w*x| (summation
 *   order may differ; the bound scales with the terms, not the result, since
 *   the result may cancel to ~0).
 * - matmul_i8: the same bound over the group terms with random scales; and
 *   with all scales 1 the result must be bit-identical to ref, because then
 *   every partial sum is an integer below 2^24: any inexact integer dot
 *   product (lost bits, int16 saturation) shows as a difference. A table
 *   named with --exact-i8 must be bit-identical to ref with any scales.
 * - quantize_act_i8: XQ and XS bit-identical, including rounding ties,
 *   all-zero groups, subnormal and huge groups.
 * Buffers are allocated at their exact size (so AddressSanitizer sees any
 * over-read), alternately 4-byte misaligned, and the output is checked for
 * writes past its end and for values left unwritten.
 */
/* clock_gettime is POSIX, not C11. */
#define _POSIX_C_SOURCE 200809L

#include "kernels.h"
#include "colibri_format.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------------ */
/* Fixed-seed PRNG (splitmix64): the same cases on every run and target. */

static uint64_t rng_state = 0x5eed0fc011b41ull;

static uint64_t rng_u64(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t rng_below(uint32_t n) { return (uint32_t)(rng_u64() % n); }

/* Uniform in [-1, 1). */
static float rng_sym(void)
{
    return (float)((double)(rng_u64() >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* ------------------------------------------------------------------------ */
/* Buffers: exact-size heap blocks, optionally shifted by one element so the
 * kernels see pointers that are not 8/16/32-byte aligned. */

typedef struct {
    void *base;
    void *p;
} buf;

static buf buf_new(size_t count, size_t esz, int misalign)
{
    buf b;
    b.base = malloc((count + (misalign ? 1 : 0)) * esz);
    if (!b.base) {
        fprintf(stderr, "out of memory (%zu elements)\n", count);
        exit(2);
    }
    b.p = (char *)b.base + (misalign ? esz : 0);
    return b;
}

static void buf_free(buf *b) { free(b->base); }

/* Y buffers get GUARD extra floats after the n*rows outputs, and every float
 * starts as a sentinel NaN pattern: a kernel must overwrite all outputs and
 * none past them. */
enum { GUARD = 16 };
static const uint32_t SENTINEL = 0x7fc0dead;

static void fill_sentinel(float *y, size_t count)
{
    for (size_t i = 0; i < count; i++)
        memcpy(&y[i], &SENTINEL, sizeof(float));
}

static int is_sentinel(float v)
{
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return b == SENTINEL;
}

/* ------------------------------------------------------------------------ */

static long n_checks, n_failures;

/* Tables whose matmul_i8 must equal ref's bit for bit (--exact-i8). */
enum { MAX_EXACT = 4 };
static const char *exact_i8[MAX_EXACT];
static int n_exact_i8;

static int i8_must_be_exact(const colibri_kernels *k)
{
    for (int i = 0; i < n_exact_i8; i++)
        if (strcmp(exact_i8[i], k->name) == 0)
            return 1;
    return 0;
}

#define FAIL(...)                                                         \
    do {                                                                  \
        n_failures++;                                                     \
        if (n_failures <= 20) {                                           \
            fprintf(stderr, "FAIL: " __VA_ARGS__);                        \
            fputc('\n', stderr);                                          \
        }                                                                 \
    } while (0)

/* Guard floats intact, every output written. */
static void check_written(const char *what, const char *kname, const float *y,
                          size_t count)
{
    for (size_t i = 0; i < count; i++)
        if (is_sentinel(y[i])) {
            FAIL("%s %s: output %zu not written", kname, what, i);
            return;
        }
    for (size_t i = count; i < count + GUARD; i++)
        if (!is_sentinel(y[i])) {
            FAIL("%s %s: wrote past the end of Y (element %zu)", kname, what, i);
            return;
        }
}

static const uint32_t COLS[] = {1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 44, 60, 63, 64, 65, 100, 257};
static const uint32_t ROWS[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 65};
/* 8 and 17 reach the many-token paths (AVX2 GEMM form from 8 tokens, in
 * blocks of 16: 17 leaves a 1-token block). */
static const uint32_t NS[] = {1, 2, 3, 5, 8, 17};
/* 33 and 48 straddle the 16/32-column vector steps; 1 and 7 are all tail. */
static const uint32_t GROUPS[] = {1, 7, 16, 32, 33, 48, 64};
#define LEN(a) (sizeof(a) / sizeof((a)[0]))

static uint32_t case_no; /* alternates alignment */

/* ---- matmul_f32 --------------------------------------------------------- */

static void test_matmul_f32(const colibri_kernels *ref, const colibri_kernels *k,
                            uint32_t n, uint32_t rows, uint32_t cols)
{
    int mis = (int)(case_no++ & 1);
    buf W = buf_new((size_t)rows * cols, sizeof(float), mis);
    buf X = buf_new((size_t)n * cols, sizeof(float), !mis);
    buf Yr = buf_new((size_t)n * rows + GUARD, sizeof(float), 0);
    buf Yk = buf_new((size_t)n * rows + GUARD, sizeof(float), mis);
    float *w = W.p, *x = X.p, *yr = Yr.p, *yk = Yk.p;
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        w[i] = rng_sym();
    for (size_t i = 0; i < (size_t)n * cols; i++)
        x[i] = 4.0f * rng_sym();
    fill_sentinel(yr, (size_t)n * rows + GUARD);
    fill_sentinel(yk, (size_t)n * rows + GUARD);
    ref->matmul_f32(yr, w, x, n, rows, cols);
    k->matmul_f32(yk, w, x, n, rows, cols);
    check_written("matmul_f32", k->name, yk, (size_t)n * rows);
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t r = 0; r < rows; r++) {
            double mag = 0;
            for (uint32_t c = 0; c < cols; c++)
                mag += fabs((double)w[(size_t)r * cols + c] * x[(size_t)t * cols + c]);
            float a = yr[(size_t)t * rows + r], b = yk[(size_t)t * rows + r];
            n_checks++;
            if (!(fabs((double)a - b) <= 1e-5 * mag + 1e-30)) {
                FAIL("%s matmul_f32 n=%u rows=%u cols=%u: y[%u,%u] = %.9g, ref %.9g (sum|terms| %.9g)",
                     k->name, n, rows, cols, t, r, b, a, mag);
                goto done;
            }
        }
done:
    buf_free(&W);
    buf_free(&X);
    buf_free(&Yr);
    buf_free(&Yk);
}

/* ---- matmul_i16 --------------------------------------------------------- */

static void test_matmul_i16(const colibri_kernels *ref, const colibri_kernels *k,
                            uint32_t n, uint32_t rows, uint32_t cols)
{
    int mis = (int)(case_no++ & 1);
    buf Q = buf_new((size_t)rows * cols, sizeof(int16_t), mis);
    buf S = buf_new(rows, sizeof(float), !mis);
    buf X = buf_new((size_t)n * cols, sizeof(float), mis);
    buf Yr = buf_new((size_t)n * rows + GUARD, sizeof(float), 0);
    buf Yk = buf_new((size_t)n * rows + GUARD, sizeof(float), !mis);
    int16_t *q = Q.p;
    float *s = S.p, *x = X.p, *yr = Yr.p, *yk = Yk.p;
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        q[i] = (int16_t)(int32_t)(rng_below(65536) - 32768); /* -32768 too */
    for (uint32_t r = 0; r < rows; r++)
        s[r] = (1.0f + rng_sym()) / 32767.0f;
    for (size_t i = 0; i < (size_t)n * cols; i++)
        x[i] = rng_sym();
    fill_sentinel(yr, (size_t)n * rows + GUARD);
    fill_sentinel(yk, (size_t)n * rows + GUARD);
    ref->matmul_i16(yr, q, s, x, n, rows, cols);
    k->matmul_i16(yk, q, s, x, n, rows, cols);
    check_written("matmul_i16", k->name, yk, (size_t)n * rows);
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t r = 0; r < rows; r++) {
            double mag = 0;
            for (uint32_t c = 0; c < cols; c++)
                mag += fabs((double)q[(size_t)r * cols + c] * x[(size_t)t * cols + c]);
            mag *= s[r];
            float a = yr[(size_t)t * rows + r], b = yk[(size_t)t * rows + r];
            n_checks++;
            if (!(fabs((double)a - b) <= 1e-5 * mag + 1e-30)) {
                FAIL("%s matmul_i16 n=%u rows=%u cols=%u: y[%u,%u] = %.9g, ref %.9g",
                     k->name, n, rows, cols, t, r, b, a);
                goto done;
            }
        }
done:
    buf_free(&Q);
    buf_free(&S);
    buf_free(&X);
    buf_free(&Yr);
    buf_free(&Yk);
}

/* ---- quantize_act_i8 ---------------------------------------------------- */

/* Fill one group of x with one of several kinds of content. */
static void fill_group(float *x, uint32_t len, int kind)
{
    switch (kind) {
    case 0: /* plain random, magnitude varies per group */
    default: {
        float m = ldexpf(1.0f, (int)rng_below(20) - 10);
        for (uint32_t i = 0; i < len; i++)
            x[i] = m * rng_sym();
        break;
    }
    case 1: /* all zero (and -0) */
        for (uint32_t i = 0; i < len; i++)
            x[i] = (i & 1) ? -0.0f : 0.0f;
        break;
    case 2: /* ties: amax 127 makes inv exactly 1, so k + 0.5 is a tie that
               rint must send to the even neighbour */
        for (uint32_t i = 0; i < len; i++)
            x[i] = (float)((int32_t)rng_below(253) - 126) + 0.5f;
        x[rng_below(len)] = (rng_u64() & 1) ? 127.0f : -127.0f;
        break;
    case 3: /* ties after scaling by a power of two: amax 254 -> inv 0.5 */
        for (uint32_t i = 0; i < len; i++)
            x[i] = (float)(2 * ((int32_t)rng_below(253) - 126) + 1);
        x[rng_below(len)] = -254.0f;
        break;
    case 4: /* subnormal and tiny values, amax below 2^-118 */
        for (uint32_t i = 0; i < len; i++)
            x[i] = ldexpf(rng_sym(), -120 - (int)rng_below(20));
        break;
    case 5: /* tiny but normal amax (inv near its largest) with subnormals */
        for (uint32_t i = 0; i < len; i++)
            x[i] = ldexpf(rng_sym(), -130);
        x[rng_below(len)] = ldexpf(1.0f, -117);
        break;
    case 6: /* huge finite values */
        for (uint32_t i = 0; i < len; i++)
            x[i] = 3.0e38f * rng_sym();
        break;
    case 7: /* one big outlier: the rest quantises to small integers */
        for (uint32_t i = 0; i < len; i++)
            x[i] = rng_sym();
        x[rng_below(len)] = 1000.0f;
        break;
    }
}

static void test_quantize(const colibri_kernels *ref, const colibri_kernels *k,
                          uint32_t n, uint32_t cols, uint32_t group)
{
    int mis = (int)(case_no++ & 1);
    uint32_t ng = (cols + group - 1) / group;
    buf X = buf_new((size_t)n * cols, sizeof(float), mis);
    buf QR = buf_new((size_t)n * cols, 1, 0);
    buf QK = buf_new((size_t)n * cols, 1, mis);
    buf SR = buf_new((size_t)n * ng + GUARD, sizeof(float), 0);
    buf SK = buf_new((size_t)n * ng + GUARD, sizeof(float), !mis);
    float *x = X.p, *sr = SR.p, *sk = SK.p;
    int8_t *qr = QR.p, *qk = QK.p;
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t g = 0; g < ng; g++) {
            uint32_t c0 = g * group, len = cols - c0 < group ? cols - c0 : group;
            fill_group(x + (size_t)t * cols + c0, len, (int)rng_below(8));
        }
    memset(qr, 0x55, (size_t)n * cols);
    memset(qk, 0x55, (size_t)n * cols);
    fill_sentinel(sr, (size_t)n * ng + GUARD);
    fill_sentinel(sk, (size_t)n * ng + GUARD);
    ref->quantize_act_i8(qr, sr, x, n, cols, group);
    k->quantize_act_i8(qk, sk, x, n, cols, group);
    check_written("quantize_act_i8 XS", k->name, sk, (size_t)n * ng);
    n_checks++;
    for (size_t i = 0; i < (size_t)n * cols; i++)
        if (qr[i] != qk[i]) {
            FAIL("%s quantize_act_i8 n=%u cols=%u group=%u: xq[%zu] = %d, ref %d (x = %.9g)",
                 k->name, n, cols, group, i, qk[i], qr[i], x[i]);
            goto done;
        }
    if (memcmp(sr, sk, (size_t)n * ng * sizeof(float)) != 0)
        FAIL("%s quantize_act_i8 n=%u cols=%u group=%u: xs differs from ref",
             k->name, n, cols, group);
done:
    buf_free(&X);
    buf_free(&QR);
    buf_free(&QK);
    buf_free(&SR);
    buf_free(&SK);
}

/* ---- matmul_i8 ---------------------------------------------------------- */

/* mode 0: random weights, scales and activations (through ref's quantiser);
 * mode 1: all scales 1, random int8 (weights include -128): bit-exact;
 * mode 2: all scales 1, extreme values only (|q| 127/128, |xq| 127). */
static void test_matmul_i8(const colibri_kernels *ref, const colibri_kernels *k,
                           uint32_t n, uint32_t rows, uint32_t cols,
                           uint32_t group, int mode)
{
    int mis = (int)(case_no++ & 1);
    uint32_t ng = (cols + group - 1) / group;
    buf Q = buf_new((size_t)rows * cols, 1, mis);
    buf S = buf_new((size_t)rows * ng, sizeof(float), !mis);
    buf XQ = buf_new((size_t)n * cols, 1, !mis);
    buf XS = buf_new((size_t)n * ng, sizeof(float), mis);
    buf Yr = buf_new((size_t)n * rows + GUARD, sizeof(float), 0);
    buf Yk = buf_new((size_t)n * rows + GUARD, sizeof(float), mis);
    int8_t *q = Q.p, *xq = XQ.p;
    float *s = S.p, *xs = XS.p, *yr = Yr.p, *yk = Yk.p;
    if (mode == 0) {
        buf X = buf_new((size_t)n * cols, sizeof(float), 0);
        float *x = X.p;
        for (size_t i = 0; i < (size_t)rows * cols; i++)
            q[i] = (int8_t)(int32_t)(rng_below(256) - 128);
        for (size_t i = 0; i < (size_t)rows * ng; i++)
            s[i] = (1.0f + rng_sym()) / 127.0f;
        for (size_t i = 0; i < (size_t)n * cols; i++)
            x[i] = rng_sym();
        ref->quantize_act_i8(xq, xs, x, n, cols, group);
        buf_free(&X);
    } else {
        static const int8_t qext[] = {-128, -127, 127};
        for (size_t i = 0; i < (size_t)rows * cols; i++)
            q[i] = mode == 1 ? (int8_t)(int32_t)(rng_below(256) - 128)
                             : qext[rng_below(3)];
        for (size_t i = 0; i < (size_t)n * cols; i++)
            xq[i] = mode == 1 ? (int8_t)(int32_t)(rng_below(255) - 127)
                              : (int8_t)((rng_u64() & 1) ? 127 : -127);
        for (size_t i = 0; i < (size_t)rows * ng; i++)
            s[i] = 1.0f;
        for (size_t i = 0; i < (size_t)n * ng; i++)
            xs[i] = 1.0f;
    }
    fill_sentinel(yr, (size_t)n * rows + GUARD);
    fill_sentinel(yk, (size_t)n * rows + GUARD);
    ref->matmul_i8(yr, q, s, xq, xs, n, rows, cols, group);
    k->matmul_i8(yk, q, s, xq, xs, n, rows, cols, group);
    check_written("matmul_i8", k->name, yk, (size_t)n * rows);
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t r = 0; r < rows; r++) {
            double mag = 0;
            for (uint32_t g = 0; g < ng; g++) {
                uint32_t c0 = g * group, c1 = cols - c0 < group ? cols : c0 + group;
                int64_t dot = 0;
                for (uint32_t c = c0; c < c1; c++)
                    dot += (int64_t)q[(size_t)r * cols + c] * xq[(size_t)t * cols + c];
                mag += fabs((double)dot * s[(size_t)r * ng + g] * xs[(size_t)t * ng + g]);
            }
            float a = yr[(size_t)t * rows + r], b = yk[(size_t)t * rows + r];
            double tol = mode == 0 && !i8_must_be_exact(k) ? 1e-5 * mag + 1e-30 : 0.0;
            n_checks++;
            if (!(fabs((double)a - b) <= tol)) {
                FAIL("%s matmul_i8 mode %d n=%u rows=%u cols=%u group=%u: y[%u,%u] = %.9g, ref %.9g (sum|terms| %.9g)",
                     k->name, mode, n, rows, cols, group, t, r, b, a, mag);
                goto done;
            }
        }
done:
    buf_free(&Q);
    buf_free(&S);
    buf_free(&XQ);
    buf_free(&XS);
    buf_free(&Yr);
    buf_free(&Yk);
}

/* Tiles (what a multi-threaded caller does): Y computed in one call must
 * equal, bit for bit, Y assembled from calls over token blocks x row blocks
 * (Q, S, Y offset to the block's first row; XQ, XS to its first token), for
 * several tile sizes that put each output element at other positions inside
 * the kernel's register blocks, panels and decode / GEMM forms. Checked for
 * tables whose matmul_i8 is bit-identical to ref (--exact-i8), where it
 * follows, so a failure here points at the tiling rather than the sums. */
static void test_matmul_i8_tiles(const colibri_kernels *k, uint32_t n, uint32_t rows,
                                 uint32_t cols, uint32_t group)
{
    uint32_t ng = (cols + group - 1) / group;
    buf Q = buf_new((size_t)rows * cols, 1, 0);
    buf S = buf_new((size_t)rows * ng, sizeof(float), 1);
    buf X = buf_new((size_t)n * cols, sizeof(float), 0);
    buf XQ = buf_new((size_t)n * cols, 1, 1);
    buf XS = buf_new((size_t)n * ng, sizeof(float), 0);
    buf Y1 = buf_new((size_t)n * rows, sizeof(float), 0);
    buf YT = buf_new((size_t)n * rows, sizeof(float), 1);
    int8_t *q = Q.p, *xq = XQ.p;
    float *s = S.p, *x = X.p, *xs = XS.p, *y1 = Y1.p, *yt = YT.p;
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        q[i] = (int8_t)(int32_t)(rng_below(256) - 128);
    for (size_t i = 0; i < (size_t)rows * ng; i++)
        s[i] = (1.0f + rng_sym()) / 127.0f;
    for (size_t i = 0; i < (size_t)n * cols; i++)
        x[i] = rng_sym();
    k->quantize_act_i8(xq, xs, x, n, cols, group);
    k->matmul_i8(y1, q, s, xq, xs, n, rows, cols, group);
    /* (token block, row block): 1 token (decode form), 3 (below the GEMM
     * threshold), 8 and 16 (GEMM); rows 1, 5, 8, 24, all. */
    static const uint32_t tiles[][2] = {{1, 1}, {1, 5}, {3, 24}, {8, 8}, {16, 5}, {1, 0}, {8, 0}};
    for (size_t i = 0; i < LEN(tiles); i++) {
        const uint32_t tb = tiles[i][0], rb = tiles[i][1] ? tiles[i][1] : rows;
        /* the tile's Y is [nt, nr] contiguous; copied into place */
        buf T = buf_new((size_t)tb * rb, sizeof(float), 0);
        float *ty = T.p;
        for (uint32_t t0 = 0; t0 < n; t0 += tb)
            for (uint32_t r0 = 0; r0 < rows; r0 += rb) {
                const uint32_t nt = n - t0 < tb ? n - t0 : tb;
                const uint32_t nr = rows - r0 < rb ? rows - r0 : rb;
                k->matmul_i8(ty, q + (size_t)r0 * cols, s + (size_t)r0 * ng,
                             xq + (size_t)t0 * cols, xs + (size_t)t0 * ng, nt, nr, cols,
                             group);
                for (uint32_t t = 0; t < nt; t++)
                    memcpy(yt + (size_t)(t0 + t) * rows + r0, ty + (size_t)t * nr,
                           nr * sizeof(float));
            }
        buf_free(&T);
        n_checks++;
        if (memcmp(y1, yt, (size_t)n * rows * sizeof(float)) != 0) {
            size_t e = 0;
            while (memcmp(y1 + e, yt + e, sizeof(float)) == 0)
                e++;
            FAIL("%s matmul_i8 tiles %ux%u of n=%u rows=%u cols=%u group=%u: y[%zu,%zu] = "
                 "%.9g in tiles, %.9g in one call", k->name, tb, rb, n, rows, cols, group,
                 e / rows, e % rows, yt[e], y1[e]);
            break;
        }
    }
    buf_free(&Q);
    buf_free(&S);
    buf_free(&X);
    buf_free(&XQ);
    buf_free(&XS);
    buf_free(&Y1);
    buf_free(&YT);
}

/* ---- block types (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K) -------------------- */
/* kernels.h promises every table's block kernels bit-identical to ref's
 * (FORMAT.md 5: exact integer sums, a fixed float order per element), so
 * XQ/XS/XB and Y are compared bit for bit. Blocks are random bytes with
 * random fp16 scales (zero and subnormal ones included); activations include all-zero
 * blocks and rounding ties. */

static const unsigned BLK_DTYPES[] = {COLIBRI_DTYPE_Q4_0, COLIBRI_DTYPE_Q4_K,
                                      COLIBRI_DTYPE_Q6_K, COLIBRI_DTYPE_Q5_0,
                                      COLIBRI_DTYPE_Q5_K, COLIBRI_DTYPE_Q8_0};
static const uint32_t BLK_COLS[] = {1, 17, 31, 32, 33, 64, 100, 255, 256, 257, 512, 700, 1100};
static const uint32_t BLK_ROWS[] = {1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 65};

typedef void (*blk_matmul_fn)(float *, const uint8_t *, const int8_t *, const float *,
                              const int16_t *, uint32_t, uint32_t, uint32_t);

/* A table's block matmul for dtype. */
static blk_matmul_fn blk_matmul_of(const colibri_kernels *k, unsigned dtype)
{
    return dtype == COLIBRI_DTYPE_Q4_0 ? k->matmul_q4_0
         : dtype == COLIBRI_DTYPE_Q5_0 ? k->matmul_q5_0
         : dtype == COLIBRI_DTYPE_Q8_0 ? k->matmul_q8_0
         : dtype == COLIBRI_DTYPE_Q4_K ? k->matmul_q4_k
         : dtype == COLIBRI_DTYPE_Q5_K ? k->matmul_q5_k : k->matmul_q6_k;
}

/* clb_f16_to_f32 against the compiler's own fp16 type (_Float16 on x86-64
 * and AArch64, __fp16 on ARMv7), for all 65536 bit patterns: zeros,
 * subnormals, normals, infinities (NaN: any NaN). Skipped where the
 * compiler has neither. */
#if defined(__FLT16_MAX__)
__extension__ typedef _Float16 host_f16; /* an ISO/IEC TS 18661-3 type: pedantic asks */
#elif defined(__ARM_FP16_FORMAT_IEEE)
__extension__ typedef __fp16 host_f16;
#endif
static void test_f16_to_f32(void)
{
#if defined(__FLT16_MAX__) || defined(__ARM_FP16_FORMAT_IEEE)
    long checked = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        host_f16 v;
        uint16_t b = (uint16_t)h;
        memcpy(&v, &b, 2);
        float want = (float)v, got = clb_f16_to_f32(b);
        if (want != want ? got == got : memcmp(&want, &got, 4) != 0)
            FAIL("clb_f16_to_f32(0x%04x) = %a, the compiler's fp16 says %a", (unsigned)h,
                 (double)got, (double)want);
        checked++;
    }
    printf("fp16 -> float32: %ld values checked\n", checked);
#else
    printf("fp16 -> float32: skipped (this compiler has no fp16 type)\n");
#endif
}

/* clb_fmaf (kernels.h: the attention's multiply-adds) and its double
 * form against the C library's fmaf, correctly rounded in glibc, bit for
 * bit: random floats of every magnitude, and the cases a double sum
 * rounds wrongly unless it is rounded to odd: c near a rounding boundary of a * b (ties at
 * every depth, either sign), c cancelling a * b's rounded value, results
 * in the subnormal range, zeros, infinities and NaN. clb_fmaf is the
 * instruction where the compiler has one (__FP_FAST_FMAF), else the
 * double form (baseline x86-64, ARMv7 with VFPv3); the double form is
 * tested on every target. */
static float fma_operand(void)
{
    const uint32_t pick = rng_below(32);
    if (pick == 0)
        return 0.0f;
    if (pick == 1)
        return rng_below(2) ? INFINITY : -INFINITY;
    if (pick == 2)
        return NAN;
    if (pick == 3) /* subnormal */
        return ldexpf(rng_sym(), -126 - (int)rng_below(24));
    return ldexpf(rng_sym(), (int)rng_below(80) - 40);
}

/* A float of at most `bits` significant bits, magnitude 2^-20 .. 2^20. */
static float short_operand(int bits)
{
    const float m = (float)(rng_below(1u << (bits - 1)) | 1u << (bits - 1));
    return ldexpf(rng_below(2) ? m : -m, (int)rng_below(40) - 20 - bits);
}

/* A tie below float's normal range, rounded to double: odd A, B < 2^24
 * with A B = 1 mod 2^30, so a * b = A B 2^-180 = j 2^-150 + 2^-180, and
 * c = (4m + 1) 2^-150 - j 2^-150, so a * b + c sits 2^-180 above the tie
 * (4m + 1) 2^-150 between two subnormals; its double sum (top bit 2^-127,
 * last 2^-179) rounds to the tie itself, which then rounds to even, down.
 * 0 where this A's inverse is out of range (then try another). */
static int subnormal_tie(float *a, float *b, float *c)
{
    const uint32_t A = 1u << 23 | rng_below(1u << 22) << 1 | 1u;
    uint32_t inv = A; /* Newton's iteration for 1/A mod 2^32: 3, 6, 12, 24, 48 bits */
    for (int k = 0; k < 4; k++)
        inv *= 2u - A * inv;
    const uint32_t B = inv & ((1u << 30) - 1u);
    if (B < 1u << 23 || B >= 1u << 24)
        return 0;
    const int64_t j = (int64_t)(((uint64_t)A * B - 1u) >> 30);
    const int64_t cn = 4 * (int64_t)((1u << 21) + rng_below(1u << 20)) + 1 - j;
    if (cn & 1)
        return 0;
    const float sign = rng_below(2) ? 1.0f : -1.0f;
    *a = sign * ldexpf((float)A, -90);
    *b = ldexpf((float)B, -90);
    *c = sign * ldexpf((float)cn, -150);
    return 1;
}

static void test_fmaf(void)
{
    long checked = 0;
    for (long i = 0; i < 2000000; i++) {
        float ta, tb, tc;
        if (i % 64 == 0 && subnormal_tie(&ta, &tb, &tc)) {
            const float want = fmaf(ta, tb, tc), got = clb_fmaf_double(ta, tb, tc);
            if (memcmp(&want, &got, 4) != 0)
                FAIL("clb_fmaf_double(%a, %a, %a) = %a, fmaf says %a (a subnormal tie)",
                     (double)ta, (double)tb, (double)tc, (double)got, (double)want);
            checked++;
        }
        const uint32_t kind = rng_below(5);
        /* kind 4: a * b of 25 bits, a float tie half the time, so a c
         * below a double's last bit decides the rounding */
        float a = kind == 4 ? short_operand(12) : fma_operand(),
              b = kind == 4 ? short_operand(13) : fma_operand(), c;
        if (kind == 0) {
            c = fma_operand();
        } else {
            /* the product's rounded value cancelled, a boundary next to
             * it, a bit k places below its last one, or (kind 4) one
             * below a double's last bit */
            const float t = a * b;
            int e = 0;
            (void)frexpf(t, &e);
            c = kind == 1 ? -t
              : kind == 2 ? -t + ldexpf(rng_below(2) ? 1.0f : -1.0f, e - 24 - (int)rng_below(3))
              : kind == 3 ? ldexpf(rng_below(2) ? 1.0f : -1.0f, e - 25 - (int)rng_below(40))
                          : ldexpf(rng_below(2) ? 1.0f : -1.0f, e - 50 - (int)rng_below(40));
        }
        const float want = fmaf(a, b, c), got = clb_fmaf_double(a, b, c), used = clb_fmaf(a, b, c);
        if (want != want ? got == got : memcmp(&want, &got, 4) != 0)
            FAIL("clb_fmaf_double(%a, %a, %a) = %a, fmaf says %a", (double)a, (double)b,
                 (double)c, (double)got, (double)want);
        if (want != want ? used == used : memcmp(&want, &used, 4) != 0)
            FAIL("clb_fmaf(%a, %a, %a) = %a, fmaf says %a", (double)a, (double)b, (double)c,
                 (double)used, (double)want);
        checked++;
    }
    printf("fused multiply-add: %ld cases checked (clb_fmaf is %s here)\n", checked,
#if defined(__FP_FAST_FMAF)
           "the instruction"
#else
           "the double form"
#endif
    );
}

static void fill_blocks(uint8_t *w, unsigned dtype, size_t nblocks)
{
    uint32_t bytes = clb_block_bytes(dtype);
    for (size_t i = 0; i < nblocks * bytes; i++)
        w[i] = (uint8_t)rng_below(256);
    for (size_t b = 0; b < nblocks; b++) {
        uint8_t *blk = w + b * bytes;
        unsigned at, nf = clb_block_scales(dtype, &at);
        for (unsigned f = 0; f < nf; f++) {
            /* fp16 scales, finite as a checked file's: zero (1 in 16),
             * subnormal (1 in 16: every table's conversion must be exact
             * there too), else 2^-10 .. 2^2 with any mantissa and sign */
            unsigned pick = (unsigned)rng_below(16), e = 5 + (unsigned)rng_below(13);
            uint16_t h = (uint16_t)(pick == 0 ? 0
                       : pick == 1 ? 1 + rng_below(1023)
                       : e << 10 | rng_below(1024));
            h = (uint16_t)(h | (rng_below(2) ? 0x8000u : 0u));
            memcpy(blk + at + 2 * f, &h, 2);
        }
    }
}

/* Activations with the awkward cases: an all-zero block, exact ties
 * (k + 0.5 steps of amax/127), and huge values. */
static void fill_blk_act(float *x, size_t count, uint32_t B)
{
    for (size_t i = 0; i < count; i++)
        x[i] = rng_sym() * 4.0f;
    size_t mode = rng_below(4);
    if (mode == 0 && count >= B)
        memset(x, 0, B * sizeof(float));
    else if (mode == 1)
        for (size_t i = 0; i < count; i++)
            x[i] = (float)((int)rng_below(255) - 127) / 2.0f; /* ties at amax 63.5 */
    else if (mode == 2 && count > 3)
        x[count / 2] = 1e30f;
}

/* test_blocks' data: random (fill_blocks, fill_blk_act), or every stored
 * value at its largest (all bits of the values and the Q4_K / Q5_K scales
 * and mins set, the fp16 scales still fill_blocks') against activations
 * all +4 or all -4 (every xq +127 or -127): the integer sums' largest
 * magnitudes, where an int16 run summed too long would wrap (avx2.c's
 * KG_RUN). */
enum { BLK_RANDOM, BLK_EXTREME_POS, BLK_EXTREME_NEG };

static void fill_blocks_extreme(uint8_t *w, unsigned dtype, size_t nblocks, int fill)
{
    const uint32_t bytes = clb_block_bytes(dtype);
    unsigned at, nf = clb_block_scales(dtype, &at);
    /* Q8_0's signed values: -128 (the largest magnitude, |q| 128 in
     * avx2.c's vpsignb form) with +127 activations, +127 (q + 128 = 255
     * in avx512.c's biased form) with -127 */
    const uint8_t v = dtype != COLIBRI_DTYPE_Q8_0 ? 0xFF : fill == BLK_EXTREME_POS ? 0x80 : 0x7F;
    for (size_t b = 0; b < nblocks; b++)
        for (uint32_t i = 0; i < bytes; i++)
            if (i < at || i >= at + 2 * nf)
                w[b * bytes + i] = v;
}

static void test_blocks(const colibri_kernels *ref, const colibri_kernels *k, unsigned dtype,
                        uint32_t n, uint32_t rows, uint32_t cols, int fill)
{
    const uint32_t B = clb_block_cols(dtype), nb = (cols + B - 1) / B;
    const size_t padded = (size_t)nb * B;
    int mis = (int)(case_no++ & 1);
    buf W = buf_new((size_t)rows * nb * clb_block_bytes(dtype), 1, 0);
    buf X = buf_new((size_t)n * cols, sizeof(float), mis);
    buf XQr = buf_new((size_t)n * padded, 1, 0), XQk = buf_new((size_t)n * padded, 1, mis);
    buf XSr = buf_new((size_t)n * nb, sizeof(float), 0);
    buf XSk = buf_new((size_t)n * nb + GUARD, sizeof(float), mis);
    buf XBr = buf_new((size_t)n * padded / 16, 2, 0), XBk = buf_new((size_t)n * padded / 16, 2, mis);
    buf Yr = buf_new((size_t)n * rows, sizeof(float), 0);
    buf Yk = buf_new((size_t)n * rows + GUARD, sizeof(float), mis);
    uint8_t *w = W.p;
    float *x = X.p, *yr = Yr.p, *yk = Yk.p, *xsr = XSr.p, *xsk = XSk.p;
    int8_t *xqr = XQr.p, *xqk = XQk.p;
    int16_t *xbr = XBr.p, *xbk = XBk.p;
    fill_blocks(w, dtype, (size_t)rows * nb);
    fill_blk_act(x, (size_t)n * cols, B);
    if (fill != BLK_RANDOM) {
        fill_blocks_extreme(w, dtype, (size_t)rows * nb, fill);
        for (size_t i = 0; i < (size_t)n * cols; i++)
            x[i] = fill == BLK_EXTREME_POS ? 4.0f : -4.0f;
    }
    fill_sentinel(xsk, (size_t)n * nb + GUARD);
    ref->quantize_act_blk(xqr, xsr, xbr, x, n, cols, B);
    k->quantize_act_blk(xqk, xsk, xbk, x, n, cols, B);
    check_written("quantize_act_blk XS", k->name, xsk, (size_t)n * nb);
    n_checks++;
    if (memcmp(xqr, xqk, (size_t)n * padded) || memcmp(xsr, xsk, (size_t)n * nb * 4) ||
        memcmp(xbr, xbk, (size_t)n * padded / 16 * 2))
        FAIL("%s quantize_act_blk n=%u cols=%u block=%u: XQ, XS or XB differ from ref",
             k->name, n, cols, B);
    fill_sentinel(yk, (size_t)n * rows + GUARD);
    blk_matmul_of(ref, dtype)(yr, w, xqr, xsr, xbr, n, rows, cols);
    blk_matmul_of(k, dtype)(yk, w, xqr, xsr, xbr, n, rows, cols);
    check_written("block matmul", k->name, yk, (size_t)n * rows);
    n_checks++;
    for (size_t i = 0; i < (size_t)n * rows; i++)
        if (memcmp(&yr[i], &yk[i], 4) != 0) {
            FAIL("%s matmul dtype %u n=%u rows=%u cols=%u: y[%zu,%zu] = %.9g, ref %.9g",
                 k->name, dtype, n, rows, cols, i / rows, i % rows, yk[i], yr[i]);
            break;
        }
    buf_free(&W); buf_free(&X); buf_free(&XQr); buf_free(&XQk); buf_free(&XSr);
    buf_free(&XSk); buf_free(&XBr); buf_free(&XBk); buf_free(&Yr); buf_free(&Yk);
}

/* The same product cut into token x row tiles (what threads do) gives the
 * same bits. */
static void test_blocks_tiles(const colibri_kernels *k, unsigned dtype, uint32_t n,
                              uint32_t rows, uint32_t cols)
{
    const uint32_t B = clb_block_cols(dtype), nb = (cols + B - 1) / B;
    const size_t padded = (size_t)nb * B, rb_bytes = (size_t)nb * clb_block_bytes(dtype);
    buf W = buf_new((size_t)rows * rb_bytes, 1, 0);
    buf X = buf_new((size_t)n * cols, sizeof(float), 0);
    buf XQ = buf_new((size_t)n * padded, 1, 0), XS = buf_new((size_t)n * nb, 4, 0);
    buf XB = buf_new((size_t)n * padded / 16, 2, 0);
    buf Y1 = buf_new((size_t)n * rows, 4, 0), YT = buf_new((size_t)n * rows, 4, 0);
    uint8_t *w = W.p;
    float *x = X.p, *xs = XS.p, *y1 = Y1.p, *yt = YT.p;
    int8_t *xq = XQ.p;
    int16_t *xb = XB.p;
    fill_blocks(w, dtype, (size_t)rows * nb);
    fill_blk_act(x, (size_t)n * cols, B);
    k->quantize_act_blk(xq, xs, xb, x, n, cols, B);
#define BLK_CALL(y, W0, T0, nt, nr)                                                        \
    blk_matmul_of(k, dtype)(y, W0, xq + (T0) * padded, xs + (T0) * nb, xb + (T0) * padded / 16, \
                            nt, nr, cols)
    BLK_CALL(y1, w, 0, n, rows);
    static const uint32_t tiles[][2] = {{1, 1}, {1, 5}, {3, 24}, {8, 8}, {16, 5}, {1, 0}, {8, 0}};
    for (size_t i = 0; i < LEN(tiles); i++) {
        const uint32_t tb = tiles[i][0], rb = tiles[i][1] ? tiles[i][1] : rows;
        buf T = buf_new((size_t)tb * rb, sizeof(float), 0);
        float *ty = T.p;
        for (uint32_t t0 = 0; t0 < n; t0 += tb)
            for (uint32_t r0 = 0; r0 < rows; r0 += rb) {
                const uint32_t nt = n - t0 < tb ? n - t0 : tb;
                const uint32_t nr = rows - r0 < rb ? rows - r0 : rb;
                BLK_CALL(ty, w + (size_t)r0 * rb_bytes, (size_t)t0, nt, nr);
                for (uint32_t t = 0; t < nt; t++)
                    memcpy(yt + (size_t)(t0 + t) * rows + r0, ty + (size_t)t * nr,
                           nr * sizeof(float));
            }
        buf_free(&T);
        n_checks++;
        if (memcmp(y1, yt, (size_t)n * rows * sizeof(float)) != 0) {
            FAIL("%s block dtype %u tiles %ux%u of n=%u rows=%u cols=%u differ from one call",
                 k->name, dtype, tb, rb, n, rows, cols);
            break;
        }
    }
#undef BLK_CALL
    buf_free(&W); buf_free(&X); buf_free(&XQ); buf_free(&XS); buf_free(&XB);
    buf_free(&Y1); buf_free(&YT);
}

static void test_table_blocks(const colibri_kernels *ref, const colibri_kernels *k)
{
    for (size_t d = 0; d < LEN(BLK_DTYPES); d++) {
        for (size_t a = 0; a < LEN(NS); a++)
            for (size_t b = 0; b < LEN(BLK_ROWS); b++)
                for (size_t c = 0; c < LEN(BLK_COLS); c++)
                    test_blocks(ref, k, BLK_DTYPES[d], NS[a], BLK_ROWS[b], BLK_COLS[c], BLK_RANDOM);
        test_blocks(ref, k, BLK_DTYPES[d], 40, 97, 2048, BLK_RANDOM);
        /* one token at a model's shape: avx512-vnni's decode tiles over
         * many rows (its prefetch stream) and 11-block rows, plus a tail */
        test_blocks(ref, k, BLK_DTYPES[d], 1, 267, 2816, BLK_RANDOM);
        /* several tokens at that shape (avx512-vnni's prefill strips and
         * their stream), and more tokens than its tail rows take a pass */
        test_blocks(ref, k, BLK_DTYPES[d], 9, 267, 2816, BLK_RANDOM);
        test_blocks(ref, k, BLK_DTYPES[d], 70, 13, 512, BLK_RANDOM);
        /* the largest sums, in every form: decode, tiles, the GEMMs */
        for (int f = BLK_EXTREME_POS; f <= BLK_EXTREME_NEG; f++) {
            test_blocks(ref, k, BLK_DTYPES[d], 1, 19, 512, f);
            test_blocks(ref, k, BLK_DTYPES[d], 5, 19, 512, f);
            test_blocks(ref, k, BLK_DTYPES[d], 24, 19, 512, f);
        }
        test_blocks_tiles(k, BLK_DTYPES[d], 24, 40, 512);
        test_blocks_tiles(k, BLK_DTYPES[d], 17, 33, 300);
    }
}

/* ---- attention (attend) ---------------------------------------------------
 * ref's clb_ref_attend against softmax attention in double precision (it
 * is the truth, so it must be right: relative 1e-5 of sum |p v|), and every
 * table's attend against ref bit for bit (kernels.h). f32 and int8 caches
 * with row strides wider than d, masks with holes and whole masked blocks
 * (and all masked: zeros), scores spread over ~30 so exps underflow, and
 * a position bias (T5's) read forwards and backwards. */
/* A KV cache of n positions for the attention tests: f32 and int8 keys and
 * values with row stride d + 3, scales with stride 2 (wider than a head:
 * the kernels must honour ld and lds), or, with att_dense set, the
 * runtime's head-major layout (ld = d, lds = 1: clb_kv_rows in
 * internal.h); a mask with holes (1), all masked (2) or none (0). */
typedef struct {
    buf KF, VF, K8, V8, KS, VS, M;
    size_t ld, lds;
} att_cache;

static int att_dense;

static att_cache att_cache_new(uint32_t n, uint32_t d, int holes)
{
    const size_t ld = att_dense ? d : (size_t)d + 3, lds = att_dense ? 1 : 2;
    att_cache c;
    c.ld = ld;
    c.lds = lds;
    c.KF = buf_new((size_t)n * ld, sizeof(float), 0);
    c.VF = buf_new((size_t)n * ld, sizeof(float), 1);
    c.K8 = buf_new((size_t)n * ld, 1, 1);
    c.V8 = buf_new((size_t)n * ld, 1, 0);
    c.KS = buf_new((size_t)n * lds, sizeof(float), 0);
    c.VS = buf_new((size_t)n * lds, sizeof(float), 1);
    c.M = buf_new(n, 1, 0);
    float *kf = c.KF.p, *vf = c.VF.p, *ks = c.KS.p, *vs = c.VS.p;
    int8_t *k8 = c.K8.p, *v8 = c.V8.p;
    uint8_t *mask = c.M.p;
    for (size_t i = 0; i < (size_t)n * ld; i++) {
        kf[i] = rng_sym();
        vf[i] = rng_sym();
        k8[i] = (int8_t)(int32_t)(rng_below(255) - 127);
        v8[i] = (int8_t)(int32_t)(rng_below(255) - 127);
    }
    for (size_t i = 0; i < (size_t)n * lds; i++) {
        ks[i] = (0.5f + rng_sym()) / 127.0f;
        vs[i] = (0.5f + rng_sym()) / 127.0f;
    }
    for (uint32_t i = 0; i < n; i++)
        mask[i] = holes == 2 ? 0 : holes ? (uint8_t)(rng_below(3) != 0 && (i / 16) % 3 != 1) : 1;
    return c;
}

/* Arguments over cache c (its f32 or int8 half) for head_dim d, without q and n. */
static clb_att_args att_cache_args(const att_cache *c, uint32_t d, int i8)
{
    clb_att_args a;
    memset(&a, 0, sizeof a);
    if (i8) {
        a.Kq = c->K8.p; a.Vq = c->V8.p; a.Ks = c->KS.p; a.Vs = c->VS.p;
    } else {
        a.K = c->KF.p; a.V = c->VF.p;
    }
    a.mask = c->M.p;
    a.ld = c->ld;
    a.lds = c->lds;
    a.d = d;
    a.scale = 1.0f / sqrtf((float)d);
    return a;
}

static void att_cache_free(att_cache *c)
{
    buf_free(&c->KF); buf_free(&c->VF); buf_free(&c->K8); buf_free(&c->V8);
    buf_free(&c->KS); buf_free(&c->VS); buf_free(&c->M);
}

/* A bias table of n floats spread over ~6 (as large as the scores' spread,
 * so it moves the softmax); the caller reads it forwards or backwards. */
static buf att_bias_new(size_t n)
{
    buf B = buf_new(n, sizeof(float), 0);
    float *b = B.p;
    for (size_t i = 0; i < n; i++)
        b[i] = 6.0f * rng_sym();
    return B;
}

/* bias: 0 none, 1 position i's at B[i], 2 at B[n - 1 - i] (step -1). */
static void test_attend(const colibri_kernels *k, uint32_t n, uint32_t d, int i8, int holes,
                        int bias)
{
    buf Q = buf_new(d, sizeof(float), 1);
    buf O1 = buf_new(d, sizeof(float), 0), O2 = buf_new(d, sizeof(float), 1);
    float *q = Q.p, *o1 = O1.p, *o2 = O2.p;
    for (uint32_t c = 0; c < d; c++)
        q[c] = 4.0f * rng_sym();
    att_cache cache = att_cache_new(n, d, holes);
    const size_t ld = cache.ld, lds = cache.lds;
    buf B = att_bias_new(n);
    const float *kf = cache.KF.p, *vf = cache.VF.p, *ks = cache.KS.p, *vs = cache.VS.p;
    const float *bt = B.p;
    const int8_t *k8 = cache.K8.p, *v8 = cache.V8.p;
    const uint8_t *mask = cache.M.p;
    clb_att_args a = att_cache_args(&cache, d, i8);
    a.q = q;
    a.n = n;
    if (bias) {
        a.bias = bias == 1 ? bt : bt + n - 1;
        a.bias_step = bias == 1 ? 1 : -1;
    }
    clb_ref_attend(o1, &a);
    if (k == NULL) { /* ref against double-precision softmax */
        double mx = -1e300, sum = 0.0;
        double *sc = malloc(sizeof(double) * n);
        for (uint32_t i = 0; i < n; i++) {
            double dot = 0.0;
            for (uint32_t c = 0; c < d; c++)
                dot += (double)q[c] * (i8 ? (double)k8[i * ld + c] * ks[i * lds] : kf[i * ld + c]);
            sc[i] = dot * a.scale + (bias ? bt[bias == 1 ? i : n - 1 - i] : 0.0);
            if (mask[i] && sc[i] > mx)
                mx = sc[i];
        }
        for (uint32_t i = 0; i < n; i++)
            if (mask[i])
                sum += exp(sc[i] - mx);
        for (uint32_t c = 0; c < d; c++) {
            double o = 0.0, mag = 0.0;
            for (uint32_t i = 0; i < n; i++) {
                if (!mask[i])
                    continue;
                double v = i8 ? (double)v8[i * ld + c] * vs[i * lds] : vf[i * ld + c];
                o += exp(sc[i] - mx) / sum * v;
                mag += fabs(exp(sc[i] - mx) / sum * v);
            }
            n_checks++;
            if (!(fabs(o - o1[c]) <= 1e-5 * mag + 1e-30) && !(holes == 2 && o1[c] == 0.0f)) {
                FAIL("ref attend n=%u d=%u i8=%d holes=%d bias=%d: out[%u] = %.9g, softmax %.9g",
                     n, d, i8, holes, bias, c, o1[c], o);
                break;
            }
        }
        free(sc);
    } else if (k->attend) {
        k->attend(o2, &a);
        n_checks++;
        if (memcmp(o1, o2, d * sizeof(float)) != 0) {
            uint32_t c = 0;
            while (memcmp(o1 + c, o2 + c, sizeof(float)) == 0)
                c++;
            FAIL("%s attend n=%u d=%u i8=%d holes=%d bias=%d: out[%u] = %.9g, ref %.9g",
                 k->name, n, d, i8, holes, bias, c, o2[c], o1[c]);
        }
    }
    buf_free(&Q); buf_free(&O1); buf_free(&O2); buf_free(&B);
    att_cache_free(&cache);
}

/* attend_rows (several queries over one KV head's cache: the GQA group's
 * heads of nr rows at positions pos[i]) against one ref attend call per
 * query, bit for bit, with row strides wider than the heads, the output's
 * gaps left as they were, and tiles of queries that reach different
 * blocks (positions first .. first + nr - 1, or every 7th). form: 0
 * causal; 1 every query over all positions (n_all) with T5's encoder bias
 * (head g's table [2 npos - 1], query at p, position j: column
 * npos - 1 - p + j); 2 causal with its decoder bias (table [npos], column
 * p - j: read backwards). The ref calls take the bias row from the tables
 * directly, not through clb_att_rows. */
static void test_attend_rows(const colibri_kernels *k, uint32_t nr, uint32_t nh, uint32_t first,
                             uint32_t d, int i8, int holes, int form)
{
    const uint32_t npos = first + 7 * nr + 1;
    const size_t ldq = (size_t)nh * d + 5;
    buf Q = buf_new(nr * ldq, sizeof(float), 1), O1 = buf_new(nr * ldq, sizeof(float), 0);
    buf O2 = buf_new(nr * ldq, sizeof(float), 1), P = buf_new(nr, sizeof(uint32_t), 0);
    float *q = Q.p, *o1 = O1.p, *o2 = O2.p;
    uint32_t *pos = P.p;
    for (size_t i = 0; i < nr * ldq; i++) {
        q[i] = 4.0f * rng_sym();
        o1[i] = o2[i] = (float)i; /* the gaps must keep these */
    }
    att_cache cache = att_cache_new(npos, d, holes);
    for (uint32_t i = 0; i < nr; i++)
        pos[i] = first + (holes ? 7 * i : i);
    const size_t cols = form == 1 ? 2 * (size_t)npos - 1 : npos;
    buf B = att_bias_new(nh * cols);
    const float *bt = B.p;
    clb_att_args a = att_cache_args(&cache, d, i8);
    a.bias_step = form == 2 ? -1 : 1;
    for (uint32_t i = 0; i < nr; i++)
        for (uint32_t g = 0; g < nh; g++) {
            a.q = q + i * ldq + (size_t)g * d;
            a.n = form == 1 ? npos : pos[i] + 1;
            a.bias = form == 1 ? bt + g * cols + (npos - 1 - pos[i])
                   : form == 2 ? bt + g * cols + pos[i] : NULL;
            clb_ref_attend(o1 + i * ldq + (size_t)g * d, &a);
        }
    clb_att_rows r = {.q = q, .out = o2, .pos = pos, .ldq = ldq, .ldo = ldq, .nr = nr, .nh = nh};
    if (form == 1) {
        r.n_all = npos;
        r.bias = bt + npos - 1;
        r.bias_pos = -1;
    } else if (form == 2) {
        r.bias = bt;
        r.bias_pos = 1;
    }
    r.bias_head = (ptrdiff_t)cols;
    a.bias = q; /* attend_rows must not read a->bias (nor a->q, a->n) */
    k->attend_rows(&r, &a);
    n_checks++;
    if (memcmp(o1, o2, nr * ldq * sizeof(float)) != 0) {
        size_t c = 0;
        while (memcmp(o1 + c, o2 + c, sizeof(float)) == 0)
            c++;
        FAIL("%s attend_rows nr=%u nh=%u first=%u d=%u i8=%d holes=%d form=%d: out[%zu] = %.9g, "
             "ref %.9g", k->name, nr, nh, first, d, i8, holes, form, c, o2[c], o1[c]);
    }
    buf_free(&Q); buf_free(&O1); buf_free(&O2); buf_free(&P); buf_free(&B);
    att_cache_free(&cache);
}

/* Keys holding NaNs (a model gone wrong), one first in a block (ref's max
 * starts from it): a query that reaches one is NaN throughout, as ref's;
 * the others keep ref's bits. (A NaN's payload is not promised: the x86
 * forms and ref differed in it before the vector max.) */
static int same_or_both_nan(const float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(x + i, y + i, sizeof *x) != 0 && !(isnan(x[i]) && isnan(y[i])))
            return 0;
    return 1;
}

static void test_attend_nan(const colibri_kernels *k)
{
    static const uint32_t at[][3] = {{5, 0, 0x7fc00001u}, {21, 3, 0xffc00abcu}, {32, 7, 0x7fc12345u}};
    const uint32_t n = 70, d = 64, nr = 5, nh = 2;
    att_cache cache = att_cache_new(n, d, 0);
    float *kf = cache.KF.p;
    for (size_t i = 0; i < LEN(at); i++) {
        float v;
        memcpy(&v, &at[i][2], sizeof v);
        kf[at[i][0] * cache.ld + at[i][1]] = v;
    }
    const size_t ldq = (size_t)nh * d;
    buf Q = buf_new(nr * ldq, sizeof(float), 1), O1 = buf_new(nr * ldq, sizeof(float), 0);
    buf O2 = buf_new(nr * ldq, sizeof(float), 1), P = buf_new(nr, sizeof(uint32_t), 0);
    float *q = Q.p, *o1 = O1.p, *o2 = O2.p;
    uint32_t *pos = P.p;
    for (size_t i = 0; i < nr * ldq; i++)
        q[i] = 4.0f * rng_sym();
    for (uint32_t i = 0; i < nr; i++)
        pos[i] = 3u + 16u * i; /* before, at and after each NaN */
    clb_att_args a = att_cache_args(&cache, d, 0);
    clb_att_rows r1 = {.q = q, .out = o1, .pos = pos, .ldq = ldq, .ldo = ldq, .nr = nr, .nh = nh};
    clb_att_rows r = r1;
    r.out = o2;
    clb_ref_attend_rows(&r1, &a); /* one ref attend a query (test_attend_all checks it) */
    k->attend_rows(&r, &a);
    n_checks++;
    if (!same_or_both_nan(o1, o2, nr * ldq))
        FAIL("%s attend_rows with NaN keys: not ref's bits", k->name);
    a.q = q + (nr - 1) * ldq;
    a.n = pos[nr - 1] + 1;
    k->attend(o2, &a);
    n_checks++;
    if (!same_or_both_nan(o1 + (nr - 1) * ldq, o2, d))
        FAIL("%s attend with NaN keys: not ref's bits", k->name);
    buf_free(&Q); buf_free(&O1); buf_free(&O2); buf_free(&P);
    att_cache_free(&cache);
}

/* Every attention test in the cache layout att_dense says (the NaN test
 * once: its cache is its own). */
static void test_attend_layout(const colibri_kernels *k)
{
    static const uint32_t AN[] = {1, 2, 15, 16, 17, 33, 100, 300};
    static const uint32_t AD[] = {1, 8, 17, 32, 64, 80, 128};
    for (size_t a = 0; a < LEN(AN); a++)
        for (size_t b = 0; b < LEN(AD); b++)
            for (int i8 = 0; i8 < 2; i8++)
                for (int holes = 0; holes < 3; holes++)
                    for (int bias = 0; bias < (holes == 1 ? 3 : 1); bias++)
                        test_attend(k, AN[a], AD[b], i8, holes, bias);
    if (k == NULL)
        return;
    /* rows x heads: one query, a GQA pair, tiles with a partial last tile,
     * a prefill chunk; first positions inside and across blocks */
    static const uint32_t RN[][3] = {{1, 1, 0}, {1, 2, 40}, {3, 3, 15}, {5, 2, 0}, {16, 2, 100},
                                     {9, 1, 33}, {40, 4, 7}};
    static const uint32_t RD[] = {8, 17, 64, 128, 300};
    for (size_t a = 0; a < LEN(RN); a++)
        for (size_t b = 0; b < LEN(RD); b++)
            for (int i8 = 0; i8 < 2; i8++)
                for (int holes = 0; holes < 3; holes++)
                    for (int form = 0; form < (holes == 1 ? 3 : 1); form++)
                        test_attend_rows(k, RN[a][0], RN[a][1], RN[a][2], RD[b], i8, holes, form);
}

static void test_attend_all(const colibri_kernels *k)
{
    for (att_dense = 0; att_dense < 2; att_dense++)
        test_attend_layout(k);
    att_dense = 0;
    if (k != NULL)
        test_attend_nan(k);
}

/* ---- silu_mul ------------------------------------------------------------ */

/* An activation for silu: the awkward values one in 4 (zeros of either
 * sign, the ends of the exp's range, subnormals, huge, infinite, NaN),
 * else a spread over [-120, 120] with any exponent down to 2^-30. */
static float silu_operand(void)
{
    static const float special[] = {0.0f, -0.0f, -87.0f, 87.0f, -87.5f, -86.99999f, 88.8f,
                                    -88.8f, 1e-40f, -1e-40f, 3e38f, -3e38f, INFINITY,
                                    -INFINITY, NAN, 0.5f, -0.5f, 1.0f, -1.0f, 104.0f};
    if (rng_below(4) == 0)
        return special[rng_below(LEN(special))];
    return ldexpf(rng_sym(), 7 - (int)rng_below(38)) * 0.94f;
}

/* Units in the last place of f between got and want (float neighbours
 * counted through zero), 1e9 for a NaN on one side only. */
static double ulps_apart(float got, double want)
{
    const float w = (float)want;
    if (got != got || w != w)
        return (got != got) == (w != w) ? 0.0 : 1e9;
    int32_t a, b;
    memcpy(&a, &got, 4);
    memcpy(&b, &w, 4);
    a = a < 0 ? INT32_MIN - a : a; /* monotonic integer order */
    b = b < 0 ? INT32_MIN - b : b;
    return fabs((double)a - (double)b);
}

/* ref's silu_mul against v / (1 + exp(-v)) * g in double: within 4 ulp
 * (the exp's ~2e-7 plus four roundings), and v below -87 (where clb_silu
 * returns -0) within 2e-36. */
static void test_silu_ref(const colibri_kernels *ref)
{
    double worst = 0.0;
    for (long i = 0; i < 400000; i++) {
        float h = silu_operand(), g = i % 2 ? 1.0f : rng_sym() * 3.0f;
        const float v = h;
        ref->silu_mul(&h, &g, 1);
        const double want = (double)v / (1.0 + exp(-(double)v)) * (double)g;
        n_checks++;
        if (v < -87.0f && v == v) {
            if (!(fabs((double)h) <= 2e-36) && !(v == -INFINITY && h != h))
                FAIL("ref silu_mul(%a) * %a = %a, want about %a", (double)v, (double)g,
                     (double)h, want);
            continue;
        }
        if (isinf(v) || (float)want == 0.0f || fabs(want) < 1e-37)
            continue; /* inf * 0 cases, and results below float's normal range */
        const double u = ulps_apart(h, want);
        if (u > worst)
            worst = u;
        if (u > 4.0)
            FAIL("ref silu_mul(%a) * %a = %a, want %a (%.0f ulp)", (double)v, (double)g,
                 (double)h, want, u);
    }
    printf("silu_mul: ref within %.0f ulp of double on 400000 values\n", worst);
}

/* Table k's silu_mul against ref's bit for bit, lengths 0..40 and a few
 * long ones (every vector step and tail), misaligned, written exactly. */
static void test_silu_mul(const colibri_kernels *ref, const colibri_kernels *k)
{
    static const size_t LENS[] = {1000, 1023, 1024, 4099};
    for (size_t li = 0; li < 41 + LEN(LENS); li++) {
        const size_t len = li < 41 ? li : LENS[li - 41];
        const int mis = (int)(case_no++ % 2);
        buf hb = buf_new(len + GUARD, sizeof(float), mis), gb = buf_new(len, sizeof(float), !mis);
        float *h = (float *)hb.p, *g = (float *)gb.p, *want = malloc((len + 1) * sizeof(float));
        if (!want)
            exit(2);
        fill_sentinel(h, len + GUARD);
        for (size_t i = 0; i < len; i++) {
            h[i] = silu_operand();
            g[i] = rng_below(8) == 0 ? silu_operand() : rng_sym() * 3.0f;
        }
        memcpy(want, h, len * sizeof(float));
        ref->silu_mul(want, g, len);
        k->silu_mul(h, g, len);
        n_checks++;
        for (size_t i = 0; i < len; i++)
            if (want[i] != want[i] ? h[i] == h[i] : memcmp(&want[i], &h[i], 4) != 0) {
                FAIL("%s silu_mul len %zu [%zu]: %a, ref %a", k->name, len, i, (double)h[i],
                     (double)want[i]);
                break;
            }
        for (size_t i = len; i < len + GUARD; i++)
            if (!is_sentinel(h[i])) {
                FAIL("%s silu_mul len %zu: wrote past the end (element %zu)", k->name, len, i);
                break;
            }
        free(want);
        buf_free(&hb);
        buf_free(&gb);
    }
}

static void test_table(const colibri_kernels *ref, const colibri_kernels *k)
{
    long f0 = n_failures, c0 = n_checks;
    for (size_t a = 0; a < LEN(NS); a++)
        for (size_t b = 0; b < LEN(ROWS); b++)
            for (size_t c = 0; c < LEN(COLS); c++) {
                test_matmul_f32(ref, k, NS[a], ROWS[b], COLS[c]);
                test_matmul_i16(ref, k, NS[a], ROWS[b], COLS[c]);
                for (size_t g = 0; g < LEN(GROUPS); g++)
                    test_matmul_i8(ref, k, NS[a], ROWS[b], COLS[c], GROUPS[g],
                                   (int)((b + c + g) % 3));
            }
    /* Quantisation: every (n, cols, group), several draws each. */
    for (size_t a = 0; a < LEN(NS); a++)
        for (size_t c = 0; c < LEN(COLS); c++)
            for (size_t g = 0; g < LEN(GROUPS); g++)
                for (int rep = 0; rep < 4; rep++)
                    test_quantize(ref, k, NS[a], COLS[c], GROUPS[g]);
    /* Larger shapes: several row panels, column chunks and token blocks,
     * each with a remainder. */
    static const uint32_t big[][3] = {{40, 200, 600}, {19, 101, 1100}, {33, 97, 257}, {9, 400, 520}};
    for (size_t i = 0; i < LEN(big); i++) {
        test_matmul_f32(ref, k, big[i][0], big[i][1], big[i][2]);
        test_matmul_i16(ref, k, big[i][0], big[i][1], big[i][2]);
        for (size_t g = 0; g < LEN(GROUPS); g++)
            test_matmul_i8(ref, k, big[i][0], big[i][1], big[i][2], GROUPS[g], (int)(g % 3));
        test_quantize(ref, k, big[i][0], big[i][2], 32);
    }
    /* Decode shapes (few tokens, the converter's group 32) over several
     * 256-column chunks, with and without a remainder of whole and short
     * groups, and row blocks whose next block is prefetched or missing
     * (avx512.c's decode form), and more than 256 groups a row (avx2.c's
     * chunks of scale products, the last with one group). */
    static const uint32_t dec[][3] = {{1, 37, 512}, {2, 9, 1100}, {5, 12, 2816}, {1, 65, 1056},
                                      {1, 14, 8224}};
    for (size_t i = 0; i < LEN(dec); i++)
        for (int mode = 0; mode < 3; mode++)
            test_matmul_i8(ref, k, dec[i][0], dec[i][1], dec[i][2], 32, mode);
    /* Long groups: the int32 sums over many 32-column steps. */
    for (int mode = 0; mode < 3; mode++)
        test_matmul_i8(ref, k, 3, 5, 4099, 4096, mode);
    test_matmul_f32(ref, k, 3, 5, 4099);
    test_matmul_i16(ref, k, 3, 5, 4099);
    /* Tiling invariance (threads): decode and GEMM forms, whole and partial
     * groups, a group over several 32-column steps, the converter's shape. */
    if (i8_must_be_exact(k)) {
        static const uint32_t tiled[][4] = {{24, 40, 96, 32}, {6, 37, 1056, 32}, {17, 33, 100, 33},
                                            {20, 29, 1100, 64}, {9, 48, 257, 7}};
        for (size_t i = 0; i < LEN(tiled); i++)
            test_matmul_i8_tiles(k, tiled[i][0], tiled[i][1], tiled[i][2], tiled[i][3]);
    }
    /* Float forms over several 4 KiB column chunks (1024 float / 2048 int16
     * columns) with 1 and 2 tokens left after the blocks of 3, and strips
     * whose next strip is prefetched, is partial, or missing. */
    static const uint32_t chunked[][3] = {{7, 13, 2100}, {8, 12, 2050}, {2, 9, 3000}};
    for (size_t i = 0; i < LEN(chunked); i++) {
        test_matmul_f32(ref, k, chunked[i][0], chunked[i][1], chunked[i][2]);
        test_matmul_i16(ref, k, chunked[i][0], chunked[i][1], chunked[i][2]);
    }
    test_table_blocks(ref, k);
    /* A table may reuse ref's own attention and SwiGLU (ARMv7's: plain
     * armv7-a NEON has no fused vector multiply-add). Comparing ref's
     * function with itself proves nothing and was 45 % of the ARMv7 run
     * under qemu; a form of its own is compared wherever one appears. */
    if (k->attend != ref->attend || k->attend_rows != ref->attend_rows)
        test_attend_all(k);
    else
        printf("%-5s attend, attend_rows: ref's own functions, not compared with themselves\n",
               k->name);
    if (k->silu_mul != ref->silu_mul)
        test_silu_mul(ref, k);
    printf("%-5s %ld checks, %ld failures%s\n", k->name, n_checks - c0, n_failures - f0,
           i8_must_be_exact(k) ? " (matmul_i8 bit-identical to ref)" : "");
}

/* ------------------------------------------------------------------------ */
/* --bench: time per call and throughput, ref against each optimised table.
 * Figures only: no assertion depends on timing. */

/* CPU time of this thread, not wall time: on a shared machine (CI, several
 * builds at once) the figures then do not count the time the benchmark sat
 * descheduled. Cache and memory contention from other processes still show. */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    uint32_t n, rows, cols, group;
    const float *w, *x, *s;
    const int8_t *q8, *xq;
    const float *xs;
    const int16_t *q16;
    float *y;
    int8_t *xq_out;
    float *xs_out;
    int16_t *xb_out;  /* quantize_act_blk's sums of 16 (the block kernels
                         themselves: run_bench_blocks) */
} bench_args;

enum { B_F32, B_I8, B_I16, B_QUANT, B_QBLK };

static void bench_call(const colibri_kernels *k, int what, const bench_args *a)
{
    switch (what) {
    case B_F32:
        k->matmul_f32(a->y, a->w, a->x, a->n, a->rows, a->cols);
        break;
    case B_I8:
        k->matmul_i8(a->y, a->q8, a->s, a->xq, a->xs, a->n, a->rows, a->cols, a->group);
        break;
    case B_I16:
        k->matmul_i16(a->y, a->q16, a->s, a->x, a->n, a->rows, a->cols);
        break;
    case B_QUANT:
        k->quantize_act_i8(a->xq_out, a->xs_out, a->x, a->n, a->cols, a->group);
        break;
    default:
        k->quantize_act_blk(a->xq_out, a->xs_out, a->xb_out, a->x, a->n, a->cols, a->group);
        break;
    }
}

/* Seconds per call of call(ctx): the best of up to 5 batches of at least
 * 0.1 s each (the least disturbed), after one call to warm the caches. */
static double best_seconds(void (*call)(void *ctx), void *ctx)
{
    call(ctx);
    double best = 1e30, total = 0;
    for (int batch = 0; batch < 5 && total < 1.5; batch++) {
        int reps = 0;
        double t0 = now_s(), t1;
        do {
            call(ctx);
            reps++;
            t1 = now_s();
        } while (t1 - t0 < 0.1);
        total += t1 - t0;
        if ((t1 - t0) / reps < best)
            best = (t1 - t0) / reps;
    }
    return best;
}

typedef struct {
    const colibri_kernels *k;
    int what;
    const bench_args *a;
} bench_ctx;

static void bench_ctx_call(void *ctx)
{
    const bench_ctx *c = ctx;
    bench_call(c->k, c->what, c->a);
}

static double time_call(const colibri_kernels *k, int what, const bench_args *a)
{
    bench_ctx c = {k, what, a};
    return best_seconds(bench_ctx_call, &c);
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

static void run_bench(const colibri_kernels *ref, const colibri_kernels **opt, int nopt,
                      const char *filter)
{
    static const uint32_t shapes[][3] = {
        {1, 2816, 1024}, {1, 1024, 2816}, {4, 2816, 1024}, {8, 2816, 1024}, {32, 2816, 1024},
        {128, 2816, 1024}, {128, 1024, 2816},
    };
    const uint32_t maxrc = 2816 * 1024, maxn = 128, maxc = 2816;
    float *w = xmalloc((size_t)maxrc * sizeof(float));
    float *x = xmalloc((size_t)maxn * maxc * sizeof(float));
    float *s = xmalloc((size_t)maxrc * sizeof(float)); /* scales, any shape */
    int8_t *q8 = xmalloc(maxrc);
    int16_t *q16 = xmalloc((size_t)maxrc * sizeof(int16_t));
    int8_t *xq = xmalloc((size_t)maxn * maxc);
    float *xs = xmalloc((size_t)maxn * maxc * sizeof(float));
    float *y = xmalloc((size_t)maxn * 2816 * sizeof(float));
    int8_t *xq_out = xmalloc((size_t)maxn * maxc);
    float *xs_out = xmalloc((size_t)maxn * maxc * sizeof(float));
    int16_t *xb_out = xmalloc((size_t)maxn * maxc / 16 * sizeof(int16_t));
    for (size_t i = 0; i < maxrc; i++) {
        w[i] = rng_sym();
        s[i] = (1.0f + rng_sym()) / 127.0f;
        q8[i] = (int8_t)(int32_t)(rng_below(255) - 127);
        q16[i] = (int16_t)(int32_t)(rng_below(65535) - 32767);
    }
    for (size_t i = 0; i < (size_t)maxn * maxc; i++)
        x[i] = rng_sym();

    printf("%-16s %-18s %10s %10s", "kernel", "n x rows x cols", "ref ms", "ref G/s");
    for (int i = 0; i < nopt; i++)
        printf(" %8s ms %8s G/s %6s", opt[i]->name, opt[i]->name, "x ref");
    printf("\n");
    static const char *names[] = {"matmul_f32", "matmul_i8 g32", "matmul_i8 g64",
                                  "matmul_i16", "quantize g32", "quantize blk256"};
    static const int whats[] = {B_F32, B_I8, B_I8, B_I16, B_QUANT, B_QBLK};
    for (int which = 0; which < (int)LEN(names); which++) {
        int what = whats[which];
        for (size_t sh = 0; sh < LEN(shapes); sh++) {
            bench_args a;
            a.n = shapes[sh][0];
            a.rows = shapes[sh][1];
            a.cols = shapes[sh][2];
            a.group = which == 2 ? 64 : what == B_QBLK ? 256 : 32;
            if ((what == B_QUANT || what == B_QBLK) && a.rows != 2816)
                continue; /* quantize depends on n x cols only */
            char shape[32];
            snprintf(shape, sizeof shape, "%ux%ux%u", a.n, a.rows, a.cols);
            if (filter && !strstr(names[which], filter) && !strstr(shape, filter))
                continue;
            a.w = w;
            a.x = x;
            a.s = s;
            a.q8 = q8;
            a.q16 = q16;
            a.y = y;
            a.xq_out = xq_out;
            a.xs_out = xs_out;
            ref->quantize_act_i8(xq, xs, x, a.n, a.cols, a.group);
            a.xq = xq;
            a.xs = xs;
            a.xb_out = xb_out;
            /* GFLOPS for the float forms, GOPS (2 per multiply-add) for
             * int8; quantize: G elements/s. */
            double ops = what == B_QUANT || what == B_QBLK ? (double)a.n * a.cols
                                         : 2.0 * a.n * a.rows * a.cols;
            double tr = time_call(ref, what, &a);
            printf("%-16s %-18s %10.3f %10.2f", names[which], shape, tr * 1e3, ops / tr * 1e-9);
            for (int i = 0; i < nopt; i++) {
                double tk = time_call(opt[i], what, &a);
                printf(" %11.3f %12.2f %6.1f", tk * 1e3, ops / tk * 1e-9, tr / tk);
            }
            printf("\n");
            fflush(stdout);
        }
    }
    free(w);
    free(x);
    free(s);
    free(q8);
    free(q16);
    free(xq);
    free(xs);
    free(y);
    free(xq_out);
    free(xs_out);
    free(xb_out);
}

/* --bench, block types: each block kernel with its activations from
 * quantize_act_blk. The weights rotate through copies filling BB_ROTATE
 * bytes (more than any L3 of this class of machine), so each call reads its
 * weights from memory as a model's layers do, not from a cache warm from
 * the previous call. Figures: ms per call, GB/s of weight bytes read, and
 * GOPS (2 per multiply-add). */
#define BB_ROTATE (96u << 20)

typedef struct {
    unsigned dtype;
    uint32_t n, rows, cols, copies;
    size_t wbytes; /* one copy */
    const uint8_t *w;
    const int8_t *xq;
    const float *xs;
    const int16_t *xb;
    float *y;
} blk_bench_args;

static void blk_bench_call(const colibri_kernels *k, const blk_bench_args *a, uint32_t i)
{
    const uint8_t *w = a->w + (size_t)(i % a->copies) * a->wbytes;
    blk_matmul_of(k, a->dtype)(a->y, w, a->xq, a->xs, a->xb, a->n, a->rows, a->cols);
}

/* Seconds per call (best_seconds), each call on the next copy of the weights. */
typedef struct {
    const colibri_kernels *k;
    const blk_bench_args *a;
    uint32_t i; /* the weights' copy, rotating */
} blk_ctx;

static void blk_ctx_call(void *ctx)
{
    blk_ctx *c = ctx;
    blk_bench_call(c->k, c->a, c->i++);
}

static double blk_time_call(const colibri_kernels *k, const blk_bench_args *a)
{
    blk_ctx c = {k, a, 0};
    return best_seconds(blk_ctx_call, &c);
}

/* --bench, attention: attend_rows of one KV head at depth npos, as the
 * bench model's (head_dim 64, GQA pairs) decode step (1 row) and the last
 * prefill chunk of 128 rows, float32 and int8 caches. Figures: ms per
 * call and G pairs (query, position) per second. */
typedef struct {
    const colibri_kernels *k;
    clb_att_rows r;
    clb_att_args a;
} att_bench_args;

static void att_call(void *ctx)
{
    const att_bench_args *b = ctx;
    b->k->attend_rows(&b->r, &b->a);
}

static void run_bench_attend(const colibri_kernels *ref, const colibri_kernels **opt, int nopt,
                             const char *filter)
{
    const uint32_t npos = 2048, d = 64, nh = 2, rows[] = {1, 128};
    att_cache cache = att_cache_new(npos, d, 0);
    const size_t ldq = (size_t)nh * d;
    buf Q = buf_new(128 * ldq, sizeof(float), 1), O = buf_new(128 * ldq, sizeof(float), 0);
    buf P = buf_new(128, sizeof(uint32_t), 0);
    printf("%-16s %-18s %10s %10s", "kernel", "rows x heads @ pos", "ref ms", "ref Gp/s");
    for (int i = 0; i < nopt; i++)
        printf(" %8s ms %7s Gp/s %6s", opt[i]->name, opt[i]->name, "x ref");
    printf("\n");
    for (int i8 = 0; i8 < 2; i8++)
        for (size_t ri = 0; ri < LEN(rows); ri++) {
            const char *name = i8 ? "attend i8" : "attend f32";
            char shape[32];
            snprintf(shape, sizeof shape, "%ux%u@%u", rows[ri], nh, npos);
            if (filter && !strstr(name, filter) && !strstr(shape, filter))
                continue;
            uint32_t *pos = P.p;
            double pairs = 0;
            for (uint32_t i = 0; i < rows[ri]; i++) {
                pos[i] = npos - rows[ri] + i;
                pairs += (double)nh * (pos[i] + 1);
            }
            att_bench_args b;
            b.a = att_cache_args(&cache, d, i8);
            b.r = (clb_att_rows){.q = Q.p, .out = O.p, .pos = pos, .ldq = ldq, .ldo = ldq,
                                 .nr = rows[ri], .nh = nh};
            b.k = ref;
            double tr = best_seconds(att_call, &b);
            printf("%-16s %-18s %10.3f %10.3f", name, shape, tr * 1e3, pairs / tr * 1e-9);
            for (int i = 0; i < nopt; i++) {
                b.k = opt[i];
                double tk = best_seconds(att_call, &b);
                printf(" %11.3f %12.3f %6.1f", tk * 1e3, pairs / tk * 1e-9, tr / tk);
            }
            printf("\n");
            fflush(stdout);
        }
    buf_free(&Q); buf_free(&O); buf_free(&P);
    att_cache_free(&cache);
}

static void run_bench_blocks(const colibri_kernels *ref, const colibri_kernels **opt, int nopt,
                             const char *filter)
{
    static const uint32_t shapes[][3] = {
        {1, 2816, 1024}, {1, 1024, 2816}, {4, 2816, 1024}, {8, 2816, 1024},
        {32, 2816, 1024}, {32, 1024, 2816}, {128, 2816, 1024}, {128, 1024, 2816},
    };
    static const char *names[] = {"matmul_q4_0", "matmul_q4_k", "matmul_q6_k", "matmul_q5_0",
                                  "matmul_q5_k", "matmul_q8_0"};
    const uint32_t maxn = 128, maxc = 2816;
    uint8_t *w = xmalloc(BB_ROTATE + (4u << 20));
    float *x = xmalloc((size_t)maxn * maxc * sizeof(float));
    int8_t *xq = xmalloc((size_t)maxn * 3072);
    float *xs = xmalloc((size_t)maxn * 96 * sizeof(float));
    int16_t *xb = xmalloc((size_t)maxn * 3072 / 16 * sizeof(int16_t));
    float *y = xmalloc((size_t)maxn * 2816 * sizeof(float));
    for (size_t i = 0; i < (size_t)maxn * maxc; i++)
        x[i] = rng_sym();
    printf("\n%-12s %-14s %8s %7s %7s", "block kernel", "n x rows x cols", "ref ms", "GB/s", "GOPS");
    for (int i = 0; i < nopt; i++)
        printf(" | %9s ms %7s %7s %6s", opt[i]->name, "GB/s", "GOPS", "x ref");
    printf("\n");
    for (size_t d = 0; d < LEN(BLK_DTYPES); d++) {
        const unsigned dtype = BLK_DTYPES[d];
        for (size_t sh = 0; sh < LEN(shapes); sh++) {
            blk_bench_args a;
            a.dtype = dtype;
            a.n = shapes[sh][0];
            a.rows = shapes[sh][1];
            a.cols = shapes[sh][2];
            char shape[32];
            snprintf(shape, sizeof shape, "%ux%ux%u", a.n, a.rows, a.cols);
            if (filter && !strstr(names[d], filter) && !strstr(shape, filter))
                continue;
            const uint32_t B = clb_block_cols(dtype), nb = (a.cols + B - 1) / B;
            a.wbytes = (size_t)a.rows * nb * clb_block_bytes(dtype);
            a.copies = (uint32_t)(BB_ROTATE / a.wbytes) + 1;
            fill_blocks(w, dtype, (size_t)a.rows * nb);
            for (uint32_t c = 1; c < a.copies; c++)
                memcpy(w + (size_t)c * a.wbytes, w, a.wbytes);
            ref->quantize_act_blk(xq, xs, xb, x, a.n, a.cols, B);
            a.w = w;
            a.xq = xq;
            a.xs = xs;
            a.xb = xb;
            a.y = y;
            const double ops = 2.0 * a.n * a.rows * a.cols;
            double tr = blk_time_call(ref, &a);
            printf("%-12s %-14s %8.3f %7.2f %7.2f", names[d], shape, tr * 1e3,
                   (double)a.wbytes / tr * 1e-9, ops / tr * 1e-9);
            for (int i = 0; i < nopt; i++) {
                double tk = blk_time_call(opt[i], &a);
                printf(" | %12.3f %7.2f %7.2f %6.1f", tk * 1e3, (double)a.wbytes / tk * 1e-9,
                       ops / tk * 1e-9, tr / tk);
            }
            printf("\n");
            fflush(stdout);
        }
    }
    free(w);
    free(x);
    free(xq);
    free(xs);
    free(xb);
    free(y);
}

int main(int argc, char **argv)
{
    const colibri_kernels *ref = colibri_kernels_ref();
    const colibri_kernels *opt[4];
    enum { MAX_REQ = 8 };
    const char *required[MAX_REQ];
    int nreq = 0;
    int nopt = 0, bench = 0;
    const char *filter = NULL;
    if (colibri_kernels_avx2())
        opt[nopt++] = colibri_kernels_avx2();
    /* the plain AVX2 form too where the CPU picks a VNNI one */
    if (colibri_kernels_avx2_plain() && colibri_kernels_avx2_plain() != colibri_kernels_avx2())
        opt[nopt++] = colibri_kernels_avx2_plain();
    if (colibri_kernels_avx512())
        opt[nopt++] = colibri_kernels_avx512();
    if (colibri_kernels_neon())
        opt[nopt++] = colibri_kernels_neon();

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--bench") == 0) {
            bench = 1;
            if (i + 1 < argc && argv[i + 1][0] != '-')
                filter = argv[++i];
        } else if (strcmp(argv[i], "--require") == 0 && i + 1 < argc && nreq < MAX_REQ) {
            required[nreq++] = argv[++i];
        } else if (strcmp(argv[i], "--exact-i8") == 0 && i + 1 < argc && nreq < MAX_REQ &&
                   n_exact_i8 < MAX_EXACT) {
            /* also required: a promise about a table that is absent proves nothing */
            exact_i8[n_exact_i8++] = required[nreq++] = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--bench [FILTER]] [--require NAME]... "
                            "[--exact-i8 NAME]...\n", argv[0]);
            return 2;
        }
    }
    for (int r = 0; r < nreq; r++) {
        int found = 0;
        for (int j = 0; j < nopt; j++)
            found |= strcmp(opt[j]->name, required[r]) == 0;
        if (!found) {
            fprintf(stderr, "kernel table \"%s\" is not available in this build/CPU\n",
                    required[r]);
            return 1;
        }
    }
    if (bench) {
        run_bench(ref, opt, nopt, filter);
        run_bench_blocks(ref, opt, nopt, filter);
        run_bench_attend(ref, opt, nopt, filter);
        return 0;
    }
    test_f16_to_f32();     /* the block scales' conversion, every value */
    test_fmaf();           /* the attention's multiply-add */
    test_attend_all(NULL); /* ref's attend against softmax in double */
    test_attend_all(ref);  /* ref's attend_rows against its attend */
    test_silu_ref(ref);    /* ref's SwiGLU activation against double */
    if (nopt == 0)
        printf("no optimised kernel table in this build: nothing to compare\n");
    for (int i = 0; i < nopt; i++)
        test_table(ref, opt[i]);
    if (n_failures) {
        printf("%ld FAILURES\n", n_failures);
        return 1;
    }
    printf("all kernels agree with ref\n");
    return 0;
}
