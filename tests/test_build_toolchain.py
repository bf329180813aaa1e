"""targets/ and colibri.buildsteps.toolchain without SCons: every target module is
complete, options are checked with messages naming what is allowed, flags
keep the arithmetic reproducible."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import targets  # noqa: E402
from colibri.buildsteps import toolchain  # noqa: E402
from colibri.errors import ColibriError  # noqa: E402

ALL = targets.load_all()


def test_the_six_targets_are_declared():
    assert set(ALL) == {"x86_64", "armv7", "ppc", "cortex-m", "aarch64", "riscv64"}


@pytest.mark.parametrize("name", list(ALL))
def test_target_module_is_complete(name):
    t = ALL[name]
    assert t.package and t.byte_order in ("little", "big") and t.pointer_bytes in (4, 8)
    assert set(t.budgets) >= {"runtime", "firmware_flash", "firmware_ram", "image"}
    assert t.ram_bytes > 0 and t.flash_bytes > 0
    if t.emulator:  # pinned CPU, so results do not move with QEMU's default
        assert "-cpu" in t.emulator and t.emulator_package
        # The pinned CPU comes first in cpu_kernels, and each expected table
        # is ref or one of the target's kernel sets (neon-dotprod: neon's).
        assert list(t.cpu_kernels)[:1] == [t.cpu]
        for table in t.cpu_kernels.values():
            assert table == "ref" or table.split("-")[0] in t.kernels, table
    else:
        assert not t.cpu_kernels and t.cpu is None
    if not t.is_linux:
        assert t.ldscript and (ROOT / t.ldscript).exists()
        assert all((ROOT / s).exists() for s in t.startup)
        assert t.budgets["firmware_flash"] <= t.flash_bytes
        assert t.budgets["firmware_ram"] <= t.ram_bytes
    fl = toolchain.flags(t, toolchain.resolve_options(t), ROOT)
    assert "-ffp-contract=off" in fl.ccflags
    assert f"-ffile-prefix-map={ROOT.resolve()}=." in fl.ccflags


def test_defaults_follow_design_table():
    ppc = toolchain.resolve_options(ALL["ppc"])
    assert (ppc.mmap, ppc.workbuf, ppc.kernels) == (False, "static", ())
    assert ALL["ppc"].byte_order == "big"
    assert toolchain.resolve_options(ALL["x86_64"]).kernels == ("avx2",)
    assert toolchain.resolve_options(ALL["armv7"]).kernels == ("neon",)
    assert toolchain.resolve_options(ALL["aarch64"]).kernels == ("neon",)
    rv = toolchain.resolve_options(ALL["riscv64"])
    assert (rv.mmap, rv.workbuf, rv.kernels) == (True, "dynamic", ())
    assert ALL["aarch64"].pointer_bytes == ALL["riscv64"].pointer_bytes == 8
    ref = toolchain.flags(ALL["armv7"], toolchain.resolve_options(ALL["armv7"], neon="0"), ROOT)
    assert "COLIBRI_KERNELS_REF_ONLY" in ref.cppdefines
    st = toolchain.flags(ALL["ppc"], ppc, ROOT)
    assert "COLIBRI_STATIC_WORKBUF" in st.cppdefines and "COLIBRI_ENABLE_MMAP=0" in st.cppdefines


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(avx2="1"), r"avx2=1: target ppc has no avx2 kernels \(available: none\)"),
    (dict(workbuf="heap"), r"workbuf='heap': expected static, dynamic or auto"),
    (dict(mmap="maybe"), r"mmap='maybe': expected 0, 1 or auto"),
])
def test_bad_options_name_the_variable(kwargs, pattern):
    with pytest.raises(ColibriError, match=pattern):
        toolchain.resolve_options(ALL["ppc"], **kwargs)


def test_bare_metal_refuses_mmap_and_fma_follows_avx2():
    with pytest.raises(ColibriError, match="bare metal: it needs mmap=0 workbuf=static"):
        toolchain.resolve_options(ALL["cortex-m"], mmap="1")
    with pytest.raises(ColibriError, match="fma must equal avx2"):
        toolchain.resolve_options(ALL["x86_64"], avx2="1", fma="0")
    assert toolchain.resolve_options(ALL["x86_64"], avx2="0").fma is False


def test_missing_toolchain_and_emulator_name_the_debian_package():
    fake = dataclasses.replace(ALL["ppc"], prefix="no-such-cross-", package="gcc-no-such",
                               emulator=("qemu-no-such", "-cpu", "x"),
                               emulator_package="qemu-no-such-pkg")
    msg = toolchain.missing_tools(fake)
    assert msg and "no-such-cross-gcc not found" in msg[0] and "apt-get install gcc-no-such" in msg[0]
    assert "apt-get install qemu-no-such-pkg" in toolchain.missing_emulator(fake)


def test_unknown_target_names_the_valid_ones():
    with pytest.raises(ValueError, match="valid targets: aarch64, armv7, cortex-m, ppc, "
                                         "riscv64, x86_64"):
        targets.get("mips")


def test_emulator_command_places_the_program():
    assert ALL["armv7"].emulator_command("p", ("--x",)) == [
        "qemu-arm", "-cpu", "cortex-a9", "-L", "/usr/arm-linux-gnueabihf", "p", "--x"]
    cm = ALL["cortex-m"].emulator_command("fw.elf")
    assert cm[cm.index("-kernel") + 1] == "fw.elf" and cm[-1] == "fw.elf"
    assert ALL["x86_64"].emulator_command("p") == ["p"]


def test_on_cpu_swaps_only_the_emulated_cpu():
    """How scons check and the matrix run aarch64 on a core with SDOT."""
    a76 = ALL["aarch64"].on_cpu("cortex-a76")
    assert a76.cpu == "cortex-a76" and ALL["aarch64"].cpu == "cortex-a72"
    assert a76.emulator_command("p") == [
        "qemu-aarch64", "-cpu", "cortex-a76", "-L", "/usr/aarch64-linux-gnu", "p"]
    assert a76.name == "aarch64" and a76.cpu_kernels == ALL["aarch64"].cpu_kernels
    with pytest.raises(ValueError, match="x86_64 pins no emulated CPU"):
        ALL["x86_64"].on_cpu("Haswell")


def test_neon_kernel_set_has_the_dotprod_file():
    """neon_dotprod.c (the SDOT matmul) and neon_attend.c (the A64
    attention) go wherever neon.c goes: without them
    colibri_neon_dotprod_matmul_i8 or clb_neon_attend would be undefined at
    link."""
    from colibri.buildsteps import sources
    assert sources.KERNELS["neon"].sources == ("src/kernels/neon.c",
                                               "src/kernels/neon_dotprod.c",
                                               "src/kernels/neon_attend.c")
    assert all((ROOT / s).exists() for k in sources.KERNELS.values() for s in k.sources)


def test_threads_default_on_linux_off_on_bare_metal():
    """threads=auto: the pthread pool on the Linux targets, no thread code
    on cortex-m (its size stays the threadless library's); threads=1 there
    builds the executor hook alone."""
    for name, t in ALL.items():
        opts = toolchain.resolve_options(t)
        assert opts.threads == t.is_linux, name
        assert f"COLIBRI_THREADS={int(t.is_linux)}" in toolchain.flags(t, opts, ROOT).cppdefines
    cm = toolchain.resolve_options(ALL["cortex-m"], threads="1")
    assert "COLIBRI_THREADS=1" in toolchain.flags(ALL["cortex-m"], cm, ROOT).cppdefines
    x = toolchain.resolve_options(ALL["x86_64"], threads="0")
    assert "COLIBRI_THREADS=0" in toolchain.flags(ALL["x86_64"], x, ROOT).cppdefines
    with pytest.raises(ColibriError, match="threads=.2.: expected 0, 1 or auto"):
        toolchain.resolve_options(ALL["x86_64"], threads="2")


def test_vnni_follows_avx2_and_vnni0_defines_no_vnni():
    """vnni=0 (scons vnni=0) builds the AVX2 kernels without their vpdpbusd
    table (COLIBRI_AVX2_NO_VNNI): what the benchmarks use to stand in for an
    AVX2-only CPU on a VNNI one. vnni=1 needs the AVX2 kernels."""
    x86 = ALL["x86_64"]
    on = toolchain.resolve_options(x86)
    assert on.vnni is True
    assert "COLIBRI_AVX2_NO_VNNI" not in toolchain.flags(x86, on, ROOT).cppdefines
    off = toolchain.resolve_options(x86, vnni="0")
    assert off.vnni is False and off.kernels == ("avx2",)
    assert "COLIBRI_AVX2_NO_VNNI" in toolchain.flags(x86, off, ROOT).cppdefines
    assert toolchain.resolve_options(x86, avx2="0").vnni is False
    with pytest.raises(ColibriError, match="vnni=1 with avx2=0"):
        toolchain.resolve_options(x86, avx2="0", vnni="1")
    # ARM and bare-metal targets never see the define
    assert "COLIBRI_AVX2_NO_VNNI" not in toolchain.flags(
        ALL["armv7"], toolchain.resolve_options(ALL["armv7"]), ROOT).cppdefines


def test_encdec0_defines_no_encdec_on_every_target():
    """encdec=0 (scons encdec=0) builds src/encdec.c as stubs
    (COLIBRI_NO_ENCDEC): a decoder-only firmware without the encoder-decoder
    runtime. The default keeps it; the value is checked like the others."""
    for name, t in ALL.items():
        on = toolchain.resolve_options(t)
        assert on.encdec is True, name
        assert "COLIBRI_NO_ENCDEC" not in toolchain.flags(t, on, ROOT).cppdefines, name
        off = toolchain.resolve_options(t, encdec="0")
        assert off.encdec is False, name
        assert "COLIBRI_NO_ENCDEC" in toolchain.flags(t, off, ROOT).cppdefines, name
    both = toolchain.resolve_options(ALL["cortex-m"], encdec="0", tokenizer="0")
    defs = toolchain.flags(ALL["cortex-m"], both, ROOT).cppdefines
    assert "COLIBRI_NO_ENCDEC" in defs and "COLIBRI_NO_TOKENIZER" in defs
    with pytest.raises(ColibriError, match="encdec=.2.: expected 0, 1 or auto"):
        toolchain.resolve_options(ALL["x86_64"], encdec="2")
