"""The C runtime on an encoder-decoder (ENC_DEC) file, judged by transformers
and by the numpy reference (tests/golden_switch.py's awkward checkpoint):

- f32, reference and host kernels (and the AddressSanitizer + UBSan build):
  the encoder output and the decoder logits
  of a prefill and 8 cached decode steps within 1e-4 of transformers' largest
  value, with a padded encoder batch and tokens over expert capacity;
- int8: the C runtime's error against transformers within 5 % of the numpy
  reference's int8 error on the same file;
- misuse codes: decode before encode, an encoder input above the file's
  max_seq_len, a decoder batch other than the encoded one; equal bits for
  the static-arena build (init from memory) and the mmap build, and for
  every thread count.
"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from golden_switch import make_switch, scenario
from test_runtime_support import DriverError, c_build  # noqa: F401

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

RTOL = 1e-4
FIGURES: dict[str, float] = {}


@pytest.fixture(scope="module")
def switch(tmp_path_factory):
    from colibri.model.convert import ColibriExporter
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("switch_c")
    model = make_switch(seed=0)
    files = {q: ColibriExporter(model=model, quant=q, max_seq_len=24, max_batch=4)
             .export(root / f"switch-{q}.colibri") for q in ("f32", "int8")}
    yield model, files
    torch.set_num_threads(old)
    if FIGURES:
        print("\nswitch C vs transformers:\n  " + "\n  ".join(
            f"{k}: {v:.3g}" for k, v in sorted(FIGURES.items())))


def _line(a) -> str:
    return " ".join(str(int(x)) for x in np.asarray(a).ravel())


def run_encdec(build, model_path, ids, mask, calls, workdir, memory=False,
               hidden=37, vocab=67):
    """colibri_encode(ids, mask) then colibri_infer per decoder call (n_past
    running) through infer_driver: (encoder output [b, S, D], logits per call)."""
    workdir.mkdir(parents=True, exist_ok=True)
    b, n = ids.shape
    lines = [f"E {b} {n}", _line(ids), "-" if mask is None else _line(mask)]
    past = 0
    for c in calls:
        lines += [f"{c.shape[0]} {c.shape[1]} {past}", _line(c), "-"]
        past += c.shape[1]
    (workdir / "calls.txt").write_text("\n".join(lines) + "\n")
    out = workdir / "out.f32"
    proc = subprocess.run(build.cmd("infer_driver", model_path, workdir / "calls.txt", out,
                                    *(["--memory"] if memory else [])),
                          capture_output=True, text=True, timeout=300)
    if proc.returncode >= 10 and proc.stdout.startswith("error "):
        _, code, *detail = proc.stdout.split(" ", 2)
        raise DriverError(int(code), " ".join(detail).strip())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = np.fromfile(out, dtype="<f4")
    enc = data[:b * n * hidden].reshape(b, n, hidden)
    at, logits = b * n * hidden, []
    for c in calls:
        k = c.size * vocab
        logits.append(data[at:at + k].reshape(*c.shape, vocab))
        at += k
    assert at == data.size
    return enc, logits


def _reference(path, ids, mask, calls):
    from colibri.model.reference_encdec import from_file
    ref = from_file(path)
    enc = ref.encode(ids, mask)
    return enc, [ref.decode(c) for c in calls]


@pytest.mark.parametrize("variant", ["ref", "host", "asan"])
def test_f32_c_matches_transformers(switch, c_build, variant, tmp_path):
    model, files = switch
    ids, mask, calls, enc_want, want = scenario(model, (11, 7), 4, 8, seed=3)
    enc, got = run_encdec(c_build(variant), files["f32"], ids, mask, calls, tmp_path)
    v = mask.astype(bool)
    err = float(np.abs(enc[v] - enc_want[v]).max() / np.abs(enc_want[v]).max())
    FIGURES[f"f32 {variant} encoder"] = err
    assert err <= RTOL, f"encoder output: {err:.3g}"
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        err = float(np.abs(g - w).max() / np.abs(w).max())
        worst = max(worst, err)
        assert err <= RTOL, f"decoder call {i}: max |diff| / max |logit| = {err:.3g}"
    FIGURES[f"f32 {variant} decoder"] = worst


def test_int8_c_error_within_5_percent_of_the_reference(switch, c_build, tmp_path):
    model, files = switch
    ids, mask, calls, _, want = scenario(model, (11, 7), 4, 8, seed=4)
    w = np.concatenate([x.ravel() for x in want])

    def rms(got):
        return float(np.sqrt(np.mean((np.concatenate([x.ravel() for x in got]) - w) ** 2)))
    ref_err = rms(_reference(files["int8"], ids, mask, calls)[1])
    assert ref_err > 0
    for variant in ("ref", "host"):
        err = rms(run_encdec(c_build(variant), files["int8"], ids, mask, calls,
                             tmp_path / variant)[1])
        FIGURES[f"int8 {variant} / reference error"] = err / ref_err
        assert abs(err - ref_err) <= 0.05 * ref_err, (variant, err, ref_err)


def test_static_arena_and_mmap_builds_agree_bit_for_bit(switch, c_build, tmp_path):
    """The ref kernels on one file: colibri_init (mmap) and the static
    work-buffer build (init from memory, caller arena of colibri_arena_size
    bytes, the small chunk) compute the same bits."""
    model, files = switch
    ids, mask, calls, _, _ = scenario(model, (11, 7), 3, 2, seed=5)
    a = run_encdec(c_build("ref"), files["int8"], ids, mask, calls, tmp_path / "a")
    b = run_encdec(c_build("static"), files["int8"], ids, mask, calls, tmp_path / "b",
                   memory=True)
    np.testing.assert_array_equal(a[0], b[0])
    for x, y in zip(a[1], b[1]):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("quant,kv", [("f32", "f32"), ("int8", "f32"), ("f32", "i8")])
def test_threads_bit_identical(switch, c_build, quant, kv):
    """colibri_set_threads on an encoder-decoder: the encoder output and the
    decoder logits of 1 thread, bit for bit, on 2, 3 (spinning) and 5
    (the encoder's and decoder's attention and matmuls cut into tiles the
    thread count does not change), with either KV cache."""
    from colibri import runtime
    _, files = switch
    ids, mask, calls, _, _ = scenario(switch[0], (11, 7), 4, 3, seed=6)

    def run(threads, spin=False):
        with runtime.Model(files[quant], library=c_build("host").so, threads=threads,
                           spin=spin, kv=kv) as m:
            out, past = [m.encode(ids, mask)], 0
            for c in calls:
                out.append(m.infer(c, n_past=past))
                past += c.shape[1]
            return [x.tobytes() for x in out]
    want = run(1)
    for n, spin in ((2, False), (3, True), (5, False)):
        assert run(n, spin) == want, (n, spin)


def _driver_error(build, path, script, tmp_path):
    (tmp_path / "s.txt").write_text(script)
    proc = subprocess.run(build.cmd("infer_driver", path, tmp_path / "s.txt",
                                    tmp_path / "o.f32"), capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.startswith("error "), proc.stdout + proc.stderr
    return int(proc.stdout.split()[1]), proc.stdout


def test_misuse_is_a_code_with_a_detail(switch, c_build, tmp_path):
    _, files = switch
    build = c_build("ref")
    f = files["f32"]
    code, out = _driver_error(build, f, "1 1 0\n0\n-\n", tmp_path)
    assert code == -11 and "before colibri_encode" in out          # KV_STATE
    code, out = _driver_error(build, f, "E 1 25\n" + " ".join(["5"] * 25) + "\n-\n", tmp_path)
    assert code == -1 and "max_seq_len 24" in out                   # INPUT_TOO_LARGE
    code, out = _driver_error(build, f, "E 2 3\n5 6 7 8 9 10\n-\n1 1 0\n0\n-\n", tmp_path)
    assert code == -11 and "batch 1" in out and "batch 2" in out     # KV_STATE
    code, out = _driver_error(build, f, "E 1 3\n5 6 99\n-\n", tmp_path)
    assert code == -8                                               # TOKEN
