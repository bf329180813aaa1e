"""The optimised C kernels (src/kernels/avx2.c, avx512.c, neon.c, neon_dotprod.c,
neon_attend.c)
against the reference kernels (src/kernels/ref.c), through the standalone C
program tests/c/test_kernels.c, which compares every kernel on many odd and
even shapes (see its header for what "agree" means for each kernel).

- x86-64: built with the default flags (avx2.c uses target attributes and
  picks at run time), once plain with gcc and clang, once with
  AddressSanitizer + UBSan so any read past an input or write past an output
  fails: these require the table this CPU gets ("avx2-vnni" with AVX-VNNI or
  AVX512-VNNI, else "avx2"). Once more with COLIBRI_AVX2_NO_VNNI (scons
  vnni=0), requiring the plain "avx2" table, so its form is tested on a VNNI
  CPU too. Both x86 tables promise a matmul_i8 bit-identical to ref and are
  held to it, and to giving the same bits when the call is split into token
  x row tiles (what threads do). Skipped on a CPU without AVX2+FMA.
- The "avx512-vnni" table also runs emulated on any AVX2 CPU (SIMDe's
  portable AVX-512 intrinsics, tests/c/avx512_emulation), held to ref the
  same way; natively where the CPU has AVX-512 VNNI.
- NEON, for every target of targets/ with NEON kernels (armv7, aarch64):
  built with the target's cross compiler and flags, run under its emulator
  on every CPU of its cpu_kernels, requiring the table the runtime must pick
  there: on AArch64 "neon" on a Cortex-A72 (no dot-product extension) and
  "neon-dotprod" (SDOT) on a Cortex-A76. The AArch64 tables are also held to
  their promise of a matmul_i8 bit-identical to ref (kernels.h). Skipped if
  the cross compiler or emulator is missing.
"""
from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import targets  # noqa: E402
from colibri.buildsteps import sources  # noqa: E402

KDIR = ROOT / "src" / "kernels"
SOURCES = [ROOT / "tests" / "c" / "test_kernels.c", KDIR / "ref.c",
           *(ROOT / src for k in sources.KERNELS.values() for src in k.sources)]
# The library's flags (targets/__init__.py COMMON_CFLAGS), warnings as errors.
WARN = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-Wpedantic", "-ffp-contract=off"]

# (target, emulated CPU, kernel table the runtime must pick there) for every
# target with NEON kernels and every CPU it lists.
NEON_RUNS = [(name, cpu, table) for name, t in targets.load_all().items()
             if "neon" in t.kernels for cpu, table in t.cpu_kernels.items()]
# Targets whose NEON tables promise a matmul_i8 bit-identical to ref's
# (kernels.h: the A64 forms keep ref's float order; ARMv7's does not).
I8_BIT_EXACT = {"aarch64"}


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
    cmd = [cc, *WARN, *extra, f"-I{KDIR}", f"-I{ROOT / 'src' / 'include'}",
           *map(str, SOURCES), "-lm", "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"build failed: {' '.join(cmd)}\n{res.stderr}"


def _run(cmd: list[str], timeout: int = 300) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, (
        f"{' '.join(cmd)} exited {res.returncode}\n{res.stdout}\n{res.stderr}")
    assert "all kernels agree with ref" in res.stdout, res.stdout
    return res.stdout


def _cpu_has_avx512_vnni() -> bool:
    """AVX-512 F/BW/VL/DQ + AVX512-VNNI: where avx512.c's "avx512-vnni" runs."""
    try:
        words = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= words


def _cpu_has_vnni() -> bool:
    """AVX-VNNI, or AVX512-VNNI with AVX512VL: where avx2.c picks "avx2-vnni"."""
    try:
        words = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return "avx_vnni" in words or {"avx512_vnni", "avx512vl"} <= words


_GCC_EXE: list = []


def _gcc_exe(tmp_path_factory) -> Path:
    """test_kernels built once with gcc and the x86 kernels (shared by the
    gcc variant and the AVX-512 test: one build, ~40 s of compiling)."""
    if not _GCC_EXE:
        exe = tmp_path_factory.mktemp("x86") / "test_kernels"
        _build("gcc", exe, ["-DCOLIBRI_USE_AVX2"])
        _GCC_EXE.append(exe)
    return _GCC_EXE[0]


# "no-vnni": COLIBRI_AVX2_NO_VNNI (scons vnni=0) keeps the plain AVX2 table,
# as an AVX2-only CPU runs it, even on a VNNI CPU.
@pytest.mark.parametrize("variant", ["gcc", "clang", "gcc-asan-ubsan", "gcc-no-vnni"])
def test_avx2_matches_ref(tmp_path: Path, tmp_path_factory, variant: str) -> None:
    if not _cpu_has_avx2_fma():
        pytest.skip("this CPU has no AVX2+FMA: the avx2 table cannot run here")
    cc = "clang" if variant == "clang" else "gcc"
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} is not installed")
    extra = ["-DCOLIBRI_USE_AVX2"]
    table = "avx2-vnni" if _cpu_has_vnni() else "avx2"
    if variant.endswith("no-vnni"):
        extra.append("-DCOLIBRI_AVX2_NO_VNNI")
        table = "avx2"
    if variant.endswith("asan-ubsan"):
        # -O1: the always-inlined register blocks make an -O2 sanitizer build
        # slow to compile, and -O1 keeps every load and store checked.
        extra += ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
    if variant == "gcc":
        exe = _gcc_exe(tmp_path_factory)
    else:
        exe = tmp_path / "test_kernels"
        _build(cc, exe, extra)
    args = ["--require", table, "--exact-i8", table]
    # the plain AVX2 form is checked too wherever a VNNI form is picked
    if table != "avx2":
        args += ["--exact-i8", "avx2"]
    out = _run([str(exe), *args])
    assert f"{table} " in out and " 0 failures" in out
    assert "bit-identical to ref" in out
    # avx512.c's table runs alongside (not with vnni=0: the AVX2-only stand-in)
    assert ("avx512-vnni " in out) == (_cpu_has_avx512_vnni() and table != "avx2")


def test_avx512_matches_ref(tmp_path_factory) -> None:
    """The "avx512-vnni" table (src/kernels/avx512.c) held to ref bit for bit
    on matmul_i8, the block kernels and attend, and its absence reported
    where the CPU lacks AVX-512 VNNI."""
    if not _cpu_has_avx2_fma():
        pytest.skip("this CPU has no AVX2+FMA: no x86 kernel table can run here")
    exe = _gcc_exe(tmp_path_factory)
    if not _cpu_has_avx512_vnni():
        res = subprocess.run([str(exe), "--require", "avx512-vnni"], capture_output=True,
                             text=True)
        assert res.returncode == 1 and "not available" in res.stderr
        pytest.skip("this CPU has no AVX-512 F/BW/VL/DQ + VNNI: avx512-vnni not picked "
                    "(its absence checked)")
    out = _run([str(exe), "--require", "avx512-vnni", "--exact-i8", "avx512-vnni"])
    assert "avx512-vnni " in out and " 0 failures" in out


EMULATION = ROOT / "tests" / "c" / "avx512_emulation"


def _simde_missing() -> str | None:
    """Why the emulated AVX-512 build cannot be made here, or None."""
    if shutil.which("gcc") is None:
        return "gcc is not installed"
    probe = subprocess.run(["gcc", "-E", "-x", "c", "-"], input="#include <simde/x86/avx512.h>\n",
                           capture_output=True, text=True)
    if probe.returncode:
        return "SIMDe's headers are missing (Debian libsimde-dev; scripts/setup.sh installs it)"
    return None


def test_avx512_matches_ref_emulated(tmp_path: Path) -> None:
    """The "avx512-vnni" table held to ref bit for bit on any AVX2 CPU: its
    AVX-512 intrinsics emulated by SIMDe (tests/c/avx512_emulation says how),
    so a change to avx512.c is checked where no AVX-512 CPU is at hand;
    with it avx2.c's EVEX-VNNI form and the plain AVX2 one, all under the
    sanitizers.
    The emulation found q6k_row reading a cast's undefined upper half."""
    if not _cpu_has_avx2_fma():
        pytest.skip("this CPU has no AVX2+FMA: the emulation runs on AVX2")
    why = _simde_missing()
    if why:
        pytest.skip(why)
    exe = tmp_path / "test_kernels_avx512_emulated"
    # Under ASan + UBSan as well, so a read past an input or a write past an
    # output fails here as on an AVX-512 CPU's sanitized run; as plain
    # functions and loops (COLIBRI_KERNELS_PLAIN, the library's sanitizer
    # builds): SIMDe's lane loops inlined and unrolled are a 200 s compile
    # sanitized (55 s not), 25 s as plain functions. The bits do not depend
    # on it (-ffp-contract=off).
    _build("gcc", exe, ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                        "-DCOLIBRI_KERNELS_PLAIN", "-mavx2", "-mfma", "-mf16c", "-Wno-psabi",
                        "-DCOLIBRI_USE_AVX2", "-DCOLIBRI_AVX512_EMULATED",
                        "-isystem", str(EMULATION)])
    # avx2.c's EVEX-VNNI table (what avx512-vnni forwards to) runs as
    # "avx2-vnni" too, emulated: an AVX2-only CPU never picks it otherwise
    out = _run([str(exe), *[a for t in ("avx512-vnni", "avx2-vnni", "avx2")
                            for a in ("--exact-i8", t)]])
    for table in ("avx512-vnni", "avx2-vnni", "avx2"):
        line = [ln for ln in out.splitlines() if ln.startswith(table + " ")]
        assert line and " 0 failures (matmul_i8 bit-identical to ref)" in line[0], out[-2000:]


@pytest.fixture(scope="module")
def neon_exe(tmp_path_factory):
    """target name -> test_kernels built for it with NEON (built once)."""
    built = {}

    def get(t):
        if t.name not in built:
            for tool in (t.tool("gcc"), t.emulator[0]):
                if shutil.which(tool) is None:
                    pytest.skip(f"{tool} is not installed: cannot build or run {t.name}'s "
                                "NEON kernels")
            exe = tmp_path_factory.mktemp("neon") / f"test_kernels_{t.name}"
            _build(t.tool("gcc"), exe, [*t.arch_flags, *t.link_flags, "-DCOLIBRI_USE_NEON"])
            built[t.name] = exe
        return built[t.name]
    return get


@pytest.mark.parametrize("name, cpu, table", NEON_RUNS,
                         ids=[f"{n}-{c}" for n, c, _ in NEON_RUNS])
def test_neon_matches_ref_under_qemu(neon_exe, name: str, cpu: str, table: str) -> None:
    t = targets.get(name).on_cpu(cpu)
    args = ["--require", table]
    if name in I8_BIT_EXACT:
        args += ["--exact-i8", table]
    out = _run(t.emulator_command(str(neon_exe(t)), tuple(args)))
    assert f"{table} " in out and " 0 failures" in out
    assert ("bit-identical to ref" in out) == (name in I8_BIT_EXACT)



def test_getters_return_null_when_not_built_in(tmp_path: Path) -> None:
    """Without COLIBRI_USE_AVX2 / COLIBRI_USE_NEON both files still link and
    their getters return NULL, so the runtime falls back to ref."""
    exe = tmp_path / "test_kernels_plain"
    _build("gcc", exe, [])
    res = subprocess.run([str(exe), "--require", "avx2"], capture_output=True, text=True)
    assert res.returncode == 1 and "not available" in res.stderr
    res = subprocess.run([str(exe)], capture_output=True, text=True)
    assert res.returncode == 0 and "no optimised kernel table" in res.stdout


# Where the decode tiles' prefetches must be in the object code. avx512.c's
# tiles request their streams inline: each must hold a prefetch instruction.
# avx2.c's Q6_K decode tile (in its three forms) calls an out-of-line
# helper (kernels.h CLB_PREFETCH_HELPER): at least that many calls.
PREFETCH_INLINE = {"avx512.c": ("q40_tile", "q80_tile", "q4k_tile", "q5k_tile", "q6k_tile")}
PREFETCH_CALLS = {"avx2.c": ("prefetch_lines", 3)}


def _functions(dis: str) -> dict:
    """objdump -d text -> {function: its instruction lines}."""
    out, name = {}, None
    for line in dis.splitlines():
        m = re.match(r"^[0-9a-f]+ <([^>]+)>:$", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name and line.strip():
            out[name].append(line)
    return out


@pytest.mark.parametrize("cc", ["gcc", "clang"])
@pytest.mark.parametrize("source", sorted({*PREFETCH_INLINE, *PREFETCH_CALLS}))
def test_decode_tiles_keep_their_prefetches(tmp_path: Path, cc: str, source: str) -> None:
    """A function that only prefetches has no side effect to GCC, which
    deletes the calls to it unless told not to (noipa); a compiler may drop
    an inline request too. The tiles then request nothing, with every
    result still exact, so only the object code shows it
    (bench/results/FINDINGS.md 33)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the x86 kernels build only for x86-64")
    for tool in (cc, "objdump"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    obj = tmp_path / "k.o"
    cmd = [cc, *WARN, "-DCOLIBRI_USE_AVX2", f"-I{KDIR}", f"-I{ROOT / 'src' / 'include'}",
           "-c", str(KDIR / source), "-o", str(obj)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"build failed: {' '.join(cmd)}\n{res.stderr}"
    dis = subprocess.run(["objdump", "-dr", "--no-show-raw-insn", str(obj)],
                         capture_output=True, text=True, check=True).stdout
    fns = _functions(dis)
    for tile in PREFETCH_INLINE.get(source, ()):
        assert tile in fns, f"{cc}: {source} has no function {tile} (renamed, or inlined?)"
        assert any("prefetch" in line for line in fns[tile]), (
            f"{cc}: {source}'s {tile} holds no prefetch instruction: its stream requests were dropped")
    if source in PREFETCH_CALLS:
        helper, least = PREFETCH_CALLS[source]
        lines = dis.splitlines()
        # a call resolved in the object ("call ... <helper>") or left to a
        # relocation on the next line ("R_X86_64_PLT32 helper-0x4")
        calls = sum(1 for i, line in enumerate(lines) if "call" in line and (
            f"<{helper}" in line or (i + 1 < len(lines) and f" {helper}" in lines[i + 1]
                                     and "R_X86_64" in lines[i + 1])))
        assert calls >= least, (
            f"{cc}: {source} calls {helper} from {calls} places, expected at least {least}: "
            "the decode tiles' prefetches were dropped (is the helper CLB_PREFETCH_HELPER?)")
