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

static const colibri_kernels ref_kernels = {
    "ref",
    ref_matmul_f32,
    ref_quantize_act_i8,
    ref_matmul_i8,
    ref_matmul_i16,
};

const colibri_kernels *colibri_kernels_ref(void)
{
    return &ref_kernels;
}
