"""Normaliser programs (FORMAT.md 7.4, colibri/text/normalizer.py,
src/tokenizer.c norm_program): the Sequences of Strip, Replace (string and
regex), Prepend and Lowercase after NFC that real tokenizer.json files carry
(tests/tokenizer_fixtures.py NORM_KINDS: transformers 5's SentencePiece and
T5 conversions, CLIP's normaliser, and a mix), on tokenizers trained here by
Hugging Face `tokenizers`, which judges: ids and decoded text on 10,000
strings each in Python and in C, a sample under ASan/UBSan (big-endian
section), QEMU (armv7, ppc) and Cortex-M; Lowercase on every code point;
the run bound; damaged and hostile programs; what is refused by name."""
from __future__ import annotations

import json
import random
import struct
import unicodedata

import pytest

from colibri.text import normalizer as N
from colibri.text import tokenizer as T
from colibri.text import tokregex as R

import tokenizer_fixtures as tf
from test_runtime_support import c_build  # noqa: F401
from test_tokenizer import strings  # noqa: F401
from test_tokenizer_c import (HOSTILE_TEXT, assert_both_readers_refuse,  # noqa: F401
                              both_readers_verdict, check_kind, check_on_cortex_m, driver,
                              ids_req, run)
from test_tokenizer_program import byte_pieces_json, check_c_equals_python

tokenizers = pytest.importorskip("tokenizers")

E_TOK_NORM = -36
NORM_BUF = 4096                 # COLIBRI_TOK_NORM_BUF's default


@pytest.fixture(scope="session")
def normed():
    text = tf.corpus_text(1_000_000)
    return tf.memo(lambda kind: tf.train_norm_kind(kind, text))


@pytest.fixture(scope="session")
def lower_divergent() -> frozenset:
    """The code points whose lowercase `tokenizers` (Rust's Unicode) and this
    Python (its unicodedata) disagree on: each must be unassigned in
    Python's Unicode (a letter newer than it), or the test fails here."""
    lo = tokenizers.normalizers.Lowercase()
    chars = [chr(c) for c in range(1, 0x110000) if not 0xD800 <= c < 0xE000]
    theirs = lo.normalize_str("\x00".join(chars)).split("\x00")
    assert len(theirs) == len(chars)
    lm = N.lower_map()
    out = frozenset(ord(c) for c, o in zip(chars, theirs) if lm.get(ord(c), c) != o)
    assert all(unicodedata.category(chr(c)) == "Cn" for c in out), sorted(out)[:10]
    assert len(out) < 100, len(out)
    return out


def _spec(hf) -> T.TokenizerSpec:
    return T.spec_from_json(json.loads(hf.to_str()))


def _judged(kind, strings, divergent):
    """The strings `tokenizers` can judge for kind: with Lowercase, none
    holding a code point of `divergent` (a handful of the 10,000)."""
    if "Lowercase" not in json.dumps(tf.norm_program_json(kind)):
        return list(strings)
    out = [b for b in strings if not any(ord(c) in divergent for c in tf.hf_text(b))]
    assert len(out) > len(strings) - 50
    return out


def test_the_trained_tokenizers_store_programs(normed):
    for kind in tf.NORM_KINDS:
        spec = _spec(normed(kind))
        assert spec.flags & T.F_NORM_PROG and spec.norm, kind
        sec = T.pack_section(spec)
        assert struct.unpack_from("<H", sec, 4)[0] == T.SECTION_VERSION_UNIGRAM
        assert T.parse_section(sec).norm == spec.norm
    clip = _spec(normed("bl-clip"))
    assert clip.flags & T.F_NFC and "NFC + Replace, Lowercase" in clip.what
    assert "normaliser Replace, Lowercase" in T.describe(clip)
    t5 = _spec(normed("t5-tf5"))
    assert t5.model == T.MODEL_UNIGRAM and "Strip(right), Replace" in t5.what
    # the shapes older files carry are flags, as before: no program
    for old in ({"type": "NFC"}, {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}):
        assert T._parse_normalizer(old)[2] == []


@pytest.mark.parametrize("kind", tf.NORM_KINDS)
def test_python_ids_and_text_equal_tokenizers_on_10000_strings(normed, strings, kind,
                                                               lower_divergent):
    hf = normed(kind)
    tok = T.Tokenizer(T.parse_section(T.pack_section(_spec(hf), "big")))
    strs = _judged(kind, strings, lower_divergent)
    bad = [b for b in strs if tok.encode(b) != hf.encode(tf.hf_text(b),
                                                         add_special_tokens=False).ids]
    assert not bad, f"{len(bad)} of {len(strs)} differ, first {bad[:3]!r}"
    ids = [hf.encode(tf.hf_text(b), add_special_tokens=False).ids for b in strs[:2000]]
    for skip in (False, True):
        bad_text = [i for i in ids if tok.decode(i, skip) != hf.decode(i, skip_special_tokens=skip)]
        assert not bad_text, bad_text[:3]


@pytest.mark.parametrize("kind", tf.NORM_KINDS)
def test_c_ids_and_text_equal_tokenizers_on_10000_strings(driver, normed, strings, kind,
                                                          lower_divergent, tmp_path):
    check_kind(driver("host"), normed(kind), _judged(kind, strings, lower_divergent),
               tmp_path, n_random=1000)


@pytest.mark.parametrize("kind", tf.NORM_KINDS)
def test_c_under_asan_ubsan_big_endian(driver, normed, strings, kind, lower_divergent,
                                       tmp_path):
    check_kind(driver("asan"), normed(kind), _judged(kind, strings[:1500], lower_divergent),
               tmp_path, "big", n_random=200)


@pytest.mark.parametrize("variant", ["armv7", "ppc"])
def test_c_under_qemu(driver, normed, strings, variant, tmp_path):
    for kind in ("spm-tf5", "t5-tf5", "t5-spm"):
        (tmp_path / kind).mkdir()
        check_kind(driver(variant), normed(kind), strings[:300], tmp_path / kind,
                   "big" if variant == "ppc" else "little", n_random=50)


@pytest.mark.parametrize("kind", ["t5-tf5", "t5-spm"])
def test_c_on_cortex_m_under_qemu(normed, strings, kind, tmp_path):
    """The Cortex-M library (two 512-byte program buffers) gives tokenizers'
    ids for transformers 5's T5 normaliser, without and with the Precompiled
    map (its 240 KB in flash)."""
    check_on_cortex_m(normed(kind), strings, tmp_path)


def test_lowercase_of_every_code_point(driver, lower_divergent, tmp_path):
    """Every code point alone and between 'A' and 'B', lowercased, then
    single-byte pieces: Python equals `tokenizers` but on lower_divergent;
    C equals Python on every one."""
    tj = byte_pieces_json("Lowercase")
    hf = tokenizers.Tokenizer.from_str(json.dumps(tj))
    spec = T.spec_from_json(tj)
    assert spec.norm == [(N.OP_LOWERCASE, 0, [], "")]
    tok = T.Tokenizer(spec)
    cps = [c for c in range(1, 0x30000) if not 0xD800 <= c < 0xE000 and c != 10]
    texts = [f"{p}{chr(c)}{q}" for c in cps for p, q in (("", ""), ("A", "B"))]
    ours = [tok.encode(s) for s in texts]
    bad = [s for s, g in zip(texts, ours)
           if ord(s[len(s) // 2]) not in lower_divergent and g != hf.encode(s).ids]
    assert not bad, bad[:5]
    check_c_equals_python(driver, spec, tok, texts, tmp_path, per_chunk=300)


def test_c_the_run_bound(driver, normed, tmp_path):
    """A run the program rewrites is tokenizers' ids up to
    COLIBRI_TOK_NORM_BUF bytes of normal form, and COLIBRI_E_TOK_NORM past
    it (never a write past the buffers: ASan); a run it leaves alone has no
    bound; an added token starts a new run."""
    hf = normed("t5-tf5")
    fits = [b"a  b " * (NORM_BUF // 6)]                    # "  " -> "▁": 6 bytes each
    same = [b"word " * 3000]                               # nothing to replace
    over = [b"a  b " * (NORM_BUF // 4), "x" * (NORM_BUF - 1) + "  y"]
    over = [o if isinstance(o, bytes) else o.encode() for o in over]
    split = [b"a  b " * 600 + b"<extra_id_0>" + b"a  b " * 600]
    for variant in ("host", "asan"):
        d = tmp_path / variant
        d.mkdir()
        check_kind(driver(variant), hf, fits + same + split, d, n_random=5)
        res = run(driver(variant), "section", d / "section-little.bin",
                  [ids_req(b) for b in over], d / "o")
        assert [rc for rc, _, _ in res] == [E_TOK_NORM] * len(over)


def _damage_program(base: bytes, rng: random.Random) -> bytes:
    """One to three bit flips or overwritten words in the extension
    directory, the program words or the first lowercase map entries."""
    b = bytearray(base)
    ext = struct.unpack_from("<I", base, 8 + 4 * 21)[0]
    poff, pcount = _ext(base, T.EXT_NORM)
    loff, _ = _ext(base, T.EXT_LOWER)
    spans = [(ext, 4 + 16 * 3), (poff, 4 * pcount), (loff, 12 * 40)]
    for _ in range(rng.randint(1, 3)):
        a, n = rng.choice(spans)
        at = a + 4 * rng.randrange(n // 4)
        if rng.random() < 0.5:
            b[at + rng.randrange(4)] ^= 1 << rng.randrange(8)
        else:
            struct.pack_into("<I", b, at, rng.choice([0, 1, 3, 0xFFFFFFFF, 0xD800, 0x110000,
                                                      rng.randrange(1 << 32)]))
    return bytes(b)


def test_c_damaged_programs_never_crash(driver, normed, tmp_path):
    """Bit flips and overwritten words in the program, the lowercase map and
    their directory under ASan/UBSan: both readers refuse the section or
    give the same ids."""
    spec = _spec(normed("bl-mixed"))
    base = T.pack_section(spec)
    rng = random.Random(13)
    verdicts = {}
    for trial in range(120):
        b = _damage_program(base, rng)
        v = both_readers_verdict(driver("asan"), b, tmp_path)
        if v == 0:       # the same ids from a damaged but valid program
            got = run(driver("asan"), "section", tmp_path / "damaged.bin",
                      [ids_req(HOSTILE_TEXT)], tmp_path / "t")
            assert got[0][2] == T.Tokenizer(T.parse_section(b)).encode(HOSTILE_TEXT), trial
        verdicts[v] = verdicts.get(v, 0) + 1
    assert verdicts.get(11, 0) > 45 and verdicts.get(0, 0) > 10, verdicts


def _ext(sec: bytes, kind: int) -> tuple[int, int]:
    off = struct.unpack_from("<I", sec, 8 + 4 * 21)[0]
    for k in range(struct.unpack_from("<I", sec, off)[0]):
        kd, eoff, count, _ = struct.unpack_from("<4I", sec, off + 4 + 16 * k)
        if kd == kind:
            return eoff, count
    raise KeyError(kind)


def _hostile_programs(sec: bytes) -> list[bytes]:
    """Edits of the program words and the lowercase map, each one a check
    both readers make."""
    poff, _ = _ext(sec, T.EXT_NORM)
    loff, lcount = _ext(sec, T.EXT_LOWER)
    n = struct.unpack_from("<I", sec, poff)[0]
    first_off = struct.unpack_from("<I", sec, poff + 8)[0]
    cases = []

    def word(at, value):
        b = bytearray(sec)
        struct.pack_into("<I", b, at, value)
        cases.append(bytes(b))
    word(poff, 0)                                   # no steps
    word(poff, 9)                                   # more than MAX_STEPS
    word(poff + 4, 7)                               # unknown op
    word(poff + 4, N.OP_STRIP | 4 << 8)             # Strip arg past both sides
    word(poff + 8, 1)                               # an offset inside the step table
    word(poff + 8, 0xFFFFFFF0)                      # an offset past the words
    word(poff + 12, 1)                              # Strip with a program
    word(poff + 4 * (1 + 4 * n) + 4 * (first_off - 1 - 4 * n), 0xD800)   # not a program
    word(loff + 12, 0)                              # lowercase maps to nothing
    word(loff + 12 * 2, 0x41)                       # map not sorted
    word(loff + 4, 0x110000)                        # not a scalar value
    # a Prepend content that is a surrogate: the step after Strip, Replace, Replace,
    # Lowercase, Replace is the Prepend (bl-mixed)
    pre = poff + 4 * (1 + 4 * 5)
    pre_off, np_, nc = struct.unpack_from("<3I", sec, pre + 4)
    assert np_ == 0 and nc == 1
    word(poff + 4 * pre_off, 0xDFFF)
    return cases


def test_hostile_programs_are_refused_by_both_readers(driver, normed, tmp_path):
    sec = T.pack_section(_spec(normed("bl-mixed")))
    assert_both_readers_refuse(driver("asan"), _hostile_programs(sec), tmp_path)


def test_a_program_that_matches_empty_ends(driver, normed, tmp_path):
    """A section may hold a pattern that matches the empty string (compiled
    ones never do): Replace and Split count such a match as none, in both
    readers, instead of looping for ever."""
    spec = _spec(normed("t5-tf5"))
    spec.norm = [(N.OP_REPLACE, 0, [R.OP_MATCH], "X")] + spec.norm
    bl = _spec(normed("bl-clip"))
    bl.pretok, bl.steps = T.PRETOK_PROGRAM, [(R.B_ISOLATED, False, [R.OP_MATCH])]
    texts = [b"a  b", "Über  x ".encode(), b" "]
    for k, s in enumerate((spec, bl)):
        tok = T.Tokenizer(T.parse_section(T.pack_section(s)))
        want = [tok.encode(t) for t in texts]
        p = tmp_path / f"e{k}.bin"
        p.write_bytes(T.pack_section(s))
        got = run(driver("host"), "section", p, [ids_req(t) for t in texts], tmp_path / f"t{k}",
                  timeout=30)
        assert [g for _, _, g in got] == want


def _with_normalizer(hf, norm) -> dict:
    tj = json.loads(hf.to_str())
    tj["normalizer"] = norm
    return tj


@pytest.mark.parametrize("norm,match", [
    ({"type": "Sequence", "normalizers": [{"type": "Precompiled", "precompiled_charsmap": "AA"},
                                          {"type": "Strip", "strip_left": False,
                                           "strip_right": True}]},
     "normalizer Precompiled"),
    ({"type": "Sequence", "normalizers": [{"type": "Lowercase"}, {"type": "NFC"}]},
     "NFC after another normaliser"),
    ({"type": "NFKD"}, "normalizer NFKD"),
    ({"type": "BertNormalizer", "lowercase": True}, "normalizer BertNormalizer"),
    ({"type": "Replace", "pattern": {"Regex": "a*"}, "content": ""}, "can match the empty"),
    ({"type": "Replace", "pattern": {"Regex": "(a)\\1"}, "content": ""}, "normalizer Replace"),
    ({"type": "Prepend", "prepend": "x" * 65}, "at most 64 characters"),
    ({"type": "Sequence", "normalizers": [{"type": "Lowercase"}] * 9}, "at most 8"),
])
def test_unsupported_normalizers_are_refused_by_name(normed, norm, match):
    with pytest.raises(T.UnsupportedTokenizer, match=match):
        T.spec_from_json(_with_normalizer(normed("bl-clip"), norm))


def test_normalised_added_tokens_are_refused_with_a_program(normed):
    """tokenizers matches a `normalized: true` added token in the
    normalised text, which a program changes: refused by name."""
    tj = json.loads(normed("bl-clip").to_str())
    tj["added_tokens"][-1]["normalized"] = True
    with pytest.raises(T.UnsupportedTokenizer, match="normalized: true"):
        T.spec_from_json(tj)
