/*
 * load.c - an instance's life: bringing a file into memory (mmap, or read
 * into huge-page memory), byte-swapping a file of the other byte order into
 * memory the instance owns, zero-copy use of a blob (flash), sharing another
 * instance's weights, giving the instance its arena and plan, and releasing
 * it all; opening a streamed instance (stream.c builds it) and the file
 * reader of its experts. The only file of the runtime that allocates or
 * makes system calls (none at all in COLIBRI_STATIC_WORKBUF builds).
 */
#if !defined(COLIBRI_STATIC_WORKBUF) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* open, fstat, mmap */
#endif
#if !defined(COLIBRI_STATIC_WORKBUF) && defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MADV_HUGEPAGE (alloc_blob) */
#endif
#if !defined(COLIBRI_STATIC_WORKBUF) && defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* O_DIRECT (the streamed experts' file reader) */
#endif

#include "encdec.h"
#include "format.h"
#include "internal.h"
#include "stream.h"

#include <string.h>

#ifndef COLIBRI_STATIC_WORKBUF
#include <stdio.h>
#include <stdlib.h>
#if COLIBRI_ENABLE_POSIX_IO
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#endif
#if COLIBRI_ENABLE_MMAP || defined(__linux__)
#include <sys/mman.h>
#endif
#if COLIBRI_ENABLE_POSIX_IO && COLIBRI_THREADS
#include <pthread.h>
#define CLB_READER_THREAD 1
#endif
#if COLIBRI_ENABLE_POSIX_IO && defined(__linux__)
/* The streamed reader asks the page cache what it holds (mincore over a
 * mapping of the file it never touches): see file_read. */
#define CLB_CACHE_PROBE 1
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

/* n bytes aligned to 64 for a large buffer the model owns: on Linux, from
 * 2 MiB, an anonymous mapping aligned to 2 MiB and advised MADV_HUGEPAGE
 * (recorded in *map, *map_size for munmap), so that transparent huge pages
 * can back it where the system allows ("madvise" or "always"); the advice
 * failing is harmless. Else malloc (recorded in *owned). */
#define CLB_HUGE_PAGE ((size_t)2 << 20)
#if defined(__linux__) && defined(MADV_HUGEPAGE)
#define CLB_HUGE_ALLOC 1
#else
#define CLB_HUGE_ALLOC 0
#endif
static void *alloc_big(size_t n, void **map_out, size_t *map_size, void **owned)
{
#if CLB_HUGE_ALLOC
    if (n >= CLB_HUGE_PAGE && n <= SIZE_MAX - CLB_HUGE_PAGE) {
        void *map = mmap(NULL, n + CLB_HUGE_PAGE, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map != MAP_FAILED) {
            uintptr_t a = ((uintptr_t)map + CLB_HUGE_PAGE - 1) & ~(uintptr_t)(CLB_HUGE_PAGE - 1);
            (void)madvise((void *)a, n, MADV_HUGEPAGE);
            *map_out = map;
            *map_size = n + CLB_HUGE_PAGE;
            return (void *)a;
        }
    }
#else
    (void)map_out;
    (void)map_size;
#endif
    return alloc64(n, owned);
}

/* The model's own copy of the file (read, or byte-swapped). */
static void *alloc_blob(struct colibri_model_private_ *v, size_t n)
{
    return alloc_big(n, &v->huge, &v->huge_size, &v->owned_blob);
}

/* The arena the library allocates: huge pages too, for the KV cache, which
 * attention at depth reads row block by row block (with 4 KiB pages a
 * 2048-position decode step of the bench model spent a third of its
 * attention time in page walks). */
static void *alloc_arena(struct colibri_model_private_ *v, size_t n)
{
    return alloc_big(n, &v->huge_arena, &v->huge_arena_size, &v->owned_arena);
}

/* Swap every section's data of a validated file in place (values by their
 * width, float32 scales by 4). The header and table stay as stored. */
static void swap_sections(uint8_t *b, const colibri_shape *s, int be)
{
    const uint8_t *tab = b + COLIBRI_TABLE_OFFSET;
    for (uint32_t i = 0; i < s->n_tensors; i++) {
        const uint8_t *en = tab + (size_t)i * COLIBRI_ENTRY_SIZE;
        clb_swap_section(b + rd64(en + COLIBRI_ENT_OFFSET, be), en, be, s->group_size);
    }
}
#endif

#ifndef COLIBRI_STATIC_WORKBUF
/* The library's own reader of a streamed instance's file: pread, and for
 * expert reads O_DIRECT where the file system takes it, so experts do not
 * also fill the page cache a memory budget charges for (a cgroup counts
 * it). Time inside it goes to ns.
 * Its alignment contract with stream.c (align CLB_DIRECT_ALIGN): a read of
 * whole blocks (offset, length and buffer multiples of the block) may reach
 * past the end of the file, which its last block holds; any other read is
 * exact and goes through the page cache. Only whole-block reads go direct:
 * the header, the prefix and the resident sections land in buffers sized
 * to the byte, which may still happen to start on a block boundary. */
#define CLB_DIRECT_ALIGN 4096u

/* Its thread (CLB_READER_THREAD builds), so that infer computes one expert
 * while the next is read, or shown and checked (stream.h clb_stream_io):
 * fills queue in a ring of CLB_READS_IN_FLIGHT, begun by the infer thread
 * (read_start), done in order by the reader thread, taken in order
 * (read_finish). `begun`, `done` and `taken` count fills; the mutex orders
 * every access to the ring and the counters, and hands each fill's results
 * over. Started at init, joined at colibri_free. */
#define CLB_READS_IN_FLIGHT CLB_STREAM_FIFO
typedef struct read_job {
    clb_fill *fill;
    int cancelled;       /* read_cancel's: the thread skips it */
} read_job;

typedef struct file_reader {
    int fd, fd_direct;   /* fd_direct -1: none (or refused) */
    uint64_t size;       /* of the file, when opened */
    uint64_t ns;         /* time in reads (the thread's, when it reads) */
    uint64_t wait_ns;    /* time infer waited for reads */
#ifdef CLB_CACHE_PROBE
    /* The file mapped read-only (NULL: no address space for it, e.g. on
     * a 32-bit host): mincore's window on which of its pages the page
     * cache holds, and where the instance uses its resident sections
     * (stream.h clb_stream_map; its experts' pages made inaccessible). */
    const uint8_t *view;
    size_t page;         /* the page size */
    /* 1: mincore tells the truth about this file. Linux tells it only to a
     * process that owns the file or may write it, and answers "cached" for
     * every page to any other: then nothing is known, as without a view. */
    int probe;
    /* What the reader may bring into the page cache, and whether it was
     * there before: a bit a page each (NULL: not known), set by note_pages
     * before a read through the cache (or the kernel's, for a resident
     * section the view maps), so that drop_new_pages takes out exactly what
     * the reader brought in. The file's readahead is off (FADV_RANDOM,
     * MADV_RANDOM): nothing else comes in. */
    uint8_t *known, *cached;
#endif
#ifdef CLB_READER_THREAD
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t job, result;
    read_job ring[CLB_READS_IN_FLIGHT];
    uint64_t begun, done, taken;
    uint64_t picked;     /* reads the thread has begun (done, or done + 1) */
    int running, quit;
#endif
} file_reader;

#ifdef CLB_READER_THREAD
static void stop_reader_thread(file_reader *r)
{
    if (!r->running)
        return;
    pthread_mutex_lock(&r->mu);
    r->quit = 1;
    pthread_cond_signal(&r->job);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    pthread_cond_destroy(&r->job);
    pthread_cond_destroy(&r->result);
    pthread_mutex_destroy(&r->mu);
    r->running = 0;
}
#endif

#ifdef CLB_CACHE_PROBE
static void drop_new_pages(const file_reader *r);
#endif

static void close_file_reader(void *user)
{
#if COLIBRI_ENABLE_POSIX_IO
    file_reader *r = (file_reader *)user;
    if (!r)
        return;
#ifdef CLB_READER_THREAD
    stop_reader_thread(r);
#endif
#ifdef CLB_CACHE_PROBE
    if (r->view)
        munmap((void *)(uintptr_t)r->view, (size_t)r->size);
    if (r->known) /* unmapped first: mapped pages are not dropped */
        drop_new_pages(r);
    free(r->known);
    free(r->cached);
#endif
    close(r->fd);
    if (r->fd_direct >= 0)
        close(r->fd_direct);
    free(r);
#else
    (void)user;
#endif
}

#if COLIBRI_ENABLE_POSIX_IO
static uint64_t now_ns(void)
{
    struct timespec t;
    if (clock_gettime(CLOCK_MONOTONIC, &t) != 0)
        return 0;
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* n bytes at off with fd, or at least at_least of them when the file ends
 * first (a whole-block read's last block); -1 on error or a short file. */
static int pread_all(int fd, uint64_t off, uint8_t *dst, size_t n, size_t at_least)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, dst + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return got >= at_least ? 0 : -1;
}

#ifdef CLB_CACHE_PROBE
/* Pages mincore is asked about at once (its answer: a byte a page). */
enum { CLB_PROBE_PAGES = 4096 };

/* vec[i] & 1: page first + i of the file is in the page cache, for the k
 * (<= CLB_PROBE_PAGES) pages from `first` that the file holds; 0, or -1
 * when mincore fails. */
static int probe_pages(const file_reader *r, uint64_t first, uint64_t k, unsigned char *vec)
{
    const uint64_t a = first * r->page, b = (first + k) * r->page;
    return mincore((void *)(uintptr_t)(r->view + a), (size_t)((b < r->size ? b : r->size) - a),
                   vec);
}

/* 1 when every page of the file's bytes [off, off + n) is in the page
 * cache now; 0 when one is not, or unknown. */
static int in_page_cache(const file_reader *r, uint64_t off, size_t n)
{
    if (!r->probe || n == 0 || off >= r->size)
        return 0;
    const uint64_t end = off + n > r->size ? r->size : off + n;
    const uint64_t last = (end + r->page - 1) / r->page;
    unsigned char vec[CLB_PROBE_PAGES];
    for (uint64_t p = off / r->page; p < last; p += CLB_PROBE_PAGES) {
        const uint64_t k = last - p < CLB_PROBE_PAGES ? last - p : CLB_PROBE_PAGES;
        if (probe_pages(r, p, k, vec) != 0)
            return 0;
        for (uint64_t i = 0; i < k; i++)
            if (!(vec[i] & 1u))
                return 0;
    }
    return 1;
}

static int bit(const uint8_t *bits, uint64_t i)
{
    return bits[i / 8] >> (i % 8) & 1;
}

/* The bitmaps of file_reader.known and .cached (1 bit a page: 32 KiB a
 * GiB each), empty; left NULL when the page cache cannot be asked (no
 * probe) or there is no memory for them. */
static void page_maps(file_reader *r)
{
    if (!r->probe)
        return;
    const size_t bytes = (size_t)((r->size / r->page + 8) / 8);
    r->known = (uint8_t *)calloc(bytes, 1);
    r->cached = (uint8_t *)calloc(bytes, 1);
    if (!r->known || !r->cached) {
        free(r->known);
        free(r->cached);
        r->known = r->cached = NULL;
    }
}

/* Before a read (or a fault) that may bring the file's bytes [off, off + n)
 * into the page cache: which of their pages not yet known the cache holds
 * now (one mincore for those it has not been asked about). */
static void note_pages(file_reader *r, uint64_t off, uint64_t n)
{
    if (!r->known || n == 0 || off >= r->size)
        return;
    const uint64_t end = off + n > r->size ? r->size : off + n;
    const uint64_t last = (end + r->page - 1) / r->page;
    unsigned char vec[CLB_PROBE_PAGES];
    for (uint64_t p = off / r->page; p < last; p += CLB_PROBE_PAGES) {
        const uint64_t k = last - p < CLB_PROBE_PAGES ? last - p : CLB_PROBE_PAGES;
        uint64_t i = 0;
        while (i < k && bit(r->known, p + i))
            i++;
        if (i == k)
            continue; /* all asked about before */
        if (probe_pages(r, p, k, vec) != 0)
            memset(vec, 1, (size_t)k); /* unknown: say cached, never dropped */
        for (; i < k; i++) {
            if (bit(r->known, p + i))
                continue;
            r->known[(p + i) / 8] |= (uint8_t)(1u << ((p + i) % 8));
            r->cached[(p + i) / 8] |= (uint8_t)((vec[i] & 1u) << ((p + i) % 8));
        }
    }
}

/* 1: page p of the file is one the reader brought into the page cache
 * (note_pages knows it, and it was not cached before), or nothing is known */
static int brought_in(const file_reader *r, uint64_t p)
{
    return !r->known || (bit(r->known, p) && !bit(r->cached, p));
}

/* Takes out of the page cache every page the reader brought in (without
 * the maps, e.g. where the cache cannot be asked, the whole file but what
 * is mapped), after init (the prefix, and the resident part where it was
 * read) and at colibri_free (the resident part used from the view, once
 * unmapped), so that what a memory cgroup charges is the instance's own
 * memory and what it maps; pages that were cached stay. */
static void drop_new_pages(const file_reader *r)
{
#ifdef POSIX_FADV_DONTNEED
    const uint64_t pages = (r->size + r->page - 1) / r->page;
    uint64_t p = 0;
    while (p < pages) {
        /* eight pages a step where none of them was brought in (of a warm
         * file's million pages, most) */
        if (r->known && p % 8 == 0 && p + 8 <= pages &&
            !(r->known[p / 8] & (uint8_t)~r->cached[p / 8])) {
            p += 8;
            continue;
        }
        if (!brought_in(r, p)) {
            p++;
            continue;
        }
        const uint64_t a = p;
        while (p < pages && brought_in(r, p))
            p++;
        (void)posix_fadvise(r->fd, (off_t)(a * r->page), (off_t)((p - a) * r->page),
                            POSIX_FADV_DONTNEED);
    }
#else
    (void)r;
#endif
}

/* clb_stream_map.cached: with the maps, the pages noted (the resident
 * sections it asks about are the ones init then uses or reads: one mincore
 * each, not one here and one in want_section or file_read) and answered
 * from them. */
static int cached_range(void *user, uint64_t off, uint64_t n)
{
    file_reader *r = (file_reader *)user;
    if (!r->known || n == 0 || off >= r->size)
        return in_page_cache(r, off, (size_t)n);
    note_pages(r, off, n);
    const uint64_t end = off + n > r->size ? r->size : off + n;
    for (uint64_t p = off / r->page; p < (end + r->page - 1) / r->page; p++)
        if (!bit(r->cached, p))
            return 0;
    return 1;
}

/* clb_stream_map.want: a resident section's pages noted, and their reading
 * begun (the view's readahead is off), so that the CRC pass over them
 * waits for the disk no longer than the disk takes. */
static void want_section(void *user, uint64_t off, uint64_t n)
{
    file_reader *r = (file_reader *)user;
    note_pages(r, off, n);
#ifdef POSIX_FADV_WILLNEED
    (void)posix_fadvise(r->fd, (off_t)off, (off_t)n, POSIX_FADV_WILLNEED);
#endif
}

/* The pages of the file's bytes [off, off + n) in the view, [*a, *b):
 * whole, those that hold nothing else; else every page any of them is in
 * (up to the view's last page). */
static void pages_of(const file_reader *r, uint64_t off, uint64_t n, int whole,
                     uint64_t *a, uint64_t *b)
{
    const uint64_t pg = r->page, last = (r->size + pg - 1) / pg * pg;
    *a = whole ? (off + pg - 1) / pg * pg : off / pg * pg;
    *b = whole ? (off + n) / pg * pg : (off + n + pg - 1) / pg * pg;
    if (*b > last)
        *b = last;
}

/* clb_stream_map.hide: the whole pages of an expert's bytes (or of a run
 * of experts) in the view leave the process's memory and become
 * inaccessible, so that a fault on a resident page next to them (the
 * kernel maps up to 64 KiB around it from the page cache) maps none of
 * them: the process holds the resident part of the file and the experts
 * its slots show, nothing more. mincore still answers for them. */
static void hide_expert(void *user, uint64_t off, uint64_t n)
{
    const file_reader *r = (const file_reader *)user;
    uint64_t a, b;
    pages_of(r, off, n, 1, &a, &b);
    if (b > a)
        (void)mprotect((void *)(uintptr_t)(r->view + a), (size_t)(b - a), PROT_NONE);
    /* out of memory with the pages it shares at either end (a neighbour
     * that needs one faults it back in from the page cache) */
    pages_of(r, off, n, 0, &a, &b);
    (void)madvise((void *)(uintptr_t)(r->view + a), (size_t)(b - a), MADV_DONTNEED);
}

/* clb_stream_map.show: an expert whose every page the page cache holds is
 * made readable in the view (and its pages mapped now, where the kernel
 * can: MADV_POPULATE_READ, 5.14), for a slot to use in place of a read. A
 * page evicted since is read back by the fault that needs it. */
static int show_expert(void *user, uint64_t off, uint64_t n)
{
    const file_reader *r = (const file_reader *)user;
    if (!in_page_cache(r, off, (size_t)n))
        return 0;
    /* every page the expert is in: one it shares with an expert next to
     * it was made inaccessible with the run they are in at init */
    uint64_t a, b;
    pages_of(r, off, n, 0, &a, &b);
    void *at = (void *)(uintptr_t)(r->view + a);
    if (b > a && mprotect(at, (size_t)(b - a), PROT_READ) != 0)
        return 0;
#ifdef MADV_POPULATE_READ
    if (b > a)
        (void)madvise(at, (size_t)(b - a), MADV_POPULATE_READ);
#endif
    return 1;
}
#endif

/* An expert read already in the page cache (a warm file: another process
 * mapped it, or a run read it buffered) is read from there, at memory
 * speed; one that is not is read direct (O_DIRECT) where the file system
 * takes it, so it does not enter the cache. Init's reads (the resident part)
 * go through the cache, and what they bring in is dropped after init
 * (drop_new_pages). So a budgeted run never leaves pages in the page
 * cache and takes none away, and a warm file loads and streams without
 * waiting for the disk (docs/STREAMING.md). A page evicted between the
 * check and the read is read from the disk through the cache. */
static int file_read(void *user, uint64_t off, void *dst, size_t n)
{
    file_reader *r = (file_reader *)user;
    uint64_t t0 = now_ns();
    int rc = -1;
    if (off >= r->size)
        return -1;
    /* a whole-block read may end past the file: what the file holds */
    size_t need = off + n > r->size ? (size_t)(r->size - off) : n;
    int whole = off % CLB_DIRECT_ALIGN == 0 && n % CLB_DIRECT_ALIGN == 0 &&
                (uintptr_t)dst % CLB_DIRECT_ALIGN == 0;
    if (!whole && need < n)
        return -1; /* only a whole-block read may pass the end */
#ifdef CLB_CACHE_PROBE
    const int warm = r->fd_direct >= 0 && whole && in_page_cache(r, off, need);
#else
    const int warm = 0;
#endif
    if (r->fd_direct >= 0 && whole && !warm) {
        rc = pread_all(r->fd_direct, off, (uint8_t *)dst, n, need);
        if (rc != 0 && errno == EINVAL) { /* the file system refuses it */
            close(r->fd_direct);
            r->fd_direct = -1;
        }
    }
    if (rc != 0) {
#ifdef CLB_CACHE_PROBE
        if (!warm) /* through the cache: what it brings in is noted */
            note_pages(r, off, need);
#endif
        rc = pread_all(r->fd, off, (uint8_t *)dst, n, need);
    }
    r->ns += now_ns() - t0;
    return rc;
}

/* The same read on infer's thread, timed as waiting (the synchronous
 * reader: COLIBRI_STREAM_SYNC=1, or no threads). */
static int file_read_waited(void *user, uint64_t off, void *dst, size_t n)
{
    file_reader *r = (file_reader *)user;
    uint64_t t0 = now_ns();
    int rc = file_read(user, off, dst, n);
    r->wait_ns += now_ns() - t0;
    return rc;
}

#ifdef CLB_READER_THREAD
static void *reader_main(void *user)
{
    file_reader *r = (file_reader *)user;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (r->done == r->begun && !r->quit)
            pthread_cond_wait(&r->job, &r->mu);
        if (r->done == r->begun) /* quit, and nothing left to read */
            break;
        read_job *j = &r->ring[r->done % CLB_READS_IN_FLIGHT];
        r->picked = r->done + 1;
        if (j->cancelled) {
            j->fill->read_rc = CLB_READ_CANCELLED;
        } else {
            pthread_mutex_unlock(&r->mu);
            clb_fill_run(j->fill, file_read, r);
            pthread_mutex_lock(&r->mu);
        }
        r->done++;
        pthread_cond_signal(&r->result);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* clb_stream_map.both: fn(arg, 1) on a thread of its own while this one
 * runs fn(arg, 0) (init checks the resident part in halves: 318 MB of the
 * 7B q4 model, the CRC at one core's read speed); one after the other if
 * the thread cannot start. */
typedef struct half_job {
    void (*fn)(void *arg, int half);
    void *arg;
} half_job;

static void *second_half(void *user)
{
    const half_job *j = (const half_job *)user;
    j->fn(j->arg, 1);
    return NULL;
}

static void run_both(void (*fn)(void *arg, int half), void *arg)
{
    half_job j = { fn, arg };
    pthread_t t;
    int threaded = pthread_create(&t, NULL, second_half, &j) == 0;
    fn(arg, 0);
    if (threaded)
        pthread_join(t, NULL);
    else
        fn(arg, 1);
}

/* clb_stream_io.start: -1 when the ring is full (never: stream.c keeps at
 * most its capacity in flight). */
static int read_start(void *user, clb_fill *f)
{
    file_reader *r = (file_reader *)user;
    int rc = -1;
    pthread_mutex_lock(&r->mu);
    if (r->begun - r->taken < CLB_READS_IN_FLIGHT) {
        r->ring[r->begun % CLB_READS_IN_FLIGHT] = (read_job){ f, 0 };
        r->begun++;
        pthread_cond_signal(&r->job);
        rc = 0;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* clb_stream_io.cancel: the k-th oldest read not yet taken, unless the
 * thread has begun it. */
static int read_cancel(void *user, uint32_t k)
{
    file_reader *r = (file_reader *)user;
    int rc = 0;
    pthread_mutex_lock(&r->mu);
    uint64_t n = r->taken + k;
    if (n >= r->picked && n < r->begun) {
        r->ring[n % CLB_READS_IN_FLIGHT].cancelled = 1;
        rc = 1;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* clb_stream_io.finish: the oldest fill not yet taken. */
static void read_finish(void *user)
{
    file_reader *r = (file_reader *)user;
    uint64_t t0 = now_ns();
    pthread_mutex_lock(&r->mu);
    if (r->taken < r->begun) {
        while (r->done <= r->taken)
            pthread_cond_wait(&r->result, &r->mu);
        r->taken++;
    }
    pthread_mutex_unlock(&r->mu);
    r->wait_ns += now_ns() - t0;
}

/* The reader thread, unless COLIBRI_STREAM_SYNC=1 (to measure one against
 * the other: bench/stream.py) or it cannot start: 1 if running. */
static int start_reader_thread(file_reader *r)
{
    const char *sync = getenv("COLIBRI_STREAM_SYNC");
    if (sync && sync[0] == '1')
        return 0;
    if (pthread_mutex_init(&r->mu, NULL) != 0)
        return 0;
    if (pthread_cond_init(&r->job, NULL) != 0) {
        pthread_mutex_destroy(&r->mu);
        return 0;
    }
    if (pthread_cond_init(&r->result, NULL) != 0) {
        pthread_cond_destroy(&r->job);
        pthread_mutex_destroy(&r->mu);
        return 0;
    }
    if (pthread_create(&r->thread, NULL, reader_main, r) != 0) {
        pthread_cond_destroy(&r->result);
        pthread_cond_destroy(&r->job);
        pthread_mutex_destroy(&r->mu);
        return 0;
    }
    r->running = 1;
    return 1;
}
#endif
#endif
#endif

/* ------------------------------------------------------------------------ */
/* Instance lifecycle                                                       */
/* ------------------------------------------------------------------------ */

/* A caller's arena starts on COLIBRI_ARENA_ALIGN (detail set if not). */
static int arena_aligned(const void *arena, char *detail)
{
    if ((uintptr_t)arena % COLIBRI_ARENA_ALIGN == 0)
        return 1;
    clb_detail(detail, DETAIL_CAP, "arena is not %u-byte aligned",
               (unsigned)COLIBRI_ARENA_ALIGN);
    return 0;
}

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
    if (v->huge_arena)
        munmap(v->huge_arena, v->huge_arena_size);
#endif
    /* the reader thread first: a read in flight writes into the arena
     * (none is, between calls; this keeps it so) */
    close_file_reader(v->file_reader);
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
        if (!arena_aligned(arena, v->detail))
            return COLIBRI_E_ALIGN;
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
        arena = alloc_arena(v, need);
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
    clb_build_plan(p, v->blob, v->blob, v->file_big_endian, clb_pick_kernels());
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
    clb_opts o;
    int orc = clb_read_options(opt, &o, v->detail);
    if (orc)
        return orc;
    unsigned kv = o.kv_dtype;
    if (o.slots || o.ram) {
        clb_detail(v->detail, DETAIL_CAP, "expert_slots and ram_bytes stream "
                   "experts from a file: use colibri_init_ex or colibri_init_stream");
        return COLIBRI_E_ARG;
    }
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

/* ------------------------------------------------------------------------ */
/* Streamed instances (stream.c builds them)                                */
/* ------------------------------------------------------------------------ */

/* Read the file's header and check it: *s, *be and the prefix length. */
static int read_header(const colibri_reader *rd, uint8_t *hdr, colibri_shape *s,
                       int *be, uint64_t *prefix, char *detail)
{
    if (!rd || !rd->read) {
        clb_detail(detail, DETAIL_CAP, "the reader or its read function is NULL");
        return COLIBRI_E_ARG;
    }
    if (rd->size < COLIBRI_HEADER_SIZE) {
        clb_detail(detail, DETAIL_CAP, "file is %llu bytes, shorter than the "
                   "%u-byte header (truncated?)", (unsigned long long)rd->size,
                   (unsigned)COLIBRI_HEADER_SIZE);
        return COLIBRI_E_BAD_FORMAT;
    }
    if (rd->read(rd->user, 0, hdr, COLIBRI_HEADER_SIZE) != 0) {
        clb_detail(detail, DETAIL_CAP, "reading the header failed");
        return COLIBRI_E_IO;
    }
    size_t size = rd->size > (uint64_t)SIZE_MAX ? SIZE_MAX : (size_t)rd->size;
    int rc = clb_check_header(hdr, size, s, be, detail, NULL, NULL, NULL);
    if (rc)
        return rc;
    *prefix = clb_prefix_bytes(hdr, s, *be);
    rc = clb_check_table_end(s, rd->size, detail); /* the all-resident load's check */
    if (rc)
        return rc;
    if (*prefix > rd->size) {
        clb_detail(detail, DETAIL_CAP, "the table and description end at %llu, "
                   "beyond the file size %llu (truncated?)",
                   (unsigned long long)*prefix, (unsigned long long)rd->size);
        return COLIBRI_E_BAD_FORMAT;
    }
    return COLIBRI_OK;
}

#ifndef COLIBRI_STATIC_WORKBUF
/* The file's header and its prefix (header, table, description) read
 * through rd into a 64-byte aligned buffer the caller frees with
 * free(*base) (also on failure): *pre, *s and *be. */
static int read_prefix(const colibri_reader *rd, colibri_shape *s, int *be, uint8_t **pre,
                       void **base, char *detail)
{
    uint8_t hdr[COLIBRI_HEADER_SIZE];
    uint64_t prefix;
    *base = NULL;
    *pre = NULL;
    int rc = read_header(rd, hdr, s, be, &prefix, detail);
    if (rc)
        return rc;
    *pre = prefix <= SIZE_MAX - 64 ? (uint8_t *)alloc64((size_t)prefix, base) : NULL;
    if (!*pre) {
        clb_detail(detail, DETAIL_CAP, "out of memory for the file's %llu-byte table",
                   (unsigned long long)prefix);
        return COLIBRI_E_NO_MEMORY;
    }
    if (rd->read(rd->user, 0, *pre, (size_t)prefix) != 0) {
        clb_detail(detail, DETAIL_CAP, "reading the table failed");
        return COLIBRI_E_IO;
    }
    return COLIBRI_OK;
}
#endif

/* The slot count of options o for geometry g: asked for, or what the
 * budget (ram, else a caller arena of arena_size) holds. */
static int slots_of(const clb_stream_geom *g, const clb_opts *o, uint32_t align,
                    size_t arena_size, uint32_t *out, char *detail)
{
    uint64_t budget = o->ram ? o->ram : arena_size;
    if (o->slots) {
        if (o->slots > g->n_streamed) {
            clb_detail(detail, DETAIL_CAP, "%u expert slots, the file has %u "
                       "experts", (unsigned)o->slots, (unsigned)g->n_streamed);
            return COLIBRI_E_ARG;
        }
        *out = o->slots;
        /* both given: the slots must fit the budget as the ones it would
         * choose do (clb_stream_slots_for: the whole image, mapped or not) */
        size_t need = SIZE_MAX;
        if (o->ram && (clb_stream_arena_bytes(g, o->slots, align, COLIBRI_CHUNK_TOKENS_OWNED,
                                              o->kv_dtype, &need) || need > o->ram)) {
            clb_detail(detail, DETAIL_CAP, "%u expert slots need %llu bytes, more "
                       "than the %llu-byte budget: fewer slots, or leave the slot "
                       "count to the budget", (unsigned)o->slots,
                       (unsigned long long)need, (unsigned long long)o->ram);
            return COLIBRI_E_NO_MEMORY;
        }
        return COLIBRI_OK;
    }
    if (!budget) {
        clb_detail(detail, DETAIL_CAP, "streamed experts need expert_slots or "
                   "ram_bytes (or a caller arena to fill)");
        return COLIBRI_E_ARG;
    }
    uint64_t least;
    *out = clb_stream_slots_for(g, budget, align, COLIBRI_CHUNK_TOKENS_OWNED,
                                o->kv_dtype, &least);
    if (*out == 0) {
        clb_detail(detail, DETAIL_CAP, "a budget of %llu bytes holds no expert "
                   "slot: the resident part and one slot need %llu",
                   (unsigned long long)budget, (unsigned long long)least);
        return COLIBRI_E_NO_MEMORY;
    }
    return COLIBRI_OK;
}

/* Open a streamed instance through rd (align: the reader's, 1 or
 * CLB_DIRECT_ALIGN), into the caller's arena or an allocated one. map: the
 * whole file mapped read-only, or NULL; where the file's byte order is the
 * host's, the instance uses its resident sections from there (stream.h)
 * and keeps the mapping as its blob. */
static int stream_open(colibri_model *m, const colibri_reader *rd, uint32_t align,
                       const clb_stream_map *map, void *arena, size_t arena_size,
                       const clb_opts *o)
{
    struct colibri_model_private_ *v = &m->priv_;
    uint8_t hdr[COLIBRI_HEADER_SIZE];
    uint64_t prefix;
    int be;
    int rc = read_header(rd, hdr, &v->shape, &be, &prefix, v->detail);
    if (rc)
        return rc;
    /* The prefix goes where the image starts: the caller's arena, or a
     * temporary buffer until the arena's size is known. */
    uint8_t *pre = (uint8_t *)arena;
    void *pre_base = NULL;
    (void)pre_base; /* static builds: never allocated */
    if (arena) {
        if (!arena_aligned(arena, v->detail))
            return COLIBRI_E_ALIGN;
        if (arena_size < prefix) {
            clb_detail(v->detail, DETAIL_CAP, "arena of %llu bytes, the table "
                       "alone needs %llu", (unsigned long long)arena_size,
                       (unsigned long long)prefix);
            return COLIBRI_E_ARENA_TOO_SMALL;
        }
    } else {
#ifdef COLIBRI_STATIC_WORKBUF
        clb_detail(v->detail, DETAIL_CAP, "static work-buffer build: the caller "
                   "must supply the arena");
        return COLIBRI_E_ARG;
#else
        pre = prefix <= SIZE_MAX - 64 ? (uint8_t *)alloc64((size_t)prefix, &pre_base) : NULL;
        if (!pre) {
            clb_detail(v->detail, DETAIL_CAP, "cannot allocate %llu bytes for the "
                       "table", (unsigned long long)prefix);
            return COLIBRI_E_NO_MEMORY;
        }
#endif
    }
    clb_stream_geom g;
    memset(&g, 0, sizeof g);
    uint32_t slots = 0;
    size_t need = 0;
    uint32_t chunk = COLIBRI_CHUNK_TOKENS_OWNED;
    if (rd->read(rd->user, 0, pre, (size_t)prefix) != 0) {
        clb_detail(v->detail, DETAIL_CAP, "reading the table failed");
        rc = COLIBRI_E_IO;
    }
    if (rc == COLIBRI_OK)
        rc = clb_stream_geometry(pre, rd->size, &g, v->detail);
    /* The budget counts the resident sections, mapped or not; the arena
     * (ga's image) holds them only where they are not mapped. */
    clb_stream_geom ga = g;
    if (rc == COLIBRI_OK)
        rc = slots_of(&g, o, align, arena_size, &slots, v->detail);
    if (rc == COLIBRI_OK) {
#if CLB_STREAM_MAP
        if (map && g.be != host_is_big_endian())
            map = NULL; /* the experts need swapping: read */
        /* Warm: used where they are, and so are the experts the page
         * cache holds. Cold: the resident sections read into the arena
         * (stream.h), and every expert too (its slot memory is faulted
         * in at init, in huge pages: faulted a page at a time during the
         * reads instead, a cold 7B q4 run inside 2 GiB decoded 40 %
         * slower). */
        if (map && !clb_stream_resident_cached(pre, &g, map))
            map = NULL;
#else
        map = NULL;
#endif
        if (map)
            ga.image_bytes = (g.prefix_bytes + 63) / 64 * 64;
        rc = clb_stream_arena_bytes(&ga, slots, align, chunk, o->kv_dtype, &need);
    }
    if (rc == COLIBRI_OK && arena && arena_size < need) {
        /* as attach_arena: a smaller caller arena gets the small chunk */
        chunk = COLIBRI_CHUNK_TOKENS;
        rc = clb_stream_arena_bytes(&ga, slots, align, chunk, o->kv_dtype, &need);
        if (rc == COLIBRI_OK && arena_size < need) {
            clb_detail(v->detail, DETAIL_CAP, "arena of %llu bytes, %u expert "
                       "slots need %llu", (unsigned long long)arena_size,
                       (unsigned)slots, (unsigned long long)need);
            rc = COLIBRI_E_ARENA_TOO_SMALL;
        }
    }
    if (rc == COLIBRI_OK && !arena) {
#ifndef COLIBRI_STATIC_WORKBUF
        /* aligned for the reader's direct reads (slots are aligned inside) */
        arena = alloc_arena(v, need);
        if (!arena) {
            clb_detail(v->detail, DETAIL_CAP, "cannot allocate an arena of %llu "
                       "bytes", (unsigned long long)need);
            rc = COLIBRI_E_NO_MEMORY;
        } else {
#if CLB_HUGE_ALLOC && defined(MADV_NOHUGEPAGE)
            /* Slots that take mapped experts are only partly faulted in (a
             * read's), or not at all: with huge pages, a fault in one would
             * bring in 2 MiB of its neighbours', which may hold mapped
             * experts too, and the process would pass its budget. */
            if (map && v->huge_arena) { /* a mapping of its own, 2 MiB aligned */
                uint64_t at = clb_stream_slots_at(&ga, slots, align, chunk, o->kv_dtype);
                uint8_t *from = (uint8_t *)arena + at / 4096 * 4096;
                (void)madvise(from, (size_t)((uint8_t *)arena + need - from), MADV_NOHUGEPAGE);
            }
#endif
            memcpy(arena, pre, (size_t)prefix);
            arena_size = need;
            /* the description reads its layer words where the prefix now is */
            if (g.d.layers)
                g.d.layers = ga.d.layers = (const uint8_t *)arena + (g.d.layers - pre);
        }
#endif
    }
#ifndef COLIBRI_STATIC_WORKBUF
    free(pre_base);
#endif
    if (rc)
        return rc;
    /* Zeroed but for the prefix. Where a map may show experts, the arena's
     * own fresh mapping is zero already and is left untouched: its pages
     * fault in as they are first used (a KV cache row when its position
     * is, a slot when a read fills it, never where it takes mapped
     * experts): in perf of a warm 1-token run of the 7B q4 model, the
     * kernel's page clearing fell from 27 % to 1.5 %. Else written now,
     * faulted in at init in huge pages. */
#if CLB_HUGE_ALLOC
    const int fresh = map && v->huge_arena;
#else
    const int fresh = 0;
#endif
    if (!fresh)
        memset((uint8_t *)arena + prefix, 0, need - (size_t)prefix);
    clb_plan *p;
    rc = clb_stream_build((uint8_t *)arena, &ga, rd, map, align, slots, o->policy,
                          chunk, o->kv_dtype, &p, v->detail);
    if (rc)
        return rc;
    /* the image (header, table, resident sections), or the mapped file */
    v->blob = map ? map->base : (const uint8_t *)arena;
    v->blob_size = (size_t)(map ? g.file_size : g.image_bytes);
    v->file_big_endian = (uint8_t)g.be;
    v->byte_swapped = g.be != host_is_big_endian() ? 1u : 0u;
    v->load_mode = CLB_LOAD_STREAM;
    v->arena = arena;
    v->arena_size = arena_size;
    v->plan = p;
    v->kernels = p->k;
    v->kv_dtype = (uint8_t)o->kv_dtype;
    v->magic = CLB_MODEL_MAGIC;
    return COLIBRI_OK;
}

int colibri_init_stream(colibri_model *m, const colibri_reader *rd, void *arena,
                        size_t arena_size, const colibri_options *opt)
{
    if (!m)
        return COLIBRI_E_ARG;
    memset(&m->priv_, 0, sizeof m->priv_);
    clb_opts o;
    int rc = clb_read_options(opt, &o, m->priv_.detail);
    if (rc == COLIBRI_OK)
        rc = stream_open(m, rd, 1, NULL, arena, arena ? arena_size : 0, &o);
    if (rc)
        release(m);
    return rc;
}

int colibri_stream_arena_size(const colibri_reader *rd, const colibri_options *opt,
                              size_t *out_bytes, uint32_t *out_slots)
{
    char detail[DETAIL_CAP];
    clb_opts o;
    if (!out_bytes)
        return COLIBRI_E_ARG;
    int rc = clb_read_options(opt, &o, detail);
    if (rc)
        return rc;
#ifdef COLIBRI_STATIC_WORKBUF
    (void)rd;
    (void)out_slots;
    return COLIBRI_E_UNSUPPORTED; /* it would need memory for the table */
#else
    colibri_shape s;
    int be;
    void *base = NULL;
    uint8_t *pre = NULL;
    rc = read_prefix(rd, &s, &be, &pre, &base, detail);
    clb_stream_geom g;
    uint32_t slots = 0;
    if (rc == COLIBRI_OK)
        rc = clb_stream_geometry(pre, rd->size, &g, detail);
    if (rc == COLIBRI_OK)
        rc = slots_of(&g, &o, 1, 0, &slots, detail);
    if (rc == COLIBRI_OK)
        rc = clb_stream_arena_bytes(&g, slots, 1, COLIBRI_CHUNK_TOKENS_OWNED,
                                    o.kv_dtype, out_bytes);
    if (rc == COLIBRI_OK && out_slots)
        *out_slots = slots;
    free(base);
    return rc;
#endif
}

#if !defined(COLIBRI_STATIC_WORKBUF) && COLIBRI_ENABLE_POSIX_IO
/* 1 if a budget of o->ram holds the all-resident instance of rd's file:
 * the file and the arena colibri_init would allocate. */
static int fits_resident(const colibri_reader *rd, const clb_opts *o)
{
    char detail[DETAIL_CAP];
    colibri_shape s;
    int be, fits = 0;
    if (rd->size >= o->ram)
        return 0;
    void *base = NULL;
    uint8_t *pre = NULL;
    clb_desc d;
    size_t arena = 0;
    if (read_prefix(rd, &s, &be, &pre, &base, detail) == COLIBRI_OK &&
        clb_validate_prefix(pre, (size_t)rd->size, &s, &be, &d, detail) == COLIBRI_OK &&
        clb_arena_bytes(&s, &d, COLIBRI_CHUNK_TOKENS_OWNED, o->kv_dtype, &arena) ==
            COLIBRI_OK)
        fits = arena <= o->ram - rd->size;
    free(base);
    return fits;
}
#endif

#ifndef COLIBRI_STATIC_WORKBUF
/* colibri_init_ex with expert_slots or ram_bytes: stream `path` through the
 * library's own reader, or CLB_FITS_RESIDENT when the budget holds the
 * all-resident instance (file and arena), which loads faster and reads
 * nothing during infer. */
#define CLB_FITS_RESIDENT 1
static int open_streamed_file(colibri_model *m, const char *path, const clb_opts *o)
{
    struct colibri_model_private_ *v = &m->priv_;
#if COLIBRI_ENABLE_POSIX_IO
    file_reader *r = (file_reader *)calloc(1, sizeof *r);
    if (!r) {
        clb_detail(v->detail, DETAIL_CAP, "out of memory");
        return COLIBRI_E_NO_MEMORY;
    }
    r->fd_direct = -1;
    r->fd = open(path, O_RDONLY);
    struct stat st;
    if (r->fd < 0 || fstat(r->fd, &st) != 0 || st.st_size < 0) {
        if (r->fd >= 0)
            close(r->fd);
        free(r);
        clb_detail(v->detail, DETAIL_CAP, "cannot open %s", path);
        return COLIBRI_E_IO;
    }
    r->size = (uint64_t)st.st_size;
#ifdef CLB_CACHE_PROBE
    {
        long pg = sysconf(_SC_PAGESIZE);
        void *view = r->size && r->size <= SIZE_MAX && pg > 0
                   ? mmap(NULL, (size_t)r->size, PROT_READ, MAP_SHARED, r->fd, 0)
                   : MAP_FAILED;
        r->view = view == MAP_FAILED ? NULL : (const uint8_t *)view;
        r->page = pg > 0 ? (size_t)pg : 4096;
        /* mincore's rule (r->probe): the owner, or a process that could
         * open the file for writing (root can) */
        r->probe = r->view && (geteuid() == 0 || st.st_uid == geteuid() ||
                               faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) == 0);
        page_maps(r);
        /* no readahead: the reader brings in what it reads and notes, and
         * the kernel nothing around it (want_section asks for a resident
         * section's reading ahead of its CRC pass) */
        (void)posix_fadvise(r->fd, 0, 0, POSIX_FADV_RANDOM);
        if (r->view)
            (void)madvise((void *)(uintptr_t)r->view, (size_t)r->size, MADV_RANDOM);
    }
#endif
    colibri_reader rd = { file_read, r, r->size };
    if (o->ram && !o->slots && fits_resident(&rd, o)) {
        close_file_reader(r);
        return CLB_FITS_RESIDENT;
    }
    uint32_t align = 1;
#ifdef O_DIRECT
    /* COLIBRI_STREAM_BUFFERED=1: through the page cache instead (to
     * measure one against the other; bench/stream.py) */
    const char *buffered = getenv("COLIBRI_STREAM_BUFFERED");
    if (!(buffered && buffered[0] == '1'))
        r->fd_direct = open(path, O_RDONLY | O_DIRECT);
    if (r->fd_direct >= 0)
        align = CLB_DIRECT_ALIGN;
#endif
    v->file_reader = r;
    const clb_stream_map *map = NULL;
#ifdef CLB_CACHE_PROBE
    /* A warm file's resident sections used where the view has them, from
     * the page cache, and its cached experts too: no copy, and no fresh
     * pages for the kernel to zero (a 4.3 GB file, 318 MB resident, inside
     * --ram 488M: the first token of a 1-token prompt 0.33 s against 0.47;
     * STREAMING.md). COLIBRI_STREAM_COPY=1: read into the arena instead
     * (to measure one against the other). */
#ifdef CLB_READER_THREAD
    void (*both)(void (*)(void *, int), void *) = run_both;
#else
    void (*both)(void (*)(void *, int), void *) = NULL;
#endif
    const clb_stream_map view_map = { r->view, cached_range, want_section, hide_expert,
                                      show_expert, both, r };
    const char *copy = getenv("COLIBRI_STREAM_COPY");
    if (r->view && !(copy && copy[0] == '1'))
        map = &view_map;
#endif
    int rc = stream_open(m, &rd, align, map, NULL, 0, o);
#ifdef CLB_CACHE_PROBE
    /* what init brought in but the view maps stays until colibri_free */
    drop_new_pages(r);
#endif
    if (rc == COLIBRI_OK) {
        clb_plan *p = (clb_plan *)v->plan;
        p->stream->read_ns = &r->ns;
        p->stream->wait_ns = &r->wait_ns;
        r->ns = 0;
        p->stream->rd.read = file_read_waited;
#ifdef CLB_READER_THREAD
        if (start_reader_thread(r)) {
            p->stream->io.start = read_start;
            p->stream->io.finish = read_finish;
            p->stream->io.cancel = read_cancel;
            p->stream->io.user = r;
            p->stream->io.capacity = CLB_READS_IN_FLIGHT;
        }
#endif
        clb_stream_prefetch_on(p, o->prefetch);
#if !defined(CLB_CACHE_PROBE) && defined(POSIX_FADV_DONTNEED)
        /* the resident sections are copied: their pages need not stay
         * (with the probe, drop_new_pages above drops only what init
         * brought in) */
        (void)posix_fadvise(r->fd, 0, 0, POSIX_FADV_DONTNEED);
#endif
    }
    if (rc)
        release(m);
    return rc;
#else
    (void)path;
    (void)o;
    clb_detail(v->detail, DETAIL_CAP, "this build has no POSIX file reader "
               "(COLIBRI_ENABLE_POSIX_IO=0): stream with colibri_init_stream "
               "and a reader");
    return COLIBRI_E_UNSUPPORTED;
#endif
}
#endif

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
    clb_opts o;
    int orc = clb_read_options(opt, &o, m->priv_.detail);
    if (orc)
        return orc;
    unsigned kv = o.kv_dtype;
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
    if (o.slots || o.ram) {
        int src = open_streamed_file(m, path, &o);
        if (src != CLB_FITS_RESIDENT)
            return src;
        memset(&m->priv_, 0, sizeof m->priv_); /* the budget holds it all */
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
    clb_opts so;
    int orc = clb_read_options(opt, &so, m->priv_.detail);
    if (orc)
        return orc;
    unsigned kv = so.kv_dtype;
    if (so.slots || so.ram) {
        clb_detail(m->priv_.detail, DETAIL_CAP, "a shared instance uses its owner's "
                   "weights: expert_slots and ram_bytes are for colibri_init_ex");
        return COLIBRI_E_ARG;
    }
    if (owner->priv_.magic != CLB_MODEL_MAGIC) {
        clb_detail(m->priv_.detail, DETAIL_CAP, "the owner model is not "
                   "initialised");
        return COLIBRI_E_NOT_INIT;
    }
    const struct colibri_model_private_ *o = &owner->priv_;
    struct colibri_model_private_ *v = &m->priv_;
    if (o->load_mode == CLB_LOAD_STREAM) {
        /* the slots are the owner's mutable state, its arena's */
        clb_detail(v->detail, DETAIL_CAP, "a streamed instance's experts cannot be "
                   "shared: open a second streamed instance");
        return COLIBRI_E_UNSUPPORTED;
    }
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
                   "needs run), flags %x", (unsigned)n, (unsigned)flags);
        return COLIBRI_E_ARG;
    }
#if COLIBRI_THREADS
    clb_team *team = &((clb_plan *)v->plan)->team;
    int rc = clb_team_set(team, n, flags, use_ex ? ex : NULL);
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

int colibri_set_route_observer(colibri_model *m, colibri_route_fn fn, void *user)
{
    if (!m)
        return COLIBRI_E_ARG;
    if (m->priv_.magic != CLB_MODEL_MAGIC || !m->priv_.plan)
        return COLIBRI_E_NOT_INIT;
    clb_plan *p = (clb_plan *)m->priv_.plan;
    p->route_fn = fn;
    p->route_user = fn ? user : NULL;
    return COLIBRI_OK;
}
