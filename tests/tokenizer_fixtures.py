"""Tokenizers trained here by Hugging Face `tokenizers` (the judge), and the
strings they are compared on.

Nothing is downloaded: the training text is the demo corpus (the Python 3.11
documentation from Debian's python3.11-doc, models/demo/prepare_corpus.py),
cut to TRAIN_BYTES so that training takes seconds.

KINDS names the four tokenizers every test uses:
- "bl-gpt2-300":   byte-level BPE, GPT-2 regex (ByteLevel use_regex), ~300 pieces
- "bl-qwen2-32k":  byte-level BPE, Qwen2 regex (Split + ByteLevel), ~32,000 pieces
- "sp-300":        SentencePiece-style BPE as Mixtral's tokenizer.json (Prepend
                   and Replace normaliser, byte fallback, <s> template), ~300
- "sp-32k":        the same with a Metaspace pre-tokenizer (prepend "first"), ~32,000
Byte-level ones carry special tokens (<|endoftext|>, <|im_start|>, <|im_end|>)
and one non-special added token.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN_BYTES = 4_000_000
KINDS = ("bl-gpt2-300", "bl-qwen2-32k", "sp-300", "sp-32k")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED_PLAIN = "<tool>"


def corpus_text(limit: int = TRAIN_BYTES) -> str:
    spec = importlib.util.spec_from_file_location(
        "prepare_corpus", ROOT / "models" / "demo" / "prepare_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    train, _ = mod.split()
    return mod.join(train)[:limit].decode("utf-8", "ignore")


def _lines(text: str):
    return [ln for ln in text.split("\n") if ln.strip()]


def memo(make):
    """kind -> make(kind), each made once (the session fixtures' cache)."""
    cache = {}

    def get(kind):
        if kind not in cache:
            cache[kind] = make(kind)
        return cache[kind]
    return get


def as_loaded(tok):
    """tok as a user has it: its tokenizer.json read back by `tokenizers`.
    A trained Unigram holds its scores exactly, but the file's 17-digit
    numbers are read an ulp off one time in six (colibri/text/json_number.py),
    and the converter reads the file: the judge must be the file too."""
    from tokenizers import Tokenizer
    return Tokenizer.from_str(tok.to_str())


def train_byte_level(tok, lines: list[str], vocab: int):
    """Train a byte-level BPE whose normaliser and pre-tokenizer are set:
    the ByteLevel decoder, SPECIALS, and ADDED_PLAIN added after training."""
    from tokenizers import AddedToken, decoders, pre_tokenizers, trainers
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
    tok.train_from_iterator(lines, tr)
    tok.add_tokens([AddedToken(ADDED_PLAIN, normalized=False)])
    return tok


def train(kind: str, text: str):
    """A `tokenizers.Tokenizer` of the given kind trained on text."""
    from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                            processors, trainers, AddedToken)
    lines = _lines(text)
    if kind.startswith("bl-"):
        vocab = 300 if kind.endswith("300") else 32000
        tok = Tokenizer(models.BPE())
        if "qwen2" in kind:
            from colibri.text.tokenizer import QWEN2_PATTERN
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        else:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        return train_byte_level(tok, lines, vocab)
    # SentencePiece style: train the merges, then build the vocabulary as
    # Mixtral's is laid out (<unk>, <s>, </s>, the 256 byte pieces, the rest).
    vocab_size = 300 if kind.endswith("300") else 32000
    base = Tokenizer(models.BPE())
    base.normalizer = normalizers.Replace(" ", "\u2581")
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always",
                                                  split=True)
    tr = trainers.BpeTrainer(vocab_size=max(vocab_size - 259, 60), show_progress=False,
                             limit_alphabet=40 if vocab_size < 1000 else 1000)
    base.train_from_iterator(lines, tr)
    trained = json.loads(base.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece in sorted(trained["vocab"], key=trained["vocab"].get):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" "))
              for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>",
                               byte_fallback=True, fuse_unk=True))
    if kind == "sp-300":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                               normalizers.Replace(" ", "\u2581")])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581",
                                                     prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                       special_tokens=[("<s>", 1)])
    tok.add_special_tokens([AddedToken("<unk>", normalized=False),
                            AddedToken("<s>", normalized=False),
                            AddedToken("</s>", normalized=False)])
    return tok


# --- test strings -----------------------------------------------------------
CJK = "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二最"
JP_KR = "こんにちは世界カタカナひらがな한국어텍스트입니다"
EMOJI = ["😀", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🏳️\u200d🌈", "❤️", "🇫🇷", "🧑🏿\u200d💻", "✨", "🐍"]
COMBINING = ["e\u0301", "a\u0308", "n\u0303", "\u0915\u094d\u0937", "o\u0302\u0323",
             "Z\u0351\u036b\u0343\u036a"]
RTL = ["שלום עולם", "مرحبا بالعالم", "\u202eabc\u202c", "עברית 123 English", "السلام عليكم!"]
CONTRACTIONS = ["it's", "don't", "we're", "they've", "I'm", "you'll", "he'd", "IT'S",
                "WE'RE", "You'LL", "o'clock", "'s", "rock'n'roll", "x'ſ"]
WS = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u3000", "\u00a0", "\t\t ",
      "\u2028", "\x0b", "\x1c", "\u200b"]
PUNCT = list("!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "—", "«»", "“”", "->", "=="]


def _number(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.3:
        return str(rng.randint(0, 10 ** rng.randint(1, 12)))
    if r < 0.5:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 6)}f}"
    if r < 0.6:
        return f"{rng.random():.3e}"
    if r < 0.7:
        return "٠١٢٣٤٥" if rng.random() < 0.5 else "½ ² Ⅻ ①"
    return f"0x{rng.getrandbits(32):x}"


def _atom(rng: random.Random, lines: list[str]) -> str:
    k = rng.randrange(12)
    if k == 0:
        return rng.choice(lines)
    if k == 1:
        ln = rng.choice(lines)
        a = rng.randrange(len(ln))
        return ln[a:a + rng.randint(1, 40)]
    if k == 2:
        return _number(rng)
    if k == 3:
        return rng.choice(WS) * rng.randint(1, 3)
    if k == 4:
        return rng.choice(CONTRACTIONS)
    if k == 5:
        return "".join(rng.choice(CJK) for _ in range(rng.randint(1, 8))) if rng.random() < .7 \
            else JP_KR[rng.randrange(len(JP_KR)):][:rng.randint(1, 10)]
    if k == 6:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 3)))
    if k == 7:
        return rng.choice(COMBINING)
    if k == 8:
        return rng.choice(RTL)
    if k == 9:
        return rng.choice(PUNCT)
    if k == 10:
        return rng.choice(SPECIALS + [ADDED_PLAIN, "<s>", "</s>", "<0x41>"])
    return "".join(chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x2fff),
                                   rng.randint(0x10000, 0x1faff)]))
                   for _ in range(rng.randint(1, 4)))


def test_strings(n: int, seed: int = 0) -> list[bytes]:
    """n strings (as UTF-8 bytes, some of them invalid UTF-8) mixing prose and
    code from the corpus, numbers, whitespace runs and newlines, contractions,
    CJK, emoji and ZWJ sequences, combining marks, right-to-left text, special
    and added tokens, and random code points."""
    rng = random.Random(seed)
    lines = _lines(corpus_text(400_000))
    out = [b"", b" ", b"\n", b"  hello", b"hello  ", b"a\n\n\nb", "日本語".encode()]
    while len(out) < n:
        s = "".join(_atom(rng, lines) + (rng.choice(WS) if rng.random() < 0.3 else "")
                    for _ in range(rng.randint(1, 6)))
        b = s.encode("utf-8")
        if rng.random() < 0.06:  # invalid UTF-8: a stray byte, a cut sequence, an overlong
            bad = rng.choice([b"\xff", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc0\xaf",
                              b"\xed\xa0\x80", b"\x80\x80"])
            at = rng.randint(0, len(b))
            b = b[:at] + bad + b[at:]
        out.append(b)
    return out[:n]


def hf_text(b: bytes) -> str:
    """What `tokenizers` is given for bytes: the documented replacement of
    invalid UTF-8 (each maximal invalid subsequence -> U+FFFD)."""
    return b.decode("utf-8", "replace")


def damage_section(section: bytes, rng: random.Random, trial: int) -> bytearray:
    """A damaged copy of a tokenizer section, by trial % 3: 1-4 flipped
    bits, a truncation, or one random 32-bit word of the section header
    (where the offsets and counts live)."""
    from colibri.text.tokenizer import SECTION_HEADER_SIZE
    b = bytearray(section)
    how = trial % 3
    if how == 0:
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif how == 1:
        b = b[:rng.randrange(len(b))]
    else:
        i = rng.randrange(0, SECTION_HEADER_SIZE - 4, 4)
        b[i:i + 4] = rng.getrandbits(32).to_bytes(4, "little")
    return b


# --- pre-tokenizers stored as programs (issue 25) ----------------------------
# The regexes of real tokenizer.json files (as llama.cpp's src/llama-vocab.cpp
# lists them next to the tokenizer.json originals), written with escapes so
# that no editor normalises the characters of their ranges.
QWEN35_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                  r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_LLM_SPLITS = ['[\r\n]', '\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+', '\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+', '\\s+$', '[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+', '\\p{N}+']
DEEPSEEK_CODER_SPLITS = ['[\r\n]', '\\s?\\p{L}+', '\\s?\\p{P}+', '[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+']   # then Digits(individual_digits=true)
DEEPSEEK3_SPLITS = ['\\p{N}{1,3}', '[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+', '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+']


def _split(pattern: str, behavior: str = "Isolated", invert: bool = False) -> dict:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": behavior,
            "invert": invert}


_BL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
_BL_RX = dict(_BL, use_regex=True)

# kind -> the tokenizer.json pre_tokenizer of a byte-level BPE trained here.
PROGRAM_PRETOKS = {
    "bl-llama3": {"type": "Sequence", "pretokenizers": [
        _split(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), _BL]},
    "bl-qwen35": {"type": "Sequence", "pretokenizers": [_split(QWEN35_PATTERN), _BL]},
    "bl-qwen2-nfkc": {"type": "Sequence", "pretokenizers": [
        _split(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), _BL]},
    "bl-qwen2-nfc": {"type": "Sequence", "pretokenizers": [
        _split(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), _BL]},
    "bl-deepseek-llm": {"type": "Sequence", "pretokenizers": [
        *(_split(p) for p in DEEPSEEK_LLM_SPLITS), _BL]},
    "bl-deepseek-coder": {"type": "Sequence", "pretokenizers": [
        *(_split(p) for p in DEEPSEEK_CODER_SPLITS),
        {"type": "Digits", "individual_digits": True}, _BL]},
    "bl-deepseek3": {"type": "Sequence", "pretokenizers": [
        *(_split(p) for p in DEEPSEEK3_SPLITS), _BL]},
    "bl-starcoder": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, _BL_RX]},
    # Falcon's shape: ByteLevel (with its regex) between the steps, so Digits
    # and the Splits after it see its byte alphabet (U+00B2's byte 0xB2 is a
    # digit there, byte 0x20's Ġ a letter). Falcon's own Punctuation first is
    # in the real-vocabulary test (test_tokenizer_llama_vocab.py): its data
    # and tokenizers' differ on 142 code points (test_tokenizer_program.py).
    "bl-falcon": {"type": "Sequence", "pretokenizers": [
        _BL_RX, {"type": "Digits", "individual_digits": False}, _split(r"[0-9][0-9][0-9]"),
        _split(r"\p{Lu}+", "MergedWithNext")]},
    # tokenizers' Whitespace (words and other runs kept, whitespace removed)
    "bl-whitespace": {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}, _BL]},
    # every Split behaviour, invert, String patterns, Punctuation, Digits runs
    "bl-behaviours": {"type": "Sequence", "pretokenizers": [
        _split(r"\n+", "MergedWithPrevious"),
        {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext",
         "invert": False},
        {"type": "Punctuation", "behavior": "Contiguous"},
        {"type": "Digits", "individual_digits": False},
        _split(r"[A-Z]+", "Isolated", invert=True),
        _split(r"\s*?x{2,3}?|\t", "Removed"),
        {"type": "WhitespaceSplit"}, _BL]},
}
# NFKC is judged on its own strings (tests/test_tokenizer_program.py): its
# data and tokenizers' differ on code points assigned since Unicode 12.
PROGRAM_KINDS = tuple(k for k in PROGRAM_PRETOKS if k != "bl-qwen2-nfkc")
# Their normalisers (the rest have none): Qwen2 / Qwen3.5 ship NFC.
NORMALIZERS = {"bl-qwen35": {"type": "NFC"}, "bl-qwen2-nfc": {"type": "NFC"},
               "bl-qwen2-nfkc": {"type": "NFKC"}}


def train_program_kind(kind: str, text: str, vocab: int = 3000):
    """A byte-level BPE with one of PROGRAM_PRETOKS, trained on text (the
    pre-tokenizer is set through JSON, the form real files have); Llama-3's
    with ignore_merges as its tokenizer.json has it."""
    from tokenizers import Tokenizer, models
    tj = json.loads(Tokenizer(models.BPE()).to_str())
    tj["pre_tokenizer"] = PROGRAM_PRETOKS[kind]
    tj["normalizer"] = NORMALIZERS.get(kind)
    tok = train_byte_level(Tokenizer.from_str(json.dumps(tj)), _lines(text), vocab)
    if kind == "bl-llama3":
        tj = json.loads(tok.to_str())
        tj["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(tj))
    return tok


# --- Unigram (T5 / Switch Transformers) -------------------------------------
# "t5-300" / "t5-32k": T5Tokenizer's pipeline (transformers'
# models/t5/tokenization_t5.py) without its Precompiled normaliser, which is
# refused by name: Unigram with unk_id 2 and <pad> </s> <unk> first,
# WhitespaceSplit + Metaspace(always, split), decoder Metaspace, template
# "$A </s>", <extra_id_*> sentinels as special added tokens.
# "uni-bf-nfc": NFC, Metaspace alone (split, prepend "always"), byte fallback
# (<0xNN> pieces added after training), the Replace/ByteFallback/Fuse/Strip
# decoder of Llama-style files.
UNIGRAM_KINDS = ("t5-300", "t5-32k", "uni-bf-nfc")
T5_SPECIALS = ["<pad>", "</s>", "<unk>"]


def train_unigram(kind: str, text: str):
    from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors, trainers)
    lines = _lines(text)
    vocab = 32000 if kind == "t5-32k" else 300 if kind == "t5-300" else 2000
    tok = Tokenizer(models.Unigram())
    if kind.startswith("t5"):
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)])
    else:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581",
                                                     prepend_scheme="always", split=True)
    tr = trainers.UnigramTrainer(vocab_size=vocab, special_tokens=T5_SPECIALS,
                                 unk_token="<unk>", show_progress=False,
                                 max_piece_length=16)
    tok.train_from_iterator(lines, tr)
    if kind.startswith("t5"):
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always",
                                         split=True)
        tok.post_processor = processors.TemplateProcessing(
            single=["$A", "</s>"], pair=["$A", "</s>", "$B", "</s>"],
            special_tokens=[("</s>", 1)])
        tok.add_special_tokens([AddedToken(t, normalized=False) for t in T5_SPECIALS]
                               + [AddedToken(f"<extra_id_{i}>", normalized=False)
                                  for i in range(3)])
        return as_loaded(tok)
    tj = json.loads(tok.to_str())
    model = tj["model"]
    low = min(s for _, s in model["vocab"]) - 1.0
    have = {p for p, _ in model["vocab"]}
    model["vocab"] += [[f"<0x{b:02X}>", low] for b in range(256) if f"<0x{b:02X}>" not in have]
    model["byte_fallback"] = True
    tok = Tokenizer.from_str(json.dumps(tj))
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return as_loaded(tok)


# --- normaliser programs (colibri/text/normalizer.py, FORMAT.md 7.4) --------
# The Sequences real tokenizer.json files carry, on tokenizers trained here:
# "spm-tf5":  transformers 5's SentencePiece conversion of a BPE model
#             (convert_slow_tokenizer.SpmConverter.build_tokenizer_from_spm_proto,
#             legacy): edge spaces removed, runs of spaces made one, ' ' -> ▁,
#             a leading ▁ doubled, then Metaspace (always, split false)
# "t5-tf5":   transformers 5's T5Converter without its Precompiled map:
#             Strip(right), Replace(' {2,}' -> ▁), Metaspace (always), Unigram
# "t5-spm":   transformers 5's T5Converter with its Precompiled map, as the
#             T5 / Switch files on the hub carry it: SentencePiece's own
#             nmt_nfkc map (nmt_nfkc_charsmap), Strip(right), Replace(' {2,}'
#             -> ▁), Metaspace (always), Unigram
# "bl-clip":  CLIP's normaliser: NFC, Replace(\s+ -> ' '), Lowercase, on a
#             byte-level BPE (GPT-2 regex)
# "bl-mixed": Strip both sides, a string Replace, Prepend of a plain space,
#             Lowercase between two Replaces, NFKC-free (NFKC has its own test)
NORM_KINDS = ("spm-tf5", "t5-tf5", "t5-spm", "bl-clip", "bl-mixed")


def _proto_field(msg: bytes, number: int) -> bytes:
    """The bytes of length-delimited field `number` of a protobuf message
    (the few lines of wire format the .model file needs, instead of a
    protobuf dependency)."""
    def varint(i):
        v = shift = 0
        while True:
            b = msg[i]
            v |= (b & 0x7F) << shift
            i, shift = i + 1, shift + 7
            if b < 0x80:
                return v, i
    i = 0
    while i < len(msg):
        key, i = varint(i)
        wire = key & 7
        if wire == 0:
            _, i = varint(i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            n, i = varint(i)
            if key >> 3 == number:
                return msg[i:i + n]
            i += n
        else:
            raise ValueError(f"protobuf wire type {wire}")
    raise KeyError(number)


@functools.lru_cache(maxsize=1)
def nmt_nfkc_charsmap() -> bytes:
    """SentencePiece's compiled nmt_nfkc map, the `precompiled_charsmap` of
    T5's tokenizer.json: from a model SentencePiece trains here on a few
    lines (ModelProto.normalizer_spec = 3, NormalizerSpec.precompiled_charsmap
    = 2)."""
    import io
    import sentencepiece as spm
    out = io.BytesIO()
    lines = [" ".join(f"w{i * j % 97}" for j in range(12)) for i in range(400)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out,
                                   vocab_size=60, model_type="unigram",
                                   normalization_rule_name="nmt_nfkc", minloglevel=2)
    return _proto_field(_proto_field(out.getvalue(), 3), 2)


def norm_program_json(kind: str) -> dict:
    from tokenizers import Regex, normalizers as N
    seqs = {
        "spm-tf5": [N.Replace(Regex(r"\A +| +\z"), ""), N.Replace(Regex(" {2,}"), " "),
                    N.Replace(" ", "\u2581"), N.Replace(Regex(r"\A\u2581"), "\u2581\u2581")],
        "t5-tf5": [N.Strip(left=False, right=True), N.Replace(Regex(" {2,}"), "\u2581")],
        "t5-spm": [N.Precompiled(list(nmt_nfkc_charsmap())), N.Strip(left=False, right=True),
                   N.Replace(Regex(" {2,}"), "\u2581")],
        "bl-clip": [N.NFC(), N.Replace(Regex(r"\s+"), " "), N.Lowercase()],
        "bl-mixed": [N.Strip(), N.Replace("\t", " -> "), N.Replace(Regex(r"[0-9]{2,}?"), "#"),
                     N.Lowercase(), N.Replace(Regex(r"(?i)th(?:e|ose)|\s+(?!\S)"), "THE"), N.Prepend(" ")],
    }
    return json.loads(N.Sequence(seqs[kind]).__getstate__())


def train_norm_kind(kind: str, text: str, vocab: int = 3000):
    """A tokenizer of NORM_KINDS trained on text by `tokenizers` (with its
    normaliser in place, as real files are trained)."""
    from tokenizers import (AddedToken, Tokenizer, decoders, models, pre_tokenizers,
                            processors, trainers)
    norm = norm_program_json(kind)
    lines = _lines(text)
    if kind.startswith("bl-"):
        tj = json.loads(Tokenizer(models.BPE()).to_str())
        tj["normalizer"] = norm
        tok = Tokenizer.from_str(json.dumps(tj))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        return train_byte_level(tok, lines, vocab)
    unigram = kind.startswith("t5-")
    tok = Tokenizer(models.Unigram() if unigram else models.BPE(unk_token="<unk>",
                                                                 byte_fallback=True))
    tj = json.loads(tok.to_str())
    tj["normalizer"] = norm
    tok = Tokenizer.from_str(json.dumps(tj))
    meta = dict(replacement="\u2581", prepend_scheme="always", split=unigram)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(**meta)
    if unigram:
        tr = trainers.UnigramTrainer(vocab_size=vocab, special_tokens=T5_SPECIALS,
                                     unk_token="<unk>", show_progress=False,
                                     max_piece_length=16)
    else:
        tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"],
                                 show_progress=False, limit_alphabet=1000)
    tok.train_from_iterator(lines, tr)
    tok.decoder = decoders.Metaspace(**meta)
    if unigram:
        tok.post_processor = processors.TemplateProcessing(
            single=["$A", "</s>"], pair=["$A", "</s>", "$B", "</s>"],
            special_tokens=[("</s>", 1)])
        tok.add_special_tokens([AddedToken(t, normalized=False) for t in T5_SPECIALS]
                               + [AddedToken("<extra_id_0>", normalized=False)])
    else:
        tj = json.loads(tok.to_str())
        model = tj["model"]
        for b in range(256):
            if f"<0x{b:02X}>" not in model["vocab"]:
                model["vocab"][f"<0x{b:02X}>"] = len(model["vocab"])
        tok = Tokenizer.from_str(json.dumps(tj))
        tok.add_special_tokens([AddedToken(t, normalized=False)
                                for t in ("<unk>", "<s>", "</s>")])
    return as_loaded(tok)
