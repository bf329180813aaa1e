"""The Hugging Face -> .colibri converter (colibri/model/convert.py).

Checkpoints are real transformers MixtralForCausalLM saves (tests/golden_configs.py);
the expected tensor values come from loading them with the safetensors library
(torch framework), never from the converter.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from colibri import cli
from colibri.file import format as F
from colibri.model.convert import ColibriExporter, parse_expert_map
from colibri.errors import ConversionError
from colibri.file.format import DType, Kind

torch = pytest.importorskip("torch")
from safetensors.torch import load_file, save_file  # noqa: E402
from export_progress import assert_one_line_per_layer  # noqa: E402
from golden_configs import save_mixtral, make_mixtral  # noqa: E402


def hf_name(kind: Kind, layer, expert) -> str:
    """The Mixtral tensor each .colibri kind comes from (FORMAT.md section 3)."""
    L = f"model.layers.{layer}."
    moe = L + "block_sparse_moe."
    return {
        Kind.EMBED: "model.embed_tokens.weight",
        Kind.ATTN_NORM: L + "input_layernorm.weight",
        Kind.WQ: L + "self_attn.q_proj.weight",
        Kind.WK: L + "self_attn.k_proj.weight",
        Kind.WV: L + "self_attn.v_proj.weight",
        Kind.WO: L + "self_attn.o_proj.weight",
        Kind.FFN_NORM: L + "post_attention_layernorm.weight",
        Kind.ROUTER: moe + "gate.weight",
        Kind.EXPERT_W1: moe + f"experts.{expert}.w1.weight",
        Kind.EXPERT_W3: moe + f"experts.{expert}.w3.weight",
        Kind.EXPERT_W2: moe + f"experts.{expert}.w2.weight",
        Kind.FINAL_NORM: "model.norm.weight",
        Kind.LM_HEAD: "lm_head.weight",
    }[kind]


def load_checkpoint(d: Path) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint dir as float32 numpy, via the safetensors library."""
    out = {}
    for p in sorted(Path(d).glob("*.safetensors")):
        out.update({k: v.float().numpy() for k, v in load_file(p).items()})
    return out


def convert(src, out, **kw) -> F.ColibriFile:
    ColibriExporter(src, **kw).export(out)
    return F.read_file(out)


def assert_same_model(cf: F.ColibriFile, tensors: dict[str, np.ndarray]) -> None:
    """Every .colibri tensor equals its checkpoint tensor exactly."""
    used = set()
    for kind, layer, expert in F.tensor_order(cf.shape):
        name = hf_name(kind, layer, expert)
        want = tensors[name]
        got = cf.dequantized(kind, layer, expert)
        assert got.shape == (1, want.size) if want.ndim == 1 else got.shape == want.shape, name
        np.testing.assert_array_equal(got.reshape(want.shape), want, err_msg=name)
        used.add(name)
    assert used == set(tensors)


# --- exact conversions -----------------------------------------------------------

@pytest.mark.parametrize("name", ["tiny", "awkward", "wide"])
def test_f32_conversion_reproduces_every_tensor(hf_checkpoint, tmp_path, name):
    src = hf_checkpoint(name)
    cf = convert(src, tmp_path / "m.colibri", quant="f32")
    assert all(e.dtype == DType.F32 for e in cf.entries)
    assert_same_model(cf, load_checkpoint(src))
    cfg = json.loads((src / "config.json").read_text())
    s = cf.shape
    assert (s.vocab, s.hidden, s.intermediate, s.n_layers) == (
        cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"])
    assert (s.n_heads, s.n_kv_heads, s.n_experts, s.top_k) == (
        cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_local_experts"],
        cfg["num_experts_per_tok"])
    assert s.head_dim == (cfg["head_dim"] or cfg["hidden_size"] // cfg["num_attention_heads"])
    assert s.rope_theta == np.float32(cfg["rope_parameters"]["rope_theta"])
    assert s.rms_eps == np.float32(cfg["rms_norm_eps"])
    assert s.max_seq_len == cfg["max_position_embeddings"]  # 64 <= the 4096 cap
    assert (s.max_batch, s.group_size) == (1, 32)


@pytest.mark.parametrize("dtype, shard", [("bfloat16", None), ("float16", None),
                                           ("bfloat16", "60KB"), ("float32", "100KB")])
def test_half_precision_and_sharded_checkpoints(tmp_path, dtype, shard):
    src = save_mixtral("awkward", tmp_path / "hf", seed=5, dtype=dtype, max_shard_size=shard)
    if shard:
        assert (src / "model.safetensors.index.json").exists()
        assert len(list(src.glob("*.safetensors"))) > 1
    cf = convert(src, tmp_path / "m.colibri", quant="f32")
    assert_same_model(cf, load_checkpoint(src))


def test_v4_config_json(hf_checkpoint, tmp_path):
    """transformers 4 writes rope_theta at the top level and may omit head_dim."""
    src = shutil.copytree(hf_checkpoint("tiny"), tmp_path / "v4")
    cfg = json.loads((src / "config.json").read_text())
    cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"]
    cfg.pop("head_dim", None)
    cfg["transformers_version"] = "4.46.0"
    (src / "config.json").write_text(json.dumps(cfg))
    v4 = tmp_path / "v4.colibri"
    v5 = tmp_path / "v5.colibri"
    ColibriExporter(src, quant="f32").export(v4)
    ColibriExporter(hf_checkpoint("tiny"), quant="f32").export(v5)
    assert v4.read_bytes() == v5.read_bytes()
    assert F.read_file(v4).shape.rope_theta == np.float32(1e6)


def test_fused_transformers5_layout(tmp_path):
    """A checkpoint saved from transformers 5's in-memory state dict
    (mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I], mlp.gate) gives
    the same file as its save_pretrained (Mixtral names) checkpoint."""
    model = make_mixtral("awkward", seed=2)
    disk = save_mixtral("awkward", tmp_path / "disk", seed=2)
    fused = tmp_path / "fused"
    fused.mkdir()
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in sd
    save_file(sd, fused / "model.safetensors", metadata={"format": "pt"})
    shutil.copy(disk / "config.json", fused / "config.json")
    a, b = tmp_path / "fused.colibri", tmp_path / "disk.colibri"
    ColibriExporter(fused, quant="f32").export(a)
    ColibriExporter(disk, quant="f32").export(b)
    assert a.read_bytes() == b.read_bytes()
    # and gate (w1) is the first half of gate_up_proj, as MixtralExperts chunks it
    cf = F.read_file(a)
    gu = sd["model.layers.1.mlp.experts.gate_up_proj"][4].numpy()
    inter = cf.shape.intermediate
    np.testing.assert_array_equal(cf.dequantized(Kind.EXPERT_W1, 1, 4), gu[:inter])
    np.testing.assert_array_equal(cf.dequantized(Kind.EXPERT_W3, 1, 4), gu[inter:])


def tied_tiny(hf_checkpoint, tmp_path) -> tuple[Path, dict]:
    """A copy of the tiny checkpoint with tie_word_embeddings and no
    lm_head.weight: (its directory, its tensors)."""
    src = shutil.copytree(hf_checkpoint("tiny"), tmp_path / "tied")
    tensors = load_file(src / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (src / "config.json").write_text(json.dumps(cfg))
    return src, tensors


def test_tied_embeddings_use_embed_tokens_for_lm_head(hf_checkpoint, tmp_path):
    src, tensors = tied_tiny(hf_checkpoint, tmp_path)
    cf = convert(src, tmp_path / "m.colibri", quant="f32")
    # one matrix for both (FORMAT.md 2, TIED_LM_HEAD): no LM_HEAD entry
    assert cf.version == 2 and cf.desc.has(F.Feat.TIED_LM_HEAD)
    assert not any(e.kind == Kind.LM_HEAD for e in cf.entries)
    np.testing.assert_array_equal(cf.dequantized(Kind.EMBED),
                                  tensors["model.embed_tokens.weight"].numpy())


@pytest.mark.parametrize("options, embed", [
    ({}, DType.I8_GROUP),                                  # format.TIED_TYPE: Q6_K -> int8
    ({"quantize_embedding": "q4_k"}, DType.Q5_0),          # --embedding alone names it
    ({"quantize_embedding": "q4_k", "quantize_lm_head": "f32"}, DType.F32),  # --lm-head wins
])
def test_q4_tied_matrix_type(hf_checkpoint, tmp_path, options, embed):
    """A tied matrix of a q4 conversion takes the preset's tied type (Q6_K,
    the LM head's use), not the untied LM head's (Q5_K);
    on tiny's 32-wide rows Q6_K falls back to int8 and Q4_K / Q5_K to Q5_0.
    The planner (`colibri info --config`) agrees with the file."""
    from colibri.model import memory
    src, _ = tied_tiny(hf_checkpoint, tmp_path)
    cf = convert(src, tmp_path / "m.colibri", quant="q4", **options)
    assert cf.entry(Kind.EMBED).dtype == embed
    assert F.fit_dtype(F.PRESET_Q4[Kind.LM_HEAD], 32, Kind.LM_HEAD) == DType.Q5_0
    if not options:
        planned = memory.plan_from_config(src, quant="q4", max_seq_len=cf.shape.max_seq_len)
        assert [e.dtype for e in planned.entries] == [e.dtype for e in cf.entries
                                                      if e.kind in Kind._value2member_map_]


# --- quantised conversions ----------------------------------------------------------

def test_int8_error_bounds_per_tensor(hf_checkpoint, tmp_path):
    src = hf_checkpoint("awkward")
    cf = convert(src, tmp_path / "m.colibri", quant="int8", group_size=16)
    tensors = load_checkpoint(src)
    assert cf.shape.group_size == 16
    assert set(cf.dtypes) == {*F.GLOBAL_KINDS, *F.LAYER_KINDS, *F.EXPERT_KINDS}
    assert cf.dtypes == {k: F.PRESET_INT8[k] for k in cf.dtypes}
    for kind, layer, expert in F.tensor_order(cf.shape):
        w = tensors[hf_name(kind, layer, expert)].reshape(F.expected_shape(cf.shape, kind))
        t = cf.tensor(kind, layer, expert)
        deq = cf.dequantized(kind, layer, expert)
        if t.dtype == DType.F32:
            np.testing.assert_array_equal(deq, w)
            continue
        if t.dtype == DType.I8_GROUP:
            # scale per (row, group) broadcast to its columns; scale = amax / 127
            step = np.repeat(t.scales, 16, axis=1)[:, :w.shape[1]]
            amax = np.abs(np.pad(w, ((0, 0), (0, -w.shape[1] % 16)))).reshape(
                w.shape[0], -1, 16).max(axis=2)
            np.testing.assert_allclose(t.scales, amax / 127, rtol=1e-6)
        else:  # I16_ROW
            step = np.broadcast_to(t.scales[:, None], w.shape)
            np.testing.assert_allclose(t.scales, np.abs(w).max(axis=1) / 32767, rtol=1e-6)
        err = np.abs(w - deq)
        # half a step, plus float32 rounding of q * scale
        assert np.all(err <= step / 2 * (1 + 1e-5) + 1e-7 * np.abs(w)), (kind, layer, expert)


def test_per_kind_overrides(hf_checkpoint, tmp_path):
    cf = convert(hf_checkpoint("tiny"), tmp_path / "m.colibri", quant="int8",
                 quantize_router="f32", quantize_embedding="f32", quantize_lm_head="f32")
    d = cf.dtypes
    assert (d[Kind.ROUTER], d[Kind.EMBED], d[Kind.LM_HEAD]) == (DType.F32,) * 3
    assert (d[Kind.EXPERT_W1], d[Kind.WQ], d[Kind.ATTN_NORM]) == (
        DType.I8_GROUP, DType.I8_GROUP, DType.F32)
    cf = convert(hf_checkpoint("tiny"), tmp_path / "n.colibri", quant="f32",
                 quantize_experts="int8", quantize_router="int16")
    d = cf.dtypes
    assert (d[Kind.EXPERT_W2], d[Kind.ROUTER], d[Kind.WO]) == (
        DType.I8_GROUP, DType.I16_ROW, DType.F32)


# --- byte order and round trips ---------------------------------------------------

@pytest.mark.parametrize("quant", ["f32", "int8"])
def test_big_endian_reads_back_to_the_same_model(hf_checkpoint, tmp_path, quant):
    src = hf_checkpoint("awkward")
    little = convert(src, tmp_path / "le.colibri", quant=quant)
    big = convert(src, tmp_path / "be.colibri", quant=quant, byte_order="big")
    assert (big.byte_order, little.byte_order) == ("big", "little")
    assert (tmp_path / "be.colibri").read_bytes()[6:8] == b"\xfe\xff"
    assert big.shape == little.shape
    for kind, layer, expert in F.tensor_order(big.shape):
        a, b = little.tensor(kind, layer, expert), big.tensor(kind, layer, expert)
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a.values, b.values)
        if a.scales is not None:
            np.testing.assert_array_equal(a.scales, b.scales)


@pytest.mark.parametrize("byte_order", ["little", "big"])
def test_converted_file_rewrites_byte_identical(hf_checkpoint, tmp_path, byte_order):
    src = hf_checkpoint("wide")
    first = tmp_path / "a.colibri"
    cf = convert(src, first, quant="int8", byte_order=byte_order)
    again = tmp_path / "b.colibri"
    F.write_file(again, cf.shape, cf.tensors(), cf.byte_order)
    assert first.read_bytes() == again.read_bytes()


# --- expert-map --------------------------------------------------------------------

def _renamed(src: Path, dst: Path, renames: dict[str, str]) -> Path:
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    tensors = load_file(src / "model.safetensors")
    out = {}
    for k, v in tensors.items():
        for old, new in renames.items():
            k = k.replace(f".{old}.weight", f".{new}.weight") if ".experts." in k else k
        out[k] = v
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_expert_map_with_renamed_checkpoint(hf_checkpoint, tmp_path):
    src = hf_checkpoint("tiny")
    renamed = _renamed(src, tmp_path / "renamed", {"w1": "wi", "w2": "wo", "w3": "wv"})
    with pytest.raises(ConversionError) as err:
        ColibriExporter(renamed, quant="f32").export(tmp_path / "x.colibri")
    msg = str(err.value)
    assert "model.layers.0.block_sparse_moe.experts.0.w1.weight" in msg
    assert "--expert-map" in msg and "experts.0.wi.weight" in msg
    assert not (tmp_path / "x.colibri").exists()

    ColibriExporter(renamed, quant="f32").set_expert_weight_mapping(
        parse_expert_map("wi=w1, wo=w2,wv=w3")).export(tmp_path / "mapped.colibri")
    ColibriExporter(src, quant="f32").export(tmp_path / "plain.colibri")
    assert (tmp_path / "mapped.colibri").read_bytes() == (tmp_path / "plain.colibri").read_bytes()

    # a partial map: unmapped names keep their Mixtral name
    partial = _renamed(src, tmp_path / "partial", {"w2": "down"})
    rc = cli.main(["convert", str(partial), "-o", str(tmp_path / "cli.colibri"),
                   "--quant", "f32", "--expert-map", "down=w2"])
    assert rc == 0
    assert (tmp_path / "cli.colibri").read_bytes() == (tmp_path / "plain.colibri").read_bytes()


@pytest.mark.parametrize("text, message", [
    ("wi", "'wi' is not SOURCE=TARGET"),
    ("wi=w4", "the target must be one of w1, w3, w2"),
    ("a=w1,b=w1", "several names map to w1"),
    ("x.y=w1", "the source is one name component"),
])
def test_expert_map_errors(hf_checkpoint, text, message):
    with pytest.raises(ConversionError, match=message):
        ColibriExporter(hf_checkpoint("tiny")).set_expert_weight_mapping(parse_expert_map(text))


# --- validation messages -------------------------------------------------------------

def _edited(src: Path, dst: Path, edit=None, config=None) -> Path:
    """Copy a single-file checkpoint, apply edit(tensors dict) and config(dict)."""
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    if config:
        config(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(src / "model.safetensors")
    if edit:
        edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_num_experts_must_match_config(hf_checkpoint):
    with pytest.raises(ConversionError) as err:
        ColibriExporter(hf_checkpoint("tiny"), num_experts=8)
    assert str(err.value).startswith(
        "num_experts = 8, but config.json has num_local_experts = 4")
    ColibriExporter(hf_checkpoint("tiny"), num_experts=4)  # agreeing is fine


@pytest.mark.parametrize("top_k", [0, 5])
def test_top_k_against_expert_count(hf_checkpoint, top_k):
    with pytest.raises(ConversionError, match=f"top_k = {top_k} must be between 1 and "
                                               "the number of experts, 4"):
        ColibriExporter(hf_checkpoint("tiny"), top_k=top_k)


def test_top_k_override_is_stored(hf_checkpoint, tmp_path):
    cf = convert(hf_checkpoint("tiny"), tmp_path / "m.colibri", quant="f32", top_k=1)
    assert cf.shape.top_k == 1


def test_config_top_k_beyond_experts(hf_checkpoint, tmp_path):
    d = _edited(hf_checkpoint("tiny"), tmp_path / "d",
                config=lambda c: c.update(num_experts_per_tok=6))
    with pytest.raises(ConversionError, match="num_experts_per_tok = 6 exceeds "
                                               "num_local_experts = 4"):
        ColibriExporter(d)


def test_missing_tensor_by_name(hf_checkpoint, tmp_path):
    name = "model.layers.1.block_sparse_moe.experts.2.w3.weight"
    d = _edited(hf_checkpoint("tiny"), tmp_path / "d", edit=lambda t: t.pop(name))
    with pytest.raises(ConversionError) as err:
        ColibriExporter(d).export(tmp_path / "x.colibri")
    assert str(err.value).startswith("1 tensor(s) missing from the checkpoint")
    assert str(err.value).endswith(name)


def test_missing_lm_head_hints_at_tying(hf_checkpoint, tmp_path):
    d = _edited(hf_checkpoint("tiny"), tmp_path / "d", edit=lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ConversionError, match="lm_head.weight; if the model ties"):
        ColibriExporter(d).export(tmp_path / "x.colibri")


def test_unexpected_tensors_by_name(hf_checkpoint, tmp_path):
    def add(t):
        t["model.layers.0.block_sparse_moe.experts.4.w1.weight"] = torch.zeros(64, 32)
        t["model.layers.2.input_layernorm.weight"] = torch.ones(32)
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)  # ignorable
    d = _edited(hf_checkpoint("tiny"), tmp_path / "d", edit=add)
    with pytest.raises(ConversionError) as err:
        ColibriExporter(d).export(tmp_path / "x.colibri")
    msg = str(err.value)
    assert msg.startswith("2 unexpected tensor(s)")
    assert "model.layers.0.block_sparse_moe.experts.4.w1.weight" in msg
    assert "model.layers.2.input_layernorm.weight" in msg
    assert "inv_freq" not in msg
    assert "2 layers, 4 experts" in msg


def test_shape_mismatch_names_tensor_found_and_expected(hf_checkpoint, tmp_path):
    name = "model.layers.1.self_attn.k_proj.weight"
    d = _edited(hf_checkpoint("tiny"), tmp_path / "d",
                edit=lambda t: t.update({name: torch.zeros(24, 32)}))
    with pytest.raises(ConversionError) as err:
        ColibriExporter(d).export(tmp_path / "x.colibri")
    assert str(err.value) == (
        f"tensor '{name}' has shape [24, 32], expected [16, 32] (from config.json: "
        "num_key_value_heads 2 x head_dim 8, hidden_size 32)")


def test_unsupported_architecture(hf_checkpoint, tmp_path):
    d = _edited(hf_checkpoint("tiny"), tmp_path / "d",
                config=lambda c: c.update(architectures=["LlamaForCausalLM"]))
    rc = cli.main(["convert", str(d), "-o", str(tmp_path / "x.colibri")])
    assert rc == 2
    with pytest.raises(ConversionError) as err:
        ColibriExporter(d)
    assert str(err.value).startswith("unsupported architecture LlamaForCausalLM: colibri "
                                     "converts the MoE families MixtralForCausalLM, "
                                     "Qwen2MoeForCausalLM, ")


def test_non_finite_weight_names_the_tensor(hf_checkpoint, tmp_path):
    name = "model.layers.0.block_sparse_moe.experts.1.w2.weight"

    def poison(t):
        t[name] = t[name].clone()
        t[name][3, 5] = float("nan")
    d = _edited(hf_checkpoint("tiny"), tmp_path / "d", edit=poison)
    with pytest.raises(ConversionError, match=f"tensor '{name}': .*NaN"):
        ColibriExporter(d).export(tmp_path / "x.colibri")
    assert list(tmp_path.glob("x.colibri*")) == []  # no partial file left behind


def test_malformed_safetensors_header(hf_checkpoint, tmp_path):
    d = shutil.copytree(hf_checkpoint("tiny"), tmp_path / "d")
    data = bytearray((d / "model.safetensors").read_bytes())
    data[:8] = (len(data) * 2).to_bytes(8, "little")
    (d / "model.safetensors").write_bytes(data)
    with pytest.raises(ConversionError, match="header length .* goes beyond the file"):
        ColibriExporter(d)


def test_sliding_window_limits_max_seq_len(hf_checkpoint, tmp_path):
    d = _edited(hf_checkpoint("tiny"), tmp_path / "d",
                config=lambda c: c.update(sliding_window=16, max_position_embeddings=100000))
    assert ColibriExporter(d).shape.max_seq_len == 16
    with pytest.raises(ConversionError, match="max_seq_len = 32 exceeds the model's "
                                               "sliding_window = 16"):
        ColibriExporter(d, max_seq_len=32)
    d2 = _edited(hf_checkpoint("tiny"), tmp_path / "d2",
                 config=lambda c: c.update(max_position_embeddings=100000))
    assert ColibriExporter(d2).shape.max_seq_len == 4096  # the documented cap
    assert ColibriExporter(d2, max_seq_len=8192).shape.max_seq_len == 8192


@pytest.mark.parametrize("kwargs, message", [
    (dict(quant="int4"), "quant = 'int4': choose f32, int8 or q4"),
    (dict(quantize_router="int8"), "quantize_router = 'int8': choose one of f32, int16"),
    (dict(group_size=0), "group_size = 0 must be between 1 and 65535"),
    (dict(max_batch=0), "max_batch = 0"),
    (dict(byte_order="middle"), "byte_order = 'middle'"),
])
def test_option_errors(hf_checkpoint, kwargs, message):
    with pytest.raises(ConversionError, match=message.replace("(", r"\(")):
        ColibriExporter(hf_checkpoint("tiny"), **kwargs)


# --- command line --------------------------------------------------------------------

def test_cli_convert_with_options(hf_checkpoint, tmp_path, capsys):
    out = tmp_path / "m.colibri"
    rc = cli.main(["convert", str(hf_checkpoint("awkward")), "-o", str(out), "--quant", "int8",
                   "--router", "f32", "--experts", "f32", "--attention", "f32",
                   "--embedding", "int16", "--lm-head", "int8", "--group-size", "8",
                   "--max-seq-len", "48", "--max-batch", "3", "--num-experts", "6",
                   "--top-k", "2", "--byte-order", "big"])
    assert rc == 0
    assert f"wrote {out}" in capsys.readouterr().out
    cf = F.read_file(out)
    s = cf.shape
    assert (s.group_size, s.max_seq_len, s.max_batch, s.top_k, cf.byte_order) == (
        8, 48, 3, 2, "big")
    d = cf.dtypes
    assert (d[Kind.ROUTER], d[Kind.EXPERT_W1], d[Kind.WQ], d[Kind.EMBED], d[Kind.LM_HEAD]) == (
        DType.F32, DType.F32, DType.F32, DType.I16_ROW, DType.I8_GROUP)


def test_cli_errors_are_one_line_exit_2(hf_checkpoint, tmp_path, capsys):
    src = hf_checkpoint("tiny")
    capsys.readouterr()   # what making the checkpoint printed (transformers' progress bar)
    rc = cli.main(["convert", str(src), "-o", str(tmp_path / "x.colibri"),
                   "--num-experts", "3"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("colibri: error: num_experts = 3, but config.json has "
                          "num_local_experts = 4")
    assert err.count("\n") == 1
    rc = cli.main(["convert", str(tmp_path / "nowhere"), "-o", str(tmp_path / "x.colibri")])
    assert rc == 2
    assert "nowhere does not exist: give a Hugging Face checkpoint directory" in \
        capsys.readouterr().err


def test_jobs_write_the_bytes_one_process_writes(hf_checkpoint, tmp_path, monkeypatch):
    """Tensors quantised on worker processes (colibri/file/encode_pool.py)
    are written in the file's order, byte for byte what one process writes:
    the q4 mix on k256 has Q4_K, Q5_K, Q6_K and Q5_0 tensors (each sent to
    a worker here, however small), int16 and float32 ones (encoded in this
    process). More workers than tensors in flight, and than cores. Each
    layer's progress line comes once its last tensor is written, in order."""
    from colibri.file import encode_pool
    monkeypatch.setattr(encode_pool, "POOL_MIN_WEIGHTS", 0)
    src = hf_checkpoint("k256")
    one, three = tmp_path / "one.colibri", tmp_path / "three.colibri"
    ColibriExporter(src, quant="q4").export(one)
    lines = []
    ex = ColibriExporter(src, quant="q4", jobs=3, progress=lines.append)
    ex.export(three)
    assert one.read_bytes() == three.read_bytes()
    assert_one_line_per_layer(lines, ex.shape.n_layers)
    stored = {DType(e.dtype) for e in F.read_file(one).entries}
    assert {DType.Q4_K, DType.Q5_K, DType.Q6_K, DType.Q5_0} <= stored, stored


def test_a_worker_s_error_names_the_tensor_and_leaves_no_file(hf_checkpoint, tmp_path, capsys,
                                                             monkeypatch):
    """A tensor a worker process cannot encode (a weight past fp16's range
    for a block type) stops the conversion with the one-process message,
    naming the tensor; no partial file is left, and the CLI says it in one
    line."""
    from colibri.file import encode_pool
    monkeypatch.setattr(encode_pool, "POOL_MIN_WEIGHTS", 0)
    name = "model.layers.1.block_sparse_moe.experts.2.w1.weight"

    def huge(t):
        t[name] = t[name].clone()
        t[name][2, 7] = 1e6
    d = _edited(hf_checkpoint("k256"), tmp_path / "d", edit=huge)
    want = f"tensor '{name}': a weight of magnitude 1e\\+06 is beyond fp16's range"
    for jobs in (1, 2):
        with pytest.raises(ConversionError, match=want):
            ColibriExporter(d, quant="q4", jobs=jobs).export(tmp_path / "x.colibri")
        assert list(tmp_path.glob("x.colibri*")) == []
    capsys.readouterr()
    rc = cli.main(["convert", str(d), "-o", str(tmp_path / "x.colibri"), "--quant", "q4",
                   "--jobs", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"colibri: error: tensor '{name}': a weight of magnitude"), err
    rc = cli.main(["convert", str(d), "-o", str(tmp_path / "x.colibri"), "--jobs", "0"])
    assert rc == 2
    assert capsys.readouterr().err == ("colibri: error: --jobs 0: give 1 or more worker "
                                       "processes\n")
    with pytest.raises(ConversionError, match="jobs = 0: the worker processes"):
        ColibriExporter(d, jobs=0)


def test_no_worker_processes_means_one_process(monkeypatch):
    """Where worker processes cannot start (no process-shared semaphores: a
    container without /dev/shm), EncodePool encodes in this process, the
    same bytes, instead of failing."""
    from colibri.file import encode_pool, storage
    from colibri.file import blocks

    def no_semaphores(*args, **kwargs):
        raise OSError(38, "Function not implemented")
    monkeypatch.setattr(encode_pool.cf, "ProcessPoolExecutor", no_semaphores)
    monkeypatch.setattr(encode_pool, "POOL_MIN_WEIGHTS", 0)
    w = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    with encode_pool.EncodePool(2) as pool:
        got = pool.submit(w, blocks.Q4_K, 32).result()
        assert pool.jobs == 1
    want = storage.encode(w, blocks.Q4_K, 32)
    assert got[0].tobytes() == want[0].tobytes() and got[1] is want[1] is None


class _KillsItsWorker(np.ndarray):
    """Weights whose unpickling ends the worker process that receives them
    (os._exit), as the kernel's OOM killer would."""

    def __reduce__(self):
        import os
        return (os._exit, (3,))


def test_a_worker_that_dies_is_a_one_line_error(hf_checkpoint, tmp_path, monkeypatch):
    """A worker process that stops mid-tensor (concurrent.futures'
    BrokenProcessPool) stops the conversion with a ConversionError naming the
    first tensor not written (every queued one fails with the pool, so it
    can be one submitted before the culprit) and the way out, and leaves no
    partial file."""
    from colibri.file import encode_pool
    monkeypatch.setattr(encode_pool, "POOL_MIN_WEIGHTS", 0)
    name = "model.layers.0.block_sparse_moe.experts.1.w3.weight"
    ex = ColibriExporter(hf_checkpoint("k256"), quant="q4", jobs=2)
    load = ex.load
    monkeypatch.setattr(ex, "load", lambda st: load(st).view(_KillsItsWorker)
                        if st.source.name == name else load(st))
    with pytest.raises(ConversionError, match=r"a worker process stopped \(killed for memory\?\) "
                       r"while tensors from 'model\.layers\.0\.block_sparse_moe\.experts\.[01]\."
                       r"w[123]\.weight' on were being encoded: convert with fewer --jobs, "
                       r"or --jobs 1$"):
        ex.export(tmp_path / "x.colibri")
    assert list(tmp_path.glob("x.colibri*")) == []


def test_unfused_mlp_prefix(hf_checkpoint, tmp_path):
    """Mixtral names with transformers 5's `mlp` module name instead of
    `block_sparse_moe` (a checkpoint renamed but not fused) convert the same."""
    src = hf_checkpoint("tiny")
    d = tmp_path / "mlp"
    d.mkdir()
    shutil.copy(src / "config.json", d / "config.json")
    tensors = {k.replace(".block_sparse_moe.", ".mlp."): v
               for k, v in load_file(src / "model.safetensors").items()}
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    ColibriExporter(d, quant="int8").export(tmp_path / "a.colibri")
    ColibriExporter(src, quant="int8").export(tmp_path / "b.colibri")
    assert (tmp_path / "a.colibri").read_bytes() == (tmp_path / "b.colibri").read_bytes()


def test_convert_says_where_a_type_did_not_fit_its_rows(tmp_path, capsys):
    """A kind whose chosen type (the preset's or an option's) does not fit
    its rows is stored in a fallback (format.fit_dtype): convert says so, one
    note per (chosen, stored, width) naming the kinds; kinds stored as
    chosen are not named. Judged by the written file's types."""
    from colibri.model.export import preset_dtypes
    ckpt = Path(__file__).resolve().parent.parent / "models" / "demo" / "checkpoint"
    out = tmp_path / "d.colibri"
    assert cli.main(["convert", str(ckpt), "-o", str(out), "--quant", "q4",
                     "--embedding", "q4_k", "--router", "f32"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
    chosen = preset_dtypes("q4", embedding="q4_k", router="f32")
    cf = F.read_file(out)
    stored = {Kind(e.kind): DType(e.dtype) for e in cf.entries if e.kind in Kind._value2member_map_}
    cf.close()
    moved = {k: dt for k, dt in stored.items() if k in chosen and dt != chosen[k]}
    assert moved.get(Kind.EMBED) == DType.Q5_0, moved     # the option on 128-wide rows
    for kind, dt in moved.items():
        line = next((n for n in notes if f" {kind.name}," in n or f" {kind.name}:" in n), None)
        assert line and f"{dt.name} instead of {chosen[kind].name}" in line, (kind, notes)
    named = {k for n in notes for k in Kind if f" {k.name}," in n or f" {k.name}:" in n}
    assert named == set(moved), (named, notes)


def test_convert_says_which_of_two_choices_a_tied_matrix_took(tmp_path, capsys):
    """The demo ties its embedding and LM head: given both --embedding and
    --lm-head, the one matrix takes --lm-head's type, and convert says that
    --embedding did not apply."""
    ckpt = Path(__file__).resolve().parent.parent / "models" / "demo" / "checkpoint"
    out = tmp_path / "d.colibri"
    assert cli.main(["convert", str(ckpt), "-o", str(out), "--quant", "int8",
                     "--embedding", "q4_k", "--lm-head", "f32"]) == 0
    err = capsys.readouterr().err
    cf = F.read_file(out)
    assert cf.desc.has(F.Feat.TIED_LM_HEAD) and cf.entry(Kind.EMBED).dtype == DType.F32
    cf.close()
    assert "stored as --lm-head f32" in err and "--embedding q4_k does not apply" in err, err


def test_convert_notes_a_cache_longer_than_the_trained_positions(tmp_path, capsys):
    """--max-seq-len past config.json's max_position_embeddings (the demo's
    256) is allowed, with a note; up to it, no note."""
    ckpt = Path(__file__).resolve().parent.parent / "models" / "demo" / "checkpoint"
    trained = json.loads((ckpt / "config.json").read_text())["max_position_embeddings"]
    for n, noted in ((trained, False), (trained + 44, True)):
        assert cli.main(["convert", str(ckpt), "-o", str(tmp_path / "d.colibri"),
                         "--max-seq-len", str(n)]) == 0
        err = capsys.readouterr().err
        assert (f"max_seq_len {n} is beyond the checkpoint's max_position_embeddings "
                f"{trained}" in err) == noted, err
