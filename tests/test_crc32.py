"""colibri_crc32 (src/crc32.c), the CRC every .colibri check rests on,
against zlib.crc32 (the independent reference) on many lengths, offsets and
chained calls, natively and under qemu-ppc (big-endian), and its generated
tables against the polynomial."""
from __future__ import annotations

import re
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include "colibri.h"
/* stdin: bytes. Prints the CRC of data[off:off+len] for every (off, len) in
 * a grid (every length below 80, then LONG's: the folding paths' 64- and
 * 128-byte steps, 16-byte steps and tails), and a chained CRC of the whole
 * input in two parts. */
int main(void) {
    static unsigned char buf[1 << 16];
    static const size_t LONG[] = { LONG_LENGTHS };
    size_t n = fread(buf, 1, sizeof buf, stdin);
    for (size_t off = 0; off < 9 && off < n; off++) {
        for (size_t len = 0; off + len <= n && len < 80; len++)
            printf("%zu %zu %08x\n", off, len, (unsigned)colibri_crc32(0, buf + off, len));
        for (size_t i = 0; i < sizeof LONG / sizeof LONG[0]; i++)
            if (off + LONG[i] <= n)
                printf("%zu %zu %08x\n", off, LONG[i],
                       (unsigned)colibri_crc32(0, buf + off, LONG[i]));
    }
    uint32_t c = colibri_crc32(0, buf, n / 3);
    printf("chain %08x\n", (unsigned)colibri_crc32(c, buf + n / 3, n - n / 3));
    return 0;
}
"""


LONG_LENGTHS = (80, 95, 96, 111, 127, 128, 129, 143, 144, 191, 192, 200, 255, 256, 257, 271,
                272, 383, 384, 385, 400, 511, 512, 640, 1000, 1023, 1024, 4095, 4096, 4097, 4990)


def expected(data: bytes) -> str:
    lines = []
    for off in range(min(9, len(data))):
        for ln in (*range(0, 80), *LONG_LENGTHS):
            if off + ln > len(data):
                break
            lines.append(f"{off} {ln} {zlib.crc32(data[off:off + ln]):08x}")
    lines.append(f"chain {zlib.crc32(data):08x}")
    return "\n".join(lines) + "\n"


def cpu_has(flag: str) -> bool:
    try:
        return f" {flag}" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("slice8,clmul,vclmul", [(1, 1, 1), (1, 1, 0), (1, 0, 0), (0, 0, 0)],
                         ids=["vpclmulqdq", "clmul", "slicing-by-8", "byte-table"])
@pytest.mark.parametrize("cc,run", [
    ("gcc", ()),
    ("powerpc-linux-gnu-gcc", ("qemu-ppc", "-L", "/usr/powerpc-linux-gnu")),
])
def test_crc32_equals_zlib(tmp_path, cc, run, slice8, clmul, vclmul):
    """clmul: the x86-64 folding path (on a CPU with PCLMULQDQ; elsewhere,
    and on ppc, the build leaves it out and the tables answer); vpclmulqdq:
    its 256-bit form, from 256 bytes, where the CPU has it."""
    if shutil.which(cc) is None or (run and shutil.which(run[0]) is None):
        pytest.skip(f"{cc} or its emulator is not installed")
    if vclmul and not run and not cpu_has("vpclmulqdq"):
        pytest.skip("this CPU has no VPCLMULQDQ: the 256-bit folding path cannot run "
                    "(the clmul case covers the 128-bit one)")
    exe = tmp_path / "crc"
    (tmp_path / "d.c").write_text(DRIVER.replace("LONG_LENGTHS",
                                                 ", ".join(map(str, LONG_LENGTHS))))
    subprocess.run([cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-static",
                    f"-DCOLIBRI_CRC32_SLICE8={slice8}", f"-DCOLIBRI_CRC32_CLMUL={clmul}",
                    f"-DCOLIBRI_CRC32_VCLMUL={vclmul}",
                    "-I", str(ROOT / "src" / "include"), "-o", str(exe),
                    str(tmp_path / "d.c"), str(ROOT / "src" / "crc32.c")],
                   check=True, capture_output=True)
    data = bytes((i * 131 + (i >> 3) * 17) & 0xFF for i in range(5000))
    out = subprocess.run([*run, str(exe)], input=data, capture_output=True,
                         check=True, timeout=120).stdout.decode()
    assert out == expected(data)


def test_tables_match_the_polynomial():
    text = (ROOT / "src" / "crc32_tables.h").read_text()
    values = [int(v, 16) for v in re.findall(r"0x([0-9a-f]{8})u", text)]
    assert len(values) == 8 * 256
    t0 = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0xEDB88320 if c & 1 else 0)
        t0.append(c)
    tables = [t0]
    for k in range(1, 8):
        tables.append([(tables[k - 1][i] >> 8) ^ t0[tables[k - 1][i] & 0xFF] for i in range(256)])
    assert values == [v for t in tables for v in t]
