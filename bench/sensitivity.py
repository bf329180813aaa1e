"""How much each kind of matrix suffers from 4-bit storage, what an
importance matrix buys, and what a mix costs in bits per weight.

For a model (the demo model models/demo/checkpoint, or a random Mixtral
with rows of 256-multiples so the K types apply), it converts a float32
.colibri file and, per configuration, a quantised one, runs both through the
numpy reference (colibri/model/reference.py) on evaluation tokens and prints the
mean KL divergence KL(f32 || quantised) of the next-token distributions (and
bits per byte on the demo model's held-out windows, models/demo/eval_windows.bin).

    python bench/sensitivity.py kinds   [--model demo|rand256] [--imatrix]
    python bench/sensitivity.py mixes   [--model demo|rand256]
    python bench/sensitivity.py bpw                # whole-model bits per weight

`kinds`: one kind at a time in Q4_K (Q5_0 or int8 on rows not a multiple of 256)
and in Q6_K, the rest float32: KL per kind and the KL removed per extra bit.
`mixes`: whole-model mixes (the q4 preset and variants), with and without
the importance matrix measured on the demo corpus's training documents
(never the held-out windows).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "models" / "demo"))

from colibri.file import format as fmt  # noqa: E402
from colibri.model import imatrix as im  # noqa: E402
from colibri.model.convert import ColibriExporter  # noqa: E402
from colibri.file.format import DType, Kind  # noqa: E402
from colibri.model.reference import Reference  # noqa: E402

DEMO = ROOT / "models" / "demo" / "checkpoint"
# A random Mixtral whose matrices are all 256-multiples wide (K blocks).
RAND256 = dict(vocab_size=512, hidden_size=256, intermediate_size=512,
               num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
               head_dim=64, num_local_experts=4, num_experts_per_tok=2,
               max_position_embeddings=128, rope_theta=1e6, rms_norm_eps=1e-5)
KIND_GROUPS = {
    "embed": (Kind.EMBED,), "lm_head": (Kind.LM_HEAD,), "wq": (Kind.WQ,), "wk": (Kind.WK,),
    "wv": (Kind.WV,), "wo": (Kind.WO,), "w1": (Kind.EXPERT_W1,), "w3": (Kind.EXPERT_W3,),
    "w2": (Kind.EXPERT_W2,),
}
# Bits per weight of each storage type (our float32 block scales) and of
# llama.cpp's GGUF types (fp16 scales), for the budget comparison.
BPW = {DType.F32: 32, DType.I16_ROW: 16, DType.I8_GROUP: 8 + 32 / 32,
       DType.Q4_0: 20 * 8 / 32, DType.Q5_0: 24 * 8 / 32, DType.Q4_K: 148 * 8 / 256,
       DType.Q5_K: 180 * 8 / 256, DType.Q6_K: 212 * 8 / 256}
GGUF_BPW = {"F32": 32, "Q4_K": 4.5, "Q5_K": 5.5, "Q6_K": 6.5625, "Q8_0": 8.5, "Q4_0": 4.5,
            "Q5_0": 5.5}


def model_dir(name: str, tmp: Path) -> Path:
    if name == "demo":
        return DEMO
    import golden_configs as gc
    gc.GOLDEN_CONFIGS["rand256"] = RAND256
    return gc.save_mixtral("rand256", tmp / "rand256", seed=1)


def eval_tokens(name: str, mdir: Path) -> list[np.ndarray]:
    if name == "demo":
        import eval as demo_eval
        return demo_eval.window_ids(demo_eval.load_windows(), mdir)
    rng = np.random.default_rng(5)
    return [rng.integers(0, RAND256["vocab_size"], 64) for _ in range(16)]


def calibration_windows(name: str, mdir: Path, f32: Path) -> list[np.ndarray]:
    """Demo: the training documents (prepare_corpus.split), tokenised;
    random model: other random tokens than eval_tokens'."""
    if name == "demo":
        import prepare_corpus as corpus
        from colibri.text.tokenizer import Tokenizer
        train, _ = corpus.split()
        ids = np.asarray(Tokenizer.from_file(f32).encode(corpus.join(train)[:400_000]))
        return im.token_windows(ids, 256, 32768)
    rng = np.random.default_rng(6)
    return [rng.integers(0, RAND256["vocab_size"], 64) for _ in range(64)]


def convert(mdir: Path, out: Path, dtypes: dict, imatrix=None) -> Path:
    ex = ColibriExporter(mdir, quant="f32", imatrix=imatrix)
    ex.dtypes = dict(dtypes)
    return ex.export(out)


def logits(path: Path, toks) -> list[np.ndarray]:
    ref = Reference(path)
    out = []
    for t in toks:
        ref.reset()
        out.append(ref.forward(np.asarray(t, np.int64)[None])[0].astype(np.float64))
    return out


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def kl(ref_logits, q_logits) -> float:
    tot, n = 0.0, 0
    for a, b in zip(ref_logits, q_logits):
        la, lb = log_softmax(a), log_softmax(b)
        tot += float((np.exp(la) * (la - lb)).sum())
        n += a.shape[0]
    return tot / n


def bpb(name, mdir, toks, lg) -> float | None:
    if name != "demo":
        return None
    import eval as demo_eval
    return demo_eval.bits_per_byte(lg, toks)


def bits(path: Path) -> tuple[float, int]:
    """(bits per weight over every tensor of the file but DESC and the
    tokenizer: section bytes * 8 / values, the weights)."""
    cf = fmt.read_file(path)
    kinds = {int(k) for k in Kind} - {int(Kind.DESC)}
    es = [e for e in cf.entries if e.kind in kinds]
    cf.close()
    nw = sum(e.rows * e.cols for e in es)
    return sum(e.size for e in es) * 8 / nw, nw


def only(kinds, dtype) -> dict:
    d = dict(fmt.PRESET_F32)
    for k in kinds:
        d[k] = dtype            # the writer's fit_dtype falls back on narrow rows
    return d


def cmd_kinds(args, tmp):
    mdir = model_dir(args.model, tmp)
    toks = eval_tokens(args.model, mdir)
    f32 = convert(mdir, tmp / "f32.colibri", fmt.PRESET_F32)
    base = logits(f32, toks)
    imx = im.collect(f32, calibration_windows(args.model, mdir, f32)) if args.imatrix else None
    print(f"model {args.model}{' with imatrix' if imx else ''}: f32 bpb {bpb(args.model, mdir, toks, base)}")
    print(f"{'kind':8s} {'weights':>9s} {'KL q4':>10s} {'KL q6':>10s} {'KL saved per Mbit':>18s}")
    for name, kinds in KIND_GROUPS.items():
        row = {}
        for dt in (DType.Q4_K, DType.Q6_K):
            p = convert(mdir, tmp / f"{name}-{dt.name}.colibri", only(kinds, dt), imx)
            row[dt] = (kl(base, logits(p, toks)), p)
        cf = fmt.read_file(row[DType.Q4_K][1])
        n = sum(e.rows * e.cols for e in cf.entries if e.kind in [int(k) for k in kinds])
        bits_q4 = sum(BPW[DType(e.dtype)] * e.rows * e.cols for e in cf.entries
                      if e.kind in [int(k) for k in kinds])
        cf.close()
        cf = fmt.read_file(row[DType.Q6_K][1])
        bits_q6 = sum(BPW[DType(e.dtype)] * e.rows * e.cols for e in cf.entries
                      if e.kind in [int(k) for k in kinds])
        cf.close()
        extra = max(bits_q6 - bits_q4, 1)
        saved = (row[DType.Q4_K][0] - row[DType.Q6_K][0]) / extra * 1e6
        print(f"{name:8s} {n:9d} {row[DType.Q4_K][0]:10.6f} {row[DType.Q6_K][0]:10.6f} "
              f"{saved:18.6f}", flush=True)


def mixes() -> dict:
    """Whole-model mixes to compare: name -> (dtypes, per-layer rule or None)."""
    out = {"q4 preset": fmt.PRESET_Q4}
    allk = dict(fmt.PRESET_Q4)
    for k in (Kind.WV, Kind.XWV, Kind.LM_HEAD):
        allk[k] = DType.Q4_K
    out["all Q4_K"] = allk
    more = dict(fmt.PRESET_Q4)
    for k in (Kind.WK, Kind.WO):
        more[k] = DType.Q6_K
    out["q4 +wk,wo Q6_K"] = more
    return out


def cmd_mixes(args, tmp):
    mdir = model_dir(args.model, tmp)
    toks = eval_tokens(args.model, mdir)
    f32 = convert(mdir, tmp / "f32.colibri", fmt.PRESET_F32)
    base = logits(f32, toks)
    imx = im.collect(f32, calibration_windows(args.model, mdir, f32))
    print(f"model {args.model}: f32 bpb {bpb(args.model, mdir, toks, base)}")
    for name, dtypes in mixes().items():
        for use in (False, True):
            p = convert(mdir, tmp / "mix.colibri", dtypes, imx if use else None)
            lg = logits(p, toks)
            b = bpb(args.model, mdir, toks, lg)
            print(f"{name:12s} imatrix={'yes' if use else 'no ':3s} bpw {bits(p)[0]:.3f} "
                  f"KL {kl(base, lg):.6f}" + (f" bpb {b:.4f}" if b is not None else ""),
                  flush=True)


def cmd_bpw(args, tmp):
    import models as bm
    for name in ("small",):
        shape = {"small": bm.SMALL}[name]
        print(name, bpw_of_shapes(shape))


def matrix_shapes(c: dict) -> list[tuple[str, int, int, int]]:
    """(kind, layer, rows, cols) of every matrix of a Mixtral config."""
    D, I, V, L = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    hd, H, KV, E = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"], \
        c["num_local_experts"]
    out = [("embed", None, V, D), ("lm_head", None, V, D)]
    for l in range(L):
        out += [("wq", l, H * hd, D), ("wk", l, KV * hd, D), ("wv", l, KV * hd, D),
                ("wo", l, D, H * hd), ("router", l, E, D)]
        out += [(k, l, r, cc) for _ in range(E) for k, r, cc in
                (("w1", I, D), ("w3", I, D), ("w2", D, I))]
    return out


def q4_k_m_type(kind: str, layer, n_layers: int, n_expert: int) -> str:
    """llama.cpp's Q4_K_M choice (src/llama-quant.cpp of the pinned 0.3.36)."""
    more = layer is not None and (layer < n_layers // 8 or layer >= 7 * n_layers // 8
                                  or (layer - n_layers // 8) % 3 == 2)
    if kind == "lm_head":
        return "Q6_K"
    if kind == "router":
        return "F32"
    if kind in ("wv", "wk") and n_expert == 8:
        return "Q8_0"
    if kind == "wv":
        return "Q6_K" if more else "Q4_K"
    if kind == "wo" and n_expert == 8:
        return "Q5_K"
    if kind == "w2" and more:
        return "Q6_K"
    return "Q4_K"


def bpw_of_shapes(c: dict, preset=None) -> str:
    preset = preset or fmt.PRESET_Q4
    L, E = c["num_hidden_layers"], c["num_local_experts"]
    mats = matrix_shapes(c)
    n = sum(r * cc for _, _, r, cc in mats)
    ll = sum(r * cc * GGUF_BPW[q4_k_m_type(k, l, L, E)] for k, l, r, cc in mats) / n
    kind_of = {"embed": Kind.EMBED, "lm_head": Kind.LM_HEAD, "wq": Kind.WQ, "wk": Kind.WK,
               "wv": Kind.WV, "wo": Kind.WO, "router": Kind.ROUTER, "w1": Kind.EXPERT_W1,
               "w3": Kind.EXPERT_W3, "w2": Kind.EXPERT_W2}
    ours = 0.0
    for k, l, r, cc in mats:
        dt = fmt.fit_dtype(preset[kind_of[k]], cc, kind_of[k])
        ours += r * cc * (BPW[dt] if dt != DType.I16_ROW else 16 + 32 / cc)
    return f"{n} weights: llama.cpp Q4_K_M {ll:.3f} bpw, colibri q4 {ours / n:.3f} bpw"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("kinds", "mixes", "bpw"))
    p.add_argument("--model", choices=("demo", "rand256"), default="demo")
    p.add_argument("--imatrix", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="colibri-sens-") as tmp:
        {"kinds": cmd_kinds, "mixes": cmd_mixes, "bpw": cmd_bpw}[args.what](args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
