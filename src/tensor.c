/*
 * tensor.c - the dense building blocks of the forward pass (FORMAT.md 5-6):
 * embedding lookup, RMSNorm, linear layers through the kernel table, RoPE
 * from the init-time tables, and grouped-query attention over the KV cache.
 * Nothing here allocates; every buffer comes from the plan (the arena).
 */
#include "internal.h"

#include <math.h>
#include <string.h>

#ifdef COLIBRI_DEBUG
#include <stdio.h>

/* One line of the first 8 values and one of the first 32 bytes in hex. */
void clb_debug_dump(const char *what, const char *role, const void *data,
                    size_t n_values, size_t elem_size, int is_float)
{
    const unsigned char *bytes = (const unsigned char *)data;
    size_t nv = n_values < 8 ? n_values : 8;
    size_t nb = n_values * elem_size < 32 ? n_values * elem_size : 32;
    fprintf(stderr, "colibri-debug: %s %s n=%zu values:", what, role, n_values);
    for (size_t i = 0; i < nv; i++) {
        if (is_float)
            fprintf(stderr, " %.6g", (double)((const float *)data)[i]);
        else if (elem_size == 1)
            fprintf(stderr, " %d", (int)((const int8_t *)data)[i]);
        else
            fprintf(stderr, " %d", (int)((const int16_t *)data)[i]);
    }
    fprintf(stderr, "\ncolibri-debug: %s %s hex:", what, role);
    for (size_t i = 0; i < nb; i++)
        fprintf(stderr, " %02x", bytes[i]);
    fprintf(stderr, "\n");
}
#define DUMP(what, role, data, n, esz, isf) \
    clb_debug_dump(what, role, data, n, esz, isf)
#else
#define DUMP(what, role, data, n, esz, isf) ((void)0)
#endif

void clb_embed(const clb_plan *p, const int32_t *ids, uint32_t n, float *X)
{
    uint32_t h = p->s.hidden;
    for (uint32_t t = 0; t < n; t++) {
        size_t row = (size_t)(uint32_t)ids[t] * h;
        float *x = X + (size_t)t * h;
        if (p->embed.dtype == COLIBRI_DTYPE_F32) {
            memcpy(x, (const float *)p->embed.q + row, h * sizeof(float));
        } else { /* I16_ROW: x = float(q) * scale[token] */
            const int16_t *q = (const int16_t *)p->embed.q + row;
            float s = p->embed.scales[ids[t]];
            for (uint32_t c = 0; c < h; c++)
                x[c] = (float)q[c] * s;
        }
    }
    DUMP("embed", "out", X, (size_t)n * h, 4, 1);
}

void clb_rmsnorm(float *Y, const float *X, const float *w, uint32_t n,
                 uint32_t dim, float eps)
{
    for (uint32_t t = 0; t < n; t++) {
        const float *x = X + (size_t)t * dim;
        float *y = Y + (size_t)t * dim;
        float ss = 0.0f;
        for (uint32_t c = 0; c < dim; c++)
            ss += x[c] * x[c];
        float d = sqrtf(ss / (float)dim + eps);
        for (uint32_t c = 0; c < dim; c++)
            y[c] = x[c] / d * w[c];
    }
}

/* Apply an I8_GROUP weight to activations already quantised in p->xq/xs. */
static void linear_i8(const clb_plan *p, const clb_weight *w, uint32_t n,
                      float *Y, const char *what)
{
    p->k->matmul_i8(Y, (const int8_t *)w->q, w->scales, p->xq, p->xs, n,
                    w->rows, w->cols, p->s.group_size);
    DUMP(what, "out", Y, (size_t)n * w->rows, 4, 1);
    (void)what;
}

static void quantize(const clb_plan *p, const float *X, uint32_t n,
                     uint32_t cols, const char *what)
{
    p->k->quantize_act_i8(p->xq, p->xs, X, n, cols, p->s.group_size);
    DUMP(what, "act-q", p->xq, (size_t)n * cols, 1, 0);
    DUMP(what, "act-scale", p->xs, (size_t)n * ((cols + p->s.group_size - 1) / p->s.group_size), 4, 1);
    (void)what;
}

void clb_linear(const clb_plan *p, const clb_weight *w, const float *X,
                uint32_t n, float *Y, const char *what)
{
    DUMP(what, "in", X, (size_t)n * w->cols, 4, 1);
    switch (w->dtype) {
    case COLIBRI_DTYPE_F32:
        p->k->matmul_f32(Y, (const float *)w->q, X, n, w->rows, w->cols);
        DUMP(what, "out", Y, (size_t)n * w->rows, 4, 1);
        break;
    case COLIBRI_DTYPE_I8_GROUP:
        quantize(p, X, n, w->cols, what);
        linear_i8(p, w, n, Y, what);
        break;
    default: /* COLIBRI_DTYPE_I16_ROW; validation admits nothing else */
        p->k->matmul_i16(Y, (const int16_t *)w->q, w->scales, X, n, w->rows,
                         w->cols);
        DUMP(what, "out", Y, (size_t)n * w->rows, 4, 1);
        break;
    }
    (void)what;
}

void clb_linear2(const clb_plan *p, const clb_weight *wa, const clb_weight *wb,
                 const float *X, uint32_t n, float *Ya, float *Yb,
                 const char *what)
{
    if (wa->dtype == COLIBRI_DTYPE_I8_GROUP &&
        wb->dtype == COLIBRI_DTYPE_I8_GROUP) {
        DUMP(what, "in", X, (size_t)n * wa->cols, 4, 1);
        quantize(p, X, n, wa->cols, what);
        linear_i8(p, wa, n, Ya, what);
        linear_i8(p, wb, n, Yb, what);
    } else {
        clb_linear(p, wa, X, n, Ya, what);
        clb_linear(p, wb, X, n, Yb, what);
    }
}

/* HF rotate_half: pairs (i, i + d/2) rotate by pos * inv_freq[i]. */
void clb_rope(const clb_plan *p, float *v, uint32_t n_heads, uint32_t pos)
{
    uint32_t d = p->s.head_dim, half = d / 2;
    const float *cs = p->rope_cos + (size_t)pos * half;
    const float *sn = p->rope_sin + (size_t)pos * half;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * d;
        for (uint32_t i = 0; i < half; i++) {
            float a = x[i], b = x[i + half];
            x[i] = a * cs[i] - b * sn[i];
            x[i + half] = b * cs[i] + a * sn[i];
        }
    }
}

void clb_attention(const clb_plan *p, uint32_t layer, uint32_t b,
                   uint32_t pos, const float *q, float *out)
{
    uint32_t d = p->s.head_dim, kvdim = p->kvdim, S = p->s.max_seq_len;
    uint32_t group = (uint32_t)p->s.n_heads / p->s.n_kv_heads;
    size_t seq_base = ((size_t)layer * p->s.max_batch + b) * S;
    const float *K = p->k_cache + seq_base * kvdim;   /* [S, kvdim] */
    const float *V = p->v_cache + seq_base * kvdim;
    const uint8_t *mask = p->mask_cache + (size_t)b * S;
    float *sc = p->scores;                            /* [pos + 1] */

    for (uint32_t h = 0; h < p->s.n_heads; h++) {
        const float *qh = q + (size_t)h * d;
        uint32_t kv_off = (h / group) * d;
        float *o = out + (size_t)h * d;
        float mx = -INFINITY;
        int any = 0;
        for (uint32_t j = 0; j <= pos; j++) {
            if (!mask[j])
                continue;
            const float *kj = K + (size_t)j * kvdim + kv_off;
            float dot = 0.0f;
            for (uint32_t c = 0; c < d; c++)
                dot += qh[c] * kj[c];
            sc[j] = dot * p->d.attn_scale;
            if (!any || sc[j] > mx)
                mx = sc[j];
            any = 1;
        }
        memset(o, 0, d * sizeof(float));
        if (!any) /* padding before any real token: zero output, no NaN */
            continue;
        float sum = 0.0f;
        for (uint32_t j = 0; j <= pos; j++) {
            if (!mask[j])
                continue;
            sc[j] = expf(sc[j] - mx);
            sum += sc[j];
        }
        for (uint32_t j = 0; j <= pos; j++) {
            if (!mask[j])
                continue;
            float wj = sc[j] / sum;
            const float *vj = V + (size_t)j * kvdim + kv_off;
            for (uint32_t c = 0; c < d; c++)
                o[c] += wj * vj[c];
        }
    }
}
