"""colibri_infer allocates nothing and makes no system call: 1000 calls under
link-time wrappers of every allocation and I/O function, then 1000 more under
seccomp strict mode (tests/c/test_noalloc.c). The canaries show both
detectors fire."""
from __future__ import annotations

import re
import signal
import subprocess

import pytest

from colibri.buildsteps import cbuild
from test_runtime_support import TESTS_C, c_build  # noqa: F401

WRAPPED = ("malloc", "calloc", "realloc", "free", "aligned_alloc", "posix_memalign",
           "mmap", "munmap", "open", "read", "write", "close", "fopen", "fread",
           "fwrite", "fclose", "clock_gettime")


@pytest.fixture(scope="module")
def noalloc(c_build):
    build = c_build("host")
    src = (TESTS_C / "test_noalloc.c").read_text()
    # The list the program documents is the list linked: keep them together.
    assert all(name in src for name in WRAPPED)
    wrap = "-Wl," + ",".join(f"--wrap={n}" for n in WRAPPED)
    return cbuild.build_program(build.info, [TESTS_C / "test_noalloc.c"],
                                build.info["lib"].parent / "test_noalloc",
                                extra_ldflags=[wrap])


@pytest.mark.parametrize("name,quant", [("tiny", "f32"), ("wide", "int8")])
def test_infer_allocates_nothing_and_makes_no_syscall(noalloc, colibri_file, name, quant):
    proc = subprocess.run([str(noalloc), str(colibri_file(name, quant))],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^wrap: 1000 calls, 0 intercepted$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^seccomp: 1000 calls survived, 0 intercepted$", proc.stdout, re.M)


@pytest.mark.parametrize("name,quant", [("tiny", "f32"), ("wide", "int8")])
def test_spinning_threads_allocate_nothing_and_make_no_syscall(noalloc, colibri_file,
                                                                name, quant):
    """COLIBRI_THREADS_SPIN on 3 threads: the wrappers count nothing and a
    seccomp filter on every thread of the process (read/write/exit only)
    lets 1000 calls through."""
    proc = subprocess.run([str(noalloc), str(colibri_file(name, quant)), "--spin-threads", "3"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "threads: 3 spin" in proc.stdout
    assert re.search(r"^wrap: 1000 calls, 0 intercepted$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^seccomp: 1000 calls survived, 0 intercepted$", proc.stdout, re.M)


def test_canary_syscall_with_threads_is_killed(noalloc, colibri_file):
    """The all-threads filter fires: getpid() under it ends the process."""
    proc = subprocess.run([str(noalloc), str(colibri_file("tiny", "f32")), "--canary-syscall",
                           "--spin-threads", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGSYS, proc.stdout + proc.stderr
    assert "survived" not in proc.stdout


def test_canary_malloc_is_counted(noalloc, colibri_file):
    proc = subprocess.run([str(noalloc), str(colibri_file("tiny", "f32")), "--canary-malloc"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "1 intercepted, first: malloc" in proc.stdout, proc.stdout


def test_canary_syscall_is_killed(noalloc, colibri_file):
    proc = subprocess.run([str(noalloc), str(colibri_file("tiny", "f32")), "--canary-syscall"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert "survived" not in proc.stdout


@pytest.mark.parametrize("name", ["qwen2", "granite"])
def test_version_2_features_allocate_nothing(noalloc, tmp_path, name):
    """The description's paths (biases, dense layers, the gated and the
    ungated shared expert, multipliers) allocate nothing either."""
    from feature_models import DESCRIPTIONS, write_model
    from colibri.file import format as F
    path = write_model(tmp_path / f"{name}.colibri", DESCRIPTIONS[name], dtypes=F.PRESET_INT8)
    proc = subprocess.run([str(noalloc), str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^wrap: 1000 calls, 0 intercepted$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^seccomp: 1000 calls survived, 0 intercepted$", proc.stdout, re.M)


def test_encoder_decoder_allocates_nothing(noalloc, tmp_path):
    """colibri_encode and the encoder-decoder's decoder steps (cross-
    attention, capacity counts, ReLU experts) allocate nothing and make no
    system call either: an int8 ENC_DEC file (fuzz/gen_seeds.py's)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fuzz"))
    import gen_seeds
    from colibri.file import format as F
    path = tmp_path / "encdec.colibri"
    path.write_bytes(gen_seeds.model_bytes(gen_seeds.ENCDEC, F.PRESET_INT8, seed=3,
                                           desc=gen_seeds.ENCDEC_DESC))
    proc = subprocess.run([str(noalloc), str(path)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^wrap: 1000 calls, 0 intercepted$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^seccomp: 1000 calls survived, 0 intercepted$", proc.stdout, re.M)
