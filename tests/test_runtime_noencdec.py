"""The encdec=0 build (scons encdec=0, -DCOLIBRI_NO_ENCDEC): src/encdec.c
compiles to stubs, so a decoder-only firmware does not pay for the
encoder-decoder runtime.

- an ENC_DEC file (tests/golden_switch.py's tiny Switch checkpoint) is
  refused by colibri_init, colibri_arena_size and colibri_init_from_memory
  with COLIBRI_E_UNSUPPORTED and a detail naming the switch; colibri-cli
  says so in one line;
- colibri_encode on a decoder-only model is COLIBRI_E_UNSUPPORTED too;
- a decoder-only file runs bit-identically to the full build (same ref
  kernels: the switch must not touch the decoder-only path);
- the Cortex-M library sizes with encdec=0 (and with tokenizer=0 too) are
  the figures the documentation states (docs/MODELS.md).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from docs_text import doc_text
from test_runtime_support import c_build, golden_calls, run_driver  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
UNSUPPORTED = -12
DETAIL = "this build has no encoder-decoder runtime (built with encdec=0)"


@pytest.fixture(scope="module")
def switch_file(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from colibri.model.convert import ColibriExporter
    from golden_switch import make_switch
    out = tmp_path_factory.mktemp("switch_noencdec") / "switch.colibri"
    return ColibriExporter(model=make_switch(seed=2), quant="f32", max_seq_len=16,
                           max_batch=1).export(out)


def _driver(build, model, script, tmp_path, *extra):
    (tmp_path / "s.txt").write_text(script)
    return subprocess.run(build.cmd("infer_driver", model, tmp_path / "s.txt",
                                    tmp_path / "o.f32", *extra),
                          capture_output=True, text=True, timeout=120)


def test_an_encoder_decoder_file_is_refused_with_the_switch_named(c_build, switch_file,
                                                                   tmp_path):
    build = c_build("ref-noencdec")
    script = "E 1 3\n5 6 7\n-\n1 1 0\n0\n-\n"
    p = _driver(build, switch_file, script, tmp_path)            # colibri_init
    assert p.returncode == 10 - UNSUPPORTED, p.stdout + p.stderr
    assert p.stdout.strip() == f"error {UNSUPPORTED} {DETAIL}", p.stdout
    p = _driver(build, switch_file, script, tmp_path, "--memory")  # colibri_arena_size
    assert p.returncode == 10 - UNSUPPORTED and p.stdout.startswith(f"error {UNSUPPORTED}"), \
        p.stdout + p.stderr
    # The full build runs the same script: the file is fine, the build is not.
    assert _driver(c_build("ref"), switch_file, script, tmp_path).returncode == 0
    # The CLI: one line naming the switch, no crash.
    cli = subprocess.run([str(build.cli), "--model", str(switch_file), "--encoder-tokens",
                          "5,6,7", "--tokens", "0"], capture_output=True, text=True,
                         timeout=60)
    assert cli.returncode != 0 and "encdec=0" in cli.stderr, cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1, cli.stderr


def test_static_build_refuses_in_init_from_memory(c_build, switch_file, tmp_path):
    """The bare-metal path (static work buffer: colibri_arena_size then
    colibri_init_from_memory) refuses the file the same way."""
    p = _driver(c_build("static-noencdec"), switch_file, "E 1 2\n5 6\n-\n", tmp_path,
                "--memory")
    assert p.returncode == 10 - UNSUPPORTED, p.stdout + p.stderr


def test_decoder_only_file_bit_identical_to_the_full_build(c_build, colibri_file, tmp_path):
    path = colibri_file("awkward", "int8")
    calls = golden_calls(vocab=83, batch=3, seed=11, prefill=20, decode=4)
    full = run_driver(c_build("ref"), path, calls, tmp_path / "full")
    small = run_driver(c_build("ref-noencdec"), path, calls, tmp_path / "small")
    assert len(full) == len(small) == len(calls)
    for a, b in zip(full, small):
        np.testing.assert_array_equal(a, b)
    # colibri_encode on it: the build's refusal, not the decoder-only _ARG.
    p = _driver(c_build("ref-noencdec"), path, "E 1 2\n5 6\n-\n", tmp_path)
    assert p.returncode == 10 - UNSUPPORTED, p.stdout + p.stderr
    assert p.stdout.strip() == f"error {UNSUPPORTED} colibri_encode: {DETAIL}", p.stdout


def _cortex_m_runtime_kib(tmp_path, *switches) -> str:
    from colibri.buildsteps.size import measure_runtime
    build_dir = tmp_path / "_".join(s.replace("=", "") for s in switches)
    lib = build_dir / "cortex-m" / "libcolibri.a"
    p = subprocess.run([str(Path(sys.executable).parent / "scons"), "-Q", "-j2",
                        "target=cortex-m", *switches, f"build_dir={build_dir}", str(lib)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    kinds, _ = measure_runtime(lib)
    return f"{sum(kinds.values()) / 1024:.1f}"


def test_cortex_m_sizes_without_encdec_are_the_readmes(tmp_path):
    """The docs (README.md or docs/; today docs/MODELS.md): "... {N.N} KiB
    built with `encdec=0` and {M.M} KiB with `encdec=0 tokenizer=0`
    (Cortex-M) ..." (worded so tests/test_readme_sizes.py's "KiB on TARGET"
    pattern, which builds the default library, does not claim them)."""
    import targets
    t = targets.load_all()["cortex-m"]
    if shutil.which(t.tool("gcc")) is None:
        pytest.skip("arm-none-eabi-gcc not installed")
    no_ed = _cortex_m_runtime_kib(tmp_path, "encdec=0")
    neither = _cortex_m_runtime_kib(tmp_path, "encdec=0", "tokenizer=0")
    assert float(neither) < float(no_ed)
    want = (f"{no_ed} KiB built with `encdec=0` and {neither} KiB with `encdec=0 "
            f"tokenizer=0` (Cortex-M)")
    assert want in doc_text(), f"no page of README.md / docs/ says: {want}"


def test_cortex_m_firmware_says_why_in_one_line(switch_file, tmp_path):
    """`scons target=cortex-m encdec=0 model=SWITCH run` under QEMU: the
    firmware stops at colibri_arena_size and prints the library's detail
    (init refuses the blob with it) on one line; scons relays that line."""
    import targets
    t = targets.load_all()["cortex-m"]
    if shutil.which(t.tool("gcc")) is None or shutil.which(t.emulator[0]) is None:
        pytest.skip("arm-none-eabi-gcc or qemu-system-arm not installed")
    p = subprocess.run([str(Path(sys.executable).parent / "scons"), "-Q", "-j2",
                        "target=cortex-m", "encdec=0", "tokenizer=0", f"model={switch_file}",
                        f"build_dir={tmp_path}", "run"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode != 0, p.stdout[-2000:]
    line = ("error: colibri_arena_size_ex: not supported by this build (-12): " + DETAIL)
    assert line in p.stdout + p.stderr, p.stdout[-2000:] + p.stderr[-2000:]
