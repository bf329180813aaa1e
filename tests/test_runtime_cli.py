"""colibri-cli: --info, --verify, --dump-router-lut, --tokens/--generate/
--logits-out (same file as `colibri run --logits-out`), --bench, errors."""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from colibri.file import format as cformat
from colibri.file.format import Kind
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


DTYPE_NAMES = {cformat.DType.F32: "f32", cformat.DType.I8_GROUP: "i8_group",
               cformat.DType.I16_ROW: "i16_row", cformat.DType.Q4_0: "q4_0",
               cformat.DType.Q4_K: "q4_k", cformat.DType.Q6_K: "q6_k",
               cformat.DType.Q5_0: "q5_0", cformat.DType.Q5_K: "q5_k",
               cformat.DType.Q8_0: "q8_0"}


def _group_dtypes(cf, first, kinds, layer) -> str:
    """What --info should print for a group, from the Python reader: the
    dtype of `first`, then every other dtype of the group's tensors."""
    want = cformat.DType(cf.entry(*first).dtype)
    held = {cformat.DType(e.dtype) for e in cf.entries if e.kind in kinds and e.layer == layer}
    return ",".join(DTYPE_NAMES[d] for d in [want] + sorted(held - {want}))


@pytest.mark.parametrize("name", ["tiny", "k256"])
def test_info_names_the_block_types_of_a_q4_file(c_build, colibri_file, name):
    """--quant q4 mixes dtypes inside a group (experts' W1 Q4_K with W2
    Q5_0 where W2's rows are narrow; on narrow models Q5_0 with int8):
    --info lists every dtype of the attention and the experts, the named
    tensor's first."""
    path = colibri_file(name, "q4")
    cf = cformat.read_file(path)
    out = cli(c_build("host"), "--model", path, "--info").stdout
    info = dict(re.findall(r"^(\w+): (.*)$", out, re.M))
    attn = _group_dtypes(cf, (Kind.WQ, 0), {Kind.WQ, Kind.WK, Kind.WV, Kind.WO}, 0)
    experts = _group_dtypes(cf, (Kind.EXPERT_W1, 0, 0),
                            {Kind.EXPERT_W1, Kind.EXPERT_W3, Kind.EXPERT_W2}, 0)
    assert info["dtype_attention"] == attn and info["dtype_experts"] == experts, out
    assert info["dtype_embed"] == DTYPE_NAMES[cformat.DType(cf.entry(Kind.EMBED).dtype)]
    assert info["dtype_lm_head"] == DTYPE_NAMES[cformat.DType(cf.entry(Kind.LM_HEAD).dtype)]
    if name == "k256":   # the test above is not vacuous: the groups are mixed
        assert (attn, experts) == ("q6_k", "q4_k,q5_0")
        assert (info["dtype_embed"], info["dtype_lm_head"]) == ("q6_k", "q5_k")


def test_verify_names_a_damaged_block_section(c_build, colibri_file, tmp_path):
    """A flipped bit in a Q5_0 block's packed values, and a NaN block scale
    with every CRC valid: --verify names the section in both, as
    `colibri verify` (the Python reader) does."""
    build = c_build("host")
    path = colibri_file("k256", "q4")
    assert "OK" in cli(build, "--model", path, "--verify").stdout
    cf = cformat.read_file(path)
    e = cf.entry(Kind.EXPERT_W2, 1, 3)
    i = cf.entries.index(e)
    assert cformat.DType(e.dtype) == cformat.DType.Q5_0
    data = bytearray(path.read_bytes())
    nbytes = cformat.blocks.BLOCK_BYTES[e.dtype]
    data[e.offset + nbytes * 7 + 9] ^= 0x10          # block 7's qs, not its d
    crc = tmp_path / "crc.colibri"
    crc.write_bytes(bytes(data))
    proc = cli(build, "--model", crc, "--verify", check=False)
    assert proc.returncode == 1
    assert re.search(rf"^FAIL section {i}: tensor {i} \(EXPERT_W2 layer 1 expert 3\): crc",
                     proc.stdout, re.M), proc.stdout
    # A NaN d in block 7, CRCs repaired: not corruption, a non-finite weight.
    import struct
    import zlib
    from test_hostile_c import _section_crc_fixed
    data = bytearray(path.read_bytes())
    struct.pack_into("<e", data, e.offset + nbytes * 7, float("nan"))   # fp16 d at 0
    nan = tmp_path / "nan.colibri"
    nan.write_bytes(bytes(_section_crc_fixed(data, "<", i)))
    assert zlib.crc32(bytes(nan.read_bytes()[e.offset:e.offset + e.size])) != e.crc
    proc = cli(build, "--model", nan, "--verify", check=False)
    assert proc.returncode == 1
    assert re.search(rf"tensor {i} \(EXPERT_W2[^)]*\): float 7 of its scales is NaN",
                     proc.stdout + proc.stderr), proc.stdout + proc.stderr
    py = subprocess.run([sys.executable, "-m", "colibri.cli", "verify", str(nan)],
                        capture_output=True, text=True)
    assert py.returncode != 0 and "float 7 of its scales is NaN" in py.stdout + py.stderr


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
