"""OTA update packages (docs/IMAGE.md section 5): one file holding a signed
manifest followed by the payloads (signed firmware images) it describes.

    header (32 bytes) | manifest | signature block (96) | payload 0 | payload 1 ...

The signature covers the header and the manifest (as RAUC and SWUpdate sign
their description, not the payloads); the manifest holds each payload's size
and SHA-256, so every byte of the file is covered by the one signature. Each
image payload is itself a signed image and is verified as one too.

Rejections reuse colibri.device.image's VerifyError classes, so a package and an image
give the same exit status for the same reason.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

from . import image as I
from . import keys
from .image import (CriticalTLVError, DigestError, KeyMismatchError, MalformedError, Policy,
                    SignatureError, TruncatedError, Version)

MAGIC = b"CLOT"
HEADER_SIZE = 32
FORMAT_VERSION = 1
HEADER_STRUCT = "<4sHHII16s"   # magic, header_size, format_version, manifest_size, sig_size, reserved
assert struct.calcsize(HEADER_STRUCT) == HEADER_SIZE

MANIFEST_FIXED_STRUCT = "<HHBBHIII12s"  # target_id, n_payloads, major, minor, patch, build,
MANIFEST_FIXED_SIZE = 32                # security_counter, flags, reserved
assert struct.calcsize(MANIFEST_FIXED_STRUCT) == MANIFEST_FIXED_SIZE
ENTRY_STRUCT = "<HHIQ32s"               # type, flags, size, offset (from package start), sha256
ENTRY_SIZE = 48
assert struct.calcsize(ENTRY_STRUCT) == ENTRY_SIZE
MAX_PAYLOADS = 64

SIG_BLOCK_SIZE = keys.KEY_HASH_SIZE + keys.SIGNATURE_SIZE   # key hash, then Ed25519 signature
SIGN_DOMAIN = b"colibri-ota-manifest-v1\0"

PAYLOAD_IMAGE = 0x8001     # a signed firmware image for the inactive slot (critical:
PAYLOAD_CRITICAL = 0x8000  # an agent that cannot install it must refuse the package)
PAYLOAD_NAMES = {PAYLOAD_IMAGE: "firmware image"}


@dataclass
class Entry:
    type: int
    flags: int
    size: int
    offset: int
    sha256: bytes


@dataclass
class Package:
    header: tuple
    target_id: int
    version: Version
    security_counter: int
    entries: list[Entry]
    size: int
    key_hash: bytes
    images: list[I.Image] = field(default_factory=list)

    @property
    def target(self) -> str:
        return I.target_name(self.target_id)


def pack_package(images: list[bytes], key, *,
                 extra_payloads: tuple[tuple[int, bytes], ...] = ()) -> bytes:
    """A package of signed images (all for one target), signed with `key`.
    The manifest's target, version and security counter are the first image's;
    every image must verify with `key`'s public half."""
    if not images:
        raise I.PackError("an OTA package needs at least one image")
    parsed = []
    for n, img in enumerate(images):
        try:
            parsed.append(I.verify_image(img, key.public_key()))
        except I.VerifyError as exc:
            raise I.PackError(f"image {n} cannot go into a package: {exc}") from None
    first = parsed[0]
    for n, p in enumerate(parsed[1:], 1):
        if p.target_id != first.target_id:
            raise I.PackError(f"image {n} is for {p.target}, image 0 for {first.target}: "
                              "one package serves one target")
    payloads = [(PAYLOAD_IMAGE, bytes(b)) for b in images] + [(t, bytes(b))
                                                              for t, b in extra_payloads]
    if len(payloads) > MAX_PAYLOADS:
        raise I.PackError(f"{len(payloads)} payloads, at most {MAX_PAYLOADS}")
    manifest_size = MANIFEST_FIXED_SIZE + ENTRY_SIZE * len(payloads)
    offset = HEADER_SIZE + manifest_size + SIG_BLOCK_SIZE
    v = first.version
    manifest = struct.pack(MANIFEST_FIXED_STRUCT, first.target_id, len(payloads),
                           v.major, v.minor, v.patch, v.build, first.security_counter, 0,
                           bytes(12))
    for t, b in payloads:
        manifest += struct.pack(ENTRY_STRUCT, t, 0, len(b), offset, hashlib.sha256(b).digest())
        offset += len(b)
    header = struct.pack(HEADER_STRUCT, MAGIC, HEADER_SIZE, FORMAT_VERSION, manifest_size,
                         SIG_BLOCK_SIZE, bytes(16))
    digest = hashlib.sha256(header + manifest).digest()
    sig = keys.key_hash(key) + keys.sign(key, SIGN_DOMAIN, digest)
    return header + manifest + sig + b"".join(b for _, b in payloads)


def pack_files(image_paths, out_path, key_path, password: bytes | None = None) -> Package:
    """`colibri fw ota` and `scons ... ota`: package the image files (MCUboot
    images, as `colibri fw pack` or `imgtool sign` made them)."""
    data = pack_package([I.read_bytes(p) for p in image_paths],
                        keys.load_private(key_path, password=password))
    I.write_atomic(out_path, data)
    return inspect_package(data)


def _parse_frame(buf) -> tuple[tuple, int]:
    """Header checks needed to find the signature: (header fields, manifest size)."""
    n = len(buf)
    if bytes(buf[:4]) != MAGIC[:min(4, n)]:
        raise MalformedError(f"magic is {bytes(buf[:4])!r}, expected {MAGIC!r}: "
                             "not a Colibri OTA package")
    if n < HEADER_SIZE:
        raise TruncatedError(f"the package is {n} bytes, shorter than its {HEADER_SIZE}-byte "
                             "header: the file is truncated")
    h = struct.unpack_from(HEADER_STRUCT, buf)
    _, hsize, version, msize, sigsize, _ = h
    if version != FORMAT_VERSION:
        raise MalformedError(f"package format version {version}, this verifier reads version "
                             f"{FORMAT_VERSION}" + (": upgrade colibri" if version > FORMAT_VERSION
                                                    else ""))
    if hsize != HEADER_SIZE or sigsize != SIG_BLOCK_SIZE:
        raise MalformedError(f"package header_size {hsize} / signature size {sigsize}, expected "
                             f"{HEADER_SIZE} / {SIG_BLOCK_SIZE}")
    if not MANIFEST_FIXED_SIZE + ENTRY_SIZE <= msize <= MANIFEST_FIXED_SIZE + ENTRY_SIZE * MAX_PAYLOADS \
            or (msize - MANIFEST_FIXED_SIZE) % ENTRY_SIZE:
        raise MalformedError(f"manifest_size = {msize} is not {MANIFEST_FIXED_SIZE} + "
                             f"{ENTRY_SIZE} x (1..{MAX_PAYLOADS} payloads)")
    end = HEADER_SIZE + msize + SIG_BLOCK_SIZE
    if end > n:
        raise TruncatedError(f"the manifest and signature end at byte {end} but the package "
                             f"ends at {n}: the file is truncated")
    return h, msize


def verify_package(buf, public_key, policy: Policy = Policy()) -> Package:
    """Check a whole package: frame, signature, manifest, the device's policy,
    every payload's SHA-256, and every image payload as an image. Raises a
    VerifyError subclass; returns the parsed package."""
    return _read(buf, public_key, policy)


def inspect_package(buf) -> Package:
    """Parse a package WITHOUT checking any signature (for `colibri fw info`;
    never act on what this returns). Payload SHA-256s are still checked."""
    return _read(buf, None, Policy())


def _read(buf, public_key, policy: Policy) -> Package:
    buf = memoryview(buf)
    n = len(buf)
    h, msize = _parse_frame(buf)
    mend = HEADER_SIZE + msize
    khash = bytes(buf[mend:mend + keys.KEY_HASH_SIZE])
    sig = bytes(buf[mend + keys.KEY_HASH_SIZE:mend + SIG_BLOCK_SIZE])
    if public_key is None:
        pass
    elif khash != keys.key_hash(public_key):
        raise KeyMismatchError(f"the package was signed by key {khash.hex()[:16]}..., not by "
                               f"the given key {keys.key_hash(public_key).hex()[:16]}...: pass "
                               "the matching KEY.pub")
    digest = hashlib.sha256(buf[:mend]).digest()
    if public_key is not None and not keys.check(public_key, SIGN_DOMAIN, digest, sig):
        raise SignatureError("the manifest's Ed25519 signature does not verify: the package "
                             "was damaged or forged; do not install it")
    # From here on the header and manifest are authentic.
    if h[5] != bytes(16):
        raise MalformedError("the package header's reserved bytes are not zero")
    tid, count, major, minor, patch, build, counter, flags, reserved = struct.unpack_from(
        MANIFEST_FIXED_STRUCT, buf, HEADER_SIZE)
    if flags or reserved != bytes(12):
        raise CriticalTLVError(f"manifest flags 0x{flags:x} / reserved bytes set: the package "
                               "needs a newer colibri")
    if msize != MANIFEST_FIXED_SIZE + ENTRY_SIZE * count:
        raise MalformedError(f"manifest says {count} payloads but is {msize} bytes")
    pkg = Package(h, tid, Version(major, minor, patch, build), counter, [], 0, khash)
    pos = mend + SIG_BLOCK_SIZE
    for i in range(count):
        e = Entry(*struct.unpack_from(ENTRY_STRUCT, buf, HEADER_SIZE + MANIFEST_FIXED_SIZE
                                      + i * ENTRY_SIZE))
        if e.offset != pos:
            raise MalformedError(f"payload {i} starts at {e.offset}, expected {pos} "
                                 "(payloads follow the signature back to back)")
        if e.flags:
            raise CriticalTLVError(f"payload {i} has flags 0x{e.flags:x}: needs a newer colibri")
        if e.type not in PAYLOAD_NAMES and e.type & PAYLOAD_CRITICAL:
            raise CriticalTLVError(f"payload {i} has type 0x{e.type:04x}, unknown to this "
                                   "agent and marked critical: it needs a newer colibri")
        pkg.entries.append(e)
        pos += e.size
    pkg.size = pos
    images = [e for e in pkg.entries if e.type == PAYLOAD_IMAGE]
    I.check_policy("package", target_id_=tid, version=pkg.version, counter=counter,
                   size=max((e.size for e in images), default=0), policy=policy)
    if pos > n:
        raise TruncatedError(f"the payloads end at byte {pos} but the package ends at {n}: "
                             "the file is truncated")
    if pos != n:
        raise MalformedError(f"{n - pos} unexpected bytes after the last payload (byte {pos})")
    for i, e in enumerate(pkg.entries):
        data = buf[e.offset:e.offset + e.size]
        if hashlib.sha256(data).digest() != e.sha256:
            raise DigestError(f"payload {i} ({PAYLOAD_NAMES.get(e.type, hex(e.type))}, bytes "
                              f"{e.offset}..{e.offset + e.size}) does not match its SHA-256 in "
                              "the manifest: the package was damaged")
        if e.type == PAYLOAD_IMAGE:
            img = (I.verify_image(data, public_key, policy) if public_key is not None
                   else I.inspect_image(data))
            if (img.target_id, img.version, img.security_counter) != \
                    (tid, pkg.version, counter):
                raise MalformedError(f"payload {i}: the image is {img.target} {img.version} "
                                     f"counter {img.security_counter}, the manifest says "
                                     f"{pkg.target} {pkg.version} counter {counter}")
            pkg.images.append(img)
    if not pkg.images:
        raise MalformedError("the package holds no firmware image")
    return pkg


def is_package(buf) -> bool:
    return bytes(buf[:4]) == MAGIC


def describe(pkg: Package) -> str:
    """What `colibri fw info` prints for a verified package."""
    lines = [f"package       Colibri OTA package, format version {FORMAT_VERSION}, {pkg.size} bytes",
             f"target        {pkg.target} (id {pkg.target_id})",
             f"version       {pkg.version}",
             f"sec counter   {pkg.security_counter}",
             f"key hash      {pkg.key_hash.hex()}"]
    for i, e in enumerate(pkg.entries):
        lines.append(f"payload {i}     {PAYLOAD_NAMES.get(e.type, f'type 0x{e.type:04x}')}, "
                     f"{e.size} bytes at {e.offset}, sha256 {e.sha256.hex()}")
    return "\n".join(lines)
