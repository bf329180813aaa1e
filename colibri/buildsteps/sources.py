"""The canonical lists of C sources, relative to the repository root.

SConstruct and any other build script (colibri/cbuild.py) take their lists
from here so a new source file is added in exactly one place.
"""
from __future__ import annotations

# The runtime library (libcolibri.a), always built. ref.c is the portable
# truth every target carries.
LIBRARY = (
    "src/core.c",
    "src/crc32.c",
    "src/tensor.c",
    "src/moe.c",
    "src/kernels/ref.c",
)

# Optional SIMD kernels: name -> (source, extra compiler flags for that file
# only, define that enables them in the library). avx2.c needs no -mavx2: its
# functions carry target("avx2,fma") attributes and the library picks them at
# run time, so the same binary still runs (ref kernels) on CPUs without AVX2.
KERNELS = {
    "avx2": ("src/kernels/avx2.c", (), "COLIBRI_USE_AVX2"),
    "neon": ("src/kernels/neon.c", (), "COLIBRI_USE_NEON"),
}

INCLUDE_DIRS = ("src/include", "src", "src/kernels")

CLI = ("src/cli/colibri-cli.c",)

# The firmware application, the same for every target; the platform layer
# differs (Linux system calls or bare-metal semihosting, see targets/).
# model_check.c verifies the embedded model at boot, before the runtime
# touches it (docs/IMAGE.md section 8).
FIRMWARE_APP = ("firmware/app/main.c", "firmware/model_check.c")
FIRMWARE_LINUX = ("firmware/linux/platform.c",)
FIRMWARE_INCLUDE_DIRS = ("firmware",)
