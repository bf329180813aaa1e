"""colibri.runtime's text methods (Model.tokenize / detokenize / generate)
over the C tokenizer, streaming detokenizer and sampler: ids and text equal
HF `tokenizers`'; greedy generation equals colibri-cli --prompt and the numpy
reference's ids; a seeded sampled generation equals colibri-cli with the same
flags; a file without a tokenizer raises; `colibri generate --engine c` and
`--engine reference` print the same greedy text."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("torch")

from colibri.buildsteps import cbuild
from colibri import errors, runtime  # noqa: E402
from colibri.buildsteps import testmodel  # noqa: E402
from colibri.model.convert import ColibriExporter  # noqa: E402
from colibri.model.reference import Reference  # noqa: E402
from greedy import assert_margins  # noqa: E402
import tokenizer_fixtures as tf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "The Python"
N = 10


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """colibri-cli and libcolibri.so of one build of this checkout."""
    return cbuild.build(tmp_path_factory.mktemp("bt-build"), kernels=cbuild.host_kernels(),
                        shared=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(.colibri path, tokenizers.Tokenizer): a tiny Mixtral with a byte-level
    BPE tokenizer of ~300 ids, the model's vocabulary padded to 320 (rows
    without text, which generation never chooses)."""
    from test_tokenizer import _checkpoint
    d = tmp_path_factory.mktemp("bt-model")
    hf = tf.train("bl-gpt2-300", tf.corpus_text(300_000))
    ck = _checkpoint(d / "ck", hf, vocab=320)
    return ColibriExporter(ck, quant="f32").export(d / "m.colibri"), hf


def strings() -> list[str]:
    """A few dozen varied valid strings: prose, code, whitespace runs,
    contractions, CJK, emoji/ZWJ, combining marks, RTL, specials."""
    out = [s.decode() for s in tf.test_strings(40, seed=5) if _valid(s)]
    out += ["Hello, world!", "it's   done\n\n", "日本語テキスト", "👨\u200d👩\u200d👧 ok",
            "e\u0301te\u0301", "שלום עולם 123", "<|endoftext|>after", "  leading", ""]
    return out


def _valid(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def cli_prompt(cli, path, *flags) -> tuple[str, list[int]]:
    """colibri-cli --prompt PROMPT ...: (generated text, generated ids)."""
    p = subprocess.run([str(cli), "--model", str(path), "--prompt", PROMPT, "--generate",
                        str(N), *flags], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = p.stdout.decode()
    assert out.startswith(PROMPT) and out.endswith("\n"), out
    err = p.stderr.decode()
    ids = [int(x) for x in err.split("generated ids:")[1].split("\n")[0].split(",")]
    return out[len(PROMPT):-1], ids


def test_tokenize_and_detokenize_equal_tokenizers(model, built):
    path, hf = model
    texts = strings()
    assert len(texts) >= 30
    with runtime.Model(path, library=built["so"]) as m:
        for text in texts:
            want = hf.encode(text).ids
            assert m.tokenize(text, add_bos=False, parse_special=True) == want, text
            assert m.tokenize(text.encode(), add_bos=False, parse_special=True) == want
            assert m.detokenize(want) == hf.decode(want, skip_special_tokens=False), text
            assert m.detokenize(want, skip_special=True) == hf.decode(want), text
        # without parse_special a special token's text is plain text
        sp = "<|endoftext|>"
        plain = m.tokenize(sp, add_bos=False)
        assert plain != [hf.token_to_id(sp)] and m.detokenize(plain) == sp
        assert m.tokenize(sp, add_bos=False, parse_special=True) == [hf.token_to_id(sp)]
        info = m.tokenizer_info
        assert info["n_vocab"] == hf.get_vocab_size()
        if info["bos_id"] < 0:
            with pytest.raises(errors.NoBosError) as ei:
                m.tokenize("x", add_bos=True)
            assert ei.value.code == -34 and ei.value.strerror
        with pytest.raises(errors.TokenError):
            m.detokenize([10**6])
        with pytest.raises(errors.TextUTF8Error):
            m.tokenize("\ud800")


def test_greedy_generate_equals_cli_and_reference(model, built):
    path, hf = model
    with runtime.Model(path, library=built["so"]) as m:
        ids = m.tokenize(PROMPT)
        gen = m.generate(PROMPT, N)
        pieces = list(gen)
        got_ids = gen.ids
    assert ids == hf.encode(PROMPT).ids
    text = "".join(pieces)
    # the numpy reference's greedy rows, checked for near ties first
    ref = Reference(path)
    n_text = hf.get_vocab_size()
    hist, rows = list(ids), []
    logits = ref.forward(np.array([ids]))[0, -1].copy()
    want = []
    for _ in range(len(got_ids)):
        logits[n_text:] = -np.inf
        rows.append(logits.copy())
        t = int(np.argmax(logits))
        want.append(t)
        hist.append(t)
        logits = ref.forward(np.array([[t]]), n_past=len(hist) - 1)[0, -1].copy()
    assert_margins(np.array(rows)[:, :n_text], what="greedy reference rows")
    assert got_ids == want
    assert len(got_ids) == N or got_ids[-1] == hf.token_to_id("<|endoftext|>")
    assert text == hf.decode(got_ids)
    cli_text, cli_ids = cli_prompt(built["cli"], path)
    assert (text, got_ids) == (cli_text, cli_ids)


def test_seeded_sampling_equals_cli(model, built):
    path, hf = model
    kw = dict(temperature=0.9, top_k=50, top_p=0.95, min_p=0.01, repetition_penalty=1.1,
              seed=7)
    flags = ["--temperature", "0.9", "--top-k", "50", "--top-p", "0.95", "--min-p", "0.01",
             "--repetition-penalty", "1.1", "--seed", "7"]
    with runtime.Model(path, library=built["so"]) as m:
        gen = m.generate(PROMPT, N, **kw)
        text = gen.text
        again = m.generate(PROMPT, N, **kw)
        assert again.text == text and again.ids == gen.ids
        other = m.generate(PROMPT, N, **dict(kw, seed=8))
        other.text
    assert (text, gen.ids) == cli_prompt(built["cli"], path, *flags)
    assert other.ids != gen.ids      # the seed matters (10 draws at T=0.9)


def test_bad_sampling_values_raise_before_any_token(model, built):
    path, _ = model
    with runtime.Model(path, library=built["so"]) as m:
        for kw in (dict(temperature=-1.0), dict(top_p=float("nan")),
                   dict(repetition_penalty=0.0)):
            with pytest.raises(errors.ArgumentError) as ei:
                m.generate(PROMPT, 3, **kw)
            assert ei.value.code == -7
        with pytest.raises(errors.ArgumentError):
            m.generate("", 3)
        assert m.generate(PROMPT, 0).text == ""
    with pytest.raises(errors.NotInitializedError):
        m.tokenize("x")


def test_model_without_tokenizer_raises(tmp_path, built):
    path = testmodel.make_model(tmp_path / "tiny.colibri", "f32")
    with runtime.Model(path, library=built["so"]) as m:
        for call in (lambda: m.tokenize("x"), lambda: m.detokenize([1]),
                     lambda: m.generate("x", 2)):
            with pytest.raises(errors.NoTokenizerError) as ei:
                call()
            e = ei.value
            assert e.code == -30 and isinstance(e, errors.ColibriError)
            assert "tokenizer" in e.strerror.lower(), e.strerror
        m.infer([[1, 2]])     # the model itself still works


def test_colibri_generate_engines_print_the_same_greedy_text(model, built):
    path, _ = model
    env = dict(os.environ, COLIBRI_LIBRARY=str(built["so"]),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    outs = {}
    for engine in ("c", "reference"):
        p = subprocess.run([sys.executable, "-m", "colibri.cli", "generate", str(path), PROMPT,
                            "--max-tokens", str(N), "--engine", engine],
                           capture_output=True, text=True, env=env, timeout=300)
        assert p.returncode == 0, p.stderr
        first, rest = p.stdout.split("\n", 1)
        assert first.startswith(f"engine: {engine}"), first
        outs[engine] = rest
    assert outs["c"] == outs["reference"] and outs["c"].startswith(PROMPT)
    cli_text, _ = cli_prompt(built["cli"], path)
    assert outs["c"] == PROMPT + cli_text + "\n"
