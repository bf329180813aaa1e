"""Sampling (src/sample.c, colibri/text/sampling.py): the C sampler and the numpy
reference choose the same token for the same logits, parameters, history
and seed, on x86_64, under ASan/UBSan and under QEMU (armv7, ppc); the draw
is integer-exact; the margin that could separate them is measured.

Both samplers get the same float32 logits (no BLAS product is involved, so
this file does not depend on the CPU: tests/test_cpu_independence.py need
not list it)."""
from __future__ import annotations

import re
import struct
import subprocess

import numpy as np
import pytest

from colibri.buildsteps import cbuild
from colibri.text import sampling as S

from test_runtime_support import TESTS_C, c_build  # noqa: F401

# Decisions closer than this (relative) to a boundary may differ by exp()'s
# last ulp between libm and numpy: they are counted, not compared.
FRAGILE = 1e-12


@pytest.fixture(scope="session")
def sampler(c_build, tmp_path_factory):
    cache = {}

    def get(variant):
        if variant not in cache:
            b = c_build(variant)
            out = tmp_path_factory.mktemp(f"sample-{variant}") / "sample_driver"
            cbuild.build_program(b.info, [TESTS_C / "sample_driver.c"], out, extra_ldflags=("-lm",))
            cache[variant] = (b, out)
        return cache[variant]
    return get


def cases(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        vocab = int(rng.choice([1, 2, 7, 50, 300, 2000]))
        kind = i % 5
        if kind == 0:
            logits = rng.normal(0, 1, vocab)
        elif kind == 1:
            logits = rng.normal(0, 8, vocab)           # peaked
        elif kind == 2:
            logits = np.round(rng.normal(0, 2, vocab))  # many ties
        elif kind == 3:
            logits = np.zeros(vocab)                    # all equal
        else:
            logits = rng.normal(0, 3, vocab)
            logits[rng.integers(0, vocab, max(1, vocab // 10))] = -np.inf
        logits = logits.astype(np.float32)
        p = S.SampleParams(
            temperature=float(rng.choice([0.0, 0.3, 0.7, 1.0, 1.5])),
            top_k=int(rng.choice([0, 0, 1, 5, 40])),
            top_p=float(rng.choice([1.0, 1.0, 0.9, 0.5, 0.95])),
            min_p=float(rng.choice([0.0, 0.0, 0.05, 0.2])),
            repetition_penalty=float(rng.choice([1.0, 1.0, 1.1, 1.3])),
            seed=int(rng.integers(0, 2 ** 63)) * int(rng.choice([1, 2])) % 2 ** 64)
        hist = [int(h) for h in rng.integers(-2, vocab + 2, int(rng.integers(0, 20)))]
        out.append((logits, p, hist, int(rng.integers(0, 10 ** 6))))
    return out


def run_c(drv, cs, tmp):
    build, prog = drv
    tmp.mkdir(parents=True, exist_ok=True)
    with open(tmp / "in.bin", "wb") as f:
        for logits, p, hist, step in cs:
            f.write(struct.pack("<IfIfffQQI", logits.size, p.temperature, p.top_k, p.top_p,
                                p.min_p, p.repetition_penalty, p.seed, step, len(hist)))
            f.write(struct.pack(f"<{len(hist)}i", *hist))
            f.write(logits.astype("<f4").tobytes())
    proc = subprocess.run([*build.runner, str(prog), str(tmp / "in.bin"), str(tmp / "out.bin")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return np.fromfile(tmp / "out.bin", dtype="<i4").reshape(-1, 2)


def compare(drv, n, tmp, seed=0):
    cs = cases(n, seed)
    got = run_c(drv, cs, tmp)
    fragile = 0
    for (logits, p, hist, step), (rc, tok) in zip(cs, got):
        want, margin = S.sample(logits, p, hist, step, margin=True)
        assert rc == 0
        # Greedy on the same logits is exact (first maximum on both sides);
        # its margin matters only across engines (the colibri-cli test).
        if margin < FRAGILE and not p.greedy:
            fragile += 1
            continue
        assert tok == want, (p, step, hist, logits[:8])
    assert fragile <= n // 1000, fragile
    return fragile


def test_draw_is_splitmix64_of_the_counter():
    # splitmix64 reference values (seed 0 stream: the published first outputs)
    assert [S.draw(0, s) for s in range(3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4,
                                                 0x06C45D188009454F]


def test_c_and_numpy_choose_the_same_tokens(sampler, tmp_path):
    compare(sampler("host"), 5000, tmp_path)


def test_c_sampler_under_asan_ubsan(sampler, tmp_path):
    compare(sampler("asan"), 800, tmp_path, seed=1)


@pytest.mark.parametrize("variant", ["armv7", "ppc"])
def test_c_sampler_under_qemu(sampler, tmp_path, variant):
    compare(sampler(variant), 400, tmp_path, seed=2)


def test_greedy_is_argmax_and_sampling_follows_the_distribution():
    logits = np.array([0.0, 2.0, 1.0, 2.0], np.float32)
    assert S.sample(logits, S.SampleParams()) == 1                  # ties: lower id
    p = S.SampleParams(temperature=1.0, seed=9)
    counts = np.bincount([S.sample(logits, p, step=s) for s in range(4000)], minlength=4)
    want = np.exp(logits) / np.exp(logits).sum()
    assert np.allclose(counts / 4000, want, atol=0.03)
    # top-k 2 keeps ids 1 and 3 only; min-p 0.5 drops ids 0 and 2 (e^-1 < 0.5)
    for q in (S.SampleParams(temperature=1.0, top_k=2, seed=3),
              S.SampleParams(temperature=1.0, min_p=0.5, seed=3)):
        assert {S.sample(logits, q, step=s) for s in range(300)} == {1, 3}
    # repetition penalty 100 on id 1: 2/100 -> id 3 wins greedily
    assert S.sample(logits, S.SampleParams(repetition_penalty=100.0), history=[1]) == 3


def test_bad_parameters_are_errors(sampler, tmp_path):
    logits = np.zeros(4, np.float32)
    bad = [S.SampleParams(temperature=-1.0), S.SampleParams(temperature=float("nan")),
           S.SampleParams(top_p=-0.1), S.SampleParams(repetition_penalty=0.0)]
    for p in bad:
        with pytest.raises(ValueError):
            S.sample(logits, p)
    got = run_c(sampler("host"), [(logits, p, [], 0) for p in bad], tmp_path)
    assert (got[:, 0] == -7).all()    # COLIBRI_E_ARG


# --- colibri tokenize / generate -------------------------------------------
def test_tokenize_and_generate_commands(tmp_path):
    """`colibri tokenize` prints tokenizers' ids; `colibri generate` prints
    the prompt and the text of the ids the reference + sampler choose (the
    same as calling colibri.text.sampling step by step), deterministic per seed."""
    import json
    import sys
    import tokenizer_fixtures as tf
    from test_tokenizer import _checkpoint
    from colibri.model.convert import ColibriExporter
    from colibri.model.generate import generate
    from colibri.model.reference import Reference
    from colibri.text.tokenizer import Tokenizer
    hf = tf.train("bl-gpt2-300", tf.corpus_text(300_000))
    ck = _checkpoint(tmp_path / "ck", hf, vocab=320)
    path = ColibriExporter(ck, quant="f32").export(tmp_path / "m.colibri")
    cli = [sys.executable, "-m", "colibri.cli"]
    out = subprocess.run([*cli, "tokenize", str(path), "Hello, world!"], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == ",".join(map(str, hf.encode("Hello, world!").ids))
    args = ["generate", str(path), "The Python", "--max-tokens", "12", "--temperature", "0.9",
            "--top-p", "0.95", "--seed", "7", "--engine", "reference"]
    a = subprocess.run([*cli, *args], capture_output=True, text=True, check=True).stdout
    b = subprocess.run([*cli, *args], capture_output=True, text=True, check=True).stdout
    head, a = a.split("\n", 1)        # the first line names the engine
    assert head.startswith("engine: reference")
    assert b.split("\n", 1)[1] == a and a.startswith("The Python")
    # the same ids by hand: reference logits, then colibri.text.sampling per step
    tok, ref = Tokenizer.from_file(path), Reference(path)
    p = S.SampleParams(temperature=0.9, top_p=0.95, seed=7)
    ids = tok.encode("The Python")
    hist = list(ids)
    n = tok.n_vocab    # the model's 320 rows; ids past the tokenizer's are never chosen
    logits = ref.forward(np.array([ids]))[0, -1]
    want = []
    for step in range(12):
        logits[n:] = -np.inf
        t = S.sample(logits, p, hist, step)
        want.append(t)
        hist.append(t)
        logits = ref.forward(np.array([[t]]), n_past=len(hist) - 1)[0, -1].copy()
    assert generate(path, "The Python", 12, p) == want
    assert a == "The Python" + tok.decode(want, skip_special=True) + "\n"
    greedy = subprocess.run([*cli, "generate", str(path), "The Python", "--max-tokens", "4",
                             "--engine", "reference"],
                            capture_output=True, text=True, check=True).stdout
    assert greedy.split("\n", 1)[1].startswith("The Python")
    err = subprocess.run([*cli, "generate", str(path), "x", "--temperature", "-1",
                          "--engine", "reference"],
                         capture_output=True, text=True)
    assert err.returncode == 2 and err.stderr.startswith("colibri: error: temperature")


def test_colibri_cli_prompt_and_tokenize_follow_the_reference(c_build, tmp_path):
    """colibri-cli --tokenize prints the file tokenizer's ids; --prompt
    streams the text of the ids the C runtime + colibri_sample choose. Each
    step is checked against the numpy reference's logits on the same history
    through colibri.text.sampling, as long as the choice's margin is clear of the
    runtime/reference logit difference (1e-4 relative in probability, far
    above an f32 file's ~1e-6 logit error: tests/greedy.py's idea)."""
    import tokenizer_fixtures as tf
    from test_tokenizer import _checkpoint
    from colibri.model.convert import ColibriExporter
    from colibri.model.reference import Reference
    from colibri.text.tokenizer import Tokenizer
    hf = tf.train("bl-gpt2-300", tf.corpus_text(300_000))
    ck = _checkpoint(tmp_path / "ck", hf, vocab=320)
    path = ColibriExporter(ck, quant="f32").export(tmp_path / "m.colibri")
    cli = str(c_build("host").cli)
    tok, ref = Tokenizer.from_file(path), Reference(path)
    out = subprocess.run([cli, "--model", str(path), "--tokenize", "Hello, wörld! 日本"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == ",".join(map(str, hf.encode("Hello, wörld! 日本").ids))
    checked = 0
    for seed, extra in ((3, ["--temperature", "0.8", "--top-p", "0.95"]),
                        (5, ["--temperature", "1.2", "--top-k", "20", "--min-p", "0.01",
                             "--repetition-penalty", "1.2"]),
                        (0, [])):
        proc = subprocess.run([cli, "--model", str(path), "--prompt", "The Python",
                               "--generate", "10", "--seed", str(seed), *extra],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        ids = [int(x) for x in re.search(r"generated ids: ([\d,]+)", proc.stderr)[1].split(",")]
        assert "tokens/s" in proc.stderr and len(ids) == 10
        text = proc.stdout
        assert text == "The Python" + tok.decode(ids, skip_special=True) + "\n"
        args = dict(zip(extra[::2], extra[1::2]))
        p = S.SampleParams(temperature=float(args.get("--temperature", 0)),
                           top_k=int(args.get("--top-k", 0)),
                           top_p=float(args.get("--top-p", 1)),
                           min_p=float(args.get("--min-p", 0)),
                           repetition_penalty=float(args.get("--repetition-penalty", 1)),
                           seed=seed)
        hist = tok.encode("The Python")
        logits = ref.forward(np.array([hist]))[0, -1].copy()
        for step, got in enumerate(ids):
            logits[tok.n_vocab:] = -np.inf
            want, margin = S.sample(logits, p, hist, step, margin=True)
            if margin < 1e-4:
                break           # too close to call across engines: stop here
            assert got == want, (seed, step)
            checked += 1
            hist.append(got)
            logits = ref.forward(np.array([[got]]), n_past=len(hist) - 1)[0, -1].copy()
    assert checked >= 20
    bad = subprocess.run([cli, "--model", str(path), "--prompt", "x", "--temperature", "-1"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == "" and "--temperature" in bad.stderr


def test_c_sampler_on_cortex_m_under_qemu(tmp_path):
    """Bare metal: the numpy reference's tokens for 150 cases, compiled into a
    Cortex-M program with the library scons builds, under qemu-system-arm."""
    import shutil
    import targets
    t = targets.load_all()["cortex-m"]
    if shutil.which(t.tool("gcc")) is None or shutil.which(t.emulator[0]) is None:
        pytest.skip("Cortex-M toolchain or qemu-system-arm not installed")
    cs = [c for c in cases(400, seed=4) if c[0].size <= 300]
    rows, kept = [], 0
    for i, (logits, p, hist, step) in enumerate(cs):
        want, margin = S.sample(logits, p, hist, step, margin=True)
        if margin < FRAGILE and not p.greedy:
            continue
        lg = ",".join("-INFINITY" if np.isneginf(v) else f"{float(v)!r}f" for v in logits)
        rows.append(f"static const float lg{kept}[] = {{{lg}}};")
        rows.append(f"static const int32_t h{kept}[] = {{{','.join(map(str, hist)) or '0'}}};")
        rows.append(f"#define CASE{kept} {{ lg{kept}, {logits.size}u, {float(p.temperature)!r}f, "
                    f"{p.top_k}u, {float(p.top_p)!r}f, {float(p.min_p)!r}f, "
                    f"{float(p.repetition_penalty)!r}f, {p.seed}ull, {step}ull, h{kept}, "
                    f"{len(hist)}u, {want} }}")
        kept += 1
        if kept == 150:
            break
    head = ["#include <math.h>", "#define MAX_VOCAB 2000",
            "struct sample_case { const float *logits; uint32_t vocab; float temperature; "
            "uint32_t top_k; float top_p, min_p, penalty; uint64_t seed, step; "
            "const int32_t *hist; uint32_t n_hist; int32_t want; };"]
    tail = [f"#define N_CASES {kept}u",
            "static const struct sample_case cases[] = {"
            + ",".join(f"CASE{i}" for i in range(kept)) + "};"]
    (tmp_path / "sample_cases.h").write_text("\n".join(head + rows + tail) + "\n")
    from baremetal import build_and_run
    proc = build_and_run(t, "tests/c/sample_baremetal.c", tmp_path, "sample")
    assert proc.returncode == 0 and f"sample: {kept} cases ok" in proc.stdout, \
        proc.stdout + proc.stderr
