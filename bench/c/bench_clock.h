/* bench_clock.h - the two clocks every bench driver reads.
 * now_s: wall time (monotonic). cpu_s: CPU time of this process, the time it
 * actually ran; on a shared machine wall time overstates it by however long
 * other processes held the core. */
#ifndef COLIBRI_BENCH_CLOCK_H
#define COLIBRI_BENCH_CLOCK_H

#include <time.h>

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
