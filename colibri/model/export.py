"""What every exporter shares (the Hugging Face one, colibri/model/convert.py;
the encoder-decoder one, convert_encdec.py; the GGUF one, convert_gguf.py):
the `--quant` presets and the per-kind storage-type options, the header's
shape from a config, the output file's check, the optional tokenizer
section and the per-layer progress line.

Imports: errors, file.format, model.hf (the config it reads), text.tokenizer.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from . import hf
from ..errors import ColibriError, ConversionError
from ..file import format as fmt
from ..file.format import DType, Kind
from ..text import tokenizer as tk

# Default KV-cache length when --max-seq-len is not given: the model's
# max_position_embeddings, capped here (a 32k-token cache of Mixtral 8x7B is
# 4 GiB of float32 KV per sequence, too much for the devices colibri targets)
# and by the sliding window (beyond it Mixtral's attention differs from ours).
DEFAULT_MAX_SEQ_CAP = 4096

# User-facing storage-type names per option -> DType. Norms are always F32.
BLOCK_CHOICES = {"q4_0": DType.Q4_0, "q5_0": DType.Q5_0, "q4_k": DType.Q4_K,
                 "q5_k": DType.Q5_K, "q6_k": DType.Q6_K, "q8_0": DType.Q8_0}
QUANT_CHOICES = {
    "router": ({"f32": DType.F32, "int16": DType.I16_ROW}, (Kind.ROUTER,)),
    "experts": ({"f32": DType.F32, "int8": DType.I8_GROUP, **BLOCK_CHOICES},
                (*fmt.EXPERT_KINDS, *fmt.SHARED_KINDS, *fmt.DENSE_KINDS)),
    "attention": ({"f32": DType.F32, "int8": DType.I8_GROUP, **BLOCK_CHOICES},
                  (Kind.WQ, Kind.WK, Kind.WV, Kind.WO)),
    "embedding": ({"f32": DType.F32, "int16": DType.I16_ROW, **BLOCK_CHOICES},
                  (Kind.EMBED,)),
    "lm_head": ({"f32": DType.F32, "int8": DType.I8_GROUP, **BLOCK_CHOICES},
                (Kind.LM_HEAD,)),
}
PRESETS = {"f32": fmt.PRESET_F32, "int8": fmt.PRESET_INT8, "q4": fmt.PRESET_Q4}


def dtype_for(option: str, value: str) -> DType:
    """The storage type option `option` (router, experts, ...) names `value`."""
    choices, _ = QUANT_CHOICES[option]
    if value not in choices:
        raise ConversionError(f"quantize_{option} = {value!r}: choose one of "
                              f"{', '.join(choices)}")
    return choices[value]


def preset_dtypes(quant: str, **overrides: str | None) -> dict[Kind, DType]:
    """The storage type of each kind: the `quant` preset (f32, int8, q4) with
    the per-option overrides (router=..., experts=...: QUANT_CHOICES's
    names) applied."""
    if quant not in PRESETS:
        raise ConversionError(f"quant = {quant!r}: choose f32, int8 or q4")
    dtypes = dict(PRESETS[quant])
    for option, value in overrides.items():
        if value is not None:
            for kind in QUANT_CHOICES[option][1]:
                dtypes[kind] = dtype_for(option, value)
    return dtypes


def tied_dtype(quant: str, dtypes: dict[Kind, DType], embedding: str | None,
               lm_head: str | None) -> DType:
    """The storage type of a tied embedding (TIED_LM_HEAD) in `dtypes`
    (preset_dtypes(quant, ...)): the --lm-head choice, else the --embedding
    choice, else the preset's type for a tied matrix (format.TIED_TYPE: the
    LM head's use is the sensitive one)."""
    if lm_head is not None:
        return dtypes[Kind.LM_HEAD]
    if embedding is not None:
        return dtypes[Kind.EMBED]
    return fmt.TIED_TYPE[quant]


def tied_note(embedding: str | None, lm_head: str | None) -> list[str]:
    """The note for a tied model given both --embedding and --lm-head that
    differ (tied_dtype: the LM head's choice wins; one command line may
    serve tied and untied models, so it is not an error)."""
    if embedding is None or lm_head is None or embedding == lm_head:
        return []
    return [f"note: the model ties its embedding and LM head (one matrix): stored as "
            f"--lm-head {lm_head} (its use as the LM head is the sensitive one); "
            f"--embedding {embedding} does not apply"]


def output_path(out) -> Path:
    """The output file an export writes, checked before any work: given, not
    a directory, in a directory that exists, and not an existing file other
    than a .colibri one (or an empty one): `-o model.gguf` or `-o
    model.safetensors` would otherwise replace the model being converted,
    a mistake that costs the download."""
    if out is None or str(out) == "":
        raise ConversionError("no output file: pass output= or -o OUT.colibri")
    out = Path(out)
    if out.is_dir():
        raise ConversionError(f"output {out} is a directory: give a file name, "
                              f"e.g. -o {out / 'model.colibri'}")
    if not out.parent.is_dir():
        raise ConversionError(f"output directory {out.parent} does not exist")
    if out.exists() and not _replaceable(out):
        raise ConversionError(f"output {out} exists and is not a .colibri file: colibri "
                              f"replaces only its own files; choose another name or "
                              f"remove it first")
    return out


def _replaceable(path: Path) -> bool:
    """An existing output an export may replace: empty, or a .colibri file
    (its magic: a damaged or partial one too)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(fmt.MAGIC))
    except OSError:
        return True  # the writer's own open reports what is wrong
    return head in (b"", fmt.MAGIC)


def report_layer_written(progress, steps, i: int, n_layers: int, start: float) -> None:
    """After writing steps[i] (a plan's tensors, each with a .layer: None for
    model-wide ones): "layer L/N written (T s)" through progress, when that
    was the layer's last tensor. start: the export's time.monotonic()."""
    layer = steps[i].layer
    if progress and layer is not None and (i + 1 == len(steps) or steps[i + 1].layer != layer):
        progress(f"layer {layer + 1}/{n_layers} written ({time.monotonic() - start:.1f} s)")


def tokenizer_sections(spec, byte_order: str) -> list:
    """The optional sections of an export: the tokenizer, packed in the
    file's byte order, when there is one."""
    if spec is None:
        return []
    return [(tk.KIND_TOKENIZER, tk.pack_section(spec, byte_order))]


def shape_and_desc(c: hf.HFConfig, num_experts, top_k, max_seq_len, max_batch: int,
                   group_size: int) -> tuple[fmt.ModelShape, fmt.Description | None]:
    """The header's shape and the resolved description of converting config
    `c` with these options (None: the checkpoint's own / colibri's
    default); the writer stores Description.default(shape), Mixtral's
    computation, as a version 1 file. Raises ConversionError."""
    if num_experts is not None and num_experts != c.n_experts:
        raise ConversionError(
            f"num_experts = {num_experts}, but config.json has num_local_experts = "
            f"{c.n_experts} (the routers have {c.n_experts} rows): colibri converts "
            f"every expert; omit --num-experts or pass {c.n_experts}")
    if top_k is None:
        top_k = c.top_k
        if top_k > c.n_experts:
            raise ConversionError(
                f"config.json: num_experts_per_tok = {top_k} exceeds num_local_experts "
                f"= {c.n_experts}")
    elif not 1 <= top_k <= c.n_experts:
        raise ConversionError(f"top_k = {top_k} must be between 1 and the number of "
                              f"experts, {c.n_experts}")
    limit = min(c.max_position_embeddings, DEFAULT_MAX_SEQ_CAP)
    if c.sliding_window is not None:
        limit = min(limit, c.sliding_window)
    if max_seq_len is None:
        max_seq_len = limit
    elif max_seq_len < 1:
        raise ConversionError(f"max_seq_len = {max_seq_len} must be at least 1")
    elif c.sliding_window is not None and max_seq_len > c.sliding_window:
        raise ConversionError(
            f"max_seq_len = {max_seq_len} exceeds the model's sliding_window = "
            f"{c.sliding_window}; colibri's attention has no sliding window, so pass "
            f"--max-seq-len {c.sliding_window} or less")
    if not 1 <= max_batch <= fmt.U16_MAX:
        raise ConversionError(f"max_batch = {max_batch} must be between 1 and {fmt.U16_MAX}")
    if not 1 <= group_size <= fmt.U16_MAX:
        raise ConversionError(f"group_size = {group_size} must be between 1 and "
                              f"{fmt.U16_MAX}")
    shape = fmt.ModelShape(
        vocab=c.vocab, hidden=c.hidden, intermediate=c.intermediate,
        max_seq_len=max_seq_len, n_layers=c.n_layers, n_heads=c.n_heads,
        n_kv_heads=c.n_kv_heads, head_dim=c.head_dim, n_experts=c.n_experts,
        top_k=top_k, max_batch=max_batch, group_size=group_size,
        rope_theta=c.rope_theta, rms_eps=c.rms_eps)
    try:
        shape.validate()
        desc = c.desc or fmt.Description()
        if c.tie_word_embeddings:
            # One matrix for the embedding and the LM head (FORMAT.md 2,
            # TIED_LM_HEAD): vocab x hidden weights not stored twice.
            desc = dataclasses.replace(desc, features=desc.features | fmt.Feat.TIED_LM_HEAD)
        desc.validate(shape)
    except ColibriError as exc:
        raise ConversionError(f"this model does not fit the .colibri header: {exc}") from exc
    # None: Mixtral's computation, a version 1 file.
    return shape, desc.resolved(shape)
