"""Evaluate the committed demo model: held-out bits per byte with transformers,
with the numpy reference on the float32 and int8 .colibri files, and with the C
runtime (libcolibri.so through colibri.runtime) when it is built; routing differences between float32 and
int8; greedy and low-temperature samples. Writes models/demo/results.json and
models/demo/RESULTS.md.

    .venv/bin/python models/demo/eval.py [--no-write]

The evaluation set is models/demo/eval_windows.bin: 32 windows of 128 bytes
from the held-out documents (recipe: prepare_corpus.py), the same windows the
byte-level model it replaced was measured on (byte_level/RESULTS.md). Each
window is tokenised on its own (the checkpoint's tokenizer.json, by Hugging
Face `tokenizers`); every token after the first is predicted from the tokens
before it in the window, and bits per byte = the total cross-entropy (nats)
of those tokens / ln 2 / the bytes they stand for (the window's 128 bytes
less its first token's; the byte-level model's figure is the same quotient
with its first byte left out). When the corpus is installed (Debian
python3.11-doc) transformers also measures the whole held-out text.

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
import train_tokenizer  # noqa: E402

# The first TEST_WINDOWS windows are what tests/test_demo_model.py re-measures.
TEST_WINDOWS = 4
PROMPT = "The Python tutorial"
SAMPLE_TOKENS = 60
# The demo's sampling (scripts/demo.sh uses the same): seeded, so every
# target prints the same text; greedy is one flag away (GREEDY=1).
SAMPLE_TEMPERATURE = 0.8
SAMPLE_TOP_K = 40
SAMPLE_SEED = 1
BYTE_LEVEL_RESULTS = HERE / "byte_level" / "results.json"
LN2 = math.log(2.0)


# ---- bits per byte ------------------------------------------------------------

def token_nats(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """logits [s, V] (row t predicts token t+1) and ids [s] -> the
    cross-entropy in nats of each of ids[1:], [s-1] float64."""
    x = np.asarray(logits, dtype=np.float64)[:-1]                       # [s-1, V]
    target = np.asarray(ids)[1:]                                        # [s-1]
    m = x.max(axis=-1, keepdims=True)
    logz = m[:, 0] + np.log(np.exp(x - m).sum(axis=-1))                 # [s-1]
    return logz - x[np.arange(len(target)), target]


def bits_per_byte(logits_list, ids_list, lengths=None) -> float:
    """Windows of logits [s_i, V] and ids [s_i] -> total nats of every token
    after each window's first / ln 2 / the bytes those tokens stand for
    (lengths: [V] bytes per piece; default the checkpoint tokenizer's)."""
    lengths = np.asarray(piece_lengths() if lengths is None else lengths)
    nats = sum(float(token_nats(lg, ids).sum()) for lg, ids in zip(logits_list, ids_list))
    nbytes = sum(int(lengths[np.asarray(ids)[1:]].sum()) for ids in ids_list)
    return nats / LN2 / nbytes


_TOKENIZER = {}


def tokenizer(model_dir: Path = CHECKPOINT):
    """The checkpoint's tokenizer.json through Hugging Face `tokenizers`."""
    key = str(model_dir)
    if key not in _TOKENIZER:
        _TOKENIZER[key] = train_tokenizer.load(Path(model_dir) / "tokenizer.json")
    return _TOKENIZER[key]


def piece_lengths(model_dir: Path = CHECKPOINT) -> list[int]:
    return train_tokenizer.piece_lengths(tokenizer(model_dir))


def window_ids(windows: np.ndarray, model_dir: Path = CHECKPOINT) -> list[np.ndarray]:
    """Byte windows [n, 128] -> each tokenised on its own, [s_i] int64."""
    tok = tokenizer(model_dir)
    return [np.array(train_tokenizer.encode_bytes(tok, bytes(w.astype(np.uint8))),
                     dtype=np.int64) for w in windows]


def predicted_bytes(ids_list, model_dir: Path = CHECKPOINT) -> int:
    lengths = np.asarray(piece_lengths(model_dir))
    return sum(int(lengths[np.asarray(ids)[1:]].sum()) for ids in ids_list)


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


def hf_window_logits(model, ids_list) -> list[np.ndarray]:
    """Windows of ids [s_i] -> transformers' logits [s_i, V] each."""
    return [hf_logits(model, ids[None])[0] for ids in ids_list]


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
    """Bits per byte over all of data, tokenised whole, in consecutive
    windows of width+1 tokens overlapping by one (each token after the first
    predicted once). Returns (bpb, bytes predicted)."""
    tokens = np.array(train_tokenizer.encode_bytes(tokenizer(), data), dtype=np.int64)
    n = (len(tokens) - 1) // width
    windows = [tokens[i * width:i * width + width + 1] for i in range(n)]
    logits = []
    for i in range(0, n, 16):
        logits += list(hf_logits(model, np.stack(windows[i:i + 16])))
    return bits_per_byte(logits, windows), predicted_bytes(windows)


def hf_generate(model, prompt_ids, n_new: int) -> list[int]:
    """n_new greedy ids after prompt_ids (ties to the lower id). Recomputes
    the whole prefix each step: plain, and fast enough for a 1.8 M parameter
    model."""
    import torch
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(torch.tensor([ids])).logits[0, -1].float()    # [V]
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt_ids):]


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
    from colibri.model.reference import Reference
    ref = Reference(path)
    logits = ref.forward(tokens, mask=None, n_past=0)
    return logits, ref.router_choices()


def reference_logits_ulp_perturbed(path: Path, tokens: np.ndarray, seed: int = 0) -> np.ndarray:
    """The reference's logits [b, s, V] with every embedding value moved by one
    part in 2^24 (about an ulp, what a different float32 summation order
    gives). A control for the C runtime comparison: how far the file's own
    arithmetic moves when nothing but rounding changes."""
    from colibri.model.reference import Reference
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


def c_logits(path: Path, tokens, library=None) -> np.ndarray:
    """C runtime logits for tokens [b, s] (or a list of windows [s_i])
    through colibri.runtime, one batch-1 prefill per row (as colibri-cli
    --tokens --logits-out did, bit for bit) -> [b, s, V] float32 (a list of
    [s_i, V] for a list)."""
    from colibri.runtime import Model
    with Model(path, library=library) as m:
        out = [m.infer(np.asarray(seq)[None])[0] for seq in tokens]
    return out if isinstance(tokens, list) else np.stack(out)


def reference_window_logits(path: Path, ids_list):
    """Numpy reference per window -> (logits [s_i, V] list, per layer the
    experts [1, sum s_i, top_k] of all windows in order)."""
    logits, routes = [], []
    for ids in ids_list:
        lg, r = reference_logits(path, ids[None])
        logits.append(lg[0])
        routes.append(r)
    return logits, [np.concatenate([r[layer] for r in routes], axis=1)
                    for layer in range(len(routes[0]))]


def hf_window_router_choices(model, ids_list) -> list[np.ndarray]:
    routes = [hf_router_choices(model, ids[None]) for ids in ids_list]
    return [np.concatenate([r[layer] for r in routes], axis=1) for layer in range(len(routes[0]))]


def window_agreement(a_list, b_list) -> dict:
    """logits_agreement over windows of logits [s_i, V] (b the baseline)."""
    return logits_agreement(np.concatenate(a_list)[None], np.concatenate(b_list)[None])


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


def demo_sampling():
    """The demo's sampling parameters (colibri.text.sampling.SampleParams)."""
    from colibri.text.sampling import SampleParams
    return SampleParams(temperature=SAMPLE_TEMPERATURE, top_k=SAMPLE_TOP_K, seed=SAMPLE_SEED)


def evaluate(model_dir: Path = CHECKPOINT, write: bool = True,
             sample_tokens: int = SAMPLE_TOKENS) -> dict:
    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f} s] {msg}", flush=True)
    windows = load_windows()                                           # [32, 128]
    ids = window_ids(windows, model_dir)                               # 32 x [s_i]
    lengths = piece_lengths(model_dir)
    res: dict = dict(eval_set=dict(file=EVAL_WINDOWS.name, windows=int(windows.shape[0]),
                                   width=int(windows.shape[1]),
                                   tokens=int(sum(len(i) for i in ids)),
                                   predicted_bytes=predicted_bytes(ids, model_dir)))
    res.update(checkpoint_facts(model_dir))
    res["tokenizer"] = dict(kind="byte-level BPE, GPT-2 regex (tokenizers)",
                            pieces=tokenizer(model_dir).get_vocab_size())
    model = load_hf(model_dir)
    res["parameters"] = int(sum(p.numel() for p in model.parameters()))

    hf = hf_window_logits(model, ids)
    bpb = {"transformers": bits_per_byte(hf, ids, lengths)}
    res["test_windows"] = dict(count=TEST_WINDOWS,
                               transformers_bpb=bits_per_byte(hf[:TEST_WINDOWS],
                                                              ids[:TEST_WINDOWS], lengths))
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
        files = {q: convert(model_dir, tmp / f"demo-{q}.colibri", q) for q in ("f32", "int8")}
        res["colibri_bytes"] = {q: f.stat().st_size for q, f in files.items()}
        routes, ref_logits = {}, {}
        for q, f in files.items():
            ref_logits[q], routes[q] = reference_window_logits(f, ids)
            bpb[f"reference_{q}"] = bits_per_byte(ref_logits[q], ids, lengths)
            if q == "f32":
                res["max_abs_logit_diff_reference_f32_vs_transformers"] = float(
                    max(np.max(np.abs(a - b)) for a, b in zip(ref_logits[q], hf)))
            say(f"reference {q}: {bpb[f'reference_{q}']:.4f} bpb")
        res["reference_vs_itself_ulp_perturbed"] = {
            q: window_agreement([reference_logits_ulp_perturbed(f, i[None])[0] for i in ids],
                                ref_logits[q])
            for q, f in files.items()}
        say("routing compared, perturbation control done")
        res["routing_f32_vs_int8"] = routing_difference(routes["f32"], routes["int8"])
        res["routing_transformers_vs_reference_f32"] = routing_difference(
            hf_window_router_choices(model, ids), routes["f32"])

        from colibri import errors, runtime
        try:
            runtime.load_library()
            c_built = True
        except errors.LibraryNotFoundError as exc:
            c_built = False
            res["c_runtime"] = f"not measured: {exc}"
        if c_built:
            for q, f in files.items():
                logits = c_logits(f, ids)
                bpb[f"c_runtime_{q}"] = bits_per_byte(logits, ids, lengths)
                res.setdefault("c_runtime_vs_reference", {})[q] = window_agreement(
                    logits, ref_logits[q])
                say(f"C runtime {q}: {bpb[f'c_runtime_{q}']:.4f} bpb")

        say("samples")
        from colibri.model.generate import generate
        from colibri.text.sampling import SampleParams
        from colibri.text.tokenizer import Tokenizer
        tok = Tokenizer.from_file(files["int8"])
        prompt_ids = tok.encode(PROMPT)
        sp = demo_sampling()
        samples = dict(prompt=PROMPT, new_tokens=sample_tokens,
                       temperature=SAMPLE_TEMPERATURE, top_k=SAMPLE_TOP_K, seed=SAMPLE_SEED,
                       transformers_greedy=tok.decode(hf_generate(model, prompt_ids,
                                                                  sample_tokens)))
        for q in ("f32", "int8"):
            samples[f"reference_{q}_greedy"] = tok.decode(
                generate(files[q], PROMPT, sample_tokens, SampleParams()))
            samples[f"reference_{q}_sampled"] = tok.decode(
                generate(files[q], PROMPT, sample_tokens, sp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    res["bpb"] = {k: round(v, 5) for k, v in bpb.items()}
    res["int8_relative_cost"] = round(bpb["reference_int8"] / bpb["reference_f32"] - 1, 5)
    res["samples"] = samples
    res["samples"]["greedy_reference_f32_equals_transformers"] = (
        samples["reference_f32_greedy"] == samples["transformers_greedy"])
    if BYTE_LEVEL_RESULTS.exists():
        bl = json.loads(BYTE_LEVEL_RESULTS.read_text())
        res["byte_level_model"] = dict(bpb=bl["bpb"], heldout_full=bl.get("heldout_full"),
                                       parameters=bl["parameters"],
                                       train_seconds=bl.get("training", {}).get("train_seconds"),
                                       predicted_bytes=bl["eval_set"]["predicted_bytes"])
    train_log = HERE / "train_log.json"
    if train_log.exists():
        tl = json.loads(train_log.read_text())
        res["training"] = {k: tl.get(k) for k in ("steps", "batch", "seq_len", "tokens",
                                                  "train_bytes_seen", "train_seconds",
                                                  "train_cpu_seconds", "torch", "threads",
                                                  "seed", "final_heldout_bpb")}
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
        f"Model: Mixtral, {res['tokenizer']['kind']} vocabulary {c['vocab_size']}, "
        f"{c['num_hidden_layers']} layers, "
        f"hidden {c['hidden_size']}, {c['num_local_experts']} experts of width "
        f"{c['intermediate_size']}, top-{c['num_experts_per_tok']}, "
        f"{c['num_attention_heads']} heads / {c['num_key_value_heads']} KV heads of "
        f"{c['head_dim']}, tied embeddings: {c['tie_word_embeddings']}; "
        f"{res['parameters']:,} parameters; model.safetensors "
        f"{res['safetensors_bytes']:,} bytes (float32).",
        "",
    ]
    if "training" in res:
        t = res["training"]
        lines += [f"Training: {t['steps']} steps x {t['batch']} x {t['seq_len']} tokens "
                  f"({t['tokens']:,} tokens, about {t['train_bytes_seen']:,} bytes seen), "
                  f"{t['train_seconds']:.0f} s wall ({t['train_cpu_seconds']:.0f} s CPU) with "
                  f"{t['threads']} torch thread(s), torch {t['torch']}; held-out bpb at the "
                  f"end of training (train.py's own held-out windows): "
                  f"{t['final_heldout_bpb']}.", ""]
    e = res["eval_set"]
    lines += [
        f"## Held-out bits per byte ({e['windows']} windows of {e['width']} bytes, "
        f"{e['tokens']} tokens, {e['predicted_bytes']} predicted bytes)",
        "",
        "bits per byte = total nats of the predicted tokens / ln 2 / the bytes they stand for "
        "(each window tokenised on its own, its first token not predicted).",
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
    if "byte_level_model" in res:
        bl = res["byte_level_model"]
        lines += [
            "",
            f"### Against the byte-level model it replaced (same windows; byte_level/RESULTS.md)",
            "",
            "| | byte-level (vocabulary 256) | BPE (this model) |",
            "|---|---:|---:|",
            f"| parameters | {bl['parameters']:,} | {res['parameters']:,} |",
            f"| transformers, f32 | {bl['bpb']['transformers']:.4f} | {b['transformers']:.4f} |",
            f"| numpy reference, f32 .colibri | {bl['bpb']['reference_f32']:.4f} | "
            f"{b['reference_f32']:.4f} |",
            f"| C runtime, int8 .colibri | {bl['bpb'].get('c_runtime_int8', float('nan')):.4f} | "
            f"{b.get('c_runtime_int8', float('nan')):.4f} |",
        ]
        if bl.get("heldout_full") and "heldout_full" in res:
            lines.append(f"| transformers, whole held-out text | "
                         f"{bl['heldout_full']['transformers_bpb']:.4f} | "
                         f"{res['heldout_full']['transformers_bpb']:.4f} |")
        if bl.get("train_seconds") and "training" in res:
            lines.append(f"| training, wall seconds (1200 steps) | {bl['train_seconds']:.0f} | "
                         f"{res['training']['train_seconds']:.0f} |")
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
        lines.append(f"Whole held-out text ({h['predicted_bytes']:,} bytes, windows of 256 "
                     f"tokens): {h['transformers_bpb']:.4f} bpb with transformers.")
    r = res["routing_f32_vs_int8"]
    s = res["samples"]
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
        f"## Samples (prompt {s['prompt']!r}, {s['new_tokens']} tokens)",
        "",
    ]
    for key, title in (
            ("reference_int8_sampled",
             f"numpy reference int8, the demo's sampling: temperature "
             f"{s['temperature']}, top-k {s['top_k']}, seed {s['seed']} (the firmware's C "
             f"int8 arithmetic rounds differently and may part from it at a near-tie)"),
            ("reference_f32_sampled", "numpy reference f32, the same sampling"),
            ("transformers_greedy", "transformers, greedy"),
            ("reference_f32_greedy", "numpy reference f32, greedy"),
            ("reference_int8_greedy", "numpy reference int8, greedy")):
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
