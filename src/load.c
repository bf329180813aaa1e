/*
 * load.c - an instance's life: bringing a file into memory (mmap, or read
 * into huge-page memory), byte-swapping a file of the other byte order into
 * memory the instance owns, zero-copy use of a blob (flash), sharing another
 * instance's weights, giving the instance its arena and plan, and releasing
 * it all. The only file of the runtime that allocates or makes system calls
 * (none at all in COLIBRI_STATIC_WORKBUF builds).
 */
#if !defined(COLIBRI_STATIC_WORKBUF) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* open, fstat, mmap */
#endif
#if !defined(COLIBRI_STATIC_WORKBUF) && defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MADV_HUGEPAGE (alloc_blob) */
#endif

#include "encdec.h"
#include "format.h"
#include "internal.h"

#include <string.h>

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
        if (kind < 1 || kind > COLIBRI_KIND_MAX || kind == COLIBRI_KIND_DESC)
            continue; /* unknown layout: never used; DESC: read as stored */
        clb_weight w = clb_weight_of(b, en, be, s->group_size);
        uint8_t *q = (uint8_t *)w.q;
        if (clb_block_cols(w.dtype)) {
            /* Blocks: only their leading float32 fields (d, Q4_K's dmin). */
            uint64_t nblk = (uint64_t)w.rows * ((w.cols + clb_block_cols(w.dtype) - 1) /
                                                clb_block_cols(w.dtype));
            unsigned nf = w.dtype == COLIBRI_DTYPE_Q4_K ? 2 : 1;
            for (uint64_t k = 0; k < nblk; k++)
                for (unsigned f = 0; f < nf; f++) {
                    uint8_t *x = q + k * clb_block_bytes(w.dtype) + 4 * f, t0 = x[0], t1 = x[1];
                    x[0] = x[3];
                    x[1] = x[2];
                    x[2] = t1;
                    x[3] = t0;
                }
            continue;
        }
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
    if (v->plan) /* the workers first: they read the plan in the arena */
        clb_team_stop(&((clb_plan *)v->plan)->team);
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
static int attach_arena(colibri_model *m, void *arena, size_t arena_size,
                        unsigned kv_dtype)
{
    struct colibri_model_private_ *v = &m->priv_;
    size_t need;
    /* Larger chunks mean a faster prefill (each expert's weights stream once
     * per chunk). An arena we allocate gets COLIBRI_CHUNK_TOKENS_OWNED; a
     * caller's arena gets it too when it is large enough, else the
     * COLIBRI_CHUNK_TOKENS that colibri_arena_size promises. The chunk is a
     * function of the arena size, so equal arenas compute equal bits. */
    uint32_t chunk_limit = COLIBRI_CHUNK_TOKENS_OWNED;
    /* The description again (validated already; the DESC section is never
     * swapped, so it reads the same from a mapping or from our copy). */
    clb_desc d;
    int rc = clb_check_desc(v->blob, v->blob_size, &v->shape, v->file_big_endian,
                            &d, v->detail);
    if (rc == COLIBRI_OK)
        rc = clb_encdec_supported(&d, v->detail); /* encdec=0 builds */
    if (rc == COLIBRI_OK)
        rc = clb_kv_supported(&d, kv_dtype, v->detail);
    if (rc)
        return rc;
    rc = clb_arena_bytes(&v->shape, &d, chunk_limit, kv_dtype, &need);
    if (arena && (rc || arena_size < need)) {
        chunk_limit = COLIBRI_CHUNK_TOKENS;
        rc = clb_arena_bytes(&v->shape, &d, chunk_limit, kv_dtype, &need);
    }
    if (rc) {
        clb_detail(v->detail, DETAIL_CAP, "the arena this model needs does not "
                   "fit in the address space");
        return rc;
    }
    if (arena) {
        if ((uintptr_t)arena % COLIBRI_ARENA_ALIGN) {
            clb_detail(v->detail, DETAIL_CAP, "arena is not %u-byte aligned",
                       (unsigned)COLIBRI_ARENA_ALIGN);
            return COLIBRI_E_ALIGN;
        }
        if (arena_size < need) {
            clb_detail(v->detail, DETAIL_CAP, "arena of %llu bytes, the model "
                       "needs %llu", (unsigned long long)arena_size,
                       (unsigned long long)need);
            return COLIBRI_E_ARENA_TOO_SMALL;
        }
    } else {
#ifdef COLIBRI_STATIC_WORKBUF
        clb_detail(v->detail, DETAIL_CAP, "static work-buffer build: the caller "
                   "must supply an arena of %llu bytes", (unsigned long long)need);
        return COLIBRI_E_ARG;
#else
        arena = alloc64(need, &v->owned_arena);
        if (!arena) {
            clb_detail(v->detail, DETAIL_CAP, "cannot allocate an arena of %llu "
                       "bytes", (unsigned long long)need);
            return COLIBRI_E_NO_MEMORY;
        }
        arena_size = need;
#endif
    }
    memset(arena, 0, need);
    carver c = { (uint8_t *)arena, 0, 0 };
    clb_plan *p;
    clb_layout(&c, &v->shape, &d, chunk_limit, kv_dtype, &p);
    clb_build_plan(p, v->blob, v->file_big_endian, clb_pick_kernels());
    v->arena = arena;
    v->arena_size = arena_size;
    v->plan = p;
    v->kernels = p->k;
    v->kv_dtype = (uint8_t)kv_dtype;
    v->cached_len = 0;
    v->cached_batch = 0;
    v->magic = CLB_MODEL_MAGIC;
    return COLIBRI_OK;
}

int colibri_init_from_memory(colibri_model *m, const void *blob, size_t size,
                             void *arena, size_t arena_size)
{
    return colibri_init_from_memory_ex(m, blob, size, arena, arena_size, NULL);
}

int colibri_init_from_memory_ex(colibri_model *m, const void *blob, size_t size,
                                void *arena, size_t arena_size,
                                const colibri_options *opt)
{
    if (!m)
        return COLIBRI_E_ARG;
    memset(&m->priv_, 0, sizeof m->priv_);
    struct colibri_model_private_ *v = &m->priv_;
    unsigned kv;
    int orc = clb_read_options(opt, &kv, v->detail);
    if (orc)
        return orc;
    if (!blob) {
        clb_detail(v->detail, DETAIL_CAP, "blob is NULL");
        return COLIBRI_E_ARG;
    }
    if ((uintptr_t)blob % COLIBRI_BLOB_ALIGN) {
        clb_detail(v->detail, DETAIL_CAP, "blob is not %u-byte aligned",
                   (unsigned)COLIBRI_BLOB_ALIGN);
        return COLIBRI_E_ALIGN;
    }
    int be;
    int rc = clb_validate((const uint8_t *)blob, size, &v->shape, &be, NULL, v->detail,
                      NULL, NULL, NULL);
    if (rc)
        return rc;
    if (be != host_is_big_endian()) {
        clb_detail(v->detail, DETAIL_CAP, "the file is %s-endian, this host "
                   "%s-endian; zero-copy needs the host order (colibri convert "
                   "--byte-order %s)", be ? "big" : "little",
                   be ? "little" : "big", be ? "little" : "big");
        return COLIBRI_E_BYTE_ORDER;
    }
    v->blob = (const uint8_t *)blob;
    v->blob_size = size;
    v->file_big_endian = (uint8_t)be;
    v->load_mode = CLB_LOAD_MEMORY;
    rc = attach_arena(m, arena, arena_size, kv);
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
        clb_detail(v->detail, DETAIL_CAP, "cannot open %s", path);
        return COLIBRI_E_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 0 ||
        (uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        clb_detail(v->detail, DETAIL_CAP, "cannot stat %s", path);
        return COLIBRI_E_IO;
    }
    size_t size = (size_t)st.st_size;
    if (size < COLIBRI_HEADER_SIZE) { /* mmap of 0 bytes fails: say why */
        close(fd);
        clb_detail(v->detail, DETAIL_CAP, "file is %llu bytes, shorter than the "
                   "%u-byte header (truncated?)", (unsigned long long)size,
                   (unsigned)COLIBRI_HEADER_SIZE);
        return COLIBRI_E_BAD_FORMAT;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        clb_detail(v->detail, DETAIL_CAP, "cannot map %s", path);
        return COLIBRI_E_IO;
    }
    v->map = map;
    v->map_size = size;
    v->blob = (const uint8_t *)map;
    v->blob_size = size;
    v->load_mode = CLB_LOAD_MMAP;
    return COLIBRI_OK;
#else
    FILE *f = fopen(path, "rb");
    if (!f) {
        clb_detail(v->detail, DETAIL_CAP, "cannot open %s", path);
        return COLIBRI_E_IO;
    }
    long end = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        end = ftell(f);
    if (end < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        clb_detail(v->detail, DETAIL_CAP, "cannot size %s", path);
        return COLIBRI_E_IO;
    }
    size_t size = (size_t)end;
    uint8_t *buf = (uint8_t *)alloc_blob(v, size ? size : 1);
    if (!buf) {
        fclose(f);
        clb_detail(v->detail, DETAIL_CAP, "cannot allocate %llu bytes for %s",
                   (unsigned long long)size, path);
        return COLIBRI_E_NO_MEMORY;
    }
    size_t got = fread(buf, 1, size, f);
    fclose(f);
    if (got != size) {
        clb_detail(v->detail, DETAIL_CAP, "short read of %s", path);
        return COLIBRI_E_IO;
    }
    v->blob = buf;
    v->blob_size = size;
    v->load_mode = CLB_LOAD_READ;
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
            clb_detail(v->detail, DETAIL_CAP, "cannot allocate %llu bytes to "
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
    return colibri_init_ex(m, path, NULL);
}

int colibri_init_ex(colibri_model *m, const char *path,
                    const colibri_options *opt)
{
    if (!m)
        return COLIBRI_E_ARG;
    memset(&m->priv_, 0, sizeof m->priv_);
    unsigned kv;
    int orc = clb_read_options(opt, &kv, m->priv_.detail);
    if (orc)
        return orc;
#ifdef COLIBRI_STATIC_WORKBUF
    (void)path;
    (void)kv;
    clb_detail(m->priv_.detail, DETAIL_CAP, "static work-buffer build: load "
               "with colibri_init_from_memory and a caller arena");
    return COLIBRI_E_UNSUPPORTED;
#else
    struct colibri_model_private_ *v = &m->priv_;
    if (!path) {
        clb_detail(v->detail, DETAIL_CAP, "path is NULL");
        return COLIBRI_E_ARG;
    }
    int rc = load_file(m, path);
    int be = 0;
    if (rc == COLIBRI_OK)
        rc = clb_validate(v->blob, v->blob_size, &v->shape, &be, NULL, v->detail, NULL,
                      NULL, NULL);
    v->file_big_endian = (uint8_t)be;
    if (rc == COLIBRI_OK && be != host_is_big_endian())
        rc = make_host_order(m, be);
    if (rc == COLIBRI_OK)
        rc = attach_arena(m, NULL, 0, kv);
    if (rc)
        release(m);
    return rc;
#endif
}

int colibri_share(colibri_model *m, const colibri_model *owner, void *arena,
                  size_t arena_size)
{
    return colibri_share_ex(m, owner, arena, arena_size, NULL);
}

int colibri_share_ex(colibri_model *m, const colibri_model *owner, void *arena,
                     size_t arena_size, const colibri_options *opt)
{
    if (!m || !owner || m == owner)
        return COLIBRI_E_ARG;
    memset(&m->priv_, 0, sizeof m->priv_);
    unsigned kv;
    int orc = clb_read_options(opt, &kv, m->priv_.detail);
    if (orc)
        return orc;
    if (owner->priv_.magic != CLB_MODEL_MAGIC) {
        clb_detail(m->priv_.detail, DETAIL_CAP, "the owner model is not "
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
    v->load_mode = CLB_LOAD_SHARED;
    int rc = attach_arena(m, arena, arena_size, kv);
    if (rc)
        release(m);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Workers (threads.c runs them; here the checks of the public calls)       */
/* ------------------------------------------------------------------------ */

/* The checks both calls share, then the team's new workers: n pthreads
 * (ex NULL) or the executor. */
static int set_team(colibri_model *m, uint32_t n, uint32_t flags,
                    const colibri_executor *ex, int use_ex)
{
    int rc0 = clb_call_begin(m);
    if (rc0)
        return rc0;
    struct colibri_model_private_ *v = &m->priv_;
    if (use_ex && ex)
        n = ex->run ? ex->n_workers : 0;
    if (n == 0 || n > COLIBRI_MAX_THREADS || (flags & ~COLIBRI_THREADS_SPIN)) {
        clb_detail(v->detail, DETAIL_CAP, "%u workers (1 .. 64, an executor "
                   "needs run), flags 0x%x", (unsigned)n, (unsigned)flags);
        return COLIBRI_E_ARG;
    }
#if COLIBRI_THREADS
    clb_team *team = &((clb_plan *)v->plan)->team;
    /* per-worker scratch: one query's attention scores [max_seq_len] */
    int rc = clb_team_set(team, n, flags, use_ex ? ex : NULL, v->shape.max_seq_len);
    if (rc == COLIBRI_E_UNSUPPORTED)
        clb_detail(v->detail, DETAIL_CAP, "no thread pool without malloc: use "
                   "colibri_set_executor");
    else if (rc)
        clb_detail(v->detail, DETAIL_CAP, "cannot create %u threads: running "
                   "on 1", (unsigned)(n - 1));
    return rc;
#else
    if (n == 1)
        return COLIBRI_OK;
    clb_detail(v->detail, DETAIL_CAP, "built with threads=0");
    return COLIBRI_E_UNSUPPORTED;
#endif
}

int colibri_set_threads(colibri_model *m, uint32_t n_threads, uint32_t flags)
{
    return set_team(m, n_threads, flags, NULL, 0);
}

int colibri_set_executor(colibri_model *m, const colibri_executor *ex)
{
    return set_team(m, 1, 0, ex, 1);
}
