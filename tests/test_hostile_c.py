"""Hostile headers and tables for the C loader, table-driven, under
AddressSanitizer + UBSan (the fuzz harness's replay driver, fuzz/replay.py:
each file is copied into a buffer of exactly its size, loaded with
colibri_init_from_memory, then inferred and verified when it loads).

The mutations of tests/test_format.py's HOSTILE table are reused as they are
(so the C and Python readers see the same bytes) with the C error code and
detail each must give; then cases that table lacks: every header field at 0
and at its maximum, offsets one past the end of the file, overlapping,
misaligned and gapped sections, dimension products overflowing 32 and 64
bits, top_k above the expert count, a wrong CRC in each section, and the
file truncated at every 64-byte boundary. Those are also checked against the
Python reader (colibri.file.format.parse). No case may crash or trip a sanitizer.
"""
from __future__ import annotations

import re
import struct
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fuzz"))

import gen_seeds  # noqa: E402
import replay  # noqa: E402
from colibri.file import format as F  # noqa: E402
from colibri.errors import CRCError, FormatError  # noqa: E402
from test_format import HOSTILE, SHAPE, _set_entry, _set_header, write  # noqa: E402
from test_runtime_support import c_build  # noqa: E402,F401

BAD_FORMAT, NO_MEMORY, CRC, VERSION, ARENA_TOO_SMALL = -1, -2, -3, -5, -9
FLAGS = replay.VERIFY | replay.DECODE     # no CRC repair: the bytes as given

# test_format.HOSTILE case -> (C code, regex the C detail must contain).
C_EXPECT = {
    "empty": (BAD_FORMAT, r"file is 0 bytes, shorter than the 64-byte header"),
    "short header": (BAD_FORMAT, r"file is 40 bytes, shorter than the 64-byte header"),
    "bad magic": (BAD_FORMAT, r'magic is 0x434c4258, not "CLBR"'),
    "gguf magic": (BAD_FORMAT, r"a GGUF file, not a \.colibri file: convert it with `colibri "
                               r"convert"),
    "bad bom": (BAD_FORMAT, r"bom is 0x1234, neither FF FE nor FE FF"),
    "newer version": (VERSION, r"format version 3, this library supports versions 1 to 2: upgrade"),
    "version 0": (BAD_FORMAT, r"format version 0, this library supports versions 1 to 2$"),
    "header crc": (CRC, r"header_crc 0x[0-9a-f]+ != computed"),
    "vocab 0": (BAD_FORMAT, r"header field vocab is 0"),
    "hidden 0": (BAD_FORMAT, r"header field hidden is 0"),
    "layers 0": (BAD_FORMAT, r"header field n_layers is 0"),
    "top_k above experts": (BAD_FORMAT, r"top_k 7 exceeds n_experts 6"),
    "kv heads not dividing": (BAD_FORMAT, r"n_kv_heads 2 does not divide n_heads 5"),
    "odd head_dim": (BAD_FORMAT, r"head_dim 11 must be even"),
    "nan rope_theta": (BAD_FORMAT, r"rope_theta \(bits 0x7fc00000\) must be finite"),
    "negative eps": (BAD_FORMAT, r"rms_eps \(bits 0xbf800000\) must be finite and > 0"),
    "flags set": (BAD_FORMAT, r"header flags 0x4, must be 0"),
    "n_tensors 0": (BAD_FORMAT, r"header field n_tensors is 0"),
    "table past end": (BAD_FORMAT, r"tensor table of 4294967295 entries ends at \d+, beyond"),
    "table crc": (CRC, r"table_crc 0x[0-9a-f]+ != computed"),
    "hidden changed": (BAD_FORMAT, r"tensor 0 \(EMBED\): shape \[83, 60\], the header implies \[83, 61\]"),
    "vocab overflow": (BAD_FORMAT, r"tensor 0 \(EMBED\): shape \[83, 60\], the header implies \[4294967295, 60\]"),
    "unknown dtype": (BAD_FORMAT, r"tensor 0 \(EMBED\): unknown dtype 14"),
    "retired dtype": (BAD_FORMAT, r"tensor 0 \(EMBED\): dtype 4 is a retired float32-scale "
                      r"block of an older colibri: re-convert the model"),
    "dtype not allowed": (BAD_FORMAT, r"tensor 1 \(ATTN_NORM\): dtype 1 not allowed"),
    "rows changed": (BAD_FORMAT, r"tensor 0 \(EMBED\): shape \[84, 60\]"),
    "size wrong": (BAD_FORMAT, r"tensor 0 \(EMBED\): size 4, dtype 0 \[83, 60\] needs 19920"),
    "size huge": (BAD_FORMAT, r"tensor 0 \(EMBED\): size 18446744073709551615, .* needs 19920"),
    "misaligned offset": (BAD_FORMAT, r"tensor 1 \(ATTN_NORM\): offset (\d+), expected \d+"),
    "overlapping offset": (BAD_FORMAT, r"tensor 1 \(ATTN_NORM\): offset \d+, expected \d+ \(sections follow"),
    "wrong layer": (BAD_FORMAT, r"tensor 1: expected ATTN_NORM layer 0 expert 65535, found ATTN_NORM layer 5"),
    "expert on a layer tensor": (BAD_FORMAT, r"expected ATTN_NORM layer 0 expert 65535, found ATTN_NORM layer 0 expert 0"),
    "duplicate entry": (CRC, r"table_crc"),
    "critical unknown kind": (BAD_FORMAT, r"tensor 1: unknown critical kind 99"),
    "entry flags": (BAD_FORMAT, r"tensor 1 \(ATTN_NORM\): flags 0x80"),
    "reserved set": (BAD_FORMAT, r"tensor 1 \(ATTN_NORM\): flags 0x1 / reserved 0x1"),
    "trailing bytes": (BAD_FORMAT, r"file size (\d+), the table implies \d+ \(truncated or trailing"),
    "section crc": (CRC, r"tensor \d+ \(LM_HEAD\): crc 0x[0-9a-f]+ != computed"),
}

HEADER_MAX = {"vocab": F.U32_MAX, "hidden": F.U32_MAX, "intermediate": F.U32_MAX,
              "max_seq_len": F.U32_MAX, "n_layers": 0xFFFF, "n_heads": 0xFFFF,
              "n_kv_heads": 0xFFFF, "head_dim": 0xFFFF, "n_experts": 0xFFFF,
              "top_k": 0xFFFF, "max_batch": 0xFFFF, "group_size": 0xFFFF,
              "n_tensors": F.U32_MAX, "flags": F.U32_MAX, "version": 0xFFFF}
ZERO_FIELDS = ("vocab", "hidden", "intermediate", "max_seq_len", "n_layers", "n_heads",
               "n_kv_heads", "head_dim", "n_experts", "top_k", "max_batch", "group_size",
               "n_tensors")


@dataclass
class Case:
    name: str
    mutate: Callable[[bytearray], bytes]
    c_code: int
    c_detail: str              # regex searched in the C error detail ("" for success)
    py: str | None             # regex of the Python FormatError; None: parse succeeds
    py_crc: bool = False       # the Python error is a CRCError


def entry_off(raw, i: int, name: str) -> int:
    off = dict((n, o) for n, _, o in F.ENTRY_FIELDS)[name]
    code = dict((n, c) for n, c, _ in F.ENTRY_FIELDS)[name]
    return struct.unpack_from("<" + code, raw, 64 + 40 * i + off)[0]


def set_many(raw, header=None, entries=()):
    """Set header fields and entry fields (index, name, value), CRCs fixed."""
    for name, value in (header or {}).items():
        raw = _set_header(raw, name, value)
    for i, name, value in entries:
        raw = _set_entry(raw, i, name, value)
    return raw


def extra_cases(raw: bytes) -> list[Case]:
    """Cases test_format.HOSTILE lacks; `raw` is the valid SHAPE f32 file."""
    cf = F.parse(raw)
    size = len(raw)
    cases = []
    for name in ZERO_FIELDS:
        py = "n_tensors = 0" if name == "n_tensors" else f"header field {name} = 0 is out of range"
        cases.append(Case(f"{name} at 0", lambda r, n=name: _set_header(r, n, 0),
                          BAD_FORMAT, f"header field {name} is 0, must be >= 1", py))
    for name in ("rope_theta", "rms_eps"):
        cases.append(Case(f"{name} at 0", lambda r, n=name: _set_header(r, n, 0.0),
                          BAD_FORMAT, rf"{name} \(bits 0x0\) must be finite and > 0",
                          f"{name} = 0.0 must be finite and > 0"))
        cases.append(Case(f"{name} inf", lambda r, n=name: _set_header(r, n, float("inf")),
                          BAD_FORMAT, rf"{name} \(bits 0x7f800000\)", f"{name} = inf"))
    # Each header field at its maximum.
    M = HEADER_MAX
    exp = [
        ("vocab", BAD_FORMAT, r"tensor 0 \(EMBED\): shape \[83, 60\], the header implies \[4294967295, 60\]",
         r"the header implies \[4294967295, 60\]"),
        ("hidden", BAD_FORMAT, r"tensor 0 \(EMBED\): shape \[83, 60\], the header implies \[83, 4294967295\]",
         r"the header implies \[83, 4294967295\]"),
        ("intermediate", BAD_FORMAT, r"\(EXPERT_W1 layer 0 expert 0\): shape \[44, 60\], the header implies \[4294967295, 60\]",
         r"EXPERT_W1 layer 0 expert 0.*the header implies \[4294967295, 60\]"),
        # A valid structure whose KV cache needs ~2^37 bytes: the harness's
        # arena (64 bytes; it never allocates above 64 MB) is refused.
        ("max_seq_len", ARENA_TOO_SMALL, r"arena of 64 bytes, the model needs \d{11,}", None),
        ("n_layers", BAD_FORMAT, r"n_layers 65535 / n_experts 6: 65535 is reserved",
         "n_layers = 65535 is out of range 1..65534"),
        ("n_heads", BAD_FORMAT, r"tensor 2 \(WQ layer 0\): shape \[60, 60\], the header implies \[786420, 60\]",
         r"WQ layer 0.*shape \[60, 60\], the header implies \[786420, 60\]"),
        ("n_kv_heads", BAD_FORMAT, r"n_kv_heads 65535 does not divide n_heads 5",
         "n_kv_heads = 65535 does not divide"),
        ("head_dim", BAD_FORMAT, r"head_dim 65535 must be even", "head_dim = 65535 must be even"),
        ("n_experts", BAD_FORMAT, r"n_layers 2 / n_experts 65535: 65535 is reserved",
         "n_experts = 65535 is out of range 1..65534"),
        ("top_k", BAD_FORMAT, r"top_k 65535 exceeds n_experts 6", "top_k = 65535 exceeds n_experts = 6"),
        ("max_batch", ARENA_TOO_SMALL, r"arena of 64 bytes, the model needs", None),
        # F32 sections do not depend on group_size: the file stays valid.
        ("group_size", 0, "", None),
        ("n_tensors", BAD_FORMAT, r"tensor table of 4294967295 entries ends at", "past the end of the file"),
        ("flags", BAD_FORMAT, r"header flags 0xffffffff, must be 0", "flags = 0xffffffff"),
        ("version", VERSION, r"format version 65535, .*upgrade colibri", "version 65535 is newer.*upgrade"),
    ]
    for name, code, c_pat, py in exp:
        cases.append(Case(f"{name} at max", lambda r, n=name: _set_header(r, n, M[n]),
                          code, c_pat, py))
    cases.append(Case("n_layers one below the reserved value",
                      lambda r: _set_header(r, "n_layers", 0xFFFE), BAD_FORMAT,
                      r"tensor \d+: expected ATTN_NORM layer 2 expert 65535, found FINAL_NORM",
                      r"out of order or out of range, expected ATTN_NORM layer 2"))
    cases.append(Case("rope_theta largest float", lambda r: _set_header(r, "rope_theta", 3.4028234663852886e38),
                      0, "", None))
    cases.append(Case("top_k equal to n_experts", lambda r: _set_header(r, "top_k", 6), 0, "", None))

    # Fields pointing one past the end of the file.
    n = len(cf.entries)
    cases.append(Case("table one entry past the end",
                      lambda r: _set_header(r, "n_tensors", (size - 64) // 40 + 1), BAD_FORMAT,
                      rf"tensor table of {(size - 64) // 40 + 1} entries ends at {64 + 40 * ((size - 64) // 40 + 1)}, beyond the file size {size}",
                      "past the end of the file"))
    last = n - 1
    cases.append(Case("last offset one past the end",
                      lambda r: _set_entry(r, last, "offset", size), BAD_FORMAT,
                      rf"tensor {last} \(LM_HEAD\): offset {size}, expected {cf.entries[last].offset}",
                      rf"offset = {size}, expected {cf.entries[last].offset}"))
    # The last section one byte longer: its size no longer matches the
    # shape, and in any case would end one past the file.
    cases.append(Case("last size one past the end",
                      lambda r: _set_entry(r, last, "size", cf.entries[last].size + 1), BAD_FORMAT,
                      rf"tensor {last} \(LM_HEAD\): size {cf.entries[last].size + 1}",
                      rf"size = {cf.entries[last].size + 1}, expected"))
    # Sections: overlapping the previous by 64 bytes, one 64-byte gap,
    # misaligned by one byte, sharing an expert's range.
    e5 = cf.entries[5]
    cases += [
        Case("section overlaps the previous one", lambda r: _set_entry(r, 5, "offset", e5.offset - 64),
             BAD_FORMAT, rf"tensor 5 \(WO\): offset {e5.offset - 64}, expected {e5.offset}",
             rf"offset = {e5.offset - 64}, expected {e5.offset}"),
        Case("gap before a section", lambda r: _set_entry(r, 5, "offset", e5.offset + 64),
             BAD_FORMAT, rf"tensor 5 \(WO\): offset {e5.offset + 64}, expected {e5.offset}",
             rf"offset = {e5.offset + 64}, expected {e5.offset}"),
        Case("section misaligned by one byte", lambda r: _set_entry(r, 5, "offset", e5.offset + 1),
             BAD_FORMAT, rf"offset {e5.offset + 1}, expected {e5.offset}",
             rf"offset = {e5.offset + 1}, expected {e5.offset}"),
    ]
    w1 = cf.entry(F.Kind.EXPERT_W1, 0, 1)
    iw3 = cf.entries.index(cf.entry(F.Kind.EXPERT_W3, 0, 1))
    cases.append(Case("expert W3 on top of W1", lambda r: _set_entry(r, iw3, "offset", w1.offset),
                      BAD_FORMAT, rf"tensor {iw3} \(EXPERT_W3\): offset {w1.offset}",
                      rf"offset = {w1.offset}, expected"))
    # Dimension products overflowing 32 bits (65536 * 65536 elements) and
    # 64 bits (4 * (2^32-1)^2 bytes), with the entry's shape matching the
    # header so the size computation itself is reached.
    for label, vocab, hidden, want in (
            ("32", 0x10000, 0x10000, r"needs 17179869184"),
            ("64", F.U32_MAX, F.U32_MAX, r"needs \d+")):
        cases.append(Case(
            f"EMBED rows*cols*4 overflows {label} bits",
            lambda r, v=vocab, h=hidden: set_many(r, {"vocab": v, "hidden": h},
                                                  [(0, "rows", v), (0, "cols", h)]),
            BAD_FORMAT, rf"tensor 0 \(EMBED\): size 19920, dtype 0 \[{vocab}, {hidden}\] {want}",
            r"tensor table entry 0 \(EMBED\): size = 19920, expected \d+"))
    # An I8_GROUP size overflowing 64 bits through rows * ngroups * 4.
    cases.append(Case(
        "I8 scales overflow 64 bits",
        lambda r: set_many(r, {"vocab": F.U32_MAX, "hidden": F.U32_MAX, "group_size": 1},
                           [(last, "dtype", 1), (0, "rows", F.U32_MAX), (0, "cols", F.U32_MAX)]),
        BAD_FORMAT, r"tensor 0 \(EMBED\): size 19920", r"entry 0 \(EMBED\): size = 19920"))
    # Unknown kinds.
    cases.append(Case("optional unknown kind first", lambda r: set_many(r, entries=[(0, "kind", 300), (0, "flags", 0)]),
                      BAD_FORMAT, r"tensor 0: unknown kind 300 before EMBED",
                      "the first entry must be EMBED"))
    return cases


@pytest.fixture(scope="module")
def replay_exe():
    return replay.build_replay()


@pytest.fixture(scope="module")
def base_file(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("hostile") / "f32.colibri"
    write(path)
    return path.read_bytes()


def run_c(exe, tmp_path, named: dict[str, bytes], flags: int = FLAGS) -> dict[str, replay.Result]:
    paths = []
    for i, (name, data) in enumerate(named.items()):
        p = tmp_path / f"{i:04d}.in"
        p.write_bytes(replay.with_tail(data, flags))
        paths.append(p)
    res = replay.replay(exe, paths)
    return dict(zip(named, res))


def case_failures(cases: list[Case], files: dict, got: dict) -> list[str]:
    """What each case's C verdict (the replay result `got[name]`) and Python
    verdict (colibri.file.format.parse of `files[name]`) got wrong, one line each.
    A case that C loads must also infer, decode and verify; a case whose `py`
    is None must parse in Python."""
    bad = []
    for c in cases:
        r = got[c.name]
        if r.init != c.c_code or not re.search(c.c_detail, r.detail):
            bad.append(f"C {c.name}: init {r.init} {r.detail!r}, want {c.c_code} /{c.c_detail}/")
        if c.c_code == 0 and (r.infer, r.decode, r.verify, r.nonfinite) != (0, 0, 0, 0):
            bad.append(f"C {c.name}: loads but infer {r.infer} decode {r.decode} "
                       f"verify {r.verify} nonfinite {r.nonfinite}")
        try:
            F.parse(files[c.name])
        except FormatError as exc:
            if c.py is None or not re.search(c.py, str(exc)) or \
                    isinstance(exc, CRCError) != c.py_crc:
                bad.append(f"Python {c.name}: {type(exc).__name__}: {exc}; want /{c.py}/")
        else:
            if c.py is not None:
                bad.append(f"Python {c.name}: accepted, want /{c.py}/")
    return bad


def check_cases(exe, tmp_path, raw: bytes, cases: list[Case], flags: int = FLAGS) -> None:
    """Run every case (and the intact file, which must load, infer, decode and
    verify) through C and Python; fail listing every wrong verdict."""
    assert len({c.name for c in cases}) == len(cases)
    files = {c.name: bytes(c.mutate(bytearray(raw))) for c in cases}
    files["intact"] = raw
    got = run_c(exe, tmp_path, files, flags)
    r = got["intact"]
    assert (r.init, r.infer, r.decode, r.verify, r.nonfinite) == (0, 0, 0, 0, 0), r
    bad = case_failures(cases, files, got)
    assert not bad, "\n".join(bad)


def check_truncations(exe, tmp_path, raw: bytes, flags: int = FLAGS) -> None:
    """Every cut of `raw` at a 64-byte boundary is a format error naming the
    truncation, in C and in Python, before any CRC is looked at."""
    cuts = {cut: raw[:cut] for cut in range(0, len(raw), 64)}
    got = run_c(exe, tmp_path, cuts, flags)
    for cut, r in got.items():
        assert r.init == BAD_FORMAT, (cut, r)
        assert "truncated" in r.detail or "shorter" in r.detail, (cut, r.detail)
        with pytest.raises(FormatError) as exc:
            F.parse(cuts[cut])
        assert not isinstance(exc.value, CRCError), (cut, exc.value)
    assert len(cuts) == (len(raw) + 63) // 64


def check_crc_in_each_section(exe, tmp_path, raw: bytes, flags: int = FLAGS) -> None:
    """A flipped byte in the middle of section i (for block sections: in a
    block's packed values, not its scales) is COLIBRI_E_CRC naming tensor i,
    colibri_verify says the same, and Python raises CRCError naming it."""
    cf = F.parse(raw)
    files = {}
    for i, e in enumerate(cf.entries):
        b = bytearray(raw)
        b[e.offset + e.size // 2] ^= 0x20
        files[i] = bytes(b)
    got = run_c(exe, tmp_path, files, flags)
    for i, e in enumerate(cf.entries):
        r = got[i]
        assert r.init == CRC and r.verify == CRC, (i, r)
        assert f"tensor {i} (" in r.detail and "crc" in r.detail, (i, r.detail)
        with pytest.raises(CRCError, match=f"CRC mismatch in {re.escape(e.label())}"):
            F.parse(files[i])


def test_every_hostile_case_of_test_format_has_a_c_expectation():
    assert set(C_EXPECT) == set(HOSTILE)


def test_test_format_hostile_table_in_c(replay_exe, base_file, tmp_path):
    files = {name: bytes(HOSTILE[name][0](bytearray(base_file))) for name in C_EXPECT}
    got = run_c(replay_exe, tmp_path, files)
    bad = []
    for name, (code, pattern) in C_EXPECT.items():
        r = got[name]
        import re
        if r.init != code or not re.search(pattern, r.detail):
            bad.append(f"{name}: init {r.init} {r.detail!r}, want {code} /{pattern}/")
    assert not bad, "\n".join(bad)


def test_extra_hostile_cases_in_c_and_python(replay_exe, base_file, tmp_path):
    check_cases(replay_exe, tmp_path, base_file, extra_cases(base_file))


def test_wrong_crc_in_each_section(replay_exe, base_file, tmp_path):
    """A flipped byte in section i gives COLIBRI_E_CRC naming tensor i, and
    colibri_verify reports it; Python raises CRCError naming the tensor."""
    check_crc_in_each_section(replay_exe, tmp_path, base_file)
    assert len(F.parse(base_file).entries) == len(F.tensor_order(SHAPE))


@pytest.mark.parametrize("quant", ["f32", "int8"])
def test_truncated_at_every_64_byte_boundary(replay_exe, tmp_path, quant):
    """Every cut of a (small) file is a format error naming the truncation,
    before any CRC; Python refuses every cut too."""
    preset = F.PRESET_F32 if quant == "f32" else F.PRESET_INT8
    check_truncations(replay_exe, tmp_path, gen_seeds.model_bytes(gen_seeds.TINY, preset))


def _with_optional_entry(raw: bytes, dtype: int, rows: int, cols: int, payload: bytes) -> bytes:
    """raw plus an optional (CRITICAL clear) kind-200 entry after EMBED whose
    stored size is len(payload), whatever its dtype and shape say."""
    cf = F.parse(raw)
    extra = F.Entry(kind=200, dtype=dtype, flags=0, layer=F.NO_INDEX, expert=F.NO_INDEX,
                    rows=rows, cols=cols, offset=0, size=len(payload), crc=zlib.crc32(payload))
    import dataclasses
    entries = [cf.entries[0], extra] + cf.entries[1:]
    body = bytearray(F.align64(64 + 40 * len(entries)))
    placed = []
    for e in entries:
        data = payload if e is extra else raw[e.offset:e.offset + e.size]
        placed.append(dataclasses.replace(e, offset=len(body)))
        body += data + bytes(F.align64(len(data)) - len(data))
    table = b"".join(F.pack_entry(e, "<") for e in placed)
    body[64:64 + len(table)] = table
    body[:64] = F.pack_header(cf.shape, len(entries), zlib.crc32(table), "<")
    return bytes(body)


OPTIONAL_SECTIONS = {
    # FORMAT.md 3: an unknown non-critical entry's size "is taken as stored
    # (its dtype and shape are the newer writer's business)".
    "size not derived from its shape": (0, 1, 32, b"future metadata".ljust(32, b"\0")),
    "dtype unknown to version 1": (9, 1, 8, bytes(8)),
}


@pytest.mark.parametrize("case", sorted(OPTIONAL_SECTIONS))
def test_optional_unknown_section_python_accepts(case):
    raw = gen_seeds.model_bytes(gen_seeds.TINY, F.PRESET_F32)
    F.parse(_with_optional_entry(raw, *OPTIONAL_SECTIONS[case]))


@pytest.mark.parametrize("case", sorted(OPTIONAL_SECTIONS))
def test_optional_unknown_section_c_accepts(replay_exe, tmp_path, case):
    """(core.c refused both until 280f702.) The file loads, infers, verifies;
    the section's CRC is still checked."""
    raw = gen_seeds.model_bytes(gen_seeds.TINY, F.PRESET_F32)
    good = _with_optional_entry(raw, *OPTIONAL_SECTIONS[case])
    extra_at = F.parse(good).entries[1].offset
    bad = bytearray(good)
    bad[extra_at] ^= 1
    got = run_c(replay_exe, tmp_path, {"good": good, "bad": bytes(bad)})
    r = got["good"]
    assert (r.init, r.infer, r.decode, r.verify) == (0, 0, 0, 0), r.detail
    assert got["bad"].init == CRC and "tensor 1 (" in got["bad"].detail, got["bad"]


def test_flipped_header_bit_reads_as_corruption_in_c_and_python(replay_exe, base_file, tmp_path):
    """A bit flipped in any header field after the version (CRC not fixed)
    is a header CRC error in both readers, never a strange field value."""
    files = {}
    for byte in range(8, 60):
        raw = bytearray(base_file)
        raw[byte] ^= 0x04
        files[byte] = bytes(raw)
    got = run_c(replay_exe, tmp_path, files)
    for byte, data in files.items():
        assert got[byte].init == CRC and "header_crc" in got[byte].detail, (byte, got[byte])
        with pytest.raises(CRCError, match="header CRC mismatch"):
            F.parse(data)


def _with_nonfinite(raw: bytes, entry_index: int, value: float) -> bytes:
    """Put `value` into the first stored float32 of a tensor (F32 value or
    I8/I16 scale) and recompute that section's CRC and the table/header
    CRCs: a CRC-valid file with a non-finite weight."""
    import struct
    import zlib

    cf = F.parse(raw, check_crc=False)
    e = cf.entries[entry_index]
    n = e.rows * e.cols
    first = {0: 0, 1: F.align64(n), 2: F.align64(2 * n)}[e.dtype]
    out = bytearray(raw)
    struct.pack_into("<f", out, e.offset + first, value)
    struct.pack_into("<I", out, 64 + 40 * entry_index + 32,
                     zlib.crc32(bytes(out[e.offset:e.offset + e.size])))
    n_t = len(cf.entries)
    struct.pack_into("<I", out, 52, zlib.crc32(bytes(out[64:64 + 40 * n_t])))
    struct.pack_into("<I", out, 60, zlib.crc32(bytes(out[:60])))
    return bytes(out)


@pytest.mark.parametrize("quant", ["f32", "int8"])
def test_non_finite_weights_are_refused_in_c_and_python(replay_exe, tmp_path, quant):
    """NaN or infinity in any stored float (values of F32 tensors, scales of
    quantised ones) with every CRC valid: both readers refuse the file,
    naming the tensor, instead of computing NaN logits."""
    path = tmp_path / f"{quant}.colibri"
    write(path, preset=F.PRESET_INT8 if quant == "int8" else F.PRESET_F32)
    raw = path.read_bytes()
    n = len(F.parse(raw).entries)
    files = {(i, v): _with_nonfinite(raw, i, v)
             for i in range(n) for v in (float("nan"), float("-inf"))}
    got = run_c(replay_exe, tmp_path, files)
    for (i, v), data in files.items():
        r = got[(i, v)]
        assert r.init == -1 and f"tensor {i} (" in r.detail and "non-finite" in r.detail, (i, r)
        with pytest.raises(FormatError, match=f"entry {i} .*non-finite"):
            F.parse(data)


# ---- format version 2: the description and the kinds it brings ----------------

from feature_models import DESCRIPTIONS, write_model  # noqa: E402

def _last_float_at(cf, e) -> tuple[int, str]:
    """(offset in its section, struct code) of the last float a tensor
    stores: an F32 value or an I8/I16 scale ("f"), or the last block's fp16
    d, or dmin for Q4_K/Q5_K ("e")."""
    from colibri.file import blocks as B
    n = e.rows * e.cols
    if e.dtype == 0:
        return 4 * (n - 1), "f"
    if e.dtype == 1:
        g = cf.shape.group_size
        return F.align64(n) + 4 * (e.rows * -(-e.cols // g) - 1), "f"
    if e.dtype == 2:
        return F.align64(2 * n) + 4 * (e.rows - 1), "f"
    last_block = e.rows * -(-e.cols // B.BLOCK_COLS[e.dtype]) - 1
    fields = B.BLOCK_DTYPES[e.dtype].fields
    return last_block * B.BLOCK_BYTES[e.dtype] + fields["dmin" if "dmin" in fields else "d"][1], "e"


@pytest.mark.parametrize("quant", ["f32", "int8", "q4"])
def test_a_non_finite_scale_deep_in_a_large_section_is_refused(replay_exe, tmp_path, quant):
    """The C reader checks a section's CRC and floats together, a piece at a
    time (64 KiB); a NaN in a section's last float, pieces past its first,
    is refused as the first is, in every storage type (F32 values, int8
    group scales, the block types' d and dmin), by both readers."""
    import dataclasses
    path = write_model(tmp_path / f"{quant}.colibri", None,
                       shape=dataclasses.replace(SHAPE, hidden=256, intermediate=512),
                       dtypes={"f32": None, "int8": F.PRESET_INT8, "q4": F.PRESET_Q4}[quant],
                       seed=4)
    raw = path.read_bytes()
    cf = F.parse(raw)
    big = [i for i, e in enumerate(cf.entries)
           if e.kind != F.Kind.DESC and _last_float_at(cf, e)[0] >= 65536]
    assert big, [e.size for e in cf.entries]
    files = {}
    for i in big:
        e = cf.entries[i]
        out = bytearray(raw)
        at, code = _last_float_at(cf, e)
        struct.pack_into("<" + code, out, e.offset + at, float("nan"))
        struct.pack_into("<I", out, 64 + 40 * i + 32,
                         zlib.crc32(bytes(out[e.offset:e.offset + e.size])))
        n_t = len(cf.entries)
        struct.pack_into("<I", out, 52, zlib.crc32(bytes(out[64:64 + 40 * n_t])))
        struct.pack_into("<I", out, 60, zlib.crc32(bytes(out[:60])))
        files[i] = bytes(out)
    got = run_c(replay_exe, tmp_path, files)
    for i, data in files.items():
        r = got[i]
        assert r.init == -1 and f"tensor {i} (" in r.detail and "NaN" in r.detail, (i, r)
        with pytest.raises(FormatError, match=f"entry {i} .*non-finite"):
            F.parse(data)


Feat = F.Feat


@pytest.fixture(scope="module")
def v2_file(tmp_path_factory) -> bytes:
    """A version 2 file with biases, a gated shared expert and a dense layer
    (the qwen2 description of tests/feature_models.py)."""
    path = tmp_path_factory.mktemp("hostile-v2") / "v2.colibri"
    return write_model(path, DESCRIPTIONS["qwen2"]).read_bytes()


def _desc_word(raw: bytearray, word: int, value=None, bits=None) -> bytearray:
    """Set DESC word `word` (float or raw bits), its CRC and the table's fixed."""
    off, size = entry_off(raw, 0, "offset"), entry_off(raw, 0, "size")
    if bits is None:
        struct.pack_into("<f", raw, off + 4 * word, value)
    else:
        struct.pack_into("<I", raw, off + 4 * word, bits)
    return _set_entry(raw, 0, "crc", zlib.crc32(bytes(raw[off:off + size])))


def _flags(raw: bytearray, set_=0, clear=0) -> bytearray:
    flags = struct.unpack_from("<I", raw, 56)[0]
    return _set_header(raw, "flags", (flags | set_) & ~clear)


def v2_cases(raw: bytes) -> list[Case]:
    cf = F.parse(raw)
    i_w1 = cf.entries.index(cf.entry(F.Kind.SHARED_W1, 0))
    i_dense = cf.entries.index(cf.entry(F.Kind.DENSE_W1, 1))
    L = F.DESC_LAYERS
    return [
        Case("unknown feature bit", lambda r: _flags(r, 0x1000), BAD_FORMAT,
             r"unknown feature bits 0x1000", r"unknown feature bits 0x1000"),
        # TIED_LM_HEAD on a file that has its LM_HEAD: one tensor too many
        Case("TIED_LM_HEAD with an LM_HEAD", lambda r: _flags(r, Feat.TIED_LM_HEAD), BAD_FORMAT,
             r"\(LM_HEAD layer 65535 expert 65535\): more known tensors than the shape implies",
             r"entry \d+ \(LM_HEAD\): out of order or out of range, expected no more tensors"),
        Case("both q/k norms", lambda r: _flags(r, Feat.QK_NORM_HEAD | Feat.QK_NORM_PROJ),
             BAD_FORMAT, r"QK_NORM_HEAD and QK_NORM_PROJ exclude each other",
             r"QK_NORM_HEAD and QK_NORM_PROJ exclude each other"),
        Case("gate without shared expert", lambda r: _flags(r, clear=Feat.SHARED_EXPERT),
             BAD_FORMAT, r"SHARED_GATE without SHARED_EXPERT", r"SHARED_GATE without SHARED_EXPERT"),
        Case("flag without its tensor", lambda r: _flags(r, Feat.BIAS_O), BAD_FORMAT,
             r"tensor \d+: expected BO layer 0 expert 65535, found FFN_NORM layer 0",
             r"out of order or out of range, expected BO layer 0"),
        Case("DESC not first", lambda r: set_many(r, entries=[(0, "kind", 300), (0, "flags", 0)]),
             BAD_FORMAT, r"tensor 0: a version 2 file starts with DESC.*found kind 300",
             r"a version 2 file starts with DESC"),
        Case("DESC wider than the layers", lambda r: _set_entry(r, 0, "cols", L + 4), BAD_FORMAT,
             r"starts with DESC, critical F32 \[1, 11\]", r"starts with DESC, critical F32 \[1, 11\]"),
        Case("DESC crc", lambda r: r[:cf.entries[0].offset + 8]
             + bytes([r[cf.entries[0].offset + 8] ^ 1]) + r[cf.entries[0].offset + 9:],
             CRC, r"tensor 0 \(DESC\): crc 0x[0-9a-f]+ != computed", r"CRC mismatch in DESC",
             py_crc=True),
        Case("shared width not an integer", lambda r: _desc_word(r, 0, 34.5), BAD_FORMAT,
             r"DESC\): shared_intermediate", r"DESC shared_intermediate = 34.5"),
        Case("shared width 0 with the flag", lambda r: _desc_word(r, 0, 0.0), BAD_FORMAT,
             r"DESC\): shared_intermediate", r"DESC shared_intermediate = 0.0, must be an integer"),
        Case("dense width above 2^24", lambda r: _desc_word(r, 1, 2.0 ** 25), BAD_FORMAT,
             r"DESC\): dense_intermediate", r"DESC dense_intermediate = 33554432.0"),
        Case("attn_scale NaN", lambda r: _desc_word(r, 3, bits=0x7FC00000), BAD_FORMAT,
             r"DESC\): attn_scale", r"DESC attn_scale = nan"),
        Case("attn_scale negative", lambda r: _desc_word(r, 3, -0.5), BAD_FORMAT,
             r"DESC\): attn_scale", r"DESC attn_scale = -0.5"),
        Case("embed_scale infinite", lambda r: _desc_word(r, 2, float("inf")), BAD_FORMAT,
             r"DESC\): embed_scale", r"DESC embed_scale = inf"),
        Case("residual_scale 0", lambda r: _desc_word(r, 4, 0.0), BAD_FORMAT,
             r"DESC\): residual_scale", r"DESC residual_scale = 0.0"),
        Case("logits_divisor 0", lambda r: _desc_word(r, 5, 0.0), BAD_FORMAT,
             r"DESC\): logits_divisor", r"DESC logits_divisor = 0.0"),
        Case("clip_qkv without the flag", lambda r: _desc_word(r, 6, 1.0), BAD_FORMAT,
             r"DESC\): clip_qkv", r"DESC clip_qkv = 1.0, must be 0 without CLIP_QKV"),
        Case("clip_qkv 0 with the flag", lambda r: _flags(r, Feat.CLIP_QKV), BAD_FORMAT,
             r"DESC\): clip_qkv", r"DESC clip_qkv = 0.0, must be finite and > 0"),
        Case("reserved word", lambda r: _desc_word(r, 7, bits=1), BAD_FORMAT,
             r"DESC\): reserved", r"DESC reserved word must be 0"),
        Case("layer kind 2", lambda r: _desc_word(r, L + 0, 2.0), BAD_FORMAT,
             r"layer 0's kind \(bits 0x40000000\) must be 0 \(MoE\) or 1 \(dense\)",
             r"DESC layer 0's kind is 2.0"),
        Case("no dense layer with the flag", lambda r: _desc_word(r, L + 1, 0.0), BAD_FORMAT,
             r"0 dense layers, but the DENSE_LAYERS flag is set",
             r"DESC lists 0 dense layers but the DENSE_LAYERS flag is set"),
        Case("dense layer moved", lambda r: _desc_word(_desc_word(r, L + 1, 0.0), L + 2, 1.0),
             BAD_FORMAT, rf"tensor {i_dense}: expected ROUTER layer 1 expert 65535, found DENSE_W1 layer 1",
             r"out of order or out of range, expected ROUTER layer 1"),
        Case("version 1 with a DESC", lambda r: _flags(_set_header(r, "version", 1), clear=F.FEAT_ALL),
             BAD_FORMAT, r"tensor 0: expected EMBED layer 65535 expert 65535, found DESC",
             r"out of order or out of range, expected EMBED"),
        Case("shared expert rows changed", lambda r: _set_entry(r, i_w1, "rows", 35), BAD_FORMAT,
             rf"tensor {i_w1} \(SHARED_W1 layer 0\): shape \[35, 44\], the header implies \[34, 44\]",
             r"SHARED_W1 layer 0.*shape \[35, 44\], the header implies \[34, 44\]"),
        Case("bias stored int8", lambda r: _set_entry(r, 4, "dtype", 1), BAD_FORMAT,
             r"tensor 4 \(BQ\): dtype 1 not allowed", r"dtype I8_GROUP is not allowed for BQ"),
    ]


def test_version_2_hostile_cases_in_c_and_python(replay_exe, v2_file, tmp_path):
    """Every check of the description and of the kinds it brings, in C
    (colibri_init_from_memory and colibri_verify through the replay harness)
    and in Python: the same refusal, each naming its field."""
    check_cases(replay_exe, tmp_path, v2_file, v2_cases(v2_file))


@pytest.mark.parametrize("order", ["little", "big"])
def test_tied_lm_head_hostile_cases_in_c_and_python(replay_exe, tmp_path, order):
    """A TIED_LM_HEAD file (no LM_HEAD; the int8-group embedding is the LM
    head) loads, infers and verifies in either byte order; with the flag
    cleared its LM_HEAD is missing, with an LM_HEAD appended it has one
    tensor too many, with ENC_DEC it combines flags that exclude each
    other: the same refusal in C and Python."""
    bc = BYTE_ORDERS[order]
    raw = gen_seeds.seeds()[f"seed-v2-tied{'-be' if bc == '>' else ''}-int8"][:-gen_seeds.TAIL]
    cf = F.parse(raw)
    assert cf.desc.has(Feat.TIED_LM_HEAD) and F.DType(cf.entry(F.Kind.EMBED).dtype) == \
        F.DType.I8_GROUP
    assert not any(e.kind == F.Kind.LM_HEAD for e in cf.entries)
    last = len(cf.entries) - 1

    def flags(r, set_=0, clear=0):
        from test_format import _fix_crcs
        f = struct.unpack_from(bc + "I", r, 56)[0]
        struct.pack_into(bc + "I", r, 56, (f | set_) & ~clear)
        return _fix_crcs(r, bc)
    cases = [
        Case("TIED_LM_HEAD cleared", lambda r: flags(r, clear=Feat.TIED_LM_HEAD), BAD_FORMAT,
             r"expected LM_HEAD layer 65535 expert 65535|LM_HEAD", r"LM_HEAD is missing"),
        Case("TIED_LM_HEAD with ENC_DEC", lambda r: flags(r, set_=Feat.ENC_DEC), BAD_FORMAT,
             r"ENC_DEC combines only with RELU_FFN and DENSE_LAYERS",
             # Python reads the DESC width ENC_DEC implies before the flags
             r"a version 2 file starts with DESC, critical F32 \[1, 18\]"),
        Case("FINAL_NORM relabelled LM_HEAD", lambda r: _entry_set(r, bc, last, "kind", 13),
             BAD_FORMAT, rf"tensor {last}", rf"entry {last} \(LM_HEAD\)|FINAL_NORM"),
    ]
    check_cases(replay_exe, tmp_path, raw, cases, _replay_flags(bc))


def test_version_2_wrong_crc_in_each_section(replay_exe, v2_file, tmp_path):
    """A flipped byte in any section of a version 2 file, the DESC included,
    is a CRC error naming it, in C and in Python."""
    check_crc_in_each_section(replay_exe, tmp_path, v2_file)


def test_version_2_truncated_at_every_64_byte_boundary(replay_exe, v2_file, tmp_path):
    check_truncations(replay_exe, tmp_path, v2_file)


# ---- encoder-decoder files (ENC_DEC): DESC words, flags, kinds 28-35 ----------

@pytest.fixture(scope="module")
def encdec_file() -> bytes:
    """fuzz/gen_seeds.py's encoder-decoder: 2 encoder + 2 decoder layers,
    layers 1 and 3 MoE (ReLU experts W1/W2), int8, little-endian."""
    return gen_seeds.model_bytes(gen_seeds.ENCDEC, F.PRESET_INT8, seed=21,
                                 desc=gen_seeds.ENCDEC_DESC)


def encdec_cases(raw: bytes) -> list[Case]:
    cf = F.parse(raw)
    W = F.DESC_LAYERS + cf.shape.n_layers          # the first ENC_DEC word
    i_xwq = cf.entries.index(cf.entry(F.Kind.XWQ, 2))
    i_dec = cf.entries.index(cf.entry(F.Kind.DEC_POS_BIAS))
    i_enc = cf.entries.index(cf.entry(F.Kind.ENC_POS_BIAS))
    return [
        Case("encoder_layers 0", lambda r: _desc_word(r, W, 0.0), BAD_FORMAT,
             r"DESC\): encoder_layers", r"DESC encoder_layers = 0.0"),
        Case("encoder_layers all layers", lambda r: _desc_word(r, W, 4.0), BAD_FORMAT,
             r"DESC\): encoder_layers", r"DESC encoder_layers = 4.0, must be an integer 1..3"),
        Case("capacity not an integer", lambda r: _desc_word(r, W + 1, 1.5), BAD_FORMAT,
             r"DESC\): expert_capacity", r"DESC expert_capacity = 1.5"),
        Case("decoder_start = vocab", lambda r: _desc_word(r, W + 2, 19.0), BAD_FORMAT,
             r"DESC\): decoder_start", r"DESC decoder_start = 19.0, must be an integer 0..18"),
        Case("lm_scale NaN", lambda r: _desc_word(r, W + 3, bits=0x7FC00000), BAD_FORMAT,
             r"DESC\): lm_scale", r"DESC lm_scale = nan"),
        Case("ENC_DEC reserved word", lambda r: _desc_word(r, W + 5, bits=1), BAD_FORMAT,
             r"DESC\): reserved \(ENC_DEC words 4-7\)", r"DESC reserved words 4-7"),
        Case("ENC_DEC with biases", lambda r: _flags(r, Feat.BIAS_QKV), BAD_FORMAT,
             r"ENC_DEC combines only with RELU_FFN and DENSE_LAYERS",
             r"ENC_DEC combines only with RELU_FFN and DENSE_LAYERS"),
        Case("ENC_DEC with top_k 2", lambda r: _set_header(r, "top_k", 2), BAD_FORMAT,
             r"ENC_DEC needs n_kv_heads = n_heads and top_k = 1",
             r"ENC_DEC needs n_kv_heads = n_heads and top_k = 1"),
        Case("RELU_FFN cleared", lambda r: _flags(r, clear=Feat.RELU_FFN), BAD_FORMAT,
             r"expected DENSE_W3 layer 0 expert 65535, found DENSE_W2 layer 0",
             r"out of order or out of range, expected DENSE_W3 layer 0"),
        Case("ENC_DEC cleared", lambda r: _flags(r, clear=Feat.ENC_DEC), BAD_FORMAT,
             r"starts with DESC, critical F32 \[1, 12\]",
             r"starts with DESC, critical F32 \[1, 12\]"),
        Case("cross-attention rows changed", lambda r: _set_entry(r, i_xwq, "rows", 9), BAD_FORMAT,
             rf"tensor {i_xwq} \(XWQ layer 2\): shape \[9, 12\], the header implies \[8, 12\]",
             r"XWQ layer 2.*shape \[9, 12\], the header implies \[8, 12\]"),
        Case("decoder bias width changed", lambda r: _set_entry(r, i_dec, "cols", 15), BAD_FORMAT,
             rf"tensor {i_dec} \(DEC_POS_BIAS\): shape \[2, 15\], the header implies \[2, 8\]",
             r"DEC_POS_BIAS.*shape \[2, 15\], the header implies \[2, 8\]"),
        Case("position bias stored int8", lambda r: _set_entry(r, i_enc, "dtype", 1), BAD_FORMAT,
             rf"tensor {i_enc} \(ENC_POS_BIAS\): dtype 1 not allowed",
             r"dtype I8_GROUP is not allowed for ENC_POS_BIAS"),
        Case("cross-attention in an encoder layer",
             lambda r: _set_entry(r, i_xwq, "layer", 1), BAD_FORMAT,
             rf"tensor {i_xwq}: expected XWQ layer 2 expert 65535, found XWQ layer 1",
             r"out of order or out of range, expected XWQ layer 2"),
    ]


def test_encoder_decoder_hostile_cases_in_c_and_python(replay_exe, encdec_file, tmp_path):
    """Every check ENC_DEC adds (its DESC words, its flag combinations, the
    order, shapes and dtypes of kinds 28-35), in C and in Python; the intact
    file loads, encodes, decodes and verifies."""
    check_cases(replay_exe, tmp_path, encdec_file, encdec_cases(encdec_file))


def test_encoder_decoder_wrong_crc_in_each_section(replay_exe, encdec_file, tmp_path):
    check_crc_in_each_section(replay_exe, tmp_path, encdec_file)


# ---- the block types (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K), in both byte orders
#
# fuzz/gen_seeds.py's block file: ONE_LAYER (hidden 16, 2 experts) with
# EMBED / EXPERT_W1 Q4_K, WQ Q5_K, WK / LM_HEAD Q6_K, EXPERT_W3 Q8_0, WV /
# EXPERT_W2 Q4_0, WO Q5_0 (each row one block: FORMAT.md 4 pads the last block), the
# router int16, norms float32. Every case runs on the little- and the
# big-endian file: both readers must give the same verdict either way.

BYTE_ORDERS = {"little": "<", "big": ">"}


def _replay_flags(bc: str) -> int:
    """A big-endian file goes through colibri_init (a path: read, then the
    blocks' fp16 fields swapped), as a little-endian host loads it;
    zero-copy would refuse it with COLIBRI_E_BYTE_ORDER before any check."""
    return FLAGS | (replay.VIA_FILE if bc == ">" else 0)


def _entry_set(raw: bytearray, bc: str, index: int, name: str, value) -> bytearray:
    """Set one table field in the file's byte order, table and header CRCs fixed."""
    from test_format import _fix_crcs
    off = dict((n, o) for n, _, o in F.ENTRY_FIELDS)[name]
    code = dict((n, c) for n, c, _ in F.ENTRY_FIELDS)[name]
    struct.pack_into(bc + code, raw, 64 + 40 * index + off, value)
    return _fix_crcs(raw, bc)


def _section_crc_fixed(raw: bytearray, bc: str, index: int) -> bytearray:
    """Recompute section `index`'s CRC (and the table's, the header's)."""
    off = entry_off_bo(raw, bc, index, "offset")
    size = entry_off_bo(raw, bc, index, "size")
    return _entry_set(raw, bc, index, "crc", zlib.crc32(bytes(raw[off:off + size])))


def entry_off_bo(raw, bc: str, i: int, name: str) -> int:
    off = dict((n, o) for n, _, o in F.ENTRY_FIELDS)[name]
    code = dict((n, c) for n, c, _ in F.ENTRY_FIELDS)[name]
    return struct.unpack_from(bc + code, raw, 64 + 40 * i + off)[0]


@pytest.fixture(scope="module", params=list(BYTE_ORDERS))
def block_file(request) -> tuple[str, bytes]:
    """(byte-order char, the block file in that order)."""
    raw = gen_seeds.block_bytes(request.param, seed=30)
    dtypes = {F.DType(e.dtype) for e in F.parse(raw).entries}
    assert {F.DType.Q4_0, F.DType.Q5_0, F.DType.Q8_0, F.DType.Q4_K, F.DType.Q5_K,
            F.DType.Q6_K} <= dtypes
    return BYTE_ORDERS[request.param], raw


def block_cases(bc: str, raw: bytes) -> list[Case]:
    cf = F.parse(raw)
    idx = {(F.Kind(e.kind), e.layer, e.expert): i for i, e in enumerate(cf.entries)}
    NI = F.NO_INDEX
    i_emb, i_lm = idx[(F.Kind.EMBED, NI, NI)], idx[(F.Kind.LM_HEAD, NI, NI)]
    i_wv, i_w1 = idx[(F.Kind.WV, 0, NI)], idx[(F.Kind.EXPERT_W1, 0, 1)]
    i_wo, i_w3 = idx[(F.Kind.WO, 0, NI)], idx[(F.Kind.EXPERT_W3, 0, 1)]
    i_norm, i_ffn = idx[(F.Kind.ATTN_NORM, 0, NI)], idx[(F.Kind.FFN_NORM, 0, NI)]
    i_router, i_final = idx[(F.Kind.ROUTER, 0, NI)], idx[(F.Kind.FINAL_NORM, NI, NI)]
    emb, lm, wv, wo = (cf.entries[i] for i in (i_emb, i_lm, i_wv, i_wo))
    set_ = lambda i, name, v: (lambda r: _entry_set(r, bc, i, name, v))  # noqa: E731

    def sizes(e, dtype):
        return F.section_size(dtype, e.rows, e.cols, cf.shape.group_size)

    def not_allowed(i, kind, dtype):
        """Entry i (of `kind`) given a block dtype its kind does not allow."""
        name = F.DType(dtype).name
        return Case(f"{kind} as {name}", set_(i, "dtype", dtype), BAD_FORMAT,
                    rf"tensor {i} \({kind}\): dtype {dtype} not allowed for this kind",
                    rf"dtype {name} is not allowed for {kind}")

    def relabelled(what, i, dtype):
        """Entry i's dtype set to another: its stored size is the other type's."""
        e = cf.entries[i]
        return Case(what, set_(i, "dtype", dtype), BAD_FORMAT,
                    rf"tensor {i} \({F.Kind(e.kind).name}\): size {e.size}, dtype {dtype} "
                    rf"\[{e.rows}, {e.cols}\] needs {sizes(e, dtype)}",
                    rf"size = {e.size}, expected {sizes(e, dtype)}")

    Q4_0, Q4_K, Q6_K, Q5_0, Q5_K, Q8_0 = (int(F.DType[n]) for n in
                                          ("Q4_0", "Q4_K", "Q6_K", "Q5_0", "Q5_K", "Q8_0"))
    nbytes = F.blocks.BLOCK_BYTES
    qs_at = {t: F.blocks.BLOCK_DTYPES[t].fields["qs"][1] for t in (Q4_0, Q5_0)}
    qh_at = F.blocks.BLOCK_DTYPES[Q5_0].fields["qh"][1]
    cases = [
        # A block section one block short, or one block long: the size no
        # longer matches rows * ceil(cols / B) blocks.
        Case("Q4_K size one block short", set_(i_emb, "size", emb.size - nbytes[Q4_K]), BAD_FORMAT,
             rf"tensor {i_emb} \(EMBED\): size {emb.size - nbytes[Q4_K]}, dtype {Q4_K} \[17, 16\] needs {emb.size}",
             rf"entry {i_emb} \(EMBED\): size = {emb.size - nbytes[Q4_K]}, expected {emb.size}"),
        Case("Q6_K size one block long", set_(i_lm, "size", lm.size + nbytes[Q6_K]), BAD_FORMAT,
             rf"tensor {i_lm} \(LM_HEAD\): size {lm.size + nbytes[Q6_K]}, dtype {Q6_K} \[17, 16\] needs {lm.size}",
             rf"entry {i_lm} \(LM_HEAD\): size = {lm.size + nbytes[Q6_K]}, expected {lm.size}"),
        # The dtype relabelled: the stored bytes have the other type's size.
        relabelled("Q4_K relabelled Q4_0", i_emb, Q4_0),
        relabelled("Q6_K relabelled Q4_K", i_lm, Q4_K),
        relabelled("Q5_0 relabelled Q4_0", i_wo, Q4_0),
        relabelled("Q4_0 relabelled Q5_0", i_wv, Q5_0),
        relabelled("Q4_0 relabelled I8_GROUP", i_wv, 1),
        relabelled("Q4_K relabelled F32", i_w1, 0),
        relabelled("Q4_K relabelled Q5_K", i_emb, Q5_K),
        relabelled("Q8_0 relabelled Q4_0", i_w3, Q4_0),
        relabelled("Q8_0 relabelled I8_GROUP", i_w3, 1),
        relabelled("Q5_0 relabelled Q8_0", i_wo, Q8_0),
        Case("dtype one past the last", set_(i_emb, "dtype", int(max(F.DType)) + 1), BAD_FORMAT,
             rf"tensor {i_emb} \(EMBED\): unknown dtype {int(max(F.DType)) + 1}",
             r"entry 0 \(EMBED\).*dtype"),
        # A retired id (the float32-scale blocks, 3..7): refused by name,
        # whatever the section size, so an old file asks to be re-converted.
        *(Case(f"retired dtype {r}", set_(i_emb, "dtype", r), BAD_FORMAT,
               rf"tensor {i_emb} \(EMBED\): dtype {r} is a retired float32-scale block.*"
               "re-convert", rf"entry {i_emb} \(EMBED\): dtype {r} is a retired "
               "float32-scale block.*re-convert") for r in F.blocks.RETIRED),
        # A block type on a kind that does not allow one (norms, router).
        *(not_allowed(i, kind, dt) for i, kind, dt in (
            (i_norm, "ATTN_NORM", Q4_0), (i_ffn, "FFN_NORM", Q4_K), (i_final, "FINAL_NORM", Q6_K),
            (i_router, "ROUTER", Q4_K), (i_router, "ROUTER", Q4_0), (i_norm, "ATTN_NORM", Q5_0),
            (i_router, "ROUTER", Q5_K), (i_router, "ROUTER", Q8_0), (i_ffn, "FFN_NORM", Q8_0),
        )),
        # A block's padding columns (16..31 of a 16-column Q4_0 row: the
        # high nibbles of qs) hold other values: still valid (a reader never
        # uses them), and the logits stay finite.
        Case("padding nibbles of a Q4_0 block changed", lambda r: _section_crc_fixed(
            _set_high_nibbles(r, wv.offset + qs_at[Q4_0], 16), bc, i_wv), 0, "", None),
        # Q5_0's padding: the high nibbles and qh bits 16..31 (qh's bytes 2, 3)
        Case("padding nibbles and high bits of a Q5_0 block changed", lambda r: _section_crc_fixed(
            _set_high_nibbles(_set_high_nibbles(r, wo.offset + qs_at[Q5_0], 16),
                              wo.offset + qh_at + 2, 2),
            bc, i_wo), 0, "", None),
    ]
    return cases


def _set_high_nibbles(raw: bytearray, at: int, n: int) -> bytearray:
    for k in range(at, at + n):
        raw[k] |= 0xF0
    return raw


def test_block_hostile_cases_in_c_and_python(replay_exe, block_file, tmp_path):
    """Wrong sizes for a block dtype, a block dtype relabelled, block types
    on kinds that allow none (norms, router): the same refusal from
    colibri_init_from_memory and colibri.file.format.parse, in either byte order;
    the intact file (and one whose padding columns changed) loads, infers,
    decodes and verifies with finite logits."""
    bc, raw = block_file
    check_cases(replay_exe, tmp_path, raw, block_cases(bc, raw), _replay_flags(bc))


def _block_floats(e: F.Entry) -> list[tuple[int, int]]:
    """(float index as both readers count it, byte offset in the section) of
    the fp16 fields of the first and the last block of a block tensor: d
    (and Q4_K's or Q5_K's dmin) of each block, block after block."""
    fields = F.blocks.BLOCK_DTYPES[e.dtype].fields
    offs = [fields[f][1] for f in ("d", "dmin") if f in fields]
    nb = e.rows * F.blocks.n_blocks(e.cols, e.dtype)
    per, size = len(offs), F.blocks.BLOCK_BYTES[e.dtype]
    picks = [(0, offs[0]), (per * (nb - 1), size * (nb - 1) + offs[0])]
    if per == 2:
        picks.append((per * (nb - 1) + 1, size * (nb - 1) + offs[1]))   # the last dmin
    return picks


def test_non_finite_block_scales_are_refused_in_c_and_python(replay_exe, block_file, tmp_path):
    """NaN or infinity in a block's fp16 d (or a Q4_K block's dmin), first block
    and last, with every CRC valid, in either byte order: C check_finite and
    Python _check_finite both refuse the file, naming the tensor and the
    same float of its scales (counted d, dmin, d, dmin, ... block by block)."""
    bc, raw = block_file
    cf = F.parse(raw)
    files = {}
    for i, e in enumerate(cf.entries):
        if not F.blocks.is_block(e.dtype):
            continue
        for k, at in _block_floats(e):
            for v in (float("nan"), float("inf")):
                b = bytearray(raw)
                struct.pack_into(bc + "e", b, e.offset + at, v)
                files[(i, k, v)] = bytes(_section_crc_fixed(b, bc, i))
    # EMBED, WQ, WK, WV, WO, LM_HEAD and three per expert.
    assert len({i for i, _, _ in files}) == 6 + 3 * cf.shape.n_experts
    got = run_c(replay_exe, tmp_path, files, _replay_flags(bc))
    bad = []
    for (i, k, v), data in files.items():
        what = "NaN" if v != v else "infinite"
        r = got[(i, k, v)]
        want = rf"tensor {i} \(.*\): float {k} of its scales is {what}: the file holds non-finite"
        if r.init != BAD_FORMAT or not re.search(want, r.detail):
            bad.append(f"C {i} float {k} {what}: init {r.init} {r.detail!r}")
        try:
            F.parse(data)
        except FormatError as exc:
            if not re.search(rf"entry {i} \(.*\): float {k} of its scales is {what}: the file "
                             "holds non-finite", str(exc)):
                bad.append(f"Python {i} float {k} {what}: {exc}")
        else:
            bad.append(f"Python {i} float {k} {what}: accepted")
    assert not bad, "\n".join(bad)


def test_block_file_truncated_at_every_64_byte_boundary(replay_exe, block_file, tmp_path):
    """Every cut of the block file (most fall inside a block section) is a
    format error naming the truncation, in C and Python, before any CRC."""
    bc, raw = block_file
    check_truncations(replay_exe, tmp_path, raw, _replay_flags(bc))


def test_block_file_wrong_crc_in_each_section(replay_exe, block_file, tmp_path):
    """A flipped byte in any section (block sections: in a block's packed
    values, not its scales) is a CRC error naming the tensor, in C and Python."""
    bc, raw = block_file
    check_crc_in_each_section(replay_exe, tmp_path, raw, _replay_flags(bc))


def _streamed_cuts(raw: bytes) -> list[int]:
    """The 64-byte boundaries test_hostile_table_streamed cuts at: every one
    in the header, table and description, and in each section its first,
    middle and last."""
    inside = {}
    for e in F.parse(raw).entries:
        first = -(-e.offset // 64) * 64
        last = (e.offset + e.size - 1) // 64 * 64
        keep = {first, (first + last) // 2 // 64 * 64, last}
        for cut in range(first, last + 1, 64):
            inside[cut] = cut in keep
    cuts = [c for c in range(0, len(raw), 64) if inside.get(c, True)]
    assert 0 < len(cuts) < len(raw) // 64
    return cuts


def test_hostile_table_streamed(c_build, base_file, tmp_path):
    """The same hostile files opened streamed (colibri-cli --slots 1: the
    library's own reader, only the resident sections read at init), under
    ASan + UBSan: each is refused at init with the all-resident load's code
    and detail, and so is the file cut short (a cut in the experts too,
    though they are not read at init).

    The cuts: every 64-byte boundary of the header, table and description
    (what init reads before any section), and in each section its first
    and last boundary and one in the middle. Init checks every section's
    extent against the file's size (load.c read_header, then the table's
    validation) before it reads a section byte, so every cut inside a
    section meets that same test. The 5,900 boundaries inside this file's
    36 expert sections, one ASan process each, took 110 of the test's 146 s
    on a 2-core Zen 3 and tested nothing the three do not; the 1,700 inside
    the resident sections (55 s) likewise. Every 64-byte cut of a file
    still goes through the replay harness (test_truncated_at_every_64_byte_
    boundary): refused all-resident, and opened streamed from memory under
    the sanitizers too."""
    import subprocess
    cli = c_build("asan").cli
    p = tmp_path / "case.colibri"

    def opened(data: bytes):
        p.write_bytes(data)
        return subprocess.run([str(cli), "--model", str(p), "--slots", "1", "--info"],
                              capture_output=True, text=True, timeout=120)
    bad = []
    for name, (code, rx) in C_EXPECT.items():
        r = opened(bytes(HOSTILE[name][0](bytearray(base_file))))
        want = rx[:-1] + r"\)" if rx.endswith("$") else rx   # the CLI's "(detail)"
        if r.returncode != 1 or not re.search(want, r.stderr) or r.stderr.count("\n") != 1:
            bad.append(f"{name}: exit {r.returncode} {r.stderr.strip()!r}, want /{want}/")
    for cut in _streamed_cuts(base_file):
        r = opened(base_file[:cut])
        if r.returncode != 1 or not re.search("truncated|shorter", r.stderr):
            bad.append(f"cut {cut}: exit {r.returncode} {r.stderr.strip()!r}")
    assert opened(base_file).returncode == 0
    assert not bad, "\n".join(bad)
