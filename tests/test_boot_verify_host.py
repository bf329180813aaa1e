"""The bootloader's verifier (firmware/boot/boot_core.c) built for the host
with AddressSanitizer and UBSan, against colibri.device.image.verify_image, on what
the QEMU tamper corpus cannot reach: images *correctly signed* by the trusted
key whose header and protected TLVs are arbitrary (a buggy or compromised
signer), so the parsing behind the signature check runs on hostile bytes too.
Every verdict must be the same number, and nothing may read out of bounds."""
from __future__ import annotations

import hashlib
import random
import shutil
import struct
import subprocess

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from colibri.device import image as I
from colibri.device import keys
from colibri.buildsteps import bootloader as BL

DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "boot_core.h"
void fw_write(const char *s, size_t n) { fwrite(s, 1, n, stdout); }
int main(int argc, char **argv) {
    if (argc != 2) return 2;
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    static unsigned char head[48];
    if (fread(head, 1, 48, f) != 48) return 2;
    unsigned target, counter, capacity, count;
    memcpy(&target, head, 4), memcpy(&counter, head + 4, 4);
    memcpy(&capacity, head + 8, 4), memcpy(&count, head + 12, 4);
    boot_policy p = {target, counter, capacity, head + 16};
    for (unsigned i = 0; i < count; i++) {
        unsigned len;
        if (fread(&len, 1, 4, f) != 4) return 2;
        unsigned char *b = malloc(len ? len : 1);   /* exactly len: ASan sees any overread */
        if (fread(b, 1, len, f) != len) return 2;
        printf("%d\n", boot_verify_image(b, len, &p, 0));
        free(b);
    }
    return 0;
}
"""

KEY = Ed25519PrivateKey.generate()
CAPACITY = 4096


def build(tmp_path):
    if shutil.which("gcc") is None or not (BL.ORLP_DIR / "ed25519.h").exists():
        pytest.skip("needs gcc and third_party/ (scripts/setup.sh)")
    (tmp_path / "driver.c").write_text(DRIVER)
    exe = tmp_path / "verify"
    ours = [tmp_path / "driver.c", BL.ROOT / "firmware/boot/boot_core.c",
            BL.ROOT / "firmware/model_check.c", BL.ROOT / "src/crc32.c"]
    flags = ["gcc", "-std=c11", "-O1", "-g", "-fsanitize=address,undefined",
             "-fno-sanitize-recover=all", "-Wall", "-Wextra", f"-I{BL.ROOT / 'firmware'}",
             f"-I{BL.ROOT / 'firmware/boot'}", f"-I{BL.ROOT / 'src/include'}",
             f"-I{BL.ORLP_DIR}", "-c"]
    objs = []
    for n, src in enumerate(ours + [BL.ORLP_DIR / s for s in BL.ORLP_SOURCES]):
        obj = tmp_path / f"{n}.o"
        # orlp's field arithmetic (ref10) left-shifts negative numbers: undefined
        # in ISO C, two's complement in GCC (documented), so that one check is
        # off for the library; everything of ours runs under the full UBSan.
        extra = ["-fno-sanitize=shift-base"] if src.parent == BL.ORLP_DIR else []
        r = subprocess.run(flags + extra + [str(src), "-o", str(obj)], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        objs.append(str(obj))
    r = subprocess.run(["gcc", "-fsanitize=address,undefined", *objs, "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return exe


def signed(header_fields: dict, payload: bytes, prot_body: bytes | None, pad: bytes = b"",
           tail: bytes = b"") -> bytes:
    """An image with an arbitrary header and protected area, signed properly."""
    prot = b"" if prot_body is None else struct.pack("<HH", 0x6908, 4 + len(prot_body)) + prot_body
    hdr_size = 32 + len(pad)
    f = dict(magic=I.MAGIC, load_addr=0, hdr_size=hdr_size, protect_tlv_size=len(prot) & 0xFFFF,
             img_size=len(payload), flags=0, ver_major=1, ver_minor=0, ver_revision=0,
             ver_build=0, pad1=0)
    f.update(header_fields)
    head = struct.pack(I.HEADER_STRUCT, *(f[n] for n, _, _ in I.HEADER_FIELDS)) + pad
    digest = hashlib.sha256(head + payload + prot).digest()
    unprot = I.tlv_area(I.TLV_INFO_MAGIC, I.tlv(I.TLV_SHA256, digest)
                        + I.tlv(I.TLV_KEYHASH, keys.key_hash(KEY))
                        + I.tlv(I.TLV_ED25519, KEY.sign(digest)))
    return head + payload + prot + unprot + tail


def hostile_images(n: int, seed: int = 1) -> list[bytes]:
    rnd = random.Random(seed)
    model = bytes(rnd.randrange(256) for _ in range(40))
    types = [I.TLV_SEC_CNT, I.TLV_TARGET, I.TLV_MODEL_SHA256, I.TLV_MODEL_INFO, I.TLV_SHA256,
             I.TLV_KEYHASH, 0x8123, 0x0123, 0x00A5]
    out = []

    def value(t):
        if t == I.TLV_SEC_CNT:
            return struct.pack("<I", rnd.choice([0, 1, 7, 2**32 - 1]))
        if t == I.TLV_TARGET:
            return struct.pack("<HH", rnd.choice([4, 4, 4, 2]), rnd.choice([0, 1, 1, 2]))
        if t == I.TLV_MODEL_SHA256:
            return rnd.choice([hashlib.sha256(model).digest()] * 3 + [bytes(32)])
        if t == I.TLV_MODEL_INFO:
            return struct.pack("<IIHBB", rnd.choice([8, 8, 9, 0xFFFFFFFF, 60]),
                               rnd.choice([40, 40, 41, 2**32 - 1]), 1, rnd.choice([0, 1, 2]),
                               rnd.choice([0, 0, 0, 1]))
        return bytes(rnd.randrange(0, 40))

    for _ in range(n):
        payload = bytes(8) + model + bytes(rnd.randrange(0, 30))
        chosen = [t for t, p in ((I.TLV_SEC_CNT, 0.9), (I.TLV_TARGET, 0.9)) if rnd.random() < p]
        if rnd.random() < 0.5:
            chosen += [I.TLV_MODEL_SHA256, I.TLV_MODEL_INFO][:rnd.choice([1, 2, 2, 2])]
        chosen += [rnd.choice(types) for _ in range(rnd.choice([0, 0, 1, 2]))]
        if rnd.random() < 0.3:
            rnd.shuffle(chosen)
        items = []
        for t in chosen:
            v = value(t)
            if rnd.random() < 0.05:
                v = v[:-1]                       # a wrong length
            items.append(struct.pack("<HH", t, len(v)) + v)
        body = b"".join(items)
        if rnd.random() < 0.05:
            body += bytes(rnd.randrange(1, 4))   # does not tile
        fields = {}
        if rnd.random() < 0.1:
            fields["flags"] = rnd.choice([0x20, 0x4, 0x10, 0x100])
        if rnd.random() < 0.05:
            fields["pad1"] = 1
        if rnd.random() < 0.05:
            fields["protect_tlv_size"] = rnd.randrange(0, 80)
        if rnd.random() < 0.03:
            fields["hdr_size"] = rnd.choice([0, 16, 31])
        if rnd.random() < 0.05:
            fields["img_size"] = rnd.randrange(0, 200)
        pad = bytes([0xFF]) * rnd.choice([0, 0, 0, 4, 224])
        tail = b"\xff" * rnd.choice([0, 0, 16])
        out.append(signed(fields, payload, body if rnd.random() < 0.97 else None, pad, tail))
    return out


def test_signed_hostile_images_same_verdicts(tmp_path):
    exe = build(tmp_path)
    images = hostile_images(3000)
    images.append(I.pack_image(b"\0" * 8, "cortex-m", I.Version(1, 0, 0), KEY))   # a good one
    corpus = tmp_path / "corpus.bin"
    corpus.write_bytes(struct.pack("<IIII", 4, 0, CAPACITY, len(images))
                       + keys.raw_public(KEY)
                       + b"".join(struct.pack("<I", len(x)) + x for x in images))
    r = subprocess.run([str(exe), str(corpus)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-500:] + r.stderr[-3000:]
    got = [int(x) for x in r.stdout.split()]
    want = []
    for x in images:
        try:
            I.verify_image(x, KEY.public_key(), I.Policy(target="cortex-m", installed_counter=0,
                                                         slot_size=CAPACITY), exact=False)
            want.append(0)
        except I.VerifyError as exc:
            want.append(exc.exit_status)
    assert len(got) == len(want)
    diff = [(i, want[i], got[i]) for i in range(len(want)) if want[i] != got[i]]
    assert not diff, diff[:10]
    counts = {v: want.count(v) for v in sorted(set(want))}
    assert counts.get(0, 0) >= 100 and len(counts) >= 5, counts   # reaches the deep checks
    print(f"\n{len(images)} signed hostile images, verdicts {counts}")
