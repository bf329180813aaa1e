/*
 * threads_bench.c - Colibri's side of the thread benchmark (bench/threads.py).
 * Public API only (colibri.h); linked against libcolibri.a.
 *
 *   threads_bench MODEL TOKENS [kv=i8]
 *
 * kv=i8: the int8 KV cache (colibri_options.kv_dtype COLIBRI_KV_I8; the
 * default is float32).
 * Loads MODEL once, then serves commands read from stdin, one per line, so
 * that bench/threads.py can interleave this engine with its peers round
 * after round without reloading a 2.6 GB file each time. Every command
 * answers with exactly one JSON object on one stdout line; an error answers
 * {"error": "..."} and the server keeps serving.
 *
 *   threads N SPIN        colibri_set_threads(m, N, SPIN ? COLIBRI_THREADS_SPIN : 0)
 *   prefill last|all N REPS
 *                         REPS fresh prefills of TOKENS[0:N] (n_past 0, batch 1);
 *                         last: colibri_infer_ex(COLIBRI_LOGITS_LAST), the
 *                         logits of the last position only (as llama-bench's
 *                         pp test); all: every position's logits
 *                         (COLIBRI_LOGITS_ALL, today's colibri_infer).
 *                         -> {"wall_s": [...], "cpu_s": [...], "argmax": id}
 *   decode N_PROMPT STEPS a prefill of TOKENS[0:N_PROMPT] (untimed), then
 *                         STEPS greedy decode calls (batch 1, KV cache).
 *                         -> {"wall_s": [...], "cpu_s": [...], "tokens": [...]}
 *   info                  -> {"kernels": ..., "threads_api": 0|1, ...}
 *   quit
 *
 * CPU time is CLOCK_PROCESS_CPUTIME_ID: with 2 threads it is the sum of
 * both threads' time, including a worker's spinning or waiting for work.
 *
 * BENCH_HAVE_THREADS (bench/threads.py defines it when colibri.h declares
 * colibri_set_threads) enables the thread and logits-mode API; without it
 * only `threads 1 0` and `prefill all` are served, so the harness runs on a
 * tree that predates them.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"
#include "bench_clock.h"

static int32_t argmax(const float *v, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return (int32_t)best;
}

static void print_doubles(const char *key, const double *v, size_t n)
{
    printf("\"%s\": [", key);
    for (size_t i = 0; i < n; i++)
        printf("%s%.9g", i ? ", " : "", v[i]);
    printf("]");
}

static void answer_error(const char *what, int rc, const colibri_model *m)
{
    /* detail strings are plain ASCII without quotes in practice; strip any */
    char detail[256] = "";
    if (m && rc) {
        const char *d = colibri_error_detail(m);
        size_t j = 0;
        for (size_t i = 0; d && d[i] && j + 1 < sizeof detail; i++)
            detail[j++] = (d[i] == '"' || d[i] == '\\') ? '\'' : d[i];
        detail[j] = 0;
    }
    printf("{\"error\": \"%s: %s (%d) %s\"}\n", what,
           rc ? colibri_strerror_for(rc, COLIBRI_CALL_INFER) : "", rc, detail);
    fflush(stdout);
}

/* Reads whitespace-separated ids; returns the count (0 on error). */
static size_t read_tokens(const char *path, int32_t **out)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = 0, cap = 1024;
    int32_t *v = malloc(cap * sizeof *v);
    long x;
    while (v && fscanf(f, "%ld", &x) == 1) {
        if (n == cap) {
            int32_t *nv = realloc(v, 2 * cap * sizeof *v);
            if (!nv) {
                free(v);
                v = NULL;
                break;
            }
            v = nv;
            cap *= 2;
        }
        v[n++] = (int32_t)x;
    }
    fclose(f);
    *out = v;
    return v ? n : 0;
}

/* One prefill of ids[0:n] from position 0; last != 0: last position's
 * logits only (logits holds V floats then), else all n rows. */
static int prefill(colibri_model *m, const int32_t *ids, uint32_t n, int last, float *logits)
{
#ifdef BENCH_HAVE_THREADS
    return colibri_infer_ex(m, ids, NULL, 1, n, 0,
                            last ? COLIBRI_LOGITS_LAST : COLIBRI_LOGITS_ALL, logits);
#else
    (void)last;
    return colibri_infer(m, ids, NULL, 1, n, 0, logits);
#endif
}

int main(int argc, char **argv)
{
    const int kv_i8 = argc == 4 && !strcmp(argv[3], "kv=i8");
    if (argc != 3 && !kv_i8) {
        fprintf(stderr, "usage: threads_bench MODEL TOKENS [kv=i8]  (commands on stdin)\n");
        return 2;
    }
    int32_t *tok;
    size_t ntok = read_tokens(argv[2], &tok);
    if (!ntok) {
        fprintf(stderr, "threads_bench: cannot read token ids from %s\n", argv[2]);
        return 1;
    }
    colibri_model m;
    colibri_info info;
    double t0 = now_s();
    colibri_options opt = colibri_options_default();
    opt.kv_dtype = kv_i8 ? COLIBRI_KV_I8 : COLIBRI_KV_F32;
    int rc = colibri_init_ex(&m, argv[1], &opt);
    if (!rc)
        rc = colibri_get_info(&m, &info);
    if (rc) {
        fprintf(stderr, "threads_bench: %s: %s (%d) %s\n", argv[1],
                colibri_strerror_for(rc, COLIBRI_CALL_INIT), rc, colibri_error_detail(&m));
        return 1;
    }
    double load_s = now_s() - t0;
    const uint32_t V = info.shape.vocab, S = info.shape.max_seq_len;
    if (ntok > S)
        ntok = S;
    float *logits = malloc((size_t)ntok * V * sizeof *logits);
    double *wall = malloc(ntok * sizeof *wall), *cpu = malloc(ntok * sizeof *cpu);
    int32_t *gen = malloc((ntok + 1) * sizeof *gen);
    if (!logits || !wall || !cpu || !gen) {
        fprintf(stderr, "threads_bench: out of memory\n");
        return 1;
    }
#ifdef BENCH_HAVE_THREADS
    const int have_threads = 1;
#else
    const int have_threads = 0;
#endif
    printf("{\"ready\": true, \"load_s\": %.6f}\n", load_s);
    fflush(stdout);

    char line[256], cmd[32], arg[32];
    while (fgets(line, sizeof line, stdin)) {
        unsigned a = 0, b = 0;
        int nf = sscanf(line, "%31s %31s %u %u", cmd, arg, &a, &b);
        if (nf < 1)
            continue;
        if (!strcmp(cmd, "quit"))
            break;
        if (!strcmp(cmd, "info")) {
            printf("{\"kernels\": \"%s\", \"load_mode\": \"%s\", \"threads_api\": %d, "
                   "\"chunk_tokens\": %u, \"vocab\": %u, \"max_seq_len\": %u}\n",
                   info.kernels, info.load_mode, have_threads, info.chunk_tokens, V, S);
        } else if (!strcmp(cmd, "threads") && nf >= 2) {
            unsigned n = (unsigned)atoi(arg), spin = a;
#ifdef BENCH_HAVE_THREADS
            rc = colibri_set_threads(&m, n, spin ? COLIBRI_THREADS_SPIN : 0);
            if (rc) {
                answer_error("colibri_set_threads", rc, &m);
                continue;
            }
#else
            if (n != 1 || spin) {
                printf("{\"error\": \"this colibri.h has no colibri_set_threads\"}\n");
                fflush(stdout);
                continue;
            }
#endif
            printf("{\"threads\": %u, \"spin\": %u}\n", n, spin);
        } else if (!strcmp(cmd, "prefill") && nf == 4) {
            int last = !strcmp(arg, "last");
            if (!last && strcmp(arg, "all")) {
                printf("{\"error\": \"prefill last|all N REPS\"}\n");
            } else if (last && !have_threads) {
                printf("{\"error\": \"this colibri.h has no colibri_infer_ex\"}\n");
            } else if (a < 1 || a > ntok || b < 1 || b > ntok) {
                printf("{\"error\": \"prefill: N in 1..%zu, REPS in 1..%zu\"}\n", ntok, ntok);
            } else {
                for (unsigned r = 0; r < b && !rc; r++) {
                    double w0 = now_s(), c0 = cpu_s();
                    rc = prefill(&m, tok, a, last, logits);
                    wall[r] = now_s() - w0;
                    cpu[r] = cpu_s() - c0;
                }
                if (rc) {
                    answer_error("prefill", rc, &m);
                    rc = 0;
                    continue;
                }
                const float *row = last ? logits : logits + (size_t)(a - 1) * V;
                printf("{");
                print_doubles("wall_s", wall, b);
                printf(", ");
                print_doubles("cpu_s", cpu, b);
                printf(", \"argmax\": %d}\n", argmax(row, V));
            }
        } else if (!strcmp(cmd, "decode") && nf >= 2) {
            unsigned n_prompt = (unsigned)atoi(arg), steps = a;
            if (n_prompt < 1 || n_prompt + steps > S || n_prompt > ntok || steps > ntok) {
                printf("{\"error\": \"decode: N_PROMPT + STEPS must fit %u positions\"}\n", S);
                fflush(stdout);
                continue;
            }
            rc = colibri_infer(&m, tok, NULL, 1, n_prompt, 0, logits);
            if (rc) {
                answer_error("prompt", rc, &m);
                rc = 0;
                continue;
            }
            gen[0] = argmax(logits + (size_t)(n_prompt - 1) * V, V);
            for (unsigned i = 0; i < steps && !rc; i++) {
                double w0 = now_s(), c0 = cpu_s();
                rc = colibri_infer(&m, &gen[i], NULL, 1, 1, n_prompt + i, logits);
                wall[i] = now_s() - w0;
                cpu[i] = cpu_s() - c0;
                gen[i + 1] = argmax(logits, V);
            }
            if (rc) {
                answer_error("decode", rc, &m);
                rc = 0;
                continue;
            }
            printf("{");
            print_doubles("wall_s", wall, steps);
            printf(", ");
            print_doubles("cpu_s", cpu, steps);
            printf(", \"tokens\": [");
            for (unsigned i = 0; i <= steps; i++)
                printf("%s%d", i ? ", " : "", gen[i]);
            printf("]}\n");
        } else {
            printf("{\"error\": \"unknown command (threads|prefill|decode|info|quit)\"}\n");
        }
        fflush(stdout);
    }
    colibri_free(&m);
    free(logits);
    free(wall);
    free(cpu);
    free(gen);
    free(tok);
    return 0;
}
