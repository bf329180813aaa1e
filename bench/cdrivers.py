"""Build and run the C drivers of bench/c/ against the host library.

Two library builds under build/bench/ (never the shared build/x86_64/, which
other work rebuilds): COLIBRI_ENABLE_MMAP=0, the x86_64 target's default
(colibri_init reads the file into huge-page memory), which every Colibri
figure uses unless marked "mmap", and the mmap one (colibri_init maps it).
Both with the host kernels (ref + avx2) and the project's own flags (-O2).
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from colibri.buildsteps import cbuild

ROOT = Path(__file__).resolve().parent.parent
C_DIR = ROOT / "bench" / "c"


class Drivers:
    """Paths of the built programs: bench (the x86_64 target's default: the
    file read into huge-page memory), bench_mmap (the file mapped), machine
    (no library)."""

    def __init__(self, out_dir: Path):
        out_dir = Path(out_dir)
        kernels = cbuild.host_kernels()
        self.kernels = kernels
        mm = cbuild.build(out_dir / "lib-mmap", kernels=kernels, mmap=True, cli=False)
        rd = cbuild.build(out_dir / "lib-read", kernels=kernels, mmap=False, cli=False)
        extra = []
        if Path("/usr/include/valgrind/callgrind.h").exists():
            extra.append("-DBENCH_CALLGRIND")  # client requests; no-ops natively
        self.bench = cbuild.build_program(rd, [C_DIR / "colibri_bench.c"],
                                          out_dir / "colibri_bench", extra_cflags=extra)
        self.bench_mmap = cbuild.build_program(mm, [C_DIR / "colibri_bench.c"],
                                               out_dir / "colibri_bench_mmap",
                                               extra_cflags=extra)
        self.machine = out_dir / "machine"
        subprocess.run(["gcc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror",
                        str(C_DIR / "machine.c"), "-o", str(self.machine)], check=True)
        self.callgrind = extra != []


def run_json(cmd: list, timeout: float | None = None) -> dict:
    """Run a driver and parse the JSON object it prints (last stdout line)."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n"
                           f"{proc.stdout}{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
