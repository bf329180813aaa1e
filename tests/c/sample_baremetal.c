/*
 * sample_baremetal.c - colibri_sample on a bare-metal target (Cortex-M under
 * qemu-system-arm): cases and the numpy reference's tokens come compiled in
 * from sample_cases.h (tests/test_sampling.py writes it). Prints
 * "sample: N cases ok" and exits 0, or names the first failing case.
 */
#include <stdio.h>
#include <string.h>

#include "colibri_sample.h"
#include "platform.h"

#include "sample_cases.h"

static double scratch[2 * MAX_VOCAB];   /* 12 bytes per id, 8-byte aligned */

int main(void)
{
    char line[96];
    for (unsigned i = 0; i < N_CASES; i++) {
        const struct sample_case *c = &cases[i];
        colibri_sample_params p = colibri_sample_defaults();
        p.temperature = c->temperature; p.top_k = c->top_k; p.top_p = c->top_p;
        p.min_p = c->min_p; p.repetition_penalty = c->penalty; p.seed = c->seed;
        int32_t tok = -1;
        int rc = colibri_sample(c->logits, c->vocab, &p, c->hist, c->n_hist, c->step,
                                scratch, sizeof scratch, &tok);
        if (rc != 0 || tok != c->want) {
            snprintf(line, sizeof line, "FAIL case %u: rc %d token %d, want %d\n", i, rc,
                     (int)tok, (int)c->want);
            fw_write(line, strlen(line));
            fw_exit(1);
        }
    }
    snprintf(line, sizeof line, "sample: %u cases ok\n", (unsigned)N_CASES);
    fw_write(line, strlen(line));
    fw_exit(0);
}
