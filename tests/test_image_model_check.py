"""The boot-time model check (firmware/model_check.c): its SHA-256 and CRC-32
against hashlib and zlib, every single-byte flip of a model blob refused, the
image's MODEL_SHA256 TLV read in C, and, under QEMU (armv7 and big-endian
ppc), a built and signed firmware image whose model section has one byte
flipped: `colibri fw verify` rejects the image and the program, run as it is,
refuses the model with its own exit status and a clear message."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from colibri.file import format as F
from colibri.device import image as I
from colibri.buildsteps import blob as fwblob
from colibri.buildsteps import testmodel
from image_fixtures import TINY  # noqa: E402,F401

ROOT = Path(__file__).resolve().parents[1]
INCLUDES = ["-I", str(ROOT / "src" / "include"), "-I", str(ROOT / "firmware")]
CHECK_C = str(ROOT / "firmware" / "model_check.c")
CRC_C = str(ROOT / "src" / "crc32.c")  # the runtime's CRC-32, which the check uses
EXIT_MODEL_CORRUPT = 3     # COLIBRI_FW_EXIT_MODEL_CORRUPT

# A host-side tool over files (native) and, with -DEMBED, a firmware-like
# program whose model is embedded exactly as the build embeds it.
DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "colibri.h"        /* colibri_crc32 */
#include "model_check.h"

void fw_write(const char *s, size_t n) { fwrite(s, 1, n, stdout); }

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(100); }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(len ? (size_t)len : 1);
    if (fread(buf, 1, (size_t)len, f) != (size_t)len) exit(101);
    fclose(f);
    *n = (size_t)len;
    return buf;
}

static void hex(const uint8_t *d, size_t n) {
    for (size_t i = 0; i < n; i++) printf("%02x", d[i]);
    printf("\n");
}

#ifdef EMBED
extern const uint8_t colibri_model_blob[];
extern const uint32_t colibri_model_blob_size;
int main(int argc, char **argv) {
    const uint8_t *expected = NULL;
    uint8_t digest[32];
    if (argc > 1) {   /* the signed image the bootloader booted: take its MODEL_SHA256 */
        size_t n;
        uint8_t *img = slurp(argv[1], &n);
        if (colibri_image_model_sha256(img, n, digest) == 0) expected = digest;
    }
    int rc = colibri_fw_model_check(colibri_model_blob, colibri_model_blob_size, expected);
    if (rc) return rc;
    printf("model ok %u bytes%s\n", (unsigned)colibri_model_blob_size,
           expected ? " sha256 matches the image" : "");
    return 0;
}
#else
int main(int argc, char **argv) {
    size_t n;
    uint8_t *buf = slurp(argv[2], &n);
    char msg[200];
    if (!strcmp(argv[1], "sha")) {
        uint8_t d[32];
        colibri_sha256(buf, n, d);
        hex(d, 32);
    } else if (!strcmp(argv[1], "crc")) {
        printf("%08x\n", (unsigned)colibri_crc32(0, buf, n));
    } else if (!strcmp(argv[1], "check")) {   /* check FILE [LEN] [SHA256HEX] */
        size_t len = argc > 3 ? strtoul(argv[3], NULL, 10) : n;
        uint8_t want[32];
        if (argc > 4)
            for (int i = 0; i < 32; i++) sscanf(argv[4] + 2 * i, "%2hhx", &want[i]);
        int rc = colibri_model_check(buf, len, argc > 4 ? want : NULL, msg, sizeof msg);
        printf("%d %s\n", rc, msg);
    } else if (!strcmp(argv[1], "flipall")) {  /* every position, mask argv[3] */
        int mask = (int)strtol(argv[3], NULL, 0), accepted = 0;
        for (size_t i = 0; i < n; i++) {
            buf[i] ^= (uint8_t)mask;
            if (colibri_model_check(buf, n, NULL, msg, sizeof msg) == 0) {
                printf("accepted %u\n", (unsigned)i);
                accepted++;
            }
            buf[i] ^= (uint8_t)mask;
        }
        printf("flipped %u accepted %d\n", (unsigned)n, accepted);
    } else if (!strcmp(argv[1], "truncall")) { /* every shorter length: which pass */
        for (size_t len = 0; len < n; len++)
            if (colibri_model_check(buf, len, NULL, msg, sizeof msg) == 0)
                printf("%u\n", (unsigned)len);
    } else if (!strcmp(argv[1], "imgsha")) {
        uint8_t d[32];
        int rc = colibri_image_model_sha256(buf, n, d);
        printf("%d ", rc);
        if (rc == 0) hex(d, 32); else printf("\n");
    }
    free(buf);
    return 0;
}
#endif
"""


@pytest.fixture(scope="module")
def tool(tmp_path_factory):
    d = tmp_path_factory.mktemp("mctool")
    (d / "driver.c").write_text(DRIVER)
    exe = d / "tool"
    subprocess.run(["gcc", "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror",
                    "-fsanitize=address,undefined", "-fno-sanitize-recover=all", *INCLUDES,
                    "-o", str(exe), str(d / "driver.c"), CHECK_C, CRC_C], check=True,
                   capture_output=True)

    def run(*args) -> str:
        return subprocess.run([str(exe), *map(str, args)], check=True, capture_output=True,
                              text=True, timeout=60).stdout
    return run


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("mcmodels")
    return {order: testmodel.make_model(d / f"{order}.colibri", "int8", shape=TINY,
                                        byte_order=order)
            for order in ("little", "big")}


def test_sha256_and_crc32_match_hashlib_and_zlib(tool, tmp_path):
    data = bytes((i * 37 + 11) & 0xFF for i in range(5000))
    for n in (0, 1, 3, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 1000, 4099, 5000):
        f = tmp_path / f"d{n}"
        f.write_bytes(data[:n])
        assert tool("sha", f).strip() == hashlib.sha256(data[:n]).hexdigest(), n
        assert int(tool("crc", f), 16) == zlib.crc32(data[:n]), n


@pytest.mark.parametrize("order", ["little", "big"])
def test_intact_model_passes(tool, models, order):
    path = models[order]
    assert tool("check", path).strip() == "0"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    size = path.stat().st_size
    assert tool("check", path, size, digest).strip() == "0"
    wrong = hashlib.sha256(b"other").hexdigest()
    assert tool("check", path, size, wrong).startswith("-21 the model's SHA-256 differs")


@pytest.mark.parametrize("order", ["little", "big"])
def test_every_single_byte_flip_is_refused(tool, models, order):
    """CRCs plus zero padding cover every byte of the blob: no flip passes,
    even without an expected SHA-256."""
    for mask in ("0xff", "0x01"):
        out = tool("flipall", models[order], mask)
        n = models[order].stat().st_size
        assert out.strip().splitlines()[-1] == f"flipped {n} accepted 0", out[:500]


def test_messages_name_what_is_wrong(tool, models, tmp_path):
    path = models["little"]
    data = path.read_bytes()
    cf = F.parse(data)                       # the Python reader, for the layout
    e = cf.entries[3]
    cases = [(10, "-3 model header CRC mismatch"),
             (70, "-3 model tensor table CRC mismatch"),
             (e.offset + 1, f"-3 section 3 (kind {e.kind}, layer 0) at offset {e.offset}: "
                            "CRC mismatch"),
             (0, "-1 the model blob does not start with CLBR")]
    for pos, want in cases:
        bad = bytearray(data)
        bad[pos] ^= 0x40
        f = tmp_path / f"bad{pos}"
        f.write_bytes(bytes(bad))
        assert tool("check", f).startswith(want), (pos, tool("check", f))
    # truncation: refused unless only trailing padding is cut off
    last_end = max(x.offset + x.size for x in cf.entries)
    accepted = [int(x) for x in tool("truncall", path).split()]
    assert accepted == list(range(last_end, len(data)))


def test_image_model_sha256_in_c(tool, models, tmp_path):
    key = Ed25519PrivateKey.generate()
    blob = models["big"].read_bytes()
    img = tmp_path / "fw.img"
    img.write_bytes(I.pack_image(b"\0" * 100 + blob, "ppc", I.Version(1, 0, 0), key, model=blob))
    assert tool("imgsha", img).split() == ["0", hashlib.sha256(blob).hexdigest()]
    img.write_bytes(I.pack_image(b"\0" * 100, "ppc", I.Version(1, 0, 0), key))
    assert tool("imgsha", img).split() == ["-2"]
    img.write_bytes(b"CLFW" + bytes(100))
    assert tool("imgsha", img).split() == ["-1"]
    img.write_bytes(I.MAGIC_BYTES + bytes(100))             # hdr_size 0: malformed
    assert tool("imgsha", img).split() == ["-1"]
    # the header size is honoured (imgtool --header-size 0x200)
    img.write_bytes(I.pack_image(b"\0" * 100 + blob, "ppc", I.Version(1, 0, 0), key,
                                 model=blob, header_size=0x200))
    assert tool("imgsha", img).split() == ["0", hashlib.sha256(blob).hexdigest()]


@pytest.mark.parametrize("cc,flags", [("arm-none-eabi-gcc", ["-mcpu=cortex-m4", "-mthumb"]),
                                      ("powerpc-linux-gnu-gcc", []),
                                      ("clang", ["-Weverything", "-Wno-declaration-after-statement",
                                                 "-Wno-padded"])])
def test_compiles_cleanly_for_bare_metal_and_big_endian(tmp_path, cc, flags):
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} not installed")
    subprocess.run([cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", *flags, *INCLUDES,
                    "-c", CHECK_C, "-o", str(tmp_path / "mc.o")], check=True,
                   capture_output=True, text=True)
    subprocess.run([cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", *flags, *INCLUDES,
                    "-c", CRC_C, "-o", str(tmp_path / "crc.o")], check=True,
                   capture_output=True, text=True)


QEMU = {"armv7": ("arm-linux-gnueabihf-gcc", ["qemu-arm", "-cpu", "cortex-a9", "-L",
                                               "/usr/arm-linux-gnueabihf"], "little"),
        "ppc": ("powerpc-linux-gnu-gcc", ["qemu-ppc", "-L", "/usr/powerpc-linux-gnu"], "big")}


@pytest.mark.parametrize("target", list(QEMU))
def test_flipped_model_byte_in_a_built_image_under_qemu(tmp_path, target):
    cc, qemu, order = QEMU[target]
    if shutil.which(cc) is None or shutil.which(qemu[0]) is None:
        pytest.skip(f"{cc} or {qemu[0]} not installed")
    model = tmp_path / "model.colibri"
    testmodel.make_model(model, "int8", shape=TINY, byte_order=order)
    (tmp_path / "driver.c").write_text(DRIVER)
    (tmp_path / "blob.S").write_text(fwblob.embed_asm(str(model), linux=True))
    elf = tmp_path / "firmware.elf"
    subprocess.run([cc, "-std=c11", "-O2", "-static", "-DEMBED", *INCLUDES, "-o", str(elf),
                    str(tmp_path / "driver.c"), CHECK_C, CRC_C, str(tmp_path / "blob.S")],
                   check=True, capture_output=True)
    key = Ed25519PrivateKey.generate()
    image = I.pack_image(elf.read_bytes(), target, I.Version(1, 0, 0), key)
    good = I.verify_image(image, key.public_key())
    assert good.model is not None and good.model.byte_order == order

    def run(image_bytes: bytes, name: str):
        """Install the image's payload as the device would run it."""
        payload = image_bytes[good.hdr_size:good.hdr_size + len(good.payload)]
        prog = tmp_path / name
        prog.write_bytes(payload)
        os.chmod(prog, 0o755)
        (tmp_path / f"{name}.img").write_bytes(image_bytes)
        return subprocess.run([*qemu, str(prog), str(tmp_path / f"{name}.img")],
                              capture_output=True, text=True, timeout=120)

    r = run(image, "good")
    assert (r.returncode, r.stdout.strip()) == (
        0, f"model ok {good.model.size} bytes sha256 matches the image")
    # One flipped byte inside the model section of the signed image: in the
    # last weight section (located with the Python reader), and in the header.
    last = F.parse(model.read_bytes()).entries[-1]
    for where, pos in (("section", last.offset + last.size // 2), ("header", 20)):
        bad = bytearray(image)
        bad[good.hdr_size + good.model.offset + pos] ^= 0x10
        with pytest.raises(I.DigestError):
            I.verify_image(bytes(bad), key.public_key())
        r = run(bytes(bad), f"bad_{where}")
        assert r.returncode == EXIT_MODEL_CORRUPT, (r.stdout, r.stderr)
        assert r.stdout.startswith("error: model check: ")
        assert "CRC mismatch" in r.stdout and "re-flash" in r.stdout
        assert r.stdout.count("\n") == 1
