/*
 * platform.h - the two services the firmware application needs from the
 * platform it runs on: write text to the console, stop with a status, and
 * how many threads to compute on.
 * Linux targets implement them with write(2)/_exit(2) (linux/platform.c),
 * bare-metal Cortex-M with semihosting (cortex_m/semihost.c), so the same
 * app/main.c runs everywhere and reports through one output format.
 */
#ifndef COLIBRI_FW_PLATFORM_H
#define COLIBRI_FW_PLATFORM_H

#include <stddef.h>

/* Write `n` bytes of `s` to the console (stdout or the semihosting host). */
void fw_write(const char *s, size_t n);

/* Workers the application asks the runtime for (colibri_set_threads): on
 * Linux the environment variable COLIBRI_FW_THREADS (1 when unset or not a
 * number from 1 to 64), on bare metal 1. */
unsigned fw_threads(void);

/* Stop the program with `status` (0 success). Never returns. */
void fw_exit(int status) __attribute__((noreturn));

#endif
