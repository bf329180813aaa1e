"""Shared machinery of the C runtime tests (tests/test_runtime_*.py); no tests.

- `c_build(variant)`: session-cached builds of libcolibri.a, colibri-cli and
  the C test programs of tests/c/ for one build variant (VARIANTS).
  Variants with shared=True ("host", "armv7-neon") also have libcolibri.so
  (`Build.so`), for colibri.runtime (tests/test_binding.py).
- `run_driver(build, model, calls, ...)`: runs tests/c/infer_driver.c over a
  list of colibri_infer calls and returns each call's logits.
- `golden_calls(...)`: the prefill + decode script of the golden tests, and
  `reference_logits(ref, calls)`, the same calls on the numpy reference.
"""
from __future__ import annotations

import os
import shutil
import sys
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from colibri.buildsteps import cbuild

TESTS_C = Path(__file__).parent / "c"

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the targets/ package (toolchains, emulators)


import targets  # noqa: E402

TARGETS = targets.load_all()
# Linux targets that run under an emulator: each has a ref-kernel variant of
# its own name below.
CROSS_LINUX = [n for n, t in TARGETS.items() if t.is_linux and t.emulator]


def _target_variant(name: str, cpu: str | None = None, **overrides) -> dict:
    """A ref-kernel build for a cross target of targets/ (its toolchain,
    flags, emulator and emulator workarounds), run on the CPU its emulator
    pins or on `cpu`."""
    t = TARGETS[name] if cpu is None else TARGETS[name].on_cpu(cpu)
    kw = dict(kernels=("ref",), cc=t.tool("gcc"), cflags=tuple(t.arch_flags),
              ldflags=tuple(t.link_flags), program_sources=tuple(t.program_sources),
              mmap=t.defaults.get("mmap", True), runner=tuple(t.emulator))
    kw.update(overrides)
    return kw


# name -> cbuild.build keyword arguments (plus "runner": the emulator prefix;
# a callable is evaluated at first use).
VARIANTS = {
    "host": dict(kernels=None, shared=True),          # ref + avx2 if present; + .so
    "ref": dict(kernels=("ref",)),
    "asan": dict(kernels=None, sanitize="address,undefined"),
    # as scons vnni=0: the AVX2 kernels without vpdpbusd (an AVX2-only CPU)
    "novnni": dict(kernels=None, defines=("COLIBRI_AVX2_NO_VNNI",)),
    "tsan": dict(kernels=None, sanitize="thread"),
    # COLIBRI_THREADS=0: the serial build whose bits every thread count keeps
    "nothreads": dict(kernels=None, defines=("COLIBRI_THREADS=0",)),
    "ref-nothreads": dict(kernels=("ref",), defines=("COLIBRI_THREADS=0",)),
    # as scons encdec=0: no encoder-decoder runtime (src/encdec.c stubs)
    "ref-noencdec": dict(kernels=("ref",), defines=("COLIBRI_NO_ENCDEC",)),
    "static-noencdec": dict(kernels=("ref",), static_workbuf=True, mmap=False,
                            defines=("COLIBRI_NO_ENCDEC",)),
    "static": dict(kernels=("ref",), static_workbuf=True, mmap=False),
    "nommap": dict(kernels=("ref",), mmap=False),
    "debug": dict(kernels=("ref",), debug=True),
    # One ref-kernel variant per emulated Linux target, named after it
    # (ppc: dynamic work buffer, so colibri_init can swap a little-endian
    # file too).
    **{name: (lambda name=name: _target_variant(name)) for name in CROSS_LINUX},
    # The NEON builds; aarch64's twice, on a CPU without and one with SDOT.
    "armv7-neon": lambda: _target_variant("armv7", kernels=("ref", "neon"), shared=True),
    "aarch64-neon": lambda: _target_variant("aarch64", kernels=("ref", "neon")),
    "aarch64-dotprod": lambda: _target_variant("aarch64", cpu="cortex-a76",
                                               kernels=("ref", "neon")),
}

# C test programs built for every variant: name -> (sources, extra ldflags).
PROGRAMS = {
    "infer_driver": (("infer_driver.c",), ()),
    "test_errors": (("test_errors.c",), ()),
    "test_threads": (("test_threads.c",), ("-pthread",)),
    "test_pool": (("test_pool.c",), ("-pthread",)),
}


@dataclass
class Build:
    variant: str
    info: dict                 # cbuild.build() result
    programs: dict             # name -> Path
    runner: tuple = ()

    @property
    def cli(self) -> Path:
        return self.info["cli"]

    @property
    def so(self) -> Path | None:
        """libcolibri.so of this build (variants with shared=True), else None."""
        return self.info.get("so")

    def cmd(self, program: str, *args) -> list[str]:
        """Command line running a test program (under the emulator if any)."""
        path = self.programs[program] if program in self.programs else Path(program)
        return [*self.runner, str(path), *map(str, args)]


def variant_kwargs(variant: str) -> dict:
    kw = VARIANTS[variant]
    return dict(kw() if callable(kw) else kw)


def tool_available(variant: str) -> str | None:
    """Why a variant cannot be built or run here, or None."""
    kw = variant_kwargs(variant)
    cc = kw.get("cc", "gcc")
    if shutil.which(cc) is None:
        return f"{cc} is not installed"
    runner = kw.get("runner")
    if runner and shutil.which(runner[0]) is None:
        return f"{runner[0]} is not installed"
    return None


# Set by test_cpu_independence for its rerun (a child pytest) to the parent
# run's shared root: the C and SCons builds kept there do not depend on the
# BLAS and numpy kernels the rerun forces, so it reuses them (under their
# locks) instead of compiling the same variants again.
SHARED_ROOT_ENV = "COLIBRI_TEST_SHARED_ROOT"


def session_shared_root(tmp_path_factory) -> Path:
    """The directory every pytest-xdist worker of this run shares (the run's
    base temporary directory, which holds each worker's own), or this
    process's own when there are no workers; $COLIBRI_TEST_SHARED_ROOT
    when set."""
    if os.environ.get(SHARED_ROOT_ENV):
        return Path(os.environ[SHARED_ROOT_ENV])
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    return base


def session_shared_dir(tmp_path_factory, name: str) -> Path:
    """session_shared_root()/name, made if missing: for builds only (what
    goes there must not depend on the CPU profile of a rerun)."""
    d = session_shared_root(tmp_path_factory) / name
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def c_build(tmp_path_factory):
    """Factory: c_build(variant) -> Build, compiled once per test run: the
    xdist workers share one build directory per variant (the first to ask
    builds it, under a lock; the others wait and reuse it, as cbuild's
    stamp finds nothing changed). Nothing writes into a build after it."""
    root = session_shared_dir(tmp_path_factory, "cbuild")
    cache: dict[str, Build] = {}

    def get(variant: str) -> Build:
        if variant in cache:
            return cache[variant]
        why = tool_available(variant)
        if why:
            pytest.skip(f"build variant {variant}: {why}")
        kw = variant_kwargs(variant)
        runner = tuple(kw.pop("runner", ()))
        if kw.get("kernels") is None:
            kw["kernels"] = cbuild.host_kernels()
        out = root / variant
        with cbuild.build_lock(out):
            info = cbuild.build(out, **kw)
            programs = {}
            for name, (sources, ldflags) in PROGRAMS.items():
                programs[name] = out / name
                if not programs[name].exists():   # whole or not at all
                    tmp = cbuild.build_program(info, [TESTS_C / s for s in sources],
                                               out / f"{name}.tmp", extra_ldflags=ldflags)
                    os.replace(tmp, programs[name])
        cache[variant] = Build(variant, info, programs, runner)
        return cache[variant]
    return get


@dataclass
class Call:
    """One colibri_infer call: tokens [b, s], mask [b, s] or None, n_past."""
    tokens: np.ndarray
    mask: np.ndarray | None
    n_past: int


class DriverError(RuntimeError):
    def __init__(self, code: int, detail: str):
        super().__init__(f"colibri error {code}: {detail}")
        self.code, self.detail = code, detail


def write_script(path: Path, calls: list[Call]) -> None:
    lines = []
    for c in calls:
        b, s = c.tokens.shape
        lines.append(f"{b} {s} {c.n_past}")
        lines.append(" ".join(str(int(t)) for t in c.tokens.ravel()))
        lines.append("-" if c.mask is None else
                     " ".join(str(int(m)) for m in c.mask.ravel()))
    path.write_text("\n".join(lines) + "\n")


def run_driver(build: Build, model: Path, calls: list[Call], workdir: Path,
               memory: bool = False, vocab: int | None = None,
               env: dict | None = None, timeout: float = 300,
               kv: str = "f32") -> list[np.ndarray]:
    """Run the calls through infer_driver; returns per call logits [b, s, V].
    kv="i8": the 8-bit KV cache. Raises DriverError with the library's code
    when a call (or init) fails."""
    workdir.mkdir(parents=True, exist_ok=True)
    script, out = workdir / "calls.txt", workdir / "logits.f32"
    write_script(script, calls)
    args = [model, script, out] + (["--memory"] if memory else []) + \
        (["--kv-i8"] if kv == "i8" else [])
    proc = subprocess.run(build.cmd("infer_driver", *args), capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if proc.returncode >= 10 and proc.stdout.startswith("error "):
        _, code, *detail = proc.stdout.split(" ", 2)
        raise DriverError(int(code), " ".join(detail).strip())
    assert proc.returncode == 0, (
        f"infer_driver ({build.variant}) exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    data = np.fromfile(out, dtype="<f4")
    if vocab is None:
        from colibri.file import format as cformat
        vocab = cformat.read_file(model, check_crc=False).shape.vocab
    result, at = [], 0
    for c in calls:
        n = c.tokens.size * vocab
        result.append(data[at:at + n].reshape(*c.tokens.shape, vocab))
        at += n
    assert at == data.size, f"driver wrote {data.size} floats, expected {at}"
    return result


def golden_calls(vocab: int, batch: int, seed: int, prefill: int = 32,
                 decode: int = 16) -> list[Call]:
    """Prefill `prefill` tokens then `decode` single-token steps. With batch
    3: sequence 0 full, sequence 1 right-padded (last 7 prompt slots are
    padding), sequence 2 left-padded (first 13 slots)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=(batch, prefill))
    mask = np.ones((batch, prefill), dtype=np.int64)
    if batch >= 2:
        mask[1, prefill - 7:] = 0
    if batch >= 3:
        mask[2, :13] = 0
    tokens[mask == 0] = 0                      # padding slots hold token 0
    calls = [Call(tokens, mask if batch > 1 else None, 0)]
    for i in range(decode):
        step = rng.integers(0, vocab, size=(batch, 1))
        calls.append(Call(step, np.ones((batch, 1), dtype=np.int64), prefill + i))
    return calls


def reference_logits(ref, calls: list[Call]) -> list[np.ndarray]:
    """The same calls on a colibri.model.reference.Reference."""
    return [ref.forward(c.tokens, c.mask, n_past=c.n_past) for c in calls]


def valid_rows(calls: list[Call], logits: list[np.ndarray]) -> np.ndarray:
    """All logits rows of real (mask 1) tokens, [rows, V]; padding rows carry
    no meaning (FORMAT.md 6)."""
    rows = []
    for c, lg in zip(calls, logits):
        m = np.ones(c.tokens.shape, bool) if c.mask is None else c.mask.astype(bool)
        rows.append(lg[m])
    return np.concatenate(rows, axis=0)


def relative_row_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per row, max |got - want| / max |want| (logits are O(1))."""
    return np.abs(got - want).max(axis=-1) / np.maximum(np.abs(want).max(axis=-1), 1e-30)


def assert_quantised_rows(got, want, what: str) -> None:
    """The agreement of a quantised file's rows with the reference of the
    same file (test_runtime_golden.py's int8 test says why these bounds): median row
    to float rounding, every row within 3e-2, greedy tokens on 95% of rows.
    (tests/test_runtime_golden.py, tests/test_kv_cache.py)."""
    rel = relative_row_error(got, want)
    print(f"{what}: rows {len(rel)}, over 1e-3: {int(np.sum(rel > 1e-3))}, "
          f"worst {rel.max():.3g}")
    assert np.median(rel) <= 1e-5, f"{what}: median row {np.median(rel):.3g}"
    assert rel.max() <= 3e-2, f"{what}: worst row {rel.max():.3g}"
    assert np.mean(got.argmax(-1) == want.argmax(-1)) >= 0.95
