"""`scons target=X run`: run the firmware once under the target's emulator
and show what it generated, for a person rather than for a comparison.

The firmware's own output (firmware/app/main.c) is machine records (logit
rows as float bits); this turns it into the prompt and the generated tokens,
as text when the prompt was given as text (byte-level models: token id =
byte value, like models/demo), and a tokens/s figure under emulation.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ColibriError
from . import emulate


def text_prompt_tokens(text: str, vocab: int | None = None) -> tuple[int, ...]:
    """The token ids of a text prompt for a byte-level model: its UTF-8
    bytes. Refuses an empty prompt and, given the vocabulary size, ids the
    model does not have."""
    ids = tuple(text.encode("utf-8"))
    if not ids:
        raise ColibriError("prompt= is empty: give some text, e.g. prompt='The Python tutorial'")
    if vocab is not None and max(ids) >= vocab:
        raise ColibriError(f"prompt= needs byte values up to {max(ids)}, the model's "
                           f"vocabulary has {vocab} ids: text prompts need a byte-level "
                           "model (vocab >= 256)")
    return ids


def bytes_text(tokens) -> str:
    """Byte-level tokens as text (invalid UTF-8 shown as U+FFFD)."""
    return bytes(t for t in tokens if 0 <= t < 256).decode("utf-8", errors="replace")


@dataclass
class Shown:
    lines: list[str]
    tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")


def run_and_show(target, firmware: str, as_text: bool) -> Shown:
    """Run `firmware` for `target` under its emulator (with its timeout) and
    describe the result. Raises ColibriError with the firmware's last lines
    when it fails."""
    r = emulate.run(target, firmware)
    if r.returncode != 0:
        tail = " / ".join((r.stdout + r.stderr).strip().splitlines()[-3:])
        raise ColibriError(f"target {target.name}: the firmware exited with status "
                           f"{r.returncode}: {tail}")
    fw = emulate.parse_firmware_output(r.stdout)
    if not fw.done:
        raise ColibriError(f"target {target.name}: the firmware's output ended before 'done'")
    lines = [f"firmware {firmware} ran: {' '.join(r.cmd)}"]
    processed = 0
    for i, p in enumerate(fw.prompts):
        processed += len(p.prompt) + max(len(p.tokens) - 1, 0)
        if as_text:
            lines += [f"prompt {i}: {bytes_text(p.prompt)!r}",
                      "generated:", bytes_text(p.prompt) + bytes_text(p.tokens)]
        else:
            lines += [f"prompt {i}: {','.join(map(str, p.prompt))}",
                      f"generated: {','.join(map(str, p.tokens))}"]
    shown = Shown(lines, processed, r.seconds)
    shown.lines.append(
        f"{processed} tokens (prefill + decode) in {r.seconds:.2f} s wall time: "
        f"{shown.tokens_per_second:.1f} tokens/s "
        + ("under emulation, emulator start-up included" if target.emulator else "native"))
    return shown
