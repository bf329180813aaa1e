"""Encoder-decoder checkpoint (Switch Transformers) -> .colibri (ENC_DEC file).

Two sources, one writer:
- a checkpoint directory (config.json + safetensors, read lazily with
  colibri.model.hf, one tensor at a time), or
- a loaded transformers model (`model=`; its state_dict, already in memory)
  and optionally its tokenizer object (`tokenizer=`).

`ColibriExporter` (colibri.model.convert) hands encoder-decoder models to
`EncDecExporter`, so `ColibriExporter(model=m, tokenizer=t).export(out)` and
`ColibriExporter("switch-dir").export(out)` both work; the options are the
decoder-only exporter's (quant presets, group size, byte order, max_seq_len,
max_batch) and `set_expert_weight_mapping({"wi": "w1", "wo": "w2"})`.

File layout (docs/FORMAT.md 3, ENC_DEC): header n_layers = encoder +
decoder layers, head_dim = d_kv, n_kv_heads = n_heads, top_k 1,
intermediate = d_ff; the T5 relative bias is written per distance
(ENC_POS_BIAS [H, 2L-1], DEC_POS_BIAS [H, L]) so the runtime needs no
bucketing; the tied LM head is written as its own LM_HEAD section.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from . import hf
from .export import output_path, report_layer_written, tokenizer_sections
from .families import switch_transformers as st
from .reference_encdec import canonical_name, position_bias_table
from ..errors import ColibriError, ConversionError
from ..file import format as fmt
from ..file.encode_pool import EncodePool, InOrder, checked_jobs
from ..file.format import Feat, Kind

# Switch has no max_position_embeddings (relative positions): the KV cache
# and the encoder input default to this many positions.
DEFAULT_MAX_SEQ = 512
EXPERT_TARGETS = ("w1", "w2")   # wi -> w1 (up), wo -> w2 (down); no w3 (ReLU, ungated)


def is_encdec_config(cfg: dict) -> bool:
    archs = cfg.get("architectures") or []
    return any(a in st.ARCHITECTURES for a in archs) or cfg.get("model_type") in st.MODEL_TYPES


def read_config_json(model_dir: Path) -> dict | None:
    """config.json as a dict, or None when absent/unreadable (the decoder-only
    path then reports the problem in its own words)."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


def shape_and_desc(cfg: dict, max_seq_len: int | None, max_batch: int, group_size: int
                   ) -> tuple[fmt.ModelShape, fmt.Description]:
    """The header's shape and the description of converting an
    encoder-decoder config.json (parsed) with these options (max_seq_len
    None: DEFAULT_MAX_SEQ). Raises ConversionError."""
    max_seq_len = DEFAULT_MAX_SEQ if max_seq_len is None else max_seq_len
    if max_seq_len < 1:
        raise ConversionError(f"max_seq_len = {max_seq_len} must be at least 1")
    es = st.encdec_shape(cfg, max_seq_len, max_batch)
    n_layers = es.enc_layers + es.dec_layers
    shape = fmt.ModelShape(
        vocab=es.vocab, hidden=es.d_model, intermediate=es.d_ff, max_seq_len=max_seq_len,
        n_layers=n_layers, n_heads=es.n_heads, n_kv_heads=es.n_heads, head_dim=es.d_kv,
        n_experts=es.n_experts, top_k=1, max_batch=max_batch, group_size=group_size,
        rope_theta=1e4, rms_eps=es.eps)
    dense = tuple(l for l in range(es.enc_layers) if l not in es.enc_sparse) + tuple(
        es.enc_layers + l for l in range(es.dec_layers) if l not in es.dec_sparse)
    features = Feat.ENC_DEC | Feat.RELU_FFN | (Feat.DENSE_LAYERS if dense else 0)
    if es.expert_capacity < 1:
        raise ConversionError("config.json: expert_capacity = 0 routes no token to any "
                              "expert; colibri needs a capacity of at least 1")
    desc = fmt.Description(
        features=int(features), dense_intermediate=es.d_ff if dense else 0,
        attn_scale=1.0, dense_layers=dense, encoder_layers=es.enc_layers,
        expert_capacity=es.expert_capacity, decoder_start=es.decoder_start,
        lm_scale=es.lm_scale)
    try:
        shape.validate()
        desc.validate(shape)
    except ColibriError as exc:
        raise ConversionError(f"this model does not fit the .colibri header: {exc}") from exc
    desc = desc.resolved(shape)
    return shape, desc


class Step(NamedTuple):
    """One tensor of the file, in file order, and its checkpoint name."""
    kind: Kind
    layer: int | None
    expert: int | None
    name: str


class EncDecExporter:
    def __init__(self, model_dir=None, *, model=None, tokenizer=None,
                 max_seq_len: int | None = None, max_batch: int = 1, quant: str = "int8",
                 dtypes: dict | None = None, group_size: int = 32,
                 byte_order: str = "little", output=None, include_tokenizer: bool = True,
                 warn: Callable[[str], None] | None = None, jobs: int = 1,
                 progress: Callable[[str], None] | None = None):
        if (model_dir is None) == (model is None):
            raise ConversionError("give either a checkpoint directory or model=")
        self.jobs = checked_jobs(jobs)
        self.output = output
        self.notes: list[str] = []   # what the user should know (the CLI prints them)
        self.model_dir = None if model_dir is None else Path(model_dir)
        if model is not None:
            self.cfg = model.config.to_dict()
            self._state = {k: v for k, v in model.state_dict().items()}
            self.checkpoint = None
        else:
            self.cfg = read_config_json(self.model_dir)
            if self.cfg is None:
                raise ConversionError(f"{self.model_dir}/config.json cannot be read")
            self.checkpoint = hf.Checkpoint(self.model_dir)
        if byte_order not in ("little", "big"):
            raise ConversionError(f"byte_order = {byte_order!r}: choose little or big")
        self.byte_order = byte_order
        self.dtypes = dtypes
        self.shape, self.desc = shape_and_desc(self.cfg, max_seq_len, max_batch, group_size)
        self.es = st.encdec_shape(self.cfg, self.shape.max_seq_len, max_batch)
        self.expert_map = {"wi": "w1", "wo": "w2"}
        self.progress = progress     # "layer L/N written" lines, or None
        self.tokenizer = None        # the TOKENIZER section's spec, or None
        if include_tokenizer:
            self.tokenizer = self._tokenizer(tokenizer, warn)

    def _tokenizer(self, tokenizer, warn):
        """A tokenizer object (saved to a temporary directory to read its
        tokenizer.json) or the checkpoint's; unsupported kinds are one warning."""
        from ..text import tokenizer as tk
        try:
            if tokenizer is not None:
                with tempfile.TemporaryDirectory() as tmp:
                    tokenizer.save_pretrained(tmp)
                    spec = tk.spec_from_dir(tmp)
            else:
                spec = tk.spec_from_dir(self.model_dir) if self.model_dir else None
        except tk.UnsupportedTokenizer as exc:
            (warn or _warn)(f"warning: tokenizer: {exc}: converting without a tokenizer "
                            "(the model takes token ids)")
            return None
        except tk.TokenizerError as exc:
            raise ConversionError(f"{exc} (or convert without the tokenizer)") from None
        if spec is not None and len(spec.pieces) > self.shape.vocab:
            raise ConversionError(
                f"the tokenizer has {len(spec.pieces)} token ids, the model's vocabulary only "
                f"{self.shape.vocab}: not this model's tokenizer")
        return spec

    def set_expert_weight_mapping(self, mapping: dict[str, str]) -> "EncDecExporter":
        """{checkpoint name: w1|w2}: which expert matrix is the up projection
        (w1) and which the down projection (w2). Switch's own names are
        {"wi": "w1", "wo": "w2"}, the default."""
        for src, dst in mapping.items():
            if dst not in EXPERT_TARGETS:
                raise ConversionError(f"expert map {src}={dst}: an encoder-decoder's experts "
                                      f"are w1 (wi, up) and w2 (wo, down); w3 has no meaning "
                                      f"without a gate")
            if "." in src or not src:
                raise ConversionError(f"expert map {src}={dst}: the source is one name "
                                      f"component, like 'wi' in experts.expert_0.wi.weight")
        if sorted(mapping.values()) != sorted(set(mapping.values())):
            raise ConversionError("expert map: several names map to the same target")
        self.expert_map = {"wi": "w1", "wo": "w2"}
        self.expert_map = {k: v for k, v in self.expert_map.items()
                           if v not in mapping.values()}
        self.expert_map.update(mapping)
        return self

    # --- sources -------------------------------------------------------------

    def _hf_names(self) -> dict:
        inv = {v: k for k, v in self.expert_map.items()}
        return st.hf_names(self.es, bool(self.cfg.get("tie_word_embeddings", True)),
                           wi=inv["w1"], wo=inv["w2"])

    def _has(self, name: str) -> bool:
        return name in self._state if self.checkpoint is None else name in self.checkpoint

    def _read(self, name: str) -> np.ndarray:
        if self.checkpoint is None:
            return self._state[name].detach().float().cpu().numpy()
        info = self.checkpoint.info(name)
        return hf.read_tensor(info).reshape(info.shape)

    def _all_names(self) -> list[str]:
        return list(self._state) if self.checkpoint is None else list(self.checkpoint.tensors)

    def plan(self) -> list[Step]:
        """(kind, layer, expert, checkpoint tensor) in file order, checked:
        missing or unexpected tensors are an error naming them."""
        names = self._hf_names()
        steps = []
        for kind, layer, expert in fmt.tensor_order(self.shape, self.desc):
            if kind == Kind.DESC:
                continue
            canon = canonical_name(kind, layer, expert, self.es.enc_layers)
            steps.append(Step(kind, layer, expert, names[canon]))
        missing = [n for n in dict.fromkeys(s[3] for s in steps) if not self._has(n)]
        if missing:
            raise ConversionError(
                f"{len(missing)} tensor(s) missing from the checkpoint: {', '.join(missing[:6])}"
                + ("; name the expert matrices with set_expert_weight_mapping / --expert-map "
                   "(e.g. wi=w1,wo=w2)" if any(".experts." in n for n in missing) else ""))
        used = {s[3] for s in steps}
        # Tied copies of the shared embedding are stored under several names.
        tied = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"}
        if self.cfg.get("tie_word_embeddings", True):
            tied.add("lm_head.weight")
        unexpected = [n for n in self._all_names() if n not in used and n not in tied]
        if unexpected:
            raise ConversionError(
                f"{len(unexpected)} unexpected tensor(s) in the checkpoint: "
                f"{', '.join(unexpected[:6])}; colibri converts {st.TITLE} as config.json "
                "describes it, so these would be lost")
        return steps

    def _weights(self, kind: Kind, name: str) -> np.ndarray:
        rows, cols = fmt.expected_shape(self.shape, kind, self.desc)
        a = self._read(name)
        if kind in (Kind.ENC_POS_BIAS, Kind.DEC_POS_BIAS):
            nb = int(self.cfg.get("relative_attention_num_buckets", 32))
            md = int(self.cfg.get("relative_attention_max_distance", 128))
            if a.shape != (nb, self.es.n_heads):
                raise ConversionError(f"tensor {name!r} has shape {list(a.shape)}, expected "
                                      f"[{nb}, {self.es.n_heads}]")
            n = self.shape.max_seq_len
            full = position_bias_table(a, kind == Kind.ENC_POS_BIAS, nb, md, n)  # [H, 2n-1]
            # DEC_POS_BIAS column j: distance j (rel = -j, column n-1-j of full).
            return full if kind == Kind.ENC_POS_BIAS else np.ascontiguousarray(full[:, n - 1::-1])
        if a.size != rows * cols:
            raise ConversionError(f"tensor {name!r} has shape {list(a.shape)}, expected "
                                  f"[{rows}, {cols}] (from config.json)")
        return a.reshape(rows, cols).astype(np.float32)

    def export(self, output=None) -> Path:
        """Write the .colibri file; returns its path (written as OUT.partial,
        renamed when complete). With self.jobs > 1 the block-type tensors are
        encoded on that many worker processes (colibri/file/encode_pool.py),
        the same bytes as with one."""
        out = output_path(output if output is not None else self.output)
        steps = self.plan()
        start = time.monotonic()

        def write(item, encoded) -> None:
            i, step, dt = item
            w.add_encoded(step.kind, step.layer, step.expert, dt, *encoded)
            report_layer_written(self.progress, steps, i, self.shape.n_layers, start)

        try:
            with fmt.ColibriWriter(out, self.shape, self.dtypes, self.byte_order, self.desc,
                                   optional_sections=tokenizer_sections(
                                       self.tokenizer, self.byte_order)) as w, \
                    EncodePool(self.jobs) as pool:
                order = InOrder(pool, write, name=lambda item: item[1].name)
                for i, step in enumerate(steps):
                    try:
                        weights = self._weights(step.kind, step.name)
                    except ColibriError as exc:
                        raise ConversionError(f"tensor {step.name!r}: {exc}") from exc
                    dt = fmt.fit_dtype(w.dtypes[step.kind], weights.shape[-1], step.kind)
                    order.submit((i, step, dt), weights, dt, self.shape.group_size)
                    del weights
                order.finish()
        except OSError as exc:
            raise ConversionError(f"cannot write {out}: {exc.strerror or exc}") from exc
        return out


def _warn(line: str) -> None:
    import sys
    print(f"colibri convert: {line}", file=sys.stderr, flush=True)
