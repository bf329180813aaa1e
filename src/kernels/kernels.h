/*
 * kernels.h - the compute kernels behind colibri_infer, as a table of function
 * pointers so one build can carry the portable reference kernels (ref.c, the
 * truth) and optimised ones (avx2.c, neon.c + neon_dotprod.c) and pick at
 * init.
 *
 * Arithmetic contract: docs/FORMAT.md section 5. Every optimised kernel must
 * agree with the ref kernel on the same inputs: F32 kernels to float rounding
 * (summation order may differ), the I8 integer inner sums exactly. On
 * x86-64 "avx2" and "avx2-vnni", on AArch64 "neon" and "neon-dotprod" promise
 * more: their matmul_i8 is bit-identical to ref's (same float operations in
 * the same order, whatever n, rows and where a row falls in a call), so the
 * two tables of a target give the same logits and splitting a call into
 * token x row tiles changes no bit.
 *
 * Conventions: W is row-major [rows, cols] (y = W x). Matrix forms take X as
 * [n, cols] and write Y as [n, rows], row t of Y = W * row t of X. Any size
 * >= 1 is valid (tails handled). Pointers need no alignment beyond their type;
 * arena buffers are 64-byte aligned, weights in a .colibri file 64-byte
 * aligned, so kernels may prefer aligned loads only after checking.
 * Kernels never allocate, never fail, and write only their output. They may
 * use up to 32 KiB of stack (the AVX2 int8 GEMM packs weights there: 12 KiB; its decode form
 * keeps 8 KiB of scale products).
 */
#ifndef COLIBRI_KERNELS_H
#define COLIBRI_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct colibri_kernels {
    const char *name; /* "ref", "avx2", "avx2-vnni", "neon", "neon-dotprod" */

    /* Y[n, rows] = X[n, cols] * W^T, W float32 [rows, cols]. */
    void (*matmul_f32)(float *Y, const float *W, const float *X,
                       uint32_t n, uint32_t rows, uint32_t cols);

    /* Quantise activations per group (docs/FORMAT.md 5): X float [n, cols]
     * -> XQ int8 [n, cols], XS float [n, ngroups], ngroups = ceil(cols/group). */
    void (*quantize_act_i8)(int8_t *XQ, float *XS, const float *X,
                            uint32_t n, uint32_t cols, uint32_t group);

    /* Y[n, rows] from int8 weights Q [rows, cols] with scales S [rows, ngroups]
     * and quantised activations XQ [n, cols], XS [n, ngroups]:
     * y = sum_g float(int32 dot over group g) * (S[r,g] * XS[t,g]).
     * Precondition: every XQ value is in [-127, 127] (quantize_act_i8
     * guarantees it; -128 could overflow the SIMD int16 pair sums). Q may
     * hold -128. */
    void (*matmul_i8)(float *Y, const int8_t *Q, const float *S,
                      const int8_t *XQ, const float *XS,
                      uint32_t n, uint32_t rows, uint32_t cols, uint32_t group);

    /* Y[n, rows] from int16 weights Q [rows, cols], per-row scales S [rows],
     * float activations X [n, cols]: y = S[r] * sum_c float(Q[r,c]) * x[c]. */
    void (*matmul_i16)(float *Y, const int16_t *Q, const float *S,
                       const float *X, uint32_t n, uint32_t rows, uint32_t cols);
} colibri_kernels;

/* Always available. */
const colibri_kernels *colibri_kernels_ref(void);
/* NULL unless built with COLIBRI_USE_AVX2 (avx2.c) and the CPU has AVX2+FMA.
 * "avx2-vnni" when the CPU also has AVX-VNNI or AVX512-VNNI + AVX512VL (not
 * with COLIBRI_AVX2_NO_VNNI, scons vnni=0), else "avx2". */
const colibri_kernels *colibri_kernels_avx2(void);
/* NULL unless built with COLIBRI_USE_NEON (neon.c). On AArch64 Linux the
 * "neon-dotprod" table when the CPU reports the dot-product extension
 * (getauxval(AT_HWCAP) & HWCAP_ASIMDDP), else "neon". */
const colibri_kernels *colibri_kernels_neon(void);

#ifdef __cplusplus
}
#endif
#endif /* COLIBRI_KERNELS_H */
