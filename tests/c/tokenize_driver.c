/*
 * tokenize_driver.c - runs colibri_tokenize / colibri_detokenize / the
 * streaming detokenizer over a batch of requests, for tests/test_tokenizer_c.py.
 *
 *     tokenize_driver model FILE.colibri IN OUT
 *     tokenize_driver section SECTION.bin IN OUT
 *
 * IN: records, little-endian: u8 op, u32 flags, u32 cap, u32 len, len bytes.
 *   op 'T': tokenize the bytes with `flags` into an id buffer of `cap` ids.
 *   op 'D': the bytes are u32 ids; decode them whole (colibri_detokenize, out
 *           buffer `cap` bytes) and streaming (one push per id into a buffer
 *           of `cap` bytes, then finish).
 * OUT: per record, i32 rc, u32 n, then n ids (T) or n bytes (D); for D also
 *   i32 stream_rc, u32 m, m bytes.
 * Exit 0 when every record was processed, 10 + init failure otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"
#include "colibri_tokenizer.h"

static int rd_u32(FILE *f, uint32_t *v)
{
    unsigned char b[4];
    if (fread(b, 1, 4, f) != 4) return 0;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return 1;
}

static void wr_u32(FILE *f, uint32_t v)
{
    unsigned char b[4] = { (unsigned char)v, (unsigned char)(v >> 8),
                           (unsigned char)(v >> 16), (unsigned char)(v >> 24) };
    fwrite(b, 1, 4, f);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s model|section PATH IN OUT\n", argv[0]);
        return 2;
    }
    static colibri_model m;
    colibri_tokenizer tok;
    void *sec = NULL;
    int rc;
    if (strcmp(argv[1], "model") == 0) {
        rc = colibri_init(&m, argv[2]);
        if (rc) { printf("error %d init\n", rc); return 10; }
        rc = colibri_tokenizer_init(&tok, &m);
        if (rc) colibri_free(&m);
    } else {
        FILE *f = fopen(argv[2], "rb");
        if (!f) return 3;
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        sec = malloc(n > 0 ? (size_t)n : 1);
        if (!sec || fread(sec, 1, (size_t)n, f) != (size_t)n) return 3;
        fclose(f);
        rc = colibri_tokenizer_init_from_section(&tok, sec, (size_t)n);
    }
    if (rc) {
        printf("error %d %s\n", rc, colibri_tok_strerror(rc));
        free(sec);
        return 11;
    }
    FILE *in = fopen(argv[3], "rb"), *out = fopen(argv[4], "wb");
    if (!in || !out) return 3;
    for (;;) {
        int op = fgetc(in);
        uint32_t flags, cap, len;
        if (op == EOF) break;
        if (!rd_u32(in, &flags) || !rd_u32(in, &cap) || !rd_u32(in, &len)) return 4;
        unsigned char *buf = malloc(len ? len : 1);
        if (!buf || fread(buf, 1, len, in) != len) return 4;
        if (op == 'T') {
            int32_t *ids = malloc((cap ? cap : 1) * sizeof *ids);
            size_t n = 0;
            rc = colibri_tokenize(&tok, (const char *)buf, len, ids, cap, &n, flags);
            wr_u32(out, (uint32_t)rc);
            wr_u32(out, (uint32_t)n);
            if (rc == 0)
                for (size_t i = 0; i < n; i++) wr_u32(out, (uint32_t)ids[i]);
            free(ids);
        } else {
            size_t k = len / 4, n = 0;
            int32_t *ids = malloc((k ? k : 1) * sizeof *ids);
            for (size_t i = 0; i < k; i++)
                ids[i] = (int32_t)((uint32_t)buf[4 * i] | (uint32_t)buf[4 * i + 1] << 8 |
                                   (uint32_t)buf[4 * i + 2] << 16 | (uint32_t)buf[4 * i + 3] << 24);
            char *text = malloc(cap ? cap : 1);
            rc = colibri_detokenize(&tok, ids, k, text, cap, &n, flags);
            wr_u32(out, (uint32_t)rc);
            wr_u32(out, (uint32_t)(rc == 0 ? n : 0));
            if (rc == 0) fwrite(text, 1, n, out);
            /* streaming: accumulate into a growing buffer */
            colibri_detok d;
            colibri_detok_init(&d, &tok, flags);
            size_t total = 0, cap_all = 64 + 64 * k;
            char *all = malloc(cap_all), piece[256];
            int src = 0;
            for (size_t i = 0; i <= k && src == 0; i++) {
                size_t got = 0;
                src = i < k ? colibri_detok_push(&d, ids[i], piece, sizeof piece, &got)
                            : colibri_detok_finish(&d, piece, sizeof piece, &got);
                if (src == 0) {
                    if (total + got > cap_all) { src = -999; break; }
                    memcpy(all + total, piece, got);
                    total += got;
                }
            }
            wr_u32(out, (uint32_t)src);
            wr_u32(out, (uint32_t)(src == 0 ? total : 0));
            if (src == 0) fwrite(all, 1, total, out);
            free(all); free(text); free(ids);
        }
        free(buf);
    }
    fclose(in);
    fclose(out);
    if (strcmp(argv[1], "model") == 0) colibri_free(&m);
    free(sec);
    return 0;
}
