/*
 * colibri.h - the public API of the Colibri Mixture-of-Experts runtime.
 *
 * A model is a .colibri file (docs/FORMAT.md). The runtime validates it, then
 * computes Mixtral logits with every byte of mutable memory carved from one
 * 64-byte aligned arena that is allocated (or supplied) once, at init:
 * colibri_infer() performs no heap allocation and no system call.
 *
 * Typical use:
 *     colibri_model m;                       // caller-owned, stack or static
 *     int rc = colibri_init(&m, "model.colibri");
 *     if (rc) { puts(colibri_strerror_for(rc, COLIBRI_CALL_INIT));
 *               puts(colibri_error_detail(&m)); }
 *     rc = colibri_infer(&m, ids, NULL, 1, n, 0, logits);   // prefill
 *     rc = colibri_infer(&m, &next, NULL, 1, 1, n, logits); // one decode step
 *     colibri_free(&m);
 *
 * Threads: one instance per thread. Instances may share one mapping of the
 * weights (colibri_share) and then add only their own arena. Functions taking
 * a const colibri_model* may run concurrently on the same instance. One
 * instance can also compute each colibri_infer on several cores
 * (colibri_set_threads, colibri_set_executor): the logits are bit-identical
 * whatever the number of threads.
 *
 * Build switches (compile-time defines, the same for the library and users):
 *   COLIBRI_ENABLE_MMAP=0|1   colibri_init maps the file (1, default) or reads
 *                             it into memory it allocates (0).
 *   COLIBRI_ENABLE_POSIX_IO=0|1  the library's own reader of a streamed file
 *                             (open, pread, O_DIRECT: colibri_init_ex with a
 *                             budget); default 1 on Unix hosts and wherever
 *                             COLIBRI_ENABLE_MMAP is 1, else 0 (then
 *                             colibri_init_stream with the caller's reader).
 *   COLIBRI_STATIC_WORKBUF    the library never calls malloc: arenas come from
 *                             the caller, colibri_init is unavailable
 *                             (COLIBRI_E_UNSUPPORTED), files must be in the
 *                             host byte order.
 *   COLIBRI_CHUNK_TOKENS=N    tokens processed together with a caller-supplied
 *                             arena (default 16); enters colibri_arena_size.
 *   COLIBRI_CHUNK_TOKENS_OWNED=N  the same when the library allocates the
 *                             arena, or the caller's arena is large enough
 *                             for it (default 128: a prefill streams each
 *                             expert's weights once per 128 tokens). The
 *                             chunk follows from the arena size, so equal
 *                             arenas give bit-identical logits.
 *   COLIBRI_KERNELS_REF_ONLY  use the portable reference kernels only.
 *   COLIBRI_THREADS=0|1       multi-threaded inference (colibri_set_threads,
 *                             colibri_set_executor); default 1 on Linux, 0
 *                             elsewhere (0: both return COLIBRI_E_UNSUPPORTED
 *                             for more than one worker, and the library
 *                             contains no thread code).
 *   COLIBRI_DEBUG             dump each kernel call to stderr.
 */
#ifndef COLIBRI_H
#define COLIBRI_H

#include <stddef.h>
#include <stdint.h>

#include "colibri_format.h" /* COLIBRI_FORMAT_VERSION, COLIBRI_DTYPE_*, kinds */

#ifdef __cplusplus
extern "C" {
#endif

/* Version of this API (bumped on incompatible changes). The file format
 * version this library reads is COLIBRI_FORMAT_VERSION (colibri_format.h). */
#define COLIBRI_API_VERSION 1

/* Arenas handed to the library must be aligned to this many bytes. */
#define COLIBRI_ARENA_ALIGN 64
/* Blobs (a file's bytes in memory) must be aligned to at least this many
 * bytes; 64 is recommended so that SIMD kernels can use aligned loads. */
#define COLIBRI_BLOB_ALIGN 4

/* Error codes: 0 is success, every failure a distinct negative value except
 * -1, which keeps its historical two meanings. */
enum {
    COLIBRI_OK = 0,
    /* -1 at init: the file is not a valid .colibri file (magic, a header
     *    field, a table entry, a size or an offset is wrong). */
    COLIBRI_E_BAD_FORMAT = -1,
    /* -1 at infer: batch > max_batch, seq > max_seq_len or
     *    n_past + seq > max_seq_len. */
    COLIBRI_E_INPUT_TOO_LARGE = -1,
    COLIBRI_E_NO_MEMORY = -2,       /* malloc failed */
    COLIBRI_E_CRC = -3,             /* header, table or section CRC mismatch */
    COLIBRI_E_IO = -4,              /* open, stat, mmap or read failed */
    COLIBRI_E_VERSION = -5,         /* format version newer than supported */
    COLIBRI_E_BYTE_ORDER = -6,      /* file in the other byte order and this
                                       path cannot swap (zero-copy/static) */
    COLIBRI_E_ARG = -7,             /* NULL pointer, zero size, bad mask value */
    COLIBRI_E_TOKEN = -8,           /* token id < 0 or >= vocab */
    COLIBRI_E_ARENA_TOO_SMALL = -9, /* caller arena smaller than needed */
    COLIBRI_E_ALIGN = -10,          /* blob or arena misaligned */
    COLIBRI_E_KV_STATE = -11,       /* n_past > cached tokens or batch differs
                                       from the cached batch */
    COLIBRI_E_UNSUPPORTED = -12,    /* not available in this build */
    COLIBRI_E_NOT_INIT = -13        /* model not initialised (or freed) */
};

/* What a model is, in host order. */
typedef struct colibri_shape {
    uint32_t vocab, hidden, intermediate, max_seq_len;
    uint16_t n_layers, n_heads, n_kv_heads, head_dim;
    uint16_t n_experts, top_k, max_batch, group_size;
    float rope_theta, rms_eps;
    uint32_t n_tensors;
} colibri_shape;

/* Everything colibri_get_info reports. Plain data; strings are static. */
typedef struct colibri_info {
    colibri_shape shape;
    uint16_t format_version;
    uint8_t file_big_endian;   /* 1 if the file is big-endian */
    uint8_t byte_swapped;      /* 1 if the runtime swapped it into memory */
    /* dtypes (COLIBRI_DTYPE_* of colibri_format.h) of layer 0 / the model */
    uint8_t dtype_embed, dtype_attn, dtype_router, dtype_expert, dtype_lm_head;
    uint32_t n_unknown_sections;  /* non-critical entries that were skipped */
    uint64_t file_size;           /* bytes */
    uint64_t n_params;            /* weights in all known tensors */
    size_t arena_bytes;           /* this instance's arena (given or allocated) */
    uint32_t chunk_tokens;        /* tokens processed together */
    const char *kernels;          /* "ref", "avx2", "avx2-vnni", "neon", "neon-dotprod" */
    const char *load_mode;        /* "mmap", "read", "memory", "shared",
                                     "stream" */
    uint8_t huge_pages_advised;   /* 1 if the model's own copy (read or
                                     swapped) lies in a MADV_HUGEPAGE region */
    uint32_t n_threads;           /* workers computing an infer, caller
                                     included (1: the caller alone) */
    uint32_t thread_flags;        /* colibri_set_threads flags in use */
    uint8_t executor;             /* 1: the workers are the caller's
                                     (colibri_set_executor) */
    uint8_t kv_dtype;             /* COLIBRI_KV_F32 or COLIBRI_KV_I8 */
    uint64_t kv_bytes_per_token;  /* KV cache bytes one position of one
                                     sequence holds, all layers (keys and
                                     values; i8: values and their scales) */
    uint64_t kv_bytes;            /* the whole cache in the arena: per token
                                     * max_batch * max_seq_len, each of the
                                     arena's pieces rounded up to 64 */
    /* Every dtype the attention (WQ, WK, WV, WO of layer 0) and the routed
     * experts (W1, W3, W2 of every expert of the first layer with experts)
     * use, as bits 1 << COLIBRI_DTYPE_*: a mix such as `--quant q4` keeps
     * WV in Q6_K beside WQ's Q4_K, W2 in Q4_0 where its rows are narrow,
     * which dtype_attn / dtype_expert (WQ's, W1's) alone do not show. */
    uint16_t dtypes_attn, dtypes_expert;
} colibri_info;

/* KV cache storage (colibri_options.kv_dtype, colibri_info.kv_dtype).
 *   COLIBRI_KV_F32  float32 keys and values: 2 * 4 * n_kv_heads * head_dim
 *                   bytes per layer and token (colibri_init's cache).
 *   COLIBRI_KV_I8   each key and value head vector [head_dim] as int8 with one
 *                   float32 scale, the I8 activation rule of docs/FORMAT.md 5
 *                   with group head_dim (scale = amax/127, q = rint(x*127/
 *                   amax) clipped to +-127): 2 * (head_dim + 4) * n_kv_heads
 *                   bytes per layer and token, about a quarter. Attention
 *                   dequantises inside its loops: q.k = scale * sum q[c] *
 *                   float(k8[c]), the value sum likewise, in float32; logits
 *                   stay bit-identical for every thread count. An ENC_DEC
 *                   file keeps its cross-attention keys and values in the
 *                   same type (and its encoder's, while it encodes). */
#define COLIBRI_KV_F32 0u
#define COLIBRI_KV_I8 1u

/* Options of colibri_init_ex, colibri_init_from_memory_ex,
 * colibri_arena_size_ex and colibri_share_ex. Plain data the library reads
 * during the call only (the caller keeps ownership; it need not outlive the
 * call). Fill it with colibri_options_default(): `size` tells the library
 * which fields the caller's header knew, so a struct from an older header
 * keeps working when fields are appended (the missing ones take their
 * defaults); a larger struct from a newer header is accepted when every byte
 * past the fields this library knows is zero (else COLIBRI_E_UNSUPPORTED:
 * an option this library does not have). size below 8: COLIBRI_E_ARG. */
typedef struct colibri_options {
    uint32_t size;      /* sizeof(colibri_options) of the caller's header */
    uint32_t kv_dtype;  /* COLIBRI_KV_F32 (default) or COLIBRI_KV_I8 */
    /* Streamed experts (colibri_init_ex, colibri_init_stream; "Experts from
     * storage" below). Both 0 (the default): every weight resident. */
    uint32_t expert_slots; /* routed-expert slots, 1 .. n_layers*n_experts;
                              0: as many as ram_bytes allows */
    uint32_t slot_policy;  /* COLIBRI_SLOTS_REUSE (the default), _FREQ or _LRU */
    uint64_t ram_bytes;    /* budget for everything the instance holds
                              (resident weights, arena, KV cache, slots);
                              0: no budget. Both set: exactly expert_slots
                              slots, streamed even where the budget would
                              hold every weight, and COLIBRI_E_NO_MEMORY when
                              they need more than ram_bytes (the detail says
                              how many bytes) */
    uint32_t prefetch;     /* streamed with the library's own reader: up to
                              this many of a MoE layer's experts predicted
                              before its attention and read meanwhile
                              (COLIBRI_PREFETCH_DEFAULT; 0: none; "Experts
                              from storage" below) */
} colibri_options;

/* colibri_options_default()'s prefetch: a decode step's top_k of 8 (the
 * library lowers it to the model's top_k and to what its slots allow). */
#define COLIBRI_PREFETCH_DEFAULT 8u

/* Which expert a full slot cache gives up (colibri_options.slot_policy).
 * None changes a bit of the logits, only what is read (docs/STREAMING.md
 * measures them on trained routing).
 *   COLIBRI_SLOTS_REUSE the expert with the least expected reuse per layer
 *                       pass until its layer runs again: (a recency
 *                       register that quarters at each pass of its layer
 *                       and gains 3/4 when the pass routes to it, plus the
 *                       share of its layer's passes that did) over the
 *                       layers until its layer's next pass; the least
 *                       recently used among equals. A decode step visits
 *                       the layers in order, so an expert of the layer
 *                       that just ran waits longest.
 *   COLIBRI_SLOTS_FREQ  the expert chosen least often so far (counts since
 *                       init, halved when one reaches 2^16 so the past
 *                       fades), the least recently used among equals: hot
 *                       experts stay, one-off visitors leave first.
 *   COLIBRI_SLOTS_LRU   the least recently used. */
#define COLIBRI_SLOTS_FREQ 0u
#define COLIBRI_SLOTS_LRU 1u
#define COLIBRI_SLOTS_REUSE 2u

/* The defaults (size set, kv_dtype COLIBRI_KV_F32, slot_policy
 * COLIBRI_SLOTS_REUSE): what the functions
 * without _ex use. Pure function. */
colibri_options colibri_options_default(void);

/* The caller's workers, for an RTOS or bare metal (colibri_set_executor):
 * the library then needs no OS at all. Plain data, copied by the library.
 *   run(user, n_workers, work, arg) must call work(arg, w) exactly once for
 *   every w in [0, n_workers), possibly concurrently (w = 0 may run on the
 *   calling thread), and return only after every call has returned; its
 *   synchronisation must order memory (a semaphore, a mutex, a queue of the
 *   RTOS, or atomics with acquire/release). Running the calls one after the
 *   other is correct too (the first call then does all the work): work
 *   items share a counter of tiles, so any schedule gives the same bits.
 *   Each worker needs COLIBRI_WORKER_STACK_BYTES of stack.
 *   run is called from colibri_infer, once per parallel region (a few per
 *   layer), so its hand-over should be cheap; what it does there (system
 *   calls, blocking) is up to the caller.
 *   n_workers  1 .. COLIBRI_MAX_THREADS. */
/* The stack a worker of colibri_executor needs, from work(arg, w) down.
 * The deepest path is the x86 int8 prefill: the GEMM's packed chunk (28
 * KiB) under a tile's 8 KiB block of outputs, 45.1 KiB measured with a
 * glibc thread's own bookkeeping on the same stack (the attention's frame
 * is 35 KiB; the ref kernels need 13). tests/c/test_pool.c runs every work
 * item on a painted stack and holds what it used to this figure (the
 * host's kernels, ref, and NEON under qemu). */
#define COLIBRI_WORKER_STACK_BYTES (48u << 10)

typedef struct colibri_executor {
    void (*run)(void *user, uint32_t n_workers,
                void (*work)(void *arg, uint32_t worker), void *arg);
    void *user;
    uint32_t n_workers;
} colibri_executor;

/* Most workers (caller included) an instance can use. */
#define COLIBRI_MAX_THREADS 64u
/* colibri_set_threads flag: workers and the caller only spin, never park. */
#define COLIBRI_THREADS_SPIN 1u

/* colibri_infer_ex logits_mode. */
#define COLIBRI_LOGITS_ALL 0u   /* logits [batch, seq, vocab] */
#define COLIBRI_LOGITS_LAST 1u  /* logits [batch, vocab]: last position only */

/* The instance. The caller allocates it (stack, static, heap); the library
 * fills it. Every field is PRIVATE to the library: read it only through the
 * functions below; its layout may change between releases. */
typedef struct colibri_model {
    struct colibri_model_private_ {
        uint32_t magic;            /* set while initialised */
        uint8_t  load_mode;        /* 1 mmap, 2 read, 3 memory, 4 shared,
                                      5 stream */
        uint8_t  file_big_endian, byte_swapped, kv_dtype;
        const uint8_t *blob;       /* the file; tensor data in host order */
        size_t blob_size;
        void *owned_blob;          /* malloc'd copy to free, or NULL */
        void *map;                 /* mmap'd file to unmap, or NULL */
        size_t map_size;
        void *huge;                /* anonymous huge-page region holding */
        size_t huge_size;          /* the read or swapped copy, or NULL */
        void *file_reader;         /* a streamed instance's own reader of
                                      its path (open files), or NULL */
        void *arena;
        size_t arena_size;
        void *owned_arena;         /* malloc'd arena to free, or NULL */
        void *huge_arena;          /* anonymous huge-page region holding */
        size_t huge_arena_size;    /* the allocated arena, or NULL */
        const void *kernels;       /* colibri_kernels* */
        void *plan;                /* the arena's layout, inside the arena;
                                      it holds the thread team too */
        colibri_shape shape;
        uint32_t cached_len;       /* tokens per sequence in the KV cache */
        uint32_t cached_batch;     /* sequences in the KV cache */
        char detail[192];          /* last error, human-readable */
    } priv_;
} colibri_model;

/* Load the file at `path`, validate it (FORMAT.md section 3: every header
 * field, every table entry, every offset and size, then every CRC), allocate
 * the arena. With COLIBRI_ENABLE_MMAP the file is mapped read-only (it must
 * not change while mapped), otherwise read into allocated memory: on Linux,
 * for files of 2 MiB and more, an anonymous region marked MADV_HUGEPAGE, so
 * the kernel can back it with transparent huge pages (decode streams every
 * weight once per token; with 4 KiB pages the page walks cost a quarter of
 * the step time on the benchmark machine, bench/results/FINDINGS.md). A file
 * in the other byte order is swapped into allocated memory the same way.
 * Ownership: the model owns the mapping/copy and the arena until
 * colibri_free. `m` need not be initialised before; on failure it is left
 * freed (colibri_free is harmless) with colibri_error_detail describing the
 * problem.
 * Returns 0, COLIBRI_E_BAD_FORMAT, _VERSION, _CRC, _IO, _NO_MEMORY, _ARG,
 * _UNSUPPORTED (COLIBRI_STATIC_WORKBUF builds). */
int colibri_init(colibri_model *m, const char *path);

/* colibri_init, colibri_init_from_memory and colibri_arena_size with
 * options (opt NULL: the defaults, exactly the plain functions). The same
 * ownership, lifetime and return codes, plus COLIBRI_E_ARG (opt->size below
 * 8, an unknown kv_dtype) and COLIBRI_E_UNSUPPORTED (an option this library
 * does not have). An arena for
 * colibri_init_from_memory_ex must be at least colibri_arena_size_ex with
 * the same options; the arena size formula's KV term becomes
 *   KV cache (i8) 2 * n_layers * max_batch * max_seq_len * n_kv_heads
 *                 * (head_dim + 4)   (values, then scales: 4 pieces)
 * colibri_share_ex: `opt` chooses the new instance's own cache (NULL:
 * the defaults, f32, whatever the owner's). */
int colibri_init_ex(colibri_model *m, const char *path,
                    const colibri_options *opt);
int colibri_init_from_memory_ex(colibri_model *m, const void *blob, size_t size,
                                void *arena, size_t arena_size,
                                const colibri_options *opt);
int colibri_arena_size_ex(const void *blob, size_t size,
                          const colibri_options *opt, size_t *out_bytes);
int colibri_share_ex(colibri_model *m, const colibri_model *owner,
                     void *arena, size_t arena_size,
                     const colibri_options *opt);

/* Use a file that is already in memory, in place (zero-copy: flash, a mapped
 * region, an embedded array). `blob` must stay valid and unchanged until
 * colibri_free, be aligned to COLIBRI_BLOB_ALIGN (64 recommended) and be in
 * the host byte order (else COLIBRI_E_BYTE_ORDER: convert with
 * `colibri convert --byte-order`). `arena` (COLIBRI_ARENA_ALIGN aligned,
 * arena_size >= colibri_arena_size) stays owned by the caller and must
 * outlive the model; with arena NULL the library allocates it (not in
 * COLIBRI_STATIC_WORKBUF builds: there arena is required).
 * Returns 0, COLIBRI_E_BAD_FORMAT, _VERSION, _CRC, _BYTE_ORDER, _ALIGN,
 * _ARENA_TOO_SMALL, _NO_MEMORY, _ARG. */
int colibri_init_from_memory(colibri_model *m, const void *blob, size_t size,
                             void *arena, size_t arena_size);

/* Bytes of arena a model needs in this build, from its header alone (the
 * header is validated, its CRC checked; the table is not read). Formula with
 * C = min(COLIBRI_CHUNK_TOKENS, max_batch*max_seq_len) (an arena the library
 * allocates, or a caller's arena large enough for it, uses
 * COLIBRI_CHUNK_TOKENS_OWNED instead: colibri_get_info reports the chunk
 * and arena of an instance), every term rounded
 * up to 64 bytes:
 *   KV cache   2 * 4 * n_layers * max_batch * max_seq_len * n_kv_heads*head_dim
 *   mask cache max_batch * max_seq_len
 *   RoPE       2 * 4 * max_seq_len * head_dim/2
 *   scratch    4*C * (5*hidden + 2*n_heads*head_dim + 2*n_kv_heads*head_dim
 *                     + 2*intermediate + 2*n_experts + top_k*(hidden + 2) + 2)
 *              + 2*C*top_k (selected experts)
 *              + C*padded + 4*C*max(ceil(max_cols/group_size), padded/32)
 *              + 2*C*padded/16   (int8 activations of I8_GROUP and block
 *                weights: values, scales, sums of 16)
 *              + n_experts + 4*n_experts + 4*(n_experts+1) (top-k flags,
 *                counts, offsets)
 *   tables     the plan, per-layer and per-expert tensor views (pointers)
 *   ENC_DEC    4*max_batch*max_seq_len*hidden (encoder output), its mask
 *              (max_batch*max_seq_len), the decoder layers' cross-attention
 *              keys and values (the KV cache term with n_layers -
 *              encoder_layers layers), 4*n_layers*max_batch*n_experts
 *              (expert capacity counts) and their tables
 * where max_cols = max(hidden, n_heads*head_dim, intermediate) and padded
 * = max_cols rounded up to a multiple of 256 (a K block). With the i8 KV
 * cache of colibri_arena_size_ex, the KV term is 2 * n_layers * max_batch *
 * max_seq_len * n_kv_heads * (head_dim + 4) (and the cross-attention's
 * likewise).
 * Returns 0, COLIBRI_E_BAD_FORMAT, _VERSION, _CRC, _ARG, _NO_MEMORY (the
 * size does not fit in size_t). */
int colibri_arena_size(const void *blob, size_t size, size_t *out_bytes);

/* Make `m` a second instance over `owner`'s weights (no copy, no new
 * mapping): only its own arena (KV cache, scratch) is added. `owner` must be
 * initialised and must outlive `m` (free `m` first). arena as in
 * colibri_init_from_memory (NULL: allocated, not in static builds).
 * Returns 0, COLIBRI_E_NOT_INIT, _ARG, _ALIGN, _ARENA_TOO_SMALL, _NO_MEMORY. */
int colibri_share(colibri_model *m, const colibri_model *owner,
                  void *arena, size_t arena_size);

/* Compute logits for `batch` sequences of `seq` new tokens each.
 *   input_ids      [batch, seq] token ids, 0 <= id < vocab.
 *   attention_mask [batch, seq] 1 = real token, 0 = padding; NULL = all 1.
 *                  The mask of cached tokens is remembered. A token that
 *                  sees no real token at all (an all-zero mask, or padding
 *                  before the first real token) gets a zero attention
 *                  output: its logits are finite but carry no meaning; no
 *                  NaN reaches the logits (docs/FORMAT.md section 6).
 *   n_past         0 starts fresh sequences; n_past > 0 continues from the KV
 *                  cache: n_past <= tokens cached and batch == cached batch
 *                  (n_past below the cached count rewinds). Token t of the
 *                  call sits at position n_past + t.
 *   logits         [batch, seq, vocab] float32, written by the call.
 * No allocation, no system call (on several threads, colibri_set_threads
 * says exactly what the workers' hand-over may do); the instance is not
 * thread-safe (one per calling thread). On error nothing is computed and the KV cache is unchanged.
 * Returns 0, COLIBRI_E_INPUT_TOO_LARGE (-1), _ARG, _TOKEN, _KV_STATE,
 * _NOT_INIT. */
int colibri_infer(colibri_model *m, const int32_t *input_ids,
                  const uint8_t *attention_mask, uint32_t batch, uint32_t seq,
                  uint32_t n_past, float *logits);

/* colibri_infer with a choice of logits rows (same arguments, checks and
 * return codes, plus COLIBRI_E_ARG for an unknown logits_mode):
 *   COLIBRI_LOGITS_ALL   logits [batch, seq, vocab], as colibri_infer.
 *   COLIBRI_LOGITS_LAST  logits [batch, vocab]: the last position of each
 *                        sequence only; the final norm and the LM head run
 *                        for those rows alone (a prefill feeding generation
 *                        skips seq-1 rows of the largest matrix). Each row is
 *                        bit-equal to the matching row of COLIBRI_LOGITS_ALL
 *                        (the LM head sees the same kernel path: a single
 *                        last row of a multi-row chunk is computed as two). */
int colibri_infer_ex(colibri_model *m, const int32_t *input_ids,
                     const uint8_t *attention_mask, uint32_t batch,
                     uint32_t seq, uint32_t n_past, uint32_t logits_mode,
                     float *logits);

/* Compute each colibri_infer of this instance on n_threads workers: the
 * caller's thread is worker 0, n_threads - 1 pthreads are created here
 * (never in infer) and joined by the next call, colibri_set_executor or
 * colibri_free; n_threads 1 joins them. Call after init, never concurrently
 * with an infer of the instance.
 * Guarantee: logits bit-identical for every n_threads (and to a build with
 * COLIBRI_THREADS=0, and with an executor): the work is cut into tiles fixed
 * by the model's shapes and the call (row blocks of each matrix, token
 * blocks of a prefill, element blocks of the SwiGLU, the heads of an
 * attention), and the thread count only decides which worker computes a
 * tile.
 * What the threaded path does inside colibri_infer: no allocation; atomic
 * operations on the instance's team; with flags 0, after spinning about
 * 20-200 us, the futex system calls FUTEX_WAKE (to hand a region to parked
 * workers) and FUTEX_WAIT (to wait for work or for the last worker), nothing
 * else. With COLIBRI_THREADS_SPIN the workers and the caller only spin: no
 * system call at all during colibri_infer, and the workers keep their cores
 * busy between calls too (for real-time users with dedicated cores).
 * Memory, allocated here: n_threads - 1 thread stacks (the C library's
 * default size), a ~1.5 KiB pool and n_threads * max_seq_len floats of
 * attention scratch (heads run in parallel); the arena is unchanged.
 * Returns 0, COLIBRI_E_NOT_INIT, COLIBRI_E_ARG (n_threads 0 or above
 * COLIBRI_MAX_THREADS, unknown flags), COLIBRI_E_UNSUPPORTED (n_threads > 1
 * in a build without threads or without malloc: COLIBRI_THREADS=0,
 * COLIBRI_STATIC_WORKBUF), COLIBRI_E_NO_MEMORY (a thread could not be
 * created: the instance is left on 1 thread). */
int colibri_set_threads(colibri_model *m, uint32_t n_threads, uint32_t flags);

/* Compute each colibri_infer on the caller's workers (colibri_executor);
 * NULL returns to the caller's thread alone. Replaces (joins) any pthreads
 * of colibri_set_threads. Call after init, never concurrently with infer.
 * The same guarantee of bit-identical logits. The executor's state lives in
 * the instance's arena; n_workers * max_seq_len floats of attention scratch
 * are allocated here (not in COLIBRI_STATIC_WORKBUF builds, which allocate
 * nothing: there the heads of an attention run on the caller, the matrices
 * on every worker). Returns 0, COLIBRI_E_NOT_INIT, COLIBRI_E_ARG (run NULL,
 * n_workers 0 or above COLIBRI_MAX_THREADS), COLIBRI_E_UNSUPPORTED
 * (n_workers > 1 in a COLIBRI_THREADS=0 build). */
int colibri_set_executor(colibri_model *m, const colibri_executor *ex);

/* Release what the model owns (mapping, copy, arena, worker threads) and mark it
 * uninitialised. Safe on a freed or failed instance and on NULL. A caller
 * arena or blob stays the caller's. */
void colibri_free(colibri_model *m);

/* A static English sentence for an error code (never NULL). -1 has two
 * meanings (COLIBRI_E_BAD_FORMAT from the calls that read a file,
 * COLIBRI_E_INPUT_TOO_LARGE from colibri_infer), so colibri_strerror(-1)
 * names both; to print the one meaning of a failed call, use
 * colibri_strerror_for. */
const char *colibri_strerror(int code);

/* Which call returned a code, for colibri_strerror_for. */
typedef enum colibri_call {
    COLIBRI_CALL_INIT = 0,  /* colibri_init, colibri_init_from_memory,
                               colibri_arena_size, colibri_verify,
                               colibri_share: every call but colibri_infer */
    COLIBRI_CALL_INFER = 1  /* colibri_infer */
} colibri_call;

/* The sentence for `code` as returned by `call`: for -1, "bad .colibri file"
 * (COLIBRI_CALL_INIT) or "input larger than the model's max_batch/
 * max_seq_len" (COLIBRI_CALL_INFER); for every other code the same text as
 * colibri_strerror. Static, never NULL. */
const char *colibri_strerror_for(int code, colibri_call call);

/* The last error of this instance in words, naming the field, tensor or
 * value ("tensor 7 (EXPERT_W1 layer 0 expert 1): crc 0x... != 0x..."); ""
 * after a successful colibri_init* or colibri_infer. Valid until the next
 * call on `m`. */
const char *colibri_error_detail(const colibri_model *m);

/* Fill `out` with the model's shape and properties. Returns 0,
 * COLIBRI_E_NOT_INIT or COLIBRI_E_ARG. */
int colibri_get_info(const colibri_model *m, colibri_info *out);

/* What a model holds resident, by part of the network: the bytes of the
 * file's sections (FORMAT.md 4: values, scales or blocks, as stored) of the
 * tensor kinds of each part, and which storage types they use.
 *   EMBED    EMBED
 *   ATTN     WQ WK WV WO, their biases, cross-attention XWQ..XWO and the
 *            relative position biases (ENC_DEC)
 *   ROUTER   ROUTER
 *   EXPERTS  EXPERT_W1/W3/W2 (the routed experts)
 *   FFN      SHARED_W1/W3/W2, SHARED_GATE, DENSE_W1/W3/W2
 *   NORMS    every RMSNorm weight (attention, FFN, final, q/k, cross)
 *   LM_HEAD  LM_HEAD
 *   OTHER    the DESC section and sections of kinds this library skips
 *            (the tokenizer)
 * The header, the table and the 64-byte alignment padding are the rest of
 * colibri_info.file_size. */
enum {
    COLIBRI_PART_EMBED = 0, COLIBRI_PART_ATTN, COLIBRI_PART_ROUTER,
    COLIBRI_PART_EXPERTS, COLIBRI_PART_FFN, COLIBRI_PART_NORMS,
    COLIBRI_PART_LM_HEAD, COLIBRI_PART_OTHER, COLIBRI_PART_COUNT
};
typedef struct colibri_weight_bytes {
    uint64_t bytes[COLIBRI_PART_COUNT];   /* section bytes per part */
    uint32_t dtypes[COLIBRI_PART_COUNT];  /* bit 1 << COLIBRI_DTYPE_* for
                                             each storage type present
                                             (OTHER: 0) */
    uint32_t tensors[COLIBRI_PART_COUNT]; /* table entries per part */
} colibri_weight_bytes;

/* Fill `out` (plain data, the caller's) from the instance's tensor table.
 * Returns 0, COLIBRI_E_NOT_INIT or COLIBRI_E_ARG. */
int colibri_get_weight_bytes(const colibri_model *m, colibri_weight_bytes *out);

/* KV cache bytes of shape `s` with cache type kv_dtype (COLIBRI_KV_*):
 * per position of one sequence over all layers, and the whole cache as an
 * arena holds it (max_batch * max_seq_len positions, each of its 2 or 4
 * pieces rounded up to 64). Either output may be NULL. Pure function.
 * Returns 0 or COLIBRI_E_ARG (s NULL, unknown kv_dtype). */
int colibri_kv_size(const colibri_shape *s, unsigned kv_dtype,
                    uint64_t *per_token, uint64_t *total);

/* Check every CRC of the file in `blob` (in either byte order) after the
 * structural checks, calling `on_bad(user, index, what)` for each failing
 * part: index -2 header, -1 table, >= 0 the tensor-table entry; `what`
 * names it. Stops at the first structural error (reported through on_bad
 * with index -3). `bad_count` (may be NULL) receives the number of
 * failures. Returns 0, COLIBRI_E_BAD_FORMAT, _VERSION, _CRC, _ARG. */
int colibri_verify(const void *blob, size_t size,
                   void (*on_bad)(void *user, int index, const char *what),
                   void *user, uint32_t *bad_count);

/* zlib's CRC-32 (docs/FORMAT.md section 1) of n bytes at data, continuing
 * from crc (0 to start): colibri_crc32(colibri_crc32(0, a, n), b, m) is the
 * CRC of a followed by b. Pure function, any alignment, any thread. */
uint32_t colibri_crc32(uint32_t crc, const void *data, size_t n);

/* The router of one layer, dequantised: router[e * hidden + c] for expert e,
 * column c (float32 values as the runtime uses them: q * scale for I16_ROW).
 * `out` holds n_experts * hidden floats. Returns 0, COLIBRI_E_NOT_INIT,
 * COLIBRI_E_ARG (layer out of range, a dense layer without a router, NULL). */
int colibri_router_weights(const colibri_model *m, uint32_t layer, float *out);

/* Build properties, a combination of the COLIBRI_BUILD_* bits. */
#define COLIBRI_BUILD_MMAP 1u
#define COLIBRI_BUILD_STATIC_WORKBUF 2u
#define COLIBRI_BUILD_DEBUG 4u
#define COLIBRI_BUILD_THREADS 8u   /* COLIBRI_THREADS=1 */
unsigned colibri_build_flags(void);

/* Only in the shared library (libcolibri.so, src/shared_abi.c), for
 * bindings that cannot read this header (Python's ctypes): sizeof
 * (colibri_model), sizeof(colibri_info) and COLIBRI_API_VERSION of the
 * build. Not in libcolibri.a: a static link has the header. */
size_t colibri_abi_sizeof_model(void);
size_t colibri_abi_sizeof_info(void);
int colibri_abi_api_version(void);

/* --- Experts from storage (streamed) ---------------------------------------
 * A model larger than the memory it may use runs with its routed experts
 * (EXPERT_W1/W3/W2, FORMAT.md 3: one expert's sections are contiguous) left
 * in storage. Everything else stays resident: the header, the table, the
 * embedding, attention, norms, routers, shared and dense FFNs, the LM head
 * (their CRCs checked at init), the arena and the KV cache. The experts live
 * in a fixed number of slots, allocated at init: when a token routes to an
 * expert that no slot holds, colibri_infer reads the expert into a slot
 * (one read of its contiguous sections), checks each section's CRC and its
 * floats, and gives up the slot slot_policy names when all are full.
 * Logits are bit-identical to the all-resident instance of the same file,
 * for every number of slots, policy and thread count (the same bytes reach
 * the same kernels; experts already in a slot run first, which changes only
 * the order in which experts are computed, never a sum).
 *
 * What a streamed colibri_infer may do, beyond the all-resident promise (no
 * allocation): for each expert it lacks, call a caller's reader on the
 * calling thread, between the parallel regions. The library's own file
 * reader (colibri_init_ex) instead reads on a thread of its own, started at
 * init and joined by colibri_free: infer hands it the next expert's read
 * (pread; on Linux after a mincore that says whether the page cache holds
 * it already) and the expert's CRC and float check while one expert
 * computes, and waits for it on a mutex and condition variable
 * (clock_gettime times the reads and the waits;
 * COLIBRI_STREAM_SYNC=1 in the environment at init reads on the calling
 * thread instead). With it, colibri_options.prefetch: before a MoE layer's
 * attention, infer applies the layer's FFN norm and router to the residual
 * that enters it, and queues the reads of up to `prefetch` of the experts
 * that predicts (most rows first), so the thread reads while attention
 * runs. When the true routing is known, queued reads it does not use are
 * cancelled; begun ones finish into their slots. Every read is finished
 * before infer returns. A prediction changes which slots hold what, never
 * a logit.
 * On Linux the library's reader maps the file read-only, and where the
 * page cache holds all of its resident sections at init (a warm file in
 * the host's byte order; COLIBRI_STREAM_COPY=1 at init: never) they are
 * checked and used where they are, not copied into the arena, and an
 * expert the page cache holds whole is used there by a slot no read has
 * filled yet, in place of a read (checked as a read is, the mapping opened
 * to it with mprotect and madvise, and closed again when the slot gives
 * it up; colibri_get_stream_stats' resident_mapped and mapped say what
 * was; that check too on the reader's thread, and at init the resident
 * sections' in two halves, one on a thread started and joined there). So
 * infer may also take page
 * faults on those pages, which read them back if the kernel evicted them,
 * and the file must not change while the instance lives (as with a mapped
 * all-resident file). What the process holds is still the budget: the
 * arena, the resident sections and at most a slot's worth a slot.
 * A read that fails or an expert whose
 * CRC or floats are wrong makes the call return COLIBRI_E_IO or
 * COLIBRI_E_CRC / COLIBRI_E_BAD_FORMAT (the detail names the expert):
 * never wrong logits. The slot is emptied, the instance stays usable and
 * its KV cache keeps the n_past tokens before the call (a later call may
 * continue from n_past). */

/* Where the file is: read n bytes at byte `offset` of the file into dst
 * (n >= 1, offset + n <= size); return 0, or a negative value on failure
 * (reported as COLIBRI_E_IO). Called during colibri_init_stream (header,
 * table, resident sections) and during colibri_infer (experts), never
 * concurrently for one instance. On bare metal: a QSPI or SD card driver.
 * Plain data, copied by the library; user must outlive the instance. */
typedef struct colibri_reader {
    int (*read)(void *user, uint64_t offset, void *dst, size_t n);
    void *user;
    uint64_t size;   /* the file's size in bytes */
} colibri_reader;

/* Bytes of arena colibri_init_stream needs for the file `rd` reads with
 * `opt` (opt->expert_slots >= 1, or opt->ram_bytes to derive them from; the
 * slot count used is written to *out_slots, may be NULL). Reads the header,
 * the table and the DESC section, and validates them. The arena holds the
 * plan and buffers of colibri_arena_size (its owned-chunk form), the
 * resident sections packed 64-byte aligned, the per-expert table
 * (n_layers * n_experts entries) and the slots (each the largest expert's
 * sections, rounded up to 64).
 * Returns 0, COLIBRI_E_BAD_FORMAT, _VERSION, _CRC (header or table), _IO,
 * _ARG (rd or out NULL, no slots and no budget, expert_slots above
 * n_layers * n_experts, an ENC_DEC file: no build streams one),
 * _NO_MEMORY (the budget holds no slot, or fewer than expert_slots when both
 * are set: the detail says the bytes needed), _UNSUPPORTED (always in a
 * COLIBRI_STATIC_WORKBUF build, which has no memory for the table: give
 * colibri_init_stream the arena there is, its detail says what it lacks). */
int colibri_stream_arena_size(const colibri_reader *rd,
                              const colibri_options *opt, size_t *out_bytes,
                              uint32_t *out_slots);

/* Open a model whose experts stay in storage, through the caller's reader.
 * `arena`: COLIBRI_ARENA_ALIGN aligned, at least colibri_stream_arena_size
 * bytes, owned by the caller and outliving the model; NULL: allocated (not
 * in COLIBRI_STATIC_WORKBUF builds). opt: as for colibri_stream_arena_size.
 * colibri_init_ex with expert_slots or ram_bytes set does the same with the
 * library's own reader of `path` (then a budget alone decides: when it
 * holds the all-resident instance, file and arena, colibri_init_ex loads it
 * all-resident instead, an ENC_DEC file too). Files in either byte order
 * (sections swapped as they are read). colibri_share of a streamed
 * instance: COLIBRI_E_UNSUPPORTED.
 * Returns what colibri_stream_arena_size returns, plus _ALIGN,
 * _ARENA_TOO_SMALL, _CRC (a resident section), _NO_MEMORY. */
int colibri_init_stream(colibri_model *m, const colibri_reader *rd,
                        void *arena, size_t arena_size,
                        const colibri_options *opt);

/* What the expert slots did since init (or the last reset). Plain data. */
typedef struct colibri_stream_stats {
    uint32_t slots;          /* slots of the instance (0: all resident) */
    uint32_t policy;         /* COLIBRI_SLOTS_* */
    uint64_t slot_bytes;     /* bytes one slot holds */
    uint64_t resident_bytes; /* weights kept resident (packed sections) */
    uint64_t hits;           /* expert uses served from a slot */
    uint64_t misses;         /* expert uses that read the expert */
    uint64_t evictions;      /* misses that gave up an occupied slot */
    uint64_t bytes_read;     /* by the reader during colibri_infer */
    uint64_t read_ns;        /* time inside the library's own file reader
                                (0 with a caller's reader) */
    uint64_t errors;         /* failed reads and damaged experts */
    uint64_t wait_ns;        /* time infer waited for the library's own
                                reader (its reader thread reads the next
                                expert while one computes; 0 with a
                                caller's reader) */
    uint64_t prefetched;     /* reads a prediction started (not misses) */
    uint64_t prefetch_hits;  /* hits on what a prediction read */
    uint64_t prefetch_cancelled; /* of the prefetched, those the routing did
                                not use, cancelled before the reader began
                                them (no bytes read) */
    uint32_t prefetch;       /* experts a layer may prefetch (0: none) */
    uint32_t resident_mapped; /* 1: the resident sections are used where
                                they are in the mapped file (page cache,
                                counted in resident_bytes, not in the
                                arena); 0: read into the arena */
    uint64_t mapped;         /* of the misses and prefetches (not
                                cancelled), experts found in the page cache
                                and used there through the mapped file (no
                                read, no copy) by a slot no read has filled
                                yet */
} colibri_stream_stats;

/* Fill `out` (zeros and slots 0 for an all-resident instance); reset 1
 * clears the counters afterwards. Returns 0, COLIBRI_E_ARG, _NOT_INIT. */
int colibri_get_stream_stats(colibri_model *m, colibri_stream_stats *out,
                             int reset);

/* The routing of every MoE layer pass, for tools that plan a budget or
 * compare slot policies on the routing a real prompt gives (colibri-cli
 * --route-trace, `colibri plan --trace`; docs/STREAMING.md). Any
 * decoder-only instance, streamed or not: the routing is the same bits
 * either way (an ENC_DEC file's top-1 layers are not observed).
 * fn(user, layer, counts, n_experts) is called from colibri_infer on the
 * calling thread, once per MoE layer and chunk of tokens (a prefill of
 * more tokens than a chunk holds calls it once per chunk), after the
 * router and before any expert runs: counts[e] = the tokens of the chunk
 * routed to expert e (n_experts entries; the array is the library's and
 * valid during the call only). fn must not call the library on this
 * instance; what it does (I/O, allocation) is the caller's, so the
 * promise of no system call in infer is then the observer's to keep.
 * NULL fn: none (the default). Returns 0, COLIBRI_E_ARG (m NULL),
 * COLIBRI_E_NOT_INIT. */
typedef void (*colibri_route_fn)(void *user, uint32_t layer, const uint32_t *counts,
                                 uint32_t n_experts);
int colibri_set_route_observer(colibri_model *m, colibri_route_fn fn, void *user);

/* --- Encoder-decoder models (ENC_DEC files: Switch Transformers) ----------
 * An encoder-decoder runs in two calls:
 *   1. colibri_encode(m, ids, mask, batch, seq) runs the encoder once over
 *      `batch` sequences of `seq` tokens (mask as colibri_infer's: 1 real,
 *      0 padding, NULL all real). Its output stays in the arena, and every
 *      decoder layer's cross-attention keys and values are computed from it
 *      there and then (in the KV cache's type, colibri_options.kv_dtype).
 *      It starts a new decoding (the decoder's KV cache is emptied).
 *   2. colibri_infer(m, decoder_ids, NULL, batch, seq, n_past, logits) runs
 *      decoder steps exactly as for a decoder-only model (n_past 0 starts,
 *      n_past > 0 continues from the self-attention KV cache; logits [batch,
 *      seq, vocab]); the first decoder token is normally
 *      colibri_decoder_start(m). It returns COLIBRI_E_KV_STATE before any
 *      colibri_encode and when `batch` differs from the encoded batch.
 * Expert capacity (Switch's top-1 router) counts the tokens of one sequence
 * within one call, as transformers does per forward: a decoder step of one
 * token never overflows. No allocation, no system call.
 * colibri_encode returns 0, COLIBRI_E_INPUT_TOO_LARGE (-1: seq above the
 * file's max_seq_len or batch above max_batch), _ARG (NULL ids, zero sizes,
 * a mask value other than 0/1, a decoder-only model), _TOKEN, _NOT_INIT. */
int colibri_encode(colibri_model *m, const int32_t *input_ids,
                   const uint8_t *attention_mask, uint32_t batch, uint32_t seq);

/* Copy the last colibri_encode's output, [batch, seq, hidden] float32 (the
 * encoder's final-normed hidden states, padding rows included), to out.
 * Returns 0, COLIBRI_E_KV_STATE (nothing encoded yet), _ARG (NULL, or a
 * decoder-only model), _NOT_INIT. */
int colibri_encoder_output(const colibri_model *m, float *out);

/* The decoder's start token (config decoder_start_token_id) of an
 * encoder-decoder model; -1 for a decoder-only model or an uninitialised m. */
int32_t colibri_decoder_start(const colibri_model *m);

#ifdef __cplusplus
}
#endif
#endif /* COLIBRI_H */
