/*
 * crc32.c - zlib's CRC-32 (docs/FORMAT.md section 1), the one copy the
 * runtime (init and colibri_verify) and the firmware's boot-time model check
 * share.
 *
 * Two forms, chosen at build time by COLIBRI_CRC32_SLICE8:
 * - 1 (default): slicing-by-8, eight bytes per step through eight 256-entry
 *   tables (8 KiB of read-only data): 1.8 GB/s on the x86 benchmark machine
 *   against 0.27 for a nibble table. Init checks every byte of a model, so on
 *   large files this is most of init's time.
 * - 0: the classic byte table (1 KiB), one lookup per byte. For
 *   microcontrollers, where 7 KiB of flash matters more (the cortex-m target
 *   sets it: the whole library is about 20 KiB) and models are small.
 * Byte order independent: bytes are combined one by one, never loaded as a
 * word. Both forms give the same CRC (tests/test_crc32.py checks each
 * against zlib).
 *
 * On x86-64 with PCLMULQDQ (checked at run time; COLIBRI_CRC32_CLMUL=0
 * leaves it out), runs of 64 bytes and more are folded with carry-less
 * multiplications instead: four 128-bit lanes, 64 bytes a step, then one
 * lane, then a Barrett reduction to 32 bits (V. Gopal, E. Ozturk et al.,
 * "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ
 * Instruction", Intel, 2009). Every byte of a model is checked at init and
 * by colibri_verify: about 8x the slicing-by-8 speed, so the check of a
 * multi-GB file no longer dominates its load. Where the CPU also has
 * VPCLMULQDQ with AVX2 (AMD Zen 3 on, Intel Ice Lake on; COLIBRI_CRC32_VCLMUL=0
 * leaves it out), runs of 256 bytes and more fold two lanes per instruction
 * in 256-bit registers, 128 bytes a step: 14 against 10 GB/s on a Zen 3 VM
 * (a hot buffer), and a streamed warm run checks every expert it maps.
 */
#include "colibri.h"

#ifndef COLIBRI_CRC32_SLICE8
#define COLIBRI_CRC32_SLICE8 1
#endif
#include "crc32_tables.h"

#ifndef COLIBRI_CRC32_CLMUL
#define COLIBRI_CRC32_CLMUL 1
#endif
/* x86-64 with GCC or clang only (and not for Frama-C's analysis) */
#if COLIBRI_CRC32_CLMUL && defined(__x86_64__) && \
    (defined(__GNUC__) || defined(__clang__)) && !defined(__FRAMAC__)
#define CLB_CRC32_CLMUL 1
#else
#define CLB_CRC32_CLMUL 0
#endif

#ifndef COLIBRI_CRC32_VCLMUL
#define COLIBRI_CRC32_VCLMUL 1
#endif

#if CLB_CRC32_CLMUL
#include <immintrin.h>

#define CLB_CLMUL_TARGET __attribute__((target("pclmul,sse4.1")))

/* a folded 16 bytes on by the constants k (x^(8D+32), x^(8D-32) mod P for
 * a distance of D bytes), then xored with d */
CLB_CLMUL_TARGET static inline __m128i fold16(__m128i a, __m128i k, __m128i d)
{
    __m128i lo = _mm_clmulepi64_si128(a, k, 0x00);
    __m128i hi = _mm_clmulepi64_si128(a, k, 0x11);
    return _mm_xor_si128(_mm_xor_si128(lo, hi), d);
}

/* The folded state a (128 bits, the bytes up to p) on over the n bytes at
 * p (a multiple of 16), then reduced to the CRC's 32 bits (the paper's
 * constants: x^(128+32), x^(128-32), x^64 mod P; P and mu = x^64 / P for
 * Barrett). */
CLB_CLMUL_TARGET static uint32_t fold_tail(__m128i a, const uint8_t *p, size_t n)
{
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    const __m128i k5 = _mm_set_epi64x(0, 0x0163cd6124);
    const __m128i pmu = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    const __m128i low32 = _mm_setr_epi32(-1, 0, -1, 0);
    for (; n >= 16; p += 16, n -= 16)
        a = fold16(a, k3k4, _mm_loadu_si128((const __m128i *)(const void *)p));
    /* 128 bits to 64, then to 32 by Barrett */
    a = _mm_xor_si128(_mm_srli_si128(a, 8), _mm_clmulepi64_si128(a, k3k4, 0x10));
    __m128i t = _mm_srli_si128(a, 4);
    a = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(a, low32), k5, 0x00), t);
    t = _mm_clmulepi64_si128(_mm_and_si128(a, low32), pmu, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), pmu, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(a, t), 1);
}

/* The reflected state crc (inverted, as below) after the n bytes at p
 * (n >= 64, a multiple of 16): four 128-bit lanes folded 64 bytes on
 * (x^(512+32), x^(512-32) mod P), then into one. */
CLB_CLMUL_TARGET static uint32_t crc32_clmul(uint32_t crc, const uint8_t *p, size_t n)
{
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    __m128i x[4];
    for (int i = 0; i < 4; i++)
        x[i] = _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i));
    x[0] = _mm_xor_si128(x[0], _mm_cvtsi32_si128((int)crc));
    p += 64;
    n -= 64;
    for (; n >= 64; p += 64, n -= 64)
        for (int i = 0; i < 4; i++)
            x[i] = fold16(x[i], k1k2,
                          _mm_loadu_si128((const __m128i *)(const void *)(p + 16 * i)));
    __m128i a = x[0];
    for (int i = 1; i < 4; i++)
        a = fold16(a, k3k4, x[i]);
    return fold_tail(a, p, n);
}

#if COLIBRI_CRC32_VCLMUL
#define CLB_VCLMUL_TARGET __attribute__((target("vpclmulqdq,avx2,pclmul,sse4.1")))

/* The same over n >= 128 bytes (a multiple of 16) with VPCLMULQDQ: four
 * 256-bit registers, eight 128-bit lanes in memory order, folded 128
 * bytes on (x^(1024+32), x^(1024-32) mod P), then into one lane. */
CLB_VCLMUL_TARGET static uint32_t crc32_vclmul(uint32_t crc, const uint8_t *p, size_t n)
{
    const __m256i k = _mm256_set_epi64x(0x014a7fe880, 0x01e88ef372, 0x014a7fe880,
                                        0x01e88ef372);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    __m256i x[4];
    for (int i = 0; i < 4; i++)
        x[i] = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * i));
    x[0] = _mm256_xor_si256(x[0], _mm256_setr_epi32((int)crc, 0, 0, 0, 0, 0, 0, 0));
    p += 128;
    n -= 128;
    for (; n >= 128; p += 128, n -= 128)
        for (int i = 0; i < 4; i++) {
            __m256i lo = _mm256_clmulepi64_epi128(x[i], k, 0x00);
            __m256i hi = _mm256_clmulepi64_epi128(x[i], k, 0x11);
            __m256i d = _mm256_loadu_si256((const __m256i *)(const void *)(p + 32 * i));
            x[i] = _mm256_xor_si256(_mm256_xor_si256(lo, hi), d);
        }
    __m128i a = _mm256_castsi256_si128(x[0]);
    a = fold16(a, k3k4, _mm256_extracti128_si256(x[0], 1));
    for (int i = 1; i < 4; i++) {
        a = fold16(a, k3k4, _mm256_castsi256_si128(x[i]));
        a = fold16(a, k3k4, _mm256_extracti128_si256(x[i], 1));
    }
    return fold_tail(a, p, n);
}

static int vclmul_available(void)
{
    return __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
}
#endif

static int clmul_available(void)
{
    return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
}
#endif

uint32_t colibri_crc32(uint32_t crc, const void *data, size_t n)
{
    const uint8_t *p = (const uint8_t *)data;
    crc = ~crc;
#if CLB_CRC32_CLMUL
    if (n >= 64 && clmul_available()) {
        size_t m = n & ~(size_t)15;
#if COLIBRI_CRC32_VCLMUL
        if (n >= 256 && vclmul_available())
            crc = crc32_vclmul(crc, p, m);
        else
#endif
            crc = crc32_clmul(crc, p, m);
        p += m;
        n -= m;
    }
#endif
#if COLIBRI_CRC32_SLICE8
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 |
                             (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = crc32_table_hi[6][lo & 0xff] ^ crc32_table_hi[5][(lo >> 8) & 0xff] ^
              crc32_table_hi[4][(lo >> 16) & 0xff] ^ crc32_table_hi[3][lo >> 24] ^
              crc32_table_hi[2][p[4]] ^ crc32_table_hi[1][p[5]] ^
              crc32_table_hi[0][p[6]] ^ crc32_table0[p[7]];
        p += 8;
        n -= 8;
    }
#endif
    while (n--)
        crc = (crc >> 8) ^ crc32_table0[(crc ^ *p++) & 0xff];
    return ~crc;
}
