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

static const char *kind_name(unsigned kind)
{
    static const char *const names[] = {
        "?", "EMBED", "ATTN_NORM", "WQ", "WK", "WV", "WO", "FFN_NORM",
        "ROUTER", "EXPERT_W1", "EXPERT_W3", "EXPERT_W2", "FINAL_NORM",
        "LM_HEAD",
    };
    return kind >= 1 && kind <= COLIBRI_KIND_MAX ? names[kind] : "unknown";
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

/* The j-th known entry of the table order (FORMAT.md 3, rule 1). */
typedef struct { unsigned kind, layer, expert; } known_slot;

static uint64_t known_count(const colibri_shape *s)
{
    return 3 + (uint64_t)s->n_layers * (7 + 3 * (uint64_t)s->n_experts);
}

static known_slot known_at(const colibri_shape *s, uint64_t j)
{
    static const unsigned layer_kinds[7] = {
        COLIBRI_KIND_ATTN_NORM, COLIBRI_KIND_WQ, COLIBRI_KIND_WK,
        COLIBRI_KIND_WV, COLIBRI_KIND_WO, COLIBRI_KIND_FFN_NORM,
        COLIBRI_KIND_ROUTER,
    };
    static const unsigned expert_kinds[3] = {
        COLIBRI_KIND_EXPERT_W1, COLIBRI_KIND_EXPERT_W3, COLIBRI_KIND_EXPERT_W2,
    };
    known_slot k = { COLIBRI_KIND_EMBED, COLIBRI_NO_LAYER, COLIBRI_NO_EXPERT };
    if (j == 0)
        return k;
    j -= 1;
    uint64_t per = 7 + 3 * (uint64_t)s->n_experts;
    if (j < (uint64_t)s->n_layers * per) {
        k.layer = (unsigned)(j / per);
        uint64_t r = j % per;
        if (r < 7) {
            k.kind = layer_kinds[r];
        } else {
            k.expert = (unsigned)((r - 7) / 3);
            k.kind = expert_kinds[(r - 7) % 3];
        }
        return k;
    }
    j -= (uint64_t)s->n_layers * per;
    k.kind = j == 0 ? COLIBRI_KIND_FINAL_NORM : COLIBRI_KIND_LM_HEAD;
    return k;
}

/* The [rows, cols] a kind must have, and the dtypes it may use (bit mask). */
static void kind_shape(const colibri_shape *s, unsigned kind, uint32_t *rows,
                       uint32_t *cols, unsigned *dtypes)
{
    uint32_t qdim = (uint32_t)s->n_heads * s->head_dim;
    uint32_t kvdim = (uint32_t)s->n_kv_heads * s->head_dim;
    const unsigned F = 1u << COLIBRI_DTYPE_F32, I8 = 1u << COLIBRI_DTYPE_I8_GROUP,
                   I16 = 1u << COLIBRI_DTYPE_I16_ROW;
    *cols = s->hidden;
    *dtypes = F | I8;
    switch (kind) {
    case COLIBRI_KIND_EMBED: *rows = s->vocab; *dtypes = F | I16; break;
    case COLIBRI_KIND_ATTN_NORM:
    case COLIBRI_KIND_FFN_NORM:
    case COLIBRI_KIND_FINAL_NORM: *rows = 1; *dtypes = F; break;
    case COLIBRI_KIND_WQ: *rows = qdim; break;
    case COLIBRI_KIND_WK:
    case COLIBRI_KIND_WV: *rows = kvdim; break;
    case COLIBRI_KIND_WO: *rows = s->hidden; *cols = qdim; break;
    case COLIBRI_KIND_ROUTER: *rows = s->n_experts; *dtypes = F | I16; break;
    case COLIBRI_KIND_EXPERT_W1:
    case COLIBRI_KIND_EXPERT_W3: *rows = s->intermediate; break;
    case COLIBRI_KIND_EXPERT_W2: *rows = s->hidden; *cols = s->intermediate; break;
    default: /* LM_HEAD */ *rows = s->vocab; break;
    }
}

/* Section size of a dtype (FORMAT.md 4), overflow-checked; where the scales
 * start within the section in *scales_at. */
uint64_t clb_section_size(unsigned dtype, uint32_t rows, uint32_t cols,
                             uint32_t group, uint64_t *scales_at, int *ovf)
{
    uint64_t n = (uint64_t)rows * cols; /* < 2^64: two 32-bit factors */
    uint64_t ngroups = ((uint64_t)cols + group - 1) / group;
    switch (dtype) {
    case COLIBRI_DTYPE_F32:
        *scales_at = 0;
        return cmul(n, 4, ovf);
    case COLIBRI_DTYPE_I8_GROUP:
        *scales_at = calign64(n, ovf);
        return cadd(*scales_at, cmul(cmul(rows, ngroups, ovf), 4, ovf), ovf);
    default: /* I16_ROW */
        *scales_at = calign64(cmul(n, 2, ovf), ovf);
        return cadd(*scales_at, cmul(rows, 4, ovf), ovf);
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
        clb_detail(detail, DETAIL_CAP, "magic is %x, not \"CLBR\": not a "
                   ".colibri file", (unsigned)(rd32(b, 1)));
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
    if (version != COLIBRI_FORMAT_VERSION) {
        clb_detail(detail, DETAIL_CAP, "format version %u, this library "
                   "supports version %u%s", (unsigned)version,
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
    if (s->n_heads % s->n_kv_heads != 0) {
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
    if (flags != 0) {
        clb_detail(detail, DETAIL_CAP, "header flags %x, must be 0 in version 1",
                   (unsigned)flags);
        return COLIBRI_E_BAD_FORMAT;
    }
    return COLIBRI_OK;
}

/* Every float32 a known tensor stores (F32 values, I8/I16 scales) must be
 * finite: a CRC-valid file can still carry NaN or infinity (crafted, or
 * written by a buggy tool), which would turn every logit into NaN. Run after
 * the section's CRC matched, so corruption is reported as a CRC error. */
static int check_finite(const uint8_t *b, const uint8_t *en, uint32_t group,
                        int be, uint32_t index, char *detail)
{
    unsigned kind = rd16(en + COLIBRI_ENT_KIND, be);
    if (kind < 1 || kind > COLIBRI_KIND_MAX)
        return COLIBRI_OK; /* optional unknown section: not ours to read */
    unsigned dtype = en[COLIBRI_ENT_DTYPE];
    uint64_t rows = rd32(en + COLIBRI_ENT_ROWS, be);
    uint64_t cols = rd32(en + COLIBRI_ENT_COLS, be);
    const uint8_t *sec = b + rd64(en + COLIBRI_ENT_OFFSET, be);
    uint64_t first = 0, count = 0; /* float32 values: byte offset, count */
    if (dtype == COLIBRI_DTYPE_F32) {
        count = rows * cols;
    } else if (dtype == COLIBRI_DTYPE_I8_GROUP) {
        first = (rows * cols + 63) & ~(uint64_t)63;
        count = rows * ((cols + group - 1) / group);
    } else if (dtype == COLIBRI_DTYPE_I16_ROW) {
        first = (2 * rows * cols + 63) & ~(uint64_t)63;
        count = rows;
    }
    for (uint64_t k = 0; k < count; k++) {
        uint32_t bits = rd32(sec + first + 4 * k, be);
        if ((bits & 0x7f800000u) == 0x7f800000u) {
            char label[64];
            clb_detail(detail, DETAIL_CAP, "tensor %u (%s): float %llu of its %s is "
                       "%s: the file holds non-finite weights (re-convert it)",
                       (unsigned)index, entry_label(label, sizeof label, kind,
                                      rd16(en + COLIBRI_ENT_LAYER, be),
                                      rd16(en + COLIBRI_ENT_EXPERT, be)),
                       (unsigned long long)k,
                       dtype == COLIBRI_DTYPE_F32 ? "values" : "scales",
                       (bits & 0x007fffffu) ? "NaN" : "infinite");
            return COLIBRI_E_BAD_FORMAT;
        }
    }
    return COLIBRI_OK;
}

/* Table: fits, table_crc, every entry (order, dtype, flags, reserved, layer
 * and expert, shape, size, offset), the file's exact length; then, if
 * check_crcs, every section's CRC. n_unknown counts skipped entries. */
static int check_table(const uint8_t *b, size_t size, const colibri_shape *s,
                       int be, int check_crcs, char *detail, bad_cb cb,
                       void *user, uint32_t *nbad, uint32_t *n_unknown)
{
    int ovf = 0;
    uint64_t table_bytes = cmul(s->n_tensors, COLIBRI_ENTRY_SIZE, &ovf);
    uint64_t table_end = cadd(COLIBRI_TABLE_OFFSET, table_bytes, &ovf);
    if (ovf || table_end > size) {
        clb_detail(detail, DETAIL_CAP, "tensor table of %u entries ends at %llu, "
                   "beyond the file size %llu (truncated?)", (unsigned)(s->n_tensors),
                   (unsigned long long)table_end, (unsigned long long)size);
        return COLIBRI_E_BAD_FORMAT;
    }
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

    uint64_t n_known = known_count(s), j = 0;
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

        /* An unknown, non-critical kind's dtype and shape are a newer
         * writer's business (FORMAT.md 3): its size is taken as stored. */
        if (known && dtype > COLIBRI_DTYPE_I16_ROW) {
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
            known_slot k = j < n_known ? known_at(s, j)
                                       : (known_slot){ 0, 0, 0 };
            if (j >= n_known || k.kind != kind || k.layer != layer ||
                k.expert != expert) {
                if (j >= n_known)
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
            kind_shape(s, kind, &want_rows, &want_cols, &dtypes);
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
        }
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
    if (j != n_known) {
        known_slot k = known_at(s, j);
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
        uint64_t off = rd64(en + COLIBRI_ENT_OFFSET, be);
        uint64_t sz = rd64(en + COLIBRI_ENT_SIZE, be);
        uint32_t want_crc = rd32(en + COLIBRI_ENT_CRC, be);
        uint32_t got_crc = colibri_crc32(0, b + off, sz);
        if (want_crc != got_crc) {
            unsigned kind = rd16(en + COLIBRI_ENT_KIND, be);
            char label[64];
            clb_detail(detail, DETAIL_CAP, "tensor %u (%s): crc %x != computed %x",
                       (unsigned)i, entry_label(label, sizeof label, kind,
                                      rd16(en + COLIBRI_ENT_LAYER, be),
                                      rd16(en + COLIBRI_ENT_EXPERT, be)),
                       (unsigned)want_crc, (unsigned)got_crc);
            if (!cb)
                return COLIBRI_E_CRC;
            cb(user, (int)i, detail);
            ++*nbad;
            continue;
        }
        int rc = check_finite(b, en, s->group_size, be, i, detail);
        if (rc != COLIBRI_OK) {
            if (!cb)
                return rc;
            cb(user, (int)i, detail);
            ++*nbad;
        }
    }
    return COLIBRI_OK;
}

/* The whole of FORMAT.md 3 on bytes as stored. */
int clb_validate(const uint8_t *b, size_t size, colibri_shape *s, int *be,
                    char *detail, bad_cb cb, void *user, uint32_t *nbad)
{
    uint32_t n_unknown;
    int rc = clb_check_header(b, size, s, be, detail, cb, user, nbad);
    if (rc == COLIBRI_OK)
        rc = check_table(b, size, s, *be, 1, detail, cb, user, nbad, &n_unknown);
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
    int rc = clb_validate((const uint8_t *)blob, size, &s, &be, detail, on_bad,
                      user, &nbad);
    if (rc != COLIBRI_OK)
        on_bad(user, -3, detail);
    if (bad_count)
        *bad_count = nbad;
    if (rc == COLIBRI_OK && nbad)
        rc = COLIBRI_E_CRC;
    return rc;
}
