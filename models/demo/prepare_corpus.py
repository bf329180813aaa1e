"""The demo model's corpus: the prose of the Python 3.11 documentation.

Source: Debian 12's `python3.11-doc` package, which ships the documentation's
reStructuredText sources as plain text under DOC_ROOT. Licence: PSF License
Agreement version 2 (code examples also Zero-Clause BSD), which allows
redistribution of the documentation and of derived works; see
models/demo/CORPUS_LICENSE.txt (copied from the package's copyright file).

Everything here is deterministic: the document list is sorted, the split is
fixed (every HELDOUT_EVERY-th document of the sorted list is held out), the text
is used byte for byte (the model's vocabulary is the 256 byte values), and the
evaluation windows are evenly spaced in the held-out text.

    python models/demo/prepare_corpus.py            # prints the split
    python models/demo/prepare_corpus.py --write-eval models/demo/eval_windows.bin
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

DOC_ROOT = Path("/usr/share/doc/python3.11/html/_sources")
DEBIAN_PACKAGE = "python3.11-doc"

# The prose-heavy parts of the documentation (the library and C-API references
# are mostly signatures and tables, which read less like text).
SUBDIRS = ("tutorial", "howto", "faq", "whatsnew", "reference", "using",
           "extending", "installing", "distributing")
TOP_FILES = ("glossary.rst.txt",)
# Documents with no prose of their own (an include directive / a toctree).
SKIP = ("whatsnew/changelog.rst.txt",)

HELDOUT_EVERY = 20          # documents 0, 20, 40, ... of the sorted list
# Separates documents in the training stream and in the held-out text.
DOC_SEPARATOR = b"\n\n"

# The committed evaluation set: EVAL_WINDOWS windows of EVAL_WINDOW bytes,
# evenly spaced over the held-out text (window i starts at
# i * (len - EVAL_WINDOW) // (EVAL_WINDOWS - 1)).
EVAL_WINDOWS = 32
EVAL_WINDOW = 128


class CorpusError(Exception):
    pass


def document_paths(root: Path = DOC_ROOT) -> list[Path]:
    """The corpus documents, sorted by their path relative to root."""
    if not root.is_dir():
        raise CorpusError(f"{root} does not exist: install the Debian package "
                          f"{DEBIAN_PACKAGE} (apt-get install -y {DEBIAN_PACKAGE})")
    paths = [root / f for f in TOP_FILES]
    for sub in SUBDIRS:
        paths += (root / sub).rglob("*.txt")
    rel = sorted(str(p.relative_to(root)) for p in paths)
    return [root / r for r in rel if r not in SKIP]


def split(root: Path = DOC_ROOT) -> tuple[list[Path], list[Path]]:
    """(train documents, held-out documents): every HELDOUT_EVERY-th document
    of the sorted list, starting with the first, is held out."""
    docs = document_paths(root)
    held = [p for i, p in enumerate(docs) if i % HELDOUT_EVERY == 0]
    train = [p for i, p in enumerate(docs) if i % HELDOUT_EVERY != 0]
    return train, held


def join(paths: list[Path]) -> bytes:
    """The documents' bytes, in order, separated by DOC_SEPARATOR."""
    return DOC_SEPARATOR.join(p.read_bytes().strip() for p in paths) + DOC_SEPARATOR


def as_tokens(data: bytes) -> np.ndarray:
    """bytes -> token ids [n] int64 (id = byte value)."""
    return np.frombuffer(data, dtype=np.uint8).astype(np.int64)


def eval_windows(heldout: bytes, n: int = EVAL_WINDOWS, width: int = EVAL_WINDOW) -> np.ndarray:
    """n windows of width bytes, evenly spaced over heldout -> [n, width] int64."""
    if len(heldout) < width or n < 2:
        raise CorpusError(f"held-out text of {len(heldout)} bytes is too short "
                          f"for {n} windows of {width}")
    starts = [i * (len(heldout) - width) // (n - 1) for i in range(n)]
    tokens = as_tokens(heldout)
    return np.stack([tokens[s:s + width] for s in starts])


def load_eval_windows(path: Path, width: int = EVAL_WINDOW) -> np.ndarray:
    """The committed evaluation windows file (raw bytes) -> [n, width] int64."""
    data = Path(path).read_bytes()
    if len(data) % width:
        raise CorpusError(f"{path}: {len(data)} bytes is not a multiple of the "
                          f"window width {width}")
    return as_tokens(data).reshape(-1, width)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=DOC_ROOT)
    ap.add_argument("--write-eval", type=Path, metavar="FILE",
                    help="write the evaluation windows (raw bytes) to FILE")
    args = ap.parse_args(argv)
    try:
        train, held = split(args.root)
    except CorpusError as exc:
        print(f"prepare_corpus: {exc}", file=sys.stderr)
        return 1
    train_bytes, held_bytes = join(train), join(held)
    print(f"{len(train)} training documents, {len(train_bytes)} bytes")
    print(f"{len(held)} held-out documents, {len(held_bytes)} bytes:")
    for p in held:
        print(f"  {p.relative_to(args.root)}")
    if args.write_eval:
        w = eval_windows(held_bytes)
        args.write_eval.write_bytes(w.astype(np.uint8).tobytes())
        print(f"wrote {args.write_eval}: {w.shape[0]} windows of {w.shape[1]} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
