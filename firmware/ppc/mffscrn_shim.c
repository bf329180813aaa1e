/*
 * mffscrn_shim.c - lets 32-bit PowerPC programs that use glibc's double
 * sin/cos run under qemu-ppc (linked into every ppc executable: colibri-cli
 * and the firmware; see targets/ppc.py).
 *
 * Why: Debian's powerpc glibc saves and sets the rounding mode inside sin,
 * cos and sincos with `mffscrni`/`mffscrn` (Power ISA 3.0). On older cores
 * these encodings are mffs with reserved bits set and execute as mffs, which
 * glibc relies on; QEMU 7.2's qemu-ppc instead raises SIGILL for them on
 * every 32-bit CPU model it offers. The runtime computes its RoPE table with
 * double cos/sin (src/plan.c), so without this shim every ppc run under
 * QEMU dies in colibri_init.
 *
 * What: a SIGILL handler installed before main. For exactly these two
 * encodings it performs the ISA 3.0 semantics on the saved context
 * (FRT <- FPSCR, then FPSCR[RN] <- the new rounding mode) and resumes after
 * the instruction; for any other illegal instruction it restores the
 * default action and returns, so the program dies with SIGILL as before.
 * On hardware (or a QEMU that accepts the encodings) it never runs.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>

#define PT_NIP 32 /* gregs index of the program counter */

static void on_sigill(int sig, siginfo_t *info, void *ctx) {
    (void)info;
    ucontext_t *uc = (ucontext_t *)ctx;
    mcontext_t *mc = uc->uc_mcontext.uc_regs;
    uint32_t insn = *(const uint32_t *)(uintptr_t)mc->gregs[PT_NIP];
    uint32_t primary = insn >> 26, xo = (insn >> 1) & 0x3FFu, sel = (insn >> 16) & 31u;
    if (primary != 63 || xo != 583 || (sel != 22 && sel != 23)) {
        signal(sig, SIG_DFL); /* not ours: re-executes and dies as it should */
        return;
    }
    uint32_t frt = (insn >> 21) & 31u;
    uint64_t fpscr_bits;
    memcpy(&fpscr_bits, &mc->fpregs.fpscr, sizeof fpscr_bits);
    uint32_t fpscr = (uint32_t)fpscr_bits;
    uint32_t rn;
    if (sel == 23) { /* mffscrni FRT,RM: RM in bits 19-20 */
        rn = (insn >> 11) & 3u;
    } else {         /* mffscrn FRT,FRB: RN from FRB's low bits */
        uint64_t frb_bits;
        memcpy(&frb_bits, &mc->fpregs.fpregs[(insn >> 11) & 31u], sizeof frb_bits);
        rn = (uint32_t)frb_bits & 3u;
    }
    uint64_t out = (uint64_t)0xFFF80000u << 32 | fpscr; /* as mffs writes it */
    memcpy(&mc->fpregs.fpregs[frt], &out, sizeof out);
    fpscr_bits = (fpscr_bits & ~(uint64_t)3u) | rn;
    memcpy(&mc->fpregs.fpscr, &fpscr_bits, sizeof fpscr_bits);
    mc->gregs[PT_NIP] += 4;
}

__attribute__((constructor)) static void install_mffscrn_shim(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigill;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGILL, &sa, NULL);
}
