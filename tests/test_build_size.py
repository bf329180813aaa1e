"""colibri.buildsteps.size without SCons: ar parsing, ELF measurements, budget
messages and the report `scons size` prints."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import targets  # noqa: E402
from colibri.buildsteps import size  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A small archive (one member with a long name, stored in '//') and a
    program with a 40000-byte table, built with the host gcc."""
    d = tmp_path_factory.mktemp("size")
    (d / "a.c").write_text("int a_func(int x) { return x * 3; }\n")
    (d / "a_member_with_a_long_name.c").write_text(
        "const unsigned char big_table[40000] = {1};\nint b_func(void) { return big_table[7]; }\n")
    (d / "main.c").write_text(
        "extern int a_func(int); extern int b_func(void);\n"
        "static char scratch[12345];\n"
        "int main(int c, char **v) { scratch[c] = 1; return a_func(c) + b_func() + scratch[2]; }\n")
    for src in ("a.c", "a_member_with_a_long_name.c", "main.c"):
        subprocess.run(["gcc", "-O2", "-c", src], cwd=d, check=True)
    subprocess.run(["ar", "rcD", "libt.a", "a.o", "a_member_with_a_long_name.o"], cwd=d, check=True)
    subprocess.run(["gcc", "main.o", "libt.a", "-o", "prog"], cwd=d, check=True)
    return d


def test_archive_members_match_ar(built):
    names = [n for n, _ in size.archive_members(built / "libt.a")]
    listed = subprocess.run(["ar", "t", "libt.a"], cwd=built, capture_output=True,
                            text=True, check=True).stdout.split()
    assert names == listed == ["a.o", "a_member_with_a_long_name.o"]
    assert dict(size.archive_members(built / "libt.a"))["a.o"] == (built / "a.o").read_bytes()


def test_measure_counts_code_rodata_bss(built):
    (built / "prog.bin").write_bytes(b"\0" * 5000)
    r = size.measure(built / "prog", built / "libt.a", built / "prog.bin")
    assert r.runtime_sections.get("rodata", 0) >= 40000       # the table, from the archive
    assert r.totals["runtime"] >= 40000
    assert r.totals["firmware_flash"] >= 40000
    assert r.totals["firmware_ram"] >= 12345                   # scratch in .bss
    assert r.totals["image"] == 5000
    assert r.symbols[0].name == "big_table" and r.symbols[0].size == 40000


def test_over_budget_names_budget_section_size_and_symbols(built):
    (built / "prog.bin").write_bytes(b"\0" * 100)
    r = size.measure(built / "prog", built / "libt.a", built / "prog.bin")
    t = dataclasses.replace(targets.get("x86_64"),
                            budgets=dict(runtime=1000, firmware_flash=1 << 30))
    problems = size.check_budgets(r, t)
    assert len(problems) == 1
    msg = problems[0]
    total = r.totals["runtime"]
    assert f"runtime is {total} bytes, over its budget of 1000 bytes by {total - 1000}" in msg
    assert "largest section rodata" in msg and "big_table (a_member_with_a_long_name.o) 40000 B" in msg
    assert "targets/x86_64.py" in msg
    t_ok = dataclasses.replace(t, budgets=dict(runtime=1 << 30))
    assert size.check_budgets(r, t_ok) == []


def test_nfc_1_raises_the_runtime_budget_where_the_target_leaves_the_tables_out(built):
    """scons nfc=1 on a firmware target (its defines leave the NFC tables out)
    may use toolchain.NFC_BUDGET more; nfc=0 or the target's default keeps
    the budget; a report 20 KiB over the budget passes only with nfc=1."""
    from colibri.buildsteps import toolchain
    (built / "prog.bin").write_bytes(b"\0" * 100)
    r = size.measure(built / "prog", built / "libt.a", built / "prog.bin")
    cm = targets.get("cortex-m")
    assert toolchain.NO_TOK_NORM in cm.defines
    t = dataclasses.replace(cm, budgets=dict(runtime=r.totals["runtime"] - (20 << 10)))
    default = toolchain.resolve_options(cm)
    with_nfc = toolchain.resolve_options(cm, nfc="1")
    assert not default.nfc and with_nfc.nfc
    assert toolchain.NO_TOK_NORM in toolchain.flags(cm, default, ".").cppdefines
    assert toolchain.NO_TOK_NORM not in toolchain.flags(cm, with_nfc, ".").cppdefines
    assert size.budgets_for(t, with_nfc)["runtime"] == t.budgets["runtime"] + toolchain.NFC_BUDGET
    assert len(size.check_budgets(r, t, default)) == 1
    assert size.check_budgets(r, t, with_nfc) == []


def test_report_has_sections_bars_and_15_symbols(built):
    (built / "prog.bin").write_bytes(b"\0" * 100)
    r = size.measure(built / "prog", built / "libt.a", built / "prog.bin")
    t = dataclasses.replace(targets.get("x86_64"), budgets=dict(runtime=20000, image=1000))
    text = size.format_report(r, t)
    assert ".text" in text and ".bss" in text
    runtime_line = next(l for l in text.splitlines() if l.strip().startswith("runtime"))
    assert "OVER BUDGET" in runtime_line and "[" + "#" * 40 + "]" in runtime_line
    image_line = next(l for l in text.splitlines() if l.strip().startswith("image"))
    assert "10.0%" in image_line and "OVER" not in image_line
    sym_lines = text.split("largest symbols of the firmware:\n")[1].strip().splitlines()
    assert len(sym_lines) == min(15, len(r.symbols)) and "big_table" in sym_lines[0]
