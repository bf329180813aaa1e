/*
 * forward.c - colibri_infer: checks the call's arguments against the model's
 * limits and the KV cache, then runs the tokens in chunks through the layers
 * (tensor.c for the dense parts, moe.c for the experts). Allocates nothing,
 * makes no system call: every buffer is in the plan.
 */
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
static void forward_chunk(const clb_plan *p, const int32_t *ids, uint32_t n,
                          float *logits)
{
    const colibri_shape *s = &p->s;
    uint32_t h = s->hidden, kvdim = p->kvdim, S = s->max_seq_len;
    clb_embed(p, ids, n, p->x);
    for (uint32_t l = 0; l < s->n_layers; l++) {
        const clb_layer *L = &p->layers[l];
        clb_rmsnorm(p->xn, p->x, L->attn_norm, n, h, s->rms_eps);
        clb_linear(p, &L->wq, p->xn, n, p->q, "wq");
        clb_linear2(p, &L->wk, &L->wv, p->xn, n, p->kbuf, p->vbuf, "wk.wv");
        for (uint32_t i = 0; i < n; i++) {
            clb_rope(p, p->q + (size_t)i * p->qdim, s->n_heads, p->tok_pos[i]);
            clb_rope(p, p->kbuf + (size_t)i * kvdim, s->n_kv_heads, p->tok_pos[i]);
            size_t slot = (((size_t)l * s->max_batch + p->tok_b[i]) * S +
                           p->tok_pos[i]) * kvdim;
            memcpy(p->k_cache + slot, p->kbuf + (size_t)i * kvdim, kvdim * 4);
            memcpy(p->v_cache + slot, p->vbuf + (size_t)i * kvdim, kvdim * 4);
        }
        for (uint32_t i = 0; i < n; i++)
            clb_attention(p, l, p->tok_b[i], p->tok_pos[i],
                          p->q + (size_t)i * p->qdim, p->att + (size_t)i * p->qdim);
        clb_linear(p, &L->wo, p->att, n, p->tmp, "wo");
        for (size_t i = 0; i < (size_t)n * h; i++)
            p->x[i] += p->tmp[i];
        clb_rmsnorm(p->xn, p->x, L->ffn_norm, n, h, s->rms_eps);
        clb_moe(p, L, p->xn, n, p->tmp);
        for (size_t i = 0; i < (size_t)n * h; i++)
            p->x[i] += p->tmp[i];
    }
    clb_rmsnorm(p->xn, p->x, p->final_norm, n, h, s->rms_eps);
    clb_linear(p, &p->lm_head, p->xn, n, logits, "lm_head");
}

int colibri_infer(colibri_model *m, const int32_t *input_ids,
                  const uint8_t *attention_mask, uint32_t batch, uint32_t seq,
                  uint32_t n_past, float *logits)
{
    if (!m)
        return COLIBRI_E_ARG;
    struct colibri_model_private_ *v = &m->priv_;
    if (v->magic != CLB_MODEL_MAGIC) {
        clb_detail(v->detail, DETAIL_CAP, "the model is not initialised");
        return COLIBRI_E_NOT_INIT;
    }
    v->detail[0] = '\0'; /* a detail describes this call's failure only */
    const colibri_shape *s = &v->shape;
    if (!input_ids || !logits || batch == 0 || seq == 0) {
        clb_detail(v->detail, DETAIL_CAP, "input_ids and logits must be non-NULL"
                   ", batch (%u) and seq (%u) >= 1", (unsigned)batch, (unsigned)seq);
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
    for (size_t i = 0; i < total; i++)
        p->mask_cache[(i / seq) * s->max_seq_len + n_past + i % seq] =
            attention_mask ? attention_mask[i] : 1;
    for (size_t start = 0; start < total; start += p->chunk) {
        uint32_t n = (uint32_t)(total - start < p->chunk ? total - start : p->chunk);
        for (uint32_t i = 0; i < n; i++) {
            p->tok_b[i] = (uint32_t)((start + i) / seq);
            p->tok_pos[i] = n_past + (uint32_t)((start + i) % seq);
        }
        forward_chunk(p, input_ids + start, n, logits + start * s->vocab);
    }
    v->cached_len = n_past + seq;
    v->cached_batch = batch;
    return COLIBRI_OK;
}
