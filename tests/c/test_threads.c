/*
 * test_threads.c - one instance per thread over one shared weight mapping.
 *
 *   test_threads MODEL [THREADS=4] [DECODE_STEPS=16]
 *
 * The owner instance loads MODEL (colibri_init: one mapping). First it runs,
 * alone, THREADS different token sequences (a 24-token prompt, then
 * DECODE_STEPS single-token decode steps) and keeps every logit. Then THREADS
 * instances made with colibri_share (instance 0 with a caller arena, the
 * others with library-allocated arenas) run the same sequences concurrently,
 * one per thread, and every logit must be bit-identical to the single-thread
 * run. Built with -fsanitize=thread too (tests/test_runtime_threads.py).
 * Exit 0 and "threads: identical" on success, 1 on a mismatch, 10 - code on a
 * library error.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"

#define PROMPT 24
#define MAX_THREADS 16

typedef struct {
    colibri_model *m;
    int32_t tokens[PROMPT + 256];
    uint32_t steps, vocab;
    float *logits;       /* [(PROMPT + steps), vocab] */
    int rc;
} job;

/* Prompt in one call, then teacher-forced decode steps. */
static void *run_job(void *arg)
{
    job *j = (job *)arg;
    j->rc = colibri_infer(j->m, j->tokens, NULL, 1, PROMPT, 0, j->logits);
    for (uint32_t s = 0; s < j->steps && j->rc == 0; s++)
        j->rc = colibri_infer(j->m, &j->tokens[PROMPT + s], NULL, 1, 1, PROMPT + s,
                              j->logits + (size_t)(PROMPT + s) * j->vocab);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_threads MODEL [THREADS] [STEPS]\n");
        return 2;
    }
    int n = argc > 2 ? atoi(argv[2]) : 4;
    uint32_t steps = argc > 3 ? (uint32_t)atoi(argv[3]) : 16;
    if (n < 1 || n > MAX_THREADS || steps > 256)
        return 2;
    colibri_model owner;
    int rc = colibri_init(&owner, argv[1]);
    if (rc) {
        printf("error %d %s\n", rc, colibri_error_detail(&owner));
        return 10 - rc;
    }
    colibri_info info;
    colibri_get_info(&owner, &info);
    if (PROMPT + steps > info.shape.max_seq_len)
        return 2;
    uint32_t V = info.shape.vocab;
    size_t rows = PROMPT + steps;

    static job solo[MAX_THREADS], par[MAX_THREADS];
    uint32_t x = 12345;
    for (int t = 0; t < n; t++) {
        for (size_t i = 0; i < rows; i++) {
            x = x * 1103515245u + 12345u;        /* a fixed LCG: same tokens */
            solo[t].tokens[i] = (int32_t)((x >> 8) % V);
        }
        solo[t].steps = steps;
        solo[t].vocab = V;
        solo[t].logits = (float *)malloc(rows * V * sizeof(float));
        par[t] = solo[t];
        par[t].logits = (float *)malloc(rows * V * sizeof(float));
    }
    /* Single thread, owner instance, one sequence after another. */
    for (int t = 0; t < n; t++) {
        solo[t].m = &owner;
        run_job(&solo[t]);
        if (solo[t].rc) {
            printf("error %d %s\n", solo[t].rc, colibri_error_detail(&owner));
            return 10 - solo[t].rc;
        }
    }
    /* Shared instances: only an arena each. */
    static colibri_model inst[MAX_THREADS];
    void *arena_base = NULL;
    for (int t = 0; t < n; t++) {
        void *arena = NULL;
        size_t arena_size = 0;
        if (t == 0) {
            arena_size = info.arena_bytes;
            arena_base = malloc(arena_size + 64);
            arena = (void *)(((uintptr_t)arena_base + 63) & ~(uintptr_t)63);
        }
        rc = colibri_share(&inst[t], &owner, arena, arena_size);
        if (rc) {
            printf("error %d %s\n", rc, colibri_error_detail(&inst[t]));
            return 10 - rc;
        }
        par[t].m = &inst[t];
    }
    pthread_t th[MAX_THREADS];
    for (int t = 0; t < n; t++)
        pthread_create(&th[t], NULL, run_job, &par[t]);
    for (int t = 0; t < n; t++)
        pthread_join(th[t], NULL);
    int status = 0;
    for (int t = 0; t < n; t++) {
        if (par[t].rc) {
            printf("error %d %s\n", par[t].rc, colibri_error_detail(&inst[t]));
            status = 10 - par[t].rc;
        } else if (memcmp(par[t].logits, solo[t].logits, rows * V * sizeof(float))) {
            printf("thread %d: logits differ from the single-thread run\n", t);
            status = 1;
        }
    }
    for (int t = 0; t < n; t++) {
        colibri_free(&inst[t]);
        free(solo[t].logits);
        free(par[t].logits);
    }
    colibri_free(&owner);
    free(arena_base);
    if (status == 0)
        printf("threads: identical (%d threads, %u decode steps, %s kernels)\n",
               n, steps, info.kernels);
    return status;
}
