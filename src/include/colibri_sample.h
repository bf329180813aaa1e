/*
 * colibri_sample.h - choosing the next token from a row of logits: greedy,
 * or sampled with temperature, top-k, top-p, min-p and a repetition penalty,
 * from a counter-based generator so that a seed gives the same tokens on
 * every target and in the numpy reference (colibri/text/sampling.py).
 *
 *     colibri_sample_params sp = colibri_sample_defaults();   // greedy
 *     sp.temperature = 0.8f; sp.top_p = 0.95f; sp.seed = 42;
 *     size_t need = colibri_sample_scratch_size(vocab);        // bytes
 *     rc = colibri_sample(logits, vocab, &sp, history, n_history, step,
 *                         scratch, need, &next);
 *
 * Determinism: the draw for step `s` is splitmix64(seed + (s+1)*golden), an
 * integer function of (seed, s) only; its top 53 bits make an exact dyadic
 * number r in [0, 1). Probabilities are computed in double from the float32
 * logits and summed in one fixed order (most probable first, ties to the
 * lower id), so C and numpy agree unless r falls within ~1e-15 of a bucket
 * boundary (tests/test_sampling.py measures the margin and says so).
 *
 * Memory: nothing is allocated; sampling (temperature > 0) needs
 * colibri_sample_scratch_size(vocab) bytes of caller scratch (any alignment
 * of 8), greedy none. Reentrant.
 */
#ifndef COLIBRI_SAMPLE_H
#define COLIBRI_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct colibri_sample_params {
    float temperature;        /* <= 0: greedy (argmax, ties to the lower id) */
    uint32_t top_k;           /* 0: off; keep the k most probable */
    float top_p;              /* >= 1: off; keep the smallest most-probable
                                 prefix whose mass reaches top_p */
    float min_p;              /* <= 0: off; keep p >= min_p * p_max */
    float repetition_penalty; /* 1: off; logits of ids in the history: / pen
                                 when > 0, * pen otherwise (transformers) */
    uint64_t seed;
} colibri_sample_params;

/* Greedy, no filters, seed 0. */
colibri_sample_params colibri_sample_defaults(void);

/* Scratch bytes colibri_sample needs for `vocab` (12 per id), 0 on overflow. */
size_t colibri_sample_scratch_size(uint32_t vocab);

/* The uniform draw of step `step`: the 64-bit counter-based value (splitmix64). */
uint64_t colibri_sample_draw(uint64_t seed, uint64_t step);

/* Choose the next token from logits[0..vocab). history[0..n_history) are
 * the ids so far (for the repetition penalty; ids outside the vocabulary are
 * ignored); `step` numbers the draw (e.g. the count of generated tokens).
 * Returns 0 and *out_token; COLIBRI_E_ARG (NULL pointers, vocab 0, a
 * parameter not finite or out of range: temperature, top_p, min_p >= 0,
 * repetition_penalty > 0); COLIBRI_E_ARENA_TOO_SMALL (scratch below
 * colibri_sample_scratch_size when sampling). A NaN logit is never chosen
 * unless all are NaN (then id 0). */
int colibri_sample(const float *logits, uint32_t vocab, const colibri_sample_params *p,
                   const int32_t *history, size_t n_history, uint64_t step,
                   void *scratch, size_t scratch_size, int32_t *out_token);

#ifdef __cplusplus
}
#endif
#endif
