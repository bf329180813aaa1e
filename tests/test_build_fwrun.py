"""`scons target=X run`: the firmware with the demo model, run under the
target's emulator on a text prompt that the device tokenises itself, shows
the text the numpy reference + the reference sampler generate for the same
file and seed (the demo's seeded sampling), and a tokens/s figure."""
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
from colibri.model.convert import ColibriExporter  # noqa: E402
from colibri.errors import ColibriError  # noqa: E402
from colibri.model.reference import Reference  # noqa: E402

SCONS = str(ROOT / ".venv" / "bin" / "scons")
PROMPT = "The Python tutorial"


def test_text_prompt_is_its_utf8_bytes():
    assert fwrun.text_prompt_tokens("Aé") == (65, 0xC3, 0xA9)
    with pytest.raises(ColibriError, match="prompt= is empty"):
        fwrun.text_prompt_tokens("")
    with pytest.raises(ColibriError, match="vocabulary has 96 ids"):
        fwrun.text_prompt_tokens("z", vocab=96)


def test_sampling_from_scons_variables():
    sp = fwrun.sampling_from_args(dict(temperature="0.8", top_k="40", top_p="0.95",
                                       seed="0x10", greedy="0"))
    assert (sp.temperature, sp.top_k, sp.top_p, sp.seed) == (0.8, 40, 0.95, 16)
    assert not sp.greedy
    assert fwrun.sampling_from_args(dict(temperature="0.8", top_k="0", top_p="1", seed="1",
                                         greedy="1")).greedy
    for bad, says in ((dict(temperature="-1"), "temperature"), (dict(temperature="x"), "temperature="),
                      (dict(top_k="-2"), "top_k"), (dict(top_p="0"), "top_p=0"),
                      (dict(seed="abc"), "seed=abc"), (dict(seed=str(2 ** 64)), "seed="),
                      (dict(greedy="maybe"), "greedy=maybe")):
        args = dict(temperature="0", top_k="0", top_p="1", seed="0", greedy="0", **{})
        args.update(bad)
        with pytest.raises(ColibriError, match=says):
            fwrun.sampling_from_args(args)


def test_bytes_text_replaces_invalid_utf8():
    assert fwrun.bytes_text([72, 105]) == "Hi"
    assert fwrun.bytes_text([0xFF]) == "\ufffd"


@pytest.fixture(scope="module")
def demo_int8(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "demo-int8.colibri"
    return ColibriExporter(ROOT / "models" / "demo" / "checkpoint", quant="int8").export(out)


@pytest.mark.parametrize("target", ["armv7", "cortex-m"])
def test_run_goal_prints_the_devices_sampled_text(demo_int8, tmp_path, target):
    """The demo as scripts/demo.sh runs it (seeded sampling). Judged by
    Hugging Face `tokenizers` (ids of the prompt, text of the tokens) and by
    the numpy reference sampler on the device's own logits (the firmware
    prints every row): each token must be exactly what colibri/text/sampling.py
    chooses from that row for the seed and step. The int8 logits themselves
    may differ from the numpy reference's by int8 rounding (RESULTS.md: up
    to 0.1), so against the reference each token need only be one the
    reference's top-k keeps (teacher-forced), not the same draw."""
    import importlib.util
    from tokenizers import Tokenizer as HFTokenizer
    from colibri.buildsteps import emulate
    from colibri.text.sampling import sample
    import targets
    spec = importlib.util.spec_from_file_location("demo_eval_r", ROOT / "models/demo/eval.py")
    demo_eval = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo_eval)
    sp = demo_eval.demo_sampling()
    hf = HFTokenizer.from_file(str(ROOT / "models/demo/checkpoint/tokenizer.json"))
    n = 24
    p = subprocess.run([SCONS, "-Q", f"target={target}", f"model={demo_int8}",
                        f"prompt={PROMPT}", f"generate={n}", f"build_dir={tmp_path}",
                        f"temperature={sp.temperature}", f"top_k={sp.top_k}", f"seed={sp.seed}",
                        "run"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    # The same firmware once more, its machine records this time.
    t = targets.load_all()[target]
    r = emulate.run(t, tmp_path / target / "firmware.elf")
    fw = emulate.parse_firmware_output(r.stdout)
    assert r.returncode == 0 and fw.done
    run_ = fw.prompts[0]
    assert run_.prompt == hf.encode(PROMPT).ids
    assert len(run_.tokens) == n
    text = hf.decode(run_.tokens)
    assert run_.text.decode("utf-8") == text
    # The person's view shows that text after the prompt.
    assert "(tokenised on the device)" in p.stdout, p.stdout[-1500:]
    shown = re.search(r"^generated:\n(.*)\n\d+ tokens \(prefill", p.stdout, re.S | re.M)[1]
    assert shown == PROMPT + text
    m = re.search(r"(\d+) tokens \(prefill \+ decode\) in [\d.]+ s wall time: ([\d.]+) tokens/s",
                  p.stdout)
    assert m and int(m.group(1)) == len(run_.prompt) + n - 1 and float(m.group(2)) > 0
    # The sampler: the reference's choice on the device's own rows.
    L = len(run_.prompt)
    hist = list(run_.prompt)
    want_rows = Reference(demo_int8).forward(np.array([hist + run_.tokens[:-1]]))[0]
    for g, tok in enumerate(run_.tokens):
        row = run_.rows[L - 1 + g].copy()
        choice, margin = sample(row, sp, hist, g, margin=True)
        assert choice == tok or margin < 1e-9, (g, tok, choice)
        ref_rank = int((want_rows[L - 1 + g] > want_rows[L - 1 + g][tok]).sum())
        assert ref_rank < sp.top_k + 8, (g, tok, ref_rank)
        hist.append(tok)
    # Sampling, not argmax, and readable: mostly ASCII words.
    assert any(int(run_.rows[L - 1 + g].argmax()) != tok for g, tok in enumerate(run_.tokens))
    assert sum(c.isalpha() or c.isspace() for c in text) > 0.6 * len(text), text


def test_run_goal_refuses_a_text_prompt_for_a_small_vocabulary(tmp_path):
    from colibri.buildsteps import testmodel

    small = testmodel.make_model(tmp_path / "small.colibri", "int8")
    p = subprocess.run([SCONS, "-Q", "target=x86_64", f"model={small}", "prompt=zz",
                        f"build_dir={tmp_path / 'b'}", "run"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode != 0
    assert "outside the model's vocabulary" in p.stderr
