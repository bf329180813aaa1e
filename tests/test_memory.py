"""The memory report (colibri/model/memory.py, colibri_get_weight_bytes,
colibri-cli --info): every figure against an independent count.

- colibri.model.memory.arena_bytes (the Python copy of clb_layout) equals the C
  library's colibri_arena_size_ex (chunk 16) and the arena colibri_init
  allocates (chunk 128), for both KV types, on files of every feature
  (golden configs, f32/int8/q4, shared experts, dense layers, biases, q/k
  norms) and its table sizes equal libcolibri.so's.
- The C library's bytes per part equal sums over the table entries here,
  each entry's size recomputed from dtype, rows and cols by FORMAT.md 4's
  formulas (not format.section_size).
- A conversion's table planned from config.json alone equals the written
  file's, and so does the file size.
"""
from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import GOLDEN_NAMES
from colibri.file import format as fmt
from colibri.model import memory
from colibri import runtime
from test_runtime_support import c_build  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent


def _entry_bytes(e, group):
    """FORMAT.md 4, written out again: values then scales, 64-aligned."""
    n = e.rows * e.cols
    up = lambda x: -(-x // 64) * 64   # noqa: E731
    if e.dtype == 0:
        return 4 * n
    if e.dtype == 1:
        return up(n) + 4 * e.rows * -(-e.cols // group)
    if e.dtype == 2:
        return up(2 * n) + 4 * e.rows
    cols, nbytes = {8: (32, 18), 9: (256, 144), 10: (256, 210), 11: (32, 22),
                    12: (256, 176)}[e.dtype]
    return e.rows * -(-e.cols // cols) * nbytes


def _files(colibri_file):
    out = [colibri_file(n, q) for n in GOLDEN_NAMES for q in ("f32", "int8")]
    out.append(colibri_file("k256", "q4"))
    return out


def test_table_sizes_are_the_librarys(c_build):
    lib = ctypes.CDLL(str(c_build("host").so))
    f = lib.colibri_abi_sizeof_table
    f.restype, f.argtypes = ctypes.c_size_t, [ctypes.c_uint]
    t = memory.TABLES_LP64
    assert [f(i) for i in range(5)] == [t.plan, t.layer, t.expert, t.encdec, t.xattn]


def test_arena_formula_equals_colibri_arena_size(c_build, colibri_file):
    so = c_build("host").so
    for path in _files(colibri_file):
        cf = fmt.read_file(path, check_crc=False)
        for kv in memory.KV_TYPES:
            assert runtime.arena_size(path, so, kv=kv) == memory.arena_bytes(
                cf.shape, cf.desc, kv, memory.CHUNK_TOKENS), (path.name, kv)
            with runtime.Model(path, library=so, kv=kv) as m:
                assert m.info.arena_bytes == memory.arena_bytes(
                    cf.shape, cf.desc, kv, memory.CHUNK_TOKENS_OWNED), (path.name, kv)


def test_feature_files_arena(c_build, tmp_path):
    """Shared experts, dense layers, biases, q/k norms (tests/feature_models.py)."""
    import feature_models as fm
    so = c_build("host").so
    for name, desc in fm.DESCRIPTIONS.items():
        for quant, dtypes in (("f32", fmt.PRESET_F32), ("int8", fmt.PRESET_INT8)):
            path = tmp_path / f"{name}-{quant}.colibri"
            fm.write_model(path, desc, dtypes=dtypes)
            cf = fmt.read_file(path, check_crc=False)
            for kv in memory.KV_TYPES:
                assert runtime.arena_size(path, so, kv=kv) == memory.arena_bytes(
                    cf.shape, cf.desc, kv, memory.CHUNK_TOKENS), (name, quant, kv)


def test_weight_parts_equal_sums_over_the_table(c_build, colibri_file):
    so = c_build("host").so
    for path in _files(colibri_file):
        cf = fmt.read_file(path, check_crc=False)
        want = {p: [0, set(), 0] for p in memory.PARTS}
        for e in cf.entries:
            p = memory.part_of(e.kind)
            if p != "other":
                assert e.size == _entry_bytes(e, cf.shape.group_size), e.label()
                want[p][1].add(e.dtype)
            want[p][0] += e.size
            want[p][2] += 1
        with runtime.Model(path, library=so) as m:
            got = m.weight_bytes()
        py = memory.weight_parts(cf.entries)
        for p in memory.PARTS:
            b, dts, n = got[p]
            assert (b, n) == (want[p][0], want[p][2]) == (py[p].bytes, py[p].tensors), p
            assert set(dts) == want[p][1] == set(py[p].dtypes), p
        # every part of a MoE file that it has
        assert got["experts"][0] > 0 and got["attn"][0] > 0 and got["norms"][0] > 0


def test_cli_info_reports_the_same_figures(c_build, colibri_file):
    build = c_build("host")
    path = colibri_file("wide", "int8")
    cf = fmt.read_file(path, check_crc=False)
    out = subprocess.run([str(build.cli), "--model", str(path), "--info", "--kv", "i8"],
                         capture_output=True, text=True, check=True).stdout
    lines = dict(l.split(": ", 1) for l in out.splitlines() if ": " in l)
    parts = memory.weight_parts(cf.entries)
    names = dict(zip(memory.PARTS, ("embedding", "attention", "router", "routed_experts",
                                    "shared_dense_ffn", "norms", "lm_head",
                                    "other_sections")))
    for p, n in names.items():
        assert lines[f"weights_{n}"].startswith(f"{parts[p].bytes} bytes"), p
    for kv in memory.KV_TYPES:
        per_tok, total = memory.kv_bytes(cf.shape, kv)
        assert lines[f"kv_{kv}"].startswith(f"{per_tok} bytes per token, {total} at")
    size = path.stat().st_size
    a8 = memory.arena_bytes(cf.shape, cf.desc, "i8", memory.CHUNK_TOKENS_OWNED)
    assert lines["arena_bytes"] == str(a8)
    assert lines["resident_total_kv_i8"].startswith(f"{size + a8} bytes")


@pytest.mark.parametrize("quant", memory.QUANTS)
def test_plan_from_config_equals_the_converted_file(tmp_path, quant):
    ckpt = ROOT / "models" / "demo" / "checkpoint"
    out = tmp_path / f"demo-{quant}.colibri"
    # The CLI through this interpreter: scripts/test.sh does not put .venv/bin
    # on PATH.
    subprocess.run([sys.executable, "-m", "colibri.cli", "convert", str(ckpt), "-o", str(out), "--quant", quant,
                    "--no-tokenizer"], check=True, capture_output=True)
    cf = fmt.read_file(out)
    pl = memory.plan_from_config(ckpt, quant)
    assert [(e.kind, e.layer, e.expert, e.dtype, e.rows, e.cols, e.size) for e in cf.entries] \
        == [(e.kind, e.layer, e.expert, e.dtype, e.rows, e.cols, e.size) for e in pl.entries]
    assert pl.file_size() == out.stat().st_size


def test_info_config_counts_the_tokenizer_the_converter_writes(tmp_path):
    """`colibri info --config DIR` counts the tokenizer section a conversion
    writes from DIR's tokenizer.json: its file size is the converted file's;
    a config alone says the tokenizer is not counted."""
    ckpt = ROOT / "models" / "demo" / "checkpoint"
    out = tmp_path / "demo-int8.colibri"
    cli = [sys.executable, "-m", "colibri.cli"]
    subprocess.run([*cli, "convert", str(ckpt), "-o", str(out), "--quant", "int8"],
                   check=True, capture_output=True)

    def info(path) -> str:
        return subprocess.run([*cli, "info", "--config", str(path), "--quant", "int8"],
                              check=True, capture_output=True, text=True).stdout

    text = info(ckpt)
    file_row = next(line for line in text.splitlines() if line.split()[:1] == ["file"])
    assert int(file_row.split()[1]) == out.stat().st_size, text
    assert "tokenizer.json: a " in text, text
    alone = tmp_path / "config.json"
    alone.write_bytes((ckpt / "config.json").read_bytes())
    text = info(alone)
    assert f"not counted: no tokenizer.json in {tmp_path}" in text, text
