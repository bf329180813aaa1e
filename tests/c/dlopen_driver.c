/*
 * dlopen_driver.c - uses libcolibri.so the way colibri.runtime (ctypes) does,
 * for targets where Python does not run (armv7 under qemu-arm): dlopen the
 * library, resolve every function by name, allocate the instance with
 * colibri_abi_sizeof_model() bytes instead of sizeof, then run a prompt and
 * greedy decode exactly as `colibri-cli --tokens --generate --logits-out`
 * does, so the two files can be compared byte for byte.
 *
 *   dlopen_driver LIB MODEL IDS GENERATE OUT
 *
 * IDS comma-separated token ids. OUT: little-endian float32 rows: one per
 * prompt position, then one per generated token fed back (GENERATE - 1).
 * colibri.h is included for its types only; nothing is linked from the
 * library. Exit 0; 3 dlopen/dlsym failed (the message on stderr); 10 + (-code)
 * on a library error ("error CODE STRERROR (DETAIL)" on stdout).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"

static struct {
    size_t (*sizeof_model)(void);
    int (*init)(colibri_model *, const char *);
    int (*infer)(colibri_model *, const int32_t *, const uint8_t *, uint32_t, uint32_t,
                 uint32_t, float *);
    void (*free_)(colibri_model *);
    int (*get_info)(const colibri_model *, colibri_info *);
    const char *(*strerror_for)(int, colibri_call);
    const char *(*detail)(const colibri_model *);
} api;

static int resolve(void *lib, const char *name, void *slot)
{
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "dlsym %s: %s\n", name, dlerror());
        return -1;
    }
    memcpy(slot, &p, sizeof p);
    return 0;
}

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

static uint32_t argmax(const float *v, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

static int fail(int rc, colibri_call call, colibri_model *m)
{
    printf("error %d %s (%s)\n", rc, api.strerror_for(rc, call), api.detail(m));
    return 10 - rc;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: dlopen_driver LIB MODEL IDS GENERATE OUT\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 3;
    }
    if (resolve(lib, "colibri_abi_sizeof_model", &api.sizeof_model)
        || resolve(lib, "colibri_init", &api.init) || resolve(lib, "colibri_infer", &api.infer)
        || resolve(lib, "colibri_free", &api.free_)
        || resolve(lib, "colibri_get_info", &api.get_info)
        || resolve(lib, "colibri_strerror_for", &api.strerror_for)
        || resolve(lib, "colibri_error_detail", &api.detail))
        return 3;

    int32_t ids[256];
    uint32_t n = 0;
    for (char *tok = strtok(argv[3], ","); tok && n < 256; tok = strtok(NULL, ","))
        ids[n++] = (int32_t)strtol(tok, NULL, 10);
    long generate = strtol(argv[4], NULL, 10);

    /* The instance as a binding allocates it: the library says how big. */
    colibri_model *m = (colibri_model *)calloc(1, api.sizeof_model());
    if (!m || n == 0)
        return 2;
    int rc = api.init(m, argv[2]);
    if (rc)
        return fail(rc, COLIBRI_CALL_INIT, m);
    colibri_info info;
    api.get_info(m, &info);
    uint32_t V = info.shape.vocab;
    float *logits = (float *)malloc((size_t)n * V * sizeof(float));
    FILE *out = fopen(argv[5], "wb");
    if (!logits || !out)
        return 2;
    rc = api.infer(m, ids, NULL, 1, n, 0, logits);
    if (rc)
        return fail(rc, COLIBRI_CALL_INFER, m);
    if (write_le(out, logits, (size_t)n * V))
        return 2;
    int32_t next = (int32_t)argmax(logits + (size_t)(n - 1) * V, V);
    printf("generated:");
    for (long g = 0; g < generate; g++) {
        printf(" %d", (int)next);
        if (g == generate - 1)
            break;
        rc = api.infer(m, &next, NULL, 1, 1, n + (uint32_t)g, logits);
        if (rc)
            return fail(rc, COLIBRI_CALL_INFER, m);
        if (write_le(out, logits, V))
            return 2;
        next = (int32_t)argmax(logits, V);
    }
    printf("\n");
    fclose(out);
    api.free_(m);
    free(m);
    free(logits);
    dlclose(lib);
    return 0;
}
