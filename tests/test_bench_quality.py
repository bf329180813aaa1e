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
3. The importance matrix both engines share: write_llama_imatrix's file, read
   back in the order llama.cpp's legacy loader reads it
   (common/imatrix-loader.cpp), holds each matrix's mean squared inputs under
   llama.cpp's tensor name, an experts tensor's experts one after another and
   1.0 for an expert no token reached; and, when llama-quantize is built, it
   loads every entry and changes what it writes.
"""
import json
import re
import struct
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
    assert got["kld_se"] == pytest.approx(kl.std() / np.sqrt(kl.size - 1), rel=1e-2)
    top = (ref[:, first:-1].argmax(-1) == other[:, first:-1].argmax(-1)).mean()
    assert got["same_top"] == pytest.approx(top, abs=1 / kl.size)
    tok = ids[:, first + 1:]
    nll = -np.take_along_axis(lo, tok[..., None], -1).mean()
    assert got["ppl"] == pytest.approx(np.exp(nll), rel=1e-9)
    # Against itself only the storage error remains.
    self_kl = quality.kl_stats(ref, base)
    assert self_kl["same_top"] == 1.0 and abs(self_kl["kld_mean"]) < 1e-5


def _llama_tool_or_skip(name: str) -> None:
    """Skip unless llama.cpp's tool `name` and the bench-only packages are there."""
    tool = quality.LLAMA_BIN / name
    if not tool.exists():
        pytest.skip(f"no {tool}: scripts/build_llama_bench.sh builds it (bench only)")
    pytest.importorskip("gguf", reason="gguf is a bench-only package (scripts/bench.sh)")
    pytest.importorskip("transformers")


def test_llama_perplexity_reads_our_base_file(tmp_path):
    _llama_tool_or_skip("llama-perplexity")
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


def _read_legacy_imatrix(path):
    """{name: (ncall, values)} in common_imatrix_load_legacy's reading order."""
    raw, off, out = path.read_bytes(), 4, {}
    (n,) = struct.unpack_from("<i", raw, 0)
    for _ in range(n):
        (ln,) = struct.unpack_from("<i", raw, off)
        name = raw[off + 4:off + 4 + ln].decode()
        ncall, nval = struct.unpack_from("<ii", raw, off + 4 + ln)
        off += 12 + ln
        out[name] = (ncall, np.frombuffer(raw, "<f4", nval, off))
        off += 4 * nval
    assert off == len(raw)
    return out


def _fake_imatrix(tmp_path, n_layers, n_exp, hidden, inter, reached):
    """An importance-matrix file as `colibri imatrix` saves it, every
    matrix a Mixtral of these shapes has but the experts not in `reached`."""
    from colibri.file.format import Kind
    from colibri.model import imatrix as im
    rng = np.random.default_rng(1)
    table = {}
    for layer in range(n_layers):
        for kind in (Kind.WQ, Kind.WK, Kind.WV):
            table[(kind, layer, None)] = hidden
        table[(Kind.WO, layer, None)] = hidden     # n_heads * head_dim = hidden here
        table[(Kind.ROUTER, layer, None)] = hidden
        for e in reached:
            table[(Kind.EXPERT_W1, layer, e)] = table[(Kind.EXPERT_W3, layer, e)] = hidden
            table[(Kind.EXPERT_W2, layer, e)] = inter
    table[(Kind.LM_HEAD, None, None)] = hidden
    table = {k: ((rng.random(c) + 0.1).astype(np.float32), 7) for k, c in table.items()}
    im.save(tmp_path / "imatrix.npz", table)
    return table


def test_llama_imatrix_file_layout(tmp_path):
    from colibri.file.format import Kind
    table = _fake_imatrix(tmp_path, 2, 4, 32, 64, reached=(0, 2))
    dat = tmp_path / "imatrix.dat"
    for tied, head in ((False, "output.weight"), (True, "token_embd.weight")):
        quality.write_llama_imatrix(tmp_path / "imatrix.npz",
                                    {"num_local_experts": 4, "tie_word_embeddings": tied}, dat)
        got = _read_legacy_imatrix(dat)
        names = {f"blk.{l}.{n}.weight" for l in range(2) for n in (
            "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_exps", "ffn_up_exps",
            "ffn_down_exps")} | {head}
        assert set(got) == names                  # no router: llama.cpp keeps it f32
        assert all(ncall == 1 for ncall, _ in got.values())
        assert np.array_equal(got[head][1], table[(Kind.LM_HEAD, None, None)][0])
        assert np.array_equal(got["blk.1.attn_output.weight"][1], table[(Kind.WO, 1, None)][0])
        down = got["blk.1.ffn_down_exps.weight"][1].reshape(4, 64)
        assert np.array_equal(down[2], table[(Kind.EXPERT_W2, 1, 2)][0])
        assert np.array_equal(down[0], table[(Kind.EXPERT_W2, 1, 0)][0])
        assert np.all(down[[1, 3]] == 1.0)        # never reached: no importance


def test_llama_quantize_reads_our_imatrix(tmp_path):
    _llama_tool_or_skip("llama-quantize")
    from bench import gguf_export
    hf = quality.checkpoint_dir("tiny", tmp_path)
    cfg = json.loads((hf / "config.json").read_text())
    _fake_imatrix(tmp_path, cfg["num_hidden_layers"], cfg["num_local_experts"],
                  cfg["hidden_size"], cfg["intermediate_size"],
                  reached=range(cfg["num_local_experts"]))
    dat = tmp_path / "imatrix.dat"
    quality.write_llama_imatrix(tmp_path / "imatrix.npz", cfg, dat)
    f32 = gguf_export.write_gguf(hf, tmp_path / "f32.gguf", "f32")
    plain, weighted = tmp_path / "plain.gguf", tmp_path / "weighted.gguf"
    quality.llama_quantize(f32, plain, "Q4_K_M", tmp_path / "plain.log")
    quality.llama_quantize(f32, weighted, "Q4_K_M", tmp_path / "weighted.log", dat)
    log = (tmp_path / "weighted.log").read_text()
    assert f"loaded {len(_read_legacy_imatrix(dat))} importance matrix entries" in log, log[-2000:]
    # Every matrix found its entry but the untied embedding, a lookup that
    # llama.cpp's own imatrix has no entry for either.
    assert re.findall(r"did not find weights for (\S+)", log) == ["token_embd.weight"], log

    assert plain.read_bytes() != weighted.read_bytes()
