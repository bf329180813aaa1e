/*
 * colibri_image.h - the signed firmware image format, version 1, as
 * docs/IMAGE.md states it, for device-side code (a bootloader, the firmware's
 * boot-time model check). tests/test_image_c.py parses every
 * `#define COLIBRI_IMG_...` here and checks it against colibri/image.py, and
 * compiles the struct below to check its size and offsets, so keep one plain
 * integer (or string) per define.
 *
 * Every field of the header and the TLVs is LITTLE-endian on every target.
 * The struct matches the bytes on a little-endian CPU; a big-endian one
 * (PowerPC) must read fields through the byte offsets (colibri_img_u16/u32).
 */
#ifndef COLIBRI_IMAGE_H
#define COLIBRI_IMAGE_H

#include <stddef.h>
#include <stdint.h>

/* --- Header (IMAGE.md 2) ------------------------------------------------- */
#define COLIBRI_IMG_MAGIC "CLFW"
#define COLIBRI_IMG_HEADER_SIZE 64
#define COLIBRI_IMG_FORMAT_VERSION 1

#define COLIBRI_IMG_HDR_MAGIC 0               /* char[4] */
#define COLIBRI_IMG_HDR_HEADER_SIZE 4         /* u16 */
#define COLIBRI_IMG_HDR_FORMAT_VERSION 6      /* u16 */
#define COLIBRI_IMG_HDR_TARGET_ID 8           /* u16 */
#define COLIBRI_IMG_HDR_FLAGS 10              /* u16 */
#define COLIBRI_IMG_HDR_VER_MAJOR 12          /* u8 */
#define COLIBRI_IMG_HDR_VER_MINOR 13          /* u8 */
#define COLIBRI_IMG_HDR_VER_PATCH 14          /* u16 */
#define COLIBRI_IMG_HDR_VER_BUILD 16          /* u32 */
#define COLIBRI_IMG_HDR_PAYLOAD_SIZE 20       /* u32 */
#define COLIBRI_IMG_HDR_LOAD_ADDR 24          /* u64 */
#define COLIBRI_IMG_HDR_PROTECTED_TLV_SIZE 32 /* u32 */
#define COLIBRI_IMG_HDR_RESERVED 36           /* u8[28], zero */
#define COLIBRI_IMG_RESERVED_SIZE 28

#define COLIBRI_IMG_FLAG_PAYLOAD_ELF 0x0001   /* else a raw binary */

/* Target ids (never renumbered). */
#define COLIBRI_IMG_TARGET_X86_64 1
#define COLIBRI_IMG_TARGET_ARMV7 2
#define COLIBRI_IMG_TARGET_PPC 3
#define COLIBRI_IMG_TARGET_CORTEX_M 4
#define COLIBRI_IMG_TARGET_AARCH64 5
#define COLIBRI_IMG_TARGET_RISCV64 6

/* --- TLV areas (IMAGE.md 3) ---------------------------------------------- */
#define COLIBRI_IMG_TLV_INFO_SIZE 8           /* u16 magic, u16 0, u32 total */
#define COLIBRI_IMG_TLV_HDR_SIZE 4            /* u16 type, u16 length */
#define COLIBRI_IMG_TLV_PROT_INFO_MAGIC 0x6908
#define COLIBRI_IMG_TLV_INFO_MAGIC 0x6907
#define COLIBRI_IMG_TLV_CRITICAL 0x8000       /* unknown + critical: refuse */

#define COLIBRI_IMG_TLV_KEYHASH 0x0001        /* unprotected, 32 bytes */
#define COLIBRI_IMG_TLV_SHA256 0x0010         /* unprotected, 32 bytes */
#define COLIBRI_IMG_TLV_ED25519 0x0024        /* unprotected, 64 bytes */
#define COLIBRI_IMG_TLV_SEC_CNT 0x8050        /* protected, u32 */
#define COLIBRI_IMG_TLV_MODEL_SHA256 0x80A0   /* protected, 32 bytes */
#define COLIBRI_IMG_TLV_MODEL_INFO 0x80A1     /* protected, 12 bytes: */
#define COLIBRI_IMG_MODEL_INFO_SIZE 12
#define COLIBRI_IMG_MODEL_INFO_OFFSET 0       /*   u32 blob offset in the payload */
#define COLIBRI_IMG_MODEL_INFO_BLOB_SIZE 4    /*   u32 blob size */
#define COLIBRI_IMG_MODEL_INFO_FORMAT 8       /*   u16 .colibri format version */
#define COLIBRI_IMG_MODEL_INFO_BYTE_ORDER 10  /*   u8 0 little, 1 big */
#define COLIBRI_IMG_MODEL_NOT_IN_PAYLOAD 0xFFFFFFFF

#define COLIBRI_IMG_SHA256_SIZE 32
#define COLIBRI_IMG_SIGNATURE_SIZE 64
#define COLIBRI_IMG_SIGN_DOMAIN "colibri-fw-image-v1" /* + one NUL byte, then the digest */

/* The header as it lies in flash on a little-endian CPU. */
typedef struct colibri_img_header {
    char magic[4];
    uint16_t header_size;
    uint16_t format_version;
    uint16_t target_id;
    uint16_t flags;
    uint8_t ver_major;
    uint8_t ver_minor;
    uint16_t ver_patch;
    uint32_t ver_build;
    uint32_t payload_size;
    uint64_t load_addr;
    uint32_t protected_tlv_size;
    uint8_t reserved[COLIBRI_IMG_RESERVED_SIZE];
} colibri_img_header;

/* Size asserts: the struct has no padding on any of our ABIs (the u64 sits
 * at offset 24; on 32-bit ARM/PowerPC its alignment is 8 or 4, both fine). */
_Static_assert(sizeof(colibri_img_header) == COLIBRI_IMG_HEADER_SIZE, "image header size");
_Static_assert(offsetof(colibri_img_header, ver_build) == COLIBRI_IMG_HDR_VER_BUILD, "ver_build");
_Static_assert(offsetof(colibri_img_header, payload_size) == COLIBRI_IMG_HDR_PAYLOAD_SIZE,
               "payload_size");
_Static_assert(offsetof(colibri_img_header, load_addr) == COLIBRI_IMG_HDR_LOAD_ADDR, "load_addr");
_Static_assert(offsetof(colibri_img_header, protected_tlv_size) ==
                   COLIBRI_IMG_HDR_PROTECTED_TLV_SIZE, "protected_tlv_size");
_Static_assert(offsetof(colibri_img_header, reserved) == COLIBRI_IMG_HDR_RESERVED, "reserved");

/* Little-endian field readers that work on any CPU and any alignment. */
static inline uint16_t colibri_img_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t colibri_img_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

#endif
