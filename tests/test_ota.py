"""OTA packages (colibri/device/ota.py) and `colibri fw` (colibri/device/fw_cli.py): the
layout against docs/IMAGE.md section 5, every byte of a small package flipped,
every truncation length, and each rejection reason with its own exit status
through the real command line."""
from __future__ import annotations

import hashlib
import struct

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from colibri import cli
from colibri.device import image as I
from colibri.device import keys, ota
from image_fixtures import TINY, key, model_blob  # noqa: E402,F401

V = I.Version.parse




def make_image(key, version="1.2.3", counter=5, target="cortex-m", payload=None, **kw):
    payload = payload if payload is not None else bytes(range(256)) * 3
    return I.pack_image(payload, target, V(version), key, security_counter=counter, **kw)


@pytest.fixture(scope="module")
def small_package(key, model_blob):
    """~3 KB: a 768-byte payload plus the tiny model."""
    payload = bytes(range(256)) * 3 + model_blob
    return ota.pack_package([make_image(key, payload=payload, model=model_blob)], key)


def test_layout_matches_the_spec(key, small_package):
    pkg = small_package
    magic, hsize, fver, msize, sigsize = struct.unpack_from("<4sHHII", pkg)
    assert (magic, hsize, fver, msize, sigsize) == (b"CLOT", 32, 1, 32 + 48, 96)
    assert pkg[16:32] == bytes(16)
    tid, count, major, minor, patch, build, counter, flags = struct.unpack_from("<HHBBHIII",
                                                                               pkg, 32)
    assert (tid, count, major, minor, patch, build, counter, flags) == (4, 1, 1, 2, 3, 0, 5, 0)
    ptype, pflags, size, offset, digest = struct.unpack_from("<HHIQ32s", pkg, 64)
    assert (ptype, pflags, offset) == (0x8001, 0, 32 + 80 + 96)
    assert offset + size == len(pkg)
    assert digest == hashlib.sha256(pkg[offset:]).digest()
    assert pkg[112:144] == hashlib.sha256(keys.der_public(key)).digest()
    key.public_key().verify(pkg[144:208], b"colibri-ota-manifest-v1\0"
                            + hashlib.sha256(pkg[:112]).digest())
    # the payload is the image, verifiable on its own
    I.verify_image(pkg[offset:], key.public_key())


def test_round_trip(key, small_package):
    p = ota.verify_package(small_package, key.public_key(),
                           I.Policy(target="cortex-m", installed_version=V("1.2.3"),
                                    installed_counter=5, slot_size=len(small_package)))
    assert (p.target, p.version, p.security_counter, len(p.images)) == ("cortex-m", V("1.2.3"),
                                                                        5, 1)
    assert "cortex-m" in ota.describe(p) and "firmware image" in ota.describe(p)


def test_every_single_byte_flip_is_rejected(key, small_package):
    """The requirement: any single flipped byte anywhere. Every position, all
    bits and the low bit."""
    pub = key.public_key()
    ota.verify_package(small_package, pub)   # the unflipped package is good
    reasons = {}
    for pos in range(len(small_package)):
        for mask in (0xFF, 0x01):
            bad = bytearray(small_package)
            bad[pos] ^= mask
            with pytest.raises(I.VerifyError) as exc:
                ota.verify_package(bytes(bad), pub)
            reasons[exc.value.reason] = reasons.get(exc.value.reason, 0) + 1
    assert sum(reasons.values()) == 2 * len(small_package)
    assert set(reasons) <= {"malformed", "truncated", "damaged", "wrong-key", "bad-signature"}
    # the manifest is covered by the signature, the payload by its SHA-256
    assert reasons["bad-signature"] >= 2 * 80 and reasons["damaged"] >= 2 * 2000


def test_every_truncation_is_rejected_as_truncated(key, small_package):
    pub = key.public_key()
    for n in range(len(small_package)):
        with pytest.raises(I.TruncatedError):
            ota.verify_package(small_package[:n], pub)
    with pytest.raises(I.MalformedError, match="unexpected bytes after the last payload"):
        ota.verify_package(small_package + b"\0", pub)


def test_policy_and_content_rejections(key):
    pub = key.public_key()
    pkg = ota.pack_package([make_image(key, "2.0.0", counter=3)], key)
    size = len(ota.inspect_package(pkg).images[0].payload)  # smaller than the image
    cases = [(I.Policy(target="x86_64"), I.TargetError, "built for cortex-m"),
             (I.Policy(installed_version=V("2.0.1")), I.DowngradeError, "older than"),
             (I.Policy(installed_counter=4), I.CounterError, "counter 3 is below"),
             (I.Policy(slot_size=size), I.SlotSizeError, "larger than")]
    for policy, err, msg in cases:
        with pytest.raises(err, match=msg):
            ota.verify_package(pkg, pub, policy)
    with pytest.raises(I.KeyMismatchError):
        ota.verify_package(pkg, Ed25519PrivateKey.generate().public_key())
    # an unknown critical payload type (a newer packer) is refused ...
    crit = ota.pack_package([make_image(key)], key, extra_payloads=((0x8077, b"delta"),))
    with pytest.raises(I.CriticalTLVError, match="0x8077.*critical"):
        ota.verify_package(crit, pub)
    # ... an unknown optional one is skipped, but still hashed
    opt = ota.pack_package([make_image(key)], key, extra_payloads=((0x0077, b"notes"),))
    assert len(ota.verify_package(opt, pub).entries) == 2
    # an image with an unknown critical TLV inside a package
    img = make_image(key, extra_protected_tlvs=((0x8999, b"?"),))
    forged = ota.pack_package([make_image(key)], key)
    hdr_and_manifest = bytearray(forged[:112])
    struct.pack_into("<I", hdr_and_manifest, 64 + 4, len(img))
    hdr_and_manifest[64 + 16:64 + 48] = hashlib.sha256(img).digest()
    digest = hashlib.sha256(bytes(hdr_and_manifest)).digest()
    repacked = (bytes(hdr_and_manifest) + keys.key_hash(key)
                + key.sign(ota.SIGN_DOMAIN + digest) + img)
    with pytest.raises(I.CriticalTLVError, match="0x8999"):
        ota.verify_package(repacked, pub)


def test_pack_refuses_images_that_do_not_fit_together(key):
    other = Ed25519PrivateKey.generate()
    with pytest.raises(I.PackError, match="image 0 cannot go into a package: the image was signed by key"):
        ota.pack_package([make_image(other)], key)
    with pytest.raises(I.PackError, match="one package serves one target"):
        ota.pack_package([make_image(key), make_image(key, target="ppc")], key)
    with pytest.raises(I.PackError, match="at least one image"):
        ota.pack_package([], key)


# --- the command line -----------------------------------------------------------------
def run_cli(capsys, *argv):
    status = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_cli_end_to_end_exit_status_per_reason(tmp_path, capsys, model_blob):
    k = tmp_path / "k"
    assert run_cli(capsys, "fw", "keygen", "-o", k)[0] == 0
    assert (tmp_path / "k.pub").exists()
    status, _, err = run_cli(capsys, "fw", "keygen", "-o", k)
    assert status == 2 and "refusing to overwrite" in err
    fw = tmp_path / "fw.bin"
    fw.write_bytes(b"\x11" * 500 + model_blob)
    model = tmp_path / "m.colibri"
    model.write_bytes(model_blob)
    img = tmp_path / "fw.img"
    status, out, _ = run_cli(capsys, "fw", "pack", fw, "--target", "armv7", "--version",
                             "1.4.0+9", "--key", k, "--security-counter", "3", "--model", model,
                             "-o", img)
    assert status == 0 and "armv7 1.4.0+9" in out
    pkg = tmp_path / "fw.ota"
    assert run_cli(capsys, "fw", "ota", img, "--key", k, "-o", pkg)[0] == 0
    pub = tmp_path / "k.pub"

    def verify(path, *policy):
        return run_cli(capsys, "fw", "verify", path, "--key", pub, *policy)

    for path in (img, pkg):
        status, out, err = verify(path, "--target", "armv7", "--installed-version", "1.4.0+9",
                                  "--installed-counter", "3")
        assert status == 0 and "OK" in out and err == ""
        for policy, code, reason in ((("--target", "ppc"), 9, "wrong-target"),
                                     (("--installed-version", "1.5.0"), 10, "downgrade"),
                                     (("--installed-counter", "4"), 11, "security-counter"),
                                     (("--slot-size", "1K"), 12, "too-large")):
            status, out, err = verify(path, *policy)
            assert (status, out) == (code, "")
            assert err.count("\n") == 1 and f"REJECTED ({reason})" in err
    data = pkg.read_bytes()
    cases = {"flipped.ota": (data[:300] + bytes([data[300] ^ 1]) + data[301:], 5, "damaged"),
             "signature.ota": (data[:150] + bytes([data[150] ^ 1]) + data[151:], 7,
                               "bad-signature"),
             "cut.ota": (data[:-1], 4, "truncated"),
             "junk.ota": (b"hello", 3, "malformed")}
    for name, (content, code, reason) in cases.items():
        (tmp_path / name).write_bytes(content)
        status, _, err = verify(tmp_path / name)
        assert status == code and f"({reason})" in err, (name, err)
    k2 = tmp_path / "k2"
    run_cli(capsys, "fw", "keygen", "-o", k2)
    status, _, err = run_cli(capsys, "fw", "verify", pkg, "--key", str(k2) + ".pub")
    assert status == 6 and "(wrong-key)" in err
    # the private key works as the verifying key too
    assert run_cli(capsys, "fw", "verify", img, "--key", k)[0] == 0
    status, _, err = run_cli(capsys, "fw", "verify", tmp_path / "missing", "--key", pub)
    assert status == 2 and "cannot read" in err
    status, out, _ = run_cli(capsys, "fw", "info", pkg)
    assert status == 0 and "armv7" in out and "not checked" in out
    status, out, _ = run_cli(capsys, "fw", "info", img)
    assert status == 0 and hashlib.sha256(model_blob).hexdigest() in out
