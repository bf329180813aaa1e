"""Format version 2: every feature of a model's description (biases, q/k
norms per head and over the whole projection, clip_qkv, shared expert with
and without its gate, router probabilities kept or renormalised, the four
multipliers, dense layers mixed with MoE layers), through the Python reader,
the numpy reference and the C runtime (reference and host SIMD kernels).

The models are random (tests/feature_models.py); golden values for the
reference come from transformers in the per-family golden tests. Here the C
runtime must follow the reference: f32 within 1e-4 of the largest logit, int8
rows as the Mixtral golden test bounds them. Version 1 files keep loading
(test_runtime_golden.py runs them all).
"""
from __future__ import annotations

import numpy as np
import pytest

from colibri.file import format as F
from colibri.model.reference import Reference
from feature_models import DESCRIPTIONS, SHAPE, write_model
from greedy import assert_argmax_agrees
from test_runtime_support import (c_build, golden_calls, reference_logits,  # noqa: F401
                                  relative_row_error, run_driver, valid_rows)

F32_ATOL = 1e-4


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("features")
    cache = {}

    def get(name, quant="f32", byte_order="little"):
        key = (name, quant, byte_order)
        if key not in cache:
            dtypes = F.PRESET_INT8 if quant == "int8" else None
            cache[key] = write_model(root / f"{name}-{quant}-{byte_order}.colibri",
                                     DESCRIPTIONS[name], dtypes=dtypes,
                                     byte_order=byte_order, seed=len(name))
        return cache[key]
    return get


@pytest.mark.parametrize("name", sorted(DESCRIPTIONS))
def test_description_round_trips(model, name):
    cf = F.read_file(model(name))
    assert cf.version == 2
    assert cf.desc == DESCRIPTIONS[name].resolved(SHAPE)
    assert cf.entries[0].kind == F.Kind.DESC


def test_mixtral_description_writes_version_1(tmp_path):
    """A file is written in the lowest version that states it."""
    p = write_model(tmp_path / "m.colibri", F.Description())
    cf = F.read_file(p)
    assert cf.version == 1 and cf.desc == F.Description.default(SHAPE)
    assert all(e.kind != F.Kind.DESC for e in cf.entries)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", sorted(DESCRIPTIONS))
def test_f32_c_runtime_follows_reference(c_build, model, tmp_path, name, batch):
    path = model(name)
    ref = Reference(path)
    calls = golden_calls(SHAPE.vocab, batch, seed=batch + len(name))
    want = valid_rows(calls, reference_logits(ref, calls))
    for variant in ("ref", "host"):
        got = valid_rows(calls, run_driver(c_build(variant), path, calls, tmp_path / variant,
                                           vocab=SHAPE.vocab))
        err = np.abs(got - want).max() / np.abs(want).max()
        print(f"{name} batch {batch} {variant}: max abs diff / max logit {err:.3g}")
        assert err <= F32_ATOL, f"{name} {variant} kernels: max |C - ref| / max = {err:.3g}"
        assert_argmax_agrees(got, want, what=f"{name} {variant} kernels")


@pytest.mark.parametrize("name", sorted(DESCRIPTIONS))
def test_int8_c_runtime_follows_reference_of_same_file(c_build, model, tmp_path, name):
    path = model(name, "int8")
    ref = Reference(path)
    calls = golden_calls(SHAPE.vocab, 3, seed=len(name))
    want = valid_rows(calls, reference_logits(ref, calls))
    for variant in ("ref", "host"):
        got = valid_rows(calls, run_driver(c_build(variant), path, calls, tmp_path / variant,
                                           vocab=SHAPE.vocab))
        rel = relative_row_error(got, want)
        # As test_runtime_golden: an int8 activation rounding flip moves a
        # row (and the later rows of its sequence) by up to ~1e-2.
        assert np.median(rel) <= 1e-5, f"{name} {variant}: median row {np.median(rel):.3g}"
        assert rel.max() <= 3e-2, f"{name} {variant}: worst row {rel.max():.3g}"
        assert np.mean(got.argmax(-1) == want.argmax(-1)) >= 0.95


@pytest.mark.parametrize("name", ["qwen2", "granite"])
def test_big_endian_file_gives_the_same_logits(c_build, model, tmp_path, name):
    """The DESC section stays in file order (it is read like the header); the
    runtime swaps the rest: a big-endian file computes the same bits."""
    calls = golden_calls(SHAPE.vocab, 1, seed=3, prefill=9, decode=2)
    build = c_build("ref")
    le = run_driver(build, model(name), calls, tmp_path / "le", vocab=SHAPE.vocab)
    be = run_driver(build, model(name, byte_order="big"), calls, tmp_path / "be",
                    vocab=SHAPE.vocab)
    for a, b in zip(le, be):
        np.testing.assert_array_equal(a, b)


def test_router_dump_skips_dense_layers(c_build, model):
    """colibri-cli --dump-router-lut prints the routers of the MoE layers
    (a dense layer has none), as the reference reads them."""
    import subprocess
    path = model("qwen2", "int8")
    cf = F.read_file(path)
    p = subprocess.run([str(c_build("ref").cli), "--model", str(path), "--dump-router-lut"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    got = np.array([float(x) for x in p.stdout.split()], dtype=np.float32)
    want = np.concatenate([cf.dequantized(F.Kind.ROUTER, l).ravel()
                           for l in range(SHAPE.n_layers) if not cf.desc.is_dense(l)])
    assert cf.desc.dense_layers == (1,) and got.size == want.size
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
