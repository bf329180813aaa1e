"""Byte order and targets: a big-endian file gives the same logits as the
little-endian one on x86 (swapped at load), is refused by zero-copy loading
with COLIBRI_E_BYTE_ORDER, and the portable ref build gives bit-identical
logits on x86-64 and every emulated Linux target: 32-bit big-endian PowerPC
(qemu-ppc, in place and swapped), ARMv7 (qemu-arm), AArch64 (qemu-aarch64)
and RISC-V 64 (qemu-riscv64). The NEON builds pick their kernel table per
CPU (AArch64: SDOT on a Cortex-A76, not on a Cortex-A72) and match the
reference. A file of 2 MiB or more that the library copies (read, or
swapped) lands in memory advised for huge pages."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import numpy as np
import pytest

from colibri.buildsteps.testmodel import FW_TINY, make_model
from test_runtime_errors import rewrite
from test_runtime_support import (CROSS_LINUX, TARGETS, Call, DriverError,  # noqa: F401
                                  c_build, run_driver)

COLIBRI_E_BYTE_ORDER = -6


@pytest.fixture(scope="module")
def tiny_files(colibri_file, tmp_path_factory):
    """tiny int8 (every dtype path: I16 embed/router, I8 experts) in both
    byte orders, plus tiny f32 big-endian, and k256 with `--quant q4`
    (Q4_K, Q6_K, Q4_0 blocks: a swap touches only their fp16 scale fields) in
    both byte orders."""
    d = tmp_path_factory.mktemp("byteorder")
    le = colibri_file("tiny", "int8")
    q4 = colibri_file("k256", "q4")
    return {"le": le, "be": rewrite(le, d / "tiny-int8-be.colibri", byte_order="big"),
            "f32-le": colibri_file("tiny", "f32"),
            "f32-be": rewrite(colibri_file("tiny", "f32"), d / "tiny-f32-be.colibri",
                              byte_order="big"),
            "q4-le": q4, "q4-be": rewrite(q4, d / "k256-q4-be.colibri", byte_order="big")}


def script(vocab=96):
    rng = np.random.default_rng(5)
    toks = rng.integers(0, vocab, size=(2, 12))
    mask = np.ones((2, 12), dtype=np.int64)
    mask[1, :3] = 0
    calls = [Call(toks, mask, 0)]
    calls += [Call(rng.integers(0, vocab, size=(2, 1)), None, 12 + i) for i in range(6)]
    return calls


def logits(build, path, tmp, memory=False):
    return np.concatenate([x.ravel() for x in
                           run_driver(build, path, script(), tmp, memory=memory, vocab=96)])


@pytest.mark.parametrize("kind", ["le", "f32-le", "q4-le"])
def test_big_endian_file_same_logits_on_x86(c_build, tiny_files, tmp_path, kind):
    other = tiny_files[kind.replace("le", "be")]
    for variant in ("host", "nommap"):
        build = c_build(variant)
        a = logits(build, tiny_files[kind], tmp_path / f"{variant}-le")
        b = logits(build, other, tmp_path / f"{variant}-be")
        np.testing.assert_array_equal(a, b)
    info = subprocess.run([str(c_build("host").cli), "--model", str(other), "--info"],
                          capture_output=True, text=True).stdout
    assert "byte_order: big (swapped in memory)" in info


def _info(build, path) -> dict:
    out = subprocess.run([str(build.cli), "--model", str(path), "--info"], capture_output=True,
                         text=True, check=True).stdout
    return dict(re.findall(r"^(\w+): (.*)$", out, re.M))


def test_large_copies_go_to_huge_page_memory(c_build, tmp_path):
    """The read build (mmap off: the x86_64 target's default) reads a file of
    2 MiB or more into an anonymous region advised MADV_HUGEPAGE, and so does
    the mapped build when it swaps a big-endian file; a mapped file stays
    mapped. Every way gives the same logits."""
    shape = dataclasses.replace(FW_TINY, vocab=2048, hidden=128, intermediate=256,
                                n_experts=8, max_seq_len=32, max_batch=2)
    le = make_model(tmp_path / "big-le.colibri", "f32", shape=shape)
    be = make_model(tmp_path / "big-be.colibri", "f32", shape=shape, byte_order="big")
    assert le.stat().st_size > 4 << 20
    huge = "advised" if sys.platform.startswith("linux") else "no"
    read, mapped = c_build("nommap"), c_build("ref")  # both ref kernels, so bit-equal
    cases = [(read, le, "read", huge), (mapped, le, "mmap", "no"), (mapped, be, "mmap", huge),
             (read, be, "read", huge)]
    got = []
    for i, (build, path, load, advised) in enumerate(cases):
        info = _info(build, path)
        assert (info["load"], info["huge_pages"]) == (load, advised), (path.name, info)
        got.append(np.concatenate([x.ravel() for x in run_driver(
            build, path, script(), tmp_path / f"case{i}", vocab=shape.vocab)]))
    for other in got[1:]:
        np.testing.assert_array_equal(other, got[0])
    # Under 2 MiB the copy is an ordinary allocation.
    small = make_model(tmp_path / "small.colibri", "f32")
    assert (_info(read, small)["load"], _info(read, small)["huge_pages"]) == ("read", "no")


def test_zero_copy_refuses_other_byte_order(c_build, tiny_files, tmp_path):
    for variant in ("static", "host"):
        with pytest.raises(DriverError) as exc:
            logits(c_build(variant), tiny_files["be"], tmp_path / variant, memory=True)
        assert exc.value.code == COLIBRI_E_BYTE_ORDER
        assert "big-endian" in exc.value.detail


def test_static_workbuf_build_same_logits_and_no_allocator(c_build, tiny_files, tmp_path):
    static, ref = c_build("static"), c_build("ref")
    a = logits(static, tiny_files["le"], tmp_path / "s", memory=True)
    b = logits(ref, tiny_files["le"], tmp_path / "r")
    np.testing.assert_array_equal(a, b)
    # The library itself references no allocator and no file or mapping call.
    nm = subprocess.run(["nm", "-u", str(static.info["lib"])], capture_output=True,
                        text=True, check=True).stdout
    undefined = {line.split()[-1] for line in nm.splitlines() if line.strip()}
    forbidden = {"malloc", "calloc", "realloc", "free", "mmap", "munmap", "open",
                 "fopen", "fread", "read", "write", "printf", "fprintf"}
    assert not undefined & forbidden, undefined & forbidden


@pytest.mark.parametrize("model", ["int8", "q4"])
@pytest.mark.parametrize("variant", CROSS_LINUX)
def test_ref_build_bit_identical_under_qemu(c_build, tiny_files, tmp_path, variant, model):
    """The scalar path with -ffp-contract=off gives the same bits on every
    target. On a big-endian target (PowerPC): the little-endian file is
    swapped at load (read, mmap off), the big-endian one used in place (also
    zero-copy). q4: the block kernels, and the swap of the blocks' float32
    fields (d, dmin) on a big-endian host."""
    pre = "" if model == "int8" else "q4-"
    x86 = logits(c_build("ref"), tiny_files[pre + "le"], tmp_path / "x86")
    target = c_build(variant)
    runs = [(pre + "le", False)]
    if TARGETS[variant].byte_order == "big":
        runs += [(pre + "be", False), (pre + "be", True)]
    for kind, memory in runs:
        got = logits(target, tiny_files[kind], tmp_path / f"{variant}-{kind}-{memory}",
                     memory=memory)
        np.testing.assert_array_equal(got, x86, err_msg=f"{variant} {kind} memory={memory}")


NEON_VARIANTS = {"armv7-neon": "neon", "aarch64-neon": "neon",
                 "aarch64-dotprod": "neon-dotprod"}


@pytest.mark.parametrize("variant", list(NEON_VARIANTS))
def test_neon_build_under_qemu_matches_reference(c_build, tiny_files, colibri_file,
                                                 reference, tmp_path, variant):
    """A NEON build with its table selected at init (colibri-cli --info
    names it: AArch64 picks SDOT only on the Cortex-A76): f32 logits within
    1e-4 of the numpy reference, int8 close to the ref build."""
    from test_runtime_support import reference_logits
    build = c_build(variant)
    info = subprocess.run(build.cmd(str(build.cli), "--model", tiny_files["le"], "--info"),
                          capture_output=True, text=True, timeout=120).stdout
    assert f"\nkernels: {NEON_VARIANTS[variant]}\n" in info, info
    calls = script()
    got = run_driver(build, tiny_files["f32-le"], calls, tmp_path / "f32", vocab=96)
    want = reference_logits(reference("tiny", "f32"), calls)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=0)
    # int8: as in test_runtime_golden, rows agree to rounding except those
    # downstream of an int8 activation rounding flip (<= 3e-2 relative).
    from test_runtime_support import relative_row_error
    a = logits(build, tiny_files["le"], tmp_path / "neon").reshape(-1, 96)
    b = logits(c_build("ref"), tiny_files["le"], tmp_path / "ref").reshape(-1, 96)
    rel = relative_row_error(a, b)
    assert np.median(rel) < 1e-5 and rel.max() < 3e-2


def test_aarch64_sdot_and_plain_neon_give_the_same_bits(c_build, tiny_files, tmp_path):
    """The one library, on a core without and one with the dot-product
    extension: different int8 matmuls (smull/sadalp, SDOT), both
    bit-identical to ref's (kernels.h), so the same logits, bit for bit, on
    the int8 model (int8 experts, attention and LM head) through prefill and
    decode."""
    plain = logits(c_build("aarch64-neon"), tiny_files["le"], tmp_path / "a72")
    sdot = logits(c_build("aarch64-dotprod"), tiny_files["le"], tmp_path / "a76")
    np.testing.assert_array_equal(plain.view(np.uint32), sdot.view(np.uint32))
