"""Pre-tokenizers stored as regex programs (FORMAT.md 7.2, colibri/text/tokregex.py,
src/tokenizer.c rx_match): byte-level BPEs trained here with the pre-tokenizers
of real tokenizer.json files (GPT-2, Qwen2 and Llama-3 as programs, Qwen3.5
with \\p{M}, DeepSeek LLM / Coder / V3 with several Splits, StarCoder's Digits +
ByteLevel, and every Split behaviour), judged by Hugging Face `tokenizers`:
ids on 10,000 strings per tokenizer in C (one driver process per tokenizer),
3,000 in Python, a sample under ASan/UBSan and under QEMU (armv7, ppc), the
Unicode classes on every code point, and what is refused."""
from __future__ import annotations

import json
import struct

import pytest

from colibri.text import tokenizer as T
from colibri.text import tokregex as R

import tokenizer_fixtures as tf
from test_runtime_support import c_build  # noqa: F401
from test_tokenizer import strings, trained  # noqa: F401
from test_tokenizer_c import (HOSTILE_REQUESTS, both_readers_verdict, driver,  # noqa: F401
                              ids_req, run, run_raw)

tokenizers = pytest.importorskip("tokenizers")

N_PY = 3000
# The built-in regexes (pretok 1..3) also stored as programs: the matcher is
# judged on the three most used patterns too.
AS_PROGRAM = ("bl-gpt2-300", "bl-qwen2-32k", "bl-llama3")
KINDS = tf.PROGRAM_KINDS + tuple(k + "/program" for k in AS_PROGRAM)


@pytest.fixture(scope="session")
def program_tok(trained):
    """kind -> (tokenizers.Tokenizer, section bytes little-endian, big-endian)."""
    text = tf.corpus_text(1_000_000)
    cache = {}

    def get(kind):
        if kind not in cache:
            base = kind.split("/")[0]
            hf = trained(base) if base in tf.KINDS else tf.train_program_kind(base, text)
            spec = T.spec_from_json(json.loads(hf.to_str()), builtin="/" not in kind)
            if "/" in kind or base not in ("bl-llama3", "bl-qwen2-nfc", "bl-qwen2-nfkc"):
                assert spec.pretok == T.PRETOK_PROGRAM, spec.what
            cache[kind] = (hf, spec, T.pack_section(spec, "little"), T.pack_section(spec, "big"))
        return cache[kind]
    return get


@pytest.mark.parametrize("kind", KINDS)
def test_python_ids_equal_tokenizers(program_tok, strings, kind):
    hf, _, sec, _ = program_tok(kind)
    tok = T.Tokenizer(T.parse_section(sec))
    bad = [b for b in strings[:N_PY]
           if tok.encode(b) != hf.encode(tf.hf_text(b), add_special_tokens=False).ids]
    assert not bad, f"{len(bad)} of {N_PY} differ, first {bad[:3]!r}"


def _check_c(drv, hf, sec: bytes, strs, tmp, ids_per_byte: int = 4):
    """ids_per_byte: the id buffer's size (NFKC: U+FDFA's 3 bytes are 18
    characters, 33 bytes)."""
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "section.bin"
    path.write_bytes(sec)
    want = [hf.encode(tf.hf_text(b), add_special_tokens=False).ids for b in strs]
    got = run(drv, "section", path, [ids_req(b, cap=ids_per_byte * len(b) + 8) for b in strs],
              tmp / "t")
    bad = [(b, w, g) for b, w, (rc, _, g) in zip(strs, want, got) if rc != 0 or g != w]
    assert not bad, f"{len(bad)} of {len(strs)} differ, first {bad[:2]!r}"


@pytest.mark.parametrize("kind", KINDS)
def test_c_ids_equal_tokenizers_on_10000_strings(driver, program_tok, strings, kind, tmp_path):
    hf, _, sec, _ = program_tok(kind)
    _check_c(driver("host"), hf, sec, strings, tmp_path)


@pytest.mark.parametrize("kind", ["bl-deepseek-llm", "bl-behaviours", "bl-qwen35",
                                  "bl-gpt2-300/program", "bl-falcon"])
def test_c_under_asan_ubsan_big_endian(driver, program_tok, strings, kind, tmp_path):
    hf, _, _, sec_be = program_tok(kind)
    _check_c(driver("asan"), hf, sec_be, strings[:1500], tmp_path)


@pytest.mark.parametrize("variant", ["armv7", "ppc"])
@pytest.mark.parametrize("kind", ["bl-deepseek-coder", "bl-behaviours"])
def test_c_under_qemu(driver, program_tok, strings, kind, variant, tmp_path):
    hf, _, sec, sec_be = program_tok(kind)
    _check_c(driver(variant), hf, sec_be if variant == "ppc" else sec, strings[:300], tmp_path)


def test_byte_alphabet_steps_are_checked_by_both_readers(driver, program_tok, tmp_path):
    """The byte-alphabet bit (FORMAT.md 7.2) missing on a step after one that
    has it, past the known mode bits, or in a SentencePiece model: -31 in C,
    TokenizerError in Python; the section as written, and one whose first
    step is over the bytes too (a ByteLevel without its regex first), are
    taken by both."""
    _, spec, sec, _ = program_tok("bl-falcon")
    assert spec.bytes_from == 1 and len(spec.steps) == 4
    off = struct.unpack_from("<I", sec, 8 + 4 * 19)[0]       # off_pretok
    assert both_readers_verdict(driver("asan"), sec, tmp_path) == 0

    def mode(k, value):
        b = bytearray(sec)
        struct.pack_into("<I", b, off + 4 * (1 + 4 * k), value)
        return bytes(b)
    m = [struct.unpack_from("<I", sec, off + 4 * (1 + 4 * k))[0] for k in range(4)]
    assert [bool(x & R.STEP_BYTES) for x in m] == [False, True, True, True]
    sp = bytearray(sec)
    struct.pack_into("<I", sp, 8, T.MODEL_SENTENCEPIECE)
    # taken, and the same ids: the first step over the bytes, and (a flag no
    # writer sets with several steps) ADD_PREFIX_SPACE's space before them
    pfx = bytearray(sec)
    struct.pack_into("<I", pfx, 16, struct.unpack_from("<I", sec, 16)[0] | T.F_ADD_PREFIX_SPACE)
    texts = [b"x 12345 y\xb2", b"Hello \xff\xfe 2024", "caf\u00e9 \u00b2\u00b3".encode()]
    for k, b in enumerate((mode(0, m[0] | R.STEP_BYTES), bytes(pfx))):
        assert both_readers_verdict(driver("asan"), b, tmp_path) == 0
        got = run(driver("asan"), "section", tmp_path / "damaged.bin",
                  [ids_req(x) for x in texts], tmp_path / f"t{k}")
        tok = T.Tokenizer(T.parse_section(b))
        assert [g for _, _, g in got] == [tok.encode(x) for x in texts], k
    for b in (mode(2, m[2] & ~R.STEP_BYTES), mode(3, m[3] | 1 << 10), bytes(sp)):
        assert both_readers_verdict(driver("asan"), b, tmp_path) == 11


def test_punctuation_differs_from_tokenizers_only_where_unicode_changed():
    """tokenizers' Punctuation pre-tokenizer takes its P* from an old
    Unicode (the unicode_categories crate); ours is Unicode 16.0's. Every
    code point from U+0021 alone between two 'a': they differ on about 140,
    and on each one either `tokenizers` agrees with Unicode 3.2's category
    or Unicode 3.2 did not have the code point (assigned, or recategorised,
    since). Text holding one of them can split differently there (FORMAT.md
    7.2)."""
    import unicodedata as ud
    pt = tokenizers.pre_tokenizers.Punctuation(behavior="isolated")
    prog = R.single_class(R.PUNCT_ITEMS)
    ascii_p = set('!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~')
    differ = []
    for c in range(0x21, 0x110000):
        if 0xD800 <= c < 0xE000:
            continue
        theirs = len(pt.pre_tokenize_str(f"a{chr(c)}a")) > 1
        if theirs == (R.match_at(prog, chr(c), 0, 1, 0) == 1):
            continue
        old = ud.ucd_3_2_0.category(chr(c))
        assert theirs == (old.startswith("P") or chr(c) in ascii_p) or old == "Cn", hex(c)
        differ.append(c)
    assert 0 < len(differ) < 160, len(differ)


def test_the_classes_are_oniguruma_s_on_every_code_point():
    """\\p{..} (General_Category of Unicode 16.0 from the generated table), \\s
    and \\d as the compiled classes match them, against `tokenizers`' own
    Oniguruma (a Split of each code point between NULs). The table against
    unicodedata2 on every code point; the classes (functions of the category,
    \\s of the code point below U+3100) on the first and last code point of
    every category run and on every code point below U+3100."""
    ud = pytest.importorskip("unicodedata2")
    from tokenizers import Regex, pre_tokenizers
    from colibri.text import unicode_tables as U
    assert ud.unidata_version == U.UNICODE_VERSION == "16.0.0"
    every = [c for c in range(1, 0x110000) if not 0xD800 <= c < 0xE000]
    assert all(U.GC_NAMES[R.gc_of(c)] == ud.category(chr(c)) for c in every)
    firsts = [r >> 5 for r in U.GC_RUNS] + [0x110000]
    edges = {c for a, b in zip(firsts, firsts[1:]) for c in (a, b - 1)}
    cps = sorted(c for c in edges | set(range(1, 0x3100)) if c and not 0xD800 <= c < 0xE000)
    text = ["".join(chr(c) + "\0" for c in cps)]
    for pat in (r"\p{L}", r"\p{N}", r"\p{M}", r"\p{P}", r"\p{S}", r"\p{Lu}", r"\p{Ll}",
                r"\p{Lo}", r"\p{Nd}", r"\p{Z}", r"\s", r"\d", r"[^\s\p{L}\p{M}\p{N}]",
                r"\P{L}", r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"):
        prog = R.compile_regex(pat)
        ours = {c for c in cps if R.match_at(prog, chr(c), 0, 1, 0) == 1}
        ours |= {0} if R.match_at(prog, "\0", 0, 1, 0) == 1 else set()
        # invert + Removed: only the matches are kept, one character each
        split = pre_tokenizers.Split(Regex(pat), behavior="removed", invert=True)
        hf = set()
        for s in text:
            for p, _ in split.pre_tokenize_str(s):
                assert len(p) == 1, (pat, p)
                hf.add(ord(p))
        assert ours == hf, (pat, sorted(ours ^ hf)[:10])


@pytest.mark.parametrize("pattern, what", [
    (r"(?:ab)+", "unbounded repeat of a group"),
    (r"a*", "can match the empty string"),
    (r"(?<=a)b", "look-behind"),
    (r"\w+", "\\w"),
    (r"(\d)\1", "escape \\1"),
    (r"[a[b]]", "nested class"),
    (r"a++", "possessive"),
    (r"(?x)a", "group option"),
])
def test_unsupported_regex_is_refused_by_name(pattern, what):
    tj = {"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
              tf._split(pattern), tf._BL]}, "decoder": {"type": "ByteLevel"}}
    with pytest.raises(T.UnsupportedTokenizer) as exc:
        T.spec_from_json(tj)
    msg = str(exc.value)
    assert what in msg and "\n" not in msg and "Split" in msg, msg


def test_unsupported_components_are_refused_by_name():
    base = {"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
            "decoder": {"type": "ByteLevel"}}
    for pre, what in (
            ({"type": "Sequence", "pretokenizers": [{"type": "UnicodeScripts"}, tf._BL]},
             "UnicodeScripts"),
            ({"type": "Sequence", "pretokenizers": [tf._BL, tf._split("a"), tf._BL]},
             "with one ByteLevel"),
            ({"type": "Sequence", "pretokenizers": [tf._split("a"),
                                                    dict(tf._BL, add_prefix_space=True)]},
             "add_prefix_space"),
            ({"type": "Sequence", "pretokenizers": [tf._split("a", "Sideways"), tf._BL]},
             "Sideways")):
        with pytest.raises(T.UnsupportedTokenizer, match=what):
            T.spec_from_json(dict(base, pre_tokenizer=pre))


def _with_program(sec: bytes, words: list[int]) -> bytes:
    """The section with its (one-step) program replaced by `words` (same
    length: the step table stays valid)."""
    h = struct.unpack_from("<22I", sec, 8)
    off = h[19]
    steps = struct.unpack_from("<5I", sec, off)
    start = off + 4 * steps[2]
    b = bytearray(sec)
    struct.pack_into(f"<{len(words)}I", b, start, *words)
    return bytes(b)


def test_c_and_python_refuse_programs_that_could_loop_or_run_off(driver, program_tok, tmp_path):
    """A jump backwards, a jump into an instruction, an unknown opcode, a
    program not ending with MATCH: both readers refuse the section (the
    model still loads; the tokenizer calls fail with a format error)."""
    hf, spec, sec, _ = program_tok("bl-starcoder")
    prog = spec.steps[0][2]
    assert len(prog) == 4            # CLASS of one item (3 words), MATCH
    cases = [[R.OP_JMP, 0, R.OP_MATCH, R.OP_MATCH],           # backwards (to itself)
             [R.OP_SPLIT, 1, 3, R.OP_MATCH],                  # into its own words
             [0x77] + prog[1:],                              # unknown opcode
             prog[:-1] + [R.OP_LOOKEND]]                     # no MATCH at the end
    for k, words in enumerate(cases):
        bad = _with_program(sec, words)
        with pytest.raises(T.TokenizerError):
            T.parse_section(bad)
        p = tmp_path / f"bad{k}.bin"
        p.write_bytes(bad)
        build, exe = driver("host")
        import subprocess
        proc = subprocess.run([*build.runner, str(exe), "section", str(p), str(p), str(p) + ".o"],
                              capture_output=True, text=True)
        assert proc.returncode == 11 and "error -31" in proc.stdout, (k, proc.stdout)


def test_c_backtrack_stack_full_is_an_error_not_a_wrong_answer(driver, tmp_path):
    """70 optional classes in a row push 70 backtrack entries: beyond
    COLIBRI_TOK_RX_STACK (64) colibri_tokenize returns COLIBRI_E_TOK_REGEX;
    text that needs fewer tokenizes as tokenizers does."""
    from tokenizers import Tokenizer
    pat = r"\p{L}?" * 70 + "x"
    tj = {"version": "1.0", "added_tokens": [], "normalizer": None, "post_processor": None,
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [tf._split(pat), tf._BL]},
          "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                      "use_regex": True},
          "model": {"type": "BPE", "vocab": {T.BYTE_TO_CHAR[b]: b for b in range(256)},
                    "merges": []}}
    hf = Tokenizer.from_str(json.dumps(tj))
    spec = T.spec_from_json(tj)
    p = tmp_path / "s.bin"
    p.write_bytes(T.pack_section(spec))
    texts = [b"a" * 80 + b"x", b"a" * 60 + b"x", b"ab x", b"x"]
    got = run(driver("host"), "section", p, [ids_req(t) for t in texts], tmp_path / "t")
    assert got[0][0] == -35
    for t, (rc, _, ids) in zip(texts[1:], got[1:]):
        assert rc == 0 and ids == hf.encode(t.decode()).ids
        assert T.Tokenizer(spec).encode(t) == ids
    # The Python matcher has no stack bound: its memo of failed states keeps
    # the exponential backtracking of the 80-letter text polynomial. Oniguruma
    # (tokenizers) gives up on it ("retry-limit-in-match"), so the judge is
    # the regex's meaning: 70 optional letters then x first match at
    # position 10 (the last 70 letters and the x), and the 10 letters
    # before it are the unmatched piece.
    t = texts[0].decode()
    prog = R.compile_regex(pat)
    assert [t[a:b] for a, b in R.split_pieces(prog, R.B_ISOLATED, False, t, 0, len(t))] == \
        ["a" * 10, "a" * 70 + "x"]


def test_version_1_sections_stay_version_1():
    """A tokenizer the built-in pretok ids describe is still written as
    version 1 (older readers read it); a stored program makes version 2,
    which a version-1 reader refuses (its version check)."""
    tj = {"model": {"type": "BPE", "vocab": {T.BYTE_TO_CHAR[b]: b for b in range(256)},
                    "merges": []},
          "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
          "decoder": {"type": "ByteLevel"}}
    assert struct.unpack_from("<H", T.pack_section(T.spec_from_json(tj)), 4)[0] == 1
    assert struct.unpack_from("<H", T.pack_section(T.spec_from_json(tj, builtin=False)),
                              4)[0] == 2


@pytest.fixture(scope="session")
def groups_driver(tmp_path_factory):
    """tokenize_driver built as Cortex-M builds the tokenizer: with the small
    Unicode table (-DCOLIBRI_TOK_GC_GROUPS: 8 category groups), on the host."""
    import subprocess
    from colibri.buildsteps import sources
    from test_runtime_support import TESTS_C
    out = tmp_path_factory.mktemp("groups") / "tokenize_driver"
    root = TESTS_C.parent.parent
    subprocess.run(["gcc", "-std=c11", "-O1", "-ffp-contract=off", "-DCOLIBRI_TOK_GC_GROUPS",
                    "-DCOLIBRI_KERNELS_REF_ONLY", "-DCOLIBRI_ENABLE_MMAP=1", "-Isrc/include",
                    "-Isrc", "-Isrc/kernels", str(TESTS_C / "tokenize_driver.c"),
                    *sources.LIBRARY, "-lm", "-lpthread", "-o", str(out)],
                   cwd=root, check=True, timeout=600)

    class B:
        runner = ()
    return B(), out


@pytest.mark.parametrize("kind", ["bl-deepseek-llm", "bl-starcoder", "bl-qwen35",
                                  "bl-behaviours", "bl-gpt2-300/program", "bl-qwen2-32k"])
def test_small_unicode_table_build_gives_the_same_ids(groups_driver, program_tok, trained,
                                                      strings, kind, tmp_path):
    """The Cortex-M table (category groups) classifies \\p{L} \\p{N} \\p{M} \\p{P}
    \\p{S} exactly: the same ids as tokenizers (bl-qwen2-32k: the built-in
    Qwen2 matcher, a version 1 section)."""
    if kind in tf.KINDS:
        hf = trained(kind)
        sec = T.pack_section(T.spec_from_json(json.loads(hf.to_str())))
    else:
        hf, _, sec, _ = program_tok(kind)
    _check_c(groups_driver, hf, sec, strings[:3000], tmp_path)


def test_small_unicode_table_build_refuses_finer_categories(groups_driver, tmp_path):
    """\\d is \\p{Nd}, finer than the N group: that build says unsupported
    (COLIBRI_E_UNSUPPORTED at init), it does not guess."""
    import subprocess
    tj = {"model": {"type": "BPE", "vocab": {T.BYTE_TO_CHAR[b]: b for b in range(256)},
                    "merges": []},
          "pre_tokenizer": {"type": "Sequence", "pretokenizers": [tf._split(r"\d+"), tf._BL]},
          "decoder": {"type": "ByteLevel"}}
    p = tmp_path / "s.bin"
    p.write_bytes(T.pack_section(T.spec_from_json(tj)))
    _, exe = groups_driver
    proc = subprocess.run([str(exe), "section", str(p), str(p), str(p) + ".o"],
                          capture_output=True, text=True)
    assert proc.returncode == 11 and "error -12 " in proc.stdout, proc.stdout


def nfc_strings(n: int = 3000) -> list[bytes]:
    """Text that NFC changes: decomposed accents, marks out of canonical
    order, singletons (U+212B), excluded composites, Hangul jamo (L V T),
    composed and decomposed Vietnamese, marks at the start of a run, long
    mark runs, mixed with the ordinary strings."""
    import random
    rng = random.Random(25)
    atoms = ["e\u0301", "A\u030a", "\u212b", "\u2126", "a\u0323\u0302", "a\u0302\u0323",
             "o\u031b\u0301", "\u1100\u1161", "\u1100\u1161\u11a8", "\uac00\u11a8",
             "\u1112\u1161\u11ab\u1100\u1173\u11af", "\u0344", "\u0958", "\u2adc",
             "Vie\u0323\u0302t Nam", "\u0301abc", "q\u0307\u0323", "\u0915\u093c",
             "e" + "\u0301\u0316" * 8, "\u00e9\u0301", "\u1e0b\u0323", "\u0f73",
             "\U0001d15e", "\u30ab\u3099", "\u304b\u309a", "\u05d0\u05b7\u05bc"]
    base = tf.test_strings(n, seed=31)
    out = []
    for b in base:
        s = tf.hf_text(b)
        k = rng.randrange(len(s) + 1)
        out.append((s[:k] + "".join(rng.choice(atoms) for _ in range(rng.randint(1, 4)))
                    + s[k:]).encode())
    return out


@pytest.mark.parametrize("kind", ["bl-qwen2-nfc", "bl-qwen35"])
def test_nfc_python_and_c_equal_tokenizers(driver, program_tok, kind, tmp_path):
    hf, spec, sec, sec_be = program_tok(kind)
    assert spec.flags & T.F_NFC and struct.unpack_from("<H", sec, 4)[0] == 2
    strs = nfc_strings()
    tok = T.Tokenizer(T.parse_section(sec))
    bad = [b for b in strs if tok.encode(b) != hf.encode(tf.hf_text(b),
                                                        add_special_tokens=False).ids]
    assert not bad, f"Python: {len(bad)} of {len(strs)} differ, first {bad[:3]!r}"
    _check_c(driver("host"), hf, sec, strs, tmp_path / "le")
    _check_c(driver("asan"), hf, sec_be, strs[:800], tmp_path / "be")


def byte_pieces_json(normalizer: str) -> dict:
    """A tokenizer.json whose pieces are the 256 single bytes, one word a
    line: its ids are the normalised text's bytes."""
    return {"version": "1.0", "added_tokens": [], "normalizer": {"type": normalizer},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"String": "\n"}, "behavior": "Isolated",
                 "invert": False}, tf._BL]},
            "model": {"type": "BPE", "vocab": {T.BYTE_TO_CHAR[b]: b for b in range(256)},
                      "merges": []}}


def check_every_code_point(driver, normalizer: str, divergent: set, tmp_path) -> list:
    """Every code point from U+00A0 alone and between 'a' and U+0301,
    normalised, then single-byte pieces: Python equals `tokenizers` except
    on `divergent` code points and on combining marks newer than
    `tokenizers`' data (Unicode 3.2 did not have them, and there they block
    composition as unassigned starters); C equals Python on every one.
    Returns the texts where Python and `tokenizers` differ."""
    import unicodedata as ud
    from tokenizers import Tokenizer
    tj = byte_pieces_json(normalizer)
    hf = Tokenizer.from_str(json.dumps(tj))
    spec = T.spec_from_json(tj)
    tok = T.Tokenizer(spec)
    cps = [c for c in range(0xA0, 0x30000) if not 0xD800 <= c < 0xE000]
    texts = [f"{p}{chr(c)}{q}" for c in cps for p, q in (("", ""), ("a", "\u0301"))]
    ours = [tok.encode(s) for s in texts]
    diverge = []
    for s, g in zip(texts, ours):
        c = s[0] if len(s) == 1 else s[1]
        if ord(c) in divergent or g == hf.encode(s).ids:
            continue
        assert s[0] == "a" and ud.combining(c) and ud.ucd_3_2_0.category(c) == "Cn", s
        diverge.append(s)
    # chunks whose normal form fits COLIBRI_TOK_NORM_BUF
    check_c_equals_python(driver, spec, tok, texts, tmp_path, per_chunk=100)
    return diverge


def check_c_equals_python(driver, spec, tok, texts, tmp_path, per_chunk):
    """The host C library's ids equal the Python tokenizer's on texts,
    joined by newlines per_chunk at a time."""
    p = tmp_path / "s.bin"
    p.write_bytes(T.pack_section(spec))
    chunks = ["\n".join(texts[k:k + per_chunk]) for k in range(0, len(texts), per_chunk)]
    got = run(driver("host"), "section", p, [("T", 2, 24 * len(c.encode()) + 64, c.encode())
                                             for c in chunks], tmp_path / "t")
    for k, (rc, _, g) in enumerate(got):
        assert rc == 0 and g == tok.encode(chunks[k]), k


def test_nfc_of_every_code_point_equals_tokenizers(driver, tmp_path):
    """The C tables (scripts/gen_unicode_norm.py, Python's Unicode 14.0) and
    the Python encoder against `tokenizers`' NFC: every code point from U+00A0
    alone, and between 'a' and U+0301 (composition across it), through a
    tokenizer whose pieces are single bytes. The one known divergence:
    `tokenizers`' normalisation data is older than Unicode 11, so combining
    marks assigned since (51 code points: U+07FD, U+0899..) are to it
    unassigned starters that block composition; each such code point must be
    a combining mark that Unicode 3.2 did not have, and only between 'a' and
    U+0301. C and Python agree on every code point."""
    diverge = check_every_code_point(driver, "NFC", set(), tmp_path)
    assert len(diverge) <= 60


# --- NFKC (flag 15, the map stored in the section: FORMAT.md 7.3) -----------
NFKC_ATOMS = ["\ufb01", "\ufb00", "\uff21\uff42\uff43", "\u2460\u2461", "\u3300", "\uff76\uff9e",
              "\uff76\u3099", "\u00b2\u00b3", "\u210c", "\U0001d400\U0001d401", "\u3131\u314f",
              "\u1100\u314f", "\u01c5", "\u1e9b\u0323", "\ufdfa", "\u2026", "\u00bd", "\u216b",
              "\u00a0x", "\u2002x", "\uff9f", "e\u0301", "\u212b", "\u017f\u0307", "\u33c2",
              "\u2474", "\ufe37", "\u1d2c", "\u32d0", "\u3192", "\u2155", "\u01c4\u030c",
              "\u0344", "\u1100\u1161\u11a8", "\ufb2c", "\u2fd5", "\u1f71\u0345"]


@pytest.fixture(scope="module")
def nfkc_divergent():
    """The code points whose NFKC `tokenizers` and Python's unicodedata
    (Unicode 14.0, our map's source) give differently, alone: `tokenizers`'
    normalisation data predates Unicode 12, so compatibility mappings
    assigned since (U+32FF, U+A7F2.., U+107xx, ...) are unknown to it. Each
    must be a code point Unicode 3.2 did not have; 72 today."""
    import unicodedata as ud
    from tokenizers import normalizers
    n = normalizers.NFKC()
    out = {c for c in range(0xA0, 0x110000) if not 0xD800 <= c < 0xE000
           and ud.normalize("NFKC", chr(c)) != n.normalize_str(chr(c))}
    assert all(ud.ucd_3_2_0.category(chr(c)) == "Cn" for c in out)
    assert len(out) <= 100, len(out)
    return out


def nfkc_strings(n: int = 3000) -> list[bytes]:
    """The ordinary strings with compatibility characters put in: ligatures,
    fullwidth and halfwidth forms (a halfwidth voiced mark that composes),
    circled and squared letters and numbers, superscripts, Hangul
    compatibility jamo (which compose as L + V), mathematical letters,
    U+FDFA (18 code points), and the canonical cases of nfc_strings."""
    import random
    rng = random.Random(26)
    out = []
    for b in tf.test_strings(n, seed=32):
        s = tf.hf_text(b)
        k = rng.randrange(len(s) + 1)
        out.append((s[:k] + "".join(rng.choice(NFKC_ATOMS) for _ in range(rng.randint(1, 5)))
                    + s[k:]).encode())
    return out


def test_nfkc_python_and_c_equal_tokenizers(driver, program_tok, nfkc_divergent, tmp_path):
    """10,000 strings in C and in Python against `tokenizers`, except the
    strings holding a divergent code point (nfkc_divergent), where C equals
    Python; a sample under ASan/UBSan (big-endian section) and under QEMU
    (armv7, ppc: big-endian)."""
    hf, spec, sec, sec_be = program_tok("bl-qwen2-nfkc")
    assert spec.flags & T.F_NFKC and struct.unpack_from("<H", sec, 4)[0] == 3
    strs = nfkc_strings(10_000)
    judged = [b for b in strs if not any(ord(c) in nfkc_divergent for c in tf.hf_text(b))]
    assert len(judged) > 9000
    tok = T.Tokenizer(T.parse_section(sec))
    bad = [b for b in judged if tok.encode(b) != hf.encode(
        tf.hf_text(b), add_special_tokens=False).ids]
    assert not bad, f"Python: {len(bad)} of {len(judged)} differ, first {bad[:3]!r}"
    _check_c(driver("host"), hf, sec, judged, tmp_path / "le", 12)
    _check_c(driver("asan"), hf, sec_be, judged[:800], tmp_path / "be", 12)
    _check_c(driver("armv7"), hf, sec, judged[:200], tmp_path / "arm", 12)
    _check_c(driver("ppc"), hf, sec_be, judged[:200], tmp_path / "ppc", 12)
    rest = [b for b in strs if b not in set(judged)][:300]
    path = tmp_path / "s.bin"
    path.write_bytes(sec)
    got = run(driver("host"), "section", path, [ids_req(b, cap=12 * len(b) + 8) for b in rest],
              tmp_path / "d")
    assert [g for _, _, g in got] == [tok.encode(b) for b in rest]


@pytest.mark.parametrize("kind", ["bl-qwen2-nfc", "bl-qwen2-nfkc"])
def test_nfc_and_nfkc_on_cortex_m_with_nfc_1_under_qemu(program_tok, nfkc_divergent, kind,
                                                       tmp_path):
    """`scons nfc=1` puts the composition tables in the Cortex-M library
    (whose default leaves them out): NFC and NFKC tokenizers give
    `tokenizers`' ids and text there."""
    from test_tokenizer_c import check_on_cortex_m
    hf = program_tok(kind)[0]
    strs = [b for b in nfkc_strings(400) if not any(ord(c) in nfkc_divergent
                                                    for c in tf.hf_text(b))]
    check_on_cortex_m(hf, strs, tmp_path, scons_vars=("nfc=1",))


def test_nfkc_of_every_code_point_equals_tokenizers(driver, nfkc_divergent, tmp_path):
    """Every code point from U+00A0 alone and between 'a' and U+0301, NFKC
    then single-byte pieces: Python equals `tokenizers` but on the divergent
    code points, and C equals Python on every one."""
    check_every_code_point(driver, "NFKC", nfkc_divergent, tmp_path)


def test_nfkc_map_damage_is_refused_by_both_readers(driver, program_tok, tmp_path):
    """An NFKC map out of order, with a length of 0 or over 18, past its
    pool, a surrogate in the pool, no pool, both NFC and NFKC: -31 in C,
    TokenizerError in Python."""
    _, _, sec, _ = program_tok("bl-qwen2-nfkc")
    off = struct.unpack_from("<I", sec, 8 + 4 * 21)[0]
    n = struct.unpack_from("<I", sec, off)[0]
    ext = {k: (o, c) for k, o, c, _ in (struct.unpack_from("<4I", sec, off + 4 + 16 * i)
                                        for i in range(n))}
    moff, nm = ext[T.EXT_NFKC_MAP]
    poff, npool = ext[T.EXT_NFKC_POOL]
    cases = []

    def edit(at, value, fmt="<I"):
        b = bytearray(sec)
        struct.pack_into(fmt, b, at, value)
        cases.append(bytes(b))
    first = struct.unpack_from("<I", sec, moff + 8)[0]
    edit(moff, first)                                    # entry 0 == entry 1: not sorted
    at1 = struct.unpack_from("<I", sec, moff + 4)[0]
    edit(moff + 4, at1 & ~31)                            # length 0
    edit(moff + 4, (at1 & ~31) | 19)                     # length 19
    edit(moff + 8 * (nm - 1) + 4, (npool << 5) | 1)      # past the pool
    edit(poff, 0xD800)                                   # a surrogate
    edit(off, n - 1)                                     # the pool's entry dropped
    flags = struct.unpack_from("<I", sec, 16)[0]
    edit(16, flags | T.F_NFC)                            # NFC and NFKC
    edit(moff, 0x110000)                                 # not a code point
    for k, b in enumerate(cases):
        with pytest.raises(T.TokenizerError):
            T.parse_section(b)
        p = tmp_path / f"h{k}.bin"
        p.write_bytes(b)
        proc = run_raw(driver("asan"), p, HOSTILE_REQUESTS, tmp_path)
        assert proc.returncode == 11 and proc.stdout.startswith("error -31"), (k, proc.stdout)


def test_whitespace_pre_tokenizer_on_every_code_point():
    """The Whitespace pre-tokenizer as stored (colibri/text/tokenizer.py
    WHITESPACE_PATTERN: Unicode's word class spelled out) cuts like
    `tokenizers`' own between two letters, and after a space, for every code
    point up to U+2FFFF."""
    from tokenizers import pre_tokenizers
    hf = pre_tokenizers.Whitespace()
    prog = R.compile_regex(T.WHITESPACE_PATTERN)
    bad = []
    for cp in range(0x80, 0x30000):
        if 0xD800 <= cp < 0xE000:
            continue
        for s in (f"a{chr(cp)}b", f" {chr(cp)}!", f"{chr(cp)}{chr(cp)} x"):
            want = [p for p, _ in hf.pre_tokenize_str(s)]
            if R.pre_tokenize_steps([(R.B_REMOVED, True, prog)], s) != want:
                bad.append(hex(cp))
    assert not bad, f"{len(bad)} code points cut differently, first {bad[:10]}"
