"""The command lines on an encoder-decoder file: `colibri-cli
--encoder-tokens ... --tokens 0 --generate N --logits-out F` and `colibri
run FILE --encoder-tokens ... --tokens 0 --generate N --logits-out F` (C
engine through libcolibri.so, and the numpy reference) write the same
decoder rows (C: same bits; reference within 1e-4 of the largest logit);
misuse is one line without a traceback."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from golden_switch import make_switch
from test_runtime_support import c_build  # noqa: F401

pytest.importorskip("torch")
pytest.importorskip("transformers")

ENC = "5,9,33,2,17,40,8"


@pytest.fixture(scope="module")
def switch_file(tmp_path_factory):
    from colibri.model.convert import ColibriExporter
    out = tmp_path_factory.mktemp("switch_cli") / "switch.colibri"
    return ColibriExporter(model=make_switch(seed=1), quant="f32", max_seq_len=24,
                           max_batch=2).export(out)


def _run(build, *args):
    env = {**os.environ, "COLIBRI_LIBRARY": str(build.so)}
    return subprocess.run([sys.executable, "-m", "colibri.cli", "run", *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=env)


def test_cli_and_colibri_run_write_the_same_decoder_rows(c_build, switch_file, tmp_path):
    build = c_build("host")
    cli_out, c_out, ref_out = tmp_path / "cli.f32", tmp_path / "c.f32", tmp_path / "r.f32"
    proc = subprocess.run([str(build.cli), "--model", str(switch_file), "--encoder-tokens",
                           ENC, "--tokens", "0,3", "--generate", "6", "--logits-out",
                           str(cli_out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    c = _run(build, switch_file, "--encoder-tokens", ENC, "--tokens", "0,3", "--generate", 6,
             "--logits-out", c_out, "--engine", "c")
    r = _run(build, switch_file, "--encoder-tokens", ENC, "--tokens", "0,3", "--generate", 6,
             "--logits-out", ref_out, "--engine", "reference")
    assert c.returncode == 0 and r.returncode == 0, c.stderr + r.stderr
    a, b, ref = (np.fromfile(p, "<f4") for p in (cli_out, c_out, ref_out))
    assert a.size == (2 + 6 - 1) * 67
    np.testing.assert_array_equal(a, b)                       # one library, same bits
    assert np.abs(a - ref).max() <= 1e-4 * np.abs(ref).max()
    gen_cli = re.search(r"^generated: (.*)$", proc.stdout, re.M).group(1).split()
    gen_run = re.search(r"generated: (.*)$", c.stdout, re.M).group(1).split(",")
    assert gen_cli == gen_run and len(gen_cli) == 6


def test_misuse_is_one_line(c_build, switch_file, tmp_path):
    build = c_build("host")
    p = subprocess.run([str(build.cli), "--model", str(switch_file), "--tokens", "0"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--encoder-tokens" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    p = subprocess.run([str(build.cli), "--model", str(switch_file), "--encoder-tokens",
                        ",".join(["4"] * 25), "--tokens", "0"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "max_seq_len 24" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    r = _run(build, switch_file, "--tokens", "0")
    assert r.returncode != 0 and "--encoder-tokens" in r.stderr and "Traceback" not in r.stderr
    r = _run(build, switch_file, "--encoder-tokens", "1,2", "--encoder-tokens", "3",
             "--tokens", "0")
    assert r.returncode != 0 and "one decoder prompt per encoder input" in r.stderr
    assert "Traceback" not in r.stderr


def test_generate_with_text_on_the_reference_refuses_an_encoder_decoder(switch_file):
    """`colibri generate --engine reference` (text in, text out) runs
    decoder-only models: on an encoder-decoder it says what to run instead,
    in one line (the C engine runs it: tests/test_switch_text.py)."""
    r = subprocess.run([sys.executable, "-m", "colibri.cli", "generate", str(switch_file),
                        "hello", "--engine", "reference"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "is an encoder-decoder" in r.stderr
    assert "--encoder-tokens" in r.stderr and "Traceback" not in r.stderr
