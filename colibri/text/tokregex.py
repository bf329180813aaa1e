"""The pre-tokenizer regexes of tokenizer.json (`Split` patterns, ByteLevel's
GPT-2 regex, Digits, Punctuation, ...) compiled at convert time to a small
program of u32 words, stored in the tokenizer section (docs/FORMAT.md 7.2) and
executed by a backtracking matcher: `match_at` here, `rx_match` in
src/tokenizer.c, instruction for instruction.

Semantics are Oniguruma's as `tokenizers` 0.23 uses it (the tests' judge):
leftmost-first alternation, greedy and lazy repeats with backtracking,
look-ahead, `^`/`$` at line boundaries, `\\p{..}` over Unicode 16.0's
General_Category (colibri/text/unicode_tables.py), `\\s` = White_Space, `\\d` =
Nd, `\\w` = L, M, Nd, Pc. `(?i:...)` folds literal characters (Python's
case folding: `s` also matches U+017F, `k` U+212A).

What the program can be is limited so that the C matcher needs no memory
beyond a bounded stack and always ends: every jump goes forward; the only
repeats are of one character class (`SPAN`, one backtrack entry however many
characters it takes); a counted repeat of a group is unrolled; `(?=C)D`, one
character class looking ahead at another, becomes their intersection. An
unbounded repeat of a group, a back-reference, a look-behind, a nested class
(`[a[b]]`, `&&`), or a pattern that can match the empty string is refused by
name (`UnsupportedRegex`).

Program layout (words): instructions back to back, ending with MATCH.
  CHAR    op | cp << 8                    one code point
  CLASS   op | flags << 8 | n << 16, then n items of 2 words
          flags: 1 negate the class, 2 the items are AND-ed (else OR-ed)
          item (a, b): bit 31 of a clear: code points (a & 0x1FFFFF)..b;
          set: a property, b its argument: kind = a & 0xFF:
          0 General_Category mask (b: bit g = GC_NAMES[g]), 1 White_Space,
          2 word (\\w), 3 any but \\n (.); bit 30 of a negates the item
          (either kind)
  SPAN    op | greedy << 8, min, max (0xFFFFFFFF: no limit), then one CHAR
          or CLASS instruction: that character repeated
  SPLIT   op, x, y: go on at x; on failure come back and go on at y
  JMP     op, x
  LOOK    op | neg << 8, end: the look-ahead body follows (ending with
          LOOKEND), matched atomically at the current position; then go on
          at end (the body's match consumes nothing)
  LOOKEND op
  ASSERT  op | kind << 8: 0 ^, 1 $, 2 \\A, 3 \\z, 4 \\b, 5 \\B, 6 \\Z
  MATCH   op
Jump targets are word indexes into the program, greater than the jump's own.
"""
from __future__ import annotations

import bisect
from functools import lru_cache

from . import unicode_tables as U
from ..errors import ColibriError

OP_CHAR, OP_CLASS, OP_SPAN, OP_SPLIT, OP_JMP, OP_LOOK, OP_LOOKEND, OP_ASSERT, OP_MATCH = range(1, 10)
CL_NEG, CL_AND = 1, 2
P_GC, P_SPACE, P_WORD, P_DOT = 0, 1, 2, 3
ITEM_PROP, ITEM_NEG = 0x80000000, 0x40000000
NO_MAX = 0xFFFFFFFF
A_BOL, A_EOL, A_BOS, A_EOS, A_WORDB, A_NWORDB, A_EOSNL = range(7)
MAX_PROGRAM_WORDS = 4096          # per step (the C reader's bound)

GC = {n: i for i, n in enumerate(U.GC_NAMES)}
_GC_FIRST = [r >> 5 for r in U.GC_RUNS]


def _mask(*names: str) -> int:
    return sum(1 << GC[n] for n in names)


# \p{X}: the one- and two-letter General_Category names and the long ones
# Oniguruma accepts for them.
GC_MASKS = {n: 1 << i for i, n in enumerate(U.GC_NAMES)}
for _major in "LMNPSZC":
    GC_MASKS[_major] = sum(1 << i for i, n in enumerate(U.GC_NAMES) if n[0] == _major)
GC_MASKS["LC"] = _mask("Lu", "Ll", "Lt")
_LONG = {"Letter": "L", "Mark": "M", "Number": "N", "Punctuation": "P", "Symbol": "S",
         "Separator": "Z", "Other": "C", "Uppercase_Letter": "Lu", "Lowercase_Letter": "Ll",
         "Titlecase_Letter": "Lt", "Modifier_Letter": "Lm", "Other_Letter": "Lo",
         "Nonspacing_Mark": "Mn", "Spacing_Mark": "Mc", "Enclosing_Mark": "Me",
         "Decimal_Number": "Nd", "Letter_Number": "Nl", "Other_Number": "No",
         "Connector_Punctuation": "Pc", "Dash_Punctuation": "Pd", "Open_Punctuation": "Ps",
         "Close_Punctuation": "Pe", "Initial_Punctuation": "Pi", "Final_Punctuation": "Pf",
         "Other_Punctuation": "Po", "Math_Symbol": "Sm", "Currency_Symbol": "Sc",
         "Modifier_Symbol": "Sk", "Other_Symbol": "So", "Space_Separator": "Zs",
         "Line_Separator": "Zl", "Paragraph_Separator": "Zp", "Control": "Cc",
         "Format": "Cf", "Surrogate": "Cs", "Private_Use": "Co", "Unassigned": "Cn",
         "Cased_Letter": "LC"}
for _long, _short in _LONG.items():
    GC_MASKS[_long] = GC_MASKS[_short]
WORD_MASK = GC_MASKS["L"] | GC_MASKS["M"] | _mask("Nd", "Pc")


class UnsupportedRegex(ColibriError):
    """A regex construct the stored program cannot express (named)."""


# --- character classes (shared by the compiler's checks and the matcher) ----
def gc_of(cp: int) -> int:
    return U.GC_RUNS[bisect.bisect_right(_GC_FIRST, cp) - 1] & 31


def is_white_space(cp: int) -> bool:
    """Unicode White_Space (what Oniguruma's \\s is; not str.isspace)."""
    return 9 <= cp <= 13 or cp in (0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F,
                                   0x205F, 0x3000) or 0x2000 <= cp <= 0x200A


def is_word(cp: int) -> bool:
    return bool(WORD_MASK >> gc_of(cp) & 1)


def item_match(a: int, b: int, cp: int) -> bool:
    if not a & ITEM_PROP:
        return (a & ~ITEM_NEG <= cp <= b) != bool(a & ITEM_NEG)
    kind = a & 0xFF
    if kind == P_GC:
        r = bool(b >> gc_of(cp) & 1)
    elif kind == P_SPACE:
        r = is_white_space(cp)
    elif kind == P_WORD:
        r = is_word(cp)
    else:
        r = cp != 10
    return r != bool(a & ITEM_NEG)


def class_match(prog: list[int], pc: int, cp: int) -> bool:
    """The CLASS instruction at pc against one code point."""
    w = prog[pc]
    flags, n = w >> 8 & 0xFF, w >> 16
    items = range(pc + 1, pc + 1 + 2 * n, 2)
    if flags & CL_AND:
        r = all(item_match(prog[i], prog[i + 1], cp) for i in items)
    else:
        r = any(item_match(prog[i], prog[i + 1], cp) for i in items)
    return r != bool(flags & CL_NEG)


def insn_len(prog: list[int], pc: int) -> int:
    op = prog[pc] & 0xFF
    if op == OP_CLASS:
        return 1 + 2 * (prog[pc] >> 16)
    if op == OP_SPAN:
        return 3 + insn_len(prog, pc + 3)
    return {OP_CHAR: 1, OP_SPLIT: 3, OP_JMP: 2, OP_LOOK: 2, OP_LOOKEND: 1, OP_ASSERT: 1,
            OP_MATCH: 1}[op]


def _valid_item(a: int, b: int) -> bool:
    if not a & ITEM_PROP:
        return (a & ~ITEM_NEG) <= 0x10FFFF and b <= 0x10FFFF
    if a & ~(ITEM_PROP | ITEM_NEG | 0xFF):
        return False
    return b < 1 << 30 if a & 0xFF == P_GC else a & 0xFF <= P_DOT and b == 0


def _valid_insn(prog: list[int], pc: int) -> bool:
    """One instruction's own fields (src/tokenizer.c valid_insn)."""
    w = prog[pc]
    op, arg = w & 0xFF, w >> 8
    if op == OP_CHAR:
        return arg <= 0x10FFFF
    if op == OP_CLASS:
        return not arg & 0xFF & ~3 and all(_valid_item(prog[pc + 1 + 2 * k], prog[pc + 2 + 2 * k])
                                           for k in range(w >> 16))
    if op == OP_SPAN:
        return (arg <= 1 and prog[pc + 1] <= prog[pc + 2]
                and prog[pc + 3] & 0xFF in (OP_CHAR, OP_CLASS) and _valid_insn(prog, pc + 3))
    if op == OP_ASSERT:
        return arg <= A_EOSNL
    if op == OP_LOOK:
        return arg <= 1
    return arg == 0


def check_program(prog: list[int]) -> None:
    """The checks src/tokenizer.c check_prog makes on stored program words:
    whole instructions with valid fields, the last a MATCH, every jump
    forward to the start of an instruction. ValueError says which fails."""
    starts, pc, last = set(), 0, 0
    try:
        while pc < len(prog):
            starts.add(pc)
            last = pc
            if not _valid_insn(prog, pc):
                raise ValueError(f"instruction {pc} is not valid")
            pc += insn_len(prog, pc)
    except (IndexError, KeyError):
        raise ValueError("not a program") from None
    if not prog or pc != len(prog) or prog[last] & 0xFF != OP_MATCH:
        raise ValueError("not a program")
    for pc in starts:
        op = prog[pc] & 0xFF
        targets = (prog[pc + 1:pc + 3] if op == OP_SPLIT else
                   prog[pc + 1:pc + 2] if op in (OP_JMP, OP_LOOK) else [])
        if any(x <= pc or x not in starts for x in targets):
            raise ValueError("a jump that is not forward")


# --- parser: pattern -> tree -------------------------------------------------
# Tree nodes: ("char", cp) ("class", flags, [(a, b)...]) ("cat", [n...])
# ("alt", [n...]) ("rep", node, min, max|None, greedy) ("look", neg, node)
# ("assert", kind) ("empty",)

_SIMPLE_ESC = {"n": 10, "r": 13, "t": 9, "f": 12, "v": 11, "a": 7, "e": 27, "0": 0}


@lru_cache(maxsize=None)
def _fold_table() -> dict[str, tuple[int, ...]]:
    """Case folding -> the code points folding to it (one scan, only when a
    pattern uses (?i))."""
    out: dict[str, list[int]] = {}
    for c in range(0x110000):
        f = chr(c).casefold()
        if len(f) == 1:
            out.setdefault(f, []).append(c)
    return {k: tuple(v) for k, v in out.items()}


def _fold_set(cp: int) -> tuple[int, ...]:
    """Code points that (?i) matches for cp: those with the same one-character
    case folding (s, S, U+017F; k, K, U+212A; ...)."""
    f = chr(cp).casefold()
    if len(f) != 1:
        return (cp,)
    return _fold_table().get(f, (cp,))


class _Parser:
    def __init__(self, pat: str):
        self.p, self.i, self.fold = pat, 0, False

    def err(self, what: str) -> UnsupportedRegex:
        return UnsupportedRegex(f"regex {self.p!r}: {what} (at offset {self.i})")

    def peek(self, k: int = 0) -> str:
        return self.p[self.i + k] if self.i + k < len(self.p) else ""

    def parse(self):
        node = self.alt()
        if self.i != len(self.p):
            raise self.err(f"unexpected {self.peek()!r}")
        return node

    def alt(self):
        branches = [self.cat()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.cat())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def cat(self):
        items = []
        while self.peek() and self.peek() not in "|)":
            items.append(self.repeat(self.atom()))
        return ("cat", items) if len(items) != 1 else items[0]

    def repeat(self, node):
        while True:
            c = self.peek()
            if c in ("*", "+", "?"):
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            elif c == "{" and (counted := self._counted()) is not None:
                lo, hi = counted
            else:
                return node
            greedy = True
            if self.peek() == "?":
                self.i += 1
                greedy = False
            elif self.peek() == "+":
                raise self.err("possessive repeat")
            if node[0] in ("assert", "look"):
                raise self.err("repeat of an assertion")
            node = ("rep", node, lo, hi, greedy)

    def _counted(self):
        """{n}, {n,}, {n,m} at i: consumes it and returns (n, m|None); None
        (and consumes nothing) when the brace is a literal."""
        j = self.p.find("}", self.i)
        if j < 0:
            return None
        body = self.p[self.i + 1:j]
        parts = body.split(",")
        if len(parts) > 2 or not parts[0].isdigit() or (len(parts) == 2 and parts[1]
                                                         and not parts[1].isdigit()):
            return None
        lo = int(parts[0])
        hi = lo if len(parts) == 1 else (int(parts[1]) if parts[1] else None)
        if hi is not None and hi < lo or lo > 1000 or (hi or 0) > 1000:
            raise self.err(f"counted repeat {{{body}}}")
        self.i = j + 1
        return lo, hi

    def atom(self):
        c = self.peek()
        if c == "(":
            return self.group()
        if c == "[":
            return self.cls()
        if c == ".":
            self.i += 1
            return ("class", 0, [(ITEM_PROP | P_DOT, 0)])
        if c == "^":
            self.i += 1
            return ("assert", A_BOL)
        if c == "$":
            self.i += 1
            return ("assert", A_EOL)
        if c == "\\":
            return self.escape(in_class=False)
        if c in "*+?":
            raise self.err(f"nothing to repeat before {c!r}")
        self.i += 1
        return self.char(ord(c))

    def char(self, cp: int):
        if self.fold:
            fs = _fold_set(cp)
            if len(fs) > 1:
                return ("class", 0, [(x, x) for x in fs])
        return ("char", cp)

    def group(self):
        self.i += 1
        saved = self.fold
        look = None
        if self.peek() == "?":
            k = self.peek(1)
            if k == ":":
                self.i += 2
            elif k in "=!":
                look = k == "!"
                self.i += 2
            elif k == "<":
                raise self.err("look-behind or named group")
            else:
                j = self.i + 1
                flags = ""
                while self.peek(j - self.i) and self.p[j] not in ":)":
                    flags += self.p[j]
                    j += 1
                if flags != "i" or j >= len(self.p):
                    raise self.err(f"group option (?{flags}")
                self.i = j + 1
                self.fold = True
                if self.p[j] == ")":   # (?i) to the end of the enclosing group
                    return ("cat", [])
        node = self.alt()
        if self.peek() != ")":
            raise self.err("unclosed group")
        self.i += 1
        self.fold = saved
        if look is not None:
            return ("look", look, node)
        return node

    def escape(self, in_class: bool):
        """A backslash escape: ("char", cp) or ("class", ...) (or an
        assertion outside a class)."""
        self.i += 1
        c = self.peek()
        if not c:
            raise self.err("trailing backslash")
        self.i += 1
        if c in _SIMPLE_ESC:
            return self.char(_SIMPLE_ESC[c])
        if c == "x":
            if self.peek() == "{":
                j = self.p.index("}", self.i)
                cp = int(self.p[self.i + 1:j], 16)
                self.i = j + 1
            else:
                cp = int(self.p[self.i:self.i + 2], 16)
                self.i += 2
            return self.char(cp)
        if c == "u":
            cp = int(self.p[self.i:self.i + 4], 16)
            self.i += 4
            return self.char(cp)
        if c in "sSdDwWhH":
            neg = ITEM_NEG if c.isupper() else 0
            lc = c.lower()
            if lc == "s":
                item = (ITEM_PROP | P_SPACE | neg, 0)
            elif lc == "d":
                item = (ITEM_PROP | P_GC | neg, GC_MASKS["Nd"])
            else:   # Oniguruma's \w is not L|M|Nd|Pc (U+FE0F is not in it)
                raise self.err(f"\\{c}")
            return ("class", 0, [item])
        if c in "pP":
            neg = c == "P"
            if self.peek() != "{":
                raise self.err("\\p without {")
            j = self.p.index("}", self.i)
            name = self.p[self.i + 1:j]
            self.i = j + 1
            if name.startswith("^"):
                neg, name = not neg, name[1:]
            if name not in GC_MASKS:
                raise self.err(f"property \\p{{{name}}}")
            return ("class", 0, [(ITEM_PROP | P_GC | (ITEM_NEG if neg else 0), GC_MASKS[name])])
        if not in_class:
            if c == "A":
                return ("assert", A_BOS)
            if c == "z":
                return ("assert", A_EOS)
            if c == "Z":
                return ("assert", A_EOSNL)
        if c.isalnum():
            raise self.err(f"escape \\{c}")
        return self.char(ord(c))

    def cls(self):
        self.i += 1
        flags = 0
        if self.peek() == "^":
            flags = CL_NEG
            self.i += 1
        items = []
        first = True
        while True:
            c = self.peek()
            if not c:
                raise self.err("unclosed [")
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            if c == "[" or (c == "&" and self.peek(1) == "&"):
                raise self.err("nested class or && in a class")
            if c == "\\":
                node = self.escape(in_class=True)
            else:
                self.i += 1
                node = ("char", ord(c))
            if node[0] == "class":
                items += node[2]
                continue
            lo = node[1]
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.i += 1
                if self.peek() == "\\":
                    hi_node = self.escape(in_class=True)
                    if hi_node[0] != "char":
                        raise self.err("range to a class")
                    hi = hi_node[1]
                else:
                    hi = ord(self.peek())
                    self.i += 1
                if hi < lo:
                    raise self.err("range out of order")
                if self.fold and any(_fold_set(x) != (x,) for x in range(lo, hi + 1)):
                    raise self.err("case-insensitive range")
                items.append((lo, hi))
            else:
                if self.fold:
                    items += [(x, x) for x in _fold_set(lo)]
                else:
                    items.append((lo, lo))
        return ("class", flags, items)


# --- tree -> program -----------------------------------------------------------
def _nullable(n) -> bool:
    t = n[0]
    if t in ("char", "class"):
        return False
    if t in ("assert", "look", "empty"):
        return True
    if t == "cat":
        return all(_nullable(x) for x in n[1])
    if t == "alt":
        return any(_nullable(x) for x in n[1])
    return n[2] == 0 or _nullable(n[1])


def _single(n):
    """The node as one CHAR/CLASS instruction's words, or None."""
    if n[0] == "char":
        return [OP_CHAR | n[1] << 8]
    if n[0] == "class":
        flags, items = n[1], n[2]
        if len(items) > 0xFFFF:
            raise UnsupportedRegex("class of more than 65535 items")
        out = [OP_CLASS | flags << 8 | len(items) << 16]
        for a, b in items:
            out += [a, b]
        return out
    if n[0] == "cat" and len(n[1]) == 1:
        return _single(n[1][0])
    return None


def _one_item(n):
    """A one-character node as one class item (a, b), or None."""
    if n[0] == "char":
        return (n[1], n[1])
    if n[0] == "class" and len(n[2]) == 1 and not n[1] & CL_AND:
        a, b = n[2][0]
        if n[1] & CL_NEG:
            return (a ^ ITEM_NEG, b)
        return (a, b)
    if n[0] == "class" and not n[1] and all(x[0] & ITEM_PROP and x[0] & 0xFF == P_GC
                                            and not x[0] & ITEM_NEG for x in n[2]):
        mask = 0
        for _, m in n[2]:
            mask |= m
        return (ITEM_PROP | P_GC, mask)
    if n[0] == "cat" and len(n[1]) == 1:
        return _one_item(n[1][0])
    return None


def _simplify(n):
    """(?=C)D with one-character C and D -> the class C AND D (keeps the
    repeats of such a pair a SPAN: tekken-style regexes)."""
    t = n[0]
    if t == "cat":
        items = [_simplify(x) for x in n[1]]
        out = []
        k = 0
        while k < len(items):
            x = items[k]
            if (x[0] == "look" and not x[1] and k + 1 < len(items)
                    and _one_item(x[2]) and _one_item(items[k + 1])):
                out.append(("class", CL_AND, [_one_item(x[2]), _one_item(items[k + 1])]))
                k += 2
                continue
            out.append(x)
            k += 1
        return ("cat", out) if len(out) != 1 else out[0]
    if t == "alt":
        return ("alt", [_simplify(x) for x in n[1]])
    if t == "rep":
        return ("rep", _simplify(n[1]), n[2], n[3], n[4])
    if t == "look":
        return ("look", n[1], _simplify(n[2]))
    return n


class _Emitter:
    def __init__(self):
        self.w: list[int] = []

    def emit(self, n):
        t = n[0]
        if t in ("char", "class"):
            self.w += _single(n)
        elif t == "cat":
            for x in n[1]:
                self.emit(x)
        elif t == "alt":
            jumps = []
            for k, b in enumerate(n[1]):
                if k < len(n[1]) - 1:
                    at = len(self.w)
                    self.w += [OP_SPLIT, at + 3, 0]
                    self.emit(b)
                    jumps.append(len(self.w))
                    self.w += [OP_JMP, 0]
                    self.w[at + 2] = len(self.w)
                else:
                    self.emit(b)
            for j in jumps:
                self.w[j + 1] = len(self.w)
        elif t == "assert":
            self.w.append(OP_ASSERT | n[1] << 8)
        elif t == "look":
            at = len(self.w)
            self.w += [OP_LOOK | (1 if n[1] else 0) << 8, 0]
            self.emit(n[2])
            self.w.append(OP_LOOKEND)
            self.w[at + 1] = len(self.w)
        elif t == "rep":
            self.rep(*n[1:])
        else:
            raise AssertionError(t)

    def rep(self, body, lo, hi, greedy):
        single = _single(body)
        if single is not None:
            self.w += [OP_SPAN | (1 if greedy else 0) << 8, lo,
                       NO_MAX if hi is None else hi] + single
            return
        if hi is None:
            raise UnsupportedRegex("an unbounded repeat of a group (only one character "
                                   "class may repeat without limit)")
        if _nullable(body):
            raise UnsupportedRegex("a repeat of a group that can match the empty string")
        for _ in range(lo):
            self.emit(body)
        self.optional(body, hi - lo, greedy)

    def optional(self, body, k, greedy):
        """(body (body (...)?)?)? k deep: forward jumps only."""
        if k == 0:
            return
        at = len(self.w)
        self.w += [OP_SPLIT, 0, 0]
        start = len(self.w)
        self.emit(body)
        self.optional(body, k - 1, greedy)
        end = len(self.w)
        self.w[at + 1], self.w[at + 2] = (start, end) if greedy else (end, start)


def compile_regex(pattern: str) -> list[int]:
    """A tokenizer.json regex -> program words; UnsupportedRegex if it uses
    what the program cannot express."""
    tree = _simplify(_Parser(pattern).parse())
    if _nullable(tree):
        raise UnsupportedRegex(f"regex {pattern!r} can match the empty string")
    e = _Emitter()
    try:
        e.emit(tree)
    except UnsupportedRegex as exc:
        raise UnsupportedRegex(f"regex {pattern!r}: {exc}") from None
    e.w.append(OP_MATCH)
    if len(e.w) > MAX_PROGRAM_WORDS:
        raise UnsupportedRegex(f"regex {pattern!r}: program of {len(e.w)} words")
    return e.w


def single_class(items, flags=0) -> list[int]:
    """A one-character program (Digits, Punctuation, ...): the class, then
    MATCH."""
    return _single(("class", flags, list(items))) + [OP_MATCH]


def span_class(items, flags=0) -> list[int]:
    """A program matching a run of one class (Digits contiguous etc.)."""
    return [OP_SPAN | 1 << 8, 1, NO_MAX] + _single(("class", flags, list(items))) + [OP_MATCH]


# --- the matcher -------------------------------------------------------------
def _assert(kind: int, t: str, lo: int, hi: int, i: int) -> bool:
    if kind == A_BOL:
        return i == lo or t[i - 1] == "\n"
    if kind == A_EOL:
        return i == hi or t[i] == "\n"
    if kind == A_BOS:
        return i == lo
    if kind == A_EOS:
        return i == hi
    if kind == A_EOSNL:
        return i == hi or (i == hi - 1 and t[i] == "\n")
    before = i > lo and is_word(ord(t[i - 1]))
    after = i < hi and is_word(ord(t[i]))
    return (before != after) == (kind == A_WORDB)


def _one(prog: list[int], pc: int, cp: int) -> bool:
    w = prog[pc]
    if w & 0xFF == OP_CHAR:
        return w >> 8 == cp
    return class_match(prog, pc, cp)


# Steps after which match_at starts again with its memo of failed states
# (a pattern like (\p{L}?){70}x backtracks exponentially without one).
MEMO_AFTER_STEPS = 4096


def match_at(prog: list[int], t: str, lo: int, hi: int, i: int,
             memo: bool = False) -> int:
    """End of the match of prog at position i of t[lo:hi] (the regex sees
    only that slice), or -1. A backtracking machine; the stack entries are
    (kind, pc, pos, aux): 0 alternative, 1 greedy span, 2 lazy span,
    3 look-ahead marker.

    memo: remember each (pc, pos) reached outside a look-ahead and fail on
    a second arrival. Backtracking explores in priority order and stops at
    the first match, so a state reached again has already failed from there;
    the answer is the same, in polynomial time. (Inside a look-ahead what
    follows LOOKEND depends on where the look-ahead began, so those states
    are not remembered.) Runs that take more than MEMO_AFTER_STEPS steps
    start again with it, so ordinary text pays nothing."""
    stack: list[tuple[int, int, int, int]] = []
    pc, pos = 0, i
    seen: set[tuple[int, int]] = set()
    looks = steps = 0
    while True:
        steps += 1
        if not memo and steps > MEMO_AFTER_STEPS:
            return match_at(prog, t, lo, hi, i, memo=True)
        revisit = False
        if memo and looks == 0:
            revisit = (pc, pos) in seen
            seen.add((pc, pos))
        w = prog[pc]
        op = w & 0xFF
        ok = True
        if revisit:              # this state has failed before
            ok = False
        elif op == OP_CHAR or op == OP_CLASS:
            if pos < hi and _one(prog, pc, ord(t[pos])):
                pos += 1
                pc += insn_len(prog, pc)
            else:
                ok = False
        elif op == OP_SPAN:
            lo_n, hi_n, item = prog[pc + 1], prog[pc + 2], pc + 3
            nxt = pc + 3 + insn_len(prog, item)
            k = 0
            while k < lo_n and pos < hi and _one(prog, item, ord(t[pos])):
                pos += 1
                k += 1
            if k < lo_n:
                ok = False
            elif w >> 8 & 1:      # greedy: take all, give back one by one
                start = pos
                while k < hi_n and pos < hi and _one(prog, item, ord(t[pos])):
                    pos += 1
                    k += 1
                if pos > start:
                    stack.append((1, pc, pos, start))
                pc = nxt
            else:
                if k < hi_n:
                    stack.append((2, pc, pos, k))
                pc = nxt
        elif op == OP_SPLIT:
            stack.append((0, prog[pc + 2], pos, 0))
            pc = prog[pc + 1]
        elif op == OP_JMP:
            pc = prog[pc + 1]
        elif op == OP_LOOK:
            stack.append((3, pc, pos, 0))
            looks += 1
            pc += 2
        elif op == OP_LOOKEND:
            while stack[-1][0] != 3:
                stack.pop()
            _, lpc, lpos, _ = stack.pop()
            looks -= 1
            if prog[lpc] >> 8 & 1:   # negative look-ahead matched: fail
                ok = False
            else:
                pc, pos = prog[lpc + 1], lpos
        elif op == OP_ASSERT:
            if _assert(w >> 8, t, lo, hi, pos):
                pc += 1
            else:
                ok = False
        elif op == OP_MATCH:
            return pos
        if ok:
            continue
        # backtrack
        while True:
            if not stack:
                return -1
            kind, bpc, bpos, aux = stack.pop()
            if kind == 0:
                pc, pos = bpc, bpos
                break
            if kind == 1:
                pos = bpos - 1
                if pos > aux:
                    stack.append((1, bpc, pos, aux))
                pc = bpc + 3 + insn_len(prog, bpc + 3)
                break
            if kind == 2:
                item = bpc + 3
                if bpos < hi and _one(prog, item, ord(t[bpos])):
                    k = aux + 1
                    if k < prog[bpc + 2]:
                        stack.append((2, bpc, bpos + 1, k))
                    pc, pos = item + insn_len(prog, item), bpos + 1
                    break
                continue
            # kind 3: the look-ahead body failed
            looks -= 1
            if prog[bpc] >> 8 & 1:
                pc, pos = prog[bpc + 1], bpos
                break


def find_iter(prog: list[int], t: str, lo: int, hi: int):
    """Non-overlapping matches (start, end) in t[lo:hi], leftmost first.
    A compiled program never matches empty; a section's may, and such a
    match counts as none (src/tokenizer.c does the same)."""
    i = lo
    while i < hi:
        e = match_at(prog, t, lo, hi, i)
        if e <= i:
            i += 1
            continue
        yield i, e
        i = e


# --- Split behaviours (tokenizers' SplitDelimiterBehavior) -----------------
B_REMOVED, B_ISOLATED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS = range(5)
BEHAVIORS = {"Removed": B_REMOVED, "Isolated": B_ISOLATED,
             "MergedWithPrevious": B_MERGED_PREV, "MergedWithNext": B_MERGED_NEXT,
             "Contiguous": B_CONTIGUOUS}


def split_pieces(prog: list[int], behavior: int, invert: bool, t: str, lo: int, hi: int):
    """tokenizers' NormalizedString::split(regex, behavior) over t[lo:hi]:
    the kept pieces as (start, end), in order, none empty."""
    segs = []                  # (start, end, is_match) covering [lo, hi)
    prev = lo
    for s, e in find_iter(prog, t, lo, hi):
        if s > prev:
            segs.append((prev, s, invert))
        segs.append((s, e, not invert))
        prev = e
    if prev < hi:
        segs.append((prev, hi, invert))
    return merge_segments(segs, behavior)


def merge_segments(segs, behavior: int):
    out: list[list[int]] = []
    if behavior == B_ISOLATED:
        return [(s, e) for s, e, _ in segs]
    if behavior == B_REMOVED:
        return [(s, e) for s, e, m in segs if not m]
    prev_match = False
    if behavior == B_CONTIGUOUS:
        for s, e, m in segs:
            if m == prev_match and out:
                out[-1][1] = e
            else:
                out.append([s, e])
            prev_match = m
    elif behavior == B_MERGED_PREV:
        for s, e, m in segs:
            if m and not prev_match and out:
                out[-1][1] = e
            else:
                out.append([s, e])
            prev_match = m
    else:  # merged with next
        for s, e, m in reversed(segs):
            if m and not prev_match and out:
                out[-1][0] = s
            else:
                out.append([s, e])
            prev_match = m
        out.reverse()
    return [(s, e) for s, e in out]


def compile_literal(text: str) -> list[int]:
    """Split's {"String": ...} pattern: the text itself."""
    if not text:
        raise UnsupportedRegex("Split on the empty string")
    return [OP_CHAR | ord(c) << 8 for c in text] + [OP_MATCH]


# tokenizers' Punctuation: Rust char::is_ascii_punctuation or a Unicode P*.
PUNCT_ITEMS = [(ITEM_PROP | P_GC, GC_MASKS["P"]), (0x21, 0x2F), (0x3A, 0x40), (0x5B, 0x60),
               (0x7B, 0x7E)]
N_ITEMS = [(ITEM_PROP | P_GC, GC_MASKS["N"])]          # Digits: char::is_numeric
SPACE_ITEMS = [(ITEM_PROP | P_SPACE, 0)]               # char::is_whitespace


STEP_BYTES = 1 << 9             # a step's mode bit: it matches over the byte alphabet


def pack_steps(steps, bytes_from: int = -1) -> list[int]:
    """[(behavior, invert, program)] -> the steps blob (FORMAT.md 7.2);
    steps from bytes_from on carry STEP_BYTES."""
    head = [len(steps)]
    body: list[int] = []
    base = 1 + 4 * len(steps)
    for k, (beh, inv, prog) in enumerate(steps):
        mode = beh | (1 if inv else 0) << 8 | (STEP_BYTES if 0 <= bytes_from <= k else 0)
        head += [mode, base + len(body), len(prog), 0]
        body += prog
    return head + body


def unpack_steps(words: list[int]):
    """-> (steps, bytes_from)."""
    n = words[0]
    out, bytes_from = [], -1
    for k in range(n):
        mode, off, ln = words[1 + 4 * k:4 + 4 * k]
        out.append((mode & 0xFF, bool(mode >> 8 & 1), list(words[off:off + ln])))
        if mode & STEP_BYTES and bytes_from < 0:
            bytes_from = k
    return out, bytes_from


def _to_alphabet(t: str, pieces, alphabet: dict) -> tuple[str, list]:
    """t in the byte alphabet (a character a UTF-8 byte) and the pieces'
    (start, end) moved to it."""
    at = [0]
    for c in t:
        at.append(at[-1] + len(c.encode("utf-8")))
    return ("".join(alphabet[b] for b in t.encode("utf-8")),
            [(at[a], at[b]) for a, b in pieces])


def pre_tokenize_steps(steps, t: str, bytes_from: int = -1,
                       alphabet: dict | None = None) -> list[str]:
    """The pieces of t after every step (each step splits each piece of the
    previous one, as tokenizers' Sequence does). bytes_from >= 0: from that
    step on, t is in ByteLevel's byte alphabet (alphabet: byte -> its
    character) and so are the pieces returned."""
    pieces = [(0, len(t))] if t else []
    for k, (beh, inv, prog) in enumerate(steps):
        if k == bytes_from:
            t, pieces = _to_alphabet(t, pieces, alphabet)
        nxt = []
        for a, b in pieces:
            nxt += [(s, e) for s, e in split_pieces(prog, beh, inv, t, a, b) if e > s]
        pieces = nxt
    return [t[a:b] for a, b in pieces]
