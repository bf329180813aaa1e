/*
 * neon_attend.c - attend and attend_rows (kernels.h) for AArch64 NEON, in
 * both of neon.c's A64 tables ("neon", "neon-dotprod"). Part of the "neon"
 * kernel set (colibri/buildsteps/sources.py); compiles to nothing off
 * AArch64 or without COLIBRI_USE_NEON. A file of its own rather than part
 * of neon.c so that gcc -fanalyzer, which stops early in a unit this size
 * (-Wanalyzer-too-complex), still explores neon.c's tiles as before.
 *
 * ref.c's flash-attention schedule with ref's float operations lane by lane
 * in ref's order, so ref's bits; the structure is avx2.c's ya_ forms in
 * 4-lane vectors. A block's 16 positions are four vectors (lanes 0-3, 4-7,
 * 8-11, 12-15). Per block its keys are loaded once and transposed (4 x 4 in
 * registers) into kt, lane = position; each of a tile's T queries sums its
 * products from kt in c order as ref does, one fused multiply-add (FMLA) a
 * product, 4 T independent chains; the output update runs along head_dim,
 * 16 columns at a time. A query the block does not reach is left as it was
 * (alpha 1, no add). attend_rows runs up to NA_G tiles as a group: each
 * block's keys are transposed once for the group (an int8 cache's values
 * widened to float once) instead of once per tile; each query still sees
 * its blocks in order, so its bits do not change.
 *
 * Only for A64: ARMv7-A NEON has no fused vector multiply-add (VFPv4's is
 * not in plain armv7-a), so the armv7 table keeps ref's attention. The
 * SwiGLU's silu_mul lives here too: it is built on the same exp.
 */
#include "kernels.h"

#if defined(COLIBRI_USE_NEON) && defined(__aarch64__)

#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "neon_inline.h" /* BLOCK, UNROLL */

/* NA_T queries a tile, NA_C columns of keys a transposed chunk (kt: 16
 * KiB), NA_G tiles a group. */
enum { NA_T = 4, NA_C = 256, NA_G = 8 };

typedef clb_att_tile na_tile; /* kernels.h; NA_T of its queries */
_Static_assert(NA_T <= CLB_ATT_TILE, "a tile holds NA_T queries");

/* Lane i all ones where bit i of bits is set (4 lanes). */
BLOCK uint32x4_t na_lanes(uint32_t bits)
{
    const uint32x4_t sel = {1u, 2u, 4u, 8u};
    return vtstq_u32(vdupq_n_u32(bits), sel);
}

/* c + a * b fused (FMLA), or a multiply and an add each rounded (kernels.h
 * clb_madd); x - n * c the same way (FMLS, or FMUL and FSUB). */
BLOCK float32x4_t na_madd(float32x4_t c, float32x4_t a, float32x4_t b, int fused)
{
    return fused ? vfmaq_f32(c, a, b) : vaddq_f32(c, vmulq_f32(a, b));
}
BLOCK float32x4_t na_nmadd(float32x4_t x, float32x4_t n, float32x4_t c, int fused)
{
    return fused ? vfmsq_f32(x, n, c) : vsubq_f32(x, vmulq_f32(n, c));
}

/* clb_exp_neg_form for 4 lanes: the same operations (kernels.h). Fused,
 * fma(-n, c, x) is FMLS x - n * c (one rounding, the negation exact); n is
 * a whole number, so the truncating conversion is exact. */
BLOCK float32x4_t na_exp4_form(float32x4_t x, int fused)
{
    const uint32x4_t ok = vcgeq_f32(x, vdupq_n_f32(CLB_EXP_MIN));
    const uint32x4_t num = vceqq_f32(x, x);
    const float32x4_t big = vdupq_n_f32(12582912.0f);
    float32x4_t n = vmulq_f32(x, vdupq_n_f32(CLB_EXP_LOG2E));
    n = vsubq_f32(vaddq_f32(n, big), big);
    float32x4_t r = na_nmadd(x, n, vdupq_n_f32(CLB_EXP_LN2_HI), fused);
    r = na_nmadd(r, n, vdupq_n_f32(CLB_EXP_LN2_LO), fused);
    float32x4_t p = vdupq_n_f32(CLB_EXP_C7);
    p = na_madd(vdupq_n_f32(CLB_EXP_C6), p, r, fused);
    p = na_madd(vdupq_n_f32(CLB_EXP_C5), p, r, fused);
    p = na_madd(vdupq_n_f32(CLB_EXP_C4), p, r, fused);
    p = na_madd(vdupq_n_f32(CLB_EXP_C3), p, r, fused);
    p = na_madd(vdupq_n_f32(CLB_EXP_C2), p, r, fused);
    p = na_madd(vdupq_n_f32(1.0f), p, r, fused);
    p = na_madd(vdupq_n_f32(1.0f), p, r, fused);
    /* out-of-range lanes hold anything in n: their exponent is not used */
    const float32x4_t nk = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(n), ok));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(nk), vdupq_n_s32(127)), 23);
    const uint32x4_t v = vandq_u32(vreinterpretq_u32_f32(vmulq_f32(p, vreinterpretq_f32_s32(e))), ok);
    return vbslq_f32(num, vreinterpretq_f32_u32(v), x);
}

/* The attention's exp (out of line: one copy for its several callers). */
static __attribute__((noinline)) float32x4_t na_exp4(float32x4_t x)
{
    return na_exp4_form(x, 1);
}

/* ref's running max of s[i] over the lanes i of bits (at least one) as a
 * vector maxNum: the same value whatever the order but for the sign of a
 * zero and a NaN (avx2.c ya_max16 says why neither changes a result). */
BLOCK float na_max16(const float *s, uint32_t bits)
{
    const float32x4_t ninf = vdupq_n_f32(-INFINITY);
    float32x4_t m = ninf;
    UNROLL
    for (uint32_t h = 0; h < 4; h++)
        m = vmaxnmq_f32(m, vbslq_f32(na_lanes(bits >> (4 * h)), vld1q_f32(s + 4 * h), ninf));
    return vmaxnmvq_f32(m);
}

/* ref's halving tree over 16 lanes (ph = lanes 4h .. 4h + 3): lane j +=
 * lane j + 8, then j + 4, j + 2, j + 1. */
BLOCK float na_sum16(float32x4_t p0, float32x4_t p1, float32x4_t p2, float32x4_t p3)
{
    const float32x4_t c = vaddq_f32(vaddq_f32(p0, p2), vaddq_f32(p1, p3));
    const float32x2_t d = vadd_f32(vget_low_f32(c), vget_high_f32(c));
    return vget_lane_f32(d, 0) + vget_lane_f32(d, 1);
}

/* 4 values from q[0 .. k) (k <= 4; the rest 0) as float (exact). */
BLOCK float32x4_t na_i8x4(const int8_t *q, uint32_t k)
{
    int8_t b8[8] = {0};
    memcpy(b8, q, k < 4 ? k : 4);
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(vld1_s8(b8)))));
}

/* 4 floats from f[0 .. k) (k <= 4; the rest 0). */
BLOCK float32x4_t na_f32x4(const float *f, uint32_t k)
{
    if (k >= 4)
        return vld1q_f32(f);
    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    memcpy(t, f, k * sizeof(float));
    return vld1q_f32(t);
}

/* Columns c .. c + k (k <= 4) of key b + row as float, 0 if row is not in
 * keep. */
BLOCK float32x4_t na_row(const clb_att_args *a, uint32_t b, uint32_t keep, uint32_t row,
                         uint32_t c, uint32_t k)
{
    if (!(keep >> row & 1u))
        return vdupq_n_f32(0.0f);
    const size_t at = (size_t)(b + row) * a->ld + c;
    return a->K ? na_f32x4(a->K + at, k) : na_i8x4(a->Kq + at, k);
}

/* kt[16 (c - c0) + lane] = key (b + lane)'s column c (int8: as float), for
 * c in c0 .. c0 + cn rounded up to 4 (cn <= NA_C) and the lanes in keep
 * (others 0). */
static __attribute__((noinline)) void na_keys(float *kt, const clb_att_args *a, uint32_t b,
                                              uint32_t keep, uint32_t c0, uint32_t cn)
{
    for (uint32_t c = 0; c < cn; c += 4) {
        const uint32_t k = cn - c < 4 ? cn - c : 4;
        for (uint32_t h = 0; h < 4; h++) {
            const float32x4_t r0 = na_row(a, b, keep, 4 * h, c0 + c, k);
            const float32x4_t r1 = na_row(a, b, keep, 4 * h + 1, c0 + c, k);
            const float32x4_t r2 = na_row(a, b, keep, 4 * h + 2, c0 + c, k);
            const float32x4_t r3 = na_row(a, b, keep, 4 * h + 3, c0 + c, k);
            /* t0 = r0[0] r1[0] r0[2] r1[2], t1 = r0[1] r1[1] r0[3] r1[3], ... */
            const float64x2_t t0 = vreinterpretq_f64_f32(vtrn1q_f32(r0, r1));
            const float64x2_t t1 = vreinterpretq_f64_f32(vtrn2q_f32(r0, r1));
            const float64x2_t t2 = vreinterpretq_f64_f32(vtrn1q_f32(r2, r3));
            const float64x2_t t3 = vreinterpretq_f64_f32(vtrn2q_f32(r2, r3));
            float *at = kt + 16 * (size_t)c + 4 * h;
            vst1q_f32(at, vreinterpretq_f32_f64(vtrn1q_f64(t0, t2)));
            vst1q_f32(at + 16, vreinterpretq_f32_f64(vtrn1q_f64(t1, t3)));
            vst1q_f32(at + 32, vreinterpretq_f32_f64(vtrn2q_f64(t0, t2)));
            vst1q_f32(at + 48, vreinterpretq_f32_f64(vtrn2q_f64(t1, t3)));
        }
    }
}

/* vf[i * d + c] = value row (b + i)'s column c as float (int8 cache), for
 * the rows i in keep: widened once for a group of tiles (exact). */
static __attribute__((noinline)) void na_vals(float *vf, const clb_att_args *a, uint32_t b,
                                              uint32_t nb, uint32_t keep)
{
    for (uint32_t i = 0; i < nb; i++) {
        if (!(keep >> i & 1u))
            continue;
        const int8_t *vq = a->Vq + (size_t)(b + i) * a->ld;
        float *row = vf + (size_t)i * a->d;
        uint32_t c = 0;
        for (; c + 4 <= a->d; c += 4)
            vst1q_f32(row + c, na_i8x4(vq + c, 4));
        for (; c < a->d; c++)
            row[c] = (float)vq[c];
    }
}

/* Value row i's 4 columns from c (k of them, 1..4) as float: from the
 * float rows vr (vld apart), else the int8 cache widened here. */
BLOCK float32x4_t na_val4(const clb_att_args *a, const float *vr, size_t vld, uint32_t b,
                          uint32_t i, uint32_t c, uint32_t k)
{
    return vr ? na_f32x4(vr + i * vld + c, k) : na_i8x4(a->Vq + (size_t)(b + i) * a->ld + c, k);
}

/* p_i = exp(s_i - m) for lanes 4h .. 4h + 3 (0 outside kj), and into w
 * their weights of v_i: p_i (int8: p_i * vs_i, ref's product). */
BLOCK float32x4_t na_p4(const clb_att_args *a, const float *s, float m, uint32_t kj, uint32_t h,
                        const float *vs, float *w)
{
    const float32x4_t e = na_exp4(vsubq_f32(vld1q_f32(s + 4 * h), vdupq_n_f32(m)));
    const float32x4_t p = vreinterpretq_f32_u32(vandq_u32(na_lanes(kj >> (4 * h)),
                                                          vreinterpretq_u32_f32(e)));
    vst1q_f32(w + 4 * h, a->K ? p : vmulq_f32(p, vld1q_f32(vs + 4 * h)));
    return p;
}

/* The block's softmax step for the tile's T queries, from their dots
 * sj[j] (overwritten by the scores): the new running maxima and sums, the
 * alphas (1 for a query the block does not reach) and the weights w of the
 * values. Out of line, T a variable: the copies of na_block per width keep
 * only the loops over columns. */
static __attribute__((noinline)) void na_softmax(const int T, na_tile *t, const clb_att_args *a,
                                                 uint32_t b, uint32_t nb, uint32_t keep,
                                                 const uint32_t *kj, float sj[][CLB_ATT_BLOCK],
                                                 float *alpha, float w[][CLB_ATT_BLOCK])
{
    float ks[CLB_ATT_BLOCK] = {0}, vs[CLB_ATT_BLOCK] = {0};
    if (!a->K)
        for (uint32_t i = 0; i < nb; i++)
            if (keep >> i & 1u) {
                ks[i] = a->Ks[(size_t)(b + i) * a->lds];
                vs[i] = a->Vs[(size_t)(b + i) * a->lds];
            }
    /* the scores: (dot [* ks]) * scale [+ bias], ref's operations in ref's order */
    for (int j = 0; j < T; j++)
        for (int h = 0; h < 4; h++) {
            const float32x4_t dv = vld1q_f32(sj[j] + 4 * h);
            const float32x4_t sv = a->K ? vmulq_n_f32(dv, a->scale)
                : vmulq_n_f32(vmulq_f32(dv, vld1q_f32(ks + 4 * h)), a->scale);
            vst1q_f32(sj[j] + 4 * h, sv);
        }
    for (int j = 0; j < T; j++)
        clb_att_add_bias(sj[j], t->bias[j], a->bias_step, b, kj[j]);
    /* the new running maxima, and alpha = exp(m - m') for the T queries in
     * one vector exp (lane j: query j) */
    float mn[NA_T], dm[4] = {0.0f, 0.0f, 0.0f, 0.0f}, ex[4];
    for (int j = 0; j < T; j++) {
        mn[j] = t->m[j];
        if (kj[j])
            mn[j] = clb_att_new_max(t->m[j], na_max16(sj[j], kj[j]), t->any[j], dm + j);
    }
    vst1q_f32(ex, na_exp4(vld1q_f32(dm)));
    for (int j = 0; j < T; j++) {
        alpha[j] = 1.0f;
        if (!kj[j])
            continue;
        alpha[j] = t->any[j] ? ex[j] : 0.0f;
        /* p_i, straight-line (the analysers see all four written), and
         * the weights of the v_i */
        const float32x4_t p0 = na_p4(a, sj[j], mn[j], kj[j], 0, vs, w[j]);
        const float32x4_t p1 = na_p4(a, sj[j], mn[j], kj[j], 1, vs, w[j]);
        const float32x4_t p2 = na_p4(a, sj[j], mn[j], kj[j], 2, vs, w[j]);
        const float32x4_t p3 = na_p4(a, sj[j], mn[j], kj[j], 3, vs, w[j]);
        t->l[j] = t->l[j] * alpha[j] + na_sum16(p0, p1, p2, p3);
        t->m[j] = mn[j];
        t->any[j] = 1;
    }
}

/* The output update of columns c0 .. d one query and position at a time,
 * testing each lane: the columns past the last 16 and every block at the
 * causal edge or with masked positions. Out of line, T a variable. w is
 * only read (not const: C11 does not convert float (*)[16] to const
 * float (*)[16]). */
static __attribute__((noinline)) void na_values_edge(const int T, na_tile *t, const clb_att_args *a,
                                                     uint32_t b, uint32_t nb, uint32_t keep,
                                                     const uint32_t *kj, const float *vr, size_t vld,
                                                     const float *alpha,
                                                     float w[][CLB_ATT_BLOCK], uint32_t c0)
{
    const uint32_t d = a->d;
    for (uint32_t c = c0; c < d; c += 4) {
        const uint32_t k = d - c < 4 ? d - c : 4;
        float32x4_t o[NA_T];
        for (int j = 0; j < T; j++)
            o[j] = kj[j] ? vmulq_n_f32(na_f32x4(t->o[j] + c, k), alpha[j]) : vdupq_n_f32(0.0f);
        for (uint32_t i = 0; i < nb; i++) {
            if (!(keep >> i & 1u))
                continue;
            const float32x4_t v = na_val4(a, vr, vld, b, i, c, k);
            for (int j = 0; j < T; j++)
                if (kj[j] >> i & 1u)
                    o[j] = vfmaq_n_f32(o[j], v, w[j][i]);
        }
        for (int j = 0; j < T; j++)
            if (kj[j]) {
                float out[4];
                vst1q_f32(out, o[j]);
                memcpy(t->o[j] + c, out, k * sizeof(float));
            }
    }
}

/* One block b of the tile (avx2.c ya_block). shared: kt already holds the
 * block's keys for every column (d <= NA_C) and, for an int8 cache, vf its
 * values as float (na_run's group); otherwise the tile transposes its own
 * and reads the values from the cache. */
BLOCK void na_block(const int T, na_tile *t, const clb_att_args *a, uint32_t b, uint32_t nb,
                    uint32_t keep, const uint32_t *kj, float *kt, int shared, const float *vf)
{
    const uint32_t d = a->d;
    float32x4_t acc[NA_T][4];
    UNROLL
    for (int j = 0; j < T; j++)
        UNROLL
        for (int h = 0; h < 4; h++)
            acc[j][h] = vdupq_n_f32(0.0f);
    for (uint32_t c0 = 0; c0 < d; c0 += NA_C) {
        const uint32_t cn = d - c0 < NA_C ? d - c0 : NA_C;
        if (!shared)
            na_keys(kt, a, b, keep, c0, cn);
        for (uint32_t c = 0; c < cn; c++) {
            const float *kc = kt + 16 * (size_t)c;
            const float32x4_t k0 = vld1q_f32(kc), k1 = vld1q_f32(kc + 4);
            const float32x4_t k2 = vld1q_f32(kc + 8), k3 = vld1q_f32(kc + 12);
            UNROLL
            for (int j = 0; j < T; j++) {
                const float qc = t->q[j][c0 + c];
                acc[j][0] = vfmaq_n_f32(acc[j][0], k0, qc);
                acc[j][1] = vfmaq_n_f32(acc[j][1], k1, qc);
                acc[j][2] = vfmaq_n_f32(acc[j][2], k2, qc);
                acc[j][3] = vfmaq_n_f32(acc[j][3], k3, qc);
            }
        }
    }
    float alpha[NA_T], w[NA_T][CLB_ATT_BLOCK], sj[NA_T][CLB_ATT_BLOCK];
    UNROLL
    for (int j = 0; j < T; j++)
        UNROLL
        for (int h = 0; h < 4; h++)
            vst1q_f32(sj[j] + 4 * h, acc[j][h]);
    na_softmax(T, t, a, b, nb, keep, kj, sj, alpha, w);
    /* The values: float rows at vr + i * vld (the f32 cache, or vf), or the
     * int8 cache widened here. full: every query of the tile takes all 16
     * positions, so the loop tests no lane. */
    const float *vr = a->V ? a->V + (size_t)b * a->ld : shared ? vf : NULL;
    const size_t vld = a->V ? a->ld : d;
    int full = keep == 0xffffu;
    for (int j = 0; j < T; j++)
        full = full && kj[j] == 0xffffu;
    uint32_t c = 0;
    if (full)
        for (; c + 16 <= d; c += 16) {
            float32x4_t o[NA_T][4];
            UNROLL
            for (int j = 0; j < T; j++)
                UNROLL
                for (int h = 0; h < 4; h++)
                    o[j][h] = vmulq_n_f32(vld1q_f32(t->o[j] + c + 4 * h), alpha[j]);
            for (uint32_t i = 0; i < CLB_ATT_BLOCK; i++) {
                float32x4_t v[4];
                if (vr) {
                    UNROLL
                    for (int h = 0; h < 4; h++)
                        v[h] = vld1q_f32(vr + i * vld + c + 4 * h);
                } else {
                    const int8x16_t q = vld1q_s8(a->Vq + (size_t)(b + i) * a->ld + c);
                    const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_s8(vget_high_s8(q));
                    v[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
                    v[1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo)));
                    v[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
                    v[3] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi)));
                }
                UNROLL
                for (int j = 0; j < T; j++)
                    UNROLL
                    for (int h = 0; h < 4; h++)
                        o[j][h] = vfmaq_n_f32(o[j][h], v[h], w[j][i]);
            }
            UNROLL
            for (int j = 0; j < T; j++)
                UNROLL
                for (int h = 0; h < 4; h++)
                    vst1q_f32(t->o[j] + c + 4 * h, o[j][h]);
        }
    if (c < d)
        na_values_edge(T, t, a, b, nb, keep, kj, vr, vld, alpha, w, c);
}

/* The queries of the nt tiles t (n[j] positions each, outputs zeroed) to
 * the end, block by block for the group (avx2.c ya_run). */
BLOCK void na_run(const int T, na_tile *t, uint32_t nt, const clb_att_args *a)
{
    float kt[NA_C * CLB_ATT_BLOCK], vf[NA_C * CLB_ATT_BLOCK];
    const int shared = nt > 1 && a->d <= NA_C; /* one tile: nothing to share */
    const uint32_t nmax = clb_att_tiles_start(t, nt, (uint32_t)T);
    for (uint32_t b = 0; b < nmax; b += CLB_ATT_BLOCK) {
        const uint32_t nb = nmax - b < CLB_ATT_BLOCK ? nmax - b : CLB_ATT_BLOCK;
        clb_att_prefetch_ahead(a, b, nmax);
        uint32_t reach[NA_G], kj[NA_G][CLB_ATT_TILE]; /* lane bits of the unmasked positions */
        const uint32_t all = clb_att_block_lanes(a, t, nt, (uint32_t)T, b, nb, reach, kj);
        if (!all)
            continue;
        if (shared) {
            na_keys(kt, a, b, all, 0, a->d);
            if (!a->V)
                na_vals(vf, a, b, nb, all);
        }
        for (uint32_t k = 0; k < nt; k++)
            if (reach[k])
                na_block(T, t + k, a, b, nb, reach[k], kj[k], kt, shared, vf);
    }
    for (uint32_t k = 0; k < nt; k++)
        for (int j = 0; j < T; j++) {
            if (!t[k].any[j])
                continue;
            float *o = t[k].o[j];
            const float32x4_t lv = vdupq_n_f32(t[k].l[j]);
            uint32_t c = 0;
            for (; c + 4 <= a->d; c += 4)
                vst1q_f32(o + c, vdivq_f32(vld1q_f32(o + c), lv));
            for (; c < a->d; c++)
                o[c] = o[c] / t[k].l[j];
        }
}

/* The nt tiles t at tile width T (1, 2, 4): a constant in each inlined
 * copy, so a tile's chains stay in registers and few queries (a decode
 * step's GQA group) pay for no padding queries. */
static void na_run_width(int T, na_tile *t, uint32_t nt, const clb_att_args *a)
{
    switch (T) {
    case 1:
        na_run(1, t, nt, a);
        break;
    case 2:
        na_run(2, t, nt, a);
        break;
    default:
        na_run(4, t, nt, a);
        break;
    }
}

void clb_neon_attend_rows(const clb_att_rows *r, const clb_att_args *a)
{
    const uint32_t nq = r->nr * r->nh;
    const int T = nq > 2u ? 4 : (int)nq;
    for (uint32_t g0 = 0; g0 < nq; g0 += (uint32_t)T * NA_G) {
        na_tile t[NA_G];
        uint32_t nt = 0;
        for (uint32_t t0 = g0; t0 < nq && nt < NA_G; t0 += (uint32_t)T, nt++)
            clb_att_tile_queries(r, a->d, t0, (uint32_t)T, t + nt);
        na_run_width(T, t, nt, a);
    }
}

void clb_neon_attend(float *out, const clb_att_args *a)
{
    na_tile t;
    clb_att_tile_one(a, out, &t);
    na_run_width(1, &t, 1, a);
}

/* silu_mul: clb_silu lane by lane (kernels.h; its exp unfused); the last
 * len % 4 through ref, the same operations on one lane. */
void clb_neon_silu_mul(float *h, const float *g, size_t len)
{
    const float32x4_t one = vdupq_n_f32(1.0f);
    size_t i = 0;
    for (; i + 4 <= len; i += 4) {
        const float32x4_t v = vld1q_f32(h + i);
        const float32x4_t e = na_exp4_form(vnegq_f32(vabsq_f32(v)), 0);
        const uint32x4_t pos = vcgeq_f32(v, vdupq_n_f32(0.0f));
        const float32x4_t s = vdivq_f32(vbslq_f32(pos, one, e), vaddq_f32(one, e));
        vst1q_f32(h + i, vmulq_f32(vmulq_f32(v, s), vld1q_f32(g + i)));
    }
    clb_ref_silu_mul(h + i, g + i, len - i);
}

#else
/* ISO C wants at least one declaration in a translation unit. */
typedef int colibri_neon_attend_not_built;

#endif
