/*
 * board.h - the MPS2 AN386 side of the bootloader, shared with the
 * applications it boots (which confirm themselves through it): semihosting,
 * and the flash driver over the slots' region.
 *
 * Contract: the slots' region (the update agent's flash file) is mapped at
 * BOARD_AGENT_BASE. QEMU keeps it in memory only, so every write is also
 * mirrored into the host file named by the semihosting argument `flash=PATH`
 * (the file QEMU loaded there), and the next run starts from what this one
 * wrote. `cut=K mode=before|torn|after` stops the power at write K (1-based,
 * counted per program) with exit status BOOT_E_POWER_CUT, as the Python
 * agent's CutWriter does.
 */
#ifndef COLIBRI_BOOT_BOARD_H
#define COLIBRI_BOOT_BOARD_H

#include <stddef.h>
#include <stdint.h>

#include "boot_core.h"

#define BOARD_AGENT_BASE 0x21000000u   /* PSRAM, 16 MB: standing for external XIP flash */
#define BOARD_AGENT_SIZE 0x01000000u

typedef struct {
    boot_flash f;        /* first: the driver is passed as a boot_flash */
    int mirror;          /* host file handle, -1: none */
    uint32_t writes, cut_at;
    int cut_mode;        /* 0 before, 1 torn, 2 after */
} board_flash;

/* Semihosting call (ARM DUI 0471): operation, parameter block; r0 back. */
int board_semihost(int op, void *arg);

/* The value of `key=` in the semihosting command line (NUL-terminated copy
 * in `buf`), or NULL. */
const char *board_arg(const char *key, char *buf, size_t cap);

uint32_t board_parse_u32(const char *s);

/* Open a host file through semihosting (mode as fopen's index: 1 "rb",
 * 3 "r+b"); a handle, or -1. */
int board_host_open(const char *path, int mode);

/* One line on the console. */
void board_puts(const char *s);

/* The slots' flash, its mirror and the cut, from the command line.
 * 0, or BOOT_E_FLASH when the mirror file cannot be opened. */
int board_flash_open(board_flash *b);
void board_flash_close(board_flash *b);

#endif
