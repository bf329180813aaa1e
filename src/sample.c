/*
 * sample.c - next-token choice (colibri_sample.h). The numpy reference
 * colibri/text/sampling.py does the same operations in the same order; the
 * steps are written so that the only floating-point differences between the
 * two are exp() rounding (an ulp of double), which moves a choice only when
 * the exact draw r lies within that distance of a bucket boundary.
 */
#include "colibri_sample.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

colibri_sample_params colibri_sample_defaults(void)
{
    colibri_sample_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    return p;
}

size_t colibri_sample_scratch_size(uint32_t vocab)
{
#if SIZE_MAX <= 0xFFFFFFFFu
    if (vocab > SIZE_MAX / 12u) return 0;   /* 32-bit size_t: 12 * vocab overflows */
#endif
    return (size_t)vocab * 12u;
}

uint64_t colibri_sample_draw(uint64_t seed, uint64_t step)
{
    /* splitmix64 of the counter: a bijective mix of seed + (step+1)*golden,
     * integer-only, so every target and Python compute the same value. */
    uint64_t z = seed + (step + 1u) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* logit after the repetition penalty (in float, as transformers does). */
static float penalised(const float *logits, uint32_t i, const colibri_sample_params *p,
                       const int32_t *history, size_t n_history)
{
    float v = logits[i];
    if (p->repetition_penalty == 1.0f) return v;
    for (size_t h = 0; h < n_history; h++) {
        if (history[h] == (int32_t)i)
            return v > 0.0f ? v / p->repetition_penalty : v * p->repetition_penalty;
    }
    return v;
}

/* (p desc, id asc): a total order, so the sort's result is unique. */
static int before(const double *pr, uint32_t a, uint32_t b)
{
    return pr[a] > pr[b] || (pr[a] == pr[b] && a < b);
}

static void sift(uint32_t *ids, uint32_t root, uint32_t n, const double *pr)
{
    for (;;) {
        uint32_t c = 2 * root + 1;
        if (c >= n) return;
        /* a heap whose top is the LAST in `before` order */
        if (c + 1 < n && before(pr, ids[c], ids[c + 1])) c++;
        if (!before(pr, ids[root], ids[c])) return;
        uint32_t t = ids[root]; ids[root] = ids[c]; ids[c] = t;
        root = c;
    }
}

/* Heap sort of ids into `before` order (in place, no recursion, no
 * allocation: qsort would need the probabilities in a global). */
static void sort_ids(uint32_t *ids, uint32_t n, const double *pr)
{
    for (uint32_t start = n / 2; start > 0; start--) sift(ids, start - 1, n, pr);
    for (uint32_t end = n; end > 1; end--) {
        uint32_t t = ids[0]; ids[0] = ids[end - 1]; ids[end - 1] = t;
        sift(ids, 0, end - 1, pr);
    }
}

int colibri_sample(const float *logits, uint32_t vocab, const colibri_sample_params *p,
                   const int32_t *history, size_t n_history, uint64_t step,
                   void *scratch, size_t scratch_size, int32_t *out_token)
{
    if (!logits || !vocab || !p || !out_token || (!history && n_history)) return COLIBRI_E_ARG;
    if (!isfinite(p->temperature) || p->temperature < 0.0f || !isfinite(p->top_p) ||
        p->top_p < 0.0f || !isfinite(p->min_p) || p->min_p < 0.0f ||
        !isfinite(p->repetition_penalty) || p->repetition_penalty <= 0.0f)
        return COLIBRI_E_ARG;
    if (p->temperature == 0.0f || p->top_k == 1) {
        uint32_t best = 0;
        float bv = 0.0f;
        int have = 0;
        for (uint32_t i = 0; i < vocab; i++) {
            float v = penalised(logits, i, p, history, n_history);
            if (v != v) continue;                       /* NaN never wins */
            if (!have || v > bv) { best = i; bv = v; have = 1; }
        }
        *out_token = (int32_t)best;
        return COLIBRI_OK;
    }
    if (!scratch || scratch_size < colibri_sample_scratch_size(vocab) ||
        ((uintptr_t)scratch % 8u))
        return COLIBRI_E_ARENA_TOO_SMALL;
    double *pr = (double *)scratch;
    uint32_t *ids = (uint32_t *)(pr + vocab);
    double mx = -INFINITY;
    for (uint32_t i = 0; i < vocab; i++) {
        float v = penalised(logits, i, p, history, n_history);
        pr[i] = v != v ? -INFINITY : (double)v / (double)p->temperature;
        if (pr[i] > mx) mx = pr[i];
    }
    if (mx == -INFINITY) { *out_token = 0; return COLIBRI_OK; }
    for (uint32_t i = 0; i < vocab; i++) {
        pr[i] = pr[i] == -INFINITY ? 0.0 : exp(pr[i] - mx);
        ids[i] = i;
    }
    sort_ids(ids, vocab, pr);
    uint32_t keep = vocab;
    if (p->top_k && p->top_k < keep) keep = p->top_k;
    if (p->top_p < 1.0f) {
        double total = 0.0, cum = 0.0;
        for (uint32_t j = 0; j < keep; j++) total += pr[ids[j]];
        for (uint32_t j = 0; j < keep; j++) {
            cum += pr[ids[j]];
            if (cum >= (double)p->top_p * total) { keep = j + 1; break; }
        }
    }
    if (p->min_p > 0.0f) {
        double floor_p = (double)p->min_p * pr[ids[0]];
        uint32_t j = 1;
        while (j < keep && pr[ids[j]] >= floor_p) j++;
        keep = j;
    }
    double total = 0.0;
    for (uint32_t j = 0; j < keep; j++) total += pr[ids[j]];
    double r = (double)(colibri_sample_draw(p->seed, step) >> 11) * 0x1p-53 * total;
    double cum = 0.0;
    for (uint32_t j = 0; j < keep; j++) {
        cum += pr[ids[j]];
        if (r < cum) { *out_token = (int32_t)ids[j]; return COLIBRI_OK; }
    }
    *out_token = (int32_t)ids[keep - 1];
    return COLIBRI_OK;
}
