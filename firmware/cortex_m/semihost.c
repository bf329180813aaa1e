/*
 * semihost.c - Arm semihosting for the bare-metal Cortex-M firmware: console
 * output (SYS_WRITE to the host's stdout) and exit with a status
 * (SYS_EXIT_EXTENDED, so qemu-system-arm -semihosting-config enable=on
 * returns our status as its own exit status), plus the few newlib system
 * calls the C library may reference. There is no heap: _sbrk always fails,
 * so any malloc in the firmware or the library would return NULL (and the
 * library reports COLIBRI_E_NO_MEMORY) instead of corrupting RAM. The one
 * exception is a COLIBRI_DEBUG build: newlib's printf of floating-point
 * values (the runtime's tensor dumps) allocates its conversion buffers, so
 * debug builds get a small static heap for them.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "platform.h"

#define SYS_OPEN 0x01
#define SYS_WRITE 0x05
#define SYS_EXIT 0x18
#define SYS_EXIT_EXTENDED 0x20
#define ADP_Stopped_ApplicationExit 0x20026

/* The semihosting call: operation in r0, parameter block pointer in r1,
 * `bkpt 0xab` traps to the debugger (QEMU), result in r0. */
static int semihost(int op, const void *arg) {
    register int r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

static int console_fd = -1;

static int console(void) {
    if (console_fd < 0) {
        /* ":tt" opened for writing ("w" is mode 4) is the host's stdout. */
        const uint32_t args[3] = {(uint32_t)(uintptr_t)":tt", 4, 3};
        console_fd = semihost(SYS_OPEN, args);
    }
    return console_fd;
}

void fw_write(const char *s, size_t n) {
    int fd = console();
    if (fd < 0 || n == 0) return;
    uint32_t args[3] = {(uint32_t)fd, (uint32_t)(uintptr_t)s, (uint32_t)n};
    semihost(SYS_WRITE, args);
}

unsigned fw_threads(void) { return 1; } /* no threads on bare metal */

void fw_exit(int status) {
    /* reason, subcode: QEMU exits with `subcode` as its status. */
    const uint32_t args[2] = {ADP_Stopped_ApplicationExit, (uint32_t)status};
    semihost(SYS_EXIT_EXTENDED, args);
    /* Hosts without the extension: plain SYS_EXIT (status 0 or 1). */
    semihost(SYS_EXIT, (const void *)(uintptr_t)(status == 0 ? ADP_Stopped_ApplicationExit
                                                             : 0x20023 /* RunTimeError */));
    for (;;) {
    }
}

/* --- newlib system calls ------------------------------------------------ */
/* Only what libc/libm can pull in (snprintf's locale code, errno users);
 * the firmware itself never uses stdio files or the heap. */

#ifdef COLIBRI_DEBUG
static unsigned char debug_heap[16384] __attribute__((aligned(8)));
static size_t debug_heap_used;
#endif

void *_sbrk(ptrdiff_t incr) {
#ifdef COLIBRI_DEBUG
    if (incr >= 0 && (size_t)incr <= sizeof debug_heap - debug_heap_used) {
        void *p = debug_heap + debug_heap_used;
        debug_heap_used += (size_t)incr;
        return p;
    }
#endif
    (void)incr;
    errno = ENOMEM;
    return (void *)-1;
}

int _write(int fd, const char *buf, int len) {
    (void)fd; /* stdout and stderr both go to the host console */
    fw_write(buf, (size_t)len);
    return len;
}

int _read(int fd, char *buf, int len) { (void)fd; (void)buf; (void)len; errno = EBADF; return -1; }
int _close(int fd) { (void)fd; errno = EBADF; return -1; }
int _lseek(int fd, int off, int whence) { (void)fd; (void)off; (void)whence; errno = ESPIPE; return -1; }
int _fstat(int fd, struct stat *st) { (void)fd; st->st_mode = S_IFCHR; return 0; }
int _isatty(int fd) { (void)fd; return 1; }
int _getpid(void) { return 1; }
int _kill(int pid, int sig) { (void)pid; (void)sig; errno = EINVAL; return -1; }
void _exit(int status) { fw_exit(status); }
