"""Signed firmware images in MCUboot's format (docs/IMAGE.md is the spec;
this module and src/include/colibri_image.h must agree, which
tests/test_image_c.py checks; `imgtool` from PyPI is the judge of
compatibility, tests/test_image_mcuboot.py).

An image is what `imgtool sign --header-size H --pad-header` writes: MCUboot's
32-byte little-endian header (padded with 0xFF to `hdr_size`), the payload (the
firmware ELF or its raw binary), a protected TLV area (covered by the SHA-256
and so by the signature: the security counter, then Colibri's own TLVs in the
vendor range: target id, model digest and info), and an unprotected TLV area
holding exactly the SHA-256, the signing key's hash and the Ed25519 signature.
For the same inputs and key, `pack_image` and `imgtool sign` give the same
bytes (Ed25519 signatures are deterministic).

`pack_image` builds one, `parse_image` checks only the structure (lengths,
magics), `verify_image` checks everything a bootloader or update agent must:
integrity, key, signature, critical TLVs, then the device's policy (target,
downgrade, security counter, slot size). Each rejection is its own VerifyError
subclass with its own exit status, so scripts can tell a damaged download from
an attack from a wrong target.
"""
from __future__ import annotations

import hashlib
import io
import struct
from dataclasses import dataclass, field

from . import keys
from ..errors import ColibriError, FormatError
from ..file import format as fmt

# --- Header (IMAGE.md 2): MCUboot's struct image_header ----------------------
MAGIC = 0x96F3B83D            # ih_magic, little-endian: bytes 3d b8 f3 96
MAGIC_BYTES = struct.pack("<I", MAGIC)
HEADER_STRUCT_SIZE = 32       # the struct; hdr_size may be larger (padding, 0xFF)
HEADER_SIZE = 32              # default hdr_size: imgtool's default, no padding
HEADER_FIELDS = (
    # (name, struct code, offset)
    ("magic", "I", 0),
    ("load_addr", "I", 4),
    ("hdr_size", "H", 8),
    ("protect_tlv_size", "H", 10),
    ("img_size", "I", 12),
    ("flags", "I", 16),
    ("ver_major", "B", 20),
    ("ver_minor", "B", 21),
    ("ver_revision", "H", 22),
    ("ver_build", "I", 24),
    ("pad1", "I", 28),
)
HEADER_STRUCT = "<" + "".join(code for _, code, _ in HEADER_FIELDS)
assert struct.calcsize(HEADER_STRUCT) == HEADER_STRUCT_SIZE
for _name, _code, _off in HEADER_FIELDS:  # offsets in the table are the packed ones
    assert struct.calcsize("<" + "".join(c for n, c, o in HEADER_FIELDS if o < _off)) == _off, _name
HEADER_PAD = 0xFF             # what imgtool --pad-header puts between the struct and hdr_size

# ih_flags (MCUboot's IMAGE_F_*). Only RAM_LOAD is understood here; any other
# bit (encrypted, compressed, ROM-fixed, non-bootable, ...) changes how the
# payload must be read, so an image carrying one is refused, as an unknown
# critical TLV is.
IMAGE_F_RAM_LOAD = 0x00000020
KNOWN_FLAGS = IMAGE_F_RAM_LOAD

# Target ids: one per targets/<name>.py. Never renumber: devices in the field
# compare them.
TARGET_IDS = {"x86_64": 1, "armv7": 2, "ppc": 3, "cortex-m": 4, "aarch64": 5, "riscv64": 6}
TARGET_NAMES = {v: k for k, v in TARGET_IDS.items()}

# --- TLV areas (IMAGE.md 3) --------------------------------------------------
TLV_INFO_STRUCT = "<HH"       # magic, total bytes including this info (MCUboot's u16)
TLV_INFO_SIZE = 4
TLV_HDR_STRUCT = "<HH"        # type, value length
TLV_HDR_SIZE = 4
assert struct.calcsize(TLV_INFO_STRUCT) == TLV_INFO_SIZE
assert struct.calcsize(TLV_HDR_STRUCT) == TLV_HDR_SIZE
TLV_PROT_INFO_MAGIC = 0x6908  # MCUboot's values
TLV_INFO_MAGIC = 0x6907
TLV_AREA_MAX = 0xFFFF         # it_tlv_tot and ih_protect_tlv_size are u16
TLV_CRITICAL = 0x8000         # Colibri's rule: an unknown type with this bit is refused

TLV_KEYHASH = 0x0001          # unprotected: SHA-256 of the DER public key (32)
TLV_SHA256 = 0x0010           # unprotected: SHA-256 of header+payload+protected TLVs (32)
TLV_ED25519 = 0x0024          # unprotected: Ed25519 signature of the SHA-256 value (64)
TLV_SEC_CNT = 0x0050          # protected: u32 security counter
# Colibri's TLVs, in MCUboot's vendor range (0x..A0-0x..FE), with the
# critical bit set: a Colibri verifier too old to know one refuses the image.
TLV_MODEL_SHA256 = 0x80A0     # protected: SHA-256 of the model blob (32)
TLV_MODEL_INFO = 0x80A1       # protected: MODEL_INFO_STRUCT
TLV_TARGET = 0x80A2           # protected: TARGET_STRUCT
MODEL_INFO_STRUCT = "<IIHBB"  # offset in payload, size, format version, byte order, reserved
MODEL_INFO_SIZE = 12
assert struct.calcsize(MODEL_INFO_STRUCT) == MODEL_INFO_SIZE
TARGET_STRUCT = "<HH"         # target id, payload kind
TARGET_SIZE = 4
PAYLOAD_RAW, PAYLOAD_ELF = 0, 1
PAYLOAD_KINDS = {PAYLOAD_RAW: "raw binary", PAYLOAD_ELF: "ELF"}
MODEL_NOT_IN_PAYLOAD = 0xFFFFFFFF
BYTE_ORDERS = {"little": 0, "big": 1}

UNPROTECTED_TLVS = {TLV_KEYHASH: 32, TLV_SHA256: 32, TLV_ED25519: 64}   # type -> length
PROTECTED_TLVS = {TLV_SEC_CNT: 4, TLV_MODEL_SHA256: 32, TLV_MODEL_INFO: MODEL_INFO_SIZE,
                  TLV_TARGET: TARGET_SIZE}
TLV_NAMES = {TLV_KEYHASH: "KEYHASH", TLV_SHA256: "SHA256", TLV_ED25519: "ED25519",
             TLV_SEC_CNT: "SEC_CNT", TLV_MODEL_SHA256: "MODEL_SHA256",
             TLV_MODEL_INFO: "MODEL_INFO", TLV_TARGET: "TARGET"}

MODEL_SECTION = ".colibri_model"   # ELF section the build embeds the .colibri blob in
U32_MAX = 0xFFFFFFFF


# --- Rejections ----------------------------------------------------------------
class VerifyError(ColibriError):
    """An image or package was rejected. `exit_status` is what `colibri fw
    verify` exits with; `reason` is a short stable word for scripts and logs."""
    exit_status = 3
    reason = "malformed"


class MalformedError(VerifyError):
    """The bytes are not a well-formed image/package (bad magic, lengths, TLVs)."""
    exit_status, reason = 3, "malformed"


class TruncatedError(VerifyError):
    """The file ends before the sizes in its header say it does."""
    exit_status, reason = 4, "truncated"


class DigestError(VerifyError):
    """A SHA-256 does not match: the bytes were damaged after signing."""
    exit_status, reason = 5, "damaged"


class KeyMismatchError(VerifyError):
    """The file was signed by a different key than the one given."""
    exit_status, reason = 6, "wrong-key"


class SignatureError(VerifyError):
    """The Ed25519 signature does not verify."""
    exit_status, reason = 7, "bad-signature"


class CriticalTLVError(VerifyError):
    """A TLV this verifier does not know is marked critical."""
    exit_status, reason = 8, "unknown-critical-tlv"


class TargetError(VerifyError):
    """Built for another target."""
    exit_status, reason = 9, "wrong-target"


class DowngradeError(VerifyError):
    """Version lower than the installed one."""
    exit_status, reason = 10, "downgrade"


class CounterError(VerifyError):
    """Security counter lower than the installed one (anti-rollback)."""
    exit_status, reason = 11, "security-counter"


class SlotSizeError(VerifyError):
    """The image does not fit the flash slot."""
    exit_status, reason = 12, "too-large"


REJECTIONS = (MalformedError, TruncatedError, DigestError, KeyMismatchError, SignatureError,
              CriticalTLVError, TargetError, DowngradeError, CounterError, SlotSizeError)
assert len({e.exit_status for e in REJECTIONS}) == len(REJECTIONS)


class PackError(ColibriError):
    """An image cannot be built from the given inputs."""


# --- Versions ------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class Version:
    """major.minor.patch+build, compared field by field (MCUboot's rule: the
    build number counts, so 1.2.3+5 is newer than 1.2.3+4)."""
    major: int
    minor: int
    patch: int
    build: int = 0

    LIMITS = (("major", 0xFF), ("minor", 0xFF), ("patch", 0xFFFF), ("build", U32_MAX))

    @classmethod
    def parse(cls, text: str) -> "Version":
        text = str(text).strip()
        core, plus, build = text.partition("+")
        parts = core.split(".")
        if len(parts) != 3 or (plus and not build):
            raise ColibriError(f"version {text!r} is not MAJOR.MINOR.PATCH[+BUILD], "
                               "e.g. 1.2.3 or 1.2.3+42")
        try:
            values = [int(p, 10) for p in parts] + [int(build, 10) if plus else 0]
        except ValueError:
            raise ColibriError(f"version {text!r}: every part must be a decimal number, "
                               "e.g. 1.2.3+42") from None
        for (name, limit), v in zip(cls.LIMITS, values):
            if not 0 <= v <= limit:
                raise ColibriError(f"version {text!r}: {name} = {v} is outside 0..{limit}")
        return cls(*values)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}" + (f"+{self.build}" if self.build else "")


def target_id(name: str) -> int:
    try:
        return TARGET_IDS[name]
    except KeyError:
        raise ColibriError(f"unknown target {name!r}; known targets: "
                           + ", ".join(TARGET_IDS)) from None


def target_name(tid: int) -> str:
    return TARGET_NAMES.get(tid, f"unknown target id {tid}")


# --- The model blob --------------------------------------------------------------
@dataclass(frozen=True)
class ModelInfo:
    sha256: bytes
    offset: int          # byte offset of the blob in the payload, or MODEL_NOT_IN_PAYLOAD
    size: int
    format_version: int
    byte_order: str      # "little" or "big"


def describe_model(blob: bytes, offset: int) -> ModelInfo:
    """Validate a .colibri blob (every CRC) and describe it for the MODEL TLVs.
    A corrupt model is refused here, at pack time, not on the device."""
    try:
        cf = fmt.parse(blob, check_crc=True)
    except FormatError as exc:
        raise PackError(f"the model blob is not a valid .colibri file: {exc}") from None
    return ModelInfo(hashlib.sha256(blob).digest(), offset, len(blob), cf.version, cf.byte_order)


def _elf(data: bytes):
    """An ELFFile over `data`; PackError when pyelftools cannot read it."""
    from elftools.elf.elffile import ELFFile
    return ELFFile(io.BytesIO(data))


def _elf_errors():
    from elftools.common.exceptions import ELFError
    from elftools.construct import ConstructError
    return (ELFError, ConstructError, ValueError, IndexError, KeyError)


def elf_facts(elf: bytes) -> tuple[int, tuple[int, bytes] | None]:
    """(load address, model) of an ELF payload. The load address is the lowest
    physical address of a loadable segment (for bare-metal ELFs, the flash LMA).
    The model is (offset in the ELF file, bytes) of its `.colibri_model`
    section, or None when there is no such section."""
    try:
        f = _elf(elf)
        loads = [seg["p_paddr"] for seg in f.iter_segments() if seg["p_type"] == "PT_LOAD"]
        load = min(loads) if loads else f["e_entry"]
        sec = f.get_section_by_name(MODEL_SECTION)
        if sec is None:
            return load, None
        if sec["sh_type"] == "SHT_NOBITS":
            raise PackError(f"section {MODEL_SECTION} has no file contents (NOBITS): the "
                            "model must be embedded as initialised data")
        off, size = sec["sh_offset"], sec["sh_size"]
    except _elf_errors() as exc:
        raise PackError(f"the payload starts like an ELF file but cannot be parsed ({exc}): "
                        "pass the firmware.elf the build produced") from None
    if off + size > len(elf):
        raise PackError(f"section {MODEL_SECTION} (bytes {off}..{off + size}) lies past the "
                        f"end of the {len(elf)}-byte ELF file: the file is truncated")
    return load, (off, elf[off:off + size])


# --- Packing --------------------------------------------------------------------
def tlv(type_: int, value: bytes) -> bytes:
    if len(value) > 0xFFFF:
        raise PackError(f"TLV 0x{type_:04x} value is {len(value)} bytes, over 65535")
    return struct.pack(TLV_HDR_STRUCT, type_, len(value)) + value


def tlv_area(magic: int, body: bytes) -> bytes:
    if TLV_INFO_SIZE + len(body) > TLV_AREA_MAX:
        raise PackError(f"TLV area of {TLV_INFO_SIZE + len(body)} bytes: MCUboot's "
                        f"u16 length holds at most {TLV_AREA_MAX}")
    return struct.pack(TLV_INFO_STRUCT, magic, TLV_INFO_SIZE + len(body)) + body


def pack_header(*, version: Version, img_size: int, protect_tlv_size: int,
                hdr_size: int = HEADER_SIZE, load_addr: int = 0, flags: int | None = None,
                pad1: int = 0, magic: int = MAGIC) -> bytes:
    """The header, padded with 0xFF to hdr_size (as `imgtool --pad-header`).
    flags default: RAM_LOAD when a load address is given, as imgtool sets it."""
    if flags is None:
        flags = IMAGE_F_RAM_LOAD if load_addr else 0
    head = struct.pack(HEADER_STRUCT, magic, load_addr, hdr_size, protect_tlv_size, img_size,
                       flags, version.major, version.minor, version.patch, version.build, pad1)
    return head + bytes([HEADER_PAD]) * (hdr_size - HEADER_STRUCT_SIZE)


def pack_image(payload: bytes, target: str, version: Version, key, *,
               security_counter: int = 0, load_address: int | None = None,
               model: bytes | None = None, slot_size: int | None = None,
               header_size: int = HEADER_SIZE,
               extra_protected_tlvs: tuple[tuple[int, bytes], ...] = ()) -> bytes:
    """Build a signed image, byte for byte what
    `imgtool sign --header-size H --pad-header -v V -s N --custom-tlv ...` makes.
    `payload` is an ELF (its `.colibri_model` section, if any, is the model) or
    a raw binary; `model` is the .colibri blob when it is not an ELF section (it
    is located in the payload if it occurs there). `load_address`: run from RAM
    at this address (MCUboot's RAM_LOAD, imgtool's --load-addr); None or 0:
    execute in place. `extra_protected_tlvs` lets a newer signer add TLVs (and
    tests add unknown ones)."""
    payload = bytes(payload)
    is_elf = payload[:4] == b"\x7fELF"
    if len(payload) > U32_MAX:
        raise PackError(f"payload is {len(payload)} bytes, over the 4 GiB the header can hold")
    if not 0 <= security_counter <= U32_MAX:
        raise PackError(f"security counter {security_counter} is outside 0..{U32_MAX}")
    if not HEADER_STRUCT_SIZE <= header_size <= 0xFFFF:
        raise PackError(f"header size {header_size} is outside {HEADER_STRUCT_SIZE}..65535")
    if load_address is not None and not 0 <= load_address <= U32_MAX:
        raise PackError(f"load address 0x{load_address:x} does not fit MCUboot's 32 bits")
    tid = target_id(target)
    found = elf_facts(payload)[1] if is_elf else None
    if model is not None:
        model = bytes(model)
        pos = payload.find(model) if model else -1
        if found is not None and found[1] != model:
            raise PackError(f"the ELF's {MODEL_SECTION} section differs from the --model "
                            "file: pack the model that was built into the firmware")
        minfo = describe_model(model, pos if pos >= 0 else MODEL_NOT_IN_PAYLOAD)
    elif found is not None:
        minfo = describe_model(found[1], found[0])
    else:
        minfo = None

    # Order as imgtool writes it: SEC_CNT first, then the custom TLVs in the
    # order given (tests/test_image_mcuboot.py passes them in this order).
    prot = tlv(TLV_SEC_CNT, struct.pack("<I", security_counter))
    prot += tlv(TLV_TARGET, struct.pack(TARGET_STRUCT, tid, PAYLOAD_ELF if is_elf else PAYLOAD_RAW))
    if minfo is not None:
        prot += tlv(TLV_MODEL_SHA256, minfo.sha256)
        prot += tlv(TLV_MODEL_INFO, struct.pack(MODEL_INFO_STRUCT, minfo.offset, minfo.size,
                                                minfo.format_version,
                                                BYTE_ORDERS[minfo.byte_order], 0))
    for t, v in extra_protected_tlvs:
        prot += tlv(t, v)
    prot = tlv_area(TLV_PROT_INFO_MAGIC, prot)
    header = pack_header(version=version, img_size=len(payload), protect_tlv_size=len(prot),
                         hdr_size=header_size, load_addr=load_address or 0)
    digest = hashlib.sha256(header + payload + prot).digest()
    unprot = tlv_area(TLV_INFO_MAGIC, tlv(TLV_SHA256, digest)
                      + tlv(TLV_KEYHASH, keys.key_hash(key))
                      + tlv(TLV_ED25519, keys.sign_digest(key, digest)))
    image = header + payload + prot + unprot
    if slot_size is not None and len(image) > slot_size:
        raise SlotSizeError(f"the image is {len(image)} bytes, larger than the "
                            f"{slot_size}-byte slot by {len(image) - slot_size}: shrink the "
                            "firmware or the model, or use a target with a larger slot")
    return image


# --- Files (shared by `colibri fw` and the SCons tool) ---------------------------------
def read_bytes(path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ColibriError(f"cannot read {path}: {exc.strerror}") from None


def write_atomic(path, data: bytes) -> None:
    """Write via a temporary file and a rename, so a failed run never leaves a
    half-written image that looks like a real one."""
    import os
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        raise ColibriError(f"cannot write {path}: {exc.strerror}") from None


def pack_file(payload_path, out_path, target: str, version: Version | str, key_path, *,
              security_counter: int = 0, slot_size: int | None = None, model_path=None,
              load_address: int | None = None, header_size: int = HEADER_SIZE,
              password: bytes | None = None) -> Image:
    """`colibri fw pack` and `scons ... image`: sign the file at payload_path
    into out_path; returns the (re-parsed) image. `password` unlocks an
    encrypted private key."""
    if isinstance(version, str):
        version = Version.parse(version)
    data = pack_image(read_bytes(payload_path), target, version,
                      keys.load_private(key_path, password=password),
                      security_counter=security_counter, load_address=load_address,
                      model=read_bytes(model_path) if model_path else None,
                      slot_size=slot_size, header_size=header_size)
    write_atomic(out_path, data)
    return inspect_image(data)


# --- Parsing and verification ---------------------------------------------------------
@dataclass
class Image:
    """A parsed image. `tlvs` lists (type, value) of the protected area in order."""
    header: dict
    payload: memoryview
    protected: bytes          # the protected TLV area, info included (b"" when absent)
    tlvs: list[tuple[int, bytes]]
    digest: bytes             # from the SHA256 TLV
    key_hash: bytes
    signature: bytes
    size: int                 # header + payload + both TLV areas
    security_counter: int | None = None
    target_id: int | None = None
    payload_kind: int | None = None
    model: ModelInfo | None = None
    unknown_tlvs: list[int] = field(default_factory=list)

    @property
    def version(self) -> Version:
        h = self.header
        return Version(h["ver_major"], h["ver_minor"], h["ver_revision"], h["ver_build"])

    @property
    def target(self) -> str:
        return target_name(self.target_id) if self.target_id is not None else "no target"

    @property
    def hdr_size(self) -> int:
        return self.header["hdr_size"]

    @property
    def signed_end(self) -> int:
        """End of what the SHA-256 covers: header, payload, protected TLVs."""
        return self.hdr_size + len(self.payload) + len(self.protected)


def _walk_tlvs(area: bytes, what: str, start: int) -> list[tuple[int, bytes]]:
    """(type, value) of each TLV in an area's body; lengths must tile it exactly."""
    out, pos = [], TLV_INFO_SIZE
    while pos < len(area):
        if pos + TLV_HDR_SIZE > len(area):
            raise MalformedError(f"{what} at byte {start + pos}: {len(area) - pos} bytes left, "
                                 "too few for a TLV header")
        t, n = struct.unpack_from(TLV_HDR_STRUCT, area, pos)
        if pos + TLV_HDR_SIZE + n > len(area):
            raise MalformedError(f"{what}: TLV 0x{t:04x} at byte {start + pos} has length {n}, "
                                 f"past the end of the area")
        out.append((t, bytes(area[pos + TLV_HDR_SIZE:pos + TLV_HDR_SIZE + n])))
        pos += TLV_HDR_SIZE + n
    return out


def _read_area(buf, pos: int, magic: int, what: str) -> bytes:
    if pos + TLV_INFO_SIZE > len(buf):
        raise TruncatedError(f"the {what} starts at byte {pos} but the data ends at "
                             f"{len(buf)}: the file is truncated")
    m, total = struct.unpack_from(TLV_INFO_STRUCT, buf, pos)
    if m != magic:
        raise MalformedError(f"the {what} at byte {pos} has magic 0x{m:04x}, expected "
                             f"0x{magic:04x}")
    if total < TLV_INFO_SIZE:
        raise MalformedError(f"the {what} at byte {pos} says it is {total} bytes, less than "
                             "its own info header")
    if pos + total > len(buf):
        raise TruncatedError(f"the {what} ends at byte {pos + total} but the data ends at "
                             f"{len(buf)}: the file is truncated")
    return bytes(buf[pos:pos + total])


def parse_image(buf, exact: bool = True) -> Image:
    """Structure only: magic, header size, where the areas start and end, the
    unprotected TLVs. Nothing here is trusted yet. `exact`: the data must end
    where the image ends (a file); False for a flash slot, whose tail is erased
    flash."""
    buf = memoryview(buf)
    n = len(buf)
    if bytes(buf[:4]) != MAGIC_BYTES[:min(4, n)]:
        raise MalformedError(f"magic is {bytes(buf[:4]).hex()}, expected {MAGIC_BYTES.hex()} "
                             f"(0x{MAGIC:08x}): not an MCUboot image")
    if n < HEADER_STRUCT_SIZE:
        raise TruncatedError(f"the data is {n} bytes, shorter than the {HEADER_STRUCT_SIZE}-"
                             "byte image header: the file is truncated")
    h = dict(zip((f for f, _, _ in HEADER_FIELDS), struct.unpack_from(HEADER_STRUCT, buf)))
    if h["hdr_size"] < HEADER_STRUCT_SIZE:
        raise MalformedError(f"hdr_size = {h['hdr_size']}, smaller than the "
                             f"{HEADER_STRUCT_SIZE}-byte header itself")
    pend = h["hdr_size"] + h["img_size"]
    if pend > n:
        raise TruncatedError(f"hdr_size {h['hdr_size']} + img_size {h['img_size']}: the "
                             f"payload would end at byte {pend} but the data ends at {n}: "
                             "the file is truncated")
    # MCUboot: the protected area is there exactly when ih_protect_tlv_size
    # is not 0, and then its own length must say the same.
    prot = b""
    if h["protect_tlv_size"]:
        prot = _read_area(buf, pend, TLV_PROT_INFO_MAGIC, "protected TLV area")
        if len(prot) != h["protect_tlv_size"]:
            raise MalformedError(f"protected TLV area is {len(prot)} bytes but the header's "
                                 f"protect_tlv_size is {h['protect_tlv_size']}")
    upos = pend + len(prot)
    unprot = _read_area(buf, upos, TLV_INFO_MAGIC, "unprotected TLV area")
    size = upos + len(unprot)
    if exact and size != n:
        raise MalformedError(f"{n - size} unexpected bytes after the end of the image "
                             f"(byte {size})")
    found: dict[int, bytes] = {}
    for t, v in _walk_tlvs(unprot, "unprotected TLV area", upos):
        # Nothing unprotected is trusted, so nothing else may be there: an
        # unknown unprotected TLV could be changed by anyone without detection.
        if t not in UNPROTECTED_TLVS:
            raise MalformedError(f"TLV 0x{t:04x} in the unprotected area: only SHA256, "
                                 "KEYHASH and ED25519 may be unprotected")
        if t in found:
            raise MalformedError(f"TLV {TLV_NAMES[t]} appears twice in the unprotected area")
        if len(v) != UNPROTECTED_TLVS[t]:
            raise MalformedError(f"TLV {TLV_NAMES[t]} is {len(v)} bytes, expected "
                                 f"{UNPROTECTED_TLVS[t]}")
        found[t] = v
    for t in UNPROTECTED_TLVS:
        if t not in found:
            raise MalformedError(f"the image has no {TLV_NAMES[t]} TLV: it is not signed "
                                 "with Ed25519 and a key hash")
    return Image(header=h, payload=buf[h["hdr_size"]:pend], protected=prot, tlvs=[],
                 digest=found[TLV_SHA256], key_hash=found[TLV_KEYHASH],
                 signature=found[TLV_ED25519], size=size)


def _interpret(img: Image, check_model: bool = True) -> None:
    """Header semantics and protected TLVs, once they are known to be authentic.
    `check_model`: also compare the model bytes with MODEL_SHA256 (off for
    `fw info`, which shows a damaged image rather than refusing it)."""
    h = img.header
    if h["flags"] & ~KNOWN_FLAGS:
        raise CriticalTLVError(f"header flags 0x{h['flags']:08x} has bits this verifier does "
                               "not handle (encrypted, compressed, ROM-fixed or non-bootable "
                               "images): sign the plain image")
    if h["pad1"] != 0:
        raise MalformedError("the header's pad1 field (bytes 28..31) is not zero")
    img.tlvs = (_walk_tlvs(img.protected, "protected TLV area", h["hdr_size"] + len(img.payload))
                if img.protected else [])
    seen: dict[int, bytes] = {}
    for t, v in img.tlvs:
        if t in PROTECTED_TLVS:
            if t in seen:
                raise MalformedError(f"TLV {TLV_NAMES[t]} appears twice")
            if len(v) != PROTECTED_TLVS[t]:
                raise MalformedError(f"TLV {TLV_NAMES[t]} is {len(v)} bytes, expected "
                                     f"{PROTECTED_TLVS[t]}")
            seen[t] = v
        elif t in UNPROTECTED_TLVS:
            raise MalformedError(f"TLV {TLV_NAMES[t]} belongs in the unprotected area")
        elif t & TLV_CRITICAL:
            raise CriticalTLVError(f"the image has TLV type 0x{t:04x}, unknown to this "
                                   "verifier and marked critical: it needs a newer colibri")
        else:
            img.unknown_tlvs.append(t)   # optional data from a newer signer
    # MCUboot itself needs neither; a Colibri device does: without the counter
    # there is no anti-rollback, without the target no wrong-target check.
    if TLV_SEC_CNT not in seen:
        raise MalformedError("the image has no security counter TLV (SEC_CNT): sign with "
                             "--security-counter (imgtool: -s N)")
    img.security_counter = struct.unpack("<I", seen[TLV_SEC_CNT])[0]
    if TLV_TARGET not in seen:
        raise MalformedError(f"the image has no Colibri TARGET TLV (0x{TLV_TARGET:04x}): "
                             "sign it with `colibri fw pack` (imgtool: --custom-tlv "
                             f"0x{TLV_TARGET:04x} 0x<target id u16><kind u16>, little-endian)")
    img.target_id, img.payload_kind = struct.unpack(TARGET_STRUCT, seen[TLV_TARGET])
    if img.payload_kind not in PAYLOAD_KINDS:
        raise CriticalTLVError(f"TARGET TLV payload kind {img.payload_kind} is unknown to this "
                               "verifier: it needs a newer colibri")
    if (TLV_MODEL_SHA256 in seen) != (TLV_MODEL_INFO in seen):
        raise MalformedError("MODEL_SHA256 and MODEL_INFO must come together")
    if TLV_MODEL_INFO in seen:
        off, size, ver, order, res = struct.unpack(MODEL_INFO_STRUCT, seen[TLV_MODEL_INFO])
        if order not in BYTE_ORDERS.values() or res != 0:
            raise MalformedError(f"MODEL_INFO byte order {order} / reserved {res} invalid")
        if off != MODEL_NOT_IN_PAYLOAD:
            if off + size > len(img.payload):
                raise MalformedError(f"MODEL_INFO says the model is bytes {off}..{off + size} "
                                     f"of a {len(img.payload)}-byte payload")
            got = hashlib.sha256(img.payload[off:off + size]).digest()
            if check_model and got != seen[TLV_MODEL_SHA256]:
                raise DigestError("the model blob in the payload does not match MODEL_SHA256")
        img.model = ModelInfo(seen[TLV_MODEL_SHA256], off, size, ver,
                              "big" if order else "little")


@dataclass(frozen=True)
class Policy:
    """What the device accepts: its target, what is installed, its slot size.
    None = not checked."""
    target: str | None = None
    installed_version: Version | None = None
    installed_counter: int | None = None
    slot_size: int | None = None


def check_policy(what: str, *, target_id_: int, version: Version, counter: int, size: int,
                 policy: Policy) -> None:
    """Target, downgrade, anti-rollback and size checks shared by images and packages."""
    if policy.target is not None and target_id_ != target_id(policy.target):
        raise TargetError(f"the {what} is built for {target_name(target_id_)}, this device "
                          f"is {policy.target}: use the {policy.target} build")
    if policy.installed_version is not None and version < policy.installed_version:
        raise DowngradeError(f"the {what} has version {version}, older than the installed "
                             f"{policy.installed_version}: downgrades are refused")
    if policy.installed_counter is not None and counter < policy.installed_counter:
        raise CounterError(f"the {what}'s security counter {counter} is below the installed "
                           f"{policy.installed_counter}: a rollback to a revoked release "
                           "is refused")
    if policy.slot_size is not None and size > policy.slot_size:
        raise SlotSizeError(f"the {what} is {size} bytes, larger than the {policy.slot_size}-"
                            f"byte slot by {size - policy.slot_size}")


def verify_image(buf, public_key, policy: Policy = Policy(), exact: bool = True) -> Image:
    """Everything a bootloader checks, in the order that gives the most useful
    reason: structure, SHA-256, key, signature, then (authentic) contents, then
    the device's policy. Returns the parsed image; raises a VerifyError."""
    img = parse_image(buf, exact=exact)
    digest = hashlib.sha256(memoryview(buf)[:img.signed_end]).digest()
    if digest != img.digest:
        raise DigestError(f"SHA-256 of header, payload and protected TLVs is {digest.hex()[:16]}"
                          f"..., the image says {img.digest.hex()[:16]}...: the image was "
                          "damaged or modified after signing")
    if img.key_hash != keys.key_hash(public_key):
        raise KeyMismatchError(f"the image was signed by key {img.key_hash.hex()[:16]}..., not "
                               f"by the given key {keys.key_hash(public_key).hex()[:16]}...: "
                               "pass the matching KEY.pub")
    if not keys.check_digest(public_key, digest, img.signature):
        raise SignatureError("the Ed25519 signature does not verify: the image is not "
                             "authentic; do not install it")
    _interpret(img)
    check_policy("image", target_id_=img.target_id, version=img.version,
                 counter=img.security_counter, size=img.size, policy=policy)
    return img


def inspect_image(buf) -> Image:
    """Parse an image and its protected TLVs WITHOUT checking the signature
    (for `colibri fw info`; never act on what this returns)."""
    img = parse_image(buf, exact=False)
    _interpret(img, check_model=False)
    return img


def describe(img: Image) -> str:
    """What `colibri fw info` prints for an image."""
    h = img.header
    load = (f"runs from RAM at 0x{h['load_addr']:x}" if h["flags"] & IMAGE_F_RAM_LOAD
            else "executes in place")
    lines = [
        f"image         MCUboot image, header {h['hdr_size']} bytes, {img.size} bytes in all",
        f"target        {img.target} (id {img.target_id})",
        f"version       {img.version}",
        f"payload       {len(img.payload)} bytes, "
        f"{PAYLOAD_KINDS.get(img.payload_kind, 'unknown kind')}, {load}",
        f"sec counter   {img.security_counter}",
    ]
    if img.model:
        m = img.model
        where = ("not in the payload" if m.offset == MODEL_NOT_IN_PAYLOAD
                 else f"payload offset {m.offset}")
        lines.append(f"model         {m.size} bytes, .colibri v{m.format_version} "
                     f"{m.byte_order}-endian, {where}")
        lines.append(f"model sha256  {m.sha256.hex()}")
    else:
        lines.append("model         none recorded")
    lines += [f"sha256        {img.digest.hex()}",
              f"key hash      {img.key_hash.hex()}"]
    if img.unknown_tlvs:
        lines.append("unknown TLVs  " + ", ".join(f"0x{t:04x}" for t in img.unknown_tlvs))
    return "\n".join(lines)
