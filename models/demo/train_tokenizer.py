"""Train the demo model's tokenizer: byte-level BPE on the demo corpus.

    .venv/bin/python models/demo/train_tokenizer.py   # writes checkpoint/tokenizer.json

Kind (a) of issue 14: GPT-2 byte-level BPE (the ByteLevel pre-tokenizer with
its regex, the 256 byte symbols as the initial alphabet), trained by Hugging
Face `tokenizers` on the training documents only (prepare_corpus.split(): the
held-out documents never reach the tokenizer), VOCAB_SIZE pieces, no special
tokens (the model never saw any: documents are separated by "\n\n" as in the
byte-level model's stream). Takes a few seconds; BPE training is
deterministic (ties broken by the pieces' bytes), so the file is reproducible.
train.py reads the tokenizer it writes; convert stores it in the .colibri file.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import prepare_corpus as corpus  # noqa: E402

# 2048 pieces: with tied input/output embeddings (2048 x 128) and experts of
# width 112 the model has exactly the byte-level model's 1,840,256 parameters
# (train.py MODEL_CONFIG).
VOCAB_SIZE = 2048
TOKENIZER_JSON = HERE / "checkpoint" / "tokenizer.json"


def build(vocab_size: int = VOCAB_SIZE):
    """A trained `tokenizers.Tokenizer` (byte-level BPE, GPT-2 regex)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    train_docs, _ = corpus.split()
    texts = [p.read_bytes().strip().decode("utf-8") for p in train_docs]
    tok.train_from_iterator(texts, trainer)
    return tok


def load(path: Path = TOKENIZER_JSON):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(path))


def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte -> printable character table, inverted: ByteLevel pieces
    spell each byte as one of these characters."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return {c: b for b, c in chars.items()}


def piece_lengths(tok) -> "list[int]":
    """[vocab] the number of bytes each piece stands for (id -> byte count),
    for bits per byte: a token's cross-entropy is spread over its bytes."""
    byte_of = _byte_of_char()
    lengths = [0] * tok.get_vocab_size()
    for piece, i in tok.get_vocab().items():
        assert all(c in byte_of for c in piece), piece
        lengths[i] = len(piece)
    return lengths


def encode_bytes(tok, data: bytes) -> list[int]:
    """Token ids of UTF-8 text given as bytes (the corpus is valid UTF-8)."""
    return tok.encode(data.decode("utf-8"), add_special_tokens=False).ids


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Train the demo tokenizer.")
    ap.add_argument("--out", type=Path, default=TOKENIZER_JSON)
    args = ap.parse_args(argv)
    try:
        tok = build()
    except corpus.CorpusError as exc:
        print(f"train_tokenizer: {exc}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out))
    _, held = corpus.split()
    held_bytes = corpus.join(held)
    n = len(encode_bytes(tok, held_bytes))
    print(f"wrote {args.out}: {tok.get_vocab_size()} pieces; held-out text "
          f"{len(held_bytes)} bytes -> {n} tokens ({len(held_bytes) / n:.2f} bytes/token)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
