/*
 * infer_edges.c - colibri_infer at and beyond the edges of its inputs, for
 * tests/test_infer_inputs.py (run under ASan+UBSan).
 *
 *   infer_edges MODEL OUT.f32
 *
 * One line per case: "case NAME rc=CODE untouched=0|1 finite=0|1 | DETAIL".
 * `untouched`: the logits buffer still holds its sentinel after the call
 * (colibri.h: on error nothing is computed). `finite`: every logit written
 * is finite. Plus "compare NAME maxdiff=X" lines for properties checked
 * here: the cache unchanged by failed calls (bitwise), NULL mask equal to an
 * all-ones mask (bitwise), a sequence's logits independent of a fully padded
 * neighbour in its batch. OUT.f32 receives the logits of an all-padding
 * prefill [4, vocab] and of the real decode step after it [1, vocab], for
 * comparison with the numpy reference.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"

#define SENTINEL 12345.5f

static colibri_model m;
static float *logits;
static size_t logits_n;
static uint32_t V, S, B;

static void fill(void)
{
    for (size_t i = 0; i < logits_n; i++)
        logits[i] = SENTINEL;
}

/* Run one call with a sentinel-filled logits buffer and report it. */
static int call(const char *name, colibri_model *mm, const int32_t *ids,
                const uint8_t *mask, uint32_t b, uint32_t s, uint32_t n_past,
                float *out)
{
    fill();
    int rc = colibri_infer(mm, ids, mask, b, s, n_past, out);
    int untouched = 1, finite = 1;
    for (size_t i = 0; i < logits_n; i++) {
        if (logits[i] != SENTINEL)
            untouched = 0;
    }
    size_t written = rc == 0 ? (size_t)b * s * V : 0;
    for (size_t i = 0; i < written; i++)
        if (!isfinite(out[i]))
            finite = 0;
    printf("case %s rc=%d untouched=%d finite=%d | %s\n", name, rc, untouched, finite,
           mm ? colibri_error_detail(mm) : "");
    return rc;
}

static double maxdiff(const float *a, const float *b, size_t n, int relative)
{
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        worst = d > worst ? d : worst;
        scale = fabs(b[i]) > scale ? fabs(b[i]) : scale;
    }
    return relative && scale > 0 ? worst / scale : worst;
}

static void *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = aligned_alloc(64, (*size + 63) / 64 * 64);
    if (p && fread(p, 1, *size, f) != *size) {
        free(p);
        p = NULL;
    }
    fclose(f);
    return p;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: infer_edges MODEL OUT.f32\n");
        return 2;
    }
    size_t size, need;
    void *blob = read_file(argv[1], &size);
    if (!blob || colibri_arena_size(blob, size, &need))
        return 2;
    void *arena = aligned_alloc(64, (need + 63) / 64 * 64);
    void *arena2 = aligned_alloc(64, (need + 63) / 64 * 64);
    if (colibri_init_from_memory(&m, blob, size, arena, need)) {
        printf("init failed: %s\n", colibri_error_detail(&m));
        return 1;
    }
    colibri_info info;
    colibri_get_info(&m, &info);
    V = info.shape.vocab, S = info.shape.max_seq_len, B = info.shape.max_batch;
    if (B < 2 || S < 8) {
        fprintf(stderr, "need max_batch >= 2 and max_seq_len >= 8\n");
        return 2;
    }
    logits_n = (size_t)B * S * V;
    logits = (float *)malloc(logits_n * sizeof(float));
    float *ref = (float *)malloc(logits_n * sizeof(float));
    int32_t ids[64] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    uint8_t mask[64];

    /* ---- a prefill, then calls that must fail and leave everything alone */
    call("prefill 4", &m, ids, NULL, 1, 4, 0, logits);
    int32_t bad[2] = { 5, 0 };
    static const struct { const char *name; int32_t id; } bad_ids[] = {
        { "token -1", -1 }, { "token INT32_MIN", INT32_MIN },
        { "token INT32_MAX", INT32_MAX }, { "token == vocab", 0 },
    };
    for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
        bad[1] = i == 3 ? (int32_t)V : bad_ids[i].id;
        call(bad_ids[i].name, &m, bad, NULL, 1, 2, 4, logits);
    }
    call("batch max_batch + 1", &m, ids, NULL, B + 1, 1, 0, logits);
    call("batch UINT32_MAX", &m, ids, NULL, UINT32_MAX, 1, 0, logits);
    call("seq max_seq_len + 1", &m, ids, NULL, 1, S + 1, 0, logits);
    call("seq UINT32_MAX", &m, ids, NULL, 1, UINT32_MAX, 0, logits);
    call("n_past + seq = max_seq_len + 1", &m, ids, NULL, 1, 2, S - 1, logits);
    call("n_past UINT32_MAX", &m, ids, NULL, 1, 1, UINT32_MAX, logits);
    call("n_past + seq wraps 32 bits", &m, ids, NULL, 1, 2, UINT32_MAX, logits);
    call("n_past beyond the cache", &m, ids, NULL, 1, 1, 5, logits);
    call("batch differs from the cache", &m, ids, NULL, 2, 1, 4, logits);
    call("NULL input_ids", &m, NULL, NULL, 1, 1, 4, logits);
    call("NULL logits", &m, ids, NULL, 1, 1, 4, NULL);
    call("NULL model", NULL, ids, NULL, 1, 1, 4, logits);
    call("batch 0", &m, ids, NULL, 0, 1, 4, logits);
    call("seq 0", &m, ids, NULL, 1, 0, 4, logits);
    mask[0] = 2;
    call("mask value 2", &m, ids + 4, mask, 1, 1, 4, logits);
    mask[0] = 255;
    call("mask value 255", &m, ids + 4, mask, 1, 1, 4, logits);

    /* The failed calls left the cache as it was: decoding token 5 at n_past
     * 4 gives the bits a second, untouched instance gives. */
    call("decode after the failed calls", &m, ids + 4, NULL, 1, 1, 4, logits);
    colibri_model m2;
    if (colibri_share(&m2, &m, arena2, need))
        return 1;
    colibri_infer(&m2, ids, NULL, 1, 4, 0, ref);
    colibri_infer(&m2, ids + 4, NULL, 1, 1, 4, ref);
    printf("compare cache unchanged by failed calls maxdiff=%g\n",
           maxdiff(logits, ref, V, 0));

    /* ---- ids at the edges of the vocabulary */
    int32_t edge[2] = { 0, (int32_t)V - 1 };
    call("tokens 0 and vocab-1", &m, edge, NULL, 1, 2, 0, logits);

    /* ---- masks */
    memset(mask, 1, sizeof mask);
    call("all-ones mask", &m, ids, mask, 1, 4, 0, logits);
    colibri_infer(&m2, ids, NULL, 1, 4, 0, ref);
    printf("compare NULL mask vs all-ones mask maxdiff=%g\n",
           maxdiff(logits, ref, (size_t)4 * V, 0));

    FILE *out = fopen(argv[2], "wb");
    memset(mask, 0, sizeof mask);
    call("all-zero mask prefill", &m, ids, mask, 1, 4, 0, logits);
    fwrite(logits, sizeof(float), (size_t)4 * V, out);
    mask[0] = 1;
    call("real token after an all-padding prefill", &m, ids + 4, mask, 1, 1, 4, logits);
    fwrite(logits, sizeof(float), V, out);
    fclose(out);

    /* Left padding: the first two slots are padding. */
    uint8_t left[4] = { 0, 0, 1, 1 };
    call("left-padded prefill", &m, ids, left, 1, 4, 0, logits);

    /* A sequence next to a fully padded one: its logits do not depend on
     * the neighbour (relative difference; SIMD kernels may block the batch
     * differently). */
    int32_t two[8] = { 1, 2, 3, 4, 9, 9, 9, 9 };
    uint8_t m2mask[8] = { 1, 1, 1, 1, 0, 0, 0, 0 };
    call("batch 2, second sequence all padding", &m, two, m2mask, 2, 4, 0, logits);
    colibri_infer(&m2, ids, NULL, 1, 4, 0, ref);
    printf("compare sequence beside an all-padding one maxdiff=%g\n",
           maxdiff(logits, ref, (size_t)4 * V, 1));
    call("decode both after it", &m, two, NULL, 2, 1, 4, logits);

    /* ---- lifecycle */
    colibri_model blank;
    memset(&blank, 0, sizeof blank);
    call("never initialised", &blank, ids, NULL, 1, 1, 0, logits);
    colibri_free(&m2);
    colibri_free(&m);
    call("after colibri_free", &m, ids, NULL, 1, 1, 0, logits);
    free(logits);
    free(ref);
    free(arena);
    free(arena2);
    free(blob);
    return 0;
}
