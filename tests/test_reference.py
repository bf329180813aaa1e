"""Unit tests of the numpy reference (colibri/model/reference.py), on small random
models written with the format writer (no torch needed): each piece against a
direct formula, and the cache/mask/batch behaviour against plain full
forwards."""
from __future__ import annotations

import numpy as np
import pytest

from colibri.file import format as F
from colibri.errors import ColibriError
from colibri.file.format import Kind
from colibri.model.reference import Reference, apply_rope, attention, rope_tables, silu, top_k
from greedy import assert_margins

SHAPE = F.ModelShape(vocab=50, hidden=36, intermediate=28, max_seq_len=24, n_layers=2,
                     n_heads=6, n_kv_heads=2, head_dim=8, n_experts=5, top_k=2,
                     max_batch=3, group_size=16, rope_theta=1e4, rms_eps=1e-5)


def write_random_model(path, shape=SHAPE, dtypes=None, seed=0, override=None):
    """A random model of unit-scale activations; override(kind, layer,
    expert, w) may replace any weight."""
    rng = np.random.default_rng(seed)
    with F.ColibriWriter(path, shape, dtypes) as w:
        for kind, layer, expert in F.tensor_order(shape):
            rows, cols = F.expected_shape(shape, kind)
            if rows == 1:     # norms
                m = 1 + 0.1 * rng.standard_normal((rows, cols))
            elif kind == Kind.EMBED:
                m = rng.standard_normal((rows, cols))
            else:
                m = rng.standard_normal((rows, cols)) / np.sqrt(cols)
            m = m.astype(np.float32)
            if override is not None:
                m = override(kind, layer, expert, m)
            w.add(kind, layer, expert, m)
    return path


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return Reference(write_random_model(tmp_path_factory.mktemp("ref") / "m.colibri"))


def toks(shape, seed=0, vocab=SHAPE.vocab):
    return np.random.default_rng(seed).integers(0, vocab, size=shape)


# ---- pieces against direct formulas ------------------------------------------

def test_rope_matches_direct_formula():
    d, theta = 10, 5e4
    positions = np.array([0, 1, 7, 23])
    x = np.random.default_rng(1).standard_normal((1, 4, 3, d)).astype(np.float32)
    cos, sin = rope_tables(positions, d, theta)
    got = apply_rope(x, cos, sin)
    want = np.empty_like(x, dtype=np.float64)
    for t, pos in enumerate(positions):
        for i in range(d // 2):
            a = pos * theta ** (-2 * i / d)
            c, s = np.cos(a), np.sin(a)
            want[0, t, :, i] = x[0, t, :, i] * c - x[0, t, :, i + d // 2] * s
            want[0, t, :, i + d // 2] = x[0, t, :, i + d // 2] * c + x[0, t, :, i] * s
    np.testing.assert_allclose(got, want, atol=2e-5)
    np.testing.assert_array_equal(got[0, 0], x[0, 0])  # position 0 is the identity


def test_top_k_breaks_ties_towards_lower_index():
    p = np.array([[0.25, 0.25, 0.25, 0.25],
                  [0.1, 0.3, 0.3, 0.3],
                  [0.2, 0.1, 0.5, 0.2],
                  [0.4, 0.1, 0.1, 0.4]], dtype=np.float32)
    idx, vals = top_k(p, 2)
    np.testing.assert_array_equal(idx, [[0, 1], [1, 2], [2, 0], [0, 3]])
    np.testing.assert_array_equal(vals, np.take_along_axis(p, idx, axis=1))


def test_model_routing_ties_pick_lowest_experts(tmp_path):
    """A zero router gives equal probabilities: every token must take experts
    0..top_k-1, with equal weights."""
    def zero_router(kind, layer, expert, m):
        return np.zeros_like(m) if kind == Kind.ROUTER else m
    r = Reference(write_random_model(tmp_path / "z.colibri", override=zero_router))
    r.forward(toks((2, 5)))
    for routing in r.routing():
        assert routing.experts.shape == (2, 5, SHAPE.top_k)
        np.testing.assert_array_equal(routing.experts, np.broadcast_to(
            np.arange(SHAPE.top_k), (2, 5, SHAPE.top_k)))
        np.testing.assert_allclose(routing.weights, 1 / SHAPE.top_k, rtol=1e-6)


def test_attention_query_with_no_visible_key_is_zero():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 3, 4, 6)).astype(np.float32)
    k = rng.standard_normal((1, 2, 3, 6)).astype(np.float32)
    v = rng.standard_normal((1, 2, 3, 6)).astype(np.float32)
    visible = np.array([[[False, False, False],
                         [False, True, False],
                         [True, True, True]]])
    out = attention(q, k, v, visible)
    np.testing.assert_array_equal(out[0, 0], 0)
    # Row 1 sees one key: the output is exactly that key's value for every head.
    for h in range(4):
        np.testing.assert_allclose(out[0, 1, h], v[0, h // 2, 1], rtol=1e-6)
    # Row 2 against a direct softmax in float64.
    for h in range(4):
        sc = k[0, h // 2].astype(np.float64) @ q[0, 2, h] / np.sqrt(6)
        p = np.exp(sc - sc.max())
        np.testing.assert_allclose(out[0, 2, h], (p / p.sum()) @ v[0, h // 2], rtol=1e-5)


def test_leading_padding_gives_finite_logits(ref):
    tokens = toks((2, 6), seed=3)
    mask = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    logits = ref.forward(tokens, mask)
    assert np.all(np.isfinite(logits))


def test_masked_slot_is_invisible(ref):
    """Changing the token in a padding slot does not change any valid
    position's logits (positions stay slot indices)."""
    tokens = toks((1, 8), seed=4)
    mask = np.array([[1, 1, 0, 1, 1, 0, 1, 1]])
    a = ref.forward(tokens, mask)
    tokens2 = tokens.copy()
    tokens2[0, [2, 5]] = (tokens[0, [2, 5]] + 7) % SHAPE.vocab
    b = ref.forward(tokens2, mask)
    valid = mask[0] == 1
    # Not bit-equality: the MoE multiplies each expert's tokens as one matrix,
    # and the new padding tokens route differently, so valid tokens land in
    # groups of other sizes; OpenBLAS rounds an sgemm differently for another
    # number of rows on some CPUs (Haswell/Zen kernels: up to 1e-6). A leak of
    # the padding slot into a valid position moves it by far more, as the
    # control below shows, so 1e-5 still catches one.
    np.testing.assert_allclose(a[0, valid], b[0, valid], atol=1e-5, rtol=0)
    assert np.abs(a[0, 2] - b[0, 2]).max() > 1e-2  # the padding slot itself changed
    # Control: with the two slots visible, the same change moves later valid
    # positions by far more than the tolerance.
    c = ref.forward(tokens, np.ones_like(mask))
    d = ref.forward(tokens2, np.ones_like(mask))
    assert np.abs(c[0, 6:] - d[0, 6:]).max() > 1e-3


def test_silu_is_finite_for_large_inputs():
    v = np.array([-1e4, -100, 0, 3, 1e4], dtype=np.float32)
    out = silu(v)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, [0, -100 / (1 + np.exp(100.0)), 0,
                                     3 / (1 + np.exp(-3.0)), 1e4], rtol=1e-6, atol=1e-30)


# ---- cache, batch and generation ------------------------------------------

def test_cached_decode_equals_full_prefill(ref):
    tokens = toks((2, 20), seed=5)
    full = ref.forward(tokens)
    part = [ref.forward(tokens[:, :12])]
    for t in range(12, 20):
        part.append(ref.forward(tokens[:, t:t + 1], n_past=t))
    np.testing.assert_allclose(np.concatenate(part, axis=1), full, atol=1e-5, rtol=0)
    # Chunks of several tokens too.
    ref.forward(tokens[:, :5])
    chunk = ref.forward(tokens[:, 5:13], n_past=5)
    np.testing.assert_allclose(chunk, full[:, 5:13], atol=1e-5, rtol=0)
    assert ref.cached_length == 13


def test_rewinding_n_past_drops_later_positions(ref):
    a = toks((1, 16), seed=6)
    b = toks((1, 5), seed=7)
    ref.forward(a)
    rewound = ref.forward(b, n_past=8)
    fresh = ref.forward(np.concatenate([a[:, :8], b], axis=1))[:, 8:]
    np.testing.assert_allclose(rewound, fresh, atol=1e-5, rtol=0)
    assert ref.cached_length == 13


def test_cached_mask_is_remembered(ref):
    tokens = toks((1, 10), seed=8)
    mask = np.array([[1, 1, 0, 1, 1, 1, 0, 1, 1, 1]])
    full = ref.forward(tokens, mask)
    ref.forward(tokens[:, :7], mask[:, :7])
    step = ref.forward(tokens[:, 7:], n_past=7)  # mask None = the new tokens are real
    np.testing.assert_allclose(step, full[:, 7:], atol=1e-5, rtol=0)


def test_batch_rows_equal_single_runs(ref):
    lengths = [9, 4, 7]
    tokens = toks((3, 9), seed=9)
    mask = np.zeros((3, 9), dtype=int)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    batch = ref.forward(tokens, mask)
    for i, n in enumerate(lengths):
        alone = ref.forward(tokens[i:i + 1, :n])
        np.testing.assert_allclose(batch[i, :n], alone[0], atol=1e-5, rtol=0)


def test_generate_is_greedy_over_full_forwards(ref):
    prompt = toks(6, seed=10)
    gen, rows = ref.generate(prompt, 7)
    assert gen.shape == (7,) and rows.shape == (6 + 7 - 1, SHAPE.vocab)
    seq = np.concatenate([prompt, gen])
    full = ref.forward(seq[None, :-1])[0]
    np.testing.assert_allclose(rows, full, atol=1e-5, rtol=0)
    # The full forward's rows (other matrix sizes) choose the same tokens:
    # checked margins make that independent of the CPU's rounding.
    assert_margins(full[5:], what="greedy rows")
    np.testing.assert_array_equal(np.argmax(full, axis=-1)[5:], gen)
    # Batched generation gives each row's own greedy continuation.
    prompts = np.stack([prompt, toks(6, seed=11)])
    gen2, rows2 = ref.generate(prompts, 7)
    np.testing.assert_array_equal(gen2[0], gen)
    assert rows2.shape == (2, 12, SHAPE.vocab)


def test_router_choices_record_last_forward(ref):
    ref.forward(toks((2, 3), seed=12))
    choices = ref.router_choices()
    assert len(choices) == SHAPE.n_layers
    for c in choices:
        assert c.shape == (2, 3, SHAPE.top_k)
        assert np.all((c >= 0) & (c < SHAPE.n_experts))
        assert np.all(c[..., 0] != c[..., 1])


# ---- input validation --------------------------------------------------------

@pytest.mark.parametrize("call, message", [
    (lambda r: r.forward([[1, 50]]), "token id 50 at [0, 1] is outside the vocabulary"),
    (lambda r: r.forward([[1, -1]]), "token id -1"),
    (lambda r: r.forward(np.ones((4, 2), int)), "batch 4 is above the model's max_batch 3"),
    (lambda r: r.forward(np.ones((1, 25), int)), "above the model's max_seq_len 24"),
    (lambda r: r.forward(np.ones((1, 1), int), n_past=-1), "n_past must be"),
    (lambda r: r.forward([[1.5, 2]]), "tokens must be integers"),
    (lambda r: r.forward([[1, 2]], mask=[[1, 2]]), "mask entries must be 0"),
    (lambda r: r.forward([[1, 2]], mask=[[1, 1, 1]]), "mask shape"),
    (lambda r: r.forward(np.ones((1, 1, 1), int)), "tokens must be [batch, seq]"),
    (lambda r: r.forward(np.ones((1, 0), int)), "batch and seq must be >= 1"),
])
def test_bad_inputs_are_refused(ref, call, message):
    with pytest.raises(ColibriError) as exc:
        call(ref)
    assert message in str(exc.value)


def test_continuing_beyond_cache_or_with_other_batch_is_refused(ref):
    ref.forward(toks((2, 4)))
    with pytest.raises(ColibriError, match="beyond the 4 cached positions"):
        ref.forward(toks((2, 1)), n_past=5)
    with pytest.raises(ColibriError, match="differs from the cached batch 2"):
        ref.forward(toks((1, 1)), n_past=4)
    with pytest.raises(ColibriError, match="above the model's max_seq_len"):
        ref.forward(toks((2, 21)), n_past=4)
    with pytest.raises(ColibriError, match="max_seq_len"):
        ref.generate(toks(20), 6)


# ---- quantised products (the torch-free counterpart of test_reference_int8) ----

def test_every_int8_product_equals_the_shared_formula(tmp_path):
    """On a random --quant int8 model, every I8_GROUP product the reference
    applies gives the same bits as colibri.file.quant.matmul_i8 (int64 dots)."""
    from colibri.file import quant
    r = Reference(write_random_model(tmp_path / "q.colibri", dtypes=F.PRESET_INT8))
    x_rng = np.random.default_rng(13)
    keys = [(Kind.LM_HEAD, None, None)]
    for layer in range(SHAPE.n_layers):
        keys += [(k, layer, None) for k in (Kind.WQ, Kind.WK, Kind.WV, Kind.WO)]
        keys += [(k, layer, e) for e in range(SHAPE.n_experts)
                 for k in (Kind.EXPERT_W1, Kind.EXPERT_W3, Kind.EXPERT_W2)]
    for kind, layer, expert in keys:
        t = r.file.tensor(kind, layer, expert)
        assert t.dtype == F.DType.I8_GROUP
        x = x_rng.standard_normal((3, t.cols)).astype(np.float32)
        xq, xs = quant.quantize_activations_i8(x, SHAPE.group_size)
        np.testing.assert_array_equal(
            r.linear(kind, x, layer, expert),
            quant.matmul_i8(xq, xs, t.values, t.scales, SHAPE.group_size))
    assert np.all(np.isfinite(r.forward(toks((2, 6)))))


@pytest.mark.parametrize("group", [5, 8000])  # 8000 * 127^2 > 2^26: float64 dots
def test_i8_group_matrix_dots_are_exact(group):
    from colibri.file import quant
    from colibri.model.reference import I8GroupMatrix
    rng = np.random.default_rng(14)
    cols = 2 * group + 7  # two full groups and a short one
    # Large same-sign values so that group dots exceed 2^24 for the big group
    # (a float32 sum would round them), and -128, never written but legal.
    q = rng.choice(np.array([-128, 125, 126, 127], dtype=np.int8), size=(4, cols),
                   p=[0.1, 0.3, 0.3, 0.3])
    ng = -(-cols // group)
    scales = rng.uniform(0.5, 2, (4, ng)).astype(np.float32)
    x = rng.uniform(0.9, 1.0, (2, cols)).astype(np.float32)
    x[1] *= -1
    got = I8GroupMatrix(q, scales, group)(x)
    xq, xs = quant.quantize_activations_i8(x, group)
    np.testing.assert_array_equal(got, quant.matmul_i8(xq, xs, q, scales, group))
