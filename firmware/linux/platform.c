/* platform.c - console and exit for the Linux user-mode firmware (static
 * executable run natively or under qemu-user). Plain system calls: no stdio
 * buffering to flush, so output is complete even when we stop early. */
#define _DEFAULT_SOURCE
#include <stdlib.h>
#include <unistd.h>

#include "platform.h"

void fw_write(const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(1, s, n);
        if (w <= 0) return; /* nothing sensible to do without a console */
        s += w;
        n -= (size_t)w;
    }
}

void fw_exit(int status) { _exit(status); }

unsigned fw_threads(void) {
    const char *s = getenv("COLIBRI_FW_THREADS");
    unsigned v = 0;
    for (; s && *s >= '0' && *s <= '9' && v <= 64; s++)
        v = v * 10u + (unsigned)(*s - '0');
    return s && *s == '\0' && v >= 1 && v <= 64 ? v : 1;
}
