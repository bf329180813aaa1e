/*
 * colibri_format.h - the constants of the .colibri file format, version 1,
 * exactly as docs/FORMAT.md states them. Nothing here is tunable: changing a
 * value changes the file format. tests/test_runtime_format_consts.py parses
 * every `#define COLIBRI_...` of this file and checks it against
 * colibri/format.py, so keep one plain integer (or string) per define.
 *
 * All multi-byte fields are stored in the file's byte order (FORMAT.md 1);
 * offsets below are byte offsets from the start of the header or the entry.
 */
#ifndef COLIBRI_FORMAT_H
#define COLIBRI_FORMAT_H

/* --- File-level constants (FORMAT.md 1, 2) ------------------------------- */
#define COLIBRI_MAGIC "CLBR"            /* bytes 43 4C 42 52 at offset 0 */
#define COLIBRI_MAGIC_SIZE 4
#define COLIBRI_FORMAT_VERSION 1        /* the only version this reader accepts */
#define COLIBRI_BOM 0xFEFF              /* byte-order mark, in file order */
#define COLIBRI_SECTION_ALIGN 64        /* every section starts at a multiple */
#define COLIBRI_HEADER_SIZE 64
#define COLIBRI_ENTRY_SIZE 40           /* one tensor-table entry */
#define COLIBRI_TABLE_OFFSET 64         /* the table follows the header */

/* --- Header field offsets (FORMAT.md 2) --------------------------------- */
#define COLIBRI_HDR_MAGIC 0             /* char[4] */
#define COLIBRI_HDR_VERSION 4           /* u16 */
#define COLIBRI_HDR_BOM 6               /* u16 */
#define COLIBRI_HDR_VOCAB 8             /* u32 */
#define COLIBRI_HDR_HIDDEN 12           /* u32 */
#define COLIBRI_HDR_INTERMEDIATE 16     /* u32 */
#define COLIBRI_HDR_MAX_SEQ_LEN 20      /* u32 */
#define COLIBRI_HDR_N_LAYERS 24         /* u16 */
#define COLIBRI_HDR_N_HEADS 26          /* u16 */
#define COLIBRI_HDR_N_KV_HEADS 28       /* u16 */
#define COLIBRI_HDR_HEAD_DIM 30         /* u16 */
#define COLIBRI_HDR_N_EXPERTS 32        /* u16 */
#define COLIBRI_HDR_TOP_K 34            /* u16 */
#define COLIBRI_HDR_MAX_BATCH 36        /* u16 */
#define COLIBRI_HDR_GROUP_SIZE 38       /* u16 */
#define COLIBRI_HDR_ROPE_THETA 40       /* f32 */
#define COLIBRI_HDR_RMS_EPS 44          /* f32 */
#define COLIBRI_HDR_N_TENSORS 48        /* u32 */
#define COLIBRI_HDR_TABLE_CRC 52        /* u32 */
#define COLIBRI_HDR_FLAGS 56            /* u32, 0 in version 1 */
#define COLIBRI_HDR_HEADER_CRC 60       /* u32, CRC32 of bytes 0..59 */

/* --- Tensor-table entry field offsets (FORMAT.md 3) --------------------- */
#define COLIBRI_ENT_KIND 0              /* u16 */
#define COLIBRI_ENT_DTYPE 2             /* u8 */
#define COLIBRI_ENT_FLAGS 3             /* u8 */
#define COLIBRI_ENT_LAYER 4             /* u16 */
#define COLIBRI_ENT_EXPERT 6            /* u16 */
#define COLIBRI_ENT_ROWS 8              /* u32 */
#define COLIBRI_ENT_COLS 12             /* u32 */
#define COLIBRI_ENT_OFFSET 16           /* u64 */
#define COLIBRI_ENT_SIZE 24             /* u64 */
#define COLIBRI_ENT_CRC 32              /* u32 */
#define COLIBRI_ENT_RESERVED 36         /* u32, 0 */

#define COLIBRI_NO_LAYER 0xFFFF         /* tensor outside the layers */
#define COLIBRI_NO_EXPERT 0xFFFF        /* tensor outside the experts */
#define COLIBRI_ENTRY_FLAG_CRITICAL 1   /* unknown kind with this bit: refuse */

/* --- Tensor kinds (FORMAT.md 3) ----------------------------------------- */
#define COLIBRI_KIND_EMBED 1
#define COLIBRI_KIND_ATTN_NORM 2
#define COLIBRI_KIND_WQ 3
#define COLIBRI_KIND_WK 4
#define COLIBRI_KIND_WV 5
#define COLIBRI_KIND_WO 6
#define COLIBRI_KIND_FFN_NORM 7
#define COLIBRI_KIND_ROUTER 8
#define COLIBRI_KIND_EXPERT_W1 9
#define COLIBRI_KIND_EXPERT_W3 10
#define COLIBRI_KIND_EXPERT_W2 11
#define COLIBRI_KIND_FINAL_NORM 12
#define COLIBRI_KIND_LM_HEAD 13
#define COLIBRI_KIND_MAX 13             /* highest kind version 1 knows */

/* --- Storage types (FORMAT.md 4) ---------------------------------------- */
#define COLIBRI_DTYPE_F32 0
#define COLIBRI_DTYPE_I8_GROUP 1
#define COLIBRI_DTYPE_I16_ROW 2

#endif /* COLIBRI_FORMAT_H */
