"""SentencePiece's compiled character map: `tokenizers`' `Precompiled`
normaliser (T5, Switch Transformers, mBART, XLM-R ... on the hub: the
`precompiled_charsmap` of their tokenizer.json, SentencePiece's nmt_nfkc
rules). The reference of src/tokenizer.c pc_* (FORMAT.md 7.5).

The map is stored as SentencePiece wrote it: u32 `trie_size` (little-endian),
a darts-clone double-array trie of `trie_size` bytes (u32 units, little-
endian), then the replacement strings, UTF-8, each ending in NUL. A key's
leaf holds the offset of its replacement.

Applying it (tokenizers 0.23, normalizers/precompiled.rs): the text is cut
into extended grapheme clusters (colibri/text/grapheme.py); a cluster of
fewer than 6 UTF-8 bytes whose bytes start with a key becomes the
replacement of the shortest such key -- the whole cluster, whatever follows
the key in it; any other cluster goes character by character, each one a
key's replacement or itself.
"""
from __future__ import annotations

import struct

from . import grapheme, grapheme_table

MAX_CLUSTER_BYTES = 6           # a cluster this long or longer goes by character
MAX_UNITS = 1 << 21             # below this no inner unit has bit 31 (a leaf's mark)


class BadCharsMap(ValueError):
    """Map bytes that fail the readers' checks."""


def _offset(u: int) -> int:
    return (u >> 10) << ((u & (1 << 9)) >> 6)


class Precompiled:
    """A checked map with the grapheme table it is applied with (the
    section stores both: FORMAT.md 7.5). The map's checks (src/tokenizer.c check_charsmap makes the
    same): the trie is whole units, at least one, fewer than MAX_UNITS; the
    strings are valid UTF-8 ending in NUL; every leaf unit (bit 31) points
    into the strings at the start of a character. A lookup that reaches a
    unit without bit 31 where a leaf should be takes it as no key, and one
    that steps outside the trie stops, so no map reads outside itself."""

    def __init__(self, data: bytes, runs=grapheme_table.RUNS):
        self.table = grapheme.Table(runs)       # raises grapheme.BadTable
        if len(data) < 4:
            raise BadCharsMap("a character map shorter than its size field")
        size = struct.unpack_from("<I", data)[0]
        if size % 4 or not 4 <= size <= len(data) - 5 or size // 4 >= MAX_UNITS:
            raise BadCharsMap(f"a character map trie of {size} bytes in {len(data)}")
        self.units = struct.unpack_from(f"<{size // 4}I", data, 4)
        self.strings = bytes(data[4 + size:])
        if self.strings[-1] != 0:
            raise BadCharsMap("the character map's strings do not end in NUL")
        try:
            self.strings.decode("utf-8")
        except UnicodeDecodeError:
            raise BadCharsMap("the character map's strings are not UTF-8") from None
        for i, u in enumerate(self.units):
            v = u & 0x7FFFFFFF
            if u >> 31 and (v >= len(self.strings) or 0x80 <= self.strings[v] < 0xC0):
                raise BadCharsMap(f"character map leaf {i} points outside its strings")
        self.data = bytes(data)

    def __eq__(self, other) -> bool:
        return isinstance(other, Precompiled) and (self.data, self.table.runs) == \
            (other.data, other.table.runs)

    def __repr__(self) -> str:
        return f"Precompiled({len(self.data)} bytes, {len(self.table.runs)} grapheme runs)"

    def match(self, key: bytes) -> str | None:
        """The replacement of the shortest key that starts key, or None
        (darts-clone's common-prefix search, its first result)."""
        units, n = self.units, len(self.units)
        pos = _offset(units[0])
        for c in key:
            pos ^= c
            if pos >= n or units[pos] & 0x800000FF != c:
                return None
            u = units[pos]
            pos ^= _offset(u)
            if pos >= n:
                return None
            if u >> 8 & 1 and units[pos] >> 31:
                v = units[pos] & 0x7FFFFFFF
                return self.strings[v:self.strings.index(0, v)].decode()
        return None

    def apply(self, text: str) -> str:
        """text normalised: the map over its clusters."""
        out = []
        for a, b in grapheme.clusters(text, self.table):
            cluster = text[a:b]
            raw = cluster.encode()
            if len(raw) < MAX_CLUSTER_BYTES:
                rep = self.match(raw)
                if rep is not None:
                    out.append(rep)
                    continue
            for ch in cluster:
                rep = self.match(ch.encode())
                out.append(ch if rep is None else rep)
        return "".join(out)
