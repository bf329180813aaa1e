"""`scons target=X run`: the firmware with the demo model, run under the
target's emulator on a text prompt, shows the text the numpy reference
generates for the same file (greedy), and a tokens/s figure."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from colibri.buildsteps import fwrun  # noqa: E402
from colibri.convert import ColibriExporter  # noqa: E402
from colibri.errors import ColibriError  # noqa: E402
from colibri.reference import Reference  # noqa: E402
from greedy import assert_margins  # noqa: E402

SCONS = str(ROOT / ".venv" / "bin" / "scons")
PROMPT = "The Python tutorial"


def test_text_prompt_is_its_utf8_bytes():
    assert fwrun.text_prompt_tokens("Aé") == (65, 0xC3, 0xA9)
    with pytest.raises(ColibriError, match="prompt= is empty"):
        fwrun.text_prompt_tokens("")
    with pytest.raises(ColibriError, match="vocabulary has 96 ids"):
        fwrun.text_prompt_tokens("z", vocab=96)


def test_bytes_text_replaces_invalid_utf8():
    assert fwrun.bytes_text([72, 105]) == "Hi"
    assert fwrun.bytes_text([0xFF]) == "\ufffd"


@pytest.fixture(scope="module")
def demo_int8(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "demo-int8.colibri"
    return ColibriExporter(ROOT / "models" / "demo" / "checkpoint", quant="int8").export(out)


@pytest.mark.parametrize("target", ["armv7", "cortex-m"])
def test_run_goal_prints_the_reference_greedy_text(demo_int8, tmp_path, target):
    n = 24
    p = subprocess.run([SCONS, "-Q", f"target={target}", f"model={demo_int8}",
                        f"prompt={PROMPT}", f"generate={n}", f"build_dir={tmp_path}", "run"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    # The independent truth: the numpy reference's greedy tokens for the file.
    tokens, rows = Reference(demo_int8).generate(np.frombuffer(PROMPT.encode(), np.uint8), n)
    # Text equality needs every choice to win by more than C-vs-numpy and
    # CPU-to-CPU rounding; measured smallest margin 1.0e-3 for this prompt.
    assert_margins(rows[len(PROMPT) - 1:], 5e-4, what="demo greedy rows")
    want = PROMPT + bytes(int(t) for t in tokens).decode("utf-8", errors="replace")
    lines = p.stdout.splitlines()
    assert want in lines, p.stdout[-1500:]
    m = re.search(r"(\d+) tokens \(prefill \+ decode\) in [\d.]+ s wall time: ([\d.]+) tokens/s",
                  p.stdout)
    assert m and int(m.group(1)) == len(PROMPT) + n - 1 and float(m.group(2)) > 0


def test_run_goal_refuses_a_text_prompt_for_a_small_vocabulary(tmp_path):
    from colibri.buildsteps import testmodel

    small = testmodel.make_model(tmp_path / "small.colibri", "int8")
    p = subprocess.run([SCONS, "-Q", "target=x86_64", f"model={small}", "prompt=zz",
                        f"build_dir={tmp_path / 'b'}", "run"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode != 0
    assert "outside the model's vocabulary" in p.stderr
