/*
 * boot_core.h - what the Colibri bootloader decides, in portable C11 with no
 * allocation, no stdio and no platform calls: verifying an MCUboot image in a
 * flash slot, and choosing the slot to boot with MCUboot's direct-XIP revert
 * rules (docs/IMAGE.md sections 4 and 7). firmware/boot/main.c wires it to
 * the Cortex-M board; tests run the same code under qemu-system-arm.
 *
 * Contracts:
 * - The flash layout is the update agent's (colibri/device/update_agent.py): a
 *   geometry block, two security-counter copies, slots A and B, each ending
 *   with MCUboot's 48-byte trailer. `boot_flash.base` maps it for reading
 *   (execute-in-place flash); every change goes through `boot_flash.write`,
 *   one call per flash write, so a power cut can be simulated at each.
 * - boot_verify_image returns the same reason numbers as
 *   `colibri fw verify` exits with (BOOT_OK or BOOT_R_*), checking in the
 *   same order, so the two give the same verdict on the same bytes.
 * - Signatures: Ed25519 over the image's SHA-256 (orlp ed25519, fetched by
 *   scripts/setup.sh); the key hash is SHA-256 of the DER public key.
 * - Nothing here ever boots an image that failed a check: boot_select
 *   returns BOOT_E_NO_IMAGE instead.
 */
#ifndef COLIBRI_BOOT_CORE_H
#define COLIBRI_BOOT_CORE_H

#include <stddef.h>
#include <stdint.h>

/* Verdicts: the exit statuses of `colibri fw verify` (docs/IMAGE.md 6). */
#define BOOT_OK 0
#define BOOT_R_MALFORMED 3
#define BOOT_R_TRUNCATED 4
#define BOOT_R_DAMAGED 5
#define BOOT_R_WRONG_KEY 6
#define BOOT_R_BAD_SIGNATURE 7
#define BOOT_R_UNKNOWN_CRITICAL 8
#define BOOT_R_WRONG_TARGET 9
#define BOOT_R_COUNTER 11
#define BOOT_R_TOO_LARGE 12

/* Bootloader exit statuses (semihosting) when it cannot hand over. */
#define BOOT_E_NO_IMAGE 20      /* neither slot holds a bootable verified image */
#define BOOT_E_GEOMETRY 21      /* the flash geometry block is missing or damaged */
#define BOOT_E_FLASH 22         /* a flash write failed */
#define BOOT_E_POWER_CUT 99     /* test builds: the simulated power cut happened */

#define BOOT_TRAILER_SIZE 48

typedef struct {
    uint32_t target_id;          /* the device's target (COLIBRI_IMG_TARGET_*) */
    uint32_t min_counter;        /* the stored security counter */
    uint32_t capacity;           /* bytes an image may take in the slot */
    const uint8_t *pubkey;       /* the Ed25519 public key built into the bootloader */
} boot_policy;

typedef struct {
    uint8_t major, minor;
    uint16_t revision;
    uint32_t build;
    uint32_t security_counter;
    uint32_t hdr_size, img_size;
    uint32_t size;               /* header + payload + both TLV areas */
} boot_image;

/* Verify the image at the start of `slot` (`len` readable bytes; erased
 * flash may follow the image). BOOT_OK and *out filled, or a BOOT_R_*. */
int boot_verify_image(const uint8_t *slot, uint32_t len, const boot_policy *p, boot_image *out);

/* One word per verdict, as `colibri fw verify` prints them. */
const char *boot_reason(int rc);

/* -1, 0, 1 as a < b, a == b, a > b (major, minor, revision, build). */
int boot_version_cmp(const boot_image *a, const boot_image *b);

typedef struct boot_flash boot_flash;
struct boot_flash {
    const uint8_t *base;         /* the agent area (geometry block first) */
    uint32_t size;               /* its readable length */
    /* Program `n` bytes at offset `off` of the area: 0 ok, else an error. */
    int (*write)(boot_flash *f, uint32_t off, const uint8_t *data, uint32_t n);
    /* Can this verified image run from `slot` (e.g. its vector table points
     * into the slot)? NULL: always. Returns a reason text, NULL when it can. */
    const char *(*runnable)(boot_flash *f, int slot, const boot_image *img);
    /* One console line per decision (no newline in `line`). */
    void (*log)(boot_flash *f, const char *line);
};

typedef struct {
    int slot;                    /* 0 A, 1 B */
    int trial;                   /* 1: a test boot (the image must confirm itself) */
    uint32_t slot_offset;        /* the slot's offset in the area */
    boot_image img;
} boot_choice;

/* The reset-time decision (docs/IMAGE.md 7): BOOT_OK and *out, or
 * BOOT_E_GEOMETRY / BOOT_E_NO_IMAGE / BOOT_E_FLASH. Writes: copy_done of a
 * test image, the erase of a reverted slot, the security counter. */
int boot_select(boot_flash *f, const boot_policy *base_policy, boot_choice *out);

/* For the application: MCUboot's boot_set_confirmed. Programs image_ok in
 * the trailer of the slot holding offset `running` of the area (e.g. the
 * running image's vector table - base) once its self-test passed; the next
 * boot then keeps it and raises the security counter. 0 (also when it was
 * confirmed already), BOOT_E_GEOMETRY, BOOT_E_FLASH, or BOOT_E_NO_IMAGE when
 * `running` is in no slot or the slot is not marked for boot. */
int boot_set_confirmed(boot_flash *f, uint32_t running);

#endif
