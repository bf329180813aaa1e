"""The SCons front end as users drive it: help, errors naming the valid
choices, missing toolchains, no-op rebuilds, reproducible clean builds,
header-precise rebuilds, and the size budget failing the build."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import targets  # noqa: E402
from colibri.file import format as cformat  # noqa: E402
from colibri.buildsteps import testmodel  # noqa: E402

SCONS = str(ROOT / ".venv" / "bin" / "scons")
TARGETS = targets.load_all()
OUTPUTS = ("libcolibri.a", "firmware.elf", "firmware.bin", "size.txt",
           "compile_commands.json")


def scons(*args, cwd=ROOT, path=None):
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    return subprocess.run([SCONS, "-Q", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=600)


def test_help_documents_every_variable_and_target():
    p = scons("-h")
    assert p.returncode == 0
    for var in ("target", "model", "mmap", "workbuf", "debug", "avx2", "fma", "neon", "vnni",
                "verbose"):
        assert f"\n{var}:" in p.stdout, var
    for name in TARGETS:
        assert name in p.stdout
    assert "size" in p.stdout and "check" in p.stdout


def test_unknown_variable_names_the_valid_ones():
    p = scons("targte=ppc")
    assert p.returncode != 0
    assert "unknown variable(s) targte=ppc" in p.stderr
    valid = p.stderr.split("valid variables:", 1)[1]
    for name in ("target", "model", "mmap", "workbuf", "debug", "avx2", "fma", "neon",
                 "prompt", "generate", "verbose"):
        assert f" {name}," in valid or f" {name} " in valid, name


def test_unknown_target_names_the_valid_ones_and_list_lists_them():
    p = scons("target=mips")
    assert p.returncode != 0
    assert f"unknown target 'mips'; valid targets: {', '.join(TARGETS)}, all, list" in p.stderr
    p = scons("target=list")
    assert p.returncode == 0
    assert [l.split()[0] for l in p.stdout.splitlines()] == list(TARGETS)


def test_bad_option_for_target_is_an_error():
    p = scons("target=ppc", "avx2=1")
    assert p.returncode != 0 and "target ppc: avx2=1: target ppc has no avx2 kernels" in p.stderr


def test_missing_cross_compiler_names_the_debian_package(tmp_path):
    # A PATH with python (scons' interpreter) but no cross toolchain.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    p = scons("target=ppc", f"build_dir={tmp_path / 'b'}", path=f"{bin_dir}:{ROOT / '.venv' / 'bin'}")
    assert p.returncode != 0
    assert "powerpc-linux-gnu-gcc not found" in p.stderr
    assert "apt-get install gcc-powerpc-linux-gnu" in p.stderr


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return testmodel.make_model(tmp_path_factory.mktemp("scons-model") / "m.colibri", "int8")


def _snapshot(bdir: Path, name: str) -> dict[str, bytes]:
    out = {}
    for f in OUTPUTS + (("colibri-cli", "libcolibri.so") if TARGETS[name].is_linux else ()):
        out[f] = (bdir / name / f).read_bytes()
    return out


# aarch64: a kernel set of three files (neon.c, neon_dotprod.c, neon_attend.c).
@pytest.mark.parametrize("name", ["cortex-m", "ppc", "aarch64"])
def test_clean_builds_are_identical_and_a_second_build_does_nothing(name, tmp_path, tiny_model):
    if shutil.which(TARGETS[name].tool("gcc")) is None:
        pytest.skip(f"{TARGETS[name].tool('gcc')} not installed")
    args = (f"target={name}", f"model={tiny_model}", f"build_dir={tmp_path}", "-j2")
    p = scons(*args)
    assert p.returncode == 0, p.stderr
    first = _snapshot(tmp_path, name)
    # Nothing to do the second time: only "up to date" lines.
    p = scons(*args)
    assert p.returncode == 0
    busy = [l for l in p.stdout.splitlines() if "is up to date" not in l]
    assert busy == [], busy
    # `scons -c` removes the outputs; building again gives the same bytes.
    p = scons(*args, "-c")
    assert p.returncode == 0 and not (tmp_path / name / "firmware.elf").exists()
    p = scons(*args)
    assert p.returncode == 0, p.stderr
    second = _snapshot(tmp_path, name)
    differ = [f for f in first if first[f] != second[f]]
    assert differ == [], f"not reproducible: {differ}"
    # The target's own defines reach the library: cortex-m builds the 1 KiB
    # byte-table CRC, not the 8 KiB slicing-by-8 tables.
    nm = subprocess.run([TARGETS[name].tool("nm"), str(tmp_path / name / "libcolibri.a")],
                        capture_output=True, text=True, check=True).stdout
    assert ("crc32_table_hi" in nm) == (name != "cortex-m"), nm


def test_touching_a_header_rebuilds_only_its_includers(tmp_path, tiny_model):
    """In a copy of the tree (other engineers edit the real one): a change to
    firmware/platform.h recompiles the firmware files including it and leaves
    the runtime objects alone."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for part in ("SConstruct", "site_scons", "targets", "src", "firmware", "colibri"):
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, tree / part)
    # avx2=0: the dependency tracking under test is the same for every
    # source, and avx2.c and avx512.c are three quarters of x86_64's compile
    # (47 s with them, 12 s without, on a Zen 3)
    args = ("target=x86_64", "avx2=0", f"model={tiny_model}", "build_dir=build")
    assert scons(*args, cwd=tree).returncode == 0
    hdr = tree / "firmware" / "platform.h"
    hdr.write_text(hdr.read_text() + "/* touched */\n")
    p = scons(*args, cwd=tree)
    assert p.returncode == 0, p.stderr
    compiled = sorted(l.split()[-1] for l in p.stdout.splitlines() if l.strip().startswith("CC"))
    assert compiled == ["build/x86_64/.obj/firmware/app/main.o",
                        "build/x86_64/.obj/firmware/linux/platform.o"], p.stdout
    # A comment changes no object byte, so SCons (content signatures) rightly
    # stops there: the library and the executables stay as they were.
    assert "`build/x86_64/libcolibri.a' is up to date" in p.stdout
    assert "AR " not in p.stdout


def test_over_budget_fails_the_build_with_one_actionable_message(tmp_path):
    """A model too big for x86_64's firmware_flash budget (4 MiB): the build
    stops naming the budget, the total, the largest section and symbol."""
    shape = cformat.ModelShape(vocab=8192, hidden=96, intermediate=32, max_seq_len=16,
                               n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8,
                               n_experts=2, top_k=1, group_size=32)
    big = testmodel.make_model(tmp_path / "big.colibri", "f32", shape=shape)  # ~6.3 MB
    # avx2=0: the budget check is what is tested, not the kernels (a quarter
    # of the compile without them)
    p = scons("target=x86_64", "avx2=0", f"model={big}", f"build_dir={tmp_path / 'b'}", "-j2")
    assert p.returncode != 0
    err = p.stderr
    assert "size budget exceeded: target x86_64: firmware_flash is" in err
    assert "over its budget of 4194304 bytes" in err
    assert "largest section .colibri_model" in err
    assert "colibri_model_blob" in err and "targets/x86_64.py" in err


def test_image_goal_is_wired_and_asks_for_its_inputs():
    """`scons target=X image` reaches site_scons/site_tools/colibri_image.py,
    which names what is missing before anything is built."""
    p = scons("target=cortex-m", "image")
    assert p.returncode != 0 and "the image goal needs version=" in p.stderr
    p = scons("target=cortex-m", "image", "version=1.0.0")
    assert p.returncode != 0 and "needs key=KEY" in p.stderr
