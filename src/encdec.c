/*
 * encdec.c - the encoder-decoder forward pass of an ENC_DEC file (Switch
 * Transformers; what it computes is docs/FORMAT.md 6 and
 * colibri/model/reference_encdec.py): colibri_encode runs the encoder once over a
 * batch and computes every decoder layer's cross-attention K/V from its
 * output; colibri_infer then runs decoder steps (forward.c hands ENC_DEC
 * chunks to clb_encdec_decode_chunk) with the self-attention KV cache.
 *
 * T5 conventions: RMSNorm without mean or bias (clb_rmsnorm), scores not
 * scaled by 1/sqrt(d) (the file's attn_scale is 1), a relative position
 * bias read from per-distance tables (bucketed at conversion), ReLU FFNs
 * (W2 . relu(W1 . x)), a top-1 router whose expert capacity counts the
 * tokens of one sequence in one call. Allocates nothing, makes no system
 * call: every buffer is in the plan's arena.
 */
#include "encdec.h"
#include "support.h"

#include <math.h>
#include <string.h>

/* The detail of every refusal of the encdec=0 build (-DCOLIBRI_NO_ENCDEC). */
#define NO_ENCDEC_DETAIL "this build has no encoder-decoder runtime (built with encdec=0)"

#ifdef COLIBRI_NO_ENCDEC
/* The build switch: the API stays, the code goes. colibri_init* and
 * colibri_arena_size refuse an ENC_DEC file (clb_encdec_supported), so no
 * plan ever has p->ed set and the hooks below are never reached with one. */
int clb_encdec_supported(const clb_desc *d, char *detail)
{
    if (!(d->features & COLIBRI_FEAT_ENC_DEC))
        return COLIBRI_OK;
    if (detail)
        clb_detail(detail, DETAIL_CAP, NO_ENCDEC_DETAIL);
    return COLIBRI_E_UNSUPPORTED;
}
void clb_encdec_layout(carver *c, const colibri_shape *s, const clb_desc *d,
                       unsigned kv_dtype, clb_plan *p)
{ (void)c; (void)s; (void)d; (void)kv_dtype; if (p) p->ed = NULL; }
int clb_encdec_bind(clb_plan *p, unsigned kind, unsigned layer, const clb_weight *w)
{ (void)p; (void)kind; (void)layer; (void)w; return 0; }
int clb_encdec_begin(const clb_plan *p, uint32_t batch, char *detail)
{ (void)p; (void)batch; clb_detail(detail, DETAIL_CAP, NO_ENCDEC_DETAIL);
  return COLIBRI_E_UNSUPPORTED; }
void clb_encdec_decode_chunk(const clb_plan *p, const int32_t *ids, uint32_t n,
                             float *logits)
{ (void)p; (void)ids; (void)n; (void)logits; }
int colibri_encode(colibri_model *m, const int32_t *input_ids,
                   const uint8_t *attention_mask, uint32_t batch, uint32_t seq)
{
    (void)input_ids; (void)attention_mask; (void)batch; (void)seq;
    if (!m)
        return COLIBRI_E_ARG;
    clb_detail(m->priv_.detail, DETAIL_CAP, "colibri_encode: " NO_ENCDEC_DETAIL);
    return COLIBRI_E_UNSUPPORTED;
}
int colibri_encoder_output(const colibri_model *m, float *out)
{ (void)out; return m ? COLIBRI_E_UNSUPPORTED : COLIBRI_E_ARG; }
int32_t colibri_decoder_start(const colibri_model *m)
{ (void)m; return -1; }
#else

int clb_encdec_supported(const clb_desc *d, char *detail)
{ (void)d; (void)detail; return COLIBRI_OK; }

/* ------------------------------------------------------------------------ */
/* Layout and binding                                                       */
/* ------------------------------------------------------------------------ */

void clb_encdec_layout(carver *c, const colibri_shape *s, const clb_desc *d,
                       unsigned kv_dtype, clb_plan *p)
{
    uint64_t B = s->max_batch, S = s->max_seq_len, h = s->hidden, E = s->n_experts;
    uint64_t L = s->n_layers, Ld = L - d->encoder_layers;
    int *o = &c->ovf;
    clb_encdec *ed = (clb_encdec *)clb_carve(c, sizeof(clb_encdec));
    clb_xattn *x = (clb_xattn *)clb_carve(c, cmul(L, sizeof(clb_xattn), o));
    float *enc_out = (float *)clb_carve(c, cmul(cmul(B * S, h, o), 4, o));
    uint8_t *enc_mask = (uint8_t *)clb_carve(c, B * S);
    /* n_kv_heads = n_heads in these files (format.c): kvdim = qdim */
    clb_kv_rows x_kv = clb_kv_carve(c, cmul(Ld, B * S, o), s, kv_dtype);
    uint32_t *cap = (uint32_t *)clb_carve(c, cmul(cmul(L, B * E, o), 4, o));
    if (!p || !ed)
        return;
    ed->x = x;
    ed->enc_out = enc_out;
    ed->enc_mask = enc_mask;
    ed->x_kv = x_kv;
    ed->cap_count = cap;
    p->ed = ed;
}

int clb_encdec_bind(clb_plan *p, unsigned kind, unsigned layer, const clb_weight *w)
{
    clb_encdec *ed = p->ed;
    clb_xattn *X = layer == COLIBRI_NO_LAYER ? NULL : &ed->x[layer];
    if (!X && kind >= COLIBRI_KIND_XATTN_NORM && kind <= COLIBRI_KIND_XWO)
        return 1; /* format.c: cross-attention tensors name their layer */
    switch (kind) {
    case COLIBRI_KIND_ENC_POS_BIAS: ed->enc_bias = (const float *)w->q; return 1;
    case COLIBRI_KIND_DEC_POS_BIAS: ed->dec_bias = (const float *)w->q; return 1;
    case COLIBRI_KIND_ENC_FINAL_NORM: ed->enc_final_norm = (const float *)w->q; return 1;
    case COLIBRI_KIND_XATTN_NORM: X->norm = (const float *)w->q; return 1;
    case COLIBRI_KIND_XWQ: X->wq = *w; return 1;
    case COLIBRI_KIND_XWK: X->wk = *w; return 1;
    case COLIBRI_KIND_XWV: X->wv = *w; return 1;
    case COLIBRI_KIND_XWO: X->wo = *w; return 1;
    default: return 0;
    }
}

/* ------------------------------------------------------------------------ */
/* Pieces                                                                   */
/* ------------------------------------------------------------------------ */

/* T5 attention of the chunk's n query rows p->q [n, qdim] (row i:
 * sequence tok_b[i] at position tok_pos[i]) over keys and values laid out
 * as the plan's cache (float32 or int8, clb_kv_rows), out
 * p->att [n, qdim]: a parallel region of (sequence, head) units, each
 * handing the kernel table's attend_rows its sequence's rows of one head
 * (kernels.h; ref.c's flash-attention schedule, the same bits in every
 * table and for every thread count). Scores are q.k times attn_scale (1
 * in these files) plus, with a bias table [H, cols], the bias of the
 * query at pos and key j at column at + pos * per_pos + j * step; keys
 * with mask[j] == 0 are skipped and a query seeing none gets zeros. */
typedef struct t5_att {
    const clb_plan *p;
    const clb_kv_rows *kv;
    size_t row0;                  /* the layer's first row (of [B, S]) */
    const uint8_t *mask;          /* [B, S] */
    const float *bias;            /* [H, cols], or NULL */
    size_t cols;
    ptrdiff_t at, per_pos, step;
    uint32_t n, n_all;            /* chunk rows; keys each query sees (0: pos + 1) */
} t5_att;

static void t5_att_unit(void *ctx, uint32_t u, uint32_t worker)
{
    (void)worker;
    const t5_att *j = (const t5_att *)ctx;
    const clb_plan *p = j->p;
    const uint32_t H = p->s.n_heads, b = u / H, hd = u % H, d = p->s.head_dim;
    const uint32_t S = p->s.max_seq_len;
    uint32_t r0, r1;
    if (!clb_seq_rows(p, j->n, b, &r0, &r1))
        return;
    clb_att_args a;
    memset(&a, 0, sizeof a);
    clb_kv_args(p, j->kv, j->row0 + (size_t)b * S, hd, &a);
    a.mask = j->mask + (size_t)b * S;
    a.bias_step = j->step;
    a.scale = p->d.attn_scale;
    clb_att_rows r = clb_chunk_queries(p, r0, r1, (size_t)hd * d, 1);
    r.n_all = j->n_all;
    r.bias = j->bias ? j->bias + hd * j->cols + j->at : NULL;
    r.bias_pos = j->per_pos;
    p->k->attend_rows(&r, &a);
}

static void t5_attention(const t5_att *j)
{
    clb_parallel(clb_team_of(j->p), j->p->s.max_batch * j->p->s.n_heads, t5_att_unit, (void *)j);
}

static void relu(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

static void add(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
}

/* Y[n, h] = W2 . relu(W1 . X) (p->h1 holds [n, width]). */
static void relu_ffn(const clb_plan *p, const clb_expert *f, const float *X,
                     uint32_t n, float *Y, const char *what1, const char *what2)
{
    clb_linear(p, &f->w1, X, n, p->h1, what1);
    relu(p->h1, (size_t)n * f->w1.rows);
    clb_linear(p, &f->w2, p->h1, n, Y, what2);
}

/* Switch's top-1 MoE of the normalised rows X[n, h] (row i of sequence
 * p->tok_b[i], rows of a sequence in position order) for file layer l:
 * softmax of the router logits, the first maximum wins; the token is kept
 * while the count of its sequence's tokens routed to that expert in this
 * call (itself included) is <= expert_capacity, and then gets
 * expert(x) * probability; a dropped token gets 0 (the residual only).
 * Experts run on their gathered rows, so each streams its weights once. */
static void switch_moe(const clb_plan *p, uint32_t l, const clb_layer *L,
                       const float *X, uint32_t n, float *Y)
{
    const clb_encdec *ed = p->ed;
    uint32_t E = p->s.n_experts, h = p->s.hidden;
    clb_linear(p, &L->router, X, n, p->router_logits, "router");
    memset(p->counts, 0, E * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++) {
        float *pr = p->probs + (size_t)i * E;
        clb_softmax(pr, p->router_logits + (size_t)i * E, E);
        uint32_t best = 0;
        for (uint32_t e = 1; e < E; e++)
            if (pr[e] > pr[best])
                best = e;
        uint32_t *cnt = ed->cap_count + ((size_t)l * p->s.max_batch + p->tok_b[i]) * E + best;
        ++*cnt;
        int kept = *cnt <= p->d.expert_capacity;
        p->sel[i] = kept ? (uint16_t)best : (uint16_t)0xFFFF;
        p->selw[i] = pr[best];
        if (kept)
            p->counts[best]++;
        else
            memset(Y + (size_t)i * h, 0, h * sizeof(float));
    }
    p->offsets[0] = 0;
    for (uint32_t e = 0; e < E; e++)
        p->offsets[e + 1] = p->offsets[e] + p->counts[e];
    memset(p->counts, 0, E * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++)
        if (p->sel[i] != 0xFFFF) {
            uint32_t e = p->sel[i];
            p->tok_list[p->offsets[e] + p->counts[e]++] = i;
        }
    for (uint32_t e = 0; e < E; e++) {
        uint32_t m = p->counts[e];
        if (!m)
            continue;
        const uint32_t *rows = p->tok_list + p->offsets[e];
        for (uint32_t r = 0; r < m; r++)
            memcpy(p->xe + (size_t)r * h, X + (size_t)rows[r] * h, h * sizeof(float));
        relu_ffn(p, &L->experts[e], p->xe, m, p->ye, "expert.w1", "expert.w2");
        for (uint32_t r = 0; r < m; r++) {
            float w = p->selw[rows[r]];
            float *y = Y + (size_t)rows[r] * h;
            const float *ye = p->ye + (size_t)r * h;
            for (uint32_t c = 0; c < h; c++)
                y[c] = ye[c] * w;
        }
    }
}

/* x[n, h] += FFN(norm(x)) for file layer l: dense ReLU or the Switch MoE. */
static void ffn_block(const clb_plan *p, uint32_t l, float *x, uint32_t n)
{
    const clb_layer *L = &p->layers[l];
    uint32_t h = p->s.hidden;
    clb_rmsnorm(p, p->xn, x, L->ffn_norm, n, h, p->s.rms_eps);
    if (L->dense)
        relu_ffn(p, &L->ffn, p->xn, n, p->tmp, "dense.w1", "dense.w2");
    else
        switch_moe(p, l, L, p->xn, n, p->tmp);
    add(x, p->tmp, (size_t)n * h);
}

/* ------------------------------------------------------------------------ */
/* Encoder                                                                  */
/* ------------------------------------------------------------------------ */

/* The chunk of encoder rows [start, start + n): sequence and position. */
static void enc_rows(const clb_plan *p, size_t start, uint32_t n, uint32_t seq)
{
    for (uint32_t i = 0; i < n; i++) {
        p->tok_b[i] = (uint32_t)((start + i) / seq);
        p->tok_pos[i] = (uint32_t)((start + i) % seq);
    }
}

/* Encoder layer l over all rows (bidirectional: every key of a sequence
 * before any query), then its FFN; x = ed->enc_out [rows, h]. */
static void encoder_layer(const clb_plan *p, uint32_t l, uint32_t batch, uint32_t seq)
{
    const clb_encdec *ed = p->ed;
    const clb_layer *L = &p->layers[l];
    uint32_t h = p->s.hidden, S = p->s.max_seq_len;
    size_t total = (size_t)batch * seq;
    for (size_t start = 0; start < total; start += p->chunk) {
        uint32_t n = (uint32_t)(total - start < p->chunk ? total - start : p->chunk);
        enc_rows(p, start, n, seq);
        clb_rmsnorm(p, p->xn, ed->enc_out + start * h, L->attn_norm, n, h, p->s.rms_eps);
        clb_linear2(p, &L->wk, &L->wv, p->xn, n, p->kbuf, p->vbuf, "enc.wk.wv");
        for (uint32_t i = 0; i < n; i++)
            clb_kv_store(p, l, p->tok_b[i], p->tok_pos[i], p->kbuf + (size_t)i * p->qdim,
                         p->vbuf + (size_t)i * p->qdim);
    }
    for (size_t start = 0; start < total; start += p->chunk) {
        uint32_t n = (uint32_t)(total - start < p->chunk ? total - start : p->chunk);
        float *x = ed->enc_out + start * h;
        enc_rows(p, start, n, seq);
        clb_rmsnorm(p, p->xn, x, L->attn_norm, n, h, p->s.rms_eps);
        clb_linear(p, &L->wq, p->xn, n, p->q, "enc.wq");
        /* every query sees the whole input; bias column S - 1 - t + j */
        const t5_att att = {p, &p->kv, clb_kv_row(p, l, 0, 0), ed->enc_mask, ed->enc_bias,
                            2u * (size_t)S - 1u,
                            (ptrdiff_t)S - 1, -1, 1, n, seq};
        t5_attention(&att);
        clb_linear(p, &L->wo, p->att, n, p->tmp, "enc.wo");
        add(x, p->tmp, (size_t)n * h);
        ffn_block(p, l, x, n);
    }
}

int colibri_encode(colibri_model *m, const int32_t *input_ids,
                   const uint8_t *attention_mask, uint32_t batch, uint32_t seq)
{
    int rc0 = clb_call_begin(m);
    if (rc0)
        return rc0;
    struct colibri_model_private_ *v = &m->priv_;
    clb_plan *p = (clb_plan *)v->plan;
    const colibri_shape *s = &v->shape;
    if (!p->ed) {
        clb_detail(v->detail, DETAIL_CAP, "colibri_encode: the model is "
                   "decoder-only (no ENC_DEC flag); use colibri_infer");
        return COLIBRI_E_ARG;
    }
    if (!input_ids || batch == 0 || seq == 0) {
        clb_detail(v->detail, DETAIL_CAP, "colibri_encode: input_ids must be "
                   "non-NULL, batch (%u) and seq (%u) >= 1", (unsigned)batch,
                   (unsigned)seq);
        return COLIBRI_E_ARG;
    }
    if (batch > s->max_batch || seq > s->max_seq_len) {
        clb_detail(v->detail, DETAIL_CAP, "colibri_encode: batch %u x seq %u "
                   "exceeds the file's max_batch %u / max_seq_len %u",
                   (unsigned)batch, (unsigned)seq, (unsigned)s->max_batch,
                   (unsigned)s->max_seq_len);
        return COLIBRI_E_INPUT_TOO_LARGE;
    }
    size_t total = (size_t)batch * seq;
    for (size_t i = 0; i < total; i++) {
        if (input_ids[i] < 0 || (uint32_t)input_ids[i] >= s->vocab) {
            clb_detail(v->detail, DETAIL_CAP, "encoder token id at [%u, %u] is "
                       "out of range [0, %u)", (unsigned)(i / seq),
                       (unsigned)(i % seq), (unsigned)s->vocab);
            return COLIBRI_E_TOKEN;
        }
        if (attention_mask && attention_mask[i] > 1) {
            clb_detail(v->detail, DETAIL_CAP, "encoder attention_mask[%u, %u] is "
                       "%u, must be 0 or 1", (unsigned)(i / seq),
                       (unsigned)(i % seq), (unsigned)attention_mask[i]);
            return COLIBRI_E_ARG;
        }
    }
    clb_encdec *ed = p->ed;
    uint32_t h = s->hidden, S = s->max_seq_len;
    uint32_t n_enc = p->d.encoder_layers;
    for (size_t i = 0; i < total; i++)
        ed->enc_mask[(i / seq) * S + i % seq] = attention_mask ? attention_mask[i] : 1;
    memset(ed->cap_count, 0, (size_t)s->n_layers * s->max_batch * s->n_experts * 4);
    for (size_t start = 0; start < total; start += p->chunk) {
        uint32_t n = (uint32_t)(total - start < p->chunk ? total - start : p->chunk);
        clb_embed(p, input_ids + start, n, ed->enc_out + start * h);
    }
    for (uint32_t l = 0; l < n_enc; l++)
        encoder_layer(p, l, batch, seq);
    clb_rmsnorm(p, ed->enc_out, ed->enc_out, ed->enc_final_norm, (uint32_t)total, h,
                s->rms_eps);
    /* Every decoder layer's cross-attention K/V, once per encoding. */
    for (uint32_t l = n_enc; l < s->n_layers; l++) {
        const clb_xattn *X = &ed->x[l];
        for (size_t start = 0; start < total; start += p->chunk) {
            uint32_t n = (uint32_t)(total - start < p->chunk ? total - start : p->chunk);
            enc_rows(p, start, n, seq);
            clb_linear2(p, &X->wk, &X->wv, ed->enc_out + start * h, n, p->kbuf, p->vbuf,
                        "cross.wk.wv");
            for (uint32_t i = 0; i < n; i++)
                clb_kv_put(p, &ed->x_kv, clb_kv_row(p, l - n_enc, p->tok_b[i], p->tok_pos[i]),
                           p->kbuf + (size_t)i * p->qdim, p->vbuf + (size_t)i * p->qdim);
        }
    }
    ed->enc_batch = batch;
    ed->enc_seq = seq;
    v->cached_len = 0; /* a new encoding starts a new decoding */
    v->cached_batch = 0;
    return COLIBRI_OK;
}

int colibri_encoder_output(const colibri_model *m, float *out)
{
    if (!m)
        return COLIBRI_E_ARG;
    if (m->priv_.magic != CLB_MODEL_MAGIC)
        return COLIBRI_E_NOT_INIT;
    const clb_plan *p = (const clb_plan *)m->priv_.plan;
    if (!out || !p->ed)
        return COLIBRI_E_ARG;
    if (!p->ed->enc_batch)
        return COLIBRI_E_KV_STATE;
    memcpy(out, p->ed->enc_out,
           (size_t)p->ed->enc_batch * p->ed->enc_seq * p->s.hidden * sizeof(float));
    return COLIBRI_OK;
}

int32_t colibri_decoder_start(const colibri_model *m)
{
    if (!m || m->priv_.magic != CLB_MODEL_MAGIC)
        return -1;
    const clb_plan *p = (const clb_plan *)m->priv_.plan;
    return p->ed ? (int32_t)p->d.decoder_start : -1;
}

/* ------------------------------------------------------------------------ */
/* Decoder                                                                  */
/* ------------------------------------------------------------------------ */

int clb_encdec_begin(const clb_plan *p, uint32_t batch, char *detail)
{
    const clb_encdec *ed = p->ed;
    if (!ed->enc_batch) {
        clb_detail(detail, DETAIL_CAP, "decoder step before colibri_encode: "
                   "encode the input first");
        return COLIBRI_E_KV_STATE;
    }
    if (batch != ed->enc_batch) {
        clb_detail(detail, DETAIL_CAP, "decoder batch %u, but colibri_encode ran "
                   "on batch %u", (unsigned)batch, (unsigned)ed->enc_batch);
        return COLIBRI_E_KV_STATE;
    }
    memset(ed->cap_count, 0,
           (size_t)p->s.n_layers * p->s.max_batch * p->s.n_experts * 4);
    return COLIBRI_OK;
}

void clb_encdec_decode_chunk(const clb_plan *p, const int32_t *ids, uint32_t n,
                             float *logits)
{
    const clb_encdec *ed = p->ed;
    const colibri_shape *s = &p->s;
    uint32_t h = s->hidden, S = s->max_seq_len, qd = p->qdim;
    size_t nh = (size_t)n * h;
    clb_embed(p, ids, n, p->x);
    for (uint32_t l = p->d.encoder_layers; l < s->n_layers; l++) {
        const clb_layer *L = &p->layers[l];
        const clb_xattn *X = &ed->x[l];
        uint32_t ld = l - p->d.encoder_layers;
        /* Causal self-attention with the decoder's bias (distance pos - j). */
        clb_rmsnorm(p, p->xn, p->x, L->attn_norm, n, h, s->rms_eps);
        clb_linear(p, &L->wq, p->xn, n, p->q, "dec.wq");
        clb_linear2(p, &L->wk, &L->wv, p->xn, n, p->kbuf, p->vbuf, "dec.wk.wv");
        for (uint32_t i = 0; i < n; i++)
            clb_kv_store(p, l, p->tok_b[i], p->tok_pos[i], p->kbuf + (size_t)i * qd,
                         p->vbuf + (size_t)i * qd);
        const t5_att self = {p, &p->kv, clb_kv_row(p, l, 0, 0), p->mask_cache, ed->dec_bias, S,
                             0, 1, -1, n, 0};
        t5_attention(&self);
        clb_linear(p, &L->wo, p->att, n, p->tmp, "dec.wo");
        add(p->x, p->tmp, nh);
        /* Cross-attention over the encoder output: no bias, padding masked. */
        clb_rmsnorm(p, p->xn, p->x, X->norm, n, h, s->rms_eps);
        clb_linear(p, &X->wq, p->xn, n, p->q, "cross.wq");
        const t5_att cross = {p, &ed->x_kv, clb_kv_row(p, ld, 0, 0), ed->enc_mask, NULL, 0, 0, 0,
                              1, n, ed->enc_seq};
        t5_attention(&cross);
        clb_linear(p, &X->wo, p->att, n, p->tmp, "cross.wo");
        add(p->x, p->tmp, nh);
        ffn_block(p, l, p->x, n);
    }
    clb_rmsnorm(p, p->xn, p->x, p->final_norm, n, h, s->rms_eps);
    if (p->d.lm_scale != 1.0f)
        for (size_t i = 0; i < nh; i++)
            p->xn[i] *= p->d.lm_scale;
    clb_linear(p, &p->lm_head, p->xn, n, logits, "lm_head");
}

#endif /* COLIBRI_NO_ENCDEC */
