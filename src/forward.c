/*
 * forward.c - colibri_infer: checks the call's arguments against the model's
 * limits and the KV cache, then runs the tokens in chunks through the layers
 * (tensor.c for the dense parts, moe.c for the experts). Allocates nothing,
 * makes no system call: every buffer is in the plan.
 */
#include "encdec.h"
#include "internal.h"
#include "support.h"

#include <string.h>

/* ------------------------------------------------------------------------ */
/* Inference                                                                */
/* ------------------------------------------------------------------------ */

/* Run chunk rows (token ids[n], sequence p->tok_b, position p->tok_pos)
 * through the model; logits [n, vocab]. Rows of one sequence come in
 * position order, so every key a row attends to is in the cache by the time
 * its layer's attention runs. */
/* Y[n, dim] += bias[dim] (a bias the file lacks is NULL: nothing). */
static void add_bias(float *Y, const float *bias, uint32_t n, uint32_t dim)
{
    for (uint32_t t = 0; bias && t < n; t++)
        for (uint32_t c = 0; c < dim; c++)
            Y[(size_t)t * dim + c] += bias[c];
}

/* X[n] clamped to [-lim, lim] (OLMoE's clip_qkv). */
static void clamp(float *X, size_t n, float lim)
{
    for (size_t i = 0; i < n; i++)
        X[i] = X[i] < -lim ? -lim : X[i] > lim ? lim : X[i];
}

/* x[n, hidden] += scale * y: every residual branch (GraniteMoE scales them;
 * 1.0f elsewhere, where the product is exact and the sum is Mixtral's), in
 * parallel rows (a serial pass here left the other workers waiting at
 * every layer, FINDINGS.md 26). */
typedef struct residual_job {
    float *x;
    const float *y;
    uint32_t h;
    float scale;
} residual_job;

static void residual_rows(void *ctx, uint32_t t0, uint32_t tn)
{
    const residual_job *j = (const residual_job *)ctx;
    for (size_t i = (size_t)t0 * j->h; i < (size_t)(t0 + tn) * j->h; i++)
        j->x[i] += j->y[i] * j->scale;
}

static void residual(const clb_plan *p, float *x, const float *y, uint32_t n, float scale)
{
    residual_job j = { x, y, p->s.hidden, scale };
    clb_parallel_rows(p, n, p->s.hidden, residual_rows, &j);
}

/* RoPE on rows [i0, i0 + ni) of q and k, their keys and values to the
 * cache (each row its own cache slot). */
typedef struct rope_job {
    const clb_plan *p;
    uint32_t layer;
} rope_job;

static void rope_rows(void *ctx, uint32_t i0, uint32_t ni)
{
    const rope_job *j = (const rope_job *)ctx;
    const clb_plan *p = j->p;
    const uint32_t kvdim = p->kvdim;
    for (uint32_t i = i0; i < i0 + ni; i++) {
        clb_rope(p, p->q + (size_t)i * p->qdim, p->s.n_heads, p->tok_pos[i]);
        clb_rope(p, p->kbuf + (size_t)i * kvdim, p->s.n_kv_heads, p->tok_pos[i]);
        clb_kv_store(p, j->layer, p->tok_b[i], p->tok_pos[i], p->kbuf + (size_t)i * kvdim,
                     p->vbuf + (size_t)i * kvdim);
    }
}

/* Queries, keys and values of the chunk rows as the description says:
 * projections [+ biases] [-> q/k RMSNorm, per head or over the whole
 * projection] [-> clamp] -> RoPE on q and k; keys and values to the cache. */
static void qkv(const clb_plan *p, const clb_layer *L, uint32_t l, uint32_t n)
{
    const colibri_shape *s = &p->s;
    uint32_t kvdim = p->kvdim, d = s->head_dim;
    clb_linear(p, &L->wq, p->xn, n, p->q, "wq");
    clb_linear2(p, &L->wk, &L->wv, p->xn, n, p->kbuf, p->vbuf, "wk.wv");
    add_bias(p->q, L->bq, n, p->qdim);
    add_bias(p->kbuf, L->bk, n, kvdim);
    add_bias(p->vbuf, L->bv, n, kvdim);
    if (L->q_norm) {
        /* Per head: n*heads rows of head_dim (Qwen3-MoE); whole: n rows of
         * qdim / kvdim (OLMoE). In place. */
        int per_head = (p->d.features & COLIBRI_FEAT_QK_NORM_HEAD) != 0;
        clb_rmsnorm(p, p->q, p->q, L->q_norm, per_head ? n * s->n_heads : n,
                    per_head ? d : p->qdim, s->rms_eps);
        clb_rmsnorm(p, p->kbuf, p->kbuf, L->k_norm, per_head ? n * s->n_kv_heads : n,
                    per_head ? d : kvdim, s->rms_eps);
    }
    if (p->d.features & COLIBRI_FEAT_CLIP_QKV) {
        clamp(p->q, (size_t)n * p->qdim, p->d.clip_qkv);
        clamp(p->kbuf, (size_t)n * kvdim, p->d.clip_qkv);
        clamp(p->vbuf, (size_t)n * kvdim, p->d.clip_qkv);
    }
    rope_job j = { p, l };
    clb_parallel_rows(p, n, p->qdim + 2u * kvdim, rope_rows, &j);
}

/* Run chunk rows (token ids[n], sequence p->tok_b, position p->tok_pos)
 * through the model; logits [n, vocab]. Rows of one sequence come in
 * position order, so every key a row attends to is in the cache by the time
 * its layer's attention runs. What differs between model families is data
 * in p->d and in the layer views, never a branch on a family. */
/* The logits of the chunk rows: all n rows into logits [n, vocab], or
 * (last_pos != UINT32_MAX) only the rows at position last_pos, the last of
 * their sequence, into logits [batch, vocab] at their sequence's row. */
static void lm_head(const clb_plan *p, uint32_t n, uint32_t last_pos,
                    float *logits)
{
    const colibri_shape *s = &p->s;
    uint32_t h = s->hidden, rows = n, first_b = 0;
    if (last_pos == UINT32_MAX) {
        clb_rmsnorm(p, p->xn, p->x, p->final_norm, n, h, s->rms_eps);
    } else {
        /* Last rows of consecutive sequences, packed into xn: they are
         * rows of sequences b, b+1, ... (chunk rows are in sequence order),
         * so their logits are consecutive rows of the output. RMSNorm is
         * row by row: the same bits as in the all-rows call. */
        rows = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (p->tok_pos[i] != last_pos)
                continue;
            if (rows == 0)
                first_b = p->tok_b[i];
            clb_rmsnorm(p, p->xn + (size_t)rows * h, p->x + (size_t)i * h,
                        p->final_norm, 1, h, s->rms_eps);
            rows++;
        }
        if (rows == 0)
            return;
        logits += (size_t)first_b * s->vocab;
    }
    /* A kernel may take another path for one token than for several (the
     * AVX2 ones do); a lone last row of a multi-row chunk goes through as
     * two rows (the second a copy, not written) so its logits are the
     * all-rows call's bits. */
    uint32_t through = rows;
    if (rows == 1 && n > 1) {
        memcpy(p->xn + h, p->xn, h * sizeof(float));
        through = 2;
    }
    clb_linear_rows(p, &p->lm_head, p->xn, through, rows, logits, "lm_head");
    if (p->d.logits_div != 1.0f)
        for (size_t i = 0; i < (size_t)rows * s->vocab; i++)
            logits[i] /= p->d.logits_div;
}

/* COLIBRI_OK, or a streamed expert's read error (detail set). */
static int forward_chunk(const clb_plan *p, const int32_t *ids, uint32_t n,
                         uint32_t last_pos, float *logits, char *detail)
{
    const colibri_shape *s = &p->s;
    uint32_t h = s->hidden;
    size_t nh = (size_t)n * h;
    clb_embed(p, ids, n, p->x);
    if (p->d.embed_scale != 1.0f)
        for (size_t i = 0; i < nh; i++)
            p->x[i] *= p->d.embed_scale;
    for (uint32_t l = 0; l < s->n_layers; l++) {
        const clb_layer *L = &p->layers[l];
#if CLB_STREAM_PREFETCH
        if (p->prefetch && !L->dense) /* its experts read while attention runs */
            clb_moe_prefetch(p, L, p->x, n);
#endif
        clb_rmsnorm(p, p->xn, p->x, L->attn_norm, n, h, s->rms_eps);
        qkv(p, L, l, n);
        clb_attention(p, l, n);
        clb_linear(p, &L->wo, p->att, n, p->tmp, "wo");
        add_bias(p->tmp, L->bo, n, h);
        residual(p, p->x, p->tmp, n, p->d.residual_scale);
        clb_rmsnorm(p, p->xn, p->x, L->ffn_norm, n, h, s->rms_eps);
        if (L->dense)
            clb_swiglu(p, &L->ffn, p->xn, n, p->tmp, "dense.w1w3", "dense.w2");
        else {
            int rc = clb_moe(p, L, p->xn, n, p->tmp, detail);
            if (rc)
                return rc;
        }
        residual(p, p->x, p->tmp, n, p->d.residual_scale);
    }
    lm_head(p, n, last_pos, logits);
    if (p->settle) /* reads a prefetch began that nothing took: done before infer returns */
        p->settle(p);
    return COLIBRI_OK;
}

int colibri_infer(colibri_model *m, const int32_t *input_ids,
                  const uint8_t *attention_mask, uint32_t batch, uint32_t seq,
                  uint32_t n_past, float *logits)
{
    return colibri_infer_ex(m, input_ids, attention_mask, batch, seq, n_past,
                            COLIBRI_LOGITS_ALL, logits);
}

int colibri_infer_ex(colibri_model *m, const int32_t *input_ids,
                     const uint8_t *attention_mask, uint32_t batch,
                     uint32_t seq, uint32_t n_past, uint32_t logits_mode,
                     float *logits)
{
    int rc0 = clb_call_begin(m);
    if (rc0)
        return rc0;
    struct colibri_model_private_ *v = &m->priv_;
    const colibri_shape *s = &v->shape;
    if (!input_ids || !logits || batch == 0 || seq == 0) {
        clb_detail(v->detail, DETAIL_CAP, "input_ids and logits must be non-NULL"
                   ", batch (%u) and seq (%u) >= 1", (unsigned)batch, (unsigned)seq);
        return COLIBRI_E_ARG;
    }
    if (logits_mode != COLIBRI_LOGITS_ALL && logits_mode != COLIBRI_LOGITS_LAST) {
        clb_detail(v->detail, DETAIL_CAP, "logits_mode %u: expected "
                   "COLIBRI_LOGITS_ALL (0) or COLIBRI_LOGITS_LAST (1)",
                   (unsigned)logits_mode);
        return COLIBRI_E_ARG;
    }
    if (batch > s->max_batch || seq > s->max_seq_len ||
        (uint64_t)n_past + seq > s->max_seq_len) {
        clb_detail(v->detail, DETAIL_CAP, "batch %u, n_past %u + seq %u exceed "
                   "the model's max_batch %u / max_seq_len %u", (unsigned)batch,
                   (unsigned)n_past,
                   (unsigned)seq, (unsigned)(s->max_batch), (unsigned)(s->max_seq_len));
        return COLIBRI_E_INPUT_TOO_LARGE;
    }
    if (n_past > 0 && (n_past > v->cached_len || batch != v->cached_batch)) {
        clb_detail(v->detail, DETAIL_CAP, "n_past %u with batch %u, but the KV "
                   "cache holds %u tokens of batch %u", (unsigned)n_past,
                   (unsigned)batch,
                   (unsigned)(v->cached_len), (unsigned)(v->cached_batch));
        return COLIBRI_E_KV_STATE;
    }
    size_t total = (size_t)batch * seq;
    for (size_t i = 0; i < total; i++) {
        if (input_ids[i] < 0 || (uint32_t)input_ids[i] >= s->vocab) {
            clb_detail(v->detail, DETAIL_CAP, "token id at [%u, %u] is out of "
                       "range [0, %u)", (unsigned)(i / seq), (unsigned)(i % seq),
                       (unsigned)(s->vocab));
            return COLIBRI_E_TOKEN;
        }
        if (attention_mask && attention_mask[i] > 1) {
            clb_detail(v->detail, DETAIL_CAP, "attention_mask[%u, %u] is %u, "
                       "must be 0 or 1", (unsigned)(i / seq), (unsigned)(i % seq),
                       (unsigned)(attention_mask[i]));
            return COLIBRI_E_ARG;
        }
    }
    clb_plan *p = (clb_plan *)v->plan;
    if (p->ed && logits_mode == COLIBRI_LOGITS_LAST && seq > 1) {
        clb_detail(v->detail, DETAIL_CAP, "an encoder-decoder's decoder gives "
                   "every position's logits: use COLIBRI_LOGITS_ALL (or seq 1)");
        return COLIBRI_E_UNSUPPORTED;
    }
    if (p->ed) { /* an encoder-decoder: decoder steps after colibri_encode */
        int rc = clb_encdec_begin(p, batch, v->detail);
        if (rc)
            return rc;
    }
    for (size_t i = 0; i < total; i++)
        p->mask_cache[(i / seq) * s->max_seq_len + n_past + i % seq] =
            attention_mask ? attention_mask[i] : 1;
    for (size_t start = 0; start < total; start += p->chunk) {
        uint32_t n = (uint32_t)(total - start < p->chunk ? total - start : p->chunk);
        for (uint32_t i = 0; i < n; i++) {
            p->tok_b[i] = (uint32_t)((start + i) / seq);
            p->tok_pos[i] = n_past + (uint32_t)((start + i) % seq);
        }
        int rc = COLIBRI_OK;
        if (p->ed) /* ALL rows; LAST with seq 1 is the same layout */
            clb_encdec_decode_chunk(p, input_ids + start, n,
                                    logits + start * s->vocab);
        else if (logits_mode == COLIBRI_LOGITS_LAST)
            rc = forward_chunk(p, input_ids + start, n, n_past + seq - 1, logits,
                               v->detail);
        else
            rc = forward_chunk(p, input_ids + start, n, UINT32_MAX,
                               logits + start * s->vocab, v->detail);
        if (rc) {
            /* A streamed expert failed mid-call: the cache positions from
             * n_past on may hold this call's keys in some layers, so only
             * the n_past before it remain (colibri.h). */
            if (v->cached_len > n_past)
                v->cached_len = n_past;
            return rc;
        }
    }
    v->cached_len = n_past + seq;
    v->cached_batch = batch;
    return COLIBRI_OK;
}
