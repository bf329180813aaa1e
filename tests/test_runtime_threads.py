"""One instance per thread over one shared weight mapping: 4 threads with 4
instances made by colibri_share give logits bit-identical to one thread
running the same sequences (tests/c/test_threads.c); clean under
ThreadSanitizer."""
from __future__ import annotations

import os
import subprocess

import pytest

from test_runtime_support import c_build  # noqa: F401


@pytest.mark.parametrize("variant", ["host", "tsan"])
@pytest.mark.parametrize("name,quant", [("awkward", "f32"), ("wide", "int8")])
def test_shared_weights_threads_identical(c_build, colibri_file, variant, name, quant):
    build = c_build(variant)
    env = {**os.environ, "TSAN_OPTIONS": "halt_on_error=1 exitcode=66"}
    proc = subprocess.run(build.cmd("test_threads", colibri_file(name, quant), 4, 16),
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "threads: identical (4 threads, 16 decode steps" in proc.stdout
    assert "WARNING: ThreadSanitizer" not in proc.stderr
