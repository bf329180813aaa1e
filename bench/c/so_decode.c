/*
 * so_decode.c - the direct C side of bench/binding_overhead.py: one-token
 * decode steps through libcolibri.so, called from C. The library is dlopened
 * and its functions taken with dlsym, as colibri.runtime (ctypes) does, so
 * both sides run the very same library code and the difference is the
 * binding alone.
 *
 *   so_decode LIB MODEL N_PROMPT N_STEPS OUT
 *
 * Prompt: tokens 1..N_PROMPT (untimed). Then N_STEPS calls of
 * colibri_infer(token, n_past = N_PROMPT): every call the same work (the
 * cache is rewound each time). OUT receives N_STEPS float64 wall seconds then
 * N_STEPS float64 CPU seconds, one per call. Exit 1 on any error.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"
#include "bench_clock.h"

typedef int (*init_fn)(colibri_model *, const char *);
typedef int (*infer_fn)(colibri_model *, const int32_t *, const uint8_t *, uint32_t,
                        uint32_t, uint32_t, float *);
typedef int (*info_fn)(const colibri_model *, colibri_info *);
typedef size_t (*size_fn)(void);
typedef void (*free_fn)(colibri_model *);

static void *sym(void *lib, const char *name)
{
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "so_decode: dlsym %s: %s\n", name, dlerror());
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: so_decode LIB MODEL N_PROMPT N_STEPS OUT\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "so_decode: %s\n", dlerror());
        return 1;
    }
    init_fn init;
    infer_fn infer;
    info_fn get_info;
    size_fn sizeof_model;
    free_fn free_model;
#define SYM(var, name) do { void *p_ = sym(lib, name); memcpy(&var, &p_, sizeof p_); } while (0)
    SYM(init, "colibri_init");
    SYM(infer, "colibri_infer");
    SYM(get_info, "colibri_get_info");
    SYM(sizeof_model, "colibri_abi_sizeof_model");
    SYM(free_model, "colibri_free");

    uint32_t n_prompt = (uint32_t)atoi(argv[3]);
    long n = atol(argv[4]);
    colibri_model *m = calloc(1, sizeof_model());
    colibri_info info;
    if (!m || n < 1 || n_prompt < 1 || init(m, argv[2]) || get_info(m, &info)) {
        fprintf(stderr, "so_decode: cannot open %s\n", argv[2]);
        return 1;
    }
    float *logits = malloc((size_t)n_prompt * info.shape.vocab * sizeof *logits);
    int32_t *ids = malloc(n_prompt * sizeof *ids);
    double *t = malloc(2 * (size_t)n * sizeof *t);
    if (!logits || !ids || !t)
        return 1;
    for (uint32_t i = 0; i < n_prompt; i++)
        ids[i] = (int32_t)((i + 1) % info.shape.vocab);
    if (infer(m, ids, NULL, 1, n_prompt, 0, logits))
        return 1;
    for (long i = 0; i < n; i++) {
        int32_t tok = (int32_t)(i % info.shape.vocab);
        double t0 = now_s(), c0 = cpu_s();
        int rc = infer(m, &tok, NULL, 1, 1, n_prompt, logits);
        t[i] = now_s() - t0;
        t[n + i] = cpu_s() - c0;
        if (rc) {
            fprintf(stderr, "so_decode: decode failed (%d)\n", rc);
            return 1;
        }
    }
    FILE *f = fopen(argv[5], "wb");
    if (!f || fwrite(t, sizeof *t, 2 * (size_t)n, f) != 2 * (size_t)n)
        return 1;
    fclose(f);
    free_model(m);
    free(m);
    free(logits);
    free(ids);
    free(t);
    dlclose(lib);
    return 0;
}
