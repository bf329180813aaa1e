/*
 * kernels.h - the compute kernels behind colibri_infer, as a table of function
 * pointers so one build can carry the portable reference kernels (ref.c, the
 * truth) and optimised ones (avx2.c, neon.c + neon_dotprod.c) and pick at
 * init.
 *
 * Arithmetic contract: docs/FORMAT.md section 5. Every optimised kernel must
 * agree with the ref kernel on the same inputs: F32 kernels to float rounding
 * (summation order may differ), the I8 integer inner sums exactly. On
 * x86-64 "avx2" and "avx2-vnni", on AArch64 "neon" and "neon-dotprod" promise
 * more: their matmul_i8 is bit-identical to ref's (same float operations in
 * the same order, whatever n, rows and where a row falls in a call), so the
 * two tables of a target give the same logits and splitting a call into
 * token x row tiles changes no bit.
 *
 * Conventions: W is row-major [rows, cols] (y = W x). Matrix forms take X as
 * [n, cols] and write Y as [n, rows], row t of Y = W * row t of X. Any size
 * >= 1 is valid (tails handled). Pointers need no alignment beyond their type;
 * arena buffers are 64-byte aligned, weights in a .colibri file 64-byte
 * aligned, so kernels may prefer aligned loads only after checking.
 * Kernels never allocate, never fail, and write only their output. They may
 * use up to 32 KiB of stack (the AVX2 int8 GEMM packs weights there: 12 KiB;
 * its decode form keeps 4 KiB of scale products).
 */
#ifndef COLIBRI_KERNELS_H
#define COLIBRI_KERNELS_H

#include <math.h> /* INFINITY */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "colibri_format.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Positions per block of the attention schedule (ref.c clb_ref_attend). */
#define CLB_ATT_BLOCK 16u

/* One query head's attention over a KV cache (clb_attention): the cached
 * positions 0 .. n-1 of one KV head, float32 (K, V) or int8 with one scale
 * per position (Kq, Ks, Vq, Vs: COLIBRI_KV_I8). Row i of K starts at
 * K + i * ld (Kq + i * ld), its scale at Ks[i * lds].
 *
 * bias: a score bias by position (T5's relative-position tables, encdec.c)
 * or NULL: position i's score is (scale * q.k_i) + bias[i * bias_step],
 * added after the scale, one float add. bias_step is +1 or -1 (a table read
 * backwards: T5's decoder indexes it by the distance pos - i); only the
 * attended positions' entries are read. */
typedef struct clb_att_args {
    const float *q;          /* [d] */
    const float *K, *V;      /* f32 cache, or NULL */
    const int8_t *Kq, *Vq;   /* i8 cache (when K is NULL) */
    const float *Ks, *Vs;
    const uint8_t *mask;     /* [n]: 0 = not attended */
    const float *bias;       /* NULL, or position i's at bias[i * bias_step] */
    ptrdiff_t bias_step;
    size_t ld, lds;
    uint32_t n, d;
    float scale;             /* score = scale * q.k (+ the bias) */
} clb_att_args;

/* s[i] += bias[(b + i) * step] for the lanes i of live (bit i: position
 * b + i attended): every form's add of the bias after the scale, one float
 * add each (the same bits in a lane of a vector), reading only attended
 * positions' entries. No bias: nothing. */
static inline void clb_att_add_bias(float *s, const float *bias, ptrdiff_t step, uint32_t b,
                                    uint32_t live)
{
    if (!bias)
        return;
    for (uint32_t i = 0; i < CLB_ATT_BLOCK; i++)
        if (live >> i & 1u)
            s[i] = s[i] + bias[(ptrdiff_t)(b + i) * step];
}


/* Blocks of keys and values ahead that the SIMD attention forms prefetch
 * (clb_att_prefetch_ahead). */
#define CLB_ATT_PF_BLOCKS 2u

/* Bytes ahead of each weight row's stream that a one-token (decode)
 * matmul requests, in the forms that take one row per memory stream
 * (avx2.c STREAMS, avx512.c). Measured for the int8 forms on Zen 3 and an
 * Intel Xeon: 512 B and 2 KiB within 2-5 % of it, none and 4 KiB slower
 * (bench/results/FINDINGS.md 14, 15); for avx512.c's K-type tiles on Zen
 * 5: 768 B and 1.5 KiB within the noise (FINDINGS.md 33). */
#define CLB_STREAM_PFB 1024u

/* An out-of-line helper that does nothing but prefetch. GCC counts a
 * prefetch as no side effect, so it finds such a function "const" and
 * deletes every call to it: avx512.c's and avx2.c's decode tiles requested
 * nothing at all until 2026-12 (bench/results/FINDINGS.md 33). `noipa`
 * keeps GCC from using what it infers about the callee; clang keeps the
 * calls anyway (its prefetch touches memory the caller cannot see) and does
 * not know the attribute. tests/test_kernels.py checks the calls are in the
 * objects. avx2.c's Q6_K decode tile keeps one; avx512.c's tiles request
 * theirs inline, which read 10-40 % faster there (FINDINGS.md 35). */
#if defined(__GNUC__) && !defined(__clang__)
#define CLB_PREFETCH_HELPER __attribute__((noinline, noipa))
#else
#define CLB_PREFETCH_HELPER __attribute__((noinline))
#endif

/* Several queries over the same cached positions (clb_att_args without
 * q, n and bias): the heads of one GQA group, for one or more rows of one
 * sequence. Query (i, g), i < nr rows, g < nh heads, is the d floats at
 * q + i * ldq + g * d; it attends positions 0 .. pos[i] (n = pos[i] + 1;
 * n_all > 0: positions 0 .. n_all - 1 whatever pos, an encoder's) and
 * writes out + i * ldo + g * d. With bias, its bias (clb_att_args) starts
 * at bias + pos[i] * bias_pos + g * bias_head, stepping by a->bias_step. */
typedef struct clb_att_rows {
    const float *q;
    float *out;
    const uint32_t *pos;     /* [nr] */
    size_t ldq, ldo;
    uint32_t nr, nh;
    uint32_t n_all;          /* 0: causal (pos[i] + 1 positions) */
    const float *bias;       /* NULL: none */
    ptrdiff_t bias_pos, bias_head;
} clb_att_rows;

/* Query (i, g) of r: its positions attended and its bias row (NULL:
 * none), as clb_att_rows says. */
static inline uint32_t clb_att_rows_n(const clb_att_rows *r, uint32_t i)
{
    return r->n_all ? r->n_all : r->pos[i] + 1u;
}
static inline const float *clb_att_rows_bias(const clb_att_rows *r, uint32_t i, uint32_t g)
{
    return r->bias ? r->bias + (ptrdiff_t)r->pos[i] * r->bias_pos + (ptrdiff_t)g * r->bias_head
                   : NULL;
}

/* One tile of an attend_rows form (avx2.c, avx512.c, neon_attend.c): up to
 * CLB_ATT_TILE queries (a form uses its own T of them) with their inputs,
 * outputs, positions attended (0: a padding query), bias rows and
 * online-softmax state (ref.c clb_ref_attend's m, l and whether a block
 * was live). */
#define CLB_ATT_TILE 8u
typedef struct clb_att_tile {
    const float *q[CLB_ATT_TILE];
    float *o[CLB_ATT_TILE];
    const float *bias[CLB_ATT_TILE];
    uint32_t n[CLB_ATT_TILE];
    float m[CLB_ATT_TILE], l[CLB_ATT_TILE];
    int any[CLB_ATT_TILE];
} clb_att_tile;

/* The T queries of the tile t that starts at query t0 of r (query x: row
 * x / nh, head x % nh, kernels' attend_rows forms): their inputs, their
 * outputs (zeroed), bias rows and positions attended; past the last query,
 * the last one's input again with none (a padding query, reaching
 * nothing). */
static inline void clb_att_tile_queries(const clb_att_rows *r, uint32_t d, uint32_t t0, uint32_t T,
                                        clb_att_tile *t)
{
    const uint32_t nq = r->nr * r->nh;
    for (uint32_t j = 0; j < T; j++) {
        const uint32_t x = t0 + j < nq ? t0 + j : nq - 1, i = x / r->nh, g = x % r->nh;
        t->q[j] = r->q + (size_t)i * r->ldq + (size_t)g * d;
        t->o[j] = r->out + (size_t)i * r->ldo + (size_t)g * d;
        t->bias[j] = clb_att_rows_bias(r, i, g);
        t->n[j] = t0 + j < nq ? clb_att_rows_n(r, i) : 0u;
        if (t->n[j])
            memset(t->o[j], 0, (size_t)d * sizeof(float));
    }
}

/* A tile of the one query of an attend call (a->q, a->n, a->bias), its
 * output zeroed. */
static inline void clb_att_tile_one(const clb_att_args *a, float *out, clb_att_tile *t)
{
    memset(out, 0, (size_t)a->d * sizeof(float));
    t->q[0] = a->q;
    t->o[0] = out;
    t->bias[0] = a->bias;
    t->n[0] = a->n;
}

/* Resets the state of the T queries of each of the nt tiles; returns the
 * most positions any of them attends (the group's block range). */
static inline uint32_t clb_att_tiles_start(clb_att_tile *t, uint32_t nt, uint32_t T)
{
    uint32_t nmax = 0;
    for (uint32_t k = 0; k < nt; k++)
        for (uint32_t j = 0; j < T; j++) {
            t[k].m[j] = -INFINITY;
            t[k].l[j] = 0.0f;
            t[k].any[j] = 0;
            nmax = t[k].n[j] > nmax ? t[k].n[j] : nmax;
        }
    return nmax;
}

/* The lane bits (bit i: position b + i, i < nb <= 16) of block b for the
 * nt tiles' T queries: kj[k][j] the unmasked positions query j of tile k
 * attends (those below its n), reach[k] their union over the tile.
 * Returns the union over the group (0: no query reaches the block). */
static inline uint32_t clb_att_block_lanes(const clb_att_args *a, const clb_att_tile *t,
                                           uint32_t nt, uint32_t T, uint32_t b, uint32_t nb,
                                           uint32_t *reach, uint32_t (*kj)[CLB_ATT_TILE])
{
    uint32_t keep = 0, all = 0;
    for (uint32_t i = 0; i < nb; i++)
        keep |= (uint32_t)(a->mask[b + i] != 0) << i;
    for (uint32_t k = 0; k < nt; k++) {
        reach[k] = 0;
        for (uint32_t j = 0; j < T; j++) {
            const uint32_t left = t[k].n[j] > b ? t[k].n[j] - b : 0u;
            kj[k][j] = keep & (left >= 16u ? 0xffffu : (1u << left) - 1u);
            reach[k] |= kj[k][j];
        }
        all |= reach[k];
    }
    return all;
}

/* Requests into L2 the keys and values of positions b .. b + nb: a block
 * of one KV head is 16 rows a cache row apart, which the hardware
 * prefetchers do not follow (decode at 2048 positions on Zen 4 waited on
 * memory for most of its attention time without this). __builtin_prefetch
 * with locality 2 is x86's prefetcht1 and A64's PRFM PLDL2KEEP. */
static inline void clb_att_prefetch(const clb_att_args *a, uint32_t b, uint32_t nb)
{
    const size_t bytes = a->K ? (size_t)a->d * sizeof(float) : a->d;
    const char *k = a->K ? (const char *)(a->K + (size_t)b * a->ld) : (const char *)(a->Kq + (size_t)b * a->ld);
    const char *v = a->V ? (const char *)(a->V + (size_t)b * a->ld) : (const char *)(a->Vq + (size_t)b * a->ld);
    const size_t ld = a->K ? a->ld * sizeof(float) : a->ld;
    for (uint32_t i = 0; i < nb; i++)
        for (size_t c = 0; c < bytes; c += 64) {
            __builtin_prefetch(k + i * ld + c, 0, 2);
            __builtin_prefetch(v + i * ld + c, 0, 2);
        }
}

/* Before block b of a group whose queries reach nmax positions: the block
 * CLB_ATT_PF_BLOCKS ahead requested (at b = 0 the first ones as well), so
 * each block's rows are on their way while the blocks before it compute. */
static inline void clb_att_prefetch_ahead(const clb_att_args *a, uint32_t b, uint32_t nmax)
{
    const uint32_t ahead = b + CLB_ATT_PF_BLOCKS * CLB_ATT_BLOCK;
    for (uint32_t p = b == 0 ? 0u : ahead; p <= ahead && p < nmax; p += CLB_ATT_BLOCK)
        clb_att_prefetch(a, p, nmax - p < CLB_ATT_BLOCK ? nmax - p : CLB_ATT_BLOCK);
}

typedef struct colibri_kernels {
    const char *name; /* "ref", "avx2", "avx2-vnni", "avx512-vnni", "neon",
                          "neon-dotprod" */

    /* Y[n, rows] = X[n, cols] * W^T, W float32 [rows, cols]. */
    void (*matmul_f32)(float *Y, const float *W, const float *X,
                       uint32_t n, uint32_t rows, uint32_t cols);

    /* Quantise activations per group (docs/FORMAT.md 5): X float [n, cols]
     * -> XQ int8 [n, cols], XS float [n, ngroups], ngroups = ceil(cols/group). */
    void (*quantize_act_i8)(int8_t *XQ, float *XS, const float *X,
                            uint32_t n, uint32_t cols, uint32_t group);

    /* Y[n, rows] from int8 weights Q [rows, cols] with scales S [rows, ngroups]
     * and quantised activations XQ [n, cols], XS [n, ngroups]:
     * y = sum_g float(int32 dot over group g) * (S[r,g] * XS[t,g]).
     * Precondition: every XQ value is in [-127, 127] (quantize_act_i8
     * guarantees it; -128 could overflow the SIMD int16 pair sums). Q may
     * hold -128. */
    void (*matmul_i8)(float *Y, const int8_t *Q, const float *S,
                      const int8_t *XQ, const float *XS,
                      uint32_t n, uint32_t rows, uint32_t cols, uint32_t group);

    /* Y[n, rows] from int16 weights Q [rows, cols], per-row scales S [rows],
     * float activations X [n, cols]: y = S[r] * sum_c float(Q[r,c]) * x[c]. */
    void (*matmul_i16)(float *Y, const int16_t *Q, const float *S,
                       const float *X, uint32_t n, uint32_t rows, uint32_t cols);

    /* --- Block-quantised weights (docs/FORMAT.md 4, "Block types"; the
     * arithmetic of section 5). B = 32 for Q4_0, Q5_0 and Q8_0, 256 for
     * Q4_K, Q5_K and Q6_K;
     * nb = ceil(cols / B); a weight row is nb consecutive blocks. */

    /* Activations for block weights: X float [n, cols] -> XQ int8
     * [n, nb*B] (rows padded with zeros past cols), XS float [n, nb]
     * (amax/127 per block, as quantize_act_i8 with group B), XB int16
     * [n, nb*B/16]: the sum of each 16 consecutive XQ values (for the
     * Q4_K mins; |sum| <= 2032). block is 32 or 256. */
    void (*quantize_act_blk)(int8_t *XQ, float *XS, int16_t *XB,
                             const float *X, uint32_t n, uint32_t cols,
                             uint32_t block);

    /* Y[n, rows] from blocks W [rows, nb] (dtype's layout) and the
     * activations of quantize_act_blk with the dtype's B. Bit-identical to
     * ref in every table (the float order of FORMAT.md 5 per element). */
    void (*matmul_q4_0)(float *Y, const uint8_t *W, const int8_t *XQ,
                        const float *XS, const int16_t *XB, uint32_t n,
                        uint32_t rows, uint32_t cols);
    void (*matmul_q4_k)(float *Y, const uint8_t *W, const int8_t *XQ,
                        const float *XS, const int16_t *XB, uint32_t n,
                        uint32_t rows, uint32_t cols);
    void (*matmul_q6_k)(float *Y, const uint8_t *W, const int8_t *XQ,
                        const float *XS, const int16_t *XB, uint32_t n,
                        uint32_t rows, uint32_t cols);
    void (*matmul_q5_0)(float *Y, const uint8_t *W, const int8_t *XQ,
                        const float *XS, const int16_t *XB, uint32_t n,
                        uint32_t rows, uint32_t cols);
    void (*matmul_q5_k)(float *Y, const uint8_t *W, const int8_t *XQ,
                        const float *XS, const int16_t *XB, uint32_t n,
                        uint32_t rows, uint32_t cols);
    void (*matmul_q8_0)(float *Y, const uint8_t *W, const int8_t *XQ,
                        const float *XS, const int16_t *XB, uint32_t n,
                        uint32_t rows, uint32_t cols);

    /* out[d] = softmax over the unmasked positions of (scale * q.k_i),
     * applied to the v_i: the flash-attention schedule of clb_ref_attend
     * (ref.c), whose float operations and order are the truth; every table
     * that has this member is bit-identical to it (the NEON tables list
     * ref's own). All positions masked: out = 0. */
    void (*attend)(float *out, const clb_att_args *a);

    /* attend for every query of r (a->q and a->n are not read): the same
     * bits as one attend call per query, whatever r's shape, so a form may
     * share the work of several queries (a block of keys loaded once for
     * all of them) without changing a result. */
    void (*attend_rows)(const clb_att_rows *r, const clb_att_args *a);

    /* SwiGLU's middle: h[i] = silu(h[i]) * g[i] for i in [0, len), with
     * clb_silu's operations (below); every table bit-identical to ref. */
    void (*silu_mul)(float *h, const float *g, size_t len);
} colibri_kernels;

/* ref.c's block kernels, named so that a table without its own form of
 * one (yet) can list ref's: the same bits by definition. */
void clb_ref_quantize_act_blk(int8_t *XQ, float *XS, int16_t *XB,
                              const float *X, uint32_t n, uint32_t cols,
                              uint32_t block);
void clb_ref_matmul_q4_0(float *Y, const uint8_t *W, const int8_t *XQ,
                         const float *XS, const int16_t *XB, uint32_t n,
                         uint32_t rows, uint32_t cols);
void clb_ref_matmul_q4_k(float *Y, const uint8_t *W, const int8_t *XQ,
                         const float *XS, const int16_t *XB, uint32_t n,
                         uint32_t rows, uint32_t cols);
void clb_ref_matmul_q6_k(float *Y, const uint8_t *W, const int8_t *XQ,
                         const float *XS, const int16_t *XB, uint32_t n,
                         uint32_t rows, uint32_t cols);
void clb_ref_matmul_q5_0(float *Y, const uint8_t *W, const int8_t *XQ,
                         const float *XS, const int16_t *XB, uint32_t n,
                         uint32_t rows, uint32_t cols);
void clb_ref_matmul_q5_k(float *Y, const uint8_t *W, const int8_t *XQ,
                         const float *XS, const int16_t *XB, uint32_t n,
                         uint32_t rows, uint32_t cols);
void clb_ref_matmul_q8_0(float *Y, const uint8_t *W, const int8_t *XQ,
                         const float *XS, const int16_t *XB, uint32_t n,
                         uint32_t rows, uint32_t cols);

void clb_ref_attend(float *out, const clb_att_args *a);
void clb_ref_attend_rows(const clb_att_rows *r, const clb_att_args *a);
void clb_ref_silu_mul(float *h, const float *g, size_t len);

/* The AArch64 NEON tables' attend, attend_rows and silu_mul (neon_attend.c;
 * defined only on AArch64 with COLIBRI_USE_NEON): ref's bits. */
void clb_neon_attend(float *out, const clb_att_args *a);
void clb_neon_attend_rows(const clb_att_rows *r, const clb_att_args *a);
void clb_neon_silu_mul(float *h, const float *g, size_t len);

/* a * b + c rounded once (IEEE 754 fusedMultiplyAdd, C's fmaf): the
 * attention's multiply-adds, so a form can use the CPU's FMA instruction
 * (x86 FMA3, NEON/VFPv4 vfma, AArch64, POWER, RISC-V F) and every form
 * still gives the same bits. Where the compiler says fmaf is one
 * instruction (__FP_FAST_FMAF: not baseline x86-64, not an ARMv7 built
 * for VFPv3 like the armv7 target) it is that instruction; elsewhere the
 * same value from double arithmetic, no libm (newlib's fmaf rounds
 * twice): a * b is exact in double (24 + 24 significant bits) and s, the
 * sum rounded to double, rounds to the right float unless s is a float
 * tie (rounding to double cannot carry a sum across a tie, which is
 * itself a double, only onto one). A tie, or a result below float's
 * normal range (where the tie bits sit higher), is rounded to odd
 * instead: s moved to its odd neighbour on the side of its rounding error
 * (exact by TwoSum) when it was inexact and its last bit even; that
 * rounded to float is correct (53 >= 24 + 2 bits: Boldo & Melquiond,
 * "Emulation of FMA and correctly rounded sums: proved algorithms using
 * rounding to odd", IEEE TC 2008). NaN and infinity pass through the
 * double sum as the instruction gives them (a NaN's payload aside). The
 * double form is clb_fmaf_double, in ref.c: out of line, as 13 inlined
 * copies cost ref 6 KB. */
float clb_fmaf_double(float a, float b, float c);
#if defined(__FP_FAST_FMAF)
static inline float clb_fmaf(float a, float b, float c)
{
    return __builtin_fmaf(a, b, c);
}
#else
static inline float clb_fmaf(float a, float b, float c)
{
    return clb_fmaf_double(a, b, c);
}
#endif

/* The attention's exp (clb_exp_neg; the SiLU's is the same with its
 * multiply-adds unfused, clb_silu): exp(x) for x <= 0 in float operations
 * and fused multiply-adds (Cody-Waite reduction by ln 2, a degree-6
 * polynomial by Horner's rule, 2^n by the exponent bits), so SIMD forms can
 * repeat it lane by lane bit for bit; relative error ~2e-7. Below -87
 * (where 2^n would leave the normal range) it returns 0, as it does for
 * -inf; NaN gives NaN. */
#define CLB_EXP_MIN (-87.0f)
#define CLB_EXP_LOG2E 1.44269504088896341f
#define CLB_EXP_LN2_HI 0.693359375f
#define CLB_EXP_LN2_LO (-2.12194440e-4f)
#define CLB_EXP_C2 5.0000001201e-1f
#define CLB_EXP_C3 1.6666665459e-1f
#define CLB_EXP_C4 4.1665795894e-2f
#define CLB_EXP_C5 8.3334519073e-3f
#define CLB_EXP_C6 1.3981999507e-3f
#define CLB_EXP_C7 1.9875691500e-4f
/* a * b + c, fused (clb_fmaf) or as a multiply and an add each rounded */
static inline float clb_madd(float a, float b, float c, int fused)
{
    return fused ? clb_fmaf(a, b, c) : a * b + c;
}

/* clb_exp_neg's operations, the multiply-adds fused or not (a constant at
 * every call: two functions once inlined). */
static inline float clb_exp_neg_form(float x, int fused)
{
    if (!(x >= CLB_EXP_MIN)) /* NaN falls through to here too */
        return x != x ? x : 0.0f;
    float n = x * CLB_EXP_LOG2E;
    /* round half to even, as the SIMD forms' roundscale / cvtps do */
    float r0 = n + 12582912.0f; /* 1.5 * 2^23: the fraction bits drop out */
    n = r0 - 12582912.0f;
    float r = clb_madd(-n, CLB_EXP_LN2_HI, x, fused);
    r = clb_madd(-n, CLB_EXP_LN2_LO, r, fused);
    float p = CLB_EXP_C7;
    p = clb_madd(p, r, CLB_EXP_C6, fused);
    p = clb_madd(p, r, CLB_EXP_C5, fused);
    p = clb_madd(p, r, CLB_EXP_C4, fused);
    p = clb_madd(p, r, CLB_EXP_C3, fused);
    p = clb_madd(p, r, CLB_EXP_C2, fused);
    p = clb_madd(p, r, 1.0f, fused);
    p = clb_madd(p, r, 1.0f, fused);
    int32_t e = (int32_t)n + 127;
    uint32_t bits = (uint32_t)e << 23;
    float two_n;
    memcpy(&two_n, &bits, 4);
    return p * two_n;
}

static inline float clb_exp_neg(float x)
{
    return clb_exp_neg_form(x, 1);
}

/* silu(v) = v * sigmoid(v), sigmoid from exp of -|v| only (clb_exp_neg's
 * domain; no overflow for any v): e = exp(-|v|), sigmoid = 1 / (1 + e)
 * for v >= 0 and e / (1 + e) below (both exact rewrites of 1 / (1 +
 * exp(-v))). The exp is clb_exp_neg's with its multiply-adds unfused:
 * where the target has no FMA instruction (ARMv7 as built, the ref table
 * on baseline x86-64) clb_fmaf's exact double form made the SiLU 3-5x
 * slower than libm's expf; unfused, every FPU runs it natively, and the
 * SIMD forms spend one more instruction a step on a pass that is 1 % of a
 * prefill. Relative error a few ulp against the exact value; v below -87
 * gives -0 (the true value is under 2e-36 in magnitude), NaN gives NaN.
 * The SIMD forms of silu_mul repeat these operations lane by lane. */
static inline float clb_silu(float v)
{
    const float e = clb_exp_neg_form(v >= 0.0f ? -v : v, 0);
    return v * ((v >= 0.0f ? 1.0f : e) / (1.0f + e));
}

/* ref's online-softmax step (ref.c clb_ref_attend) for a block whose
 * unmasked scores' max is mb, the running max m (any: an earlier block
 * was live): the new running max, and in *dm the argument of the block's
 * alpha = exp(m - m') (0 for the first live block, whose alpha is 0
 * whatever it is), so SIMD forms can take several queries' alphas in one
 * vector exp. */
static inline float clb_att_new_max(float m, float mb, int any, float *dm)
{
    const float mn = !any || mb > m ? mb : m;
    *dm = any ? m - mn : 0.0f;
    return mn;
}

/* Block geometry (FORMAT.md 4, colibri_format.h). */
#define CLB_Q4_0_COLS ((uint32_t)COLIBRI_Q4_0_COLS)
#define CLB_Q4_0_BYTES ((uint32_t)COLIBRI_Q4_0_BYTES)
#define CLB_Q5_0_BYTES ((uint32_t)COLIBRI_Q5_0_BYTES)
#define CLB_Q8_0_BYTES ((uint32_t)COLIBRI_Q8_0_BYTES)
#define CLB_QK_COLS ((uint32_t)COLIBRI_QK_COLS)
#define CLB_Q4_K_BYTES ((uint32_t)COLIBRI_Q4_K_BYTES)
#define CLB_Q5_K_BYTES ((uint32_t)COLIBRI_Q5_K_BYTES)
#define CLB_Q6_K_BYTES ((uint32_t)COLIBRI_Q6_K_BYTES)
/* Field offsets (GGUF's layouts): Q4_0's qs[16], Q5_0's qh[4], qs[16] and
 * Q8_0's signed qs[32] after d; Q4_K's and Q5_K's scales[12] after d and dmin, then Q5_K's
 * qh[32], then qs[128]; Q6_K's qh[64], scales[16] and d after ql[128]. */
#define CLB_Q4_0_QS 2u
#define CLB_Q5_0_QH 2u
#define CLB_Q5_0_QS 6u
#define CLB_Q8_0_QS 2u
#define CLB_QK_SCALES 4u
#define CLB_Q5_K_QH 16u
#define CLB_Q4_K_QS 16u
#define CLB_Q5_K_QS 48u
#define CLB_Q6_K_QH 128u
#define CLB_Q6_K_SC 192u
#define CLB_Q6_K_D ((unsigned)COLIBRI_Q6_K_D)

/* Block geometry of a dtype (FORMAT.md 4): columns and bytes of one block,
 * 0 for the element types (F32, I8_GROUP, I16_ROW). */
static inline uint32_t clb_block_cols(unsigned dtype)
{
    return dtype == COLIBRI_DTYPE_Q4_0 || dtype == COLIBRI_DTYPE_Q5_0 ||
                   dtype == COLIBRI_DTYPE_Q8_0 ? COLIBRI_Q4_0_COLS
         : dtype == COLIBRI_DTYPE_Q4_K || dtype == COLIBRI_DTYPE_Q5_K ||
                   dtype == COLIBRI_DTYPE_Q6_K ? COLIBRI_QK_COLS : 0;
}
static inline uint32_t clb_block_bytes(unsigned dtype)
{
    return dtype == COLIBRI_DTYPE_Q4_0 ? COLIBRI_Q4_0_BYTES
         : dtype == COLIBRI_DTYPE_Q5_0 ? COLIBRI_Q5_0_BYTES
         : dtype == COLIBRI_DTYPE_Q8_0 ? COLIBRI_Q8_0_BYTES
         : dtype == COLIBRI_DTYPE_Q4_K ? COLIBRI_Q4_K_BYTES
         : dtype == COLIBRI_DTYPE_Q5_K ? COLIBRI_Q5_K_BYTES
         : dtype == COLIBRI_DTYPE_Q6_K ? COLIBRI_Q6_K_BYTES : 0;
}
/* The fp16 scales of a block of dtype (FORMAT.md 4): returns how many (d,
 * then Q4_K's and Q5_K's dmin, 2 bytes apart), *at the byte of the first. */
static inline unsigned clb_block_scales(unsigned dtype, unsigned *at)
{
    *at = dtype == COLIBRI_DTYPE_Q6_K ? COLIBRI_Q6_K_D : 0;
    return dtype == COLIBRI_DTYPE_Q4_K || dtype == COLIBRI_DTYPE_Q5_K ? 2 : 1;
}

/* Shared by every table (ref.c): the exact values of one block row, for
 * embedding lookups. out[cols] = the first cols values of a row of nb
 * blocks of dtype (COLIBRI_DTYPE_Q4_0/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K). */
void clb_dequant_row(float *out, const uint8_t *row, unsigned dtype,
                     uint32_t cols);

/* The stored value of column i (0..31) of a Q4_0 block (0..15: the nibble
 * of qs, low for i < 16) or, with five, of a Q5_0 block (0..31: qs at CLB_Q5_0_QS,
 * bit i of the little-endian qh[4] as bit 4). */
static inline unsigned clb_q_0_value(const uint8_t *blk, unsigned i, int five)
{
    const uint8_t *qs = blk + (five ? CLB_Q5_0_QS : CLB_Q4_0_QS);
    unsigned lo = i < 16 ? qs[i] & 15u : (unsigned)qs[i - 16] >> 4;
    return five ? lo | (((unsigned)blk[CLB_Q5_0_QH + i / 8] >> (i % 8)) & 1u) << 4 : lo;
}

/* The stored value of column i (0..255) of a Q4_K block (0..15) or, with
 * five, of a Q5_K block (0..31: bit 4 is bit i / 32 of qh[i % 32]). */
static inline unsigned clb_qk_value(const uint8_t *blk, unsigned i, int five)
{
    unsigned j = i / 32, l = i % 32;
    const uint8_t *qs = blk + (five ? CLB_Q5_K_QS : CLB_Q4_K_QS);
    unsigned q = ((unsigned)qs[32 * (j / 2) + l] >> ((j & 1) * 4)) & 15u;
    return five ? q | (((unsigned)blk[CLB_Q5_K_QH + l] >> j) & 1u) << 4 : q;
}

/* Q4_K's 6-bit scale and min of sub-block j (0..7) from scales[12]. */
static inline void clb_q4k_scale_min(const uint8_t *sc12, unsigned j,
                                     uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = sc12[j] & 63;
        *m = sc12[j + 4] & 63;
    } else {
        *sc = (uint8_t)((sc12[j + 4] & 15) | ((sc12[j - 4] >> 6) << 4));
        *m = (uint8_t)((sc12[j + 4] >> 4) | ((sc12[j] >> 6) << 4));
    }
}

/* fp16 (IEEE binary16) bits -> float32, exactly (every fp16 is a float32):
 * the 11-bit significand times a power of two from a 31-entry table, both
 * exact, the sign by negation; infinity and NaN map to theirs (a checked
 * file has none). Arithmetic rather than bits moved into a float, so that
 * Frama-C EVA bounds the result (tests/c/eva/eva_kernels.c). The ref
 * table's truth, and what the SIMD tables' conversions (F16C, AVX-512,
 * AArch64 fcvt) must equal. Out of line (ref.c): one copy, called once a
 * block of 32 or 256 weights. */
float clb_f16_to_f32(uint16_t h);

/* A block's fp16 field at byte offset off, in host order (the loader
 * swapped a foreign-order file), as float32. Blocks are 2-byte aligned at
 * best (18, 22 and 210 bytes), so the load goes through memcpy. AArch64
 * has the conversion in every core (one fcvt, exact as clb_f16_to_f32:
 * test_kernels checks the NEON tables against ref on subnormal scales);
 * elsewhere clb_f16_to_f32. */
static inline float clb_blk_f16(const uint8_t *blk, unsigned off)
{
#if defined(__aarch64__) && defined(__ARM_FP16_FORMAT_IEEE)
    __fp16 h;
    memcpy(&h, blk + off, 2);
    return (float)h;
#else
    uint16_t h;
    memcpy(&h, blk + off, 2);
    return clb_f16_to_f32(h);
#endif
}

/* Always available. */
const colibri_kernels *colibri_kernels_ref(void);
/* NULL unless built with COLIBRI_USE_AVX2 (avx2.c) and the CPU has AVX2+FMA.
 * "avx2-vnni" when the CPU also has AVX-VNNI or AVX512-VNNI + AVX512VL (not
 * with COLIBRI_AVX2_NO_VNNI, scons vnni=0), else "avx2". */
const colibri_kernels *colibri_kernels_avx2(void);
/* The plain "avx2" table (no vpdpbusd) on any AVX2+FMA CPU, VNNI or not:
 * what COLIBRI_KERNELS=avx2 forces (clb_pick_kernels). NULL as above. */
const colibri_kernels *colibri_kernels_avx2_plain(void);
/* NULL unless built with COLIBRI_USE_AVX2 (avx512.c; not with
 * COLIBRI_AVX2_NO_VNNI) and the CPU has AVX-512 F/BW/VL/DQ and AVX512-VNNI
 * with the OS saving their state: "avx512-vnni" (the int8 decode form,
 * the int8 GEMM's micro-kernel, Q4_K and Q6_K for one and several tokens,
 * and attend in 512-bit vectors; the rest avx2.c's EVEX-VNNI forms). */
const colibri_kernels *colibri_kernels_avx512(void);
/* NULL unless built with COLIBRI_USE_NEON (neon.c). On AArch64 Linux the
 * "neon-dotprod" table when the CPU reports the dot-product extension
 * (getauxval(AT_HWCAP) & HWCAP_ASIMDDP), else "neon". */
const colibri_kernels *colibri_kernels_neon(void);

#ifdef __cplusplus
}
#endif
#endif /* COLIBRI_KERNELS_H */
