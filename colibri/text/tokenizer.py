"""Tokenizers in the .colibri file: Hugging Face `tokenizer.json` -> the
TOKENIZER section (docs/FORMAT.md section 7), and a tokenizer that reads that
section back (`Tokenizer.from_file`).

Two kinds are understood, the ones the supported model families ship:

- byte-level BPE with the GPT-2 pre-tokenizer regex (`ByteLevel` with
  `use_regex`), or with the Qwen2 / Llama-3 regex (`Split` + `ByteLevel`
  without regex): Qwen2/3, OLMoE, Granite;
- SentencePiece-style BPE: `▁` for spaces (the `Prepend`+`Replace`
  normaliser, or a `Metaspace` pre-tokenizer that does the same) with byte
  fallback (`<0xNN>` pieces): Mixtral, Llama 2, Mistral.

Anything else raises `UnsupportedTokenizer` naming the part it does not
understand; `colibri convert` then writes the model without a tokenizer and
prints one warning line (the weights are still usable with token ids).

This module never imports the `tokenizers` package: that package is only the
tests' judge. The algorithms below follow `tokenizers` 0.23 (Rust):
`AddedVocabulary::extract_and_normalize`, the pre-tokenizer regexes as
Oniguruma matches them, `BPE::merge_word` and `Word::merge_all`, and the
decoders `ByteLevel`, `Replace`, `ByteFallback`, `Fuse`, `Strip`. The C
tokenizer (src/tokenizer.c) implements the same steps over the same section.
"""
from __future__ import annotations

import functools
import heapq
import json
import math
import struct
import unicodedata
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from . import grapheme, json_number, normalizer, precompiled, tokregex
from ..errors import ColibriError, FormatError
from ..file.format import KIND_TOKENIZER  # the section's table kind (optional, never CRITICAL)

# --- the section (docs/FORMAT.md section 7) ---------------------------------
SECTION_MAGIC = b"CTOK"
SECTION_VERSION = 1             # written when the pre-tokenizer is one of pretok 0..3
SECTION_VERSION_PROGRAM = 2     # ... else: the Split steps' programs are stored
SECTION_VERSION_UNIGRAM = 3     # extensions (Unigram scores, NFKC map) or a flag of bit 10..15
SECTION_HEADER_SIZE = 96

MODEL_BYTE_LEVEL = 1            # byte-level BPE
MODEL_SENTENCEPIECE = 2         # SentencePiece-style BPE (▁, byte fallback)
MODEL_UNIGRAM = 3               # version 3: SentencePiece Unigram (T5): Viterbi over scores
MODEL_NAMES = {MODEL_BYTE_LEVEL: "byte-level BPE", MODEL_SENTENCEPIECE: "SentencePiece BPE",
               MODEL_UNIGRAM: "Unigram"}

PRETOK_NONE = 0                 # the whole (normalised) text is one word
PRETOK_GPT2 = 1                 # GPT-2 regex (ByteLevel use_regex=true)
PRETOK_QWEN2 = 2                # Qwen2 regex: digits one by one
PRETOK_LLAMA3 = 3               # Llama-3 regex: digits in runs of up to 3
PRETOK_PROGRAM = 4              # version 2: Split steps with stored regex programs
PRETOK_NAMES = {PRETOK_NONE: "none", PRETOK_GPT2: "GPT-2 regex", PRETOK_QWEN2: "Qwen2 regex",
                PRETOK_LLAMA3: "Llama-3 regex"}

# Section header flags.
F_ADD_PREFIX_SPACE = 1 << 0     # byte-level: a space before text not starting with one
F_IGNORE_MERGES = 1 << 1        # a word found whole in the vocabulary is one token
F_BYTE_FALLBACK = 1 << 2        # an unknown character becomes its <0xNN> pieces
F_FUSE_UNK = 1 << 3             # consecutive unknown characters give one unk
F_SP_PREPEND = 1 << 4           # SentencePiece: ▁ before each non-empty text run
F_SP_PREPEND_FIRST = 1 << 5     # ... only before the run at the start of the text
F_SP_STRIP = 1 << 6             # decoding drops one leading space
F_SP_PREPEND_UNLESS = 1 << 7    # ... but not before a run that starts with ▁ (Metaspace)
F_TEMPLATE_BOS = 1 << 8         # the post-processor puts bos first (add_special_tokens)
F_NFC = 1 << 9                  # version 2: each text run is NFC-normalised first
# Version 3 (the Metaspace and T5 shapes; FORMAT.md section 7.3):
F_SP_SPLIT = 1 << 10            # Metaspace split: a word is cut before each ▁
F_WS_SPLIT = 1 << 11            # WhitespaceSplit first: words are the runs of non-space
F_DEC_METASPACE = 1 << 12       # decoder Metaspace: ▁ -> space, no byte fallback
F_DEC_DROP_FIRST = 1 << 13      # ... and the first token loses every ▁ (scheme not never)
F_TEMPLATE_EOS = 1 << 14        # the post-processor puts eos last (T5's "$A </s>")
F_NFKC = 1 << 15                # each text run is NFKC-normalised first (the map is stored)
F_NORM_PROG = 1 << 16           # ... then the stored normaliser program (EXT_NORM, 7.4)
KNOWN_FLAGS_V2 = (1 << 10) - 1
KNOWN_FLAGS = (1 << 17) - 1
# Version 3: the extensions at off_ext (header word reserved2): n, then
# n x {kind, offset, count, 0}; each kind at most once (FORMAT.md 7.3).
EXT_SCORES = 1                  # count n_vocab float64: the Unigram pieces' scores
EXT_NFKC_MAP = 2                # count x {cp | no_cut << 31, pool offset << 5 | length}
EXT_NFKC_POOL = 3               # count u32 code points: the maps' NFKD sequences
EXT_NORM = 4                    # count u32: the normaliser program (colibri/text/normalizer.py)
EXT_LOWER = 5                   # count u32, 3 a code point: {cp, lowercase, second or 0}
EXT_CHARSMAP = 6                # count bytes: a Precompiled step's map, as SentencePiece wrote it
EXT_GRAPHEMES = 7               # count u32: the grapheme cluster table it is applied with
EXT_UNITS = {EXT_SCORES: 8, EXT_NFKC_MAP: 8, EXT_NFKC_POOL: 4, EXT_NORM: 4, EXT_LOWER: 4,
             EXT_CHARSMAP: 1, EXT_GRAPHEMES: 4}
EXT_ALIGN = {EXT_SCORES: 8, EXT_NFKC_MAP: 8}    # others: 4
MAX_EXT = 7
NFKC_MAX_LEN = 18               # the longest NFKD of one code point (U+FDFA)

# Per-id flags (one byte per id).
ID_ADDED = 1 << 0               # an added token: matched in the raw text
ID_SPECIAL = 1 << 1             # ... and special (skipped by skip_special)
ID_BYTE = 1 << 2                # a <0xNN> byte-fallback piece
ID_IN_VOCAB = 1 << 3            # a piece of the BPE vocabulary (string lookup)
KNOWN_ID_FLAGS = 0x0F

NO_ID = 0xFFFFFFFF
SP_SPACE = "\u2581"             # ▁

GPT2_PATTERN = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
                r"|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLIT_PATTERNS = {QWEN2_PATTERN: PRETOK_QWEN2, LLAMA3_PATTERN: PRETOK_LLAMA3}
# tokenizers' Whitespace pre-tokenizer: words `\w+` and runs `[^\w\s]+` kept,
# whitespace removed. Its \w is Unicode's word class (Alphabetic, marks, Nd,
# Pc and Join_Control), which is not Oniguruma's \w of Split patterns (no
# Join_Control there): L M Nd Pc Nl, the circled and squared Latin letters
# (Other_Alphabetic symbols) and ZWNJ/ZWJ, as tests/test_tokenizer_program.py
# checks on every code point.
_WORD = ("\\p{L}\\p{M}\\p{Nd}\\p{Pc}\\p{Nl}\u24b6-\u24e9\U0001f130-\U0001f149"
         "\U0001f150-\U0001f169\U0001f170-\U0001f189\u200c\u200d")
WHITESPACE_PATTERN = f"[{_WORD}]+|[^{_WORD}\\s]+"

# Limits that keep a hostile tokenizer.json or section from exhausting memory.
MAX_VOCAB = 1 << 22
MAX_PIECE_BYTES = 1 << 16
MAX_UNIGRAM_PIECE_BYTES = 255   # the C Viterbi keeps one byte per position for the way back


class TokenizerError(ColibriError):
    """A tokenizer cannot be read (a damaged section, a malformed
    tokenizer.json) or an input cannot be tokenised."""


class UnsupportedTokenizer(TokenizerError):
    """tokenizer.json uses a model, normaliser, pre-tokenizer or decoder this
    runtime does not implement; the message names it."""


# --- byte-level alphabet (GPT-2's bytes_to_unicode) -------------------------
def _bytes_to_unicode() -> dict[int, str]:
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


BYTE_TO_CHAR = _bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}

# Unicode White_Space: what Oniguruma's \s matches in `tokenizers`' regexes
# (not str.isspace, which also takes U+001C..U+001F).
WHITE_SPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004"
                        "\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f"
                        "\u205f\u3000")


# \p{L} and \p{N} as `tokenizers`' Oniguruma has them (Unicode 16.0; Python
# 3.11's unicodedata is 14.0): the generated General_Category table, the same
# as the C tokenizer's.
_L_MASK = tokregex.GC_MASKS["L"]
_N_MASK = tokregex.GC_MASKS["N"]


def _is_l(c: str) -> bool:
    return bool(_L_MASK >> tokregex.gc_of(ord(c)) & 1)


def _is_n(c: str) -> bool:
    return bool(_N_MASK >> tokregex.gc_of(ord(c)) & 1)


def _is_s(c: str) -> bool:
    return c in WHITE_SPACE


# --- the pre-tokenizer regexes, matched by hand -----------------------------
# Each function returns the end of the match that the regex's leftmost
# alternative gives at position i (the regexes match every character, so
# there is always one). The C tokenizer has the same functions.
_CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")


def _contraction(t: str, i: int, fold: bool) -> int:
    if t[i] != "'":
        return 0
    for c in _CONTRACTIONS:
        seg = t[i + 1:i + 1 + len(c)]
        if len(seg) != len(c):
            continue
        if fold:
            # (?i): ASCII case, and U+017F LONG S folds to s.
            seg = seg.lower().replace("\u017f", "s") if all(
                ord(ch) < 128 or ch == "\u017f" for ch in seg) else ""
        if seg == c:
            return i + 1 + len(c)
    return 0


def _ws_tail(t: str, i: int) -> int:
    """`\\s+(?!\\S)|\\s+` at i (t[i] is whitespace)."""
    j = i
    while j < len(t) and _is_s(t[j]):
        j += 1
    if j == len(t) or j - i == 1:
        return j
    return j - 1


def _match_gpt2(t: str, i: int) -> int:
    e = _contraction(t, i, fold=False)
    if e:
        return e
    n = len(t)
    k = i + 1 if t[i] == " " and i + 1 < n else i
    for cls in (_is_l, _is_n):
        if cls(t[k]):
            j = k + 1
            while j < n and cls(t[j]):
                j += 1
            return j
    if not (_is_s(t[k]) or _is_l(t[k]) or _is_n(t[k])):
        j = k + 1
        while j < n and not (_is_s(t[j]) or _is_l(t[j]) or _is_n(t[j])):
            j += 1
        return j
    return _ws_tail(t, i)


def _match_qwen(t: str, i: int, digits: int) -> int:
    e = _contraction(t, i, fold=True)
    if e:
        return e
    n = len(t)
    c = t[i]
    # [^\r\n\p{L}\p{N}]?\p{L}+
    k = i
    if c not in "\r\n" and not _is_l(c) and not _is_n(c) and i + 1 < n and _is_l(t[i + 1]):
        k = i + 1
    if _is_l(t[k]):
        j = k + 1
        while j < n and _is_l(t[j]):
            j += 1
        return j
    # \p{N} or \p{N}{1,3}
    if _is_n(c):
        j = i + 1
        while j < n and j - i < digits and _is_n(t[j]):
            j += 1
        return j
    # ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    k = i + 1 if c == " " and i + 1 < n else i
    if not (_is_s(t[k]) or _is_l(t[k]) or _is_n(t[k])):
        j = k + 1
        while j < n and not (_is_s(t[j]) or _is_l(t[j]) or _is_n(t[j])):
            j += 1
        while j < n and t[j] in "\r\n":
            j += 1
        return j
    # \s*[\r\n]+ : through the last \r or \n of the whitespace run
    j, last_nl = i, -1
    while j < n and _is_s(t[j]):
        if t[j] in "\r\n":
            last_nl = j
        j += 1
    if last_nl >= 0:
        return last_nl + 1
    return _ws_tail(t, i)


def pre_tokenize(kind: int, text: str) -> list[str]:
    if kind == PRETOK_NONE:
        return [text] if text else []
    out, i = [], 0
    while i < len(text):
        if kind == PRETOK_GPT2:
            j = _match_gpt2(text, i)
        else:
            j = _match_qwen(text, i, 1 if kind == PRETOK_QWEN2 else 3)
        out.append(text[i:j])
        i = j
    return out


# --- what the section holds -------------------------------------------------
@dataclass
class TokenizerSpec:
    """Everything the section stores (FORMAT.md section 7), as Python values."""
    model: int
    pretok: int
    flags: int
    pieces: list[str]                       # by id; "" for an unused id
    id_flags: list[int]
    merges: list[tuple[int, int, int]]      # (left, right, result) by rank
    unk_id: int = -1
    bos_id: int = -1
    eos_id: int = -1
    added: list[int] = field(default_factory=list)   # ids, in tokenizer.json order
    # pretok PRETOK_PROGRAM: [(behavior, invert, program words)] applied in order
    steps: list = field(default_factory=list)
    what: str = ""          # one line for the converter: the components stored
    scores: list = field(default_factory=list)   # Unigram: a float per id (0.0 if unused)
    # F_NORM_PROG: the normaliser program's steps (colibri/text/normalizer.py)
    norm: list = field(default_factory=list)
    lower: dict | None = None   # a section's lowercase map as read (None: normalizer's own)
    # pretok PRETOK_PROGRAM: steps from this index on match over ByteLevel's
    # byte alphabet (a ByteLevel between the steps, Falcon's); -1 none
    bytes_from: int = -1


def describe(spec: TokenizerSpec) -> str:
    """One line for `colibri info`: the model, ids, merges, normaliser,
    pre-tokenizer and special ids of a section."""
    parts = [f"{MODEL_NAMES.get(spec.model, spec.model)}, {len(spec.pieces)} ids"
             + (f", {len(spec.merges)} merges" if spec.model != MODEL_UNIGRAM else "")]
    if spec.flags & F_NFC:
        parts.append("NFC")
    if spec.flags & F_NFKC:
        parts.append("NFKC")
    if spec.norm:
        parts.append(f"normaliser {normalizer.name(spec.norm)}")
    if spec.flags & F_WS_SPLIT:
        parts.append("WhitespaceSplit")
    if spec.flags & F_SP_SPLIT:
        parts.append("Metaspace split")
    if spec.pretok == PRETOK_PROGRAM:
        parts.append(f"{len(spec.steps)} stored pre-tokenizer step"
                     f"{'s' if len(spec.steps) != 1 else ''}")
    elif spec.pretok != PRETOK_NONE:
        parts.append(PRETOK_NAMES.get(spec.pretok, f"pre-tokenizer {spec.pretok}"))
    if spec.added:
        parts.append(f"{len(spec.added)} added tokens")
    parts += [f"{name} {i}" for name, i in (("bos", spec.bos_id), ("eos", spec.eos_id),
                                             ("unk", spec.unk_id)) if i >= 0]
    if spec.flags & F_TEMPLATE_EOS:
        parts.append("template appends eos")
    return ", ".join(parts)


def _req(obj, key, what):
    if not isinstance(obj, dict) or key not in obj:
        raise TokenizerError(f"tokenizer.json: {what} has no {key!r}")
    return obj[key]


_type = normalizer.type_of


def _parse_normalizer(norm) -> tuple[bool, int, list]:
    """-> (SentencePiece-style: spaces are ▁; flags; normaliser program).
    The shapes of older files stay flags: NFC or NFKC alone, and
    SentencePiece's Prepend(▁) + Replace(' ', ▁); any other Sequence of
    NFC / NFKC (first), Strip, Replace, Prepend and Lowercase is a program."""
    if norm is None:
        return False, 0, []
    items = norm.get("normalizers") if _type(norm) == "Sequence" else [norm]
    if not isinstance(items, list):
        raise UnsupportedTokenizer("normalizer Sequence without a list")
    types = [_type(n) for n in items]
    for name, flag in (("NFC", F_NFC), ("NFKC", F_NFKC)):
        if types == [name]:
            return False, flag, []
    if (types in (["Replace"], ["Prepend", "Replace"]) and items[-1].get("pattern") ==
            {"String": " "} and items[-1].get("content") == SP_SPACE and
            (len(items) == 1 or items[0].get("prepend") == SP_SPACE)):
        return True, F_SP_PREPEND if len(items) == 2 else 0, []
    if not items:
        return False, 0, []
    try:
        form, steps, sp = normalizer.parse(norm)
    except normalizer.UnsupportedNormalizer as exc:
        raise UnsupportedTokenizer(str(exc)) from None
    flags = {"": 0, "NFC": F_NFC, "NFKC": F_NFKC}[form]
    return sp, flags | (F_NORM_PROG if steps else 0), steps


def _flatten(pre) -> list:
    if _type(pre) == "Sequence":
        items = pre.get("pretokenizers")
        if not isinstance(items, list):
            raise UnsupportedTokenizer("pre-tokenizer Sequence without a list")
        return [x for p in items for x in _flatten(p)]
    return [pre]


def _split_step(p) -> tuple[int, bool, list[int], str]:
    """One pre-tokenizer component -> (behavior, invert, program, name)."""
    t = _type(p)
    R = tokregex
    try:
        if t == "Split":
            pat = p.get("pattern", {})
            beh = R.BEHAVIORS.get(p.get("behavior"))
            if beh is None:
                raise UnsupportedTokenizer(f"Split behavior {p.get('behavior')!r}")
            if isinstance(pat, dict) and isinstance(pat.get("Regex"), str):
                return beh, bool(p.get("invert")), R.compile_regex(pat["Regex"]), "Split"
            if isinstance(pat, dict) and isinstance(pat.get("String"), str):
                return beh, bool(p.get("invert")), R.compile_literal(pat["String"]), "Split"
            raise UnsupportedTokenizer(f"Split pattern {json.dumps(pat)[:60]}")
        if t == "Digits":
            beh = R.B_ISOLATED if p.get("individual_digits") else R.B_CONTIGUOUS
            return beh, False, R.single_class(R.N_ITEMS), "Digits"
        if t == "Punctuation":
            beh = R.BEHAVIORS.get(p.get("behavior", "Isolated"))
            if beh is None:
                raise UnsupportedTokenizer(f"Punctuation behavior {p.get('behavior')!r}")
            return beh, False, R.single_class(R.PUNCT_ITEMS), "Punctuation"
        if t == "WhitespaceSplit":
            return R.B_REMOVED, False, R.single_class(R.SPACE_ITEMS), "WhitespaceSplit"
        if t == "Whitespace":     # Split(Invert(word+ | [^word\s]+), Removed)
            return R.B_REMOVED, True, R.compile_regex(WHITESPACE_PATTERN), "Whitespace"
        if t == "ByteLevel":
            return R.B_ISOLATED, False, R.compile_regex(GPT2_PATTERN), "ByteLevel regex"
    except R.UnsupportedRegex as exc:
        raise UnsupportedTokenizer(f"pre-tokenizer {t}: {exc}") from None
    raise UnsupportedTokenizer(f"pre-tokenizer {t}: only Split, Digits, Punctuation, "
                               "Whitespace, WhitespaceSplit, ByteLevel and Metaspace are "
                               "supported")


def _metaspace_scheme(m) -> str:
    """prepend_scheme, or the older add_prefix_space (true: always)."""
    if "prepend_scheme" in m:
        return m["prepend_scheme"]
    return "always" if m.get("add_prefix_space", True) else "never"


def _metaspace(m) -> tuple[int, str]:
    """A Metaspace pre-tokenizer -> (flags, prepend scheme)."""
    if m.get("replacement") != SP_SPACE:
        raise UnsupportedTokenizer(f"Metaspace replacement {m.get('replacement')!r} (only '▁')")
    scheme = _metaspace_scheme(m)
    flags = {"always": F_SP_PREPEND | F_SP_PREPEND_UNLESS,
             "first": F_SP_PREPEND | F_SP_PREPEND_FIRST | F_SP_PREPEND_UNLESS,
             "never": 0}.get(scheme)
    if flags is None:
        raise UnsupportedTokenizer(f"Metaspace prepend_scheme {scheme!r}")
    return flags | (F_SP_SPLIT if m.get("split", True) else 0), scheme


def _parse_pretok(pre, sp_norm: bool, builtin: bool = True) -> tuple[int, int, int, list, str, int]:
    """-> (model kind the pre-tokenizer implies, pretok, flags, steps, name,
    bytes_from: the first step that matches over ByteLevel's byte alphabet, or -1).
    builtin: the GPT-2 / Qwen2 / Llama-3 regexes as pretok 1..3 (a version 1
    section, as older readers read it); else as stored programs."""
    if pre is None:
        return (MODEL_SENTENCEPIECE if sp_norm else 0), PRETOK_NONE, 0, [], "none", -1
    t = _type(pre)
    if t == "ByteLevel" and pre.get("use_regex", True) and builtin:
        return MODEL_BYTE_LEVEL, PRETOK_GPT2, (F_ADD_PREFIX_SPACE
                                               if pre.get("add_prefix_space") else 0), [], \
            "ByteLevel (GPT-2 regex)", -1
    if t == "Sequence" and builtin:
        items = pre.get("pretokenizers")
        if (isinstance(items, list) and len(items) == 2 and _type(items[0]) == "Split"
                and _type(items[1]) == "ByteLevel" and not items[1].get("use_regex", True)
                and isinstance(items[0].get("pattern"), dict)
                and items[0]["pattern"].get("Regex") in SPLIT_PATTERNS
                and items[0].get("behavior") == "Isolated" and not items[0].get("invert")):
            pid = SPLIT_PATTERNS[items[0]["pattern"]["Regex"]]
            return MODEL_BYTE_LEVEL, pid, (F_ADD_PREFIX_SPACE if items[1].get("add_prefix_space")
                                           else 0), [], f"Split ({PRETOK_NAMES[pid]}) + ByteLevel", -1
    if t == "Metaspace":
        flags, scheme = _metaspace(pre)
        return MODEL_SENTENCEPIECE, PRETOK_NONE, flags, [], f"Metaspace ({scheme})", -1
    if t == "Sequence" and [_type(c) for c in _flatten(pre)] == ["WhitespaceSplit", "Metaspace"]:
        # T5 / Switch: words are the runs of non-whitespace, each with its ▁.
        flags, scheme = _metaspace(_flatten(pre)[1])
        if flags & F_SP_PREPEND_FIRST:
            raise UnsupportedTokenizer("Metaspace prepend_scheme 'first' after WhitespaceSplit")
        return MODEL_SENTENCEPIECE, PRETOK_NONE, flags | F_WS_SPLIT, [], \
            f"WhitespaceSplit + Metaspace ({scheme})", -1
    # The general case: Split steps and one ByteLevel (the byte mapping).
    comps = _flatten(pre)
    known = ("Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit", "ByteLevel",
             "Metaspace")
    for c in comps:
        if _type(c) not in known:
            raise UnsupportedTokenizer(f"pre-tokenizer {_type(c)}: only Split, Digits, "
                                       "Punctuation, Whitespace, WhitespaceSplit, ByteLevel "
                                       "and Metaspace are supported")
    types = [_type(c) for c in comps]
    if types.count("ByteLevel") != 1 or "Metaspace" in types:
        raise UnsupportedTokenizer(f"pre-tokenizer {types}: a byte-level tokenizer with one "
                                   "ByteLevel (and no Metaspace) is supported")
    at = types.index("ByteLevel")
    bl = comps[at]
    flags = 0
    if bl.get("add_prefix_space"):
        if len(comps) > 1:
            raise UnsupportedTokenizer("ByteLevel add_prefix_space next to other pre-tokenizers "
                                       "(a space before every piece)")
        flags = F_ADD_PREFIX_SPACE
    # Components after a ByteLevel see its byte alphabet (Falcon's Digits and
    # Split): steps from bytes_from on match over one character a byte.
    steps, names, bytes_from = [], [], -1
    for k, c in enumerate(comps):
        if k == at and not bl.get("use_regex", True):
            continue
        if k > at and bytes_from < 0:
            bytes_from = len(steps)
        beh, inv, prog, name = _split_step(c)
        steps.append((beh, inv, prog))
        names.append(name)
    if not steps:
        raise UnsupportedTokenizer("ByteLevel pre-tokenizer without a regex and without "
                                   "a Split before it")
    if len(steps) > 8:
        raise UnsupportedTokenizer(f"pre-tokenizer of {len(steps)} steps (at most 8)")
    what = " + ".join(names) + (" + ByteLevel" if bytes_from < 0 else  # between the steps:
                                f" (the last {len(names) - bytes_from} over ByteLevel's "
                                "byte alphabet)")
    return MODEL_BYTE_LEVEL, PRETOK_PROGRAM, flags, steps, what + " (stored regex programs)", \
        bytes_from


def _parse_decoder(dec, model: int) -> int:
    t = _type(dec)
    if model == MODEL_BYTE_LEVEL:
        if t != "ByteLevel":
            raise UnsupportedTokenizer(f"decoder {t} for a byte-level BPE (ByteLevel expected)")
        return 0
    if t == "Metaspace":
        if dec.get("replacement") != SP_SPACE:
            raise UnsupportedTokenizer(f"decoder Metaspace replacement {dec.get('replacement')!r}")
        scheme = _metaspace_scheme(dec)
        if scheme not in ("always", "first", "never"):
            raise UnsupportedTokenizer(f"decoder Metaspace prepend_scheme {scheme!r}")
        return F_DEC_METASPACE | (F_DEC_DROP_FIRST if scheme != "never" else 0)
    items = dec.get("decoders") if t == "Sequence" else [dec]
    types = [_type(d) for d in items or []]
    want = ["Replace", "ByteFallback", "Fuse"]
    strip = 0
    if types == want + ["Strip"]:
        s = items[3]
        if s.get("content") != " " or s.get("start") != 1 or s.get("stop") != 0:
            raise UnsupportedTokenizer(f"decoder Strip {json.dumps(s)}")
        strip = F_SP_STRIP
    elif types != want:
        raise UnsupportedTokenizer(f"decoder Sequence {types}: Replace, ByteFallback, Fuse "
                                   "(and Strip) expected")
    r = items[0]
    if r.get("pattern") != {"String": SP_SPACE} or r.get("content") != " ":
        raise UnsupportedTokenizer(f"decoder Replace {json.dumps(r)}")
    return strip


def _merge_pair(m) -> tuple[str, str]:
    if isinstance(m, str):
        parts = m.split(" ")
        if len(parts) != 2:
            raise TokenizerError(f"tokenizer.json: merge {m!r} is not two pieces")
        return parts[0], parts[1]
    if isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m):
        return m[0], m[1]
    raise TokenizerError(f"tokenizer.json: merge {m!r} is not two pieces")


def spec_from_json(tj: dict, config: dict | None = None, builtin: bool = True) -> TokenizerSpec:
    """Parse a tokenizer.json object (and optionally config.json for bos/eos
    ids) into a TokenizerSpec; raises UnsupportedTokenizer / TokenizerError."""
    if not isinstance(tj, dict):
        raise TokenizerError("tokenizer.json is not a JSON object")
    model = _req(tj, "model", "tokenizer.json")
    unigram = _type(model) == "Unigram"
    if _type(model) not in ("BPE", "Unigram"):
        raise UnsupportedTokenizer(f"model {_type(model)}: only BPE and Unigram are supported")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise UnsupportedTokenizer(f"BPE with {key} {model[key]!r}")
    if model.get("dropout") not in (None, 0, 0.0):
        raise UnsupportedTokenizer("BPE dropout (not deterministic)")
    sp_norm, flags, norm = _parse_normalizer(tj.get("normalizer"))
    kind, pretok, pflags, steps, pre_name, bytes_from = _parse_pretok(
        tj.get("pre_tokenizer"), sp_norm, builtin)
    if kind == 0:
        raise UnsupportedTokenizer("no normaliser and no pre-tokenizer")
    if kind == MODEL_BYTE_LEVEL and sp_norm:
        raise UnsupportedTokenizer("byte-level pre-tokenizer with a SentencePiece normaliser")
    if kind == MODEL_SENTENCEPIECE and sp_norm and pflags and not norm:
        raise UnsupportedTokenizer("both a ▁ normaliser and a Metaspace pre-tokenizer")
    if unigram:
        if kind != MODEL_SENTENCEPIECE:
            raise UnsupportedTokenizer("Unigram with a byte-level pre-tokenizer (a Metaspace "
                                       "pre-tokenizer or a ▁ normaliser is supported)")
        kind = MODEL_UNIGRAM
    flags |= pflags
    flags |= _parse_decoder(tj.get("decoder"), kind)
    if model.get("ignore_merges"):
        flags |= F_IGNORE_MERGES
    if model.get("byte_fallback"):
        flags |= F_BYTE_FALLBACK
    if model.get("fuse_unk"):
        flags |= F_FUSE_UNK

    vocab = _req(model, "vocab", "model")
    scores_by_piece = {}
    if unigram:
        vocab, scores_by_piece = _unigram_vocab(vocab)
    if not isinstance(vocab, dict):
        raise TokenizerError("tokenizer.json: model.vocab is not an object")
    added = tj.get("added_tokens") or []
    ids = [v for v in vocab.values()] + [a.get("id") for a in added if isinstance(a, dict)]
    if not all(isinstance(i, int) and 0 <= i < MAX_VOCAB for i in ids) or len(ids) != (
            len(vocab) + len(added)):
        raise TokenizerError(f"tokenizer.json: an id is not an integer in [0, {MAX_VOCAB})")
    n = max(ids, default=-1) + 1
    pieces = [""] * n
    id_flags = [0] * n
    for piece, i in vocab.items():
        if id_flags[i] & ID_IN_VOCAB:
            raise TokenizerError(f"tokenizer.json: id {i} appears twice in model.vocab")
        if len(piece.encode()) > MAX_PIECE_BYTES or not piece:
            raise TokenizerError(f"tokenizer.json: piece of id {i} is empty or too long")
        pieces[i] = piece
        id_flags[i] = ID_IN_VOCAB
        if (len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")
                and all(c in "0123456789ABCDEF" for c in piece[3:5])):
            id_flags[i] |= ID_BYTE
    added_ids = []
    for a in added:
        if not isinstance(a, dict) or not isinstance(a.get("content"), str) or not a["content"]:
            raise TokenizerError(f"tokenizer.json: added token {a!r} has no content")
        for opt in ("single_word", "lstrip", "rstrip"):
            if a.get(opt):
                raise UnsupportedTokenizer(f"added token {a['content']!r} with {opt}")
        if a.get("normalized") and norm:
            raise UnsupportedTokenizer(f"added token {a['content']!r} matched in the "
                                       "normalised text (normalized: true) with a "
                                       "normaliser Sequence")
        if a.get("normalized") and not a.get("special") and kind == MODEL_SENTENCEPIECE \
                and " " in a["content"]:
            raise UnsupportedTokenizer(f"normalised added token {a['content']!r} with a space")
        i = a["id"]
        if id_flags[i] & ID_IN_VOCAB and pieces[i] != a["content"]:
            raise TokenizerError(f"tokenizer.json: added token {a['content']!r} has id {i}, "
                                 f"which the vocabulary gives to {pieces[i]!r}")
        if id_flags[i] & ID_ADDED:
            raise TokenizerError(f"tokenizer.json: id {i} added twice")
        pieces[i] = a["content"]
        id_flags[i] |= ID_ADDED | (ID_SPECIAL if a.get("special") else 0)
        added_ids.append(i)
    merges = []
    seen = set()
    for m in ([] if unigram else _req(model, "merges", "model")):
        left, right = _merge_pair(m)
        if left not in vocab or right not in vocab or left + right not in vocab:
            raise TokenizerError(f"tokenizer.json: merge {left!r} {right!r}: a piece or "
                                 "the merged piece is not in the vocabulary")
        pair = (vocab[left], vocab[right])
        if pair in seen:
            raise TokenizerError(f"tokenizer.json: merge {left!r} {right!r} listed twice")
        seen.add(pair)
        merges.append((pair[0], pair[1], vocab[left + right]))
    unk = model.get("unk_token")
    unk_id = -1
    if unigram:
        # tokenizers' Unigram fails on an unknown character without an unk.
        unk_id = model.get("unk_id")
        if not isinstance(unk_id, int) or not 0 <= unk_id < len(vocab):
            raise UnsupportedTokenizer(f"Unigram unk_id {unk_id!r} (an id of the vocabulary "
                                       "is needed)")
    elif unk is not None:
        if unk not in vocab:
            raise TokenizerError(f"tokenizer.json: unk_token {unk!r} is not in the vocabulary")
        unk_id = vocab[unk]
    bos_id = eos_id = -1
    post = tj.get("post_processor")
    if _type(post) == "TemplateProcessing":
        single = post.get("single") or []
        if (len(single) == 2 and "SpecialToken" in single[0] and "Sequence" in single[1]):
            tok = single[0]["SpecialToken"].get("id")
            st = (post.get("special_tokens") or {}).get(tok, {})
            if isinstance(st.get("ids"), list) and len(st["ids"]) == 1:
                bos_id = st["ids"][0]
                flags |= F_TEMPLATE_BOS
        elif (len(single) == 2 and "Sequence" in single[0] and "SpecialToken" in single[1]):
            tok = single[1]["SpecialToken"].get("id")
            st = (post.get("special_tokens") or {}).get(tok, {})
            if (isinstance(st.get("ids"), list) and len(st["ids"]) == 1
                    and isinstance(st["ids"][0], int) and 0 <= st["ids"][0] < n):
                eos_id = st["ids"][0]
                flags |= F_TEMPLATE_EOS
    config = config or {}
    for key in ("bos_token_id", "eos_token_id"):
        v = config.get(key)
        if isinstance(v, list):
            v = v[0] if v else None
        if isinstance(v, int) and 0 <= v < n:
            if key == "bos_token_id" and bos_id < 0:
                bos_id = v
            if key == "eos_token_id" and not flags & F_TEMPLATE_EOS:
                eos_id = v
            elif key == "eos_token_id" and v != eos_id:
                raise UnsupportedTokenizer(f"the post-processor appends id {eos_id}, but the "
                                           f"config's eos_token_id is {v}")
    model_name = {MODEL_BYTE_LEVEL: "byte-level BPE", MODEL_SENTENCEPIECE:
                  "SentencePiece-style BPE", MODEL_UNIGRAM: "Unigram"}[kind]
    norm_name = _type(tj.get('normalizer')) if tj.get('normalizer') else 'none'
    if norm:
        norm_name = " + ".join(["NFC"] * bool(flags & F_NFC) + ["NFKC"] * bool(flags & F_NFKC)
                               + [normalizer.name(norm)])
    what = (f"{model_name}, {n} ids, normalizer {norm_name}"
            f", pre-tokenizer {pre_name}")
    scores = [scores_by_piece.get(pieces[i], 0.0) if id_flags[i] & ID_IN_VOCAB else 0.0
              for i in range(n)] if unigram else []
    return TokenizerSpec(kind, pretok, flags, pieces, id_flags, merges, unk_id, bos_id,
                         eos_id, added_ids, steps, what, scores, norm, bytes_from=bytes_from)


def _unigram_vocab(items) -> tuple[dict, dict]:
    """A Unigram model's vocab ([[piece, score], ...], the id is the index)
    -> ({piece: id}, {piece: score}); a score is the double `tokenizers`
    reads from the JSON number (json_number.as_tokenizers_reads)."""
    if not isinstance(items, list) or not items:
        raise TokenizerError("tokenizer.json: Unigram vocab is not a non-empty list")
    if len(items) > MAX_VOCAB:
        raise TokenizerError(f"tokenizer.json: Unigram vocab of {len(items)} pieces")
    vocab, scores = {}, {}
    for i, it in enumerate(items):
        if (not isinstance(it, list) or len(it) != 2 or not isinstance(it[0], str)
                or isinstance(it[1], bool) or not isinstance(it[1], (int, float))
                or not math.isfinite(it[1])):
            raise TokenizerError(f"tokenizer.json: Unigram vocab entry {i} is not "
                                 "[piece, finite score]")
        piece = it[0]
        if piece in vocab:
            raise TokenizerError(f"tokenizer.json: Unigram piece {piece!r} appears twice "
                                 f"(ids {vocab[piece]} and {i})")
        if len(piece.encode()) > MAX_UNIGRAM_PIECE_BYTES:
            raise UnsupportedTokenizer(f"Unigram piece {i} of {len(piece.encode())} bytes "
                                       f"(at most {MAX_UNIGRAM_PIECE_BYTES})")
        vocab[piece] = i
        try:
            # tokenizers' own parse of the number, not the nearest double: a
            # near-tie in the Viterbi search goes its way (json_number.py)
            scores[piece] = json_number.as_tokenizers_reads(it[1])
        except ValueError:
            raise TokenizerError(f"tokenizer.json: Unigram vocab entry {i}'s score is out "
                                 "of range") from None
    return vocab, scores


def spec_from_dir(model_dir: str | Path) -> TokenizerSpec | None:
    """The tokenizer of a checkpoint directory, or None without tokenizer.json."""
    d = Path(model_dir)
    path = d / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        tj = json_number.load_json(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{path}: not valid JSON: {exc}") from None
    config = {}
    if (d / "config.json").is_file():
        try:
            config = json.loads((d / "config.json").read_text(encoding="utf-8"))
        except ValueError:
            config = {}
    return spec_from_json(tj, config if isinstance(config, dict) else {})


# --- section bytes ----------------------------------------------------------
# Header: 0 magic, 4 u16 version, 6 u16 bom, then u32/i32 fields:
_HEADER_FIELDS = ("model", "pretok", "flags", "n_vocab", "n_merges", "n_added", "unk_id",
                  "bos_id", "eos_id", "off_pieces", "off_strings", "n_string_bytes",
                  "off_id_flags", "off_sorted", "n_sorted", "off_merges", "off_added",
                  "off_byte_ids", "section_size", "reserved0", "reserved1", "reserved2")
_HEADER_FMT = "4sHH" + "I" * len(_HEADER_FIELDS)
assert struct.calcsize("<" + _HEADER_FMT) == SECTION_HEADER_SIZE


def _a8(n: int) -> int:
    return (n + 7) & ~7


def _byte_piece_ids(spec: TokenizerSpec) -> list[int]:
    """For each byte value, the id of the piece that stands for it: byte-level,
    the piece of its alphabet character; SentencePiece, its <0xNN> piece."""
    lookup = {spec.pieces[i]: i for i in range(len(spec.pieces))
              if spec.id_flags[i] & ID_IN_VOCAB}
    out = []
    for b in range(256):
        key = BYTE_TO_CHAR[b] if spec.model == MODEL_BYTE_LEVEL else f"<0x{b:02X}>"
        out.append(lookup.get(key, NO_ID))
    return out


def pack_section(spec: TokenizerSpec, byte_order: str = "little") -> bytes:
    """The TOKENIZER section's bytes, integers in the file's byte order."""
    bc = "<" if byte_order == "little" else ">"
    n = len(spec.pieces)
    strings = [p.encode("utf-8") for p in spec.pieces]
    offs, pos = [], 0
    for s in strings:
        offs.append(pos)
        pos += len(s)
    offs.append(pos)
    blob = b"".join(strings)
    sorted_ids = sorted((i for i in range(n) if spec.id_flags[i] & ID_IN_VOCAB),
                        key=lambda i: strings[i])
    merges = sorted(((l, r, res, rank) for rank, (l, r, res) in enumerate(spec.merges)),
                    key=lambda m: (m[0], m[1]))
    layout = {}
    cur = SECTION_HEADER_SIZE
    for name, size in (("off_pieces", 4 * (n + 1)), ("off_strings", len(blob)),
                       ("off_id_flags", n), ("off_sorted", 4 * len(sorted_ids)),
                       ("off_merges", 16 * len(merges)), ("off_added", 4 * len(spec.added)),
                       ("off_byte_ids", 4 * 256)):
        layout[name] = cur
        cur = _a8(cur + size)
    pre_words = (tokregex.pack_steps(spec.steps, spec.bytes_from)
                 if spec.pretok == PRETOK_PROGRAM else [])
    off_pretok = cur if pre_words else 0
    cur = _a8(cur + 4 * len(pre_words))
    exts = []         # (kind, fmt, values) in the section's order
    if spec.model == MODEL_UNIGRAM:
        exts.append((EXT_SCORES, "d", spec.scores))
    if spec.flags & F_NFKC:
        nmap, pool = nfkc_map()
        exts += [(EXT_NFKC_MAP, "I", nmap), (EXT_NFKC_POOL, "I", pool)]
    if spec.flags & F_NORM_PROG:
        exts.append((EXT_NORM, "I", normalizer.pack(spec.norm)))
        if any(st[0] == normalizer.OP_LOWERCASE for st in spec.norm):
            exts.append((EXT_LOWER, "I", normalizer.lower_words()))
        for op, _, pre, _ in spec.norm:
            if op == normalizer.OP_PRECOMPILED:
                exts += [(EXT_CHARSMAP, f"{len(pre.data)}s", [pre.data]),
                         (EXT_GRAPHEMES, "I", pre.table.runs)]
    off_ext = cur if exts else 0
    if exts:
        cur = _a8(cur + 4 + 16 * len(exts))
    ext_dir = []
    for kind, fmt, vals in exts:
        size = struct.calcsize(f"<{fmt}" if kind == EXT_CHARSMAP else f"<{len(vals)}{fmt}")
        ext_dir.append((kind, cur, size // EXT_UNITS[kind]))
        cur = _a8(cur + size)
    h = dict(model=spec.model, pretok=spec.pretok, flags=spec.flags, n_vocab=n,
             n_merges=len(merges), n_added=len(spec.added),
             unk_id=spec.unk_id & 0xFFFFFFFF, bos_id=spec.bos_id & 0xFFFFFFFF,
             eos_id=spec.eos_id & 0xFFFFFFFF, n_string_bytes=len(blob),
             n_sorted=len(sorted_ids), section_size=cur, reserved0=off_pretok,
             reserved1=len(pre_words), reserved2=off_ext, **layout)
    out = bytearray(cur)
    version = (SECTION_VERSION_UNIGRAM if off_ext or spec.flags & ~KNOWN_FLAGS_V2 else
               SECTION_VERSION_PROGRAM if pre_words or spec.flags & F_NFC else SECTION_VERSION)
    struct.pack_into(bc + _HEADER_FMT, out, 0, SECTION_MAGIC, version, 0xFEFF,
                     *(h[f] for f in _HEADER_FIELDS))
    if pre_words:
        struct.pack_into(f"{bc}{len(pre_words)}I", out, off_pretok, *pre_words)
    struct.pack_into(f"{bc}{n + 1}I", out, layout["off_pieces"], *offs)
    out[layout["off_strings"]:layout["off_strings"] + len(blob)] = blob
    out[layout["off_id_flags"]:layout["off_id_flags"] + n] = bytes(spec.id_flags)
    struct.pack_into(f"{bc}{len(sorted_ids)}I", out, layout["off_sorted"], *sorted_ids)
    struct.pack_into(f"{bc}{4 * len(merges)}I", out, layout["off_merges"],
                     *(v for m in merges for v in m))
    struct.pack_into(f"{bc}{len(spec.added)}I", out, layout["off_added"], *spec.added)
    struct.pack_into(f"{bc}256I", out, layout["off_byte_ids"], *_byte_piece_ids(spec))
    if exts:
        struct.pack_into(f"{bc}I", out, off_ext, len(exts))
        for k, ((kind, fmt, vals), (_, off, count)) in enumerate(zip(exts, ext_dir)):
            struct.pack_into(f"{bc}4I", out, off_ext + 4 + 16 * k, kind, off, count, 0)
            struct.pack_into(bc + fmt if kind == EXT_CHARSMAP else f"{bc}{len(vals)}{fmt}",
                             out, off, *vals)
    return bytes(out)


@functools.lru_cache(maxsize=1)
def nfkc_map() -> tuple[tuple, tuple]:
    """The NFKC map a section stores (from this Python's unicodedata, as the
    encoder's NFKC): every code point whose NFKD differs from its NFD ->
    its NFKD, and whether text may not be cut before it (its NFKD starts
    with a combining mark or a character that composes with the one before).
    -> (map words: cp | no_cut << 31, offset << 5 | length; pool)."""
    words, pool = [], []
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        k = unicodedata.normalize("NFKD", c)
        if k == unicodedata.normalize("NFD", c):
            continue
        no_cut = bool(unicodedata.combining(k[0])) or k[0] in _seconds()
        words += [cp | (no_cut << 31), len(pool) << 5 | len(k)]
        pool += [ord(x) for x in k]
    return tuple(words), tuple(pool)


@functools.lru_cache(maxsize=1)
def _seconds() -> frozenset:
    """The characters that compose with the one before them (the second of
    a primary composite; Hangul V and T jamo): scripts/gen_unicode_norm.py's
    `seconds`."""
    out = set()
    for cp in range(0x110000):
        d = unicodedata.decomposition(chr(cp))
        if not d or d.startswith("<"):
            continue
        parts = d.split()
        if len(parts) == 2 and unicodedata.normalize(
                "NFC", chr(int(parts[0], 16)) + chr(int(parts[1], 16))) == chr(cp):
            out.add(chr(int(parts[1], 16)))
    out.update(chr(c) for c in range(0x1161, 0x1176))     # Hangul V, T jamo
    out.update(chr(c) for c in range(0x11A8, 0x11C3))
    return frozenset(out)



def _bad(msg: str) -> TokenizerError:
    return TokenizerError(f"tokenizer section: {msg}: the file is damaged or was written "
                          "by a newer colibri (re-convert it)")


def parse_section(data: bytes) -> TokenizerSpec:
    """Validate a TOKENIZER section (every offset, count and id, the checks the
    C reader makes) and return its spec. Raises TokenizerError."""
    data = bytes(data)
    if len(data) < SECTION_HEADER_SIZE:
        raise _bad(f"{len(data)} bytes, shorter than its {SECTION_HEADER_SIZE}-byte header")
    if data[:4] != SECTION_MAGIC:
        raise _bad(f"magic {data[:4]!r}, expected {SECTION_MAGIC!r}")
    if data[6:8] == b"\xff\xfe":
        bc = "<"
    elif data[6:8] == b"\xfe\xff":
        bc = ">"
    else:
        raise _bad(f"byte-order mark {data[6:8].hex()}")
    vals = struct.unpack_from(bc + _HEADER_FMT, data, 0)
    version = vals[1]
    h = dict(zip(_HEADER_FIELDS, vals[3:]))
    if version not in (SECTION_VERSION, SECTION_VERSION_PROGRAM, SECTION_VERSION_UNIGRAM):
        raise _bad(f"section version {version}, this reader reads {SECTION_VERSION} to "
                   f"{SECTION_VERSION_UNIGRAM}")
    size = len(data)
    if h["section_size"] != size:
        raise _bad(f"section_size {h['section_size']}, the table says {size}")
    if h["model"] not in (MODEL_BYTE_LEVEL, MODEL_SENTENCEPIECE, MODEL_UNIGRAM) or (
            h["model"] == MODEL_UNIGRAM and version != SECTION_VERSION_UNIGRAM):
        raise _bad(f"model kind {h['model']}")
    unigram = h["model"] == MODEL_UNIGRAM
    has_prog = version >= SECTION_VERSION_PROGRAM and h["pretok"] == PRETOK_PROGRAM
    if h["pretok"] not in (PRETOK_NONE, PRETOK_GPT2, PRETOK_QWEN2, PRETOK_LLAMA3) and not has_prog:
        raise _bad(f"pre-tokenizer {h['pretok']}")
    needs_ext = unigram or bool(h["flags"] & (F_NFKC | F_NORM_PROG))
    if h["flags"] & ~KNOWN_FLAGS or bool(h["reserved2"]) != needs_ext or (not has_prog and (
            h["reserved0"] or h["reserved1"])) or (
            h["flags"] & F_NFC and version < SECTION_VERSION_PROGRAM) or (
            h["flags"] & F_NFC and h["flags"] & F_NFKC) or (
            h["flags"] & ~KNOWN_FLAGS_V2 and version != SECTION_VERSION_UNIGRAM):
        raise _bad(f"flags 0x{h['flags']:x} or reserved fields not valid")
    n = h["n_vocab"]
    if not 1 <= n <= MAX_VOCAB:
        raise _bad(f"n_vocab {n}")

    def span(name, count, unit):
        off = h[name]
        if off % 4 or off < SECTION_HEADER_SIZE or count > size or off + count * unit > size:
            raise _bad(f"{name} {off} with {count} entries does not fit in {size} bytes")
        return off

    po = span("off_pieces", n + 1, 4)
    so = span("off_strings", h["n_string_bytes"], 1)
    fo = span("off_id_flags", n, 1)
    sorto = span("off_sorted", h["n_sorted"], 4)
    mo = span("off_merges", h["n_merges"], 16)
    ao = span("off_added", h["n_added"], 4)
    bo = span("off_byte_ids", 256, 4)
    offs = struct.unpack_from(f"{bc}{n + 1}I", data, po)
    if offs[0] != 0 or offs[-1] != h["n_string_bytes"] or any(
            offs[i] > offs[i + 1] for i in range(n)):
        raise _bad("piece offsets are not increasing within the string bytes")
    blob = data[so:so + h["n_string_bytes"]]
    try:
        pieces = [blob[offs[i]:offs[i + 1]].decode("utf-8") for i in range(n)]
    except UnicodeDecodeError:
        raise _bad("a piece is not valid UTF-8") from None
    id_flags = list(data[fo:fo + n])
    if any(f & ~KNOWN_ID_FLAGS for f in id_flags):
        raise _bad("unknown per-id flags")
    for i, f in enumerate(id_flags):
        p = pieces[i]
        if f & ID_BYTE and not (len(p) == 6 and p[:3] == "<0x" and p[5] == ">"
                                and all(c in "0123456789ABCDEF" for c in p[3:5])):
            raise _bad(f"id {i} is flagged as a byte piece but is {p!r}")

    def check_id(i, what, allow_none=False):
        if allow_none and i in (NO_ID, ):
            return
        if i >= n:
            raise _bad(f"{what} {i} is not below n_vocab {n}")

    sorted_ids = struct.unpack_from(f"{bc}{h['n_sorted']}I", data, sorto)
    for a, b in zip(sorted_ids, sorted_ids[1:]):
        check_id(a, "sorted id")
        check_id(b, "sorted id")
        if not pieces[a].encode() < pieces[b].encode():
            raise _bad("the sorted piece index is not strictly sorted")
    if set(sorted_ids) != {i for i in range(n) if id_flags[i] & ID_IN_VOCAB}:
        raise _bad("the sorted piece index does not list the vocabulary pieces")
    mflat = struct.unpack_from(f"{bc}{4 * h['n_merges']}I", data, mo)
    merges_by_rank: list = [None] * h["n_merges"]
    prev = None
    for k in range(h["n_merges"]):
        l, r, res, rank = mflat[4 * k:4 * k + 4]
        for v in (l, r, res):
            check_id(v, "merge id")
        if rank >= h["n_merges"] or merges_by_rank[rank] is not None:
            raise _bad(f"merge rank {rank} out of range or repeated")
        if prev is not None and (l, r) <= prev:
            raise _bad("merges are not sorted by pair")
        prev = (l, r)
        merges_by_rank[rank] = (l, r, res)
    added = list(struct.unpack_from(f"{bc}{h['n_added']}I", data, ao))
    for i in added:
        check_id(i, "added id")
        if not id_flags[i] & ID_ADDED or not pieces[i]:
            raise _bad(f"added id {i} is not flagged as added or has no content")
    for i in struct.unpack_from(f"{bc}256I", data, bo):
        check_id(i, "byte piece id", allow_none=True)
    signed = [v - (1 << 32) if v >= 1 << 31 else v for v in (h["unk_id"], h["bos_id"],
                                                           h["eos_id"])]
    for v, what in zip(signed, ("unk_id", "bos_id", "eos_id")):
        if not -1 <= v < n:
            raise _bad(f"{what} {v}")
    steps, bytes_from = [], -1
    if has_prog:
        off, nw = h["reserved0"], h["reserved1"]
        if off % 4 or off < SECTION_HEADER_SIZE or nw < 1 or off + 4 * nw > size:
            raise _bad("the pre-tokenizer program does not fit in the section")
        words = list(struct.unpack_from(f"{bc}{nw}I", data, off))
        steps, bytes_from = _check_steps(words)
        if bytes_from >= 0 and h["model"] != MODEL_BYTE_LEVEL:
            raise _bad("pre-tokenizer steps over the byte alphabet in a model that is not "
                       "byte-level")
    ext = _check_extensions(data, bc, h["reserved2"], n) if needs_ext else {}
    if (EXT_SCORES in ext) != unigram or (EXT_NFKC_MAP in ext) != bool(h["flags"] & F_NFKC) \
            or (EXT_NORM in ext) != bool(h["flags"] & F_NORM_PROG):
        raise _bad("the extensions do not match the model and flags")
    norm, lower, pre = [], None, None
    if EXT_NORM in ext:
        off, count = ext[EXT_NORM]
        try:
            if (EXT_CHARSMAP in ext) != (EXT_GRAPHEMES in ext):
                raise normalizer.BadProgram("a character map without its grapheme table, or "
                                            "a table without its map")
            if EXT_CHARSMAP in ext:
                (moff, msize), (goff, gcount) = ext[EXT_CHARSMAP], ext[EXT_GRAPHEMES]
                pre = precompiled.Precompiled(
                    data[moff:moff + msize], struct.unpack_from(f"{bc}{gcount}I", data, goff))
            norm = normalizer.unpack(list(struct.unpack_from(f"{bc}{count}I", data, off)), pre)
            lowers = any(st[0] == normalizer.OP_LOWERCASE for st in norm)
            if lowers != (EXT_LOWER in ext):
                raise normalizer.BadProgram("a Lowercase step without the lowercase map, "
                                            "or a map without the step")
            if lowers:
                off, count = ext[EXT_LOWER]
                lower = normalizer.read_lower(struct.unpack_from(f"{bc}{count}I", data, off))
        except (normalizer.BadProgram, precompiled.BadCharsMap, grapheme.BadTable) as exc:
            raise _bad(str(exc)) from None
    elif EXT_LOWER in ext or EXT_CHARSMAP in ext or EXT_GRAPHEMES in ext:
        raise _bad("a lowercase map, character map or grapheme table without a normaliser "
                   "program")
    scores = []
    if unigram:
        off, count = ext[EXT_SCORES]
        scores = list(struct.unpack_from(f"{bc}{n}d", data, off))
        if not all(math.isfinite(x) for x in scores):
            raise _bad("a Unigram score is not finite")
        if h["n_merges"] or signed[0] < 0 or any(
                len(p.encode()) > MAX_UNIGRAM_PIECE_BYTES
                for p, f in zip(pieces, id_flags) if f & ID_IN_VOCAB):
            raise _bad("a Unigram model with merges, without unk_id or with a piece "
                       f"over {MAX_UNIGRAM_PIECE_BYTES} bytes")
    return TokenizerSpec(h["model"], h["pretok"], h["flags"], pieces, id_flags,
                         merges_by_rank, *signed, added=added, steps=steps, scores=scores,
                         norm=norm, lower=lower, bytes_from=bytes_from)


def _check_extensions(data: bytes, bc: str, off: int, n_vocab: int) -> dict:
    """The version 3 extension directory (the checks src/tokenizer.c
    check_extensions makes) -> {kind: (offset, count)}."""
    size = len(data)
    if off % 4 or off < SECTION_HEADER_SIZE or off + 4 > size:
        raise _bad("the extension directory does not fit in the section")
    n = struct.unpack_from(f"{bc}I", data, off)[0]
    if not 1 <= n <= MAX_EXT or off + 4 + 16 * n > size:
        raise _bad(f"{n} extensions")
    out = {}
    for k in range(n):
        kind, eoff, count, zero = struct.unpack_from(f"{bc}4I", data, off + 4 + 16 * k)
        unit = EXT_UNITS.get(kind)
        if unit is None or kind in out or zero or eoff % EXT_ALIGN.get(kind, 4) or \
                eoff < SECTION_HEADER_SIZE \
                or count > size or eoff + unit * count > size:
            raise _bad(f"extension {k} (kind {kind})")
        out[kind] = (eoff, count)
    if EXT_SCORES in out and out[EXT_SCORES][1] != n_vocab:
        raise _bad("the Unigram scores are not one per id")
    if (EXT_NFKC_MAP in out) != (EXT_NFKC_POOL in out):
        raise _bad("an NFKC map without its pool, or a pool without its map")
    if EXT_NFKC_MAP in out:
        (moff, nm), (poff, npool) = out[EXT_NFKC_MAP], out[EXT_NFKC_POOL]
        words = struct.unpack_from(f"{bc}{2 * nm}I", data, moff)
        pool = struct.unpack_from(f"{bc}{npool}I", data, poff)
        prev = -1
        for i in range(nm):
            cp, at = words[2 * i] & 0x7FFFFFFF, words[2 * i + 1]
            length, start = at & 31, at >> 5
            if cp <= prev or cp > 0x10FFFF or 0xD800 <= cp < 0xE000 or words[2 * i] & 0x7FE00000 \
                    or not 1 <= length <= NFKC_MAX_LEN or start + length > npool:
                raise _bad(f"NFKC map entry {i}")
            prev = cp
        if any(c > 0x10FFFF or 0xD800 <= c < 0xE000 for c in pool):
            raise _bad("an NFKC pool value is not a Unicode scalar value")
    return out


def _check_steps(words: list[int]):
    """The checks src/tokenizer.c check_pretok makes (a program the C reader
    refuses is refused here too)."""
    R = tokregex
    n = words[0]
    if not 1 <= n <= 8 or len(words) < 1 + 4 * n:
        raise _bad(f"{n} pre-tokenizer steps")
    in_bytes = False
    for k in range(n):
        mode, off, ln, zero = words[1 + 4 * k:5 + 4 * k]
        # STEP_BYTES: once a step has it, every later one (the byte alphabet
        # stays)
        bytes_ok = bool(mode & R.STEP_BYTES) or not in_bytes
        in_bytes = bool(mode & R.STEP_BYTES)
        if mode & 0xFF > R.B_CONTIGUOUS or mode >> 8 > 3 or not bytes_ok or zero or \
                off < 1 + 4 * n or off + ln > len(words) or not 1 <= ln <= R.MAX_PROGRAM_WORDS:
            raise _bad(f"pre-tokenizer step {k}")
        try:
            R.check_program(words[off:off + ln])
        except ValueError as exc:
            raise _bad(f"pre-tokenizer step {k}: {exc}") from None
    return R.unpack_steps(words)


# --- the tokenizer ----------------------------------------------------------
class Tokenizer:
    """Encode and decode with a TokenizerSpec (normally read from a .colibri
    file by `from_file`). Ids equal `tokenizers`' for the same tokenizer.json."""

    def __init__(self, spec: TokenizerSpec):
        self.spec = spec
        self.vocab = {spec.pieces[i]: i for i in range(len(spec.pieces))
                      if spec.id_flags[i] & ID_IN_VOCAB}
        self.merges = {(l, r): (rank, res) for rank, (l, r, res) in enumerate(spec.merges)}
        self.added = [(spec.pieces[i], i) for i in spec.added]
        self.special = {i for i in range(len(spec.pieces)) if spec.id_flags[i] & ID_SPECIAL}
        self.byte_level = spec.model == MODEL_BYTE_LEVEL
        self.unigram = spec.model == MODEL_UNIGRAM
        self.trie: dict = {}     # Unigram: byte -> child; key None: the piece's id
        if self.unigram:
            for piece, i in self.vocab.items():
                node = self.trie
                for b in piece.encode("utf-8"):
                    node = node.setdefault(b, {})
                node[None] = i
            self.unk_score = min(spec.scores[i] for i in self.vocab.values()) - 10.0

    @property
    def n_vocab(self) -> int:
        return len(self.spec.pieces)

    @classmethod
    def from_file(cls, path: str | Path) -> "Tokenizer":
        from ..file import format as fmt
        cf = fmt.read_file(path)
        try:
            for e in cf.entries:
                if e.kind == KIND_TOKENIZER:
                    return cls(parse_section(bytes(cf.section(e))))
        finally:
            cf.close()
        raise TokenizerError(f"{path}: the file holds no tokenizer (convert a checkpoint "
                             "that has a tokenizer.json, or a GGUF file whose tokenizer "
                             "colibri supports: the conversion warned when it left it out; "
                             "the model still runs on token ids)")

    @classmethod
    def from_json(cls, path: str | Path, config: dict | None = None) -> "Tokenizer":
        return cls(spec_from_json(json_number.load_json(Path(path).read_text(encoding="utf-8")),
                                  config))

    # -- encode --
    def _split_added(self, text: str, parse_special: bool) -> list[tuple[str, int]]:
        """Leftmost-longest matches of the added tokens in the raw text ->
        [(segment, id or -1)]. Special tokens only when parse_special."""
        pats = [(c, i) for c, i in self.added if parse_special or i not in self.special]
        if not pats:
            return [(text, -1)] if text else []
        out, start, i = [], 0, 0
        while i < len(text):
            best = None
            for c, tid in pats:
                if text.startswith(c, i) and (best is None or len(c) > len(best[0])):
                    best = (c, tid)
            if best is None:
                i += 1
                continue
            if i > start:
                out.append((text[start:i], -1))
            out.append((best[0], best[1]))
            i += len(best[0])
            start = i
        if start < len(text):
            out.append((text[start:], -1))
        return out

    def _bpe(self, word: str) -> list[int]:
        s = self.spec
        if s.flags & F_IGNORE_MERGES and word in self.vocab:
            return [self.vocab[word]]
        syms: list[int] = []
        unk = None  # (pending) the unknown token run, as `tokenizers` keeps it
        for ch in word:
            tid = self.vocab.get(ch)
            if tid is not None:
                if unk is not None:
                    syms.append(s.unk_id)
                    unk = None
                syms.append(tid)
                continue
            if s.flags & F_BYTE_FALLBACK:
                bt = [self.vocab.get(f"<0x{b:02X}>") for b in ch.encode("utf-8")]
                if all(t is not None for t in bt):
                    syms.extend(bt)   # a pending unk stays pending, as in tokenizers
                    continue
            if s.unk_id >= 0:
                if unk is not None and not s.flags & F_FUSE_UNK:
                    syms.append(s.unk_id)
                unk = True
        if unk is not None:
            syms.append(s.unk_id)
        return self._merge_all(syms)

    def _unigram(self, word: str) -> list[int]:
        """`Unigram::encode_optimized` then `tokenize` (tokenizers 0.23): the
        best-scoring segmentation of the word's bytes into pieces (an
        unknown character costs min score - 10), scores summed in float64
        from the left, the earliest start kept on a tie; consecutive unknown
        spans fused; a span outside the vocabulary becomes its <0xNN> pieces
        (byte_fallback, when all exist) or unk."""
        s = self.spec
        b = word.encode("utf-8")
        size = len(b)
        best = [0.0] * (size + 1)
        back = [0] * (size + 1)          # length of the best last piece; 0: not reached
        start = 0
        while start < size:
            here = best[start]
            lead = b[start]
            mblen = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            single = False
            node, k = self.trie, start
            while k < size and b[k] in node:
                node = node[b[k]]
                k += 1
                i = node.get(None)
                if i is None:
                    continue
                cand = s.scores[i] + here
                if not back[k] or cand > best[k]:
                    best[k], back[k] = cand, k - start
                single = single or k - start == mblen
            if not single:
                e = start + mblen
                cand = self.unk_score + here
                if not back[e] or cand > best[e]:
                    best[e], back[e] = cand, mblen
            start += mblen
        spans, e = [], size
        while e > 0:
            spans.append((e - back[e], e))
            e -= back[e]
        spans.reverse()
        ids: list[int] = []
        unk_from = None

        def emit(a: int, z: int):
            piece = b[a:z].decode("utf-8")
            i = self.vocab.get(piece)
            if i is not None:
                ids.append(i)
                return
            if s.flags & F_BYTE_FALLBACK:
                bt = [self.vocab.get(f"<0x{x:02X}>") for x in b[a:z]]
                if all(t is not None for t in bt):
                    ids.extend(bt)
                    return
            ids.append(s.unk_id)
        for a, z in spans:
            if self.vocab.get(b[a:z].decode("utf-8"), s.unk_id) == s.unk_id:
                unk_from = a if unk_from is None else unk_from
                continue
            if unk_from is not None:
                emit(unk_from, a)
                unk_from = None
            emit(a, z)
        if unk_from is not None:
            emit(unk_from, size)
        return ids

    def _merge_all(self, syms: list[int]) -> list[int]:
        """`Word::merge_all`: lowest rank first, then leftmost."""
        n = len(syms)
        if n < 2:
            return syms
        ids = list(syms)
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        alive = [True] * n
        heap = []
        for p in range(n - 1):
            m = self.merges.get((ids[p], ids[p + 1]))
            if m:
                heap.append((m[0], p, m[1]))
        heapq.heapify(heap)
        while heap:
            rank, p, new = heapq.heappop(heap)
            if not alive[p] or nxt[p] < 0:
                continue
            q = nxt[p]
            m = self.merges.get((ids[p], ids[q]))
            if m is None or m[1] != new:
                continue
            ids[p] = new
            alive[q] = False
            nxt[p] = nxt[q]
            if nxt[q] >= 0:
                prv[nxt[q]] = p
            if prv[p] >= 0:
                m = self.merges.get((ids[prv[p]], ids[p]))
                if m:
                    heapq.heappush(heap, (m[0], prv[p], m[1]))
            if nxt[p] >= 0:
                m = self.merges.get((ids[p], ids[nxt[p]]))
                if m:
                    heapq.heappush(heap, (m[0], p, m[1]))
        return [ids[p] for p in range(n) if alive[p]]

    def encode(self, text: str | bytes, add_bos: bool = False, parse_special: bool = True,
               errors: str = "replace", add_eos: bool = False) -> list[int]:
        """Text -> ids. Bytes that are not valid UTF-8 become U+FFFD (each
        maximal invalid subsequence, as bytes.decode(errors="replace")), or
        raise TokenizerError with errors="strict". add_bos / add_eos: the
        template's special ids first / last (info: F_TEMPLATE_BOS / _EOS)."""
        s = self.spec
        if isinstance(text, (bytes, bytearray, memoryview)):
            try:
                text = bytes(text).decode("utf-8", errors)
            except UnicodeDecodeError as exc:
                raise TokenizerError(f"text is not valid UTF-8: byte {exc.start} "
                                     f"(0x{exc.object[exc.start]:02x})") from None
        ids = []
        if add_bos:
            if s.bos_id < 0:
                raise TokenizerError("add_bos: this tokenizer has no bos token")
            ids.append(s.bos_id)
        first = True
        for seg, tid in self._split_added(text, parse_special):
            if tid >= 0:
                ids.append(tid)
                first = False
                continue
            if s.flags & F_NFC:
                seg = unicodedata.normalize("NFC", seg)
            if s.flags & F_NFKC:
                seg = unicodedata.normalize("NFKC", seg)
            if s.norm:
                seg = normalizer.apply(s.norm, seg, s.lower)
                if not seg:
                    first = False
                    continue
            if self.byte_level:
                if s.flags & F_ADD_PREFIX_SPACE and not seg.startswith(" "):
                    seg = " " + seg
                if s.pretok == PRETOK_PROGRAM and s.bytes_from >= 0:
                    # a ByteLevel between the steps: the words come mapped
                    words = tokregex.pre_tokenize_steps(s.steps, seg, s.bytes_from,
                                                        BYTE_TO_CHAR)
                else:         # the byte mapping after the last step
                    words = ["".join(BYTE_TO_CHAR[b] for b in w.encode("utf-8")) for w in (
                        tokregex.pre_tokenize_steps(s.steps, seg) if s.pretok == PRETOK_PROGRAM
                        else pre_tokenize(s.pretok, seg))]
                for w in words:
                    ids += self._bpe(w)
            else:
                model = self._unigram if self.unigram else self._bpe
                # WhitespaceSplit: the runs of non-White_Space (str.split()
                # would also cut at U+001C..U+001F, which Rust does not).
                runs = ([r for r in "".join(" " if c in WHITE_SPACE else c
                                            for c in seg).split(" ") if r]
                        if s.flags & F_WS_SPLIT else [seg])
                for run in runs:
                    run = run.replace(" ", SP_SPACE)
                    if (s.flags & F_SP_PREPEND and (first or not s.flags & F_SP_PREPEND_FIRST)
                            and not (s.flags & F_SP_PREPEND_UNLESS
                                     and run.startswith(SP_SPACE))):
                        run = SP_SPACE + run
                    if s.flags & F_SP_SPLIT:   # MergedWithNext on ▁: cut before each
                        cuts = [0] + [j for j in range(1, len(run)) if run[j] == SP_SPACE]
                        for a, z in zip(cuts, cuts[1:] + [len(run)]):
                            ids += model(run[a:z])
                    else:
                        ids += model(run)
            first = False
        if add_eos:
            if s.eos_id < 0:
                raise TokenizerError("add_eos: this tokenizer has no eos token")
            ids.append(s.eos_id)
        return ids

    # -- decode --
    def piece_bytes(self, i: int) -> bytes:
        """What one id contributes to decoded bytes before any cross-token rule
        (byte-level: alphabet characters -> bytes; SentencePiece: ▁ -> space;
        a <0xNN> piece -> that byte)."""
        p = self.spec.pieces[i]
        if self.byte_level:
            try:
                return bytes(CHAR_TO_BYTE[c] for c in p)
            except KeyError:
                return p.encode("utf-8")
        if self.spec.id_flags[i] & ID_BYTE:
            return bytes([int(p[3:5], 16)])
        return p.replace(SP_SPACE, " ").encode("utf-8")

    def decode(self, ids, skip_special: bool = False) -> str:
        d = StreamDecoder(self, skip_special)
        return "".join(d.push(i) for i in ids) + d.finish()


class StreamDecoder:
    """Decodes one id at a time and returns the text that is final so far: a
    UTF-8 sequence split across tokens is held back until it completes. The
    concatenation of every push and finish equals `Tokenizer.decode`, which
    equals `tokenizers`' decode."""

    def __init__(self, tok: Tokenizer, skip_special: bool = False):
        self.tok = tok
        self.skip_special = skip_special
        self.pending = b""      # bytes not yet decodable
        self.run = 0            # SentencePiece: byte pieces in the pending run
        self.started = False    # SentencePiece strip: the first character was seen

    def _emit(self, text: str) -> str:
        if not self.started and text:
            self.started = True
            if self.tok.spec.flags & F_SP_STRIP and text.startswith(" "):
                text = text[1:]
        return text

    def _flush_run(self) -> str:
        """SentencePiece ByteFallback: a run of byte pieces that is not valid
        UTF-8 as a whole becomes one U+FFFD per byte piece."""
        if not self.run:
            return ""
        try:
            text = self.pending.decode("utf-8")
        except UnicodeDecodeError:
            text = "\ufffd" * self.run
        self.pending, self.run = b"", 0
        return self._emit(text)

    def push(self, i: int) -> str:
        tok = self.tok
        if not 0 <= i < tok.n_vocab:
            raise TokenizerError(f"token id {i} is outside the vocabulary (0..{tok.n_vocab - 1})")
        if self.skip_special and i in tok.special:
            return ""
        if tok.spec.flags & F_DEC_METASPACE:
            # decoders::Metaspace: ▁ is a space, except that the first token
            # (after skipped specials) loses every ▁; <0xNN> stays as written.
            drop = not self.started and tok.spec.flags & F_DEC_DROP_FIRST
            self.started = True
            return tok.spec.pieces[i].replace(SP_SPACE, "" if drop else " ")
        b = tok.piece_bytes(i)
        if tok.byte_level:
            # ByteLevel decodes all bytes with from_utf8_lossy at the end: emit
            # the longest prefix that no later byte can change.
            self.pending += b
            cut = _final_prefix(self.pending)
            text = self.pending[:cut].decode("utf-8", "replace")
            self.pending = self.pending[cut:]
            return text
        if tok.spec.id_flags[i] & ID_BYTE and not tok.spec.id_flags[i] & ID_ADDED:
            self.pending += b
            self.run += 1
            return ""
        return self._flush_run() + self._emit(b.decode("utf-8"))

    def finish(self) -> str:
        if self.tok.byte_level:
            text, self.pending = self.pending.decode("utf-8", "replace"), b""
            return text
        return self._flush_run()


def _final_prefix(b: bytes) -> int:
    """Length of the prefix of b whose lossy UTF-8 decoding no appended byte
    can change: all of b except a trailing incomplete (so far valid) sequence."""
    n = len(b)
    for back in range(1, min(4, n) + 1):
        lead = b[n - back]
        if lead < 0x80:
            return n
        if lead >= 0xC0:
            need = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            if need > back:
                try:
                    b[n - back:].decode("utf-8")
                except UnicodeDecodeError as exc:
                    if exc.reason == "unexpected end of data":
                        return n - back
                return n
            return n
    return n


def section_crc(data: bytes) -> int:
    return zlib.crc32(data)


def load(path: str | Path) -> Tokenizer:
    """The tokenizer of a .colibri file (TokenizerError if it has none)."""
    return Tokenizer.from_file(path)


__all__ = ["Tokenizer", "StreamDecoder", "TokenizerSpec", "TokenizerError",
           "UnsupportedTokenizer", "spec_from_json", "spec_from_dir", "pack_section",
           "parse_section", "load", "KIND_TOKENIZER", "FormatError"]
