/*
 * soak.c - a long decode run in one process: flat memory, no leak, and the
 * logits of a fixed prompt unchanged at the end.
 *
 *   soak MODEL STEPS [SAMPLE_EVERY]
 *
 * Loads MODEL with colibri_init (the library maps the file and allocates the
 * arena), prefills a fixed prompt and keeps its logits, then runs STEPS
 * single-token decode steps, feeding back (argmax + step) % vocab. When the
 * KV cache is full, n_past is rewound to the end of the prompt (the prompt
 * stays cached; the decoded tokens are overwritten). Every SAMPLE_EVERY
 * steps the resident set size is read from /proc/self/statm (with open/read:
 * no malloc, so allocator quarantines do not blur the figure). At the end the
 * prompt is run again from n_past 0 and its logits compared bit for bit.
 *
 * Prints one line of figures:
 *   steps=.. seconds=.. steps_per_s=.. rss_kb_first=.. rss_kb_last=..
 *   rss_kb_min=.. rss_kb_max=.. samples=.. rewinds=.. logits_identical=0|1
 * With SOAK_TRACE set in the environment, each sample goes to stderr; with
 * SOAK_THREADS=N the instance computes on N threads (colibri_set_threads,
 * parking workers), and the line adds threads=N.
 * Exit 0, or 1 on a library error or differing logits (2: usage).
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "colibri.h"

#define PROMPT_MAX 8

static long rss_kb(void)
{
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    long size, resident;
    if (sscanf(buf, "%ld %ld", &size, &resident) != 2)
        return -1;
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint32_t argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

static int fail(colibri_model *m, const char *what, int rc)
{
    /* Only the init step reads the file; every other step infers. */
    colibri_call call = strcmp(what, "init") == 0 ? COLIBRI_CALL_INIT : COLIBRI_CALL_INFER;
    printf("error %d %s: %s (%s)\n", rc, what, colibri_strerror_for(rc, call),
           colibri_error_detail(m));
    colibri_free(m);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: soak MODEL STEPS [SAMPLE_EVERY]\n");
        return 2;
    }
    long steps = atol(argv[2]);
    long every = argc > 3 ? atol(argv[3]) : 1000;
    if (steps < 0 || every <= 0)
        return 2;
    colibri_model m;
    int rc = colibri_init(&m, argv[1]);
    if (rc)
        return fail(&m, "init", rc);
    const char *nt = getenv("SOAK_THREADS");
    if (nt && atoi(nt) > 1 && (rc = colibri_set_threads(&m, (uint32_t)atoi(nt), 0)))
        return fail(&m, "set_threads", rc);
    colibri_info info;
    colibri_get_info(&m, &info);
    const uint32_t V = info.shape.vocab, S = info.shape.max_seq_len;
    const uint32_t P = S > PROMPT_MAX ? PROMPT_MAX : S - 1 > 0 ? S - 1 : 1;
    if (S < 2)
        return fail(&m, "max_seq_len < 2", COLIBRI_E_ARG);

    int32_t prompt[PROMPT_MAX];
    for (uint32_t i = 0; i < P; i++)
        prompt[i] = (int32_t)((i * 7 + 3) % V);
    /* All buffers are allocated before the loop: the loop allocates nothing. */
    float *first = (float *)malloc((size_t)P * V * sizeof(float));
    float *again = (float *)malloc((size_t)P * V * sizeof(float));
    float *logits = (float *)malloc((size_t)V * sizeof(float));
    if (!first || !again || !logits)
        return fail(&m, "malloc", COLIBRI_E_NO_MEMORY);
    if ((rc = colibri_infer(&m, prompt, NULL, 1, P, 0, first)))
        return fail(&m, "prefill", rc);

    int32_t tok = (int32_t)argmax(first + (size_t)(P - 1) * V, V);
    uint32_t n_past = P;
    long first_rss = -1, last_rss = -1, min_rss = -1, max_rss = -1, samples = 0;
    long rewinds = 0;
    const int trace = getenv("SOAK_TRACE") != NULL; /* one stderr line per sample */
    /* Read statm once before measuring: the first sscanf faults in libc's
     * scanf code and locale tables (~200 KB), which would otherwise show as
     * growth between the first and the second sample. */
    (void)rss_kb();
    double t0 = now();
    for (long step = 0; step < steps; step++) {
        if (n_past == S) {
            n_past = P;
            rewinds++;
        }
        if ((rc = colibri_infer(&m, &tok, NULL, 1, 1, n_past, logits))) {
            printf("at step %ld n_past %u: ", step, n_past);
            free(first), free(again), free(logits);
            return fail(&m, "decode", rc);
        }
        n_past++;
        tok = (int32_t)((argmax(logits, V) + (uint32_t)step) % V);
        if ((step + 1) % every == 0) {
            long r = rss_kb();
            if (first_rss < 0)
                first_rss = r;
            last_rss = r;
            min_rss = min_rss < 0 || r < min_rss ? r : min_rss;
            max_rss = r > max_rss ? r : max_rss;
            samples++;
            if (trace)
                fprintf(stderr, "step %ld rss_kb %ld\n", step + 1, r);
        }
    }
    double secs = now() - t0;
    if ((rc = colibri_infer(&m, prompt, NULL, 1, P, 0, again))) {
        free(first), free(again), free(logits);
        return fail(&m, "final prompt", rc);
    }
    int same = memcmp(first, again, (size_t)P * V * sizeof(float)) == 0;
    printf("steps=%ld seconds=%.3f steps_per_s=%.0f rss_kb_first=%ld rss_kb_last=%ld "
           "rss_kb_min=%ld rss_kb_max=%ld samples=%ld rewinds=%ld logits_identical=%d "
           "threads=%u\n",
           steps, secs, secs > 0 ? steps / secs : 0.0, first_rss, last_rss, min_rss,
           max_rss, samples, rewinds, same, (unsigned)info.n_threads);
    colibri_free(&m);
    free(first);
    free(again);
    free(logits);
    return same ? 0 : 1;
}
