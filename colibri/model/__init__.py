"""The model: Hugging Face checkpoints and GGUF files -> .colibri files, and
what computes with them in Python.

- hf.py (config.json, safetensors), families/ (one module per family),
  export.py (what every exporter shares), convert.py (`colibri convert`,
  `colibri imatrix`; ColibriExporter), convert_encdec.py, gguf_in.py and
  convert_gguf.py (GGUF input), imatrix.py (importance matrices);
- reference.py and reference_encdec.py: the numpy forward, the golden truth
  the C runtime is held to (they import only file, errors and each other:
  the truth does not depend on the converter);
- memory.py (what a run holds resident), and the commands that use a model:
  inspect.py (`colibri info`/`verify`), run.py (`colibri run`), generate.py
  (`colibri tokenize`/`generate`).

It uses the file, text and the C binding (runtime); it knows no device or
build.

May import: errors, file, text, runtime
"""
