"""Extended grapheme clusters (Unicode UAX #29, rules GB3-GB13 with GB9c),
as Rust's unicode-segmentation cuts text for `tokenizers`' `Precompiled`
normaliser. The reference of src/tokenizer.c gc_* (same table, same rules).

The table (colibri/text/grapheme_table.py, stored in a section that needs
it: FORMAT.md 7.5) is runs of `first_code_point << 8 | props`; props bits
0-3 are Grapheme_Cluster_Break (GCB_NAMES order), bit 4
Extended_Pictographic, bits 5-6 Indic_Conjunct_Break (INCB_NAMES order).
"""
from __future__ import annotations

import bisect

GCB_NAMES = ("Other", "CR", "LF", "Control", "Extend", "ZWJ", "Regional_Indicator",
             "Prepend", "SpacingMark", "L", "V", "T", "LV", "LVT")
(OTHER, CR, LF, CONTROL, EXTEND, ZWJ, RI, PREPEND, SPACING_MARK, L, V, T, LV,
 LVT) = range(len(GCB_NAMES))
INCB_NAMES = ("None", "Linker", "Consonant", "Extend")
INCB_LINKER, INCB_CONSONANT, INCB_EXTEND = 1, 2, 3
PICT = 1 << 4
PROPS_MASK = 0x7F               # the bits a run may set
MAX_RUNS = 8192


class BadTable(ValueError):
    """Table words that fail the readers' checks."""


def check(runs) -> None:
    """The checks src/tokenizer.c check_graphemes makes: entry 0 starts at
    U+0000, starts strictly increasing and at most U+10FFFF, a known
    Grapheme_Cluster_Break value and no unknown bit."""
    if not 1 <= len(runs) <= MAX_RUNS or runs[0] >> 8:
        raise BadTable(f"a grapheme table of {len(runs)} runs, or not from U+0000")
    prev = -1
    for i, w in enumerate(runs):
        cp, props = w >> 8, w & 0xFF
        if cp <= prev or cp > 0x10FFFF or props & ~PROPS_MASK or props & 15 >= len(GCB_NAMES):
            raise BadTable(f"grapheme table run {i}")
        prev = cp


class Table:
    """A checked table: props(cp) by one binary search."""

    def __init__(self, runs):
        check(runs)
        self.runs = tuple(runs)
        self._starts = [w >> 8 for w in runs]

    def props(self, cp: int) -> int:
        return self.runs[bisect.bisect_right(self._starts, cp) - 1] & 0xFF


def _breaks(prev: int, cur: int, st: list) -> bool:
    """Is there a boundary between code points of props prev and cur?
    st = [Regional_Indicators just before cur, emoji state, InCB state]
    as the text before cur left them."""
    p, c = prev & 15, cur & 15
    if p == CR and c == LF:                                     # GB3
        return False
    if p in (CONTROL, CR, LF) or c in (CONTROL, CR, LF):        # GB4, GB5
        return True
    if (p == L and c in (L, V, LV, LVT)) or (p in (LV, V) and c in (V, T)) or \
            (p in (LVT, T) and c == T):                         # GB6-GB8
        return False
    if c in (EXTEND, ZWJ, SPACING_MARK) or p == PREPEND:        # GB9, GB9a, GB9b
        return False
    if st[2] == 2 and cur >> 5 == INCB_CONSONANT:               # GB9c
        return False
    if p == ZWJ and st[1] == 2 and cur & PICT:                  # GB11
        return False
    if p == RI and c == RI and st[0] % 2:                       # GB12, GB13
        return False
    return True


def _advance(cur: int, st: list) -> None:
    """The state after a code point of props cur."""
    c, incb = cur & 15, cur >> 5
    st[0] = st[0] + 1 if c == RI else 0
    # emoji: 1 after \p{ExtPict} Extend*, 2 after \p{ExtPict} Extend* ZWJ
    st[1] = 1 if cur & PICT else 1 if st[1] == 1 and c == EXTEND else \
        2 if st[1] == 1 and c == ZWJ else 0
    # InCB: 1 after Consonant [Extend Linker]*, 2 once a Linker is among them
    st[2] = 1 if incb == INCB_CONSONANT else \
        2 if st[2] and incb == INCB_LINKER else st[2] if incb == INCB_EXTEND else 0


def clusters(text: str, table: Table) -> list[tuple[int, int]]:
    """The clusters of text as (start, end) indices, in order."""
    out, start, prev, st = [], 0, None, [0, 0, 0]
    for i, ch in enumerate(text):
        cur = table.props(ord(ch))
        if prev is not None and _breaks(prev, cur, st):
            out.append((start, i))
            start = i
        _advance(cur, st)
        prev = cur
    if text:
        out.append((start, len(text)))
    return out
