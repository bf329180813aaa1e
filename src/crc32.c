/*
 * crc32.c - zlib's CRC-32 (docs/FORMAT.md section 1), the one copy the
 * runtime (init and colibri_verify) and the firmware's boot-time model check
 * share.
 *
 * Slicing-by-8: eight bytes per step through eight 256-entry tables (8 KiB of
 * read-only data), several times faster than a byte table; init checks every
 * byte of a model, so this is most of init's time on large files. Byte order
 * independent: the eight bytes are combined one by one, never loaded as a
 * word.
 */
#include "colibri.h"
#include "crc32_tables.h"

uint32_t colibri_crc32(uint32_t crc, const void *data, size_t n)
{
    const uint8_t *p = (const uint8_t *)data;
    crc = ~crc;
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 |
                             (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = crc32_table[7][lo & 0xff] ^ crc32_table[6][(lo >> 8) & 0xff] ^
              crc32_table[5][(lo >> 16) & 0xff] ^ crc32_table[4][lo >> 24] ^
              crc32_table[3][p[4]] ^ crc32_table[2][p[5]] ^
              crc32_table[1][p[6]] ^ crc32_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc32_table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}
