"""Threads through the Python binding and colibri-cli: Model(path,
threads=N) and `colibri-cli --threads N [--spin]` give the bytes of one
thread; Model.infer(last_only=True) gives the last rows of the full call;
Info reports the thread count; bad counts are ArgumentError / a one-line
usage error."""
from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

from colibri import errors, runtime
from test_runtime_support import c_build  # noqa: F401


@pytest.fixture(scope="module")
def so(c_build):
    return c_build("host").so


def workload(m: runtime.Model) -> list[np.ndarray]:
    """A batch-2 masked prefill in several chunks, decode steps, and the same
    prefill's last rows."""
    rng = np.random.default_rng(7)
    b = min(2, m.max_batch)
    ids = rng.integers(0, m.vocab, size=(b, 40))
    mask = np.ones_like(ids)
    mask[-1, :3] = 0
    out = [m.infer(ids, mask)]
    for i in range(4):
        out.append(m.infer(rng.integers(0, m.vocab, size=(b, 1)), n_past=40 + i))
    out.append(m.infer(ids, mask, last_only=True))
    return out


@pytest.mark.parametrize("name,quant", [("awkward", "f32"), ("wide", "int8")])
def test_model_threads_bit_identical(so, colibri_file, name, quant):
    path = colibri_file(name, quant)
    with runtime.Model(path, library=so) as m:
        assert m.info.n_threads == 1
        want = workload(m)
    # the last-only rows are the full call's last rows, bit for bit
    assert want[-1].tobytes() == want[0][:, -1].tobytes()
    for n, spin in ((2, False), (3, True), (5, False)):
        with runtime.Model(path, library=so, threads=n, spin=spin) as m:
            assert (m.info.n_threads, m.info.thread_spin) == (n, spin)
            got = workload(m)
        for g, w in zip(got, want):
            assert g.tobytes() == w.tobytes(), (n, spin)
    with runtime.Model(path, library=so, threads=3) as m:
        m.set_threads(1)
        assert m.info.n_threads == 1
        assert workload(m)[0].tobytes() == want[0].tobytes()


def test_bad_thread_counts(so, colibri_file):
    path = colibri_file("tiny", "f32")
    for bad in (0, 65):
        with pytest.raises(errors.ArgumentError):
            runtime.Model(path, library=so, threads=bad)
    with runtime.Model(path, library=so) as m:
        with pytest.raises(errors.ArgumentError):
            m.set_threads(-1)
        with pytest.raises(errors.ArgumentError, match="out must be"):
            m.infer([[1, 2, 3]], last_only=True, out=np.empty((1, 3, m.vocab), np.float32))


def test_cli_threads_same_output(c_build, colibri_file, tmp_path):
    cli = c_build("host").cli
    path = colibri_file("wide", "int8")
    outs = []
    for extra in ([], ["--threads", "2"], ["--threads", "4", "--spin"]):
        f = tmp_path / f"l{len(outs)}.f32"
        proc = subprocess.run([str(cli), "--model", str(path), "--tokens",
                               "5,17,3,9,1,22,40,7,11,2,30,8,4,4,19,60,61,2,3",
                               "--generate", "5", "--logits-out", str(f), *extra],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert re.search(r"^prefill: 19 tokens, [\d.]+ tokens/s; decode: 4 steps, "
                         r"[\d.]+ tokens/s$", proc.stderr, re.M), proc.stderr
        outs.append((proc.stdout, f.read_bytes()))
    assert outs[1] == outs[0] and outs[2] == outs[0]
    info = subprocess.run([str(cli), "--model", str(path), "--info", "--threads", "3"],
                          capture_output=True, text=True, timeout=60)
    assert "threads: 3\n" in info.stdout
    bad = subprocess.run([str(cli), "--model", str(path), "--info", "--threads", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "--threads needs a count" in bad.stderr
