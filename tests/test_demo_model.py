"""The committed demo model (models/demo/): it loads, it is the model the docs
describe, and the converter + numpy reference reproduce its held-out bits per
byte.

Golden values: models/demo/results.json `test_windows.transformers_bpb`, the
bits per byte that transformers (not the code under test) measured on the first
TEST_WINDOWS committed evaluation windows when eval.py was run. The test
re-measures it with transformers (the checkpoint is unchanged), then converts
the checkpoint with the real converter and runs the numpy reference on the same
windows: float32 within 1e-3 bpb, int8 within 1% relative.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

DEMO = Path(__file__).resolve().parent.parent / "models" / "demo"
CHECKPOINT = DEMO / "checkpoint"
SAFETENSORS = CHECKPOINT / "model.safetensors"
MAX_CHECKPOINT_BYTES = 8_000_000
F32_BPB_TOL = 1e-3
INT8_REL_TOL = 0.01

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def _load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


demo_eval = _load_module("demo_eval", DEMO / "eval.py")


@pytest.fixture(scope="module")
def results() -> dict:
    return json.loads((DEMO / "results.json").read_text())


@pytest.fixture(scope="module")
def test_windows(results) -> np.ndarray:
    n = results["test_windows"]["count"]
    windows = demo_eval.load_windows()[:n]                             # [n, 128]
    assert windows.shape == (n, 128)
    return windows


@pytest.fixture(scope="module")
def demo_hf():
    old = torch.get_num_threads()
    model = demo_eval.load_hf(CHECKPOINT)
    yield model
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def converted(tmp_path_factory, test_windows):
    """{quant: Path} of the checkpoint converted by the real converter."""
    from colibri.convert import ColibriExporter
    root = tmp_path_factory.mktemp("demo")
    out = {}
    for quant in ("f32", "int8"):
        out[quant] = ColibriExporter(CHECKPOINT, quant=quant,
                                     max_batch=test_windows.shape[0]).export(
            root / f"demo-{quant}.colibri")
    return out


def test_checkpoint_size_and_config():
    assert SAFETENSORS.stat().st_size <= MAX_CHECKPOINT_BYTES
    cfg = json.loads((CHECKPOINT / "config.json").read_text())
    assert cfg["model_type"] == "mixtral"
    assert cfg["architectures"] == ["MixtralForCausalLM"]
    assert cfg["num_local_experts"] == 8
    assert cfg["num_experts_per_tok"] == 2
    assert cfg["vocab_size"] == 256          # byte-level: token id = byte value
    assert cfg["num_hidden_layers"] == 4
    assert cfg["tie_word_embeddings"] is False


def test_checkpoint_loads_as_float32_mixtral(demo_hf):
    from transformers import MixtralForCausalLM
    assert isinstance(demo_hf, MixtralForCausalLM)
    params = list(demo_hf.parameters())
    assert all(p.dtype == torch.float32 for p in params)
    assert all(torch.isfinite(p).all() for p in params)
    # Every parameter is stored: 4 bytes each plus a small safetensors header.
    n = sum(p.numel() for p in params)
    assert 4 * n <= SAFETENSORS.stat().st_size <= 4 * n + 64 * 1024


def test_bits_per_byte_helper_against_torch(demo_hf, test_windows):
    """eval.bits_per_byte agrees with torch's cross entropy (independent)."""
    tokens = torch.as_tensor(test_windows)
    with torch.no_grad():
        logits = demo_hf(tokens).logits
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                           tokens[:, 1:].reshape(-1))
    ours = demo_eval.bits_per_byte(logits.numpy(), test_windows)
    assert ours == pytest.approx(float(ce) / np.log(2), abs=1e-5)


def test_transformers_bpb_matches_committed(demo_hf, test_windows, results):
    """The committed golden still describes the committed checkpoint."""
    bpb = demo_eval.bits_per_byte(demo_eval.hf_logits(demo_hf, test_windows), test_windows)
    golden = results["test_windows"]["transformers_bpb"]
    assert bpb == pytest.approx(golden, abs=1e-4)
    # A trained model: far below the 8 bits of a uniform guess over bytes.
    assert bpb < 3.0


def test_reference_f32_bpb_matches_transformers(converted, test_windows, results):
    logits, _ = demo_eval.reference_logits(converted["f32"], test_windows)
    bpb = demo_eval.bits_per_byte(logits, test_windows)
    golden = results["test_windows"]["transformers_bpb"]
    assert abs(bpb - golden) <= F32_BPB_TOL, f"reference f32 {bpb:.5f} vs transformers {golden:.5f}"


def test_reference_int8_bpb_within_one_percent(converted, test_windows, results):
    logits, _ = demo_eval.reference_logits(converted["int8"], test_windows)
    bpb = demo_eval.bits_per_byte(logits, test_windows)
    golden = results["test_windows"]["transformers_bpb"]
    assert abs(bpb / golden - 1) <= INT8_REL_TOL, f"int8 {bpb:.5f} vs float32 {golden:.5f}"
    # ...and the int8 file really is quantised (not silently float32).
    assert converted["int8"].stat().st_size < converted["f32"].stat().st_size / 2


def test_reference_f32_routing_matches_transformers(demo_hf, converted, test_windows):
    """Same experts per token as transformers' router, except where the two
    top-2 candidates nearly tie (float32 rounding may flip those)."""
    _, ours = demo_eval.reference_logits(converted["f32"], test_windows)
    theirs = demo_eval.hf_router_choices(demo_hf, test_windows)
    diff = demo_eval.routing_difference(theirs, ours)
    assert diff["overall"] <= 0.002, diff


def test_eval_windows_follow_the_recipe():
    """eval_windows.bin is what prepare_corpus.py makes from the held-out
    documents (needs the corpus: Debian's python3.11-doc)."""
    corpus = _load_module("demo_corpus", DEMO / "prepare_corpus.py")
    if not corpus.DOC_ROOT.is_dir():
        pytest.skip(f"corpus not installed ({corpus.DEBIAN_PACKAGE})")
    train, held = corpus.split()
    assert len(held) == 5 and not set(train) & set(held)
    expected = corpus.eval_windows(corpus.join(held))
    assert np.array_equal(demo_eval.load_windows(), expected)
