/*
 * format.c - what makes a .colibri file valid (docs/FORMAT.md sections 2-4):
 * the header's fields and ranges, the tensor table's order, shapes, sizes and
 * offsets (overflow-safe, before any tensor byte is used), every section's
 * CRC and the finiteness of its floats; and colibri_verify, which reports
 * every damaged part instead of stopping at the first. Reads the bytes as
 * stored, in either byte order; knows nothing of arenas or the forward pass.
 */
#include "format.h"

#include <math.h>

/* ------------------------------------------------------------------------ */
/* Kinds                                                                    */
/* ------------------------------------------------------------------------ */

/* Out of line: gcc would inline it into each of its fifteen error paths. */
#if defined(__GNUC__)
__attribute__((noinline))
#endif
static const char *kind_name(unsigned kind)
{
    static const char *const names[] = {
        "?", "EMBED", "ATTN_NORM", "WQ", "WK", "WV", "WO", "FFN_NORM",
        "ROUTER", "EXPERT_W1", "EXPERT_W3", "EXPERT_W2", "FINAL_NORM",
        "LM_HEAD", "DESC", "BQ", "BK", "BV", "BO", "Q_NORM", "K_NORM",
        "SHARED_GATE", "SHARED_W1", "SHARED_W3", "SHARED_W2", "DENSE_W1",
        "DENSE_W3", "DENSE_W2", "ENC_POS_BIAS", "DEC_POS_BIAS", "XATTN_NORM",
        "XWQ", "XWK", "XWV", "XWO", "ENC_FINAL_NORM",
    };
    /* 0x100: the tokenizer section (tokenizer.c), outside the weights' kinds */
    return kind >= 1 && kind <= COLIBRI_KIND_MAX ? names[kind]
           : kind == 0x100u                      ? "tokenizer"
                                                 : "unknown";
}

/* "EXPERT_W1 layer 0 expert 3", "WQ layer 1", "LM_HEAD". */
static const char *entry_label(char *buf, size_t cap, unsigned kind,
                               unsigned layer, unsigned expert)
{
    if (layer == COLIBRI_NO_LAYER)
        clb_detail(buf, cap, "%s", kind_name(kind));
    else if (expert == COLIBRI_NO_EXPERT)
        clb_detail(buf, cap, "%s layer %u", kind_name(kind), (unsigned)layer);
    else
        clb_detail(buf, cap, "%s layer %u expert %u", kind_name(kind),
                   (unsigned)layer, (unsigned)expert);
    return buf;
}

int clb_desc_dense(const clb_desc *d, uint32_t layer)
{
    return d->layers && rdf32(d->layers + 4 * (size_t)layer, d->be) != 0.0f;
}

int clb_desc_decoder_layer(const clb_desc *d, uint32_t layer)
{
    return (d->features & COLIBRI_FEAT_ENC_DEC) && layer >= d->encoder_layers;
}

/* Matrices per expert: W1, W3, W2, or W1, W2 with RELU_FFN. */
static unsigned expert_matrices(const clb_desc *d)
{
    return (d->features & COLIBRI_FEAT_RELU_FFN) ? 2u : 3u;
}

/* DESC words: 8, one per layer, and 8 more with ENC_DEC. */
static uint64_t desc_cols(const colibri_shape *s, uint32_t features)
{
    return COLIBRI_DESC_LAYERS + (uint64_t)s->n_layers +
           ((features & COLIBRI_FEAT_ENC_DEC) ? COLIBRI_DESCX_WORDS : 0);
}

/* The known entries in table order (FORMAT.md 3, rule 1), walked by a
 * cursor: [DESC,] EMBED, [ENC_POS_BIAS, DEC_POS_BIAS,] per layer the
 * attention tensors the features ask for ([cross-attention in a decoder
 * layer]), then a dense FFN or the router, the shared expert and every
 * expert's matrices; [ENC_FINAL_NORM,] FINAL_NORM, [LM_HEAD]. A layer has at
 * most 17 entries before its experts in a valid header; head[] has room for
 * the 22 that layer_head's branches add when the header's exclusions between
 * flags (ENC_DEC with BIAS_*, QK_NORM_*, SHARED_*) are not taken into
 * account, so that the bound holds without them (docs/ANALYSIS.md 2). */
typedef struct { unsigned kind, layer, expert; } known_slot;
enum { ST_DESC, ST_EMBED, ST_ENC_BIAS, ST_DEC_BIAS, ST_LAYERS, ST_ENC_FINAL,
       ST_FINAL_NORM, ST_LM_HEAD, ST_END };
typedef struct {
    unsigned stage;          /* ST_* */
    uint32_t layer, r;       /* ST_LAYERS: layer and entry within it */
    unsigned n_head;         /* entries of this layer before its experts */
    unsigned head[22];
} known_cursor;

static void layer_head(known_cursor *c, const colibri_shape *s, const clb_desc *d)
{
    unsigned n = 0, f = d->features;
    (void)s;
    c->head[n++] = COLIBRI_KIND_ATTN_NORM;
    c->head[n++] = COLIBRI_KIND_WQ;
    if (f & COLIBRI_FEAT_BIAS_QKV)
        c->head[n++] = COLIBRI_KIND_BQ;
    c->head[n++] = COLIBRI_KIND_WK;
    if (f & COLIBRI_FEAT_BIAS_QKV)
        c->head[n++] = COLIBRI_KIND_BK;
    c->head[n++] = COLIBRI_KIND_WV;
    if (f & COLIBRI_FEAT_BIAS_QKV)
        c->head[n++] = COLIBRI_KIND_BV;
    c->head[n++] = COLIBRI_KIND_WO;
    if (f & COLIBRI_FEAT_BIAS_O)
        c->head[n++] = COLIBRI_KIND_BO;
    if (f & (COLIBRI_FEAT_QK_NORM_HEAD | COLIBRI_FEAT_QK_NORM_PROJ)) {
        c->head[n++] = COLIBRI_KIND_Q_NORM;
        c->head[n++] = COLIBRI_KIND_K_NORM;
    }
    if (clb_desc_decoder_layer(d, c->layer)) {
        c->head[n++] = COLIBRI_KIND_XATTN_NORM;
        c->head[n++] = COLIBRI_KIND_XWQ;
        c->head[n++] = COLIBRI_KIND_XWK;
        c->head[n++] = COLIBRI_KIND_XWV;
        c->head[n++] = COLIBRI_KIND_XWO;
    }
    c->head[n++] = COLIBRI_KIND_FFN_NORM;
    if (clb_desc_dense(d, c->layer)) {
        c->head[n++] = COLIBRI_KIND_DENSE_W1;
        if (!(f & COLIBRI_FEAT_RELU_FFN))
            c->head[n++] = COLIBRI_KIND_DENSE_W3;
        c->head[n++] = COLIBRI_KIND_DENSE_W2;
    } else {
        c->head[n++] = COLIBRI_KIND_ROUTER;
        if (f & COLIBRI_FEAT_SHARED_GATE)
            c->head[n++] = COLIBRI_KIND_SHARED_GATE;
        if (f & COLIBRI_FEAT_SHARED_EXPERT) {
            c->head[n++] = COLIBRI_KIND_SHARED_W1;
            c->head[n++] = COLIBRI_KIND_SHARED_W3;
            c->head[n++] = COLIBRI_KIND_SHARED_W2;
        }
    }
    c->n_head = n;
}

static void cursor_start(known_cursor *c, const colibri_shape *s, const clb_desc *d)
{
    memset(c, 0, sizeof *c);
    c->stage = d->version >= 2 ? ST_DESC : ST_EMBED;
    (void)s;
}

/* The slot the cursor is at; kind 0 at the end. */
static known_slot cursor_slot(const known_cursor *c, const colibri_shape *s,
                              const clb_desc *d)
{
    known_slot k = { 0, COLIBRI_NO_LAYER, COLIBRI_NO_EXPERT };
    static const unsigned expert_kinds[3] = {
        COLIBRI_KIND_EXPERT_W1, COLIBRI_KIND_EXPERT_W3, COLIBRI_KIND_EXPERT_W2,
    };
    static const unsigned relu_kinds[2] = { COLIBRI_KIND_EXPERT_W1, COLIBRI_KIND_EXPERT_W2 };
    unsigned m = expert_matrices(d);
    switch (c->stage) {
    case ST_DESC: k.kind = COLIBRI_KIND_DESC; break;
    case ST_EMBED: k.kind = COLIBRI_KIND_EMBED; break;
    case ST_ENC_BIAS: k.kind = COLIBRI_KIND_ENC_POS_BIAS; break;
    case ST_DEC_BIAS: k.kind = COLIBRI_KIND_DEC_POS_BIAS; break;
    case ST_LAYERS:
        k.layer = c->layer;
        if (c->r < c->n_head) {
            k.kind = c->head[c->r];
        } else {
            k.expert = (c->r - c->n_head) / m;
            k.kind = (m == 2 ? relu_kinds : expert_kinds)[(c->r - c->n_head) % m];
        }
        break;
    case ST_ENC_FINAL: k.kind = COLIBRI_KIND_ENC_FINAL_NORM; break;
    case ST_FINAL_NORM: k.kind = COLIBRI_KIND_FINAL_NORM; break;
    case ST_LM_HEAD: k.kind = COLIBRI_KIND_LM_HEAD; break;
    default: break;
    }
    (void)s;
    return k;
}

static void cursor_next(known_cursor *c, const colibri_shape *s, const clb_desc *d)
{
    int encdec = (d->features & COLIBRI_FEAT_ENC_DEC) != 0;
    if (c->stage == ST_LAYERS) {
        uint32_t per = c->n_head;
        if (!clb_desc_dense(d, c->layer))
            per += expert_matrices(d) * s->n_experts;
        if (++c->r < per)
            return;
        c->r = 0;
        if (++c->layer < s->n_layers) {
            layer_head(c, s, d);
            return;
        }
        c->stage = encdec ? ST_ENC_FINAL : ST_FINAL_NORM;
        return;
    }
    if (c->stage < ST_END)
        c->stage++;
    if (!encdec && c->stage == ST_ENC_BIAS)
        c->stage = ST_LAYERS;
    if (c->stage == ST_LM_HEAD && (d->features & COLIBRI_FEAT_TIED_LM_HEAD))
        c->stage = ST_END; /* the LM head is EMBED */
    if (c->stage == ST_LAYERS) {
        c->layer = 0;
        c->r = 0;
        layer_head(c, s, d);
    }
}

/* The [rows, cols] a kind must have, and the dtypes it may use (bit mask). */
static void kind_shape(const colibri_shape *s, const clb_desc *d, unsigned kind,
                       uint32_t *rows, uint32_t *cols, unsigned *dtypes)
{
    uint32_t qdim = (uint32_t)s->n_heads * s->head_dim;
    uint32_t kvdim = (uint32_t)s->n_kv_heads * s->head_dim;
    int per_head = (d->features & COLIBRI_FEAT_QK_NORM_HEAD) != 0;
    /* I8 stands for every quantised matrix type: I8_GROUP and the block
     * types (FORMAT.md 4). */
    const unsigned F = 1u << COLIBRI_DTYPE_F32,
                   BLK = 1u << COLIBRI_DTYPE_Q4_0 | 1u << COLIBRI_DTYPE_Q5_0 |
                         1u << COLIBRI_DTYPE_Q8_0 |
                         1u << COLIBRI_DTYPE_Q4_K | 1u << COLIBRI_DTYPE_Q5_K |
                         1u << COLIBRI_DTYPE_Q6_K,
                   I8 = 1u << COLIBRI_DTYPE_I8_GROUP | BLK,
                   I16 = 1u << COLIBRI_DTYPE_I16_ROW;
    *cols = s->hidden;
    *dtypes = F | I8;
    switch (kind) {
    /* EMBED: every dtype with a lookup and a product (TIED_LM_HEAD) */
    case COLIBRI_KIND_EMBED: *rows = s->vocab; *dtypes = F | I16 | I8; break;
    case COLIBRI_KIND_ATTN_NORM:
    case COLIBRI_KIND_FFN_NORM:
    case COLIBRI_KIND_FINAL_NORM:
    case COLIBRI_KIND_XATTN_NORM:
    case COLIBRI_KIND_ENC_FINAL_NORM:
    case COLIBRI_KIND_BO:
    case COLIBRI_KIND_SHARED_GATE: *rows = 1; *dtypes = F; break;
    case COLIBRI_KIND_DESC:
        *rows = 1;
        *cols = (uint32_t)desc_cols(s, d->features);
        *dtypes = F;
        break;
    /* ENC_DEC: the header checked 2 * max_seq_len - 1 fits in 32 bits. */
    case COLIBRI_KIND_ENC_POS_BIAS:
        *rows = s->n_heads; *cols = 2u * s->max_seq_len - 1u; *dtypes = F; break;
    case COLIBRI_KIND_DEC_POS_BIAS:
        *rows = s->n_heads; *cols = s->max_seq_len; *dtypes = F; break;
    case COLIBRI_KIND_XWQ: *rows = qdim; break;
    case COLIBRI_KIND_XWK:
    case COLIBRI_KIND_XWV: *rows = kvdim; break;
    case COLIBRI_KIND_XWO: *rows = s->hidden; *cols = qdim; break;
    case COLIBRI_KIND_BQ: *rows = 1; *cols = qdim; *dtypes = F; break;
    case COLIBRI_KIND_BK:
    case COLIBRI_KIND_BV: *rows = 1; *cols = kvdim; *dtypes = F; break;
    case COLIBRI_KIND_Q_NORM:
        *rows = 1; *cols = per_head ? s->head_dim : qdim; *dtypes = F; break;
    case COLIBRI_KIND_K_NORM:
        *rows = 1; *cols = per_head ? s->head_dim : kvdim; *dtypes = F; break;
    case COLIBRI_KIND_WQ: *rows = qdim; break;
    case COLIBRI_KIND_WK:
    case COLIBRI_KIND_WV: *rows = kvdim; break;
    case COLIBRI_KIND_WO: *rows = s->hidden; *cols = qdim; break;
    case COLIBRI_KIND_ROUTER: *rows = s->n_experts; *dtypes = F | I16; break;
    case COLIBRI_KIND_EXPERT_W1:
    case COLIBRI_KIND_EXPERT_W3: *rows = s->intermediate; break;
    case COLIBRI_KIND_EXPERT_W2: *rows = s->hidden; *cols = s->intermediate; break;
    case COLIBRI_KIND_SHARED_W1:
    case COLIBRI_KIND_SHARED_W3: *rows = d->shared_inter; break;
    case COLIBRI_KIND_SHARED_W2: *rows = s->hidden; *cols = d->shared_inter; break;
    case COLIBRI_KIND_DENSE_W1:
    case COLIBRI_KIND_DENSE_W3: *rows = d->dense_inter; break;
    case COLIBRI_KIND_DENSE_W2: *rows = s->hidden; *cols = d->dense_inter; break;
    default: /* LM_HEAD */ *rows = s->vocab; break;
    }
}

/* Section size of a dtype (FORMAT.md 4), overflow-checked; where the scales
 * start within the section in *scales_at. */
uint64_t clb_section_size(unsigned dtype, uint32_t rows, uint32_t cols,
                             uint32_t group, uint64_t *scales_at, int *ovf)
{
    uint64_t n = (uint64_t)rows * cols; /* < 2^64: two 32-bit factors */
    switch (dtype) {
    case COLIBRI_DTYPE_F32:
        *scales_at = 0;
        return cmul(n, 4, ovf);
    case COLIBRI_DTYPE_I8_GROUP: {
        /* group >= 1 in a checked header; 0 is no size, never a division */
        uint64_t ngroups = group ? ((uint64_t)cols + group - 1) / group : 0;
        *ovf |= !group;
        *scales_at = calign64(n, ovf);
        return cadd(*scales_at, cmul(cmul(rows, ngroups, ovf), 4, ovf), ovf);
    }
    case COLIBRI_DTYPE_I16_ROW:
        *scales_at = calign64(cmul(n, 2, ovf), ovf);
        return cadd(*scales_at, cmul(rows, 4, ovf), ovf);
    default: { /* block types: rows * ceil(cols / B) blocks, scales inside */
        uint64_t B = clb_block_cols(dtype);
        *scales_at = 0;
        if (!B) { /* not a dtype of FORMAT.md 4 (callers check it first): no size */
            *ovf = 1;
            return 0;
        }
        return cmul(cmul(rows, (cols + B - 1) / B, ovf), clb_block_bytes(dtype), ovf);
    }
    }
}

/* ------------------------------------------------------------------------ */
/* Validation (FORMAT.md 3)                                                 */
/* ------------------------------------------------------------------------ */

/* Header: magic, bom, version, header_crc, every field's range, flags.
 * Fills *s and *be. With cb set, a CRC mismatch is reported and counted
 * instead of returned. */
int clb_check_header(const uint8_t *b, size_t size, colibri_shape *s,
                        int *be, char *detail, bad_cb cb, void *user,
                        uint32_t *nbad)
{
    if (size < COLIBRI_HEADER_SIZE) {
        clb_detail(detail, DETAIL_CAP, "file is %llu bytes, shorter than the "
                   "%u-byte header (truncated?)", (unsigned long long)size,
                   (unsigned)COLIBRI_HEADER_SIZE);
        return COLIBRI_E_BAD_FORMAT;
    }
    if (memcmp(b + COLIBRI_HDR_MAGIC, COLIBRI_MAGIC, COLIBRI_MAGIC_SIZE) != 0) {
        /* llama.cpp's files are the likeliest mistake: name the fix */
        clb_detail(detail, DETAIL_CAP, memcmp(b, "GGUF", 4) == 0
                   ? "a GGUF file, not a .colibri file: convert it with `colibri "
                     "convert FILE.gguf -o FILE.colibri`"
                   : "magic is %x, not \"CLBR\": not a .colibri file",
                   (unsigned)(rd32(b, 1)));
        return COLIBRI_E_BAD_FORMAT;
    }
    uint16_t bom_le = rd16(b + COLIBRI_HDR_BOM, 0);
    if (bom_le == COLIBRI_BOM) {
        *be = 0;
    } else if (rd16(b + COLIBRI_HDR_BOM, 1) == COLIBRI_BOM) {
        *be = 1;
    } else {
        clb_detail(detail, DETAIL_CAP, "bom is %x, neither FF FE nor FE FF",
                   (unsigned)(rd16(b + COLIBRI_HDR_BOM, 1)));
        return COLIBRI_E_BAD_FORMAT;
    }
    int e = *be;
    unsigned version = rd16(b + COLIBRI_HDR_VERSION, e);
    if (version < COLIBRI_FORMAT_VERSION_MIN || version > COLIBRI_FORMAT_VERSION) {
        clb_detail(detail, DETAIL_CAP, "format version %u, this library "
                   "supports versions %u to %u%s", (unsigned)version,
                   (unsigned)COLIBRI_FORMAT_VERSION_MIN,
                   (unsigned)COLIBRI_FORMAT_VERSION,
                   version > COLIBRI_FORMAT_VERSION ? ": upgrade colibri" : "");
        return version > COLIBRI_FORMAT_VERSION ? COLIBRI_E_VERSION
                                                : COLIBRI_E_BAD_FORMAT;
    }
    /* The CRC before the field ranges: a flipped bit reads as corruption
     * (E_CRC), not as a puzzling field value. */
    uint32_t want = rd32(b + COLIBRI_HDR_HEADER_CRC, e);
    uint32_t got = colibri_crc32(0, b, COLIBRI_HDR_HEADER_CRC);
    if (want != got) {
        /* No "damaged" here: the code's text (or colibri_verify's "header"
         * index) already says it, and a message should say it once. */
        clb_detail(detail, DETAIL_CAP, "header_crc %x != computed %x",
                   (unsigned)want, (unsigned)got);
        if (!cb)
            return COLIBRI_E_CRC;
        cb(user, -2, detail);
        ++*nbad;
    }
    s->vocab = rd32(b + COLIBRI_HDR_VOCAB, e);
    s->hidden = rd32(b + COLIBRI_HDR_HIDDEN, e);
    s->intermediate = rd32(b + COLIBRI_HDR_INTERMEDIATE, e);
    s->max_seq_len = rd32(b + COLIBRI_HDR_MAX_SEQ_LEN, e);
    s->n_layers = rd16(b + COLIBRI_HDR_N_LAYERS, e);
    s->n_heads = rd16(b + COLIBRI_HDR_N_HEADS, e);
    s->n_kv_heads = rd16(b + COLIBRI_HDR_N_KV_HEADS, e);
    s->head_dim = rd16(b + COLIBRI_HDR_HEAD_DIM, e);
    s->n_experts = rd16(b + COLIBRI_HDR_N_EXPERTS, e);
    s->top_k = rd16(b + COLIBRI_HDR_TOP_K, e);
    s->max_batch = rd16(b + COLIBRI_HDR_MAX_BATCH, e);
    s->group_size = rd16(b + COLIBRI_HDR_GROUP_SIZE, e);
    s->rope_theta = rdf32(b + COLIBRI_HDR_ROPE_THETA, e);
    s->rms_eps = rdf32(b + COLIBRI_HDR_RMS_EPS, e);
    s->n_tensors = rd32(b + COLIBRI_HDR_N_TENSORS, e);

    /* Fields that must be >= 1, in header order. */
    const struct { const char *name; uint32_t v; } pos[] = {
        { "vocab", s->vocab }, { "hidden", s->hidden },
        { "intermediate", s->intermediate }, { "max_seq_len", s->max_seq_len },
        { "n_layers", s->n_layers }, { "n_heads", s->n_heads },
        { "n_kv_heads", s->n_kv_heads }, { "head_dim", s->head_dim },
        { "n_experts", s->n_experts }, { "top_k", s->top_k },
        { "max_batch", s->max_batch }, { "group_size", s->group_size },
        { "n_tensors", s->n_tensors },
    };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++) {
        if (pos[i].v == 0) {
            clb_detail(detail, DETAIL_CAP, "header field %s is 0, must be >= 1",
                       pos[i].name);
            return COLIBRI_E_BAD_FORMAT;
        }
    }
    if (s->n_layers == COLIBRI_NO_LAYER || s->n_experts == COLIBRI_NO_EXPERT) {
        clb_detail(detail, DETAIL_CAP, "n_layers %u / n_experts %u: 65535 is "
                   "reserved (it marks a tensor outside the layers/experts)",
                   (unsigned)(s->n_layers), (unsigned)(s->n_experts));
        return COLIBRI_E_BAD_FORMAT;
    }
    /* n_kv_heads >= 1 was checked above (pos[]); said again where it is
     * divided by, so that it is visible without the copy in pos[]. */
    if (s->n_kv_heads == 0 || s->n_heads % s->n_kv_heads != 0) {
        clb_detail(detail, DETAIL_CAP, "n_kv_heads %u does not divide n_heads %u",
                   (unsigned)(s->n_kv_heads), (unsigned)(s->n_heads));
        return COLIBRI_E_BAD_FORMAT;
    }
    if (s->head_dim < 2 || s->head_dim % 2 != 0) {
        clb_detail(detail, DETAIL_CAP, "head_dim %u must be even and >= 2",
                   (unsigned)(s->head_dim));
        return COLIBRI_E_BAD_FORMAT;
    }
    if (s->top_k > s->n_experts) {
        clb_detail(detail, DETAIL_CAP, "top_k %u exceeds n_experts %u",
                   (unsigned)(s->top_k), (unsigned)(s->n_experts));
        return COLIBRI_E_BAD_FORMAT;
    }
    if (!isfinite(s->rope_theta) || !(s->rope_theta > 0.0f)) {
        clb_detail(detail, DETAIL_CAP, "rope_theta (bits %x) must be finite and > 0",
                   (unsigned)(rd32(b + COLIBRI_HDR_ROPE_THETA, e)));
        return COLIBRI_E_BAD_FORMAT;
    }
    if (!isfinite(s->rms_eps) || !(s->rms_eps > 0.0f)) {
        clb_detail(detail, DETAIL_CAP, "rms_eps (bits %x) must be finite and > 0",
                   (unsigned)(rd32(b + COLIBRI_HDR_RMS_EPS, e)));
        return COLIBRI_E_BAD_FORMAT;
    }
    uint32_t flags = rd32(b + COLIBRI_HDR_FLAGS, e);
    if (version == 1 && flags != 0) {
        clb_detail(detail, DETAIL_CAP, "header flags %x, must be 0 in version 1",
                   (unsigned)flags);
        return COLIBRI_E_BAD_FORMAT;
    }
    if (flags & ~(uint32_t)COLIBRI_FEAT_ALL) {
        clb_detail(detail, DETAIL_CAP, "header flags %x: unknown feature bits "
                   "%x (a newer colibri wrote the file?)", (unsigned)flags,
                   (unsigned)(flags & ~(uint32_t)COLIBRI_FEAT_ALL));
        return COLIBRI_E_BAD_FORMAT;
    }
    if ((flags & COLIBRI_FEAT_QK_NORM_HEAD) && (flags & COLIBRI_FEAT_QK_NORM_PROJ)) {
        clb_detail(detail, DETAIL_CAP, "header flags %x: QK_NORM_HEAD and "
                   "QK_NORM_PROJ exclude each other", (unsigned)flags);
        return COLIBRI_E_BAD_FORMAT;
    }
    if ((flags & COLIBRI_FEAT_SHARED_GATE) && !(flags & COLIBRI_FEAT_SHARED_EXPERT)) {
        clb_detail(detail, DETAIL_CAP, "header flags %x: SHARED_GATE without "
                   "SHARED_EXPERT", (unsigned)flags);
        return COLIBRI_E_BAD_FORMAT;
    }
    if (flags & COLIBRI_FEAT_ENC_DEC) {
        const uint32_t ok = COLIBRI_FEAT_ENC_DEC | COLIBRI_FEAT_RELU_FFN |
                            COLIBRI_FEAT_DENSE_LAYERS;
        if (flags & ~ok) {
            clb_detail(detail, DETAIL_CAP, "header flags %x: ENC_DEC combines only "
                       "with RELU_FFN and DENSE_LAYERS", (unsigned)flags);
            return COLIBRI_E_BAD_FORMAT;
        }
        if (s->n_kv_heads != s->n_heads || s->top_k != 1) {
            clb_detail(detail, DETAIL_CAP, "header: ENC_DEC needs n_kv_heads = "
                       "n_heads and top_k = 1 (found %u, %u, %u)",
                       (unsigned)s->n_kv_heads, (unsigned)s->n_heads,
                       (unsigned)s->top_k);
            return COLIBRI_E_BAD_FORMAT;
        }
        if (s->max_seq_len > 0x7fffffffu) {
            clb_detail(detail, DETAIL_CAP, "header: ENC_DEC max_seq_len %u above "
                       "2^31 - 1 (the position bias has 2 * max_seq_len - 1 "
                       "columns)", (unsigned)s->max_seq_len);
            return COLIBRI_E_BAD_FORMAT;
        }
    }
    return COLIBRI_OK;
}

/* Mixtral's computation: what a version 1 file means, and what a version 2
 * DESC describes before its words are read. */
static void desc_default(clb_desc *d, const colibri_shape *s)
{
    memset(d, 0, sizeof *d);
    d->version = 1;
    d->features = COLIBRI_FEAT_ROUTER_RENORM;
    d->embed_scale = 1.0f;
    d->attn_scale = (float)(1.0 / sqrt((double)s->head_dim));
    d->residual_scale = 1.0f;
    d->logits_div = 1.0f;
    d->lm_scale = 1.0f;
}

/* An integer-valued word in 1..2^24 with the feature, exactly 0 without. */
static int desc_size_word(float v, int on, uint32_t *out)
{
    if (!on) {
        *out = 0;
        return v == 0.0f;
    }
    if (!(v >= 1.0f && v <= (float)COLIBRI_DESC_MAX_INTERMEDIATE) ||
        v != (float)(uint32_t)v)
        return 0;
    *out = (uint32_t)v;
    return 1;
}

/* An integer-valued word in lo..hi. hi is compared in double, which holds
 * every uint32_t: (float)hi rounds up above 2^24 (vocab - 1 = 2^24 + 3 gave
 * 2^24 + 4, a decoder_start equal to vocab), and to 2^32 near the top, where
 * (uint32_t)v is undefined. */
static int desc_int_word(float v, uint32_t lo, uint32_t hi, uint32_t *out)
{
    if (!(v >= (float)lo && (double)v <= (double)hi) || v != (float)(uint32_t)v)
        return 0;
    *out = (uint32_t)v;
    return 1;
}

/* The ENC_DEC words after the layer words (FORMAT.md 3). */
static int check_encdec_words(const uint8_t *w, const colibri_shape *s, int be,
                              clb_desc *d, char *detail)
{
    const char *bad = NULL;
    float lm = rdf32(w + 4 * COLIBRI_DESCX_LM_SCALE, be);
    if (!desc_int_word(rdf32(w + 4 * COLIBRI_DESCX_ENCODER_LAYERS, be), 1,
                       (uint32_t)s->n_layers - 1u, &d->encoder_layers))
        bad = "encoder_layers";
    else if (!desc_int_word(rdf32(w + 4 * COLIBRI_DESCX_EXPERT_CAPACITY, be), 1,
                            COLIBRI_DESC_MAX_INTERMEDIATE, &d->expert_capacity))
        bad = "expert_capacity";
    else if (!desc_int_word(rdf32(w + 4 * COLIBRI_DESCX_DECODER_START, be), 0,
                            s->vocab - 1u, &d->decoder_start))
        bad = "decoder_start";
    else if (!isfinite(lm) || !(lm > 0.0f))
        bad = "lm_scale";
    else
        for (unsigned i = 4; i < COLIBRI_DESCX_WORDS; i++)
            if (rd32(w + 4 * i, be) != 0)
                bad = "reserved (ENC_DEC words 4-7)";
    if (bad) {
        clb_detail(detail, DETAIL_CAP, "tensor 0 (DESC): %s out of range "
                   "(FORMAT.md 3)", bad);
        return COLIBRI_E_BAD_FORMAT;
    }
    d->lm_scale = lm;
    return COLIBRI_OK;
}

int clb_check_table_end(const colibri_shape *s, uint64_t size, char *detail)
{
    uint64_t table_end = COLIBRI_TABLE_OFFSET + (uint64_t)s->n_tensors * COLIBRI_ENTRY_SIZE;
    /* table_end <= size, as a bound on n_tensors itself: the table loops
     * read entry i < n_tensors, and so this bound is what keeps them inside
     * the file (an analyser sees it there, not through table_end). */
    if (size >= COLIBRI_TABLE_OFFSET &&
        s->n_tensors <= (size - COLIBRI_TABLE_OFFSET) / COLIBRI_ENTRY_SIZE)
        return COLIBRI_OK;
    clb_detail(detail, DETAIL_CAP, "tensor table of %u entries ends at %llu, "
               "beyond the file size %llu (truncated?)", (unsigned)(s->n_tensors),
               (unsigned long long)table_end, (unsigned long long)size);
    return COLIBRI_E_BAD_FORMAT;
}

int clb_check_desc(const uint8_t *b, size_t size, const colibri_shape *s,
                   int be, clb_desc *d, char *detail)
{
    desc_default(d, s);
    unsigned version = rd16(b + COLIBRI_HDR_VERSION, be);
    if (version < 2)
        return COLIBRI_OK;
    d->version = (uint16_t)version;
    d->features = rd32(b + COLIBRI_HDR_FLAGS, be);
    d->be = be;
    /* Entry 0 must be the DESC: everything after it is laid out by it. */
    uint64_t want_cols = desc_cols(s, d->features);
    uint64_t table_end = COLIBRI_TABLE_OFFSET + (uint64_t)s->n_tensors * COLIBRI_ENTRY_SIZE;
    uint64_t at = (table_end + 63) & ~(uint64_t)63;
    int rc = clb_check_table_end(s, size, detail);
    if (rc)
        return rc;
    const uint8_t *en = b + COLIBRI_TABLE_OFFSET;
    if (rd16(en + COLIBRI_ENT_KIND, be) != COLIBRI_KIND_DESC ||
        en[COLIBRI_ENT_DTYPE] != COLIBRI_DTYPE_F32 ||
        en[COLIBRI_ENT_FLAGS] != COLIBRI_ENTRY_FLAG_CRITICAL ||
        rd16(en + COLIBRI_ENT_LAYER, be) != COLIBRI_NO_LAYER ||
        rd16(en + COLIBRI_ENT_EXPERT, be) != COLIBRI_NO_EXPERT ||
        rd32(en + COLIBRI_ENT_ROWS, be) != 1 ||
        rd32(en + COLIBRI_ENT_COLS, be) != want_cols ||
        rd64(en + COLIBRI_ENT_SIZE, be) != 4 * want_cols ||
        rd64(en + COLIBRI_ENT_OFFSET, be) != at ||
        rd32(en + COLIBRI_ENT_RESERVED, be) != 0) {
        clb_detail(detail, DETAIL_CAP, "tensor 0: a version 2 file starts with "
                   "DESC, critical F32 [1, %llu] at offset %llu (found kind %u "
                   "[%u, %u])", (unsigned long long)want_cols,
                   (unsigned long long)at, (unsigned)rd16(en + COLIBRI_ENT_KIND, be),
                   (unsigned)rd32(en + COLIBRI_ENT_ROWS, be),
                   (unsigned)rd32(en + COLIBRI_ENT_COLS, be));
        return COLIBRI_E_BAD_FORMAT;
    }
    if (at + 4 * want_cols > size) {
        clb_detail(detail, DETAIL_CAP, "tensor 0 (DESC): section ends at %llu, "
                   "beyond the file size %llu (truncated?)",
                   (unsigned long long)(at + 4 * want_cols), (unsigned long long)size);
        return COLIBRI_E_BAD_FORMAT;
    }
    /* Its CRC before its words: a flipped bit must read as corruption, not
     * as a different model. */
    const uint8_t *w = b + at;
    uint32_t want = rd32(en + COLIBRI_ENT_CRC, be);
    uint32_t got = colibri_crc32(0, w, (size_t)(4 * want_cols));
    if (want != got) {
        clb_detail(detail, DETAIL_CAP, "tensor 0 (DESC): crc %x != computed %x",
                   (unsigned)want, (unsigned)got);
        return COLIBRI_E_CRC;
    }
    uint32_t f = d->features;
    const char *bad = NULL;
    float v[COLIBRI_DESC_LAYERS];
    for (unsigned i = 0; i < COLIBRI_DESC_LAYERS; i++)
        v[i] = rdf32(w + 4 * i, be);
    if (!desc_size_word(v[COLIBRI_DESC_SHARED_INTERMEDIATE],
                        (f & COLIBRI_FEAT_SHARED_EXPERT) != 0, &d->shared_inter))
        bad = "shared_intermediate";
    else if (!desc_size_word(v[COLIBRI_DESC_DENSE_INTERMEDIATE],
                             (f & COLIBRI_FEAT_DENSE_LAYERS) != 0, &d->dense_inter))
        bad = "dense_intermediate";
    else if (!isfinite(v[COLIBRI_DESC_EMBED_SCALE]) || v[COLIBRI_DESC_EMBED_SCALE] == 0.0f)
        bad = "embed_scale";
    else if (!isfinite(v[COLIBRI_DESC_ATTN_SCALE]) || !(v[COLIBRI_DESC_ATTN_SCALE] > 0.0f))
        bad = "attn_scale";
    else if (!isfinite(v[COLIBRI_DESC_RESIDUAL_SCALE]) || v[COLIBRI_DESC_RESIDUAL_SCALE] == 0.0f)
        bad = "residual_scale";
    else if (!isfinite(v[COLIBRI_DESC_LOGITS_DIVISOR]) || v[COLIBRI_DESC_LOGITS_DIVISOR] == 0.0f)
        bad = "logits_divisor";
    else if ((f & COLIBRI_FEAT_CLIP_QKV)
                 ? !(isfinite(v[COLIBRI_DESC_CLIP_QKV]) && v[COLIBRI_DESC_CLIP_QKV] > 0.0f)
                 : v[COLIBRI_DESC_CLIP_QKV] != 0.0f)
        bad = "clip_qkv";
    else if (rd32(w + 4 * COLIBRI_DESC_RESERVED, be) != 0)
        bad = "reserved";
    if (bad) {
        /* The names are FORMAT.md's; its DESC table gives each range. */
        clb_detail(detail, DETAIL_CAP, "tensor 0 (DESC): %s out of range "
                   "(FORMAT.md 3)", bad);
        return COLIBRI_E_BAD_FORMAT;
    }
    d->embed_scale = v[COLIBRI_DESC_EMBED_SCALE];
    d->attn_scale = v[COLIBRI_DESC_ATTN_SCALE];
    d->residual_scale = v[COLIBRI_DESC_RESIDUAL_SCALE];
    d->logits_div = v[COLIBRI_DESC_LOGITS_DIVISOR];
    d->clip_qkv = v[COLIBRI_DESC_CLIP_QKV];
    uint32_t n_dense = 0;
    for (uint32_t l = 0; l < s->n_layers; l++) {
        uint32_t u = rd32(w + 4 * (COLIBRI_DESC_LAYERS + (size_t)l), be);
        if (u != 0 && u != 0x3f800000u) { /* float 0 or 1, nothing else */
            clb_detail(detail, DETAIL_CAP, "tensor 0 (DESC): layer %u's kind "
                       "(bits %x) must be 0 (MoE) or 1 (dense)", (unsigned)l,
                       (unsigned)u);
            return COLIBRI_E_BAD_FORMAT;
        }
        n_dense += u != 0;
    }
    if (!n_dense != !(f & COLIBRI_FEAT_DENSE_LAYERS)) {
        clb_detail(detail, DETAIL_CAP, "tensor 0 (DESC): %u dense layers, but "
                   "the DENSE_LAYERS flag is %s", (unsigned)n_dense,
                   (f & COLIBRI_FEAT_DENSE_LAYERS) ? "set" : "clear");
        return COLIBRI_E_BAD_FORMAT;
    }
    d->layers = w + 4 * COLIBRI_DESC_LAYERS;
    if (f & COLIBRI_FEAT_ENC_DEC)
        return check_encdec_words(w + 4 * (COLIBRI_DESC_LAYERS + (size_t)s->n_layers),
                                  s, be, d, detail);
    return COLIBRI_OK;
}

/* Every float a known tensor stores (F32 values, I8/I16 scales, the block
 * types' fp16 d and dmin) must be finite: a CRC-valid file can still carry
 * NaN or infinity (crafted, or written by a buggy tool), which would turn
 * every logit into NaN. They lie at first + stride * b + width * j (b <
 * blocks, j < per) from the section's start; width 4 is a float32, 2 an
 * fp16. */
typedef struct float_fields {
    uint64_t first, stride, per, blocks, width;
} float_fields;

/* The float fields of the section entry `en` describes (none for an
 * optional unknown kind: not ours to read). */
static float_fields fields_of(const uint8_t *en, uint32_t group, int be)
{
    float_fields f = { 0, 4, 1, 0, 4 };
    unsigned kind = rd16(en + COLIBRI_ENT_KIND, be);
    if (kind < 1 || kind > COLIBRI_KIND_MAX)
        return f;
    unsigned dtype = en[COLIBRI_ENT_DTYPE];
    uint64_t rows = rd32(en + COLIBRI_ENT_ROWS, be);
    uint64_t cols = rd32(en + COLIBRI_ENT_COLS, be);
    if (dtype == COLIBRI_DTYPE_F32) {
        f.blocks = rows * cols;
    } else if (dtype == COLIBRI_DTYPE_I8_GROUP) {
        f.first = (rows * cols + 63) & ~(uint64_t)63;
        /* group >= 1 in a checked header; 0 is no count, never a division */
        f.blocks = group ? rows * ((cols + group - 1) / group) : 0;
    } else if (dtype == COLIBRI_DTYPE_I16_ROW) {
        f.first = (2 * rows * cols + 63) & ~(uint64_t)63;
        f.blocks = rows;
    } else if (clb_block_cols(dtype)) {
        uint64_t B = clb_block_cols(dtype);
        unsigned at;
        f.per = clb_block_scales(dtype, &at);
        f.first = at;
        f.stride = clb_block_bytes(dtype);
        f.width = 2;
        f.blocks = rows * ((cols + B - 1) / B);
    }
    return f;
}

/* CRC and floats in one pass over pieces that stay in the cache (the
 * second look at a piece costs nothing; at a section's end it would read
 * the section again from memory): the floats of the blocks that start in
 * a piece are checked after its CRC. Corruption is reported as a CRC error
 * before a non-finite value. */
#define CHECK_PIECE ((uint64_t)64 << 10)

int clb_check_section(const uint8_t *sec, const uint8_t *en, uint32_t index,
                      uint32_t group, int be, char *detail)
{
    const uint64_t size = rd64(en + COLIBRI_ENT_SIZE, be);
    const float_fields f = fields_of(en, group, be);
    /* all exponent bits set: infinity or NaN (an fp16's, shifted below) */
    const uint32_t exp_all = f.width == 4 ? 0x7f800000u : 0x0f800000u;
    uint64_t bad = UINT64_MAX, b = 0; /* b: the next block to check */
    uint32_t got_crc = 0, bits = 0;
    for (uint64_t lo = 0; lo < size; lo += CHECK_PIECE) {
        const uint64_t hi = size - lo < CHECK_PIECE ? size : lo + CHECK_PIECE;
        got_crc = colibri_crc32(got_crc, sec + lo, (size_t)(hi - lo));
        for (; bad == UINT64_MAX && b < f.blocks && f.first + f.stride * b < hi; b++)
            for (uint64_t j = 0; j < f.per; j++) {
                const uint8_t *at = sec + f.first + f.stride * b + f.width * j;
                /* an fp16 shifted so that its mantissa sits in float32's */
                bits = f.width == 4 ? rd32(at, be) : (uint32_t)rd16(at, be) << 13;
                if ((bits & exp_all) == exp_all) {
                    bad = b * f.per + j;
                    break;
                }
            }
    }
    uint32_t want_crc = rd32(en + COLIBRI_ENT_CRC, be);
    if (want_crc == got_crc && bad == UINT64_MAX)
        return COLIBRI_OK;
    char label[64];
    entry_label(label, sizeof label, rd16(en + COLIBRI_ENT_KIND, be),
                rd16(en + COLIBRI_ENT_LAYER, be), rd16(en + COLIBRI_ENT_EXPERT, be));
    if (want_crc != got_crc) {
        clb_detail(detail, DETAIL_CAP, "tensor %u (%s): crc %x != computed %x",
                   (unsigned)index, label, (unsigned)want_crc, (unsigned)got_crc);
        return COLIBRI_E_CRC;
    }
    clb_detail(detail, DETAIL_CAP, "tensor %u (%s): float %llu of its %s is "
               "%s: the file holds non-finite weights (re-convert it)",
               (unsigned)index, label, (unsigned long long)bad,
               en[COLIBRI_ENT_DTYPE] == COLIBRI_DTYPE_F32 ? "values" : "scales",
               (bits & 0x007fffffu) ? "NaN" : "infinite");
    return COLIBRI_E_BAD_FORMAT;
}

/* Table: fits, table_crc, every entry (order, dtype, flags, reserved, layer
 * and expert, shape, size, offset), the file's exact length; then, if
 * check_crcs, every section's CRC. n_unknown counts skipped entries. */
static int check_table(const uint8_t *b, size_t size, const colibri_shape *s,
                       int be, int check_crcs, char *detail, bad_cb cb,
                       void *user, uint32_t *nbad, uint32_t *n_unknown,
                       clb_desc *d)
{
    if (clb_check_table_end(s, size, detail) != COLIBRI_OK)
        return COLIBRI_E_BAD_FORMAT;
    /* Computed after the check, from the n_tensors it bounded. */
    int ovf = 0;
    uint64_t table_bytes = cmul(s->n_tensors, COLIBRI_ENTRY_SIZE, &ovf);
    uint64_t table_end = cadd(COLIBRI_TABLE_OFFSET, table_bytes, &ovf);
    if (ovf)
        return COLIBRI_E_BAD_FORMAT; /* never (u32 entries of 40 bytes) */
    const uint8_t *tab = b + COLIBRI_TABLE_OFFSET;
    uint32_t want = rd32(b + COLIBRI_HDR_TABLE_CRC, be);
    uint32_t got = colibri_crc32(0, tab, table_bytes);
    if (want != got) {
        clb_detail(detail, DETAIL_CAP, "table_crc %x != computed %x",
                   (unsigned)want, (unsigned)got);
        if (!cb)
            return COLIBRI_E_CRC;
        cb(user, -1, detail);
        ++*nbad;
    }
    /* The description says which entries the table must hold. */
    int rc = clb_check_desc(b, size, s, be, d, detail);
    if (rc != COLIBRI_OK)
        return rc;

    known_cursor cur;
    cursor_start(&cur, s, d);
    uint64_t j = 0; /* known entries seen */
    uint64_t pos = calign64(table_end, &ovf);
    *n_unknown = 0;
    for (uint32_t i = 0; i < s->n_tensors; i++) {
        const uint8_t *en = tab + (size_t)i * COLIBRI_ENTRY_SIZE;
        unsigned kind = rd16(en + COLIBRI_ENT_KIND, be);
        unsigned dtype = en[COLIBRI_ENT_DTYPE], flags = en[COLIBRI_ENT_FLAGS];
        unsigned layer = rd16(en + COLIBRI_ENT_LAYER, be);
        unsigned expert = rd16(en + COLIBRI_ENT_EXPERT, be);
        uint32_t rows = rd32(en + COLIBRI_ENT_ROWS, be);
        uint32_t cols = rd32(en + COLIBRI_ENT_COLS, be);
        uint64_t off = rd64(en + COLIBRI_ENT_OFFSET, be);
        uint64_t sz = rd64(en + COLIBRI_ENT_SIZE, be);
        uint32_t reserved = rd32(en + COLIBRI_ENT_RESERVED, be);
        int known = kind >= 1 && kind <= COLIBRI_KIND_MAX;
        /* For Frama-C EVA: the known and the unknown entries apart, so that
         * the known branch below keeps the dtype <= COLIBRI_DTYPE_MAX of the
         * next check (the shift by dtype). No effect on the code. */
        /*@ split known; */

        /* An unknown, non-critical kind's dtype and shape are a newer
         * writer's business (FORMAT.md 3): its size is taken as stored. */
        if (known && dtype >= COLIBRI_DTYPE_RETIRED_MIN &&
            dtype <= COLIBRI_DTYPE_RETIRED_MAX) {
            clb_detail(detail, DETAIL_CAP, "tensor %u (%s): dtype %u is a retired "
                       "float32-scale block of an older colibri: re-convert the model",
                       (unsigned)i, kind_name(kind), (unsigned)dtype);
            return COLIBRI_E_BAD_FORMAT;
        }
        if (known && dtype > COLIBRI_DTYPE_MAX) {
            clb_detail(detail, DETAIL_CAP, "tensor %u (%s): unknown dtype %u",
                       (unsigned)i, kind_name(kind), (unsigned)dtype);
            return COLIBRI_E_BAD_FORMAT;
        }
        if ((flags & ~(unsigned)COLIBRI_ENTRY_FLAG_CRITICAL) || reserved) {
            clb_detail(detail, DETAIL_CAP, "tensor %u (%s): flags %x / reserved "
                       "%x, unknown bits must be 0", (unsigned)i, kind_name(kind),
                       (unsigned)flags,
                       (unsigned)reserved);
            return COLIBRI_E_BAD_FORMAT;
        }
        if (!known) {
            if (flags & COLIBRI_ENTRY_FLAG_CRITICAL) {
                clb_detail(detail, DETAIL_CAP, "tensor %u: unknown critical "
                           "kind %u: the file needs a newer colibri", (unsigned)i,
                           (unsigned)kind);
                return COLIBRI_E_BAD_FORMAT;
            }
            if (j == 0) {
                clb_detail(detail, DETAIL_CAP, "tensor %u: unknown kind %u "
                           "before EMBED", (unsigned)i, (unsigned)kind);
                return COLIBRI_E_BAD_FORMAT;
            }
            ++*n_unknown;
        } else {
            known_slot k = cursor_slot(&cur, s, d);
            if (k.kind == 0 || k.kind != kind || k.layer != layer ||
                k.expert != expert) {
                if (k.kind == 0)
                    clb_detail(detail, DETAIL_CAP, "tensor %u (%s layer %u "
                               "expert %u): more known tensors than the shape "
                               "implies", (unsigned)i, kind_name(kind),
                               (unsigned)layer, (unsigned)expert);
                else
                    clb_detail(detail, DETAIL_CAP, "tensor %u: expected %s layer "
                               "%u expert %u, found %s layer %u expert %u", (unsigned)i,
                               kind_name(k.kind), (unsigned)(k.layer),
                               (unsigned)(k.expert),
                               kind_name(kind), (unsigned)layer, (unsigned)expert);
                return COLIBRI_E_BAD_FORMAT;
            }
            uint32_t want_rows, want_cols;
            unsigned dtypes;
            kind_shape(s, d, kind, &want_rows, &want_cols, &dtypes);
            if (rows != want_rows || cols != want_cols) {
                char label[64];
                clb_detail(detail, DETAIL_CAP, "tensor %u (%s): shape [%u, %u], "
                           "the header implies [%u, %u]", (unsigned)i,
                           entry_label(label, sizeof label, kind, layer, expert),
                           (unsigned)rows,
                           (unsigned)cols, (unsigned)want_rows, (unsigned)want_cols);
                return COLIBRI_E_BAD_FORMAT;
            }
            if (!(dtypes & (1u << dtype))) {
                clb_detail(detail, DETAIL_CAP, "tensor %u (%s): dtype %u not "
                           "allowed for this kind", (unsigned)i, kind_name(kind),
                           (unsigned)dtype);
                return COLIBRI_E_BAD_FORMAT;
            }
            j++;
            cursor_next(&cur, s, d);
        }
        /*@ merge known; */
        uint64_t scales_at;
        uint64_t want_sz = known ? clb_section_size(dtype, rows, cols, s->group_size,
                                                &scales_at, &ovf)
                                 : sz;
        if (ovf || sz != want_sz) {
            clb_detail(detail, DETAIL_CAP, "tensor %u (%s): size %llu, dtype %u "
                       "[%u, %u] needs %llu", (unsigned)i, kind_name(kind),
                       (unsigned long long)sz, (unsigned)dtype,
                       (unsigned)rows, (unsigned)cols, (unsigned long long)want_sz);
            return COLIBRI_E_BAD_FORMAT;
        }
        if (off != pos) {
            clb_detail(detail, DETAIL_CAP, "tensor %u (%s): offset %llu, expected "
                       "%llu (sections follow the table, 64-byte aligned)", (unsigned)i,
                       kind_name(kind), (unsigned long long)off,
                       (unsigned long long)pos);
            return COLIBRI_E_BAD_FORMAT;
        }
        uint64_t end = cadd(off, sz, &ovf);
        if (ovf || end > size) {
            clb_detail(detail, DETAIL_CAP, "tensor %u (%s): section ends at %llu, "
                       "beyond the file size %llu (truncated?)", (unsigned)i,
                       kind_name(kind), (unsigned long long)end,
                       (unsigned long long)size);
            return COLIBRI_E_BAD_FORMAT;
        }
        pos = calign64(end, &ovf);
    }
    known_slot k = cursor_slot(&cur, s, d);
    if (k.kind != 0) {
        clb_detail(detail, DETAIL_CAP, "tensor table ends after %u entries; "
                   "missing %s layer %u expert %u", (unsigned)(s->n_tensors),
                   kind_name(k.kind), (unsigned)(k.layer), (unsigned)(k.expert));
        return COLIBRI_E_BAD_FORMAT;
    }
    if (ovf || pos != size) {
        clb_detail(detail, DETAIL_CAP, "file size %llu, the table implies %llu "
                   "(truncated or trailing bytes)", (unsigned long long)size,
                   (unsigned long long)pos);
        return COLIBRI_E_BAD_FORMAT;
    }
    if (!check_crcs)
        return COLIBRI_OK;
    for (uint32_t i = 0; i < s->n_tensors; i++) {
        const uint8_t *en = tab + (size_t)i * COLIBRI_ENTRY_SIZE;
        int rc = clb_check_section(b + rd64(en + COLIBRI_ENT_OFFSET, be), en, i,
                                   s->group_size, be, detail);
        if (rc != COLIBRI_OK) {
            if (!cb)
                return rc;
            cb(user, (int)i, detail);
            ++*nbad;
        }
    }
    return COLIBRI_OK;
}

uint64_t clb_prefix_bytes(const uint8_t *hdr, const colibri_shape *s, int be)
{
    uint64_t table_end = COLIBRI_TABLE_OFFSET + (uint64_t)s->n_tensors * COLIBRI_ENTRY_SIZE;
    if (rd16(hdr + COLIBRI_HDR_VERSION, be) < 2)
        return table_end;
    uint64_t at = (table_end + 63) & ~(uint64_t)63;
    return at + 4 * desc_cols(s, rd32(hdr + COLIBRI_HDR_FLAGS, be));
}

int clb_validate_prefix(const uint8_t *b, size_t size, colibri_shape *s,
                        int *be, clb_desc *d, char *detail)
{
    uint32_t n_unknown;
    int rc = clb_check_header(b, size, s, be, detail, NULL, NULL, NULL);
    if (rc == COLIBRI_OK)
        rc = check_table(b, size, s, *be, 0, detail, NULL, NULL, NULL, &n_unknown, d);
    return rc;
}

/* The whole of FORMAT.md 3 on bytes as stored. */
int clb_validate(const uint8_t *b, size_t size, colibri_shape *s, int *be,
                 clb_desc *d, char *detail, bad_cb cb, void *user,
                 uint32_t *nbad)
{
    uint32_t n_unknown;
    clb_desc local;
    int rc = clb_check_header(b, size, s, be, detail, cb, user, nbad);
    if (rc == COLIBRI_OK)
        rc = check_table(b, size, s, *be, 1, detail, cb, user, nbad, &n_unknown,
                         d ? d : &local);
    return rc;
}

int colibri_verify(const void *blob, size_t size,
                   void (*on_bad)(void *user, int index, const char *what),
                   void *user, uint32_t *bad_count)
{
    char detail[DETAIL_CAP];
    colibri_shape s;
    int be;
    uint32_t nbad = 0;
    if (bad_count)
        *bad_count = 0;
    if (!blob || !on_bad)
        return COLIBRI_E_ARG;
    detail[0] = '\0';
    int rc = clb_validate((const uint8_t *)blob, size, &s, &be, NULL, detail,
                          on_bad, user, &nbad);
    if (rc != COLIBRI_OK)
        on_bad(user, -3, detail);
    if (bad_count)
        *bad_count = nbad;
    if (rc == COLIBRI_OK && nbad)
        rc = COLIBRI_E_CRC;
    return rc;
}
