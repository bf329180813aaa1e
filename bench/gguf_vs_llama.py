"""GGUF imports judged by llama.cpp itself: for each GGUF file, llama.cpp's
logits (libllama of the pinned build, bench/c/llama_logits.c) against the
logits of `colibri convert FILE.gguf` (the file's own types kept) run by
the C runtime (libcolibri.so, `python -m colibri.buildsteps.cbuild`) and the numpy
reference (colibri/model/reference.py), on the same token ids.

    python bench/gguf_vs_llama.py FILE.gguf [FILE.gguf ...] [--tokens N]

Needs scripts/build_llama_bench.sh's native build (libllama.so) and its
sources (llama.h). Prints, per file and engine: max |colibri - llama.cpp|
/ max |llama.cpp logit| over all positions, and the argmax agreement.
Both quantise activations to int8 per block for the block products
(llama.cpp's Q8_K for Q4_K/Q6_K, Q8_0 with an fp16 scale for Q8_0); where
a float sum in another order moves one activation across a rounding step,
that row and the later rows attending to it differ by ~1e-2 (docs/FORMAT.md
5: the numpy reference's sums are not the C runtime's).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
LLAMA = ROOT / "build" / "bench" / "llama.cpp"
VERSION = "0.3.36"


def driver() -> Path:
    src = LLAMA / "src" / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
    lib = LLAMA / "native" / "bin"
    exe = ROOT / "build" / "gguf-judge" / "llama_logits"
    c = ROOT / "bench" / "c" / "llama_logits.c"
    if not (lib / "libllama.so").exists():
        sys.exit("no libllama.so: run scripts/build_llama_bench.sh first")
    if not exe.exists() or exe.stat().st_mtime < c.stat().st_mtime:
        exe.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", str(c), f"-I{src / 'include'}",
                        f"-I{src / 'ggml' / 'include'}", f"-L{lib}", "-lllama", "-lggml",
                        "-lggml-base", f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True)
    return exe


def llama_logits(exe: Path, gguf: Path, ids: list[int], vocab: int) -> np.ndarray:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "logits.f32"
        subprocess.run([str(exe), str(gguf), str(out), *map(str, ids)], check=True,
                       capture_output=True)
        return np.fromfile(out, np.float32).reshape(len(ids), vocab)


def compare(exe: Path, gguf: Path, n: int, seed: int = 0) -> tuple[dict, str]:
    """{engine: (max |diff| / max |logit|, argmax agreement)} and the types."""
    from colibri import runtime
    from colibri.model.convert_gguf import GGUFExporter
    from colibri.model.reference import Reference
    with tempfile.TemporaryDirectory() as d:
        ex = GGUFExporter(gguf, tokenizer=False)
        out = ex.export(Path(d) / "m.colibri")
        vocab = ex.shape.vocab
        ids = np.random.default_rng(seed).integers(0, vocab, size=n).tolist()
        ours = {"reference": Reference(out).forward(np.array([ids]))[0]}
        try:
            with runtime.Model(out) as m:
                ours["C runtime"] = m.infer(np.array([ids]))[0]
        except Exception as exc:  # no libcolibri.so built: the reference alone
            print(f"  (C runtime skipped: {exc})")
    theirs = llama_logits(exe, gguf, ids, vocab)
    scale = np.abs(theirs).max()
    res = {k: (float(np.abs(v - theirs).max() / scale),
               float(np.mean(v.argmax(-1) == theirs.argmax(-1)))) for k, v in ours.items()}
    kinds = ", ".join(f"{n} {s}->{t}" for (s, t, _), n in sorted(ex.summary().items()))
    return res, kinds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", nargs="+", type=Path)
    ap.add_argument("--tokens", type=int, default=24)
    args = ap.parse_args()
    exe = driver()
    for g in args.gguf:
        try:
            res, kinds = compare(exe, g, args.tokens)
        except subprocess.CalledProcessError as exc:
            why = exc.stderr.decode(errors="replace").strip().splitlines()[-1:]
            print(f"{g.name}: llama.cpp cannot run it ({' '.join(why)})")
            continue
        print(f"{g.name} ({kinds}): max |colibri - llama.cpp| / max |logit| "
              + "; ".join(f"{k} {e:.2e} (argmax {a:.0%})" for k, (e, a) in res.items()))


if __name__ == "__main__":
    main()
