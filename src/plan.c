/*
 * plan.c - the arena and the plan: how many bytes a model needs and where
 * each buffer lies in them (one layout function both counts and carves, so
 * the size colibri_arena_size promises is the size used), the weight views
 * into a validated file, the RoPE tables, and the kernel table in use.
 */
#include "encdec.h"
#include "format.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h> /* getenv (x86 hosts: forced_x86_kernels) */
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Arena layout                                                             */
/* ------------------------------------------------------------------------ */

void *clb_carve(carver *c, uint64_t bytes)
{
    uint64_t at = c->off;
    c->off = calign64(cadd(at, bytes, &c->ovf), &c->ovf);
    return c->base && !c->ovf ? c->base + at : NULL;
}
#define carve clb_carve

static uint64_t cm(carver *c, uint64_t a, uint64_t b)
{
    return cmul(a, b, &c->ovf);
}

clb_kv_rows clb_kv_carve(carver *c, uint64_t rows, const colibri_shape *s, unsigned kv_dtype)
{
    const uint64_t kvdim = (uint64_t)s->n_kv_heads * s->head_dim;
    clb_kv_rows r;
    memset(&r, 0, sizeof r);
    if (kv_dtype == COLIBRI_KV_I8) {
        /* int8 values [rows, kvdim], then one float32 scale per head
         * vector [rows, n_kv_heads] */
        uint64_t vals = cm(c, rows, kvdim);
        uint64_t scales = cm(c, cm(c, rows, s->n_kv_heads), 4);
        r.kq = (int8_t *)carve(c, vals);
        r.vq = (int8_t *)carve(c, vals);
        r.ks = (float *)carve(c, scales);
        r.vs = (float *)carve(c, scales);
    } else {
        uint64_t kv = cm(c, cm(c, rows, kvdim), 4);
        r.k = (float *)carve(c, kv);
        r.v = (float *)carve(c, kv);
    }
    return r;
}

/* Lay out the arena for shape s (the formula documented at
 * colibri_arena_size). With c->base NULL, p gets NULL pointers and only
 * c->off matters. */
void clb_layout(carver *c, const colibri_shape *s, const clb_desc *d,
                uint32_t chunk_limit, unsigned kv_dtype, clb_plan **pp)
{
    uint64_t L = s->n_layers, E = s->n_experts, K = s->top_k;
    uint64_t B = s->max_batch, S = s->max_seq_len, h = s->hidden;
    uint64_t qdim = (uint64_t)s->n_heads * s->head_dim;
    uint64_t kvdim = (uint64_t)s->n_kv_heads * s->head_dim;
    /* h1/h3 serve the routed experts, the shared expert and dense layers:
     * the widest of the three. */
    uint64_t inter = s->intermediate;
    if (d->shared_inter > inter)
        inter = d->shared_inter;
    if (d->dense_inter > inter)
        inter = d->dense_inter;
    uint64_t max_cols = h > qdim ? h : qdim;
    if (inter > max_cols)
        max_cols = inter;
    uint64_t max_groups = (max_cols + s->group_size - 1) / s->group_size;
    uint64_t tokens = B * S; /* <= 2^16 * 2^32 */
    uint64_t C = tokens < chunk_limit ? tokens : chunk_limit;

    clb_plan *p = (clb_plan *)carve(c, sizeof(clb_plan));
    clb_plan dummy;
    if (!p)
        p = &dummy;
    memset(p, 0, sizeof *p);
    p->s = *s;
    p->d = *d;
    p->max_inter = (uint32_t)inter;
    p->chunk = (uint32_t)C;
    p->qdim = (uint32_t)qdim;
    p->kvdim = (uint32_t)kvdim;
    p->max_cols = (uint32_t)max_cols;
    p->max_groups = (uint32_t)max_groups;
    p->layers = (const clb_layer *)carve(c, cm(c, L, sizeof(clb_layer)));
    /* experts: [L, E] dispatch table, filled by build_plan */
    void *experts = carve(c, cm(c, cm(c, L, E), sizeof(clb_expert)));
    if (p->layers && experts) {
        for (uint64_t l = 0; l < L; l++)
            ((clb_layer *)p->layers)[l].experts = (const clb_expert *)experts + l * E;
    }
    p->rope_cos = (const float *)carve(c, cm(c, cm(c, S, s->head_dim / 2), 4));
    p->rope_sin = (const float *)carve(c, cm(c, cm(c, S, s->head_dim / 2), 4));
    p->kv_dtype = (uint8_t)kv_dtype;
    p->kv = clb_kv_carve(c, cm(c, L, tokens), s, kv_dtype); /* rows [L, B, S] */
    p->mask_cache = (uint8_t *)carve(c, tokens);
    p->tok_b = (uint32_t *)carve(c, C * 4);
    p->tok_pos = (uint32_t *)carve(c, C * 4);
    p->x = (float *)carve(c, cm(c, C * 4, h));
    p->xn = (float *)carve(c, cm(c, C * 4, h));
    p->tmp = (float *)carve(c, cm(c, C * 4, h));
    p->q = (float *)carve(c, cm(c, C * 4, qdim));
    p->att = (float *)carve(c, cm(c, C * 4, qdim));
    p->kbuf = (float *)carve(c, cm(c, C * 4, kvdim));
    p->vbuf = (float *)carve(c, cm(c, C * 4, kvdim));
    p->router_logits = (float *)carve(c, cm(c, C * 4, E));
    p->probs = (float *)carve(c, cm(c, C * 4, E));
    p->sel = (uint16_t *)carve(c, cm(c, C * 2, K));
    p->selw = (float *)carve(c, cm(c, C * 4, K));
    p->chosen = (uint8_t *)carve(c, E);
    p->counts = (uint32_t *)carve(c, cm(c, E, 4));
    p->offsets = (uint32_t *)carve(c, cm(c, E + 1, 4));
    p->tok_list = (uint32_t *)carve(c, cm(c, C * 4, K));
    p->yslot = (float *)carve(c, cm(c, cm(c, C * 4, K), h));
    p->xe = (float *)carve(c, cm(c, C * 4, h));
    p->ye = (float *)carve(c, cm(c, C * 4, h));
    p->h1 = (float *)carve(c, cm(c, C * 4, inter));
    p->h3 = (float *)carve(c, cm(c, C * 4, inter));
    /* Activations of quantised weights: I8_GROUP [C, max_cols] and
     * [C, max_groups]; block types [C, max_cols rounded up to 256] int8,
     * their scales per 32 (Q4_0) at most, their sums of 16 (xb). */
    uint64_t padded = (max_cols + CLB_QK_COLS - 1) / CLB_QK_COLS * CLB_QK_COLS;
    uint64_t max_blocks = padded / CLB_Q4_0_COLS;
    p->xq = (int8_t *)carve(c, cm(c, C, padded));
    p->xs = (float *)carve(c, cm(c, C * 4, max_groups > max_blocks ? max_groups
                                                                   : max_blocks));
    p->xb = (int16_t *)carve(c, cm(c, C * 2, padded / 16));
    if (d->features & COLIBRI_FEAT_ENC_DEC)
        clb_encdec_layout(c, s, d, kv_dtype, p == &dummy ? NULL : p);
    *pp = p == &dummy ? NULL : p;
}

/* Arena bytes for shape s processing up to chunk_limit tokens together;
 * COLIBRI_E_NO_MEMORY if it exceeds size_t. */
int clb_arena_bytes(const colibri_shape *s, const clb_desc *d,
                    uint32_t chunk_limit, unsigned kv_dtype, size_t *out)
{
    carver c = { NULL, 0, 0 };
    clb_plan *unused;
    clb_layout(&c, s, d, chunk_limit, kv_dtype, &unused);
    if (c.ovf || c.off > (uint64_t)SIZE_MAX)
        return COLIBRI_E_NO_MEMORY;
    *out = (size_t)c.off;
    return COLIBRI_OK;
}

uint64_t clb_kv_bytes_per_token(const colibri_shape *s, unsigned kv_dtype)
{
    uint64_t per_head = kv_dtype == COLIBRI_KV_I8 ? (uint64_t)s->head_dim + 4u
                                                   : 4u * (uint64_t)s->head_dim;
    return 2u * (uint64_t)s->n_layers * s->n_kv_heads * per_head;
}

uint64_t clb_kv_bytes(const colibri_shape *s, unsigned kv_dtype)
{
    /* the same pieces clb_layout carves (header-validated shapes: no
     * overflow in 64 bits) */
    uint64_t slots = (uint64_t)s->n_layers * s->max_batch * s->max_seq_len;
    uint64_t kvdim = (uint64_t)s->n_kv_heads * s->head_dim;
    int ovf = 0;
    if (kv_dtype == COLIBRI_KV_I8)
        return 2u * (calign64(slots * kvdim, &ovf) +
                     calign64(slots * s->n_kv_heads * 4u, &ovf));
    return 2u * calign64(slots * kvdim * 4u, &ovf);
}

int colibri_kv_size(const colibri_shape *s, unsigned kv_dtype,
                    uint64_t *per_token, uint64_t *total)
{
    if (!s || (kv_dtype != COLIBRI_KV_F32 && kv_dtype != COLIBRI_KV_I8))
        return COLIBRI_E_ARG;
    if (per_token)
        *per_token = clb_kv_bytes_per_token(s, kv_dtype);
    if (total)
        *total = clb_kv_bytes(s, kv_dtype);
    return COLIBRI_OK;
}

colibri_options colibri_options_default(void)
{
    colibri_options o;
    memset(&o, 0, sizeof o);
    o.size = (uint32_t)sizeof o;
    o.kv_dtype = COLIBRI_KV_F32;
    o.slot_policy = COLIBRI_SLOTS_REUSE;
    o.prefetch = COLIBRI_PREFETCH_DEFAULT;
    return o;
}

/* Whether the caller's struct (opt->size bytes) holds the field at
 * offset `at` of `width` bytes: fields past it take their defaults. */
static int has_field(const colibri_options *opt, size_t at, size_t width)
{
    return opt->size >= at + width;
}

int clb_read_options(const colibri_options *opt, clb_opts *o, char *detail)
{
    memset(o, 0, sizeof *o);
    o->kv_dtype = COLIBRI_KV_F32;
    o->policy = COLIBRI_SLOTS_REUSE;
    o->prefetch = COLIBRI_PREFETCH_DEFAULT;
    if (!opt)
        return COLIBRI_OK;
    if (opt->size < 8u) {
        clb_detail(detail, DETAIL_CAP, "colibri_options.size %u: fill the "
                   "options with colibri_options_default()", (unsigned)opt->size);
        return COLIBRI_E_ARG;
    }
    /* A newer header's struct: its extra options must be left at zero. */
    const uint8_t *b = (const uint8_t *)opt;
    for (size_t i = sizeof(colibri_options); i < opt->size; i++) {
        if (b[i]) {
            clb_detail(detail, DETAIL_CAP, "colibri_options byte %u is set: an "
                       "option this library does not have", (unsigned)i);
            return COLIBRI_E_UNSUPPORTED;
        }
    }
    if (opt->kv_dtype != COLIBRI_KV_F32 && opt->kv_dtype != COLIBRI_KV_I8) {
        clb_detail(detail, DETAIL_CAP, "kv_dtype %u (COLIBRI_KV_F32 0 or "
                   "COLIBRI_KV_I8 1)", (unsigned)opt->kv_dtype);
        return COLIBRI_E_ARG;
    }
    o->kv_dtype = opt->kv_dtype;
    if (has_field(opt, offsetof(colibri_options, expert_slots), 4))
        o->slots = opt->expert_slots;
    if (has_field(opt, offsetof(colibri_options, slot_policy), 4))
        o->policy = opt->slot_policy;
    if (has_field(opt, offsetof(colibri_options, ram_bytes), 8))
        o->ram = opt->ram_bytes;
    if (has_field(opt, offsetof(colibri_options, prefetch), 4))
        o->prefetch = opt->prefetch;
    if (o->policy > COLIBRI_SLOTS_REUSE) {
        clb_detail(detail, DETAIL_CAP, "slot_policy %u (COLIBRI_SLOTS_FREQ 0, "
                   "COLIBRI_SLOTS_LRU 1 or COLIBRI_SLOTS_REUSE 2)", (unsigned)o->policy);
        return COLIBRI_E_ARG;
    }
    return COLIBRI_OK;
}

int colibri_arena_size_ex(const void *blob, size_t size,
                          const colibri_options *opt, size_t *out_bytes)
{
    char detail[DETAIL_CAP];
    colibri_shape s;
    int be;
    unsigned kv;
    if (!blob || !out_bytes)
        return COLIBRI_E_ARG;
    clb_desc d;
    memset(&d, 0, sizeof d); /* read only once clb_check_desc has filled it */
    clb_opts o;
    int rc = clb_read_options(opt, &o, detail);
    kv = o.kv_dtype;
    if (rc == COLIBRI_OK)
        rc = clb_check_header((const uint8_t *)blob, size, &s, &be, detail, NULL,
                              NULL, NULL);
    if (rc == COLIBRI_OK)
        rc = clb_check_desc((const uint8_t *)blob, size, &s, be, &d, detail);
    if (rc == COLIBRI_OK)
        rc = clb_encdec_supported(&d, detail);
    return rc ? rc : clb_arena_bytes(&s, &d, COLIBRI_CHUNK_TOKENS, kv, out_bytes);
}

int colibri_arena_size(const void *blob, size_t size, size_t *out_bytes)
{
    return colibri_arena_size_ex(blob, size, NULL, out_bytes);
}

/* ------------------------------------------------------------------------ */
/* The plan: weight views and init-time tables                              */
/* ------------------------------------------------------------------------ */

clb_weight clb_weight_at(const uint8_t *sec, const uint8_t *en, int be,
                         uint32_t group)
{
    clb_weight w;
    int ovf = 0;
    uint64_t scales_at;
    w.dtype = en[COLIBRI_ENT_DTYPE];
    w.rows = rd32(en + COLIBRI_ENT_ROWS, be);
    w.cols = rd32(en + COLIBRI_ENT_COLS, be);
    (void)clb_section_size(w.dtype, w.rows, w.cols, group, &scales_at, &ovf);
    w.q = sec;
    /* F32 and the block types (scales inside the blocks) have no scales
     * array. */
    w.scales = sec && (w.dtype == COLIBRI_DTYPE_I8_GROUP || w.dtype == COLIBRI_DTYPE_I16_ROW)
                   ? (const float *)(sec + scales_at) : NULL;
    return w;
}

clb_weight clb_weight_of(const uint8_t *blob, const uint8_t *en, int be,
                         uint32_t group)
{
    return clb_weight_at(blob + rd64(en + COLIBRI_ENT_OFFSET, be), en, be, group);
}

void clb_swap_section(uint8_t *sec, const uint8_t *en, int be, uint32_t group)
{
    unsigned kind = rd16(en + COLIBRI_ENT_KIND, be);
    if (!sec || kind < 1 || kind > COLIBRI_KIND_MAX || kind == COLIBRI_KIND_DESC)
        return; /* unknown layout: never used; DESC: read as stored */
    clb_weight w = clb_weight_at(sec, en, be, group);
    uint8_t *q = sec;
    if (clb_block_cols(w.dtype)) {
        /* Blocks: only their fp16 scales (d, Q4_K's / Q5_K's dmin). */
        uint64_t nblk = (uint64_t)w.rows * ((w.cols + clb_block_cols(w.dtype) - 1) /
                                            clb_block_cols(w.dtype));
        unsigned at, nf = clb_block_scales(w.dtype, &at);
        for (uint64_t k = 0; k < nblk; k++)
            for (unsigned f = 0; f < nf; f++) {
                uint8_t *x = q + k * clb_block_bytes(w.dtype) + at + 2 * f, t = x[0];
                x[0] = x[1];
                x[1] = t;
            }
        return;
    }
    uint64_t n = (uint64_t)w.rows * w.cols, n_scales = 0;
    unsigned width = w.dtype == COLIBRI_DTYPE_F32 ? 4
                   : w.dtype == COLIBRI_DTYPE_I16_ROW ? 2 : 1;
    if (w.dtype == COLIBRI_DTYPE_I8_GROUP)
        n_scales = (uint64_t)w.rows * ((w.cols + group - 1) / group);
    else if (w.dtype == COLIBRI_DTYPE_I16_ROW)
        n_scales = w.rows;
    for (uint64_t v = 0; width > 1 && v < n; v++) {
        uint8_t *x = q + v * width;
        for (unsigned a = 0, z = width - 1; a < z; a++, z--) {
            uint8_t t = x[a];
            x[a] = x[z];
            x[z] = t;
        }
    }
    uint8_t *sc = (uint8_t *)w.scales;
    for (uint64_t v = 0; sc && v < n_scales; v++) {
        uint8_t *x = sc + v * 4, t0 = x[0], t1 = x[1];
        x[0] = x[3];
        x[1] = x[2];
        x[2] = t1;
        x[3] = t0;
    }
}

/* The entries without a layer (FORMAT.md 3): EMBED, FINAL_NORM, LM_HEAD and
 * an ENC_DEC file's position biases and encoder final norm. */
static void bind_model_wide(clb_plan *p, unsigned kind, const clb_weight *w)
{
    if (kind == COLIBRI_KIND_EMBED)
        p->embed = *w;
    else if (kind == COLIBRI_KIND_FINAL_NORM)
        p->final_norm = (const float *)w->q;
    else if (kind == COLIBRI_KIND_LM_HEAD)
        p->lm_head = *w;
    else if (p->ed && (kind == COLIBRI_KIND_ENC_POS_BIAS || kind == COLIBRI_KIND_DEC_POS_BIAS ||
                       kind == COLIBRI_KIND_ENC_FINAL_NORM))
        (void)clb_encdec_bind(p, kind, COLIBRI_NO_LAYER, w);
}

/* Point every tensor view of the plan into a validated blob, and compute the
 * RoPE tables in double precision (then rounded to float) so every libm
 * gives the same table. */
void clb_build_plan(clb_plan *p, const uint8_t *blob, const uint8_t *data, int be,
                    const colibri_kernels *k)
{
    const colibri_shape *s = &p->s;
    const uint8_t *tab = blob + COLIBRI_TABLE_OFFSET;
    p->k = k;
    for (uint32_t i = 0; i < s->n_tensors; i++) {
        const uint8_t *en = tab + (size_t)i * COLIBRI_ENTRY_SIZE;
        unsigned kind = rd16(en + COLIBRI_ENT_KIND, be);
        unsigned l = rd16(en + COLIBRI_ENT_LAYER, be);
        unsigned e = rd16(en + COLIBRI_ENT_EXPERT, be);
        if (kind < 1 || kind > COLIBRI_KIND_MAX)
            continue; /* unknown, non-critical: not used */
        if (kind == COLIBRI_KIND_DESC)
            continue; /* read into p->d, never byte-swapped */
        /* A streamed instance's experts are not in the blob (stream.c):
         * their views get shape and dtype only. */
        uint64_t where = rd64(en + COLIBRI_ENT_OFFSET, be);
        clb_weight w = clb_weight_at(where == CLB_NOT_RESIDENT ? NULL : data + where,
                                     en, be, s->group_size);
        if (l == COLIBRI_NO_LAYER) { /* format.c: only model-wide kinds have no layer */
            bind_model_wide(p, kind, &w);
            continue;
        }
        clb_layer *L = (clb_layer *)&p->layers[l];
        /* NULL for a layer's own tensors; format.c gives every expert
         * matrix its expert, the cases below test it all the same */
        clb_expert *X = e != COLIBRI_NO_EXPERT ? (clb_expert *)&L->experts[e] : NULL;
        const float *vec = (const float *)w.q; /* [1, n] F32 kinds */
        L->dense = (uint8_t)clb_desc_dense(&p->d, l);
        if (p->ed && clb_encdec_bind(p, kind, l, &w))
            continue;
        switch (kind) {
        case COLIBRI_KIND_ATTN_NORM: L->attn_norm = (const float *)w.q; break;
        case COLIBRI_KIND_WQ: L->wq = w; break;
        case COLIBRI_KIND_WK: L->wk = w; break;
        case COLIBRI_KIND_WV: L->wv = w; break;
        case COLIBRI_KIND_WO: L->wo = w; break;
        case COLIBRI_KIND_FFN_NORM: L->ffn_norm = (const float *)w.q; break;
        case COLIBRI_KIND_ROUTER: L->router = w; break;
        case COLIBRI_KIND_EXPERT_W1: if (X) X->w1 = w; break;
        case COLIBRI_KIND_EXPERT_W3: if (X) X->w3 = w; break;
        case COLIBRI_KIND_EXPERT_W2: if (X) X->w2 = w; break;
        case COLIBRI_KIND_BQ: L->bq = vec; break;
        case COLIBRI_KIND_BK: L->bk = vec; break;
        case COLIBRI_KIND_BV: L->bv = vec; break;
        case COLIBRI_KIND_BO: L->bo = vec; break;
        case COLIBRI_KIND_Q_NORM: L->q_norm = vec; break;
        case COLIBRI_KIND_K_NORM: L->k_norm = vec; break;
        case COLIBRI_KIND_SHARED_GATE: L->shared_gate = w; break;
        case COLIBRI_KIND_SHARED_W1: L->shared.w1 = w; break;
        case COLIBRI_KIND_SHARED_W3: L->shared.w3 = w; break;
        case COLIBRI_KIND_SHARED_W2: L->shared.w2 = w; break;
        case COLIBRI_KIND_DENSE_W1: L->ffn.w1 = w; break;
        case COLIBRI_KIND_DENSE_W3: L->ffn.w3 = w; break;
        case COLIBRI_KIND_DENSE_W2: L->ffn.w2 = w; break;
        default: break; /* LM_HEAD and the model-wide kinds have no layer */
        }
    }
    if (p->d.features & COLIBRI_FEAT_TIED_LM_HEAD)
        p->lm_head = p->embed; /* FORMAT.md 2: the same matrix, its own dtype */
    /* RoPE as transformers computes it: exponent 2i/d, inv_freq = 1 /
     * theta^exponent and angle = pos * inv_freq rounded to float32 at each
     * step; pow, cos and sin in double precision then rounded, so the table
     * is the same bits with every libm. */
    uint32_t half = s->head_dim / 2;
    float *cs = (float *)p->rope_cos, *sn = (float *)p->rope_sin;
    for (uint32_t i = 0; i < half; i++) {
        float exponent = (float)(2 * i) / (float)s->head_dim;
        float inv_freq = 1.0f / (float)pow((double)s->rope_theta, (double)exponent);
        for (uint32_t pos = 0; pos < s->max_seq_len; pos++) {
            double a = (double)((float)pos * inv_freq);
            cs[(size_t)pos * half + i] = (float)cos(a);
            sn[(size_t)pos * half + i] = (float)sin(a);
        }
    }
}

#if !defined(COLIBRI_KERNELS_REF_ONLY) && defined(COLIBRI_USE_AVX2)
/* COLIBRI_KERNELS=NAME forces the x86 table NAME ("ref", "avx2",
 * "avx2-vnni", "avx512-vnni") where this CPU can run it, so one build
 * measures and tests each table on a CPU that has several; an unknown or
 * unavailable name leaves the default choice (colibri_model_info reports
 * which table runs). Read at init only (x86 hosts, which have getenv). */
static const colibri_kernels *forced_x86_kernels(void)
{
    const char *want = getenv("COLIBRI_KERNELS");
    if (!want || !*want)
        return NULL;
    const colibri_kernels *cand[] = {colibri_kernels_ref(), colibri_kernels_avx2_plain(),
                                     colibri_kernels_avx2(), colibri_kernels_avx512()};
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++)
        if (cand[i] && strcmp(cand[i]->name, want) == 0)
            return cand[i];
    return NULL;
}
#endif

const colibri_kernels *clb_pick_kernels(void)
{
    const colibri_kernels *k = NULL;
#ifndef COLIBRI_KERNELS_REF_ONLY
#ifdef COLIBRI_USE_AVX2
    k = forced_x86_kernels();
    if (!k)
        k = colibri_kernels_avx512();
    if (!k)
        k = colibri_kernels_avx2();
#endif
#ifdef COLIBRI_USE_NEON
    if (!k)
        k = colibri_kernels_neon();
#endif
#endif
    return k ? k : colibri_kernels_ref();
}
