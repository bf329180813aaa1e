/*
 * colibri_image.h - signed firmware images in MCUboot's format, as
 * docs/IMAGE.md states it, for device-side code (a bootloader, the firmware's
 * boot-time model check). tests/test_image_c.py parses every
 * `#define COLIBRI_IMG_...` here and checks it against colibri/device/image.py, and
 * compiles the struct below to check its size and offsets, so keep one plain
 * integer (or string) per define.
 *
 * Contract: every field of the header and the TLVs is LITTLE-endian on every
 * target (imgtool's default and what Colibri signs). The struct matches the
 * bytes on a little-endian CPU; a big-endian one (PowerPC) must read fields
 * through the byte offsets (colibri_img_u16/u32). The payload starts at
 * hdr_size (>= 32); the SHA-256 covers bytes [0, hdr_size + img_size +
 * protect_tlv_size); the ED25519 TLV signs that 32-byte digest itself.
 */
#ifndef COLIBRI_IMAGE_H
#define COLIBRI_IMAGE_H

#include <stddef.h>
#include <stdint.h>

/* --- Header (IMAGE.md 2): MCUboot's struct image_header ------------------ */
#define COLIBRI_IMG_MAGIC 0x96F3B83D          /* ih_magic */
#define COLIBRI_IMG_HEADER_STRUCT_SIZE 32     /* hdr_size may be larger */
#define COLIBRI_IMG_HEADER_SIZE 32            /* the default hdr_size */

#define COLIBRI_IMG_HDR_MAGIC 0               /* u32 */
#define COLIBRI_IMG_HDR_LOAD_ADDR 4           /* u32, with IMAGE_F_RAM_LOAD */
#define COLIBRI_IMG_HDR_HDR_SIZE 8            /* u16: the payload starts here */
#define COLIBRI_IMG_HDR_PROTECT_TLV_SIZE 10   /* u16: 0 = no protected area */
#define COLIBRI_IMG_HDR_IMG_SIZE 12           /* u32: payload bytes */
#define COLIBRI_IMG_HDR_FLAGS 16              /* u32 */
#define COLIBRI_IMG_HDR_VER_MAJOR 20          /* u8 */
#define COLIBRI_IMG_HDR_VER_MINOR 21          /* u8 */
#define COLIBRI_IMG_HDR_VER_REVISION 22       /* u16 */
#define COLIBRI_IMG_HDR_VER_BUILD 24          /* u32 */
#define COLIBRI_IMG_HDR_PAD1 28               /* u32, zero */

#define COLIBRI_IMG_F_RAM_LOAD 0x00000020     /* the only flag Colibri accepts */

/* Target ids (never renumbered), in the TARGET TLV. */
#define COLIBRI_IMG_TARGET_X86_64 1
#define COLIBRI_IMG_TARGET_ARMV7 2
#define COLIBRI_IMG_TARGET_PPC 3
#define COLIBRI_IMG_TARGET_CORTEX_M 4
#define COLIBRI_IMG_TARGET_AARCH64 5
#define COLIBRI_IMG_TARGET_RISCV64 6

/* --- TLV areas (IMAGE.md 3) ---------------------------------------------- */
#define COLIBRI_IMG_TLV_INFO_SIZE 4           /* u16 magic, u16 total (info included) */
#define COLIBRI_IMG_TLV_HDR_SIZE 4            /* u16 type, u16 length */
#define COLIBRI_IMG_TLV_PROT_INFO_MAGIC 0x6908
#define COLIBRI_IMG_TLV_INFO_MAGIC 0x6907
#define COLIBRI_IMG_TLV_CRITICAL 0x8000       /* unknown + critical: refuse */

#define COLIBRI_IMG_TLV_KEYHASH 0x0001        /* unprotected, 32: SHA-256 of the DER key */
#define COLIBRI_IMG_TLV_SHA256 0x0010         /* unprotected, 32 bytes */
#define COLIBRI_IMG_TLV_ED25519 0x0024        /* unprotected, 64 bytes */
#define COLIBRI_IMG_TLV_SEC_CNT 0x0050        /* protected, u32 */
#define COLIBRI_IMG_TLV_MODEL_SHA256 0x80A0   /* protected, 32 bytes */
#define COLIBRI_IMG_TLV_MODEL_INFO 0x80A1     /* protected, 12 bytes: */
#define COLIBRI_IMG_MODEL_INFO_SIZE 12
#define COLIBRI_IMG_MODEL_INFO_OFFSET 0       /*   u32 blob offset in the payload */
#define COLIBRI_IMG_MODEL_INFO_BLOB_SIZE 4    /*   u32 blob size */
#define COLIBRI_IMG_MODEL_INFO_FORMAT 8       /*   u16 .colibri format version */
#define COLIBRI_IMG_MODEL_INFO_BYTE_ORDER 10  /*   u8 0 little, 1 big */
#define COLIBRI_IMG_MODEL_NOT_IN_PAYLOAD 0xFFFFFFFF
#define COLIBRI_IMG_TLV_TARGET 0x80A2         /* protected, 4 bytes: */
#define COLIBRI_IMG_TARGET_SIZE 4
#define COLIBRI_IMG_TARGET_ID 0               /*   u16 target id */
#define COLIBRI_IMG_TARGET_KIND 2             /*   u16 payload kind: */
#define COLIBRI_IMG_PAYLOAD_RAW 0             /*     raw binary */
#define COLIBRI_IMG_PAYLOAD_ELF 1             /*     ELF file */

#define COLIBRI_IMG_SHA256_SIZE 32
#define COLIBRI_IMG_SIGNATURE_SIZE 64

/* The header as it lies in flash on a little-endian CPU. */
typedef struct colibri_img_header {
    uint32_t magic;
    uint32_t load_addr;
    uint16_t hdr_size;
    uint16_t protect_tlv_size;
    uint32_t img_size;
    uint32_t flags;
    uint8_t ver_major;
    uint8_t ver_minor;
    uint16_t ver_revision;
    uint32_t ver_build;
    uint32_t pad1;
} colibri_img_header;

/* Size asserts: the struct has no padding on any of our ABIs. */
_Static_assert(sizeof(colibri_img_header) == COLIBRI_IMG_HEADER_STRUCT_SIZE, "image header size");
_Static_assert(offsetof(colibri_img_header, hdr_size) == COLIBRI_IMG_HDR_HDR_SIZE, "hdr_size");
_Static_assert(offsetof(colibri_img_header, img_size) == COLIBRI_IMG_HDR_IMG_SIZE, "img_size");
_Static_assert(offsetof(colibri_img_header, ver_revision) == COLIBRI_IMG_HDR_VER_REVISION,
               "ver_revision");
_Static_assert(offsetof(colibri_img_header, ver_build) == COLIBRI_IMG_HDR_VER_BUILD, "ver_build");
_Static_assert(offsetof(colibri_img_header, pad1) == COLIBRI_IMG_HDR_PAD1, "pad1");

/* Little-endian field readers that work on any CPU and any alignment. */
static inline uint16_t colibri_img_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t colibri_img_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

#endif
