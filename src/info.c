/*
 * info.c - what the library says about itself and an instance: error
 * sentences, the last error's detail, the model's shape and properties, the
 * router as the runtime uses it, and the build's switches.
 */
#include "internal.h"
#include "stream.h"
#include "support.h"
#include "colibri_tokenizer.h" /* the tokenizer's codes -30..-37 */

#include <string.h>

/* ------------------------------------------------------------------------ */
/* Introspection                                                            */
/* ------------------------------------------------------------------------ */

const char *colibri_strerror(int code)
{
    switch (code) {
    case COLIBRI_OK: return "success";
    case COLIBRI_E_BAD_FORMAT:
        return "bad .colibri file (init) or input larger than the model's "
               "max_batch/max_seq_len (infer)";
    case COLIBRI_E_NO_MEMORY: return "out of memory";
    case COLIBRI_E_CRC: return "CRC mismatch: the file is corrupted";
    case COLIBRI_E_IO: return "I/O error: cannot open, map or read the file";
    case COLIBRI_E_VERSION: return "unsupported format version";
    case COLIBRI_E_BYTE_ORDER:
        return "file byte order differs from the host and cannot be swapped here";
    case COLIBRI_E_ARG: return "bad argument";
    case COLIBRI_E_TOKEN: return "token id out of range";
    case COLIBRI_E_ARENA_TOO_SMALL: return "arena too small for this model";
    case COLIBRI_E_ALIGN: return "misaligned blob or arena";
    case COLIBRI_E_KV_STATE: return "n_past or batch does not match the KV cache";
    case COLIBRI_E_UNSUPPORTED: return "not supported by this build";
    case COLIBRI_E_NOT_INIT: return "model not initialised";
    /* colibri_tokenizer.h's codes: one text for every code the library
     * returns, whichever header defines it (colibri_tok_strerror adds only
     * the no-tokenizer build's meaning of COLIBRI_E_UNSUPPORTED). A build
     * without the tokenizer never returns them and keeps its bytes. */
#ifndef COLIBRI_NO_TOKENIZER
    case COLIBRI_E_TOK_NONE:
        return "the model file holds no tokenizer (convert a checkpoint with a tokenizer.json)";
    case COLIBRI_E_TOK_FORMAT: return "the tokenizer section is malformed (re-convert the file)";
    case COLIBRI_E_TOK_BUFFER: return "output buffer too small (the count needed is returned)";
    case COLIBRI_E_TOK_UTF8: return "text is not valid UTF-8";
    case COLIBRI_E_TOK_NO_BOS:
        return "the tokenizer has no bos token (ADD_BOS) or no eos token (ADD_EOS)";
    case COLIBRI_E_TOK_REGEX:
        return "the text needs more regex backtracking than COLIBRI_TOK_RX_STACK allows "
               "(split the text, or rebuild with a larger COLIBRI_TOK_RX_STACK)";
    case COLIBRI_E_TOK_NORM:
        return "the text is not in NFC and its normal form is longer than "
               "COLIBRI_TOK_NORM_BUF bytes (normalise it first, or split it)";
    case COLIBRI_E_TOK_WORD:
        return "a word (text between spaces) is longer than COLIBRI_TOK_UNIGRAM_WORD bytes, "
               "the Unigram tokenizer's bound (split it, or rebuild with a larger one)";
#endif
    default: return "unknown error code";
    }
}

/* -1 is the one code with two meanings (colibri.h); the caller says which
 * call returned it, so a user reads only the meaning that applies. */
const char *colibri_strerror_for(int code, colibri_call call)
{
    if (code == COLIBRI_E_BAD_FORMAT)
        return call == COLIBRI_CALL_INFER
                   ? "input larger than the model's max_batch/max_seq_len"
                   : "bad .colibri file";
    return colibri_strerror(code);
}

const char *colibri_error_detail(const colibri_model *m)
{
    return m ? m->priv_.detail : "";
}

int colibri_get_info(const colibri_model *m, colibri_info *out)
{
    if (!m || !out)
        return COLIBRI_E_ARG;
    const struct colibri_model_private_ *v = &m->priv_;
    if (v->magic != CLB_MODEL_MAGIC)
        return COLIBRI_E_NOT_INIT;
    static const char *const modes[] = { "?", "mmap", "read", "memory", "shared",
                                         "stream" };
    const clb_plan *p = (const clb_plan *)v->plan;
    memset(out, 0, sizeof *out);
    out->shape = v->shape;
    out->format_version = p->d.version;
    out->file_big_endian = v->file_big_endian;
    out->byte_swapped = v->byte_swapped;
    out->dtype_embed = p->embed.dtype;
    out->dtype_attn = p->layers[0].wq.dtype;
    uint32_t moe_layer = 0; /* the first layer with experts */
    while (moe_layer + 1u < v->shape.n_layers && p->layers[moe_layer].dense)
        moe_layer++;
    out->dtype_router = p->layers[moe_layer].router.dtype;
    out->dtype_expert = p->layers[moe_layer].experts[0].w1.dtype;
    out->dtype_lm_head = p->lm_head.dtype;
    const clb_layer *l0 = &p->layers[0];
    out->dtypes_attn = (uint16_t)(1u << l0->wq.dtype | 1u << l0->wk.dtype |
                                  1u << l0->wv.dtype | 1u << l0->wo.dtype);
    const clb_layer *lm = &p->layers[moe_layer];
    for (uint32_t e = 0; !lm->dense && e < v->shape.n_experts; e++)
        out->dtypes_expert |= (uint16_t)(1u << lm->experts[e].w1.dtype |
                                         1u << lm->experts[e].w3.dtype |
                                         1u << lm->experts[e].w2.dtype);
    /* a streamed instance's blob is its resident image, not the file */
    out->file_size = p->stream ? p->stream->file_size : v->blob_size;
    out->arena_bytes = v->arena_size;
    out->chunk_tokens = p->chunk;
    out->kv_dtype = p->kv_dtype;
    out->kv_bytes_per_token = clb_kv_bytes_per_token(&v->shape, p->kv_dtype);
    out->kv_bytes = clb_kv_bytes(&v->shape, p->kv_dtype);
    out->kernels = p->k->name;
    out->n_threads = clb_team_size(&p->team);
#if COLIBRI_THREADS
    out->thread_flags = p->team.flags;
    out->executor = p->team.ex.run != NULL;
#endif
    out->load_mode = modes[v->load_mode <= CLB_LOAD_STREAM ? v->load_mode : 0];
    out->huge_pages_advised = v->huge != NULL;
    const uint8_t *tab = v->blob + COLIBRI_TABLE_OFFSET;
    for (uint32_t i = 0; i < v->shape.n_tensors; i++) {
        const uint8_t *en = tab + (size_t)i * COLIBRI_ENTRY_SIZE;
        unsigned kind = rd16(en + COLIBRI_ENT_KIND, v->file_big_endian);
        if (kind < 1 || kind > COLIBRI_KIND_MAX)
            out->n_unknown_sections++;
        else if (kind != COLIBRI_KIND_DESC) /* a description, not weights */
            out->n_params += (uint64_t)rd32(en + COLIBRI_ENT_ROWS, v->file_big_endian) *
                             rd32(en + COLIBRI_ENT_COLS, v->file_big_endian);
    }
    return COLIBRI_OK;
}

/* The part of the network (COLIBRI_PART_*) a tensor kind belongs to. */
static unsigned part_of_kind(unsigned kind)
{
    switch (kind) {
    case COLIBRI_KIND_EMBED: return COLIBRI_PART_EMBED;
    case COLIBRI_KIND_WQ: case COLIBRI_KIND_WK: case COLIBRI_KIND_WV:
    case COLIBRI_KIND_WO: case COLIBRI_KIND_BQ: case COLIBRI_KIND_BK:
    case COLIBRI_KIND_BV: case COLIBRI_KIND_BO: case COLIBRI_KIND_XWQ:
    case COLIBRI_KIND_XWK: case COLIBRI_KIND_XWV: case COLIBRI_KIND_XWO:
    case COLIBRI_KIND_ENC_POS_BIAS: case COLIBRI_KIND_DEC_POS_BIAS:
        return COLIBRI_PART_ATTN;
    case COLIBRI_KIND_ROUTER: return COLIBRI_PART_ROUTER;
    case COLIBRI_KIND_EXPERT_W1: case COLIBRI_KIND_EXPERT_W3:
    case COLIBRI_KIND_EXPERT_W2:
        return COLIBRI_PART_EXPERTS;
    case COLIBRI_KIND_SHARED_GATE: case COLIBRI_KIND_SHARED_W1:
    case COLIBRI_KIND_SHARED_W3: case COLIBRI_KIND_SHARED_W2:
    case COLIBRI_KIND_DENSE_W1: case COLIBRI_KIND_DENSE_W3:
    case COLIBRI_KIND_DENSE_W2:
        return COLIBRI_PART_FFN;
    case COLIBRI_KIND_ATTN_NORM: case COLIBRI_KIND_FFN_NORM:
    case COLIBRI_KIND_FINAL_NORM: case COLIBRI_KIND_Q_NORM:
    case COLIBRI_KIND_K_NORM: case COLIBRI_KIND_XATTN_NORM:
    case COLIBRI_KIND_ENC_FINAL_NORM:
        return COLIBRI_PART_NORMS;
    case COLIBRI_KIND_LM_HEAD: return COLIBRI_PART_LM_HEAD;
    default: return COLIBRI_PART_OTHER; /* DESC, unknown kinds */
    }
}

int colibri_get_weight_bytes(const colibri_model *m, colibri_weight_bytes *out)
{
    if (!m || !out)
        return COLIBRI_E_ARG;
    const struct colibri_model_private_ *v = &m->priv_;
    if (v->magic != CLB_MODEL_MAGIC)
        return COLIBRI_E_NOT_INIT;
    memset(out, 0, sizeof *out);
    const uint8_t *tab = v->blob + COLIBRI_TABLE_OFFSET;
    int be = v->file_big_endian; /* the table stays in file order */
    for (uint32_t i = 0; i < v->shape.n_tensors; i++) {
        const uint8_t *en = tab + (size_t)i * COLIBRI_ENTRY_SIZE;
        unsigned part = part_of_kind(rd16(en + COLIBRI_ENT_KIND, be));
        out->bytes[part] += rd64(en + COLIBRI_ENT_SIZE, be);
        out->tensors[part]++;
        if (part != COLIBRI_PART_OTHER)
            out->dtypes[part] |= 1u << (en[COLIBRI_ENT_DTYPE] & 31u);
    }
    return COLIBRI_OK;
}

int colibri_router_weights(const colibri_model *m, uint32_t layer, float *out)
{
    if (!m || !out)
        return COLIBRI_E_ARG;
    if (m->priv_.magic != CLB_MODEL_MAGIC)
        return COLIBRI_E_NOT_INIT;
    const clb_plan *p = (const clb_plan *)m->priv_.plan;
    if (layer >= p->s.n_layers)
        return COLIBRI_E_ARG;
    const clb_weight *w = &p->layers[layer].router;
    if (w->rows == 0)
        return COLIBRI_E_ARG; /* a dense layer has no router */
    size_t n = (size_t)w->rows * w->cols;
    if (w->dtype == COLIBRI_DTYPE_F32) {
        memcpy(out, w->q, n * sizeof(float));
    } else { /* I16_ROW */
        const int16_t *q = (const int16_t *)w->q;
        for (size_t i = 0; i < n; i++)
            out[i] = (float)q[i] * w->scales[i / w->cols];
    }
    return COLIBRI_OK;
}

unsigned colibri_build_flags(void)
{
    unsigned f = 0;
#if COLIBRI_ENABLE_MMAP && !defined(COLIBRI_STATIC_WORKBUF)
    f |= COLIBRI_BUILD_MMAP;
#endif
#ifdef COLIBRI_STATIC_WORKBUF
    f |= COLIBRI_BUILD_STATIC_WORKBUF;
#endif
#ifdef COLIBRI_DEBUG
    f |= COLIBRI_BUILD_DEBUG;
#endif
#if COLIBRI_THREADS
    f |= COLIBRI_BUILD_THREADS;
#endif
    return f;
}
