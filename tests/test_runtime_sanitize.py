"""The C tests under AddressSanitizer + UndefinedBehaviorSanitizer (any
report fails: -fno-sanitize-recover=all, and ASan exits non-zero), and
valgrind memcheck on a colibri-cli run."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from test_runtime_errors import error_files, run_errors  # noqa: F401
from test_runtime_support import (c_build, golden_calls, reference_logits,  # noqa: F401
                                  relative_row_error, run_driver, valid_rows)


@pytest.mark.parametrize("name,quant", [("tiny", "f32"), ("awkward", "int8"),
                                        ("wide", "f32")])
def test_golden_under_asan_ubsan(c_build, colibri_file, reference, tmp_path, name, quant):
    build = c_build("asan")
    ref = reference(name, quant)
    calls = golden_calls(ref.shape.vocab, 3, seed=11, decode=8)
    for memory in (False, True):
        got = run_driver(build, colibri_file(name, quant), calls,
                         tmp_path / str(memory), memory=memory)
        want = reference_logits(ref, calls)
        rel = relative_row_error(valid_rows(calls, got), valid_rows(calls, want))
        assert np.median(rel) < 1e-5 and rel.max() < 3e-2


def test_errors_under_asan_ubsan(c_build, error_files):
    proc = run_errors(c_build("asan"), error_files)
    assert proc.returncode == 0 and "FAIL" not in proc.stdout, proc.stdout + proc.stderr
    assert "ERROR: AddressSanitizer" not in proc.stderr
    assert "runtime error" not in proc.stderr


def test_threads_under_asan_ubsan(c_build, colibri_file):
    proc = subprocess.run(c_build("asan").cmd("test_threads", colibri_file("tiny", "int8"), 4, 8),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed")
@pytest.mark.parametrize("args", [["--tokens", "1,2,3,4,5,6,7,8,9", "--generate", "4"],
                                  ["--verify"], ["--info"]])
def test_cli_valgrind_memcheck_clean(c_build, colibri_file, args):
    cli = c_build("ref").cli
    proc = subprocess.run(["valgrind", "--error-exitcode=1", "--leak-check=full",
                           "--errors-for-leak-kinds=definite,indirect", "-q",
                           str(cli), "--model", str(colibri_file("awkward", "int8")), *args],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ERROR SUMMARY" not in proc.stderr or "0 errors" in proc.stderr


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "olmoe", "granite"])
def test_version_2_features_under_asan_ubsan(c_build, tmp_path, name):
    """Every feature of the description (tests/feature_models.py) through
    the runtime under ASan + UBSan, mapped and zero-copy, int8."""
    from colibri.file import format as F
    from colibri.model.reference import Reference
    from feature_models import DESCRIPTIONS, SHAPE, write_model
    path = write_model(tmp_path / f"{name}.colibri", DESCRIPTIONS[name], dtypes=F.PRESET_INT8)
    calls = golden_calls(SHAPE.vocab, 3, seed=12, decode=8)
    want = reference_logits(Reference(path), calls)
    for memory in (False, True):
        got = run_driver(c_build("asan"), path, calls, tmp_path / str(memory), memory=memory,
                         vocab=SHAPE.vocab)
        rel = relative_row_error(valid_rows(calls, got), valid_rows(calls, want))
        assert np.median(rel) < 1e-5 and rel.max() < 3e-2
