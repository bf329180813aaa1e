"""What the 8-bit KV cache costs in accuracy: the C runtime with an i8 cache
against the same runtime with the f32 cache, on the same file, position by
position: KL divergence KL(p_f32 || p_i8) of the next-token distributions,
top-1 (argmax) agreement, and for the demo model bits per byte with each.

    .venv/bin/python -m bench.kv_accuracy [--demo FILE] [--json OUT]

Models: the trained demo model (models/demo/checkpoint converted with
`colibri convert ... --quant int8`, and f32), its 32 evaluation windows
(models/demo/eval_windows.bin) joined into one text, tokenised, and cut into
sequences of max_seq_len tokens (the longest context the file allows), each
run as one prefill; and the golden configs (tests/golden_configs.py,
generated with transformers; random tokens, max_seq_len positions, f32 and
int8 files). Figures are measurements, nothing is asserted. Both caches run
through libcolibri.so (colibri.runtime, the build of `python -m
colibri.buildsteps.cbuild`).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "models" / "demo"


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def compare(l32: np.ndarray, l8: np.ndarray) -> dict:
    """Rows [n, vocab] of both caches -> KL(f32 || i8) in nats (mean, p99,
    max) and the argmax agreement."""
    a, b = log_softmax(l32), log_softmax(l8)
    kl = (np.exp(a) * (a - b)).sum(-1)
    return dict(rows=int(len(kl)), kl_mean=float(kl.mean()),
                kl_p99=float(np.quantile(kl, 0.99)), kl_max=float(kl.max()),
                top1_agree=float(np.mean(l32.argmax(-1) == l8.argmax(-1))))


def run(path: Path, seqs: list[np.ndarray], kv: str) -> list[np.ndarray]:
    from colibri import runtime
    with runtime.Model(path, kv=kv) as m:
        return [m.infer(s[None])[0] for s in seqs]


def demo_sequences(seq_len: int) -> tuple[list[np.ndarray], np.ndarray]:
    sys.path.insert(0, str(DEMO))
    import eval as demo_eval   # models/demo/eval.py
    windows = demo_eval.load_windows()
    text = b"".join(bytes(w.astype(np.uint8)) for w in windows)
    import train_tokenizer
    ids = np.array(train_tokenizer.encode_bytes(demo_eval.tokenizer(), text), np.int64)
    n = len(ids) // seq_len
    lengths = np.asarray(demo_eval.piece_lengths())
    return [ids[i * seq_len:(i + 1) * seq_len] for i in range(n)], lengths


def nats_and_bytes(logits, seqs, lengths):
    nats = nbytes = 0.0
    for lg, s in zip(logits, seqs):
        lp = log_softmax(lg[:-1])
        nats -= lp[np.arange(len(s) - 1), s[1:]].sum()
        nbytes += lengths[s[1:]].sum()
    return nats / np.log(2) / nbytes


def by_position(l32, l8, seq_len, parts=4):
    out = []
    step = seq_len // parts
    for p in range(parts):
        a = np.concatenate([x[p * step:(p + 1) * step] for x in l32])
        b = np.concatenate([x[p * step:(p + 1) * step] for x in l8])
        out.append(dict(positions=f"{p * step}-{(p + 1) * step - 1}", **compare(a, b)))
    return out


def measure(path: Path, seqs, seq_len, lengths=None) -> dict:
    l32, l8 = run(path, seqs, "f32"), run(path, seqs, "i8")
    res = dict(file=path.name, sequences=len(seqs), seq_len=seq_len,
               all=compare(np.concatenate(l32), np.concatenate(l8)),
               by_position=by_position(l32, l8, seq_len))
    if lengths is not None:
        res["bpb_f32"] = float(nats_and_bytes(l32, seqs, lengths))
        res["bpb_i8"] = float(nats_and_bytes(l8, seqs, lengths))
    return res


def golden_files(tmp: Path) -> list[Path]:
    sys.path.insert(0, str(ROOT / "tests"))
    from golden_configs import GOLDEN_CONFIGS, make_mixtral
    from colibri.model.convert import ColibriExporter
    out = []
    for name in ("tiny", "awkward", "wide", "k256"):
        ckpt = tmp / name
        make_mixtral(name).save_pretrained(ckpt)
        for quant in ("f32", "int8"):
            out.append(ColibriExporter(ckpt, quant=quant, tokenizer=False).export(
                tmp / f"{name}-{quant}.colibri"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from colibri.file import format as cformat
    results = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for quant in ("int8", "f32"):
            path = tmp / f"demo-{quant}.colibri"
            subprocess.run([sys.executable, "-m", "colibri.cli", "convert",
                            str(DEMO / "checkpoint"), "-o", str(path), "--quant", quant],
                           check=True, capture_output=True)
            S = cformat.read_file(path, check_crc=False).shape.max_seq_len
            seqs, lengths = demo_sequences(S)
            results.append(dict(model=f"demo {quant}", **measure(path, seqs, S, lengths)))
        rng = np.random.default_rng(0)
        for path in golden_files(tmp):
            sh = cformat.read_file(path, check_crc=False).shape
            seqs = [rng.integers(0, sh.vocab, sh.max_seq_len) for _ in range(4)]
            results.append(dict(model=path.stem, **measure(path, seqs, sh.max_seq_len)))
    print("| model | rows | context | KL mean (nats) | KL p99 | KL max | top-1 agree |"
          " bpb f32 | bpb i8 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        a = r["all"]
        bpb = (f"{r['bpb_f32']:.4f} | {r['bpb_i8']:.4f}" if "bpb_f32" in r else "- | -")
        print(f"| {r['model']} | {a['rows']} | {r['sequences']} x {r['seq_len']} | "
              f"{a['kl_mean']:.2e} | {a['kl_p99']:.2e} | {a['kl_max']:.2e} | "
              f"{a['top1_agree']:.4f} | {bpb} |")
    print("\nby position (demo int8):")
    for p in results[0]["by_position"]:
        print(f"  {p['positions']}: KL mean {p['kl_mean']:.2e} max {p['kl_max']:.2e} "
              f"top-1 {p['top1_agree']:.4f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
