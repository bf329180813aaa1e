"""`scons target=X run`: run the firmware once under the target's emulator
and show what it generated, for a person rather than for a comparison.

The firmware's own output (firmware/app/main.c) is machine records (logit
rows as float bits, and in text mode the text its streaming detokenizer
released); this turns it into the prompt and the generated tokens, as text
when the prompt was given as text (a model with a tokenizer: the device's
own text; a byte-level model without one: token id = byte value), and a
tokens/s figure under emulation.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import emulate
from ..errors import ColibriError
from ..text.sampling import SampleParams


def sampling_from_args(args: dict) -> SampleParams:
    """SampleParams from the scons variables temperature, top_k, top_p,
    seed, greedy (strings). Raises ColibriError naming the bad variable."""
    def num(name, conv, what):
        try:
            return conv(args.get(name, ""))
        except ValueError:
            raise ColibriError(f"{name}={args.get(name)}: give {what}") from None
    sp = SampleParams(temperature=num("temperature", float, "a number >= 0 (0: greedy)"),
                      top_k=num("top_k", int, "a whole number >= 0 (0: off)"),
                      top_p=num("top_p", float, "a number in (0, 1] (1: off)"),
                      seed=num("seed", lambda v: int(v, 0), "a whole number 0 .. 2^64-1"))
    greedy = str(args.get("greedy", "0")).lower()
    if greedy not in ("0", "1", "", "no", "yes", "false", "true", "off", "on"):
        raise ColibriError(f"greedy={args.get('greedy')}: give 0 or 1")
    if greedy in ("1", "yes", "true", "on"):
        sp.temperature = 0.0
    if not 0 <= sp.seed < 2 ** 64:
        raise ColibriError(f"seed={args.get('seed')}: give a whole number 0 .. 2^64-1")
    if not 0.0 < sp.top_p <= 1.0:
        raise ColibriError(f"top_p={args.get('top_p')}: give a number in (0, 1] (1: off)")
    try:
        sp.check()
    except ValueError as exc:
        raise ColibriError(str(exc).replace(" = ", "=")) from None
    return sp


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


def run_and_show(target, firmware: str, as_text: bool, text: str = "") -> Shown:
    """Run `firmware` for `target` under its emulator (with its timeout) and
    describe the result; `text`: the prompt as given (shown before the
    device's generated text). Raises ColibriError with the firmware's last
    lines when it fails."""
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
        if as_text and p.text_chunks:
            lines += [f"prompt {i} (tokenised on the device): "
                      f"{','.join(map(str, p.prompt))}",
                      "generated:", text + p.text.decode("utf-8", errors="replace")]
        elif as_text:
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
