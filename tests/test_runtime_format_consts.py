"""src/include/colibri_format.h and colibri/file/format.py state the same format:
every `#define COLIBRI_...` of the C header is parsed and checked against the
Python module, both ways (a constant on one side only fails too). And the C
compiler sees the same values the parser read."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from colibri.file import blocks
from colibri.file import format as cformat

HEADER = Path(__file__).resolve().parent.parent / "src" / "include" / "colibri_format.h"


def c_defines() -> dict[str, int | str]:
    out = {}
    for name, value in re.findall(r"^#define[ \t]+(COLIBRI_\w+)[ \t]+(\S+)", HEADER.read_text(), re.M):
        out[name] = value.strip('"') if value.startswith('"') else int(value, 0)
    return out


def python_constants() -> dict[str, int | str]:
    """What each C define must be, from colibri/file/format.py alone."""
    want = {
        "COLIBRI_MAGIC": cformat.MAGIC.decode("ascii"),
        "COLIBRI_MAGIC_SIZE": len(cformat.MAGIC),
        "COLIBRI_FORMAT_VERSION": cformat.VERSION,
        "COLIBRI_FORMAT_VERSION_MIN": cformat.VERSION_MIN,
        "COLIBRI_FEAT_ALL": cformat.FEAT_ALL,
        "COLIBRI_DESC_MAX_INTERMEDIATE": cformat.DESC_MAX_INTERMEDIATE,
        "COLIBRI_DESC_LAYERS": cformat.DESC_LAYERS,
        "COLIBRI_BOM": cformat.BOM,
        "COLIBRI_SECTION_ALIGN": cformat.ALIGN,
        "COLIBRI_HEADER_SIZE": cformat.HEADER_SIZE,
        "COLIBRI_ENTRY_SIZE": cformat.ENTRY_SIZE,
        "COLIBRI_TABLE_OFFSET": cformat.HEADER_SIZE,
        "COLIBRI_NO_LAYER": cformat.NO_INDEX,
        "COLIBRI_NO_EXPERT": cformat.NO_INDEX,
        "COLIBRI_ENTRY_FLAG_CRITICAL": cformat.FLAG_CRITICAL,
        "COLIBRI_KIND_MAX": max(cformat.Kind),
    }
    want.update({f"COLIBRI_HDR_{n.upper()}": off for n, _, off in cformat.HEADER_FIELDS})
    want.update({f"COLIBRI_ENT_{n.upper()}": off for n, _, off in cformat.ENTRY_FIELDS})
    want.update({f"COLIBRI_KIND_{k.name}": int(k) for k in cformat.Kind})
    want.update({f"COLIBRI_DTYPE_{d.name}": int(d) for d in cformat.DType})
    want["COLIBRI_DTYPE_MAX"] = max(cformat.DType)
    want["COLIBRI_DTYPE_RETIRED_MIN"] = min(blocks.RETIRED)
    want["COLIBRI_DTYPE_RETIRED_MAX"] = max(blocks.RETIRED)
    want["COLIBRI_Q6_K_D"] = blocks.BLOCK_DTYPES[blocks.Q6_K].fields["d"][1]
    want["COLIBRI_Q4_0_COLS"] = blocks.BLOCK_COLS[blocks.Q4_0]
    want["COLIBRI_QK_COLS"] = blocks.BLOCK_COLS[blocks.Q4_K]
    assert blocks.BLOCK_COLS[blocks.Q6_K] == blocks.BLOCK_COLS[blocks.Q4_K]
    want.update({f"COLIBRI_{cformat.DType(d).name}_BYTES": n
                 for d, n in blocks.BLOCK_BYTES.items()})
    want.update({f"COLIBRI_FEAT_{f.name}": int(f) for f in cformat.Feat})
    want.update({f"COLIBRI_DESC_{n.upper()}": i for i, n in enumerate(cformat.DESC_WORDS)})
    want.update({f"COLIBRI_DESCX_{n.upper()}": i
                 for i, n in enumerate(cformat.DESC_ENCDEC_WORDS) if not n.startswith("reserved")})
    want["COLIBRI_DESCX_WORDS"] = len(cformat.DESC_ENCDEC_WORDS)
    return want


def test_every_constant_agrees_both_ways():
    c, py = c_defines(), python_constants()
    assert set(c) - set(py) == set(), "defined in C only"
    assert set(py) - set(c) == set(), "missing from colibri_format.h"
    diff = {k: (c[k], py[k]) for k in py if c[k] != py[k]}
    assert not diff, f"C vs Python: {diff}"


def test_header_field_sizes_fit_between_offsets():
    """The last header field ends at HEADER_SIZE, the last entry field at
    ENTRY_SIZE (the offsets alone would not catch a resized last field)."""
    import struct
    n, code, off = cformat.HEADER_FIELDS[-1]
    assert off + struct.calcsize("<" + code) == c_defines()["COLIBRI_HEADER_SIZE"]
    n, code, off = cformat.ENTRY_FIELDS[-1]
    assert off + struct.calcsize("<" + code) == c_defines()["COLIBRI_ENTRY_SIZE"]


def test_compiler_sees_the_parsed_values(tmp_path):
    defs = {k: v for k, v in c_defines().items() if isinstance(v, int)}
    body = "\n".join(f'    printf("{k} %lld\\n", (long long)({k}));' for k in defs)
    src = tmp_path / "consts.c"
    src.write_text(f'#include <stdio.h>\n#include "colibri_format.h"\n'
                   f"int main(void) {{\n{body}\n    return 0;\n}}\n")
    exe = tmp_path / "consts"
    try:
        subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", f"-I{HEADER.parent}",
                        str(src), "-o", str(exe)], check=True, capture_output=True)
    except FileNotFoundError:
        pytest.skip("gcc not installed")
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    seen = {k: int(v) for k, v in (line.split() for line in out.splitlines())}
    assert seen == defs
