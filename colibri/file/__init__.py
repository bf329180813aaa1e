"""The .colibri file (docs/FORMAT.md): its layout, read and written by
format.py (agrees with src/include/colibri_format.h); the storage types and
the way between float weights and their stored values (storage.py); their
arithmetic, exactly as FORMAT.md 4-5 state it: int8/int16 (quant.py), the
block types Q4_0/Q5_0/Q4_K/Q5_K/Q6_K and their numpy product, the block kernels'
reference (blocks.py), and the block quantisers (kquants.py).

Everything else in colibri stands on this package; it knows no checkpoint,
tokenizer, device or build.

May import: errors
"""
