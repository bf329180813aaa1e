"""Importance matrix (llama.cpp's imatrix idea): for every matrix the block
quantisers store, the mean of x^2 per input column over calibration text,
where x are the inputs that matrix multiplies in the float32 model (an
expert's only the tokens routed to it). colibri/file/kquants.py weights each
column's squared error by it, so the columns that see large activations are
stored more accurately.

Collected by the numpy reference (colibri/model/reference.py) over a float32
.colibri file of the model, in windows of the model's context. Saved as a
.npz: one float32 [cols] array per matrix, named KIND[.LAYER[.EXPERT]] (e.g.
EXPERT_W2.3.5), and the number of inputs it averages as NAME#count. A matrix
no token reached (an expert the router never chose) has no entry: it is
quantised without importance.

    colibri imatrix HF_DIR --text calib.txt -o model.imatrix.npz
    colibri convert HF_DIR --quant q4 --imatrix model.imatrix.npz -o model.colibri

Measuring one from a checkpoint converts it first: that
(`imatrix_from_checkpoint`) and the `colibri imatrix` command are in
colibri/model/convert.py, which imports this module to read the file back.
"""
from __future__ import annotations

import numpy as np

from ..errors import ColibriError
from ..file.format import Kind

Key = tuple  # (Kind, layer or None, expert or None)


def key_name(kind, layer=None, expert=None) -> str:
    parts = [Kind(kind).name] + [str(v) for v in (layer, expert) if v is not None]
    return ".".join(parts)


def parse_key(name: str) -> Key:
    parts = name.split(".")
    nums = [int(p) for p in parts[1:]] + [None, None]
    return (Kind[parts[0]], nums[0], nums[1])


class _Recorder:
    """A reference Linear that also sums x^2 per column of what it is given."""

    def __init__(self, inner):
        self.inner = inner
        self.sum_sq = np.zeros(inner.cols, np.float64)
        self.count = 0

    def __call__(self, x):
        x64 = np.asarray(x, np.float64)
        self.sum_sq += (x64 * x64).sum(axis=0)
        self.count += x64.shape[0]
        return self.inner(x)


def _instrument(ref) -> dict[Key, _Recorder]:
    """Replace every matrix product of a Reference by a _Recorder."""
    from ..file.format import DENSE_KINDS, EXPERT_KINDS, SHARED_KINDS
    rec: dict[Key, _Recorder] = {}

    def wrap(kind, layer, expert, lin):
        r = rec[(kind, layer, expert)] = _Recorder(lin)
        return r

    for l, layer in enumerate(ref.layers):
        for name, kind in (("wq", Kind.WQ), ("wk", Kind.WK), ("wv", Kind.WV), ("wo", Kind.WO),
                           ("router", Kind.ROUTER)):
            if layer.get(name) is not None:
                layer[name] = wrap(kind, l, None, layer[name])
        layer["experts"] = [tuple(wrap(k, l, e, lin) for k, lin in zip(EXPERT_KINDS, trio))
                            for e, trio in enumerate(layer["experts"])]
        for name, kinds in (("shared", SHARED_KINDS), ("dense", DENSE_KINDS)):
            if layer.get(name) is not None:
                layer[name] = tuple(wrap(k, l, None, lin) for k, lin in zip(kinds, layer[name]))
    ref.lm_head = wrap(Kind.LM_HEAD, None, None, ref.lm_head)
    return rec


def collect(colibri_file, windows) -> dict[Key, tuple[np.ndarray, int]]:
    """{(kind, layer, expert): (mean x^2 float32 [cols], count)} over token
    windows (a list of 1-D int arrays, each at most max_seq_len long) run
    through the reference of the (float32) .colibri file."""
    from .reference import Reference
    ref = Reference(colibri_file)
    rec = _instrument(ref)
    for w in windows:
        ref.reset()
        ref.forward(np.asarray(w, np.int64)[None, :])
    return {k: ((r.sum_sq / r.count).astype(np.float32), r.count)
            for k, r in rec.items() if r.count > 0}


def token_windows(tokens: np.ndarray, window: int, max_tokens: int) -> list[np.ndarray]:
    """Consecutive windows of `window` tokens (the last may be shorter), at
    most max_tokens in all."""
    tokens = np.asarray(tokens)[:max_tokens]
    return [tokens[i:i + window] for i in range(0, len(tokens), window) if i + 1 < len(tokens)]


def save(path, imatrix: dict[Key, tuple[np.ndarray, int]]) -> None:
    arrays = {}
    for k, (mean, count) in imatrix.items():
        arrays[key_name(*k)] = mean
        arrays[key_name(*k) + "#count"] = np.array(count, np.int64)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load(path) -> dict[Key, np.ndarray]:
    """{(kind, layer, expert): mean x^2 [cols]} from a file `save` wrote."""
    try:
        with np.load(path) as z:
            return {parse_key(n): z[n].astype(np.float32) for n in z.files if "#" not in n}
    except (OSError, ValueError, KeyError) as exc:
        raise ColibriError(f"{path}: not an importance matrix written by `colibri imatrix` "
                           f"({exc})") from None
