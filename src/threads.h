/*
 * threads.h - the team of workers that computes an instance's parallel
 * regions (threads.c). Not installed, not public.
 *
 * A parallel region is a number of TILES, fixed by the caller from the
 * shapes alone (never from the number of workers): clb_parallel runs
 * fn(ctx, t) once for every t in [0, n_tiles) and returns when all have
 * returned. Workers take tiles from a shared counter, so the thread count
 * only decides WHO computes a tile, never what a tile computes: results are
 * bit-identical for every thread count and to a build without threads,
 * which runs the same tiles in order on the caller.
 *
 * The team lives in the plan (the arena): its state is a few words, so the
 * executor hook works in builds that never call malloc. The pthread pool
 * (its thread handles) is allocated by colibri_set_threads, outside infer.
 *
 * Build switch: COLIBRI_THREADS=0|1 (default 1 on Linux, 0 elsewhere).
 * With 0 the team is empty, clb_parallel is the serial loop below and the
 * library does not reference pthreads or atomics at all (cortex-m).
 */
#ifndef COLIBRI_THREADS_H
#define COLIBRI_THREADS_H

#include <stdint.h>

#include "colibri.h"

#ifndef COLIBRI_THREADS
#if defined(__linux__)
#define COLIBRI_THREADS 1
#else
#define COLIBRI_THREADS 0
#endif
#endif

/* One tile of a region, computed by worker `worker` (0 = the caller, below
 * the team's size): never a reason for different arithmetic. */
typedef void (*clb_tile_fn)(void *ctx, uint32_t tile, uint32_t worker);

#if COLIBRI_THREADS
struct clb_pool; /* threads.c: the pthread handles (malloc'd) */

/* All fields belong to threads.c. n == 1 (or 0, never set up): serial. */
typedef struct clb_team {
    uint32_t n;              /* workers including the caller, 1..MAX */
    uint32_t flags;          /* COLIBRI_THREADS_SPIN */
    colibri_executor ex;     /* ex.run != NULL: the caller's workers */
    struct clb_pool *pool;   /* pthread mode, else NULL */
    /* The current region, written by the caller before it publishes gen. */
    clb_tile_fn fn;
    void *ctx;
    uint32_t n_tiles;
    /* Atomics (GCC __atomic builtins). */
    uint32_t next;           /* next tile to take */
    uint32_t gen;            /* region generation: workers wait for a change */
    uint32_t door;           /* CLB_DOOR_OPEN while workers may join the
                                region, | the workers inside it */
    uint32_t sleepers;       /* pool workers parked on gen (futex) */
    uint32_t caller_parked;  /* the caller parked on door (futex) */
    uint32_t stop;           /* pool workers exit at the next generation */
} clb_team;

/* Run fn(ctx, t) for every t in [0, n_tiles) on the team (the caller is
 * worker 0) and return when all tiles are done. No allocation; system calls
 * only the futex wake/wait of a parking pool (never with
 * COLIBRI_THREADS_SPIN), or whatever the caller's executor does. */
void clb_parallel(clb_team *team, uint32_t n_tiles, clb_tile_fn fn, void *ctx);

/* Replace the team's workers: n - 1 pthreads (flags as colibri_set_threads),
 * or the caller's executor (ex != NULL). Joins the previous workers first.
 * Returns 0, COLIBRI_E_NO_MEMORY, COLIBRI_E_UNSUPPORTED (pthread mode in a
 * build without malloc or pthreads); on failure the team is serial. */
int clb_team_set(clb_team *team, uint32_t n, uint32_t flags,
                 const colibri_executor *ex);

/* Join and release the workers; the team becomes serial. Idempotent. */
void clb_team_stop(clb_team *team);

static inline uint32_t clb_team_size(const clb_team *team)
{
    return team->n ? team->n : 1;
}
#else
typedef struct clb_team { char unused_; } clb_team;

static inline void clb_parallel(clb_team *team, uint32_t n_tiles,
                                clb_tile_fn fn, void *ctx)
{
    (void)team;
    for (uint32_t t = 0; t < n_tiles; t++)
        fn(ctx, t, 0);
}

static inline void clb_team_stop(clb_team *team) { (void)team; }
static inline uint32_t clb_team_size(const clb_team *team)
{
    (void)team;
    return 1;
}
#endif

#endif /* COLIBRI_THREADS_H */
