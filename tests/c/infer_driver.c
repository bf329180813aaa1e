/*
 * infer_driver.c - runs a script of colibri_infer calls and writes every
 * logit as little-endian float32, so pytest can compare any build (host,
 * sanitizers, static work buffer, qemu-ppc/arm) with the numpy reference.
 *
 *   infer_driver MODEL SCRIPT OUT [--memory] [--kv-i8]
 *
 * --memory: read the file here and use colibri_init_from_memory with an arena
 * of colibri_arena_size bytes (the only way in COLIBRI_STATIC_WORKBUF builds);
 * otherwise colibri_init. --kv-i8: the 8-bit KV cache (colibri_options,
 * the _ex calls). SCRIPT is text, one call per three lines:
 *   B S N_PAST
 *   B*S token ids
 *   B*S mask values, or "-" for a NULL mask
 * OUT receives the [B, S, vocab] logits of every call, in order.
 * An encoder-decoder's encoder call is "E B S" then the same two lines: it
 * runs colibri_encode and writes the encoder output [B, S, hidden] to OUT.
 * Exit status 0; on a library error the status is 10 + (-code) and the line
 * "error CODE DETAIL" goes to stdout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"

static int write_le(FILE *f, const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        unsigned char b[4] = { (unsigned char)u, (unsigned char)(u >> 8),
                               (unsigned char)(u >> 16), (unsigned char)(u >> 24) };
        if (fwrite(b, 1, 4, f) != 4)
            return -1;
    }
    return 0;
}

static int report(int rc, const colibri_model *m)
{
    printf("error %d %s\n", rc, colibri_error_detail(m));
    return 10 - rc;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: infer_driver MODEL SCRIPT OUT [--memory] [--kv-i8]\n");
        return 2;
    }
    int memory = 0;
    colibri_options opt = colibri_options_default();
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "--memory"))
            memory = 1;
        else if (!strcmp(argv[i], "--kv-i8"))
            opt.kv_dtype = COLIBRI_KV_I8;
    }
    colibri_model m;
    void *file_base = NULL, *arena_base = NULL;
    int rc;
    if (memory) {
        FILE *f = fopen(argv[1], "rb");
        if (!f)
            return 3;
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        fseek(f, 0, SEEK_SET);
        file_base = malloc((size_t)size + 64);
        uint8_t *blob = (uint8_t *)(((uintptr_t)file_base + 63) & ~(uintptr_t)63);
        if (fread(blob, 1, (size_t)size, f) != (size_t)size)
            return 3;
        fclose(f);
        size_t need = 0;
        rc = colibri_arena_size_ex(blob, (size_t)size, &opt, &need);
        if (rc) {
            memset(&m, 0, sizeof m);
            return report(rc, &m);
        }
        arena_base = malloc(need + 64);
        void *arena = (void *)(((uintptr_t)arena_base + 63) & ~(uintptr_t)63);
        rc = colibri_init_from_memory_ex(&m, blob, (size_t)size, arena, need, &opt);
    } else {
        rc = colibri_init_ex(&m, argv[1], &opt);
    }
    if (rc)
        return report(rc, &m);
    colibri_info info;
    colibri_get_info(&m, &info);
    FILE *script = fopen(argv[2], "r");
    FILE *out = fopen(argv[3], "wb");
    if (!script || !out)
        return 3;
    unsigned b, s, n_past;
    int status = 0;
    char first[16];
    while (fscanf(script, "%15s", first) == 1) {
        int encode = !strcmp(first, "E");
        if (encode ? fscanf(script, "%u %u", &b, &s) != 2
                   : (sscanf(first, "%u", &b) != 1 ||
                      fscanf(script, "%u %u", &s, &n_past) != 2))
            return 4;
        size_t n = (size_t)b * s;
        size_t row = encode ? info.shape.hidden : info.shape.vocab;
        int32_t *ids = (int32_t *)malloc(n * sizeof *ids);
        uint8_t *mask = (uint8_t *)malloc(n);
        float *logits = (float *)malloc(n * row * sizeof(float));
        int have_mask = 1;
        for (size_t i = 0; i < n; i++)
            if (fscanf(script, "%d", &ids[i]) != 1)
                return 4;
        char tok[16];
        for (size_t i = 0; i < n && have_mask; i++) {
            if (fscanf(script, "%15s", tok) != 1)
                return 4;
            if (!strcmp(tok, "-"))
                have_mask = 0;
            else
                mask[i] = (uint8_t)atoi(tok);
        }
        if (encode) {
            rc = colibri_encode(&m, ids, have_mask ? mask : NULL, b, s);
            if (rc == 0)
                rc = colibri_encoder_output(&m, logits);
        } else {
            rc = colibri_infer(&m, ids, have_mask ? mask : NULL, b, s, n_past, logits);
        }
        if (rc == 0 && write_le(out, logits, n * row))
            rc = COLIBRI_E_IO;
        free(ids);
        free(mask);
        free(logits);
        if (rc) {
            status = report(rc, &m);
            break;
        }
    }
    fclose(script);
    fclose(out);
    colibri_free(&m);
    free(file_base);
    free(arena_base);
    return status;
}
