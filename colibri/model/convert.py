"""Hugging Face MoE checkpoint -> .colibri file (`colibri convert`).

The checkpoint's family (colibri/model/families/, picked from config.json's
`architectures` or `model_type`) names the fields and tensors; what follows
describes the Mixtral layout, the other families' are in their modules.

The conversion is planned completely before anything is written: every tensor
of the .colibri file (format.tensor_order) is mapped to its source in the
checkpoint, and missing tensors, unexpected tensors and shape mismatches are
reported by name. Then the tensors are streamed one at a time: read from the
safetensors file (colibri.model.hf), quantised and written by format.ColibriWriter,
and dropped. Peak memory is a few copies of the largest tensor, whatever the
model's size.

Source layouts understood (per layer L, expert E):
- Mixtral on disk (transformers 4 and 5 save this):
  model.layers.L.block_sparse_moe.gate.weight            [E, hidden]
  model.layers.L.block_sparse_moe.experts.E.w1.weight    [I, hidden] (gate)
  model.layers.L.block_sparse_moe.experts.E.w3.weight    [I, hidden] (up)
  model.layers.L.block_sparse_moe.experts.E.w2.weight    [hidden, I] (down)
  (also accepted with `mlp` in place of `block_sparse_moe`).
- transformers 5's in-memory fused layout, if a checkpoint was saved that way:
  model.layers.L.mlp.gate.weight                         [E, hidden]
  model.layers.L.mlp.experts.gate_up_proj                [E, 2I, hidden]
      = concat(w1, w3) along dim 1 (MixtralExperts.forward: `gate, up =
        linear(x, gate_up_proj[e]).chunk(2, dim=-1)`)
  model.layers.L.mlp.experts.down_proj                   [E, hidden, I]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import convert_encdec as ed
from . import families, gguf_in, hf
from . import imatrix as im
from .convert_gguf import GGUFExporter
from .export import (DEFAULT_MAX_SEQ_CAP, PRESETS, QUANT_CHOICES, output_path, preset_dtypes,
                     report_layer_written, shape_and_desc, tied_dtype, tied_note,
                     tokenizer_sections)
from .families.common import LAYER_TENSORS, ExpertLayout, Fused
from ..errors import ColibriError, ConversionError
from ..file import blocks
from ..file import format as fmt
from ..file.encode_pool import EncodePool, InOrder, checked_jobs, default_jobs
from ..file.format import DType, Kind
from ..text import tokenizer as tk

# Names of the expert matrices in the Mixtral checkpoint layout.
MIXTRAL_EXPERT_NAMES = {"w1": Kind.EXPERT_W1, "w3": Kind.EXPERT_W3, "w2": Kind.EXPERT_W2}

# Kinds stored as 1-D tensors in a checkpoint (norms, biases).
NORM_KINDS = (Kind.ATTN_NORM, Kind.FFN_NORM, Kind.FINAL_NORM, Kind.Q_NORM, Kind.K_NORM,
              Kind.BQ, Kind.BK, Kind.BV, Kind.BO)
EMBED_NAME = "model.embed_tokens.weight"
FINAL_NORM_NAME = "model.norm.weight"
LM_HEAD_NAME = "lm_head.weight"

# Checkpoint entries that carry no weights colibri needs: old checkpoints store
# RoPE's inverse frequencies, which follow from rope_theta.
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)

@dataclass(frozen=True)
class Source:
    """Where one .colibri tensor comes from: elements [first, first + count)
    of checkpoint tensor `name` (the whole tensor when count is None), whose
    full shape must be `hf_shape`."""
    name: str
    hf_shape: tuple[int, ...]
    first: int = 0
    count: int | None = None


@dataclass(frozen=True)
class Step:
    kind: Kind
    layer: int | None
    expert: int | None
    source: Source


def parse_expert_map(text: str) -> dict[str, str]:
    """'wi=w1,wo=w2' -> {'wi': 'w1', 'wo': 'w2'} (checkpoint name -> Mixtral name)."""
    mapping: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        src, sep, dst = item.partition("=")
        if not sep or not src.strip() or not dst.strip():
            raise ConversionError(f"--expert-map: {item!r} is not SOURCE=TARGET "
                                  f"(example: wi=w1,wo=w2)")
        mapping[src.strip()] = dst.strip()
    return mapping


class ColibriExporter:
    """Converts one Hugging Face MoE checkpoint directory (any family of
    colibri/model/families/) to .colibri.

        ColibriExporter("mixtral-dir", quantize_experts="int8").export("m.colibri")

    `quant` picks the preset ("int8": router int16, experts/attention int8,
    embedding int16, lm_head int8; "f32": everything float32); each
    quantize_* argument left at None follows the preset. The constructor reads
    config.json and the safetensors headers (no weights) and checks the options.
    `jobs` > 1 quantises tensors on that many spawned worker processes
    (colibri/file/encode_pool.py; the same bytes as 1, the default): a
    script that passes it must start from an `if __name__ == "__main__":`
    block, as every multiprocessing spawn needs.

    Encoder-decoder models (Switch Transformers) are handed to
    colibri.model.convert_encdec.EncDecExporter, from a directory or from a loaded
    transformers model with its tokenizer object:

        ColibriExporter(model=m, tokenizer=tok, quant="f32").export("s.colibri")
    """

    def __new__(cls, model_dir=None, *args, model=None, **kwargs):
        if cls is not ColibriExporter:
            return super().__new__(cls)
        cfg = (model.config.to_dict() if model is not None
               else ed.read_config_json(Path(model_dir)) if model_dir is not None else None)
        if cfg is not None and ed.is_encdec_config(cfg):
            return _encdec_exporter(model_dir, model, *args, **kwargs)
        if model is not None:
            raise ConversionError(
                f"model=: {type(model).__name__} is not an encoder-decoder colibri converts "
                "from memory; save it with save_pretrained(DIR) and pass DIR")
        return super().__new__(cls)

    def __init__(self, model_dir: str | os.PathLike = None, num_experts: int | None = None,
                 top_k: int | None = None, max_seq_len: int | None = None,
                 max_batch: int = 1, quant: str = "int8",
                 quantize_router: str | None = None, quantize_experts: str | None = None,
                 quantize_attention: str | None = None,
                 quantize_embedding: str | None = None,
                 quantize_lm_head: str | None = None, group_size: int = 32,
                 byte_order: str = "little", output: str | os.PathLike | None = None,
                 progress: Callable[[str], None] | None = None, tokenizer: bool = True,
                 warn: Callable[[str], None] | None = None, imatrix=None, jobs: int = 1):
        self.jobs = checked_jobs(jobs)
        self.model_dir = Path(model_dir)
        self.config = hf.read_config(self.model_dir)
        self.family = families.load(self.config.family)
        self.checkpoint = hf.Checkpoint(self.model_dir)
        self.output = output
        self.progress = progress
        if byte_order not in ("little", "big"):
            raise ConversionError(f"byte_order = {byte_order!r}: choose little or big")
        self.byte_order = byte_order
        self.dtypes = preset_dtypes(quant, router=quantize_router, experts=quantize_experts,
                                    attention=quantize_attention, embedding=quantize_embedding,
                                    lm_head=quantize_lm_head)
        self.shape = self._shape(num_experts, top_k, max_seq_len, max_batch, group_size)
        if self.desc.has(fmt.Feat.TIED_LM_HEAD):
            self.dtypes[Kind.EMBED] = tied_dtype(quant, self.dtypes, quantize_embedding,
                                                 quantize_lm_head)
        self.expert_map: dict[str, str] = {}
        # what the user should know of the choices made (export() adds its own)
        self.notes: list[str] = []
        self._choice_notes = (tied_note(quantize_embedding, quantize_lm_head)
                              if self.desc.has(fmt.Feat.TIED_LM_HEAD) else [])
        trained = self.config.max_position_embeddings
        if self.shape.max_seq_len > trained:
            # allowed (a cache sized for more), but the positions past it
            # were never trained: RoPE beyond them is extrapolation
            self._choice_notes.append(
                f"note: max_seq_len {self.shape.max_seq_len} is beyond the checkpoint's "
                f"max_position_embeddings {trained}: the model was not trained on positions "
                "past it")
        self.tokenizer = self._tokenizer(warn) if tokenizer else None
        self.importance = self._importance(imatrix)

    def _tokenizer(self, warn: Callable[[str], None] | None):
        """The checkpoint's tokenizer.json as a TOKENIZER section spec, or None
        (no tokenizer.json; or an unsupported kind: one warning line, and the
        model converts without a tokenizer, usable with token ids)."""
        try:
            spec = tk.spec_from_dir(self.model_dir)
        except tk.UnsupportedTokenizer as exc:
            (warn or _warn)(f"warning: {self.model_dir / 'tokenizer.json'}: {exc}: converting "
                            "without a tokenizer (the model takes token ids)")
            return None
        except tk.TokenizerError as exc:
            raise ConversionError(f"{exc} (or convert with --no-tokenizer)") from None
        if spec is not None and len(spec.pieces) > self.shape.vocab:
            raise ConversionError(
                f"tokenizer.json has {len(spec.pieces)} token ids, the model's vocabulary "
                f"only {self.shape.vocab}: not this model's tokenizer (or convert with "
                "--no-tokenizer)")
        return spec

    @staticmethod
    def _importance(imatrix) -> dict:
        """{(kind, layer, expert): mean x^2 [cols]} (colibri/model/imatrix.py) from a
        file `colibri imatrix` wrote, a dict of that form, or None (none)."""
        if imatrix is None:
            return {}
        if isinstance(imatrix, dict):
            return {k: (v[0] if isinstance(v, tuple) else v) for k, v in imatrix.items()}
        return im.load(imatrix)

    # --- options -------------------------------------------------------------

    def _shape(self, num_experts, top_k, max_seq_len, max_batch, group_size) -> fmt.ModelShape:
        shape, self.desc = shape_and_desc(self.config, num_experts, top_k, max_seq_len,
                                          max_batch, group_size)
        return shape

    def set_expert_weight_mapping(self, mapping: dict[str, str]) -> "ColibriExporter":
        """Name the expert matrices of a checkpoint that does not call them
        w1/w3/w2: {checkpoint name: Mixtral name}, e.g. {"wi": "w1", "wo": "w2"}.
        Unmapped Mixtral names keep their own name."""
        targets = list(mapping.values())
        for src, dst in mapping.items():
            if dst not in MIXTRAL_EXPERT_NAMES:
                raise ConversionError(f"expert map {src}={dst}: the target must be one of "
                                      f"{', '.join(MIXTRAL_EXPERT_NAMES)}")
            if targets.count(dst) > 1:
                raise ConversionError(f"expert map: several names map to {dst}")
            if "." in src or not src:
                raise ConversionError(f"expert map {src}={dst}: the source is one name "
                                      f"component, like 'wi' in experts.0.wi.weight")
        self.expert_map = dict(mapping)
        return self

    # --- plan ----------------------------------------------------------------

    def _source_name(self, mixtral_name: str) -> str:
        for src, dst in self.expert_map.items():
            if dst == mixtral_name:
                return src
        return mixtral_name

    def plan(self) -> list[Step]:
        """Every .colibri tensor's source, in file order, checked against the
        checkpoint (names and shapes). Raises ConversionError listing what is
        missing, unexpected or mis-shaped."""
        s, c, d, fam = self.shape, self.config, self.desc, self.family
        h, inter, n_exp = s.hidden, s.intermediate, s.n_experts
        steps: list[Step] = []
        layouts = [self._layer_layout(layer) for layer in range(s.n_layers)]
        names = {k: self._source_name(k) for k in MIXTRAL_EXPERT_NAMES}
        shared_dense = dict(zip(fmt.SHARED_KINDS, fam.shared))
        shared_dense.update(zip(fmt.DENSE_KINDS, fam.dense))
        for kind, layer, expert in fmt.tensor_order(s, d):
            if kind == Kind.DESC:
                continue  # written by the writer from self.desc
            rows, cols = fmt.expected_shape(s, kind, d)
            whole = (cols,) if kind in NORM_KINDS else (rows, cols)
            prefix = f"model.layers.{layer}."
            if kind == Kind.EMBED:
                src = Source(EMBED_NAME, whole)
            elif kind == Kind.FINAL_NORM:
                src = Source(FINAL_NORM_NAME, whole)
            elif kind == Kind.LM_HEAD:
                src = Source(EMBED_NAME if c.tie_word_embeddings else LM_HEAD_NAME, whole)
            elif kind in LAYER_TENSORS:
                src = Source(prefix + LAYER_TENSORS[kind], whole)
            elif kind == Kind.SHARED_GATE:
                src = Source(prefix + fam.shared_gate, whole)
            elif kind in shared_dense:
                spec = shared_dense[kind]
                if isinstance(spec, Fused):
                    # [2n, cols]: gate rows first, then up (chunk(2)).
                    src = Source(prefix + spec.name, (2 * rows, cols), spec.part * rows * cols,
                                 rows * cols)
                else:
                    src = Source(prefix + spec, whole)
            else:
                lay = layouts[layer]
                if kind == Kind.ROUTER:
                    src = Source(prefix + lay.router, whole)
                elif lay.fused and kind in (Kind.EXPERT_W1, Kind.EXPERT_W3):
                    # gate_up [E, 2I, H]: expert e's block is [2I, H],
                    # gate (w1) rows first, then up (w3).
                    half = inter * h
                    first = expert * 2 * half + (half if kind == Kind.EXPERT_W3 else 0)
                    src = Source(prefix + lay.fused[0], (n_exp, 2 * inter, h), first, half)
                elif lay.fused:  # down [E, H, I]
                    src = Source(prefix + lay.fused[1], (n_exp, h, inter),
                                 expert * h * inter, h * inter)
                else:
                    tpl = lay.per_expert[fmt.EXPERT_KINDS.index(kind)]
                    src = Source(prefix + tpl.format(e=expert, **names), whole)
            steps.append(Step(kind, layer, expert, src))
        self._check_plan(steps)
        return steps

    def _layer_layout(self, layer: int) -> ExpertLayout:
        """Where this layer's experts are, from the names present (the last
        layout when none is: the errors then name its tensors)."""
        ck = self.checkpoint
        for lay in self.family.layouts:
            if f"model.layers.{layer}.{lay.marker}" in ck:
                return lay
        return self.family.layouts[-1]

    def _check_plan(self, steps: list[Step]) -> None:
        ck = self.checkpoint
        used = {step.source.name for step in steps}
        missing = [name for name in dict.fromkeys(st.source.name for st in steps)
                   if name not in ck]
        ignorable = {LM_HEAD_NAME} if self.config.tie_word_embeddings else set()
        unexpected = [name for name in ck.tensors
                      if name not in used and name not in ignorable
                      and not name.endswith(IGNORED_SUFFIXES)]
        if missing:
            hint = ""
            if any(".experts." in n for n in missing) and \
                    any(".experts." in n for n in unexpected):
                hint = ("; the checkpoint names its expert weights differently: map them "
                        "with --expert-map (e.g. wi=w1,wo=w2,wv=w3)")
            elif self.config.tie_word_embeddings is False and missing == [LM_HEAD_NAME]:
                hint = ("; if the model ties its output layer to the embedding, set "
                        "tie_word_embeddings in config.json")
            raise ConversionError(f"{len(missing)} tensor(s) missing from the checkpoint "
                                  f"in {self.model_dir}: {_some(missing)}"
                                  + (f" (the checkpoint has unexpected {_some(unexpected)})"
                                     if unexpected and hint else "") + hint)
        if unexpected:
            raise ConversionError(
                f"{len(unexpected)} unexpected tensor(s) in the checkpoint in "
                f"{self.model_dir}: {_some(unexpected)}; colibri converts "
                f"{self.family.title} as config.json describes it "
                f"({self.config.n_layers} layers, {self.config.n_experts} experts), so these "
                f"would be lost")
        checked: set[str] = set()
        for st in steps:
            src = st.source
            if src.name in checked:
                continue
            checked.add(src.name)
            info = ck.info(src.name)
            if tuple(info.shape) != src.hf_shape:
                raise ConversionError(
                    f"tensor {src.name!r} has shape {list(info.shape)}, expected "
                    f"{list(src.hf_shape)} (from config.json: {self._shape_note(st.kind)})")
            if info.dtype not in ("F32", "F16", "BF16", "F64"):
                raise ConversionError(
                    f"tensor {src.name!r} is {info.dtype}; colibri converts BF16, F16, "
                    f"F32 and F64 weights (dequantise quantised checkpoints first)")

    def _shape_note(self, kind: Kind) -> str:
        s = self.shape
        if kind in (Kind.EMBED, Kind.LM_HEAD):
            return f"vocab_size {s.vocab}, hidden_size {s.hidden}"
        if kind in (Kind.WQ, Kind.WO):
            return f"num_attention_heads {s.n_heads} x head_dim {s.head_dim}, hidden_size {s.hidden}"
        if kind in (Kind.WK, Kind.WV):
            return f"num_key_value_heads {s.n_kv_heads} x head_dim {s.head_dim}, hidden_size {s.hidden}"
        if kind == Kind.ROUTER:
            return f"num_local_experts {s.n_experts}, hidden_size {s.hidden}"
        if kind in fmt.EXPERT_KINDS:
            return (f"num_local_experts {s.n_experts}, intermediate_size {s.intermediate}, "
                    f"hidden_size {s.hidden}")
        return f"hidden_size {s.hidden}"

    # --- export --------------------------------------------------------------

    def load(self, step: Step) -> np.ndarray:
        """The source weights of one step as float32 [rows, cols]."""
        src = step.source
        flat = hf.read_tensor(self.checkpoint.info(src.name), src.first, src.count)
        return flat.reshape(fmt.expected_shape(self.shape, step.kind, self.desc))

    def export(self, output: str | os.PathLike | None = None) -> Path:
        """Write the .colibri file; returns its path. The file appears only when
        complete (the writer writes OUT.partial and renames it). With
        self.jobs > 1 the tensors are encoded on that many worker processes
        (colibri/file/encode_pool.py), the same bytes as with one."""
        out = output_path(output if output is not None else self.output)
        steps = self.plan()
        start = time.monotonic()
        # (chosen, stored, cols) -> kinds whose rows the chosen type did not fit
        fallbacks: dict[tuple, dict[str, None]] = {}

        def write(item, encoded) -> None:
            i, st, dt = item
            w.add_encoded(st.kind, st.layer, st.expert, dt, *encoded)
            report_layer_written(self.progress, steps, i, self.shape.n_layers, start)

        try:
            optional = tokenizer_sections(self.tokenizer, self.byte_order)
            with fmt.ColibriWriter(out, self.shape, self.dtypes, self.byte_order,
                                   self.desc, optional_sections=optional) as w, \
                    EncodePool(self.jobs) as pool:
                order = InOrder(pool, write, name=lambda item: item[1].source.name)
                for i, st in enumerate(steps):
                    weights = self.load(st)
                    key = (st.kind, st.layer, st.expert)
                    if st.kind == Kind.EMBED and self.desc.has(fmt.Feat.TIED_LM_HEAD):
                        key = (Kind.LM_HEAD, None, None)   # its product is the LM head's
                    imp = self.importance.get(key)
                    if imp is not None and imp.shape != (weights.shape[-1],):
                        raise ConversionError(
                            f"tensor {st.source.name!r}: the importance matrix has "
                            f"{imp.shape[0]} columns for it, the tensor {weights.shape[-1]}: "
                            "measured on another model")
                    dt = fmt.fit_dtype(self.dtypes[st.kind], weights.shape[-1], st.kind)
                    if dt != self.dtypes[st.kind]:
                        fallbacks.setdefault((self.dtypes[st.kind], dt, weights.shape[-1]),
                                             {})[st.kind.name] = None
                    order.submit((i, st, dt), weights, dt, self.shape.group_size, imp)
                    del weights
                order.finish()
        except OSError as exc:
            raise ConversionError(f"cannot write {out}: {exc.strerror or exc}") from exc
        self.notes = self._choice_notes + [fallback_note(*key, list(kinds))
                                           for key, kinds in fallbacks.items()]
        return out


def fallback_note(chosen: DType, stored: DType, cols: int, kinds: list[str]) -> str:
    """The line that says a kind's type (a preset's or an option's) did not
    fit its rows and what was stored instead (format.fit_dtype)."""
    return (f"note: {', '.join(kinds)}: {stored.name} instead of {chosen.name}, whose "
            f"{blocks.BLOCK_COLS[chosen]}-weight blocks do not divide the {cols}-wide rows "
            f"({stored.name}: the fewest bits a weight among {chosen.name} and its fallbacks, "
            f"docs/QUANTISATION.md)")


def _warn(line: str) -> None:
    print(f"colibri convert: {line}", file=sys.stderr, flush=True)


def _encdec_exporter(model_dir, model, num_experts=None, top_k=None, max_seq_len=None,
                     max_batch=1, quant="int8", quantize_router=None, quantize_experts=None,
                     quantize_attention=None, quantize_embedding=None, quantize_lm_head=None,
                     group_size=32, byte_order="little", output=None, progress=None,
                     tokenizer=True, warn=None, imatrix=None, jobs=1):
    """ColibriExporter's options applied to an encoder-decoder model."""
    if imatrix is not None:
        raise ConversionError("an importance matrix (--imatrix, --calibration) is for "
                              "decoder-only models; convert Switch Transformers without it")
    dtypes = preset_dtypes(quant, router=quantize_router, experts=quantize_experts,
                           attention=quantize_attention, embedding=quantize_embedding,
                           lm_head=quantize_lm_head)
    for k in (Kind.XWQ, Kind.XWK, Kind.XWV, Kind.XWO):  # cross-attention follows attention
        dtypes[k] = dtypes[Kind.WQ]
    ex = ed.EncDecExporter(model_dir, model=model,
                           tokenizer=None if isinstance(tokenizer, bool) else tokenizer,
                           include_tokenizer=tokenizer is not False, max_seq_len=max_seq_len,
                           max_batch=max_batch, dtypes=dtypes, group_size=group_size,
                           byte_order=byte_order, output=output, warn=warn, jobs=jobs,
                           progress=progress)
    if num_experts is not None and num_experts != ex.shape.n_experts:
        raise ConversionError(f"num_experts = {num_experts}, but config.json has num_experts "
                              f"= {ex.shape.n_experts}")
    if top_k not in (None, 1):
        raise ConversionError(f"top_k = {top_k}: Switch Transformers route each token to "
                              "one expert (top-1)")
    return ex


def _some(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# --- the importance matrix of a checkpoint (`colibri imatrix`, --calibration) ---

# Calibration defaults: tokens read from the text and the window length cap.
DEFAULT_TOKENS = 32768
MAX_WINDOW = 512


def _calibration_text(path) -> bytes:
    """The bytes of a calibration text file (`--calibration`, `--text`)."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConversionError(f"cannot read {path}: {exc.strerror or exc}") from None


def imatrix_from_checkpoint(model_dir, text: bytes, max_tokens: int = DEFAULT_TOKENS,
                            progress=None) -> dict[im.Key, tuple[np.ndarray, int]]:
    """The importance matrix of a Hugging Face checkpoint on calibration
    text: converts it to a temporary float32 .colibri file (with its
    tokenizer), tokenises `text`, runs the reference."""
    from .convert import ColibriExporter
    from ..text.tokenizer import Tokenizer
    with tempfile.TemporaryDirectory(prefix="colibri-imatrix-") as tmp:
        path = Path(tmp) / "f32.colibri"
        ex = ColibriExporter(model_dir, quant="f32")
        if ex.tokenizer is None:
            raise ColibriError(f"{model_dir} has no tokenizer.json: an importance matrix "
                               "needs the calibration text tokenised")
        ex.export(path)
        ids = np.asarray(tk.Tokenizer.from_file(path).encode(text), np.int64)
        window = min(ex.shape.max_seq_len, MAX_WINDOW)
        wins = im.token_windows(ids, window, max_tokens)
        if not wins:
            raise ColibriError("the calibration text is empty")
        if progress:
            progress(f"{sum(len(w) for w in wins)} calibration tokens in {len(wins)} windows "
                     f"of {window}")
        return im.collect(path, wins)


# --- command line ----------------------------------------------------------

# Checkpoints at least this big print one progress line per layer.
PROGRESS_BYTES = 64 * 1024 * 1024


def add_parser(subparsers) -> None:
    """`colibri convert` and `colibri imatrix` (which converts first)."""
    add_convert_parser(subparsers)
    add_imatrix_parser(subparsers)


def add_convert_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "convert", help="convert a Hugging Face MoE checkpoint or a GGUF file to .colibri",
        description="Convert a Hugging Face MoE checkpoint directory (Mixtral, Qwen2-MoE, "
                    "Qwen3-MoE, OLMoE, GraniteMoE, GraniteMoeShared, Switch Transformers; "
                    "config.json + "
                    "safetensors, single or sharded, bf16/f16/f32), or a llama.cpp GGUF file "
                    "of those decoder families (architectures llama with experts, qwen2moe, "
                    "qwen3moe, olmoe, granitemoe), to a .colibri file.")
    p.add_argument("model_dir", metavar="HF_DIR|FILE.gguf",
                   help="checkpoint directory or GGUF file")
    p.add_argument("-o", "--output", required=True, metavar="OUT.colibri")
    p.add_argument("--quant", choices=tuple(PRESETS), default=None,
                   help="preset: int8 = router int16, experts/attention int8, embedding "
                        "int16, lm_head int8; q4 = the 4-bit mix (docs/FORMAT.md 4: "
                        "experts Q4_K, embedding Q6_K, LM head Q5_K, attention Q6_K, a tied "
                        "embedding Q6_K; rows not a multiple of 256 wide Q5_0 / int8); "
                        "f32 = exact "
                        "(default: int8 for a checkpoint; for a GGUF file, keep its own "
                        "types: F32/F16/BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K without a second "
                        "rounding, other types requantised with the measured error printed)")
    for option in QUANT_CHOICES:
        p.add_argument("--" + option.replace("_", "-"), dest=option,
                       choices=tuple(QUANT_CHOICES[option][0]), help="override the preset")
    p.add_argument("--group-size", type=int, default=32,
                   help="int8 group length along a row (default: %(default)s)")
    p.add_argument("--max-seq-len", type=int,
                   help="KV-cache length (default: max_position_embeddings, at most "
                        f"{DEFAULT_MAX_SEQ_CAP} and at most sliding_window)")
    p.add_argument("--max-batch", type=int, default=1,
                   help="sequences per batch the runtime allocates (default: %(default)s)")
    p.add_argument("--num-experts", type=int,
                   help="expected expert count, checked against num_local_experts")
    p.add_argument("--top-k", type=int,
                   help="experts per token (default: config num_experts_per_tok)")
    p.add_argument("--expert-map", metavar="SRC=DST,...",
                   help="checkpoint expert-weight names -> Mixtral names, e.g. wi=w1,wo=w2")
    p.add_argument("--byte-order", choices=("little", "big"), default="little",
                   help="byte order of the file (big for PowerPC; default: %(default)s)")
    p.add_argument("--no-tokenizer", action="store_true",
                   help="leave the checkpoint's tokenizer.json out of the file")
    calib = p.add_mutually_exclusive_group()
    calib.add_argument("--calibration", metavar="TEXT_FILE",
                       help="calibration text: run the float32 model over it first and "
                            "weight the 4-bit quantisers' error per input column by the "
                            "mean squared activation there (llama.cpp's imatrix; only the "
                            "block types Q4_0/Q5_0/Q4_K/Q5_K/Q6_K use it). Text like what the model "
                            "will see, not the text you evaluate it on")
    calib.add_argument("--imatrix", metavar="FILE.npz",
                       help="the same from a file `colibri imatrix HF_DIR --text TEXT_FILE "
                            "-o FILE.npz` wrote (measure once, convert many times)")
    p.add_argument("--calibration-tokens", type=int, metavar="N",
                   help="tokens of --calibration to use (a positive number; default: 32768)")
    p.add_argument("-j", "--jobs", type=int, default=default_jobs(), metavar="N",
                   help="worker processes for the 4-bit searches of large tensors, from a "
                        "checkpoint (decoder-only or encoder-decoder) or a GGUF file (the "
                        "same file for any N; default: the %(default)s cores this process "
                        "may use)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    start = time.monotonic()
    if args.jobs < 1:
        raise ConversionError(f"--jobs {args.jobs}: give 1 or more worker processes")

    def progress(line: str) -> None:
        print(f"colibri convert: {line}", file=sys.stderr, flush=True)

    if gguf_in.is_gguf(args.model_dir):
        return _run_gguf(args, start, progress)
    if gguf_in.named_gguf(args.model_dir):
        gguf_in.refuse_not_gguf(args.model_dir)   # not checkpoint advice for x.gguf
    if args.quant is None:
        args.quant = "int8"
    _check_calibration(args)

    imatrix = args.imatrix
    if args.calibration:
        text = _calibration_text(args.calibration)
        imatrix = imatrix_from_checkpoint(args.model_dir, text,
                                          args.calibration_tokens or DEFAULT_TOKENS,
                                          progress=None if args.quiet else progress)
    exporter = ColibriExporter(
        args.model_dir, num_experts=args.num_experts, top_k=args.top_k,
        max_seq_len=args.max_seq_len, max_batch=args.max_batch, quant=args.quant,
        quantize_router=args.router, quantize_experts=args.experts,
        quantize_attention=args.attention, quantize_embedding=args.embedding,
        quantize_lm_head=args.lm_head, group_size=args.group_size,
        byte_order=args.byte_order, output=args.output, tokenizer=not args.no_tokenizer,
        imatrix=imatrix, jobs=args.jobs)
    if args.expert_map:
        exporter.set_expert_weight_mapping(parse_expert_map(args.expert_map))
    if not args.quiet and exporter.checkpoint.nbytes() >= PROGRESS_BYTES:
        exporter.progress = progress
    out = exporter.export()
    for note in exporter.notes:
        progress(note)
    size = out.stat().st_size
    print(f"wrote {out}: {size} bytes ({size / 2**20:.1f} MiB), "
          f"{written_tensors(out)} tensors, "
          f"{'a tokenizer, ' if exporter.tokenizer is not None else ''}"
          f"{time.monotonic() - start:.1f} s")
    if exporter.tokenizer is not None and exporter.tokenizer.what:
        print(f"tokenizer: {exporter.tokenizer.what}")
    return 0


def _check_calibration(args: argparse.Namespace) -> None:
    """Refuse calibration options that would be ignored: a token count that
    is not positive (0 used to mean "all the text"), one without the text,
    and an importance matrix when no kind gets a block type (only the
    Q4_0/Q5_0/Q4_K/Q5_K/Q6_K quantisers use it). A per-kind option can give
    a block type under any preset, so the types are the ones the options
    resolve to. Checked before the float32 conversion calibration runs."""
    n = args.calibration_tokens
    if n is not None and n < 1:
        raise ConversionError(f"--calibration-tokens {n}: give a positive number of tokens "
                              f"(default {DEFAULT_TOKENS})")
    if n is not None and not args.calibration:
        raise ConversionError("--calibration-tokens is how much of --calibration's text to "
                              "use: give --calibration TEXT_FILE too")
    flag = "--calibration" if args.calibration else "--imatrix" if args.imatrix else None
    if flag is None:
        return
    dtypes = preset_dtypes(args.quant, router=args.router, experts=args.experts,
                           attention=args.attention, embedding=args.embedding,
                           lm_head=args.lm_head)
    # a tied embedding takes the preset's tied type (TIED_TYPE: Q6_K for q4)
    types = [*dtypes.values(), fmt.TIED_TYPE[args.quant]]
    if not any(blocks.is_block(dt) for dt in types):
        raise ConversionError(
            f"{flag} weights the error of the 4-bit block types (Q4_0, Q5_0, Q4_K, Q5_K, "
            f"Q6_K), and --quant {args.quant} with these options stores no tensor in one: drop "
            f"{flag}, or use --quant q4 or a per-kind block type (e.g. --experts q4_k)")


def written_tensors(path) -> int:
    """The tensors a finished file holds: read back from its table, since
    the writer leaves DESC out of a version 1 file (format.ColibriWriter),
    so the plan's tensor_order can count one more than was written."""
    cf = fmt.read_file(path, check_crc=False)
    try:
        return sum(1 for e in cf.entries if e.kind in Kind._value2member_map_)
    finally:
        cf.close()


def _run_gguf(args: argparse.Namespace, start: float, progress) -> int:
    """`colibri convert FILE.gguf` (colibri/model/convert_gguf.py)."""
    for flag, value in (("--expert-map", args.expert_map), ("--calibration", args.calibration),
                        ("--imatrix", args.imatrix),
                        ("--calibration-tokens", args.calibration_tokens is not None)):
        if value:
            raise ConversionError(f"{flag} is for Hugging Face checkpoints; a GGUF file's "
                                  "tensors are named by llama.cpp and already quantised")
    exporter = GGUFExporter(
        args.model_dir, quant=args.quant, quantize_router=args.router,
        quantize_experts=args.experts, quantize_attention=args.attention,
        quantize_embedding=args.embedding, quantize_lm_head=args.lm_head,
        num_experts=args.num_experts, top_k=args.top_k, max_seq_len=args.max_seq_len,
        max_batch=args.max_batch, group_size=args.group_size, byte_order=args.byte_order,
        output=args.output, tokenizer=not args.no_tokenizer, jobs=args.jobs)
    if not args.quiet and Path(args.model_dir).stat().st_size >= PROGRESS_BYTES:
        exporter.progress = progress
    out = exporter.export()
    for note in exporter.notes:
        progress(note)
    kept = sum(n for (_, _, how), n in exporter.summary().items() if how == "copy")
    size = out.stat().st_size
    print(f"wrote {out}: {size} bytes ({size / 2**20:.1f} MiB) from {exporter.family.title} "
          f"GGUF, {written_tensors(out)} tensors "
          f"({kept} of {len(exporter.steps)} with the GGUF's own values), "
          f"{'a tokenizer, ' if exporter.tokenizer is not None else ''}"
          f"{time.monotonic() - start:.1f} s")
    return 0


def add_imatrix_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "imatrix", help="measure an importance matrix for `convert --imatrix`",
        description="Run a checkpoint (float32, the numpy reference) over calibration text "
                    "and save, per matrix, the mean squared activation of each input column "
                    "(llama.cpp's imatrix idea). `colibri convert --quant q4 --imatrix FILE` "
                    "then stores the columns that matter most more accurately. Use text like "
                    "what the model will see, and not the text you evaluate it on.")
    p.add_argument("model_dir", metavar="HF_DIR", help="checkpoint directory (with tokenizer.json)")
    p.add_argument("--text", required=True, metavar="FILE", help="calibration text (UTF-8)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.npz")
    p.add_argument("--tokens", type=int, default=DEFAULT_TOKENS,
                   help="calibration tokens to use from the start of the text "
                        "(default: %(default)s)")
    p.set_defaults(func=_run_imatrix)


def _run_imatrix(args: argparse.Namespace) -> int:
    start = time.monotonic()
    text = _calibration_text(args.text)
    say = lambda line: print(f"colibri imatrix: {line}", file=sys.stderr, flush=True)
    matrix = imatrix_from_checkpoint(args.model_dir, text, args.tokens, progress=say)
    im.save(args.output, matrix)
    print(f"wrote {args.output}: {len(matrix)} matrices, {time.monotonic() - start:.1f} s")
    return 0
