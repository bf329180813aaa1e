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

from colibri import format as cformat  # noqa: E402
from colibri.buildsteps import blob, testmodel  # noqa: E402
from colibri.errors import ColibriError, CRCError  # noqa: E402
from colibri.reference import Reference  # noqa: E402


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


def test_arena_bound_grows_with_the_model():
    small = blob.arena_bytes(testmodel.FW_TINY, 4)
    import dataclasses
    longer = dataclasses.replace(testmodel.FW_TINY, max_seq_len=64)
    batched = dataclasses.replace(testmodel.FW_TINY, max_batch=4)
    assert blob.arena_bytes(longer, 4) > small and blob.arena_bytes(batched, 4) > small
    assert blob.arena_bytes(testmodel.FW_TINY, 8) > small  # pointer tables
    # The KV cache alone (2 * layers * tokens * kv_dim floats) is inside it.
    s = testmodel.FW_TINY
    assert small > 2 * 4 * s.n_layers * s.max_seq_len * s.n_kv_heads * s.head_dim


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
