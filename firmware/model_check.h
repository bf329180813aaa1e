/*
 * model_check.h - the firmware's boot-time check of its embedded model
 * (docs/IMAGE.md section 8), run BEFORE colibri_init_from_memory so a model
 * corrupted in flash is refused with a clear message and its own exit status
 * instead of producing garbage or a confusing init error.
 *
 * What is checked, every byte of the blob:
 *   - the .colibri header: magic, byte-order mark, format version, header CRC;
 *   - the tensor table CRC, every section's bounds and CRC32;
 *   - every padding byte between and after the sections is zero (FORMAT.md 1),
 *     so no byte escapes the check;
 *   - when an expected SHA-256 is given (the image's MODEL_SHA256 TLV, see
 *     colibri_image_model_sha256), the SHA-256 of the whole blob.
 *
 * Pure C11, no allocation, no stdio: usable on bare metal. The blob may be in
 * either byte order (its BOM says which), whatever the CPU's.
 */
#ifndef COLIBRI_FW_MODEL_CHECK_H
#define COLIBRI_FW_MODEL_CHECK_H

#include <stddef.h>
#include <stdint.h>

/* Results of colibri_model_check (negative: the model is refused). The first
 * three reuse the runtime's meanings (colibri.h: -1 format, -3 CRC). */
#define COLIBRI_MODEL_OK 0
#define COLIBRI_MODEL_ERR_FORMAT (-1)    /* not a .colibri blob / bad structure */
#define COLIBRI_MODEL_ERR_CRC (-3)       /* header, table or section CRC mismatch */
#define COLIBRI_MODEL_ERR_TRUNCATED (-20) /* ends before its table/sections do */
#define COLIBRI_MODEL_ERR_SHA256 (-21)   /* whole-blob SHA-256 is not the expected one */

/* Exit status of a firmware that refuses its model (main.c uses 1 and 2). */
#define COLIBRI_FW_EXIT_MODEL_CORRUPT 3

#define COLIBRI_SHA256_SIZE 32

/* Check `size` bytes at `blob`. `expected_sha256` may be NULL (structure and
 * CRCs only). On failure writes one NUL-terminated line (no newline) naming
 * the field/section and the values into `msg` (if msg_size > 0). */
int colibri_model_check(const uint8_t *blob, size_t size, const uint8_t *expected_sha256,
                        char *msg, size_t msg_size);

/* For the firmware app: run colibri_model_check and, on failure, print
 * "error: model check: <detail>\n" through fw_write (platform.h) and return
 * COLIBRI_FW_EXIT_MODEL_CORRUPT; 0 when the model is intact. Call it first:
 *     int rc = colibri_fw_model_check(colibri_model_blob, colibri_model_blob_size, NULL);
 *     if (rc) return rc;
 */
int colibri_fw_model_check(const uint8_t *blob, size_t size, const uint8_t *expected_sha256);

/* The MODEL_SHA256 TLV of a signed image (colibri_image.h) at `image`, e.g.
 * the slot a bootloader booted from. Structure only: the caller (bootloader)
 * has verified the image signature. 0: found, copied to `out`; -1: not a
 * well-formed image; -2: the image records no model. */
int colibri_image_model_sha256(const uint8_t *image, size_t size,
                               uint8_t out[COLIBRI_SHA256_SIZE]);

/* FIPS 180-4 SHA-256, exposed for tests and reuse. (The CRC-32 is the
 * runtime's colibri_crc32, colibri.h.) */
void colibri_sha256(const uint8_t *data, size_t n, uint8_t out[COLIBRI_SHA256_SIZE]);

#endif
