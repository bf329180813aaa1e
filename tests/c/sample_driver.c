/*
 * sample_driver.c - colibri_sample over a batch of cases, for
 * tests/test_sampling.py. IN (little-endian): per case u32 vocab, f32
 * temperature, u32 top_k, f32 top_p, f32 min_p, f32 repetition_penalty,
 * u64 seed, u64 step, u32 n_history, n_history i32, vocab f32 logits.
 * OUT: per case i32 rc, i32 token. Also prints nothing; exit 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri_sample.h"

static int rd(FILE *f, void *p, size_t n)
{
    unsigned char b[8];
    if (fread(b, 1, n, f) != n) return 0;
    /* little-endian file -> host */
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = v << 8 | b[i];
    if (n == 4) { uint32_t w = (uint32_t)v; memcpy(p, &w, 4); }
    else memcpy(p, &v, 8);
    return 1;
}

static void wr(FILE *f, uint32_t v)
{
    unsigned char b[4] = { (unsigned char)v, (unsigned char)(v >> 8),
                           (unsigned char)(v >> 16), (unsigned char)(v >> 24) };
    fwrite(b, 1, 4, f);
}

int main(int argc, char **argv)
{
    if (argc != 3) return 2;
    FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "wb");
    if (!in || !out) return 3;
    uint32_t vocab;
    while (rd(in, &vocab, 4)) {
        colibri_sample_params p;
        uint64_t step;
        uint32_t nh;
        if (!rd(in, &p.temperature, 4) || !rd(in, &p.top_k, 4) || !rd(in, &p.top_p, 4) ||
            !rd(in, &p.min_p, 4) || !rd(in, &p.repetition_penalty, 4) || !rd(in, &p.seed, 8) ||
            !rd(in, &step, 8) || !rd(in, &nh, 4))
            return 4;
        int32_t *hist = malloc((nh ? nh : 1) * sizeof *hist);
        float *logits = malloc((vocab ? vocab : 1) * sizeof *logits);
        for (uint32_t i = 0; i < nh; i++) if (!rd(in, &hist[i], 4)) return 4;
        for (uint32_t i = 0; i < vocab; i++) if (!rd(in, &logits[i], 4)) return 4;
        size_t need = colibri_sample_scratch_size(vocab);
        double *scratch = malloc(need ? need : 8);
        int32_t tok = -1;
        int rc = colibri_sample(logits, vocab, &p, hist, nh, step, scratch, need, &tok);
        wr(out, (uint32_t)rc);
        wr(out, (uint32_t)tok);
        free(hist); free(logits); free(scratch);
    }
    fclose(in);
    fclose(out);
    return 0;
}
