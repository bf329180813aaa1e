"""Colibri: Mixture-of-Experts inference for small devices.

Python side: the .colibri format (format.py), quantisation (quant.py), the
Hugging Face converter (convert.py), the numpy reference forward pass
(reference.py) and the `colibri` command line (cli.py).
"""
__version__ = "0.1.0"
