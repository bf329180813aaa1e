/*
 * test_tok_noalloc.c - colibri_tokenize, the detokenizers and colibri_sample
 * allocate nothing and make no system call: a workload of them runs with
 * every allocation entry point wrapped (-Wl,--wrap, counted while armed),
 * then again under seccomp strict mode (any system call but read/write/exit
 * kills the process). Same technique as test_noalloc.c.
 *
 *   test_tok_noalloc MODEL [--canary-malloc]
 * Prints "wrap: N calls, 0 intercepted" and "seccomp: N calls survived".
 */
#define _GNU_SOURCE
#include <linux/seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "colibri.h"
#include "colibri_sample.h"
#include "colibri_tokenizer.h"

static volatile int armed;
static unsigned long hits;
#define COUNT() do { if (armed) hits++; } while (0)

/* WRAPPED: malloc calloc realloc free */
void *__real_malloc(size_t);
void *__real_calloc(size_t, size_t);
void *__real_realloc(void *, size_t);
void __real_free(void *);
void *__wrap_malloc(size_t n) { COUNT(); return __real_malloc(n); }
void *__wrap_calloc(size_t a, size_t b) { COUNT(); return __real_calloc(a, b); }
void *__wrap_realloc(void *p, size_t n) { COUNT(); return __real_realloc(p, n); }
void __wrap_free(void *p) { COUNT(); __real_free(p); }

static const char *texts[] = {
    "Hello, world! It's 2026; we're testing.", "  whitespace\t\truns\n\n\nand newlines ",
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9 emoji",
    "bad \xff\xfe utf-8 \xe2\x82", "<s> special </s> <|endoftext|>", "def f(x):\n    return x**2\n",
};

#define N_ROUNDS 200

static int workload(const colibri_tokenizer *tok, uint32_t vocab, float *logits,
                    void *scratch, size_t scratch_size, int canary)
{
    int32_t ids[256];
    char out[1024];
    size_t n, k;
    int calls = 0;
    for (int r = 0; r < N_ROUNDS; r++) {
        if (canary && r == N_ROUNDS / 2) __real_free(malloc(16)); /* counted */
        const char *t = texts[r % 6];
        size_t cap = r % 5 == 0 ? 3 : 256;   /* buffer too small, too */
        int rc = colibri_tokenize(tok, t, strlen(t), ids, cap, &n,
                                  (unsigned)(r % 8) & ~1u);
        calls++;
        if (rc == COLIBRI_E_TOK_BUFFER || rc == COLIBRI_E_TOK_UTF8) continue;
        if (rc) return rc;
        rc = colibri_detokenize(tok, ids, n, out, sizeof out, &k, 0);
        calls++;
        if (rc) return rc;
        colibri_detok d;
        colibri_detok_init(&d, tok, (unsigned)r & 1u);
        for (size_t i = 0; i < n; i++) {
            rc = colibri_detok_push(&d, ids[i], out, sizeof out, &k);
            calls++;
            if (rc) return rc;
        }
        colibri_detok_finish(&d, out, sizeof out, &k);
        for (uint32_t i = 0; i < vocab; i++) logits[i] = (float)((i * 37u + (unsigned)r) % 101u) / 10.0f;
        colibri_sample_params sp = colibri_sample_defaults();
        sp.temperature = r % 3 ? 0.8f : 0.0f;
        sp.top_p = 0.9f; sp.top_k = (uint32_t)(r % 4) * 10u; sp.min_p = 0.01f;
        sp.repetition_penalty = 1.2f; sp.seed = (uint64_t)r;
        int32_t next;
        rc = colibri_sample(logits, vocab, &sp, ids, n, (uint64_t)r, scratch, scratch_size, &next);
        calls++;
        if (rc) return rc;
    }
    return calls > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc < 2) return 2;
    int canary = argc > 2 && !strcmp(argv[2], "--canary-malloc");
    static colibri_model m;
    colibri_tokenizer tok;
    int rc = colibri_init(&m, argv[1]);
    if (!rc) rc = colibri_tokenizer_init(&tok, &m);
    if (rc) { printf("error %d\n", rc); return 10; }
    colibri_info info;
    colibri_get_info(&m, &info);
    uint32_t V = info.shape.vocab;
    float *logits = (float *)__real_malloc(V * sizeof(float));
    size_t ss = colibri_sample_scratch_size(V);
    void *scratch = __real_malloc(ss);
    fflush(stdout);
    armed = 1;
    rc = workload(&tok, V, logits, scratch, ss, canary);
    armed = 0;
    if (rc) { printf("error %d\n", rc); return 11; }
    printf("wrap: %d rounds, %lu intercepted\n", N_ROUNDS, hits);
    fflush(stdout);
    if (hits) return 1;
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT) != 0) { printf("seccomp: unavailable\n"); return 3; }
    armed = 1;
    rc = workload(&tok, V, logits, scratch, ss, 0);
    armed = 0;
    if (rc || hits) syscall(SYS_exit, 1);
    static const char ok[] = "seccomp: rounds survived\n";
    syscall(SYS_write, 1, ok, sizeof ok - 1);
    syscall(SYS_exit, 0);
    return 0;
}
