"""Golden tests of every non-Mixtral family against transformers (its
modeling files are the truth): a tiny checkpoint per family on awkward shapes
(tests/golden_families.py) -> save_pretrained -> `colibri convert` (the
family module picked from config.json) -> the numpy reference and the C
runtime (reference and host SIMD kernels).

f32: max |diff| <= 1e-4 of the largest logit for a 32-token prefill, 16
KV-cache decode steps and a right-padded batch of 3.
int8 (routed, shared and dense experts and attention int8; norms and biases
f32): the C runtime's error against transformers within 5 % of the numpy
reference's on the same file.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from colibri.file import format as F
from golden_families import FAMILY_CONFIGS, make_family, save_family
from test_runtime_support import Call, c_build, run_driver  # noqa: F401

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

NAMES = tuple(FAMILY_CONFIGS)
RTOL = 1e-4
FIGURES: dict[str, float] = {}   # printed at the end: the closing note's numbers


@pytest.fixture(scope="module", autouse=True)
def _torch_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)
    if FIGURES:
        print("\nfamilies vs transformers (max |diff| / max |logit|):\n  "
              + "\n  ".join(f"{k}: {v:.2e}" for k, v in sorted(FIGURES.items())))


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """family(name) -> (hf model, checkpoint dir, {quant: .colibri path})."""
    root = tmp_path_factory.mktemp("families")
    cache = {}

    def get(name):
        if name not in cache:
            from colibri.model.convert import ColibriExporter
            model = make_family(name, seed=0)
            ck = save_family(model, root / name)
            files = {q: ColibriExporter(ck, quant=q, max_seq_len=64, max_batch=4)
                     .export(root / f"{name}-{q}.colibri") for q in ("f32", "int8")}
            cache[name] = (model, ck, files)
        return cache[name]
    return get


def _hf(model, tokens, mask=None, cache=None):
    with torch.no_grad():
        out = model(torch.as_tensor(tokens),
                    attention_mask=None if mask is None else torch.as_tensor(mask),
                    cache=cache, use_cache=cache is not None)
    return out.logits.float().numpy(), out


def scenario(model, vocab, lengths, decode, seed):
    """Right-padded prefill of `lengths` then `decode` single-token steps:
    (calls, transformers logits per call, valid-row selectors per call)."""
    from transformers import DynamicCache
    rng = np.random.default_rng(seed)
    b, s = len(lengths), max(lengths)
    tokens = rng.integers(0, vocab, size=(b, s))
    mask = np.zeros((b, s), dtype=np.int64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        tokens[i, n:] = 0
    theirs, out = _hf(model, tokens, mask, cache=DynamicCache(config=model.config))
    calls = [Call(tokens, mask if b > 1 else None, 0)]
    want, valid = [theirs], [mask.astype(bool)]
    steps = rng.integers(0, vocab, size=(b, decode))
    for t in range(decode):
        mask = np.concatenate([mask, np.ones((b, 1), dtype=np.int64)], axis=1)
        theirs, out = _hf(model, steps[:, t:t + 1], mask, cache=out.cache)
        calls.append(Call(steps[:, t:t + 1], np.ones((b, 1), dtype=np.int64), s + t))
        want.append(theirs)
        valid.append(np.ones((b, 1), dtype=bool))
    return calls, want, valid


def reference_run(path, calls):
    from colibri.model.reference import Reference
    ref = Reference(path)
    return [ref.forward(c.tokens, c.mask, c.n_past) for c in calls]


def rows(logits, valid):
    return np.concatenate([l[v] for l, v in zip(logits, valid)])


SCENARIOS = {"prefill32+decode16": ([32], 16), "batch3-right-padded+decode16": ([32, 21, 7], 16)}


@pytest.mark.parametrize("scen", sorted(SCENARIOS))
@pytest.mark.parametrize("name", NAMES)
def test_f32_reference_and_c_match_transformers(name, scen, family, c_build, tmp_path):
    model, _, files = family(name)
    vocab = model.config.vocab_size
    lengths, decode = SCENARIOS[scen]
    calls, want, valid = scenario(model, vocab, lengths, decode, seed=len(name))
    theirs = rows(want, valid)
    scale = np.abs(theirs).max()
    assert theirs.std() > 0.1 * scale and scale > 0.3, "logits too flat to test"
    runs = {"reference": reference_run(files["f32"], calls)}
    for variant in ("ref", "host"):
        runs[f"C {variant}"] = run_driver(c_build(variant), files["f32"], calls,
                                          tmp_path / variant, vocab=vocab)
    for what, got in runs.items():
        err = float(np.abs(rows(got, valid) - theirs).max() / scale)
        key = f"{name} f32 {what}"
        FIGURES[key] = max(FIGURES.get(key, 0.0), err)
        assert err <= RTOL, f"{name} {scen} {what}: max |diff| / max |logit| = {err:.3g}"


@pytest.mark.parametrize("name", NAMES)
def test_int8_c_error_within_5_percent_of_the_reference(name, family, c_build, tmp_path):
    model, _, files = family(name)
    vocab = model.config.vocab_size
    cf = F.read_file(files["int8"])
    # Routed, shared and dense experts and attention int8; norms, biases f32.
    for kind in (*F.EXPERT_KINDS, *F.SHARED_KINDS, *F.DENSE_KINDS, F.Kind.WQ):
        if kind in cf.dtypes:
            assert cf.dtypes[kind] == F.DType.I8_GROUP, kind
    for kind in (F.Kind.BQ, F.Kind.Q_NORM, F.Kind.ATTN_NORM):
        if kind in cf.dtypes:
            assert cf.dtypes[kind] == F.DType.F32, kind
    calls, want, valid = scenario(model, vocab, [32, 21, 7], 16, seed=7 + len(name))
    theirs = rows(want, valid)

    def rms(got):
        return float(np.sqrt(np.mean((rows(got, valid) - theirs) ** 2)))
    ref_err = rms(reference_run(files["int8"], calls))
    FIGURES[f"{name} int8 reference rms"] = ref_err
    for variant in ("ref", "host"):
        err = rms(run_driver(c_build(variant), files["int8"], calls, tmp_path / variant,
                             vocab=vocab))
        FIGURES[f"{name} int8 C {variant} / reference error"] = err / ref_err
        assert ref_err > 0 and abs(err - ref_err) <= 0.05 * ref_err, (
            f"{name} int8 C {variant}: rms error {err:.4g} vs reference {ref_err:.4g}")


@pytest.mark.parametrize("name", NAMES)
def test_converter_picks_the_family_and_writes_its_description(name, family):
    model, ck, files = family(name)
    from colibri.model import hf
    cfg = hf.read_config(ck)
    assert cfg.family == name
    cf = F.read_file(files["f32"])
    want = cfg.desc.resolved(cf.shape)
    if cfg.tie_word_embeddings:   # the converter stores one matrix for both
        want = dataclasses.replace(want, features=want.features | F.Feat.TIED_LM_HEAD)
    assert cf.version == 2 and cf.desc == want


@pytest.mark.parametrize("name", ["qwen2_moe", "olmoe"])
def test_fused_expert_checkpoint_converts_to_the_same_file(name, family, tmp_path):
    """transformers 5 holds experts as fused 3-D tensors (gate_up_proj [E,
    2I, H], down_proj [E, H, I]); a checkpoint saved that way converts to the
    same bytes as the per-expert one."""
    import json
    import shutil

    from colibri.model import hf
    from colibri.model.convert import ColibriExporter
    from test_hf import write_safetensors
    model, ck, files = family(name)
    cfg = json.loads((ck / "config.json").read_text())
    n_layers = cfg["num_hidden_layers"]
    n_exp = cfg.get("num_experts") or cfg["num_local_experts"]
    src = hf.Checkpoint(ck)
    out: dict[str, tuple[str, np.ndarray]] = {}
    per_expert = {f"model.layers.{l}.mlp.experts.{e}.{p}.weight"
                  for l in range(n_layers) for e in range(n_exp)
                  for p in ("gate_proj", "up_proj", "down_proj")}
    for tname, info in src.tensors.items():
        if tname not in per_expert:
            out[tname] = ("F32", hf.read_tensor(info).reshape(info.shape))
    for l in range(n_layers):
        pre = f"model.layers.{l}.mlp.experts."
        if pre + "0.gate_proj.weight" not in src:
            continue  # a dense layer
        rd = lambda e, p: hf.read_tensor(src.info(f"{pre}{e}.{p}.weight")).reshape(  # noqa: E731
            src.info(f"{pre}{e}.{p}.weight").shape)
        out[pre + "gate_up_proj"] = ("F32", np.stack(
            [np.concatenate([rd(e, "gate_proj"), rd(e, "up_proj")]) for e in range(n_exp)]))
        out[pre + "down_proj"] = ("F32", np.stack([rd(e, "down_proj") for e in range(n_exp)]))
    fused = tmp_path / "fused"
    fused.mkdir()
    shutil.copy(ck / "config.json", fused / "config.json")
    write_safetensors(fused / "model.safetensors", out)
    got = ColibriExporter(fused, quant="f32", max_seq_len=64, max_batch=4).export(
        tmp_path / "fused.colibri")
    assert got.read_bytes() == files["f32"].read_bytes()
