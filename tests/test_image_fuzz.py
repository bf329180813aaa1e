"""Hostile input never crashes the verifiers: random bytes, random mutations,
and (the harder case) arbitrary content *correctly signed* by a trusted key,
so the parsers behind the signature check see it too. Every outcome must be
a clean result or a VerifyError, never another exception."""
from __future__ import annotations

import hashlib
import struct

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from colibri.device import image as I
from colibri.device import keys, ota

KEY = Ed25519PrivateKey.generate()
PUB = KEY.public_key()
GOOD_IMAGE = I.pack_image(b"\x42" * 200, "armv7", I.Version(1, 0, 0), KEY, security_counter=2)
GOOD_PACKAGE = ota.pack_package([GOOD_IMAGE], KEY)
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def sign_image(header: bytes, payload: bytes, prot_body: bytes) -> bytes:
    """An image whose header and protected TLV area are arbitrary, signed
    properly (what a compromised or buggy signer could produce)."""
    prot = struct.pack("<HH", I.TLV_PROT_INFO_MAGIC, 4 + len(prot_body)) + prot_body
    head = bytearray(header)
    struct.pack_into("<I", head, 12, len(payload))       # img_size
    struct.pack_into("<H", head, 10, len(prot))          # protect_tlv_size
    struct.pack_into("<H", head, 8, len(head))           # hdr_size
    digest = hashlib.sha256(bytes(head) + payload + prot).digest()
    unprot = I.tlv_area(I.TLV_INFO_MAGIC, I.tlv(I.TLV_SHA256, digest)
                        + I.tlv(I.TLV_KEYHASH, keys.key_hash(KEY))
                        + I.tlv(I.TLV_ED25519, KEY.sign(digest)))
    return bytes(head) + payload + prot + unprot


def outcome(fn, data):
    try:
        fn(data)
        return "ok"
    except I.VerifyError as exc:
        return exc.reason


tlv_items = st.lists(st.tuples(st.sampled_from([I.TLV_SEC_CNT, I.TLV_MODEL_SHA256,
                                                I.TLV_MODEL_INFO, I.TLV_TARGET,
                                                I.TLV_SHA256, 0x8123,
                                                0x0123]) | st.integers(0, 0xFFFF),
                               st.binary(max_size=40)), max_size=5)


@FAST
@given(fields=st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 255),
                        st.integers(0, 255), st.integers(0, 0xFFFF), st.integers(0, 2**32 - 1),
                        st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1) | st.just(0)),
       pad=st.binary(max_size=40), payload=st.binary(max_size=64), items=tlv_items,
       raw_tail=st.binary(max_size=8))
def test_signed_hostile_images(fields, pad, payload, items, raw_tail):
    flags, major, minor, patch, build, load, pad1 = fields
    header = struct.pack(I.HEADER_STRUCT, I.MAGIC, load, 0, 0, 0, flags, major, minor, patch,
                         build, pad1) + pad
    body = b"".join(struct.pack("<HH", t, len(v)) + v for t, v in items) + raw_tail
    img = sign_image(header, payload, body)
    result = outcome(lambda d: I.verify_image(d, PUB, I.Policy(target="armv7", slot_size=4096)),
                     img)
    assert result in {"ok", "malformed", "damaged", "unknown-critical-tlv", "wrong-target",
                      "too-large"}
    if result == "ok":   # accepted only with exactly one security counter and one target
        assert sum(1 for t, v in items if t == I.TLV_SEC_CNT) == 1 and not raw_tail
        assert sum(1 for t, v in items if t == I.TLV_TARGET) == 1
        assert "armv7" in I.describe(I.inspect_image(img))


def test_the_signing_helper_makes_acceptable_images():
    """So the hostile-image test does reach the parsers behind the signature."""
    header = struct.pack(I.HEADER_STRUCT, I.MAGIC, 0, 32, 0, 0, 0, 1, 2, 3, 4, 0)
    ok = struct.pack("<HHI", I.TLV_SEC_CNT, 4, 9) + struct.pack("<HHHH", I.TLV_TARGET, 4, 2, 0)
    img = sign_image(header, b"fw", ok)
    assert I.verify_image(img, PUB).security_counter == 9
    img = sign_image(header, b"fw", ok + struct.pack("<HH", 0x8123, 0))
    assert outcome(lambda d: I.verify_image(d, PUB), img) == "unknown-critical-tlv"


@FAST
@given(st.data())
def test_random_mutations_of_images_and_packages(data):
    for good, fn in ((GOOD_IMAGE, lambda d: I.verify_image(d, PUB)),
                     (GOOD_PACKAGE, lambda d: ota.verify_package(d, PUB))):
        buf = bytearray(good)
        for _ in range(data.draw(st.integers(1, 6))):
            pos = data.draw(st.integers(0, len(buf) - 1))
            buf[pos] = data.draw(st.integers(0, 255))
        cut = data.draw(st.integers(0, len(buf)))
        mutated = bytes(buf[:cut]) + data.draw(st.binary(max_size=16))
        result = outcome(fn, mutated)
        assert result != "ok" or mutated == good


@FAST
@given(manifest_tail=st.binary(max_size=120), count=st.integers(0, 70),
       fixed=st.binary(min_size=28, max_size=28), payload=st.binary(max_size=64))
def test_signed_hostile_manifests(manifest_tail, count, fixed, payload):
    """Arbitrary manifests, properly signed: only VerifyErrors come out."""
    manifest = struct.pack("<HH", 2, count) + fixed + manifest_tail
    header = struct.pack(ota.HEADER_STRUCT, ota.MAGIC, 32, 1, len(manifest), 96, bytes(16))
    digest = hashlib.sha256(header + manifest).digest()
    pkg = header + manifest + keys.key_hash(KEY) + KEY.sign(ota.SIGN_DOMAIN + digest) + payload
    assert outcome(lambda d: ota.verify_package(d, PUB), pkg) != "ok"


@FAST
@given(st.binary(max_size=300))
def test_random_bytes(data):
    for prefix in (b"", I.MAGIC_BYTES, ota.MAGIC):
        assert outcome(lambda d: I.verify_image(d, PUB), prefix + data) != "ok"
        assert outcome(lambda d: ota.verify_package(d, PUB), prefix + data) != "ok"
