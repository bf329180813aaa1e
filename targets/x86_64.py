"""x86-64 Linux, the host: AVX2+FMA kernels with the reference fallback chosen
at run time, mmap on, dynamic work buffer. Runs natively."""
from . import Target

TARGET = Target(
    name="x86_64",
    description="x86-64 Linux (host gcc), AVX2+FMA kernels, runs natively",
    os="linux",
    prefix="",
    package="gcc",
    arch_flags=("-m64",),
    byte_order="little",
    pointer_bytes=8,
    kernels=("avx2",),
    defaults=dict(mmap=True, workbuf="dynamic", avx2=True, fma=True, neon=False),
    # Native. qemu-x86_64 -cpu Haswell (package qemu-user) also runs the same
    # binaries; the matrix uses native runs because they are 30x faster.
    emulator=(),
    emulator_package="",
    ram_bytes=64 << 20,
    flash_bytes=16 << 20,
    budgets=dict(
        runtime=160 << 10,        # libcolibri.a text+rodata+data
        firmware_flash=4 << 20,   # static executable incl. libc and the model (demo: 2 MiB)
        firmware_ram=16 << 20,    # data+bss (arena included)
        image=4 << 20,            # packed firmware.bin against the slot
    ),
    link_flags=("-static",),
    run_timeout=60.0,
)
