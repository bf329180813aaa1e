"""SCons firmware builds that share their compiled libraries.

`scons target=all model=M build_dir=D` compiles every target's libcolibri,
colibri-cli and firmware application, though only the model blob and the
firmware link depend on M. The target matrix alone built ten models, each in
its own directory: ten compilations of six targets' libraries where two (the
default kernels and the reference kernels) give the same objects.

`SharedBuilds.build(out, *args, config=...)` runs the build in one work
directory per configuration (the scons arguments that change what the
library is compiled from: `avx2=0 neon=0`, `tokenizer=0`, ...; the model,
prompt, sampling and kv= change only the firmware) and copies each built
target's directory to `out` (without the object files), so every caller
still gets a build directory of its own, as if it had built alone, and
SCons, which tracks every input, recompiles exactly what the new arguments
change. The work directories are shared by the xdist workers of a run (as
tests/test_runtime_support.py's c_build builds are): a build and its copy
hold the work directory's lock, so a library one worker compiled is the
other's too (each compiled the six targets' default libraries itself
before, x86_64's alone 47 s on a Zen 3), and the next build relinks what
its own arguments change.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from colibri.buildsteps.cbuild import build_lock

ROOT = Path(__file__).resolve().parent.parent


class SharedBuilds:
    def __init__(self, root: Path, target_names: list[str]):
        self.root = Path(root)
        self.target_names = list(target_names)

    def _built_targets(self, args) -> list[str]:
        for a in args:
            if a.startswith("target="):
                want = a.split("=", 1)[1]
                return self.target_names if want == "all" else want.split(",")
        return ["x86_64"]         # SConstruct's default target

    def work_dir(self, config: str = "default") -> Path:
        """Where the builds of `config` run (for naming a file goal in ARGS:
        work_dir() / "x86_64" / "size.txt")."""
        return self.root / f"work-{config}"

    def build(self, out: Path, *args: str, config: str = "default",
              timeout: float = 1800) -> subprocess.CompletedProcess:
        """scons -Q -j2 ARGS in the work directory of `config`, then every
        built target's directory copied to out/<target>. Raises
        AssertionError with the build's output tail when scons fails."""
        work = self.work_dir(config)
        scons = ROOT / ".venv" / "bin" / "scons"
        with build_lock(work):
            p = subprocess.run([str(scons), "-Q", "-j2", *args, f"build_dir={work}"], cwd=ROOT,
                               capture_output=True, text=True, timeout=timeout)
            if p.returncode != 0:
                raise AssertionError(f"scons {' '.join(args)} failed ({p.returncode}):\n"
                                     f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
            out = Path(out)
            for name in self._built_targets(args):
                src = work / name
                if src.is_dir():
                    dst = out / name
                    if dst.exists():
                        shutil.rmtree(dst)
                    shutil.copytree(src, dst, symlinks=True,
                                    ignore=shutil.ignore_patterns(".obj", "*.o"))
        return p
