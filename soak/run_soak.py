"""Build and run the soak driver (soak/soak.c) and print its figures.

    .venv/bin/python soak/run_soak.py [--steps 100000] [--quant int8|f32]
                                      [--valgrind-steps N]

Two runs of the same decode loop over a seeded tiny model
(colibri.buildsteps.testmodel, max_seq_len 64 so the cache rewinds every 56
steps): an optimised build (-O2, host kernels) for time and resident memory,
and an AddressSanitizer + UBSan build whose LeakSanitizer checks at exit that
nothing leaked (any report fails). Exit status 0 when both runs are clean,
memory is flat and the prompt's logits are bit-identical at the end.
With --valgrind-steps N (and valgrind installed) the optimised build also
runs N steps under valgrind memcheck (--leak-check=full; ~50x slower).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

SOAK = Path(__file__).resolve().parent
ROOT = SOAK.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from colibri.buildsteps import cbuild  # noqa: E402
sys.path.insert(0, str(ROOT / "fuzz"))
from replay import build_lock  # noqa: E402  (one lock helper for shared build/)
from colibri.buildsteps import testmodel  # noqa: E402

SHAPE = dataclasses.replace(testmodel.FW_TINY, max_seq_len=64)
# Resident memory may move by allocator noise; more than this between the
# first and the last sample (both after the first SAMPLE_EVERY steps) is growth.
RSS_SLACK_KB = 64
SAN_MARKS = ("LeakSanitizer", "AddressSanitizer", "runtime error", "definitely lost",
             "Invalid read", "Invalid write", "uninitialised")
VALGRIND = ("valgrind", "--error-exitcode=9", "--leak-check=full",
            "--errors-for-leak-kinds=definite,indirect,possible", "-q")

FIGURES = re.compile(r"(\w+)=([-\d.]+)")


def build(variant: str, out: Path | None = None) -> Path:
    """The soak program for 'plain' or 'asan' (address,undefined + LSan)."""
    out = out or ROOT / "build" / "soak" / variant
    with build_lock(out):
        info = cbuild.build(out / "lib", kernels=cbuild.host_kernels(),
                            sanitize="address,undefined" if variant == "asan" else None)
        exe = out / "soak"
        src = SOAK / "soak.c"
        if not exe.exists() or src.stat().st_mtime > exe.stat().st_mtime or \
                Path(info["lib"]).stat().st_mtime > exe.stat().st_mtime:
            cbuild.build_program(info, [src], exe, extra_ldflags=["-pthread"])
    return exe


def model(quant: str, out_dir: Path | None = None) -> Path:
    out_dir = out_dir or ROOT / "build" / "soak"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"soak-{quant}.colibri"
    with build_lock(out_dir):
        if not path.exists():
            testmodel.make_model(path, quant, seed=7, shape=SHAPE)
    return path


@dataclasses.dataclass
class Run:
    figures: dict
    returncode: int
    stdout: str
    stderr: str
    wall: float

    @property
    def rss_growth_kb(self) -> float:
        return self.figures["rss_kb_last"] - self.figures["rss_kb_first"]

    def problems(self) -> list[str]:
        out = []
        if self.returncode != 0:
            out.append(f"exit {self.returncode}: {self.stdout.strip()}")
        for mark in SAN_MARKS:
            if mark in self.stderr:
                out.append(f"{mark} report:\n{self.stderr[-4000:]}")
        if self.figures.get("logits_identical") != 1:
            out.append("prompt logits changed over the run")
        if self.figures and (self.rss_growth_kb > RSS_SLACK_KB or
                             self.figures["rss_kb_max"] - self.figures["rss_kb_first"] > RSS_SLACK_KB):
            out.append(f"resident memory grew: first {self.figures['rss_kb_first']:.0f} KB, "
                       f"last {self.figures['rss_kb_last']:.0f} KB, max "
                       f"{self.figures['rss_kb_max']:.0f} KB")
        return out


def run(exe: Path, model_path: Path, steps: int, every: int = 1000,
        timeout: float = 3600, prefix: tuple = (), threads: int = 1) -> Run:
    """threads > 1: the instance computes on that many threads (SOAK_THREADS)."""
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=1", "UBSAN_OPTIONS": "halt_on_error=1",
           "SOAK_THREADS": str(threads)}
    t = time.monotonic()
    proc = subprocess.run([*prefix, str(exe), str(model_path), str(steps), str(every)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    wall = time.monotonic() - t
    figs = {k: float(v) for k, v in FIGURES.findall(proc.stdout.splitlines()[-1])} \
        if proc.stdout.strip() else {}
    return Run(figs, proc.returncode, proc.stdout, proc.stderr, wall)


LEAK_CHECK = {"plain": "n/a", "asan": "LeakSanitizer clean", "valgrind": "memcheck clean"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--quant", default="int8", choices=("int8", "f32"))
    ap.add_argument("--every", type=int, default=1000, help="RSS sample interval (steps)")
    ap.add_argument("--valgrind-steps", type=int, default=0,
                    help="also run this many steps of the optimised build under valgrind")
    args = ap.parse_args(argv)
    path = model(args.quant)
    bad = 0
    runs = [("plain", args.steps, ()), ("asan", args.steps, ())]
    if args.valgrind_steps and shutil.which("valgrind"):
        runs.append(("valgrind", args.valgrind_steps, VALGRIND))
    for variant, steps, prefix in runs:
        r = run(build("plain" if variant == "valgrind" else variant), path, steps,
                args.every, prefix=prefix)
        f = r.figures
        print(f"{variant:5s}: {int(f.get('steps', 0))} steps in {f.get('seconds', 0):.1f} s "
              f"({f.get('steps_per_s', 0):.0f} steps/s), RSS first {f.get('rss_kb_first')} KB, "
              f"last {f.get('rss_kb_last')} KB, min {f.get('rss_kb_min')} KB, max "
              f"{f.get('rss_kb_max')} KB over {int(f.get('samples', 0))} samples, "
              f"{int(f.get('rewinds', 0))} cache rewinds, prompt logits identical: "
              f"{bool(f.get('logits_identical'))}, "
              f"leak check: {LEAK_CHECK[variant] if not r.problems() else 'FAILED'}")
        for p in r.problems():
            print(f"  PROBLEM: {p}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
