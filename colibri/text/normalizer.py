"""Normaliser programs: a tokenizer.json `Sequence` of `Strip`, `Replace`
(a string or a regex), `Prepend`, `Lowercase` and `Precompiled` (after an
optional NFC or NFKC) -> the steps the TOKENIZER section stores (FORMAT.md 7.4), and the
reference that applies them (tokenizers 0.23's NormalizedString::strip,
replace, prepend, lowercase). src/tokenizer.c norm_program applies the same
steps to the same words.

The two shapes older files carry are not programs and stay as they were:
NFC or NFKC alone (a flag), and SentencePiece's Prepend("▁") + Replace(" ",
"▁") (flags F_SP_PREPEND and the SentencePiece model's ▁ for space).

Words of a program (u32, the file's byte order), extension kind EXT_NORM:
  n (1..MAX_STEPS), then n x {op | arg << 8, offset, n_prog, n_content},
  and at each offset (a word index) n_prog program words (tokregex) then
  n_content code points.
  op STRIP: arg bit 0 left, bit 1 right (n_prog = n_content = 0);
  op REPLACE: a program (the pattern) and its content (may be empty);
  op PREPEND: the content (n_prog = 0, n_content >= 1);
  op LOWERCASE: nothing; the section's EXT_LOWER map says what each
  code point becomes (Rust's char::to_lowercase, one or two code points).
  op PRECOMPILED: nothing; the section's EXT_CHARSMAP (SentencePiece's
  compiled map) and EXT_GRAPHEMES (the clusters it is applied to) say what
  it does (colibri/text/precompiled.py, FORMAT.md 7.5). At most one.
"""
from __future__ import annotations

import base64
import functools
import json

from . import tokregex as R
from .precompiled import Precompiled

OP_STRIP, OP_REPLACE, OP_PREPEND, OP_LOWERCASE, OP_PRECOMPILED = 1, 2, 3, 4, 5
OP_NAMES = {OP_STRIP: "Strip", OP_REPLACE: "Replace", OP_PREPEND: "Prepend",
            OP_LOWERCASE: "Lowercase", OP_PRECOMPILED: "Precompiled"}
MAX_STEPS = 8
MAX_CONTENT = 64                # code points of a Replace or Prepend content
SP_SPACE = "\u2581"


class UnsupportedNormalizer(ValueError):
    """A normaliser (or a combination) no program expresses; the message
    names it."""


class BadProgram(ValueError):
    """Program words that fail the reader's checks."""


# A step is a tuple (op, arg, program words, content str); a Precompiled
# step holds its Precompiled (the map and its grapheme table) in place of
# the program words.


def type_of(obj) -> str:
    """A tokenizer.json component's "type" (its repr when it is no object)."""
    return obj.get("type", "?") if isinstance(obj, dict) else repr(obj)


_type = type_of


def _flatten(norm) -> list:
    if _type(norm) != "Sequence":
        return [norm]
    items = norm.get("normalizers")
    if not isinstance(items, list):
        raise UnsupportedNormalizer("normalizer Sequence without a list")
    return [x for n in items for x in _flatten(n)]


def _content(s, what: str) -> str:
    if not isinstance(s, str) or len(s) > MAX_CONTENT:
        raise UnsupportedNormalizer(f"{what}: content {s!r:.40} (a string of at most "
                                    f"{MAX_CONTENT} characters)")
    return s


def _step(n) -> tuple:
    t = _type(n)
    if t == "Strip":
        left, right = n.get("strip_left", True), n.get("strip_right", True)
        return (OP_STRIP, int(bool(left)) | int(bool(right)) << 1, [], "")
    if t == "Prepend":
        s = _content(n.get("prepend"), "Prepend")
        if not s:
            raise UnsupportedNormalizer("Prepend of the empty string")
        return (OP_PREPEND, 0, [], s)
    if t == "Lowercase":
        return (OP_LOWERCASE, 0, [], "")
    if t == "Replace":
        pat = n.get("pattern")
        content = _content(n.get("content"), "Replace")
        try:
            if isinstance(pat, dict) and isinstance(pat.get("Regex"), str):
                return (OP_REPLACE, 0, R.compile_regex(pat["Regex"]), content)
            if isinstance(pat, dict) and isinstance(pat.get("String"), str):
                return (OP_REPLACE, 0, R.compile_literal(pat["String"]), content)
        except R.UnsupportedRegex as exc:
            raise UnsupportedNormalizer(f"normalizer Replace: {exc}") from None
        raise UnsupportedNormalizer(f"normalizer Replace pattern {json.dumps(pat)[:60]}")
    if t == "Precompiled":
        raw = n.get("precompiled_charsmap")
        try:
            data = bytes(raw) if isinstance(raw, list) else base64.b64decode(raw, validate=True)
            return (OP_PRECOMPILED, 0, Precompiled(data), "")
        except (TypeError, ValueError) as exc:     # binascii.Error is a ValueError
            raise UnsupportedNormalizer(f"normalizer Precompiled: its precompiled_charsmap is "
                                        f"not a SentencePiece character map ({exc})") from None
    if t in ("NFC", "NFKC"):
        raise UnsupportedNormalizer(f"normalizer {t} after another normaliser (NFC and NFKC "
                                    "are supported first in a Sequence)")
    raise UnsupportedNormalizer(f"normalizer {t} ({json.dumps(n)[:80]}): NFC, NFKC, Strip, "
                                "Replace, Prepend, Lowercase and their Sequences are "
                                "supported")


def parse(norm) -> tuple[str, list, bool]:
    """A tokenizer.json normalizer -> (unicode form: "", "NFC" or "NFKC";
    the program's steps; whether a step writes ▁ for space, which makes
    the text SentencePiece-style). The caller keeps the older shapes (see
    the module's text) before calling this."""
    if norm is None:
        return "", [], False
    items = _flatten(norm)
    form = ""
    if items and _type(items[0]) in ("NFC", "NFKC"):
        form = _type(items[0])
        items = items[1:]
    steps = [_step(n) for n in items]
    if sum(st[0] == OP_PRECOMPILED for st in steps) > 1:
        raise UnsupportedNormalizer("normalizer Sequence with two Precompiled maps")
    if len(steps) > MAX_STEPS:
        raise UnsupportedNormalizer(f"normalizer Sequence of {len(steps)} steps (at most "
                                    f"{MAX_STEPS})")
    sp = any(op == OP_REPLACE and prog == R.compile_literal(" ") and content == SP_SPACE
             for op, _, prog, content in steps)
    return form, steps, sp


def name(steps) -> str:
    """'Strip(right), Replace(regex), ...' for the converter's line."""
    out = []
    for op, arg, prog, content in steps:
        if op == OP_STRIP:
            out.append("Strip(" + "+".join(s for s, b in (("left", 1), ("right", 2))
                                          if arg & b) + ")")
        elif op == OP_REPLACE:
            out.append("Replace")
        else:
            out.append(OP_NAMES[op])
    return ", ".join(out)


# --- the reference ------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def lower_map() -> dict[int, str]:
    """Every code point whose lowercase differs from it -> that lowercase
    (this Python's str.lower of the one character: the simple and the
    unconditional special mappings, what Rust's char::to_lowercase gives;
    U+0130 is the one of two code points)."""
    out = {}
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        lc = chr(cp).lower()
        if lc != chr(cp):
            out[cp] = lc
    return out


def lower_words() -> list[int]:
    """EXT_LOWER: {cp, first, second or 0} for each entry of lower_map, by cp."""
    words = []
    for cp, lc in sorted(lower_map().items()):
        assert 1 <= len(lc) <= 2
        words += [cp, ord(lc[0]), ord(lc[1]) if len(lc) > 1 else 0]
    return words


def apply(steps, t: str, lower: dict[int, str] | None = None) -> str:
    """The normalised text of one run (between added tokens); lower: the
    lowercase map (a section's, as read; default lower_map())."""
    for op, arg, prog, content in steps:
        if op == OP_STRIP:
            a, z = 0, len(t)
            if arg & 1:
                while a < z and R.is_white_space(ord(t[a])):
                    a += 1
            if arg & 2:
                while z > a and R.is_white_space(ord(t[z - 1])):
                    z -= 1
            t = t[a:z]
        elif op == OP_PREPEND:
            t = content + t if t else t
        elif op == OP_LOWERCASE:
            lm = lower_map() if lower is None else lower
            t = "".join(lm.get(ord(c), c) for c in t)
        elif op == OP_PRECOMPILED:
            t = prog.apply(t)
        else:
            out, prev = [], 0
            for s, e in R.find_iter(prog, t, 0, len(t)):
                out += [t[prev:s], content]
                prev = e
            t = "".join(out) + t[prev:]
    return t


# --- the words ----------------------------------------------------------------
def pack(steps) -> list[int]:
    head, body = [len(steps)], []
    base = 1 + 4 * len(steps)
    for op, arg, prog, content in steps:
        words = [] if op == OP_PRECOMPILED else list(prog)
        head += [op | arg << 8, base + len(body), len(words), len(content)]
        body += words + [ord(c) for c in content]
    return head + body


def unpack(words: list[int], precompiled: Precompiled | None = None) -> list:
    """Program words -> steps, with every check src/tokenizer.c
    check_norm makes; BadProgram names the first that fails. precompiled:
    the section's map, for its step (one exactly when it has the map)."""
    if not words or not 1 <= words[0] <= MAX_STEPS or len(words) < 1 + 4 * words[0]:
        raise BadProgram(f"{words[0] if words else 0} normaliser steps")
    n = words[0]
    steps = []
    for k in range(n):
        mode, off, n_prog, n_content = words[1 + 4 * k:5 + 4 * k]
        op, arg = mode & 0xFF, mode >> 8
        shape_ok = {OP_STRIP: arg <= 3 and not n_prog and not n_content,
                    OP_REPLACE: not arg and 1 <= n_prog <= R.MAX_PROGRAM_WORDS,
                    OP_PREPEND: not arg and not n_prog and n_content >= 1,
                    OP_LOWERCASE: not arg and not n_prog and not n_content,
                    OP_PRECOMPILED: not arg and not n_prog and not n_content}.get(op, False)
        if not shape_ok or n_content > MAX_CONTENT or off < 1 + 4 * n or \
                off + n_prog + n_content > len(words):
            raise BadProgram(f"normaliser step {k}")
        prog = list(words[off:off + n_prog])
        if n_prog:
            try:
                R.check_program(prog)
            except ValueError as exc:
                raise BadProgram(f"normaliser step {k}: {exc}") from None
        cps = words[off + n_prog:off + n_prog + n_content]
        if any(c > 0x10FFFF or 0xD800 <= c < 0xE000 for c in cps):
            raise BadProgram(f"normaliser step {k}: content is not Unicode scalar values")
        steps.append((op, arg, precompiled if op == OP_PRECOMPILED else prog,
                      "".join(map(chr, cps))))
    if sum(st[0] == OP_PRECOMPILED for st in steps) != (precompiled is not None):
        raise BadProgram("a Precompiled step without the character map, a map without "
                         "the step, or two such steps")
    return steps


def read_lower(words) -> dict[int, str]:
    """EXT_LOWER's words -> the map, with the checks src/tokenizer.c
    check_norm makes (sorted code points, each to one or two scalar values)."""
    if len(words) % 3:
        raise BadProgram("the lowercase map is not whole entries")
    prev, out = -1, {}
    for i in range(0, len(words), 3):
        cp, a, b = words[i:i + 3]
        if cp <= prev or any(c > 0x10FFFF or 0xD800 <= c < 0xE000 for c in (cp, a, b)) \
                or not a:
            raise BadProgram(f"lowercase map entry {i // 3}")
        out[cp] = chr(a) + (chr(b) if b else "")
        prev = cp
    return out
