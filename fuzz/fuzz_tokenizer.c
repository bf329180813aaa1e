/*
 * fuzz_tokenizer.c - libFuzzer target for src/tokenizer.c.
 *
 * Input byte 0 chooses what is hostile:
 *   even: the rest is a tokenizer section (u16 little-endian length, the
 *         section, then text): colibri_tokenizer_init_from_section must
 *         refuse it or the tokenizer must survive any text and ids;
 *   odd:  the rest is text and ids for a valid section read at start-up from
 *         $COLIBRI_FUZZ_SECTION (tests/test_tokenizer_fuzz.py writes one; a
 *         version 2 section's stored regex programs put the matcher under
 *         hostile text, and mutated copies of it under hostile programs; a
 *         version 3 Unigram section, the Viterbi and hostile scores).
 * Every call must return a documented code; ASan/UBSan catch the rest.
 *
 *   clang -fsanitize=fuzzer,address,undefined -Isrc/include -Isrc \
 *       fuzz/fuzz_tokenizer.c src/tokenizer.c src/core.c src/crc32.c \
 *       src/tensor.c src/moe.c src/kernels/ref.c -DCOLIBRI_KERNELS_REF_ONLY -lm
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri_tokenizer.h"

static unsigned char *good;
static size_t good_size;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    const char *path = getenv("COLIBRI_FUZZ_SECTION");
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    good = malloc(n > 0 ? (size_t)n : 1);
    if (good && fread(good, 1, (size_t)n, f) == (size_t)n) good_size = (size_t)n;
    fclose(f);
    return 0;
}

static void exercise(const colibri_tokenizer *t, const uint8_t *x, size_t n)
{
    int32_t ids[64];
    size_t k = 0;
    for (unsigned flags = 0; flags < 16; flags++) {
        size_t cap = (size_t)(flags * 9) % 64;
        int rc = colibri_tokenize(t, (const char *)x, n, ids, cap, &k, flags);
        if (rc != 0 && rc != COLIBRI_E_TOK_BUFFER && rc != COLIBRI_E_TOK_UTF8 &&
            rc != COLIBRI_E_TOK_NO_BOS && rc != COLIBRI_E_TOK_REGEX &&
            rc != COLIBRI_E_TOK_NORM && rc != COLIBRI_E_TOK_WORD)
            abort();
        if (rc == 0 && k > cap) abort();
    }
    colibri_tokenizer_info info;
    if (colibri_tokenizer_get_info(t, &info)) abort();
    /* The bytes as ids (some in range, some not), whole and streamed. */
    int32_t dec[32];
    size_t nd = n / 4 < 32 ? n / 4 : 32;
    for (size_t i = 0; i < nd; i++) {
        uint32_t v;
        memcpy(&v, x + 4 * i, 4);
        dec[i] = (int32_t)(v % (info.n_vocab + 2u)) - 1;
    }
    char out[512];
    size_t got;
    unsigned skip = n ? x[0] & 1u : 0u;
    int rc = colibri_detokenize(t, dec, nd, out, sizeof out, &got, skip);
    if (rc != 0 && rc != COLIBRI_E_TOKEN && rc != COLIBRI_E_TOK_BUFFER) abort();
    colibri_detok d;
    colibri_detok_init(&d, t, skip);
    for (size_t i = 0; i < nd; i++) {
        rc = colibri_detok_push(&d, dec[i], out, (size_t)(i * 7 % 40), &got);
        if (rc != 0 && rc != COLIBRI_E_TOKEN && rc != COLIBRI_E_TOK_BUFFER) abort();
    }
    rc = colibri_detok_finish(&d, out, sizeof out, &got);
    if (rc != 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    colibri_tokenizer t;
    if (data[0] & 1u) {
        if (!good || colibri_tokenizer_init_from_section(&t, good, good_size)) return 0;
        exercise(&t, data + 1, size - 1);
        return 0;
    }
    if (size < 3) return 0;
    size_t len = (size_t)data[1] | (size_t)data[2] << 8;
    if (len > size - 3) len = size - 3;
    /* a copy of exactly the section's bytes: reads past it are caught */
    unsigned char *sec = malloc(len ? len : 1);
    if (!sec) return 0;
    memcpy(sec, data + 3, len);
    int rc = colibri_tokenizer_init_from_section(&t, sec, len);
    if (rc == 0) exercise(&t, data + 3 + len, size - 3 - len);
    else if (rc != COLIBRI_E_TOK_FORMAT) abort();
    free(sec);
    return 0;
}
