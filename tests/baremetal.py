"""Build a bare-metal test program against the cortex-m target's
libcolibri.a (built by scons, so with the target's own flags and defines)
and run it under the target's emulator.

Used by tests that check C code on the device kind with no file system: the
program takes its cases from a generated header in `include_dir`."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_and_run(target, source: str, include_dir: Path, name: str,
                  timeout: float = 300, scons_vars=()) -> subprocess.CompletedProcess:
    """source (relative to the root) + the target's start-up and linker
    script + libcolibri.a from `scons target=... build_dir=include_dir
    [scons_vars]`; returns the emulator run (stdout/stderr as text)."""
    lib = include_dir / target.name / "libcolibri.a"
    p = subprocess.run([str(Path(sys.executable).parent / "scons"), "-Q", "-j2",
                        f"target={target.name}", f"build_dir={include_dir}", *scons_vars,
                        str(lib)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    elf = include_dir / f"{name}.elf"
    subprocess.run([target.tool("gcc"), *target.arch_flags, "-std=c11", "-O2", "-Wall",
                    "-Werror", "-Isrc/include", "-Isrc", "-Ifirmware", f"-I{include_dir}",
                    source, *target.startup, str(lib), "-T", target.ldscript,
                    *target.link_flags, *[f"-l{x}" for x in target.libs], "-o", str(elf)],
                   cwd=ROOT, check=True, timeout=300)
    cmd = [str(elf) if a == "{prog}" else a for a in target.emulator]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
