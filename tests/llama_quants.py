"""llama.cpp's own quantisers (ggml-quants.c of the pinned llama-cpp-python
sdist) as a judge for colibri/file/kquants.py: compiled on demand into a small
shared library and called through ctypes.

The sources are the ones scripts/build_llama_bench.sh unpacks
(build/bench/llama.cpp/src/llama_cpp_python-VERSION/vendor/llama.cpp), or a
llama.cpp tree named by $COLIBRI_LLAMA_CPP (its ggml/ directory). Only
ggml-quants.c is compiled (about 5 s); the four ggml.c functions it calls
are the shim below. `load()` returns None with the reason when the sources
or a C compiler are missing, so tests can skip.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
VERSION = os.environ.get("LLAMA_CPP_PYTHON_VERSION", "0.3.36")
BUILD = ROOT / "build" / "test-llama-quants"

# GGML type ids and block geometry (ggml.h, ggml-common.h).
GGML_Q4_0, GGML_Q5_0, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K = 2, 6, 12, 13, 14
BLOCK = {GGML_Q4_0: (32, 18), GGML_Q5_0: (32, 22), GGML_Q4_K: (256, 144),
         GGML_Q5_K: (256, 176), GGML_Q6_K: (256, 210)}
NAME = {GGML_Q4_0: "q4_0", GGML_Q5_0: "q5_0", GGML_Q4_K: "q4_K", GGML_Q5_K: "q5_K",
        GGML_Q6_K: "q6_K"}

SHIM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
/* The ggml.c functions ggml-quants.c calls, for the five types we judge. */
static size_t blk(int t, int which) {
    switch (t) {
    case 2:  return which ? 18 : 32;
    case 6:  return which ? 22 : 32;
    case 12: return which ? 144 : 256;
    case 13: return which ? 176 : 256;
    case 14: return which ? 210 : 256;
    default: fprintf(stderr, "shim: type %d not supported\n", t); abort();
    }
}
size_t ggml_type_size(int t) { return blk(t, 1); }
size_t ggml_row_size(int t, long long ne) { return blk(t, 1) * (size_t)(ne / (long long)blk(t, 0)); }
const char *ggml_type_name(int t) { (void)t; return "?"; }
void ggml_abort(const char *file, int line, const char *fmt, ...) {
    fprintf(stderr, "ggml_abort %s:%d %s\n", file, line, fmt); abort();
}
"""


def source_dir() -> Path | None:
    env = os.environ.get("COLIBRI_LLAMA_CPP")
    cands = [Path(env)] if env else []
    cands.append(ROOT / "build" / "bench" / "llama.cpp" / "src" /
                 f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp")
    for c in cands:
        if (c / "ggml" / "src" / "ggml-quants.c").is_file():
            return c / "ggml"
    return None


_lib = None


def load():
    """(library, None) or (None, reason)."""
    global _lib
    if _lib is not None:
        return _lib, None
    src = source_dir()
    if src is None:
        return None, ("llama.cpp sources not found: run scripts/build_llama_bench.sh "
                      "or set COLIBRI_LLAMA_CPP to a llama.cpp tree")
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return None, "no C compiler"
    BUILD.mkdir(parents=True, exist_ok=True)
    so = BUILD / "libggmlquants.so"
    quants = src / "src" / "ggml-quants.c"
    shim = BUILD / "shim.c"
    stale_shim = not shim.exists() or shim.read_text() != SHIM   # the types it knows
    if stale_shim or not so.exists() or so.stat().st_mtime < quants.stat().st_mtime:
        shim.write_text(SHIM)
        cmd = [cc, "-O2", "-shared", "-fPIC", f"-I{src / 'include'}", f"-I{src / 'src'}",
               f"-I{src / 'src' / 'ggml-cpu'}", str(quants), str(shim), "-o", str(so), "-lm"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            return None, f"cannot compile ggml-quants.c: {r.stderr[-500:]}"
    lib = ctypes.CDLL(str(so))
    for name in NAME.values():
        q = getattr(lib, f"quantize_{name}")
        q.restype = ctypes.c_size_t
        q.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                      ctypes.c_void_p]
        d = getattr(lib, f"dequantize_row_{name}")
        d.restype = None
        d.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    _lib = lib
    return lib, None


def roundtrip(w: np.ndarray, ggml_type: int, imatrix: np.ndarray | None = None) -> np.ndarray:
    """llama.cpp's quantize_<type> then dequantize_row_<type>: the float32
    values llama-quantize would store for w [rows, cols] (cols a multiple of
    the block), with the importance matrix `imatrix` [cols] or none."""
    lib, why = load()
    if lib is None:
        raise RuntimeError(why)
    name = NAME[ggml_type]
    w = np.ascontiguousarray(w, dtype=np.float32)
    rows, cols = w.shape
    bcols, bbytes = BLOCK[ggml_type]
    assert cols % bcols == 0
    dst = np.zeros(rows * cols // bcols * bbytes, np.uint8)
    qw = None
    if imatrix is not None:
        imatrix = np.ascontiguousarray(imatrix, dtype=np.float32)
        qw = imatrix.ctypes.data
    getattr(lib, f"quantize_{name}")(w.ctypes.data, dst.ctypes.data, rows, cols, qw)
    out = np.zeros(rows * cols, np.float32)
    getattr(lib, f"dequantize_row_{name}")(dst.ctypes.data, out.ctypes.data, rows * cols)
    return out.reshape(rows, cols)
