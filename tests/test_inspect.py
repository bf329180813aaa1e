"""`colibri info` and `colibri verify` (colibri/model/inspect.py)."""
from __future__ import annotations

import re
import shutil

import pytest

from colibri import cli
from colibri.file import format as F
from colibri.file.format import Kind


@pytest.fixture()
def int8_copy(colibri_file, tmp_path):
    return shutil.copy(colibri_file("awkward", "int8"), tmp_path / "m.colibri")


def test_info_shows_metadata_and_sizes(int8_copy, capsys):
    assert cli.main(["info", str(int8_copy)]) == 0
    out = capsys.readouterr().out
    cf = F.read_file(int8_copy)
    s = cf.shape
    assert f"{s.n_layers} layers, hidden {s.hidden}, vocab {s.vocab}" in out
    assert f"{s.n_experts} experts, top_k {s.top_k}, intermediate {s.intermediate}" in out
    assert "little-endian" in out
    # per kind: dtype, count, bytes = sum of its section sizes (independently summed here)
    for kind in sorted({Kind(e.kind) for e in cf.entries}):
        es = [e for e in cf.entries if e.kind == kind]
        dt = F.DType(es[0].dtype).name
        assert re.search(rf"^{kind.name}\s+{dt}\s+{len(es)}\s+{sum(e.size for e in es)}\s",
                         out, re.M), kind.name
    size = int8_copy.stat().st_size
    assert re.search(rf"^total file\s+{size}\s", out, re.M)
    # one line per section, with its offset and size
    for e in (cf.entries[0], cf.entries[-1], cf.entries[len(cf.entries) // 2]):
        assert re.search(rf"^{re.escape(e.label())}\s+\S+\s+\[{e.rows}, {e.cols}\]\s+"
                         rf"{e.offset}\s+{e.size}\s", out, re.M), e.label()
    capsys.readouterr()
    assert cli.main(["info", "--brief", str(int8_copy)]) == 0
    brief = capsys.readouterr().out
    assert "total file" in brief and "EXPERT_W2 layer 0 expert 0" not in brief


def test_verify_intact_file(int8_copy, capsys):
    assert cli.main(["verify", str(int8_copy)]) == 0
    assert "OK" in capsys.readouterr().out


@pytest.mark.parametrize("kind, layer, expert", [(Kind.EXPERT_W3, 1, 4),
                                                 (Kind.EXPERT_W2, 0, 0)])
def test_verify_names_the_damaged_expert_section(int8_copy, capsys, kind, layer, expert):
    cf = F.read_file(int8_copy)
    e = cf.entry(kind, layer, expert)
    cf.close()
    data = bytearray(int8_copy.read_bytes())
    data[e.offset + e.size // 2] ^= 0x10   # one flipped bit inside the section
    int8_copy.write_bytes(data)
    rc = cli.main(["verify", str(int8_copy)])
    out, err = capsys.readouterr()
    assert rc == 1
    # The damaged sections are the report (stdout); the verdict is one line.
    assert f"CRC mismatch in {kind.name} layer {layer} expert {expert} " in out
    assert out.count("CRC mismatch") == 1
    assert err.count("\n") == 1 and err.startswith("colibri: error:")
    assert "1 of " in err and "copy or convert the file again" in err
    # info still describes the damaged file (it does not check section CRCs)
    assert cli.main(["info", "--brief", str(int8_copy)]) == 0


def test_verify_damaged_header_is_a_one_line_error(int8_copy, capsys):
    data = bytearray(int8_copy.read_bytes())
    data[9] ^= 1  # vocab, covered by the header CRC
    int8_copy.write_bytes(data)
    assert cli.main(["verify", str(int8_copy)]) == 1  # damaged, like a section
    err = capsys.readouterr().err
    assert err.startswith("colibri: error:") and "header CRC mismatch" in err


def test_info_on_non_colibri_file(tmp_path, capsys):
    p = tmp_path / "x.colibri"
    p.write_bytes(b"not a colibri file at all" * 4)
    assert cli.main(["info", str(p)]) == 2
    assert "not a .colibri file" in capsys.readouterr().err
