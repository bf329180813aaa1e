"""A/B firmware updates with rollback, simulated over a flash image kept in a
file (docs/IMAGE.md section 7).

Flash layout (all little-endian):

    0                 geometry block (64 bytes, written once by `init_flash`)
    STATE_OFFSET      state copy 0 (64 bytes)
    + STATE_SIZE      state copy 1 (64 bytes)
    slot_a_offset     slot A (slot_size bytes, aligned to `align`)
    slot_b_offset     slot B

The state record says which slot holds the confirmed image and whether a new
image waits in the other slot for a trial boot. It is never updated in place:
each write goes to the copy that does NOT hold the newest valid record, with a
sequence number one higher and a CRC32, so a write torn by a power cut leaves
the previous record intact and the reader simply picks the newest copy whose
magic and CRC are good (the classic ping-pong scheme).

Update: install into the inactive slot (erase, write in chunks, read back and
verify), then mark it PENDING. Boot: a PENDING slot is marked TRYING and booted
once; a TRYING slot found at boot means the trial never confirmed, so the boot
rolls back. The running trial image calls `confirm` after its self-test passes
(the slot becomes the confirmed one and the anti-rollback counter rises) or
`rollback` when it fails. Every boot verifies the image signature before it
picks a slot; the confirmed slot is never written while it is confirmed.

Writes go through an injectable `writer(file, offset, data)`, which is how the
tests cut the power after (or in the middle of) every single write.
"""
from __future__ import annotations

import os
import struct
import sys
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

from . import image as I
from . import keys, ota
from .errors import ColibriError

GEOMETRY_MAGIC = b"CLFL"
GEOMETRY_STRUCT = "<4sHHIIII36sI"   # magic, version, target_id, slot_size, slot_a, slot_b,
GEOMETRY_SIZE = 64                  # write_size, reserved, crc32 of bytes 0..59
assert struct.calcsize(GEOMETRY_STRUCT) == GEOMETRY_SIZE
GEOMETRY_VERSION = 1

STATE_MAGIC = b"CLST"
STATE_STRUCT = "<4sIBBBBI44sI"      # magic, seq, confirmed_slot, trial_slot, trial_state,
STATE_SIZE = 64                     # reserved, min_security_counter, reserved, crc32 of 0..59
assert struct.calcsize(STATE_STRUCT) == STATE_SIZE
STATE_OFFSET = GEOMETRY_SIZE
STATE_COPIES = 2

NO_SLOT = 0xFF
TRIAL_NONE, TRIAL_PENDING, TRIAL_TRYING = 0, 1, 2
TRIAL_NAMES = {TRIAL_NONE: "none", TRIAL_PENDING: "pending", TRIAL_TRYING: "trying"}
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
    number of writes seen, so a run without a cut (at=0) counts the steps."""

    def __init__(self, at: int = 0, mode: str = "torn"):
        assert mode in ("before", "torn", "after")
        self.at, self.mode, self.count = at, mode, 0

    def __call__(self, f, offset: int, data: bytes) -> None:
        self.count += 1
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
class State:
    seq: int
    confirmed_slot: int
    trial_slot: int = NO_SLOT
    trial_state: int = TRIAL_NONE
    min_security_counter: int = 0

    def pack(self) -> bytes:
        head = struct.pack(STATE_STRUCT, STATE_MAGIC, self.seq, self.confirmed_slot,
                           self.trial_slot, self.trial_state, 0, self.min_security_counter,
                           bytes(44), 0)
        return head[:60] + struct.pack("<I", zlib.crc32(head[:60]))

    @classmethod
    def unpack(cls, raw: bytes) -> "State | None":
        """The record in `raw`, or None when it is torn, erased or damaged."""
        if len(raw) != STATE_SIZE or raw[:4] != STATE_MAGIC:
            return None
        _, seq, conf, tslot, tstate, res, counter, res2, crc = struct.unpack(STATE_STRUCT, raw)
        if zlib.crc32(raw[:60]) != crc or res or res2 != bytes(44):
            return None
        if conf > 1 or tstate not in TRIAL_NAMES or (tstate != TRIAL_NONE) != (tslot != NO_SLOT) \
                or tslot == conf:
            return None
        return cls(seq, conf, tslot, tstate, counter)

    def describe(self) -> str:
        trial = ("no trial" if self.trial_state == TRIAL_NONE else
                 f"slot {SLOT_NAMES[self.trial_slot]} {TRIAL_NAMES[self.trial_state]}")
        return (f"confirmed slot {SLOT_NAMES[self.confirmed_slot]}, {trial}, "
                f"min security counter {self.min_security_counter}, seq {self.seq}")


@dataclass(frozen=True)
class Boot:
    """What `Agent.boot` decided: the slot to run and its verified image."""
    slot: int
    image: I.Image
    trial: bool          # True: a trial boot; the image must confirm or be rolled back
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

    # --- state -------------------------------------------------------------------
    def _copies(self) -> list[State | None]:
        return [State.unpack(self._read(STATE_OFFSET + i * STATE_SIZE, STATE_SIZE))
                for i in range(STATE_COPIES)]

    def read_state(self) -> State | None:
        """The newest valid state record, or None when no copy is valid."""
        valid = [s for s in self._copies() if s is not None]
        return max(valid, key=lambda s: s.seq) if valid else None

    def write_state(self, **changes) -> State:
        """Write the current record with `changes` (seq + 1) into the copy that
        does not hold the current one: a torn write cannot lose it."""
        copies = self._copies()
        valid = [(s.seq, i) for i, s in enumerate(copies) if s is not None]
        if valid:
            seq, newest = max(valid)
            new = replace(copies[newest], seq=seq + 1, **changes)
            index = 1 - newest
        else:
            new = State(seq=1, **changes)
            index = 0
        self._write(STATE_OFFSET + index * STATE_SIZE, new.pack())
        return new

    # --- images --------------------------------------------------------------------
    def verify_slot(self, slot: int, min_counter: int = 0) -> I.Image:
        """The verified image in `slot` (signature, target, anti-rollback);
        VerifyError otherwise."""
        policy = I.Policy(target=self.target, installed_counter=min_counter,
                          slot_size=self.geometry.slot_size)
        return I.verify_image(self.slot_bytes(slot), self.public_key, policy, exact=False)

    def _try_slot(self, slot: int, min_counter: int) -> I.Image | None:
        try:
            return self.verify_slot(slot, min_counter)
        except I.VerifyError:
            return None

    def _write_slot(self, slot: int, image: bytes) -> None:
        """Erase the slot, then program the image, `write_size` bytes per write
        (each one a step a power cut can interrupt)."""
        base, size, step = self.geometry.slot_offsets[slot], self.geometry.slot_size, \
            self.geometry.write_size
        for off in range(0, size, step):
            self._write(base + off, bytes([ERASED]) * min(step, size - off))
        for off in range(0, len(image), step):
            self._write(base + off, image[off:off + step])

    # --- the update --------------------------------------------------------------
    def install(self, package: bytes) -> int:
        """Verify `package` against this device, write its image into the
        inactive slot, read it back, verify it, mark it pending. Returns the slot."""
        state = self.read_state()
        if state is None:
            raise UpdateError("the flash state area is unreadable: boot the device first "
                              "(boot repairs it) and retry")
        if state.trial_state != TRIAL_NONE:
            raise UpdateError(f"slot {SLOT_NAMES[state.trial_slot]} is already on trial "
                              f"({TRIAL_NAMES[state.trial_state]}): boot, then confirm or roll "
                              "back before installing another update")
        current = self._try_slot(state.confirmed_slot, 0)
        policy = I.Policy(target=self.target,
                          installed_version=current.version if current else None,
                          installed_counter=state.min_security_counter,
                          slot_size=self.geometry.slot_size)
        pkg = ota.verify_package(package, self.public_key, policy)
        if len(pkg.images) != 1:
            raise UpdateError(f"the package holds {len(pkg.images)} firmware images; an A/B "
                              "device installs exactly one")
        entry = next(e for e in pkg.entries if e.type == ota.PAYLOAD_IMAGE)
        image = bytes(memoryview(package)[entry.offset:entry.offset + entry.size])
        slot = 1 - state.confirmed_slot
        self._write_slot(slot, image)
        try:
            self.verify_slot(slot, state.min_security_counter)
        except I.VerifyError as exc:
            raise UpdateError(f"slot {SLOT_NAMES[slot]} does not verify after writing "
                              f"({exc}): the flash may be failing; the update was not "
                              "marked pending") from None
        self.write_state(trial_slot=slot, trial_state=TRIAL_PENDING)
        return slot

    def boot(self) -> Boot:
        """Pick the slot to run, as the bootloader does at reset. Verifies the
        image before choosing it; never returns an unverified slot."""
        state = self.read_state()
        if state is None:
            return self._boot_without_state()
        if state.trial_state == TRIAL_PENDING:
            img = self._try_slot(state.trial_slot, state.min_security_counter)
            if img is not None:
                # Consume the trial before running it: if it hangs or resets
                # before confirming, the next boot sees TRYING and rolls back.
                self.write_state(trial_state=TRIAL_TRYING)
                return Boot(state.trial_slot, img, True,
                            f"trial boot of slot {SLOT_NAMES[state.trial_slot]} ({img.version})")
            state = self.write_state(trial_slot=NO_SLOT, trial_state=TRIAL_NONE)
            note = "pending image does not verify: discarded"
        elif state.trial_state == TRIAL_TRYING:
            state = self.write_state(trial_slot=NO_SLOT, trial_state=TRIAL_NONE)
            note = "trial boot did not confirm: rolled back"
        else:
            note = "confirmed image"
        img = self._try_slot(state.confirmed_slot, state.min_security_counter)
        if img is not None:
            return Boot(state.confirmed_slot, img, False,
                        f"slot {SLOT_NAMES[state.confirmed_slot]} ({img.version}): {note}")
        # The confirmed slot is damaged (bit rot, not an update step: updates
        # never touch it). Fall back to the other slot if it holds a good image.
        other = 1 - state.confirmed_slot
        img = self._try_slot(other, state.min_security_counter)
        if img is None:
            raise NoBootableImageError(f"neither slot holds a verified image with security "
                                       f"counter >= {state.min_security_counter}: re-flash "
                                       "the device with `colibri fw flash-init`")
        self.write_state(confirmed_slot=other, trial_slot=NO_SLOT, trial_state=TRIAL_NONE)
        return Boot(other, img, False, f"confirmed slot {SLOT_NAMES[state.confirmed_slot]} "
                    f"does not verify: fell back to slot {SLOT_NAMES[other]} ({img.version})")

    def _boot_without_state(self) -> Boot:
        """No valid state copy (never happens through this agent's writes;
        possible after outside damage): boot the newest verified slot and write
        a fresh record for it."""
        found = [(img.version, slot, img) for slot in (0, 1)
                 if (img := self._try_slot(slot, 0)) is not None]
        if not found:
            raise NoBootableImageError("no state record and neither slot holds a verified "
                                       "image: re-flash the device with `colibri fw flash-init`")
        version, slot, img = max(found, key=lambda t: (t[0], -t[1]))
        self.write_state(confirmed_slot=slot, min_security_counter=img.security_counter)
        return Boot(slot, img, False, f"state area unreadable: booted newest slot "
                    f"{SLOT_NAMES[slot]} ({version}) and rewrote the state")

    def confirm(self) -> State:
        """The trial image passed its self-test: make it the confirmed one and
        raise the anti-rollback counter to its security counter."""
        state = self.read_state()
        if state is None or state.trial_state != TRIAL_TRYING:
            raise UpdateError("nothing to confirm: no trial boot is running")
        img = self.verify_slot(state.trial_slot, state.min_security_counter)
        return self.write_state(confirmed_slot=state.trial_slot, trial_slot=NO_SLOT,
                                trial_state=TRIAL_NONE,
                                min_security_counter=max(state.min_security_counter,
                                                         img.security_counter))

    def rollback(self) -> State:
        """The trial image failed its self-test: drop it; the next boot runs
        the confirmed slot."""
        state = self.read_state()
        if state is None or state.trial_state == TRIAL_NONE:
            raise UpdateError("nothing to roll back: no update is pending or on trial")
        return self.write_state(trial_slot=NO_SLOT, trial_state=TRIAL_NONE)


def init_flash(path: str | os.PathLike, image: bytes, public_key, *, slot_size: int,
               align: int = 4096, write_size: int = DEFAULT_WRITE_SIZE) -> Geometry:
    """Factory provisioning: a fresh flash file with `image` (verified first)
    confirmed in slot A, slot B erased, both state copies written."""
    img = I.verify_image(image, public_key, I.Policy(slot_size=slot_size))
    a = -(-(STATE_OFFSET + STATE_COPIES * STATE_SIZE) // align) * align
    b = a + -(-slot_size // align) * align
    geo = Geometry(img.target_id, slot_size, (a, b), write_size)
    flash = bytearray([ERASED]) * (b + slot_size)
    flash[:GEOMETRY_SIZE] = geo.pack()
    flash[a:a + len(image)] = image
    st = State(seq=1, confirmed_slot=0, min_security_counter=img.security_counter)
    flash[STATE_OFFSET:STATE_OFFSET + STATE_SIZE] = st.pack()
    flash[STATE_OFFSET + STATE_SIZE:STATE_OFFSET + 2 * STATE_SIZE] = \
        replace(st, seq=0).pack()
    I.write_atomic(path, bytes(flash))
    return geo


# --- `colibri fw flash-init|install|boot|confirm|rollback|status` ---------------------
def add_parsers(sub) -> None:
    from .fw_cli import parse_size
    p = sub.add_parser("flash-init", help="create a simulated A/B flash with IMG confirmed in A")
    p.add_argument("flash", metavar="FLASH")
    p.add_argument("--image", required=True, metavar="IMG")
    p.add_argument("--key", required=True, metavar="KEY.pub")
    p.add_argument("--slot-size", required=True, type=parse_size, metavar="BYTES")
    p.add_argument("--write-size", type=parse_size, default=DEFAULT_WRITE_SIZE, metavar="BYTES",
                   help="bytes per flash write step (default 4096)")
    p.set_defaults(func=_cmd_init)
    for name, helptext in (("install", "verify PKG and install it into the inactive slot"),
                           ("boot", "pick and verify the slot to boot (trial/rollback logic)"),
                           ("confirm", "the trial image passed its self-test: keep it"),
                           ("rollback", "the trial image failed its self-test: drop it"),
                           ("status", "print the state record and both slots")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("flash", metavar="FLASH")
        if name == "install":
            p.add_argument("package", metavar="PKG")
        p.add_argument("--key", required=name != "rollback", metavar="KEY.pub")
        p.set_defaults(func=_cmd_agent, agent_command=name)


def _cmd_init(args) -> int:
    geo = init_flash(args.flash, I.read_bytes(args.image), keys.load_public(args.key),
                     slot_size=args.slot_size, write_size=args.write_size)
    print(f"wrote {args.flash}: {I.target_name(geo.target_id)}, slots of {geo.slot_size} bytes "
          f"at {geo.slot_offsets[0]} and {geo.slot_offsets[1]}, {args.image} confirmed in A")
    return 0


def _cmd_agent(args) -> int:
    pub = keys.load_public(args.key) if args.key else None
    with Agent(args.flash, pub) as agent:
        cmd = args.agent_command
        if cmd == "install":
            try:
                slot = agent.install(I.read_bytes(args.package))
            except I.VerifyError as exc:
                print(f"{args.package}: REJECTED ({exc.reason}): {exc}", file=sys.stderr)
                return exc.exit_status
            print(f"installed {args.package} into slot {SLOT_NAMES[slot]}: pending; boot to try it")
        elif cmd == "boot":
            b = agent.boot()
            print(f"boot slot {SLOT_NAMES[b.slot]}: {b.note}")
        elif cmd == "confirm":
            print(f"confirmed: {agent.confirm().describe()}")
        elif cmd == "rollback":
            print(f"rolled back: {agent.rollback().describe()}")
        else:
            st = agent.read_state()
            print(f"state         {st.describe() if st else 'no valid record'}")
            for slot in (0, 1):
                try:
                    img = agent.verify_slot(slot) if pub else None
                    what = f"{img.version}, counter {img.security_counter}" if img else "?"
                except I.VerifyError as exc:
                    what = f"no verified image ({exc.reason})"
                print(f"slot {SLOT_NAMES[slot]}        {what}")
    return 0
