/*
 * test_pool.c - one instance computing on several threads gives the same
 * bits as on one.
 *
 *   test_pool MODEL [MAX_THREADS=8]
 *
 * The workload (run_workload): a caller arena sized by colibri_arena_size,
 * so the chunk is COLIBRI_CHUNK_TOKENS (16) and a prefill of batch B
 * (max_batch, at most 3) x 37 tokens with padding masks runs in several
 * chunks; then 6 decode steps of all sequences; then a batch-1 prefill of
 * 19 tokens and 3 decode steps. Every logit is hashed (FNV-1a 64 over the
 * bytes) and kept.
 *
 * It runs with colibri_set_threads(1..MAX) (parking workers), with
 * COLIBRI_THREADS_SPIN at 2 and 3, with an executor of this program's own
 * pthreads (3 workers, mutex + condition variable), and with an executor
 * that runs the work items one after the other (4) on a thread of its own
 * whose stack it measures ("stack: N bytes", at most
 * COLIBRI_WORKER_STACK_BYTES), and compares every
 * logit with the 1-thread run. Then COLIBRI_LOGITS_LAST: each call's rows
 * against the matching rows of the all-rows call. And the misuse codes.
 *
 * Prints "pool: digest HEX" (the 1-thread digest, for comparing builds),
 * "pool: identical (N runs)" and "last: identical (N calls)"; in a build
 * without threads "pool: threads unsupported" instead of the multi-thread
 * runs. Exit 0 on success, 1 on a mismatch, 10 - code on a library error.
 */
#define _POSIX_C_SOURCE 200809L /* pthread_attr_setstack */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"

#define PROMPT 37
#define STEPS 6
#define MAXB 3

static int fail(const char *what, const colibri_model *m, int rc)
{
    printf("error %d in %s: %s\n", rc, what, colibri_error_detail(m));
    return 10 - rc;
}

/* ---- a test-provided worker set for colibri_set_executor ---------------- */

typedef struct worker_set {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint32_t n;            /* workers including the caller */
    unsigned gen, pending; /* region generation, items not finished */
    int stop;
    void (*work)(void *, uint32_t);
    void *arg;
    pthread_t th[16];
    uint32_t ids[16];
    unsigned regions;      /* regions run (the hook was really used) */
} worker_set;

static worker_set g_ws;

static void *ws_main(void *p)
{
    uint32_t id = *(uint32_t *)p;
    worker_set *ws = &g_ws;
    unsigned seen = 0;
    pthread_mutex_lock(&ws->mu);
    for (;;) {
        while (ws->gen == seen && !ws->stop)
            pthread_cond_wait(&ws->go, &ws->mu);
        if (ws->stop)
            break;
        seen = ws->gen;
        void (*work)(void *, uint32_t) = ws->work;
        void *arg = ws->arg;
        pthread_mutex_unlock(&ws->mu);
        work(arg, id);
        pthread_mutex_lock(&ws->mu);
        if (--ws->pending == 0)
            pthread_cond_signal(&ws->done);
    }
    pthread_mutex_unlock(&ws->mu);
    return NULL;
}

static void ws_run(void *user, uint32_t n, void (*work)(void *, uint32_t), void *arg)
{
    worker_set *ws = (worker_set *)user;
    pthread_mutex_lock(&ws->mu);
    ws->work = work;
    ws->arg = arg;
    ws->pending = n - 1;
    ws->gen++;
    ws->regions++;
    pthread_cond_broadcast(&ws->go);
    pthread_mutex_unlock(&ws->mu);
    work(arg, 0);
    pthread_mutex_lock(&ws->mu);
    while (ws->pending)
        pthread_cond_wait(&ws->done, &ws->mu);
    pthread_mutex_unlock(&ws->mu);
}

static void ws_start(uint32_t n)
{
    worker_set *ws = &g_ws;
    memset(ws, 0, sizeof *ws);
    pthread_mutex_init(&ws->mu, NULL);
    pthread_cond_init(&ws->go, NULL);
    pthread_cond_init(&ws->done, NULL);
    ws->n = n;
    for (uint32_t i = 1; i < n; i++) {
        ws->ids[i] = i;
        pthread_create(&ws->th[i], NULL, ws_main, &ws->ids[i]);
    }
}

static void ws_stop(void)
{
    worker_set *ws = &g_ws;
    pthread_mutex_lock(&ws->mu);
    ws->stop = 1;
    pthread_cond_broadcast(&ws->go);
    pthread_mutex_unlock(&ws->mu);
    for (uint32_t i = 1; i < ws->n; i++)
        pthread_join(ws->th[i], NULL);
}

/* An executor that runs a region's items one after the other on a thread
 * whose stack is g_stack, painted before the run: the deepest byte written
 * is the stack a worker used, held to colibri.h's
 * COLIBRI_WORKER_STACK_BYTES in main. The buffer is larger than the figure,
 * so an overrun shows as a number rather than a crash. */
#define STACK_PAINT 0xa5
static unsigned char g_stack[2u << 20] __attribute__((aligned(64))); /* TSan wants 900 KiB */
static unsigned g_serial_regions;

typedef struct region {
    void (*work)(void *, uint32_t);
    void *arg;
    uint32_t n;
} region;

static void *region_main(void *p)
{
    const region *r = (const region *)p;
    for (uint32_t i = r->n; i-- > 0;) /* any order is allowed */
        r->work(r->arg, i);
    return NULL;
}

static void serial_run(void *user, uint32_t n, void (*work)(void *, uint32_t), void *arg)
{
    (void)user;
    g_serial_regions++;
    region r = { work, arg, n };
    pthread_attr_t at;
    pthread_t th;
    if (pthread_attr_init(&at) != 0 || pthread_attr_setstack(&at, g_stack, sizeof g_stack) != 0 ||
        pthread_create(&th, &at, region_main, &r) != 0) {
        fprintf(stderr, "test_pool: no thread on the painted stack\n");
        exit(3); /* the executor must run every item: nothing else to do */
    }
    pthread_join(th, NULL);
    pthread_attr_destroy(&at);
}

/* Bytes of g_stack written since it was painted (the stack grows down). */
static size_t stack_used(void)
{
    size_t lo = 0;
    while (lo < sizeof g_stack && g_stack[lo] == STACK_PAINT)
        lo++;
    return sizeof g_stack - lo;
}

/* ---- the workload -------------------------------------------------------- */

typedef struct calls {
    uint32_t batch[4], seq[4], past[4];
    int32_t *ids[4];
    uint8_t *mask[4];
    uint32_t n;
} calls;

static uint64_t fnv(uint64_t h, const void *data, size_t n)
{
    const unsigned char *b = (const unsigned char *)data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* All calls' logits, concatenated, into out (NULL: count floats only). */
static int run_workload(colibri_model *m, const colibri_info *info, uint32_t B,
                        float *out, size_t *n_floats)
{
    uint32_t V = info->shape.vocab;
    size_t at = 0;
    int32_t ids[MAXB * PROMPT];
    uint8_t mask[MAXB * PROMPT];
    for (uint32_t i = 0; i < B * PROMPT; i++) {
        ids[i] = (int32_t)((i * 2654435761u + 7u) % V);
        /* sequence b starts with b padding tokens (left padding) */
        mask[i] = (i % PROMPT) >= (i / PROMPT) ? 1 : 0;
    }
    /* the batch prefill, then STEPS decode steps of every sequence */
    int rc = 0;
    if (out)
        rc = colibri_infer(m, ids, mask, B, PROMPT, 0, out + at);
    at += (size_t)B * PROMPT * V;
    for (uint32_t s = 0; s < STEPS && rc == 0; s++) {
        int32_t step[MAXB];
        for (uint32_t b = 0; b < B; b++)
            step[b] = (int32_t)((s * 31u + b * 17u + 3u) % V);
        if (out)
            rc = colibri_infer(m, step, NULL, B, 1, PROMPT + s, out + at);
        at += (size_t)B * V;
    }
    /* batch 1, a prompt that ends in a chunk of 3 rows, 3 decode steps */
    if (out && rc == 0)
        rc = colibri_infer(m, ids, NULL, 1, 19, 0, out + at);
    at += (size_t)19 * V;
    for (uint32_t s = 0; s < 3 && rc == 0; s++) {
        int32_t t = (int32_t)((s * 101u + 5u) % V);
        if (out)
            rc = colibri_infer(m, &t, NULL, 1, 1, 19 + s, out + at);
        at += V;
    }
    *n_floats = at;
    return rc;
}

static long first_diff(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)))
            return (long)i;
    return -1;
}

/* COLIBRI_LOGITS_LAST against the all-rows rows, for prefills that end in
 * chunks of 1, 2 and 16 rows and for batches. */
static int check_last(colibri_model *m, const colibri_info *info, uint32_t B)
{
    uint32_t V = info->shape.vocab;
    static const uint32_t seqs[] = { 1, 17, 18, 32, PROMPT };
    float *all = (float *)malloc((size_t)MAXB * PROMPT * V * sizeof(float));
    float *last = (float *)malloc((size_t)MAXB * V * sizeof(float));
    int32_t ids[MAXB * PROMPT];
    uint8_t mask[MAXB * PROMPT];
    uint32_t ncalls = 0;
    int bad = 0, rc = 0;
    for (uint32_t bb = 1; bb <= B && !bad && !rc; bb++) {
        for (size_t k = 0; k < sizeof seqs / sizeof seqs[0] && !bad && !rc; k++) {
            uint32_t seq = seqs[k];
            for (uint32_t i = 0; i < bb * seq; i++) {
                ids[i] = (int32_t)((i * 40503u + k) % V);
                mask[i] = (i % seq) + 1 >= (i / seq) ? 1 : 0;
            }
            rc = colibri_infer_ex(m, ids, mask, bb, seq, 0, COLIBRI_LOGITS_ALL, all);
            if (!rc)
                rc = colibri_infer_ex(m, ids, mask, bb, seq, 0, COLIBRI_LOGITS_LAST, last);
            /* and a decode step after the last-only prefill */
            for (uint32_t b = 0; b < bb && !rc && !bad; b++) {
                const float *want = all + ((size_t)b * seq + seq - 1) * V;
                if (first_diff(last + (size_t)b * V, want, V) >= 0) {
                    printf("last: batch %u seq %u row %u differs from the all-rows call\n",
                           (unsigned)bb, (unsigned)seq, (unsigned)b);
                    bad = 1;
                }
            }
            ncalls++;
        }
    }
    free(all);
    free(last);
    if (rc)
        return fail("colibri_infer_ex", m, rc);
    if (!bad)
        printf("last: identical (%u calls)\n", (unsigned)ncalls);
    return bad;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_pool MODEL [MAX_THREADS]\n");
        return 2;
    }
    uint32_t maxn = argc > 2 ? (uint32_t)atoi(argv[2]) : 8;
    /* the file in memory, a caller arena of colibri_arena_size bytes */
    FILE *f = fopen(argv[1], "rb");
    if (!f)
        return 2;
    fseek(f, 0, SEEK_END);
    size_t size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *blob = aligned_alloc(64, (size + 63) / 64 * 64);
    if (!blob || fread(blob, 1, size, f) != size)
        return 2;
    fclose(f);
    size_t arena_bytes;
    int rc = colibri_arena_size(blob, size, &arena_bytes);
    if (rc)
        return 10 - rc;
    void *arena = aligned_alloc(64, (arena_bytes + 63) / 64 * 64);
    colibri_model m;
    rc = colibri_init_from_memory(&m, blob, size, arena, arena_bytes);
    if (rc)
        return fail("colibri_init_from_memory", &m, rc);
    colibri_info info;
    colibri_get_info(&m, &info);
    uint32_t B = info.shape.max_batch < MAXB ? info.shape.max_batch : MAXB;
    size_t nf;
    run_workload(&m, &info, B, NULL, &nf);
    float *want = (float *)malloc(nf * sizeof(float));
    float *got = (float *)malloc(nf * sizeof(float));

    /* misuse */
    if (colibri_set_threads(&m, 0, 0) != COLIBRI_E_ARG ||
        colibri_set_threads(&m, COLIBRI_MAX_THREADS + 1, 0) != COLIBRI_E_ARG ||
        colibri_set_threads(&m, 2, 0x80) != COLIBRI_E_ARG ||
        colibri_set_threads(NULL, 2, 0) != COLIBRI_E_ARG) {
        printf("misuse: a bad thread count or flag was accepted\n");
        return 1;
    }
    colibri_executor bad_ex = { NULL, NULL, 2 };
    if (colibri_set_executor(&m, &bad_ex) != COLIBRI_E_ARG) {
        printf("misuse: an executor without run was accepted\n");
        return 1;
    }
    colibri_model dead;
    memset(&dead, 0, sizeof dead);
    if (colibri_set_threads(&dead, 2, 0) != COLIBRI_E_NOT_INIT) {
        printf("misuse: set_threads on an uninitialised model\n");
        return 1;
    }
    int32_t tok0 = 0;
    if (colibri_infer_ex(&m, &tok0, NULL, 1, 1, 0, 7, want) != COLIBRI_E_ARG) {
        printf("misuse: logits_mode 7 was accepted\n");
        return 1;
    }
    printf("misuse: rejected\n");

    rc = run_workload(&m, &info, B, want, &nf);
    if (rc)
        return fail("colibri_infer (1 thread)", &m, rc);
    printf("pool: digest %016llx (%lu floats, batch %u)\n",
           (unsigned long long)fnv(0xcbf29ce484222325ull, want, nf * sizeof(float)),
           (unsigned long)nf, (unsigned)B);
    rc = check_last(&m, &info, B);
    if (rc)
        return rc;

    rc = colibri_set_threads(&m, 2, 0);
    if (rc == COLIBRI_E_UNSUPPORTED) {
        colibri_executor ex = { serial_run, NULL, 2 };
        if (colibri_set_executor(&m, &ex) != COLIBRI_E_UNSUPPORTED ||
            colibri_set_threads(&m, 1, 0) != COLIBRI_OK) {
            printf("pool: threadless build accepted an executor\n");
            return 1;
        }
        printf("pool: threads unsupported\n");
        colibri_free(&m);
        return 0;
    }
    if (rc)
        return fail("colibri_set_threads", &m, rc);

    typedef struct { const char *how; uint32_t n, flags; int executor; } run_t;
    run_t runs[32];
    uint32_t nruns = 0;
    for (uint32_t n = 1; n <= maxn && nruns < 24; n++)
        runs[nruns++] = (run_t){ "threads", n, 0, 0 };
    runs[nruns++] = (run_t){ "spin", 2, COLIBRI_THREADS_SPIN, 0 };
    runs[nruns++] = (run_t){ "spin", 3, COLIBRI_THREADS_SPIN, 0 };
    runs[nruns++] = (run_t){ "executor", 3, 0, 1 };
    runs[nruns++] = (run_t){ "serial-executor", 4, 0, 2 };
    for (uint32_t r = 0; r < nruns; r++) {
        if (runs[r].executor == 1) {
            ws_start(runs[r].n);
            colibri_executor ex = { ws_run, &g_ws, runs[r].n };
            rc = colibri_set_executor(&m, &ex);
        } else if (runs[r].executor == 2) {
            memset(g_stack, STACK_PAINT, sizeof g_stack);
            colibri_executor ex = { serial_run, NULL, runs[r].n };
            rc = colibri_set_executor(&m, &ex);
        } else {
            rc = colibri_set_threads(&m, runs[r].n, runs[r].flags);
        }
        if (rc)
            return fail("set threads/executor", &m, rc);
        colibri_info ti;
        colibri_get_info(&m, &ti);
        if (ti.n_threads != runs[r].n || ti.executor != (runs[r].executor != 0) ||
            ti.thread_flags != runs[r].flags) {
            printf("info: n_threads %u executor %u flags %u, expected %u %d %u\n",
                   (unsigned)ti.n_threads, (unsigned)ti.executor,
                   (unsigned)ti.thread_flags, (unsigned)runs[r].n,
                   runs[r].executor != 0, (unsigned)runs[r].flags);
            return 1;
        }
        memset(got, 0xff, nf * sizeof(float));
        rc = run_workload(&m, &info, B, got, &nf);
        if (rc)
            return fail("colibri_infer", &m, rc);
        long d = first_diff(got, want, nf);
        if (d >= 0) {
            printf("pool: %s %u: logit %ld differs (%.9g vs %.9g)\n", runs[r].how,
                   (unsigned)runs[r].n, d, (double)got[d], (double)want[d]);
            return 1;
        }
        if (runs[r].executor == 1) {
            colibri_set_executor(&m, NULL); /* before its workers go */
            if (g_ws.regions == 0) {
                printf("pool: the executor was never called\n");
                return 1;
            }
            ws_stop();
        } else if (runs[r].executor == 2) {
            if (g_serial_regions == 0) {
                printf("pool: the serial executor was never called\n");
                return 1;
            }
            /* sanitizer builds grow every frame: the figure is for the
             * library as built for use */
            const size_t used = stack_used();
            printf("stack: %lu bytes used by a worker (COLIBRI_WORKER_STACK_BYTES %lu)\n",
                   (unsigned long)used, (unsigned long)COLIBRI_WORKER_STACK_BYTES);
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
            if (used > COLIBRI_WORKER_STACK_BYTES) {
                printf("pool: a worker used more stack than colibri.h says\n");
                return 1;
            }
#endif
        }
    }
    /* LAST under threads too */
    colibri_set_threads(&m, 3, 0);
    rc = check_last(&m, &info, B);
    if (rc)
        return rc;
    printf("pool: identical (%u runs, up to %u threads)\n", (unsigned)nruns,
           (unsigned)maxn);
    colibri_free(&m); /* joins the workers */
    free(want);
    free(got);
    free(arena);
    free(blob);
    return 0;
}
