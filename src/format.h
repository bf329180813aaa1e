/*
 * format.h - the .colibri file checks (format.c) other runtime files call:
 * validation of a whole file, of the header alone (for the arena size), and
 * the section size a dtype and shape imply. Not installed.
 */
#ifndef COLIBRI_FORMAT_CHECKS_H
#define COLIBRI_FORMAT_CHECKS_H

#include "colibri.h"
#include "support.h"

/* colibri_verify's callback: index -2 header, -1 table, >= 0 a tensor, -3
 * the error that stopped the check. */
typedef void (*bad_cb)(void *user, int index, const char *what);

/* Header: magic, bom, version, header_crc, every field's range, flags.
 * Fills *s and *be (1: the file is big-endian). With cb set, a CRC mismatch
 * is reported and counted in *nbad instead of returned. */
int clb_check_header(const uint8_t *b, size_t size, colibri_shape *s,
                     int *be, char *detail, bad_cb cb, void *user,
                     uint32_t *nbad);

/* The whole of FORMAT.md 3 on the bytes as stored (header, table, every
 * section's CRC and floats). detail gets DETAIL_CAP bytes. */
int clb_validate(const uint8_t *b, size_t size, colibri_shape *s, int *be,
                 char *detail, bad_cb cb, void *user, uint32_t *nbad);

/* Section size of a dtype (FORMAT.md 4), overflow-checked (*ovf sticky);
 * where the scales start within the section in *scales_at. */
uint64_t clb_section_size(unsigned dtype, uint32_t rows, uint32_t cols,
                          uint32_t group, uint64_t *scales_at, int *ovf);

#endif /* COLIBRI_FORMAT_CHECKS_H */
