"""Runs llama.cpp's convert_hf_to_gguf.py (the pinned sdist's, with its own
gguf-py) on tiny checkpoints made by the tests, all in one process (torch
is imported once):

    python tests/hf_to_gguf_driver.py LLAMA_CPP_DIR HF_DIR OUT.gguf OUTTYPE [...]

Its weight and metadata conversion runs untouched. Two things are patched,
both about the tokenizer only: the tiny checkpoints carry a tiny byte-level
BPE tokenizer.json (tests/gguf_fixtures.py), which the converter would
refuse because its pre-tokenizer hash is not one of the real vocabularies
it knows (get_vocab_base_pre is told "gpt-2", the regex the tiny tokenizer
uses), and Mixtral's class would first look for a SentencePiece
tokenizer.model (the gpt2 path is taken directly).
"""
import runpy
import sys
from pathlib import Path

llama, jobs = sys.argv[1], sys.argv[2:]
sys.path.insert(0, llama)
sys.path.insert(1, str(Path(llama) / "gguf-py"))
import conversion  # noqa: E402
import conversion.base as base  # noqa: E402

base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
_get = conversion.get_model_class


def get_model_class(*a, **k):
    cls = _get(*a, **k)
    cls.set_vocab = lambda self: self._set_vocab_gpt2()
    return cls


mod = runpy.run_path(str(Path(llama) / "convert_hf_to_gguf.py"), run_name="not_main")
mod["main"].__globals__["get_model_class"] = get_model_class
for i in range(0, len(jobs), 3):
    model, out, outtype = jobs[i:i + 3]
    sys.argv = ["convert_hf_to_gguf.py", model, "--outfile", out, "--outtype", outtype]
    mod["main"]()
