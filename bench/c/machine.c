/*
 * machine.c - what one core of this machine can do, measured in the same run
 * as the engines (bench/run.py): the ceilings the kernels are judged against.
 * No Colibri code. Prints one JSON object.
 *
 *   machine fma SECONDS        AVX2 FMA peak: 12 independent chains of
 *                              256-bit fused multiply-adds (8 floats, 2 flops
 *                              each); enough chains to cover the FMA latency
 *                              on any core with <= 2 FMA ports x 6 cycles.
 *   machine mem MIB REPS       memcpy of a MIB-MiB buffer (far larger than the
 *                              caches): bytes copied per second (each byte
 *                              read once and written once), best of REPS;
 *                              and read-only bandwidth (an AVX2 sum over the
 *                              same buffer), which is what decode does to
 *                              its weights.
 */
#define _POSIX_C_SOURCE 200809L
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_clock.h"

__attribute__((target("avx2,fma"), noinline))
static float fma_chains(long iters)
{
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    __m256 a0 = _mm256_set1_ps(0.f), a1 = _mm256_set1_ps(1.f), a2 = _mm256_set1_ps(2.f),
           a3 = _mm256_set1_ps(3.f), a4 = _mm256_set1_ps(4.f), a5 = _mm256_set1_ps(5.f),
           a6 = _mm256_set1_ps(6.f), a7 = _mm256_set1_ps(7.f), a8 = _mm256_set1_ps(8.f),
           a9 = _mm256_set1_ps(9.f), a10 = _mm256_set1_ps(10.f), a11 = _mm256_set1_ps(11.f);
    for (long it = 0; it < iters; it++) {
        /* 12 independent dependency chains: throughput-bound, not latency */
        a0 = _mm256_fmadd_ps(a0, m, c);
        a1 = _mm256_fmadd_ps(a1, m, c);
        a2 = _mm256_fmadd_ps(a2, m, c);
        a3 = _mm256_fmadd_ps(a3, m, c);
        a4 = _mm256_fmadd_ps(a4, m, c);
        a5 = _mm256_fmadd_ps(a5, m, c);
        a6 = _mm256_fmadd_ps(a6, m, c);
        a7 = _mm256_fmadd_ps(a7, m, c);
        a8 = _mm256_fmadd_ps(a8, m, c);
        a9 = _mm256_fmadd_ps(a9, m, c);
        a10 = _mm256_fmadd_ps(a10, m, c);
        a11 = _mm256_fmadd_ps(a11, m, c);
        /* an empty asm that "changes" the registers: the compiler can neither
         * fold the iterations nor spill them to memory */
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5),
                         "+x"(a6), "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[7];
}

__attribute__((target("avx2"), noinline))
static float sum_read(const float *p, size_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
    }
    s0 = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    float out[8];
    _mm256_storeu_ps(out, s0);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

static int mode_fma(double seconds)
{
    long iters = 1000000;
    double dt = 0;
    float sink = 0;
    /* grow the loop until one run takes about a tenth of the budget */
    for (;;) {
        double t0 = now_s();
        sink += fma_chains(iters);
        dt = now_s() - t0;
        if (dt > seconds / 10)
            break;
        iters *= 2;
    }
    double best = dt, best_cpu = 1e30, t_end = now_s() + seconds;
    while (now_s() < t_end) {
        double t0 = now_s(), c0 = cpu_s();
        sink += fma_chains(iters);
        double d = now_s() - t0, dc = cpu_s() - c0;
        if (d < best)
            best = d;
        if (dc < best_cpu)
            best_cpu = dc;
    }
    double flops = (double)iters * 12 * 8 * 2;
    printf("{\"fma_gflops\": %.6g, \"fma_gflops_cpu\": %.6g, \"iters\": %ld, \"sink\": %g}\n",
           flops / best / 1e9, flops / best_cpu / 1e9, iters, (double)sink);
    return 0;
}

static int mode_mem(size_t mib, int reps)
{
    size_t bytes = mib << 20;
    float *a = NULL, *b = NULL;
    if (posix_memalign((void **)&a, 64, bytes) || posix_memalign((void **)&b, 64, bytes)) {
        fprintf(stderr, "machine: cannot allocate 2 x %zu MiB\n", mib);
        return 1;
    }
    memset(a, 1, bytes); /* fault every page in before timing */
    memset(b, 2, bytes);
    double best_copy = 1e30, best_read = 1e30, cpu_copy = 1e30, cpu_read = 1e30;
    float sink = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s(), c0 = cpu_s();
        memcpy(b, a, bytes);
        double d = now_s() - t0, dc = cpu_s() - c0;
        if (d < best_copy)
            best_copy = d;
        if (dc < cpu_copy)
            cpu_copy = dc;
        t0 = now_s();
        c0 = cpu_s();
        sink += sum_read(b, bytes / sizeof(float));
        d = now_s() - t0;
        dc = cpu_s() - c0;
        if (d < best_read)
            best_read = d;
        if (dc < cpu_read)
            cpu_read = dc;
    }
    printf("{\"memcpy_bytes_per_s\": %.6g, \"read_bytes_per_s\": %.6g, "
           "\"memcpy_bytes_per_cpu_s\": %.6g, \"read_bytes_per_cpu_s\": %.6g, "
           "\"buffer_mib\": %zu, \"sink\": %g}\n", (double)bytes / best_copy,
           (double)bytes / best_read, (double)bytes / cpu_copy, (double)bytes / cpu_read, mib,
           (double)sink);
    free(a);
    free(b);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "fma"))
        return mode_fma(atof(argv[2]));
    if (argc == 4 && !strcmp(argv[1], "mem"))
        return mode_mem((size_t)atol(argv[2]), atoi(argv[3]));
    fprintf(stderr, "usage: machine fma SECONDS | machine mem MIB REPS\n");
    return 2;
}
