/*
 * internal.h - the plan and the functions that build and run it, shared by
 * plan.c (arena layout, weight views), load.c (instance lifecycle),
 * forward.c (the infer loop), tensor.c (embedding, norms, RoPE, attention,
 * linear layers), moe.c (router, top-k, dispatch, experts) and info.c.
 * The file checks are format.h's. Not installed, not public.
 *
 * Everything an inference touches hangs off one clb_plan, which lives at the
 * start of the instance's arena: pointers into the (read-only) file for the
 * weights, pointers into the arena for the mutable buffers. Shapes in the
 * comments use C = plan->chunk (tokens processed together), E = n_experts,
 * K = top_k, L = n_layers, B = max_batch, S = max_seq_len.
 */
#ifndef COLIBRI_INTERNAL_H
#define COLIBRI_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"
#include "format.h"
#include "kernels/kernels.h"
#include "threads.h"

#ifndef COLIBRI_ENABLE_MMAP
#define COLIBRI_ENABLE_MMAP 1
#endif
/* The library's own POSIX reader of a streamed file (open, pread, O_DIRECT,
 * clock_gettime: colibri_init_ex with a budget). Every hosted Unix build has
 * it, whether colibri_init maps the file or reads it: without it a budget
 * needs colibri_init_stream and the caller's reader. */
#ifndef COLIBRI_ENABLE_POSIX_IO
#if COLIBRI_ENABLE_MMAP || defined(__unix__) || defined(__APPLE__)
#define COLIBRI_ENABLE_POSIX_IO 1
#else
#define COLIBRI_ENABLE_POSIX_IO 0
#endif
#endif

/* Builds whose library reader has a thread (load.c's CLB_READER_THREAD, stream.c):
 * the only reader a prefetch overlaps with compute, so the prefetch's code
 * is in these builds only (bare metal has none of it). */
#if !defined(COLIBRI_STATIC_WORKBUF) && COLIBRI_ENABLE_POSIX_IO && COLIBRI_THREADS
#define CLB_STREAM_PREFETCH 1
#else
#define CLB_STREAM_PREFETCH 0
#endif
/* The library's own reader on Linux maps the file it streams (stream.h
 * clb_stream_map): the code that uses a mapping is in these builds only. */
#if !defined(COLIBRI_STATIC_WORKBUF) && COLIBRI_ENABLE_POSIX_IO && defined(__linux__)
#define CLB_STREAM_MAP 1
#else
#define CLB_STREAM_MAP 0
#endif

/* priv_.magic of an initialised instance ("CLBR"), and priv_.load_mode. */
#define CLB_MODEL_MAGIC 0x434C4252u
enum { CLB_LOAD_MMAP = 1, CLB_LOAD_READ = 2, CLB_LOAD_MEMORY = 3,
       CLB_LOAD_SHARED = 4, CLB_LOAD_STREAM = 5 };

/* Tokens processed together (a prefill groups each chunk's tokens by expert,
 * so each expert's weights stream once per chunk). A caller-supplied arena
 * (colibri_arena_size) is sized for COLIBRI_CHUNK_TOKENS, small enough for
 * microcontrollers; an arena the library allocates itself uses
 * COLIBRI_CHUNK_TOKENS_OWNED, which streams the weights 8x less often on a
 * 128-token prefill at a few MB of extra arena on large models. */
#ifndef COLIBRI_CHUNK_TOKENS
#define COLIBRI_CHUNK_TOKENS 16
#endif
#ifndef COLIBRI_CHUNK_TOKENS_OWNED
#define COLIBRI_CHUNK_TOKENS_OWNED 128
#endif
#if COLIBRI_CHUNK_TOKENS < 1 || COLIBRI_CHUNK_TOKENS_OWNED < 1
#error "COLIBRI_CHUNK_TOKENS and COLIBRI_CHUNK_TOKENS_OWNED must be >= 1"
#endif

/* A weight matrix [rows, cols] in the file, in host byte order. */
typedef struct clb_weight {
    const void *q;        /* F32: float[rows*cols]; I8_GROUP: int8; I16_ROW: int16;
                             Q4_0/Q5_0/Q4_K/Q5_K/Q6_K: [rows, nb] blocks (FORMAT.md 4) */
    const float *scales;  /* I8_GROUP [rows, ngroups]; I16_ROW [rows]; else NULL */
    uint32_t rows, cols;
    uint8_t dtype;        /* COLIBRI_DTYPE_* */
} clb_weight;

/* A SwiGLU FFN: a routed expert (the dispatch-table entry built at init),
 * the shared expert or a dense layer's FFN; its width is w1.rows. */
typedef struct clb_expert {
    clb_weight w1;  /* gate [intermediate, hidden] */
    clb_weight w3;  /* up   [intermediate, hidden] */
    clb_weight w2;  /* down [hidden, intermediate] */
} clb_expert;

/* One layer as the file describes it; a feature the file lacks leaves its
 * pointer NULL (biases, q/k norms) or its weight empty (shared expert). */
typedef struct clb_layer {
    const float *attn_norm;   /* [hidden] */
    const float *ffn_norm;    /* [hidden] */
    clb_weight wq, wk, wv, wo;
    const float *bq, *bk, *bv; /* [qdim], [kvdim], [kvdim] or NULL */
    const float *bo;          /* [hidden] or NULL */
    const float *q_norm;      /* [head_dim] per head, [qdim] whole, or NULL */
    const float *k_norm;      /* [head_dim] per head, [kvdim] whole, or NULL */
    uint8_t dense;            /* 1: ffn is a dense SwiGLU, no router */
    clb_expert ffn;           /* dense layer: [dense_inter] SwiGLU */
    clb_weight router;        /* [E, hidden], F32 or I16_ROW */
    clb_weight shared_gate;   /* [1, hidden] F32, rows 0 without a gate */
    clb_expert shared;        /* [shared_inter] SwiGLU, w1.rows 0 without */
    const clb_expert *experts; /* [E], in the arena */
} clb_layer;

/* Keys and values laid out as the plan's cache: rows of kvdim values,
 * float32 (k, v) or int8 with one float32 scale per head vector (kq, vq,
 * ks, vs: COLIBRI_KV_I8; the pointers of the other type NULL). The plan's
 * cache (clb_plan.kv) and an encoder-decoder's cross-attention keys and
 * values (encdec.h) are two of these.
 * Rows come in runs of max_seq_len (one layer's sequence, clb_kv_row), and
 * a run is stored head-major: [n_kv_heads, max_seq_len, head_dim] (scales
 * [n_kv_heads, max_seq_len]), so one head's keys are one contiguous
 * stream. Row-major [max_seq_len, kvdim] put a head's rows kvdim apart, a
 * power of two: every row of a head fell in the same few L1 sets, and a
 * decode step at depth 2048 attended at 6 GB/s on Zen 5, where a plain
 * read of the same bytes ran at 25 (bench/results/FINDINGS.md 32). */
typedef struct clb_kv_rows {
    float *k, *v;               /* f32: [rows / S, n_kv_heads, S, head_dim] */
    int8_t *kq, *vq;            /* i8: the same layout */
    float *ks, *vs;             /* i8: [rows / S, n_kv_heads, S] (amax/127 each) */
} clb_kv_rows;

typedef struct clb_plan {
    colibri_shape s;
    const colibri_kernels *k;
    clb_team team;              /* who computes the parallel regions
                                   (threads.h); mutable, set outside infer */
    uint32_t chunk;             /* C */
    uint32_t qdim;              /* n_heads * head_dim */
    uint32_t kvdim;             /* n_kv_heads * head_dim */
    uint32_t max_inter;         /* max(intermediate, shared, dense widths) */
    uint32_t max_cols;          /* max(hidden, qdim, max_inter) */
    uint32_t max_groups;        /* ceil(max_cols / group_size) */
    clb_desc d;                 /* what the model computes (format.h) */

    /* Weights (into the blob). */
    clb_weight embed;           /* [vocab, hidden]: F32, I16_ROW, I8_GROUP or blocks */
    clb_weight lm_head;         /* [vocab, hidden] (TIED_LM_HEAD: = embed) */
    const float *final_norm;    /* [hidden] */
    const clb_layer *layers;    /* [L], in the arena */

    /* Read-only tables computed at init (in the arena). */
    const float *rope_cos, *rope_sin;   /* [S, head_dim/2] */

    /* Mutable state (in the arena). */
    uint8_t kv_dtype;           /* COLIBRI_KV_F32 or COLIBRI_KV_I8 */
    clb_kv_rows kv;             /* rows [L, B, S] of the kv_dtype's type */
    uint8_t *mask_cache;        /* [B, S] */
    uint32_t *tok_b, *tok_pos;  /* [C] sequence and position of chunk rows */
    float *x, *xn, *tmp;        /* [C, hidden] residual, normed, branch out */
    float *q, *att;             /* [C, qdim] queries, attention output */
    float *kbuf, *vbuf;         /* [C, kvdim] new keys and values */
    float *router_logits;       /* [C, E] */
    float *probs;               /* [C, E] */
    uint16_t *sel;              /* [C, K] chosen experts, rank order */
    float *selw;                /* [C, K] their renormalised weights */
    uint8_t *chosen;            /* [E] top-k scratch */
    uint32_t *counts;           /* [E] tokens routed to each expert */
    uint32_t *offsets;          /* [E+1] start of each expert's token list */
    uint32_t *tok_list;         /* [C*K] selections (row*K + slot) by expert */
    float *yslot;               /* [C, K, hidden] expert outputs per selection */
    float *xe, *ye;             /* [C, hidden] one expert's gathered in/out */
    float *h1, *h3;             /* [C, max_inter] gate and up */
    int8_t *xq;                 /* [C, max_cols] int8 activations; block
                                   types [C, nb*B] (cols padded to B) */
    float *xs;                  /* [C, max_groups] their scales ([C, nb]) */
    int16_t *xb;                /* [C, nb*B/16] block activations' sums of 16 */

    /* ENC_DEC files only (encdec.h), else NULL: the encoder-decoder state. */
    struct clb_encdec *ed;

    /* Streamed instances only (stream.h), else NULL: the expert slots, and
     * how moe.c gets an expert into one (a pointer, so that builds which
     * never stream do not link stream.c). */
    struct clb_stream *stream;
    /* told each MoE layer pass's routing (p->offsets) before the others */
    void (*routed)(const struct clb_plan *p, uint32_t layer);
    /* CLB_HELD with *ex when a slot holds the expert (a use), CLB_IN_FLIGHT
     * when a prefetch is reading it, else CLB_ABSENT */
    int (*held)(const struct clb_plan *p, uint32_t layer, uint32_t expert,
                const clb_expert **ex);
    /* a slot for an expert no slot holds, and its read started (nothing if
     * a read of it is in flight, or a slot has it by now) */
    void (*fetch)(const struct clb_plan *p, uint32_t layer, uint32_t expert);
    /* the fetched expert, once read and checked, or the error */
    int (*take)(const struct clb_plan *p, uint32_t layer, uint32_t expert,
                const clb_expert **ex, char *detail);
    uint32_t read_ahead;        /* fetches ahead of the take (1 or 2) */
    /* start the reads of what votes [E] (rows whose predicted top-k has the
     * expert) predict for MoE layer `layer`'s coming pass; set only where
     * the instance prefetches (stream.c clb_stream_prefetch_on) */
    void (*prefetch)(const struct clb_plan *p, uint32_t layer, const uint32_t *votes);
    /* every read still in flight finished (infer returns with none) */
    void (*settle)(const struct clb_plan *p);

    /* colibri_set_route_observer's, else NULL. */
    colibri_route_fn route_fn;
    void *route_user;
} clb_plan;

/* clb_plan.held's answers */
#define CLB_ABSENT 0
#define CLB_HELD 1
#define CLB_IN_FLIGHT 2

/* --- plan.c --------------------------------------------------------------- */

/* Hands out 64-byte aligned pieces of an arena; with base NULL it only
 * counts (ovf sticky on overflow). */
typedef struct { uint8_t *base; uint64_t off; int ovf; } carver;

/* The next 64-byte aligned piece of `bytes` (NULL while only counting). */
void *clb_carve(carver *c, uint64_t bytes);

/* The keys and values of `rows` rows of shape s's kvdim in the cache type
 * kv_dtype (clb_kv_rows), carved from c: k, v or kq, vq, ks, vs. */
clb_kv_rows clb_kv_carve(carver *c, uint64_t rows, const colibri_shape *s, unsigned kv_dtype);

/* Lay out the arena for shape s processing up to chunk_limit tokens
 * together. With c->base NULL, *pp is NULL and only c->off matters. */
void clb_layout(carver *c, const colibri_shape *s, const clb_desc *d,
                uint32_t chunk_limit, unsigned kv_dtype, clb_plan **pp);

/* Arena bytes for shape s, description d, chunk_limit and the KV cache type
 * (COLIBRI_KV_*); COLIBRI_E_NO_MEMORY if it exceeds size_t. */
int clb_arena_bytes(const colibri_shape *s, const clb_desc *d,
                    uint32_t chunk_limit, unsigned kv_dtype, size_t *out);

/* Bytes of KV cache per position of one sequence (all layers) and of the
 * whole cache as the layout carves it (each piece rounded up to 64). */
uint64_t clb_kv_bytes_per_token(const colibri_shape *s, unsigned kv_dtype);
uint64_t clb_kv_bytes(const colibri_shape *s, unsigned kv_dtype);

/* The options a caller passed (NULL: defaults), checked; fields past the
 * caller's opt->size take their defaults. */
typedef struct clb_opts {
    unsigned kv_dtype;   /* COLIBRI_KV_* */
    uint32_t slots;      /* expert_slots (0: none asked) */
    uint32_t policy;     /* COLIBRI_SLOTS_* */
    uint64_t ram;        /* ram_bytes (0: no budget) */
    uint32_t prefetch;   /* prefetch (0: none) */
} clb_opts;

/* Read and check *opt into *o; detail says what is wrong. COLIBRI_OK,
 * _ARG, _UNSUPPORTED. */
int clb_read_options(const colibri_options *opt, clb_opts *o, char *detail);

/* The view of table entry `en` whose section lies at `sec` (NULL: shape
 * and dtype only), and of entry `en` of a validated blob (data in host
 * order) at its file offset. */
clb_weight clb_weight_at(const uint8_t *sec, const uint8_t *en, int be,
                         uint32_t group);
clb_weight clb_weight_of(const uint8_t *blob, const uint8_t *en, int be,
                         uint32_t group);

/* Swap one section's data at `sec` (its entry `en`, in the file's byte
 * order be) into the other byte order, in place: values by their width,
 * float32 scales by 4, blocks' float fields; DESC and unknown kinds are
 * left as stored. */
void clb_swap_section(uint8_t *sec, const uint8_t *en, int be, uint32_t group);

/* The table offset of a section that is not in the blob: a streamed
 * instance's experts (stream.c rewrites its resident copy of the table). */
#define CLB_NOT_RESIDENT UINT64_MAX

/* Point every tensor view of the plan into validated, host-order data:
 * the table is blob's, its offsets count from `data` (blob itself, or the
 * mapped file a streamed instance uses its resident sections from;
 * CLB_NOT_RESIDENT: a view with shape and dtype but no data), and compute
 * the RoPE tables. */
void clb_build_plan(clb_plan *p, const uint8_t *blob, const uint8_t *data, int be,
                    const colibri_kernels *k);

/* The fastest kernel table this build and CPU can run. */
const colibri_kernels *clb_pick_kernels(void);

/* --- tensor.c -------------------------------------------------------------- */

/* X[n, hidden] = rows of the embedding for ids[n] (ids already validated). */
void clb_embed(const clb_plan *p, const int32_t *ids, uint32_t n, float *X);

/* Y[n, dim] = X / sqrt(mean(X^2) + eps) * w, row by row (in parallel
 * tiles of rows, clb_parallel_rows). Y may equal X. */
void clb_rmsnorm(const clb_plan *p, float *Y, const float *X, const float *w,
                 uint32_t n, uint32_t dim, float eps);

/* A row-wise pass over rows [0, n) of `width` elements as a parallel
 * region: fn(ctx, r0, nr) for tiles of about CLB_TILE_ELEMS_ROWS elements.
 * For passes whose rows do not depend on each other (RMSNorm, the
 * activations' quantisation, RoPE, the SiLU, the experts' weighted sum,
 * the residual adds), so any split gives the same bits. A
 * pass of one tile or less (decode) runs on the caller, without a region.
 * At prefill these passes were the caller's alone while the other workers
 * waited: 9 % of its samples at 2 threads (FINDINGS.md 26). */
typedef void (*clb_rows_fn)(void *ctx, uint32_t r0, uint32_t nr);
void clb_parallel_rows(const clb_plan *p, uint32_t n, uint32_t width,
                       clb_rows_fn fn, void *ctx);
#define CLB_TILE_ELEMS_ROWS 8192u

/* Y[n, rows] = X[n, cols] * W^T for any dtype: I8_GROUP quantises X into
 * p->xq/p->xs first (FORMAT.md 5). `what` names the call for debug dumps. */
void clb_linear(const clb_plan *p, const clb_weight *w, const float *X,
                uint32_t n, float *Y, const char *what);

/* clb_linear computing n tokens but writing only the first n_out rows of Y
 * [n_out, rows] (COLIBRI_LOGITS_LAST pads a lone row to two, so the kernel
 * takes its multi-token path as in the all-rows call). */
void clb_linear_rows(const clb_plan *p, const clb_weight *w, const float *X,
                     uint32_t n, uint32_t n_out, float *Y, const char *what);

/* Two matrices of the same input shape applied to the same X (expert w1 and
 * w3): the int8 activations are quantised once. */
void clb_linear2(const clb_plan *p, const clb_weight *wa, const clb_weight *wb,
                 const float *X, uint32_t n, float *Ya, float *Yb,
                 const char *what);

/* Rows of a weight matrix per tile of a parallel linear layer: one token
 * (decode) writes Y in place, CLB_TILE_ROWS_1 rows a tile; several tokens
 * go through a [CLB_TILE_TOKENS, CLB_TILE_ROWS_N] block on the worker's
 * stack (8 KiB). Fixed numbers: the tiles never depend on the thread count
 * (threads.h), so neither do the bits. Decode tiles are long because a
 * kernel call is where its software prefetch stops (it never reaches past
 * its own rows): 64 rows (37 KiB of Q4_K at 1024 columns) restarted the
 * memory stream cold so often that the small bench model decoded at ~15 ms
 * a token against ~10.5 ms with 256 (Zen 4, one thread); on Zen 5, 512
 * against 256 took its q4 decode from 5.4 to 4.8 ms (two threads 3.0 to
 * 2.9; int8 and f32 the same; Zen 3: within the noise), and 1024 was
 * slower at two threads, a 1024-row matrix then being one tile for two
 * (bench/results/FINDINGS.md 32). */
#define CLB_TILE_ROWS_1 512u
#define CLB_TILE_ROWS_N 16u
#define CLB_TILE_TOKENS 128u

/* The team of an instance's plan (the plan is const in the compute paths;
 * the team is the one part they mutate, its region state). */
static inline clb_team *clb_team_of(const clb_plan *p)
{
    return (clb_team *)&p->team;
}

/* Rotate n_heads heads of head_dim in v (in place) for position pos. */
void clb_rope(const clb_plan *p, float *v, uint32_t n_heads, uint32_t pos);

/* Keys and values [kvdim] into row `row` of c (of the plan's kv_dtype; f32:
 * copied; i8: quantised per head vector, FORMAT.md 5's I8 rule with group
 * head_dim, by the kernel table's quantize_act_i8). */
void clb_kv_put(const clb_plan *p, const clb_kv_rows *c, size_t row, const float *k,
                const float *v);

/* The row of sequence b's position pos of layer `layer` in rows laid out
 * [layers, max_batch, max_seq_len] (the plan's cache, an encoder-decoder's
 * cross-attention keys and values). */
static inline size_t clb_kv_row(const clb_plan *p, uint32_t layer, uint32_t b, uint32_t pos)
{
    return ((size_t)layer * p->s.max_batch + b) * p->s.max_seq_len + pos;
}

/* clb_kv_put into the plan's cache: sequence b at position pos of layer. */
void clb_kv_store(const clb_plan *p, uint32_t layer, uint32_t b, uint32_t pos,
                  const float *k, const float *v);

/* Where row `row`'s KV head kvh starts (clb_kv_rows' layout): its
 * head_dim values at this element of k, v (kq, vq), its scale at the
 * returned *scale of ks, vs. */
static inline size_t clb_kv_at(const clb_plan *p, size_t row, uint32_t kvh, size_t *scale)
{
    const size_t S = p->s.max_seq_len, run = row / S, pos = row % S;
    const size_t head = run * p->s.n_kv_heads + kvh; /* the (run, head) stream */
    *scale = head * S + pos;
    return (head * S + pos) * p->s.head_dim;
}

/* a's keys and values (K, V or Kq, Vq, Ks, Vs; ld, lds, d): KV head kvh of
 * c's rows from `row` on (a sequence's positions 0, 1, ...; row is the
 * first of its run). */
void clb_kv_args(const clb_plan *p, const clb_kv_rows *c, size_t row, uint32_t kvh,
                 clb_att_args *a);

/* Attention of the chunk's n query rows p->q [n, qdim] (row i: sequence
 * tok_b[i] at position tok_pos[i]) against layer `layer`'s cache (keys
 * 0..pos, mask-filtered, every key of the chunk already stored); out
 * p->att [n, qdim]. */
void clb_attention(const clb_plan *p, uint32_t layer, uint32_t n);

/* The rows [*r0, *r1) of sequence b among the chunk's n rows (tok_b: a
 * sequence's rows are consecutive); returns 0 when it has none. */
int clb_seq_rows(const clb_plan *p, uint32_t n, uint32_t b, uint32_t *r0, uint32_t *r1);

/* The queries of chunk rows [r0, r1) (positions tok_pos) for attend_rows:
 * nh heads of head_dim from column col of p->q, out at the same place of
 * p->att; causal, no bias (the caller sets n_all and bias). */
clb_att_rows clb_chunk_queries(const clb_plan *p, uint32_t r0, uint32_t r1, size_t col,
                               uint32_t nh);

/* COLIBRI_DEBUG: print a labelled dump of a float buffer to stderr. */
#ifdef COLIBRI_DEBUG
void clb_debug_dump(const char *what, const char *role, const void *data,
                    size_t n_values, size_t elem_size, int is_float);
#endif

/* --- moe.c ----------------------------------------------------------------- */

/* Y[n, hidden] = sparse MoE of X[n, hidden] (already normalised) for the
 * layer: router, softmax, top-k, per-expert grouped SwiGLU, weighted sum.
 * COLIBRI_OK, or (streamed instances only) the error of reading an expert,
 * with detail set. */
int clb_moe(const clb_plan *p, const clb_layer *layer, const float *X,
            uint32_t n, float *Y, char *detail);

/* A streamed instance that prefetches (p->prefetch set): predict MoE layer
 * `layer`'s routing of the chunk from the residual X[n, hidden] that enters
 * the layer (its FFN norm and router applied as if attention added nothing;
 * the residual dominates, so most choices hold) and start the reads of the
 * experts predicted. Uses p->xn and the routing buffers as scratch: call it
 * before the layer's attention norm. Changes no logit, only what is read. */
void clb_moe_prefetch(const clb_plan *p, const clb_layer *layer, const float *X,
                      uint32_t n);

/* p[0..n) = softmax(v[0..n)) in float32 (max-subtracted). */
void clb_softmax(float *p, const float *v, uint32_t n);

/* Top-k of probs[n] with ties towards the lower index: k passes over all n,
 * no early exit. sel[k] in rank order, w[k] the probabilities, renormalised
 * to sum 1 if renorm. */
void clb_topk(const float *probs, uint32_t n, uint32_t k, int renorm,
              uint8_t *chosen, uint16_t *sel, float *w);

/* Y[n, hidden] = W2 (silu(W1 X) * (W3 X)) for a SwiGLU of any width
 * (p->h1/h3 hold [n, width]). */
void clb_swiglu(const clb_plan *p, const clb_expert *ex, const float *X,
                uint32_t n, float *Y, const char *what13, const char *what2);

#endif /* COLIBRI_INTERNAL_H */
