"""Running target programs (natively or under the target's emulator, always
under a timeout) and reading the firmware's output.

The firmware (firmware/app/main.c) prints every logit row as float bits in
hex, so the host sees exactly what the target computed: the comparison with
the reference and the bit-identity check across targets need no text
round-off.
"""
from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field

import numpy as np

from .toolchain import missing_emulator
from ..errors import ColibriError


@dataclass
class RunResult:
    cmd: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run(target, prog: str, args=(), timeout: float | None = None,
        env: dict[str, str] | None = None) -> RunResult:
    """Run `prog` on `target` (its emulator command, see targets/) and wait at
    most `timeout` seconds (the target's run_timeout by default). A timeout
    or a missing emulator raises ColibriError naming the command. `env`:
    variables added to this process's environment (qemu-user passes them on;
    the Linux firmware reads COLIBRI_FW_THREADS)."""
    problem = missing_emulator(target)
    if problem:
        raise ColibriError(problem)
    cmd = target.emulator_command(str(prog), tuple(args))
    timeout = target.run_timeout if timeout is None else timeout
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
                           env={**os.environ, **env} if env else None)
    except subprocess.TimeoutExpired as exc:
        raise ColibriError(f"target {target.name}: {' '.join(cmd)} did not finish within "
                           f"{timeout:.0f} s (killed)") from exc
    return RunResult(cmd, p.returncode, p.stdout.decode(errors="replace"),
                     p.stderr.decode(errors="replace"), time.monotonic() - t0)


def fnv1a(rows: np.ndarray) -> int:
    """The firmware's checksum: FNV-1a 32 over each float's bits, least
    significant byte first (same value on any host byte order)."""
    h = 2166136261
    for b in np.ascontiguousarray(rows, dtype="<f4").tobytes():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


@dataclass
class PromptRun:
    prompt: list[int]
    rows: np.ndarray              # [positions, vocab] float32, as computed
    tokens: list[int]             # the chosen (greedy or sampled) tokens
    checksum: int
    text: bytes = b""             # text mode: what the streaming detokenizer released
    text_chunks: int = 0          # `text` records (one per token that released bytes)


def unescape_text(s: str) -> bytes:
    """The firmware's `text` record payload -> the bytes it stands for
    (\\\\, \\n, \\r, \\t, \\xNN escaped; everything else UTF-8 as is)."""
    out = bytearray()
    raw = s.encode("utf-8")
    i = 0
    while i < len(raw):
        c = raw[i]
        if c != 0x5C:
            out.append(c)
            i += 1
            continue
        nxt = raw[i + 1:i + 2]
        if nxt == b"x":
            out.append(int(raw[i + 2:i + 4], 16))
            i += 4
        else:
            out += {b"\\": b"\\", b"n": b"\n", b"r": b"\r", b"t": b"\t"}[nxt]
            i += 2
    return bytes(out)


@dataclass
class FirmwareRun:
    header: dict[str, str]
    prompts: list[PromptRun] = field(default_factory=list)
    done: bool = False
    kernels: str = ""             # the kernel table colibri_init picked


def parse_firmware_output(text: str) -> FirmwareRun:
    """Parse the firmware's records (see firmware/app/main.c). Raises
    ColibriError on a malformed line, or when a printed checksum does not
    match the printed rows (the output was cut or corrupted)."""
    run_ = FirmwareRun(header={})
    rows: dict[int, dict[int, np.ndarray]] = {}
    # split("\n"), not splitlines(): a text record may hold U+2028 or U+0085.
    for n, line in enumerate(text.split("\n"), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            tag = parts[0]
            if tag == "colibri-fw":
                run_.header = dict(p.split("=", 1) for p in parts[1:])
            elif tag == "kernels":
                run_.kernels = parts[1]
            elif tag == "prompt":
                run_.prompts.append(PromptRun([int(t) for t in parts[2].split(",")],
                                              np.zeros((0, 0), np.float32), [], 0))
                rows[int(parts[1])] = {}
            elif tag == "row":
                bits = np.array([int(h, 16) for h in parts[3:]], dtype=np.uint32)
                rows[int(parts[1])][int(parts[2])] = bits.view(np.float32)
            elif tag == "text":
                # The payload is everything after "text P " (it may hold spaces).
                p = run_.prompts[int(parts[1])]
                p.text += unescape_text(line.split(" ", 2)[2] if line.count(" ") >= 2 else "")
                p.text_chunks += 1
            elif tag == "tokens":
                run_.prompts[int(parts[1])].tokens = [int(t) for t in parts[2].split(",")]
            elif tag == "checksum":
                p = run_.prompts[int(parts[1])]
                r = rows[int(parts[1])]
                p.rows = np.stack([r[i] for i in sorted(r)]) if r else np.zeros((0, 0), np.float32)
                p.checksum = int(parts[2], 16)
                if fnv1a(p.rows) != p.checksum:
                    raise ColibriError(f"prompt {parts[1]}: checksum 0x{p.checksum:08x} "
                                       f"does not match the printed rows "
                                       f"(0x{fnv1a(p.rows):08x}): output corrupted")
            elif tag == "done":
                run_.done = True
        except (IndexError, ValueError, KeyError) as exc:
            raise ColibriError(f"firmware output line {n} is malformed ({exc}): "
                               f"{line[:120]!r}") from None
    return run_
