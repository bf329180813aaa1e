"""The build itself: `python -m colibri.buildsteps.cbuild` into build/x86_64/, the
cross compilers (-Werror) including the NEON kernels, the arena size
formula documented in colibri.h, and the COLIBRI_DEBUG kernel dumps."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from colibri.buildsteps import cbuild
from colibri.file import format as cformat
from colibri.file.format import Kind
from test_runtime_support import Call, c_build, run_driver  # noqa: F401


def test_default_host_build(c_build, tmp_path):
    """`python -m colibri.buildsteps.cbuild` builds what the suite tests: the
    "host" variant, which c_build compiled from scratch (every C test needs
    it). Over a copy of that build the command finds its stamp current and
    compiles nothing, so its defaults are that variant's compiler, flags,
    kernels and sources. (A second compilation from scratch here took a
    minute of a CI run and proved no more.)"""
    host = c_build("host")
    out = tmp_path / "x86_64"
    out.mkdir()
    built = [host.info["lib"], host.so, host.cli, host.info["lib"].parent / ".build-stamp"]
    for f in built:
        shutil.copy2(f, out / f.name)
    before = {f.name: (out / f.name).stat().st_mtime_ns for f in built}
    proc = subprocess.run([sys.executable, "-m", "colibri.buildsteps.cbuild", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "built " in proc.stdout and "libcolibri.so" in proc.stdout, proc.stdout
    after = {f.name: (out / f.name).stat().st_mtime_ns for f in built}
    assert after == before and not (out / "obj").exists(), (
        "the command rebuilt the host variant: its defaults differ from c_build's")
    help_text = subprocess.run([str(out / "colibri-cli"), "--help"], capture_output=True,
                               text=True).stdout
    assert "--dump-router-lut" in help_text


def test_bare_metal_library_build(tmp_path):
    """Cortex-M (newlib, no OS): the library alone, static work buffer, no
    mmap; -Werror and printf-format checks of the error messages (uint32_t is
    unsigned long there)."""
    cc = "arm-none-eabi-gcc"
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} not installed")
    info = cbuild.build(tmp_path, cc=cc, kernels=("ref",), static_workbuf=True, mmap=False,
                        cflags=("-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard",
                                "-mfpu=fpv4-sp-d16", "-Wformat=2"), cli=False)
    assert info["lib"].exists() and info["cli"] is None


@pytest.mark.parametrize("cc,kernels,cflags", [
    ("arm-linux-gnueabihf-gcc", ("ref", "neon"),
     ("-march=armv7-a", "-mfpu=neon", "-mfloat-abi=hard")),
    ("powerpc-linux-gnu-gcc", ("ref",), ("-mcpu=powerpc",)),
    ("clang", ("ref", "avx2"), ()),
])
def test_cross_and_clang_builds_are_warning_free(tmp_path, cc, kernels, cflags):
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} not installed")
    for static in (False, True):
        try:
            cbuild.build(tmp_path / str(static), cc=cc, kernels=kernels, cflags=cflags,
                         static_workbuf=static, mmap=not static)
        except cbuild.BuildError as exc:
            if "src/kernels/" in str(exc) and "not in this tree" in str(exc):
                pytest.skip(str(exc))
            raise


def align64(n: int) -> int:
    return (n + 63) // 64 * 64


def documented_arena_data_bytes(s: cformat.ModelShape, chunk: int = 16) -> int:
    """colibri.h's formula for everything but the pointer tables, each buffer
    rounded up to 64 bytes as the runtime carves it."""
    C = min(chunk, s.max_batch * s.max_seq_len)
    q, kv = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
    mc = max(s.hidden, q, s.intermediate)
    ng = -(-mc // s.group_size)
    padded = -(-mc // 256) * 256        # block weights' activations: whole K blocks
    T = s.max_batch * s.max_seq_len
    parts = [4 * s.max_seq_len * (s.head_dim // 2)] * 2              # RoPE cos, sin
    parts += [4 * s.n_layers * T * kv] * 2 + [T]                    # KV cache, mask
    parts += [4 * C] * 2                                            # token seq/pos
    parts += [4 * C * s.hidden] * 3 + [4 * C * q] * 2 + [4 * C * kv] * 2
    parts += [4 * s.max_seq_len]                                    # scores
    parts += [4 * C * s.n_experts] * 2 + [2 * C * s.top_k, 4 * C * s.top_k]
    parts += [s.n_experts, 4 * s.n_experts, 4 * (s.n_experts + 1)]
    parts += [4 * C * s.top_k, 4 * C * s.top_k * s.hidden]          # lists, outputs
    parts += [4 * C * s.hidden] * 2 + [4 * C * s.intermediate] * 2
    parts += [C * padded, 4 * C * max(ng, padded // 32), 2 * C * padded // 16]
    return sum(align64(p) for p in parts)


@pytest.mark.parametrize("name", ["tiny", "awkward", "wide"])
def test_arena_size_follows_the_documented_formula(c_build, colibri_file, name):
    path = colibri_file(name, "f32")
    info = subprocess.run([str(c_build("host").cli), "--model", str(path), "--info"],
                          capture_output=True, text=True, check=True).stdout
    arena = int(re.search(r"^arena_bytes: (\d+)$", info, re.M).group(1))
    # colibri-cli lets the library allocate the arena: COLIBRI_CHUNK_TOKENS_OWNED.
    s = cformat.read_file(path).shape
    chunk = min(128, s.max_batch * s.max_seq_len)
    assert int(re.search(r"^chunk_tokens: (\d+)$", info, re.M).group(1)) == chunk
    tables = arena - documented_arena_data_bytes(s, chunk=128)
    # The plan and the per-layer / per-expert tensor views: pointers only.
    assert 0 < tables <= 1024 + 256 * s.n_layers + 192 * s.n_layers * s.n_experts, tables


def test_debug_build_dumps_kernel_inputs_and_outputs(c_build, colibri_file, tmp_path):
    """COLIBRI_DEBUG: every kernel call prints its first values and a hex dump
    of its first 32 bytes; the dumped embedding equals the file's rows. The
    normal build prints nothing."""
    path = colibri_file("tiny", "int8")
    calls = [Call(np.array([[7, 3]]), None, 0)]
    build = c_build("debug")
    script = tmp_path / "calls.txt"
    script.write_text("1 2 0\n7 3\n-\n")
    proc = subprocess.run(build.cmd("infer_driver", path, script, tmp_path / "o.f32"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    err = proc.stderr
    for what in ("embed out", "wq in", "wq out", "wk.wv act-q", "router out",
                 "expert.w1w3 out", "expert.w2 out", "lm_head out"):
        assert f"colibri-debug: {what} " in err, what
    hexes = re.findall(r"^colibri-debug: wq in hex:((?: [0-9a-f]{2})+)$", err, re.M)
    assert hexes and all(len(h.split()) == 32 for h in hexes)
    first = re.search(r"^colibri-debug: embed out n=(\d+) values:(.*)$", err, re.M)
    cf = cformat.read_file(path)
    emb = cf.tensor(Kind.EMBED)
    row = emb.values[7].astype(np.float32) * np.float32(emb.scales[7])
    np.testing.assert_allclose(np.array(first.group(2).split(), np.float32), row[:8],
                               rtol=1e-5)
    assert int(first.group(1)) == 2 * cf.shape.hidden
    # Same logits as the plain ref build, and that build is silent.
    got = run_driver(c_build("ref"), path, calls, tmp_path / "ref")[0]
    np.testing.assert_array_equal(np.fromfile(tmp_path / "o.f32", "<f4"), got.ravel())
    quiet = subprocess.run(c_build("host").cmd("infer_driver", path, script, tmp_path / "q.f32"),
                           capture_output=True, text=True)
    assert quiet.returncode == 0 and quiet.stderr == ""


def _cpu_flags() -> set:
    cpuinfo = Path("/proc/cpuinfo")
    return set(cpuinfo.read_text().split()) if cpuinfo.exists() else set()


def test_kernel_selection_at_init(c_build, colibri_file):
    """avx2 when linked and the CPU has AVX2+FMA, avx2-vnni when it also has
    AVX-VNNI or AVX512-VNNI (+VL), avx512-vnni when it has AVX-512
    F/BW/VL/DQ + VNNI, neither VNNI table when built with COLIBRI_AVX2_NO_VNNI
    (scons vnni=0); the ref-only build (which defines
    COLIBRI_KERNELS_REF_ONLY) always ref. COLIBRI_KERNELS=NAME forces a table
    the CPU can run; an unknown or unavailable name keeps the default."""
    def kernels(variant, force=None):
        env = dict(os.environ, COLIBRI_KERNELS=force) if force else None
        out = subprocess.run([str(c_build(variant).cli), "--model",
                              str(colibri_file("tiny", "f32")), "--info"],
                             capture_output=True, text=True, check=True, env=env).stdout
        return re.search(r"^kernels: ([\w-]+)$", out, re.M).group(1)
    assert kernels("ref") == "ref"
    assert kernels("ref", "avx2") == "ref"
    flags = _cpu_flags()
    has_avx2 = {"avx2", "fma"} <= flags
    has_vnni = "avx_vnni" in flags or {"avx512_vnni", "avx512vl"} <= flags
    has_avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= flags
    plain = "avx2" if "avx2" in cbuild.host_kernels() and has_avx2 else "ref"
    vnni = plain + "-vnni" if plain == "avx2" and has_vnni else plain
    default = "avx512-vnni" if plain == "avx2" and has_avx512 else vnni
    assert kernels("host") == default
    assert kernels("novnni") == plain
    assert kernels("host", "ref") == "ref"
    assert kernels("host", "avx2") == plain
    assert kernels("host", "avx2-vnni") == (vnni if vnni != plain else default)
    assert kernels("host", "no-such-table") == default
    assert kernels("novnni", "avx512-vnni") == plain


def test_int8_logits_same_bits_with_and_without_vnni(c_build, colibri_file, tmp_path):
    """The two x86 tables differ only in matmul_i8, and both are bit-identical
    to ref's there (kernels.h): an int8 model's logits must then be the same
    bits with vpdpbusd and without, at prefill (12 tokens: the GEMM form) and
    decode (the dot-product form). On a CPU without VNNI both builds run the
    same table and the test shows nothing new; on one with VNNI it compares
    the two forms end to end."""
    path = colibri_file("tiny", "int8")
    calls = [Call(np.array([[5, 9, 2, 7, 7, 1, 3, 8, 4, 6, 2, 9]]), None, 0),
             Call(np.array([[3]]), None, 12), Call(np.array([[11]]), None, 13)]
    host = run_driver(c_build("host"), path, calls, tmp_path / "host")
    novnni = run_driver(c_build("novnni"), path, calls, tmp_path / "novnni")
    for a, b in zip(host, novnni):
        np.testing.assert_array_equal(a, b)


def test_header_usable_from_cplusplus(c_build, tmp_path):
    """colibri.h is extern "C": a C++ program compiles warning-free and links."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    src = tmp_path / "use.cpp"
    src.write_text('#include "colibri.h"\n'
                   "int main() {\n"
                   "    colibri_model m;\n"
                   '    int rc = colibri_init(&m, "/nonexistent.colibri");\n'
                   "    colibri_free(&m);\n"
                   "    return rc == COLIBRI_E_IO ? 0 : 1;\n"
                   "}\n")
    build = c_build("ref")
    inc = [f for f in build.info["cflags"] if f.startswith("-I")]
    exe = tmp_path / "use"
    subprocess.run(["g++", "-std=c++11", "-Wall", "-Wextra", "-Werror", *inc, str(src),
                    str(build.info["lib"]), "-lm", "-o", str(exe)], check=True)
    assert subprocess.run([str(exe)]).returncode == 0
