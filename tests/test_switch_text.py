"""Text in, text out on an encoder-decoder: a Switch Transformers checkpoint
(tests/golden_switch.py, random weights, fixed seed) with a T5-shaped
Unigram tokenizer trained here (tests/tokenizer_fixtures.py "t5-300"; and
"t5-spm", with the Precompiled nmt_nfkc map the T5 / Switch files on the hub
carry), converted with its tokenizer.json. `colibri-cli --prompt`, the binding's
Model.generate and `colibri generate` give the ids and the text of
transformers' generate (greedy, with a repetition penalty: the random
model repeats one token without it) on the ids `tokenizers` gives the prompt
(eos last, T5's template), decoded by `tokenizers` with
skip_special_tokens."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from golden_switch import make_switch
from test_runtime_support import c_build  # noqa: F401
from test_tokenizer_unigram import unigram  # noqa: F401

import tokenizer_fixtures as tf

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

PROMPTS = ["The quick brown fox", "Return the value of x.", "définir  un  objet 日本",
           "import os\nprint(os.name)"]
NEW = 12
PENALTY = 1.5   # the random model repeats one token without it
MARGIN = 1e-3   # greedy is compared where transformers' top two logits differ by more


# Text the nmt_nfkc map rewrites: full-width letters, a circled digit, a
# decomposed accent, a ligature.
MAP_PROMPTS = ["\uff26\uff55\uff4c\uff4c \uff57\uff49\uff44\uff54\uff48 \u2460 cafe\u0301",
               "the \ufb01rst  de\u0301finition"]


@pytest.fixture(scope="module", params=["t5-300", "t5-spm"])
def switch_text(tmp_path_factory, unigram, request):
    """(the .colibri file, the transformers model, the tokenizers.Tokenizer,
    the prompts)."""
    from colibri.model.convert import ColibriExporter
    if request.param == "t5-spm":
        hf = tf.train_norm_kind("t5-spm", tf.corpus_text(1_000_000), vocab=300)
        assert hf.normalizer.normalize_str(MAP_PROMPTS[0]).startswith("Full width 1 caf\u00e9")
    else:
        hf = unigram("t5-300")
    d = tmp_path_factory.mktemp("switch_text")
    # The vocabulary padded past the tokenizer's ~303 ids: those rows are never chosen.
    assert hf.get_vocab_size(with_added_tokens=True) <= 320
    model = make_switch(seed=3, vocab_size=320)
    model.save_pretrained(d / "ckpt")
    (d / "ckpt" / "tokenizer.json").write_text(hf.to_str())
    out = ColibriExporter(d / "ckpt", quant="f32", max_seq_len=40, max_batch=1).export(
        d / "switch.colibri")
    return out, model, hf, PROMPTS + (MAP_PROMPTS if request.param == "t5-spm" else [])


def _transformers(model, hf, prompt):
    ids = hf.encode(prompt).ids
    assert ids[-1] == 1                        # </s>: T5's template
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False,
                             num_beams=1, repetition_penalty=PENALTY,
                             decoder_start_token_id=0, eos_token_id=1, pad_token_id=0,
                             output_scores=True, return_dict_in_generate=True)
    # Padded ids (>= the tokenizer's) are excluded, as colibri excludes them.
    n_text = hf.get_vocab_size(with_added_tokens=True)
    for row in out.scores:
        top = np.sort(row[0, :n_text].numpy())[-2:]
        assert top[1] - top[0] > MARGIN, "a near tie: choose another prompt or seed"
        assert int(np.argmax(row[0].numpy())) < n_text
    gen = out.sequences[0, 1:].tolist()
    return ids, gen, hf.decode(gen, skip_special_tokens=True)


def test_colibri_cli_prompt_gives_transformers_text(c_build, switch_text):
    path, model, hf, prompts = switch_text
    cli = str(c_build("host").cli)
    for prompt in prompts:
        enc, gen, text = _transformers(model, hf, prompt)
        proc = subprocess.run([cli, "--model", str(path), "--prompt", prompt, "--generate",
                               str(NEW), "--repetition-penalty", str(PENALTY)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"encoded {len(enc)} prompt tokens" in proc.stderr
        ids = [int(x) for x in re.search(r"generated ids: (\S+)", proc.stderr).group(1)
               .split(",")]
        assert ids == gen, (prompt, ids, gen)
        assert proc.stdout == text + "\n", (proc.stdout, text)


def test_the_binding_and_colibri_generate_give_transformers_text(c_build, switch_text):
    from colibri import runtime
    path, model, hf, prompts = switch_text
    build = c_build("host")
    with runtime.Model(path, library=build.so) as m:
        info = m.tokenizer_info
        assert info["model"] == 3 and info["template_eos"] == 1 and m.decoder_start == 0
        for prompt in prompts:
            enc, gen, text = _transformers(model, hf, prompt)
            assert m.tokenize(prompt, parse_special=True, add_eos=True) == enc
            g = m.generate(prompt, NEW, repetition_penalty=PENALTY)
            assert g.text == text and g.ids == gen, (prompt, g.ids, gen)
    env = {**os.environ, "COLIBRI_LIBRARY": str(build.so)}
    enc, gen, text = _transformers(model, hf, PROMPTS[0])
    r = subprocess.run([sys.executable, "-m", "colibri.cli", "generate", str(path), PROMPTS[0],
                        "--max-tokens", str(NEW), "--engine", "c",
                        "--repetition-penalty", str(PENALTY)], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n", 1)[1] == text + "\n", (r.stdout, text)


def test_the_converter_says_which_tokenizer_it_stored(switch_text, tmp_path):
    path, _, hf, prompts = switch_text
    n = hf.get_vocab_size(with_added_tokens=True)
    r = subprocess.run([sys.executable, "-m", "colibri.cli", "info", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    want = (f"Unigram, {n} ids, normaliser Precompiled, Strip(right), Replace, Metaspace split"
            if prompts != PROMPTS else f"Unigram, {n} ids, WhitespaceSplit, Metaspace split")
    assert want in r.stdout, r.stdout
    assert "template appends eos" in r.stdout
