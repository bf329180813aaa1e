"""Reading llama.cpp GGUF files: `colibri convert FILE.gguf` and `colibri info FILE.gguf`.

The header is parsed here (GGUFFile; gguf-py's GGUFReader is its judge in
the tests, the pinned `gguf` package gives the type sizes and dequantises
the types Colibri does not store); everything it says is checked before
use, and any failure of a truncated or hostile file is one ConversionError. Weights are then read
tensor by tensor (one expert's rows of a merged [E, rows, cols] tensor at a
time) straight from the file, as colibri.model.hf does for safetensors: peak memory
follows the largest expert matrix, not the model.

What llama.cpp's convert_hf_to_gguf.py did to a checkpoint, undone here:
- names and metadata keys: each family module (colibri/model/families/) says how its
  GGUF files name what config.json says (`Family.gguf`); the tensors are
  GGUF_LAYER_TENSORS / GGUF_GLOBAL_TENSORS;
- the rows of Q and K (and their biases) permuted for llama.cpp's
  interleaved RoPE (`llama`, `granitemoe`: LlamaModel.permute) -- a row
  permutation, so it is undone on encoded rows too and stays exact;
- routed experts merged into one 3-D tensor per matrix: expert e is rows
  [e*R, (e+1)*R) of its [E*R, cols] view;
- a tied output layer: no output.weight, the LM head is token_embd.

Storage types (docs/FORMAT.md 4): F32, F16, BF16 widen to float32 exactly
(F64 is narrowed to float32: rounded, reported);
Q8_0 is I8_GROUP with group_size 32 value for value (fp16 scale widened);
Q4_0, Q5_0, Q4_K, Q5_K, Q6_K are Colibri's block types of the same names, byte for
byte (their blocks are copied). Where the
chosen storage type of a tensor is the one its GGUF type maps to (or
float32), its values are copied without a second rounding. Anything else
(other GGUF types, or another --quant target) is dequantised by gguf-py and
requantised, and the converter prints the measured error of that step. A
type gguf-py cannot dequantise (Q8_1, Q8_K, I8, ...) is refused when the
conversion is planned, before anything is written.
"""
from __future__ import annotations

import functools
import math
import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import families
from .families.common import (GGUF_COMMON_CONFIG, GGUF_GLOBAL_TENSORS, GGUF_LAYER_TENSORS,
                              Family)
from ..errors import ConversionError
from ..file import blocks
from ..file import format as fmt
from ..file.format import DType, Kind

GGUF_MAGIC = b"GGUF"
# The header (metadata and tensor directory) is read whole; a real one is a
# few MB (a 256k vocabulary with its merges is about 10 MB).
HEADER_LIMIT = 256 << 20


def _gguf():
    import gguf  # the pinned gguf-py (pyproject)
    return gguf


# What a Git LFS pointer file starts with (a clone without `git lfs pull`).
LFS_POINTER = b"version https://git-lfs"
# The advice for a GGUF colibri cannot read as it is.
REQUANTISE_ADVICE = ("requantise it with llama-quantize to Q8_0 or Q4_K_M, or convert from the "
                     "Hugging Face checkpoint")
RECONVERT_ADVICE = "convert the model again with a current llama.cpp convert_hf_to_gguf.py"


def named_gguf(path: str | os.PathLike) -> bool:
    """A path named *.gguf that is not a directory: the user means a GGUF
    file, so a missing or broken one gets GGUF advice, not checkpoint advice."""
    p = Path(path)
    return p.suffix.lower() == ".gguf" and not p.is_dir()


def refuse_not_gguf(path: str | os.PathLike) -> None:
    """Raise the one-line reason a path named *.gguf is not a GGUF file
    colibri can open (missing, empty, a Git LFS pointer, no magic)."""
    p = Path(path)
    if not p.exists():
        raise ConversionError(f"{p} does not exist: check the path")
    try:
        with open(p, "rb") as f:
            head = f.read(len(LFS_POINTER))
    except OSError as exc:
        raise ConversionError(f"cannot read {p}: {exc.strerror or exc}") from None
    raise ConversionError(not_gguf_message(p, head))


def not_gguf_message(path: Path, head: bytes) -> str:
    """Why a file whose first bytes are `head` is not a GGUF file, and what to do."""
    if not head:
        return f"{path} is empty (0 bytes): an incomplete download? download it again"
    if head.startswith(LFS_POINTER):
        return (f"{path} is a Git LFS pointer, not the GGUF data: fetch the file with "
                "`git lfs pull` (or download it directly)")
    return (f"{path} is not a GGUF file (no GGUF magic: a Git LFS pointer or an incomplete "
            "download?): download it again")


def is_gguf(path: str | os.PathLike) -> bool:
    """A regular file starting with the GGUF magic."""
    p = Path(path)
    if not p.is_file():
        return False
    try:
        with open(p, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


# GGML types colibri stores without a second rounding -> the storage type.
# F64 is not one: float32 rounds it (convert_gguf narrows it, and says so).
def exact_dtype(ggml_name: str) -> DType | None:
    return {"F32": DType.F32, "F16": DType.F32, "BF16": DType.F32,
            "Q8_0": DType.Q8_0, "Q4_0": DType.Q4_0, "Q5_0": DType.Q5_0, "Q4_K": DType.Q4_K,
            "Q5_K": DType.Q5_K,
            "Q6_K": DType.Q6_K}.get(ggml_name)


FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


@functools.lru_cache(maxsize=None)
def dequantisable(ggml_name: str) -> bool:
    """Whether to_float can read this GGML type: a float type, or one the
    pinned gguf-py dequantises. Asked of gguf.quants.dequantize itself (one
    zero block) rather than of its private registry, so a gguf-py that
    learns a type is believed and one that forgets it is not."""
    if ggml_name in FLOAT_TYPES:
        return True
    gguf = _gguf()
    qt = gguf.GGMLQuantizationType[ggml_name]
    try:
        gguf.quants.dequantize(np.zeros((1, gguf.GGML_QUANT_SIZES[qt][1]), np.uint8), qt)
    except NotImplementedError:
        return False
    return True


@dataclass(frozen=True)
class GTensor:
    """One GGUF tensor: numpy shape (GGUF's ne reversed), type, and where its
    bytes are. As 2-D it is [rows, cols] with cols = ne0 (one row for 1-D)."""
    name: str
    type_name: str
    type_id: int
    shape: tuple[int, ...]
    start: int
    nbytes: int
    block: int          # elements per block (1 for plain types)
    block_bytes: int

    @property
    def cols(self) -> int:
        return self.shape[-1]

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def row_bytes(self) -> int:
        return self.cols // self.block * self.block_bytes


# GGUF metadata value types (gguf-py GGUFValueType): numpy dtype of the
# fixed-size ones; 8 is a string, 9 an array.
_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
            10: "<u8", 11: "<i8", 12: "<f8"}
STRING, ARRAY, BOOL = 8, 9, 7
MAX_STRING = 1 << 30


class _Cursor:
    """Reads the GGUF header from bytes, every read checked against the end
    (a count or length past it is a truncated or hostile file)."""

    def __init__(self, buf: memoryview, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def fail(self, what: str):
        raise ConversionError(f"{self.path}: malformed GGUF header: {what} at byte {self.pos}; "
                              "the file is truncated or corrupt: download or copy it again")

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            self.fail(f"{n} bytes needed, {len(self.buf) - self.pos} left")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def u32(self) -> int:
        return int.from_bytes(self.take(4), "little")

    def u64(self) -> int:
        return int.from_bytes(self.take(8), "little")

    def string(self) -> str:
        n = self.u64()
        if n > MAX_STRING:
            self.fail(f"a string of {n} bytes")
        try:
            return str(self.take(n), "utf-8")
        except UnicodeDecodeError:
            self.fail("a string that is not UTF-8")

    def value(self, vtype: int, depth: int = 0):
        if vtype in _SCALARS:
            dt = np.dtype(_SCALARS[vtype])
            v = np.frombuffer(self.take(dt.itemsize), dt)[0].item()
            return bool(v) if vtype == BOOL else v
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY and depth < 2:
            etype, n = self.u32(), self.u64()
            if etype in _SCALARS:
                dt = np.dtype(_SCALARS[etype])
                if n > (len(self.buf) - self.pos) // dt.itemsize:
                    self.fail(f"an array of {n} values past the end")
                arr = np.frombuffer(self.take(n * dt.itemsize), dt)
                return (arr != 0).tolist() if etype == BOOL else arr.tolist()
            if n > (len(self.buf) - self.pos) // 8:
                self.fail(f"an array of {n} values past the end")
            if etype == STRING:
                return self._strings(n)
            return [self.value(etype, depth + 1) for _ in range(n)]
        self.fail(f"unknown value type {vtype}" if vtype != ARRAY else "arrays nested too deep")

    def _strings(self, n: int) -> list[str]:
        buf, pos, end = self.buf, self.pos, len(self.buf)
        out = []
        for _ in range(n):
            if pos + 8 > end:
                self.pos = pos
                self.fail("a string past the end")
            m = int.from_bytes(buf[pos:pos + 8], "little")
            pos += 8
            if m > end - pos:
                self.pos = pos
                self.fail(f"a string of {m} bytes past the end")
            try:
                out.append(str(buf[pos:pos + m], "utf-8"))
            except UnicodeDecodeError:
                self.pos = pos
                self.fail("a string that is not UTF-8")
            pos += m
        self.pos = pos
        return out


class GGUFFile:
    """The metadata and tensor directory of one GGUF file (versions 2 and
    3, little-endian), checked. The header is parsed here rather than by
    gguf-py's GGUFReader, which makes a numpy view per string: 30 s for a
    128k-token vocabulary, against a fraction of a second here. gguf-py
    still gives the type sizes and the dequantisation, and is the judge of
    this parser in tests/test_gguf.py."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        gguf = _gguf()
        if not self.path.exists():
            raise ConversionError(f"{self.path} does not exist: check the path")
        try:
            self.size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                head = f.read(len(LFS_POINTER))
                if not head.startswith(GGUF_MAGIC):
                    raise ConversionError(not_gguf_message(self.path, head))
                # Mapped, not read: only the header's pages are touched.
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise ConversionError(f"cannot read {self.path}: "
                                  f"{getattr(exc, 'strerror', None) or exc}") from None
        view = memoryview(mm)
        try:
            self._parse(view[4:4 + HEADER_LIMIT], gguf)
        finally:
            view.release()
            try:
                mm.close()
            except BufferError:  # a view still referenced by a traceback: the GC closes it
                pass

    def _parse(self, head: memoryview, gguf) -> None:
        cur = _Cursor(head, self.path)
        version = cur.u32()
        if version in (2 << 24, 3 << 24):
            raise ConversionError(f"{self.path}: a big-endian GGUF file; colibri reads "
                                  "little-endian GGUF (convert_hf_to_gguf.py's default): "
                                  "convert the model again without --bigendian")
        if version not in (2, 3):
            raise ConversionError(f"{self.path}: GGUF version {version}; colibri reads "
                                  f"versions 2 and 3: {RECONVERT_ADVICE} (it writes "
                                  "version 3)")
        n_tensors, n_kv = cur.u64(), cur.u64()
        if n_kv > len(head) // 12 or n_tensors > len(head) // 24:
            cur.fail(f"{n_kv} metadata entries and {n_tensors} tensors in a header of at "
                     f"most {len(head)} bytes")
        self.fields: dict = {}
        for _ in range(n_kv):
            key = cur.string()
            vtype = cur.u32()
            if key in self.fields:
                cur.fail(f"metadata key {key!r} twice")
            self.fields[key] = (vtype, cur.value(vtype))
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.u32()
            if not 1 <= n_dims <= 4:
                cur.fail(f"tensor {name!r} with {n_dims} dimensions")
            ne = [cur.u64() for _ in range(n_dims)]
            infos.append((name, ne, cur.u32(), cur.u64()))
        align = self.fields.get("general.alignment", (4, 32))
        if align[0] != 4 or align[1] < 1 or align[1] & (align[1] - 1):
            raise ConversionError(f"{self.path}: general.alignment = {align[1]!r}, not a "
                                  "power of two")
        self.data_start = -(-(4 + cur.pos) // align[1]) * align[1]
        self.tensors: dict[str, GTensor] = {}
        for name, ne, type_id, offset in infos:
            if name in self.tensors:
                raise ConversionError(f"{self.path}: tensor {name!r} listed twice")
            self.tensors[name] = self._tensor(name, ne, type_id, offset, gguf)
        self._check_no_overlap()

    def _tensor(self, name, ne, type_id, offset, gguf) -> GTensor:
        where = f"{self.path}: tensor {name!r}"
        if any(d < 1 or d > 1 << 40 for d in ne):
            raise ConversionError(f"{where}: malformed shape {ne}")
        try:
            qt = gguf.GGMLQuantizationType(type_id)
        except ValueError:
            raise ConversionError(f"{where}: unknown GGML type {type_id}") from None
        if qt not in gguf.GGML_QUANT_SIZES:
            raise ConversionError(f"{where}: GGML type {qt.name} has no known size")
        block, block_bytes = gguf.GGML_QUANT_SIZES[qt]
        if ne[0] % block:
            raise ConversionError(f"{where}: {qt.name} rows of {ne[0]} elements are not whole "
                                  f"blocks of {block}")
        nbytes = math.prod(ne) // block * block_bytes
        start = self.data_start + offset
        if start + nbytes > self.size:
            raise ConversionError(f"{where}: its data (bytes {start}..{start + nbytes}) goes "
                                  f"beyond the end of the file ({self.size} bytes); the file "
                                  "is truncated: download or copy it again")
        return GTensor(name, qt.name, int(qt), tuple(reversed(ne)), start, nbytes, block,
                       block_bytes)

    def _check_no_overlap(self) -> None:
        spans = sorted((t.start, t.start + t.nbytes, t.name) for t in self.tensors.values())
        for (_, e0, n0), (b1, _, n1) in zip(spans, spans[1:]):
            if b1 < e0:
                raise ConversionError(f"{self.path}: the data of tensors {n0!r} and {n1!r} "
                                      "overlap; the file is corrupt: download it again")

    # --- metadata -------------------------------------------------------------

    def value(self, key: str, default=None):
        """A scalar or string metadata value (default when absent)."""
        f = self.fields.get(key)
        if f is None:
            return default
        if f[0] == ARRAY:
            raise ConversionError(f"{self.path}: metadata {key} is an array, expected one "
                                  "value")
        return f[1]

    def array(self, key: str):
        """An array metadata value as a list (None when absent)."""
        f = self.fields.get(key)
        if f is None:
            return None
        if f[0] != ARRAY:
            raise ConversionError(f"{self.path}: metadata {key} is not an array")
        return f[1]

    @property
    def arch(self) -> str:
        a = self.value("general.architecture")
        if not isinstance(a, str):
            raise ConversionError(f"{self.path}: no general.architecture in the metadata")
        return a

    # --- data -----------------------------------------------------------------

    def read_rows(self, t: GTensor, first: int, count: int) -> bytes:
        """The raw bytes of rows [first, first + count) of t's 2-D view."""
        if not 0 <= first <= first + count <= t.rows:
            raise ValueError(f"rows [{first}, {first + count}) outside {t.name}")
        off = t.start + first * t.row_bytes
        n = count * t.row_bytes
        try:
            with open(self.path, "rb") as f:
                data = os.pread(f.fileno(), n, off)
        except OSError as exc:
            raise ConversionError(f"cannot read {t.name!r} from {self.path}: {exc}") from None
        if len(data) != n:
            raise ConversionError(f"{self.path}: tensor {t.name!r} is truncated: download or "
                                  "copy the file again")
        return data


# --- metadata -> the config.json colibri's families read ---------------------

def config_dict(g: GGUFFile) -> tuple[Family, dict]:
    """The family and an equivalent config.json dict (every field the
    family's description reads), from the metadata and the tensor directory."""
    arch = g.arch
    p = arch + "."

    def positive(key):
        v = g.value(p + key)
        return v is not None and not isinstance(v, str) and v > 0

    fam = families.pick_gguf(arch, positive, g.path)
    names = fam.gguf
    if g.value(p + "expert_count") in (None, 0):
        raise ConversionError(f"{g.path}: {arch} without {p}expert_count: a dense model, not a "
                              "Mixture-of-Experts; colibri converts MoE models only")
    cfg: dict = {"architectures": [fam.architectures[0]], "model_type": fam.model_types[0],
                 "hidden_act": "silu"}
    keys = {**GGUF_COMMON_CONFIG, **names.config}
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_experts_per_tok", *(k for k in fam.experts_keys[:1]),
                fam.intermediate_key)
    for hf_key, gkey in keys.items():
        v = g.value(p + gkey)
        if v is None:
            if hf_key in required:
                raise ConversionError(f"{g.path}: metadata {p}{gkey} is missing (the {hf_key} "
                                      f"of {fam.title}); the file is incomplete")
            continue
        if isinstance(v, str):
            raise ConversionError(f"{g.path}: metadata {p}{gkey} = {v!r}, expected a number")
        cfg[hf_key] = v
    cfg.update(names.implied)
    if cfg.get("clip_qkv") == 0:
        cfg.pop("clip_qkv")
    emb = g.tensors.get(GGUF_GLOBAL_TENSORS[Kind.EMBED])
    if emb is None:
        raise ConversionError(f"{g.path}: no token_embd.weight tensor")
    cfg["vocab_size"] = emb.shape[0]
    cfg["tie_word_embeddings"] = GGUF_GLOBAL_TENSORS[Kind.LM_HEAD] not in g.tensors
    biased = "blk.0." + GGUF_LAYER_TENSORS[Kind.BQ] in g.tensors
    cfg["qkv_bias"] = cfg["attention_bias"] = biased
    cfg.setdefault("mlp_only_layers", [])
    _refuse_rope(g, p, cfg)
    return fam, cfg


# Per-frequency RoPE factors: llama.cpp's converter writes them for a
# checkpoint with rope_type "llama3" (LlamaModel.generate_extra_tensors).
ROPE_FREQS = "rope_freqs.weight"
PLAIN_ROPE_ONLY = ("colibri implements plain RoPE ('default') only: this model needs "
                   "llama.cpp, or a checkpoint without RoPE scaling")


def _refuse_rope(g: GGUFFile, p: str, cfg: dict) -> None:
    """Colibri's RoPE is plain, over the whole head."""
    scaling = g.value(p + "rope.scaling.type")
    if scaling not in (None, "none"):
        raise ConversionError(f"{g.path}: RoPE scaling {scaling!r}; {PLAIN_ROPE_ONLY}")
    _refuse_rope_freqs(g)
    heads = cfg.get("num_attention_heads") or 1
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    dims = g.value(p + "rope.dimension_count")
    if dims is not None and dims != head_dim:
        raise ConversionError(f"{g.path}: RoPE over {dims} of {head_dim} dimensions per head; "
                              "colibri rotates whole heads")
    vdim = g.value(p + "attention.value_length")
    if vdim is not None and vdim != head_dim:
        raise ConversionError(f"{g.path}: value heads of {vdim} dimensions, key heads of "
                              f"{head_dim}; colibri needs them equal")


def _refuse_rope_freqs(g: GGUFFile) -> None:
    """rope_freqs.weight divides RoPE's frequencies: factors that are all
    exactly 1 change nothing (the plan then ignores the tensor), any other
    is Llama 3 RoPE scaling, which plain RoPE would silently get wrong."""
    t = g.tensors.get(ROPE_FREQS)
    if t is None:
        return
    if t.type_name not in FLOAT_TYPES:
        raise ConversionError(f"{g.path}: {ROPE_FREQS} is {t.type_name}, not a float type; "
                              f"the file is corrupt: {RECONVERT_ADVICE}")
    factors = to_float(g.read_rows(t, 0, t.rows), t, t.rows)
    if not np.all(factors == 1.0):
        raise ConversionError(
            f"{g.path}: RoPE type 'llama3' ({ROPE_FREQS} holds frequency factors other than "
            f"1, from {float(factors.min()):g} to {float(factors.max()):g}); "
            f"{PLAIN_ROPE_ONLY}")


# --- the plan: every .colibri tensor's GGUF source ----------------------------

@dataclass(frozen=True)
class GSource:
    """Rows [first, first + count) of GGUF tensor `tensor`'s 2-D view;
    `heads`: undo LlamaModel.permute over this many heads (Q, K)."""
    tensor: GTensor
    first: int
    count: int
    heads: int | None = None


@dataclass(frozen=True)
class GStep:
    kind: Kind
    layer: int | None
    expert: int | None
    source: GSource
    want: tuple[int, ...]   # the numpy shape the whole GGUF tensor must have


def unpermute_rows(n: int, heads: int) -> np.ndarray:
    """Index array: HF row r is GGUF row perm[r]. LlamaModel.permute maps
    w.reshape(heads, 2, d/2, ...).swapaxes(1, 2) -- GGUF row (h, i, j) is HF
    row (h, j, i) for i < d/2, j < 2."""
    d = n // heads
    return np.arange(n).reshape(heads, d // 2, 2).swapaxes(1, 2).reshape(-1)


def plan(g: GGUFFile, fam: Family, shape: fmt.ModelShape,
         desc: fmt.Description) -> list[GStep]:
    """Every .colibri tensor (but DESC) mapped to its GGUF rows, checked:
    missing, unexpected and mis-shaped tensors are reported by name."""
    _refuse_split_experts(g)
    steps: list[GStep] = []
    missing: dict[str, None] = {}   # names in plan order, each once
    permuted = fam.gguf.permuted_qk
    tied = GGUF_GLOBAL_TENSORS[Kind.LM_HEAD] not in g.tensors
    for kind, layer, expert in fmt.tensor_order(shape, desc):
        if kind == Kind.DESC:
            continue
        rows, cols = fmt.expected_shape(shape, kind, desc)
        if kind in GGUF_GLOBAL_TENSORS:
            name = GGUF_GLOBAL_TENSORS[
                Kind.EMBED if kind == Kind.LM_HEAD and tied else kind]
        else:
            name = f"blk.{layer}." + GGUF_LAYER_TENSORS[kind]
        t = g.tensors.get(name)
        if t is None:
            missing[name] = None   # once, though a merged tensor serves every expert
            continue
        is_vector = rows == 1 and kind not in (Kind.SHARED_GATE,)
        heads = None
        if permuted and kind in (Kind.WQ, Kind.BQ):
            heads = shape.n_heads
        elif permuted and kind in (Kind.WK, Kind.BK):
            heads = shape.n_kv_heads
        if expert is not None:
            want = (shape.n_experts, rows, cols)
            src = GSource(t, expert * rows, rows)
        else:
            want = (cols,) if is_vector else (rows, cols)
            src = GSource(t, 0, rows, heads)
        steps.append(GStep(kind, layer, expert, src, want))
    used = {st.source.tensor.name for st in steps}
    # rope_freqs.weight reaches here only with every factor 1 (_refuse_rope_freqs)
    unexpected = [n for n in g.tensors if n not in used and n != ROPE_FREQS]
    if missing:
        parts = g.value("split.count", 1)
        advice = (f"; the file is one of {parts} parts of a split GGUF: merge them with "
                  "llama-gguf-split --merge" if isinstance(parts, int) and parts > 1
                  else f": the file is incomplete or not as llama.cpp writes it; "
                       f"{RECONVERT_ADVICE}")
        raise ConversionError(f"{g.path}: {len(missing)} tensor(s) missing for {fam.title} as "
                              f"the metadata describes it: {_some(list(missing))}"
                              + (f" (the file has unexpected {_some(unexpected)})"
                                 if unexpected else "") + advice)
    if unexpected:
        raise ConversionError(
            f"{g.path}: {len(unexpected)} unexpected tensor(s): {_some(unexpected)}; colibri "
            f"converts {fam.title} as the metadata describes it ({shape.n_layers} layers, "
            f"{shape.n_experts} experts), so these would be lost")
    for st in steps:
        t = st.source.tensor
        if t.shape != st.want:
            raise ConversionError(f"{g.path}: tensor {t.name!r} has shape {list(t.shape)}, "
                                  f"expected {list(st.want)} from the metadata")
    _refuse_unreadable(g, steps)
    return steps


# llama.cpp's old Mixtral layout: one tensor per expert (blk.N.ffn_gate.E.weight).
_SPLIT_EXPERT = re.compile(r"blk\.\d+\.ffn_(gate|up|down)\.\d+\.weight")


def _refuse_split_experts(g: GGUFFile) -> None:
    """Old GGUF files keep each expert in its own tensor; llama.cpp's
    converter has since merged them (blk.N.ffn_gate_exps.weight), the only
    layout read here. Said before the plan lists every merged tensor as
    missing and every per-expert one as unexpected."""
    split = [n for n in g.tensors if _SPLIT_EXPERT.fullmatch(n)]
    if split:
        raise ConversionError(
            f"{g.path}: experts stored one tensor each ({split[0]}, ...), llama.cpp's old "
            "layout, which colibri does not read (it reads the merged "
            f"blk.N.ffn_gate_exps.weight): {RECONVERT_ADVICE}")


def _refuse_unreadable(g: GGUFFile, steps: list[GStep]) -> None:
    """Every planned tensor must be readable whatever --quant says (a copied
    block is readable too): refused here, where `colibri info` also plans,
    not when the export reaches the tensor."""
    bad: dict[str, dict[str, None]] = {}    # type -> tensor names, in file order
    for st in steps:
        t = st.source.tensor
        if not dequantisable(t.type_name):
            bad.setdefault(t.type_name, {})[t.name] = None
    if bad:
        kinds = "; ".join(f"{len(names)} {typ} ({_some(list(names), 2)})"
                          for typ, names in bad.items())
        raise ConversionError(
            f"{g.path}: tensors of a type colibri cannot read (gguf-py "
            f"{_gguf_version()} cannot dequantise it): {kinds}; {REQUANTISE_ADVICE}")


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("gguf")
    except PackageNotFoundError:
        return "(unknown version)"


def _some(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# --- decoding one step's rows ---------------------------------------------------

def to_float(raw: bytes, t: GTensor, rows: int) -> np.ndarray:
    """Rows of raw GGUF data -> float32 [rows, cols]: exact widening for the
    float types, gguf-py's dequantisation for block types."""
    name = t.type_name
    if name == "F32":
        w = np.frombuffer(raw, "<f4").astype(np.float32)
    elif name == "F16":
        w = np.frombuffer(raw, "<f2").astype(np.float32)
    elif name == "F64":
        w = np.frombuffer(raw, "<f8").astype(np.float32)
    elif name == "BF16":
        w = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        gguf = _gguf()
        qt = gguf.GGMLQuantizationType(t.type_id)
        try:
            w = gguf.quants.dequantize(np.frombuffer(raw, np.uint8).reshape(rows, -1), qt)
        except NotImplementedError:
            # plan() refuses these first (_refuse_unreadable): a backstop
            raise ConversionError(f"tensor {t.name!r} is {name}, which gguf-py cannot "
                                  f"dequantise; {REQUANTISE_ADVICE}") from None
    return np.ascontiguousarray(w, dtype=np.float32).reshape(rows, t.cols)


def to_exact(raw: bytes, t: GTensor, rows: int, dt: DType | None = None):
    """Rows of a Q8_0 / Q4_0 / Q5_0 / Q4_K / Q5_K / Q6_K tensor -> (dtype, values, scales)
    as the .colibri writer takes them, the same values: the blocks as they
    are (Colibri's block types are GGUF's byte for byte), or, with dt
    I8_GROUP, Q8_0 as int8 [rows, cols] with its fp16 scales widened to
    float32 [rows, cols / 32] (exact; `--quant int8` with groups of 32)."""
    if t.type_name == "Q8_0" and dt == DType.I8_GROUP:
        src = np.frombuffer(raw, blocks.BLOCK_DTYPES[DType.Q8_0]).reshape(rows, -1)
        values = np.ascontiguousarray(src["qs"]).reshape(rows, t.cols)
        return DType.I8_GROUP, values, src["d"].astype(np.float32)
    dt = exact_dtype(t.type_name)
    return dt, np.frombuffer(raw, blocks.BLOCK_DTYPES[dt]).reshape(rows, -1).copy(), None
