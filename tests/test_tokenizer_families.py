"""A checkpoint of another family with its tokenizer: the file is format
version 2 (the computation's description leads the table) and carries the
optional tokenizer section after its tensors. Both readers, the Python
tokenizer and the C runtime (colibri-cli --tokenize / --prompt), use it, and
the ids are those of HF `tokenizers`."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")

from colibri.buildsteps import cbuild
from colibri.file import format as F  # noqa: E402
from colibri.model.convert import ColibriExporter  # noqa: E402
from colibri.model.reference import Reference  # noqa: E402
from colibri.text.tokenizer import Tokenizer  # noqa: E402
from golden_families import FAMILY_CONFIGS, make_family, save_family  # noqa: E402
from greedy import assert_margins  # noqa: E402
from tokenizer_fixtures import corpus_text, train  # noqa: E402

TEXTS = ["def main():\n    return 42", "The Python tutorial", "héllo wörld  ✓ 123456"]


@pytest.fixture(scope="module")
def qwen2_with_tokenizer(tmp_path_factory):
    """(.colibri path, tokenizers.Tokenizer): Qwen2-MoE with a byte-level BPE
    tokenizer of 301 ids, the model's vocabulary widened to hold them."""
    tok = train("bl-qwen2-300", corpus_text(300_000))
    name = "qwen2_moe"
    cfg_cls, model_cls, kwargs = FAMILY_CONFIGS[name]
    saved = FAMILY_CONFIGS[name]
    FAMILY_CONFIGS[name] = (cfg_cls, model_cls, dict(kwargs, vocab_size=tok.get_vocab_size()))
    try:
        model = make_family(name, seed=3)
    finally:
        FAMILY_CONFIGS[name] = saved
    d = tmp_path_factory.mktemp("qwen2-tok")
    ckpt = save_family(model, d / "hf")
    tok.save(str(ckpt / "tokenizer.json"))
    out = ColibriExporter(ckpt, quant="f32").export(d / "q.colibri")
    return out, tok


def test_file_is_version_2_with_a_tokenizer_section(qwen2_with_tokenizer):
    path, tok = qwen2_with_tokenizer
    cf = F.read_file(path)
    assert cf.version == 2
    assert cf.entries[0].kind == F.Kind.DESC
    assert cf.entries[-1].kind not in F.Kind._value2member_map_  # the optional section
    ours = Tokenizer.from_file(path)
    for text in TEXTS:
        assert ours.encode(text) == tok.encode(text).ids, text


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    return cbuild.build(tmp_path_factory.mktemp("cli"), kernels=cbuild.host_kernels())["cli"]


def test_c_runtime_tokenizes_and_generates_from_a_version_2_file(qwen2_with_tokenizer, cli):
    path, tok = qwen2_with_tokenizer
    for text in TEXTS:
        p = subprocess.run([str(cli), "--model", str(path), "--tokenize", text],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert [int(x) for x in p.stdout.split(",")] == tok.encode(text).ids, text
    # The prompt is tokenised by C from the file and decoded greedily; the
    # reference's greedy continuation of the same ids is the judge.
    prompt = TEXTS[1]
    ids = tok.encode(prompt).ids
    n = 6
    gen, rows = Reference(path).generate(np.array(ids), n)
    assert_margins(rows[len(ids) - 1:], what="qwen2 greedy rows")
    p = subprocess.run([str(cli), "--model", str(path), "--prompt", prompt,
                        "--generate", str(n)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    want = tok.decode(list(map(int, gen)), skip_special_tokens=False)
    assert len(want) >= n // 2 and want in p.stdout, (want, p.stdout)
