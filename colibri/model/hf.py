"""Reading Hugging Face checkpoints without torch: config.json and safetensors.

A checkpoint directory holds `config.json` and either one `model.safetensors`,
or shards listed by `model.safetensors.index.json` (`weight_map`: tensor name
-> shard file). We read tensors lazily, one at a time (or one expert's slice of
a fused 3-D tensor), straight from the file into a float32 array: nothing else
of the model is ever in memory, so the converter's peak memory follows the
largest tensor, not the model.

We parse safetensors ourselves instead of using `safetensors.safe_open`: its
numpy framework cannot return bfloat16 (numpy has no bf16 dtype), and reading a
byte range with `np.fromfile` lets us take a single expert out of a fused
[experts, rows, cols] tensor without touching the rest.

safetensors layout: u64 little-endian header length N, N bytes of JSON
({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}),
then the data; offsets are relative to the first byte after the header, data
is little-endian and row-major.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConversionError

# safetensors dtype -> (numpy dtype of the stored bytes, element size). BF16 is
# read as little-endian u16 and widened by hand (see _to_float32).
_DTYPES = {
    "F32": (np.dtype("<f4"), 4),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),
    "F64": (np.dtype("<f8"), 8),
}

# A safetensors header beyond this is certainly not a header (the format's own
# reader refuses headers over 100 MB).
_MAX_HEADER = 100 * 1024 * 1024

INDEX_FILE = "model.safetensors.index.json"
# What `colibri convert` wants, for its error messages.
CHECKPOINT_DIR = ("a Hugging Face checkpoint directory (config.json and *.safetensors, "
                  "as save_pretrained writes it)")
SINGLE_FILE = "model.safetensors"


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: its file, dtype name, shape and absolute byte
    range [start, start + nbytes)."""
    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _to_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Stored elements -> native float32, exactly (bf16 and f16 widen without
    rounding; f64 is rounded to nearest float32)."""
    if dtype == "BF16":
        # bf16 is the top half of a float32: shift the 16 bits up.
        out = np.empty(raw.shape, dtype=np.uint32)
        out[...] = raw
        out <<= 16
        return out.view(np.float32)
    return raw.astype(np.float32)


class SafetensorsFile:
    """The header of one .safetensors file, checked against the file's size;
    tensors are read on demand with read()."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise ConversionError(
                        f"{self.path}: not a safetensors file: {size} bytes, "
                        f"shorter than the 8-byte header length")
                (n,) = struct.unpack("<Q", head)
                if n > size - 8 or n > _MAX_HEADER:
                    raise ConversionError(
                        f"{self.path}: malformed safetensors file: header length "
                        f"{n} goes beyond the file ({size} bytes); the file is "
                        f"truncated or not safetensors")
                raw = f.read(n)
        except OSError as exc:
            raise ConversionError(f"cannot read {self.path}: {exc.strerror}") from exc
        try:
            header = json.loads(raw.decode("utf-8"))
        except RecursionError:
            raise ConversionError(f"{self.path}: malformed safetensors header (JSON nested "
                                  "too deeply)") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConversionError(
                f"{self.path}: malformed safetensors header (not JSON: {exc})") from exc
        if not isinstance(header, dict):
            raise ConversionError(f"{self.path}: malformed safetensors header "
                                  f"(a JSON {type(header).__name__}, not an object)")
        data_start = 8 + n
        data_len = size - data_start
        self.tensors: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            self.tensors[name] = self._entry(name, entry, data_start, data_len)
        self._check_no_overlap()

    def _check_no_overlap(self) -> None:
        """Two tensors sharing bytes would silently alias each other's data."""
        spans = sorted((t.start, t.start + t.nbytes, t.name) for t in self.tensors.values()
                       if t.nbytes)
        for (_, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
            if b1 < e0:
                raise ConversionError(
                    f"{self.path}: malformed safetensors file: the data of tensors {n0!r} "
                    f"and {n1!r} overlap (file bytes {b1}..{min(e0, e1)}); the file is "
                    "corrupt")

    def _entry(self, name: str, entry, data_start: int, data_len: int) -> TensorInfo:
        where = f"{self.path}: tensor {name!r}"
        if not isinstance(entry, dict):
            raise ConversionError(f"{where}: malformed header entry {entry!r}")
        dtype = entry.get("dtype")
        shape = entry.get("shape")
        offsets = entry.get("data_offsets")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise ConversionError(f"{where}: malformed shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) for o in offsets)):
            raise ConversionError(f"{where}: malformed data_offsets {offsets!r}")
        begin, end = offsets
        if not 0 <= begin <= end <= data_len:
            raise ConversionError(
                f"{where}: data_offsets [{begin}, {end}] go beyond the data "
                f"({data_len} bytes); the file is truncated or corrupt")
        if dtype not in _DTYPES:
            # Reported only if the tensor is needed: an int8 buffer we skip
            # should not stop a conversion. Keep it with its raw size.
            return TensorInfo(name, self.path, str(dtype), tuple(shape),
                              data_start + begin, end - begin)
        itemsize = _DTYPES[dtype][1]
        if math.prod(shape) * itemsize != end - begin:
            raise ConversionError(
                f"{where}: {dtype} shape {shape} needs {math.prod(shape) * itemsize} "
                f"bytes but data_offsets [{begin}, {end}] hold {end - begin}")
        return TensorInfo(name, self.path, dtype, tuple(shape), data_start + begin, end - begin)


def read_tensor(info: TensorInfo, first: int = 0, count: int | None = None) -> np.ndarray:
    """Elements [first, first + count) of the row-major flattened tensor as a
    1-D native float32 array (count None: to the end). Reads only those bytes."""
    if info.dtype not in _DTYPES:
        raise ConversionError(
            f"{info.path}: tensor {info.name!r} has dtype {info.dtype}; colibri "
            f"converts BF16, F16, F32 and F64 weights")
    np_dtype, itemsize = _DTYPES[info.dtype]
    if count is None:
        count = info.numel - first
    if not (0 <= first and 0 <= count and first + count <= info.numel):
        raise ValueError(f"range [{first}, {first + count}) outside {info.name} "
                         f"({info.numel} elements)")
    try:
        with open(info.path, "rb") as f:
            f.seek(info.start + first * itemsize)
            raw = np.fromfile(f, dtype=np_dtype, count=count)
    except OSError as exc:
        raise ConversionError(f"cannot read {info.name!r} from {info.path}: {exc}") from exc
    if raw.size != count:
        raise ConversionError(f"{info.path}: tensor {info.name!r} is truncated "
                              f"(read {raw.size} of {count} elements)")
    return _to_float32(raw, info.dtype)


class Checkpoint:
    """The tensors of a checkpoint directory, by name, over all its shards."""

    def __init__(self, model_dir: str | os.PathLike):
        self.dir = Path(model_dir)
        self.tensors: dict[str, TensorInfo] = {}
        self._index: dict[str, str] = {}  # model.safetensors.index.json's weight_map
        for shard in self._shard_files():
            for name, info in SafetensorsFile(shard).tensors.items():
                if name in self.tensors:
                    raise ConversionError(
                        f"tensor {name!r} is stored twice: in {self.tensors[name].path.name} "
                        f"and in {shard.name}")
                self.tensors[name] = info
        self._check_index()

    def _shard_files(self) -> list[Path]:
        if not self.dir.is_dir():
            raise ConversionError(f"{self.dir} is not a directory: give {CHECKPOINT_DIR}")
        index = self.dir / INDEX_FILE
        if index.exists():
            weight_map = self._weight_map(index)
            files = sorted(set(weight_map.values()))
            for name in files:
                if not (self.dir / name).is_file():
                    raise ConversionError(f"{index} lists shard {name!r}, which is missing "
                                          f"from {self.dir}")
            return [self.dir / name for name in files]
        single = self.dir / SINGLE_FILE
        if single.is_file():
            return [single]
        found = sorted(self.dir.glob("*.safetensors"))
        if not found:
            hint = ""
            if any(self.dir.glob("*.bin")) or any(self.dir.glob("*.pt")):
                hint = (" (only PyTorch .bin/.pt weights: re-save them with "
                        "save_pretrained(..., safe_serialization=True))")
            raise ConversionError(f"no safetensors weights in {self.dir}: expected "
                                  f"{SINGLE_FILE} or {INDEX_FILE}{hint}")
        return found

    def _weight_map(self, index: Path) -> dict[str, str]:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConversionError(f"{index}: malformed index, expected an object with "
                                  f"a 'weight_map' ({exc})") from exc
        if not isinstance(weight_map, dict):
            raise ConversionError(f"{index}: 'weight_map' is not an object")
        self._index = weight_map
        return weight_map

    def _check_index(self) -> None:
        # The index must agree with the shards: a tensor it promises but no
        # shard holds is a broken download.
        for name, shard in self._index.items():
            info = self.tensors.get(name)
            if info is None:
                raise ConversionError(f"{INDEX_FILE} lists tensor {name!r} in {shard}, "
                                      f"but that shard does not contain it")

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        return self.tensors[name]

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


# --- config.json -------------------------------------------------------------

@dataclass(frozen=True)
class HFConfig:
    """The fields of a config.json colibri needs, normalised across
    transformers 4 and 5 and across families (colibri/model/families/: the family
    module names the expert count and width fields and derives `desc`, what
    the model computes)."""
    vocab: int
    hidden: int
    intermediate: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_experts: int
    top_k: int
    max_position_embeddings: int
    rope_theta: float
    rms_eps: float
    tie_word_embeddings: bool
    sliding_window: int | None
    family: str = "mixtral"              # colibri/model/families/ module name
    desc: object = None                  # format.Description (None: Mixtral)


def _field(cfg: dict, key: str, kind=int, required=True, default=None):
    value = cfg.get(key, default)
    if value is None:
        if required:
            raise ConversionError(f"config.json: missing field {key!r}")
        return default
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConversionError(f"config.json: {key} = {value!r}, expected a positive integer")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value <= 0:
            raise ConversionError(f"config.json: {key} = {value!r}, expected a positive number")
        value = float(value)
    return value


def read_config(model_dir: str | os.PathLike) -> HFConfig:
    """Parse and check model_dir/config.json (transformers 4 or 5 layout)."""
    model_dir = Path(model_dir)
    # The directory itself first: "X/config.json: Not a directory" would
    # send the user looking for a file when the argument is wrong.
    if not model_dir.exists():
        raise ConversionError(f"{model_dir} does not exist: give {CHECKPOINT_DIR}")
    if not model_dir.is_dir():
        raise ConversionError(f"{model_dir} is not a directory: give {CHECKPOINT_DIR}")
    path = model_dir / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConversionError(f"no config.json in {model_dir}: give {CHECKPOINT_DIR}") from None
    except (OSError, ValueError) as exc:
        raise ConversionError(f"{path}: cannot parse ({exc})") from exc
    if not isinstance(cfg, dict):
        raise ConversionError(f"{path}: expected a JSON object")
    return config_from_dict(cfg, str(path))


def config_from_dict(cfg: dict, where: str = "config.json") -> HFConfig:
    """The checks and fields of read_config over a parsed config.json (no
    directory, no weights: colibri.model.memory sizes a checkpoint from this)."""
    if not isinstance(cfg, dict):
        raise ConversionError(f"{where}: expected a JSON object")
    from . import families  # the family decides the fields below
    family = families.pick(cfg)

    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ConversionError(f"config.json: hidden_act = {act!r}; colibri's experts use silu")

    # transformers 5: rope_parameters {"rope_theta", "rope_type"}; 4: rope_theta
    # at the top level and an optional rope_scaling.
    rope = cfg.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ConversionError(f"config.json: rope_parameters = {rope!r}, expected an object")
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict):
        rope_type = scaling.get("rope_type") or scaling.get("type") or rope_type
    if rope_type != "default":
        raise ConversionError(f"config.json: RoPE type {rope_type!r}; colibri implements "
                              f"plain RoPE ('default') only")
    if "rope_theta" in rope:
        theta = _field(rope, "rope_theta", float)
    else:
        theta = _field(cfg, "rope_theta", float, required=False, default=1e6)

    hidden = _field(cfg, "hidden_size")
    n_heads = _field(cfg, "num_attention_heads")
    n_kv = _field(cfg, "num_key_value_heads", required=False, default=n_heads)
    # transformers 5 writes "head_dim": null when it is hidden / heads.
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if hidden % n_heads:
            raise ConversionError(f"config.json: head_dim absent and hidden_size {hidden} "
                                  f"is not a multiple of num_attention_heads {n_heads}")
        head_dim = hidden // n_heads
    else:
        head_dim = _field(cfg, "head_dim")
    if n_heads % n_kv:
        raise ConversionError(f"config.json: num_attention_heads {n_heads} is not a "
                              f"multiple of num_key_value_heads {n_kv}")
    window = cfg.get("sliding_window") if family.extra.get("sliding_window") else None
    if window is not None:
        window = _field(cfg, "sliding_window")
    experts_key = next((k for k in family.experts_keys if cfg.get(k) is not None),
                       family.experts_keys[0])
    return HFConfig(
        vocab=_field(cfg, "vocab_size"),
        hidden=hidden,
        intermediate=_field(cfg, family.intermediate_key),
        n_layers=_field(cfg, "num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        n_experts=_field(cfg, experts_key),
        top_k=_field(cfg, "num_experts_per_tok"),
        max_position_embeddings=_field(cfg, "max_position_embeddings",
                                       required=False, default=4096),
        rope_theta=theta,
        rms_eps=_field(cfg, "rms_norm_eps", float, required=False, default=1e-5),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        sliding_window=window,
        family=family.name,
        desc=family.describe(cfg),
    )
