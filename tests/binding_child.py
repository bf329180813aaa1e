"""Child processes of tests/test_binding.py: what could crash or leak runs
here, in a subprocess, so that a crash shows as a signal in the parent's
return code instead of killing pytest, and RSS is this process's alone.

    python binding_child.py fuzz LIB FILE...        one line per fuzz input
    python binding_child.py leak LIB MODEL CYCLES    one JSON line (RSS in KiB)

fuzz: each input is a fuzz/corpus file, driven as fuzz/fuzz_init_infer.c
drives the C library (same control tail, same CRC fix-up, same 64 MiB arena
cap, same decode step) but through colibri.runtime, so the codes can be
compared with the harness's own (tests/test_binding.py does): colibri_arena_size, Model(bytes, arena=...)
or Model(path) (the via-file flag), infer, a decode step, verify. Prints
"NAME arena=RC init=RC infer=RC decode=RC verify=RC bad_parts=N" per input
(RC 0, a colibri code, or 1 when the step did not run), flushed, so a
crash names its input; an exception other than a ColibriError is printed as
"NAME python-error TYPE: MESSAGE" and the exit status is 3.
"""
from __future__ import annotations

import json
import os
import struct
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from colibri import errors, runtime  # noqa: E402

TAIL = 16
ARENA_CAP = 64 << 20
LOGITS_CAP = 1 << 20
MAX_SEQ = 12
FIX_CRCS, MASK, RAW_IDS, DECODE, VIA_FILE, VERIFY, REWIND, NULL_MASK_DECODE = (
    1, 2, 4, 8, 16, 32, 64, 128)


def fix_crcs(b: bytearray) -> None:
    """fuzz_init_infer.c fix_crcs: sections, then table, then header."""
    size = len(b)
    if size < 64:
        return
    e = ">" if b[6] == 0xFE else "<"
    n = struct.unpack_from(e + "I", b, 48)[0]
    if n <= (size - 64) // 40:
        for i in range(n):
            en = 64 + i * 40
            off, sz = struct.unpack_from(e + "QQ", b, en + 16)
            if off <= size and sz <= size - off:
                struct.pack_into(e + "I", b, en + 32, zlib.crc32(b[off:off + sz]))
        struct.pack_into(e + "I", b, 52, zlib.crc32(b[64:64 + n * 40]))
    struct.pack_into(e + "I", b, 60, zlib.crc32(b[:60]))


def code_of(fn):
    try:
        return 0, fn()
    except errors.RuntimeCallError as exc:
        assert exc.code is not None and exc.strerror, exc
        return exc.code, None


def fuzz_one(lib: str, data: bytes, tmp: Path) -> str:
    if len(data) < TAIL:   # the harness runs nothing
        return "arena=1 init=1 infer=1 decode=1 verify=1 bad_parts=0"
    blob, tail = bytearray(data[:-TAIL]), data[-TAIL:]
    flags = tail[0]
    if flags & FIX_CRCS:
        fix_crcs(blob)
    blob = bytes(blob)
    arena_rc, need = code_of(lambda: runtime.arena_size(blob, lib))
    fits = arena_rc == 0 and need <= ARENA_CAP
    arena = (need + 63) // 64 * 64 if fits else 64
    if flags & VIA_FILE and fits:
        path = tmp / "model.colibri"
        path.write_bytes(blob)
        init_rc, m = code_of(lambda: runtime.Model(path, library=lib))
    else:
        init_rc, m = code_of(lambda: runtime.Model(blob, arena=arena, library=lib))
    infer_rc = decode_rc = 1
    if m is not None:
        with m:
            s = m.info.shape
            batch = 1 + tail[1] % (s.max_batch + 1)
            seq = 1 + tail[2] % (min(s.max_seq_len, MAX_SEQ) + 1)
            while batch * seq * s.vocab > LOGITS_CAP and (batch > 1 or seq > 1):
                if seq > 1:
                    seq -= 1
                else:
                    batch -= 1
            if batch * seq * s.vocab <= LOGITS_CAP:
                i = np.arange(batch * seq)
                t = np.frombuffer(tail[4:], np.uint8)[i % 12]
                if flags & RAW_IDS:
                    ids = t.view(np.int8).astype(np.int64) * (s.vocab // 64 + 1)
                else:
                    ids = t.astype(np.int64) % s.vocab
                mask_all = ((tail[3] >> (i % 8)) & 1).astype(np.uint8)
                mask = mask_all.reshape(batch, seq) if flags & MASK else None
                ids = ids.reshape(batch, seq)
                # As the harness: an encoder-decoder encodes the same ids first.
                infer_rc = 0
                if m.decoder_start is not None:
                    infer_rc, _ = code_of(lambda: m.encode(ids, mask))
                if infer_rc == 0:
                    infer_rc, _ = code_of(lambda: m.infer(ids, mask, 0))
                if infer_rc == 0 and flags & DECODE:
                    # As the harness: the first `batch` ids and mask values
                    # (the mask even without MASK), n_past seq or seq / 2.
                    n_past = seq // 2 if flags & REWIND else seq
                    dmask = None if flags & NULL_MASK_DECODE else mask_all[:batch, None]
                    decode_rc, _ = code_of(lambda: m.infer(ids.ravel()[:batch, None], dmask,
                                                           n_past))
    verify_rc, bad = 1, []
    if flags & VERIFY:   # the code colibri_verify returned: -1 structure, -3 CRC
        verify_rc, got = code_of(lambda: runtime.verify_code(blob, lib))
        if verify_rc == 0:
            verify_rc, bad = got
    return (f"arena={arena_rc} init={init_rc} infer={infer_rc} decode={decode_rc} "
            f"verify={verify_rc} bad_parts={len(bad or [])}")


def fuzz(lib: str, files: list[str]) -> int:
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            name = os.path.basename(f)
            try:
                line = fuzz_one(lib, Path(f).read_bytes(), Path(tmp))
            except Exception as exc:   # noqa: BLE001 - reported, fails the test
                line, status = f"python-error {type(exc).__name__}: {exc}", 3
            print(f"{name} {line}", flush=True)
    return status


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def leak(lib: str, model: str, cycles: int) -> int:
    """open / infer / close `cycles` times, alternating a path and bytes,
    plus a failing init and a failing infer each cycle (the error paths must
    free too). RSS after a warm-up of cycles // 10, and at the end."""
    data = Path(model).read_bytes()
    ids = np.arange(1, 9, dtype=np.int64)[None, :]
    warm = max(cycles // 10, 1)
    before = None
    for i in range(warm + cycles):
        if i == warm:
            before = rss_kib()
        src = model if i % 2 else data
        with runtime.Model(src, library=lib) as m:
            m.infer(ids)
            m.infer(ids[:, :1], n_past=8)
            try:
                m.infer([[m.vocab]])
            except errors.TokenError:
                pass
        try:
            runtime.Model(data[:1000], library=lib)
        except errors.BadFormatError:
            pass
    after = rss_kib()
    print(json.dumps(dict(cycles=cycles, warmup=warm, rss_before_kib=before,
                          rss_after_kib=after)))
    return 0


if __name__ == "__main__":
    mode, lib, *rest = sys.argv[1:]
    if mode == "fuzz":
        sys.exit(fuzz(lib, rest))
    if mode == "leak":
        sys.exit(leak(lib, rest[0], int(rest[1])))
    sys.exit(f"unknown mode {mode}")
