"""bench/quality.py's KL arithmetic and its llama-perplexity base file.

1. kl_stats (the mirror of llama-perplexity's --kl-divergence arithmetic over
   the uint16 base file) agrees with the exact KL divergence, top-1 agreement
   and next-token nll computed in float64 from the float logits.
2. When llama.cpp's llama-perplexity is built (scripts/build_llama_bench.sh
   native; skipped otherwise): it reads the token ids and log-probabilities of
   a base file we write from the C runtime's f32 logits of the golden tiny
   model, and finds its own f32 GGUF of the same checkpoint at KL ~ 0 with the
   same top token everywhere; so the file format, the token order and the
   GGUF are right (a wrong one gives KL of order 1).
"""
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import quality  # noqa: E402


def _log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def test_kl_mirror_matches_exact_kl(tmp_path):
    rng = np.random.default_rng(3)
    c, n_ctx, V = 3, 32, 200
    ids = rng.integers(0, V, size=(c, n_ctx), dtype=np.int32)
    ref = (3 * rng.standard_normal((c, n_ctx, V))).astype(np.float32)
    other = (ref + 0.3 * rng.standard_normal(ref.shape)).astype(np.float32)
    base = tmp_path / "base.kld"
    quality.write_base_file(base, ids, ref)
    back, rec, v = quality.read_base_file(base)
    assert v == V and np.array_equal(back, ids) and rec.shape[:2] == (c, n_ctx - 1 - n_ctx // 2)

    got = quality.kl_stats(other, base)
    first = n_ctx // 2
    lr, lo = _log_softmax(ref[:, first:-1]), _log_softmax(other[:, first:-1])
    kl = (np.exp(lr) * (lr - lo)).sum(-1).ravel()
    assert got["count"] == kl.size
    # The base stores log p to 16/65535/2 and drops p < e^-16: ~1e-4 nats.
    assert abs(got["kld_mean"] - kl.mean()) < 2e-4
    assert abs(got["kld_p99"] - np.percentile(kl, 99)) < 2e-3
    top = (ref[:, first:-1].argmax(-1) == other[:, first:-1].argmax(-1)).mean()
    assert got["same_top"] == pytest.approx(top, abs=1 / kl.size)
    tok = ids[:, first + 1:]
    nll = -np.take_along_axis(lo, tok[..., None], -1).mean()
    assert got["ppl"] == pytest.approx(np.exp(nll), rel=1e-9)
    # Against itself only the storage error remains.
    self_kl = quality.kl_stats(ref, base)
    assert self_kl["same_top"] == 1.0 and abs(self_kl["kld_mean"]) < 1e-5


def test_llama_perplexity_reads_our_base_file(tmp_path):
    tool = quality.LLAMA_BIN / "llama-perplexity"
    if not tool.exists():
        pytest.skip(f"no {tool}: scripts/build_llama_bench.sh builds it (bench only)")
    pytest.importorskip("gguf", reason="gguf is a bench-only package (scripts/bench.sh)")
    pytest.importorskip("transformers")
    from bench import gguf_export
    from colibri import cli

    hf = quality.checkpoint_dir("tiny", tmp_path)
    n_ctx = 64
    ids, _ = quality.token_chunks("tiny", 96, n_ctx, 4)
    gguf = gguf_export.write_gguf(hf, tmp_path / "tiny-f32.gguf", "f32")
    col = tmp_path / "tiny-f32.colibri"
    assert cli.main(["convert", str(hf), "-o", str(col), "--quant", "f32",
                     "--max-seq-len", str(n_ctx), "-q"]) == 0
    ref = quality.colibri_logits(col, ids, quality.colibri_library(), 1)
    base = tmp_path / "base.kld"
    quality.write_base_file(base, ids, ref)
    got = quality.llama_kl(gguf, base, n_ctx, 1)
    assert "error" not in got, got.get("error")
    assert got["count"] == 4 * (n_ctx - 1 - n_ctx // 2)
    assert got["kld_mean"] < 1e-4 and got["same_top"] > 0.99
    assert got["ppl"] == pytest.approx(got["ppl_base"], rel=1e-3)
