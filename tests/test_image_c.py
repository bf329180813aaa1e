"""src/include/colibri_image.h against colibri/device/image.py: every
`#define COLIBRI_IMG_...` has the Python value, and the C struct compiles to
the documented size and offsets on every target's compiler (32-bit ARM and
big-endian PowerPC included)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from colibri.device import image as I

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "src" / "include" / "colibri_image.h"


def c_defines() -> dict[str, int | str]:
    out = {}
    for m in re.finditer(r"^#define\s+(COLIBRI_IMG_\w+)\s+(\S+)", HEADER.read_text(), re.M):
        name, value = m.groups()
        out[name] = value.strip('"') if value.startswith('"') else int(value, 0)
    return out


def python_values() -> dict[str, int | str]:
    offsets = {f"COLIBRI_IMG_HDR_{name.upper()}": off for name, _, off in I.HEADER_FIELDS}
    return {
        "COLIBRI_IMG_MAGIC": I.MAGIC,
        "COLIBRI_IMG_HEADER_STRUCT_SIZE": I.HEADER_STRUCT_SIZE,
        "COLIBRI_IMG_HEADER_SIZE": I.HEADER_SIZE,
        **offsets,
        "COLIBRI_IMG_F_RAM_LOAD": I.IMAGE_F_RAM_LOAD,
        **{f"COLIBRI_IMG_TARGET_{n.upper().replace('-', '_')}": v
           for n, v in I.TARGET_IDS.items()},
        "COLIBRI_IMG_TLV_INFO_SIZE": I.TLV_INFO_SIZE,
        "COLIBRI_IMG_TLV_HDR_SIZE": I.TLV_HDR_SIZE,
        "COLIBRI_IMG_TLV_PROT_INFO_MAGIC": I.TLV_PROT_INFO_MAGIC,
        "COLIBRI_IMG_TLV_INFO_MAGIC": I.TLV_INFO_MAGIC,
        "COLIBRI_IMG_TLV_CRITICAL": I.TLV_CRITICAL,
        "COLIBRI_IMG_TLV_KEYHASH": I.TLV_KEYHASH,
        "COLIBRI_IMG_TLV_SHA256": I.TLV_SHA256,
        "COLIBRI_IMG_TLV_ED25519": I.TLV_ED25519,
        "COLIBRI_IMG_TLV_SEC_CNT": I.TLV_SEC_CNT,
        "COLIBRI_IMG_TLV_MODEL_SHA256": I.TLV_MODEL_SHA256,
        "COLIBRI_IMG_TLV_MODEL_INFO": I.TLV_MODEL_INFO,
        "COLIBRI_IMG_MODEL_INFO_SIZE": I.MODEL_INFO_SIZE,
        "COLIBRI_IMG_MODEL_INFO_OFFSET": 0,
        "COLIBRI_IMG_MODEL_INFO_BLOB_SIZE": 4,
        "COLIBRI_IMG_MODEL_INFO_FORMAT": 8,
        "COLIBRI_IMG_MODEL_INFO_BYTE_ORDER": 10,
        "COLIBRI_IMG_MODEL_NOT_IN_PAYLOAD": I.MODEL_NOT_IN_PAYLOAD,
        "COLIBRI_IMG_TLV_TARGET": I.TLV_TARGET,
        "COLIBRI_IMG_TARGET_SIZE": I.TARGET_SIZE,
        "COLIBRI_IMG_TARGET_ID": 0,
        "COLIBRI_IMG_TARGET_KIND": 2,
        "COLIBRI_IMG_PAYLOAD_RAW": I.PAYLOAD_RAW,
        "COLIBRI_IMG_PAYLOAD_ELF": I.PAYLOAD_ELF,
        "COLIBRI_IMG_SHA256_SIZE": 32,
        "COLIBRI_IMG_SIGNATURE_SIZE": 64,
    }


def test_every_c_define_matches_python():
    c, py = c_defines(), python_values()
    assert set(c) == set(py), f"only in C: {set(c) - set(py)}, only in Python: {set(py) - set(c)}"
    for name, value in py.items():
        assert c[name] == value, f"{name}: C {c[name]!r}, Python {value!r}"


def test_model_info_offsets_follow_the_struct():
    import struct
    fields = struct.Struct(I.MODEL_INFO_STRUCT)
    assert fields.size == c_defines()["COLIBRI_IMG_MODEL_INFO_SIZE"]
    sizes = [struct.calcsize("<" + ch) for ch in I.MODEL_INFO_STRUCT[1:]]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    assert offsets[:4] == [0, 4, 8, 10]


PROBE = r"""
#include <stdio.h>
#include <string.h>
#include "colibri_image.h"
int main(void) {
    static const unsigned char le[4] = {0x78, 0x56, 0x34, 0x12};
    printf("%u %u %u %u 0x%08x\n", (unsigned)sizeof(colibri_img_header),
           (unsigned)offsetof(colibri_img_header, ver_revision),
           (unsigned)offsetof(colibri_img_header, load_addr),
           (unsigned)offsetof(colibri_img_header, protect_tlv_size),
           (unsigned)colibri_img_u32(le));
    return 0;
}
"""


@pytest.mark.parametrize("cc,run", [("gcc", ()),
                                    ("arm-linux-gnueabihf-gcc",
                                     ("qemu-arm", "-L", "/usr/arm-linux-gnueabihf")),
                                    ("powerpc-linux-gnu-gcc",
                                     ("qemu-ppc", "-L", "/usr/powerpc-linux-gnu"))])
def test_struct_layout_on_each_compiler(tmp_path, cc, run):
    """The _Static_asserts must compile, and the printed layout and the
    little-endian reader must give the same numbers on 64-bit x86, 32-bit
    ARM and big-endian PowerPC."""
    if shutil.which(cc) is None or (run and shutil.which(run[0]) is None):
        pytest.skip(f"{cc} or {run[:1]} not installed")
    src = tmp_path / "probe.c"
    src.write_text(PROBE)
    exe = tmp_path / "probe"
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-static", "-I", str(HEADER.parent),
                    "-o", str(exe), str(src)], check=True, capture_output=True)
    out = subprocess.run([*run, str(exe)], check=True, capture_output=True, text=True,
                         timeout=60).stdout.split()
    assert out == ["32", "22", "4", "10", "0x12345678"]
