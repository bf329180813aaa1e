"""A/B firmware updates with rollback, simulated over a flash image kept in a
file (docs/IMAGE.md section 7), with MCUboot's slot trailer and the semantics
of MCUboot's direct-XIP mode with revert (MCUBOOT_DIRECT_XIP_REVERT).

Flash layout (all little-endian):

    0                 geometry block (64 bytes, written once by `init_flash`)
    NV_OFFSET         security counter copy 0 (64 bytes)
    + NV_SIZE         security counter copy 1 (64 bytes)
    slot_a_offset     slot A (slot_size bytes, aligned to `align`)
    slot_b_offset     slot B

Each slot ends with MCUboot's image trailer (BOOT_MAX_ALIGN 8, offsets from
the slot's end): swap_size at -48, swap_info at -40, copy_done at -32,
image_ok at -24, the 16-byte boot magic at -16; each flag is one byte padded
with erased 0xFF to 8. Direct-XIP: every slot runs where it lies, nothing is
swapped; the bootloader boots the verified slot with the highest version:

- magic not good, or copy_done set and image_ok not set (a test image that
  already had its one boot and was not confirmed): erase the slot (revert) and
  try the next one;
- image_ok not set (a test image): set copy_done, then boot it once;
- image_ok set: a confirmed image; raise the stored security counter to its
  own (MCUboot raises its hardware counter only for confirmed images, so a
  test image can still be reverted).

An update writes the image into the slot that is not running, then marks it
for test (`boot_set_pending`: magic, then swap_info TEST; with `permanent`
also image_ok). The running test image confirms itself (`boot_set_confirmed`:
image_ok) after its self-test; without that, the next reset reverts it.

The security counter (MCUboot keeps it in hardware, `boot_nv_security_counter`)
lives here in two ping-pong copies: each write goes to the copy that does NOT
hold the newest valid record, with a sequence number one higher and a CRC32,
so a torn write leaves the previous value readable.

Writes go through an injectable `writer(file, offset, data)`, which is how the
tests cut the power after (or in the middle of) every single write.
"""
from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from . import image as I
from . import keys, ota
from ..errors import ColibriError

GEOMETRY_MAGIC = b"CLFL"
GEOMETRY_STRUCT = "<4sHHIIII36sI"   # magic, version, target_id, slot_size, slot_a, slot_b,
GEOMETRY_SIZE = 64                  # write_size, reserved, crc32 of bytes 0..59
assert struct.calcsize(GEOMETRY_STRUCT) == GEOMETRY_SIZE
GEOMETRY_VERSION = 2                # 2: MCUboot trailers (1 had a state record)

NV_MAGIC = b"CLNV"
NV_STRUCT = "<4sII48sI"             # magic, seq, security counter, reserved, crc32 of 0..59
NV_SIZE = 64
assert struct.calcsize(NV_STRUCT) == NV_SIZE
NV_OFFSET = GEOMETRY_SIZE
NV_COPIES = 2

# --- MCUboot's image trailer (bootutil_priv.h, boot_magic in bootutil_public.c)
BOOT_MAX_ALIGN = 8
BOOT_MAGIC = bytes([0x77, 0xC2, 0x95, 0xF3, 0x60, 0xD2, 0xEF, 0x7F,
                    0x35, 0x52, 0x50, 0x0F, 0x2C, 0xB6, 0x79, 0x80])
MAGIC_OFF = -16                     # offsets from the end of the slot
IMAGE_OK_OFF = MAGIC_OFF - BOOT_MAX_ALIGN
COPY_DONE_OFF = IMAGE_OK_OFF - BOOT_MAX_ALIGN
SWAP_INFO_OFF = COPY_DONE_OFF - BOOT_MAX_ALIGN
SWAP_SIZE_OFF = SWAP_INFO_OFF - BOOT_MAX_ALIGN
TRAILER_SIZE = -SWAP_SIZE_OFF       # 48: no swap status area, direct-XIP swaps nothing
BOOT_FLAG_SET = 0x01
BOOT_SWAP_TYPE_TEST, BOOT_SWAP_TYPE_PERM = 2, 3
MAGIC_GOOD, MAGIC_UNSET, MAGIC_BAD = "good", "unset", "bad"
FLAG_SET, FLAG_UNSET, FLAG_BAD = "set", "unset", "bad"

TRIAL_NONE, TRIAL_PENDING, TRIAL_TRYING = 0, 1, 2
TRIAL_NAMES = {TRIAL_NONE: "none", TRIAL_PENDING: "pending", TRIAL_TRYING: "trying"}
NO_SLOT = 0xFF
SLOT_NAMES = ("A", "B")
ERASED = 0xFF
DEFAULT_WRITE_SIZE = 4096


class UpdateError(ColibriError):
    """The agent refuses an operation (wrong state, bad package, bad flash file)."""


class NoBootableImageError(UpdateError):
    """Neither slot holds a verified image: the device would be bricked. The
    power-cut tests assert this never happens."""


class PowerCut(Exception):
    """Raised by a test writer to stop the agent as a power loss would. Not a
    ColibriError: nothing may catch it but the test harness."""


def direct_writer(f, offset: int, data: bytes) -> None:
    f.seek(offset)
    f.write(data)
    f.flush()


class CutWriter:
    """Writes normally until write number `at` (1-based), then simulates the
    power loss: mode "before" writes nothing, "torn" writes the first half of
    the data, "after" writes it all; then raises PowerCut. `count` is the
    number of writes seen, so a run without a cut (at=0) counts the steps;
    `log` lists (offset, length) of every write."""

    def __init__(self, at: int = 0, mode: str = "torn"):
        assert mode in ("before", "torn", "after")
        self.at, self.mode, self.count, self.log = at, mode, 0, []

    def __call__(self, f, offset: int, data: bytes) -> None:
        self.count += 1
        self.log.append((offset, len(data)))
        if self.count != self.at:
            direct_writer(f, offset, data)
            return
        keep = {"before": 0, "torn": len(data) // 2, "after": len(data)}[self.mode]
        if keep:
            direct_writer(f, offset, data[:keep])
        raise PowerCut(f"power cut at write {self.at} ({self.mode})")


@dataclass(frozen=True)
class Geometry:
    target_id: int
    slot_size: int
    slot_offsets: tuple[int, int]
    write_size: int

    @property
    def image_capacity(self) -> int:
        """The largest image a slot holds: its trailer takes the end."""
        return self.slot_size - TRAILER_SIZE

    def pack(self) -> bytes:
        head = struct.pack(GEOMETRY_STRUCT, GEOMETRY_MAGIC, GEOMETRY_VERSION, self.target_id,
                           self.slot_size, *self.slot_offsets, self.write_size, bytes(36), 0)
        return head[:60] + struct.pack("<I", zlib.crc32(head[:60]))

    @classmethod
    def unpack(cls, raw: bytes) -> "Geometry":
        if len(raw) < GEOMETRY_SIZE or raw[:4] != GEOMETRY_MAGIC:
            raise UpdateError("not a Colibri flash image (no geometry block): create one with "
                              "`colibri fw flash-init`")
        magic, ver, tid, size, a, b, wsize, _, crc = struct.unpack_from(GEOMETRY_STRUCT, raw)
        if zlib.crc32(raw[:60]) != crc or ver != GEOMETRY_VERSION:
            raise UpdateError("the flash geometry block is damaged or of an unknown version: "
                              "re-provision the device with `colibri fw flash-init`")
        return cls(tid, size, (a, b), wsize)


@dataclass(frozen=True)
class Counter:
    """One copy of the stored security counter."""
    seq: int
    value: int

    def pack(self) -> bytes:
        head = struct.pack(NV_STRUCT, NV_MAGIC, self.seq, self.value, bytes(48), 0)
        return head[:60] + struct.pack("<I", zlib.crc32(head[:60]))

    @classmethod
    def unpack(cls, raw: bytes) -> "Counter | None":
        """The record in `raw`, or None when it is torn, erased or damaged."""
        if len(raw) != NV_SIZE or raw[:4] != NV_MAGIC:
            return None
        _, seq, value, res, crc = struct.unpack(NV_STRUCT, raw)
        if zlib.crc32(raw[:60]) != crc or res != bytes(48):
            return None
        return cls(seq, value)


@dataclass(frozen=True)
class Trailer:
    """A slot's MCUboot trailer, decoded as bootutil reads it."""
    magic: str           # good / unset / bad
    image_ok: str        # set / unset / bad
    copy_done: str
    swap_info: int       # raw byte (0xFF: never written)

    @classmethod
    def unpack(cls, tail: bytes) -> "Trailer":
        assert len(tail) == TRAILER_SIZE

        def flag(off: int) -> str:
            b = tail[off]
            return FLAG_SET if b == BOOT_FLAG_SET else FLAG_UNSET if b == ERASED else FLAG_BAD
        m = tail[MAGIC_OFF:]
        magic = (MAGIC_GOOD if m == BOOT_MAGIC else
                 MAGIC_UNSET if m == bytes([ERASED]) * 16 else MAGIC_BAD)
        return cls(magic, flag(IMAGE_OK_OFF), flag(COPY_DONE_OFF), tail[SWAP_INFO_OFF])

    @property
    def confirmed(self) -> bool:
        return self.magic == MAGIC_GOOD and self.image_ok == FLAG_SET

    @property
    def trial(self) -> int:
        """TRIAL_PENDING: marked for test, not booted yet; TRIAL_TRYING: had
        its one boot (copy_done) and is not confirmed; else TRIAL_NONE."""
        if self.magic != MAGIC_GOOD or self.image_ok == FLAG_SET:
            return TRIAL_NONE
        return TRIAL_TRYING if self.copy_done == FLAG_SET else TRIAL_PENDING

    def describe(self) -> str:
        return (f"magic {self.magic}, image_ok {self.image_ok}, copy_done {self.copy_done}, "
                f"swap_info 0x{self.swap_info:02x}")


def trailer_field(value: int) -> bytes:
    """One flag as it is programmed: the byte, then erased padding to BOOT_MAX_ALIGN."""
    return bytes([value]) + bytes([ERASED]) * (BOOT_MAX_ALIGN - 1)


@dataclass(frozen=True)
class State:
    """What the trailers and the counter say, in one view (derived, not stored)."""
    confirmed_slot: int                  # the confirmed slot that boots, NO_SLOT if none
    trial_slot: int = NO_SLOT
    trial_state: int = TRIAL_NONE
    min_security_counter: int = 0

    def describe(self) -> str:
        conf = ("no confirmed slot" if self.confirmed_slot == NO_SLOT
                else f"confirmed slot {SLOT_NAMES[self.confirmed_slot]}")
        trial = ("no trial" if self.trial_state == TRIAL_NONE else
                 f"slot {SLOT_NAMES[self.trial_slot]} {TRIAL_NAMES[self.trial_state]}")
        return f"{conf}, {trial}, min security counter {self.min_security_counter}"


@dataclass(frozen=True)
class Boot:
    """What `Agent.boot` decided: the slot to run and its verified image."""
    slot: int
    image: I.Image
    trial: bool          # True: a test boot; the image must confirm or it is reverted
    note: str            # one line for the log: why this slot


class Agent:
    """The update agent and the boot logic of one device, over a flash file.
    `public_key` is the device's trust anchor; the target comes from the flash
    geometry."""

    def __init__(self, path: str | os.PathLike, public_key, writer=direct_writer):
        self.path = Path(path)
        self.public_key = public_key
        self.writer = writer
        try:
            self._f = open(self.path, "r+b")
        except OSError as exc:
            raise UpdateError(f"cannot open flash image {path}: {exc.strerror}") from None
        self.geometry = Geometry.unpack(self._read(0, GEOMETRY_SIZE))
        self.target = I.target_name(self.geometry.target_id)

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- raw flash ---------------------------------------------------------------
    def _read(self, offset: int, n: int) -> bytes:
        self._f.seek(offset)
        return self._f.read(n)

    def _write(self, offset: int, data: bytes) -> None:
        self.writer(self._f, offset, data)

    def slot_bytes(self, slot: int) -> bytes:
        return self._read(self.geometry.slot_offsets[slot], self.geometry.slot_size)

    def _slot_end(self, slot: int) -> int:
        return self.geometry.slot_offsets[slot] + self.geometry.slot_size

    def trailer(self, slot: int) -> Trailer:
        return Trailer.unpack(self._read(self._slot_end(slot) - TRAILER_SIZE, TRAILER_SIZE))

    def _write_flag(self, slot: int, off: int, value: int) -> None:
        self._write(self._slot_end(slot) + off, trailer_field(value))

    # --- the stored security counter ---------------------------------------------
    def _copies(self) -> list[Counter | None]:
        return [Counter.unpack(self._read(NV_OFFSET + i * NV_SIZE, NV_SIZE))
                for i in range(NV_COPIES)]

    def security_counter(self) -> int:
        """The newest valid copy's value (0 when neither copy is valid)."""
        valid = [c for c in self._copies() if c is not None]
        return max(valid, key=lambda c: c.seq).value if valid else 0

    def _raise_counter(self, value: int) -> None:
        """Store `value` if it is higher, in the copy that does not hold the
        newest record: a torn write cannot lose the current value."""
        copies = self._copies()
        valid = [(c.seq, i) for i, c in enumerate(copies) if c is not None]
        seq, newest = max(valid) if valid else (0, 1)
        if valid and copies[newest].value >= value:
            return
        self._write(NV_OFFSET + (1 - newest) * NV_SIZE, Counter(seq + 1, value).pack())

    # --- images --------------------------------------------------------------------
    def verify_slot(self, slot: int, min_counter: int = 0) -> I.Image:
        """The verified image in `slot` (signature, target, anti-rollback, it
        leaves room for the trailer); VerifyError otherwise."""
        policy = I.Policy(target=self.target, installed_counter=min_counter,
                          slot_size=self.geometry.image_capacity)
        return I.verify_image(self.slot_bytes(slot), self.public_key, policy, exact=False)

    def _try_slot(self, slot: int, min_counter: int) -> I.Image | None:
        try:
            return self.verify_slot(slot, min_counter)
        except I.VerifyError:
            return None

    def _erase_slot(self, slot: int) -> None:
        """Erase the whole slot, trailer included, `write_size` bytes per step."""
        base, size, step = self.geometry.slot_offsets[slot], self.geometry.slot_size, \
            self.geometry.write_size
        for off in range(0, size, step):
            self._write(base + off, bytes([ERASED]) * min(step, size - off))

    def _write_slot(self, slot: int, image: bytes) -> None:
        """Erase the slot, then program the image, `write_size` bytes per write
        (each one a step a power cut can interrupt)."""
        self._erase_slot(slot)
        base, step = self.geometry.slot_offsets[slot], self.geometry.write_size
        for off in range(0, len(image), step):
            self._write(base + off, image[off:off + step])

    def read_state(self) -> State:
        """The device's state as the trailers and the counter give it."""
        counter = self.security_counter()
        found = [(img.version, slot) for slot in (0, 1)
                 if self.trailer(slot).confirmed
                 and (img := self._try_slot(slot, counter)) is not None]
        confirmed = max(found)[1] if found else NO_SLOT
        for slot in (0, 1):
            t = self.trailer(slot).trial
            if t != TRIAL_NONE:
                return State(confirmed, slot, t, counter)
        return State(confirmed, NO_SLOT, TRIAL_NONE, counter)

    def running_slot(self) -> int | None:
        """The slot `boot` would run now, without writing anything."""
        counter = self.security_counter()
        for _, slot, _ in self._candidates(counter):
            t = self.trailer(slot)
            if t.magic == MAGIC_GOOD and not (t.copy_done == FLAG_SET and t.image_ok != FLAG_SET):
                return slot
        return None

    def _candidates(self, counter: int) -> list[tuple[I.Version, int, I.Image]]:
        """Verified slots, highest version first (ties: slot A)."""
        found = [(img.version, slot, img) for slot in (0, 1)
                 if (img := self._try_slot(slot, counter)) is not None]
        return sorted(found, key=lambda t: (t[0], -t[1]), reverse=True)

    # --- the update --------------------------------------------------------------
    def install(self, package: bytes, permanent: bool = False) -> int:
        """Verify `package` against this device, write its image into the slot
        that is not running, read it back, verify it, then mark it for test
        (MCUboot's boot_set_pending: magic, swap_info; `permanent`: image_ok
        too, so it is confirmed without a self-test). Returns the slot."""
        state = self.read_state()
        if state.trial_state != TRIAL_NONE:
            raise UpdateError(f"slot {SLOT_NAMES[state.trial_slot]} is already on trial "
                              f"({TRIAL_NAMES[state.trial_state]}): boot, then confirm or roll "
                              "back before installing another update")
        running = self.running_slot()
        current = self._try_slot(running, 0) if running is not None else None
        policy = I.Policy(target=self.target,
                          installed_version=current.version if current else None,
                          installed_counter=state.min_security_counter,
                          slot_size=self.geometry.image_capacity)
        pkg = ota.verify_package(package, self.public_key, policy)
        if len(pkg.images) != 1:
            raise UpdateError(f"the package holds {len(pkg.images)} firmware images; an A/B "
                              "device installs exactly one")
        entry = next(e for e in pkg.entries if e.type == ota.PAYLOAD_IMAGE)
        image = bytes(memoryview(package)[entry.offset:entry.offset + entry.size])
        slot = 1 - running if running is not None else 0
        self._write_slot(slot, image)
        try:
            self.verify_slot(slot, state.min_security_counter)
        except I.VerifyError as exc:
            raise UpdateError(f"slot {SLOT_NAMES[slot]} does not verify after writing "
                              f"({exc}): the flash may be failing; the update was not "
                              "marked pending") from None
        # Magic last of the image but first of the trailer: until it is
        # complete the slot is not a candidate, and a slot without good magic
        # is erased by the next boot, never run.
        self._write(self._slot_end(slot) + MAGIC_OFF, BOOT_MAGIC)
        if permanent:
            self._write_flag(slot, IMAGE_OK_OFF, BOOT_FLAG_SET)
        self._write_flag(slot, SWAP_INFO_OFF,
                         BOOT_SWAP_TYPE_PERM if permanent else BOOT_SWAP_TYPE_TEST)
        return slot

    def boot(self) -> Boot:
        """Pick the slot to run, as the bootloader does at reset: the verified
        slot with the highest version, with MCUboot's direct-XIP revert rules.
        Never returns an unverified slot."""
        counter = self.security_counter()
        candidates = self._candidates(counter)
        notes = [f"slot {SLOT_NAMES[s]} does not verify"
                 for s in (0, 1) if self.trailer(s).magic == MAGIC_GOOD
                 and s not in [c[1] for c in candidates]]
        for version, slot, img in candidates:
            t = self.trailer(slot)
            if t.magic != MAGIC_GOOD or (t.copy_done == FLAG_SET and t.image_ok != FLAG_SET):
                # A test image that had its boot and was not confirmed, or a
                # slot that was never marked (an install cut short): MCUboot
                # erases it so it can never be selected again.
                why = ("not marked for boot" if t.magic != MAGIC_GOOD
                       else "test boot was not confirmed")
                self._erase_slot(slot)
                notes.append(f"slot {SLOT_NAMES[slot]} ({version}) {why}: reverted")
                continue
            tail = (": " + "; ".join(notes)) if notes else ""
            if t.image_ok != FLAG_SET:
                # Consume the test before running it: if it hangs or resets
                # before confirming, the next boot sees copy_done and reverts.
                if t.copy_done != FLAG_SET:
                    self._write_flag(slot, COPY_DONE_OFF, BOOT_FLAG_SET)
                return Boot(slot, img, True,
                            f"test boot of slot {SLOT_NAMES[slot]} ({version}){tail}")
            self._raise_counter(img.security_counter)
            what = "fell back to" if notes else "confirmed image in"
            return Boot(slot, img, False, f"{what} slot {SLOT_NAMES[slot]} ({version}){tail}")
        raise NoBootableImageError(f"neither slot holds a verified image with security counter "
                                   f">= {counter}" + (f" ({'; '.join(notes)})" if notes else "")
                                   + ": re-flash the device with `colibri fw flash-init`")

    def confirm(self) -> State:
        """The test image passed its self-test: set image_ok (MCUboot's
        boot_set_confirmed), then raise the security counter to its own."""
        state = self.read_state()
        if state.trial_state != TRIAL_TRYING:
            raise UpdateError("nothing to confirm: no test boot is running")
        img = self.verify_slot(state.trial_slot, state.min_security_counter)
        self._write_flag(state.trial_slot, IMAGE_OK_OFF, BOOT_FLAG_SET)
        self._raise_counter(img.security_counter)
        return self.read_state()

    def rollback(self) -> State:
        """The test image failed its self-test (or a pending one is withdrawn):
        erase its slot now, as the next boot would."""
        state = self.read_state()
        if state.trial_state == TRIAL_NONE:
            raise UpdateError("nothing to roll back: no update is pending or on trial")
        self._erase_slot(state.trial_slot)
        return self.read_state()


def init_flash(path: str | os.PathLike, image: bytes, public_key, *, slot_size: int,
               align: int = 4096, write_size: int = DEFAULT_WRITE_SIZE) -> Geometry:
    """Factory provisioning: a fresh flash file with `image` (verified first;
    a signed image, or a whole slot padded by imgtool --pad) confirmed in slot
    A (trailer magic and image_ok, as `imgtool sign --pad --confirm` leaves
    them), slot B erased, the security counter stored."""
    if slot_size <= TRAILER_SIZE:
        raise UpdateError(f"slot size {slot_size} leaves no room for the {TRAILER_SIZE}-byte "
                          "MCUboot trailer")
    # A whole slot as `imgtool sign --pad [--confirm] -S SLOT` writes it
    # (image, erased flash, trailer) is taken as it is; the factory image is
    # confirmed either way below.
    padded = len(image) == slot_size
    img = I.verify_image(image, public_key, I.Policy(slot_size=slot_size - TRAILER_SIZE),
                         exact=not padded)
    a = -(-(NV_OFFSET + NV_COPIES * NV_SIZE) // align) * align
    b = a + -(-slot_size // align) * align
    geo = Geometry(img.target_id, slot_size, (a, b), write_size)
    flash = bytearray([ERASED]) * (b + slot_size)
    flash[:GEOMETRY_SIZE] = geo.pack()
    flash[a:a + len(image)] = image
    end = a + slot_size
    flash[end + MAGIC_OFF:end] = BOOT_MAGIC
    flash[end + IMAGE_OK_OFF:end + IMAGE_OK_OFF + BOOT_MAX_ALIGN] = trailer_field(BOOT_FLAG_SET)
    flash[NV_OFFSET:NV_OFFSET + NV_SIZE] = Counter(1, img.security_counter).pack()
    I.write_atomic(path, bytes(flash))
    return geo
