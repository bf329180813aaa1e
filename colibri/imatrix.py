"""Importance matrix (llama.cpp's imatrix idea): for every matrix the block
quantisers store, the mean of x^2 per input column over calibration text,
where x are the inputs that matrix multiplies in the float32 model (an
expert's only the tokens routed to it). colibri/kquants.py weights each
column's squared error by it, so the columns that see large activations are
stored more accurately.

Collected by the numpy reference (colibri/reference.py) over a float32
.colibri file of the model, in windows of the model's context. Saved as a
.npz: one float32 [cols] array per matrix, named KIND[.LAYER[.EXPERT]] (e.g.
EXPERT_W2.3.5), and the number of inputs it averages as NAME#count. A matrix
no token reached (an expert the router never chose) has no entry: it is
quantised without importance.

    colibri imatrix HF_DIR --text calib.txt -o model.imatrix.npz
    colibri convert HF_DIR --quant q4 --imatrix model.imatrix.npz -o model.colibri
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .errors import ColibriError
from .format import Kind

Key = tuple  # (Kind, layer or None, expert or None)

# Calibration defaults: tokens read from the text and the window length cap.
DEFAULT_TOKENS = 32768
MAX_WINDOW = 512


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
    from .format import DENSE_KINDS, EXPERT_KINDS, SHARED_KINDS
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


def from_checkpoint(model_dir, text: bytes, max_tokens: int = DEFAULT_TOKENS,
                    progress=None) -> dict[Key, tuple[np.ndarray, int]]:
    """The importance matrix of a Hugging Face checkpoint on calibration
    text: converts it to a temporary float32 .colibri file (with its
    tokenizer), tokenises `text`, runs the reference."""
    from .convert import ColibriExporter
    from .tokenizer import Tokenizer
    with tempfile.TemporaryDirectory(prefix="colibri-imatrix-") as tmp:
        path = Path(tmp) / "f32.colibri"
        ex = ColibriExporter(model_dir, quant="f32")
        if ex.tokenizer is None:
            raise ColibriError(f"{model_dir} has no tokenizer.json: an importance matrix "
                               "needs the calibration text tokenised")
        ex.export(path)
        ids = np.asarray(Tokenizer.from_file(path).encode(text), np.int64)
        window = min(ex.shape.max_seq_len, MAX_WINDOW)
        wins = token_windows(ids, window, max_tokens)
        if not wins:
            raise ColibriError("the calibration text is empty")
        if progress:
            progress(f"{sum(len(w) for w in wins)} calibration tokens in {len(wins)} windows "
                     f"of {window}")
        return collect(path, wins)


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


# --- command line ------------------------------------------------------------

def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "imatrix", help="measure an importance matrix for `convert --imatrix`",
        description="Run a checkpoint (float32, the numpy reference) over calibration text "
                    "and save, per matrix, the mean squared activation of each input column "
                    "(llama.cpp's imatrix idea). `colibri convert --quant q4 --imatrix FILE` "
                    "then stores the columns that matter most more accurately. Use text like "
                    "what the model will see, and not the text you evaluate it on.")
    p.add_argument("model_dir", metavar="HF_DIR", help="checkpoint directory (with tokenizer.json)")
    p.add_argument("--text", required=True, metavar="FILE", help="calibration text (UTF-8)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.npz")
    p.add_argument("--tokens", type=int, default=DEFAULT_TOKENS,
                   help="calibration tokens to use from the start of the text "
                        "(default: %(default)s)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    start = time.monotonic()
    try:
        text = Path(args.text).read_bytes()
    except OSError as exc:
        raise ColibriError(f"cannot read {args.text}: {exc.strerror or exc}") from None
    say = lambda line: print(f"colibri imatrix: {line}", file=sys.stderr, flush=True)
    im = from_checkpoint(args.model_dir, text, args.tokens, progress=say)
    save(args.output, im)
    print(f"wrote {args.output}: {len(im)} matrices, {time.monotonic() - start:.1f} s")
    return 0
