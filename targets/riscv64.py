"""64-bit RISC-V Linux (RV64GC, lp64d), reference kernels, mmap on, dynamic
work buffer. Runs under qemu-riscv64 with a pinned SiFive U54 (RV64GC).

Why no vector (RVV) kernels: Debian 12's gcc-riscv64-linux-gnu is GCC 12.2,
which has no <riscv_vector.h> (the RVV intrinsics arrived in GCC 13, RVV
auto-vectorisation in GCC 14): `-march=rv64gcv` is accepted and binutils
2.40 assembles RVV 1.0, but C code cannot reach the vector unit except
through hand-written assembly. Debian 12's clang 14 does ship
<riscv_vector.h>, but with the pre-ratification (v0.10) names that the
ratified intrinsics renamed (`vle32_v_f32m1` became `__riscv_vle32_v_f32m1`),
so kernels written for it would not build with any current compiler. The
reference kernels are what every RV64GC board runs today (most boards sold
before 2024 have no RVV 1.0 unit anyway); RVV kernels belong in a later
toolchain (Debian 13: GCC 14)."""
from . import Target

TARGET = Target(
    name="riscv64",
    description="RISC-V 64 (RV64GC) Linux, ref kernels, under qemu-riscv64",
    os="linux",
    prefix="riscv64-linux-gnu-",
    package="gcc-riscv64-linux-gnu libc6-dev-riscv64-cross",
    arch_flags=("-march=rv64gc", "-mabi=lp64d"),
    byte_order="little",
    pointer_bytes=8,
    kernels=(),
    defaults=dict(mmap=True, workbuf="dynamic", avx2=False, fma=False, neon=False),
    # The U54 (HiFive Unleashed) is a plain RV64GC core: pinning it keeps the
    # emulated instruction set fixed when QEMU's generic "rv64" CPU gains
    # extensions.
    emulator=("qemu-riscv64", "-cpu", "sifive-u54", "-L", "/usr/riscv64-linux-gnu"),
    emulator_package="qemu-user",
    cpu_kernels={"sifive-u54": "ref"},
    ram_bytes=64 << 20,
    flash_bytes=16 << 20,
    # The tokenizer's NFC tables (32 KiB) stay out of the firmware library's
    # budget: an NFC tokenizer is COLIBRI_E_UNSUPPORTED in this build (the host
    # library colibri.buildsteps.cbuild makes, and libcolibri.so, have them).
    defines=("COLIBRI_NO_TOK_NORM",),
    budgets=dict(
        # libcolibri.a: text+rodata+data (`scons target=riscv64 size`): 127.3
        # KiB with the streamed reader's page-cache mapping, then 128.9 with
        # its checks on the reader thread and the resident part checked in
        # two halves at init (a warm first token of the 7B q4 model 0.35 ->
        # 0.20 s on x86_64; docs/STREAMING.md), so 132 KiB.
        runtime=132 << 10,
        firmware_flash=4 << 20,   # static executable incl. libc and the model (demo: 2.46 MiB)
        firmware_ram=8 << 20,
        image=4 << 20,
    ),
    link_flags=("-static",),
    run_timeout=240.0,
)
