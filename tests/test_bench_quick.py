"""The benchmark's GGUF writer (bench/gguf_export.py) produces the same model
for llama.cpp as the checkpoint is for transformers: expert stacking, the q/k
row permutation for llama.cpp's RoPE layout, rope_theta, eps and the router
all have to be right for the greedy tokens and the logits to agree. Without
this the benchmark's llama.cpp figures would be of a different model.

llama-cpp-python and gguf are bench-only packages (scripts/bench.sh installs
them); without them this test is skipped.
"""
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: it is a "
                    "bench-only package (scripts/bench.sh installs it), not part of the test setup")
pytest.importorskip("gguf", reason="gguf is not installed: it is a bench-only package "
                    "(scripts/bench.sh installs it), not part of the test setup")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def test_gguf_f32_matches_transformers(tmp_path):
    from bench.gguf_export import write_gguf
    from bench.models import write_tiny_checkpoint
    from bench.peers import LlamaEngine, TransformersEngine, greedy

    hf_dir = tmp_path / "hf"
    write_tiny_checkpoint(hf_dir, seed=3)
    gguf_path = write_gguf(hf_dir, tmp_path / "tiny-f32.gguf", "f32")
    prompt = [int(t) for t in np.random.default_rng(5).integers(3, 96, 12)]

    hf, ll = TransformersEngine(hf_dir), LlamaEngine(gguf_path)
    # The logits of a 12-token prompt (all positions' attention and RoPE).
    np.testing.assert_allclose(ll.start(prompt), hf.start(prompt), rtol=1e-3, atol=1e-3)
    # And 16 greedy decode steps through the KV caches.
    want = greedy(hf, prompt, 16)
    assert greedy(ll, prompt, 16) == want
