"""colibri.buildsteps.blob without SCons: byte-order conversion of the embedded
model, the .incbin assembly, the arena bound and the firmware config."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from elftools.elf.constants import SH_FLAGS
from elftools.elf.elffile import ELFFile

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from colibri.file import format as cformat  # noqa: E402
from colibri.buildsteps import blob, testmodel  # noqa: E402
from colibri.errors import ColibriError, CRCError  # noqa: E402
from colibri.model.reference import Reference  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return testmodel.make_model(tmp_path_factory.mktemp("blob") / "t.colibri", "int8")


def test_big_endian_blob_has_the_same_model(tiny, tmp_path):
    big = blob.blob_for_target(tiny, tmp_path / "big.bin", "big")
    raw = big.read_bytes()
    assert raw[6:8] == b"\xfe\xff"  # byte-order mark in big-endian order
    assert raw != tiny.read_bytes() and len(raw) == tiny.stat().st_size
    f = cformat.read_file(big)      # every CRC valid in the new byte order
    assert f.byte_order == "big"
    f.close()
    tokens = np.array([[1, 5, 9, 2]])
    a = Reference(tiny).forward(tokens)
    b = Reference(big).forward(tokens)
    # Same weights (the byte round trip below is exact); the logits are
    # compared with a bound, not bits: numpy/OpenBLAS may take other SIMD
    # paths for arrays at other addresses.
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    # Converting back gives the original bytes: nothing was lost or re-quantised.
    back = blob.blob_for_target(big, tmp_path / "back.bin", "little")
    assert back.read_bytes() == tiny.read_bytes()


def test_same_order_blob_is_a_byte_copy(tiny, tmp_path):
    out = blob.blob_for_target(tiny, tmp_path / "le.bin", "little")
    assert out.read_bytes() == tiny.read_bytes()


def test_corrupt_model_is_refused_before_embedding(tiny, tmp_path):
    bad = tmp_path / "bad.colibri"
    data = bytearray(tiny.read_bytes())
    data[-100] ^= 0x40
    bad.write_bytes(bytes(data))
    with pytest.raises(CRCError, match="CRC"):
        blob.blob_for_target(bad, tmp_path / "x.bin", "big")


def test_embed_asm_gives_aligned_readonly_section_with_symbols(tiny, tmp_path):
    (tmp_path / "model.bin").write_bytes(tiny.read_bytes())
    (tmp_path / "m.S").write_text(blob.embed_asm("model.bin", linux=True))
    subprocess.run(["gcc", "-c", "m.S", "-o", "m.o"], cwd=tmp_path, check=True)
    with open(tmp_path / "m.o", "rb") as f:
        elf = ELFFile(f)
        sec = elf.get_section_by_name(".colibri_model")
        assert sec is not None and sec["sh_addralign"] == 64
        assert sec["sh_flags"] & SH_FLAGS.SHF_ALLOC and not sec["sh_flags"] & SH_FLAGS.SHF_WRITE
        assert sec.data() == tiny.read_bytes()
        syms = elf.get_section_by_name(".symtab")
        start = syms.get_symbol_by_name(blob.SYM_START)[0]
        assert start["st_size"] == tiny.stat().st_size and start["st_info"]["bind"] == "STB_GLOBAL"
        size_sym = syms.get_symbol_by_name(blob.SYM_SIZE)[0]
        rodata = elf.get_section(size_sym["st_shndx"]).data()
        value = int.from_bytes(rodata[size_sym["st_value"]:size_sym["st_value"] + 4], "little")
        assert value == tiny.stat().st_size
        assert elf.get_section_by_name(".note.GNU-stack") is not None


def test_arena_is_memory_formula_for_the_kv_type():
    """One formula: the firmware's arena is colibri/model/memory.py's (held equal
    to the C library by tests/test_memory.py) for a caller's arena, chunk
    16, with the build's KV cache; an i8 cache makes it smaller by the
    cache's difference, which colibri_kv_size's rule gives from the shape."""
    from colibri.model import memory
    s, t = testmodel.FW_TINY, memory.tables_bound(4)
    f32, i8 = blob.arena_bytes(s, t), blob.arena_bytes(s, t, kv="i8")
    assert f32 == memory.arena_bytes(s, None, "f32", 16, t)
    assert i8 == memory.arena_bytes(s, None, "i8", 16, t)
    slots = s.n_layers * s.max_batch * s.max_seq_len
    up = lambda n: -(-n // 64) * 64   # noqa: E731
    kv32 = 2 * up(slots * s.n_kv_heads * s.head_dim * 4)
    kv8 = 2 * (up(slots * s.n_kv_heads * s.head_dim) + up(slots * s.n_kv_heads * 4))
    assert f32 - i8 == kv32 - kv8 > 0
    import dataclasses
    longer = dataclasses.replace(s, max_seq_len=64)
    assert blob.arena_bytes(longer, t, kv="i8") > i8
    with pytest.raises(ValueError):
        memory.tables_bound(2)


def _compile_probe(cc, flags, out):
    subprocess.run([cc, *flags, "-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror",
                    *(f"-I{ROOT / d}" for d in ("src/include", "src", "src/kernels")),
                    "-c", str(ROOT / "firmware/arena_tables.c"), "-o", str(out)], check=True)
    return blob.table_sizes_from_object(out)


def test_probe_measures_the_host_librarys_tables(tmp_path):
    """firmware/arena_tables.c compiled by the host gcc gives the sizes the
    host library reports (memory.TABLES_LP64 == colibri_abi_sizeof_table,
    tests/test_memory.py) and the default chunk, read from its symbols."""
    from colibri.model import memory
    tables, chunk = _compile_probe("gcc", ["-O2"], tmp_path / "t.o")
    assert tables == memory.TABLES_LP64 and chunk == blob.CHUNK_TOKENS
    tables, chunk = _compile_probe("gcc", ["-DCOLIBRI_CHUNK_TOKENS=7"], tmp_path / "c.o")
    assert chunk == 7


def test_bound_covers_every_targets_struct_sizes(tmp_path):
    """memory.tables_bound(pointer_bytes) is no smaller than what each
    target's own compiler lays out (with threads, the larger clb_team), and
    is exact on the 64-bit ones."""
    import dataclasses
    import shutil
    import targets
    from colibri.model import memory
    seen = 0
    for name, t in targets.load_all().items():
        cc = t.prefix + "gcc" if t.prefix else "gcc"
        if not shutil.which(cc):
            continue
        flags = [*t.arch_flags, *(f"-D{d}" for d in t.defines), "-DCOLIBRI_THREADS=1"]
        got, _ = _compile_probe(cc, flags, tmp_path / f"{name}.o")
        bound = memory.tables_bound(t.pointer_bytes)
        pairs = list(zip(dataclasses.astuple(got), dataclasses.astuple(bound)))
        assert all(g <= b for g, b in pairs), (name, got, bound)
        if t.pointer_bytes == 8:
            assert got == bound, name
        else:
            assert got.plan < bound.plan, name    # really laid out for 32 bits
        seen += 1
    assert seen >= 2


def test_kv_type_is_checked_and_an_encoder_decoder_takes_either(tiny, tmp_path):
    with pytest.raises(ColibriError, match="f32 .*or i8"):
        blob.plan_inputs(tiny, kv="i4")
    assert blob.plan_inputs(tiny, kv="i8").kv == "i8"
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from colibri.model.convert import ColibriExporter
    from golden_switch import make_switch
    sw = ColibriExporter(model=make_switch(seed=0), quant="int8", max_seq_len=8).export(
        tmp_path / "switch.colibri")
    assert blob.plan_inputs(sw, kv="f32").kv == "f32"
    assert blob.plan_inputs(sw, kv="i8").kv == "i8"


def test_config_header_checks_prompts():
    s = testmodel.FW_TINY
    text = blob.config_header("ppc", s, 1000, 5000, prompts=((1, 2), (3,)), n_generate=2)
    assert "#define FW_ARENA_BYTES 5000u" in text and "#define FW_N_PROMPTS 2u" in text
    assert "{1, 2, 3}" in text and "{0, 2}" in text and "{2, 1}" in text
    with pytest.raises(ColibriError, match=r"token ids \[96\].*vocabulary 0..95"):
        blob.config_header("ppc", s, 1000, 5000, prompts=((1, 96),))
    with pytest.raises(ColibriError, match="max_seq_len 16"):
        blob.config_header("ppc", s, 1000, 5000, prompts=(tuple(range(15)),), n_generate=4)


def test_prepare_rewrites_only_on_change(tiny, tmp_path):
    import targets
    t = targets.get("ppc")
    paths = blob.prepare_firmware_inputs(tiny, tmp_path, t)
    stamps = {k: p.stat().st_mtime_ns for k, p in paths.items()}
    again = blob.prepare_firmware_inputs(tiny, tmp_path, t)
    assert {k: p.stat().st_mtime_ns for k, p in again.items()} == stamps
    assert '.incbin "' + str(paths["blob"]) in paths["asm"].read_text()
