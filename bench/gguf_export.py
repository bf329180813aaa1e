"""Hugging Face Mixtral checkpoint -> GGUF for llama.cpp, f32 or Q8_0, written
with the `gguf` package (GGUFWriter, gguf.quants), streamed tensor by tensor.

llama.cpp runs Mixtral as architecture "llama" with expert keys
(llama.expert_count / expert_used_count) and, per layer, the experts stacked
into one 3-D tensor each (what convert_hf_to_gguf.py's LlamaModel writes):
  blk.N.ffn_gate_exps.weight  [E, I, D]  <- experts.e.w1 (gate)
  blk.N.ffn_up_exps.weight    [E, I, D]  <- experts.e.w3 (up)
  blk.N.ffn_down_exps.weight  [E, D, I]  <- experts.e.w2 (down)
  blk.N.ffn_gate_inp.weight   [E, D]     <- block_sparse_moe.gate (router, f32)
(shapes numpy-order; GGUF stores them reversed). llama.cpp's RoPE rotates
adjacent pairs (GPT-J style) while HF rotates the two halves of each head, so
the q and k rows are permuted per head as LlamaModel.permute does: row order
(h, pair i, half j) -> (h, j, i). The tokenizer is a minimal SentencePiece
("llama") vocabulary: <unk>, <s>, </s>, then byte tokens <0xNN> while they fit,
then placeholders; the benchmark feeds token ids, never text, but llama.cpp
(and llama-cpp-python) need a vocabulary of exactly vocab_size entries.
Norms and the router stay f32 in Q8_0 files, as convert_hf_to_gguf keeps them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from colibri.model import hf


def permute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """[n_head*hd, D] rows from HF's rotate-half order to llama.cpp's
    interleaved order (convert_hf_to_gguf.py LlamaModel.permute)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


class _Source:
    """Mixtral tensors from a checkpoint in either on-disk layout (per-expert
    w1/w2/w3, or transformers 5's fused gate_up_proj/down_proj)."""

    def __init__(self, model_dir: Path):
        self.ck = hf.Checkpoint(model_dir)

    def get(self, name: str) -> np.ndarray:
        info = self.ck.info(name)
        return hf.read_tensor(info).reshape(info.shape)

    def experts(self, l: int, which: str, E: int, I: int) -> np.ndarray:
        """which in w1/w3/w2 -> [E, I, D] or [E, D, I] float32."""
        for moe in ("block_sparse_moe", "mlp"):
            p = f"model.layers.{l}.{moe}.experts."
            if f"{p}0.{which}.weight" in self.ck:
                return np.stack([self.get(f"{p}{e}.{which}.weight") for e in range(E)])
            if f"{p}gate_up_proj" in self.ck:
                if which == "w2":
                    return self.get(f"{p}down_proj")
                gu = self.get(f"{p}gate_up_proj")           # [E, 2I, D] = concat(w1, w3)
                return gu[:, :I] if which == "w1" else gu[:, I:]
        raise KeyError(f"layer {l}: no expert tensors for {which} in the checkpoint")

    def prefix(self, l: int) -> str:
        for moe in ("block_sparse_moe", "mlp"):
            if f"model.layers.{l}.{moe}.gate.weight" in self.ck:
                return f"model.layers.{l}.{moe}."
        raise KeyError(f"layer {l}: no router (gate.weight)")


def _plan(cfg: dict, tied: bool = False):
    """[(gguf name, numpy shape, loader(src) -> float32 array, quantisable)].
    tied: the checkpoint has no lm_head (tie_word_embeddings): no output.weight,
    llama.cpp then uses token_embd for the output, as convert_hf_to_gguf.py
    writes such a model (and llama-quantize gives token_embd the output's type)."""
    D, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or D // H
    E = cfg["num_local_experts"]
    plan = [("token_embd.weight", (V, D), lambda s: s.get("model.embed_tokens.weight"), True)]
    for l in range(cfg["num_hidden_layers"]):
        a = f"model.layers.{l}."
        b = f"blk.{l}."
        plan += [
            (b + "attn_norm.weight", (D,), lambda s, a=a: s.get(a + "input_layernorm.weight"), False),
            (b + "attn_q.weight", (H * hd, D),
             lambda s, a=a: permute_rope(s.get(a + "self_attn.q_proj.weight"), H), True),
            (b + "attn_k.weight", (KV * hd, D),
             lambda s, a=a: permute_rope(s.get(a + "self_attn.k_proj.weight"), KV), True),
            (b + "attn_v.weight", (KV * hd, D), lambda s, a=a: s.get(a + "self_attn.v_proj.weight"), True),
            (b + "attn_output.weight", (D, H * hd),
             lambda s, a=a: s.get(a + "self_attn.o_proj.weight"), True),
            (b + "ffn_norm.weight", (D,),
             lambda s, a=a: s.get(a + "post_attention_layernorm.weight"), False),
            (b + "ffn_gate_inp.weight", (E, D), lambda s, l=l: s.get(s.prefix(l) + "gate.weight"), False),
            (b + "ffn_gate_exps.weight", (E, I, D), lambda s, l=l: s.experts(l, "w1", E, I), True),
            (b + "ffn_down_exps.weight", (E, D, I), lambda s, l=l: s.experts(l, "w2", E, I), True),
            (b + "ffn_up_exps.weight", (E, I, D), lambda s, l=l: s.experts(l, "w3", E, I), True),
        ]
    plan += [("output_norm.weight", (D,), lambda s: s.get("model.norm.weight"), False)]
    if not tied:
        plan += [("output.weight", (V, D), lambda s: s.get("lm_head.weight"), True)]
    return plan


def _vocab(V: int):
    """Minimal SentencePiece vocabulary of exactly V tokens: (pieces, scores, types)."""
    import gguf
    T = gguf.TokenType
    pieces, types = ["<unk>", "<s>", "</s>"], [T.UNKNOWN, T.CONTROL, T.CONTROL]
    if V >= 3 + 256:
        pieces += [f"<0x{b:02X}>" for b in range(256)]
        types += [T.BYTE] * 256
    while len(pieces) < V:
        pieces.append(f"\u2581t{len(pieces)}")
        types.append(T.NORMAL)
    pieces, types = pieces[:V], types[:V]
    scores = [0.0] * 3 + [-float(i) for i in range(3, V)]
    return pieces, scores, [int(t) for t in types]


def _rope_theta(cfg: dict) -> float:
    rp = cfg.get("rope_parameters") or {}
    return float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def write_gguf(model_dir: Path, out: Path, kind: str = "f32") -> Path:
    """Write the checkpoint at model_dir as GGUF `kind` (f32 or q8_0) to out."""
    import json

    import gguf
    from gguf import GGMLQuantizationType as Q

    if kind not in ("f32", "q8_0"):
        raise ValueError(f"kind = {kind!r}: f32 or q8_0")
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or D // H
    src = _Source(Path(model_dir))
    tied = bool(cfg.get("tie_word_embeddings")) and "lm_head.weight" not in src.ck
    plan = _plan(cfg, tied)
    q8 = kind == "q8_0"

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(f"colibri-bench {Path(model_dir).parent.name}")
    w.add_context_length(int(cfg["max_position_embeddings"]))
    w.add_embedding_length(D)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(_rope_theta(cfg))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_expert_count(cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.ALL_F32)
    pieces, scores, types = _vocab(cfg["vocab_size"])
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)

    def quantised(name, shape, quantisable):
        return q8 and quantisable and shape[-1] % 32 == 0

    # Tensor infos first (from the shapes alone), then the data one by one.
    for name, shape, _, qz in plan:
        if quantised(name, shape, qz):
            bshape = (*shape[:-1], shape[-1] // 32 * 34)  # Q8_0: 32 int8 + f16 scale
            w.add_tensor_info(name, bshape, np.dtype(np.uint8), int(np.prod(bshape)), raw_dtype=Q.Q8_0)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, load, qz in plan:
        x = np.ascontiguousarray(load(src), dtype=np.float32)
        if x.shape != tuple(shape):
            raise ValueError(f"{name}: shape {x.shape}, expected {shape}")
        if quantised(name, shape, qz):
            x = gguf.quants.quantize(x, Q.Q8_0)
        w.write_tensor_data(x)
    w.close()
    return Path(out)
