"""The .colibri reader and writer (colibri/file/format.py) against docs/FORMAT.md:
round trips, byte order, layout rules, and a table of hostile files each of
which must give its own clear error."""
from __future__ import annotations

import dataclasses
import struct
import zlib

import numpy as np
import pytest

from colibri.file import format as F
from colibri.file import quant as Q
from colibri.errors import CRCError, FormatError

SHAPE = F.ModelShape(vocab=83, hidden=60, intermediate=44, max_seq_len=64, n_layers=2,
                     n_heads=5, n_kv_heads=1, head_dim=12, n_experts=6, top_k=3,
                     max_batch=2, group_size=32, rope_theta=1e4, rms_eps=1e-6)


def random_weights(shape: F.ModelShape, seed: int = 0):
    rng = np.random.default_rng(seed)
    return {key: rng.standard_normal(F.expected_shape(shape, key[0])).astype(np.float32)
            for key in F.tensor_order(shape)}


def write(path, shape=SHAPE, preset=F.PRESET_F32, byte_order="little", seed=0):
    weights = random_weights(shape, seed)
    with F.ColibriWriter(path, shape, preset, byte_order) as w:
        for key in F.tensor_order(shape):
            w.add(*key, weights[key])
    return weights


@pytest.fixture(scope="module")
def f32_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("fmt") / "f32.colibri"
    weights = write(path)
    return path, weights


@pytest.fixture(scope="module")
def int8_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("fmt") / "int8.colibri"
    weights = write(path, preset=F.PRESET_INT8)
    return path, weights


# --- layout ---------------------------------------------------------------

def test_header_is_64_bytes_and_starts_with_magic(f32_file):
    raw = f32_file[0].read_bytes()
    assert raw[:4] == b"CLBR"
    assert raw[6:8] == b"\xff\xfe"  # 0xFEFF little-endian
    assert zlib.crc32(raw[:60]) == struct.unpack("<I", raw[60:64])[0]
    n = struct.unpack_from("<I", raw, 48)[0]
    assert n == len(F.tensor_order(SHAPE))
    assert zlib.crc32(raw[64:64 + 40 * n]) == struct.unpack_from("<I", raw, 52)[0]


def test_sections_aligned_in_order_and_experts_contiguous(f32_file):
    cf = F.read_file(f32_file[0])
    for e in cf.entries:
        assert e.offset % 64 == 0
    for a, b in zip(cf.entries, cf.entries[1:]):
        assert b.offset == F.align64(a.offset + a.size)
    for layer in range(SHAPE.n_layers):
        for ex in range(SHAPE.n_experts):
            w1, w3, w2 = (cf.entry(k, layer, ex) for k in F.EXPERT_KINDS)
            span = w2.offset + w2.size - w1.offset
            assert span < w1.size + w3.size + w2.size + 2 * 64


def test_f32_values_exact(f32_file):
    path, weights = f32_file
    cf = F.read_file(path)
    for (kind, layer, expert), w in weights.items():
        np.testing.assert_array_equal(cf.dequantized(kind, layer, expert), w)


def test_int8_error_within_half_a_step(int8_file):
    path, weights = int8_file
    cf = F.read_file(path)
    for (kind, layer, expert), w in weights.items():
        t = cf.tensor(kind, layer, expert)
        deq = cf.dequantized(kind, layer, expert)
        if t.dtype == F.DType.I8_GROUP:
            step = np.repeat(t.scales, SHAPE.group_size, axis=1)[:, :t.cols]
        elif t.dtype == F.DType.I16_ROW:
            step = np.broadcast_to(t.scales[:, None], t.values.shape)
        else:
            step = np.zeros_like(w)
        # half a quantisation step, plus float32 rounding of q * scale
        assert np.all(np.abs(deq - w) <= step / 2 + 1e-6 * np.abs(w)), (kind, layer, expert)


def test_int8_dtypes_match_preset(int8_file):
    cf = F.read_file(int8_file[0])
    # The kinds a Mixtral (version 1) file holds, each as the preset says.
    assert set(cf.dtypes) == {*F.GLOBAL_KINDS, *F.LAYER_KINDS, *F.EXPERT_KINDS}
    assert cf.dtypes == {k: F.PRESET_INT8[k] for k in cf.dtypes}


@pytest.mark.parametrize("preset", [F.PRESET_F32, F.PRESET_INT8], ids=["f32", "int8"])
def test_write_read_write_byte_identical(tmp_path, preset):
    a, b = tmp_path / "a.colibri", tmp_path / "b.colibri"
    write(a, preset=preset)
    cf = F.read_file(a)
    F.write_file(b, cf.shape, cf.tensors(), cf.byte_order, desc=cf.desc)
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("preset", [F.PRESET_F32, F.PRESET_INT8], ids=["f32", "int8"])
def test_big_endian_file_reads_to_the_same_model(tmp_path, preset):
    le, be = tmp_path / "le.colibri", tmp_path / "be.colibri"
    write(le, preset=preset)
    write(be, preset=preset, byte_order="big")
    raw = be.read_bytes()
    assert raw[6:8] == b"\xfe\xff"
    a, b = F.read_file(le), F.read_file(be)
    assert b.byte_order == "big" and a.shape == b.shape
    for ta, tb in zip(a.tensors(), b.tensors()):
        np.testing.assert_array_equal(ta.values, tb.values)
        if ta.scales is not None:
            np.testing.assert_array_equal(ta.scales, tb.scales)
    # Re-writing the big-endian file little-endian gives the little-endian file.
    again = tmp_path / "again.colibri"
    F.write_file(again, b.shape, b.tensors(), "little")
    assert again.read_bytes() == le.read_bytes()


def test_writer_refuses_wrong_order_and_shape(tmp_path):
    w = F.ColibriWriter(tmp_path / "x.colibri", SHAPE)
    with pytest.raises(FormatError, match="file order expects EMBED"):
        with w:
            w.add(F.Kind.LM_HEAD, None, None, np.zeros((83, 60), np.float32))
    assert not (tmp_path / "x.colibri").exists()
    assert not (tmp_path / "x.colibri.partial").exists()
    w = F.ColibriWriter(tmp_path / "x.colibri", SHAPE)
    with pytest.raises(FormatError, match=r"shape \(83, 61\), expected \(83, 60\)"):
        with w:
            w.add(F.Kind.EMBED, None, None, np.zeros((83, 61), np.float32))


def test_writer_refuses_incomplete_model(tmp_path):
    with pytest.raises(FormatError, match="ATTN_NORM layer 0 was never given"):
        with F.ColibriWriter(tmp_path / "x.colibri", SHAPE) as w:
            w.add(F.Kind.EMBED, None, None, np.zeros((83, 60), np.float32))
    assert not (tmp_path / "x.colibri").exists()


def test_writer_refuses_dtype_not_allowed_for_kind(tmp_path):
    bad = {**F.PRESET_F32, F.Kind.ATTN_NORM: F.DType.I8_GROUP}
    with pytest.raises(FormatError, match="ATTN_NORM cannot be stored as I8_GROUP"):
        F.ColibriWriter(tmp_path / "x.colibri", SHAPE, bad)


# --- quantisers -------------------------------------------------------------

def test_quantize_i8_group_rounds_half_to_even_and_never_writes_minus_128():
    w = np.array([[127.0, 0.5, 1.5, 2.5, -127.0, -0.5]], np.float32)
    q, s = Q.quantize_i8_group(w, 6)
    assert s[0, 0] == np.float32(1.0)
    assert q.tolist() == [[127, 0, 2, 2, -127, 0]]


def test_zero_group_has_zero_scale():
    q, s = Q.quantize_i8_group(np.zeros((2, 5), np.float32), 4)
    assert np.all(q == 0) and np.all(s == 0)
    xq, xs = Q.quantize_activations_i8(np.zeros((1, 5), np.float32), 4)
    assert np.all(xq == 0) and np.all(xs == 0)


def test_i8_matmul_equals_brute_force_formula():
    """The I8_GROUP product against FORMAT.md 5 written out loop by loop."""
    rng = np.random.default_rng(3)
    rows, cols, G, n = 5, 37, 8, 3
    q, s = Q.quantize_i8_group(rng.standard_normal((rows, cols)).astype(np.float32), G)
    xq, xs = Q.quantize_activations_i8(rng.standard_normal((n, cols)).astype(np.float32), G)
    y = Q.matmul_i8(xq, xs, q, s, G)
    for t in range(n):
        for r in range(rows):
            acc = np.float32(0)
            for g in range(-(-cols // G)):
                lo, hi = g * G, min(cols, (g + 1) * G)
                dot = int(np.dot(q[r, lo:hi].astype(np.int64), xq[t, lo:hi].astype(np.int64)))
                acc = np.float32(acc + np.float32(dot) * np.float32(s[r, g] * xs[t, g]))
            assert y[t, r] == acc


def test_activation_quantisation_is_close():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 100)).astype(np.float32)
    xq, xs = Q.quantize_activations_i8(x, 32)
    back = Q.dequantize_i8_group(xq.reshape(4, 100), xs, 32)
    assert np.max(np.abs(back - x)) <= np.max(xs) / 2 * 1.0001


# --- hostile files: each gives its own specific error -------------------------

def _fix_crcs(raw: bytearray, bc="<") -> bytearray:
    """Recompute table and header CRCs so a test reaches the check it aims at."""
    n = struct.unpack_from(bc + "I", raw, 48)[0]
    table = bytes(raw[64:64 + 40 * n])
    struct.pack_into(bc + "I", raw, 52, zlib.crc32(table))
    struct.pack_into(bc + "I", raw, 60, zlib.crc32(bytes(raw[:60])))
    return raw


def _set_header(raw, name, value):
    off = dict((n, o) for n, _, o in F.HEADER_FIELDS)[name]
    code = dict((n, c) for n, c, _ in F.HEADER_FIELDS)[name]
    struct.pack_into("<" + code, raw, off, value)
    return _fix_crcs(raw)


def _set_entry(raw, index, name, value):
    off = dict((n, o) for n, _, o in F.ENTRY_FIELDS)[name]
    code = dict((n, c) for n, c, _ in F.ENTRY_FIELDS)[name]
    struct.pack_into("<" + code, raw, 64 + 40 * index + off, value)
    return _fix_crcs(raw)


HOSTILE = {
    # name: (mutation of the valid file's bytes, expected message pattern)
    "empty": (lambda r: bytearray(), "empty|shorter than"),
    "short header": (lambda r: r[:40], "shorter than the 64-byte header"),
    "bad magic": (lambda r: bytearray(b"CLBX") + r[4:], "magic is b'CLBX'"),
    # llama.cpp's file where a .colibri one is wanted: named, with the command
    "gguf magic": (lambda r: bytearray(b"GGUF") + r[4:],
                   r"a GGUF file, not a \.colibri file: convert it with `colibri convert"),
    "bad bom": (lambda r: r[:6] + b"\x12\x34" + r[8:], "byte-order mark is 1234"),
    "newer version": (lambda r: _set_header(r, "version", 3), "version 3 is newer.*upgrade"),
    "version 0": (lambda r: _set_header(r, "version", 0), "version 0 is not supported"),
    "header crc": (lambda r: r[:60] + bytes([r[60] ^ 1]) + r[61:], "header CRC mismatch"),
    "vocab 0": (lambda r: _set_header(r, "vocab", 0), "vocab = 0 is out of range"),
    "hidden 0": (lambda r: _set_header(r, "hidden", 0), "hidden = 0 is out of range"),
    "layers 0": (lambda r: _set_header(r, "n_layers", 0), "n_layers = 0 is out of range"),
    "top_k above experts": (lambda r: _set_header(r, "top_k", 7), "top_k = 7 exceeds n_experts = 6"),
    "kv heads not dividing": (lambda r: _set_header(r, "n_kv_heads", 2), "n_kv_heads = 2 does not divide"),
    "odd head_dim": (lambda r: _set_header(r, "head_dim", 11), "head_dim = 11 must be even"),
    "nan rope_theta": (lambda r: _set_header(r, "rope_theta", float("nan")), "rope_theta = nan"),
    "negative eps": (lambda r: _set_header(r, "rms_eps", -1.0), "rms_eps = -1.0"),
    "flags set": (lambda r: _set_header(r, "flags", 4), "flags = 0x4"),
    "n_tensors 0": (lambda r: _set_header(r, "n_tensors", 0), "n_tensors = 0"),
    "table past end": (lambda r: _set_header(r, "n_tensors", 0xFFFFFFFF), "past the end of the file"),
    "table crc": (lambda r: r[:70] + bytes([r[70] ^ 1]) + r[71:], "tensor table CRC mismatch"),
    "hidden changed": (lambda r: _set_header(r, "hidden", 61), r"shape \[83, 60\], the header implies \[83, 61\]"),
    "vocab overflow": (lambda r: _set_header(r, "vocab", 0xFFFFFFFF), r"the header implies \[4294967295, 60\]"),
    "unknown dtype": (lambda r: _set_entry(r, 0, "dtype", 14), "dtype = 14 is unknown"),
    "retired dtype": (lambda r: _set_entry(r, 0, "dtype", 4),
                      "dtype 4 is a retired float32-scale block of an older colibri: re-convert"),
    "dtype not allowed": (lambda r: _set_entry(r, 1, "dtype", 1), "dtype I8_GROUP is not allowed for ATTN_NORM"),
    "rows changed": (lambda r: _set_entry(r, 0, "rows", 84), r"shape \[84, 60\]"),
    "size wrong": (lambda r: _set_entry(r, 0, "size", 4), "size = 4, expected 19920"),
    "size huge": (lambda r: _set_entry(r, 0, "size", 2**64 - 1), "size = 18446744073709551615"),
    "misaligned offset": (lambda r: _set_entry(r, 1, "offset",
                                               struct.unpack_from("<Q", r, 64 + 40 + 16)[0] + 4),
                          "offset = .*, expected"),
    "overlapping offset": (lambda r: _set_entry(r, 1, "offset",
                                                struct.unpack_from("<Q", r, 64 + 16)[0]),
                           "offset = .*, expected"),
    "wrong layer": (lambda r: _set_entry(r, 1, "layer", 5), "ATTN_NORM layer 5.*out of order"),
    "expert on a layer tensor": (lambda r: _set_entry(r, 1, "expert", 0), "out of order or out of range"),
    "duplicate entry": (lambda r: bytearray(r[:64 + 40]) + r[64 + 40:64 + 80] + r[64 + 40:],
                        "out of order|CRC"),
    "critical unknown kind": (lambda r: _set_entry(r, 1, "kind", 99), "kind 99 is unknown and marked critical"),
    "entry flags": (lambda r: _set_entry(r, 1, "flags", 0x80), "flags = 0x80 has unknown bits"),
    "reserved set": (lambda r: _set_entry(r, 1, "reserved", 1), "reserved = 1, must be 0"),
    "trailing bytes": (lambda r: r + b"\0" * 64, "trailing bytes"),
    "section crc": (lambda r: r[:-100] + bytes([r[-100] ^ 0x40]) + r[-99:], "CRC mismatch in LM_HEAD"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_file_gives_specific_error(f32_file, tmp_path, case):
    mutate, pattern = HOSTILE[case]
    raw = bytearray(f32_file[0].read_bytes())
    bad = tmp_path / "bad.colibri"
    bad.write_bytes(bytes(mutate(raw)))
    with pytest.raises(FormatError, match=pattern):
        F.read_file(bad)


def test_crc_errors_are_crc_errors(f32_file, tmp_path):
    raw = bytearray(f32_file[0].read_bytes())
    raw[-100] ^= 1
    bad = tmp_path / "bad.colibri"
    bad.write_bytes(bytes(raw))
    with pytest.raises(CRCError):
        F.read_file(bad)
    cf = F.read_file(bad, check_crc=False)  # structure still valid
    assert len(cf.verify()) == 1 and "LM_HEAD" in cf.verify()[0]


def test_truncated_at_every_64_byte_boundary_is_refused(tmp_path):
    # A small model of every storage type keeps the number of cuts modest.
    small = dataclasses.replace(SHAPE, vocab=17, hidden=20, intermediate=12, n_experts=3,
                                top_k=2, group_size=8)
    path = tmp_path / "small.colibri"
    write(path, shape=small, preset=F.PRESET_INT8)
    raw = path.read_bytes()
    bad = tmp_path / "cut.colibri"
    for cut in range(0, len(raw), 64):
        bad.write_bytes(raw[:cut])
        with pytest.raises(FormatError, match="truncated|shorter than|empty|past the end"):
            F.read_file(bad)


def test_optional_unknown_section_is_skipped_but_checked(tmp_path):
    """A newer writer's optional section (CRITICAL clear) is accepted, its CRC
    still verified; the known tensors read as before."""
    path = tmp_path / "m.colibri"
    write(path)
    cf = F.read_file(path)
    payload = b"future metadata" + b"\0" * 17
    old = cf.entries
    n = len(old) + 1
    first = F.align64(64 + 40 * n)
    extra = F.Entry(kind=200, dtype=0, flags=0, layer=F.NO_INDEX, expert=F.NO_INDEX, rows=1,
                    cols=len(payload), offset=0, size=len(payload), crc=zlib.crc32(payload))
    entries = [old[0], extra] + old[1:]
    raw = cf._buf
    body = bytearray(b"\0" * first)
    new_entries = []
    for e in entries:
        data = payload if e is extra else bytes(raw[e.offset:e.offset + e.size])
        new_entries.append(dataclasses.replace(e, offset=len(body)))
        body += data + b"\0" * (F.align64(len(data)) - len(data))
    table = b"".join(F.pack_entry(e, "<") for e in new_entries)
    body[64:64 + len(table)] = table
    body[:64] = F.pack_header(cf.shape, n, zlib.crc32(table), "<")
    out = tmp_path / "extra.colibri"
    out.write_bytes(bytes(body))
    cf2 = F.read_file(out)
    np.testing.assert_array_equal(cf2.dequantized(F.Kind.LM_HEAD), cf.dequantized(F.Kind.LM_HEAD))
    # Its CRC is still checked.
    body[new_entries[1].offset] ^= 1
    out.write_bytes(bytes(body))
    with pytest.raises(CRCError, match="unknown kind 200"):
        F.read_file(out)


@pytest.mark.parametrize("dtype, cols, kind, want", [
    (F.DType.Q4_K, 2816, F.Kind.EXPERT_W2, F.DType.Q4_K),    # whole blocks
    (F.DType.Q4_K, 1408, F.Kind.EXPERT_W2, F.DType.Q4_K),    # padded: 5.05 bits < Q5_0's 6.0
    (F.DType.Q4_K, 320, F.Kind.EXPERT_W2, F.DType.Q5_0),     # padded 7.4 bits > 6.0
    (F.DType.Q4_K, 128, F.Kind.EMBED, F.DType.Q5_0),
    (F.DType.Q4_K, 112, F.Kind.EXPERT_W2, F.DType.I8_GROUP),  # Q5_0 would pad: int8, 9.1
    (F.DType.Q5_K, 320, F.Kind.WO, F.DType.Q5_0),
    (F.DType.Q6_K, 1408, F.Kind.LM_HEAD, F.DType.Q6_K),      # padded 7.2 < int8's 9.2
    (F.DType.Q6_K, 128, F.Kind.LM_HEAD, F.DType.I8_GROUP),
    (F.DType.Q6_K, 128, F.Kind.EMBED, F.DType.I8_GROUP),
    (F.DType.I8_GROUP, 100, F.Kind.WQ, F.DType.I8_GROUP),    # not a K type: as asked
])
def test_narrow_rows_take_the_type_of_fewest_bits(dtype, cols, kind, want):
    """A K type on a row that is not a multiple of 256 wide: the candidate
    of fewest bits a weight (FORMAT.md 4), among the K type padded and the
    fallbacks that fit the width and the kind."""
    got = F.fit_dtype(dtype, cols, kind)
    assert got == want, (F.DType(got).name, {d.name: round(F.bits_per_weight(d, cols), 2)
                                            for d in (dtype, *F.NARROW_FALLBACK.get(dtype, ()))})
