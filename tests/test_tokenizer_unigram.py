"""Unigram tokenizers (T5 / Switch Transformers' kind; FORMAT.md 7.3,
colibri/text/tokenizer.py Tokenizer._unigram, src/tokenizer.c unigram_word)
trained here by Hugging Face `tokenizers` (tests/tokenizer_fixtures.py
UNIGRAM_KINDS: T5's pipeline at 300 and 32,000 pieces, and NFC + Metaspace +
byte fallback), judged by `tokenizers`: ids and decoded text on 10,000
strings each in Python and in C, a sample under ASan/UBSan (big-endian
section) and under QEMU (armv7, ppc), T5's template (eos last), the word
bound, damaged sections, and what is refused by name."""
from __future__ import annotations

import json
import random
import struct

import pytest

from colibri.text import tokenizer as T

import tokenizer_fixtures as tf
from test_runtime_support import c_build  # noqa: F401
from test_tokenizer import strings  # noqa: F401
from test_tokenizer_c import (HOSTILE_REQUESTS, PARSE_SPECIAL, both_readers_verdict,  # noqa: F401
                              check_kind, check_on_cortex_m, driver, ids_req, run, run_raw)

tokenizers = pytest.importorskip("tokenizers")

ADD_EOS = 8
E_TOK_WORD, E_TOK_NO_BOS = -37, -34
WORD_BOUND = 4096       # COLIBRI_TOK_UNIGRAM_WORD's default


@pytest.fixture(scope="session")
def unigram():
    text = tf.corpus_text(1_000_000)
    return tf.memo(lambda kind: tf.train_unigram(
        kind, tf.corpus_text() if kind == "t5-32k" else text))


def _spec(hf) -> T.TokenizerSpec:
    return T.spec_from_json(json.loads(hf.to_str()))


def test_the_trained_tokenizers_are_t5_shaped(unigram):
    big, small = unigram("t5-32k"), unigram("t5-300")
    assert big.get_vocab_size() >= 30000 and small.get_vocab_size() <= 400
    spec = _spec(big)
    assert spec.model == T.MODEL_UNIGRAM and spec.unk_id == 2 and spec.eos_id == 1
    assert spec.flags & T.F_WS_SPLIT and spec.flags & T.F_SP_SPLIT
    assert spec.flags & T.F_TEMPLATE_EOS and spec.flags & T.F_DEC_METASPACE
    sec = T.pack_section(spec)
    assert struct.unpack_from("<H", sec, 4)[0] == T.SECTION_VERSION_UNIGRAM
    assert "WhitespaceSplit + Metaspace (always)" in spec.what
    nfc = _spec(unigram("uni-bf-nfc"))
    assert nfc.flags & T.F_NFC and nfc.flags & T.F_BYTE_FALLBACK
    assert not nfc.flags & T.F_WS_SPLIT


@pytest.mark.parametrize("kind", tf.UNIGRAM_KINDS)
def test_python_ids_and_text_equal_tokenizers_on_10000_strings(unigram, strings, kind):
    hf = unigram(kind)
    tok = T.Tokenizer(T.parse_section(T.pack_section(_spec(hf), "big")))
    bad, bad_text = [], []
    for b in strings:
        want = hf.encode(tf.hf_text(b), add_special_tokens=False).ids
        if tok.encode(b) != want:
            bad.append(b)
        for skip in (False, True):
            if tok.decode(want, skip) != hf.decode(want, skip_special_tokens=skip):
                bad_text.append((b, skip))
    assert not bad, f"{len(bad)} of {len(strings)} differ, first {bad[:3]!r}"
    assert not bad_text, f"{len(bad_text)} decodes differ, first {bad_text[:3]!r}"


@pytest.mark.parametrize("kind", tf.UNIGRAM_KINDS)
def test_c_ids_and_text_equal_tokenizers_on_10000_strings(driver, unigram, strings, kind,
                                                          tmp_path):
    check_kind(driver("host"), unigram(kind), strings, tmp_path, n_random=2000)


@pytest.mark.parametrize("kind", ["t5-32k", "uni-bf-nfc"])
def test_c_under_asan_ubsan_big_endian(driver, unigram, strings, kind, tmp_path):
    check_kind(driver("asan"), unigram(kind), strings[:1500], tmp_path, "big", n_random=300)


@pytest.mark.parametrize("variant", ["armv7", "ppc"])
def test_c_under_qemu(driver, unigram, strings, variant, tmp_path):
    check_kind(driver(variant), unigram("t5-32k"), strings[:300], tmp_path,
               "big" if variant == "ppc" else "little", n_random=100)


def test_c_on_cortex_m_under_qemu(unigram, strings, tmp_path):
    """The Cortex-M library (COLIBRI_TOK_UNIGRAM_WORD=512, the double-
    precision scores in software floating point) gives tokenizers' ids."""
    check_on_cortex_m(unigram("t5-32k"), strings, tmp_path)


def test_the_template_puts_eos_last(driver, unigram, strings, tmp_path):
    """T5's post-processor ("$A </s>"): add_eos / COLIBRI_TOK_ADD_EOS give
    what `tokenizers` gives with add_special_tokens (transformers' default)."""
    hf = unigram("t5-32k")
    tok = T.Tokenizer(_spec(hf))
    strs = strings[:300]
    want = [hf.encode(tf.hf_text(b)).ids for b in strs]
    assert all(w[-1] == 1 for w in want)
    assert [tok.encode(b, add_eos=True) for b in strs] == want
    sec = tmp_path / "t5.bin"
    sec.write_bytes(T.pack_section(_spec(hf)))
    got = run(driver("host"), "section", sec, [ids_req(b, PARSE_SPECIAL | ADD_EOS) for b in strs],
              tmp_path / "t")
    assert [g for _, _, g in got] == want
    # A tokenizer without eos refuses ADD_EOS (-34), in both.
    plain = _spec(unigram("uni-bf-nfc"))
    with pytest.raises(T.TokenizerError, match="no eos"):
        T.Tokenizer(plain).encode("x", add_eos=True)
    sec.write_bytes(T.pack_section(plain))
    (rc, _, _), = run(driver("host"), "section", sec, [ids_req(b"x", ADD_EOS)], tmp_path / "n")
    assert rc == E_TOK_NO_BOS


def test_c_long_words_and_the_word_bound(driver, unigram, tmp_path):
    """A word (text between spaces) up to COLIBRI_TOK_UNIGRAM_WORD bytes is
    tokenizers' ids; one byte more is COLIBRI_E_TOK_WORD, never a wrong
    answer or a write past the stack buffers (ASan)."""
    hf = unigram("t5-300")
    rng = random.Random(3)
    # The Metaspace ▁ is 3 bytes of the word: 4093 letters fill the bound.
    fits = ["".join(rng.choice("thequickbrownfox") for _ in range(WORD_BOUND - 3)).encode(),
            ("日本語" * 454).encode(), b"a" * (WORD_BOUND - 3),
            "".join(rng.choice("abc日😀é") for _ in range(900)).encode()]
    over = [b"a" * (WORD_BOUND - 2), b"x " + b"b" * 5000 + b" y"]
    for variant in ("host", "asan"):
        (tmp_path / variant).mkdir()
        check_kind(driver(variant), hf, fits, tmp_path / variant, n_random=5)
        sec = tmp_path / variant / "section-little.bin"
        res = run(driver(variant), "section", sec, [ids_req(b) for b in over],
                  tmp_path / variant / "o")
        assert [rc for rc, _, _ in res] == [E_TOK_WORD] * len(over)


def test_c_damaged_sections_never_crash(driver, unigram, tmp_path):
    """Bit flips, truncations and overwritten header words of a Unigram
    section under ASan/UBSan: init refuses it (-31) or the tokenizer works;
    parse_section refuses or works the same way."""
    base = T.pack_section(_spec(unigram("t5-300")))
    rng = random.Random(9)
    verdicts = {}
    for trial in range(90):
        v = both_readers_verdict(driver("asan"), bytes(tf.damage_section(base, rng, trial)),
                                 tmp_path)
        verdicts[v] = verdicts.get(v, 0) + 1
    assert verdicts.get(11, 0) > 45 and verdicts.get(0, 0) > 0, verdicts


def _edited(hf, edit) -> dict:
    tj = json.loads(hf.to_str())
    edit(tj)
    return tj


def _set_score(tj, value):
    tj["model"]["vocab"][5][1] = value


@pytest.mark.parametrize("edit,match", [
    (lambda tj: tj.__setitem__("normalizer", {"type": "Precompiled",
                                              "precompiled_charsmap": "AAAA"}),
     "normalizer Precompiled"),
    (lambda tj: tj["model"].__setitem__("unk_id", None), "Unigram unk_id None"),
    (lambda tj: tj["model"]["vocab"].append(["x" * 300, -20.0]), "Unigram piece .* of 300 bytes"),
    (lambda tj: tj["pre_tokenizer"]["pretokenizers"][1].__setitem__("prepend_scheme", "first"),
     "'first' after WhitespaceSplit"),
    (lambda tj: tj.__setitem__("pre_tokenizer", {"type": "ByteLevel"}),
     "Unigram with a byte-level pre-tokenizer"),
])
def test_unsupported_parts_are_refused_by_name(unigram, edit, match):
    with pytest.raises(T.UnsupportedTokenizer, match=match):
        T.spec_from_json(_edited(unigram("t5-300"), edit))


@pytest.mark.parametrize("edit,match", [
    (lambda tj: _set_score(tj, "high"), "not \\[piece, finite score\\]"),
    (lambda tj: _set_score(tj, float("nan")), "not \\[piece, finite score\\]"),
    (lambda tj: tj["model"]["vocab"].append(list(tj["model"]["vocab"][7])), "appears twice"),
    (lambda tj: tj["model"].__setitem__("vocab", []), "not a non-empty list"),
])
def test_hostile_unigram_json_is_a_clear_error(unigram, edit, match):
    with pytest.raises(T.TokenizerError, match=match):
        T.spec_from_json(_edited(unigram("t5-300"), edit))


def test_hostile_scores_are_refused_by_both_readers(driver, unigram, tmp_path):
    """A NaN or infinite score, a misaligned or oversized scores offset, a
    Unigram section without unk: -31 in C, TokenizerError in Python."""
    spec = _spec(unigram("t5-300"))
    sec = T.pack_section(spec)
    off = struct.unpack_from("<I", sec, 8 + 4 * 21)[0]
    cases = []
    for bits in (0x7FF8000000000000, 0x7FF0000000000000):
        b = bytearray(sec)
        struct.pack_into("<Q", b, off + 8 * 7, bits)
        cases.append(b)
    for new_off in (off + 4, len(sec) - 8, 0):
        b = bytearray(sec)
        struct.pack_into("<I", b, 8 + 4 * 21, new_off)
        cases.append(b)
    b = bytearray(sec)
    struct.pack_into("<I", b, 8 + 4 * 6, 0xFFFFFFFF)     # unk_id -1
    cases.append(b)
    for k, b in enumerate(cases):
        with pytest.raises(T.TokenizerError):
            T.parse_section(bytes(b))
        p = tmp_path / f"h{k}.bin"
        p.write_bytes(bytes(b))
        proc = run_raw(driver("asan"), p, HOSTILE_REQUESTS, tmp_path)
        assert proc.returncode == 11 and proc.stdout.startswith("error -31"), (k, proc.stdout)


# --- scores as `tokenizers` reads them (colibri/text/json_number.py) ----------
METASPACE = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
             "split": True}


def _unigram_json_text(scores: list[tuple[str, str]]) -> str:
    """A Unigram tokenizer.json (Metaspace) with <unk> then scores' pieces,
    each score written exactly as its text."""
    vocab = ", ".join(f'[{json.dumps(p)}, {s}]' for p, s in scores)
    tj = json.loads(tokenizers.Tokenizer(tokenizers.models.Unigram()).to_str())
    tj["model"]["vocab"] = "@VOCAB@"
    tj["pre_tokenizer"] = tj["decoder"] = METASPACE
    return json.dumps(tj).replace('"@VOCAB@"', f'[["<unk>", 0.0], {vocab}]')


def _number_texts() -> list[str]:
    """Scores written the ways files write them: 17-digit shortest forms
    (Python, ryu), fixed and exponent forms with extra digits, integers,
    more digits than a u64 holds, leading zeros, the range's edges."""
    rng = random.Random(3)
    xs = [-rng.uniform(0, 20) for _ in range(3000)] + [-rng.expovariate(1e-3) for _ in range(200)]
    texts = [repr(x) for x in xs]
    texts += [f"{x:.22f}" for x in xs[:300]] + [f"{x:.16e}" for x in xs[300:600]]
    texts += [f"{x:.25E}" for x in xs[600:700]] + [f"{x:.3f}" for x in xs[700:800]]
    texts += ["-10", "0", "-0", "-123456789012345678901234", "12345678901234567890.5",
              "-0.0000000000001234567890123456789", "-1e-320", "-2.5e-310", "1e308",
              "-18446744073709551615.9", "-18446744073709551616", "-1.7976931348623157e308",
              "17976931348623157129e289".replace("e289", "e280")]
    return texts


def test_scores_are_the_doubles_tokenizers_reads(tmp_path):
    """`tokenizers` (serde_json without float_roundtrip) reads 17-digit
    numbers an ulp off the nearest double about one time in six; the
    converter reads each score as it does, from a file (spec_from_dir) and
    from a dict (json.dumps' repr), and not as Python's float() would."""
    from colibri.text import json_number
    texts = _number_texts()
    raw = _unigram_json_text([(f"p{i}", t) for i, t in enumerate(texts)])
    hf = tokenizers.Tokenizer.from_str(raw)
    theirs = [s for _, s in json.loads(hf.to_str())["model"]["vocab"][1:]]  # exact (shortest)
    mine = [json_number.serde_f64(t) for t in texts]
    bad = [(t, m, h) for t, m, h in zip(texts, mine, theirs) if m != h]
    assert not bad, f"{len(bad)} of {len(texts)} differ, first {bad[:3]}"
    python = sum(float(t) != h for t, h in zip(texts, theirs))
    assert python > len(texts) // 10, python          # the case this guards is common
    (tmp_path / "tokenizer.json").write_text(raw)
    assert T.spec_from_dir(tmp_path).scores[1:] == theirs      # id i + 1 is p{i}
    from_dict = T.spec_from_json(json.loads(raw))
    want_dict = [s for _, s in json.loads(tokenizers.Tokenizer.from_str(
        json.dumps(json.loads(raw))).to_str())["model"]["vocab"][1:]]
    assert from_dict.scores[1:] == want_dict


def test_a_score_tokenizers_refuses_is_refused(tmp_path):
    """A number Python reads as the largest double but serde_json's two
    roundings take past it: `tokenizers` refuses the file, and so does the
    converter, by entry."""
    raw = _unigram_json_text([("p0", "-1.5"), ("p1", "17976931348623157129e289")])
    with pytest.raises(Exception, match="out of range"):
        tokenizers.Tokenizer.from_str(raw)
    (tmp_path / "tokenizer.json").write_text(raw)
    with pytest.raises(T.TokenizerError, match="entry 2's score is out of range"):
        T.spec_from_dir(tmp_path)


def test_a_near_tie_goes_the_way_tokenizers_reads_the_scores(driver, tmp_path):
    """Scores from a T5-style vocabulary trained here (the one that made
    test_the_older_hub_shape_of_t5s_tokenizer_json flaky): "▁865551" is
    ▁8 6 5 55 1 to `tokenizers`, and ▁8 6 55 5 1 with the correctly rounded
    scores (the two sums an ulp apart). Python and C give `tokenizers`'."""
    scores = [("\u25818", "-8.594438339209509"), ("6", "-6.981349513322318"),
              ("5", "-6.87316490781536"), ("55", "-9.065630226507807"),
              ("1", "-6.609986116544975"), ("\u2581", "-3.5")]
    raw = _unigram_json_text(scores)
    hf = tokenizers.Tokenizer.from_str(raw)
    want = hf.encode("865551", add_special_tokens=False).ids
    assert hf.encode("865551", add_special_tokens=False).tokens == ["\u25818", "6", "5", "55", "1"]
    spec = T.spec_from_json(json.loads(raw))
    tok = T.Tokenizer(T.parse_section(T.pack_section(spec)))
    assert tok.encode(b"865551") == want
    check_kind(driver("host"), tokenizers.Tokenizer.from_str(raw), [b"865551", b"5565 1 86"],
               tmp_path, n_random=20)
    spec.scores = [float(s) for s in [0.0] + [t for _, t in scores]]   # Python's float()
    assert T.Tokenizer(spec).encode(b"865551") != want
