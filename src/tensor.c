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
        } else if (clb_block_cols(p->embed.dtype)) { /* the block's values */
            clb_dequant_row(x, (const uint8_t *)p->embed.q +
                            (size_t)(uint32_t)ids[t] *
                                clb_block_row_bytes(p->embed.dtype, h),
                            p->embed.dtype, h);
        } else if (p->embed.dtype == COLIBRI_DTYPE_I8_GROUP) {
            /* x[c] = float(q) * scale[token, c / g] (FORMAT.md 5) */
            uint32_t g = p->s.group_size, ng = (h + g - 1) / g;
            const int8_t *q = (const int8_t *)p->embed.q + row;
            const float *s = p->embed.scales + (size_t)(uint32_t)ids[t] * ng;
            for (uint32_t c = 0; c < h; c++)
                x[c] = (float)q[c] * s[c / g];
        } else { /* I16_ROW: x = float(q) * scale[token] */
            const int16_t *q = (const int16_t *)p->embed.q + row;
            float s = p->embed.scales[ids[t]];
            for (uint32_t c = 0; c < h; c++)
                x[c] = (float)q[c] * s;
        }
    }
    DUMP("embed", "out", X, (size_t)n * h, 4, 1);
}

#if COLIBRI_THREADS
typedef struct rows_job {
    clb_rows_fn fn;
    void *ctx;
    uint32_t n, per; /* rows, rows a tile */
} rows_job;

static void rows_tile(void *ctx, uint32_t tile, uint32_t worker)
{
    (void)worker;
    const rows_job *j = (const rows_job *)ctx;
    uint32_t r0 = tile * j->per;
    j->fn(j->ctx, r0, j->n - r0 < j->per ? j->n - r0 : j->per);
}

void clb_parallel_rows(const clb_plan *p, uint32_t n, uint32_t width,
                       clb_rows_fn fn, void *ctx)
{
    /* rows a tile from the shape alone, never from the team; at least 1 */
    uint32_t per = CLB_TILE_ELEMS_ROWS / (width ? width : 1u);
    if (per == 0)
        per = 1;
    if (n <= per) {
        if (n)
            fn(ctx, 0, n);
        return;
    }
    rows_job j = { fn, ctx, n, per };
    clb_parallel(clb_team_of(p), (n - 1u) / per + 1u, rows_tile, &j);
}
#else /* no team: the whole pass on the caller */
void clb_parallel_rows(const clb_plan *p, uint32_t n, uint32_t width,
                       clb_rows_fn fn, void *ctx)
{
    (void)p;
    (void)width;
    if (n)
        fn(ctx, 0, n);
}
#endif

typedef struct norm_job {
    float *Y;
    const float *X, *w;
    uint32_t dim;
    float eps;
} norm_job;

static void norm_rows(void *ctx, uint32_t t0, uint32_t tn)
{
    const norm_job *j = (const norm_job *)ctx;
    const uint32_t dim = j->dim;
    for (uint32_t t = t0; t < t0 + tn; t++) {
        const float *x = j->X + (size_t)t * dim;
        float *y = j->Y + (size_t)t * dim;
        float ss = 0.0f;
        for (uint32_t c = 0; c < dim; c++)
            ss += x[c] * x[c];
        float d = sqrtf(ss / (float)dim + j->eps);
        for (uint32_t c = 0; c < dim; c++)
            y[c] = x[c] / d * j->w[c];
    }
}

void clb_rmsnorm(const clb_plan *p, float *Y, const float *X, const float *w,
                 uint32_t n, uint32_t dim, float eps)
{
    norm_job j = { Y, X, w, dim, eps };
    clb_parallel_rows(p, n, dim, norm_rows, &j);
}

/* ------------------------------------------------------------------------ */
/* Linear layers as parallel regions of row tiles                           */
/* ------------------------------------------------------------------------ */

/* Y[n, nr] (row stride nr) = rows [r0, r0 + nr) of w applied to tokens
 * [t0, t0 + n): a sub-matrix of W (rows are contiguous, so are their
 * scales) through the unchanged kernel interface. I8_GROUP reads the
 * activations quantised in p->xq/xs [tokens, cols] / [tokens, ngroups]. */
static void kernel_rows(const clb_plan *p, const clb_weight *w, const float *X,
                        uint32_t t0, uint32_t n, uint32_t r0, uint32_t nr,
                        float *Y)
{
    size_t cols = w->cols;
    switch (w->dtype) {
    case COLIBRI_DTYPE_F32:
        p->k->matmul_f32(Y, (const float *)w->q + r0 * cols, X + t0 * cols, n,
                         nr, w->cols);
        break;
    case COLIBRI_DTYPE_I8_GROUP: {
        uint32_t g = p->s.group_size;
        size_t ng = (cols + g - 1) / g;
        p->k->matmul_i8(Y, (const int8_t *)w->q + r0 * cols, w->scales + r0 * ng,
                        p->xq + t0 * cols, p->xs + t0 * ng, n, nr, w->cols, g);
        break;
    }
    case COLIBRI_DTYPE_Q4_0:
    case COLIBRI_DTYPE_Q5_0:
    case COLIBRI_DTYPE_Q8_0:
    case COLIBRI_DTYPE_Q4_K:
    case COLIBRI_DTYPE_Q5_K:
    case COLIBRI_DTYPE_Q6_K: {
        /* Activations [tokens, nb*B] padded, scales [tokens, nb], sums of
         * 16 [tokens, nb*B/16] (quantize_blk). */
        uint32_t B = clb_block_cols(w->dtype);
        size_t nb = (cols + B - 1) / B;
        const uint8_t *W = (const uint8_t *)w->q + r0 * clb_block_row_bytes(w->dtype, w->cols);
        const int8_t *xq = p->xq + t0 * nb * B;
        const float *xs = p->xs + t0 * nb;
        const int16_t *xb = p->xb + t0 * nb * (B / 16);
        if (w->dtype == COLIBRI_DTYPE_Q4_0)
            p->k->matmul_q4_0(Y, W, xq, xs, xb, n, nr, w->cols);
        else if (w->dtype == COLIBRI_DTYPE_Q5_0)
            p->k->matmul_q5_0(Y, W, xq, xs, xb, n, nr, w->cols);
        else if (w->dtype == COLIBRI_DTYPE_Q8_0)
            p->k->matmul_q8_0(Y, W, xq, xs, xb, n, nr, w->cols);
        else if (w->dtype == COLIBRI_DTYPE_Q4_K)
            p->k->matmul_q4_k(Y, W, xq, xs, xb, n, nr, w->cols);
        else if (w->dtype == COLIBRI_DTYPE_Q5_K)
            p->k->matmul_q5_k(Y, W, xq, xs, xb, n, nr, w->cols);
        else
            p->k->matmul_q6_k(Y, W, xq, xs, xb, n, nr, w->cols);
        break;
    }
    default: /* COLIBRI_DTYPE_I16_ROW; validation admits nothing else */
        p->k->matmul_i16(Y, (const int16_t *)w->q + r0 * cols, w->scales + r0,
                         X + t0 * cols, n, nr, w->cols);
        break;
    }
}

/* No threads and ref kernels only (cortex-m): ref computes every output
 * element alone, in column order, whatever the rows or tokens of a call, so
 * one whole call gives the tiles' bits (tests/test_runtime_pool.py compares
 * this build with the threaded ref one), without tile code in a small
 * library. Every other build runs the tiles. */
#if !COLIBRI_THREADS && defined(COLIBRI_KERNELS_REF_ONLY)
#define CLB_TILED 0
#else
#define CLB_TILED 1
#endif

#if CLB_TILED
/* One or two matrices over the same X as one parallel region: tiles
 * [0, tiles0) are row blocks of w[0], the rest row blocks of w[1]. */
typedef struct lin_job {
    const clb_plan *p;
    const clb_weight *w[2];
    float *Y[2];
    const float *X;
    uint32_t n;       /* tokens through the kernel */
    uint32_t n_out;   /* rows of Y written (the first n_out tokens) */
    uint32_t rb;      /* weight rows per tile */
    uint32_t tiles0;  /* tiles of w[0] */
} lin_job;

static void lin_tile(void *ctx, uint32_t tile, uint32_t worker)
{
    (void)worker;
    const lin_job *j = (const lin_job *)ctx;
    int b = tile >= j->tiles0;
    const clb_weight *w = j->w[b];
    uint32_t r0 = (b ? tile - j->tiles0 : tile) * j->rb;
    uint32_t nr = w->rows - r0 < j->rb ? w->rows - r0 : j->rb;
    if (j->n == 1) { /* Y [1, rows]: the tile's rows are contiguous */
        kernel_rows(j->p, w, j->X, 0, 1, r0, nr, j->Y[b] + r0);
        return;
    }
    /* Several tokens: Y[t, r0 .. r0 + nr) is strided, so the kernel writes
     * a contiguous [tn, nr] block here (8 KiB of stack) and the rows are
     * copied out. */
    float blk[CLB_TILE_TOKENS * CLB_TILE_ROWS_N];
    for (uint32_t t0 = 0; t0 < j->n_out; t0 += CLB_TILE_TOKENS) {
        uint32_t tn = j->n - t0 < CLB_TILE_TOKENS ? j->n - t0 : CLB_TILE_TOKENS;
        kernel_rows(j->p, w, j->X, t0, tn, r0, nr, blk);
        /* a whole tile's rows are 64 bytes a token: a copy of constant
         * size, inlined, where a library call per token was 4 % of a
         * prefill's time */
        for (uint32_t t = 0; t < tn && t0 + t < j->n_out; t++) {
            float *dst = j->Y[b] + (size_t)(t0 + t) * w->rows + r0;
            const float *src = blk + (size_t)t * nr;
            if (nr == CLB_TILE_ROWS_N)
                memcpy(dst, src, CLB_TILE_ROWS_N * sizeof(float));
            else
                memcpy(dst, src, nr * sizeof(float));
        }
    }
}

static uint32_t tiles_of(uint32_t rows, uint32_t rb)
{
    return rows ? (rows - 1) / rb + 1 : 0;
}
#endif /* CLB_TILED */

/* Tokens [t0, t0 + tn) of X [n, cols] quantised into p->xq/xs(/xb) at
 * their rows: I8_GROUP per header group (B 0), block types per block of B
 * (FORMAT.md 5). A token's values depend on its row alone. */
typedef struct quant_job {
    const clb_plan *p;
    const float *X;
    uint32_t cols, B;
} quant_job;

static void quant_rows(void *ctx, uint32_t t0, uint32_t tn)
{
    const quant_job *j = (const quant_job *)ctx;
    const clb_plan *p = j->p;
    const uint32_t cols = j->cols, B = j->B;
    const float *X = j->X + (size_t)t0 * cols;
    if (B == 0) {
        uint32_t g = p->s.group_size, ng = (cols + g - 1) / g;
        p->k->quantize_act_i8(p->xq + (size_t)t0 * cols, p->xs + (size_t)t0 * ng, X, tn,
                              cols, g);
    } else {
        size_t nb = (cols + B - 1) / B; /* XQ [n, nb*B], XS [n, nb], XB [n, nb*B/16] */
        p->k->quantize_act_blk(p->xq + t0 * nb * B, p->xs + t0 * nb, p->xb + t0 * nb * B / 16,
                               X, tn, cols, B);
    }
}

/* The activations a weight of this dtype reads, into p->xq/xs(/xb):
 * I8_GROUP per header group, block types per block (FORMAT.md 5); F32 and
 * I16_ROW read X itself. */
static void quantize_for(const clb_plan *p, unsigned dtype, const float *X,
                         uint32_t n, uint32_t cols, const char *what)
{
    uint32_t B = clb_block_cols(dtype);
    if (dtype != COLIBRI_DTYPE_I8_GROUP && B == 0)
        return;
    quant_job j = { p, X, cols, dtype == COLIBRI_DTYPE_I8_GROUP ? 0u : B };
    clb_parallel_rows(p, n, cols, quant_rows, &j);
    if (B == 0) {
        DUMP(what, "act-q", p->xq, (size_t)n * cols, 1, 0);
        DUMP(what, "act-scale", p->xs, (size_t)n * ((cols + p->s.group_size - 1) / p->s.group_size), 4, 1);
    } else {
        DUMP(what, "act-q", p->xq, (size_t)n * ((cols + B - 1) / B) * B, 1, 0);
    }
    (void)what;
}

/* Whether two dtypes read the same quantised activations (one pass serves
 * both weights of clb_linear2). */
static int same_activations(unsigned a, unsigned b)
{
    uint32_t ba = clb_block_cols(a), bb = clb_block_cols(b);
    if (a == COLIBRI_DTYPE_I8_GROUP || b == COLIBRI_DTYPE_I8_GROUP)
        return a == b;
    return ba == bb; /* both unquantised (0), or blocks of one width */
}

/* wa (and wb if not NULL) over X [n, cols] -> Ya (Yb), the first n_out rows
 * written, as one region. */
static void linear_region(const clb_plan *p, const clb_weight *wa,
                          const clb_weight *wb, const float *X, uint32_t n,
                          uint32_t n_out, float *Ya, float *Yb)
{
#if !CLB_TILED
    (void)n; /* the first n_out tokens alone: the same bits with ref */
    kernel_rows(p, wa, X, 0, n_out, 0, wa->rows, Ya);
    if (wb)
        kernel_rows(p, wb, X, 0, n_out, 0, wb->rows, Yb);
#else
    lin_job j;
    j.p = p;
    j.w[0] = wa;
    j.w[1] = wb ? wb : wa;
    j.Y[0] = Ya;
    j.Y[1] = Yb;
    j.X = X;
    j.n = n;
    j.n_out = n_out;
    j.rb = n == 1 ? CLB_TILE_ROWS_1 : CLB_TILE_ROWS_N;
    j.tiles0 = tiles_of(wa->rows, j.rb);
    uint32_t tiles = j.tiles0 + (wb ? tiles_of(wb->rows, j.rb) : 0);
    clb_parallel(clb_team_of(p), tiles, lin_tile, &j);
#endif
}

void clb_linear_rows(const clb_plan *p, const clb_weight *w, const float *X,
                     uint32_t n, uint32_t n_out, float *Y, const char *what)
{
    DUMP(what, "in", X, (size_t)n * w->cols, 4, 1);
    quantize_for(p, w->dtype, X, n, w->cols, what);
    linear_region(p, w, NULL, X, n, n_out, Y, NULL);
    DUMP(what, "out", Y, (size_t)n_out * w->rows, 4, 1);
    (void)what;
}

void clb_linear(const clb_plan *p, const clb_weight *w, const float *X,
                uint32_t n, float *Y, const char *what)
{
    clb_linear_rows(p, w, X, n, n, Y, what);
}

void clb_linear2(const clb_plan *p, const clb_weight *wa, const clb_weight *wb,
                 const float *X, uint32_t n, float *Ya, float *Yb,
                 const char *what)
{
    if (same_activations(wa->dtype, wb->dtype) &&
        (wa->dtype == COLIBRI_DTYPE_I8_GROUP || clb_block_cols(wa->dtype))) {
        /* The quantised activations are made once for both. */
        DUMP(what, "in", X, (size_t)n * wa->cols, 4, 1);
        quantize_for(p, wa->dtype, X, n, wa->cols, what);
        linear_region(p, wa, wb, X, n, n, Ya, Yb);
        DUMP(what, "out", Ya, (size_t)n * wa->rows, 4, 1);
        DUMP(what, "out", Yb, (size_t)n * wb->rows, 4, 1);
    } else if (same_activations(wa->dtype, wb->dtype)) {
        linear_region(p, wa, wb, X, n, n, Ya, Yb);
        /* the dumps of two clb_linear calls, as before the region */
        DUMP(what, "in", X, (size_t)n * wa->cols, 4, 1);
        DUMP(what, "out", Ya, (size_t)n * wa->rows, 4, 1);
        DUMP(what, "in", X, (size_t)n * wb->cols, 4, 1);
        DUMP(what, "out", Yb, (size_t)n * wb->rows, 4, 1);
    } else { /* mixed dtypes: p->xq serves one at a time */
        clb_linear(p, wa, X, n, Ya, what);
        clb_linear(p, wb, X, n, Yb, what);
    }
    (void)what;
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

int clb_seq_rows(const clb_plan *p, uint32_t n, uint32_t b, uint32_t *r0, uint32_t *r1)
{
    uint32_t i = 0;
    while (i < n && p->tok_b[i] != b)
        i++;
    *r0 = i;
    while (i < n && p->tok_b[i] == b)
        i++;
    *r1 = i;
    return *r1 > *r0;
}

clb_att_rows clb_chunk_queries(const clb_plan *p, uint32_t r0, uint32_t r1, size_t col,
                               uint32_t nh)
{
    clb_att_rows r;
    memset(&r, 0, sizeof r);
    r.q = p->q + (size_t)r0 * p->qdim + col;
    r.out = p->att + (size_t)r0 * p->qdim + col;
    r.pos = p->tok_pos + r0;
    r.ldq = r.ldo = p->qdim;
    r.nr = r1 - r0;
    r.nh = nh;
    return r;
}

/* The chunk's attention as a parallel region of (sequence, KV head) units:
 * a unit hands the table's attend_rows every query of its KV head in the
 * sequence's chunk rows (consecutive, positions in order; the GQA group's
 * heads of each row), so a form can load a block of
 * keys once for all of them (kernels.h). Each query's bits are ref's
 * one-query attend (the flash-attention schedule of ref.c's
 * clb_ref_attend, one pass over K and V, no score buffer) whatever the
 * unit and the worker. The cache is float32 (K, V) or int8 with one scale
 * per head vector (Kq, Ks, Vq, Vs: COLIBRI_KV_I8), read as stored. */
typedef struct att_job {
    const clb_plan *p;
    uint32_t layer, n;        /* the chunk's rows */
} att_job;

/* Unit u: sequence b = u / n_kv_heads (its rows, consecutive in the chunk;
 * none: nothing to do), KV head u % n_kv_heads. */
static void att_unit(void *ctx, uint32_t u, uint32_t worker)
{
    (void)worker;
    const att_job *j = (const att_job *)ctx;
    const clb_plan *p = j->p;
    const colibri_shape *s = &p->s;
    const uint32_t kvh = u % s->n_kv_heads, b = u / s->n_kv_heads, d = s->head_dim;
    const uint32_t group = (uint32_t)s->n_heads / s->n_kv_heads;
    uint32_t r0, r1;
    if (!clb_seq_rows(p, j->n, b, &r0, &r1))
        return;
    const uint32_t S = s->max_seq_len;
    /* this sequence's cache rows in the layer (clb_kv_rows: head-major) */
    const size_t seq = clb_kv_row(p, j->layer, b, 0);
    clb_att_args a;
    memset(&a, 0, sizeof a);
    clb_kv_args(p, &p->kv, seq, kvh, &a);
    a.mask = p->mask_cache + (size_t)b * S;
    a.scale = p->d.attn_scale;
    /* queries of KV head kvh: heads kvh * group .. + group - 1 of each row */
    const clb_att_rows r = clb_chunk_queries(p, r0, r1, (size_t)kvh * group * d, group);
    p->k->attend_rows(&r, &a);
}

void clb_kv_put(const clb_plan *p, const clb_kv_rows *c, size_t row, const float *k,
                const float *v)
{
    const colibri_shape *s = &p->s;
    const uint32_t d = s->head_dim;
    for (uint32_t h = 0; h < s->n_kv_heads; h++) {
        size_t hs;
        const size_t at = clb_kv_at(p, row, h, &hs);
        if (p->kv_dtype == COLIBRI_KV_I8) {
            /* one head vector: one group of head_dim */
            p->k->quantize_act_i8(c->kq + at, c->ks + hs, k + (size_t)h * d, 1, d, d);
            p->k->quantize_act_i8(c->vq + at, c->vs + hs, v + (size_t)h * d, 1, d, d);
        } else {
            memcpy(c->k + at, k + (size_t)h * d, (size_t)d * 4);
            memcpy(c->v + at, v + (size_t)h * d, (size_t)d * 4);
        }
    }
}

void clb_kv_store(const clb_plan *p, uint32_t layer, uint32_t b, uint32_t pos,
                  const float *k, const float *v)
{
    clb_kv_put(p, &p->kv, clb_kv_row(p, layer, b, pos), k, v);
}

void clb_kv_args(const clb_plan *p, const clb_kv_rows *c, size_t row, uint32_t kvh,
                 clb_att_args *a)
{
    size_t hs;
    const size_t at = clb_kv_at(p, row, kvh, &hs);
    if (p->kv_dtype == COLIBRI_KV_I8) {
        a->Kq = c->kq + at;
        a->Vq = c->vq + at;
        a->Ks = c->ks + hs;
        a->Vs = c->vs + hs;
    } else {
        a->K = c->k + at;
        a->V = c->v + at;
    }
    a->ld = p->s.head_dim; /* one head's positions follow each other */
    a->lds = 1;
    a->d = p->s.head_dim;
}

void clb_attention(const clb_plan *p, uint32_t layer, uint32_t n)
{
    att_job j;
    j.p = p;
    j.layer = layer;
    j.n = n;
    clb_parallel(clb_team_of(p), p->s.max_batch * p->s.n_kv_heads, att_unit, &j);
}
