/*
 * stream.h - experts from storage (colibri.h, "Experts from storage"): the
 * resident image of a streamed file, the expert slots and their policy.
 * Private to the runtime; stream.c implements it, load.c opens instances
 * with it, moe.c reaches it through clb_plan.routed, held, fetch and take only.
 *
 * A streamed instance's memory is one arena, laid out as
 *   [image: the file's prefix (header, table, DESC) then every resident
 *    section packed 64-byte aligned, the table's offsets rewritten to match
 *    and the experts' set to CLB_NOT_RESIDENT]
 *   [clb_stream, its expert table [L*E], its slot table [N]]
 *   [the plan and buffers of an all-resident instance (plan.c's layout)]
 *   [N slots, each `stride` bytes, aligned to the reader's alignment]
 * so that colibri_stream_arena_size, the budget and the build agree on one
 * number, and bare metal can hand the whole of it over as a static array.
 * Where the file is mapped in the host's byte order (load.c's own reader on
 * Linux), the resident sections stay where they are in it, used from the
 * page cache: the image is then the prefix alone (its table keeps their
 * file offsets), the arena smaller by them, and the budget counts them all
 * the same (clb_stream_slots_for with the whole image).
 */
#ifndef COLIBRI_STREAM_H
#define COLIBRI_STREAM_H

#include "internal.h"

/* What the prefix of a file says about streaming it (clb_stream_geometry). */
typedef struct clb_stream_geom {
    colibri_shape s;
    clb_desc d;
    int be;                  /* the file's byte order */
    uint64_t file_size;
    uint64_t prefix_bytes;   /* header, table, DESC (clb_prefix_bytes) */
    uint64_t image_bytes;    /* prefix + resident sections, packed */
    uint64_t resident_bytes; /* the resident sections alone */
    uint64_t max_span;       /* the largest expert's sections, first to last */
    uint32_t n_streamed;     /* experts in the file (routed, all layers) */
} clb_stream_geom;

/* A streamed file mapped in memory in the host's byte order (load.c's own
 * reader on Linux): the instance uses its resident sections where they
 * are in it. */
typedef struct clb_stream_map {
    const uint8_t *base; /* the whole file, valid while the instance lives */
    /* cached(user, off, n): 1 when the page cache holds all of the file's
     * bytes [off, off + n) now; 0 when not, or not known. The resident
     * sections are used from base only where it holds all of them (a warm
     * file): a cold one reads them into the arena, whose memory nothing
     * else can take, where mapped pages would be what a memory limit
     * reclaims first and reads back a fault at a time (measured inside
     * 512 MiB: a cold first token 1.2 s copied, 3.0 s mapped). */
    int (*cached)(void *user, uint64_t off, uint64_t n);
    /* want(user, off, n), or NULL: called for every resident section
     * before any is checked (the mapper may begin reading them in) */
    void (*want)(void *user, uint64_t off, uint64_t n);
    /* hide(user, off, n), or NULL: called for every expert before any
     * resident section is touched (at init, once for each run of experts
     * adjacent in the file: [off, off + n) from the first's bytes to the
     * last's, the padding between them included), and for an expert a
     * slot gives up; the instance never reads those bytes through base
     * (but where it shows them), so the mapper may make them inaccessible
     * (load.c does, so that the kernel maps no expert page around a
     * resident one it faults in) */
    void (*hide)(void *user, uint64_t off, uint64_t n);
    /* show(user, off, n), or NULL: 1 when the expert's bytes [off, off + n)
     * are all in the page cache now and readable through base from now on
     * (until hide, which also takes them out of the process's memory); 0:
     * read them instead. A slot whose memory no read has touched takes an
     * expert shown so, in place of a read: a warm file fills it with no
     * copy, and the process's memory grows by the expert's pages, not by
     * the slot's. */
    int (*show)(void *user, uint64_t off, uint64_t n);
    /* both(fn, arg), or NULL: fn(arg, 0) and fn(arg, 1), on two threads
     * where the mapper can start one (else one after the other), returning
     * once both have: init's check of the resident sections, in halves */
    void (*both)(void (*fn)(void *arg, int half), void *arg);
    void *user;
} clb_stream_map;

/* One routed expert of the file. */
typedef struct clb_stream_expert {
    uint64_t off;      /* file offset of its first section */
    uint64_t span;     /* bytes from there to the end of its last section */
    uint32_t entry;    /* table index of its first section; the others follow */
    uint32_t rel[3];   /* each section's offset from off (W1, [W3,] W2) */
    uint32_t uses;     /* COLIBRI_SLOTS_FREQ's count */
    uint32_t picked;   /* COLIBRI_SLOTS_REUSE: passes of its layer that
                          routed to it (halved with the layer's visits) */
    uint32_t recent;   /* COLIBRI_SLOTS_REUSE: recency register, Q16 */
    int32_t slot;      /* the slot holding it, or -1 */
    int32_t fetching;  /* the slot its read in flight goes to, or -1 */
    uint8_t n_mats;    /* 3 (SwiGLU) or 2 (RELU_FFN) */
    uint8_t prefetched; /* its read (in flight or done) was a prefetch's,
                           and no use has met it yet */
    uint8_t awaited;   /* the pass running uses it and has not taken it
                          yet: its slot is not given up */
} clb_stream_expert;

struct clb_stream;

/* One fill of a slot: expert idx's bytes shown through the map where the
 * slot may take them so (may_show) and the map can, else read into the
 * slot's memory. clb_fill_run does it, on the reader's thread
 * (clb_stream_io) or at once: either way the same bits. A shown expert is
 * checked there too (each section's CRC and floats), so that infer computes
 * one expert while the reader thread shows and checks the next; a read one
 * is checked by the taker, on infer's thread, so that the reader goes on
 * to the next read while infer checks (a cold file's reads are what a run
 * waits for: checked on the reader thread, a 512 MiB run decoded 15 %
 * slower). */
typedef struct clb_fill {
    const struct clb_stream *st;
    uint32_t idx;       /* the expert (layer * n_experts + expert) */
    uint32_t slot;      /* the slot it fills */
    uint8_t may_show;   /* the slot's memory is untouched (clb_slot.touched) */
    uint8_t queued;     /* begun on the reader's thread: its finish awaits it */
    /* what it did */
    uint8_t shown;      /* the map's bytes, shown: nothing read */
    int read_rc;        /* 0, -1 (the read failed) or CLB_READ_CANCELLED */
    int check_rc;       /* a shown expert's check (COLIBRI_E_*), 0 when it
                           passed or did not run; its detail is found
                           again on infer's thread (the check is
                           repeatable: nothing is swapped unless all of
                           it passes) */
} clb_fill;

/* Do fill f: show (and check) or read through `read` (colibri_reader.read's
 * contract, with its user). Touches only the slot's memory, the map's
 * pages of the expert and f's results: safe on another thread while the
 * instance runs, as long as nothing else touches that slot. */
void clb_fill_run(clb_fill *f, int (*read)(void *user, uint64_t off, void *dst, size_t n),
                  void *user);

/* One slot: memory for one expert, and the views into it while full. */
typedef struct clb_slot {
    uint8_t *mem;       /* stride bytes, aligned to the reader's alignment */
    int32_t expert;     /* layer * n_experts + expert, or -1 (empty) */
    uint64_t last_use;  /* the stream's tick at its last use */
    uint8_t pending;    /* a fill of it is in flight (stream_fetch) */
    uint8_t mapped;     /* its expert is the map's bytes, shown, not read
                           into mem */
    uint8_t touched;    /* a read has filled mem: its pages are in use */
    clb_fill fill;      /* the last fill begun */
    clb_expert views;   /* the expert's matrices in mem */
} clb_slot;

/* An asynchronous reader (the library's own, with a reader thread: load.c):
 * start(user, f) begins fill f on the reader's thread (clb_fill_run with
 * its own read; 0, or -1 if it cannot begin); finish(user) waits for the
 * oldest fill begun and not yet finished. At most `capacity` fills are in
 * flight (stream.c finishes the oldest first when it would pass that). */
typedef struct clb_stream_io {
    int (*start)(void *user, clb_fill *f);
    void (*finish)(void *user);
    /* cancel(user, k): the k-th oldest fill not yet finished (0: the
     * oldest) is not done if the reader has not begun it: 1 then (its
     * read_rc CLB_READ_CANCELLED), else 0 */
    int (*cancel)(void *user, uint32_t k);
    void *user;
    uint32_t capacity;
} clb_stream_io;
#define CLB_READ_CANCELLED 1

/* The most reads a stream keeps in flight: a prefetched layer's experts and
 * the read-ahead. */
#define CLB_STREAM_FIFO 16u

typedef struct clb_stream {
    colibri_reader rd;     /* infer's own reads (timed as waiting) */
    clb_stream_io io;      /* start NULL: every read on rd, when fetched */
    clb_stream_map map;    /* base NULL: none (every expert read) */
    uint32_t align;        /* the reader's offset/length/address alignment
                              (1, or 4096 for the library's O_DIRECT file) */
    uint32_t n_slots, policy;
    uint64_t stride;       /* bytes per slot */
    uint64_t tick;
    uint64_t *read_ns;     /* where the library's file reader adds its time,
                              or NULL */
    uint64_t *wait_ns;     /* where it adds the time infer waited for reads,
                              or NULL */
    const uint8_t *table;  /* the image's table (file byte order) */
    uint64_t file_size;
    uint32_t group;
    int be;
    uint32_t n_experts;         /* per layer (E) */
    uint32_t n_exp;             /* L * E */
    uint32_t n_layers;          /* L */
    clb_stream_expert *experts; /* [L*E]; entries of dense layers unused */
    uint32_t *visits;           /* [L] MoE passes of each layer (REUSE) */
    clb_slot *slots;            /* [n_slots] */
    /* the experts (L*E index) whose reads are in flight, oldest first:
     * reads finish in the order they started */
    uint32_t fifo[CLB_STREAM_FIFO];
    uint32_t fifo_head, fifo_len;
    uint32_t top_k;
    colibri_stream_stats st;
} clb_stream;

/* Check a file's prefix (its first g->prefix_bytes bytes at `prefix`, the
 * whole file size_t `size`) and measure it for streaming: structure as
 * clb_validate_prefix, then the resident and streamed parts. ENC_DEC files:
 * COLIBRI_E_ARG (no build streams them). */
int clb_stream_geometry(const uint8_t *prefix, uint64_t size, clb_stream_geom *g,
                        char *detail);

/* Bytes of one slot for a reader of alignment `align` (1 or a power of 2). */
uint64_t clb_slot_stride(const clb_stream_geom *g, uint32_t align);

/* The whole arena of a streamed instance with n_slots slots (the layout
 * above; chunk_limit as plan.c's), COLIBRI_E_NO_MEMORY past size_t. */
int clb_stream_arena_bytes(const clb_stream_geom *g, uint32_t n_slots,
                           uint32_t align, uint32_t chunk_limit, unsigned kv_dtype,
                           size_t *out);

/* 1 when map->cached says the page cache holds every resident section of
 * the file whose prefix (g->prefix_bytes, checked by clb_stream_geometry)
 * is at `prefix`: then an instance uses them through the map. */
int clb_stream_resident_cached(const uint8_t *prefix, const clb_stream_geom *g,
                               const clb_stream_map *map);

/* Where the slots begin in that arena (they are its last part). */
uint64_t clb_stream_slots_at(const clb_stream_geom *g, uint32_t n_slots, uint32_t align,
                             uint32_t chunk_limit, unsigned kv_dtype);

/* The most slots a budget of `ram` bytes holds (capped at the file's
 * experts); 0 if not even one. *least gets the budget one slot needs. */
uint32_t clb_stream_slots_for(const clb_stream_geom *g, uint64_t ram, uint32_t align,
                              uint32_t chunk_limit, unsigned kv_dtype,
                              uint64_t *least);


/* Build a streamed instance in `arena` (at least clb_stream_arena_bytes,
 * 64-byte aligned, its first g->prefix_bytes holding the file's prefix
 * already, the rest zeroed up to the slots, which need not be): read the resident sections through rd, check
 * each one's CRC and floats, swap them to the host order, rewrite the
 * image's table, build the plan; *plan receives it. With `map` (g->be the
 * host's order; g's image_bytes then the prefix's, rounded to 64) the
 * resident sections are checked and used where they are in map->base
 * instead, nothing read, and slots may take experts the map shows. */
int clb_stream_build(uint8_t *arena, const clb_stream_geom *g, const colibri_reader *rd,
                     const clb_stream_map *map, uint32_t align, uint32_t n_slots,
                     uint32_t policy, uint32_t chunk_limit, unsigned kv_dtype,
                     clb_plan **plan, char *detail);

/* Let a streamed instance whose reads are asynchronous (st->io set) read
 * up to `want` of a MoE layer's experts predicted before its attention
 * (colibri_options.prefetch; clb_moe_prefetch): lowered to top_k and to
 * what the reader and the slots allow, 0 where they allow none (a caller's
 * reader reads on infer's thread: nothing would overlap). What it allows
 * goes to the stats' `prefetch`. */
void clb_stream_prefetch_on(clb_plan *p, uint32_t want);

#endif /* COLIBRI_STREAM_H */
