/*
 * i8_matmul.c - micro-benchmark of one kernel table's matmul_i8 at a model's
 * shapes, with weights streamed from memory as decode streams them (issue 15:
 * int8 without VNNI). No assertion: figures only.
 *
 * Build (x86-64; pick the table with the defines, e.g. -DCOLIBRI_AVX2_NO_VNNI
 * for the plain AVX2 table on a VNNI CPU, or link an older avx2.c for A/B):
 *   cc -std=c11 -O2 -ffp-contract=off -DCOLIBRI_USE_AVX2 -Isrc/kernels
 *      bench/c/i8_matmul.c src/kernels/ref.c src/kernels/avx2.c -lm -o i8_matmul
 * Run:
 *   i8_matmul N ROWS COLS GROUP [RING_MIB [SECONDS]]
 * ROWS x COLS int8 weights with float scales per GROUP columns, N tokens.
 * The weights are RING_MIB MiB of distinct matrices (default 512: far past
 * the last-level cache, so every call reads its weights from DRAM, as a
 * model's decode does); each call takes the next matrix of the ring.
 * Prints one JSON line: the table's name, per call the median wall and CPU
 * milliseconds over batches, weight GB/s and int8 GOPS (2 per multiply-add).
 */
#define _POSIX_C_SOURCE 200809L

#include "kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../bench/c/bench_clock.h"

static uint64_t rng = 0x1234567887654321ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s N ROWS COLS GROUP [RING_MIB [SECONDS]]\n", argv[0]);
        return 2;
    }
    const uint32_t n = (uint32_t)atoi(argv[1]), rows = (uint32_t)atoi(argv[2]),
                   cols = (uint32_t)atoi(argv[3]), group = (uint32_t)atoi(argv[4]);
    const double ring_mib = argc > 5 ? atof(argv[5]) : 512.0;
    const double seconds = argc > 6 ? atof(argv[6]) : 2.0;
    const colibri_kernels *k = colibri_kernels_avx2();
    if (!k)
        k = colibri_kernels_ref();
    const uint32_t ng = (cols + group - 1) / group;
    const size_t qbytes = (size_t)rows * cols, sbytes = (size_t)rows * ng * sizeof(float);
    size_t nmat = (size_t)(ring_mib * 1048576.0 / (double)(qbytes + sbytes));
    if (nmat < 1)
        nmat = 1;
    int8_t *Q = malloc(qbytes * nmat);
    float *S = malloc(sbytes * nmat);
    float *X = malloc((size_t)n * cols * sizeof(float));
    int8_t *XQ = malloc((size_t)n * cols);
    float *XS = malloc((size_t)n * ng * sizeof(float));
    float *Y = malloc((size_t)n * rows * sizeof(float));
    if (!Q || !S || !X || !XQ || !XS || !Y) {
        fprintf(stderr, "out of memory\n");
        return 2;
    }
    for (size_t i = 0; i < qbytes * nmat; i++)
        Q[i] = (int8_t)(int32_t)(rnd() % 255u - 127u);
    for (size_t i = 0; i < (size_t)rows * ng * nmat; i++)
        S[i] = (float)(rnd() % 1000u + 1u) * 1e-5f;
    for (size_t i = 0; i < (size_t)n * cols; i++)
        X[i] = (float)((int32_t)(rnd() % 2001u) - 1000) * 1e-3f;
    k->quantize_act_i8(XQ, XS, X, n, cols, group);

    enum { MAXB = 64 };
    double wall[MAXB], cpu[MAXB];
    long calls_per_batch = 0;
    size_t m = 0;
    /* warm-up pass over the whole ring (page faults, frequency) */
    for (size_t i = 0; i < nmat; i++)
        k->matmul_i8(Y, Q + qbytes * i, S + (sbytes / sizeof(float)) * i, XQ, XS, n, rows,
                     cols, group);
    /* calls per batch: about seconds / 20 of work */
    {
        double t0 = now_s();
        long c = 0;
        do {
            k->matmul_i8(Y, Q + qbytes * m, S + (sbytes / sizeof(float)) * m, XQ, XS, n,
                         rows, cols, group);
            m = (m + 1) % nmat;
            c++;
        } while (now_s() - t0 < seconds / 20.0);
        calls_per_batch = c;
    }
    int nb = 0;
    double tend = now_s() + seconds;
    while (nb < MAXB && (nb < 5 || now_s() < tend)) {
        double w0 = now_s(), c0 = cpu_s();
        for (long c = 0; c < calls_per_batch; c++) {
            k->matmul_i8(Y, Q + qbytes * m, S + (sbytes / sizeof(float)) * m, XQ, XS, n,
                         rows, cols, group);
            m = (m + 1) % nmat;
        }
        wall[nb] = (now_s() - w0) / (double)calls_per_batch;
        cpu[nb] = (cpu_s() - c0) / (double)calls_per_batch;
        nb++;
    }
    qsort(wall, (size_t)nb, sizeof(double), cmp_d);
    qsort(cpu, (size_t)nb, sizeof(double), cmp_d);
    const double wm = wall[nb / 2], cm = cpu[nb / 2];
    volatile float sink = Y[0];
    (void)sink;
    printf("{\"table\": \"%s\", \"n\": %u, \"rows\": %u, \"cols\": %u, \"group\": %u, "
           "\"ring_mib\": %.0f, \"wall_ms\": %.4f, \"cpu_ms\": %.4f, \"weight_gbs\": %.2f, "
           "\"gops\": %.2f, \"batches\": %d}\n",
           k->name, n, rows, cols, group, ring_mib, wm * 1e3, cm * 1e3,
           (double)(qbytes + sbytes) / cm * 1e-9, 2.0 * n * rows * cols / cm * 1e-9, nb);
    free(Q);
    free(S);
    free(X);
    free(XQ);
    free(XS);
    free(Y);
    return 0;
}
