/* fuzz_harness.h - the harness entry point shared by the libFuzzer build
 * (fuzz_init_infer.c) and the plain replay driver (replay_main.c). */
#ifndef COLIBRI_FUZZ_HARNESS_H
#define COLIBRI_FUZZ_HARNESS_H
#include <stddef.h>
#include <stdint.h>

/* What one input did; each *_rc is a colibri error code, or 1 when that
 * step did not run. */
typedef struct {
    int arena_rc, init_rc, infer_rc, decode_rc, verify_rc;
    int nonfinite;     /* some logit not finite (the weights are arbitrary) */
    char detail[200];  /* colibri_error_detail after the first failing step */
} fuzz_result;

int fuzz_one(const uint8_t *data, size_t size, fuzz_result *r);
#endif
