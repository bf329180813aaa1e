"""Colibri: Mixture-of-Experts inference for small devices.

The Python side, one subpackage a concern (docs/ARCHITECTURE.md, "Python"):

    file/        the .colibri file: its layout (format), storage types
                 (storage) and their arithmetic (quant, blocks, kquants)
    text/        tokenizers (tokenizer.json and GGUF -> the TOKENIZER
                 section, encode/decode) and next-token sampling
    model/       checkpoints -> .colibri (hf, families/, convert*, gguf_in,
                 imatrix), the numpy reference forward (the golden truth),
                 memory, and the commands that use a model (info, run,
                 generate)
    device/      signed images, keys, OTA packages, the A/B update agent,
                 `colibri fw`
    buildsteps/  the build: the C runtime on the host (cbuild) and the
                 functions behind the SCons tools
    runtime.py   the C runtime from Python (ctypes over libcolibri.so)
    cli.py       the `colibri` command;  errors.py  what a user can act on

Imports run one way, down this table: a part may import only what its row
names (tests/test_import_graph.py holds the code to it; every subpackage's
docstring repeats its row), and nothing imports cli.

    part         may import
    errors       -
    file         errors
    text         errors, file
    runtime      errors, file
    device       errors, file
    model        errors, file, text, runtime
    buildsteps   errors, file, text, model, device
    cli          errors (the subcommand modules by name, at run time)

colibri/convert.py, cbuild.py and memory.py are thin aliases of their old
paths (`colibri.convert.ColibriExporter`, `python -m colibri.cbuild`,
`python -m colibri.memory`): they import their new module and nothing else
imports them.
"""
__version__ = "0.1.0"
