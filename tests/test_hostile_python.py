"""Property-based fuzzing (hypothesis, deterministic, a few hundred examples
each) of the Python readers: colibri.file.format.parse over mutated, truncated and
extended .colibri files, and colibri.model.hf's safetensors reader over mutated
files and arbitrary JSON headers. Whatever the bytes, they raise nothing but
ColibriError (FormatError / ConversionError); plus malformed safetensors
cases tests/test_hf.py lacks."""
from __future__ import annotations

import json
import struct
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fuzz"))

import gen_seeds  # noqa: E402
from colibri.file import format as F  # noqa: E402
from colibri.model import hf  # noqa: E402
from colibri.errors import ColibriError, ConversionError, CRCError, FormatError  # noqa: E402

FUZZ = settings(max_examples=300, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Small valid files: f32, int8 and big-endian int8 (a few KB each), the block
# types Q4_0 / Q5_0 / Q4_K / Q6_K in both byte orders (about 16 KB each).
FILES = {
    "f32": gen_seeds.model_bytes(gen_seeds.TINY, F.PRESET_F32),
    "int8": gen_seeds.model_bytes(gen_seeds.TINY, F.PRESET_INT8, seed=1),
    "be-int8": gen_seeds.model_bytes(gen_seeds.ODD, F.PRESET_INT8, "big", seed=2),
    # Format version 2: a description with every section kind it can bring.
    "v2-qwen2": gen_seeds.model_bytes(gen_seeds.TINY, F.PRESET_INT8, seed=3,
                                      desc=gen_seeds.V2_DESCRIPTIONS["qwen2"]),
    "v2-be-olmoe": gen_seeds.model_bytes(gen_seeds.TINY, F.PRESET_F32, "big", seed=4,
                                         desc=gen_seeds.V2_DESCRIPTIONS["olmoe"]),
    # An encoder-decoder: ENC_DEC words, cross-attention and position-bias kinds.
    "v2-encdec": gen_seeds.model_bytes(gen_seeds.ENCDEC, F.PRESET_INT8, seed=5,
                                       desc=gen_seeds.ENCDEC_DESC),
    "q4-blocks": gen_seeds.block_bytes(seed=6),
    "be-q4-blocks": gen_seeds.block_bytes("big", seed=7),
}


def covered(data: bytes) -> np.ndarray:
    """Bytes some check covers: header, table, sections (the zero padding
    between sections is covered by none)."""
    cf = F.parse(data)
    cov = np.zeros(len(data), bool)
    cov[:F.HEADER_SIZE + F.ENTRY_SIZE * len(cf.entries)] = True
    for e in cf.entries:
        cov[e.offset:e.offset + e.size] = True
    return cov


COVERED = {k: covered(v) for k, v in FILES.items()}


@st.composite
def mutations(draw):
    """(file name, mutated bytes): overwrites, bit flips, a cut or an insert."""
    name = draw(st.sampled_from(sorted(FILES)))
    data = bytearray(FILES[name])
    for _ in range(draw(st.integers(1, 4))):
        # Bias towards the header and table, where the structure lives.
        hi = draw(st.sampled_from([64, 64 + 40 * 40, len(data)]))
        at = draw(st.integers(0, min(hi, len(data)) - 1))
        op = draw(st.sampled_from(["flip", "byte", "u32", "cut", "insert"]))
        if op == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "byte":
            data[at] = draw(st.integers(0, 255))
        elif op == "u32":
            v = draw(st.sampled_from([0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 0x10000, 64]))
            data[at:at + 4] = struct.pack("<I", v)[:len(data[at:at + 4])]
        elif op == "cut":
            data = data[:at]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=80))
        if not data:
            break
    return name, bytes(data)


def fix_crcs(data: bytes) -> bytes:
    """Recompute every CRC the structure lets us find (sections, table,
    header), as the C fuzz harness does, so mutations reach the checks
    behind the CRCs."""
    b = bytearray(data)
    if len(b) < 64:
        return data
    bc = ">" if b[6:8] == b"\xfe\xff" else "<"
    n = struct.unpack_from(bc + "I", b, 48)[0]
    if 64 + 40 * n <= len(b):
        for i in range(n):
            at = 64 + 40 * i
            off, size = struct.unpack_from(bc + "QQ", b, at + 16)
            if off + size <= len(b):
                struct.pack_into(bc + "I", b, at + 32, zlib.crc32(bytes(b[off:off + size])))
        struct.pack_into(bc + "I", b, 52, zlib.crc32(bytes(b[64:64 + 40 * n])))
    struct.pack_into(bc + "I", b, 60, zlib.crc32(bytes(b[:60])))
    return bytes(b)


@FUZZ
@given(mutations())
def test_parse_refuses_or_the_change_was_in_padding(m):
    """Only FormatError escapes; an accepted file differs from the original
    only in padding no check covers."""
    name, data = m
    try:
        F.parse(data)
    except FormatError:
        return
    orig = FILES[name]
    assert len(data) == len(orig)
    diff = np.frombuffer(data, np.uint8) != np.frombuffer(orig, np.uint8)
    assert not (diff & COVERED[name]).any(), "a covered byte changed and the file was accepted"


@FUZZ
@given(mutations())
def test_parse_behind_the_crcs_only_raises_format_errors(m):
    """With CRCs repaired, mutations reach every structural check; accepted
    files dequantise every tensor without error."""
    _, data = m
    try:
        cf = F.parse(fix_crcs(data))
    except FormatError:
        return
    with np.errstate(all="ignore"):       # mutated weights may be inf/NaN
        for t in cf.tensors():   # block tensors: [rows, nb] blocks
            want = ((t.rows, F.blocks.n_blocks(t.cols, t.dtype)) if F.blocks.is_block(t.dtype)
                    else (t.rows, t.cols))
            assert t.values.shape == want
        for kind, layer, expert in F.tensor_order(cf.shape, cf.desc if cf.version > 1 else None):
            cf.dequantized(kind, layer, expert)
    assert cf.verify() == []


@settings(max_examples=60, derandomize=True, deadline=None, database=None)
@given(mutations())
def test_read_file_only_raises_format_errors(m):
    """The path-based reader (mmap) on the same mutations."""
    _, data = m
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "x.colibri"
        path.write_bytes(data)
        try:
            F.read_file(path).close()
        except FormatError as exc:
            assert str(path) in str(exc)


def test_crc_failures_are_crc_errors_in_every_byte_order():
    for name, data in FILES.items():
        cf = F.parse(data)
        bad = bytearray(data)
        bad[cf.entries[-1].offset] ^= 0x80
        with pytest.raises(CRCError, match="LM_HEAD"):
            F.parse(bytes(bad))


# --- safetensors ---------------------------------------------------------------

def st_bytes(header: dict | bytes, data: bytes) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def valid_safetensors() -> bytes:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4)).astype("<f4")
    b = rng.standard_normal((5,)).astype("<f2")
    c = np.arange(6, dtype="<u2")
    header = {"a": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},
              "b": {"dtype": "F16", "shape": [5], "data_offsets": [48, 58]},
              "c": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [58, 70]},
              "__metadata__": {"format": "pt"}}
    return st_bytes(header, a.tobytes() + b.tobytes() + c.tobytes())


SAFE = valid_safetensors()


def open_and_read_all(raw: bytes) -> None:
    """SafetensorsFile + read_tensor of every tensor; only ConversionError may
    escape, and what is read has the declared number of elements."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.safetensors"
        path.write_bytes(raw)
        try:
            f = hf.SafetensorsFile(path)
        except ConversionError as exc:
            assert str(path) in str(exc)
            return
        for name, info in f.tensors.items():
            try:
                with np.errstate(all="ignore"):
                    arr = hf.read_tensor(info)
            except ConversionError as exc:
                assert repr(name) in str(exc) or str(path) in str(exc)
                continue
            assert arr.size == info.numel and arr.dtype == np.float32


@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(st.lists(st.tuples(st.integers(0, len(SAFE) - 1), st.integers(0, 255)), min_size=1,
                max_size=6),
       st.one_of(st.none(), st.integers(0, len(SAFE))))
def test_safetensors_byte_mutations_only_raise_conversion_errors(writes, cut):
    raw = bytearray(SAFE)
    for at, v in writes:
        raw[at] = v
    open_and_read_all(bytes(raw[:cut] if cut is not None else raw))


entries = st.fixed_dictionaries({
    "dtype": st.one_of(st.sampled_from(["F32", "F16", "BF16", "F64", "I8", "U8", "Q7", ""]),
                       st.integers(), st.none()),
    "shape": st.one_of(st.lists(st.integers(-2, 6), max_size=3), st.integers(), st.text(max_size=3)),
    "data_offsets": st.one_of(st.lists(st.integers(-8, 120), min_size=0, max_size=3),
                              st.none(), st.lists(st.floats(0, 64), min_size=2, max_size=2)),
})


@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(st.dictionaries(st.text(min_size=1, max_size=8), st.one_of(entries, st.integers(), st.none()),
                       max_size=4),
       st.binary(min_size=0, max_size=120))
def test_safetensors_arbitrary_headers_only_raise_conversion_errors(header, data):
    open_and_read_all(st_bytes(header, data))


# Malformed safetensors cases tests/test_hf.py lacks.
F32_1 = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
MALFORMED = {
    "header length one past the file": (
        lambda: struct.pack("<Q", 3) + b"{}", r"header length 3 goes beyond the file \(10 bytes\)"),
    "header length 2^64-1": (
        lambda: struct.pack("<Q", 2**64 - 1) + b"{}", r"header length 18446744073709551615 goes beyond"),
    "unknown dtype string, when read": (
        lambda: st_bytes({"w": {**F32_1, "dtype": "Q7"}}, bytes(4)), r"'w' has dtype Q7"),
    "dtype not a string, when read": (
        lambda: st_bytes({"w": {**F32_1, "dtype": 7}}, bytes(4)), r"'w' has dtype 7"),
    "reversed data offsets": (
        lambda: st_bytes({"w": {**F32_1, "data_offsets": [4, 0]}}, bytes(4)),
        r"'w': data_offsets \[4, 0\] go beyond"),
    "negative data offset": (
        lambda: st_bytes({"w": {**F32_1, "data_offsets": [-4, 0]}}, bytes(4)),
        r"'w': data_offsets \[-4, 0\]"),
    "float data offsets": (
        lambda: st_bytes({"w": {**F32_1, "data_offsets": [0.0, 4.0]}}, bytes(4)),
        r"'w': malformed data_offsets"),
    "negative dimension": (
        lambda: st_bytes({"w": {**F32_1, "shape": [-1]}}, bytes(4)), r"'w': malformed shape \[-1\]"),
    "header a JSON list": (lambda: st_bytes(b"[1, 2]", b""), r"a JSON list, not an object"),
    "header not UTF-8": (lambda: st_bytes(b"\xff\xfe{}", b""), r"not JSON"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_safetensors(tmp_path, case):
    make, pattern = MALFORMED[case]
    path = tmp_path / "model.safetensors"
    path.write_bytes(make())
    with pytest.raises(ConversionError, match=pattern):
        f = hf.SafetensorsFile(path)
        for info in f.tensors.values():
            hf.read_tensor(info)


def test_missing_tensor_in_a_checkpoint_is_named(tmp_path):
    """A checkpoint (index + shard) whose shard lacks a tensor the index
    lists: the error names the tensor and the shard."""
    (tmp_path / "model-00001-of-00001.safetensors").write_bytes(st_bytes({"a": F32_1}, bytes(4)))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00001.safetensors",
                        "b": "model-00001-of-00001.safetensors"}}))
    with pytest.raises(ConversionError, match=r"'b'.*model-00001-of-00001"):
        hf.Checkpoint(tmp_path)


def test_overlapping_data_offsets_are_refused(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(st_bytes({"a": {**F32_1, "data_offsets": [0, 8], "shape": [2]},
                               "b": {**F32_1, "data_offsets": [4, 8]}}, bytes(8)))
    with pytest.raises(ConversionError, match="overlap"):
        hf.SafetensorsFile(path)


def test_deeply_nested_header_is_a_conversion_error(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(st_bytes(b"[" * 100_000 + b"]" * 100_000, b""))
    with pytest.raises(ConversionError):
        hf.SafetensorsFile(path)


def test_colibri_error_is_the_only_escape_hatch():
    """FormatError and ConversionError are ColibriErrors: the CLI turns them
    into one line. (Guards the assumption the properties above rest on.)"""
    assert issubclass(FormatError, ColibriError) and issubclass(ConversionError, ColibriError)


# --- GGUF files (colibri/model/gguf_in.py, colibri/model/convert_gguf.py) -----------------

sys.path.insert(0, str(ROOT / "tests"))
import gguf_fixtures  # noqa: E402

# A TemporaryDirectory object, not mkdtemp: its finalizer removes the files
# when the (xdist worker) process ends; a bare mkdtemp left one per run.
_GGUF_TMP = tempfile.TemporaryDirectory(prefix="colibri-hostile-gguf-")
_GGUF_DIR = Path(_GGUF_TMP.name)
# A tiny Mixtral-as-`llama` GGUF (F32 and Q8_0 tensors, a byte-level
# tokenizer), about 110 KB.
GGUF = gguf_fixtures.write_gguf(_GGUF_DIR / "tiny.gguf", q8=True).read_bytes()


def convert_gguf(raw: bytes, name: str = "m") -> None:
    """The whole `colibri convert FILE.gguf` path, and `colibri info`'s."""
    from colibri.model.convert_gguf import GGUFExporter
    from colibri.model.inspect import describe_gguf
    path = _GGUF_DIR / f"{name}.gguf"
    path.write_bytes(raw)
    describe_gguf(str(path))
    GGUFExporter(path).export(_GGUF_DIR / f"{name}.colibri")


def test_the_gguf_seed_converts():
    convert_gguf(GGUF)
    F.read_file(_GGUF_DIR / "m.colibri")


def _tensor_info_at(raw: bytes, name: bytes) -> int:
    """Offset of tensor `name`'s n_dims field in the directory."""
    i = raw.index(struct.pack("<Q", len(name)) + name)
    return i + 8 + len(name)


def _set(raw: bytes, at: int, fmt: str, v) -> bytes:
    b = bytearray(raw)
    b[at:at + struct.calcsize(fmt)] = struct.pack(fmt, v)
    return bytes(b)


FIRST_KEY = 24                                  # after magic, version, counts
EMB = _tensor_info_at(GGUF, b"token_embd.weight")
MALFORMED_GGUF = {
    "cut in the header": (lambda: GGUF[:300], r"malformed GGUF header"),
    "cut in the tensor data": (lambda: GGUF[:-100], r"beyond the end of the file"),
    "only the magic": (lambda: GGUF[:4], r"malformed GGUF header"),
    "version 4": (lambda: _set(GGUF, 4, "<I", 4), r"GGUF version 4"),
    "big-endian": (lambda: _set(GGUF, 4, ">I", 3), r"big-endian GGUF"),
    "2^64-1 metadata entries": (lambda: _set(GGUF, 16, "<Q", 2**64 - 1),
                                r"18446744073709551615 metadata entries"),
    "2^40 tensors": (lambda: _set(GGUF, 8, "<Q", 2**40), r"1099511627776 tensors"),
    "key length 2^63": (lambda: _set(GGUF, FIRST_KEY, "<Q", 2**63), r"a string of"),
    "unknown value type": (
        lambda: _set(GGUF, FIRST_KEY + 8 + len("general.architecture"), "<I", 99),
        r"unknown value type 99"),
    "tensor with 7 dimensions": (lambda: _set(GGUF, EMB, "<I", 7), r"with 7 dimensions"),
    "tensor dimension 0": (lambda: _set(GGUF, EMB + 4, "<Q", 0), r"malformed shape \[0, 40\]"),
    "overflowing shape": (lambda: _set(GGUF, EMB + 4, "<Q", 2**63),
                          r"malformed shape \[9223372036854775808"),
    "unknown GGML type": (lambda: _set(GGUF, EMB + 20, "<I", 99), r"unknown GGML type 99"),
    "data offset past the end": (lambda: _set(GGUF, EMB + 24, "<Q", 2**40),
                                 r"'token_embd.weight': its data .* beyond the end"),
    "shape that disagrees with the metadata": (
        lambda: _set(GGUF, EMB + 12, "<Q", 39),
        r"'output.weight' has shape \[40, 32\], expected \[39, 32\]"),
    "not GGUF": (lambda: b"GGML" + GGUF[4:], r"not a GGUF file"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED_GGUF))
def test_malformed_gguf(case):
    make, pattern = MALFORMED_GGUF[case]
    with pytest.raises(ConversionError, match=pattern):
        convert_gguf(make(), "malformed")


def test_malformed_gguf_is_one_cli_line(tmp_path):
    import subprocess
    path = tmp_path / "cut.gguf"
    path.write_bytes(GGUF[:300])
    for cmd in (["convert", str(path), "-o", str(tmp_path / "o.colibri")], ["info", str(path)]):
        r = subprocess.run([sys.executable, "-m", "colibri.cli", *cmd], capture_output=True,
                           text=True, cwd=ROOT)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "malformed GGUF header" in r.stderr and "Traceback" not in r.stderr


@st.composite
def gguf_mutations(draw):
    """Overwrites (bytes, u32/u64 values), a cut or an insert, biased
    towards the header (metadata and tensor directory)."""
    data = bytearray(GGUF)
    header = EMB + 2000
    for _ in range(draw(st.integers(1, 4))):
        bound = draw(st.sampled_from([64, header, len(data)]))
        at = draw(st.integers(0, max(1, min(bound, len(data))) - 1))
        op = draw(st.sampled_from(["byte", "u32", "u64", "cut", "insert"]))
        if op == "byte":
            data[at] = draw(st.integers(0, 255))
        elif op in ("u32", "u64"):
            n = 4 if op == "u32" else 8
            v = draw(st.sampled_from([0, 1, 3, 7, 12, 99, 2**31, 2**32 - 1, 2**63, 2**64 - 1]))
            data[at:at + n] = v.to_bytes(8, "little")[:n][:len(data[at:at + n])]
        elif op == "cut":
            del data[at:]
            if not data:
                data = bytearray(b"G")
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


@settings(max_examples=200, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(gguf_mutations())
def test_mutated_gguf_only_raises_conversion_errors(raw):
    try:
        convert_gguf(raw, "fuzz")
    except ColibriError:
        pass
