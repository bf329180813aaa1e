/*
 * neon_dotprod.c - the int8 and block-type matmuls of the AArch64
 * "neon-dotprod" table (neon.c): neon_a64_i8.h and neon_blocks.h with SDOT
 * for the integer dot products. Part of
 * the "neon" kernel set (colibri/buildsteps/sources.py); compiles to nothing
 * off AArch64 or without COLIBRI_USE_NEON.
 *
 * This file alone is compiled for ARMv8.2-A with the dot-product extension
 * (FEAT_DotProd: Cortex-A55/A76 and later, Neoverse N1), by the pragma
 * below rather than by a -march flag, so every build script and every
 * target compiles it the same way. The pragma is GCC's (the cross
 * toolchains are GCC); a compiler that ignores it stops at the #error. The rest of the library stays plain
 * ARMv8-A, and colibri_kernels_neon() calls into this file only when the
 * CPU reports the extension (getauxval(AT_HWCAP) & HWCAP_ASIMDDP on
 * Linux): on other cores these instructions would be illegal.
 *
 * Results: bit-identical to ref.c's matmul_i8 and block matmuls (Q4_0, Q5_0,
 * Q4_K, Q6_K; Q5_K is neon.c's form in both tables), as the plain "neon" forms (see neon_a64_i8.h,
 * neon_blocks.h).
 */
#include "kernels.h"

#if defined(COLIBRI_USE_NEON) && defined(__aarch64__)

#pragma GCC target("arch=armv8.2-a+dotprod")

#include <arm_neon.h>

#ifndef __ARM_FEATURE_DOTPROD
#error "the dot-product extension must be enabled here (the pragma above)"
#endif

#include "neon_a64_i8.h"
#include "neon_blocks.h"

void colibri_neon_dotprod_matmul_i8(float *Y, const int8_t *Q, const float *S,
                                    const int8_t *XQ, const float *XS, uint32_t n,
                                    uint32_t rows, uint32_t cols, uint32_t group)
{
    a64_matmul_i8(Y, Q, S, XQ, XS, n, rows, cols, group);
}

void colibri_neon_dotprod_matmul_q4_0(float *Y, const uint8_t *W, const int8_t *XQ,
                                      const float *XS, const int16_t *XB, uint32_t n,
                                      uint32_t rows, uint32_t cols)
{
    (void)XB;
    nb_matmul_q4_0(COLIBRI_DTYPE_Q4_0, Y, W, XQ, XS, n, rows, cols);
}

void colibri_neon_dotprod_matmul_q5_0(float *Y, const uint8_t *W, const int8_t *XQ,
                                      const float *XS, const int16_t *XB, uint32_t n,
                                      uint32_t rows, uint32_t cols)
{
    (void)XB;
    nb_matmul_q4_0(COLIBRI_DTYPE_Q5_0, Y, W, XQ, XS, n, rows, cols);
}

void colibri_neon_dotprod_matmul_q8_0(float *Y, const uint8_t *W, const int8_t *XQ,
                                      const float *XS, const int16_t *XB, uint32_t n,
                                      uint32_t rows, uint32_t cols)
{
    (void)XB;
    nb_matmul_q4_0(COLIBRI_DTYPE_Q8_0, Y, W, XQ, XS, n, rows, cols);
}

void colibri_neon_dotprod_matmul_q4_k(float *Y, const uint8_t *W, const int8_t *XQ,
                                      const float *XS, const int16_t *XB, uint32_t n,
                                      uint32_t rows, uint32_t cols)
{
    nb_matmul_kq(NB_Q4_K, Y, W, XQ, XS, XB, n, rows, cols);
}

void colibri_neon_dotprod_matmul_q6_k(float *Y, const uint8_t *W, const int8_t *XQ,
                                      const float *XS, const int16_t *XB, uint32_t n,
                                      uint32_t rows, uint32_t cols)
{
    nb_matmul_kq(NB_Q6_K, Y, W, XQ, XS, XB, n, rows, cols);
}


#else
/* ISO C wants at least one declaration in a translation unit. */
typedef int colibri_neon_dotprod_not_built;
#endif
