/*
 * board.c - semihosting and the slots' flash driver on MPS2 AN386 (board.h).
 */
#include "board.h"

#include <string.h>

#include "platform.h"

/* --- semihosting (ARM DUI 0471): op in r0, parameter block in r1 ---------- */
#define SYS_OPEN 0x01
#define SYS_CLOSE 0x02
#define SYS_WRITE 0x05
#define SYS_READ 0x06
#define SYS_SEEK 0x0A
#define SYS_FLEN 0x0C
#define SYS_GET_CMDLINE 0x15

int board_semihost(int op, void *arg) {
    register int r0 __asm__("r0") = op;
    register void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

void board_puts(const char *s) {
    fw_write(s, strlen(s));
    fw_write("\n", 1);
}

static char cmdline[512];
static int cmdline_read;

/* The value of `key=` in the semihosting command line, or NULL. Values end
 * at a space; the caller gets a NUL-terminated copy in `buf`. */
const char *board_arg(const char *key, char *buf, size_t cap) {
    if (!cmdline_read) {
        uint32_t cl[2] = {(uint32_t)(uintptr_t)cmdline, sizeof cmdline - 1};
        if (board_semihost(SYS_GET_CMDLINE, cl) != 0) cmdline[0] = 0;
        cmdline_read = 1;
    }
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

uint32_t board_parse_u32(const char *s) {
    uint32_t v = 0;
    while (s && *s >= '0' && *s <= '9') v = v * 10u + (uint32_t)(*s++ - '0');
    return v;
}

int board_host_open(const char *path, int mode) {
    uint32_t a[3] = {(uint32_t)(uintptr_t)path, (uint32_t)mode, (uint32_t)strlen(path)};
    return board_semihost(SYS_OPEN, a);
}

/* --- the flash driver: memory, mirrored to the host file, cut on demand --- */
static int board_write(boot_flash *f, uint32_t off, const uint8_t *data, uint32_t n) {
    board_flash *b = (board_flash *)f;
    uint32_t keep = n;
    int cut = ++b->writes == b->cut_at;
    if (cut) keep = b->cut_mode == 0 ? 0 : b->cut_mode == 1 ? n / 2 : n;
    if (off > f->size || keep > f->size - off) return BOOT_E_FLASH;
    memcpy((uint8_t *)(uintptr_t)(BOARD_AGENT_BASE + off), data, keep);
    if (b->mirror >= 0 && keep) {
        uint32_t seek[2] = {(uint32_t)b->mirror, off};
        uint32_t wr[3] = {(uint32_t)b->mirror, (uint32_t)(uintptr_t)data, keep};
        if (board_semihost(SYS_SEEK, seek) != 0 || board_semihost(SYS_WRITE, wr) != 0) return BOOT_E_FLASH;
    }
    if (cut) {
        board_puts("boot: power cut (test)");
        fw_exit(BOOT_E_POWER_CUT);
    }
    return 0;
}

int board_flash_open(board_flash *b) {
    char buf[256], tmp[32];
    memset(b, 0, sizeof *b);
    b->f.base = (const uint8_t *)(uintptr_t)BOARD_AGENT_BASE;
    b->f.size = BOARD_AGENT_SIZE;
    b->f.write = board_write;
    b->mirror = -1;
    const char *path = board_arg("flash", buf, sizeof buf);
    if (path) {
        b->mirror = board_host_open(path, 3 /* r+b */);
        if (b->mirror < 0) {
            board_puts("boot: cannot open the flash mirror file (flash=PATH)");
            return BOOT_E_FLASH;
        }
    }
    b->cut_at = board_parse_u32(board_arg("cut", tmp, sizeof tmp));
    const char *mode = board_arg("mode", tmp, sizeof tmp);
    b->cut_mode = !mode ? 1 : mode[0] == 'b' ? 0 : mode[0] == 'a' ? 2 : 1;
    return 0;
}

void board_flash_close(board_flash *b) {
    if (b->mirror >= 0) {
        uint32_t c[1] = {(uint32_t)b->mirror};
        board_semihost(SYS_CLOSE, c);
        b->mirror = -1;
    }
}
