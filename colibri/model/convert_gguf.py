"""GGUF file -> .colibri file (`colibri convert FILE.gguf`).

colibri/model/gguf_in.py reads and checks the GGUF file and maps every .colibri
tensor to its rows there; this module chooses each tensor's storage type,
streams the tensors into format.ColibriWriter in the file's order (those
quantised to a block type on worker processes with jobs > 1, as a
checkpoint's: colibri/file/encode_pool.py), and reports what it could not
keep exactly.

What `--quant` means for a GGUF input (docs/FORMAT.md, "GGUF files"):
- not given ("keep", the default): every tensor keeps the values it has.
  F32/F16/BF16 -> F32, Q8_0/Q4_0/Q5_0/Q4_K/Q5_K/Q6_K -> the block type of
  that name (the same bytes); where the kind cannot use that type (the router
  is F32 or I16_ROW) -> F32, still exact.
  Other GGUF types (Q5_1, Q3_K, IQ4_XS, ...) are dequantised and stored in
  the smallest Colibri type of at least their bits (Q6_K from 5.5 bits a
  weight, else Q4_K; Q5_0 / I8_GROUP on rows not a multiple of 256): a
  second rounding, reported with its measured error. F64 -> F32 is
  rounded too (narrowed; reported). Types gguf-py cannot dequantise are
  refused when planning (gguf_in.plan).
- f32 | int8 | q4 (and the per-kind options): the preset's type per kind, as
  for a Hugging Face checkpoint. A tensor whose GGUF type already is that
  type is copied exactly; a float tensor is quantised once; a quantised one
  of another type is requantised (reported).
"""
from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

import numpy as np

from . import gguf_in, hf
from .export import (PRESETS, QUANT_CHOICES, dtype_for, output_path, report_layer_written,
                     shape_and_desc, tied_dtype, tokenizer_sections)
from ..errors import ConversionError
from ..file import format as fmt
from ..file import storage
from ..file.encode_pool import EncodePool, InOrder, checked_jobs
from ..file.format import DType, Kind

# How a tensor gets its stored values.
COPY = "copy"              # the same values (exact)
QUANTISE = "quantise"      # float weights rounded once, as from a checkpoint
REQUANTISE = "requantise"  # a quantised GGUF tensor rounded a second time
# F64 -> F32 rounds each value once: never "copy" (which `colibri info`
# prints as "kept exactly"); export() adds a "narrowed" note.
NARROW = "narrow"


def keep_dtype(kind: Kind, t: gguf_in.GTensor) -> tuple[DType, str]:
    """The "keep" choice for one tensor (the module docstring)."""
    allowed = fmt.ALLOWED_DTYPES[kind]
    if t.type_name == "F64":
        return DType.F32, NARROW
    ex = gguf_in.exact_dtype(t.type_name)
    if ex is not None:
        return (ex if ex in allowed else DType.F32), COPY
    bpw = 8.0 * t.block_bytes / t.block
    target = DType.Q6_K if bpw >= 5.5 else DType.Q4_K
    dt = fmt.fit_dtype(target, t.cols, kind)
    if dt not in allowed:
        return DType.F32, COPY   # dequantised into float32: exact
    return dt, REQUANTISE


def target_dtype(kind: Kind, t: gguf_in.GTensor, chosen: DType, group_size: int
                 ) -> tuple[DType, str]:
    """The storage type for a kind's chosen type (a preset or an option)."""
    dt = fmt.fit_dtype(chosen, t.cols, kind)
    ex = gguf_in.exact_dtype(t.type_name)
    # Q8_0's values are I8_GROUP's in groups of 32 (its fp16 scales widened)
    q8_as_int8 = t.type_name == "Q8_0" and dt == DType.I8_GROUP and group_size == 32
    if dt == DType.F32 and t.type_name == "F64":
        return dt, NARROW
    if dt == DType.F32 or dt == ex or q8_as_int8:
        return dt, COPY
    if t.type_name in gguf_in.FLOAT_TYPES:
        return dt, QUANTISE
    return dt, REQUANTISE


class GGUFExporter:
    """Converts one GGUF file of a family colibri runs to .colibri.

        GGUFExporter("olmoe.Q4_K_M.gguf").export("olmoe.colibri")

    `quant` None keeps the file's own types (see the module docstring);
    "f32" / "int8" / "q4" and the quantize_* options choose as for a
    Hugging Face checkpoint. `jobs` > 1 quantises the large tensors that
    get a block type on that many worker processes (the same bytes as 1).
    The constructor reads the metadata and the tensor directory (no
    weights) and plans the whole conversion."""

    def __init__(self, path: str | os.PathLike, quant: str | None = None,
                 quantize_router: str | None = None, quantize_experts: str | None = None,
                 quantize_attention: str | None = None,
                 quantize_embedding: str | None = None,
                 quantize_lm_head: str | None = None, num_experts: int | None = None,
                 top_k: int | None = None, max_seq_len: int | None = None,
                 max_batch: int = 1, group_size: int = 32, byte_order: str = "little",
                 output: str | os.PathLike | None = None, tokenizer: bool = True,
                 progress: Callable[[str], None] | None = None,
                 warn: Callable[[str], None] | None = None, jobs: int = 1):
        self.jobs = checked_jobs(jobs)
        self.path = Path(path)
        self.gguf = gguf_in.GGUFFile(self.path)
        self.family, self.config_dict = gguf_in.config_dict(self.gguf)
        where = f"{self.path} (GGUF metadata)"
        try:
            self.config = hf.config_from_dict(self.config_dict, where)
        except ConversionError as exc:
            raise ConversionError(str(exc).replace("config.json", where)) from None
        if byte_order not in ("little", "big"):
            raise ConversionError(f"byte_order = {byte_order!r}: choose little or big")
        self.byte_order = byte_order
        self.output = output
        self.progress = progress
        self.shape, self.desc = shape_and_desc(self.config, num_experts, top_k, max_seq_len,
                                               max_batch, group_size)
        if quant is not None and quant not in PRESETS:
            raise ConversionError(f"quant = {quant!r}: choose f32, int8 or q4 (or none: keep "
                                  "the GGUF file's types)")
        self.preset = None if quant is None else dict(PRESETS[quant])
        self.overrides: dict[Kind, DType] = {}
        for option, value in dict(router=quantize_router, experts=quantize_experts,
                                  attention=quantize_attention, embedding=quantize_embedding,
                                  lm_head=quantize_lm_head).items():
            if value is not None:
                for kind in QUANT_CHOICES[option][1]:
                    self.overrides[kind] = dtype_for(option, value)
        if self.desc.has(fmt.Feat.TIED_LM_HEAD):
            # the one matrix gets the preset's tied type (export.tied_dtype)
            if self.preset is not None:
                self.preset[Kind.EMBED] = tied_dtype(quant, self.preset, quantize_embedding,
                                                     quantize_lm_head)
            if Kind.LM_HEAD in self.overrides:
                self.overrides[Kind.EMBED] = self.overrides[Kind.LM_HEAD]
        self.steps = gguf_in.plan(self.gguf, self.family, self.shape, self.desc)
        self.choices = [self.choose(st) for st in self.steps]
        self.tokenizer = self._tokenizer(warn) if tokenizer else None
        self.notes: list[str] = []

    # --- storage types ---------------------------------------------------------

    def chosen(self, kind: Kind) -> DType | None:
        """The type the options give a kind; None: keep the GGUF's."""
        chosen = self.overrides.get(kind)
        if chosen is None and self.preset is not None:
            chosen = self.preset[kind]
        return chosen

    def choose(self, st: gguf_in.GStep) -> tuple[DType, str]:
        t, gs = st.source.tensor, self.shape.group_size
        chosen = self.chosen(st.kind)
        if chosen is None:
            return keep_dtype(st.kind, t)
        return target_dtype(st.kind, t, chosen, gs)

    def _tokenizer(self, warn):
        from ..text import gguf_tokenizer as gt
        from ..text import tokenizer as tk
        try:
            spec = gt.spec_from_gguf(self.gguf)
        except tk.UnsupportedTokenizer as exc:
            (warn or _warn)(f"warning: {self.path}: {exc}: converting without a tokenizer "
                            "(the model takes token ids)")
            return None
        except tk.TokenizerError as exc:
            raise ConversionError(f"{self.path}: {exc} (or convert with --no-tokenizer)") \
                from None
        if spec is not None and len(spec.pieces) > self.shape.vocab:
            raise ConversionError(
                f"{self.path}: the tokenizer has {len(spec.pieces)} token ids, the model's "
                f"vocabulary only {self.shape.vocab} (or convert with --no-tokenizer)")
        return spec

    # --- export ------------------------------------------------------------------

    def read(self, st: gguf_in.GStep, dt: DType, how: str):
        """One step's source: ("encoded", (values, scales)) for a block
        copied as it is, else ("float", weights [rows, cols] float32) to be
        encoded as `dt`."""
        src = st.source
        t = src.tensor
        raw = self.gguf.read_rows(t, src.first, src.count)
        if how == COPY and dt != DType.F32:
            got, values, scales = gguf_in.to_exact(raw, t, src.count, dt)
            assert got == dt, (got, dt)
            fields = [scales] if scales is not None else [values[f] for f in ("d", "dmin")
                                                          if f in values.dtype.names]
            if not all(np.all(np.isfinite(f)) for f in fields):
                raise ConversionError(f"{self.path}: tensor {t.name!r} has NaN or infinite "
                                      "block scales; the file is corrupt")
            return "encoded", (values, scales)
        w = gguf_in.to_float(raw, t, src.count)
        if not np.all(np.isfinite(w)):
            raise ConversionError(f"{self.path}: tensor {t.name!r} holds NaN or infinity")
        return "float", w

    def stored(self, st: gguf_in.GStep, values: np.ndarray, scales):
        """(values, scales) as the writer takes them: the rows llama.cpp's
        converter permuted for its RoPE (Q and K) put back."""
        src = st.source
        if src.heads is not None:
            n = values.shape[1] if st.kind in (Kind.BQ, Kind.BK) else values.shape[0]
            perm = gguf_in.unpermute_rows(n, src.heads)
            if st.kind in (Kind.BQ, Kind.BK):
                values = values[:, perm]
            else:
                values = values[perm]
                scales = scales[perm] if scales is not None else None
        return np.ascontiguousarray(values), scales

    def export(self, output: str | os.PathLike | None = None) -> Path:
        """Write the .colibri file; returns its path (written as OUT.partial,
        renamed when complete). With self.jobs > 1 the tensors quantised
        to block types are encoded on that many worker processes
        (colibri/file/encode_pool.py), the same bytes as with one."""
        out = output_path(output if output is not None else self.output)
        start = time.monotonic()
        errors: dict = defaultdict(list)
        narrowed = 0

        def write(item, encoded) -> None:
            i, st, dt, how, w_src = item
            values, scales = encoded
            if how == REQUANTISE:   # the second rounding's error, against the GGUF values
                back = storage.decode(values, scales, dt, self.shape.group_size,
                                      st.source.tensor.cols)
                norm = float(np.linalg.norm(w_src))
                err = float(np.linalg.norm(back - w_src)) / norm if norm else 0.0
                errors[(st.source.tensor.type_name, dt.name)].append(err)
            w.add_encoded(st.kind, st.layer, st.expert, dt, *self.stored(st, values, scales))
            report_layer_written(self.progress, self.steps, i, self.shape.n_layers, start)

        try:
            optional = tokenizer_sections(self.tokenizer, self.byte_order)
            with fmt.ColibriWriter(out, self.shape, fmt.PRESET_F32, self.byte_order,
                                   self.desc, optional_sections=optional) as w, \
                    EncodePool(self.jobs) as pool:
                order = InOrder(pool, write, name=lambda item: item[1].source.tensor.name)
                for i, (st, (dt, how)) in enumerate(zip(self.steps, self.choices)):
                    narrowed += st.source.tensor.type_name == "F64" and dt == DType.F32
                    what, data = self.read(st, dt, how)
                    if what == "encoded":
                        order.encoded((i, st, dt, how, None), *data)
                    else:
                        # a requantised tensor's float values stay for its error
                        keep = data if how == REQUANTISE else None
                        order.submit((i, st, dt, how, keep), data, dt, self.shape.group_size)
                    del data
                order.finish()
        except OSError as exc:
            raise ConversionError(f"cannot write {out}: {exc.strerror or exc}") from exc
        self.notes = [requantised_note(errors)] if errors else []
        if narrowed:
            self.notes.append(narrowed_note(narrowed))
        return out

    def summary(self) -> dict[tuple[str, str, str], int]:
        """{(GGUF type, stored type, how): tensor count} over the plan
        (an expert counts once per expert)."""
        out: dict = defaultdict(int)
        for st, (dt, how) in zip(self.steps, self.choices):
            out[(st.source.tensor.type_name, dt.name, how)] += 1
        return dict(out)


def requantised_note(errors: dict) -> str:
    """One line: what was rounded a second time and the measured error
    (relative RMS over each tensor, against the GGUF's own values)."""
    parts = []
    for (src, dst), errs in sorted(errors.items()):
        parts.append(f"{len(errs)} {src} -> {dst} (relative RMS error mean "
                     f"{np.mean(errs):.4f}, max {max(errs):.4f})")
    return "requantised " + "; ".join(parts) + ": a second rounding of the GGUF values"


def narrowed_note(n: int) -> str:
    """One line: F64 tensors stored as float32 are rounded, not kept."""
    return (f"narrowed {n} F64 tensor(s) to F32: each value rounded to float32 (relative "
            "error at most 6e-8 for a normal float32), not the GGUF's own values")


def _warn(line: str) -> None:
    print(f"colibri convert: {line}", file=sys.stderr, flush=True)
