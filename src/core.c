/*
 * core.c - everything around the forward pass: reading and validating a
 * .colibri file (docs/FORMAT.md section 3, overflow-safe, before any tensor
 * byte is used), CRC32, loading (mmap or read), byte swapping, the arena
 * layout, the instance lifecycle, and the infer loop that drives tensor.c and
 * moe.c over chunks of tokens.
 *
 * The header and the table are always read field by field in the file's byte
 * order (rd16/rd32/rd64), so validation works on the bytes as stored; only the
 * tensor data is ever swapped.
 */
#if !defined(COLIBRI_STATIC_WORKBUF) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* open, fstat, mmap */
#endif
#if !defined(COLIBRI_STATIC_WORKBUF) && defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MADV_HUGEPAGE (alloc_blob) */
#endif

#include "internal.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

#ifndef COLIBRI_ENABLE_MMAP
#define COLIBRI_ENABLE_MMAP 1
#endif

#ifndef COLIBRI_STATIC_WORKBUF
#include <stdio.h>
#include <stdlib.h>
#if COLIBRI_ENABLE_MMAP
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#endif
#if COLIBRI_ENABLE_MMAP || defined(__linux__)
#include <sys/mman.h>
#endif
#endif

#define MODEL_MAGIC 0x434C4252u /* "CLBR": the instance is initialised */
enum { LOAD_MMAP = 1, LOAD_READ = 2, LOAD_MEMORY = 3, LOAD_SHARED = 4 };

/* ------------------------------------------------------------------------ */
/* Error details: a tiny printf subset (%s, %u, %x, %llu) so the library    */
/* needs no snprintf on small targets; GCC checks the arguments' types.     */
/* ------------------------------------------------------------------------ */

typedef struct { char *buf; size_t cap, len; } fmt_out;

static void put_ch(fmt_out *o, char c)
{
    if (o->len + 1 < o->cap)
        o->buf[o->len++] = c;
}

static void put_u64(fmt_out *o, uint64_t v, unsigned base)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v);
    if (base == 16) {
        put_ch(o, '0');
        put_ch(o, 'x');
    }
    while (n)
        put_ch(o, tmp[--n]);
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void fmt_detail(char *buf, size_t cap, const char *fmt, ...);

static void fmt_detail(char *buf, size_t cap, const char *fmt, ...)
{
    fmt_out o = { buf, cap, 0 };
    va_list ap;
    va_start(ap, fmt);
    for (const char *f = fmt; *f; f++) {
        if (*f != '%' || !f[1]) {
            put_ch(&o, *f);
            continue;
        }
        switch (*++f) {
        case 's': {
            const char *s = va_arg(ap, const char *);
            while (s && *s)
                put_ch(&o, *s++);
            break;
        }
        case 'u': put_u64(&o, va_arg(ap, unsigned), 10); break;
        case 'l': /* %llu */
            if (f[1] == 'l' && f[2] == 'u') {
                f += 2;
                put_u64(&o, va_arg(ap, unsigned long long), 10);
            }
            break;
        case 'x': put_u64(&o, va_arg(ap, unsigned), 16); break;
        default: put_ch(&o, *f); break;
        }
    }
    va_end(ap);
    if (cap)
        buf[o.len] = '\0';
}

#define DETAIL_CAP sizeof(((colibri_model *)0)->priv_.detail)

/* ------------------------------------------------------------------------ */
/* Byte order, checked arithmetic, CRC32                                    */
/* ------------------------------------------------------------------------ */

static int host_is_big_endian(void)
{
    const uint16_t one = 1;
    uint8_t first;
    memcpy(&first, &one, 1);
    return first == 0;
}

static uint16_t rd16(const uint8_t *p, int be)
{
    return be ? (uint16_t)(p[0] << 8 | p[1]) : (uint16_t)(p[1] << 8 | p[0]);
}

static uint32_t rd32(const uint8_t *p, int be)
{
    return be ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]
              : (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

static uint64_t rd64(const uint8_t *p, int be)
{
    uint64_t a = rd32(p, be), b = rd32(p + 4, be);
    return be ? a << 32 | b : b << 32 | a;
}

static float rdf32(const uint8_t *p, int be)
{
    uint32_t u = rd32(p, be);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* a*b and a+b in 64 bits; *ovf is set (sticky) on overflow. */
static uint64_t cmul(uint64_t a, uint64_t b, int *ovf)
{
    if (a && b > UINT64_MAX / a)
        *ovf = 1;
    return a * b;
}

static uint64_t cadd(uint64_t a, uint64_t b, int *ovf)
{
    if (b > UINT64_MAX - a)
        *ovf = 1;
    return a + b;
}

static uint64_t calign64(uint64_t n, int *ovf)
{
    return cadd(n, 63, ovf) & ~(uint64_t)63;
}


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
        fmt_detail(buf, cap, "%s", kind_name(kind));
    else if (expert == COLIBRI_NO_EXPERT)
        fmt_detail(buf, cap, "%s layer %u", kind_name(kind), (unsigned)layer);
    else
        fmt_detail(buf, cap, "%s layer %u expert %u", kind_name(kind),
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
static uint64_t section_size(unsigned dtype, uint32_t rows, uint32_t cols,
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

typedef void (*bad_cb)(void *user, int index, const char *what);

/* Header: magic, bom, version, header_crc, every field's range, flags.
 * Fills *s and *be. With cb set, a CRC mismatch is reported and counted
 * instead of returned. */
static int check_header(const uint8_t *b, size_t size, colibri_shape *s,
                        int *be, char *detail, bad_cb cb, void *user,
                        uint32_t *nbad)
{
    if (size < COLIBRI_HEADER_SIZE) {
        fmt_detail(detail, DETAIL_CAP, "file is %llu bytes, shorter than the "
                   "%u-byte header (truncated?)", (unsigned long long)size,
                   (unsigned)COLIBRI_HEADER_SIZE);
        return COLIBRI_E_BAD_FORMAT;
    }
    if (memcmp(b + COLIBRI_HDR_MAGIC, COLIBRI_MAGIC, COLIBRI_MAGIC_SIZE) != 0) {
        fmt_detail(detail, DETAIL_CAP, "magic is %x, not \"CLBR\": not a "
                   ".colibri file", (unsigned)(rd32(b, 1)));
        return COLIBRI_E_BAD_FORMAT;
    }
    uint16_t bom_le = rd16(b + COLIBRI_HDR_BOM, 0);
    if (bom_le == COLIBRI_BOM) {
        *be = 0;
    } else if (rd16(b + COLIBRI_HDR_BOM, 1) == COLIBRI_BOM) {
        *be = 1;
    } else {
        fmt_detail(detail, DETAIL_CAP, "bom is %x, neither FF FE nor FE FF",
                   (unsigned)(rd16(b + COLIBRI_HDR_BOM, 1)));
        return COLIBRI_E_BAD_FORMAT;
    }
    int e = *be;
    unsigned version = rd16(b + COLIBRI_HDR_VERSION, e);
    if (version != COLIBRI_FORMAT_VERSION) {
        fmt_detail(detail, DETAIL_CAP, "format version %u, this library "
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
        fmt_detail(detail, DETAIL_CAP, "header_crc %x != computed %x",
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
            fmt_detail(detail, DETAIL_CAP, "header field %s is 0, must be >= 1",
                       pos[i].name);
            return COLIBRI_E_BAD_FORMAT;
        }
    }
    if (s->n_layers == COLIBRI_NO_LAYER || s->n_experts == COLIBRI_NO_EXPERT) {
        fmt_detail(detail, DETAIL_CAP, "n_layers %u / n_experts %u: 65535 is "
                   "reserved (it marks a tensor outside the layers/experts)",
                   (unsigned)(s->n_layers), (unsigned)(s->n_experts));
        return COLIBRI_E_BAD_FORMAT;
    }
    if (s->n_heads % s->n_kv_heads != 0) {
        fmt_detail(detail, DETAIL_CAP, "n_kv_heads %u does not divide n_heads %u",
                   (unsigned)(s->n_kv_heads), (unsigned)(s->n_heads));
        return COLIBRI_E_BAD_FORMAT;
    }
    if (s->head_dim < 2 || s->head_dim % 2 != 0) {
        fmt_detail(detail, DETAIL_CAP, "head_dim %u must be even and >= 2",
                   (unsigned)(s->head_dim));
        return COLIBRI_E_BAD_FORMAT;
    }
    if (s->top_k > s->n_experts) {
        fmt_detail(detail, DETAIL_CAP, "top_k %u exceeds n_experts %u",
                   (unsigned)(s->top_k), (unsigned)(s->n_experts));
        return COLIBRI_E_BAD_FORMAT;
    }
    if (!isfinite(s->rope_theta) || !(s->rope_theta > 0.0f)) {
        fmt_detail(detail, DETAIL_CAP, "rope_theta (bits %x) must be finite and > 0",
                   (unsigned)(rd32(b + COLIBRI_HDR_ROPE_THETA, e)));
        return COLIBRI_E_BAD_FORMAT;
    }
    if (!isfinite(s->rms_eps) || !(s->rms_eps > 0.0f)) {
        fmt_detail(detail, DETAIL_CAP, "rms_eps (bits %x) must be finite and > 0",
                   (unsigned)(rd32(b + COLIBRI_HDR_RMS_EPS, e)));
        return COLIBRI_E_BAD_FORMAT;
    }
    uint32_t flags = rd32(b + COLIBRI_HDR_FLAGS, e);
    if (flags != 0) {
        fmt_detail(detail, DETAIL_CAP, "header flags %x, must be 0 in version 1",
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
            fmt_detail(detail, DETAIL_CAP, "tensor %u (%s): float %llu of its %s is "
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
        fmt_detail(detail, DETAIL_CAP, "tensor table of %u entries ends at %llu, "
                   "beyond the file size %llu (truncated?)", (unsigned)(s->n_tensors),
                   (unsigned long long)table_end, (unsigned long long)size);
        return COLIBRI_E_BAD_FORMAT;
    }
    const uint8_t *tab = b + COLIBRI_TABLE_OFFSET;
    uint32_t want = rd32(b + COLIBRI_HDR_TABLE_CRC, be);
    uint32_t got = colibri_crc32(0, tab, table_bytes);
    if (want != got) {
        fmt_detail(detail, DETAIL_CAP, "table_crc %x != computed %x",
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
            fmt_detail(detail, DETAIL_CAP, "tensor %u (%s): unknown dtype %u",
                       (unsigned)i, kind_name(kind), (unsigned)dtype);
            return COLIBRI_E_BAD_FORMAT;
        }
        if ((flags & ~(unsigned)COLIBRI_ENTRY_FLAG_CRITICAL) || reserved) {
            fmt_detail(detail, DETAIL_CAP, "tensor %u (%s): flags %x / reserved "
                       "%x, unknown bits must be 0", (unsigned)i, kind_name(kind),
                       (unsigned)flags,
                       (unsigned)reserved);
            return COLIBRI_E_BAD_FORMAT;
        }
        if (!known) {
            if (flags & COLIBRI_ENTRY_FLAG_CRITICAL) {
                fmt_detail(detail, DETAIL_CAP, "tensor %u: unknown critical "
                           "kind %u: the file needs a newer colibri", (unsigned)i,
                           (unsigned)kind);
                return COLIBRI_E_BAD_FORMAT;
            }
            if (j == 0) {
                fmt_detail(detail, DETAIL_CAP, "tensor %u: unknown kind %u "
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
                    fmt_detail(detail, DETAIL_CAP, "tensor %u (%s layer %u "
                               "expert %u): more known tensors than the shape "
                               "implies", (unsigned)i, kind_name(kind),
                               (unsigned)layer, (unsigned)expert);
                else
                    fmt_detail(detail, DETAIL_CAP, "tensor %u: expected %s layer "
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
                fmt_detail(detail, DETAIL_CAP, "tensor %u (%s): shape [%u, %u], "
                           "the header implies [%u, %u]", (unsigned)i,
                           entry_label(label, sizeof label, kind, layer, expert),
                           (unsigned)rows,
                           (unsigned)cols, (unsigned)want_rows, (unsigned)want_cols);
                return COLIBRI_E_BAD_FORMAT;
            }
            if (!(dtypes & (1u << dtype))) {
                fmt_detail(detail, DETAIL_CAP, "tensor %u (%s): dtype %u not "
                           "allowed for this kind", (unsigned)i, kind_name(kind),
                           (unsigned)dtype);
                return COLIBRI_E_BAD_FORMAT;
            }
            j++;
        }
        uint64_t scales_at;
        uint64_t want_sz = known ? section_size(dtype, rows, cols, s->group_size,
                                                &scales_at, &ovf)
                                 : sz;
        if (ovf || sz != want_sz) {
            fmt_detail(detail, DETAIL_CAP, "tensor %u (%s): size %llu, dtype %u "
                       "[%u, %u] needs %llu", (unsigned)i, kind_name(kind),
                       (unsigned long long)sz, (unsigned)dtype,
                       (unsigned)rows, (unsigned)cols, (unsigned long long)want_sz);
            return COLIBRI_E_BAD_FORMAT;
        }
        if (off != pos) {
            fmt_detail(detail, DETAIL_CAP, "tensor %u (%s): offset %llu, expected "
                       "%llu (sections follow the table, 64-byte aligned)", (unsigned)i,
                       kind_name(kind), (unsigned long long)off,
                       (unsigned long long)pos);
            return COLIBRI_E_BAD_FORMAT;
        }
        uint64_t end = cadd(off, sz, &ovf);
        if (ovf || end > size) {
            fmt_detail(detail, DETAIL_CAP, "tensor %u (%s): section ends at %llu, "
                       "beyond the file size %llu (truncated?)", (unsigned)i,
                       kind_name(kind), (unsigned long long)end,
                       (unsigned long long)size);
            return COLIBRI_E_BAD_FORMAT;
        }
        pos = calign64(end, &ovf);
    }
    if (j != n_known) {
        known_slot k = known_at(s, j);
        fmt_detail(detail, DETAIL_CAP, "tensor table ends after %u entries; "
                   "missing %s layer %u expert %u", (unsigned)(s->n_tensors),
                   kind_name(k.kind), (unsigned)(k.layer), (unsigned)(k.expert));
        return COLIBRI_E_BAD_FORMAT;
    }
    if (ovf || pos != size) {
        fmt_detail(detail, DETAIL_CAP, "file size %llu, the table implies %llu "
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
            fmt_detail(detail, DETAIL_CAP, "tensor %u (%s): crc %x != computed %x",
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
static int validate(const uint8_t *b, size_t size, colibri_shape *s, int *be,
                    char *detail, bad_cb cb, void *user, uint32_t *nbad)
{
    uint32_t n_unknown;
    int rc = check_header(b, size, s, be, detail, cb, user, nbad);
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
    int rc = validate((const uint8_t *)blob, size, &s, &be, detail, on_bad,
                      user, &nbad);
    if (rc != COLIBRI_OK)
        on_bad(user, -3, detail);
    if (bad_count)
        *bad_count = nbad;
    if (rc == COLIBRI_OK && nbad)
        rc = COLIBRI_E_CRC;
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Arena layout                                                             */
/* ------------------------------------------------------------------------ */

/* Hands out 64-byte aligned pieces; with base NULL it only counts. */
typedef struct { uint8_t *base; uint64_t off; int ovf; } carver;

static void *carve(carver *c, uint64_t bytes)
{
    uint64_t at = c->off;
    c->off = calign64(cadd(at, bytes, &c->ovf), &c->ovf);
    return c->base && !c->ovf ? c->base + at : NULL;
}

static uint64_t cm(carver *c, uint64_t a, uint64_t b)
{
    return cmul(a, b, &c->ovf);
}

/* Lay out the arena for shape s (the formula documented at
 * colibri_arena_size). With c->base NULL, p gets NULL pointers and only
 * c->off matters. */
static void layout(carver *c, const colibri_shape *s, uint32_t chunk_limit,
                   clb_plan **pp)
{
    uint64_t L = s->n_layers, E = s->n_experts, K = s->top_k;
    uint64_t B = s->max_batch, S = s->max_seq_len, h = s->hidden;
    uint64_t qdim = (uint64_t)s->n_heads * s->head_dim;
    uint64_t kvdim = (uint64_t)s->n_kv_heads * s->head_dim;
    uint64_t inter = s->intermediate;
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
    uint64_t kv = cm(c, cm(c, cm(c, L, tokens), kvdim), 4);
    p->k_cache = (float *)carve(c, kv);
    p->v_cache = (float *)carve(c, kv);
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
    p->scores = (float *)carve(c, cm(c, S, 4));
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
    p->xq = (int8_t *)carve(c, cm(c, C, max_cols));
    p->xs = (float *)carve(c, cm(c, C * 4, max_groups));
    *pp = p == &dummy ? NULL : p;
}

/* Arena bytes for shape s processing up to chunk_limit tokens together;
 * COLIBRI_E_NO_MEMORY if it exceeds size_t. */
static int arena_bytes(const colibri_shape *s, uint32_t chunk_limit, size_t *out)
{
    carver c = { NULL, 0, 0 };
    clb_plan *unused;
    layout(&c, s, chunk_limit, &unused);
    if (c.ovf || c.off > (uint64_t)SIZE_MAX)
        return COLIBRI_E_NO_MEMORY;
    *out = (size_t)c.off;
    return COLIBRI_OK;
}

int colibri_arena_size(const void *blob, size_t size, size_t *out_bytes)
{
    char detail[DETAIL_CAP];
    colibri_shape s;
    int be;
    if (!blob || !out_bytes)
        return COLIBRI_E_ARG;
    int rc = check_header((const uint8_t *)blob, size, &s, &be, detail, NULL,
                          NULL, NULL);
    return rc ? rc : arena_bytes(&s, COLIBRI_CHUNK_TOKENS, out_bytes);
}

/* ------------------------------------------------------------------------ */
/* The plan: weight views and init-time tables                              */
/* ------------------------------------------------------------------------ */

static clb_weight weight_of(const uint8_t *blob, const uint8_t *en, int be,
                            uint32_t group)
{
    clb_weight w;
    int ovf = 0;
    uint64_t scales_at;
    w.dtype = en[COLIBRI_ENT_DTYPE];
    w.rows = rd32(en + COLIBRI_ENT_ROWS, be);
    w.cols = rd32(en + COLIBRI_ENT_COLS, be);
    const uint8_t *base = blob + rd64(en + COLIBRI_ENT_OFFSET, be);
    (void)section_size(w.dtype, w.rows, w.cols, group, &scales_at, &ovf);
    w.q = base;
    w.scales = w.dtype == COLIBRI_DTYPE_F32 ? NULL
                                            : (const float *)(base + scales_at);
    return w;
}

/* Point every tensor view of the plan into a validated blob, and compute the
 * RoPE tables in double precision (then rounded to float) so every libm
 * gives the same table. */
static void build_plan(clb_plan *p, const uint8_t *blob, int be,
                       const colibri_kernels *k)
{
    const colibri_shape *s = &p->s;
    const uint8_t *tab = blob + COLIBRI_TABLE_OFFSET;
    p->k = k;
    p->attn_scale = (float)(1.0 / sqrt((double)s->head_dim));
    for (uint32_t i = 0; i < s->n_tensors; i++) {
        const uint8_t *en = tab + (size_t)i * COLIBRI_ENTRY_SIZE;
        unsigned kind = rd16(en + COLIBRI_ENT_KIND, be);
        unsigned l = rd16(en + COLIBRI_ENT_LAYER, be);
        unsigned e = rd16(en + COLIBRI_ENT_EXPERT, be);
        if (kind < 1 || kind > COLIBRI_KIND_MAX)
            continue; /* unknown, non-critical: not used */
        clb_weight w = weight_of(blob, en, be, s->group_size);
        clb_layer *L = kind == COLIBRI_KIND_EMBED || kind >= COLIBRI_KIND_FINAL_NORM
                           ? NULL : (clb_layer *)&p->layers[l];
        clb_expert *X = L && e != COLIBRI_NO_EXPERT ? (clb_expert *)&L->experts[e] : NULL;
        switch (kind) {
        case COLIBRI_KIND_EMBED: p->embed = w; break;
        case COLIBRI_KIND_ATTN_NORM: L->attn_norm = (const float *)w.q; break;
        case COLIBRI_KIND_WQ: L->wq = w; break;
        case COLIBRI_KIND_WK: L->wk = w; break;
        case COLIBRI_KIND_WV: L->wv = w; break;
        case COLIBRI_KIND_WO: L->wo = w; break;
        case COLIBRI_KIND_FFN_NORM: L->ffn_norm = (const float *)w.q; break;
        case COLIBRI_KIND_ROUTER: L->router = w; break;
        case COLIBRI_KIND_EXPERT_W1: X->w1 = w; break;
        case COLIBRI_KIND_EXPERT_W3: X->w3 = w; break;
        case COLIBRI_KIND_EXPERT_W2: X->w2 = w; break;
        case COLIBRI_KIND_FINAL_NORM: p->final_norm = (const float *)w.q; break;
        default: p->lm_head = w; break;
        }
    }
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

static const colibri_kernels *pick_kernels(void)
{
    const colibri_kernels *k = NULL;
#ifndef COLIBRI_KERNELS_REF_ONLY
#ifdef COLIBRI_USE_AVX2
    k = colibri_kernels_avx2();
#endif
#ifdef COLIBRI_USE_NEON
    if (!k)
        k = colibri_kernels_neon();
#endif
#endif
    return k ? k : colibri_kernels_ref();
}

/* ------------------------------------------------------------------------ */
/* Memory and files (absent from COLIBRI_STATIC_WORKBUF builds)             */
/* ------------------------------------------------------------------------ */

#ifndef COLIBRI_STATIC_WORKBUF
/* malloc n bytes aligned to 64; *base receives what to free. */
static void *alloc64(size_t n, void **base)
{
    if (n > SIZE_MAX - 64)
        return NULL;
    *base = malloc(n + 64);
    if (!*base)
        return NULL;
    return (void *)(((uintptr_t)*base + 63) & ~(uintptr_t)63);
}

/* Memory for the model's own copy of the file (read, or byte-swapped), n
 * bytes aligned to 64. On Linux, from 2 MiB: an anonymous mapping aligned to
 * 2 MiB and advised MADV_HUGEPAGE (recorded in v->huge for munmap), so that
 * transparent huge pages can back it where the system allows ("madvise" or
 * "always"); the advice failing is harmless. Else malloc (v->owned_blob). */
#define CLB_HUGE_PAGE ((size_t)2 << 20)
#if defined(__linux__) && defined(MADV_HUGEPAGE)
#define CLB_HUGE_ALLOC 1
#else
#define CLB_HUGE_ALLOC 0
#endif
static void *alloc_blob(struct colibri_model_private_ *v, size_t n)
{
#if CLB_HUGE_ALLOC
    if (n >= CLB_HUGE_PAGE && n <= SIZE_MAX - CLB_HUGE_PAGE) {
        void *map = mmap(NULL, n + CLB_HUGE_PAGE, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map != MAP_FAILED) {
            uintptr_t a = ((uintptr_t)map + CLB_HUGE_PAGE - 1) & ~(uintptr_t)(CLB_HUGE_PAGE - 1);
            (void)madvise((void *)a, n, MADV_HUGEPAGE);
            v->huge = map;
            v->huge_size = n + CLB_HUGE_PAGE;
            return (void *)a;
        }
    }
#endif
    return alloc64(n, &v->owned_blob);
}

/* Swap every section's data of a validated file in place (values by their
 * width, float32 scales by 4). The header and table stay as stored. */
static void swap_sections(uint8_t *b, const colibri_shape *s, int be)
{
    const uint8_t *tab = b + COLIBRI_TABLE_OFFSET;
    for (uint32_t i = 0; i < s->n_tensors; i++) {
        const uint8_t *en = tab + (size_t)i * COLIBRI_ENTRY_SIZE;
        unsigned kind = rd16(en + COLIBRI_ENT_KIND, be);
        if (kind < 1 || kind > COLIBRI_KIND_MAX)
            continue; /* unknown layout: never used, left as stored */
        clb_weight w = weight_of(b, en, be, s->group_size);
        uint8_t *q = (uint8_t *)w.q;
        uint64_t n = (uint64_t)w.rows * w.cols, n_scales = 0;
        unsigned width = w.dtype == COLIBRI_DTYPE_F32 ? 4
                       : w.dtype == COLIBRI_DTYPE_I16_ROW ? 2 : 1;
        if (w.dtype == COLIBRI_DTYPE_I8_GROUP)
            n_scales = (uint64_t)w.rows * ((w.cols + s->group_size - 1) / s->group_size);
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
        for (uint64_t v = 0; v < n_scales; v++) {
            uint8_t *x = sc + v * 4, t0 = x[0], t1 = x[1];
            x[0] = x[3];
            x[1] = x[2];
            x[2] = t1;
            x[3] = t0;
        }
    }
}
#endif

/* ------------------------------------------------------------------------ */
/* Instance lifecycle                                                       */
/* ------------------------------------------------------------------------ */

/* Release owned memory, keep the error detail (for failed inits). */
static void release(colibri_model *m)
{
    struct colibri_model_private_ *v = &m->priv_;
#ifndef COLIBRI_STATIC_WORKBUF
#if COLIBRI_ENABLE_MMAP
    if (v->map)
        munmap(v->map, v->map_size);
#endif
#if CLB_HUGE_ALLOC
    if (v->huge)
        munmap(v->huge, v->huge_size);
#endif
    free(v->owned_blob);
    free(v->owned_arena);
#endif
    char keep[DETAIL_CAP];
    memcpy(keep, v->detail, DETAIL_CAP);
    memset(v, 0, sizeof *v);
    memcpy(v->detail, keep, DETAIL_CAP);
}

void colibri_free(colibri_model *m)
{
    if (!m)
        return;
    release(m);
    m->priv_.detail[0] = '\0';
}

/* Give m an arena for its shape (caller's or allocated) and build its plan
 * over m->priv_.blob (validated, host-order data). */
static int attach_arena(colibri_model *m, void *arena, size_t arena_size)
{
    struct colibri_model_private_ *v = &m->priv_;
    size_t need;
    /* Larger chunks mean a faster prefill (each expert's weights stream once
     * per chunk). An arena we allocate gets COLIBRI_CHUNK_TOKENS_OWNED; a
     * caller's arena gets it too when it is large enough, else the
     * COLIBRI_CHUNK_TOKENS that colibri_arena_size promises. The chunk is a
     * function of the arena size, so equal arenas compute equal bits. */
    uint32_t chunk_limit = COLIBRI_CHUNK_TOKENS_OWNED;
    int rc = arena_bytes(&v->shape, chunk_limit, &need);
    if (arena && (rc || arena_size < need)) {
        chunk_limit = COLIBRI_CHUNK_TOKENS;
        rc = arena_bytes(&v->shape, chunk_limit, &need);
    }
    if (rc) {
        fmt_detail(v->detail, DETAIL_CAP, "the arena this model needs does not "
                   "fit in the address space");
        return rc;
    }
    if (arena) {
        if ((uintptr_t)arena % COLIBRI_ARENA_ALIGN) {
            fmt_detail(v->detail, DETAIL_CAP, "arena is not %u-byte aligned",
                       (unsigned)COLIBRI_ARENA_ALIGN);
            return COLIBRI_E_ALIGN;
        }
        if (arena_size < need) {
            fmt_detail(v->detail, DETAIL_CAP, "arena of %llu bytes, the model "
                       "needs %llu", (unsigned long long)arena_size,
                       (unsigned long long)need);
            return COLIBRI_E_ARENA_TOO_SMALL;
        }
    } else {
#ifdef COLIBRI_STATIC_WORKBUF
        fmt_detail(v->detail, DETAIL_CAP, "static work-buffer build: the caller "
                   "must supply an arena of %llu bytes", (unsigned long long)need);
        return COLIBRI_E_ARG;
#else
        arena = alloc64(need, &v->owned_arena);
        if (!arena) {
            fmt_detail(v->detail, DETAIL_CAP, "cannot allocate an arena of %llu "
                       "bytes", (unsigned long long)need);
            return COLIBRI_E_NO_MEMORY;
        }
        arena_size = need;
#endif
    }
    memset(arena, 0, need);
    carver c = { (uint8_t *)arena, 0, 0 };
    clb_plan *p;
    layout(&c, &v->shape, chunk_limit, &p);
    build_plan(p, v->blob, v->file_big_endian, pick_kernels());
    v->arena = arena;
    v->arena_size = arena_size;
    v->plan = p;
    v->kernels = p->k;
    v->cached_len = 0;
    v->cached_batch = 0;
    v->magic = MODEL_MAGIC;
    return COLIBRI_OK;
}

int colibri_init_from_memory(colibri_model *m, const void *blob, size_t size,
                             void *arena, size_t arena_size)
{
    if (!m)
        return COLIBRI_E_ARG;
    memset(&m->priv_, 0, sizeof m->priv_);
    struct colibri_model_private_ *v = &m->priv_;
    if (!blob) {
        fmt_detail(v->detail, DETAIL_CAP, "blob is NULL");
        return COLIBRI_E_ARG;
    }
    if ((uintptr_t)blob % COLIBRI_BLOB_ALIGN) {
        fmt_detail(v->detail, DETAIL_CAP, "blob is not %u-byte aligned",
                   (unsigned)COLIBRI_BLOB_ALIGN);
        return COLIBRI_E_ALIGN;
    }
    int be;
    int rc = validate((const uint8_t *)blob, size, &v->shape, &be, v->detail,
                      NULL, NULL, NULL);
    if (rc)
        return rc;
    if (be != host_is_big_endian()) {
        fmt_detail(v->detail, DETAIL_CAP, "the file is %s-endian, this host "
                   "%s-endian; zero-copy needs the host order (colibri convert "
                   "--byte-order %s)", be ? "big" : "little",
                   be ? "little" : "big", be ? "little" : "big");
        return COLIBRI_E_BYTE_ORDER;
    }
    v->blob = (const uint8_t *)blob;
    v->blob_size = size;
    v->file_big_endian = (uint8_t)be;
    v->load_mode = LOAD_MEMORY;
    rc = attach_arena(m, arena, arena_size);
    if (rc)
        release(m);
    return rc;
}

#ifndef COLIBRI_STATIC_WORKBUF
/* Bring the file's bytes into memory: mapped (read-only) or read. */
static int load_file(colibri_model *m, const char *path)
{
    struct colibri_model_private_ *v = &m->priv_;
#if COLIBRI_ENABLE_MMAP
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        fmt_detail(v->detail, DETAIL_CAP, "cannot open %s", path);
        return COLIBRI_E_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 0 ||
        (uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        fmt_detail(v->detail, DETAIL_CAP, "cannot stat %s", path);
        return COLIBRI_E_IO;
    }
    size_t size = (size_t)st.st_size;
    if (size < COLIBRI_HEADER_SIZE) { /* mmap of 0 bytes fails: say why */
        close(fd);
        fmt_detail(v->detail, DETAIL_CAP, "file is %llu bytes, shorter than the "
                   "%u-byte header (truncated?)", (unsigned long long)size,
                   (unsigned)COLIBRI_HEADER_SIZE);
        return COLIBRI_E_BAD_FORMAT;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        fmt_detail(v->detail, DETAIL_CAP, "cannot map %s", path);
        return COLIBRI_E_IO;
    }
    v->map = map;
    v->map_size = size;
    v->blob = (const uint8_t *)map;
    v->blob_size = size;
    v->load_mode = LOAD_MMAP;
    return COLIBRI_OK;
#else
    FILE *f = fopen(path, "rb");
    if (!f) {
        fmt_detail(v->detail, DETAIL_CAP, "cannot open %s", path);
        return COLIBRI_E_IO;
    }
    long end = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        end = ftell(f);
    if (end < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        fmt_detail(v->detail, DETAIL_CAP, "cannot size %s", path);
        return COLIBRI_E_IO;
    }
    size_t size = (size_t)end;
    uint8_t *buf = (uint8_t *)alloc_blob(v, size ? size : 1);
    if (!buf) {
        fclose(f);
        fmt_detail(v->detail, DETAIL_CAP, "cannot allocate %llu bytes for %s",
                   (unsigned long long)size, path);
        return COLIBRI_E_NO_MEMORY;
    }
    size_t got = fread(buf, 1, size, f);
    fclose(f);
    if (got != size) {
        fmt_detail(v->detail, DETAIL_CAP, "short read of %s", path);
        return COLIBRI_E_IO;
    }
    v->blob = buf;
    v->blob_size = size;
    v->load_mode = LOAD_READ;
    return COLIBRI_OK;
#endif
}

/* The file is in the other byte order: swap its sections into memory we
 * own (the mapping, if any, is released). */
static int make_host_order(colibri_model *m, int be)
{
    struct colibri_model_private_ *v = &m->priv_;
    uint8_t *dst = (uint8_t *)v->blob;
    if (!v->owned_blob && !v->huge) {
        dst = (uint8_t *)alloc_blob(v, v->blob_size);
        if (!dst) {
            fmt_detail(v->detail, DETAIL_CAP, "cannot allocate %llu bytes to "
                       "byte-swap the %s-endian file",
                       (unsigned long long)(v->blob_size),
                       be ? "big" : "little");
            return COLIBRI_E_NO_MEMORY;
        }
        memcpy(dst, v->blob, v->blob_size);
#if COLIBRI_ENABLE_MMAP
        if (v->map)
            munmap(v->map, v->map_size);
#endif
        v->map = NULL;
        v->blob = dst;
    }
    swap_sections(dst, &v->shape, be);
    v->byte_swapped = 1;
    return COLIBRI_OK;
}
#endif /* !COLIBRI_STATIC_WORKBUF */

int colibri_init(colibri_model *m, const char *path)
{
    if (!m)
        return COLIBRI_E_ARG;
    memset(&m->priv_, 0, sizeof m->priv_);
#ifdef COLIBRI_STATIC_WORKBUF
    (void)path;
    fmt_detail(m->priv_.detail, DETAIL_CAP, "static work-buffer build: load "
               "with colibri_init_from_memory and a caller arena");
    return COLIBRI_E_UNSUPPORTED;
#else
    struct colibri_model_private_ *v = &m->priv_;
    if (!path) {
        fmt_detail(v->detail, DETAIL_CAP, "path is NULL");
        return COLIBRI_E_ARG;
    }
    int rc = load_file(m, path);
    int be = 0;
    if (rc == COLIBRI_OK)
        rc = validate(v->blob, v->blob_size, &v->shape, &be, v->detail, NULL,
                      NULL, NULL);
    v->file_big_endian = (uint8_t)be;
    if (rc == COLIBRI_OK && be != host_is_big_endian())
        rc = make_host_order(m, be);
    if (rc == COLIBRI_OK)
        rc = attach_arena(m, NULL, 0);
    if (rc)
        release(m);
    return rc;
#endif
}

int colibri_share(colibri_model *m, const colibri_model *owner, void *arena,
                  size_t arena_size)
{
    if (!m || !owner || m == owner)
        return COLIBRI_E_ARG;
    memset(&m->priv_, 0, sizeof m->priv_);
    if (owner->priv_.magic != MODEL_MAGIC) {
        fmt_detail(m->priv_.detail, DETAIL_CAP, "the owner model is not "
                   "initialised");
        return COLIBRI_E_NOT_INIT;
    }
    const struct colibri_model_private_ *o = &owner->priv_;
    struct colibri_model_private_ *v = &m->priv_;
    v->blob = o->blob;
    v->blob_size = o->blob_size;
    v->shape = o->shape;
    v->file_big_endian = o->file_big_endian;
    v->byte_swapped = o->byte_swapped;
    v->load_mode = LOAD_SHARED;
    int rc = attach_arena(m, arena, arena_size);
    if (rc)
        release(m);
    return rc;
}

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
    if (v->magic != MODEL_MAGIC) {
        fmt_detail(v->detail, DETAIL_CAP, "the model is not initialised");
        return COLIBRI_E_NOT_INIT;
    }
    v->detail[0] = '\0'; /* a detail describes this call's failure only */
    const colibri_shape *s = &v->shape;
    if (!input_ids || !logits || batch == 0 || seq == 0) {
        fmt_detail(v->detail, DETAIL_CAP, "input_ids and logits must be non-NULL"
                   ", batch (%u) and seq (%u) >= 1", (unsigned)batch, (unsigned)seq);
        return COLIBRI_E_ARG;
    }
    if (batch > s->max_batch || seq > s->max_seq_len ||
        (uint64_t)n_past + seq > s->max_seq_len) {
        fmt_detail(v->detail, DETAIL_CAP, "batch %u, n_past %u + seq %u exceed "
                   "the model's max_batch %u / max_seq_len %u", (unsigned)batch,
                   (unsigned)n_past,
                   (unsigned)seq, (unsigned)(s->max_batch), (unsigned)(s->max_seq_len));
        return COLIBRI_E_INPUT_TOO_LARGE;
    }
    if (n_past > 0 && (n_past > v->cached_len || batch != v->cached_batch)) {
        fmt_detail(v->detail, DETAIL_CAP, "n_past %u with batch %u, but the KV "
                   "cache holds %u tokens of batch %u", (unsigned)n_past,
                   (unsigned)batch,
                   (unsigned)(v->cached_len), (unsigned)(v->cached_batch));
        return COLIBRI_E_KV_STATE;
    }
    size_t total = (size_t)batch * seq;
    for (size_t i = 0; i < total; i++) {
        if (input_ids[i] < 0 || (uint32_t)input_ids[i] >= s->vocab) {
            fmt_detail(v->detail, DETAIL_CAP, "token id at [%u, %u] is out of "
                       "range [0, %u)", (unsigned)(i / seq), (unsigned)(i % seq),
                       (unsigned)(s->vocab));
            return COLIBRI_E_TOKEN;
        }
        if (attention_mask && attention_mask[i] > 1) {
            fmt_detail(v->detail, DETAIL_CAP, "attention_mask[%u, %u] is %u, "
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
    if (v->magic != MODEL_MAGIC)
        return COLIBRI_E_NOT_INIT;
    static const char *const modes[] = { "?", "mmap", "read", "memory", "shared" };
    const clb_plan *p = (const clb_plan *)v->plan;
    memset(out, 0, sizeof *out);
    out->shape = v->shape;
    out->format_version = COLIBRI_FORMAT_VERSION;
    out->file_big_endian = v->file_big_endian;
    out->byte_swapped = v->byte_swapped;
    out->dtype_embed = p->embed.dtype;
    out->dtype_attn = p->layers[0].wq.dtype;
    out->dtype_router = p->layers[0].router.dtype;
    out->dtype_expert = p->layers[0].experts[0].w1.dtype;
    out->dtype_lm_head = p->lm_head.dtype;
    out->file_size = v->blob_size;
    out->arena_bytes = v->arena_size;
    out->chunk_tokens = p->chunk;
    out->kernels = p->k->name;
    out->load_mode = modes[v->load_mode <= LOAD_SHARED ? v->load_mode : 0];
    out->huge_pages_advised = v->huge != NULL;
    const uint8_t *tab = v->blob + COLIBRI_TABLE_OFFSET;
    for (uint32_t i = 0; i < v->shape.n_tensors; i++) {
        const uint8_t *en = tab + (size_t)i * COLIBRI_ENTRY_SIZE;
        unsigned kind = rd16(en + COLIBRI_ENT_KIND, v->file_big_endian);
        if (kind < 1 || kind > COLIBRI_KIND_MAX)
            out->n_unknown_sections++;
        else
            out->n_params += (uint64_t)rd32(en + COLIBRI_ENT_ROWS, v->file_big_endian) *
                             rd32(en + COLIBRI_ENT_COLS, v->file_big_endian);
    }
    return COLIBRI_OK;
}

int colibri_router_weights(const colibri_model *m, uint32_t layer, float *out)
{
    if (!m || !out)
        return COLIBRI_E_ARG;
    if (m->priv_.magic != MODEL_MAGIC)
        return COLIBRI_E_NOT_INIT;
    const clb_plan *p = (const clb_plan *)m->priv_.plan;
    if (layer >= p->s.n_layers)
        return COLIBRI_E_ARG;
    const clb_weight *w = &p->layers[layer].router;
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
    return f;
}
