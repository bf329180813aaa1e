"""colibri-cli: --info, --verify, --dump-router-lut, --tokens/--generate/
--logits-out (same file as `colibri run --logits-out`), --bench, errors."""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from colibri import format as cformat
from colibri.format import Kind
from test_runtime_support import c_build  # noqa: F401


def cli(build, *args, check=True):
    proc = subprocess.run([str(build.cli), *map(str, args)], capture_output=True,
                          text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.mark.parametrize("name,quant", [("tiny", "f32"), ("awkward", "int8")])
def test_info_reports_the_header(c_build, colibri_file, name, quant):
    path = colibri_file(name, quant)
    out = cli(c_build("host"), "--model", path, "--info").stdout
    info = dict(re.findall(r"^(\w+): (.*)$", out, re.M))
    shape = cformat.read_file(path).shape
    for field in ("vocab", "hidden", "intermediate", "max_seq_len", "n_layers", "n_heads",
                  "n_kv_heads", "head_dim", "n_experts", "top_k", "max_batch", "group_size"):
        assert int(info[field]) == getattr(shape, field), field
    assert np.float32(info["rope_theta"]) == np.float32(shape.rope_theta)
    assert int(info["file_size"]) == path.stat().st_size
    assert info["dtype_experts"] == ("f32" if quant == "f32" else "i8_group")
    assert info["dtype_router"] == ("f32" if quant == "f32" else "i16_row")
    assert info["load"] == "mmap" and info["byte_order"] == "little"
    assert int(info["arena_bytes"]) > 0


def test_verify_passes_and_names_every_corrupted_section(c_build, colibri_file, tmp_path):
    build = c_build("host")
    path = colibri_file("wide", "int8")
    assert "OK" in cli(build, "--model", path, "--verify").stdout
    cf = cformat.read_file(path)
    data = bytearray(path.read_bytes())
    targets = [(Kind.EXPERT_W1, 1, 2), (Kind.ROUTER, 2, None)]
    index = {}
    for kind, layer, expert in targets:
        e = cf.entry(kind, layer, expert)
        data[e.offset + e.size // 2] ^= 0x40
        index[cf.entries.index(e)] = (kind, layer, expert)
    bad = tmp_path / "bad.colibri"
    bad.write_bytes(bytes(data))
    proc = cli(build, "--model", bad, "--verify", check=False)
    assert proc.returncode == 1
    fails = re.findall(r"^FAIL section (\d+): tensor \d+ \((.*?)\): crc", proc.stdout, re.M)
    assert {int(i) for i, _ in fails} == set(index), proc.stdout
    assert "EXPERT_W1 layer 1 expert 2" in proc.stdout
    assert "ROUTER layer 2)" in proc.stdout
    assert re.match(r"colibri-cli: .*bad\.colibri: CRC mismatch", proc.stderr)
    # A structural problem is named too, before any CRC is computed.
    trunc = tmp_path / "trunc.colibri"
    trunc.write_bytes(path.read_bytes()[:-64])
    proc = cli(build, "--model", trunc, "--verify", check=False)
    assert proc.returncode == 1
    assert re.search(r"^FAIL structure: tensor \d+ \(LM_HEAD\): section ends at", proc.stdout, re.M)


@pytest.mark.parametrize("quant", ["f32", "int8"])
def test_dump_router_lut_equals_the_file(c_build, colibri_file, quant):
    path = colibri_file("awkward", quant)
    out = cli(c_build("host"), "--model", path, "--dump-router-lut").stdout
    got = np.array(out.split(), dtype=np.float32)
    cf = cformat.read_file(path)
    want = []
    for layer in range(cf.shape.n_layers):
        t = cf.tensor(Kind.ROUTER, layer)
        w = t.values.astype(np.float32)
        if t.scales is not None:  # I16_ROW: q * scale per row, float32
            w = w * t.scales.astype(np.float32)[:, None]
        want.append(w.ravel())   # [experts, hidden] row-major
    np.testing.assert_array_equal(got, np.concatenate(want))


@pytest.mark.parametrize("name,quant", [("tiny", "f32"), ("wide", "f32"), ("awkward", "int8")])
def test_tokens_generate_logits_out_match_colibri_run(c_build, colibri_file, tmp_path,
                                                      name, quant):
    path = colibri_file(name, quant)
    tokens = "5,17,3,9,1,22,40,7,11,2,30,8"
    c_out, py_out = tmp_path / "c.f32", tmp_path / "py.f32"
    proc = cli(c_build("host"), "--model", path, "--tokens", tokens, "--generate", 6,
               "--logits-out", c_out)
    py = subprocess.run([sys.executable, "-m", "colibri.cli", "run", str(path), "--engine",
                         "reference", "--tokens", tokens, "--generate", "6", "--logits-out",
                         str(py_out)],
                        capture_output=True, text=True, timeout=300)
    assert py.returncode == 0, py.stderr
    c_gen = re.search(r"^generated: (.*)$", proc.stdout, re.M).group(1).split()
    py_gen = re.search(r"generated: (.*)$", py.stdout, re.M).group(1).split(",")
    assert c_gen == py_gen
    c, p = np.fromfile(c_out, "<f4"), np.fromfile(py_out, "<f4")
    assert c.size == p.size == (12 + 6 - 1) * cformat.read_file(path).shape.vocab
    tol = 1e-4 if quant == "f32" else 3e-2
    assert np.abs(c - p).max() <= tol


def test_bench_prints_latency_statistics(c_build, colibri_file):
    out = cli(c_build("host"), "--model", colibri_file("tiny", "int8"), "--bench", 200).stdout
    stats = {k: float(v) for k, v in re.findall(r"^(\w+_us): ([\d.]+)$", out, re.M)}
    assert set(stats) == {"mean_us", "p50_us", "p99_us", "stddev_us"}
    assert 0 < stats["p50_us"] <= stats["p99_us"]
    assert stats["mean_us"] > 0 and stats["stddev_us"] >= 0
    assert "decode steps: 200" in out


def test_errors_are_one_line_with_advice(c_build, colibri_file, tmp_path):
    build = c_build("host")
    proc = cli(build, "--model", tmp_path / "missing.colibri", "--info", check=False)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1
    assert re.match(r"colibri-cli: .*missing\.colibri: I/O error.*: check the path", proc.stderr)
    trunc = tmp_path / "trunc.colibri"
    trunc.write_bytes(colibri_file("tiny", "f32").read_bytes()[:1000])
    proc = cli(build, "--model", trunc, "--tokens", "1,2", check=False)
    assert proc.returncode == 1 and "bad .colibri file" in proc.stderr
    assert "truncated" in proc.stderr and proc.stderr.count("\n") == 1
    proc = cli(build, "--model", colibri_file("tiny", "f32"), "--tokens", "1,96", check=False)
    assert proc.returncode == 1 and "token id out of range" in proc.stderr
    proc = cli(build, "--model", colibri_file("tiny", "f32"), check=False)
    assert proc.returncode == 2 and "exactly one of" in proc.stderr
    help_text = cli(build, "--help").stdout
    assert "layer, expert, hidden column" in help_text
