"""One instance on N threads (colibri_set_threads, colibri_set_executor):
logits bit-identical for N = 1..8, spinning or parking workers, the
caller's own executor, and to the build without threads
(COLIBRI_THREADS=0), for the ref, AVX2 and NEON kernels; COLIBRI_LOGITS_LAST
rows bit-equal to the all-rows call; misuse codes; a worker's stack within
colibri.h's COLIBRI_WORKER_STACK_BYTES; clean under ThreadSanitizer
(tests/c/test_pool.c)."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from test_runtime_support import c_build  # noqa: F401

# tiny q4: its narrow rows are Q5_0, whose products for a 16-token chunk
# run in the int8 GEMM (avx2.c i8g_src), as the int8 model's do; k256 q4:
# its Q4_K / Q6_K rows of 256 columns run avx512.c's K GEMM (zk_gemm) from
# 12 tokens where the CPU has AVX-512 VNNI.
MODELS = [("awkward", "f32"), ("wide", "int8"), ("tiny", "q4"), ("k256", "q4")]


def run_pool(build, model, max_threads=8, timeout=900):
    env = {**os.environ, "TSAN_OPTIONS": "halt_on_error=1 exitcode=66"}
    proc = subprocess.run(build.cmd("test_pool", model, max_threads), capture_output=True,
                          text=True, timeout=timeout, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "WARNING: ThreadSanitizer" not in proc.stderr, out
    assert "misuse: rejected" in proc.stdout, out
    assert re.search(r"^last: identical \(\d+ calls\)$", proc.stdout, re.M), out
    return proc.stdout


def worker_stack(stdout: str) -> tuple[int, int]:
    """(bytes a worker used, colibri.h's COLIBRI_WORKER_STACK_BYTES) from the
    serial executor's run on a painted stack."""
    m = re.search(r"^stack: (\d+) bytes used by a worker \(COLIBRI_WORKER_STACK_BYTES (\d+)\)$",
                  stdout, re.M)
    assert m, stdout
    return int(m.group(1)), int(m.group(2))


def digest(stdout: str) -> str:
    m = re.search(r"^pool: digest ([0-9a-f]{16})", stdout, re.M)
    assert m, stdout
    return m.group(1)


@pytest.mark.parametrize("name,quant", MODELS)
@pytest.mark.parametrize("pair", [("host", "nothreads"), ("ref", "ref-nothreads")],
                         ids=["host", "ref"])
def test_threads_bit_identical_to_threadless_build(c_build, colibri_file, name, quant, pair):
    """N = 1..8 (parking), spin 2 and 3, a pthread executor and a serial
    executor all give the 1-thread bits, and those equal the bits of the
    same kernels built with COLIBRI_THREADS=0."""
    threaded, threadless = (c_build(v) for v in pair)
    model = colibri_file(name, quant)
    out = run_pool(threaded, model)
    assert re.search(r"^pool: identical \(12 runs, up to 8 threads\)$", out, re.M), out
    used, limit = worker_stack(out)
    assert 0 < used <= limit == 48 << 10, out
    base = run_pool(threadless, model)
    assert "pool: threads unsupported" in base, base
    assert digest(out) == digest(base)


@pytest.mark.parametrize("name,quant", MODELS)
def test_threads_tsan_clean(c_build, colibri_file, name, quant):
    out = run_pool(c_build("tsan"), colibri_file(name, quant), max_threads=4)
    assert "pool: identical (8 runs, up to 4 threads)" in out, out


@pytest.mark.parametrize("variant", ["armv7-neon", "aarch64-neon"])
def test_threads_neon_under_qemu(c_build, colibri_file, variant):
    """NEON kernels: 1..3 threads identical, LAST rows identical (tiny model:
    emulation is slow)."""
    out = run_pool(c_build(variant), colibri_file("tiny", "int8"), max_threads=3)
    assert "pool: identical (7 runs, up to 3 threads)" in out, out
    used, limit = worker_stack(out)
    assert 0 < used <= limit, out
