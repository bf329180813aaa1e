"""The benchmark's models, generated locally from fixed seeds and cached.

Three Hugging Face checkpoints, each converted to .colibri (f32 and int8) and
written as GGUF (f32 and Q8_0), all under build/bench/models/NAME/:

- tiny:  tests/golden_configs.py's "tiny" (built with transformers, as the
         golden tests build it), its max_position_embeddings raised to 512 so
         that a 128-token prefill and a decode run fit.
- small: the issue's "small" Mixtral (hidden 1024, 8 layers, 16 heads, 8 KV
         heads, 8 experts top-2, intermediate 2816, vocab 32000: 0.6 B
         parameters, 2.4 GB f32), generated with numpy and streamed tensor by
         tensor into one safetensors file (never the whole model in memory).
- ffn:   one layer of the small model's experts (hidden 1024, intermediate
         2816, 8 experts top-2) with a token attention (1 head of 8) and a
         32-token vocabulary: 99.6 % of its prefill flops are the expert FFN,
         so its prefill time measures Colibri's expert matmul path through
         the public API.

Weights follow golden_configs' scheme (unit-scale activations: matrices std
1/sqrt(fan_in), embeddings std 1, routers 2/sqrt(fan_in), norms 1 + 0.1 N),
so that greedy tokens are well separated and comparable between engines.
A directory is complete when its `.done` stamp exists; reruns reuse it.
"""
from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

SMALL = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
             num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
             head_dim=64, num_local_experts=8, num_experts_per_tok=2,
             max_position_embeddings=512, rope_theta=1e6, rms_norm_eps=1e-5)
# bench/quality.py's "mid" model: the small model's layer shapes (every width a
# multiple of 256, so the K block types apply everywhere but the experts' W2 of
# width 2816 = 11 x 256, also a multiple) with 2 layers: 0.21 B parameters.
MID = dict(SMALL, num_hidden_layers=2)
FFN = dict(vocab_size=32, hidden_size=1024, intermediate_size=2816,
           num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
           head_dim=8, num_local_experts=8, num_experts_per_tok=2,
           max_position_embeddings=512, rope_theta=1e6, rms_norm_eps=1e-5)
# docs/STREAMING.md's 7B class: OLMoE-1B-7B's shapes (hidden 2048, 16 layers, 64
# experts top-8, expert width 1024, vocabulary 50304) as a Mixtral: 6.9 B
# parameters, 7.3 GB at int8, 6.3 GB of it routed experts (6.3 MB an expert).
MOE7B = dict(vocab_size=50304, hidden_size=2048, intermediate_size=1024,
             num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
             head_dim=128, num_local_experts=64, num_experts_per_tok=8,
             max_position_embeddings=512, rope_theta=1e4, rms_norm_eps=1e-5)
# ... with routers skewed as trained ones are (ROUTER_SKEW below).
MOE7B_SKEWED = dict(MOE7B, router_skew=True)
MAX_SEQ_LEN = 512  # KV cache of every converted file (prefill 128 + decode)
# Which artefacts each model gets (.colibri quants, GGUF kinds): the 7B class
# only what bench/stream.py compares (its f32 files would be 27 GB each).
ARTEFACTS = {"moe7b": (("int8",), ("q8_0",)), "moe7b-skewed": (("int8",), ("q8_0",))}
DEFAULT_ARTEFACTS = (("f32", "int8"), ("f32", "q8_0"))


def mixtral_config(kw: dict):
    """A transformers MixtralConfig from our keyword dict (rope_theta placed
    where this transformers version keeps it)."""
    from transformers import MixtralConfig
    kw = dict(kw)
    kw.pop("router_skew", None)
    theta = kw.pop("rope_theta")
    cfg = MixtralConfig(**kw, tie_word_embeddings=False)
    if getattr(cfg, "rope_parameters", None) is not None:
        cfg.rope_parameters["rope_theta"] = theta
    else:
        cfg.rope_theta = theta
    cfg.architectures = ["MixtralForCausalLM"]
    return cfg


def hf_tensor_specs(kw: dict) -> list[tuple[str, tuple[int, ...], float | None]]:
    """(name, shape, std) of every tensor of a Mixtral checkpoint in the
    on-disk layout; std None = a norm weight (1 + 0.1 N)."""
    D, I, V = kw["hidden_size"], kw["intermediate_size"], kw["vocab_size"]
    H, KV, hd = kw["num_attention_heads"], kw["num_key_value_heads"], kw["head_dim"]
    E = kw["num_local_experts"]
    specs = [("model.embed_tokens.weight", (V, D), 1.0)]
    for l in range(kw["num_hidden_layers"]):
        p = f"model.layers.{l}."
        specs += [
            (p + "input_layernorm.weight", (D,), None),
            (p + "self_attn.q_proj.weight", (H * hd, D), D ** -0.5),
            (p + "self_attn.k_proj.weight", (KV * hd, D), D ** -0.5),
            (p + "self_attn.v_proj.weight", (KV * hd, D), D ** -0.5),
            (p + "self_attn.o_proj.weight", (D, H * hd), (H * hd) ** -0.5),
            (p + "post_attention_layernorm.weight", (D,), None),
            (p + "block_sparse_moe.gate.weight", (E, D), 2 * D ** -0.5),
        ]
        for e in range(E):
            q = p + f"block_sparse_moe.experts.{e}."
            specs += [(q + "w1.weight", (I, D), D ** -0.5),
                      (q + "w2.weight", (D, I), I ** -0.5),
                      (q + "w3.weight", (I, D), D ** -0.5)]
    specs += [("model.norm.weight", (D,), None), ("lm_head.weight", (V, D), D ** -0.5)]
    return specs


# A skewed router (kw router_skew): random routers route close to uniformly,
# trained ones concentrate on a few experts a layer. Every embedding row gets
# a shared component EMBED_SHARE * sqrt(hidden) * u (u a fixed random unit
# vector; a row's own part has norm sqrt(hidden)), so every hidden state
# leans along u. Expert e's router row gets a multiple of u that adds
# offset_e = ROUTER_SKEW * log(1 / rank_e) to its logit at the first layer
# (ranks a permutation of 1..E per layer: a Zipf-like preference for low
# ranks, fading in later layers as the layers' outputs dilute u). What
# routing that gives is measured (bench/stream.py's trace), not assumed: on
# the 7B class's layout at hidden 512 with 120 distinct tokens a layer's most
# used quarter of experts takes 80 % of its uses with these constants, 66 %
# without the skew (random routers are not uniform either), 99 % with a
# share of 3.
EMBED_SHARE = 0.3
ROUTER_SKEW = 1.0


def _skew(name: str, x: np.ndarray, kw: dict, seed: int) -> np.ndarray:
    D = kw["hidden_size"]
    u = np.random.default_rng([seed, 10 ** 6]).standard_normal(D).astype(np.float32)
    u /= np.linalg.norm(u)
    if name == "model.embed_tokens.weight":
        return x + np.float32(EMBED_SHARE * D ** 0.5) * u[None, :]
    if name.endswith("block_sparse_moe.gate.weight"):
        layer = int(name.split(".")[2])
        E = x.shape[0]
        rank = np.random.default_rng([seed, 10 ** 6, layer]).permutation(E) + 1
        offset = (ROUTER_SKEW * np.log(1.0 / rank)).astype(np.float32)
        # a hidden state at the first layer has about sqrt(D) * share / sqrt(share^2 + 1)
        # along u (normalised), so this adds offset_e to its router logit there
        lean = EMBED_SHARE / (EMBED_SHARE ** 2 + 1) ** 0.5
        return x + offset[:, None] * u[None, :] * np.float32(D ** -0.5 / lean)
    return x


def write_numpy_checkpoint(kw: dict, out_dir: Path, seed: int) -> None:
    """config.json + model.safetensors for config `kw`, weights from numpy
    (tensor i drawn from default_rng([seed, i])), streamed: the header is
    written first from the shapes, then one tensor at a time. kw
    router_skew: the skew above."""
    out_dir.mkdir(parents=True, exist_ok=True)
    mixtral_config(kw).to_json_file(out_dir / "config.json")
    specs = hf_tensor_specs(kw)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in specs:
        n = 4 * int(np.prod(shape))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned
    tmp = out_dir / "model.safetensors.part"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for i, (name, shape, std) in enumerate(specs):
            rng = np.random.default_rng([seed, i])
            x = rng.standard_normal(shape, dtype=np.float32)
            x = (1.0 + 0.1 * x) if std is None else x * np.float32(std)
            if kw.get("router_skew"):
                x = _skew(name, x, kw, seed)
            f.write(np.ascontiguousarray(x, dtype="<f4").tobytes())
    tmp.rename(out_dir / "model.safetensors")


def write_tiny_checkpoint(out_dir: Path, seed: int) -> None:
    """The golden "tiny" model, as tests/golden_configs.py builds it, with
    room for 512 positions (RoPE tables are not bounded by the config)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from golden_configs import make_mixtral
    model = make_mixtral("tiny", seed)
    model.config.max_position_embeddings = MAX_SEQ_LEN
    model.save_pretrained(out_dir)


def checkpoint_bytes(kw: dict) -> int:
    return sum(4 * int(np.prod(s)) for _, s, _ in hf_tensor_specs(kw))


class ModelSet:
    """Paths of one benchmark model's artefacts: hf/, f32/int8 .colibri,
    f32/q8_0 .gguf."""

    def __init__(self, name: str, base: Path):
        self.name = name
        self.dir = Path(base) / name
        self.hf = self.dir / "hf"
        quants, kinds = ARTEFACTS.get(name, DEFAULT_ARTEFACTS)
        self.colibri = {q: self.dir / f"model-{q}.colibri" for q in quants}
        self.gguf = {k: self.dir / f"model-{k}.gguf" for k in kinds}
        self.stamp = self.dir / ".done"

    def config(self) -> dict:
        return json.loads((self.hf / "config.json").read_text())


def prepare(name: str, base: Path, seed: int = 0, log=print, with_gguf: bool = True) -> ModelSet:
    """Generate (or reuse) every artefact of model `name`."""
    from colibri.model.convert import ColibriExporter
    from . import gguf_export

    ms = ModelSet(name, base)
    # A set made with its GGUF files also serves a run that needs none
    # (context.py --no-llama): regenerating it would delete them, and the
    # next run with llama.cpp would make them all again.
    if ms.stamp.exists() and ms.stamp.read_text() in {
            _stamp_text(name, seed, g) for g in ((True, False) if not with_gguf else (True,))}:
        return ms
    if ms.dir.exists():
        shutil.rmtree(ms.dir)
    ms.dir.mkdir(parents=True)
    log(f"generating the {name} model (seed {seed}) in {ms.dir}")
    if name == "tiny":
        write_tiny_checkpoint(ms.hf, seed)
    else:
        kw = {"small": SMALL, "ffn": FFN, "moe7b": MOE7B, "moe7b-skewed": MOE7B_SKEWED}[name]
        # the float32 checkpoint and what is converted from it
        need = (1.6 if name in ARTEFACTS else 4) * checkpoint_bytes(kw)
        free = shutil.disk_usage(base).free
        if free < need:
            raise RuntimeError(f"{base}: {free / 2**30:.1f} GiB free, the {name} model's "
                               f"artefacts need about {need / 2**30:.1f} GiB")
        write_numpy_checkpoint(kw, ms.hf, seed)
    for quant, path in ms.colibri.items():
        log(f"  colibri convert --quant {quant} -> {path.name}")
        ColibriExporter(ms.hf, quant=quant, max_seq_len=MAX_SEQ_LEN).export(path)
    if with_gguf:
        for kind, path in ms.gguf.items():
            log(f"  GGUF {kind} -> {path.name}")
            gguf_export.write_gguf(ms.hf, path, kind)
    if name in ARTEFACTS:   # the 27 GB float32 checkpoint is not needed again
        (ms.hf / "model.safetensors").unlink()
    ms.stamp.write_text(_stamp_text(name, seed, with_gguf))
    return ms


# The 4-bit pair of a 7B-class model (bench/stream.py --quant q4): llama.cpp's
# own Q4_K_M of the Q8_0 GGUF (llama-quantize --allow-requantize: the float32
# checkpoint is gone by then, and requantising costs quality, not bytes), and
# the .colibri file imported from that GGUF (`colibri convert FILE.gguf`, every
# tensor copied exactly), so both engines read the same bytes per expert.
LLAMA_QUANTIZE = ROOT / "build" / "bench" / "llama.cpp" / "native" / "bin" / "llama-quantize"


def prepare_q4_from_gguf(ms: ModelSet, log=print) -> tuple[Path, Path]:
    """(model-q4.colibri, model-q4_k_m.gguf) of model set ms, made once."""
    import os
    import subprocess
    from colibri import cli

    gguf, colibri = ms.dir / "model-q4_k_m.gguf", ms.dir / "model-q4.colibri"
    stamp = ms.dir / ".q4-gguf-done"
    if stamp.exists() and gguf.exists() and colibri.exists():
        return colibri, gguf
    if not LLAMA_QUANTIZE.exists():
        raise RuntimeError(f"no {LLAMA_QUANTIZE}: scripts/build_llama_bench.sh builds it")
    log(f"  llama-quantize --allow-requantize Q4_K_M -> {gguf.name}")
    tmp = gguf.with_suffix(".part")
    r = subprocess.run([str(LLAMA_QUANTIZE), "--allow-requantize", str(ms.gguf["q8_0"]),
                        str(tmp), "Q4_K_M", str(os.cpu_count() or 1)],
                       capture_output=True, text=True, errors="replace")
    if r.returncode:
        raise RuntimeError(f"llama-quantize: {(r.stderr or r.stdout)[-1500:]}")
    tmp.rename(gguf)
    log(f"  colibri convert {gguf.name} -> {colibri.name}")
    if cli.main(["convert", str(gguf), "-o", str(colibri), "-q"]):
        raise RuntimeError(f"colibri convert {gguf.name} failed")
    stamp.write_text("v1\n")
    return colibri, gguf


def _stamp_text(name: str, seed: int, with_gguf: bool) -> str:
    return f"{name} seed={seed} gguf={with_gguf} v1\n"
