/*
 * threads.c - the team that runs an instance's parallel regions
 * (threads.h): a pthread pool that parks its workers on a futex between
 * regions (or only spins, COLIBRI_THREADS_SPIN), or the caller's executor
 * (colibri_executor: an RTOS's tasks, no OS in the library).
 *
 * Protocol of the pool (every step a GCC __atomic operation):
 *   caller: write fn/ctx/n_tiles, next = 0, busy = n - 1, then gen += 1
 *           (seq_cst); if a worker sleeps, FUTEX_WAKE gen; take tiles;
 *           wait until busy == 0 (spin, then FUTEX_WAIT on busy).
 *   worker: wait until gen changes (spin, then FUTEX_WAIT on gen); take
 *           tiles until the counter passes n_tiles; busy -= 1, and the last
 *           one wakes a parked caller.
 * "sleepers" / "caller_parked" are raised before the last check of the
 * awaited word and read after the word is changed, both seq_cst, so either
 * the sleeper sees the change or the changer sees the sleeper (no lost
 * wake-up), and a region whose workers all spin makes no system call.
 */
#define _GNU_SOURCE /* syscall() */
#include "threads.h"

#if COLIBRI_THREADS

#include <stdlib.h>
#include <string.h>

#if defined(__linux__) && !defined(COLIBRI_STATIC_WORKBUF)
#define CLB_POOL 1
#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define CLB_POOL 0
#endif

/* Spins (each a pause/yield instruction, tens of cycles) before a parking
 * worker or caller enters the kernel: about 100-300 us, longer than the
 * serial stretches between the regions of one decode step (norms, RoPE,
 * attention of a short context), so a step runs without a system call while
 * the pool is warm, and much shorter than the gap between steps of a slow
 * caller. */
#define CLB_SPINS (1u << 14)

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || (defined(__arm__) && __ARM_ARCH >= 7)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

#define LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define ADD(p, v) __atomic_add_fetch((p), (v), __ATOMIC_SEQ_CST)
#define SUB(p, v) __atomic_sub_fetch((p), (v), __ATOMIC_SEQ_CST)

/* Take tiles until none is left. */
static void run_tiles(clb_team *t)
{
    for (;;) {
        uint32_t i = __atomic_fetch_add(&t->next, 1u, __ATOMIC_RELAXED);
        if (i >= t->n_tiles)
            return;
        t->fn(t->ctx, i);
    }
}

/* ------------------------------------------------------------------------ */
/* The executor hook                                                        */
/* ------------------------------------------------------------------------ */

/* What the executor runs on each of its workers: the same tile loop. */
static void executor_work(void *arg, uint32_t worker)
{
    (void)worker;
    run_tiles((clb_team *)arg);
}

/* ------------------------------------------------------------------------ */
/* The pthread pool                                                         */
/* ------------------------------------------------------------------------ */

#if CLB_POOL
struct clb_pool {
    pthread_t th[COLIBRI_MAX_THREADS];
    uint32_t started;    /* threads created (n - 1 on success) */
    uint32_t start_gen;  /* gen when the threads were created */
    clb_team *team;
};

static void futex_wait(uint32_t *word, uint32_t expect)
{
    (void)syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expect, NULL, NULL, 0);
}

static void futex_wake(uint32_t *word)
{
    (void)syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

/* Wait until *word != old; spin only with COLIBRI_THREADS_SPIN, else spin a
 * while then park, announcing it in *parked. Returns the new value. */
static uint32_t await_change(uint32_t *word, uint32_t old, int spin_only,
                             uint32_t *parked)
{
    for (uint32_t spins = 0;; spins++) {
        uint32_t v = LOAD_ACQ(word);
        if (v != old)
            return v;
        if (spin_only || spins < CLB_SPINS) {
            cpu_relax();
            continue;
        }
        ADD(parked, 1u);
        if (LOAD(word) == old)
            futex_wait(word, old);
        SUB(parked, 1u);
    }
}

static void *worker_main(void *arg)
{
    struct clb_pool *pool = (struct clb_pool *)arg;
    clb_team *t = pool->team;
    int spin_only = (t->flags & COLIBRI_THREADS_SPIN) != 0;
    /* Not the current gen: a thread that starts late must still see the
     * regions (or the stop) published since its creation. */
    uint32_t seen = pool->start_gen;
    for (;;) {
        seen = await_change(&t->gen, seen, spin_only, &t->sleepers);
        if (LOAD(&t->stop))
            return NULL;
        run_tiles(t);
        if (SUB(&t->busy, 1u) == 0 && LOAD(&t->caller_parked))
            futex_wake(&t->busy);
    }
}

/* Publish a new generation and wake parked workers. */
static void bump_gen(clb_team *t)
{
    ADD(&t->gen, 1u);
    if (LOAD(&t->sleepers))
        futex_wake(&t->gen);
}

static void pool_region(clb_team *t)
{
    STORE(&t->busy, t->n - 1);
    bump_gen(t);
    run_tiles(t);
    int spin_only = (t->flags & COLIBRI_THREADS_SPIN) != 0;
    for (uint32_t spins = 0;; spins++) {
        uint32_t b = LOAD_ACQ(&t->busy);
        if (b == 0)
            return;
        if (spin_only || spins < CLB_SPINS) {
            cpu_relax();
            continue;
        }
        STORE(&t->caller_parked, 1u);
        if ((b = LOAD(&t->busy)) != 0)
            futex_wait(&t->busy, b);
        STORE(&t->caller_parked, 0u);
    }
}
#endif /* CLB_POOL */

/* ------------------------------------------------------------------------ */

void clb_parallel(clb_team *t, uint32_t n_tiles, clb_tile_fn fn, void *ctx)
{
    if (t->n <= 1 || n_tiles <= 1) {
        for (uint32_t i = 0; i < n_tiles; i++)
            fn(ctx, i);
        return;
    }
    t->fn = fn;
    t->ctx = ctx;
    t->n_tiles = n_tiles;
    __atomic_store_n(&t->next, 0u, __ATOMIC_RELAXED);
    if (t->ex.run) {
        t->ex.run(t->ex.user, t->n, executor_work, t);
        return;
    }
#if CLB_POOL
    pool_region(t);
#endif
}

void clb_team_stop(clb_team *t)
{
#if CLB_POOL
    struct clb_pool *pool = t->pool;
    if (pool) {
        STORE(&t->stop, 1u);
        ADD(&t->gen, 1u);
        futex_wake(&t->gen);
        for (uint32_t i = 0; i < pool->started; i++)
            pthread_join(pool->th[i], NULL);
        free(pool);
    }
#endif
    memset(t, 0, sizeof *t);
}

int clb_team_set(clb_team *t, uint32_t n, uint32_t flags,
                 const colibri_executor *ex)
{
    clb_team_stop(t);
    if (ex) {
        t->ex = *ex;
        t->n = ex->n_workers;
        return COLIBRI_OK;
    }
    if (n <= 1)
        return COLIBRI_OK;
#if CLB_POOL
    struct clb_pool *pool = (struct clb_pool *)calloc(1, sizeof *pool);
    if (!pool)
        return COLIBRI_E_NO_MEMORY;
    pool->team = t;
    pool->start_gen = LOAD(&t->gen);
    t->n = n;
    t->flags = flags;
    t->pool = pool;
    for (uint32_t i = 0; i + 1 < n; i++) {
        if (pthread_create(&pool->th[i], NULL, worker_main, pool) != 0) {
            clb_team_stop(t);
            return COLIBRI_E_NO_MEMORY;
        }
        pool->started++;
    }
    return COLIBRI_OK;
#else
    (void)flags;
    return COLIBRI_E_UNSUPPORTED;
#endif
}

#else
/* COLIBRI_THREADS=0: threads.h has the serial forms; nothing to compile. */
typedef int clb_threads_unused_;
#endif /* COLIBRI_THREADS */
