/*
 * ref.c - the portable reference kernels: plain C11, one multiply-add at a
 * time in column order, float32 accumulation. They define the truth the
 * optimised kernels (avx2.c, neon.c) are checked against, and with
 * -ffp-contract=off they give bit-identical results on every target.
 * Arithmetic: docs/FORMAT.md section 5.
 */
#include "kernels.h"

#include <math.h>

/* Y[n, rows] = X[n, cols] * W^T. */
static void ref_matmul_f32(float *Y, const float *W, const float *X,
                           uint32_t n, uint32_t rows, uint32_t cols)
{
    for (uint32_t t = 0; t < n; t++) {
        const float *x = X + (size_t)t * cols;
        float *y = Y + (size_t)t * rows;
        for (uint32_t r = 0; r < rows; r++) {
            const float *w = W + (size_t)r * cols;
            float acc = 0.0f;
            for (uint32_t c = 0; c < cols; c++)
                acc += w[c] * x[c];
            y[r] = acc;
        }
    }
}

/* Per row t and group g: xs = amax/127, xq = clip(rint(x * 127/amax)). Both
 * 0 for an all-zero group. rintf rounds half to even in the default rounding
 * mode, as numpy's rint does. */
static void ref_quantize_act_i8(int8_t *XQ, float *XS, const float *X,
                                uint32_t n, uint32_t cols, uint32_t group)
{
    uint32_t ngroups = (cols + group - 1) / group;
    for (uint32_t t = 0; t < n; t++) {
        const float *x = X + (size_t)t * cols;
        int8_t *xq = XQ + (size_t)t * cols;
        float *xs = XS + (size_t)t * ngroups;
        for (uint32_t g = 0; g < ngroups; g++) {
            uint32_t c0 = g * group;
            uint32_t c1 = c0 + group < cols ? c0 + group : cols;
            float amax = 0.0f;
            for (uint32_t c = c0; c < c1; c++) {
                float a = fabsf(x[c]);
                if (a > amax)
                    amax = a;
            }
            if (amax == 0.0f) {
                xs[g] = 0.0f;
                for (uint32_t c = c0; c < c1; c++)
                    xq[c] = 0;
                continue;
            }
            float inv = 127.0f / amax;
            xs[g] = amax / 127.0f;
            for (uint32_t c = c0; c < c1; c++) {
                float v = rintf(x[c] * inv);
                /* NaN (a NaN activation, or inf * 0 when amax is inf: a
                 * CRC-valid file may hold non-finite weights) has no int8
                 * value and converting it is undefined behaviour: use 0. */
                if (v != v)
                    v = 0.0f;
                if (v > 127.0f)
                    v = 127.0f;
                if (v < -127.0f)
                    v = -127.0f;
                xq[c] = (int8_t)v;
            }
        }
    }
}

/* y[r] = sum_g float(int32 dot over group g) * (S[r,g] * XS[t,g]). */
static void ref_matmul_i8(float *Y, const int8_t *Q, const float *S,
                          const int8_t *XQ, const float *XS, uint32_t n,
                          uint32_t rows, uint32_t cols, uint32_t group)
{
    uint32_t ngroups = (cols + group - 1) / group;
    for (uint32_t t = 0; t < n; t++) {
        const int8_t *xq = XQ + (size_t)t * cols;
        const float *xs = XS + (size_t)t * ngroups;
        float *y = Y + (size_t)t * rows;
        for (uint32_t r = 0; r < rows; r++) {
            const int8_t *q = Q + (size_t)r * cols;
            const float *s = S + (size_t)r * ngroups;
            float acc = 0.0f;
            for (uint32_t g = 0; g < ngroups; g++) {
                uint32_t c0 = g * group;
                uint32_t c1 = c0 + group < cols ? c0 + group : cols;
                int32_t dot = 0;
                for (uint32_t c = c0; c < c1; c++)
                    dot += (int32_t)q[c] * (int32_t)xq[c];
                acc += (float)dot * (s[g] * xs[g]);
            }
            y[r] = acc;
        }
    }
}

/* y[r] = S[r] * sum_c float(Q[r,c]) * x[c]. */
static void ref_matmul_i16(float *Y, const int16_t *Q, const float *S,
                           const float *X, uint32_t n, uint32_t rows,
                           uint32_t cols)
{
    for (uint32_t t = 0; t < n; t++) {
        const float *x = X + (size_t)t * cols;
        float *y = Y + (size_t)t * rows;
        for (uint32_t r = 0; r < rows; r++) {
            const int16_t *q = Q + (size_t)r * cols;
            float acc = 0.0f;
            for (uint32_t c = 0; c < cols; c++)
                acc += (float)q[c] * x[c];
            y[r] = S[r] * acc;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Block types (FORMAT.md 4-5): Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K          */
/* ------------------------------------------------------------------------ */

/* Per row t and block b of `block` columns: the I8 activation quantisation
 * of the block's real columns, zeros past cols; XB the sums of 16. */
void clb_ref_quantize_act_blk(int8_t *XQ, float *XS, int16_t *XB,
                                 const float *X, uint32_t n, uint32_t cols,
                                 uint32_t block)
{
    uint32_t nb = (cols + block - 1) / block;
    size_t padded = (size_t)nb * block;
    for (uint32_t t = 0; t < n; t++) {
        int8_t *xq = XQ + (size_t)t * padded;
        int16_t *xb = XB + (size_t)t * (padded / 16);
        /* The real columns exactly as quantize_act_i8 with group `block`
         * (its last group is the short one), then the zero tail. */
        ref_quantize_act_i8(xq, XS + (size_t)t * nb, X + (size_t)t * cols, 1,
                            cols, block);
        for (size_t c = cols; c < padded; c++)
            xq[c] = 0;
        for (size_t s = 0; s < padded / 16; s++) {
            int32_t sum = 0;
            for (unsigned c = 0; c < 16; c++)
                sum += xq[s * 16 + c];
            xb[s] = (int16_t)sum;
        }
    }
}

/* The value of column i (0..31) of a block of dtype Q4_0, Q5_0 or Q8_0:
 * the stored integer less the type's zero (8, 16; Q8_0's is signed). */
static int32_t q_0_value(const uint8_t *blk, unsigned i, unsigned dtype)
{
    if (dtype == COLIBRI_DTYPE_Q8_0)
        return ((const int8_t *)blk)[CLB_Q8_0_QS + i];
    const int five = dtype == COLIBRI_DTYPE_Q5_0;
    return (int32_t)clb_q_0_value(blk, i, five) - (five ? 16 : 8);
}

/* y = sum_b float(dot_b) * (d_b * xs_b): the I8 form with 4-bit (Q4_0,
 * dot = sum (q - 8) x), 5-bit (Q5_0, sum (q - 16) x) or 8-bit values
 * (Q8_0, sum q x: I8_GROUP's group term with an fp16 scale). */
static void ref_matmul_q_0(unsigned dtype, float *Y, const uint8_t *W, const int8_t *XQ,
                           const float *XS, uint32_t n, uint32_t rows, uint32_t cols)
{
    const uint32_t bytes = clb_block_bytes(dtype);
    uint32_t nb = (cols + CLB_Q4_0_COLS - 1) / CLB_Q4_0_COLS;
    for (uint32_t t = 0; t < n; t++) {
        const int8_t *xq = XQ + (size_t)t * nb * CLB_Q4_0_COLS;
        const float *xs = XS + (size_t)t * nb;
        for (uint32_t r = 0; r < rows; r++) {
            const uint8_t *blk = W + (size_t)r * nb * bytes;
            float acc = 0.0f;
            for (uint32_t b = 0; b < nb; b++, blk += bytes) {
                const int8_t *x = xq + (size_t)b * CLB_Q4_0_COLS;
                int32_t dot = 0;
                for (unsigned i = 0; i < 32; i++)
                    dot += q_0_value(blk, i, dtype) * x[i];
                acc += (float)dot * (clb_blk_f16(blk, 0) * xs[b]);
            }
            Y[(size_t)t * rows + r] = acc;
        }
    }
}

void clb_ref_matmul_q4_0(float *Y, const uint8_t *W, const int8_t *XQ,
                         const float *XS, const int16_t *XB, uint32_t n,
                         uint32_t rows, uint32_t cols)
{
    (void)XB;
    ref_matmul_q_0(COLIBRI_DTYPE_Q4_0, Y, W, XQ, XS, n, rows, cols);
}

void clb_ref_matmul_q5_0(float *Y, const uint8_t *W, const int8_t *XQ,
                         const float *XS, const int16_t *XB, uint32_t n,
                         uint32_t rows, uint32_t cols)
{
    (void)XB;
    ref_matmul_q_0(COLIBRI_DTYPE_Q5_0, Y, W, XQ, XS, n, rows, cols);
}

void clb_ref_matmul_q8_0(float *Y, const uint8_t *W, const int8_t *XQ,
                         const float *XS, const int16_t *XB, uint32_t n,
                         uint32_t rows, uint32_t cols)
{
    (void)XB;
    ref_matmul_q_0(COLIBRI_DTYPE_Q8_0, Y, W, XQ, XS, n, rows, cols);
}

/* acc += xs * (d * float(sum_j sc_j dot_j) - dmin * float(sum_j m_j bsum_j)),
 * Q4_K (five = 0) or Q5_K (five = 1: the values have a fifth bit). */
static void ref_matmul_qk_affine(int five, float *Y, const uint8_t *W, const int8_t *XQ,
                                 const float *XS, const int16_t *XB, uint32_t n,
                                 uint32_t rows, uint32_t cols)
{
    const uint32_t bytes = five ? CLB_Q5_K_BYTES : CLB_Q4_K_BYTES;
    uint32_t nb = (cols + CLB_QK_COLS - 1) / CLB_QK_COLS;
    for (uint32_t t = 0; t < n; t++) {
        const int8_t *xq = XQ + (size_t)t * nb * CLB_QK_COLS;
        const int16_t *xb = XB + (size_t)t * nb * (CLB_QK_COLS / 16);
        const float *xs = XS + (size_t)t * nb;
        for (uint32_t r = 0; r < rows; r++) {
            const uint8_t *blk = W + (size_t)r * nb * bytes;
            float acc = 0.0f;
            for (uint32_t b = 0; b < nb; b++, blk += bytes) {
                const int8_t *x = xq + (size_t)b * CLB_QK_COLS;
                const int16_t *bs = xb + (size_t)b * (CLB_QK_COLS / 16);
                int32_t isum = 0, msum = 0;
                for (unsigned j = 0; j < 8; j++) {
                    uint8_t sc, m;
                    clb_q4k_scale_min(blk + CLB_QK_SCALES, j, &sc, &m);
                    int32_t dot = 0;
                    for (unsigned l = 0; l < 32; l++)
                        dot += (int32_t)clb_qk_value(blk, 32 * j + l, five) * x[32 * j + l];
                    isum += (int32_t)sc * dot;
                    msum += (int32_t)m * ((int32_t)bs[2 * j] + bs[2 * j + 1]);
                }
                float dd = clb_blk_f16(blk, 0) * (float)isum;
                float mm = clb_blk_f16(blk, 2) * (float)msum;
                acc += xs[b] * (dd - mm);
            }
            Y[(size_t)t * rows + r] = acc;
        }
    }
}

void clb_ref_matmul_q4_k(float *Y, const uint8_t *W, const int8_t *XQ,
                         const float *XS, const int16_t *XB, uint32_t n,
                         uint32_t rows, uint32_t cols)
{
    ref_matmul_qk_affine(0, Y, W, XQ, XS, XB, n, rows, cols);
}

void clb_ref_matmul_q5_k(float *Y, const uint8_t *W, const int8_t *XQ,
                         const float *XS, const int16_t *XB, uint32_t n,
                         uint32_t rows, uint32_t cols)
{
    ref_matmul_qk_affine(1, Y, W, XQ, XS, XB, n, rows, cols);
}

/* acc += xs * (d * float(sum_j sc_j dot_j)), q - 32 signed. */
void clb_ref_matmul_q6_k(float *Y, const uint8_t *W, const int8_t *XQ,
                            const float *XS, const int16_t *XB, uint32_t n,
                            uint32_t rows, uint32_t cols)
{
    (void)XB;
    uint32_t nb = (cols + CLB_QK_COLS - 1) / CLB_QK_COLS;
    for (uint32_t t = 0; t < n; t++) {
        const int8_t *xq = XQ + (size_t)t * nb * CLB_QK_COLS;
        const float *xs = XS + (size_t)t * nb;
        for (uint32_t r = 0; r < rows; r++) {
            const uint8_t *blk = W + (size_t)r * nb * CLB_Q6_K_BYTES;
            float acc = 0.0f;
            for (uint32_t b = 0; b < nb; b++, blk += CLB_Q6_K_BYTES) {
                const uint8_t *ql = blk, *qh = blk + CLB_Q6_K_QH;
                const int8_t *sc = (const int8_t *)(blk + CLB_Q6_K_SC);
                const int8_t *x = xq + (size_t)b * CLB_QK_COLS;
                int32_t isum = 0;
                for (unsigned j = 0; j < 16; j++) {
                    int32_t dot = 0;
                    for (unsigned c = 0; c < 16; c++) {
                        unsigned i = 16 * j + c, h = i / 128, rr = i % 128;
                        unsigned l = rr % 32, s = rr / 32;
                        unsigned lo = ql[64 * h + l + 32 * (s % 2)];
                        lo = s < 2 ? lo & 15 : lo >> 4;
                        unsigned hi = (qh[32 * h + l] >> (2 * s)) & 3;
                        dot += ((int32_t)(lo | hi << 4) - 32) * x[i];
                    }
                    isum += (int32_t)sc[j] * dot;
                }
                acc += xs[b] * (clb_blk_f16(blk, CLB_Q6_K_D) * (float)isum);
            }
            Y[(size_t)t * rows + r] = acc;
        }
    }
}

float clb_f16_to_f32(uint16_t h)
{
    static const float pow2[31] = { /* 2^(e - 25), e = 0..30 (e = 0 unused) */
        0x1p-25f, 0x1p-24f, 0x1p-23f, 0x1p-22f, 0x1p-21f, 0x1p-20f, 0x1p-19f, 0x1p-18f,
        0x1p-17f, 0x1p-16f, 0x1p-15f, 0x1p-14f, 0x1p-13f, 0x1p-12f, 0x1p-11f, 0x1p-10f,
        0x1p-9f, 0x1p-8f, 0x1p-7f, 0x1p-6f, 0x1p-5f, 0x1p-4f, 0x1p-3f, 0x1p-2f,
        0x1p-1f, 0x1p0f, 0x1p1f, 0x1p2f, 0x1p3f, 0x1p4f, 0x1p5f };
    uint32_t e = (h >> 10) & 31u, m = h & 0x3ffu;
    float v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = (float)(e ? m | 0x400u : m) * pow2[e ? e : 1];
    return (h & 0x8000u) ? -v : v;
}

void clb_dequant_row(float *out, const uint8_t *row, unsigned dtype,
                     uint32_t cols)
{
    for (uint32_t i = 0; i < cols; i++) {
        if (clb_block_cols(dtype) == CLB_Q4_0_COLS) { /* Q4_0, Q5_0, Q8_0 */
            const uint8_t *blk = row + (size_t)(i / 32) * clb_block_bytes(dtype);
            out[i] = clb_blk_f16(blk, 0) * (float)q_0_value(blk, i % 32, dtype);
        } else if (dtype == COLIBRI_DTYPE_Q4_K || dtype == COLIBRI_DTYPE_Q5_K) {
            int five = dtype == COLIBRI_DTYPE_Q5_K;
            const uint8_t *blk = row + (size_t)(i / 256) * (five ? CLB_Q5_K_BYTES : CLB_Q4_K_BYTES);
            unsigned k = i % 256, j = k / 32;
            uint8_t sc, m;
            clb_q4k_scale_min(blk + CLB_QK_SCALES, j, &sc, &m);
            unsigned q = clb_qk_value(blk, k, five);
            float d1 = clb_blk_f16(blk, 0) * (float)sc;
            float m1 = clb_blk_f16(blk, 2) * (float)m;
            out[i] = d1 * (float)q - m1;
        } else { /* COLIBRI_DTYPE_Q6_K */
            const uint8_t *blk = row + (size_t)(i / 256) * CLB_Q6_K_BYTES;
            unsigned k = i % 256, h = k / 128, rr = k % 128;
            unsigned l = rr % 32, s = rr / 32;
            unsigned lo = blk[64 * h + l + 32 * (s % 2)];
            lo = s < 2 ? lo & 15 : lo >> 4;
            unsigned hi = (blk[CLB_Q6_K_QH + 32 * h + l] >> (2 * s)) & 3;
            float d1 = clb_blk_f16(blk, CLB_Q6_K_D) *
                       (float)((const int8_t *)blk)[CLB_Q6_K_SC + k / 16];
            out[i] = d1 * (float)((int)(lo | hi << 4) - 32);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Attention (kernels.h attend): the flash-attention schedule.
 *
 * Positions go in blocks of CLB_ATT_BLOCK (16). Per block: the unmasked
 * positions' scores s_i = (q.k_i [* ks_i]) * scale [+ bias_i]; the block's max m_b;
 * the running max m' = max(m, m_b); alpha = exp(m - m') (0 for the first
 * block); l = l * alpha + the sum of p_i = exp(s_i - m') (masked
 * positions p = 0) and o = o * alpha + sum_i p_i v_i; at the end out = o / l.
 * One pass over K and V, no buffer of n scores: the work per position is
 * a dot, an exp and an axpy, each in a fixed order that a SIMD form repeats
 * bit for bit (avx2.c, avx512.c):
 * - q.k: the products q[c] * k[c] (int8: float(k8[c])) summed in c order,
 *   each one fused with the running sum (clb_fmaf: a * b + c rounded once),
 *   int8 times the key's scale after, then times scale: the order of the
 *   previous one-score-at-a-time loop, which the golden tests' int8 files
 *   are sensitive to (a 16-lane order flipped an int8 activation rounding
 *   on "wide": rows off by 1e-2 from the second token on). A SIMD form
 *   puts 16 positions in lanes (gathering K along c) to keep it.
 * - sum of p: lane j += lane j + 8, j + 4, j + 2, j + 1 (a halving tree)
 *   over the block's 16 positions.
 * - o: element by element, positions in order: o[c] = fma(p_i, v_i[c], o[c])
 *   (int8: fma(p_i * vs_i, float(v8[c]), o[c])).
 * The multiply-adds of the dot, the axpy and clb_exp_neg are fused, the
 * rest (o * alpha, l * alpha + sum, the scales) separate operations: fused,
 * the x86 and ARM forms run one FMA instruction where they ran a multiply
 * and an add, and the dot and axpy, then bound by the FP ports, take half
 * the instructions (prefill at 2048 positions on a Xeon, avx2: attention
 * 23 % -> 17 % of the samples, bench/results/FINDINGS.md 21).
 * -ffp-contract=off still keeps the compiler from fusing anything else. */

/* kernels.h clb_fmaf where fmaf is not one instruction; any target can
 * call it (test_kernels holds it to the C library's fmaf). */
float clb_fmaf_double(float a, float b, float c)
{
    const double p = (double)a * (double)b; /* exact */
    double s = p + (double)c;
    uint64_t bits;
    memcpy(&bits, &s, sizeof bits);
    const uint64_t below = bits & 0x1fffffffu, exponent = bits >> 52 & 0x7ffu;
    if (below != 0x10000000u && exponent >= 1023u - 126u)
        return (float)s; /* not a tie, float's normal range (or NaN, inf) */
    const double z = s - p;
    const double e = (p - (s - z)) + ((double)c - z); /* s's error */
    if (e == e && e != 0.0 && !(bits & 1u)) {
        /* |s| up a step where the error has s's sign, else down (s != 0
         * here: a sum that rounds to 0 is exact) */
        bits = (e > 0.0) == (s > 0.0) ? bits + 1u : bits - 1u;
        memcpy(&s, &bits, sizeof s);
    }
    return (float)s;
}

/* 16 lanes -> lane 0 by the halving tree. */
static float att_tree16(float v[16])
{
    for (unsigned w = 8; w >= 1; w /= 2)
        for (unsigned j = 0; j < w; j++)
            v[j] = v[j] + v[j + w];
    return v[0];
}

/* s[i] = the scores of positions b .. b + nb (masked ones too: they are
 * in the cache, and ignored after), 4 positions side by side: each one's
 * sum still runs in c order, the 4 chains just overlap (the one-chain loop
 * was latency-bound: an add's latency per column). */
static void att_scores(const clb_att_args *a, uint32_t b, uint32_t nb, float *s)
{
    const uint32_t d = a->d;
    uint32_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
        if (a->K) {
            const float *k = a->K + (size_t)(b + i) * a->ld;
            for (uint32_t c = 0; c < d; c++) {
                const float qc = a->q[c];
                d0 = clb_fmaf(qc, k[c], d0);
                d1 = clb_fmaf(qc, k[a->ld + c], d1);
                d2 = clb_fmaf(qc, k[2 * a->ld + c], d2);
                d3 = clb_fmaf(qc, k[3 * a->ld + c], d3);
            }
        } else {
            const int8_t *k = a->Kq + (size_t)(b + i) * a->ld;
            for (uint32_t c = 0; c < d; c++) {
                const float qc = a->q[c];
                d0 = clb_fmaf(qc, (float)k[c], d0);
                d1 = clb_fmaf(qc, (float)k[a->ld + c], d1);
                d2 = clb_fmaf(qc, (float)k[2 * a->ld + c], d2);
                d3 = clb_fmaf(qc, (float)k[3 * a->ld + c], d3);
            }
        }
        s[i] = d0;
        s[i + 1] = d1;
        s[i + 2] = d2;
        s[i + 3] = d3;
    }
    for (; i < nb; i++) {
        float dot = 0.0f;
        if (a->K) {
            const float *k = a->K + (size_t)(b + i) * a->ld;
            for (uint32_t c = 0; c < d; c++)
                dot = clb_fmaf(a->q[c], k[c], dot);
        } else {
            const int8_t *k = a->Kq + (size_t)(b + i) * a->ld;
            for (uint32_t c = 0; c < d; c++)
                dot = clb_fmaf(a->q[c], (float)k[c], dot);
        }
        s[i] = dot;
    }
    for (i = 0; i < nb; i++)
        s[i] = a->K ? s[i] * a->scale : s[i] * a->Ks[(size_t)(b + i) * a->lds] * a->scale;
    uint32_t live = 0;
    for (i = 0; i < nb; i++)
        live |= (uint32_t)(a->mask[b + i] != 0) << i;
    clb_att_add_bias(s, a->bias, a->bias_step, b, live);
}

/* o[0 .. d) = o * alpha, then o = fma(w_i, v_i, o) for the block's
 * positions in order (element-wise: restrict lets the compiler use
 * vectors, which changes no bit). */
static void att_values(float *restrict o, const clb_att_args *a, uint32_t b, uint32_t nb,
                       const float *pr, float alpha)
{
    const uint32_t d = a->d;
    for (uint32_t c = 0; c < d; c++)
        o[c] = o[c] * alpha;
    for (uint32_t i = 0; i < nb; i++) {
        if (!a->mask[b + i])
            continue;
        if (a->V) {
            const float *restrict v = a->V + (size_t)(b + i) * a->ld;
            const float w = pr[i];
            for (uint32_t c = 0; c < d; c++)
                o[c] = clb_fmaf(w, v[c], o[c]);
        } else {
            const int8_t *restrict v = a->Vq + (size_t)(b + i) * a->ld;
            const float w = pr[i] * a->Vs[(size_t)(b + i) * a->lds];
            for (uint32_t c = 0; c < d; c++)
                o[c] = clb_fmaf(w, (float)v[c], o[c]);
        }
    }
}

void clb_ref_attend(float *out, const clb_att_args *a)
{
    const uint32_t d = a->d;
    float m = -INFINITY, l = 0.0f;
    int any = 0;
    for (uint32_t c = 0; c < d; c++)
        out[c] = 0.0f;
    for (uint32_t b = 0; b < a->n; b += CLB_ATT_BLOCK) {
        const uint32_t nb = a->n - b < CLB_ATT_BLOCK ? a->n - b : CLB_ATT_BLOCK;
        float s[CLB_ATT_BLOCK], pr[CLB_ATT_BLOCK] = {0};
        float mb = -INFINITY;
        int live = 0;
        for (uint32_t i = 0; i < nb; i++)
            live |= a->mask[b + i] != 0;
        if (!live)
            continue;
        att_scores(a, b, nb, s);
        live = 0;
        for (uint32_t i = 0; i < nb; i++)
            if (a->mask[b + i]) {
                mb = !live || s[i] > mb ? s[i] : mb;
                live = 1;
            }
        float dm;
        const float mn = clb_att_new_max(m, mb, any, &dm);
        const float alpha = any ? clb_exp_neg(dm) : 0.0f;
        for (uint32_t i = 0; i < nb; i++)
            if (a->mask[b + i])
                pr[i] = clb_exp_neg(s[i] - mn);
        float ps[16];
        memcpy(ps, pr, sizeof ps);
        l = l * alpha + att_tree16(ps);
        att_values(out, a, b, nb, pr, alpha);
        m = mn;
        any = 1;
    }
    if (!any) /* padding before any real token: zero output, no NaN */
        return;
    for (uint32_t c = 0; c < d; c++)
        out[c] = out[c] / l;
}

void clb_ref_attend_rows(const clb_att_rows *r, const clb_att_args *a)
{
    clb_att_args one = *a;
    for (uint32_t i = 0; i < r->nr; i++) {
        one.n = clb_att_rows_n(r, i);
        for (uint32_t g = 0; g < r->nh; g++) {
            one.q = r->q + (size_t)i * r->ldq + (size_t)g * a->d;
            one.bias = clb_att_rows_bias(r, i, g);
            clb_ref_attend(r->out + (size_t)i * r->ldo + (size_t)g * a->d, &one);
        }
    }
}

void clb_ref_silu_mul(float *h, const float *g, size_t len)
{
    for (size_t i = 0; i < len; i++)
        h[i] = clb_silu(h[i]) * g[i];
}

static const colibri_kernels ref_kernels = {
    "ref",
    ref_matmul_f32,
    ref_quantize_act_i8,
    ref_matmul_i8,
    ref_matmul_i16,
    clb_ref_quantize_act_blk,
    clb_ref_matmul_q4_0,
    clb_ref_matmul_q4_k,
    clb_ref_matmul_q6_k,
    clb_ref_matmul_q5_0,
    clb_ref_matmul_q5_k,
    clb_ref_matmul_q8_0,
    clb_ref_attend,
    clb_ref_attend_rows,
    clb_ref_silu_mul,
};

const colibri_kernels *colibri_kernels_ref(void)
{
    return &ref_kernels;
}
