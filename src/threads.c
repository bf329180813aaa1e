/*
 * threads.c - the team that runs an instance's parallel regions
 * (threads.h): a pthread pool that parks its workers on a futex between
 * regions (or only spins, COLIBRI_THREADS_SPIN), or the caller's executor
 * (colibri_executor: an RTOS's tasks, no OS in the library).
 *
 * Protocol of the pool (every step a GCC __atomic operation):
 *   caller: write fn/ctx/n_tiles, next = 0, open the door, gen += 1; if a
 *           worker sleeps, FUTEX_WAKE gen; take tiles; then close the door
 *           once nobody is inside (spin, then FUTEX_WAIT on door).
 *   worker: wait until gen changes (spin, then FUTEX_WAIT on gen); enter
 *           through the door if it is open (CAS: open | inside + 1), take
 *           tiles until the counter passes n_tiles, leave (inside - 1; the
 *           last one out wakes a parked caller).
 * A worker that is not running (a busy or shared machine) never holds the
 * caller up: it finds the door closed and waits for the next region, and the
 * caller (and the others) take its tiles; one descheduled inside a region
 * holds up at most the run of tiles it took (run_tiles: a share of what
 * was left, 1/8 for two workers at most). Which worker takes a tile never
 * changes what the tile computes. The region's fields are read only inside
 * the door, which the caller opens after writing them (release) and closes
 * before returning, so a late worker never sees a stale region.
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

#define LOAD(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define ADD(p, v) __atomic_add_fetch((p), (v), __ATOMIC_SEQ_CST)
#define SUB(p, v) __atomic_sub_fetch((p), (v), __ATOMIC_SEQ_CST)
#define CLB_DOOR_OPEN 0x80000000u

/* Take runs of consecutive tiles until none is left: a run is 1 /
 * (CLB_RUN_SHARE x workers) of the tiles still free (at least one), so the
 * runs shrink towards the region's end and a slow worker holds up at most
 * its current run. One tile a take, as before, alternated the workers over
 * neighbouring row tiles: each core's weight stream restarted every tile
 * (16 rows, ~11 KiB of a prefill's matrix) and every take moved the counter's
 * cache line between the cores. With runs, prefill at 2 threads was 4-7 %
 * faster and decode 5 % (FINDINGS.md 26); who computes a tile still never
 * changes what it computes. */
#define CLB_RUN_SHARE 4u
static void run_tiles(clb_team *t, uint32_t worker)
{
    const uint32_t n = t->n_tiles, share = CLB_RUN_SHARE * t->n;
    uint32_t i = __atomic_load_n(&t->next, __ATOMIC_RELAXED), run;
    for (;;) {
        do {
            if (i >= n)
                return;
            run = (n - i) / share;
            if (run == 0)
                run = 1;
        } while (!__atomic_compare_exchange_n(&t->next, &i, i + run, 0, __ATOMIC_RELAXED,
                                              __ATOMIC_RELAXED));
        for (uint32_t k = i; k < i + run; k++)
            t->fn(t->ctx, k, worker);
        i = __atomic_load_n(&t->next, __ATOMIC_RELAXED);
    }
}

/* ------------------------------------------------------------------------ */
/* The executor hook                                                        */
/* ------------------------------------------------------------------------ */

/* What the executor runs on each of its workers: the same tile loop. */
static void executor_work(void *arg, uint32_t worker)
{
    clb_team *t = (clb_team *)arg;
    if (worker < t->n) /* an index past the team's is the executor's bug */
        run_tiles(t, worker);
}

/* ------------------------------------------------------------------------ */
/* The pthread pool                                                         */
/* ------------------------------------------------------------------------ */

#if CLB_POOL
/* Spins (each a pause/yield instruction, 10-150 cycles) before a parking
 * worker or caller enters the kernel: about 20-200 us, longer than the
 * serial stretches between the regions of one decode step (norms, RoPE,
 * attention of a short context), so a step runs without a system call while
 * the pool is warm, and much shorter than the gap between steps of a slow
 * caller. */
#define CLB_SPINS (1u << 12)

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || (defined(__arm__) && __ARM_ARCH >= 7)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

struct clb_worker {
    struct clb_pool *pool;
    uint32_t id;         /* 1 .. n-1 */
};

struct clb_pool {
    pthread_t th[COLIBRI_MAX_THREADS];
    struct clb_worker w[COLIBRI_MAX_THREADS];
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
    struct clb_pool *pool = ((struct clb_worker *)arg)->pool;
    uint32_t id = ((struct clb_worker *)arg)->id;
    clb_team *t = pool->team;
    int spin_only = (t->flags & COLIBRI_THREADS_SPIN) != 0;
    /* Not the current gen: a thread that starts late must still see the
     * regions (or the stop) published since its creation. */
    uint32_t seen = pool->start_gen;
    for (;;) {
        seen = await_change(&t->gen, seen, spin_only, &t->sleepers);
        if (LOAD(&t->stop))
            return NULL;
        uint32_t d = LOAD(&t->door);
        while ((d & CLB_DOOR_OPEN) &&
               !__atomic_compare_exchange_n(&t->door, &d, d + 1u, 0,
                                            __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            ;
        if (!(d & CLB_DOOR_OPEN))
            continue; /* too late: the region is over */
        run_tiles(t, id);
        if (SUB(&t->door, 1u) == CLB_DOOR_OPEN && LOAD(&t->caller_parked))
            futex_wake(&t->door);
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
    STORE(&t->door, CLB_DOOR_OPEN);
    bump_gen(t);
    run_tiles(t, 0);
    /* Every tile is taken; close the door when the last worker inside has
     * finished its tile. */
    int spin_only = (t->flags & COLIBRI_THREADS_SPIN) != 0;
    for (uint32_t spins = 0;; spins++) {
        uint32_t d = CLB_DOOR_OPEN;
        if (__atomic_compare_exchange_n(&t->door, &d, 0u, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST))
            return;
        if (spin_only || spins < CLB_SPINS) {
            cpu_relax();
            continue;
        }
        STORE(&t->caller_parked, 1u);
        if ((d = LOAD(&t->door)) != CLB_DOOR_OPEN)
            futex_wait(&t->door, d);
        STORE(&t->caller_parked, 0u);
    }
}
#endif /* CLB_POOL */

/* ------------------------------------------------------------------------ */

void clb_parallel(clb_team *t, uint32_t n_tiles, clb_tile_fn fn, void *ctx)
{
    if (t->n <= 1 || n_tiles <= 1) {
        for (uint32_t i = 0; i < n_tiles; i++)
            fn(ctx, i, 0);
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

int clb_team_set(clb_team *t, uint32_t n, uint32_t flags, const colibri_executor *ex)
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
        pool->w[i].pool = pool;
        pool->w[i].id = i + 1;
        if (pthread_create(&pool->th[i], NULL, worker_main, &pool->w[i]) != 0) {
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
