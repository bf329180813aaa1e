/*
 * replay_main.c - runs the fuzz harness (fuzz_init_infer.c) over files
 * without libFuzzer, for the test suite's corpus replay under ASan+UBSan.
 *
 *   fuzz_replay FILE...
 *
 * One line per file: "FILE arena=A init=I infer=F decode=D verify=V nonfinite=N detail=TEXT"
 * (1 = that step did not run). Exit 0 unless a file cannot be read; any
 * sanitizer report aborts the program (-fno-sanitize-recover=all).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_harness.h"


int main(int argc, char **argv)
{
    for (int a = 1; a < argc; a++) {
        FILE *f = fopen(argv[a], "rb");
        if (!f) {
            fprintf(stderr, "cannot open %s\n", argv[a]);
            return 2;
        }
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        uint8_t *buf = (uint8_t *)malloc(n > 0 ? (size_t)n : 1);
        if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
            fprintf(stderr, "cannot read %s\n", argv[a]);
            return 2;
        }
        fclose(f);
        fuzz_result r;
        fuzz_one(buf, (size_t)n, &r);
        printf("%s arena=%d init=%d infer=%d decode=%d verify=%d nonfinite=%d detail=%s\n",
               argv[a], r.arena_rc, r.init_rc, r.infer_rc, r.decode_rc,
               r.verify_rc, r.nonfinite, r.detail);
        fflush(stdout);
        free(buf);
    }
    return 0;
}
