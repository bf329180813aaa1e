"""Runs llama.cpp's convert_hf_to_gguf.py (the pinned sdist's, with its own
gguf-py) on a tiny checkpoint made by the tests:

    python tests/hf_to_gguf_driver.py LLAMA_CPP_DIR HF_DIR OUT.gguf OUTTYPE

Its weight and metadata conversion runs untouched. Two things are patched,
both about the tokenizer only: the tiny checkpoints carry a tiny byte-level
BPE tokenizer.json (tests/gguf_fixtures.py), which the converter would
refuse because its pre-tokenizer hash is not one of the real vocabularies
it knows (get_vocab_base_pre is told "gpt-2", the regex the tiny tokenizer
uses), and Mixtral's class would first look for a SentencePiece
tokenizer.model (the gpt2 path is taken directly).
"""
import sys
from pathlib import Path

llama, model, out, outtype = sys.argv[1:5]
sys.path.insert(0, llama)
sys.path.insert(1, str(Path(llama) / "gguf-py"))
import conversion.base as base  # noqa: E402

base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
orig_model_class = None
import conversion  # noqa: E402

_get = conversion.get_model_class


def get_model_class(*a, **k):
    cls = _get(*a, **k)
    cls.set_vocab = lambda self: self._set_vocab_gpt2()
    return cls


sys.argv = ["convert_hf_to_gguf.py", model, "--outfile", out, "--outtype", outtype]
import runpy  # noqa: E402

conversion.get_model_class = get_model_class
mod = runpy.run_path(str(Path(llama) / "convert_hf_to_gguf.py"), run_name="not_main")
mod["get_model_class"] = get_model_class
mod["main"].__globals__["get_model_class"] = get_model_class
mod["main"]()
