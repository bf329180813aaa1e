"""The canonical lists of C sources, relative to the repository root.

SConstruct and any other build script (colibri/buildsteps/cbuild.py) take their lists
from here so a new source file is added in exactly one place.
"""
from __future__ import annotations

from typing import NamedTuple

# The runtime library (libcolibri.a), always built. ref.c is the portable
# truth every target carries.
LIBRARY = (
    "src/format.c",    # what makes a file valid (FORMAT.md 2-4), colibri_verify
    "src/load.c",      # instance lifecycle: mmap/read/swap, arena, free
    "src/plan.c",      # arena layout, weight views, RoPE tables, kernel pick
    "src/forward.c",   # colibri_infer: argument checks, the layer loop
    "src/tensor.c",    # embedding, RMSNorm, linear, RoPE, attention
    "src/moe.c",       # router, top-k, experts
    "src/stream.c",    # experts from storage: resident image, slots, policy
    "src/encdec.c",    # encoder-decoder (ENC_DEC): colibri_encode, decoder steps
    "src/info.c",      # strerror, get_info, router weights, build flags
    "src/detail.c",    # the error-detail formatter
    "src/crc32.c",
    "src/tokenizer.c", # text <-> ids (-DCOLIBRI_NO_TOKENIZER leaves stubs)
    "src/sample.c",    # next-token choice: greedy or seeded sampling
    "src/threads.c",   # the worker team of parallel regions (COLIBRI_THREADS)
    "src/kernels/ref.c",
)



class KernelSet(NamedTuple):
    """An optional SIMD kernel set: its sources, extra compiler flags for
    those files only, and the define that enables it in the library."""
    sources: tuple[str, ...]
    flags: tuple[str, ...]
    define: str


# Optional SIMD kernels, name -> KernelSet. No set needs flags of its own:
# avx2.c's functions carry target("avx2,fma") attributes and the library
# picks them at run time, so the same binary still runs (ref kernels) on CPUs
# without AVX2; neon_dotprod.c (AArch64 SDOT, picked at run time too)
# switches its own architecture with a pragma, and compiles to nothing on
# ARMv7, as neon_attend.c (the A64 attention) does. neon.c needs NEON enabled by the target's arch flags on ARMv7
# (targets/armv7.py: -mfpu=neon); every AArch64 core has it.
KERNELS = {
    "avx2": KernelSet(("src/kernels/avx2.c", "src/kernels/avx512.c"), (), "COLIBRI_USE_AVX2"),
    "neon": KernelSet(("src/kernels/neon.c", "src/kernels/neon_dotprod.c",
                       "src/kernels/neon_attend.c"), (), "COLIBRI_USE_NEON"),
}

INCLUDE_DIRS = ("src/include", "src", "src/kernels")

# Linked into the shared library (libcolibri.so) only, on top of LIBRARY and
# the kernels: the struct sizes and API version a binding that cannot read
# colibri.h (colibri.runtime, through ctypes) needs. Not in libcolibri.a, so
# the static library and its size report are unchanged.
SHARED_ONLY = ("src/shared_abi.c",)

CLI = ("src/cli/colibri-cli.c",)

# The firmware application, the same for every target; the platform layer
# differs (Linux system calls or bare-metal semihosting, see targets/).
# model_check.c verifies the embedded model at boot, before the runtime
# touches it (docs/IMAGE.md section 8).
FIRMWARE_APP = ("firmware/app/main.c", "firmware/model_check.c")
FIRMWARE_LINUX = ("firmware/linux/platform.c",)
FIRMWARE_INCLUDE_DIRS = ("firmware",)
