"""Evaluate the committed demo model: held-out bits per byte with transformers,
with the numpy reference on the float32 and int8 .colibri files, and with the C
runtime (libcolibri.so through colibri.runtime) when it is built; routing differences between float32 and
int8; greedy and low-temperature samples. Writes models/demo/results.json and
models/demo/RESULTS.md.

    .venv/bin/python models/demo/eval.py [--no-write]

The evaluation set is models/demo/eval_windows.bin: 32 windows of 128 bytes
from the held-out documents (recipe: prepare_corpus.py). Bits per byte of a
window are measured on its last 127 bytes, each predicted from the bytes before
it in the window (the first byte has no context). When the corpus is installed
(Debian python3.11-doc) transformers also measures the whole held-out text.

The helpers here are shared with tests/test_demo_model.py.
"""
from __future__ import annotations

import os

# Run as a script: one BLAS/OpenMP thread, since on the shared 2-core machine
# two threads collapse under contention (see train.py THREADS). Must be set
# before numpy/torch load; not done on import (the tests import this module).
if __name__ == "__main__":
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CHECKPOINT = HERE / "checkpoint"
EVAL_WINDOWS = HERE / "eval_windows.bin"
RESULTS_JSON = HERE / "results.json"
RESULTS_MD = HERE / "RESULTS.md"
COLIBRI = Path(sys.executable).parent / "colibri"   # the console script of this venv

sys.path.insert(0, str(HERE))
import prepare_corpus as corpus  # noqa: E402

# The first TEST_WINDOWS windows are what tests/test_demo_model.py re-measures.
TEST_WINDOWS = 4
PROMPT = "The Python tutorial"
SAMPLE_BYTES = 200
SAMPLE_TEMPERATURE = 0.7
SAMPLE_SEED = 0
LN2 = math.log(2.0)


# ---- bits per byte ------------------------------------------------------------

def bits_per_byte(logits: np.ndarray, tokens: np.ndarray) -> float:
    """logits [b, s, V] (row t predicts token t+1) and tokens [b, s] -> mean
    -log2 p(tokens[:, t+1]) over t < s-1, computed in float64."""
    x = np.asarray(logits, dtype=np.float64)[:, :-1]                    # [b, s-1, V]
    target = np.asarray(tokens)[:, 1:]                                  # [b, s-1]
    m = x.max(axis=-1, keepdims=True)
    logz = (m[..., 0] + np.log(np.exp(x - m).sum(axis=-1)))             # [b, s-1]
    picked = np.take_along_axis(x, target[..., None], axis=-1)[..., 0]  # [b, s-1]
    return float(np.mean(logz - picked) / LN2)


def load_windows(path: Path = EVAL_WINDOWS) -> np.ndarray:
    """The committed evaluation windows [32, 128] int64."""
    return corpus.load_eval_windows(path)


# ---- transformers -------------------------------------------------------------

def load_hf(model_dir: Path = CHECKPOINT):
    """MixtralForCausalLM from model_dir, float32, eval mode, eager attention
    (the plain softmax(QK^T)V that docs/FORMAT.md describes)."""
    import torch
    from transformers import MixtralForCausalLM
    torch.set_num_threads(1)
    model = MixtralForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                               attn_implementation="eager")
    return model.eval()


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    """tokens [b, s] -> logits [b, s, V] float32."""
    import torch
    with torch.no_grad():
        return model(torch.as_tensor(tokens)).logits.float().numpy()


def hf_router_choices(model, tokens: np.ndarray) -> list[np.ndarray]:
    """Per layer the experts [b, s, top_k] transformers' router picks for tokens."""
    import torch
    b, s = tokens.shape
    k = model.config.num_experts_per_tok
    with torch.no_grad():
        out = model(torch.as_tensor(tokens), output_router_logits=True)
    return [torch.topk(torch.softmax(r.float(), -1), k, dim=-1).indices.reshape(b, s, k).numpy()
            for r in out.router_logits]


def hf_heldout_bpb(model, data: bytes, width: int = 256) -> tuple[float, int]:
    """Bits per byte over all of data, in consecutive windows of width+1 bytes
    overlapping by one (each byte after the first predicted once). Returns
    (bpb, bytes predicted)."""
    tokens = corpus.as_tokens(data)
    n = (len(tokens) - 1) // width
    windows = np.stack([tokens[i * width:i * width + width + 1] for i in range(n)])
    total = 0.0
    for i in range(0, n, 16):
        chunk = windows[i:i + 16]
        total += bits_per_byte(hf_logits(model, chunk), chunk) * chunk.shape[0] * width
    return total / (n * width), n * width


def hf_generate(model, prompt: bytes, n_new: int, temperature: float = 0.0,
                seed: int = 0) -> bytes:
    """n_new bytes after prompt: greedy (temperature 0; ties to the lower id)
    or sampled at temperature with a seeded generator. Recomputes the whole
    prefix each step: plain, and fast enough for a 1.8 M parameter model."""
    import torch
    ids = list(prompt)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(torch.tensor([ids])).logits[0, -1].float()    # [V]
            if temperature == 0.0:
                nxt = int(torch.argmax(logits))
            else:
                p = torch.softmax(logits / temperature, dim=-1)
                nxt = int(torch.multinomial(p, 1, generator=gen))
            ids.append(nxt)
    return bytes(ids[len(prompt):])


# ---- .colibri files: converter, numpy reference, C runtime ----------------------

def convert(model_dir: Path, out: Path, quant: str, max_batch: int = 1) -> Path:
    """`colibri convert model_dir -o out --quant quant` (the user's command)."""
    cmd = [str(COLIBRI), "convert", str(model_dir), "-o", str(out), "--quant", quant,
           "--max-batch", str(max_batch), "-q"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def reference_logits(path: Path, tokens: np.ndarray):
    """Numpy reference on tokens [b, s] -> (logits [b, s, V], per layer the
    experts [b, s, top_k])."""
    from colibri.reference import Reference
    ref = Reference(path)
    logits = ref.forward(tokens, mask=None, n_past=0)
    return logits, ref.router_choices()


def reference_logits_ulp_perturbed(path: Path, tokens: np.ndarray, seed: int = 0) -> np.ndarray:
    """The reference's logits [b, s, V] with every embedding value moved by one
    part in 2^24 (about an ulp, what a different float32 summation order
    gives). A control for the C runtime comparison: how far the file's own
    arithmetic moves when nothing but rounding changes."""
    from colibri.reference import Reference
    ref = Reference(path)
    rng = np.random.default_rng(seed)
    embed = ref.embed

    def perturbed(t):
        e = embed(t)                                                      # [b, s, D]
        return (e * (1 + rng.choice([-1.0, 1.0], size=e.shape) * 2.0 ** -24)).astype(np.float32)
    ref.embed = perturbed
    return ref.forward(tokens, mask=None, n_past=0)


def logits_agreement(a: np.ndarray, b: np.ndarray) -> dict:
    """Per-position agreement of two logits arrays [b, s, V] (b the baseline)."""
    diff = np.abs(a - b).max(axis=-1)                                     # [b, s]
    rel = diff / np.abs(b).max(axis=-1)
    return dict(max_abs_logit_diff=float(diff.max()),
                positions_rel_diff_above_1e_3=float((rel > 1e-3).mean()),
                argmax_agreement=float((a.argmax(-1) == b.argmax(-1)).mean()))


def routing_difference(a: list[np.ndarray], b: list[np.ndarray]) -> dict:
    """Compare two routings (per layer [b, s, k]) as sets of experts per token.
    Returns the fraction of (layer, token) pairs whose sets differ, per layer
    and overall, and the fraction of tokens with a difference in any layer."""
    differs = np.stack([np.any(np.sort(x, -1) != np.sort(y, -1), axis=-1)
                        for x, y in zip(a, b)])                            # [L, b, s]
    return dict(overall=float(differs.mean()),
                per_layer=[round(float(d.mean()), 4) for d in differs],
                any_layer=float(differs.any(axis=0).mean()),
                pairs=int(differs.size))


def c_logits(path: Path, tokens: np.ndarray, library=None) -> np.ndarray:
    """C runtime logits for tokens [b, s] through colibri.runtime, one
    batch-1 prefill per row (as colibri-cli --tokens --logits-out did,
    bit for bit) -> [b, s, V] float32."""
    from colibri.runtime import Model
    with Model(path, library=library) as m:
        return np.stack([m.infer(seq[None])[0] for seq in tokens])


# ---- the report -----------------------------------------------------------------

def checkpoint_facts(model_dir: Path = CHECKPOINT) -> dict:
    cfg = json.loads((model_dir / "config.json").read_text())
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "num_local_experts",
            "num_experts_per_tok", "max_position_embeddings", "rms_norm_eps",
            "tie_word_embeddings")
    config = {k: cfg.get(k) for k in keys}
    config["rope_theta"] = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta"))
    return dict(config=config,
                safetensors_bytes=(model_dir / "model.safetensors").stat().st_size)


def evaluate(model_dir: Path = CHECKPOINT, write: bool = True,
             sample_bytes: int = SAMPLE_BYTES) -> dict:
    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f} s] {msg}", flush=True)
    windows = load_windows()                                           # [32, 128]
    res: dict = dict(eval_set=dict(file=EVAL_WINDOWS.name, windows=int(windows.shape[0]),
                                   width=int(windows.shape[1]),
                                   predicted_bytes=int(windows.shape[0] * (windows.shape[1] - 1))))
    res.update(checkpoint_facts(model_dir))
    model = load_hf(model_dir)
    res["parameters"] = int(sum(p.numel() for p in model.parameters()))

    hf = hf_logits(model, windows)
    bpb = {"transformers": bits_per_byte(hf, windows)}
    test = windows[:TEST_WINDOWS]
    res["test_windows"] = dict(count=TEST_WINDOWS,
                               transformers_bpb=bits_per_byte(hf_logits(model, test), test))
    try:
        held = corpus.join(corpus.split()[1])
        full, n = hf_heldout_bpb(model, held)
        res["heldout_full"] = dict(transformers_bpb=round(full, 4), predicted_bytes=n)
        say(f"transformers, whole held-out text: {full:.4f} bpb")
    except corpus.CorpusError as exc:
        print(f"eval: whole held-out text skipped: {exc}", file=sys.stderr)
    say(f"transformers: {bpb['transformers']:.4f} bpb")

    tmp = Path(tempfile.mkdtemp(prefix="colibri-demo-eval-"))
    try:
        files = {q: convert(model_dir, tmp / f"demo-{q}.colibri", q, max_batch=windows.shape[0])
                 for q in ("f32", "int8")}
        res["colibri_bytes"] = {q: f.stat().st_size for q, f in files.items()}
        routes, ref_logits = {}, {}
        for q, f in files.items():
            logits, routes[q] = reference_logits(f, windows)
            ref_logits[q] = logits
            bpb[f"reference_{q}"] = bits_per_byte(logits, windows)
            if q == "f32":
                res["max_abs_logit_diff_reference_f32_vs_transformers"] = float(
                    np.max(np.abs(logits - hf)))
            say(f"reference {q}: {bpb[f'reference_{q}']:.4f} bpb")
        res["reference_vs_itself_ulp_perturbed"] = {
            q: logits_agreement(reference_logits_ulp_perturbed(f, windows), ref_logits[q])
            for q, f in files.items()}
        say("routing compared, perturbation control done")
        res["routing_f32_vs_int8"] = routing_difference(routes["f32"], routes["int8"])
        res["routing_transformers_vs_reference_f32"] = routing_difference(
            hf_router_choices(model, windows), routes["f32"])

        from colibri import errors, runtime
        try:
            runtime.load_library()
            c_built = True
        except errors.LibraryNotFoundError as exc:
            c_built = False
            res["c_runtime"] = f"not measured: {exc}"
        if c_built:
            # Batch-1 files (an arena for one sequence), one prefill per window.
            c_files = {q: convert(model_dir, tmp / f"demo-{q}-b1.colibri", q)
                       for q in ("f32", "int8")}
            for q, f in c_files.items():
                logits = c_logits(f, windows)
                bpb[f"c_runtime_{q}"] = bits_per_byte(logits, windows)
                res.setdefault("c_runtime_vs_reference", {})[q] = logits_agreement(
                    logits, ref_logits[q])
                say(f"C runtime {q}: {bpb[f'c_runtime_{q}']:.4f} bpb")

        say("samples")
        prompt = PROMPT.encode()
        from colibri.reference import Reference
        samples = dict(prompt=PROMPT, new_bytes=sample_bytes,
                       transformers_greedy=hf_generate(model, prompt, sample_bytes),
                       transformers_sampled=hf_generate(model, prompt, sample_bytes,
                                                        SAMPLE_TEMPERATURE, SAMPLE_SEED))
        for q in ("f32", "int8"):
            ids, _ = Reference(files[q]).generate(np.frombuffer(prompt, np.uint8).astype(np.int64),
                                                  sample_bytes)
            samples[f"reference_{q}_greedy"] = bytes(int(i) for i in ids)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    res["bpb"] = {k: round(v, 5) for k, v in bpb.items()}
    res["int8_relative_cost"] = round(bpb["reference_int8"] / bpb["reference_f32"] - 1, 5)
    res["samples"] = {k: (v.decode("utf-8", "replace") if isinstance(v, bytes) else v)
                      for k, v in samples.items()}
    res["samples"]["greedy_reference_f32_equals_transformers"] = (
        samples["reference_f32_greedy"] == samples["transformers_greedy"])
    train_log = HERE / "train_log.json"
    if train_log.exists():
        tl = json.loads(train_log.read_text())
        res["training"] = {k: tl[k] for k in ("steps", "batch", "seq_len", "tokens",
                                              "train_seconds", "torch", "threads", "seed",
                                              "final_heldout_bpb")}
    res["eval_seconds"] = round(time.monotonic() - t0, 1)
    if write:
        RESULTS_JSON.write_text(json.dumps(res, indent=1, ensure_ascii=False) + "\n")
        RESULTS_MD.write_text(render_markdown(res))
        print(f"wrote {RESULTS_JSON.relative_to(ROOT)} and {RESULTS_MD.relative_to(ROOT)}")
    return res


def render_markdown(res: dict) -> str:
    b = res["bpb"]
    c = res["config"]
    lines = [
        "# Demo model: measured results",
        "",
        "Written by `models/demo/eval.py` (do not edit by hand).",
        "",
        f"Model: Mixtral, byte vocabulary {c['vocab_size']}, {c['num_hidden_layers']} layers, "
        f"hidden {c['hidden_size']}, {c['num_local_experts']} experts of width "
        f"{c['intermediate_size']}, top-{c['num_experts_per_tok']}, "
        f"{c['num_attention_heads']} heads / {c['num_key_value_heads']} KV heads of "
        f"{c['head_dim']}; {res['parameters']:,} parameters; model.safetensors "
        f"{res['safetensors_bytes']:,} bytes (float32).",
        "",
    ]
    if "training" in res:
        t = res["training"]
        lines += [f"Training: {t['steps']} steps x {t['batch']} x {t['seq_len']} bytes "
                  f"({t['tokens']:,} bytes seen), {t['train_seconds']:.0f} s with "
                  f"{t['threads']} torch thread(s), torch {t['torch']}; held-out bpb at the "
                  f"end of training (train.py's own held-out windows): "
                  f"{t['final_heldout_bpb']}.", ""]
    e = res["eval_set"]
    lines += [
        f"## Held-out bits per byte ({e['windows']} windows of {e['width']} bytes, "
        f"{e['predicted_bytes']} predicted bytes)",
        "",
        "| runtime | file | bits per byte |",
        "|---|---|---:|",
        f"| transformers | checkpoint (float32) | {b['transformers']:.4f} |",
        f"| numpy reference | f32 .colibri ({res['colibri_bytes']['f32']:,} bytes) | "
        f"{b['reference_f32']:.4f} |",
        f"| numpy reference | int8 .colibri ({res['colibri_bytes']['int8']:,} bytes) | "
        f"{b['reference_int8']:.4f} |",
    ]
    for q in ("f32", "int8"):
        if f"c_runtime_{q}" in b:
            lines.append(f"| C runtime (libcolibri.so through colibri.runtime, x86_64) | {q} .colibri | {b[f'c_runtime_{q}']:.4f} |")
    lines += ["", f"int8 costs {100 * res['int8_relative_cost']:.3f}% relative (bound: 1%)."]
    for q, d in res.get("c_runtime_vs_reference", {}).items():
        lines.append(f"C runtime vs numpy reference on the same {q} file: max |logit difference| "
                     f"{d['max_abs_logit_diff']:.1e}, positions whose logits differ by more than "
                     f"1e-3 of their largest: {100 * d['positions_rel_diff_above_1e_3']:.1f}%, "
                     f"same argmax at {100 * d['argmax_agreement']:.2f}% of positions.")
    if "c_runtime" in res:
        lines.append(f"C runtime: {res['c_runtime']}.")
    for q, d in res["reference_vs_itself_ulp_perturbed"].items():
        lines.append(f"Control, numpy reference vs itself with every embedding value moved by "
                     f"2^-24 relative ({q} file): max |logit difference| "
                     f"{d['max_abs_logit_diff']:.1e}, {100 * d['positions_rel_diff_above_1e_3']:.1f}% "
                     f"of positions above 1e-3, same argmax at "
                     f"{100 * d['argmax_agreement']:.2f}%. (int8 activations amplify "
                     f"rounding differences: FORMAT.md section 5.)")
    if "heldout_full" in res:
        h = res["heldout_full"]
        lines.append(f"Whole held-out text ({h['predicted_bytes']:,} bytes, windows of 256): "
                     f"{h['transformers_bpb']:.4f} bpb with transformers.")
    r = res["routing_f32_vs_int8"]
    lines += [
        "",
        "## Routing, float32 vs int8 (numpy reference, expert sets per token)",
        "",
        f"{100 * r['overall']:.2f}% of {r['pairs']} (layer, token) pairs choose a different "
        f"set of experts (per layer: {', '.join(f'{100 * x:.2f}%' for x in r['per_layer'])}); "
        f"{100 * r['any_layer']:.2f}% of tokens differ in at least one layer.",
        f"transformers vs reference f32: {100 * res['routing_transformers_vs_reference_f32']['overall']:.2f}% "
        f"of pairs differ; max |logit difference| "
        f"{res['max_abs_logit_diff_reference_f32_vs_transformers']:.1e}.",
        "",
        f"## Samples (prompt {res['samples']['prompt']!r}, {res['samples']['new_bytes']} bytes)",
        "",
    ]
    s = res["samples"]
    for key, title in (("transformers_greedy", "transformers, greedy"),
                       ("reference_f32_greedy", "numpy reference f32, greedy"),
                       ("reference_int8_greedy", "numpy reference int8, greedy"),
                       ("transformers_sampled",
                        f"transformers, temperature {SAMPLE_TEMPERATURE}, seed {SAMPLE_SEED}")):
        lines += [f"{title}:", "", "```", s["prompt"] + s[key], "```", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Evaluate the Colibri demo model.")
    ap.add_argument("--checkpoint", type=Path, default=CHECKPOINT,
                    help="Hugging Face checkpoint directory (default: %(default)s)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args(argv)
    res = evaluate(args.checkpoint, write=not args.no_write)
    print(json.dumps({k: res[k] for k in ("bpb", "int8_relative_cost", "routing_f32_vs_int8")},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
