/*
 * format.h - the .colibri file checks (format.c) other runtime files call:
 * validation of a whole file, of the header alone (for the arena size), and
 * the section size a dtype and shape imply. Not installed.
 */
#ifndef COLIBRI_FORMAT_CHECKS_H
#define COLIBRI_FORMAT_CHECKS_H

#include "colibri.h"
#include "colibri_format.h"
#include "support.h"
#include "kernels/kernels.h" /* the block geometry: clb_block_cols, _bytes, _scales */

/* Bytes of one row of a block-type matrix of `cols` columns. */
static inline size_t clb_block_row_bytes(unsigned dtype, uint32_t cols)
{
    uint32_t b = clb_block_cols(dtype);
    return b ? (size_t)((cols + b - 1) / b) * clb_block_bytes(dtype) : 0;
}

/* colibri_verify's callback: index -2 header, -1 table, >= 0 a tensor, -3
 * the error that stopped the check. */
typedef void (*bad_cb)(void *user, int index, const char *what);

/* Header: magic, bom, version, header_crc, every field's range, flags.
 * Fills *s and *be (1: the file is big-endian). With cb set, a CRC mismatch
 * is reported and counted in *nbad instead of returned. */
int clb_check_header(const uint8_t *b, size_t size, colibri_shape *s,
                     int *be, char *detail, bad_cb cb, void *user,
                     uint32_t *nbad);

/* What the model computes (FORMAT.md 2-3): a version 1 file is Mixtral
 * (renormalised top-k, 1/sqrt(head_dim), no multipliers); a version 2 file
 * says it in the header's flags and its DESC section. The DESC section is
 * never byte-swapped: its words are read in file order, like the header. */
typedef struct clb_desc {
    uint16_t version;        /* the file's format version */
    uint32_t features;       /* COLIBRI_FEAT_* */
    uint32_t shared_inter;   /* shared expert width, 0 without one */
    uint32_t dense_inter;    /* dense FFN width, 0 without dense layers */
    float embed_scale;       /* x = EMBED[token] * embed_scale */
    float attn_scale;        /* scores = q.k * attn_scale */
    float residual_scale;    /* x += branch * residual_scale */
    float logits_div;        /* logits = LM_HEAD . x / logits_div */
    float clip_qkv;          /* > 0: q, k, v clamped to [-clip, clip] */
    const uint8_t *layers;   /* DESC word 8 as stored (NULL: no DESC) */
    int be;                  /* the file's byte order, for layers */
    /* ENC_DEC only (0 / 1 otherwise): file layers [0, encoder_layers) are
     * the encoder's; top-1 expert capacity per sequence of one call; the
     * decoder's start token; the LM head's input scale. */
    uint32_t encoder_layers;
    uint32_t expert_capacity;
    uint32_t decoder_start;
    float lm_scale;
} clb_desc;

/* 1 if layer l is a decoder layer of an ENC_DEC file (has cross-attention). */
int clb_desc_decoder_layer(const clb_desc *d, uint32_t layer);

/* 1 if layer l is a dense SwiGLU layer (d->layers' word is 1.0f). */
int clb_desc_dense(const clb_desc *d, uint32_t layer);

/* Fill *d from a file whose header passed clb_check_header: defaults for
 * version 1; for version 2 entry 0 must be the DESC, in bounds, its CRC
 * right and every word in range. Reads only the header, entry 0 and the
 * DESC section (colibri_arena_size calls it without validating the rest). */
int clb_check_desc(const uint8_t *b, size_t size, const colibri_shape *s,
                   int be, clb_desc *d, char *detail);

/* The whole of FORMAT.md 3 on the bytes as stored (header, table, every
 * section's CRC and floats). detail gets DETAIL_CAP bytes; *d (if not
 * NULL) the description. */
int clb_validate(const uint8_t *b, size_t size, colibri_shape *s, int *be,
                 clb_desc *d, char *detail, bad_cb cb, void *user,
                 uint32_t *nbad);

/* COLIBRI_E_BAD_FORMAT (detail set) when the tensor table of s's n_tensors
 * entries ends past a file of `size` bytes, else COLIBRI_OK. */
int clb_check_table_end(const colibri_shape *s, uint64_t size, char *detail);

/* The bytes of a file before its first section after the DESC: header,
 * table and (version 2) the DESC section, from a header that passed
 * clb_check_header. What a streamed instance reads first. */
uint64_t clb_prefix_bytes(const uint8_t *hdr, const colibri_shape *s, int be);

/* clb_validate without the sections' CRCs and floats, on a buffer holding
 * only the file's first clb_prefix_bytes bytes (size is the whole file's:
 * offsets and sizes are checked against it). */
int clb_validate_prefix(const uint8_t *b, size_t size, colibri_shape *s,
                        int *be, clb_desc *d, char *detail);

/* One section's CRC, then its floats (every float32 value or scale finite),
 * at `sec` wherever the section now lies; en is its table entry, index its
 * number for the detail. COLIBRI_OK, _CRC, _BAD_FORMAT. */
int clb_check_section(const uint8_t *sec, const uint8_t *en, uint32_t index,
                      uint32_t group, int be, char *detail);

/* Section size of a dtype (FORMAT.md 4), overflow-checked (*ovf sticky);
 * where the scales start within the section in *scales_at. */
uint64_t clb_section_size(unsigned dtype, uint32_t rows, uint32_t cols,
                          uint32_t group, uint64_t *scales_at, int *ovf);

#endif /* COLIBRI_FORMAT_CHECKS_H */
