/*
 * main.c - the Colibri bootloader for the Cortex-M4F MPS2 AN386 board
 * (qemu-system-arm -M mps2-an386): flash map, the check that an image can run
 * from its slot, and the hand-over to the application. The decisions are
 * boot_core.c's; semihosting and the flash driver are board.c's.
 *
 * Flash map (QEMU models both regions as writable memory):
 *   0x00000000  ZBT SSRAM1 (4 MB): the bootloader, in its first 32 KiB.
 *   0x21000000  PSRAM (16 MB), standing for an external execute-in-place
 *               flash (QSPI on a real board): the update agent's area
 *               (colibri/device/update_agent.py layout): geometry, security counter
 *               copies, slot A, slot B, each slot ending with MCUboot's
 *               trailer. Two slots of the 2 MB demo firmware do not fit the
 *               4 MB SSRAM1. Slot images are linked for their slot
 *               (firmware/boot/xip.ld) and run in place.
 *
 * Exit statuses (semihosting) when nothing is handed over, each with one
 * line on the console: BOOT_E_NO_IMAGE 20, BOOT_E_GEOMETRY 21,
 * BOOT_E_FLASH 22; test builds also BOOT_E_POWER_CUT 99.
 *
 * Flash writes are mirrored to the host file `flash=PATH` and can be cut at
 * write K for tests (board.h). BOOT_CORPUS builds instead verify every image
 * of a corpus file (`corpus=PATH`) and print one verdict each.
 */
#include <stdint.h>
#include <string.h>

#include "board.h"
#include "boot_core.h"
#include "colibri_image.h"
#include "platform.h"

#define AGENT_BASE BOARD_AGENT_BASE
#define RAM_START 0x20000000u
#define RAM_END 0x20400000u
#define SCB_VTOR (*(volatile uint32_t *)0xE000ED08u)

extern const uint8_t colibri_boot_pubkey[32];   /* boot_key.c, generated from KEY.pub */
extern const uint32_t colibri_boot_target_id;

static void board_log(boot_flash *f, const char *line) {
    (void)f;
    board_puts(line);
}

/* Hand over: VTOR, MSP and the reset handler of the image's vector table. */
__attribute__((noreturn)) static void jump(uint32_t vectors) {
    const volatile uint32_t *vt = (const volatile uint32_t *)(uintptr_t)vectors;
    uint32_t sp = vt[0], pc = vt[1];
    SCB_VTOR = vectors;
    __asm__ volatile("dsb\n\tisb\n\tmsr msp, %0\n\tbx %1" : : "r"(sp), "r"(pc) : "memory");
    __builtin_unreachable();
}

/* Only an image linked for its slot can run in place: its vector table must
 * sit VTOR-aligned at the payload, with the reset handler inside the payload
 * and the stack pointer in RAM. */
static const char *xip_runnable(uint32_t slot_base, const boot_image *img) {
    uint32_t vectors = slot_base + img->hdr_size;
    const uint8_t *v = (const uint8_t *)(uintptr_t)vectors;
    uint32_t sp = colibri_img_u32(v), pc = colibri_img_u32(v + 4) & ~1u;
    if (vectors % 128u) return "vector table not 128-byte aligned (use a header size of 0x200)";
    if (sp <= RAM_START || sp > RAM_END || pc < vectors || pc >= vectors + img->img_size)
        return "not linked for this slot (its vector table points elsewhere)";
    return 0;
}

static board_flash flash;

static const char *runnable(boot_flash *f, int slot, const boot_image *img) {
    /* The slot offsets of the geometry block boot_core has checked. */
    uint32_t off = colibri_img_u32(f->base + 12 + 4u * (uint32_t)slot);
    return xip_runnable(AGENT_BASE + off, img);
}

#ifdef BOOT_CORPUS
#define SYS_READ 0x06
#define SYS_FLEN 0x0C

/* Corpus file: u32 target id, u32 min counter, u32 capacity, u32 count,
 * then per entry u32 length and the bytes. One line of verdicts out. */
static uint8_t corpus[3u << 20]; /* RAM is 4 MB: room for the 2 MB demo image */

static int run_corpus(const char *path, uint32_t repeat) {
    int fd = board_host_open(path, 1 /* rb */);
    if (fd < 0) {
        board_puts("boot: cannot open the corpus file");
        return 2;
    }
    uint32_t fl[1] = {(uint32_t)fd};
    int len = board_semihost(SYS_FLEN, fl);
    uint32_t rd[3] = {(uint32_t)fd, (uint32_t)(uintptr_t)corpus, (uint32_t)len};
    if (len <= 16 || (uint32_t)len > sizeof corpus || board_semihost(SYS_READ, rd) != 0) {
        board_puts("boot: cannot read the corpus file");
        return 2;
    }
    boot_policy p = {colibri_img_u32(corpus), colibri_img_u32(corpus + 4),
                     colibri_img_u32(corpus + 8), colibri_boot_pubkey};
    uint32_t count = colibri_img_u32(corpus + 12), pos = 16;
    static char out[8192];
    size_t n = 0;
    memcpy(out, "verdicts", 8), n = 8;
    for (uint32_t i = 0; i < count && pos + 4 <= (uint32_t)len; i++) {
        uint32_t size = colibri_img_u32(corpus + pos);
        pos += 4;
        int rc = 0;
        for (uint32_t r = 0; r < (repeat ? repeat : 1); r++)
            rc = boot_verify_image(corpus + pos, size, &p, 0);
        pos += size;
        if (n + 4 < sizeof out) {
            out[n++] = ' ';
            if (rc >= 10) out[n++] = (char)('0' + rc / 10);
            out[n++] = (char)('0' + rc % 10);
        }
    }
    out[n] = 0;
    board_puts(out);
    return 0;
}
#endif

int main(void) {
#ifdef BOOT_CORPUS
    char buf[256], rep[16];
    const char *c = board_arg("corpus", buf, sizeof buf);
    return c ? run_corpus(c, board_parse_u32(board_arg("repeat", rep, sizeof rep))) : 2;
#else
    int rc = board_flash_open(&flash);
    if (rc) return rc;
    flash.f.runnable = runnable;
    flash.f.log = board_log;
    boot_policy p = {colibri_boot_target_id, 0, 0, colibri_boot_pubkey};
    boot_choice ch;
    rc = boot_select(&flash.f, &p, &ch);
    if (rc) return rc;
    board_flash_close(&flash);
    jump(AGENT_BASE + ch.slot_offset + ch.img.hdr_size);
#endif
}
