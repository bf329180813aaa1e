"""The optimised C kernels (src/kernels/avx2.c, neon.c) against the reference
kernels (src/kernels/ref.c), through the standalone C program
tests/c/test_kernels.c, which compares every kernel on many odd and even
shapes (see its header for what "agree" means for each kernel).

- x86-64: built with the default flags (avx2.c uses target attributes and
  picks at run time), once plain with gcc and clang, once with
  AddressSanitizer + UBSan so any read past an input or write past an output
  fails, and (on an AVX-VNNI CPU) once without the vpdpbusd form. Skipped on
  a CPU without AVX2+FMA.
- ARMv7: built with arm-linux-gnueabihf-gcc for a Cortex-A9 with NEON and run
  under qemu-arm. Skipped if the cross compiler or qemu-arm is missing.
"""
from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KDIR = ROOT / "src" / "kernels"
SOURCES = [ROOT / "tests" / "c" / "test_kernels.c", KDIR / "ref.c", KDIR / "avx2.c", KDIR / "neon.c"]
# The library's flags (targets/__init__.py COMMON_CFLAGS), warnings as errors.
WARN = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-Wpedantic", "-ffp-contract=off"]
ARM_SYSROOT = "/usr/arm-linux-gnueabihf"


def _cpu_has_avx2_fma() -> bool:
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    words = set(flags.split())
    return "avx2" in words and "fma" in words


def _build(cc: str, out: Path, extra: list[str]) -> None:
    cmd = [cc, *WARN, *extra, f"-I{KDIR}", *map(str, SOURCES), "-lm", "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"build failed: {' '.join(cmd)}\n{res.stderr}"


def _run(cmd: list[str], timeout: int = 300) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, (
        f"{' '.join(cmd)} exited {res.returncode}\n{res.stdout}\n{res.stderr}")
    assert "all kernels agree with ref" in res.stdout, res.stdout
    return res.stdout


def _cpu_has_avx_vnni() -> bool:
    try:
        return "avx_vnni" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


# "no-vnni": on a CPU with AVX-VNNI the table uses vpdpbusd for the int8 dot
# products; COLIBRI_AVX2_NO_VNNI checks the plain AVX2 form as well.
@pytest.mark.parametrize("variant", ["gcc", "clang", "gcc-asan-ubsan", "gcc-no-vnni"])
def test_avx2_matches_ref(tmp_path: Path, variant: str) -> None:
    if not _cpu_has_avx2_fma():
        pytest.skip("this CPU has no AVX2+FMA: the avx2 table cannot run here")
    cc = "clang" if variant == "clang" else "gcc"
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} is not installed")
    extra = ["-DCOLIBRI_USE_AVX2"]
    if variant.endswith("no-vnni"):
        if not _cpu_has_avx_vnni():
            pytest.skip("no AVX-VNNI on this CPU: the plain AVX2 form is what the other variants test")
        extra.append("-DCOLIBRI_AVX2_NO_VNNI")
    if variant.endswith("asan-ubsan"):
        # -O1: the always-inlined register blocks make an -O2 sanitizer build
        # slow to compile, and -O1 keeps every load and store checked.
        extra += ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
    exe = tmp_path / "test_kernels"
    _build(cc, exe, extra)
    out = _run([str(exe), "--require", "avx2"])
    assert "avx2" in out and " 0 failures" in out


def test_neon_matches_ref_under_qemu(tmp_path: Path) -> None:
    cc = "arm-linux-gnueabihf-gcc"
    for tool in (cc, "qemu-arm"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed: cannot build or run the ARMv7 NEON kernels")
    exe = tmp_path / "test_kernels_armv7"
    _build(cc, exe, ["-march=armv7-a", "-mfpu=neon", "-mfloat-abi=hard", "-DCOLIBRI_USE_NEON"])
    out = _run(["qemu-arm", "-cpu", "cortex-a9", "-L", ARM_SYSROOT, str(exe), "--require", "neon"])
    assert "neon" in out and " 0 failures" in out


def test_getters_return_null_when_not_built_in(tmp_path: Path) -> None:
    """Without COLIBRI_USE_AVX2 / COLIBRI_USE_NEON both files still link and
    their getters return NULL, so the runtime falls back to ref."""
    exe = tmp_path / "test_kernels_plain"
    _build("gcc", exe, [])
    res = subprocess.run([str(exe), "--require", "avx2"], capture_output=True, text=True)
    assert res.returncode == 1 and "not available" in res.stderr
    res = subprocess.run([str(exe)], capture_output=True, text=True)
    assert res.returncode == 0 and "no optimised kernel table" in res.stdout
