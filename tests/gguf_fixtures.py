"""GGUF files for the tests, made here (no hub):

- `llama_cpp()`: the pinned llama.cpp tree (the llama-cpp-python sdist's
  vendor/llama.cpp, where scripts/build_llama_bench.sh unpacks it); on a
  machine without it, fetched once with `pip download` of the same sdist
  (about 75 MB), as the script does. Only its Python converter, its gguf-py
  and its models/ggml-vocab-* files are used: nothing is built.
- `hf_to_gguf(jobs)`: llama.cpp's own convert_hf_to_gguf.py over tiny
  checkpoints (tests/hf_to_gguf_driver.py: one process for all of them).
- `requantize(src, dst, rule)`: a GGUF rewritten with some tensors quantised
  by llama.cpp's own ggml-quants.c (tests/llama_quants.py compiles it):
  the blocks llama-quantize writes, without a llama.cpp build.
- `tiny_tokenizer(dir)`: a 36-piece byte-level BPE tokenizer.json, small
  enough for the tiny vocabularies (convert_hf_to_gguf.py needs one).
- `write_gguf(path, ...)`: a GGUF written directly by the pinned gguf
  package (the hostile-input tests mutate these).
"""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
VERSION = os.environ.get("LLAMA_CPP_PYTHON_VERSION", "0.3.36")
SRC = ROOT / "build" / "bench" / "llama.cpp" / "src"


def llama_cpp() -> tuple[Path | None, str]:
    """(the llama.cpp tree, "") or (None, why not)."""
    env = os.environ.get("COLIBRI_LLAMA_CPP")
    tree = Path(env) if env else SRC / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
    if (tree / "convert_hf_to_gguf.py").is_file():
        return tree, ""
    if env:
        return None, f"COLIBRI_LLAMA_CPP={env} has no convert_hf_to_gguf.py"
    SRC.mkdir(parents=True, exist_ok=True)
    with open(SRC / ".fetch.lock", "w") as lock:   # pytest-xdist workers fetch once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (tree / "convert_hf_to_gguf.py").is_file():
            return tree, ""
        return _fetch(tree)


def _fetch(tree: Path) -> tuple[Path | None, str]:
    sdist = SRC / f"llama_cpp_python-{VERSION}.tar.gz"
    if not sdist.is_file():
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                            "--no-binary", ":all:", f"llama-cpp-python=={VERSION}",
                            "-d", str(SRC)], capture_output=True, text=True)
        if r.returncode or not sdist.is_file():
            return None, f"cannot fetch the llama-cpp-python {VERSION} sdist: {r.stderr[-300:]}"
    with tarfile.open(sdist) as tf:
        tf.extractall(SRC, filter="data")
    return (tree, "") if (tree / "convert_hf_to_gguf.py").is_file() else \
        (None, f"{sdist} has no vendor/llama.cpp/convert_hf_to_gguf.py")


def hf_to_gguf(tree: Path, jobs: list[tuple[Path, Path, str]]) -> None:
    """Run convert_hf_to_gguf.py for each (checkpoint dir, out.gguf, outtype)."""
    args = [str(x) for job in jobs for x in job]
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "hf_to_gguf_driver.py"),
                        str(tree), *args], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    if r.returncode:
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{r.stderr[-3000:]}")


def tiny_tokenizer(model_dir: Path) -> None:
    """A byte-level BPE tokenizer.json of 36 pieces (a-z, Ġ, Ċ, 8 merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", "Ċ"]
    merges = [("t", "h"), ("h", "e"), ("Ġ", "t"), ("i", "n"), ("th", "e"), ("e", "r"),
              ("a", "n"), ("Ġt", "he")]
    vocab = {c: i for i, c in enumerate(chars)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(Path(model_dir) / "tokenizer.json"))


def copy_metadata(reader, writer) -> None:
    """Every metadata field of a GGUFReader into a GGUFWriter (but the
    header's own and general.architecture, which the writer writes)."""
    import gguf
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, f.contents(), vtype, sub_type=sub)


def requantize(src: Path, dst: Path, rule) -> dict[str, str]:
    """Rewrite GGUF `src` as `dst` with each tensor whose rule(name, shape)
    gives "Q4_0" / "Q5_0" / "Q4_K" / "Q5_K" / "Q6_K" quantised by llama.cpp's ggml-quants.c
    (row by row, as llama-quantize does without an imatrix); others copied.
    Returns {tensor name: type written}."""
    import gguf
    import llama_quants as LQ
    lib, why = LQ.load()
    if lib is None:
        raise RuntimeError(why)
    ids = {"Q4_0": LQ.GGML_Q4_0, "Q5_0": LQ.GGML_Q5_0, "Q4_K": LQ.GGML_Q4_K,
           "Q5_K": LQ.GGML_Q5_K, "Q6_K": LQ.GGML_Q6_K}
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, r.fields["general.architecture"].contents())
    copy_metadata(r, w)
    written = {}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        want = rule(t.name, shape)
        if want is None or t.tensor_type != gguf.GGMLQuantizationType.F32:
            w.add_tensor(t.name, np.array(t.data), raw_shape=shape)
            written[t.name] = t.tensor_type.name
            continue
        rows = int(np.prod(shape[:-1]))
        x = np.ascontiguousarray(np.asarray(t.data, np.float32).reshape(rows, shape[-1]))
        cols_b, bytes_b = LQ.BLOCK[ids[want]]
        raw = np.zeros(rows * shape[-1] // cols_b * bytes_b, np.uint8)
        getattr(lib, f"quantize_{want[:2].lower()}{want[2:]}")(
            x.ctypes.data, raw.ctypes.data, rows, shape[-1], None)
        w.add_tensor(t.name, raw.reshape(*shape[:-1], -1),
                     raw_dtype=gguf.GGMLQuantizationType[want])
        written[t.name] = want
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


# --- GGUF files written directly (hostile-input tests) -------------------------

def write_gguf(path: Path, seed: int = 0, arch: str = "llama", experts: int = 4,
               q8: bool = False, tokenizer: str | None = "gpt2", pre: str = "gpt-2",
               extra_tensor: str | None = None) -> Path:
    """A tiny Mixtral-as-`llama` GGUF (hidden 32, 2 layers, 4 experts top-2,
    vocab 40; expert matrices Q8_0 when q8) with a byte-level tokenizer."""
    import gguf
    rng = np.random.default_rng(seed)
    h, inter, layers, vocab, heads, kv = 32, 32, 2, 40, 4, 2
    w = gguf.GGUFWriter(path, arch)
    p = arch + "."
    for key, v in (("block_count", layers), ("context_length", 64),
                   ("embedding_length", h), ("feed_forward_length", inter),
                   ("attention.head_count", heads), ("attention.head_count_kv", kv),
                   ("expert_used_count", 2)):
        w.add_uint32(p + key, v)
    if experts:
        w.add_uint32(p + "expert_count", experts)
    w.add_float32(p + "rope.freq_base", 10000.0)
    w.add_float32(p + "attention.layer_norm_rms_epsilon", 1e-5)
    if tokenizer:
        toks = [chr(c) for c in range(ord("a"), ord("a") + vocab - 4)] + ["Ġ", "ab", "abc",
                                                                          "<s>"]
        w.add_string("tokenizer.ggml.model", tokenizer)
        w.add_string("tokenizer.ggml.pre", pre)
        w.add_array("tokenizer.ggml.tokens", toks)
        w.add_array("tokenizer.ggml.token_type", [1] * (vocab - 1) + [3])
        w.add_array("tokenizer.ggml.merges", ["a b", "ab c"])
        w.add_array("tokenizer.ggml.scores", [-float(i) for i in range(vocab)])
        w.add_uint32("tokenizer.ggml.bos_token_id", vocab - 1)

    def mat(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    w.add_tensor("token_embd.weight", mat(vocab, h))
    w.add_tensor("output_norm.weight", np.ones(h, np.float32))
    w.add_tensor("output.weight", mat(vocab, h))
    hd = h // heads
    for layer in range(layers):
        b = f"blk.{layer}."
        w.add_tensor(b + "attn_norm.weight", np.ones(h, np.float32))
        w.add_tensor(b + "ffn_norm.weight", np.ones(h, np.float32))
        w.add_tensor(b + "attn_q.weight", mat(heads * hd, h))
        w.add_tensor(b + "attn_k.weight", mat(kv * hd, h))
        w.add_tensor(b + "attn_v.weight", mat(kv * hd, h))
        w.add_tensor(b + "attn_output.weight", mat(h, heads * hd))
        if experts:
            w.add_tensor(b + "ffn_gate_inp.weight", mat(experts, h))
            for name, shape in (("ffn_gate_exps", (experts, inter, h)),
                                ("ffn_up_exps", (experts, inter, h)),
                                ("ffn_down_exps", (experts, h, inter))):
                m = mat(*shape)
                if q8:
                    raw = gguf.quants.quantize(m, gguf.GGMLQuantizationType.Q8_0)
                    w.add_tensor(b + name + ".weight", raw,
                                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
                else:
                    w.add_tensor(b + name + ".weight", m)
        else:
            for name, shape in (("ffn_gate", (inter, h)), ("ffn_up", (inter, h)),
                                ("ffn_down", (h, inter))):
                w.add_tensor(b + name + ".weight", mat(*shape))
    if extra_tensor:
        w.add_tensor(extra_tensor, mat(2, 32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
