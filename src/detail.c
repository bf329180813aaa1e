/*
 * detail.c - error details: the library's one formatter, a printf subset
 * (%s, %u, %x, %llu) so that no target needs snprintf (support.h).
 */
#include "support.h"
#include "internal.h" /* CLB_MODEL_MAGIC */

#include <stdarg.h>


typedef struct { char *buf; size_t cap, len; } fmt_out;

static void put_ch(fmt_out *o, char c)
{
    if (o->len + 1 < o->cap)
        o->buf[o->len++] = c;
}

static void put_u64(fmt_out *o, uint64_t v, unsigned base)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v);
    if (base == 16) {
        put_ch(o, '0');
        put_ch(o, 'x');
    }
    while (n)
        put_ch(o, tmp[--n]);
}

void clb_detail(char *buf, size_t cap, const char *fmt, ...)
{
    fmt_out o = { buf, cap, 0 };
    va_list ap;
    va_start(ap, fmt);
    for (const char *f = fmt; *f; f++) {
        if (*f != '%' || !f[1]) {
            put_ch(&o, *f);
            continue;
        }
        switch (*++f) {
        case 's': {
            const char *s = va_arg(ap, const char *);
            while (s && *s)
                put_ch(&o, *s++);
            break;
        }
        case 'u': put_u64(&o, va_arg(ap, unsigned), 10); break;
        case 'l': /* %llu */
            if (f[1] == 'l' && f[2] == 'u') {
                f += 2;
                put_u64(&o, va_arg(ap, unsigned long long), 10);
            }
            break;
        case 'x': put_u64(&o, va_arg(ap, unsigned), 16); break;
        default: put_ch(&o, *f); break;
        }
    }
    va_end(ap);
    if (cap)
        buf[o.len] = '\0';
}

#define DETAIL_CAP sizeof(((colibri_model *)0)->priv_.detail)

int clb_call_begin(colibri_model *m)
{
    if (!m)
        return COLIBRI_E_ARG;
    if (m->priv_.magic != CLB_MODEL_MAGIC) {
        clb_detail(m->priv_.detail, DETAIL_CAP, "the model is not initialised");
        return COLIBRI_E_NOT_INIT;
    }
    m->priv_.detail[0] = '\0';
    return 0;
}
