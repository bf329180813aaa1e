"""64-bit ARM Linux (ARMv8-A: Raspberry Pi 4/5, RK3588 boards, Jetson), NEON
kernels built for A64, mmap on, dynamic work buffer. Runs under
qemu-aarch64 with a pinned Cortex-A72 (the Pi 4's core: NEON without the
dot-product extension).

The library is compiled for plain ARMv8-A, so the same binary runs on every
64-bit ARM core. On cores with the dot-product extension (ARMv8.2-A
FEAT_DotProd: Cortex-A55/A76 and later, Neoverse N1) colibri_kernels_neon()
picks the "neon-dotprod" table at init, from the Linux hardware capabilities
(getauxval(AT_HWCAP) & HWCAP_ASIMDDP): its int8 matmul uses SDOT, the rest is
the "neon" table. `cpu_kernels` lists the CPUs the tests run each program
under and the table the runtime must report on each (colibri-cli --info,
the firmware's `kernels` line)."""
from . import Target

TARGET = Target(
    name="aarch64",
    description="AArch64 Linux (Cortex-A72 class), NEON kernels (+SDOT at run time), "
                "under qemu-aarch64",
    os="linux",
    prefix="aarch64-linux-gnu-",
    package="gcc-aarch64-linux-gnu libc6-dev-arm64-cross",
    arch_flags=("-march=armv8-a",),
    byte_order="little",
    pointer_bytes=8,
    kernels=("neon",),
    defaults=dict(mmap=True, workbuf="dynamic", avx2=False, fma=False, neon=True),
    emulator=("qemu-aarch64", "-cpu", "cortex-a72", "-L", "/usr/aarch64-linux-gnu"),
    emulator_package="qemu-user",
    # Cortex-A72 (Pi 4) has no dot-product instructions; Cortex-A76 (Pi 5,
    # RK3588) has them.
    cpu_kernels={"cortex-a72": "neon", "cortex-a76": "neon-dotprod"},
    ram_bytes=64 << 20,
    flash_bytes=16 << 20,
    # The tokenizer's NFC tables (32 KiB) stay out of the firmware library's
    # budget: an NFC tokenizer is COLIBRI_E_UNSUPPORTED in this build (the host
    # library colibri.buildsteps.cbuild makes, and libcolibri.so, have them).
    defines=("COLIBRI_NO_TOK_NORM",),
    budgets=dict(
        # libcolibri.a text+rodata+data (`scons size`): 166.1 KiB with the
        # streamed experts and their reader thread, Unigram, the NFKC map's
        # checks and the normaliser programs (142.5 KiB
        # since the tokenizer's Unicode 16 General_Category table and the
        # flash-schedule attention; 128 KiB before); 168.3 with the
        # Precompiled normaliser of T5 / Switch files (FORMAT.md 7.5, +2.2):
        # 176 KiB kept 7.7 (an AArch64 board has megabytes for code; the
        # budget is there to catch a jump, as the NEON kernels' 20 KiB was).
        # 180.2 with the Q5_0 and Q5_K blocks (FORMAT.md 4: Q5_0 in both
        # NEON tables, Q5_K one form shared by both), so 188 KiB; 183.2 with
        # the prefetch of streamed experts; 184.5 with the streamed
        # reader's page-cache probe (docs/STREAMING.md); 187.9 with its
        # mapping of a warm file (the resident part and cached experts
        # used from the page cache) and the CRC and float check in one
        # pass, so 192; 189.4 with checks on the reader thread and the
        # resident part checked in two halves at init; 190.3 with the blocks'
        # fp16 scales (FORMAT.md 4: fcvt on AArch64); 200.5 with the
        # attention in NEON (neon_attend.c, both tables: its tile widths 1,
        # 2 and 4 inlined, +10.1 KiB), so 204; 200.8 with the SiLU in
        # NEON (silu_mul); 201.4 with the row passes in parallel
        # (tensor.c clb_parallel_rows); 201.7 with the SiLU's exp unfused;
        # 201.8 with the experts' combine and the residuals as row passes;
        # 201.9 with the tiles taken in runs; 206.8 with Q8_0 (llama.cpp's
        # 8.5-bit block, a form with and one without SDOT), so 208.
        runtime=208 << 10,
        firmware_flash=4 << 20,   # static executable incl. libc and the model (demo: 2.82 MiB)
        firmware_ram=8 << 20,
        image=4 << 20,
    ),
    link_flags=("-static",),
    run_timeout=120.0,
)
