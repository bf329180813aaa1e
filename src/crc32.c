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
 */
#include "colibri.h"

#ifndef COLIBRI_CRC32_SLICE8
#define COLIBRI_CRC32_SLICE8 1
#endif
#include "crc32_tables.h"

uint32_t colibri_crc32(uint32_t crc, const void *data, size_t n)
{
    const uint8_t *p = (const uint8_t *)data;
    crc = ~crc;
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
