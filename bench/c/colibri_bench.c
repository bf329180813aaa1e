/*
 * colibri_bench.c - timing driver for the benchmark suite (bench/run.py).
 * Public API only (colibri.h); linked against libcolibri.a. Every mode
 * prints one JSON object on stdout; errors go to stderr with exit status 1.
 *
 *   colibri_bench speed   MODEL TOKENS N_PROMPT N_PREFILL PREFILL_REPS DECODE_BUDGET_S MAX_DECODE
 *       Prefill: infer(TOKENS[0:N_PREFILL], n_past 0), PREFILL_REPS times
 *       (each a fresh sequence), every time recorded. Decode: prefill
 *       TOKENS[0:N_PROMPT] (untimed), then greedy decode one token per call
 *       (batch 1, KV cache) until DECODE_BUDGET_S seconds or MAX_DECODE
 *       steps; every step's time and the greedy tokens are recorded.
 *   colibri_bench latency MODEL TOKENS N_PROMPT N_STEPS cycle|fixed OUT [CONTROL_BYTES]
 *       N_STEPS decode calls after a prompt of N_PROMPT tokens. cycle: the
 *       position runs from N_PROMPT to max_seq_len-1, then n_past rewinds to
 *       N_PROMPT (attention work grows with the position); fixed: every call
 *       is at n_past = N_PROMPT (the same work each time, pure jitter). The
 *       input token of call i is TOKENS[i % n]. Writes N_STEPS float64
 *       wall seconds, then N_STEPS float64 CPU seconds, to OUT.
 *       With CONTROL_BYTES > 0, each decode call is followed by a control
 *       step: one read-only pass over a private buffer of that many bytes
 *       (the weight bytes one decode step reads), timed the same way; its
 *       N_STEPS wall seconds follow in OUT. Interleaved with the decode
 *       steps, it shows how much of the spread the machine alone causes.
 *   colibri_bench icount  MODEL TOKENS N_PROMPT N_INPUTS
 *       For valgrind --tool=callgrind --instr-atstart=no: after the prompt,
 *       one decode call at n_past = N_PROMPT per input token TOKENS[i],
 *       each bracketed by CALLGRIND_ZERO_STATS / CALLGRIND_DUMP_STATS, so
 *       every dump holds exactly one colibri_infer call.
 *   colibri_bench init    MODEL path|memory REPS
 *       path: colibri_init (mmap or read, as this library was built);
 *       memory: the file is read into a 64-byte aligned buffer (timed apart),
 *       then colibri_init_from_memory with a library-allocated arena. The
 *       first init's time, the best of REPS, and the process's peak RSS
 *       (getrusage ru_maxrss) before and after.
 *   colibri_bench crc     MODEL REPS
 *       The file in memory; colibri_verify (every CRC after the structural
 *       checks) REPS times; bytes per second of the best.
 *
 * TOKENS is a text file of token ids (whitespace separated).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>

#include "colibri.h"

#ifdef BENCH_CALLGRIND
#include <valgrind/callgrind.h>
#else
#define CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_ZERO_STATS
#define CALLGRIND_DUMP_STATS
#endif

#include "bench_clock.h"

/* Peak resident set of this process in KiB: VmHWM of /proc/self/status
 * (getrusage's ru_maxrss survives execve, so it would report the parent's
 * peak when that is larger); ru_maxrss where /proc is missing. */
static long peak_rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6))
            kib = atol(line + 6);
    if (f)
        fclose(f);
    if (kib < 0) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        kib = ru.ru_maxrss;
    }
    return kib;
}

static int die(const char *what, int rc, const colibri_model *m)
{
    /* Only the colibri_* setup calls read the file; the others infer. */
    colibri_call call = strncmp(what, "colibri_", 8) == 0 ? COLIBRI_CALL_INIT
                                                           : COLIBRI_CALL_INFER;
    fprintf(stderr, "colibri_bench: %s: %s (%d) %s\n", what, colibri_strerror_for(rc, call), rc,
            m ? colibri_error_detail(m) : "");
    return 1;
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

/* The whole file in a 64-byte aligned buffer; NULL on error. */
static void *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = NULL;
    if (n > 0 && posix_memalign(&buf, 64, (size_t)n) == 0) {
        if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

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

static int open_model(colibri_model *m, const char *path, colibri_info *info)
{
    int rc = colibri_init(m, path);
    if (rc)
        return die("colibri_init", rc, m);
    rc = colibri_get_info(m, info);
    if (rc)
        return die("colibri_get_info", rc, m);
    return 0;
}

static int mode_speed(int argc, char **argv)
{
    if (argc != 9) {
        fprintf(stderr, "usage: colibri_bench speed MODEL TOKENS N_PROMPT N_PREFILL "
                        "PREFILL_REPS DECODE_BUDGET_S MAX_DECODE\n");
        return 2;
    }
    int32_t *tok;
    size_t ntok = read_tokens(argv[3], &tok);
    uint32_t n_prompt = (uint32_t)atoi(argv[4]), n_prefill = (uint32_t)atoi(argv[5]);
    int reps = atoi(argv[6]);
    double budget = atof(argv[7]);
    int max_decode = atoi(argv[8]);
    if (ntok < n_prefill || ntok < n_prompt) {
        fprintf(stderr, "colibri_bench: %s has %zu tokens, fewer than needed\n", argv[3], ntok);
        return 1;
    }
    colibri_model m;
    colibri_info info;
    if (open_model(&m, argv[2], &info))
        return 1;
    uint32_t V = info.shape.vocab;
    size_t rows = n_prefill > n_prompt ? n_prefill : n_prompt;
    float *logits = malloc(rows * (size_t)V * sizeof *logits);
    double *pre = calloc((size_t)reps, sizeof *pre), *pre_cpu = calloc((size_t)reps, sizeof *pre);
    double *dec = calloc((size_t)max_decode, sizeof *dec);
    double *dec_cpu = calloc((size_t)max_decode, sizeof *dec);
    int32_t *gen = calloc((size_t)max_decode + 1, sizeof *gen);
    if (!logits || !pre || !pre_cpu || !dec || !dec_cpu || !gen)
        return 1;

    for (int r = 0; r < reps; r++) {
        double t0 = now_s(), c0 = cpu_s();
        int rc = colibri_infer(&m, tok, NULL, 1, n_prefill, 0, logits);
        pre[r] = now_s() - t0;
        pre_cpu[r] = cpu_s() - c0;
        if (rc)
            return die("prefill", rc, &m);
    }

    int rc = colibri_infer(&m, tok, NULL, 1, n_prompt, 0, logits);
    if (rc)
        return die("prompt", rc, &m);
    gen[0] = argmax(logits + (size_t)(n_prompt - 1) * V, V);
    int n_dec = 0;
    double start = now_s();
    while (n_dec < max_decode && n_prompt + (uint32_t)n_dec < info.shape.max_seq_len
           && (now_s() - start < budget || n_dec < 3)) {
        double t0 = now_s(), c0 = cpu_s();
        rc = colibri_infer(&m, &gen[n_dec], NULL, 1, 1, n_prompt + (uint32_t)n_dec, logits);
        dec[n_dec] = now_s() - t0;
        dec_cpu[n_dec] = cpu_s() - c0;
        if (rc)
            return die("decode", rc, &m);
        gen[n_dec + 1] = argmax(logits, V);
        n_dec++;
    }
    printf("{\"kernels\": \"%s\", \"load_mode\": \"%s\", \"n_params\": %llu, "
           "\"file_size\": %llu, \"arena_bytes\": %zu, \"chunk_tokens\": %u, ",
           info.kernels, info.load_mode, (unsigned long long)info.n_params,
           (unsigned long long)info.file_size, info.arena_bytes, info.chunk_tokens);
    print_doubles("prefill_s", pre, (size_t)reps);
    printf(", ");
    print_doubles("prefill_cpu_s", pre_cpu, (size_t)reps);
    printf(", ");
    print_doubles("decode_s", dec, (size_t)n_dec);
    printf(", ");
    print_doubles("decode_cpu_s", dec_cpu, (size_t)n_dec);
    printf(", \"tokens\": [");
    for (int i = 0; i <= n_dec; i++)
        printf("%s%d", i ? ", " : "", gen[i]);
    printf("]}\n");
    colibri_free(&m);
    free(logits);
    free(pre);
    free(pre_cpu);
    free(dec);
    free(dec_cpu);
    free(gen);
    free(tok);
    return 0;
}

/* The control step of mode_latency: sum buf[0..n) as 64-bit words, 4
 * independent chains so the adds never limit the read. */
static uint64_t read_pass(const uint64_t *buf, size_t n)
{
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a += buf[i];
        b += buf[i + 1];
        c += buf[i + 2];
        d += buf[i + 3];
    }
    for (; i < n; i++)
        a += buf[i];
    return a + b + c + d;
}

static int mode_latency(int argc, char **argv)
{
    if (argc != 8 && argc != 9) {
        fprintf(stderr, "usage: colibri_bench latency MODEL TOKENS N_PROMPT N_STEPS cycle|fixed OUT "
                        "[CONTROL_BYTES]\n");
        return 2;
    }
    size_t control_words = argc == 9 ? (size_t)atoll(argv[8]) / sizeof(uint64_t) : 0;
    int32_t *tok;
    size_t ntok = read_tokens(argv[3], &tok);
    uint32_t n_prompt = (uint32_t)atoi(argv[4]);
    long n_steps = atol(argv[5]);
    int cycle = !strcmp(argv[6], "cycle");
    if (ntok < n_prompt || n_prompt == 0) {
        fprintf(stderr, "colibri_bench: %s has too few tokens\n", argv[3]);
        return 1;
    }
    colibri_model m;
    colibri_info info;
    if (open_model(&m, argv[2], &info))
        return 1;
    uint32_t V = info.shape.vocab;
    float *logits = malloc((size_t)n_prompt * V * sizeof *logits);
    /* lat[0..n) wall seconds, lat[n..2n) CPU seconds of each step,
     * lat[2n..3n) wall seconds of each control step */
    const size_t n_out = (control_words ? 3 : 2) * (size_t)n_steps;
    double *lat = malloc(n_out * sizeof *lat);
    uint64_t *control = control_words ? malloc(control_words * sizeof *control) : NULL;
    if (!logits || !lat || (control_words && !control))
        return 1;
    for (size_t i = 0; i < control_words; i++) /* touch every page now */
        control[i] = i;
    volatile uint64_t sink = 0;
    int rc = colibri_infer(&m, tok, NULL, 1, n_prompt, 0, logits);
    if (rc)
        return die("prompt", rc, &m);
    uint32_t pos = n_prompt;
    uint32_t wraps = 0;
    for (long i = 0; i < n_steps; i++) {
        if (!cycle || pos >= info.shape.max_seq_len) {
            wraps += cycle;
            pos = n_prompt; /* rewind: n_past below the cached count */
        }
        int32_t t = tok[(size_t)i % ntok];
        double t0 = now_s(), c0 = cpu_s();
        rc = colibri_infer(&m, &t, NULL, 1, 1, pos, logits);
        lat[i] = now_s() - t0;
        lat[n_steps + i] = cpu_s() - c0;
        if (rc)
            return die("decode", rc, &m);
        pos++;
        if (control_words) {
            t0 = now_s();
            sink += read_pass(control, control_words);
            lat[2 * n_steps + i] = now_s() - t0;
        }
    }
    (void)sink;
    free(control);
    FILE *f = fopen(argv[7], "wb");
    if (!f || fwrite(lat, sizeof *lat, n_out, f) != n_out) {
        fprintf(stderr, "colibri_bench: cannot write %s\n", argv[7]);
        return 1;
    }
    fclose(f);
    printf("{\"steps\": %ld, \"mode\": \"%s\", \"first_pos\": %u, \"max_seq_len\": %u, "
           "\"rewinds\": %u, \"control_bytes\": %zu}\n", n_steps, argv[6], n_prompt,
           info.shape.max_seq_len, wraps, control_words * sizeof(uint64_t));
    colibri_free(&m);
    free(logits);
    free(lat);
    free(tok);
    return 0;
}

static int mode_icount(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: colibri_bench icount MODEL TOKENS N_PROMPT N_INPUTS\n");
        return 2;
    }
    int32_t *tok;
    size_t ntok = read_tokens(argv[3], &tok);
    uint32_t n_prompt = (uint32_t)atoi(argv[4]);
    int n_inputs = atoi(argv[5]);
    if (ntok < (size_t)n_inputs || ntok < n_prompt) {
        fprintf(stderr, "colibri_bench: %s has too few tokens\n", argv[3]);
        return 1;
    }
    colibri_model m;
    colibri_info info;
    if (open_model(&m, argv[2], &info))
        return 1;
    float *logits = malloc((size_t)n_prompt * info.shape.vocab * sizeof *logits);
    if (!logits)
        return 1;
    int rc = colibri_infer(&m, tok, NULL, 1, n_prompt, 0, logits);
    if (rc)
        return die("prompt", rc, &m);
    CALLGRIND_START_INSTRUMENTATION;
    for (int i = 0; i < n_inputs; i++) {
        int32_t t = tok[i];
        CALLGRIND_ZERO_STATS;
        rc = colibri_infer(&m, &t, NULL, 1, 1, n_prompt, logits);
        CALLGRIND_DUMP_STATS;
        if (rc)
            return die("decode", rc, &m);
    }
    printf("{\"inputs\": %d, \"n_past\": %u}\n", n_inputs, n_prompt);
    colibri_free(&m);
    free(logits);
    free(tok);
    return 0;
}

static int mode_init(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: colibri_bench init MODEL path|memory REPS\n");
        return 2;
    }
    int memory = !strcmp(argv[3], "memory");
    int reps = atoi(argv[4]);
    long rss0 = peak_rss_kib();
    double read_s = 0, first = 0, best = 1e30, best_cpu = 1e30;
    void *blob = NULL;
    size_t size = 0;
    if (memory) {
        double t0 = now_s();
        blob = read_file(argv[2], &size);
        read_s = now_s() - t0;
        if (!blob) {
            fprintf(stderr, "colibri_bench: cannot read %s\n", argv[2]);
            return 1;
        }
    }
    colibri_info info;
    memset(&info, 0, sizeof info);
    for (int r = 0; r < reps; r++) {
        colibri_model m;
        double t0 = now_s(), c0 = cpu_s();
        int rc = memory ? colibri_init_from_memory(&m, blob, size, NULL, 0)
                        : colibri_init(&m, argv[2]);
        double dt = now_s() - t0, dc = cpu_s() - c0;
        if (dc < best_cpu)
            best_cpu = dc;
        if (rc)
            return die("init", rc, &m);
        if (r == 0) {
            first = dt;
            colibri_get_info(&m, &info);
        }
        if (dt < best)
            best = dt;
        colibri_free(&m);
    }
    printf("{\"mode\": \"%s\", \"load_mode\": \"%s\", \"file_size\": %llu, \"arena_bytes\": %zu, "
           "\"read_s\": %.9g, \"init_first_s\": %.9g, \"init_best_s\": %.9g, \"init_best_cpu_s\": %.9g, "
           "\"rss_before_kib\": %ld, \"peak_rss_kib\": %ld}\n",
           argv[3], info.load_mode ? info.load_mode : "?", (unsigned long long)info.file_size,
           info.arena_bytes, read_s, first, best, best_cpu, rss0, peak_rss_kib());
    free(blob);
    return 0;
}

static void on_bad(void *user, int index, const char *what)
{
    (void)user;
    fprintf(stderr, "colibri_bench: verify: part %d: %s\n", index, what);
}

static int mode_crc(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: colibri_bench crc MODEL REPS\n");
        return 2;
    }
    size_t size;
    void *blob = read_file(argv[2], &size);
    if (!blob) {
        fprintf(stderr, "colibri_bench: cannot read %s\n", argv[2]);
        return 1;
    }
    int reps = atoi(argv[3]);
    double best = 1e30, best_cpu = 1e30;
    for (int r = 0; r < reps; r++) {
        uint32_t bad = 0;
        double t0 = now_s(), c0 = cpu_s();
        int rc = colibri_verify(blob, size, on_bad, NULL, &bad);
        double dt = now_s() - t0, dc = cpu_s() - c0;
        if (dc < best_cpu)
            best_cpu = dc;
        if (rc || bad)
            return die("colibri_verify", rc, NULL);
        if (dt < best)
            best = dt;
    }
    printf("{\"bytes\": %zu, \"best_s\": %.9g, \"bytes_per_s\": %.9g, \"best_cpu_s\": %.9g, "
           "\"bytes_per_cpu_s\": %.9g}\n", size, best, (double)size / best, best_cpu,
           (double)size / best_cpu);
    free(blob);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "speed"))
        return mode_speed(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "latency"))
        return mode_latency(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "icount"))
        return mode_icount(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "init"))
        return mode_init(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "crc"))
        return mode_crc(argc, argv);
    fprintf(stderr, "usage: colibri_bench speed|latency|icount|init|crc ... "
                    "(see the comment at the top of bench/c/colibri_bench.c)\n");
    return 2;
}
