/*
 * eva_format.c - Frama-C EVA harness for the .colibri file checks
 * (src/format.c). Every byte of a file of EVA_MAX_BYTES bytes is unknown
 * (Frama_C_make_unknown: all 2^(8 * EVA_MAX_BYTES) contents at once) and its
 * size is any of 0..EVA_MAX_BYTES; the harness calls every entry point that
 * reads header or table bytes: clb_validate (header, DESC, table, CRCs,
 * floats), colibri_verify (the same, reporting every damaged part through a
 * callback) and clb_check_header + clb_check_desc (colibri_arena_size's
 * path). An EVA run without alarms proves, for all those inputs: no
 * out-of-bounds access, no signed overflow, no division by zero, no
 * uninitialised read, no invalid shift or conversion. scripts/analysis.sh
 * runs it.
 */
#include "__fc_builtin.h"
#include "format.h"

#ifndef EVA_MAX_BYTES
#define EVA_MAX_BYTES 512
#endif

static uint8_t file_bytes[EVA_MAX_BYTES];

static void on_bad(void *user, int index, const char *what)
{
    (void)index;
    (void)what;
    ++*(unsigned *)user;
}

void eva_main(void)
{
    Frama_C_make_unknown((char *)file_bytes, EVA_MAX_BYTES);
    size_t size = Frama_C_unsigned_int_interval(0, EVA_MAX_BYTES);
    colibri_shape s;
    clb_desc d;
    int be;
    char detail[DETAIL_CAP];
    uint32_t nbad = 0;
    (void)clb_validate(file_bytes, size, &s, &be, &d, detail, NULL, NULL, &nbad);
    unsigned reports = 0;
    uint32_t bad_count;
    (void)colibri_verify(file_bytes, size, on_bad, &reports, &bad_count);
    if (clb_check_header(file_bytes, size, &s, &be, detail, NULL, NULL, &nbad) == 0)
        (void)clb_check_desc(file_bytes, size, &s, be, &d, detail);
}
