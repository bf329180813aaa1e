"""Every error code of colibri.h, provoked and checked (tests/c/test_errors.c),
in the dynamic build and in the static work-buffer build (which alone can
return COLIBRI_E_UNSUPPORTED); and what a hostile file gets: a code, never a
crash."""
from __future__ import annotations

import dataclasses
import re
import subprocess

import numpy as np
import pytest

from colibri.file import format as cformat
from test_runtime_support import c_build  # noqa: F401

# Every code colibri.h defines (parsed, so a new code cannot be forgotten).
HEADER = cformat.Path(__file__).resolve().parent.parent / "src" / "include" / "colibri.h"


def header_codes() -> dict[str, int]:
    text = HEADER.read_text()
    return {name: int(val) for name, val in
            re.findall(r"^\s*(COLIBRI_(?:OK|E_\w+))\s*=\s*(-?\d+)", text, re.M)}


def rewrite(src, dst, byte_order="little", **shape_changes):
    """Re-write a .colibri file with format.write_file, optionally in the
    other byte order or with header fields changed."""
    cf = cformat.read_file(src)
    shape = dataclasses.replace(cf.shape, **shape_changes)
    desc = cf.desc if cf.version >= 2 else None
    tensors = [cf.tensor(k, l, e) for k, l, e in cformat.tensor_order(shape, desc)]
    return cformat.write_file(dst, shape, tensors, byte_order=byte_order, desc=desc)


@pytest.fixture(scope="module")
def error_files(colibri_file, tmp_path_factory):
    d = tmp_path_factory.mktemp("errfiles")
    good = colibri_file("tiny", "f32")
    other = rewrite(good, d / "tiny-be.colibri", byte_order="big")
    # A valid file whose KV cache (max_seq_len ~ 2^32) cannot be allocated.
    huge = rewrite(good, d / "tiny-huge.colibri", max_seq_len=0xFFFFFF00)
    return good, other, huge


def run_errors(build, files):
    proc = subprocess.run(build.cmd("test_errors", *files), capture_output=True,
                          text=True, timeout=120,
                          env={"ASAN_OPTIONS": "allocator_may_return_null=1"})
    return proc


@pytest.mark.parametrize("variant", ["host", "static"])
def test_each_case_returns_its_code(c_build, error_files, variant):
    proc = run_errors(c_build(variant), error_files)
    print(proc.stdout)
    assert "FAIL" not in proc.stdout, proc.stdout
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == "", "the library printed: " + proc.stderr


def test_every_code_is_produced_and_described(c_build, error_files):
    codes = header_codes()
    seen, texts = set(), {}
    for variant in ("host", "static"):
        out = run_errors(c_build(variant), error_files).stdout
        seen |= {int(c) for c in re.findall(r"^ok (-?\d+) ", out, re.M)}
        texts.update({int(c): t for c, t in re.findall(r"^strerror (-?\d+) (.*)$", out, re.M)})
    missing = {n: v for n, v in codes.items() if v not in seen}
    assert not missing, f"codes never produced: {missing}"
    for name, v in codes.items():
        assert texts.get(v), f"{name} has no strerror text"
    assert len({texts[v] for v in set(codes.values())}) == len(set(codes.values()))


def test_error_details_name_the_problem(c_build, error_files):
    out = run_errors(c_build("host"), error_files).stdout
    detail = dict(re.findall(r"^ok -?\d+ (.*?) \| (.*)$", out, re.M))
    assert "n_kv_heads 3 does not divide n_heads 4" in detail["n_kv_heads not dividing n_heads"]
    newer = detail["format version newer than supported"]
    assert "version 3" in newer and "upgrade" in newer
    assert re.search(r"tensor \d+ \(LM_HEAD", detail["section crc"])
    assert "truncated" in detail["truncated file"]
    assert "token id at [0, 1]" in detail["token id == vocab"]
    assert "big-endian" in detail["zero-copy of the other byte order"]


def covered(data: bytes) -> np.ndarray:
    """Which bytes of a file some check covers: the header, the table and the
    sections (CRCs); the zero padding between sections is covered by none."""
    cf = cformat.parse(data, check_crc=False)
    cov = np.zeros(len(data), bool)
    cov[:cformat.HEADER_SIZE + cformat.ENTRY_SIZE * len(cf.entries)] = True
    for e in cf.entries:
        cov[e.offset:e.offset + e.size] = True
    return cov


def test_hostile_files_never_crash(c_build, colibri_file, tmp_path):
    """Random bit flips and truncations of a real file, loaded by the
    sanitizer build: a format or CRC error, never a crash or a sanitizer
    report. A flip in the padding between sections (covered by no CRC) must
    load and give the original logits."""
    from test_runtime_support import Call, DriverError, run_driver
    build = c_build("asan")
    data = colibri_file("awkward", "int8").read_bytes()
    cov = covered(data)
    rng = np.random.default_rng(3)
    calls = [Call(np.array([[1, 2, 3]]), None, 0)]
    clean = run_driver(build, colibri_file("awkward", "int8"), calls, tmp_path / "clean")
    for i in range(9):
        bad = bytearray(data)
        if i % 3 == 2:
            bad, hits_data = bad[:int(rng.integers(0, len(bad)))], True
        else:
            at = int(rng.integers(0, len(bad)))
            bad[at] ^= 1 << int(rng.integers(0, 8))
            hits_data = bool(cov[at])
        path = tmp_path / f"bad{i}.colibri"
        path.write_bytes(bytes(bad))
        if not hits_data:
            got = run_driver(build, path, calls, tmp_path / f"run{i}", vocab=83)
            np.testing.assert_array_equal(got[0], clean[0])
            continue
        with pytest.raises(DriverError) as exc:
            run_driver(build, path, calls, tmp_path / f"run{i}", vocab=83)
        assert exc.value.code in (-1, -3), exc.value


def with_extra_section(src, dst, kind: int, flags: int, at: int = 1,
                       payload: bytes = b"\x01\x02\x03\x04" * 24,
                       dtype: int = 0, rows: int = 1, cols: int | None = None):
    """Re-lay a file with one more table entry (kind, flags, by default an F32
    [1, n] section) inserted at table position `at`, every offset and CRC
    redone."""
    import zlib
    cf = cformat.read_file(src)
    old = list(cf.entries)
    sections = [bytes(cf.section(e)) for e in old]
    extra = cformat.Entry(kind, dtype, flags, cformat.NO_INDEX, cformat.NO_INDEX, rows,
                          len(payload) // 4 if cols is None else cols, 0, len(payload),
                          zlib.crc32(payload))
    entries, datas = old[:at] + [extra] + old[at:], sections[:at] + [payload] + sections[at:]
    table_len = cformat.ENTRY_SIZE * len(entries)
    out = bytearray(cformat.HEADER_SIZE + table_len)
    laid = []
    for e, d in zip(entries, datas):
        out += bytes(cformat.align64(len(out)) - len(out))   # zero padding
        laid.append(dataclasses.replace(e, offset=len(out)))
        out += d
    out += bytes(cformat.align64(len(out)) - len(out))
    table = b"".join(cformat.pack_entry(e, "<") for e in laid)
    out[cformat.HEADER_SIZE:cformat.HEADER_SIZE + table_len] = table
    out[:cformat.HEADER_SIZE] = cformat.pack_header(cf.shape, len(laid), zlib.crc32(table), "<")
    dst.write_bytes(out)
    return dst


def test_unknown_sections(c_build, colibri_file, tmp_path):
    """FORMAT.md 3: an unknown kind without CRITICAL is skipped (still
    CRC-checked); with CRITICAL, or before EMBED, the file is refused."""
    from test_runtime_support import Call, DriverError, run_driver
    good = colibri_file("tiny", "f32")
    build = c_build("host")
    calls = [Call(np.array([[4, 5, 6]]), None, 0)]
    base = run_driver(build, good, calls, tmp_path / "base")[0]

    skip = with_extra_section(good, tmp_path / "skip.colibri", kind=200, flags=0, at=5)
    assert cformat.read_file(skip)  # the Python reader agrees it is valid
    np.testing.assert_array_equal(run_driver(build, skip, calls, tmp_path / "s")[0], base)
    info = subprocess.run([str(build.cli), "--model", str(skip), "--info"],
                          capture_output=True, text=True, check=True).stdout
    assert "unknown_sections: 1" in info

    # Its dtype and shape are a newer writer's business: size taken as stored.
    odd = with_extra_section(good, tmp_path / "odd.colibri", kind=201, flags=0, at=9,
                             payload=b"future metadata".ljust(40, b"\0"), dtype=9,
                             rows=3, cols=7)
    np.testing.assert_array_equal(run_driver(build, odd, calls, tmp_path / "o")[0], base)

    crit = with_extra_section(good, tmp_path / "crit.colibri", kind=200, flags=1, at=5)
    with pytest.raises(DriverError) as exc:
        run_driver(build, crit, calls, tmp_path / "c")
    assert exc.value.code == -1 and "unknown critical kind 200" in exc.value.detail

    first = with_extra_section(good, tmp_path / "first.colibri", kind=200, flags=0, at=0)
    with pytest.raises(DriverError) as exc:
        run_driver(build, first, calls, tmp_path / "f")
    assert exc.value.code == -1 and "before EMBED" in exc.value.detail

    data = bytearray(skip.read_bytes())
    e = cformat.read_file(skip).entries[5]
    data[e.offset] ^= 0xFF   # the skipped section is still under its CRC
    bad = tmp_path / "skipbad.colibri"
    bad.write_bytes(bytes(data))
    with pytest.raises(DriverError) as exc:
        run_driver(build, bad, calls, tmp_path / "b")
    assert exc.value.code == -3 and "tensor 5 (unknown)" in exc.value.detail
