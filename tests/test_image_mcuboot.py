"""MCUboot compatibility, judged by MCUboot's own `imgtool` (PyPI, pinned in
pyproject.toml's test extra): byte-identical images for the same inputs,
`imgtool verify` accepts what `colibri fw pack` makes and `colibri fw verify`
accepts what `imgtool sign` makes, keys go both ways (encrypted ones too),
`imgtool dumpinfo` shows Colibri's TLVs, and both verifiers are run over the
same tamper corpus (every byte of a small image flipped two ways, every
truncation).

imgtool's own verifier is laxer than an MCUboot bootloader in the unprotected
TLV area (it never compares KEYHASH with the key, reads a TLV type as one
byte, and ignores the area's length and the end of the file); Colibri checks
these as the bootloader does. The corpus test asserts that Colibri rejects
everything imgtool rejects and that every other disagreement lies in exactly
those fields."""
from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from colibri.device import image as I
from colibri.device import keys

imgtool_image = pytest.importorskip("imgtool.image")
imgtool_keys = pytest.importorskip("imgtool.keys")

from image_fixtures import TINY, model_blob  # noqa: E402,F401

V = I.Version.parse
BIN = Path(sys.executable).parent
IMGTOOL = str(BIN / "imgtool")
COLIBRI = str(BIN / "colibri")


def run(*args, env=None):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def keydir(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    r = run(COLIBRI, "fw", "keygen", "-o", d / "k")
    assert r.returncode == 0, r.stderr
    return d


def colibri_tlv_args(target: str, payload: bytes, model: bytes | None, kind=I.PAYLOAD_RAW):
    """The --custom-tlv arguments that make imgtool write Colibri's TLVs."""
    args = ["--custom-tlv", f"0x{I.TLV_TARGET:04x}",
            "0x" + struct.pack(I.TARGET_STRUCT, I.TARGET_IDS[target], kind).hex()]
    if model is not None:
        info = struct.pack(I.MODEL_INFO_STRUCT, payload.find(model), len(model), 1, 0, 0)
        args += ["--custom-tlv", f"0x{I.TLV_MODEL_SHA256:04x}",
                 "0x" + hashlib.sha256(model).hexdigest(),
                 "--custom-tlv", f"0x{I.TLV_MODEL_INFO:04x}", "0x" + info.hex()]
    return args


@pytest.mark.parametrize("header_size", [0x20, 0x200])
def test_pack_is_byte_identical_to_imgtool_sign(tmp_path, keydir, model_blob, header_size):
    payload = bytes(range(256)) + model_blob + b"\x5a" * 300
    (tmp_path / "fw.bin").write_bytes(payload)
    (tmp_path / "m.colibri").write_bytes(model_blob)
    r = run(COLIBRI, "fw", "pack", tmp_path / "fw.bin", "--model", tmp_path / "m.colibri",
            "--target", "cortex-m", "--version", "1.2.3+4", "--security-counter", "7",
            "--header-size", hex(header_size), "--key", keydir / "k", "-o", tmp_path / "c.img")
    assert r.returncode == 0, r.stderr
    r = run(IMGTOOL, "sign", "-k", keydir / "k", "--header-size", hex(header_size),
            "--pad-header", "-S", "0x100000", "-v", "1.2.3+4", "-s", "7",
            *colibri_tlv_args("cortex-m", payload, model_blob), tmp_path / "fw.bin",
            tmp_path / "i.img")
    assert r.returncode == 0, r.stderr
    ours, theirs = (tmp_path / "c.img").read_bytes(), (tmp_path / "i.img").read_bytes()
    assert ours == theirs
    # imgtool verifies ours, with the public or the private key
    for k in ("k.pub", "k"):
        r = run(IMGTOOL, "verify", "-k", keydir / k, tmp_path / "c.img")
        assert r.returncode == 0 and "correctly validated" in r.stdout, r.stdout
    # colibri verifies imgtool's, with the device policy
    r = run(COLIBRI, "fw", "verify", tmp_path / "i.img", "--key", keydir / "k.pub",
            "--target", "cortex-m", "--installed-counter", "7")
    assert r.returncode == 0, r.stderr
    img = I.verify_image(theirs, keys.load_public(keydir / "k.pub"))
    assert img.model.sha256 == hashlib.sha256(model_blob).digest()
    assert img.hdr_size == header_size and theirs[32:header_size] == b"\xff" * (header_size - 32)


def test_elf_payload_and_ram_load_match_imgtool(tmp_path, keydir):
    """An ELF payload (kind 1) and a RAM-load address (imgtool --load-addr)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    (tmp_path / "fw.c").write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-O1", "-o", str(tmp_path / "fw.elf"), str(tmp_path / "fw.c")],
                   check=True)
    elf = (tmp_path / "fw.elf").read_bytes()
    key = keys.load_private(keydir / "k")
    ours = I.pack_image(elf, "armv7", V("2.0.1"), key, security_counter=3,
                        load_address=0x20000000)
    r = run(IMGTOOL, "sign", "-k", keydir / "k", "--header-size", "0x20", "--pad-header",
            "-S", "0x100000", "-v", "2.0.1", "-s", "3", "--load-addr", "0x20000000",
            *colibri_tlv_args("armv7", elf, None, kind=I.PAYLOAD_ELF),
            tmp_path / "fw.elf", tmp_path / "i.img")
    assert r.returncode == 0, r.stderr
    assert ours == (tmp_path / "i.img").read_bytes()
    img = I.verify_image(ours, key.public_key())
    assert img.header["flags"] == I.IMAGE_F_RAM_LOAD and img.header["load_addr"] == 0x20000000
    assert "runs from RAM at 0x20000000" in I.describe(img)


def test_dumpinfo_shows_colibri_tlvs(tmp_path, keydir, model_blob):
    payload = b"\x00" * 64 + model_blob
    img = I.pack_image(payload, "ppc", V("1.0.0"), keys.load_private(keydir / "k"),
                       security_counter=9, model=model_blob)
    (tmp_path / "x.img").write_bytes(img)
    r = run(IMGTOOL, "dumpinfo", tmp_path / "x.img")
    assert r.returncode == 0, r.stderr
    for word in ("0x96f3b83d", "SEC_CNT (0x50)", "UNKNOWN (0x80a0)", "UNKNOWN (0x80a1)",
                 "UNKNOWN (0x80a2)", "SHA256 (0x10)", "KEYHASH (0x1)", "ED25519 (0x24)"):
        assert word in r.stdout, word


def test_imgtool_keys_work_with_colibri(tmp_path):
    """imgtool keygen (plain and password-protected) -> colibri fw pack;
    imgtool getpub -> colibri fw verify; colibri's encrypted key -> imgtool."""
    r = run(IMGTOOL, "keygen", "-t", "ed25519", "-k", tmp_path / "it.pem")
    assert r.returncode == 0, r.stderr
    r = run(IMGTOOL, "getpub", "-k", tmp_path / "it.pem", "-e", "pem")
    assert r.returncode == 0, r.stderr
    (tmp_path / "it.pub").write_text(r.stdout)
    (tmp_path / "fw.bin").write_bytes(b"firmware" * 10)
    r = run(COLIBRI, "fw", "pack", tmp_path / "fw.bin", "--target", "riscv64", "--version",
            "1.0.0", "--key", tmp_path / "it.pem", "-o", tmp_path / "a.img")
    assert r.returncode == 0, r.stderr
    r = run(COLIBRI, "fw", "verify", tmp_path / "a.img", "--key", tmp_path / "it.pub")
    assert r.returncode == 0, r.stderr

    # An encrypted key as imgtool writes it (`imgtool keygen -p` prompts, so
    # its own export function is called with the password).
    imgtool_keys.Ed25519.generate().export_private(str(tmp_path / "enc.pem"), passwd=b"s3cret")
    (tmp_path / "pw").write_text("s3cret\n")
    (tmp_path / "bad").write_text("wrong\n")
    base = [COLIBRI, "fw", "pack", tmp_path / "fw.bin", "--target", "riscv64", "--version",
            "1.0.0", "--key", tmp_path / "enc.pem", "-o", tmp_path / "e.img"]
    r = run(*base)
    assert r.returncode == 2 and "is encrypted: give its password" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run(*base, "--password-file", tmp_path / "bad")
    assert r.returncode == 2 and "wrong password" in r.stderr
    r = run(*base, "--password-file", tmp_path / "pw")
    assert r.returncode == 0, r.stderr
    r = run(*base, env={"COLIBRI_KEY_PASSWORD": "s3cret"})
    assert r.returncode == 0, r.stderr
    pub = imgtool_keys.load(str(tmp_path / "enc.pem"), b"s3cret")
    pub.export_public(str(tmp_path / "enc.pub"))
    r = run(IMGTOOL, "verify", "-k", tmp_path / "enc.pub", tmp_path / "e.img")
    assert r.returncode == 0, r.stdout

    # colibri fw keygen --password-file: imgtool reads it with the password
    r = run(COLIBRI, "fw", "keygen", "-o", tmp_path / "ck", "--password-file", tmp_path / "pw")
    assert r.returncode == 0, r.stderr
    assert b"ENCRYPTED PRIVATE KEY" in (tmp_path / "ck").read_bytes()
    assert imgtool_keys.load(str(tmp_path / "ck")) is None          # imgtool: needs a password
    k = imgtool_keys.load(str(tmp_path / "ck"), b"s3cret")
    assert k.get_public_bytes() == keys.der_public(keys.load_public(tmp_path / "ck.pub"))


# --- the tamper corpus ----------------------------------------------------------------
def imgtool_verdict(path: Path, data: bytes, pub) -> bool:
    """imgtool's verdict, through the function `imgtool verify` calls (its CLI
    exits 1 on anything but OK; an exception there is a rejection too)."""
    path.write_bytes(data)
    try:
        return imgtool_image.Image.verify(str(path), pub)[0] == imgtool_image.VerifyResult.OK
    except Exception:
        return False


def colibri_verdict(data: bytes, pub) -> bool:
    try:
        I.verify_image(data, pub)
    except I.VerifyError:
        return False
    return True


def imgtool_blind_spots(img: bytes) -> set[int]:
    """Bytes of the unprotected TLV area that imgtool's verifier does not
    check but an MCUboot bootloader (and Colibri) does: the area's length, the
    high byte of each TLV type (imgtool reads 'BBH'), the KEYHASH TLV whole
    (never compared with the key) and the signature's length (imgtool slices
    past the end of the file)."""
    p = I.parse_image(img)
    u = p.signed_end
    spots = {u + 2, u + 3}
    pos = u + I.TLV_INFO_SIZE
    while pos < len(img):
        t, n = struct.unpack_from("<HH", img, pos)
        spots.add(pos + 1)
        if t == I.TLV_KEYHASH:
            spots.update(range(pos, pos + 4 + n))
        if t == I.TLV_ED25519:
            spots.update((pos + 2, pos + 3))
        pos += 4 + n
    return spots


def test_tamper_corpus_same_verdicts_as_imgtool(tmp_path, keydir):
    key = keys.load_private(keydir / "k")
    pub_c = key.public_key()
    pub_i = imgtool_keys.load(str(keydir / "k.pub"))
    img = I.pack_image(bytes(range(64)), "cortex-m", V("1.2.3+4"), key, security_counter=7)
    path = tmp_path / "t.img"
    assert imgtool_verdict(path, img, pub_i) and colibri_verdict(img, pub_c)
    corpus = []
    for pos in range(len(img)):
        for mask in (0x01, 0xFF):
            bad = bytearray(img)
            bad[pos] ^= mask
            corpus.append((("flip", pos, mask), bytes(bad)))
    corpus += [(("cut", n, 0), img[:n]) for n in range(len(img))]
    blind = imgtool_blind_spots(img)
    agree, lax = 0, []
    for what, data in corpus:
        ours, theirs = colibri_verdict(data, pub_c), imgtool_verdict(path, data, pub_i)
        assert not ours, f"colibri accepted {what}"
        if ours == theirs:
            agree += 1
        else:
            lax.append(what)
    assert all(kind == "flip" and pos in blind for kind, pos, _ in lax), lax
    # the figures docs/IMAGE.md quotes
    assert (len(img), len(corpus)) == (260, 780)
    assert (agree, len(lax)) == (703, 77), (agree, len(lax))


def test_cli_verdicts_match_on_a_sample(tmp_path, keydir):
    """The two CLIs themselves on a few corpus items: exit 0 together, or
    imgtool's 1 and Colibri's documented status."""
    key = keys.load_private(keydir / "k")
    img = I.pack_image(bytes(range(64)), "cortex-m", V("1.0.0"), key, security_counter=1)
    cases = {"good": (img, 0), "payload": (img[:40] + b"\x00" + img[41:], 5),
             "signature": (img[:-1] + bytes([img[-1] ^ 1]), 7), "cut": (img[:-10], 4),
             "magic": (b"\x00" + img[1:], 3)}
    for name, (data, status) in cases.items():
        f = tmp_path / f"{name}.img"
        f.write_bytes(data)
        i = run(IMGTOOL, "verify", "-k", keydir / "k.pub", f)
        c = run(COLIBRI, "fw", "verify", f, "--key", keydir / "k.pub")
        assert c.returncode == status, (name, c.stderr)
        assert (i.returncode == 0) == (status == 0), (name, i.stdout)
