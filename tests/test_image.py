"""Signed firmware images (colibri/device/image.py, docs/IMAGE.md): layout against
the spec table, ELFs with an embedded model built by real compilers, every
rejection reason, every single-byte flip and every truncation of a small image.

Layout expectations are written from the IMAGE.md tables (offsets and
constants), and digests with hashlib directly, never from the packer itself."""
from __future__ import annotations

import hashlib
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from colibri.device import image as I
from colibri.device import keys
from colibri.buildsteps import blob as fwblob
from colibri.buildsteps import testmodel
from image_fixtures import TINY, key, model_blob  # noqa: E402,F401

V = I.Version.parse




@pytest.fixture(scope="module")
def small_image(key, model_blob):
    """A 1 KiB raw payload that contains the model: ~3 KB image."""
    payload = bytes(range(256)) * 2 + model_blob + b"\x5a" * 512
    return I.pack_image(payload, "armv7", V("1.2.3+4"), key, security_counter=7,
                        model=model_blob)


def compile_elf(tmp_path, cc: str, blob_path=None, name="fw"):
    """A small static-free ELF from `cc`, with the model embedded in the
    `.colibri_model` section by the build's own assembler generator."""
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} is not installed")
    src = tmp_path / f"{name}.c"
    src.write_text("extern const unsigned char colibri_model_blob[];\n"
                   "int main(void) { return colibri_model_blob[0] == 'C' ? 0 : 1; }\n"
                   if blob_path else "int main(void) { return 0; }\n")
    sources = [str(src)]
    if blob_path:
        asm = tmp_path / f"{name}_blob.S"
        asm.write_text(fwblob.embed_asm(str(blob_path), linux=True))
        sources.append(str(asm))
    out = tmp_path / f"{name}.elf"
    subprocess.run([cc, "-O1", "-o", str(out), *sources], check=True, capture_output=True)
    return out.read_bytes()


# --- versions ---------------------------------------------------------------------
def test_version_parse_order_and_limits():
    assert V("1.2.3") == I.Version(1, 2, 3, 0)
    assert V("1.2.3+42") == I.Version(1, 2, 3, 42)
    assert str(V("1.2.3+42")) == "1.2.3+42" and str(V("0.0.1")) == "0.0.1"
    assert V("1.2.3") < V("1.2.3+1") < V("1.2.4") < V("1.10.0") < V("2.0.0")
    for bad, word in (("1.2", "MAJOR"), ("1.2.3+", "MAJOR"), ("a.b.c", "decimal"),
                      ("256.0.0", "major"), ("1.256.0", "minor"), ("1.2.65536", "patch"),
                      ("1.2.3+4294967296", "build"), ("1.2.-3", "outside")):
        with pytest.raises(I.ColibriError, match=word):
            V(bad)


# --- layout against IMAGE.md ---------------------------------------------------------
def test_header_layout_matches_the_spec(key, small_image, model_blob):
    img = small_image
    payload_size = 512 + len(model_blob) + 512
    assert img[0:4] == bytes.fromhex("3db8f396")                 # ih_magic 0x96f3b83d
    (magic, load, hsize, prot, psize, flags, major, minor, rev, build, pad1) = \
        struct.unpack_from("<IIHHIIBBHII", img, 0)
    assert (hsize, psize, flags, load, pad1) == (32, payload_size, 0, 0, 0)
    assert (major, minor, rev, build) == (1, 2, 3, 4)
    # protected TLV area right after the payload
    p = 32 + payload_size
    assert struct.unpack_from("<HH", img, p) == (0x6908, prot)
    # SEC_CNT, TARGET, MODEL_SHA256, MODEL_INFO, each type/len/value
    q = p + 4
    assert struct.unpack_from("<HHI", img, q) == (0x0050, 4, 7)
    q += 8
    assert struct.unpack_from("<HHHH", img, q) == (0x80A2, 4, 2, 0)   # armv7, raw binary
    q += 8
    assert struct.unpack_from("<HH", img, q) == (0x80A0, 32)
    assert img[q + 4:q + 36] == hashlib.sha256(model_blob).digest()
    q += 36
    assert struct.unpack_from("<HHIIHBB", img, q) == (0x80A1, 12, 512, len(model_blob), 1, 0, 0)
    q += 16
    assert q == p + prot
    # unprotected area: SHA256, KEYHASH, ED25519 and nothing after it
    magic, total = struct.unpack_from("<HH", img, q)
    assert (magic, total) == (0x6907, 4 + 36 + 36 + 68)
    assert q + total == len(img)
    digest = hashlib.sha256(img[:p + prot]).digest()
    assert struct.unpack_from("<HH", img, q + 4) == (0x0010, 32)
    assert img[q + 8:q + 40] == digest
    assert struct.unpack_from("<HH", img, q + 40) == (0x0001, 32)
    assert img[q + 44:q + 76] == hashlib.sha256(keys.der_public(key)).digest()
    assert struct.unpack_from("<HH", img, q + 76) == (0x0024, 64)
    # the signature is Ed25519 over the bare digest (MCUboot's rule)
    key.public_key().verify(img[q + 80:q + 144], digest)


def test_round_trip_and_describe(key, small_image, model_blob):
    img = I.verify_image(small_image, key.public_key())
    assert img.version == V("1.2.3+4") and img.target == "armv7"
    assert img.security_counter == 7
    assert img.model.sha256 == hashlib.sha256(model_blob).digest()
    assert (img.model.offset, img.model.size, img.model.format_version,
            img.model.byte_order) == (512, len(model_blob), 1, "little")
    text = I.describe(img)
    for word in ("armv7", "1.2.3+4", "sec counter   7", "raw binary", "executes in place",
                 hashlib.sha256(model_blob).hexdigest()):
        assert word in text


@pytest.mark.parametrize("cc,target,order", [("gcc", "x86_64", "little"),
                                             ("arm-linux-gnueabihf-gcc", "armv7", "little"),
                                             ("powerpc-linux-gnu-gcc", "ppc", "big")])
def test_elf_with_embedded_model(tmp_path, key, cc, target, order):
    """The model is found in the ELF's .colibri_model section (as the build
    embeds it), located in the payload, hashed and described."""
    blob_path = tmp_path / "m.colibri"
    testmodel.make_model(blob_path, "f32", shape=TINY, byte_order=order)
    blob = blob_path.read_bytes()
    elf = compile_elf(tmp_path, cc, blob_path)
    img = I.verify_image(I.pack_image(elf, target, V("2.0.0"), key), key.public_key())
    assert img.payload_kind == I.PAYLOAD_ELF and img.header["flags"] == 0
    m = img.model
    assert m is not None and m.byte_order == order and m.size == len(blob)
    assert bytes(img.payload[m.offset:m.offset + m.size]) == blob
    assert m.sha256 == hashlib.sha256(blob).digest()


def test_elf_without_model_and_model_option(tmp_path, key, model_blob):
    elf = compile_elf(tmp_path, "gcc")
    img = I.verify_image(I.pack_image(elf, "x86_64", V("1.0.0"), key), key.public_key())
    assert img.model is None
    # a model given separately, not inside the payload
    img = I.verify_image(I.pack_image(elf, "x86_64", V("1.0.0"), key, model=model_blob),
                         key.public_key())
    assert img.model.offset == I.MODEL_NOT_IN_PAYLOAD
    assert img.model.sha256 == hashlib.sha256(model_blob).digest()


def test_pack_refuses_bad_inputs(tmp_path, key, model_blob):
    bad_model = bytearray(model_blob)
    bad_model[-1] ^= 1                               # a section CRC fails
    with pytest.raises(I.PackError, match="not a valid .colibri"):
        I.pack_image(b"x" * 100, "armv7", V("1.0.0"), key, model=bytes(bad_model))
    elf = compile_elf(tmp_path, "gcc")
    with pytest.raises(I.PackError, match="cannot be parsed"):
        I.pack_image(elf[:len(elf) // 2], "x86_64", V("1.0.0"), key)
    with pytest.raises(I.SlotSizeError, match="larger than the 1000-byte slot"):
        I.pack_image(b"x" * 1000, "armv7", V("1.0.0"), key, slot_size=1000)
    with pytest.raises(I.ColibriError, match="unknown target 'avr'"):
        I.pack_image(b"x", "avr", V("1.0.0"), key)
    with pytest.raises(I.PackError, match="security counter"):
        I.pack_image(b"x", "armv7", V("1.0.0"), key, security_counter=-1)
    with pytest.raises(I.PackError, match="header size 16"):
        I.pack_image(b"x", "armv7", V("1.0.0"), key, header_size=16)
    with pytest.raises(I.PackError, match="32 bits"):
        I.pack_image(b"x", "armv7", V("1.0.0"), key, load_address=1 << 32)


# --- every rejection, each with its own class and exit status --------------------------------
def test_exit_statuses_are_distinct_and_documented():
    statuses = {e.exit_status for e in I.REJECTIONS}
    assert len(statuses) == len(I.REJECTIONS) and 0 not in statuses and 2 not in statuses
    doc = (Path(__file__).resolve().parents[1] / "docs" / "IMAGE.md").read_text()
    for e in I.REJECTIONS:
        assert f"| {e.exit_status} | `{e.reason}` |" in doc, e.reason


def test_policy_rejections(key, small_image):
    pub = key.public_key()
    size = len(small_image)
    I.verify_image(small_image, pub, I.Policy(target="armv7", installed_version=V("1.2.3+4"),
                                              installed_counter=7, slot_size=size))
    cases = [(I.Policy(target="ppc"), I.TargetError, "built for armv7.*device is ppc"),
             (I.Policy(installed_version=V("1.2.3+5")), I.DowngradeError, "older than"),
             (I.Policy(installed_version=V("1.3.0")), I.DowngradeError, "1.2.3\\+4"),
             (I.Policy(installed_counter=8), I.CounterError, "counter 7 is below.* 8"),
             (I.Policy(slot_size=size - 1), I.SlotSizeError, "larger than")]
    for policy, err, msg in cases:
        with pytest.raises(err, match=msg):
            I.verify_image(small_image, pub, policy)


def test_wrong_key_and_forged_signature(key, small_image):
    other = Ed25519PrivateKey.generate()
    with pytest.raises(I.KeyMismatchError, match="matching KEY.pub"):
        I.verify_image(small_image, other.public_key())
    # A forger who re-hashes a modified image and keeps the key hash but
    # cannot sign: the SHA-256 matches, the signature does not.
    img = bytearray(small_image)
    img[100] ^= 0xFF
    end = I.parse_image(bytes(img)).signed_end
    digest = hashlib.sha256(bytes(img[:end])).digest()
    img[end + 8:end + 40] = digest
    with pytest.raises(I.SignatureError, match="not authentic"):
        I.verify_image(bytes(img), key.public_key())
    # ...and re-signing with another key while keeping the original key hash
    img[end + 80:end + 144] = other.sign(digest)
    with pytest.raises(I.SignatureError):
        I.verify_image(bytes(img), key.public_key())


def test_unknown_tlvs(key):
    pub = key.public_key()
    crit = I.pack_image(b"p" * 64, "ppc", V("1.0.0"), key,
                        extra_protected_tlvs=((0x8123, b"new"),))
    with pytest.raises(I.CriticalTLVError, match="0x8123.*critical"):
        I.verify_image(crit, pub)
    optional = I.pack_image(b"p" * 64, "ppc", V("1.0.0"), key,
                            extra_protected_tlvs=((0x0123, b"new"),))
    assert I.verify_image(optional, pub).unknown_tlvs == [0x0123]
    dup = I.pack_image(b"p" * 64, "ppc", V("1.0.0"), key,
                       extra_protected_tlvs=((I.TLV_SEC_CNT, struct.pack("<I", 9)),))
    with pytest.raises(I.MalformedError, match="SEC_CNT appears twice"):
        I.verify_image(dup, pub)
    kind = I.pack_image(b"p" * 64, "ppc", V("1.0.0"), key,
                        extra_protected_tlvs=((0x80A3, b"x"),))
    with pytest.raises(I.CriticalTLVError, match="0x80a3"):
        I.verify_image(kind, pub)


def test_flags_and_missing_colibri_tlvs(key):
    """What MCUboot allows but a Colibri device refuses: header flags it cannot
    honour (encrypted, compressed, ...), no security counter, no target."""
    pub = key.public_key()

    def signed(header_flags=0, prot_body=b""):
        prot = I.tlv_area(I.TLV_PROT_INFO_MAGIC, prot_body) if prot_body else b""
        head = I.pack_header(version=V("1.0.0"), img_size=8, protect_tlv_size=len(prot),
                             flags=header_flags)
        digest = hashlib.sha256(head + b"p" * 8 + prot).digest()
        return head + b"p" * 8 + prot + I.tlv_area(
            I.TLV_INFO_MAGIC, I.tlv(I.TLV_SHA256, digest) + I.tlv(I.TLV_KEYHASH, keys.key_hash(key))
            + I.tlv(I.TLV_ED25519, key.sign(digest)))
    sec = I.tlv(I.TLV_SEC_CNT, struct.pack("<I", 1))
    tgt = I.tlv(I.TLV_TARGET, struct.pack("<HH", 2, 0))
    assert I.verify_image(signed(0, sec + tgt), pub).target == "armv7"
    with pytest.raises(I.CriticalTLVError, match="0x00000004"):
        I.verify_image(signed(0x4, sec + tgt), pub)            # ENCRYPTED_AES128
    with pytest.raises(I.MalformedError, match="no security counter"):
        I.verify_image(signed(0, tgt), pub)
    with pytest.raises(I.MalformedError, match="no Colibri TARGET TLV"):
        I.verify_image(signed(0, sec), pub)
    with pytest.raises(I.MalformedError, match="no security counter"):
        I.verify_image(signed(0, b""), pub)                     # no protected area at all


def test_unprotected_area_takes_only_the_signature_tlvs(key):
    img = I.pack_image(b"p" * 64, "ppc", V("1.0.0"), key)
    u = I.parse_image(img).signed_end
    extra = struct.pack("<HH", 0x0042, 2) + b"hi"
    total = struct.unpack_from("<H", img, u + 2)[0] + len(extra)
    bad = img[:u] + struct.pack("<HH", 0x6907, total) + img[u + 4:] + extra
    with pytest.raises(I.MalformedError, match="0x0042 in the unprotected area"):
        I.verify_image(bad, key.public_key())


def test_every_single_byte_flip_is_rejected(key, small_image):
    """Flip each byte of a ~3 KB image (all 8 bits at once, and the low bit):
    every one must be rejected, and the reasons are only those a flip can give."""
    pub = key.public_key()
    I.verify_image(small_image, pub)      # the unflipped image is good
    reasons = {}
    for pos in range(len(small_image)):
        for mask in (0xFF, 0x01):
            bad = bytearray(small_image)
            bad[pos] ^= mask
            with pytest.raises(I.VerifyError) as exc:
                I.verify_image(bytes(bad), pub)
            reasons[type(exc.value)] = reasons.get(type(exc.value), 0) + 1
    assert sum(reasons.values()) == 2 * len(small_image)
    assert set(reasons) <= {I.MalformedError, I.TruncatedError, I.DigestError,
                            I.KeyMismatchError, I.SignatureError}
    assert reasons[I.DigestError] > len(small_image)   # payload and TLVs: the hash catches it


def test_every_truncation_is_rejected_as_truncated(key, small_image):
    pub = key.public_key()
    for n in range(len(small_image)):
        with pytest.raises(I.TruncatedError):
            I.verify_image(small_image[:n], pub)
    with pytest.raises(I.MalformedError, match="unexpected bytes after"):
        I.verify_image(small_image + b"\xff", pub)
    # in a flash slot, erased flash after the image is fine
    I.verify_image(small_image + b"\xff" * 100, pub, exact=False)
