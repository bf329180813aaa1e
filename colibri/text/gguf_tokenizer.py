"""A GGUF file's tokenizer (`tokenizer.ggml.*`) as Colibri's tokenizer section.

The metadata is turned into the tokenizer.json llama.cpp's vocabulary
means, and colibri.text.tokenizer.spec_from_json builds the section from that,
so a GGUF tokenizer is checked exactly as a Hugging Face one is.

- `gpt2` (byte-level BPE): tokens, `merges` ("left right", rank = position),
  the pre-tokenizer `tokenizer.ggml.pre` names (PRE_TOKENIZERS: the names
  llama.cpp maps to the GPT-2, Qwen2, Llama-3 and StarCoder regexes;
  Llama-3's also ignores merges for a word found whole, as llama.cpp does).
- `llama` (SentencePiece): there are no merges in the file; llama.cpp
  merges the adjacent pair whose joined piece has the highest score. The
  same rule as ranked merges: every split of every piece into two pieces of
  the vocabulary is a merge, ranked by the joined piece's score (highest
  first). Spaces become ▁ (with one ▁ before the text when
  `add_space_prefix`), unknown characters their <0xNN> byte pieces.
- Token types: control tokens are special added tokens, user-defined ones
  plain added tokens (matched in the raw text), unused ids stay empty.
  bos/eos from `bos_token_id` / `eos_token_id`; `add_bos_token` makes
  generation start with bos.
"""
from __future__ import annotations

from . import tokenizer as tk

# llama-vocab.cpp's StarCoder pre-tokenizer: "\p{N}" (each digit apart), then
# the GPT-2 regex; Refact's (IBM Granite's tokenizer), Command-R's, SmolLM's,
# CodeShell's, EXAONE's and Minerva's too. tokenizer.json writes it as
# Digits(individual) + ByteLevel with its regex.
STARCODER_NAMES = ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone",
                   "minerva-7b")
# tokenizer.ggml.pre names -> the pre-tokenizer (llama-vocab.cpp maps each
# of these to exactly that regex).
PRE_TOKENIZERS = {
    "gpt-2": tk.PRETOK_GPT2, "mpt": tk.PRETOK_GPT2, "olmo": tk.PRETOK_GPT2,
    "phi-2": tk.PRETOK_GPT2,
    "qwen2": tk.PRETOK_QWEN2, "deepseek-r1-qwen": tk.PRETOK_QWEN2, "stablelm2": tk.PRETOK_QWEN2,
    "llama-bpe": tk.PRETOK_LLAMA3, "llama3": tk.PRETOK_LLAMA3, "llama-v3": tk.PRETOK_LLAMA3,
    "dbrx": tk.PRETOK_LLAMA3, "smaug-bpe": tk.PRETOK_LLAMA3,
    **{name: "starcoder" for name in STARCODER_NAMES},
}
# llama.cpp sets ignore_merges (and add_bos) for these.
LLAMA3_NAMES = ("llama-bpe", "llama3", "llama-v3")
PATTERN = {tk.PRETOK_QWEN2: tk.QWEN2_PATTERN, tk.PRETOK_LLAMA3: tk.LLAMA3_PATTERN}

# llama.cpp's token types (llama_token_type / gguf-py TokenType).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def spec_from_gguf(g) -> tk.TokenizerSpec | None:
    """The tokenizer of GGUFFile g, or None when it has none. Raises
    tk.UnsupportedTokenizer (a kind Colibri does not have) or
    tk.TokenizerError (malformed)."""
    model = g.value("tokenizer.ggml.model")
    if model is None:
        return None
    tj, config = tokenizer_json(g, model)
    return tk.spec_from_json(tj, config)


def _ids(g, key: str, n: int):
    v = g.value(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
        raise tk.TokenizerError(f"{key} = {v!r} is not a token id below {n}")
    return v


def tokenizer_json(g, model: str) -> tuple[dict, dict]:
    """(tokenizer.json dict, config.json-like dict of bos/eos ids)."""
    if model not in ("gpt2", "llama"):
        raise tk.UnsupportedTokenizer(f"GGUF tokenizer model {model!r}: colibri reads gpt2 "
                                      "(byte-level BPE) and llama (SentencePiece)")
    tokens = g.array("tokenizer.ggml.tokens")
    if not tokens:
        raise tk.TokenizerError("tokenizer.ggml.tokens is missing or empty")
    if not all(isinstance(t, str) for t in tokens):
        raise tk.TokenizerError("tokenizer.ggml.tokens holds something other than strings")
    n = len(tokens)
    if n > tk.MAX_VOCAB:
        raise tk.TokenizerError(f"{n} tokens: more than {tk.MAX_VOCAB}")
    types = g.array("tokenizer.ggml.token_type") or [NORMAL] * n
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in types):
        raise tk.TokenizerError("tokenizer.ggml.token_type holds something other than integers")
    if len(types) != n:
        raise tk.TokenizerError(f"tokenizer.ggml.token_type has {len(types)} entries for "
                                f"{n} tokens")
    vocab: dict[str, int] = {}
    added = []
    for i, (piece, ty) in enumerate(zip(tokens, types)):
        ty = int(ty)
        if ty in (CONTROL, USER_DEFINED):
            if piece:
                added.append({"id": i, "content": piece, "special": ty == CONTROL,
                              "normalized": False})
        elif ty != UNUSED and piece and piece not in vocab:
            vocab[piece] = i
    config = {"bos_token_id": _ids(g, "tokenizer.ggml.bos_token_id", n),
              "eos_token_id": _ids(g, "tokenizer.ggml.eos_token_id", n)}
    if model == "gpt2":
        tj = _byte_level(g, vocab)
    else:
        tj = _sentencepiece(g, tokens, types, vocab)
    tj["added_tokens"] = added
    add_bos = g.value("tokenizer.ggml.add_bos_token")
    if add_bos is None:
        add_bos = model == "llama" or g.value("tokenizer.ggml.pre") in LLAMA3_NAMES
    bos = config["bos_token_id"]
    if add_bos and bos is not None:
        tj["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": tokens[bos], "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "special_tokens": {tokens[bos]: {"id": tokens[bos], "ids": [bos],
                                             "tokens": [tokens[bos]]}}}
    return tj, config


def _byte_level(g, vocab: dict) -> dict:
    pre = g.value("tokenizer.ggml.pre")
    if pre not in PRE_TOKENIZERS:
        known = ", ".join(sorted(PRE_TOKENIZERS))
        raise tk.UnsupportedTokenizer(f"pre-tokenizer {pre!r} (tokenizer.ggml.pre): colibri "
                                      f"has the GPT-2, Qwen2, Llama-3 and StarCoder regexes "
                                      f"({known})")
    kind = PRE_TOKENIZERS[pre]
    if kind == tk.PRETOK_GPT2:
        pretok = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
    elif kind == "starcoder":
        pretok = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}]}
    else:
        pretok = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERN[kind]}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}
    merges = g.array("tokenizer.ggml.merges") or []
    if not all(isinstance(m, str) for m in merges):
        raise tk.TokenizerError("tokenizer.ggml.merges holds something other than strings")
    model = {"type": "BPE", "vocab": vocab, "merges": merges,
             "ignore_merges": pre in LLAMA3_NAMES}
    return {"model": model, "pre_tokenizer": pretok, "normalizer": None,
            "decoder": {"type": "ByteLevel"}}


def _sentencepiece(g, tokens, types, vocab: dict) -> dict:
    scores = g.array("tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in scores):
        raise tk.TokenizerError("a llama (SentencePiece) tokenizer needs tokenizer.ggml.scores, "
                                "one number per token")
    merges = sp_merges(vocab, [float(s) for s in scores])
    prefix = g.value("tokenizer.ggml.add_space_prefix")
    prefix = True if prefix is None else bool(prefix)
    norm = [{"type": "Replace", "pattern": {"String": " "}, "content": tk.SP_SPACE}]
    if prefix:
        norm.insert(0, {"type": "Prepend", "prepend": tk.SP_SPACE})
    unk_id = g.value("tokenizer.ggml.unknown_token_id")
    if unk_id is None:
        unk_id = next((i for i, t in enumerate(types) if int(t) == UNKNOWN), None)
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
    if unk is not None and unk not in vocab:
        vocab[unk] = unk_id
    dec = [{"type": "Replace", "pattern": {"String": tk.SP_SPACE}, "content": " "},
           {"type": "ByteFallback"}, {"type": "Fuse"}]
    if prefix:
        dec.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    model = {"type": "BPE", "vocab": vocab, "merges": merges, "byte_fallback": True,
             "fuse_unk": True, "unk_token": unk}
    return {"model": model, "normalizer": {"type": "Sequence", "normalizers": norm},
            "pre_tokenizer": None, "decoder": {"type": "Sequence", "decoders": dec}}


def sp_merges(vocab: dict[str, int], scores: list[float]) -> list[list[str]]:
    """SentencePiece's merge order as a ranked merge list: every split of a
    piece into two vocabulary pieces, by the joined piece's score (highest
    first; equal scores by id, then by the left piece's length)."""
    found = []
    for piece, i in vocab.items():
        if len(piece) < 2 or (piece.startswith("<0x") and len(piece) == 6):
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                found.append((-scores[i], i, k, left, right))
    found.sort()
    return [[left, right] for _, _, _, left, right in found]
