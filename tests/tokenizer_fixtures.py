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


def train(kind: str, text: str):
    """A `tokenizers.Tokenizer` of the given kind trained on text."""
    from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                            processors, trainers, AddedToken)
    lines = _lines(text)
    if kind.startswith("bl-"):
        vocab = 300 if kind.endswith("300") else 32000
        tok = Tokenizer(models.BPE())
        if "qwen2" in kind:
            from colibri.tokenizer import QWEN2_PATTERN
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        else:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                 show_progress=False)
        tok.train_from_iterator(lines, tr)
        tok.add_tokens([AddedToken(ADDED_PLAIN, normalized=False)])
        return tok
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
    from colibri.tokenizer import SECTION_HEADER_SIZE
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
