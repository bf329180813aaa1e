"""Build and run the fuzz harness without libFuzzer (fuzz/replay_main.c):
the test suite's way to replay the committed corpus and to feed hand-made
hostile files to the C loader under AddressSanitizer + UBSan.

The library is built by colibri.buildsteps.cbuild with clang (gcc when clang is
missing) and -fsanitize=address,undefined -fno-sanitize-recover=all, into
build/fuzz-replay/ (cached across test sessions by cbuild's stamp).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
ROOT = FUZZ.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from colibri.buildsteps import cbuild  # noqa: E402
from colibri.buildsteps.cbuild import build_lock  # noqa: E402,F401  (soak/ imports it from here)

TAIL = 16
# Control-tail flags, as in fuzz_init_infer.c.
FIX_CRCS, MASK, RAW_IDS, DECODE, VIA_FILE, VERIFY, REWIND, NULL_MASK_DECODE = (
    1, 2, 4, 8, 16, 32, 64, 128)

SANITIZER_MARKS = ("runtime error", "AddressSanitizer", "LeakSanitizer",
                   "UndefinedBehaviorSanitizer")
SAN_ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}


def compiler() -> str:
    return "clang" if shutil.which("clang") else "gcc"


def build_library(out: Path | None = None) -> dict:
    """libcolibri.a under ASan+UBSan with the host kernels (cbuild result)."""
    out = out or ROOT / "build" / "fuzz-replay"
    with build_lock(out):
        return cbuild.build(out / "lib", cc=compiler(), sanitize="address,undefined",
                            kernels=cbuild.host_kernels())


def build_replay(info: dict | None = None, out: Path | None = None) -> Path:
    """The replay driver linked against build_library()."""
    info = info or build_library(out)
    exe = Path(info["lib"]).parent.parent / "fuzz_replay"
    srcs = [FUZZ / "fuzz_init_infer.c", FUZZ / "replay_main.c"]
    # Rebuild when the harness or the library changed.
    with build_lock(exe.parent):
        if not exe.exists() or any(p.stat().st_mtime > exe.stat().st_mtime
                                   for p in srcs + [Path(info["lib"])]):
            cbuild.build_program(info, srcs, exe)
    return exe


def build_tool(name: str, info: dict | None = None) -> Path:
    """fuzz/NAME.c (a standalone driver with its own main) linked against
    build_library()."""
    info = info or build_library()
    exe = Path(info["lib"]).parent.parent / name
    src = FUZZ / f"{name}.c"
    with build_lock(exe.parent):
        if not exe.exists() or any(p.stat().st_mtime > exe.stat().st_mtime
                                   for p in (src, Path(info["lib"]))):
            cbuild.build_program(info, [src], exe)
    return exe


@dataclass
class Result:
    path: str
    arena: int
    init: int
    infer: int
    decode: int
    verify: int
    nonfinite: int
    detail: str


LINE = re.compile(r"^(.*) arena=(-?\d+) init=(-?\d+) infer=(-?\d+) decode=(-?\d+) "
                  r"verify=(-?\d+) nonfinite=(\d+) detail=(.*)$")


class SanitizerReport(AssertionError):
    pass


def replay(exe: Path, files, timeout: float = 600) -> list[Result]:
    """Run the harness over files; raise SanitizerReport on any sanitizer
    output or abnormal exit. Results in file order."""
    files = [str(f) for f in files]
    results: list[Result] = []
    # Chunks keep the command line short.
    for i in range(0, len(files), 200):
        chunk = files[i:i + 200]
        proc = subprocess.run([str(exe), *chunk], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, **SAN_ENV})
        if proc.returncode != 0 or any(m in proc.stderr for m in SANITIZER_MARKS):
            done = proc.stdout.count("\n")
            culprit = chunk[done] if done < len(chunk) else "?"
            raise SanitizerReport(f"replay failed (exit {proc.returncode}) on {culprit}:\n"
                                  f"{proc.stderr[-6000:]}")
        for line in proc.stdout.splitlines():
            m = LINE.match(line)
            assert m, f"unexpected replay output: {line!r}"
            results.append(Result(m[1], *map(int, m.groups()[1:7]), m[8]))
    assert len(results) == len(files)
    return results


def with_tail(model: bytes, flags: int = VERIFY | DECODE, batch: int = 0, seq: int = 2,
              mask: int = 0xFF, tokens: bytes = bytes(range(1, 13))) -> bytes:
    """A harness input: model bytes + control tail."""
    return model + bytes([flags, batch, seq, mask]) + tokens[:12].ljust(12, b"\0")
