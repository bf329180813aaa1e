"""The tokenizer section and the Python tokenizer that reads it
(colibri/text/tokenizer.py), judged by Hugging Face `tokenizers` on tokenizers it
trains here (tests/tokenizer_fixtures.py): ids for 10,000 strings per
tokenizer, decoding, streaming decoding, `colibri convert`, and bad input.
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from colibri.file import format as cformat
from colibri.text import tokenizer as T
from colibri.model.convert import ColibriExporter
from colibri.errors import ConversionError

import tokenizer_fixtures as tf
from test_runtime_support import c_build  # noqa: F401

tokenizers = pytest.importorskip("tokenizers")

N_STRINGS = 10_000


@pytest.fixture(scope="session")
def trained():
    """kind -> `tokenizers.Tokenizer` trained here (seconds, cached)."""
    text = tf.corpus_text()
    return tf.memo(lambda kind: tf.train(kind, text))


@pytest.fixture(scope="session")
def strings():
    return tf.test_strings(N_STRINGS, seed=14)


def ours(hf_tok, byte_order="little") -> T.Tokenizer:
    """Our tokenizer, through the section bytes (written, then parsed back)."""
    spec = T.spec_from_json(json.loads(hf_tok.to_str()))
    return T.Tokenizer(T.parse_section(T.pack_section(spec, byte_order)))


def test_the_trained_tokenizers_have_the_sizes_the_issue_asks(trained):
    sizes = {k: trained(k).get_vocab_size() for k in tf.KINDS}
    assert 290 <= sizes["bl-gpt2-300"] <= 330 and 290 <= sizes["sp-300"] <= 330
    assert 31_000 <= sizes["bl-qwen2-32k"] <= 33_000 and 31_000 <= sizes["sp-32k"] <= 33_000


@pytest.mark.parametrize("kind", tf.KINDS)
def test_ids_equal_tokenizers_on_10000_strings(trained, strings, kind):
    hf = trained(kind)
    tok = ours(hf)
    bad = []
    for b in strings:
        want = hf.encode(tf.hf_text(b), add_special_tokens=False).ids
        if tok.encode(b) != want:
            bad.append(b)
    assert not bad, f"{len(bad)} of {len(strings)} differ, first {bad[:3]!r}"


@pytest.mark.parametrize("kind", tf.KINDS)
def test_bos_and_unparsed_specials_equal_tokenizers(trained, strings, kind):
    """add_bos = the <s> template of the SentencePiece kinds; parse_special
    False = `encode_special_tokens` (special tokens are plain text)."""
    hf = trained(kind)
    tok = ours(hf, "big")
    sp = kind.startswith("sp")
    for b in strings[:2000]:
        text = tf.hf_text(b)
        assert tok.encode(b, add_bos=sp) == hf.encode(text, add_special_tokens=True).ids, b
        hf.encode_special_tokens = True
        try:
            want = hf.encode(text, add_special_tokens=False).ids
        finally:
            hf.encode_special_tokens = False
        assert tok.encode(b, parse_special=False) == want, b


@pytest.mark.parametrize("kind", tf.KINDS)
def test_decode_equals_tokenizers_and_streams(trained, strings, kind):
    """Decoding the ids of every string, and of random id sequences (which
    cut UTF-8 sequences anywhere), equals `tokenizers`' decode, whole or one
    id at a time."""
    hf = trained(kind)
    tok = ours(hf)
    rng = random.Random(3)
    seqs = [hf.encode(tf.hf_text(b), add_special_tokens=False).ids for b in strings[:3000]]
    seqs += [[rng.randrange(tok.n_vocab) for _ in range(rng.randint(1, 12))]
             for _ in range(2000)]
    for ids in seqs:
        for skip in (False, True):
            want = hf.decode(ids, skip_special_tokens=skip)
            assert tok.decode(ids, skip_special=skip) == want, ids
            d = T.StreamDecoder(tok, skip)
            parts = [d.push(i) for i in ids] + [d.finish()]
            assert "".join(parts) == want, ids


def test_stream_holds_a_split_utf8_sequence_back(trained):
    tok = ours(trained("bl-gpt2-300"))   # 300 pieces: "€" is three byte tokens
    ids = tok.encode("€")
    assert len(ids) == 3
    d = T.StreamDecoder(tok)
    assert [d.push(i) for i in ids] == ["", "", "€"] and d.finish() == ""


def test_invalid_utf8_strict_is_an_error(trained):
    tok = ours(trained("sp-300"))
    with pytest.raises(T.TokenizerError, match="not valid UTF-8: byte 1"):
        tok.encode(b"a\xffb", errors="strict")
    assert tok.encode(b"a\xffb") == tok.encode("a\ufffdb")


def test_llama3_regex_equals_tokenizers(trained, strings):
    """The Llama-3 variant of the regex (digits in runs of up to three)."""
    from tokenizers import Regex, pre_tokenizers
    hf = tokenizers.Tokenizer.from_str(trained("bl-qwen2-32k").to_str())
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(T.LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = ours(hf)
    assert tok.spec.pretok == T.PRETOK_LLAMA3
    for b in strings[:2000]:
        assert tok.encode(b) == hf.encode(tf.hf_text(b), add_special_tokens=False).ids, b


# --- colibri convert --------------------------------------------------------
def _checkpoint(tmp: Path, hf_tok, vocab: int = 512) -> Path:
    """A tiny Mixtral checkpoint (transformers, random weights) with tokenizer.json."""
    torch = pytest.importorskip("torch")
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = MixtralConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, num_local_experts=2, num_experts_per_tok=1,
                        max_position_embeddings=64, tie_word_embeddings=False,
                        bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    MixtralForCausalLM(cfg).float().save_pretrained(tmp)
    if hf_tok is not None:
        (tmp / "tokenizer.json").write_text(hf_tok.to_str())
    return tmp


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, trained):
    return _checkpoint(tmp_path_factory.mktemp("ckpt"), trained("sp-300"))


@pytest.mark.parametrize("byte_order", ["little", "big"])
def test_convert_stores_the_tokenizer_and_the_file_reads_back(ckpt, trained, strings,
                                                             tmp_path, byte_order):
    out = ColibriExporter(ckpt, quant="f32", byte_order=byte_order).export(
        tmp_path / "m.colibri")
    cf = cformat.read_file(out)   # every CRC, the tokenizer section's included
    entries = [e for e in cf.entries if e.kind == T.KIND_TOKENIZER]
    assert len(entries) == 1 and entries[0].flags == 0   # optional, not critical
    cf.close()
    tok = T.Tokenizer.from_file(out)
    hf = trained("sp-300")
    assert tok.spec.bos_id == 1 and tok.spec.eos_id == 2
    for b in strings[:500]:
        assert tok.encode(b, add_bos=True) == hf.encode(tf.hf_text(b)).ids


def test_the_c_runtime_accepts_a_file_with_a_tokenizer(c_build, ckpt, tmp_path):
    """The section is optional and non-critical: the C runtime verifies its
    CRC and position like any section's and runs the model."""
    out = ColibriExporter(ckpt, quant="int8").export(tmp_path / "m.colibri")
    cli = str(c_build("host").cli)
    proc = subprocess.run([cli, "--model", str(out), "--verify"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run([cli, "--model", str(out), "--tokens", "1,5,9", "--generate", "2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_convert_without_tokenizer_json_is_unchanged(tmp_path, trained):
    d = _checkpoint(tmp_path / "ck", None)
    out = ColibriExporter(d, quant="f32").export(tmp_path / "m.colibri")
    assert all(e.kind != T.KIND_TOKENIZER for e in cformat.read_file(out).entries)
    with pytest.raises(T.TokenizerError, match="holds no tokenizer"):
        T.Tokenizer.from_file(out)


def test_unsupported_kind_converts_without_a_tokenizer_and_one_warning(tmp_path, trained):
    from tokenizers import models
    wp = tokenizers.Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    d = _checkpoint(tmp_path / "ck", wp)
    proc = subprocess.run([sys.executable, "-m", "colibri.cli", "convert", str(d), "-o",
                           str(tmp_path / "m.colibri"), "--quant", "f32"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "model WordPiece: only BPE and Unigram are supported" in lines[0] \
        and "converting without a tokenizer" in lines[0], proc.stderr
    assert all(e.kind != T.KIND_TOKENIZER
               for e in cformat.read_file(tmp_path / "m.colibri").entries)


def test_no_tokenizer_flag_and_too_large_a_tokenizer(tmp_path, trained):
    hf = trained("bl-gpt2-300")
    d = _checkpoint(tmp_path / "ck", hf, vocab=256)
    n = hf.get_vocab_size(with_added_tokens=True)
    with pytest.raises(ConversionError, match=f"{n} token ids, the model's vocabulary only 256"):
        ColibriExporter(d, quant="f32")
    out = ColibriExporter(d, quant="f32", tokenizer=False).export(tmp_path / "m.colibri")
    assert all(e.kind != T.KIND_TOKENIZER for e in cformat.read_file(out).entries)


@pytest.mark.parametrize("edit,match", [
    (lambda j: j["model"].update(type="WordLevel"), "model WordLevel"),
    (lambda j: j["model"].update(type="Unigram"), "Unigram with a byte-level pre-tokenizer"),
    (lambda j: j.update(pre_tokenizer={"type": "UnicodeScripts"}),
     "pre-tokenizer UnicodeScripts"),
    (lambda j: j.update(pre_tokenizer={"type": "Whitespace"}),
     "a byte-level tokenizer with one ByteLevel"),
    (lambda j: j["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex="\\w+"),
     "pre-tokenizer Split: regex"),
    (lambda j: j.update(decoder={"type": "WordPiece"}), "decoder WordPiece"),
    (lambda j: j["model"].update(dropout=0.1), "dropout"),
])
def test_unsupported_parts_are_named(trained, edit, match):
    j = json.loads(trained("bl-qwen2-32k").to_str())
    edit(j)
    with pytest.raises(T.UnsupportedTokenizer, match=match):
        T.spec_from_json(j)


@pytest.mark.parametrize("edit,match", [
    (lambda j: j["model"]["merges"].append(["zz_not", "there"]), "not in the vocabulary"),
    (lambda j: j["model"]["merges"].append(j["model"]["merges"][0]), "listed twice"),
    (lambda j: j["model"]["vocab"].update(bad=-5), "not an integer"),
    (lambda j: j["model"]["vocab"].update(big=1 << 40), "not an integer"),
    (lambda j: j["model"].update(vocab=[1, 2]), "not an object"),
    (lambda j: j["model"]["merges"].append("a b c"), "not two pieces"),
    (lambda j: j["model"].update(unk_token="<nope>"), "unk_token"),
    (lambda j: j["added_tokens"].append({"id": 5, "content": "zzz"}), "which the vocabulary"),
    (lambda j: j["added_tokens"].append({"id": 7}), "no content"),
])
def test_hostile_tokenizer_json_is_a_clear_error(trained, edit, match):
    j = json.loads(trained("bl-gpt2-300").to_str())
    edit(j)
    with pytest.raises(T.TokenizerError, match=match):
        T.spec_from_json(j)


def test_hostile_tokenizer_json_in_convert_is_one_error_line(tmp_path, trained):
    d = _checkpoint(tmp_path / "ck", None)
    (d / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": ')
    proc = subprocess.run([sys.executable, "-m", "colibri.cli", "convert", str(d), "-o",
                           str(tmp_path / "m.colibri")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    assert proc.stderr.startswith("colibri: error: ") and "not valid JSON" in proc.stderr \
        and "--no-tokenizer" in proc.stderr and "Traceback" not in proc.stderr


# --- a damaged section ------------------------------------------------------
def test_damaged_sections_are_a_tokenizer_error_never_a_crash(trained):
    """Bit flips, truncations and overwritten fields: parse_section either
    accepts the bytes (a flip in a piece's text is still a valid section) and
    the tokenizer then works, or raises TokenizerError."""
    sec = T.pack_section(T.spec_from_json(json.loads(trained("bl-gpt2-300").to_str())))
    rng = random.Random(1)
    outcomes = {"ok": 0, "error": 0}
    for trial in range(1500):
        b = tf.damage_section(sec, rng, trial)
        try:
            tok = T.Tokenizer(T.parse_section(bytes(b)))
        except T.TokenizerError as exc:
            assert "tokenizer section" in str(exc)
            outcomes["error"] += 1
            continue
        outcomes["ok"] += 1
        ids = tok.encode("Hello, world! 123 ünïcödé 日本 😀")
        tok.decode(ids)
    assert outcomes["error"] > 1000 and outcomes["ok"] > 0, outcomes


def test_the_unicode_tables_are_unicode_16_as_tokenizers_has_it():
    """colibri/text/unicode_tables.py (and src/unicode_tables.h, from the same
    generator) hold the General_Category of Unicode 16.0 (\\p{L}, \\p{N}), the version of the
    Oniguruma inside `tokenizers`: checked against unicodedata2 and against
    `tokenizers` itself on every code point."""
    ud = pytest.importorskip("unicodedata2")
    from tokenizers import Regex, pre_tokenizers
    from colibri.text import unicode_tables as U
    assert ud.unidata_version == U.UNICODE_VERSION == "16.0.0"
    cps = [c for c in range(1, 0x110000) if not 0xD800 <= c < 0xE000]
    from colibri.text.tokregex import gc_of
    for major, pat in (("L", r"\p{L}"), ("N", r"\p{N}")):
        ours_set = {c for c in cps if U.GC_NAMES[gc_of(c)][0] == major}
        split = pre_tokenizers.Split(Regex(pat), behavior="isolated")
        hf = set()
        for k in range(0, len(cps), 50_000):
            s = "".join(chr(c) + "\0" for c in cps[k:k + 50_000])
            hf |= {ord(p) for p, _ in split.pre_tokenize_str(s) if len(p) == 1 and p != "\0"}
        assert ours_set == hf


@pytest.mark.parametrize("kind", ["sp-300", "bl-qwen2-nfc"])
def test_info_describes_the_stored_tokenizer(tmp_path, trained, kind):
    """`colibri info FILE.colibri` says which tokenizer the file carries,
    with the counts tokenizers itself reports (ids, merges) and the NFC
    normaliser a Qwen2 file ships; a file without one says so."""
    hf = (tf.train_program_kind(kind, tf.corpus_text(1_000_000), vocab=300)
          if kind in tf.PROGRAM_KINDS else trained(kind))
    tj = json.loads(hf.to_str())
    d = _checkpoint(tmp_path / "ck", hf)
    out = ColibriExporter(d, quant="f32").export(tmp_path / "m.colibri")
    proc = subprocess.run([sys.executable, "-m", "colibri.cli", "info", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("tokenizer "))
    model = "SentencePiece" if kind.startswith("sp") else "byte-level"
    assert f"{model} BPE, {hf.get_vocab_size()} ids, {len(tj['model']['merges'])} merges" \
        in line, line
    assert ("NFC" in line) == (kind == "bl-qwen2-nfc"), line
    if kind == "bl-qwen2-nfc":      # Qwen2's Split regex is the built-in one
        assert "Qwen2 regex" in line, line
    bare = ColibriExporter(_checkpoint(tmp_path / "ck0", None), quant="f32").export(
        tmp_path / "bare.colibri")
    proc = subprocess.run([sys.executable, "-m", "colibri.cli", "info", str(bare)],
                          capture_output=True, text=True, timeout=300)
    assert "tokenizer     none" in proc.stdout, proc.stdout
