"""GGUF inputs colibri must refuse, or handle, with one line saying what to
do (colibri/model/gguf_in.py, convert_gguf.py, convert.py's dispatch). The
files are written here with the pinned gguf-py (tests/gguf_fixtures.py's
write_gguf, then rewritten): no llama.cpp needed. The judges are gguf-py
(which types it can dequantise, how it stores each type) and numpy (what
float32 rounding of F64 values gives)."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import pytest

import gguf_fixtures as GF
from colibri.errors import ConversionError
from colibri.file import format as F

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType


def _rewrite(src: Path, dst: Path, change=lambda name, data: [(name, data, None)],
             extra=()) -> Path:
    """GGUF `src` rewritten as `dst`: `extra` (name, array) tensors first,
    then each tensor as change(name, float32 data) says: a list of
    (name, array, raw GGML type or None)."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    GF.copy_metadata(r, w)
    for name, data in extra:
        w.add_tensor(name, data)
    for t in r.tensors:
        for name, data, raw in change(t.name, np.array(t.data)):
            if raw is None:
                w.add_tensor(name, data)
            else:
                w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return dst


def _exporter(path, **kw):
    from colibri.model.convert_gguf import GGUFExporter
    return GGUFExporter(path, **kw)


def _cli(capsys, *argv) -> tuple[int, str, str]:
    from colibri import cli
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error_line(rc, err) -> str:
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# --- 1. rope_freqs.weight (Llama 3 RoPE) ---------------------------------------

def test_rope_freqs_other_than_one_are_refused(tmp_path):
    """llama.cpp's converter writes rope_freqs.weight for rope_type llama3:
    its factors divide RoPE's frequencies (llama.cpp ggml_rope_ext's
    freq_factors), so ignoring them gives other logits. Refused."""
    src = GF.write_gguf(tmp_path / "m.gguf")
    factors = np.linspace(1.0, 8.0, 4, dtype=np.float32)   # head_dim 8: 4 frequencies
    path = _rewrite(src, tmp_path / "llama3.gguf", extra=[("rope_freqs.weight", factors)])
    with pytest.raises(ConversionError, match=r"llama3\.gguf: RoPE type 'llama3' "
                       r"\(rope_freqs\.weight holds frequency factors other than 1"):
        _exporter(path)


def test_rope_freqs_of_one_are_a_no_op(tmp_path):
    """Factors all exactly 1 change no frequency: the file converts to the
    same bytes as without the tensor."""
    src = GF.write_gguf(tmp_path / "m.gguf")
    ones = _rewrite(src, tmp_path / "ones.gguf",
                    extra=[("rope_freqs.weight", np.ones(4, np.float32))])
    _exporter(src).export(tmp_path / "plain.colibri")
    _exporter(ones).export(tmp_path / "ones.colibri")
    assert (tmp_path / "plain.colibri").read_bytes() == (tmp_path / "ones.colibri").read_bytes()


# --- 2. types gguf-py cannot dequantise: refused when planning -----------------

def _experts_as(src: Path, dst: Path, type_name: str) -> Path:
    """src with its expert matrices stored as `type_name`: integer types
    from the float values (gguf-py picks I8/I16/I32 from the numpy dtype),
    block types as arbitrary bytes of that type's size (never read)."""
    qt = T[type_name]
    ints = {"I8": np.int8, "I16": np.int16, "I32": np.int32}
    rng = np.random.default_rng(0)

    def change(name, data):
        if "_exps" not in name:
            return [(name, data, None)]
        if type_name in ints:
            return [(name, (data * 100).astype(ints[type_name]), None)]
        block, size = gguf.GGML_QUANT_SIZES[qt]
        if type_name in ("Q4_1", "Q5_1"):   # gguf-py quantises these
            return [(name, gguf.quants.quantize(data, qt), qt)]
        raw = rng.integers(0, 50, (*data.shape[:-1], data.shape[-1] // block * size), np.uint8)
        return [(name, raw, qt)]
    return _rewrite(src, dst, change)


# Types whose block fits write_gguf's 32-wide rows (Q8_K's and Q1_0's
# blocks are 256 and 128 wide; the check is the same for every type).
UNREADABLE = ("Q8_1", "I8", "I16", "I32")


@pytest.mark.parametrize("type_name", UNREADABLE)
def test_types_gguf_py_cannot_dequantise_are_refused_by_info_and_convert(
        type_name, tmp_path, capsys):
    qt = T[type_name]
    block, size = gguf.GGML_QUANT_SIZES[qt]
    with pytest.raises(NotImplementedError):        # the judge: gguf-py itself
        gguf.quants.dequantize(np.zeros((1, size), np.uint8), qt)
    path = _experts_as(GF.write_gguf(tmp_path / "m.gguf"), tmp_path / f"{type_name}.gguf",
                       type_name)
    for argv in (("info", path), ("convert", path, "-o", tmp_path / "o.colibri")):
        err = _one_error_line(*_cli(capsys, *argv)[::2])
        assert f"{path}: " in err and f"6 {type_name} (blk.0.ffn_gate_exps.weight" in err, err
        assert "requantise it with llama-quantize to Q8_0 or Q4_K_M" in err, err
    assert not (tmp_path / "o.colibri").exists()
    assert not (tmp_path / "o.colibri.partial").exists()


@pytest.mark.parametrize("type_name", ("Q4_1", "Q5_1"))
def test_types_gguf_py_dequantises_are_still_requantised(type_name, tmp_path):
    """The refusal is only for what gguf-py cannot read: its other types
    still convert (a second rounding, noted)."""
    path = _experts_as(GF.write_gguf(tmp_path / "m.gguf"), tmp_path / f"{type_name}.gguf",
                       type_name)
    ex = _exporter(path)
    assert any(src == type_name and how == "requantise"
               for (src, _, how) in ex.summary()), ex.summary()
    ex.export(tmp_path / "o.colibri")
    assert ex.notes and f"{type_name} -> " in ex.notes[0]


# --- 3. a path named *.gguf that is not a GGUF file ----------------------------

NOT_GGUF = {
    "missing": (None, "missing.gguf does not exist"),
    "empty": (b"", "empty.gguf is empty (0 bytes)"),
    "lfs": (b"version https://git-lfs.github.com/spec/v1\noid sha256:ab12\nsize 4\n",
            "lfs.gguf is a Git LFS pointer, not the GGUF data"),
    "html": (b"<!DOCTYPE html><html>Not found</html>",
             "html.gguf is not a GGUF file (no GGUF magic"),
}


@pytest.mark.parametrize("case", sorted(NOT_GGUF))
def test_a_gguf_name_that_is_not_a_gguf_file_gets_gguf_advice(case, tmp_path, capsys):
    content, says = NOT_GGUF[case]
    path = tmp_path / f"{case}.gguf"
    if content is not None:
        path.write_bytes(content)
    err = _one_error_line(*_cli(capsys, "convert", path, "-o", tmp_path / "o.colibri")[::2])
    assert says in err and "Hugging Face" not in err, err
    with pytest.raises(ConversionError, match=re.escape(says)):
        _exporter(path)


# --- 4. --group-size with kept Q8_0 tensors ------------------------------------

def test_group_size_leaves_kept_q8_0_alone(tmp_path):
    """Q8_0 is kept as Colibri's Q8_0 blocks (groups of 32 by definition,
    gguf-py's GGML_QUANT_SIZES), so --group-size (I8_GROUP's) does not touch
    it: the blocks stay exactly as stored. (Until Q8_0 was a block type a
    kept Q8_0 tensor was I8_GROUP in groups of 32, and another group size
    was refused.)"""
    assert gguf.GGML_QUANT_SIZES[T.Q8_0][0] == 32
    path = GF.write_gguf(tmp_path / "q8.gguf", q8=True)
    ex = _exporter(path, group_size=64)
    ex.export(tmp_path / "kept.colibri")
    assert ("Q8_0", "Q8_0", "copy") in ex.summary() and not ex.notes
    cf = F.read_file(tmp_path / "kept.colibri")
    assert F.DType(cf.entry(F.Kind.EXPERT_W1, 0, 0).dtype) == F.DType.Q8_0
    del cf
    # Asked to requantise to int8: the group size applies, with the measured note.
    ex = _exporter(path, group_size=64, quant="int8")
    ex.export(tmp_path / "g64.colibri")
    cf = F.read_file(tmp_path / "g64.colibri")
    assert cf.shape.group_size == 64
    assert F.DType(cf.entry(F.Kind.EXPERT_W1, 0, 0).dtype) == F.DType.I8_GROUP
    assert "Q8_0 -> I8_GROUP" in ex.notes[0]
    # No Q8_0 tensor: nothing the group size would change.
    _exporter(GF.write_gguf(tmp_path / "f32.gguf"), group_size=64)


# --- 5. calibration options ------------------------------------------------------

def test_calibration_tokens_are_refused_for_a_gguf_file(tmp_path, capsys):
    path = GF.write_gguf(tmp_path / "m.gguf")
    err = _one_error_line(*_cli(capsys, "convert", path, "-o", tmp_path / "o.colibri",
                                "--calibration-tokens", "100")[::2])
    assert "--calibration-tokens is for Hugging Face checkpoints" in err


@pytest.mark.parametrize("argv, says", [
    (("--calibration", "T", "--calibration-tokens", "0"), "--calibration-tokens 0: give a "
     "positive number"),
    (("--calibration", "T", "--calibration-tokens", "-5"), "--calibration-tokens -5: give a "
     "positive number"),
    (("--calibration-tokens", "100"), "give --calibration TEXT_FILE too"),
    (("--calibration", "T", "--quant", "int8"), "--calibration weights the error of the 4-bit "
     "block types (Q4_0, Q5_0, Q4_K, Q5_K, Q6_K), and --quant int8"),
    (("--calibration", "T", "--quant", "f32", "--experts", "int8"), "and --quant f32 with "
     "these options stores no tensor in one"),
    (("--imatrix", "X.npz",), "--imatrix weights the error"),   # --quant int8 by default
])
def test_calibration_options_that_would_be_ignored_are_refused(argv, says, tmp_path, capsys):
    """Refused before the checkpoint is read (the directory need not exist):
    calibration is a whole float32 conversion and forward pass."""
    err = _one_error_line(*_cli(capsys, "convert", tmp_path / "ckpt", "-o",
                                tmp_path / "o.colibri", *argv)[::2])
    assert says in err, err


@pytest.mark.parametrize("quant, experts", [("q4", None), ("int8", "q4_k"), ("f32", "q5_0")])
def test_calibration_with_a_block_type_passes_the_check(quant, experts):
    """A per-kind block type under any preset makes calibration useful."""
    from colibri.model.convert import _check_calibration
    args = argparse.Namespace(calibration="T", imatrix=None, calibration_tokens=100,
                              quant=quant, router=None, experts=experts, attention=None,
                              embedding=None, lm_head=None)
    _check_calibration(args)


# --- 6. the tensor count printed is what the file holds -------------------------

def test_convert_prints_the_tensors_written(tmp_path, capsys):
    """A Mixtral GGUF makes a version 1 file (no DESC section): the count
    printed is that of the file's own table (its entries but the tokenizer
    section), not the plan's, which counts a DESC (it printed 42 for 41)."""
    out = tmp_path / "o.colibri"
    rc, stdout, _ = _cli(capsys, "convert", GF.write_gguf(tmp_path / "m.gguf"), "-o", out)
    assert rc == 0
    cf = F.read_file(out)
    assert cf.version == 1
    tensors = [e for e in cf.entries if e.kind in F.Kind._value2member_map_]
    assert len(tensors) == len(cf.entries) - 1          # the tokenizer section
    assert f", {len(tensors)} tensors (" in stdout, stdout


# --- 7. messages that say what to do --------------------------------------------

def test_a_missing_merged_expert_tensor_is_named_once(tmp_path):
    path = _rewrite(GF.write_gguf(tmp_path / "m.gguf"), tmp_path / "cut.gguf",
                    lambda name, data: [] if name == "blk.1.ffn_up_exps.weight"
                    else [(name, data, None)])
    with pytest.raises(ConversionError) as e:
        _exporter(path)
    msg = str(e.value)
    assert "1 tensor(s) missing" in msg and msg.count("blk.1.ffn_up_exps.weight") == 1, msg
    assert "convert the model again with a current llama.cpp" in msg


def test_old_per_expert_layout_gets_reconvert_advice(tmp_path):
    """llama.cpp's old Mixtral GGUFs: blk.N.ffn_gate.E.weight per expert."""
    def split(name, data):
        m = re.fullmatch(r"(blk\.\d+\.ffn_(?:gate|up|down))_exps\.weight", name)
        if m is None:
            return [(name, data, None)]
        return [(f"{m.group(1)}.{e}.weight", data[e], None) for e in range(data.shape[0])]
    path = _rewrite(GF.write_gguf(tmp_path / "m.gguf"), tmp_path / "old.gguf", split)
    with pytest.raises(ConversionError, match=r"old\.gguf: experts stored one tensor each "
                       r"\(blk\.0\.ffn_gate\.0\.weight, \.\.\.\), llama\.cpp's old layout.*"
                       r"convert the model again with a current llama\.cpp "
                       r"convert_hf_to_gguf\.py"):
        _exporter(path)


def test_unsupported_architecture_names_the_file(tmp_path):
    path = GF.write_gguf(tmp_path / "g.gguf", arch="gemma3")
    with pytest.raises(ConversionError, match=re.escape(f"{path}: unsupported GGUF "
                                                        "architecture 'gemma3'")):
        _exporter(path)


def test_version_and_truncation_refusals_say_what_to_do(tmp_path):
    good = GF.write_gguf(tmp_path / "m.gguf").read_bytes()
    v1 = tmp_path / "v1.gguf"
    v1.write_bytes(good[:4] + (1).to_bytes(4, "little") + good[8:])
    with pytest.raises(ConversionError, match=r"GGUF version 1; .*convert the model again"):
        _exporter(v1)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good[:-10])
    with pytest.raises(ConversionError, match=r"truncated: download or copy it again"):
        _exporter(cut)


# --- 8. F64 is narrowed, not kept exactly -----------------------------------------

def test_f64_is_narrowed_and_says_so(tmp_path):
    """F64 tensors are stored as float32: numpy's float32 rounding of the
    GGUF's float64 values, reported as a rounding, never as kept."""
    src = GF.write_gguf(tmp_path / "m.gguf")
    f64 = {}

    def widen(name, data):
        if "_exps" not in name:
            return [(name, data, None)]
        # values float32 cannot hold exactly, so narrowing must round them
        f64[name] = data.astype(np.float64) * (1 + 1e-12) + 1e-13
        return [(name, f64[name], None)]
    path = _rewrite(src, tmp_path / "f64.gguf", widen)
    ex = _exporter(path)
    kinds = {(s, d, how) for (s, d, how) in ex.summary() if s == "F64"}
    assert kinds == {("F64", "F32", "narrow")}, ex.summary()
    ex.export(tmp_path / "o.colibri")
    assert any(n.startswith("narrowed 24 F64 tensor(s) to F32") for n in ex.notes), ex.notes
    cf = F.read_file(tmp_path / "o.colibri")
    got = cf.dequantized(F.Kind.EXPERT_W2, 1, 3)
    want = f64["blk.1.ffn_down_exps.weight"][3].astype(np.float32)
    assert np.array_equal(got, want)
