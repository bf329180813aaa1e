/*
 * encdec.h - the encoder-decoder forward pass (ENC_DEC files: Switch
 * Transformers, docs/FORMAT.md 6): its arena state, the weight views the
 * decoder-only plan lacks, and the entry points plan.c and forward.c call.
 * Not installed.
 *
 * Shapes: B max_batch, S max_seq_len, H n_heads, d head_dim (T5's d_kv),
 * qdim = H * d, h hidden, E n_experts, L n_layers (encoder + decoder),
 * Ld decoder layers, n = batch * seq rows of one call.
 */
#ifndef COLIBRI_ENCDEC_H
#define COLIBRI_ENCDEC_H

#include "internal.h"

/* A decoder layer's cross-attention (into the file). */
typedef struct clb_xattn {
    const float *norm;          /* [hidden] */
    clb_weight wq, wk, wv, wo;  /* [qdim, h] x3, [h, qdim] */
} clb_xattn;

/* Everything of an ENC_DEC model the decoder-only plan has no field for;
 * lives in the arena, p->ed points at it (NULL for other models). */
typedef struct clb_encdec {
    const float *enc_bias;       /* [H, 2S-1]: column rel + S - 1, rel = key - query */
    const float *dec_bias;       /* [H, S]: column = query - key distance */
    const float *enc_final_norm; /* [h] */
    clb_xattn *x;                /* [L]; entries of decoder layers are set */
    float *enc_out;              /* [B*S, h]: rows b*seq + t; the encoder's
                                    residual stream, then its output */
    uint8_t *enc_mask;           /* [B, S] */
    clb_kv_rows x_kv;            /* rows [Ld, B, S]: cross-attention K/V,
                                    of the plan's kv_dtype */
    uint32_t *cap_count;         /* [L, B, E] tokens routed per expert in
                                    the current call (expert capacity) */
    uint32_t enc_batch, enc_seq; /* of the last colibri_encode; 0 before */
} clb_encdec;

/* The build switch -DCOLIBRI_NO_ENCDEC (scons encdec=0) compiles encdec.c's
 * code out and leaves stubs: the public calls return COLIBRI_E_UNSUPPORTED
 * (colibri_decoder_start -1). colibri_init* and colibri_arena_size ask this
 * first: 0, or COLIBRI_E_UNSUPPORTED with a detail (detail may be NULL) when
 * d is an ENC_DEC model and the build has no encoder-decoder runtime. */
int clb_encdec_supported(const clb_desc *d, char *detail);

/* Carve the ENC_DEC state after the plan's buffers (counting only when
 * c->base is NULL; the cross-attention K/V of the cache type kv_dtype) and
 * point p->ed at it (p may be NULL when counting). */
void clb_encdec_layout(carver *c, const colibri_shape *s, const clb_desc *d,
                       unsigned kv_dtype, clb_plan *p);

/* Bind one table entry of the ENC_DEC kinds (the positional biases,
 * cross-attention, the encoder's final norm). Returns 1 if the kind was one
 * of them, 0 to let the decoder-only binding handle it. */
int clb_encdec_bind(clb_plan *p, unsigned kind, unsigned layer, const clb_weight *w);

/* colibri_infer on an ENC_DEC model, before anything changes: 0, or
 * COLIBRI_E_KV_STATE (no colibri_encode yet, or a batch other than the
 * encoded one) with a detail. Resets the capacity counts of the call. */
int clb_encdec_begin(const clb_plan *p, uint32_t batch, char *detail);

/* The decoder on chunk rows (ids[n], p->tok_b / p->tok_pos set, mask_cache
 * filled): logits [n, vocab]. */
void clb_encdec_decode_chunk(const clb_plan *p, const int32_t *ids, uint32_t n,
                             float *logits);

#endif /* COLIBRI_ENCDEC_H */
