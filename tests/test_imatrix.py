"""colibri/model/imatrix.py: the importance matrix collected through the numpy
reference, checked against the same means computed directly from the
reference's pieces (embedding lookup + rmsnorm for layer 0's attention
inputs), the routing counts, the file round trip, and its use by convert."""
from __future__ import annotations

import numpy as np
import pytest

from golden_configs import save_mixtral
from colibri.file import format as fmt
from colibri.model import imatrix as im
from colibri.model.convert import ColibriExporter
from colibri.file.format import Kind
from colibri.model.reference import Reference, rmsnorm


@pytest.fixture(scope="module")
def k256(tmp_path_factory):
    d = tmp_path_factory.mktemp("k256")
    model = save_mixtral("k256", d / "hf")
    f32 = ColibriExporter(model, quant="f32").export(d / "f32.colibri")
    return model, f32


def windows():
    rng = np.random.default_rng(0)
    return [rng.integers(0, 96, 20), rng.integers(0, 96, 13)]


def test_collect_matches_direct_means(k256):
    _, f32 = k256
    got = im.collect(f32, windows())
    ref = Reference(f32)
    sh = ref.shape
    xs = np.concatenate([rmsnorm(ref.embed(w), ref.layers[0]["attn_norm"], sh.rms_eps)
                         for w in windows()])
    want = (xs.astype(np.float64) ** 2).mean(0)
    for kind in (Kind.WQ, Kind.WK, Kind.WV):
        mean, count = got[(kind, 0, None)]
        assert count == 33
        np.testing.assert_allclose(mean, want, rtol=1e-5)
    for layer in range(sh.n_layers):
        routed = sum(got[(Kind.EXPERT_W1, layer, e)][1] for e in range(sh.n_experts)
                     if (Kind.EXPERT_W1, layer, e) in got)
        assert routed == 33 * sh.top_k
    assert got[(Kind.LM_HEAD, None, None)][0].shape == (sh.hidden,)
    assert got[(Kind.EXPERT_W2, 0, 0)][0].shape == (sh.intermediate,) \
        if (Kind.EXPERT_W2, 0, 0) in got else True


def test_save_load_and_convert(k256, tmp_path):
    model, f32 = k256
    got = im.collect(f32, windows())
    path = tmp_path / "m.npz"
    im.save(path, got)
    back = im.load(path)
    assert set(back) == set(got)
    for k, (mean, _) in got.items():
        np.testing.assert_array_equal(back[k], mean)
    plain = ColibriExporter(model, quant="q4").export(tmp_path / "plain.colibri")
    weighted = ColibriExporter(model, quant="q4", imatrix=path).export(tmp_path / "w.colibri")
    a, b = fmt.read_file(plain), fmt.read_file(weighted)
    w1_a, w1_b = a.tensor(Kind.EXPERT_W1, 0, 0), b.tensor(Kind.EXPERT_W1, 0, 0)
    assert w1_a.dtype == w1_b.dtype == fmt.DType.Q4_K
    assert w1_a.values.tobytes() != w1_b.values.tobytes()


def test_load_rejects_other_files(tmp_path):
    p = tmp_path / "x.npz"
    p.write_bytes(b"not a zip")
    with pytest.raises(Exception, match="importance matrix"):
        im.load(p)
