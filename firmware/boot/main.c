/*
 * main.c - the Colibri bootloader for the Cortex-M4F MPS2 AN386 board
 * (qemu-system-arm -M mps2-an386): flash map, the flash driver, the hand-over
 * to the application, and the semihosting console. The decisions are
 * boot_core.c's.
 *
 * Flash map (QEMU models both regions as writable memory):
 *   0x00000000  ZBT SSRAM1 (4 MB): the bootloader, in its first 32 KiB.
 *   0x21000000  PSRAM (16 MB), standing for an external execute-in-place
 *               flash (QSPI on a real board): the update agent's area
 *               (colibri/update_agent.py layout): geometry, security counter
 *               copies, slot A, slot B, each slot ending with MCUboot's
 *               trailer. Two slots of the 2 MB demo firmware do not fit the
 *               4 MB SSRAM1. Slot images are linked for their slot
 *               (firmware/boot/xip.ld) and run in place.
 *
 * Exit statuses (semihosting) when nothing is handed over, each with one
 * line on the console: BOOT_E_NO_IMAGE 20, BOOT_E_GEOMETRY 21,
 * BOOT_E_FLASH 22; test builds also BOOT_E_POWER_CUT 99.
 *
 * QEMU keeps flash in memory only, so a write is also mirrored into the host
 * file named by the semihosting argument `flash=PATH` (the area image QEMU
 * loaded at AGENT_BASE): the next run starts from what this one wrote. `cut=K` and
 * `mode=before|torn|after` stop the power at write K (1-based), as the
 * Python agent's CutWriter does. BOOT_CORPUS builds instead verify every
 * image of a corpus file (`corpus=PATH`) and print one verdict each.
 */
#include <stdint.h>
#include <string.h>

#include "boot_core.h"
#include "colibri_image.h"
#include "platform.h"

#define AGENT_BASE 0x21000000u
#define AGENT_SIZE 0x01000000u
#define RAM_START 0x20000000u
#define RAM_END 0x20400000u
#define SCB_VTOR (*(volatile uint32_t *)0xE000ED08u)

extern const uint8_t colibri_boot_pubkey[32];   /* boot_key.c, generated from KEY.pub */
extern const uint32_t colibri_boot_target_id;

/* --- semihosting (ARM DUI 0471): op in r0, parameter block in r1 ---------- */
#define SYS_OPEN 0x01
#define SYS_CLOSE 0x02
#define SYS_WRITE 0x05
#define SYS_READ 0x06
#define SYS_SEEK 0x0A
#define SYS_FLEN 0x0C
#define SYS_GET_CMDLINE 0x15

static int semihost(int op, void *arg) {
    register int r0 __asm__("r0") = op;
    register void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

static void puts_line(const char *s) {
    fw_write(s, strlen(s));
    fw_write("\n", 1);
}

static char cmdline[512];

/* The value of `key=` in the semihosting command line, or NULL. Values end
 * at a space; the caller gets a NUL-terminated copy in `buf`. */
static const char *arg(const char *key, char *buf, size_t cap) {
    size_t k = strlen(key);
    for (const char *p = cmdline; *p; p++) {
        if ((p == cmdline || p[-1] == ' ') && strncmp(p, key, k) == 0 && p[k] == '=') {
            p += k + 1;
            size_t n = 0;
            while (p[n] && p[n] != ' ' && n + 1 < cap) buf[n] = p[n], n++;
            buf[n] = 0;
            return buf;
        }
    }
    return 0;
}

static uint32_t parse_u32(const char *s) {
    uint32_t v = 0;
    while (s && *s >= '0' && *s <= '9') v = v * 10u + (uint32_t)(*s++ - '0');
    return v;
}

static int host_open(const char *path, int mode) {
    uint32_t a[3] = {(uint32_t)(uintptr_t)path, (uint32_t)mode, (uint32_t)strlen(path)};
    return semihost(SYS_OPEN, a);
}

/* --- the flash driver: memory, mirrored to the host file, cut on demand --- */
typedef struct {
    boot_flash f;
    int mirror;          /* host file handle, -1: none */
    uint32_t writes, cut_at;
    int cut_mode;        /* 0 before, 1 torn, 2 after */
} board_flash;

static int board_write(boot_flash *f, uint32_t off, const uint8_t *data, uint32_t n) {
    board_flash *b = (board_flash *)f;
    uint32_t keep = n;
    int cut = ++b->writes == b->cut_at;
    if (cut) keep = b->cut_mode == 0 ? 0 : b->cut_mode == 1 ? n / 2 : n;
    if (off > f->size || keep > f->size - off) return BOOT_E_FLASH;
    memcpy((uint8_t *)(uintptr_t)(AGENT_BASE + off), data, keep);
    if (b->mirror >= 0 && keep) {
        uint32_t seek[2] = {(uint32_t)b->mirror, off};
        uint32_t wr[3] = {(uint32_t)b->mirror, (uint32_t)(uintptr_t)data, keep};
        if (semihost(SYS_SEEK, seek) != 0 || semihost(SYS_WRITE, wr) != 0) return BOOT_E_FLASH;
    }
    if (cut) {
        puts_line("boot: power cut (test)");
        fw_exit(BOOT_E_POWER_CUT);
    }
    return 0;
}

static void board_log(boot_flash *f, const char *line) {
    (void)f;
    puts_line(line);
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
/* Corpus file: u32 target id, u32 min counter, u32 capacity, u32 count,
 * then per entry u32 length and the bytes. One line of verdicts out. */
static uint8_t corpus[3u << 20]; /* RAM is 4 MB: room for the 2 MB demo image */

static int run_corpus(const char *path, uint32_t repeat) {
    int fd = host_open(path, 1 /* rb */);
    if (fd < 0) {
        puts_line("boot: cannot open the corpus file");
        return 2;
    }
    uint32_t fl[1] = {(uint32_t)fd};
    int len = semihost(SYS_FLEN, fl);
    uint32_t rd[3] = {(uint32_t)fd, (uint32_t)(uintptr_t)corpus, (uint32_t)len};
    if (len <= 16 || (uint32_t)len > sizeof corpus || semihost(SYS_READ, rd) != 0) {
        puts_line("boot: cannot read the corpus file");
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
    puts_line(out);
    return 0;
}
#endif

int main(void) {
    uint32_t cl[2] = {(uint32_t)(uintptr_t)cmdline, sizeof cmdline - 1};
    if (semihost(SYS_GET_CMDLINE, cl) != 0) cmdline[0] = 0;
    char buf[256];
#ifdef BOOT_CORPUS
    const char *c = arg("corpus", buf, sizeof buf);
    char rep[16];
    return c ? run_corpus(c, parse_u32(arg("repeat", rep, sizeof rep))) : 2;
#else
    flash.f.base = (const uint8_t *)(uintptr_t)AGENT_BASE;
    flash.f.size = AGENT_SIZE;
    flash.f.write = board_write;
    flash.f.runnable = runnable;
    flash.f.log = board_log;
    flash.mirror = -1;
    const char *path = arg("flash", buf, sizeof buf);
    if (path) {
        flash.mirror = host_open(path, 3 /* r+b */);
        if (flash.mirror < 0) {
            puts_line("boot: cannot open the flash mirror file");
            return BOOT_E_FLASH;
        }
    }
    char tmp[32];
    flash.cut_at = parse_u32(arg("cut", tmp, sizeof tmp));
    const char *mode = arg("mode", tmp, sizeof tmp);
    flash.cut_mode = !mode ? 1 : mode[0] == 'b' ? 0 : mode[0] == 'a' ? 2 : 1;

    boot_policy p = {colibri_boot_target_id, 0, 0, colibri_boot_pubkey};
    boot_choice ch;
    int rc = boot_select(&flash.f, &p, &ch);
    if (rc) return rc;
    if (flash.mirror >= 0) {
        uint32_t c[1] = {(uint32_t)flash.mirror};
        semihost(SYS_CLOSE, c);
    }
    jump(AGENT_BASE + ch.slot_offset + ch.img.hdr_size);
#endif
}
