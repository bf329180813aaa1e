/*
 * support.h - the small helpers every runtime file that reads the file or
 * reports an error shares: field readers in the file's byte order (the
 * header and the table are always read field by field, so validation works
 * on the bytes as stored; only tensor data is ever swapped), 64-bit
 * arithmetic with a sticky overflow flag (every size a file implies is
 * computed with them), and the error-detail formatter. Not installed.
 */
#ifndef COLIBRI_SUPPORT_H
#define COLIBRI_SUPPORT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "colibri.h"

/* Bytes of an instance's error detail (colibri_model.priv_.detail). */
#define DETAIL_CAP sizeof(((colibri_model *)0)->priv_.detail)

/* A tiny printf subset (%s, %u, %x, %llu) into buf[cap], always terminated,
 * so the library needs no snprintf on small targets; GCC checks the
 * arguments' types. detail.c. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
void clb_detail(char *buf, size_t cap, const char *fmt, ...);

/* The start every call on an instance shares: COLIBRI_E_ARG for NULL,
 * COLIBRI_E_NOT_INIT (with a detail) for an instance that is not
 * initialised, else 0 with the previous call's detail cleared (a detail
 * describes this call's failure only). detail.c. */
int clb_call_begin(colibri_model *m);


static inline int host_is_big_endian(void)
{
    const uint16_t one = 1;
    uint8_t first;
    memcpy(&first, &one, 1);
    return first == 0;
}

static inline uint16_t rd16(const uint8_t *p, int be)
{
    return be ? (uint16_t)(p[0] << 8 | p[1]) : (uint16_t)(p[1] << 8 | p[0]);
}

static inline uint32_t rd32(const uint8_t *p, int be)
{
    return be ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]
              : (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

static inline uint64_t rd64(const uint8_t *p, int be)
{
    uint64_t a = rd32(p, be), b = rd32(p + 4, be);
    return be ? a << 32 | b : b << 32 | a;
}

static inline float rdf32(const uint8_t *p, int be)
{
    uint32_t u = rd32(p, be);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* a*b and a+b in 64 bits; *ovf is set (sticky) on overflow. */
static inline uint64_t cmul(uint64_t a, uint64_t b, int *ovf)
{
    if (a && b > UINT64_MAX / a)
        *ovf = 1;
    return a * b;
}

static inline uint64_t cadd(uint64_t a, uint64_t b, int *ovf)
{
    if (b > UINT64_MAX - a)
        *ovf = 1;
    return a + b;
}

static inline uint64_t calign64(uint64_t n, int *ovf)
{
    return cadd(n, 63, ovf) & ~(uint64_t)63;
}

#endif /* COLIBRI_SUPPORT_H */
