/*
 * immintrin.h for the emulated AVX-512 build of tests/c/test_kernels.c
 * (tests/test_kernels.py test_avx512_matches_ref_emulated): the compiler's
 * own intrinsics for what this CPU runs (AVX2, FMA, F16C, built with
 * -mavx2 -mfma -mf16c), SIMDe's portable implementations for AVX-512
 * (Debian's libsimde-dev, installed by scripts/setup.sh), and below, the
 * AVX-512 intrinsics that SIMDe 0.7.4 lacks, written out lane by lane from
 * Intel's pseudo-code. With COLIBRI_AVX512_EMULATED, avx512.c drops its
 * target attribute (the compiler must not emit AVX-512 itself) and its
 * CPUID check, and avx2.c computes its EVEX vpdpbusd / vpdpwssd with these
 * intrinsics instead of inline asm: the "avx512-vnni" table then runs, and is
 * held to ref bit for bit, on a CPU with AVX2 alone. Its speed means nothing.
 *
 * Found only through -isystem tests/c/avx512_emulation, never by the
 * library's own builds.
 */
#ifndef CLB_AVX512_EMULATION_IMMINTRIN_H
#define CLB_AVX512_EMULATION_IMMINTRIN_H

#include_next <immintrin.h>

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* SIMDe's alias takes the masked form's four arguments */
#undef _mm512_madd_epi16
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)

/* implemented by SIMDe, without an alias */
#define _mm512_shuffle_f32x4(a, b, imm) simde_mm512_shuffle_f32x4(a, b, imm)
#define _mm512_shuffle_i64x2(a, b, imm) simde_mm512_shuffle_i64x2(a, b, imm)

/* Lane views: GCC's vector types, subscripted. */
typedef int32_t clb_emu_i32x16 __attribute__((vector_size(64)));
typedef int32_t clb_emu_i32x8 __attribute__((vector_size(32)));
typedef int16_t clb_emu_i16x8 __attribute__((vector_size(16)));
typedef int8_t clb_emu_i8x16 __attribute__((vector_size(16)));
typedef int8_t clb_emu_i8x32 __attribute__((vector_size(32)));
typedef float clb_emu_f32x16 __attribute__((vector_size(64)));

/* vpmovdw: the low 16 bits of each int32 */
static inline __m128i clb_emu_mm256_cvtepi32_epi16(__m256i a)
{
    clb_emu_i32x8 v = (clb_emu_i32x8)a;
    clb_emu_i16x8 r;
    for (int i = 0; i < 8; i++)
        r[i] = (int16_t)(uint16_t)(uint32_t)v[i];
    return (__m128i)r;
}
#define _mm256_cvtepi32_epi16(a) clb_emu_mm256_cvtepi32_epi16(a)

/* masked byte loads of n bytes: those whose mask bit is clear are zero and
 * not read (the instruction suppresses their faults) */
static inline void clb_emu_maskz_bytes(int8_t *r, uint32_t k, const void *p, int n)
{
    for (int i = 0; i < n; i++)
        r[i] = (k >> i) & 1u ? ((const int8_t *)p)[i] : 0;
}

static inline __m256i clb_emu_mm256_maskz_loadu_epi8(uint32_t k, const void *p)
{
    clb_emu_i8x32 r;
    clb_emu_maskz_bytes((int8_t *)&r, k, p, 32);
    return (__m256i)r;
}
#define _mm256_maskz_loadu_epi8(k, p) clb_emu_mm256_maskz_loadu_epi8(k, p)

static inline __m128i clb_emu_mm_maskz_loadu_epi8(uint32_t k, const void *p)
{
    clb_emu_i8x16 r;
    clb_emu_maskz_bytes((int8_t *)&r, k, p, 16);
    return (__m128i)r;
}
#define _mm_maskz_loadu_epi8(k, p) clb_emu_mm_maskz_loadu_epi8(k, p)

static inline __m512 clb_emu_mm512_cvtepi32_ps(__m512i a)
{
    clb_emu_i32x16 v = (clb_emu_i32x16)a;
    clb_emu_f32x16 r;
    for (int i = 0; i < 16; i++)
        r[i] = (float)v[i];  /* round to nearest even, as vcvtdq2ps */
    return (__m512)r;
}
#define _mm512_cvtepi32_ps(a) clb_emu_mm512_cvtepi32_ps(a)

static inline __m512i clb_emu_mm512_cvtepi8_epi32(__m128i a)
{
    clb_emu_i8x16 v = (clb_emu_i8x16)a;
    clb_emu_i32x16 r;
    for (int i = 0; i < 16; i++)
        r[i] = v[i];
    return (__m512i)r;
}
#define _mm512_cvtepi8_epi32(a) clb_emu_mm512_cvtepi8_epi32(a)

/* 16 halves: F16C's conversion on each 128-bit half */
static inline __m512 clb_emu_mm512_cvtph_ps(__m256i a)
{
    __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(a));
    __m256 hi = _mm256_cvtph_ps(_mm256_extracti128_si256(a, 1));
    clb_emu_f32x16 r;
    memcpy(&r, &lo, 32);
    memcpy((char *)&r + 32, &hi, 32);
    return (__m512)r;
}
#define _mm512_cvtph_ps(a) clb_emu_mm512_cvtph_ps(a)

/* vcvtps2dq: round to nearest even; NaN and out of range give INT_MIN */
static inline __m512i clb_emu_mm512_cvtps_epi32(__m512 a)
{
    clb_emu_f32x16 v = (clb_emu_f32x16)a;
    clb_emu_i32x16 r;
    for (int i = 0; i < 16; i++) {
        float x = nearbyintf(v[i]);
        r[i] = x >= -2147483648.0f && x < 2147483648.0f ? (int32_t)x : INT_MIN;
    }
    return (__m512i)r;
}
#define _mm512_cvtps_epi32(a) clb_emu_mm512_cvtps_epi32(a)

static inline __m256 clb_emu_mm512_extractf32x8_ps(__m512 a, int imm)
{
    __m256 r;
    memcpy(&r, (const char *)&a + (imm & 1) * 32, 32);
    return r;
}
#define _mm512_extractf32x8_ps(a, imm) clb_emu_mm512_extractf32x8_ps(a, imm)

static inline __m512i clb_emu_mm512_zextsi256_si512(__m256i a)
{
    clb_emu_i32x16 r = {0};
    memcpy(&r, &a, 32);
    return (__m512i)r;
}
#define _mm512_zextsi256_si512(a) clb_emu_mm512_zextsi256_si512(a)

static inline __m512 clb_emu_mm512_mask_i32gather_ps(__m512 src, uint32_t k, __m512i idx,
                                                      const void *base, int scale)
{
    clb_emu_f32x16 r = (clb_emu_f32x16)src;
    clb_emu_i32x16 ix = (clb_emu_i32x16)idx;
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1u)
            memcpy(&r[i], (const char *)base + (int64_t)ix[i] * scale, sizeof(float));
    return (__m512)r;
}
#define _mm512_mask_i32gather_ps(src, k, idx, base, scale) \
    clb_emu_mm512_mask_i32gather_ps(src, k, idx, base, scale)

static inline __m512 clb_emu_mm512_maskz_loadu_ps(uint32_t k, const void *p)
{
    clb_emu_f32x16 r = {0};
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1u)
            memcpy(&r[i], (const float *)p + i, sizeof(float));
    return (__m512)r;
}
#define _mm512_maskz_loadu_ps(k, p) clb_emu_mm512_maskz_loadu_ps(k, p)

static inline void clb_emu_mm512_mask_storeu_ps(void *p, uint32_t k, __m512 a)
{
    clb_emu_f32x16 v = (clb_emu_f32x16)a;
    for (int i = 0; i < 16; i++)
        if ((k >> i) & 1u)
            memcpy((float *)p + i, &v[i], sizeof(float));
}
#define _mm512_mask_storeu_ps(p, k, a) clb_emu_mm512_mask_storeu_ps(p, k, a)

/* GCC's reduction tree (avx512fintrin.h __MM512_REDUCE_OP), with -inf in
 * the lanes the mask clears: the same operand order, so the same result
 * for signed zeros */
static inline float clb_emu_mm512_mask_reduce_max_ps(uint32_t k, __m512 a)
{
    clb_emu_f32x16 v = (clb_emu_f32x16)a;
    for (int i = 0; i < 16; i++)
        if (!((k >> i) & 1u))
            v[i] = -INFINITY;
    __m256 lo, hi;
    memcpy(&lo, &v, 32);
    memcpy(&hi, (char *)&v + 32, 32);
    __m256 t3 = _mm256_max_ps(hi, lo);
    __m128 t6 = _mm_max_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    __m128 t8 = _mm_max_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
    __m128 t10 = _mm_max_ps(t8, _mm_shuffle_ps(t8, t8, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtss_f32(t10);
}
#define _mm512_mask_reduce_max_ps(k, a) clb_emu_mm512_mask_reduce_max_ps(k, a)

/* pshufd in each 128-bit lane */
static inline __m512i clb_emu_mm512_shuffle_epi32(__m512i a, int imm)
{
    clb_emu_i32x16 v = (clb_emu_i32x16)a, r;
    for (int l = 0; l < 16; l += 4)
        for (int j = 0; j < 4; j++)
            r[l + j] = v[l + ((imm >> (2 * j)) & 3)];
    return (__m512i)r;
}
#define _mm512_shuffle_epi32(a, imm) clb_emu_mm512_shuffle_epi32(a, (int)(imm))

/* arithmetic shift; counts above 31 fill with the sign */
static inline __m512i clb_emu_mm512_srai_epi32(__m512i a, unsigned imm)
{
    clb_emu_i32x16 v = (clb_emu_i32x16)a, r;
    const unsigned s = imm > 31 ? 31 : imm;
    for (int i = 0; i < 16; i++)
        r[i] = v[i] < 0 ? (int32_t)~(~(uint32_t)v[i] >> s) : (int32_t)((uint32_t)v[i] >> s);
    return (__m512i)r;
}
#define _mm512_srai_epi32(a, imm) clb_emu_mm512_srai_epi32(a, imm)

#endif
