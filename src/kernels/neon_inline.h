/*
 * neon_inline.h - the inlining macros of neon.c and neon_attend.c.
 *
 * The (R, T) loops must be unrolled completely for the accumulators to live
 * in registers; GCC's own heuristics stop short for the larger blocks.
 * COLIBRI_KERNELS_PLAIN: ordinary functions and loops for sanitizer builds
 * (avx2.c says why).
 */
#ifndef COLIBRI_NEON_INLINE_H
#define COLIBRI_NEON_INLINE_H

#ifdef COLIBRI_KERNELS_PLAIN
#define BLOCK static
#define UNROLL
#else
#define BLOCK static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
#endif

#endif /* COLIBRI_NEON_INLINE_H */
