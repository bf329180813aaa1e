/*
 * test_noalloc.c - proves colibri_infer allocates nothing and makes no
 * system call, two independent ways, over 1000 calls each:
 *
 * 1. Link-time interposition: built with -Wl,--wrap=SYM for every allocation
 *    and I/O entry point (WRAPPED below), every call from the library's
 *    objects lands in a __wrap_SYM that counts it while armed.
 * 2. The kernel: the second 1000 calls run under seccomp strict mode, where
 *    any system call but read/write/exit/sigreturn kills the process with
 *    SIGKILL (so a syscall hidden inside libc, e.g. malloc growing the heap,
 *    is caught too); write is counted by the wrapper.
 *
 *   test_noalloc MODEL [--canary-malloc | --canary-syscall] [--spin-threads N]
 *
 * --spin-threads N: the instance computes on N threads with
 * COLIBRI_THREADS_SPIN (created before the armed window). Strict mode
 * binds the calling thread only, so then step 2 installs a seccomp filter on
 * every thread of the process (SECCOMP_FILTER_FLAG_TSYNC) that allows only
 * read, write, exit and sigreturn and kills the process (SIGSYS) on
 * anything else: a futex of a worker is caught too.
 * --canary-syscall shows the filter fires (SIGSYS).
 *
 * The canaries prove the test can fail: --canary-malloc mallocs inside the
 * armed window (counted: exit 1), --canary-syscall calls getpid() under
 * seccomp (killed by SIGKILL).
 * Prints "wrap: N calls, 0 intercepted" and "seccomp: N calls survived".
 */
#define _GNU_SOURCE /* syscall() */
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "colibri.h"

#define N_CALLS 1000

static volatile int armed;
static unsigned long hits;
static const char *first_hit;

#define COUNT(name)                    \
    do {                               \
        if (armed) {                   \
            if (!hits)                 \
                first_hit = name;      \
            hits++;                    \
        }                              \
    } while (0)

/* WRAPPED: malloc calloc realloc free aligned_alloc posix_memalign mmap
 * munmap open read write close fopen fread fwrite fclose clock_gettime */
void *__real_malloc(size_t);
void *__wrap_malloc(size_t n) { COUNT("malloc"); return __real_malloc(n); }
void *__real_calloc(size_t, size_t);
void *__wrap_calloc(size_t a, size_t b) { COUNT("calloc"); return __real_calloc(a, b); }
void *__real_realloc(void *, size_t);
void *__wrap_realloc(void *p, size_t n) { COUNT("realloc"); return __real_realloc(p, n); }
void __real_free(void *);
void __wrap_free(void *p) { COUNT("free"); __real_free(p); }
void *__real_aligned_alloc(size_t, size_t);
void *__wrap_aligned_alloc(size_t a, size_t n) { COUNT("aligned_alloc"); return __real_aligned_alloc(a, n); }
int __real_posix_memalign(void **, size_t, size_t);
int __wrap_posix_memalign(void **p, size_t a, size_t n) { COUNT("posix_memalign"); return __real_posix_memalign(p, a, n); }
void *__real_mmap(void *, size_t, int, int, int, off_t);
void *__wrap_mmap(void *a, size_t n, int p, int f, int fd, off_t o) { COUNT("mmap"); return __real_mmap(a, n, p, f, fd, o); }
int __real_munmap(void *, size_t);
int __wrap_munmap(void *a, size_t n) { COUNT("munmap"); return __real_munmap(a, n); }
int __real_open(const char *, int, ...);
int __wrap_open(const char *path, int flags, ...)
{
    COUNT("open");
    va_list ap;
    va_start(ap, flags);
    int mode = va_arg(ap, int);
    va_end(ap);
    return __real_open(path, flags, mode);
}
ssize_t __real_read(int, void *, size_t);
ssize_t __wrap_read(int fd, void *b, size_t n) { COUNT("read"); return __real_read(fd, b, n); }
ssize_t __real_write(int, const void *, size_t);
ssize_t __wrap_write(int fd, const void *b, size_t n) { COUNT("write"); return __real_write(fd, b, n); }
int __real_close(int);
int __wrap_close(int fd) { COUNT("close"); return __real_close(fd); }
FILE *__real_fopen(const char *, const char *);
FILE *__wrap_fopen(const char *p, const char *m) { COUNT("fopen"); return __real_fopen(p, m); }
size_t __real_fread(void *, size_t, size_t, FILE *);
size_t __wrap_fread(void *b, size_t s, size_t n, FILE *f) { COUNT("fread"); return __real_fread(b, s, n, f); }
size_t __real_fwrite(const void *, size_t, size_t, FILE *);
size_t __wrap_fwrite(const void *b, size_t s, size_t n, FILE *f) { COUNT("fwrite"); return __real_fwrite(b, s, n, f); }
int __real_fclose(FILE *);
int __wrap_fclose(FILE *f) { COUNT("fclose"); return __real_fclose(f); }
int __real_clock_gettime(clockid_t, struct timespec *);
int __wrap_clock_gettime(clockid_t c, struct timespec *t) { COUNT("clock_gettime"); return __real_clock_gettime(c, t); }

/* N_CALLS infer calls: batch-2 prompts with padding, decode steps, rewinds
 * and restarts, all sizes inside the model's limits. */
static int workload(colibri_model *m, const colibri_info *info, int32_t *ids,
                    uint8_t *mask, float *logits, int canary_malloc)
{
    uint32_t S = info->shape.max_seq_len, V = info->shape.vocab;
    uint32_t B = info->shape.max_batch < 2 ? info->shape.max_batch : 2;
    uint32_t P = S < 8 ? 1 : 8, n_past = 0;
    for (int call = 0; call < N_CALLS; call++) {
        int rc;
        if (n_past == 0 || n_past >= S) {
            for (uint32_t i = 0; i < B * P; i++) {
                ids[i] = (int32_t)((i * 7 + (uint32_t)call) % V);
                mask[i] = (uint8_t)(i % P != 0 || i < P); /* pad one slot */
            }
            rc = colibri_infer(m, ids, mask, B, P, 0, logits);
            n_past = P;
        } else if (call % 97 == 0) {
            rc = colibri_infer(m, ids, NULL, B, 1, n_past / 2, logits); /* rewind */
            n_past = n_past / 2 + 1;
        } else {
            for (uint32_t b = 0; b < B; b++)
                ids[b] = (int32_t)((b + (uint32_t)call) % V);
            rc = colibri_infer(m, ids, NULL, B, 1, n_past, logits);
            n_past++;
        }
        if (canary_malloc && call == N_CALLS / 2)
            __real_free(malloc(16)); /* counted: the canary */
        if (rc)
            return rc;
    }
    return 0;
}

static void say(const char *s)
{
    __real_write(1, s, strlen(s));
}

static void say_num(const char *a, unsigned long n, const char *b)
{
    char buf[32];
    int i = 31;
    buf[i] = '\0';
    do {
        buf[--i] = (char)('0' + n % 10);
        n /= 10;
    } while (n);
    say(a);
    say(buf + i);
    say(b);
}

/* Every thread of the process may call read, write, exit, exit_group and
 * rt_sigreturn only; anything else kills the process with SIGSYS. */
static int filter_all_threads(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_read, 5, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_write, 4, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_exit, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_exit_group, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_rt_sigreturn, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = { (unsigned short)(sizeof f / sizeof f[0]), f };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
        return -1;
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
                        SECCOMP_FILTER_FLAG_TSYNC, &prog);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_noalloc MODEL [--canary-malloc|--canary-syscall]\n");
        return 2;
    }
    int canary_malloc = 0, canary_syscall = 0;
    unsigned spin_threads = 1;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--canary-malloc"))
            canary_malloc = 1;
        else if (!strcmp(argv[i], "--canary-syscall"))
            canary_syscall = 1;
        else if (!strcmp(argv[i], "--spin-threads") && i + 1 < argc)
            spin_threads = (unsigned)atoi(argv[++i]);
    }
    colibri_model m;
    int rc = colibri_init(&m, argv[1]);
    if (rc) {
        printf("error %d %s\n", rc, colibri_error_detail(&m));
        return 10 - rc;
    }
    if (spin_threads > 1) {
        rc = colibri_set_threads(&m, spin_threads, COLIBRI_THREADS_SPIN);
        if (rc) {
            printf("error %d %s\n", rc, colibri_error_detail(&m));
            return 10 - rc;
        }
    }
    colibri_info info;
    colibri_get_info(&m, &info);
    printf("threads: %u%s\n", (unsigned)info.n_threads,
           info.thread_flags & COLIBRI_THREADS_SPIN ? " spin" : "");
    size_t cap = (size_t)info.shape.max_batch * info.shape.max_seq_len;
    int32_t *ids = (int32_t *)calloc(cap, sizeof *ids);
    uint8_t *mask = (uint8_t *)calloc(cap, 1);
    float *logits = (float *)calloc(cap * info.shape.vocab, sizeof(float));
    fflush(stdout);

    /* 1. Interposition counters. */
    armed = 1;
    rc = workload(&m, &info, ids, mask, logits, canary_malloc);
    armed = 0;
    if (rc) {
        printf("error %d %s\n", rc, colibri_error_detail(&m));
        return 10 - rc;
    }
    printf("wrap: %d calls, %lu intercepted%s%s\n", N_CALLS, hits,
           hits ? ", first: " : "", hits ? first_hit : "");
    fflush(stdout);
    if (hits)
        return 1;

    /* 2. seccomp strict mode: from here on only read/write/_exit work
     * (threads: the same list as a filter on every thread). */
    if (spin_threads > 1 ? filter_all_threads() != 0
                         : prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT) != 0) {
        printf("seccomp: unavailable\n");
        return 3;
    }
    /* exit ends the calling thread only: with spinning workers the process
     * ends by exit_group (which strict mode does not allow). */
    long exit_nr = spin_threads > 1 ? SYS_exit_group : SYS_exit;
    armed = 1;
    if (canary_syscall)
        (void)syscall(SYS_getpid); /* SIGKILL */
    rc = workload(&m, &info, ids, mask, logits, 0);
    armed = 0;
    if (rc) {
        say_num("seccomp: error ", (unsigned long)-rc, "\n");
        syscall(exit_nr, 1);
    }
    say_num("seccomp: ", N_CALLS, " calls survived, ");
    say_num("", hits, " intercepted\n");
    syscall(exit_nr, hits ? 1 : 0);
    return 0;
}
