"""Golden tests: the numpy reference on a converted float32 file against
transformers' MixtralForCausalLM on the same checkpoint.

Path under test: make_mixtral -> save_pretrained -> ColibriExporter(quant="f32")
-> Reference. Logits are of unit scale (checked), so the 1e-4 bound is absolute
and relative at once. transformers uses eager attention and no position_ids:
positions are slot indices, as FORMAT.md section 6 says.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import GOLDEN_NAMES
from greedy import assert_margins

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ATOL = 1e-4
MAX_DIFF: dict[str, float] = {}  # worst difference seen per config, printed at the end


@pytest.fixture(scope="module", autouse=True)
def _torch_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)
    if MAX_DIFF:
        print("\nreference vs transformers, max |logit diff| (f32 file): "
              + ", ".join(f"{k} {v:.2e}" for k, v in sorted(MAX_DIFF.items())))


def _compare(name: str, ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    assert ours.shape == theirs.shape, what
    assert np.all(np.isfinite(ours)), what
    # Unit-scale logits: an absolute 1e-4 bound is then a tight relative one.
    assert theirs.std() > 0.3, f"{what}: logits std {theirs.std()} too small to test"
    diff = float(np.max(np.abs(ours - theirs)))
    MAX_DIFF[name] = max(MAX_DIFF.get(name, 0.0), diff)
    assert diff < ATOL, f"{name} {what}: max |diff| {diff:.3e} >= {ATOL}"


def _hf_logits(model, tokens, mask=None, cache=None):
    with torch.no_grad():
        out = model(torch.as_tensor(tokens),
                    attention_mask=None if mask is None else torch.as_tensor(mask),
                    cache=cache, use_cache=cache is not None)
    return out.logits.float().numpy(), out


def _tokens(name, hf_model, shape, seed):
    vocab = hf_model(name).config.vocab_size
    return np.random.default_rng(seed).integers(0, vocab, size=shape)


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_prefill_32(name, hf_model, reference):
    model, ref = hf_model(name), reference(name, "f32")
    tokens = _tokens(name, hf_model, (1, 32), seed=1)
    theirs, _ = _hf_logits(model, tokens)
    _compare(name, ref.forward(tokens), theirs, "prefill 32, batch 1")


def _right_padded(name, hf_model, lengths, seed):
    b, s = len(lengths), max(lengths)
    tokens = _tokens(name, hf_model, (b, s), seed)
    mask = np.zeros((b, s), dtype=np.int64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        tokens[i, n:] = 0  # padding token; its slots are masked out
    return tokens, mask


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_prefill_batch3_right_padding(name, hf_model, reference):
    model, ref = hf_model(name), reference(name, "f32")
    lengths = [32, 21, 7]
    tokens, mask = _right_padded(name, hf_model, lengths, seed=2)
    theirs, _ = _hf_logits(model, tokens, mask)
    ours = ref.forward(tokens, mask)
    for i, n in enumerate(lengths):  # padding slots carry no meaning
        _compare(name, ours[i, :n], theirs[i, :n], f"batch 3 row {i} ({n} tokens)")


@pytest.mark.parametrize("name", GOLDEN_NAMES)
@pytest.mark.parametrize("lengths", [[16], [16, 11, 4]], ids=["batch1", "batch3"])
def test_decode_16_steps_with_cache(name, lengths, hf_model, reference):
    """Prefill (right-padded for batch 3), then 16 single-token steps through
    both KV caches, compared step by step with transformers' own cache path."""
    model, ref = hf_model(name), reference(name, "f32")
    tokens, mask = _right_padded(name, hf_model, lengths, seed=3)
    b, s = tokens.shape
    theirs, out = _hf_logits(model, tokens, mask, cache=_new_cache(model))
    ours = ref.forward(tokens, mask)
    for i, n in enumerate(lengths):
        _compare(name, ours[i, :n], theirs[i, :n], f"decode prefill row {i}")
    cache = out.cache
    steps = _tokens(name, hf_model, (b, 16), seed=4)
    for t in range(16):
        mask = np.concatenate([mask, np.ones((b, 1), dtype=np.int64)], axis=1)
        theirs, out = _hf_logits(model, steps[:, t:t + 1], mask, cache=cache)
        cache = out.cache
        ours = ref.forward(steps[:, t:t + 1], n_past=s + t)
        _compare(name, ours, theirs, f"decode step {t}")


def _new_cache(model):
    from transformers import DynamicCache
    return DynamicCache(config=model.config)


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_greedy_generation_matches_transformers(name, hf_model, reference):
    model, ref = hf_model(name), reference(name, "f32")
    prompt = _tokens(name, hf_model, (1, 8), seed=5)
    with torch.no_grad():
        hf_out = model.generate(torch.as_tensor(prompt), max_new_tokens=12, do_sample=False,
                                pad_token_id=0, eos_token_id=None)
    theirs = hf_out[0, 8:].numpy()
    ours, rows = ref.generate(prompt[0], 12)
    assert rows.shape == (8 + 12 - 1, model.config.vocab_size)
    # A near tie could legitimately flip the greedy choice (torch and numpy
    # round differently, and differently per CPU): the margins are checked
    # first, so whole-sequence equality does not depend on the machine.
    assert_margins(rows[7:], what=f"{name} greedy rows")
    np.testing.assert_array_equal(ours, theirs)
    full, _ = _hf_logits(model, np.concatenate([prompt[0], ours[:-1]])[None])
    _compare(name, rows, full[0], "generate rows")


def test_cli_convert_and_run_match_transformers(name="awkward", *, hf_model, hf_checkpoint,
                                                tmp_path):
    """The user's path: `colibri convert --quant f32` then `colibri run
    --engine reference --logits-out` (the C engine: tests/test_binding.py),
    read back as little-endian float32 rows."""
    model = hf_model(name)
    out = tmp_path / "m.colibri"
    logits_file = tmp_path / "logits.f32"
    prompt = _tokens(name, hf_model, (1, 10), seed=6)[0]
    cli = [sys.executable, "-m", "colibri.cli"]
    subprocess.run(cli + ["convert", str(hf_checkpoint(name)), "-o", str(out),
                          "--quant", "f32", "-q"], check=True, capture_output=True)
    res = subprocess.run(cli + ["run", str(out), "--engine", "reference",
                                "--tokens", ",".join(map(str, prompt)),
                                "--generate", "4", "--logits-out", str(logits_file)],
                         check=True, capture_output=True, text=True)
    vocab = model.config.vocab_size
    rows = np.fromfile(logits_file, dtype="<f4").reshape(-1, vocab)
    assert rows.shape[0] == 10 + 4 - 1
    generated = [int(t) for t in
                 res.stdout.split("generated:")[1].split()[0].split(",")]
    full_seq = np.concatenate([prompt, generated[:-1]])[None]
    theirs, _ = _hf_logits(model, full_seq)
    _compare(name, rows, theirs[0], "CLI logits")
    assert generated == list(np.argmax(rows, axis=-1)[-4:])
