"""colibri/model/hf.py: the torch-free safetensors and config.json reader.

Values are checked against the safetensors library (torch framework, which
handles bf16) as the independent reference; malformed files must give errors
that say what is wrong.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from colibri.model import hf
from colibri.errors import ConversionError

# --- a minimal safetensors writer for tests (numpy cannot hold bf16) --------

_ST_DTYPE = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8", "I8": "i1"}


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), round to nearest even, as torch does."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """tensors: name -> (safetensors dtype, array already in that dtype's
    storage: uint16 bits for BF16). Streams one tensor at a time."""
    header, offset = {}, 0
    for name, (dt, arr) in tensors.items():
        n = arr.size * np.dtype(_ST_DTYPE[dt]).itemsize
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for dt, arr in tensors.values():
            f.write(np.ascontiguousarray(arr, dtype=_ST_DTYPE[dt]).tobytes())


# --- values ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_read_matches_safetensors_library(tmp_path, dtype):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file, load_file

    gen = torch.Generator().manual_seed(3)
    tensors = {"a": torch.randn(7, 5, generator=gen).to(getattr(torch, dtype)),
               "b.c": (1e30 * torch.randn(3, 4, 2, generator=gen)).to(getattr(torch, dtype)),
               "v": torch.randn(11, generator=gen).to(getattr(torch, dtype))}
    save_file(tensors, tmp_path / "x.safetensors")
    want = load_file(tmp_path / "x.safetensors")
    st = hf.SafetensorsFile(tmp_path / "x.safetensors")
    assert set(st.tensors) == set(want)
    for name, t in want.items():
        info = st.tensors[name]
        assert info.shape == tuple(t.shape)
        got = hf.read_tensor(info).reshape(info.shape)
        assert got.dtype == np.float32
        ref = t.float().numpy()  # exact widening for bf16/f16; f64 rounds like numpy
        np.testing.assert_array_equal(got, ref)


def test_read_a_slice_reads_only_those_elements(tmp_path):
    x = np.arange(4 * 6 * 3, dtype=np.float32).reshape(4, 6, 3)
    write_safetensors(tmp_path / "x.safetensors", {"x": ("BF16", to_bf16_bits(x))})
    info = hf.SafetensorsFile(tmp_path / "x.safetensors").tensors["x"]
    got = hf.read_tensor(info, first=2 * 18 + 9, count=9)  # expert 2, rows 3..5
    np.testing.assert_array_equal(got, x[2, 3:6].ravel())


def test_bf16_rounding_helper_agrees_with_torch():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    ref = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(to_bf16_bits(x), ref)


# --- malformed files -----------------------------------------------------------

def _valid(tmp_path) -> Path:
    p = tmp_path / "m.safetensors"
    write_safetensors(p, {"w": ("F32", np.ones((4, 4), np.float32))})
    return p


def test_header_length_beyond_file(tmp_path):
    p = _valid(tmp_path)
    data = bytearray(p.read_bytes())
    data[:8] = struct.pack("<Q", len(data) + 100)
    p.write_bytes(data)
    with pytest.raises(ConversionError, match=r"header length \d+ goes beyond the file"):
        hf.SafetensorsFile(p)


def test_file_shorter_than_length_field(tmp_path):
    p = tmp_path / "m.safetensors"
    p.write_bytes(b"\x01\x02")
    with pytest.raises(ConversionError, match="shorter than the 8-byte header length"):
        hf.SafetensorsFile(p)


def test_header_not_json(tmp_path):
    p = tmp_path / "m.safetensors"
    p.write_bytes(struct.pack("<Q", 4) + b"{{{{")
    with pytest.raises(ConversionError, match="not JSON"):
        hf.SafetensorsFile(p)


def test_truncated_data(tmp_path):
    p = _valid(tmp_path)
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(ConversionError, match=r"tensor 'w': data_offsets \[0, 64\] go beyond"):
        hf.SafetensorsFile(p)


def test_size_disagrees_with_shape(tmp_path):
    p = tmp_path / "m.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [4, 5], "data_offsets": [0, 64]}}).encode()
    p.write_bytes(struct.pack("<Q", len(header)) + header + bytes(64))
    with pytest.raises(ConversionError, match=r"'w': F32 shape \[4, 5\] needs 80 bytes"):
        hf.SafetensorsFile(p)


def test_unsupported_dtype_only_when_read(tmp_path):
    p = tmp_path / "m.safetensors"
    write_safetensors(p, {"q": ("I8", np.ones((2, 2), np.int8))})
    info = hf.SafetensorsFile(p).tensors["q"]
    with pytest.raises(ConversionError, match="'q' has dtype I8"):
        hf.read_tensor(info)


def test_index_naming_a_missing_shard(tmp_path):
    _valid(tmp_path)
    (tmp_path / hf.INDEX_FILE).write_text(json.dumps(
        {"weight_map": {"w": "m.safetensors", "v": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(ConversionError, match="model-00002-of-00002.safetensors'?, which is missing"):
        hf.Checkpoint(tmp_path)


def test_index_promising_a_tensor_no_shard_has(tmp_path):
    _valid(tmp_path)
    (tmp_path / hf.INDEX_FILE).write_text(json.dumps(
        {"weight_map": {"w": "m.safetensors", "ghost": "m.safetensors"}}))
    with pytest.raises(ConversionError, match="lists tensor 'ghost'"):
        hf.Checkpoint(tmp_path)


def test_tensor_stored_twice(tmp_path):
    write_safetensors(tmp_path / "a.safetensors", {"w": ("F32", np.ones(2, np.float32))})
    write_safetensors(tmp_path / "b.safetensors", {"w": ("F32", np.ones(2, np.float32))})
    with pytest.raises(ConversionError, match="'w' is stored twice"):
        hf.Checkpoint(tmp_path)


def test_no_weights(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(ConversionError, match="no safetensors weights.*safe_serialization"):
        hf.Checkpoint(tmp_path)


# --- config.json ---------------------------------------------------------------

V5 = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "head_dim": None,
      "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
      "num_attention_heads": 8, "num_key_value_heads": 2, "num_local_experts": 4,
      "num_experts_per_tok": 2, "max_position_embeddings": 32768, "vocab_size": 100,
      "rms_norm_eps": 1e-5, "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"},
      "sliding_window": None, "tie_word_embeddings": False, "hidden_act": "silu"}


def _config(tmp_path, **changes) -> hf.HFConfig:
    cfg = dict(V5)
    for k, v in changes.items():
        if v is ... and k in cfg:
            del cfg[k]
        elif v is not ...:
            cfg[k] = v
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return hf.read_config(tmp_path)


def test_config_v5_null_head_dim_and_rope_parameters(tmp_path):
    c = _config(tmp_path)
    assert (c.head_dim, c.rope_theta, c.n_kv_heads, c.n_experts, c.top_k) == (8, 5e5, 2, 4, 2)


def test_config_v4_top_level_rope_theta_no_head_dim(tmp_path):
    c = _config(tmp_path, rope_parameters=..., head_dim=..., rope_theta=1e6)
    assert (c.head_dim, c.rope_theta) == (8, 1e6)


def test_config_explicit_head_dim(tmp_path):
    assert _config(tmp_path, head_dim=16).head_dim == 16


SUPPORTED = ("MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM, "
             "GraniteMoeForCausalLM, GraniteMoeSharedForCausalLM, "
             "SwitchTransformersForConditionalGeneration")


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "DeepseekV3ForCausalLM"])
def test_unsupported_architecture_by_name(tmp_path, arch):
    with pytest.raises(ConversionError) as err:
        _config(tmp_path, architectures=[arch])
    assert str(err.value) == (f"unsupported architecture {arch}: colibri converts the MoE "
                              f"families {SUPPORTED}")


@pytest.mark.parametrize("arch, model_type, family", [
    ("MixtralForCausalLM", "mixtral", "mixtral"),
    ("Qwen2MoeForCausalLM", "qwen2_moe", "qwen2_moe"),
    ("Qwen3MoeForCausalLM", "qwen3_moe", "qwen3_moe"),
    ("OlmoeForCausalLM", "olmoe", "olmoe"),
    ("GraniteMoeForCausalLM", "granitemoe", "granitemoe"),
    ("GraniteMoeSharedForCausalLM", "granitemoeshared", "granitemoe_shared"),
])
def test_family_picked_by_architecture_or_model_type(arch, model_type, family):
    from colibri.model import families
    assert families.pick({"architectures": [arch]}).name == family
    assert families.pick({"model_type": model_type}).name == family


def test_model_type_alone_is_enough_and_checked(tmp_path):
    assert _config(tmp_path, architectures=...).n_layers == 2
    with pytest.raises(ConversionError, match="model_type 'llama'"):
        _config(tmp_path, architectures=..., model_type="llama")


@pytest.mark.parametrize("changes, message", [
    (dict(num_local_experts=...), "missing field 'num_local_experts'"),
    (dict(hidden_size=0), "hidden_size = 0, expected a positive integer"),
    (dict(num_key_value_heads=3), "num_attention_heads 8 is not a multiple of num_key_value_heads 3"),
    (dict(rope_parameters={"rope_theta": 1e4, "rope_type": "yarn"}), "RoPE type 'yarn'"),
    (dict(hidden_act="gelu"), "hidden_act = 'gelu'"),
    (dict(rms_norm_eps=-1), "rms_norm_eps = -1"),
])
def test_config_errors_name_the_field(tmp_path, changes, message):
    with pytest.raises(ConversionError, match=message.replace("(", r"\(").replace("[", r"\[")):
        _config(tmp_path, **changes)
