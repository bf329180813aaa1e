"""Quality at equal bits: Colibri's `--quant q4` (and int8) against llama.cpp's
Q4_K_M, Q4_0 (and Q8_0), measured as llama.cpp measures its own quantisations.

    .venv/bin/python bench/quality.py                  # every model -> bench/results/quality.{json,md}
    .venv/bin/python bench/quality.py --models demo,k256 --out build/bench/quality-quick

Models (each with its float32 reference):
  demo   the trained demo (models/demo/checkpoint: Mixtral, hidden 128, vocab 2048,
         byte-level BPE); tokens = its whole held-out text (the documents
         models/demo/prepare_corpus.py holds out), tokenised at once by the
         checkpoint's tokenizer.json, 64 chunks evenly spaced over it; also
         measured with one importance matrix for both engines (make_imatrix)
  tiny, wide, k256   tests/golden_configs.py's random models (k256: hidden 256, so
         the K block types apply); random token ids
  mid    bench/models.py MID: the bench "small" model's shapes with 2 layers
         (hidden 1024, 8 experts of 2816, vocab 32000; 0.21 B parameters); random ids

Files: a float32 GGUF from bench/gguf_export.py (llama.cpp's convert_hf_to_gguf.py
refuses these checkpoints: the random ones have no tokenizer, the demo's locally
trained BPE has a pre-tokenizer hash it does not know), quantised by llama.cpp's own
`llama-quantize` to Q8_0, Q4_K_M and Q4_0 (native build of
scripts/build_llama_bench.sh); the .colibri files by `colibri convert --quant
f32|int8|q4` (re-made on every run: the quantisers are still changing).

How identical tokens are guaranteed: the reference logits (the C runtime on the f32
.colibri file, checked against the numpy reference colibri/model/reference.py) are written
as a `llama-perplexity --kl-divergence-base` file in llama.cpp's own format
(tools/perplexity/perplexity.cpp: "_logits_", n_ctx, n_vocab, n_chunk, the token ids,
then per chunk the second half's log-probabilities as uint16 over [max-16, max]).
`llama-perplexity --kl-divergence` reads the token ids from that file (it does not
tokenise anything in this mode) and compares each GGUF's logits with it; Colibri's
files are compared with the same file by the same arithmetic (kl_stats below mirrors
perplexity.cpp's log_softmax). The llama.cpp f32 row is the control: its KL from the
Colibri f32 reference says both engines compute the same model on the same tokens.

Scored positions are llama-perplexity's: chunks of n_ctx tokens, each a fresh
sequence, every position from n_ctx/2 to n_ctx-2 predicting the next token.
Figures: bits per weight (file bytes * 8 / the checkpoint's parameters, and the
tensors' data bytes * 8 / their elements), KL divergence from the reference (mean,
median, 99th percentile, max), top-1 agreement with the reference, perplexity, and
for the demo bits per byte (the scored tokens' nats / ln 2 / their bytes).
Nothing is asserted.
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import json
import math
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import gguf_export, models, threads  # noqa: E402

LLAMA_BIN = ROOT / "build" / "bench" / "llama.cpp" / "native" / "bin"
DEMO_DIR = ROOT / "models" / "demo"
# name -> tokens per chunk, chunks. A mean KL is carried by its few large
# values (a token that swaps experts), so the sample is as large as the run
# time allows: its standard error is in the report. `calibrated`: the model
# has calibration text (the demo's training documents), so both engines are
# also measured with an importance matrix from it.
SUBJECTS = {
    "demo": dict(n_ctx=128, n_chunk=64, calibrated=True),
    "tiny": dict(n_ctx=64, n_chunk=32, calibrated=False),
    "wide": dict(n_ctx=64, n_chunk=32, calibrated=False),
    "k256": dict(n_ctx=64, n_chunk=32, calibrated=False),
    "mid": dict(n_ctx=128, n_chunk=16, calibrated=False),
}
GGUF_TYPES = ("Q8_0", "Q4_K_M", "Q4_0")      # llama-quantize's names
GGUF_IMATRIX_TYPES = ("Q4_K_M",)             # also made with the importance matrix
COLIBRI_QUANTS = ("f32", "int8", "q4")
IMATRIX = "+imatrix"                         # the suffix of a calibrated row's quant
LN2 = math.log(2.0)


def log(msg: str) -> None:
    print(f"[quality {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- checkpoints and token ids ------------------------------------------------

def checkpoint_dir(name: str, work: Path) -> Path:
    """The HF checkpoint of subject `name` (generated once, fixed seeds)."""
    if name == "demo":
        return DEMO_DIR / "checkpoint"
    out = work / name / "hf"
    stamp = out / ".done"
    if stamp.exists():
        return out
    if out.exists():
        shutil.rmtree(out)
    log(f"generating the {name} checkpoint in {out}")
    if name == "mid":
        models.write_numpy_checkpoint(models.MID, out, seed=0)
    else:
        sys.path.insert(0, str(ROOT / "tests"))
        from golden_configs import make_mixtral
        make_mixtral(name, 0).save_pretrained(out)
    stamp.write_text("seed 0\n")
    return out


def _demo_eval():
    """models/demo/eval.py as a module (its tokenizer and windows helpers)."""
    sys.path.insert(0, str(DEMO_DIR))
    import eval as demo_eval  # noqa: PLC0415  (models/demo/eval.py)
    return demo_eval


def token_chunks(name: str, vocab: int, n_ctx: int, n_chunk: int):
    """(ids [n_chunk, n_ctx] int32, bytes per vocabulary piece [V] or None).
    Demo: the held-out documents (Debian's python3.11-doc, which
    scripts/setup.sh installs) tokenised whole by the checkpoint's tokenizer,
    n_chunk windows evenly spaced over them."""
    if name == "demo":
        ev = _demo_eval()
        corpus = ev.corpus                     # models/demo/prepare_corpus.py
        try:
            _, heldout = corpus.split()
        except corpus.CorpusError as exc:
            raise SystemExit(f"quality: {exc}") from None
        tokens = np.array(ev.train_tokenizer.encode_bytes(ev.tokenizer(), corpus.join(heldout)),
                          dtype=np.int32)
        starts = [i * (len(tokens) - n_ctx) // (n_chunk - 1) for i in range(n_chunk)]
        return (np.stack([tokens[s:s + n_ctx] for s in starts]),
                np.asarray(ev.piece_lengths()))
    rng = np.random.default_rng([7, vocab, n_ctx])
    return rng.integers(0, vocab, size=(n_chunk, n_ctx), dtype=np.int32), None


def checkpoint_parameters(hf_dir: Path) -> int:
    from colibri.model import hf
    return int(sum(t.numel for t in hf.Checkpoint(hf_dir).tensors.values()))


# --- llama.cpp files --------------------------------------------------------

def llama_tool(tool: str) -> Path:
    p = LLAMA_BIN / tool
    if not p.exists():
        raise SystemExit(f"quality: no {p}: build it with scripts/build_llama_bench.sh")
    return p


def llama_quantize(src: Path, dst: Path, qtype: str, log_path: Path, imatrix=None) -> None:
    """`llama-quantize [--imatrix FILE] SRC DST QTYPE 1`, written via a .part file."""
    tmp = dst.with_suffix(".part")
    cmd = ["nice", "-n", "10", str(llama_tool("llama-quantize"))]
    cmd += ["--imatrix", str(imatrix)] if imatrix else []
    r = subprocess.run(cmd + [str(src), str(tmp), qtype, "1"],
                       capture_output=True, text=True, errors="replace")
    if r.returncode:
        raise RuntimeError(f"llama-quantize {qtype} failed:\n{(r.stderr or r.stdout)[-2000:]}")
    log_path.write_text(" ".join(cmd) + "\n" + r.stdout + r.stderr)
    tmp.rename(dst)


def make_ggufs(hf_dir: Path, out_dir: Path, imatrix: Path | None = None) -> dict[str, Path]:
    """{"f32": ..., "Q8_0": ..., "Q4_K_M": ..., "Q4_0": ...} (cached: the f32 file
    and the llama-quantize outputs only depend on the checkpoint and llama.cpp),
    and with `imatrix` (llama.cpp's imatrix file) "Q4_K_M+imatrix" (made anew:
    the importance matrix comes from our reference)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"f32": out_dir / "model-f32.gguf"}
    if not files["f32"].exists():
        log(f"  GGUF f32 (bench/gguf_export.py) -> {files['f32']}")
        tmp = files["f32"].with_suffix(".part")
        gguf_export.write_gguf(hf_dir, tmp, "f32")
        tmp.rename(files["f32"])
    for t in GGUF_TYPES:
        files[t] = out_dir / f"model-{t.lower()}.gguf"
        if files[t].exists():
            continue
        log(f"  llama-quantize {t} -> {files[t].name}")
        llama_quantize(files["f32"], files[t], t, out_dir / f"quantize-{t.lower()}.log")
    for t in GGUF_IMATRIX_TYPES if imatrix else ():
        files[t + IMATRIX] = out_dir / f"model-{t.lower()}-imatrix.gguf"
        log(f"  llama-quantize --imatrix {t} -> {files[t + IMATRIX].name}")
        llama_quantize(files["f32"], files[t + IMATRIX], t,
                       out_dir / f"quantize-{t.lower()}-imatrix.log", imatrix)
    return files


def gguf_tensor_bits(path: Path) -> dict:
    """Tensor data bytes, elements and the count of tensors per ggml type."""
    import gguf
    r = gguf.GGUFReader(str(path))
    types: dict[str, int] = {}
    nbytes = nel = 0
    for t in r.tensors:
        nbytes += int(t.n_bytes)
        nel += int(t.n_elements)
        if len(t.shape) > 1 or int(t.n_elements) > 4096:   # the matrices, not the norms
            types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    return {"tensor_bytes": nbytes, "elements": nel, "types": types}


# --- Colibri files ------------------------------------------------------------

def make_colibri(hf_dir: Path, out_dir: Path, n_ctx: int,
                 imatrix: Path | None = None) -> dict[str, Path]:
    """`colibri convert --quant Q` for every Q (in-process: the command's own
    code), and with `imatrix` (`colibri imatrix`'s file) q4 with it too."""
    from colibri import cli
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [(q, []) for q in COLIBRI_QUANTS]
    jobs += [("q4" + IMATRIX, ["--imatrix", str(imatrix)])] if imatrix else []
    files = {}
    for name, extra in jobs:
        files[name] = out_dir / f"model-{name.replace(IMATRIX, '-imatrix')}.colibri"
        log(f"  colibri convert --quant {name} -> {files[name].name}")
        rc = cli.main(["convert", str(hf_dir), "-o", str(files[name]), "--quant",
                       name.replace(IMATRIX, ""), "--max-seq-len", str(n_ctx), "-q", *extra])
        if rc:
            raise RuntimeError(f"colibri convert --quant {name} failed ({rc})")
    return files


# --- calibration: one importance matrix for both engines ----------------------

def make_imatrix(hf_dir: Path, out_dir: Path) -> tuple[Path, Path]:
    """The demo's importance matrix on its training documents (never the
    held-out text the KL is measured on), measured once by `colibri imatrix`
    (the numpy reference in float32; its default 32768 tokens), and the same
    numbers as a llama.cpp imatrix file: both quantisers get the same
    importance of every column. Returns (the .npz, the llama.cpp file)."""
    from colibri import cli
    out_dir.mkdir(parents=True, exist_ok=True)
    text = out_dir / "calibration.txt"
    corpus = _demo_eval().corpus
    train, _ = corpus.split()
    text.write_bytes(corpus.join(train))
    npz, dat = out_dir / "imatrix.npz", out_dir / "imatrix.dat"
    log(f"  colibri imatrix --text {text.name} -> {npz.name}")
    if cli.main(["imatrix", str(hf_dir), "--text", str(text), "-o", str(npz)]):
        raise RuntimeError("colibri imatrix failed")
    cfg = json.loads((hf_dir / "config.json").read_text())
    write_llama_imatrix(npz, cfg, dat)
    return npz, dat


def write_llama_imatrix(npz: Path, cfg: dict, out: Path) -> None:
    """llama.cpp's legacy imatrix file (common/imatrix-loader.cpp:
    int32 n_entries; per entry int32 name length, the name, int32 ncall,
    int32 nval, float32 values[nval], which the loader divides by ncall) of the
    mean squared inputs in `npz`. An experts tensor's entry is its experts'
    columns one after another (llama-quantize reads expert e's at e * cols);
    an expert no calibration token reached gets 1.0 everywhere, what
    llama.cpp's own loader gives it and what our converter's no-importance is."""
    from colibri.file.format import EXPERT_KINDS, Kind
    from colibri.model import imatrix as im
    from colibri.model.families.common import GGUF_GLOBAL_TENSORS, GGUF_LAYER_TENSORS
    table = im.load(npz)
    quantised = {Kind.WQ, Kind.WK, Kind.WV, Kind.WO, *EXPERT_KINDS}  # not the f32 router
    head = GGUF_GLOBAL_TENSORS[Kind.EMBED if cfg.get("tie_word_embeddings") else Kind.LM_HEAD]
    entries = {}
    n_exp = cfg["num_local_experts"]
    for (kind, layer, expert), mean in table.items():
        if kind == Kind.LM_HEAD:
            entries[head] = mean
        elif kind in quantised and expert is None:
            entries[f"blk.{layer}.{GGUF_LAYER_TENSORS[kind]}"] = mean
        elif kind in quantised:
            name = f"blk.{layer}.{GGUF_LAYER_TENSORS[kind]}"
            entries.setdefault(name, np.ones((n_exp, mean.size), np.float32))[expert] = mean
    with open(out, "wb") as f:
        f.write(struct.pack("<i", len(entries)))
        for name, values in entries.items():
            v = np.ascontiguousarray(values, "<f4").reshape(-1)
            f.write(struct.pack("<i", len(name)) + name.encode())
            f.write(struct.pack("<ii", 1, v.size) + v.tobytes())


def colibri_tensor_bits(path: Path) -> dict:
    from colibri.file import format as fmt
    cf = fmt.read_file(path, check_crc=False)
    types: dict[str, int] = {}
    nbytes = nel = 0
    for e in cf.entries:
        if e.kind not in fmt.Kind._value2member_map_:
            continue   # the tokenizer section: not a tensor (GGUF keeps it in metadata)
        nbytes += e.size
        nel += e.rows * e.cols
        if e.rows > 1:
            name = fmt.DType(e.dtype).name
            types[name] = types.get(name, 0) + 1
    cf.close()
    return {"tensor_bytes": nbytes, "elements": nel, "types": types}


def colibri_library() -> Path:
    """libcolibri.so for this host (the default kernels), built once."""
    from colibri.buildsteps import cbuild
    info = cbuild.build(ROOT / "build" / "bench" / "quality" / "lib",
                        kernels=cbuild.host_kernels(), mmap=False, cli=False, shared=True)
    return info["so"]


def colibri_logits(path: Path, ids: np.ndarray, library: Path, threads: int) -> np.ndarray:
    """The C runtime's logits [n_chunk, n_ctx, V], each chunk a fresh sequence."""
    from colibri.runtime import Model
    with Model(path, library=library, threads=threads) as m:
        return np.stack([m.infer(chunk[None])[0] for chunk in ids])


def numpy_reference_check(path: Path, ids: np.ndarray, c_logits: np.ndarray) -> float:
    """Max |C f32 - numpy reference| over the first chunk (the reference of the
    reference: colibri/model/reference.py is independent of the C runtime)."""
    from colibri.model.reference import Reference
    ref = Reference(path).forward(ids[:1].astype(np.int64), mask=None, n_past=0)
    return float(np.max(np.abs(ref[0] - c_logits[0])))


# --- llama-perplexity's base file, and its KL arithmetic ---------------------

def _nearest_int(x: np.ndarray) -> np.ndarray:
    """perplexity.cpp nearest_int: round to nearest, ties to even (float32)."""
    return np.rint(x.astype(np.float32)).astype(np.int64)


def base_log_probs(logits: np.ndarray) -> np.ndarray:
    """Logits [n, V] float32 -> [n, nv] uint16 records as perplexity.cpp's
    log_softmax writes them: floats scale, min_log_prob in the first 4 uint16,
    then round((logit - min_logit) / scale) with min_logit >= max - 16."""
    n, V = logits.shape
    nv = 2 * ((V + 1) // 2) + 4
    x = logits.astype(np.float32)
    mx = x.max(axis=1)
    mn = np.maximum(x.min(axis=1), mx - np.float32(16))
    sum_exp = np.exp((x - mx[:, None]).astype(np.float32)).astype(np.float64).sum(axis=1)
    lse = np.log(sum_exp).astype(np.float32)
    min_log_prob = (mn - mx - lse).astype(np.float32)
    scale = ((mx - mn) / np.float32(65535)).astype(np.float32)
    out = np.zeros((n, nv), dtype=np.uint16)
    head = np.stack([scale, min_log_prob], axis=1).astype("<f4")     # [n, 2] -> 4 uint16
    out[:, :4] = head.view("<u2").reshape(n, 4)
    inv = np.where(scale > 0, np.float32(1) / np.where(scale > 0, scale, 1), 0).astype(np.float32)
    q = _nearest_int(inv[:, None] * (x - mn[:, None]))
    q = np.where(x > mn[:, None], np.clip(q, 0, 65535), 0)
    out[:, 4:4 + V] = q.astype(np.uint16)
    return out


def write_base_file(path: Path, ids: np.ndarray, ref_logits: np.ndarray) -> None:
    """A `--kl-divergence-base` file for token chunks ids [c, n_ctx] and the
    reference's logits [c, n_ctx, V] (positions n_ctx/2 .. n_ctx-2 stored)."""
    c, n_ctx = ids.shape
    V = ref_logits.shape[-1]
    first = n_ctx // 2
    with open(path, "wb") as f:
        f.write(b"_logits_")
        f.write(struct.pack("<Iii", n_ctx, V, c))
        f.write(ids.astype("<i4").tobytes())
        for k in range(c):
            f.write(base_log_probs(ref_logits[k, first:n_ctx - 1]).tobytes())


def read_base_file(path: Path):
    """(ids [c, n_ctx], records [c, n_ctx-1-n_ctx/2, nv] uint16)."""
    raw = path.read_bytes()
    assert raw[:8] == b"_logits_", path
    n_ctx, V, c = struct.unpack_from("<Iii", raw, 8)
    off = 20
    ids = np.frombuffer(raw, "<i4", c * n_ctx, off).reshape(c, n_ctx)
    off += 4 * c * n_ctx
    nv = 2 * ((V + 1) // 2) + 4
    n = n_ctx - 1 - n_ctx // 2
    rec = np.frombuffer(raw, "<u2", c * n * nv, off).reshape(c, n, nv)
    return ids, rec, V


def _percentile(sorted_v: np.ndarray, fraction: float) -> float:
    """perplexity.cpp's percentile (linear between neighbours of a sorted list)."""
    p = fraction * (len(sorted_v) - 1)
    i = int(p)
    p -= i
    return float((1 - p) * sorted_v[i] + p * sorted_v[min(i + 1, len(sorted_v) - 1)])


def kl_stats(logits: np.ndarray, base: Path) -> dict:
    """What `llama-perplexity --kl-divergence` computes, for logits [c, n_ctx, V]
    of the base file's token chunks: per scored position the KL divergence
    sum_i p_base,i (log p_base,i - log p_i) over the entries with log p_base > -16,
    the next token's nll, whether the arg-maxes agree (the first maximum)."""
    ids, rec, V = read_base_file(base)
    c, n_ctx = ids.shape
    first = n_ctx // 2
    klds, nlls, nll_bases, same = [], [], [], 0
    for k in range(c):
        r = rec[k]                                                   # [n, nv]
        head = np.ascontiguousarray(r[:, :4]).view("<f4").reshape(-1, 2)
        scale, mlp = head[:, 0], head[:, 1]
        p_log_base = (scale[:, None] * r[:, 4:4 + V].astype(np.float32)
                      + mlp[:, None]).astype(np.float32)             # [n, V]
        x = logits[k, first:n_ctx - 1].astype(np.float64)            # [n, V]
        m = x.max(axis=1, keepdims=True)
        lp = x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
        pb = np.where(p_log_base > -16, np.exp(p_log_base.astype(np.float64)), 0.0)
        klds.append((pb * (p_log_base - lp)).sum(axis=1))
        tok = ids[k, first + 1:n_ctx]
        rows = np.arange(len(tok))
        nlls.append(-lp[rows, tok])
        nll_bases.append(-p_log_base[rows, tok].astype(np.float64))
        same += int((x.argmax(axis=1) == p_log_base.argmax(axis=1)).sum())
    kld = np.sort(np.concatenate(klds))
    nll = np.concatenate(nlls)
    return {"kld_mean": float(kld.mean()),
            # perplexity.cpp's uncertainty of the mean: sqrt(var / (n - 1))
            "kld_se": float(math.sqrt(kld.var() / (len(kld) - 1))),
            "kld_median": _percentile(kld, 0.5),
            "kld_p99": _percentile(kld, 0.99), "kld_max": float(kld[-1]),
            "same_top": same / len(kld), "ppl": float(np.exp(nll.mean())),
            "ppl_base": float(np.exp(np.concatenate(nll_bases).mean())),
            "count": int(len(kld)), "nll_sum": float(nll.sum())}


_LP = {  # llama-perplexity's summary lines -> our keys
    "ppl": r"Mean PPL\(Q\)\s*:\s*([-\d.]+)",
    "ppl_base": r"Mean PPL\(base\)\s*:\s*([-\d.]+)",
    "kld_mean": r"Mean\s+KLD:\s*([-\d.]+)",
    "kld_se": r"Mean\s+KLD:\s*[-\d.]+\s*±\s*([-\d.]+)",
    "kld_max": r"Maximum KLD:\s*([-\d.]+)",
    "kld_p99": r"99\.0%\s+KLD:\s*([-\d.]+)",
    "kld_median": r"Median\s+KLD:\s*([-\d.]+)",
    "same_top": r"Same top p:\s*([-\d.]+)",
}


def llama_kl(gguf: Path, base: Path, n_ctx: int, threads: int, attempts: int = 4) -> dict:
    """`llama-perplexity --kl-divergence` of one GGUF against the base file
    (float32 KV cache like Colibri's; one sequence of n_ctx per batch).
    llama.cpp's logger writes from a thread it never joins (common/log.cpp
    leaks it on purpose), so on a loaded machine the summary printed last is
    sometimes lost although the run succeeded: then the run is repeated."""
    cmd = ["nice", "-n", "10", str(llama_tool("llama-perplexity")), "-m", str(gguf),
           "--kl-divergence-base", str(base), "--kl-divergence", "-c", str(n_ctx),
           "-b", str(n_ctx), "-t", str(threads), "-ctk", "f32", "-ctv", "f32"]
    for attempt in range(1, attempts + 1):
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
        text = r.stdout + r.stderr
        (gguf.parent / f"kl-{gguf.stem}.log").write_text(" ".join(cmd) + "\n" + text)
        out = {k: float(m.group(1)) for k, pat in _LP.items() if (m := re.search(pat, text))}
        if r.returncode == 0 and len(out) == len(_LP):
            break
        if r.returncode == 0 and attempt < attempts:
            log(f"    llama-perplexity's summary was lost (attempt {attempt}): again")
    if r.returncode or len(out) != len(_LP):
        return {"error": f"llama-perplexity exit {r.returncode}: " + text[-800:]}
    out["same_top"] /= 100.0
    ids, _, _ = read_base_file(base)
    out["count"] = int(ids.shape[0] * (n_ctx - 1 - n_ctx // 2))
    out["nll_sum"] = out["count"] * math.log(out["ppl"])
    return out


def scored_bytes(ids: np.ndarray, lengths: np.ndarray) -> int:
    """Bytes the scored target tokens stand for (positions n_ctx/2+1 .. n_ctx-1)."""
    n_ctx = ids.shape[1]
    return int(lengths[ids[:, n_ctx // 2 + 1:]].sum())


# --- one subject --------------------------------------------------------------

def run_subject(name: str, work: Path, threads: int, library: Path) -> dict:
    spec = SUBJECTS[name]
    hf_dir = checkpoint_dir(name, work)
    cfg = json.loads((hf_dir / "config.json").read_text())
    params = checkpoint_parameters(hf_dir)
    ids, lengths = token_chunks(name, cfg["vocab_size"], spec["n_ctx"], spec["n_chunk"])
    n_ctx = spec["n_ctx"]
    log(f"{name}: {params / 1e6:.2f} M parameters, {ids.shape[0]} chunks of {n_ctx} tokens "
        f"({ids.shape[0] * (n_ctx - 1 - n_ctx // 2)} scored positions)")
    d = work / name
    npz, dat = make_imatrix(hf_dir, d / "imatrix") if spec["calibrated"] else (None, None)
    ggufs = make_ggufs(hf_dir, d / "gguf", dat)
    colibris = make_colibri(hf_dir, d / "colibri", n_ctx, npz)

    log(f"  reference: C runtime on the f32 .colibri file")
    ref = colibri_logits(colibris["f32"], ids, library, threads)
    ref_check = numpy_reference_check(colibris["f32"], ids, ref)
    base = d / "base-colibri-f32.kld"
    write_base_file(base, ids, ref)
    back_ids, _, _ = read_base_file(base)
    assert np.array_equal(back_ids, ids)

    rows = []
    nbytes = scored_bytes(ids, lengths) if lengths is not None else None

    def finish(row, path, bits):
        row["file_bytes"] = path.stat().st_size
        row["bpw_file"] = row["file_bytes"] * 8 / params
        row["bpw_tensors"] = bits["tensor_bytes"] * 8 / bits["elements"]
        row["types"] = bits["types"]
        if nbytes and "nll_sum" in row:
            row["bpb"] = row["nll_sum"] / LN2 / nbytes
        rows.append(row)

    for q, path in colibris.items():
        log(f"  colibri {q}: logits and KL")
        lg = ref if q == "f32" else colibri_logits(path, ids, library, threads)
        finish({"engine": "colibri", "quant": q, **kl_stats(lg, base)}, path,
               colibri_tensor_bits(path))
    for t, path in ggufs.items():
        log(f"  llama.cpp {t}: llama-perplexity --kl-divergence")
        finish({"engine": "llama.cpp", "quant": t, **llama_kl(path, base, n_ctx, threads)},
               path, gguf_tensor_bits(path))
    return {"name": name, "config": {k: cfg.get(k) for k in (
                "hidden_size", "intermediate_size", "num_hidden_layers", "num_local_experts",
                "num_experts_per_tok", "vocab_size", "tie_word_embeddings")},
            "parameters": params, "n_ctx": n_ctx, "n_chunk": int(ids.shape[0]),
            "scored_positions": int(ids.shape[0] * (n_ctx - 1 - n_ctx // 2)),
            "scored_bytes": nbytes, "c_f32_vs_numpy_reference_max_abs": ref_check,
            "rows": rows}


# --- report -------------------------------------------------------------------

def _f(x, nd=4):
    return "—" if x is None else f"{x:.{nd}f}"


def _types(t: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(t.items(), key=lambda kv: -kv[1]))


def _cpu_line(cpu: dict | None) -> str:
    """The CPU the reference logits were computed on: the kernels it picks
    round differently, and so do llama.cpp's, so a rerun on another CPU
    moves the figures' last digits. Runs before the CPU was recorded have
    none."""
    if not cpu:
        return ""
    return f" · {cpu['model']}, {cpu['cores']} cores ({threads.cpu_features(cpu)})"


def markdown(res: dict) -> str:
    env = res["env"]
    L = ["# Quality at equal bits: Colibri vs llama.cpp", "",
         f"{env['date_utc']} UTC · `{res['command']}` · {res['wall_s'] / 60:.1f} min · "
         f"git {env['git']} · llama.cpp {env['llama_cpp']}"
         + _cpu_line(env.get("cpu")), "",
         "KL divergence of next-token distributions from the float32 reference (the C "
         "runtime on the f32 .colibri file), on the same token ids for both engines "
         "(written into a `llama-perplexity --kl-divergence-base` file that llama.cpp "
         "reads them from; bench/quality.py). Scored: positions n_ctx/2 .. n_ctx-2 of "
         "each chunk, as llama-perplexity scores. llama.cpp f32 is the control (same "
         "model, same tokens: KL near 0). bpw file = file bytes x 8 / checkpoint "
         "parameters; bpw tensors = tensor data x 8 / stored elements; types = the "
         "storage types of the matrices (count of tensors). bpb: the demo's held-out "
         "text, bits per byte of the scored tokens. KL mean ± its standard error "
         "(llama-perplexity's: a few tokens that swap experts carry much of a mean). "
         "+imatrix: quantised with one importance matrix for both engines, measured "
         "by `colibri imatrix` (the numpy reference) on the demo's training "
         "documents and handed to `llama-quantize --imatrix` as llama.cpp's own "
         "imatrix file.", ""]
    for s in res["subjects"]:
        c = s["config"]
        L += [f"## {s['name']}: hidden {c['hidden_size']}, intermediate "
              f"{c['intermediate_size']}, {c['num_hidden_layers']} layers, "
              f"{c['num_local_experts']} experts top-{c['num_experts_per_tok']}, vocab "
              f"{c['vocab_size']}; {s['parameters'] / 1e6:.2f} M parameters; "
              f"{s['n_chunk']} chunks x {s['n_ctx']} tokens, {s['scored_positions']} scored",
              "",
              f"C f32 vs numpy reference, max |logit diff| (first chunk): "
              f"{s['c_f32_vs_numpy_reference_max_abs']:.2e}", "",
              "| engine | quant | MB | bpw file | bpw tensors | KL mean | KL median | "
              "KL p99 | KL max | top-1 | PPL | bpb | types |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in s["rows"]:
            if "error" in r:
                L.append(f"| {r['engine']} | {r['quant']} | {r['file_bytes'] / 1e6:.2f} | "
                         f"{r['bpw_file']:.2f} | {r['bpw_tensors']:.2f} | error: "
                         f"{r['error'][:80]!r} | | | | | | | |")
                continue
            L.append(f"| {r['engine']} | {r['quant']} | {r['file_bytes'] / 1e6:.2f} | "
                     f"{r['bpw_file']:.2f} | {r['bpw_tensors']:.2f} | {_f(r['kld_mean'], 5)} ± "
                     f"{_f(r.get('kld_se'), 5)} | "
                     f"{_f(r.get('kld_median'), 5)} | {_f(r.get('kld_p99'), 5)} | "
                     f"{_f(r.get('kld_max'), 4)} | {100 * r['same_top']:.1f} % | "
                     f"{_f(r.get('ppl'), 3)} | {_f(r.get('bpb'), 4)} | {_types(r['types'])} |")
        L.append("")
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench/quality.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(SUBJECTS),
                    help=f"comma-separated subset of {','.join(SUBJECTS)}")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results",
                    help="where quality.json and quality.md go")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "bench" / "quality",
                    help="checkpoints, GGUF and .colibri files (GGUF cached)")
    ap.add_argument("--threads", type=int, default=1, help="threads of both engines")
    ap.add_argument("--report-only", action="store_true",
                    help="measure nothing: rewrite quality.md from quality.json")
    a = ap.parse_args(argv)
    if a.report_only:
        (a.out / "quality.md").write_text(markdown(json.loads((a.out / "quality.json").read_text())))
        return 0
    names = [n for n in a.models.split(",") if n]
    for n in names:
        if n not in SUBJECTS:
            ap.error(f"unknown model {n!r}: choose from {', '.join(SUBJECTS)}")
    t0 = time.perf_counter()
    a.work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    llama_tool("llama-quantize"), llama_tool("llama-perplexity")
    library = colibri_library()
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, cwd=ROOT).stdout.strip()
    if subprocess.run(["git", "status", "--porcelain", "colibri", "src", "bench/quality.py",
                       "bench/gguf_export.py"], capture_output=True, text=True,
                      cwd=ROOT).stdout.strip():
        git += " (uncommitted changes in colibri/, src/ or the bench)"
    version = (LLAMA_BIN.parent / ".done").read_text().strip() \
        if (LLAMA_BIN.parent / ".done").exists() else "?"
    env = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "git": git,
           "llama_cpp": f"vendored in llama-cpp-python {version} (native build)",
           "threads": a.threads, "cpu": threads.cpu_description()}
    subjects = [run_subject(n, a.work, a.threads, library) for n in names]
    res = {"env": env, "command": "bench/quality.py " + " ".join(argv or sys.argv[1:]),
           "subjects": subjects, "wall_s": time.perf_counter() - t0}
    (a.out / "quality.json").write_text(json.dumps(res, indent=1) + "\n")
    md = markdown(res)
    (a.out / "quality.md").write_text(md)
    print(md)
    log(f"wrote {a.out}/quality.json and quality.md in {res['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
