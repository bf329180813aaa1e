"""The numpy encoder-decoder reference (colibri/model/reference_encdec.py) against
transformers' SwitchTransformersForConditionalGeneration on an awkward tiny
checkpoint (tests/golden_switch.py): encoder output and decoder logits of a
prefill and 8 cached decode steps within 1e-4 of the largest value, with an
encoder batch that has padding and a capacity small enough that tokens
overflow (checked, so the capacity path is really exercised)."""
from __future__ import annotations

import numpy as np
import pytest

from golden_switch import hf_config_dict, hf_state, make_switch, scenario

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

RTOL = 1e-4


@pytest.fixture(scope="module")
def switch():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    model = make_switch(seed=0)
    yield model
    torch.set_num_threads(old)


def _reference(model, max_len=32):
    from colibri.model.families import switch_transformers as st
    from colibri.model.reference_encdec import EncDecReference
    cfg = hf_config_dict(model)
    shape = st.encdec_shape(cfg, max_seq_len=max_len, max_batch=4)
    return EncDecReference(shape, st.weights_from_state(cfg, hf_state(model), shape))


def _rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_sparse_layer_placement_matches_transformers(switch):
    from colibri.model.families import switch_transformers as st
    shape = _reference(switch).shape
    for stack, sparse in ((switch.encoder, shape.enc_sparse), (switch.decoder, shape.dec_sparse)):
        want = tuple(i for i, blk in enumerate(stack.block) if blk.is_sparse)
        assert sparse == want
    assert (shape.enc_sparse, shape.dec_sparse) == ((1, 3), (1,))
    assert st.sparse_layers(12, 6) == tuple(range(1, 12, 2))
    assert st.sparse_layers(1, 0) == (0,)      # transformers' documented quirk


def test_relative_position_buckets_match_transformers():
    from transformers.models.switch_transformers.modeling_switch_transformers import (
        SwitchTransformersAttention as A)
    from colibri.model.reference_encdec import relative_position_bucket
    rel = np.arange(-300, 301)
    for bidir in (True, False):
        for nb, md in ((8, 12), (32, 128), (6, 7), (32, 20)):
            want = A._relative_position_bucket(torch.as_tensor(rel), bidirectional=bidir,
                                               num_buckets=nb, max_distance=md).numpy()
            got = relative_position_bucket(rel, bidir, nb, md)
            np.testing.assert_array_equal(got, want, err_msg=f"{bidir} {nb} {md}")


@pytest.mark.parametrize("enc_lengths", [(11, 7), (16,)])
def test_encoder_and_cached_decoder_match_transformers(switch, enc_lengths):
    ids, mask, calls, enc_want, logits_want = scenario(switch, enc_lengths, 4, 8, seed=3)
    ref = _reference(switch)
    enc = ref.encode(ids, mask)
    valid = mask.astype(bool)
    err = _rel(enc[valid], enc_want[valid])
    assert err <= RTOL, f"encoder output: max |diff| / max = {err:.3g}"
    overflowed = [~kept for _, _, _, kept in ref.routing]
    assert any(o.any() for o in overflowed), "capacity 2 should drop some encoder tokens"
    got = []
    dropped_in_decoder = False
    for c in calls:
        got.append(ref.decode(c))
        dropped_in_decoder |= any((~kept).any() for _, _, _, kept in ref.routing)
    assert dropped_in_decoder, "the decoder prefill should overflow capacity too"
    for i, (g, w) in enumerate(zip(got, logits_want)):
        assert w.std() > 0.1 * np.abs(w).max(), "logits too flat to test"
        err = _rel(g, w)
        assert err <= RTOL, f"decoder call {i}: max |diff| / max |logit| = {err:.3g}"


def test_capacity_overflow_keeps_only_the_residual():
    """A token over its expert's capacity gets no expert output, as
    transformers' cumsum mask gives; probabilities are the softmax max."""
    from colibri.model.reference_encdec import top1_with_capacity
    p = np.array([[[0.6, 0.4], [0.7, 0.3], [0.2, 0.8], [0.9, 0.1]]], np.float32)
    expert, prob, kept = top1_with_capacity(p, 2)
    assert expert.tolist() == [[0, 0, 1, 0]]
    assert kept.tolist() == [[True, True, True, False]]
    np.testing.assert_array_equal(prob, np.float32([[0.6, 0.7, 0.8, 0.9]]))


def test_capacity_mask_matches_the_transformers_router(switch):
    """Random hidden states through transformers' own top-1 router: the
    dispatch mask (expert one-hot with overflow zeroed) is ours."""
    from colibri.model.reference_encdec import softmax, top1_with_capacity
    router = switch.encoder.block[1].layer[1].mlp.router
    x = torch.randn(3, 13, switch.config.d_model, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        mask, prob, logits = router(x)
    expert, p, kept = top1_with_capacity(softmax(logits.numpy()), router.expert_capacity)
    ours = np.eye(router.num_experts, dtype=np.int64)[expert] * kept[..., None]
    np.testing.assert_array_equal(ours, mask.numpy())
    assert (~kept).any() and kept.any()
    np.testing.assert_allclose(p, prob.numpy()[..., 0], rtol=1e-6)


def test_greedy_generation_matches_transformers_generate(switch):
    ref = _reference(switch)
    ids = np.array([5, 9, 33, 2, 17, 40, 8])
    toks, rows = ref.generate(ids, 6)
    with torch.no_grad():
        out = switch.generate(torch.as_tensor(ids[None]), max_new_tokens=6, do_sample=False,
                              min_new_tokens=6, eos_token_id=None)
    assert out[0, 0].item() == switch.config.decoder_start_token_id
    # Token equality only while the choice is clear (1e-4 of the largest
    # logit between the best two): a near-tie may go either way on another CPU.
    for i, row in enumerate(rows):
        top2 = np.sort(row)[-2:]
        if top2[1] - top2[0] <= 1e-4 * np.abs(row).max():
            break
        assert toks[i] == out[0, 1 + i].item(), f"step {i}"
    else:
        assert toks.tolist() == out[0, 1:].tolist()


def test_misuse_is_an_error(switch):
    from colibri.errors import ColibriError
    ref = _reference(switch, max_len=8)
    with pytest.raises(ColibriError, match="decode before encode"):
        ref.decode([[0]])
    with pytest.raises(ColibriError, match="1 to 8"):
        ref.encode(np.ones((1, 9), np.int64))
    ref.encode(np.ones((2, 3), np.int64))
    with pytest.raises(ColibriError, match="batch 1 differs"):
        ref.decode([[0]])
