"""The `Precompiled` normaliser (FORMAT.md 7.5; colibri/text/precompiled.py,
grapheme.py; src/tokenizer.c norm_precompiled): SentencePiece's compiled
character map applied per extended grapheme cluster, as the T5 / Switch
tokenizer.json files on the hub carry it.

Judges: `tokenizers` 0.23 (its `Precompiled` normaliser and whole
tokenizers), SentencePiece (the source of the real nmt_nfkc map and of
small maps compiled from rules here), and the `regex` module's `\\X` for
the cluster cuts. The 10,000-string runs of the T5 kind with its map
("t5-spm") are tests/test_tokenizer_normalizer.py's, with the other
normaliser kinds; here: every BMP code point, cluster-hard strings, hostile
and damaged maps and tables, and the fuzzer."""
from __future__ import annotations

import base64
import functools
import io
import json
import random
import shutil
import struct
import tempfile

import pytest

from colibri.text import grapheme as G
from colibri.text import grapheme_table as GT
from colibri.text import normalizer as N
from colibri.text import precompiled as P
from colibri.text import tokenizer as T

import tokenizer_fixtures as tf
from test_runtime_support import c_build  # noqa: F401
from test_tokenizer import strings  # noqa: F401
from test_tokenizer_c import (HOSTILE_TEXT, assert_both_readers_refuse,  # noqa: F401
                              both_readers_verdict, check_kind, driver, ids_req, run)
from test_tokenizer_fuzz import build_fuzzer, run_fuzzer
from test_tokenizer_normalizer import _ext, normed  # noqa: F401
from test_tokenizer_program import byte_pieces_json, check_c_equals_python

tokenizers = pytest.importorskip("tokenizers")
regex = pytest.importorskip("regex")

# Rules compiled by SentencePiece into a small map (normalization_rule_tsv:
# source code points TAB replacement, hex): compositions, a key that is a
# prefix of another, CR LF, a key to nothing, a key of 3 code points.
SMALL_RULES = {"41 301": "C1", "65 301": "E9", "65": "45", "FF21": "41", "FF22": "42",
               "2460": "31", "D": "20", "D A": "20", "B2": "32", "7F": "",
               "1100 1161 11A8": "AC01", "1F1EB 1F1F7": "46 52", "E9 300": "45"}


@functools.lru_cache(maxsize=1)
def small_charsmap() -> bytes:
    import sentencepiece as spm
    tsv = "".join(f"{k}\t{v}\n" for k, v in SMALL_RULES.items())
    out = io.BytesIO()
    with tempfile.NamedTemporaryFile("w", suffix=".tsv") as f:
        f.write(tsv)
        f.flush()
        lines = [" ".join(f"w{i * j % 97}" for j in range(12)) for i in range(400)]
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out,
                                       vocab_size=60, model_type="unigram",
                                       normalization_rule_tsv=f.name, minloglevel=2)
    return tf._proto_field(tf._proto_field(out.getvalue(), 3), 2)


def precompiled_json(charsmap: bytes) -> dict:
    return {"type": "Precompiled",
            "precompiled_charsmap": base64.b64encode(charsmap).decode()}


def byte_pieces_with(charsmap: bytes) -> dict:
    tj = byte_pieces_json("NFC")
    tj["normalizer"] = precompiled_json(charsmap)
    return tj


# Cluster-hard atoms: bases and marks (1, 2, 3 and 4 bytes), CR LF, controls,
# ZWJ emoji and skin tones, flags, Hangul jamo and syllables, a Prepend, a
# SpacingMark, Devanagari conjuncts, and characters nmt_nfkc rewrites (full
# width, circled, half-width kana and voicing marks, ligatures, spaces).
ATOMS = ["a", "e", "z", "A", "\u00e9", "\u00b2", "\u0301", "\u0300", "\u0308", "\u0327",
         "\u20dd", "\u302a", "\U0001d167", "\r", "\n", "\r\n", "\t", "\x01", "\x7f", "\u200d",
         "\u200c", "\ufe0f", "\U0001f468", "\U0001f469", "\U0001f3fb", "\u2764", "\u00a9",
         "\U0001f1eb", "\U0001f1f7", "\U0001f1e9", "\u1100", "\u1161", "\u11a8", "\uac00",
         "\uac01", "\u0600", "\u0903", "\u0915", "\u094d", "\u0937", "\uff21", "\uff42",
         "\u2460", "\uff76", "\uff9e", "\u3099", "\ufb01", "\u3000", "\u00a0", " ", "  ",
         "\u2028", "\ufffd", "\u0e33", "\u0e01", "\U0001f600"]


def cluster_strings(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(ATOMS) for _ in range(rng.randint(1, 9))) for _ in range(n)]


# --- the grapheme clusters ----------------------------------------------------
def test_the_stored_table_is_the_generated_one():
    """The table the converter stores checks out, starts at U+0000 and knows
    the properties the rules need."""
    t = G.Table(GT.RUNS)
    assert GT.UNICODE_VERSION == "17.0.0"
    assert t.props(0x0D) & 15 == G.CR and t.props(0x0A) & 15 == G.LF
    assert t.props(0x0301) & 15 == G.EXTEND and t.props(0x200D) & 15 == G.ZWJ
    assert t.props(0x1F1E6) & 15 == G.RI and t.props(0x0600) & 15 == G.PREPEND
    assert t.props(0xAC00) & 15 == G.LV and t.props(0xAC01) & 15 == G.LVT
    assert t.props(0x1F600) & G.PICT and t.props(0x094D) >> 5 == G.INCB_LINKER


def test_clusters_equal_the_regex_module_outside_gb9c():
    """Our cuts against `regex`'s \\X on 30,000 strings of cluster-hard atoms.
    regex applies GB9c (Indic conjuncts) without the consonant before the
    linker, unlike UAX #29, so the virama is left out here; the Indic cases
    are in the tokenizers runs (where they cannot change the map's result:
    such clusters are 6 bytes or more)."""
    t = G.Table(GT.RUNS)
    atoms = [a for a in ATOMS if a != "\u094d"]
    rng = random.Random(3)
    bad = []
    for _ in range(30000):
        s = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 9)))
        want = [len(m) for m in regex.findall(r"\X", s)]
        if [b - a for a, b in G.clusters(s, t)] != want:
            bad.append(s)
    assert not bad, [ascii(s) for s in bad[:5]]


def test_every_bmp_code_point_after_a_key_equals_tokenizers(driver, tmp_path):
    """Each BMP code point alone, after '²' (a 2-byte key: the pair is one
    cluster of < 6 bytes exactly when the code point extends it, and then
    it is dropped) and after 'z' (whose compositions are keys): the real
    nmt_nfkc map in Python equals `tokenizers`' Precompiled on every one
    (so the table's Unicode version is the one `tokenizers` cuts by), and
    the C library equals Python (single-byte pieces)."""
    cmap = tf.nmt_nfkc_charsmap()
    ours, theirs = P.Precompiled(cmap), tokenizers.normalizers.Precompiled(list(cmap))
    cps = [c for c in range(1, 0x10000) if not 0xD800 <= c < 0xE000]
    texts = [p + chr(c) for c in cps for p in ("", "\u00b2", "z")]
    bad = [s for s in texts if ours.apply(s) != theirs.normalize_str(s)]
    assert not bad, [ascii(s) for s in bad[:5]]
    tj = byte_pieces_with(cmap)
    spec = T.spec_from_json(tj)
    tok = T.Tokenizer(spec)
    sample = texts[::7] + [s for s in texts if len(s) > 1 and ord(s[1]) in range(0x300, 0x370)]
    check_c_equals_python(driver, spec, tok, sample, tmp_path, per_chunk=400)


def test_cluster_hard_strings_equal_tokenizers(driver, normed, tmp_path):
    """The T5 kind with the real map ("t5-spm"): Python and C ids equal
    `tokenizers`' on 6,000 cluster-hard strings, and the small map's
    single-byte tokenizer (shortest key over a longer one, a cluster's tail
    dropped, a 3-code-point key, CR LF) too."""
    hf = normed("t5-spm")
    strs = [s.encode() for s in cluster_strings(6000, seed=1)]
    tok = T.Tokenizer(T.parse_section(T.pack_section(T.spec_from_json(json.loads(hf.to_str())))))
    bad = [b for b in strs if tok.encode(b) != hf.encode(b.decode(),
                                                         add_special_tokens=False).ids]
    assert not bad, bad[:3]
    (tmp_path / "t5").mkdir()
    check_kind(driver("host"), hf, strs, tmp_path / "t5", n_random=100)
    small = tokenizers.Tokenizer.from_str(json.dumps(byte_pieces_with(small_charsmap())))
    (tmp_path / "small").mkdir()
    texts = cluster_strings(3000, seed=2) + ["e\u0301\u0301", "\u00e9\u0300x", "A\u0301",
                                             "\r\n\r", "\u1100\u1161\u11a8",
                                             "\U0001f1eb\U0001f1f7"]
    check_kind(driver("asan"), small, [s.encode() for s in texts], tmp_path / "small",
               "big", n_random=50)


def test_the_older_hub_shape_of_t5s_tokenizer_json(driver, normed, strings, tmp_path):
    """t5-base's tokenizer.json on the hub (2020) has the map alone as its
    normaliser, WhitespaceSplit + Metaspace with `add_prefix_space` and the
    Metaspace decoder: ids and text equal `tokenizers`' (Python on 3,000
    strings, C on 1,000)."""
    tj = json.loads(normed("t5-spm").to_str())
    tj["normalizer"] = precompiled_json(tf.nmt_nfkc_charsmap())
    tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"},
        {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True}]}
    tj["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True}
    hf = tokenizers.Tokenizer.from_str(json.dumps(tj))
    spec = T.spec_from_json(tj)
    assert "normalizer Precompiled, pre-tokenizer WhitespaceSplit + Metaspace" in spec.what
    tok = T.Tokenizer(T.parse_section(T.pack_section(spec)))
    strs = strings[:3000]
    bad = [b for b in strs if tok.encode(b) != hf.encode(tf.hf_text(b),
                                                         add_special_tokens=False).ids]
    assert not bad, bad[:3]
    check_kind(driver("host"), hf, strs[:1000], tmp_path, n_random=100)


def test_the_converter_names_the_map(normed):
    spec = T.spec_from_json(json.loads(normed("t5-spm").to_str()))
    assert "normalizer Precompiled, Strip(right), Replace" in spec.what
    assert "normaliser Precompiled, Strip(right), Replace" in T.describe(spec)
    sec = T.pack_section(spec)
    assert T.parse_section(sec).norm == spec.norm
    pre = spec.norm[0][2]
    assert isinstance(pre, P.Precompiled) and pre.data == tf.nmt_nfkc_charsmap()


# --- hostile and damaged maps and tables ---------------------------------------
def _small_section() -> bytes:
    return T.pack_section(T.spec_from_json(byte_pieces_with(small_charsmap())))


def _hostile(sec: bytes) -> list[bytes]:
    """One edit per check both readers make on a map, its table and its step."""
    moff, msize = _ext(sec, T.EXT_CHARSMAP)
    goff, gcount = _ext(sec, T.EXT_GRAPHEMES)
    poff, _ = _ext(sec, T.EXT_NORM)
    trie = struct.unpack_from("<I", sec, moff)[0]
    units = struct.unpack_from(f"<{trie // 4}I", sec, moff + 4)
    leaf = next(i for i, u in enumerate(units) if u >> 31)
    strings_at = moff + 4 + trie
    cases = []

    def word(at, value):
        b = bytearray(sec)
        struct.pack_into("<I", b, at, value)
        cases.append(bytes(b))

    def byte(at, value):
        b = bytearray(sec)
        b[at] = value
        cases.append(bytes(b))
    word(moff, trie + 2)                          # not whole units
    word(moff, 0)                                 # no unit
    word(moff, msize)                             # no strings
    byte(moff + msize - 1, 0x41)                  # strings not ending in NUL
    byte(strings_at + 1, 0xFF)                    # strings not UTF-8
    word(moff + 4 + 4 * leaf, 1 << 31 | msize)    # a leaf past the strings
    cont = next(i for i in range(msize - 4 - trie)
                if 0x80 <= sec[strings_at + i] < 0xC0)
    word(moff + 4 + 4 * leaf, 1 << 31 | cont)     # a leaf inside a character
    word(goff, 5 << 8)                            # the table not from U+0000
    word(goff + 8, struct.unpack_from("<I", sec, goff + 4)[0])   # not increasing
    word(goff + 4 * (gcount - 1), 0x110000 << 8)  # past U+10FFFF
    word(goff + 4, struct.unpack_from("<I", sec, goff + 4)[0] | 14)   # unknown GCB
    word(goff + 4, struct.unpack_from("<I", sec, goff + 4)[0] | 0x80)  # unknown bit
    word(poff + 4, N.OP_PRECOMPILED | 1 << 8)     # an argument
    word(poff + 4, N.OP_LOWERCASE)                # the map without its step
    return cases


def test_hostile_maps_are_refused_by_both_readers(driver, tmp_path):
    sec = _small_section()
    assert both_readers_verdict(driver("asan"), sec, tmp_path) == 0
    assert_both_readers_refuse(driver("asan"), _hostile(sec), tmp_path)


def test_damaged_tries_never_crash_and_both_readers_agree(driver, tmp_path):
    """Bit flips and overwritten units in the trie (the part no init check
    can prove whole) under ASan/UBSan: both readers refuse the section, or
    both take it and give the same ids for cluster-hard text."""
    sec = _small_section()
    moff, _ = _ext(sec, T.EXT_CHARSMAP)
    trie = struct.unpack_from("<I", sec, moff)[0]
    rng = random.Random(17)
    text = "".join(cluster_strings(40, seed=9)).encode() + HOSTILE_TEXT
    verdicts = {}
    for trial in range(150):
        b = bytearray(sec)
        for _ in range(rng.randint(1, 3)):
            at = moff + 4 + 4 * rng.randrange(trie // 4)
            if rng.random() < 0.5:
                b[at + rng.randrange(4)] ^= 1 << rng.randrange(8)
            else:
                struct.pack_into("<I", b, at, rng.choice([0, 0xFFFFFFFF, 1 << 31, 0x3FF,
                                                          rng.randrange(1 << 32)]))
        b = bytes(b)
        v = both_readers_verdict(driver("asan"), b, tmp_path)
        if v == 0:
            got = run(driver("asan"), "section", tmp_path / "damaged.bin", [ids_req(text)],
                      tmp_path / "t")
            assert got[0][0] == 0 and got[0][2] == T.Tokenizer(T.parse_section(b)).encode(text), \
                trial
        verdicts[v] = verdicts.get(v, 0) + 1
    assert verdicts.get(0, 0) > 50 and verdicts.get(11, 0) > 10, verdicts


@pytest.mark.skipif(shutil.which("clang") is None, reason="clang not installed")
def test_fuzz_a_precompiled_section_short_run_is_clean(tmp_path, tmp_path_factory):
    """fuzz/fuzz_tokenizer.c over the small map's section: mutated sections
    (map, table, program) and hostile text through the clusters and the
    trie, under ASan/UBSan."""
    exe = build_fuzzer(tmp_path_factory)
    sec = _small_section()
    assert len(sec) < 65536
    (tmp_path / "good.bin").write_bytes(sec)
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    for i, s in enumerate(cluster_strings(40, seed=4)):
        (seeds / f"t{i}").write_bytes(b"\x01" + s.encode())
    (seeds / "sec").write_bytes(b"\x00" + struct.pack("<H", len(sec)) + sec
                                + "e\u0301\u0301 \r\n".encode())
    run_fuzzer(exe, seeds, tmp_path / "good.bin", 65536)


def test_bad_maps_are_refused_at_conversion_by_name(normed):
    tj = json.loads(normed("t5-tf5").to_str())
    for bad, match in ((b"\x01\x02", "not a SentencePiece character map"),
                       (b"\x08\x00\x00\x00" + b"\x00" * 8 + b"x", "not a SentencePiece")):
        tj["normalizer"] = precompiled_json(bad)
        with pytest.raises(T.UnsupportedTokenizer, match=match):
            T.spec_from_json(tj)
    two = precompiled_json(small_charsmap())
    tj["normalizer"] = {"type": "Sequence", "normalizers": [two, two]}
    with pytest.raises(T.UnsupportedTokenizer, match="two Precompiled"):
        T.spec_from_json(tj)
