/*
 * colibri_format.h - the constants of the .colibri file format, versions 1
 * and 2, exactly as docs/FORMAT.md states them. Nothing here is tunable: changing a
 * value changes the file format. tests/test_runtime_format_consts.py parses
 * every `#define COLIBRI_...` of this file and checks it against
 * colibri/file/format.py, so keep one plain integer (or string) per define.
 *
 * All multi-byte fields are stored in the file's byte order (FORMAT.md 1);
 * offsets below are byte offsets from the start of the header or the entry.
 */
#ifndef COLIBRI_FORMAT_H
#define COLIBRI_FORMAT_H

/* --- File-level constants (FORMAT.md 1, 2) ------------------------------- */
#define COLIBRI_MAGIC "CLBR"            /* bytes 43 4C 42 52 at offset 0 */
#define COLIBRI_MAGIC_SIZE 4
#define COLIBRI_FORMAT_VERSION 2        /* the newest version this reader accepts */
#define COLIBRI_FORMAT_VERSION_MIN 1    /* the oldest: version 1 files still load */
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
#define COLIBRI_HDR_FLAGS 56            /* u32: 0 in version 1, COLIBRI_FEAT_* in 2 */
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
/* Version 2 (FORMAT.md 3): the model description, then what the features
 * need. Biases and norms are vectors [1, n]. */
#define COLIBRI_KIND_DESC 14            /* F32 [1, 8 + n_layers], first entry */
#define COLIBRI_KIND_BQ 15              /* [1, n_heads*head_dim] */
#define COLIBRI_KIND_BK 16              /* [1, n_kv_heads*head_dim] */
#define COLIBRI_KIND_BV 17              /* [1, n_kv_heads*head_dim] */
#define COLIBRI_KIND_BO 18              /* [1, hidden] */
#define COLIBRI_KIND_Q_NORM 19          /* [1, head_dim] per head, or [1, qdim] */
#define COLIBRI_KIND_K_NORM 20          /* [1, head_dim] per head, or [1, kvdim] */
#define COLIBRI_KIND_SHARED_GATE 21     /* [1, hidden] */
#define COLIBRI_KIND_SHARED_W1 22       /* [shared_intermediate, hidden] */
#define COLIBRI_KIND_SHARED_W3 23       /* [shared_intermediate, hidden] */
#define COLIBRI_KIND_SHARED_W2 24       /* [hidden, shared_intermediate] */
#define COLIBRI_KIND_DENSE_W1 25        /* [dense_intermediate, hidden] */
#define COLIBRI_KIND_DENSE_W3 26        /* [dense_intermediate, hidden] */
#define COLIBRI_KIND_DENSE_W2 27        /* [hidden, dense_intermediate] */
/* Encoder-decoder (ENC_DEC): layers [0, encoder_layers) are the encoder. */
#define COLIBRI_KIND_ENC_POS_BIAS 28    /* [n_heads, 2*max_seq_len-1]: rel+L-1 */
#define COLIBRI_KIND_DEC_POS_BIAS 29    /* [n_heads, max_seq_len]: distance */
#define COLIBRI_KIND_XATTN_NORM 30      /* decoder layers: [1, hidden] */
#define COLIBRI_KIND_XWQ 31             /* cross-attention, as WQ */
#define COLIBRI_KIND_XWK 32             /* as WK, applied to the encoder output */
#define COLIBRI_KIND_XWV 33             /* as WV, applied to the encoder output */
#define COLIBRI_KIND_XWO 34             /* as WO */
#define COLIBRI_KIND_ENC_FINAL_NORM 35  /* [1, hidden] */
#define COLIBRI_KIND_MAX 35             /* highest kind this reader knows */

/* --- Feature flags: the header's flags field in version 2 (FORMAT.md 2) -- */
#define COLIBRI_FEAT_ROUTER_RENORM 0x1  /* top-k weights renormalised to sum 1 */
#define COLIBRI_FEAT_QK_NORM_HEAD 0x2   /* RMSNorm over each head of q and k */
#define COLIBRI_FEAT_QK_NORM_PROJ 0x4   /* RMSNorm over the whole q and k */
#define COLIBRI_FEAT_BIAS_QKV 0x8       /* BQ, BK, BV */
#define COLIBRI_FEAT_BIAS_O 0x10        /* BO */
#define COLIBRI_FEAT_SHARED_EXPERT 0x20 /* SHARED_W1/W3/W2 in MoE layers */
#define COLIBRI_FEAT_SHARED_GATE 0x40   /* sigmoid(SHARED_GATE . x) scales it */
#define COLIBRI_FEAT_CLIP_QKV 0x80      /* q, k, v clamped to +-clip_qkv */
#define COLIBRI_FEAT_DENSE_LAYERS 0x100 /* some layers are a dense SwiGLU */
#define COLIBRI_FEAT_RELU_FFN 0x200     /* FFNs are W2 . relu(W1 . x), no W3 */
#define COLIBRI_FEAT_ENC_DEC 0x400      /* encoder-decoder (Switch, T5) */
#define COLIBRI_FEAT_TIED_LM_HEAD 0x800 /* no LM_HEAD: the LM head is EMBED */
#define COLIBRI_FEAT_ALL 0xFFF          /* every bit this reader knows */

/* --- DESC section: float32 words (FORMAT.md 3), read in file order ------ */
#define COLIBRI_DESC_SHARED_INTERMEDIATE 0  /* integer valued, 0 = none */
#define COLIBRI_DESC_DENSE_INTERMEDIATE 1   /* integer valued, 0 = none */
#define COLIBRI_DESC_EMBED_SCALE 2          /* embedding multiplier */
#define COLIBRI_DESC_ATTN_SCALE 3           /* score multiplier */
#define COLIBRI_DESC_RESIDUAL_SCALE 4       /* every branch's multiplier */
#define COLIBRI_DESC_LOGITS_DIVISOR 5       /* logits are divided by it */
#define COLIBRI_DESC_CLIP_QKV 6             /* > 0 with CLIP_QKV, else 0 */
#define COLIBRI_DESC_RESERVED 7             /* 0 */
#define COLIBRI_DESC_LAYERS 8               /* word 8 + l: 1 dense, 0 MoE */
#define COLIBRI_DESC_MAX_INTERMEDIATE 16777216 /* 2^24: exact in float32 */
/* With ENC_DEC, 8 words follow the layer words: word 8 + n_layers + i. */
#define COLIBRI_DESCX_ENCODER_LAYERS 0      /* integer 1..n_layers-1 */
#define COLIBRI_DESCX_EXPERT_CAPACITY 1     /* integer 1..2^24, per sequence */
#define COLIBRI_DESCX_DECODER_START 2       /* integer 0..vocab-1 */
#define COLIBRI_DESCX_LM_SCALE 3            /* LM head input scale, > 0 */
#define COLIBRI_DESCX_WORDS 8               /* 4..7 reserved, 0 */

/* --- Storage types (FORMAT.md 4) ---------------------------------------- */
#define COLIBRI_DTYPE_F32 0
#define COLIBRI_DTYPE_I8_GROUP 1
#define COLIBRI_DTYPE_I16_ROW 2
/* Block types: llama.cpp's (GGUF's) blocks byte for byte, fp16 scales
 * (FORMAT.md 4). Ids 3-7 were float32-scale blocks (converters before
 * 2026-12-05): retired, a reader refuses them with "re-convert". */
#define COLIBRI_DTYPE_RETIRED_MIN 3
#define COLIBRI_DTYPE_RETIRED_MAX 7
#define COLIBRI_DTYPE_Q4_0 8   /* 32 columns, 18 bytes */
#define COLIBRI_DTYPE_Q4_K 9   /* 256 columns, 144 bytes */
#define COLIBRI_DTYPE_Q6_K 10  /* 256 columns, 210 bytes */
#define COLIBRI_DTYPE_Q5_0 11  /* 32 columns, 22 bytes */
#define COLIBRI_DTYPE_Q5_K 12  /* 256 columns, 176 bytes */
#define COLIBRI_DTYPE_Q8_0 13  /* 32 columns, 34 bytes */
#define COLIBRI_DTYPE_MAX 13
#define COLIBRI_Q4_0_COLS 32     /* columns of a Q4_0, Q5_0 or Q8_0 block */
#define COLIBRI_Q4_0_BYTES 18    /* f16 d, u8 qs[16] at 2 */
#define COLIBRI_Q5_0_BYTES 22    /* f16 d, u8 qh[4] at 2, u8 qs[16] at 6 */
#define COLIBRI_Q8_0_BYTES 34    /* f16 d, i8 qs[32] at 2 */
#define COLIBRI_QK_COLS 256      /* columns of a Q4_K, Q5_K or Q6_K block */
#define COLIBRI_Q4_K_BYTES 144   /* f16 d, f16 dmin, u8 scales[12] at 4, u8 qs[128] at 16 */
#define COLIBRI_Q5_K_BYTES 176   /* Q4_K's fields, then u8 qh[32] at 16, qs[128] at 48 */
#define COLIBRI_Q6_K_BYTES 210   /* u8 ql[128], u8 qh[64] at 128, i8 scales[16] at 192, f16 d at 208 */
#define COLIBRI_Q6_K_D 208       /* Q6_K's d: the only block whose scale ends it */

#endif /* COLIBRI_FORMAT_H */
