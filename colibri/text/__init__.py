"""Text: tokenizers and sampling. tokenizer.py turns a Hugging Face
tokenizer.json into the TOKENIZER section of a .colibri file (FORMAT.md 7)
and encodes/decodes from it as `tokenizers` does; tokregex.py compiles and
runs the pre-tokenizer regexes over unicode_tables.py (generated);
gguf_tokenizer.py reads a GGUF file's tokenizer into the same section;
sampling.py is the numpy reference of src/sample.c.

It reads its section from a .colibri file (file.format) and knows nothing of
the converters, the reference forward or the devices.

May import: errors, file
"""
