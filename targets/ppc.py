"""32-bit big-endian PowerPC Linux: reference kernels only, no mmap, static
work buffer, the model embedded in big-endian order so it is used in place.
Runs under qemu-ppc (about 65x slower than native: keep models tiny)."""
from . import Target

TARGET = Target(
    name="ppc",
    description="PowerPC 32-bit big-endian Linux, ref kernels, under qemu-ppc",
    os="linux",
    prefix="powerpc-linux-gnu-",
    package="gcc-powerpc-linux-gnu",
    arch_flags=("-m32", "-mcpu=powerpc", "-mbig-endian"),
    byte_order="big",
    pointer_bytes=4,
    kernels=(),
    defaults=dict(mmap=False, workbuf="static", avx2=False, fma=False, neon=False),
    # The 7400 (G4) is a plain 32-bit core with an FPU; pinning it keeps the
    # emulated instruction set fixed across QEMU versions.
    emulator=("qemu-ppc", "-cpu", "7400", "-L", "/usr/powerpc-linux-gnu"),
    emulator_package="qemu-user",
    cpu_kernels={"7400": "ref"},
    ram_bytes=32 << 20,
    flash_bytes=8 << 20,
    # The tokenizer's NFC tables (32 KiB) stay out of the firmware library's
    # budget: an NFC tokenizer is COLIBRI_E_UNSUPPORTED in this build (the host
    # library colibri.buildsteps.cbuild makes, and libcolibri.so, have them).
    defines=("COLIBRI_NO_TOK_NORM",),
    budgets=dict(
        # libcolibri.a text+rodata+data (`scons size`): 162.3 KiB with the
        # streamed experts (and the REUSE policy), Unigram and the normaliser programs (156.5
        # before those; 135.7 KiB since the tokenizer's Unicode 16
        # General_Category table and the flash-schedule attention; 128 KiB
        # before); 165.1 with the Precompiled normaliser (FORMAT.md 7.5):
        # 168 KiB kept 2.9; 167.0 with the Q5_0 and Q5_K reference blocks
        # and the tied LM head, so 176 KiB; 168.7 with the slot cache's FIFO
        # of reads in flight; 170.6 with the streamed reader's page-cache
        # mapping and its checks on the reader thread.
        runtime=176 << 10,
        firmware_flash=4 << 20,   # static executable incl. libc and the model (demo: 2 MiB)
        firmware_ram=8 << 20,
        image=4 << 20,
    ),
    link_flags=("-static",),
    # qemu-ppc 7.2 rejects glibc's mffscrni (used by double sin/cos): see the file.
    program_sources=("firmware/ppc/mffscrn_shim.c",),
    run_timeout=240.0,
)
