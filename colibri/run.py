"""`colibri run`: a forward pass on a .colibri file, from the command line,
through the C runtime or the numpy reference.

    colibri run model.colibri --tokens 1,2,3 [--tokens 4,5 ...] [--generate N]
                [--logits-out logits.f32] [--engine c|reference]

--engine c runs libcolibri.so through colibri.runtime (found as that module
says: COLIBRI_LIBRARY, else the package's build/<host>/libcolibri.so);
--engine reference the numpy reference (colibri.reference), the golden truth
the C runtime is tested against. Without --engine: c when the library is
built, else reference. The first line printed names the engine that ran.
The C engine runs the sequences one at a time (batch 1, unpadded: each
one's rows are what `colibri-cli --tokens` gives for it, bit for bit), so
the file's max_batch does not limit the number of --tokens; the reference
runs them as one padded batch, within the file's max_batch.

Each --tokens is one sequence; several make a batch, right-padded with mask 0.
Prints, per sequence, the greedy next token at every position (or the
generated tokens) and the top logits of the last row. --logits-out writes
little-endian float32 rows of `vocab` logits: per sequence in order, one row
per input position (valid positions only), then with --generate one row per
generated token that was fed back (N - 1 rows: row i is the distribution that
chose token i + 1 of prompt + generated).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from .errors import ColibriError


def parse_tokens(text: str) -> list[int]:
    """'1,2, 3' -> [1, 2, 3]; errors name the bad item."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            out.append(int(item))
        except ValueError:
            raise ColibriError(f"--tokens: {item!r} is not an integer token id") from None
    if not out:
        raise ColibriError(f"--tokens {text!r} holds no token id")
    return out


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "run", help="run a .colibri file: the C runtime (libcolibri.so) or the numpy reference",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", type=Path, help=".colibri model file")
    p.add_argument("--tokens", action="append", required=True, metavar="IDS",
                   help="comma-separated token ids; repeat for a batch")
    p.add_argument("--generate", type=int, default=0, metavar="N",
                   help="greedily generate N tokens after the prompt(s) "
                        "(a batch must have prompts of equal length)")
    p.add_argument("--logits-out", type=Path, metavar="F",
                   help="write the logits rows as little-endian float32")
    p.add_argument("--top", type=int, default=5, metavar="K",
                   help="how many of the last row's top logits to print (default 5)")
    p.add_argument("--engine", choices=("c", "reference"), default=None,
                   help="c: the C runtime through colibri.runtime; reference: the numpy "
                        "reference (the golden truth). Default: c when libcolibri.so is "
                        "built (python -m colibri.cbuild), else reference")
    p.set_defaults(func=run_command)


def choose_engine(requested: str | None) -> tuple[str, str]:
    """(engine, what to print about it). An explicit "c" whose library is
    missing is an error (LibraryNotFoundError, with how to build it)."""
    from . import runtime
    if requested == "reference":
        return "reference", "reference (numpy, colibri.reference)"
    try:
        lib = runtime.load_library()
    except ColibriError as exc:
        if requested == "c":
            raise
        return "reference", f"reference (numpy, colibri.reference; C runtime not used: {exc})"
    return "c", f"c (libcolibri through colibri.runtime: {lib.path})"


def _c_generate(m, tokens: np.ndarray, n_new: int) -> tuple[np.ndarray, np.ndarray]:
    """Reference.generate's contract through the C runtime: tokens [b, N],
    logits [b, s + N - 1, V]; argmax takes the lowest id among equals."""
    b, s = tokens.shape
    rows = [m.infer(tokens)]
    out = np.empty((b, n_new), dtype=np.int64)
    for i in range(n_new):
        nxt = np.argmax(rows[-1][:, -1, :], axis=-1)
        out[:, i] = nxt
        if i + 1 < n_new:
            rows.append(m.infer(nxt[:, None], n_past=s + i))
    return out, np.concatenate(rows, axis=1)


def run_command(args) -> int:
    seqs = [parse_tokens(t) for t in args.tokens]
    if args.generate < 0:
        raise ColibriError(f"--generate must be >= 0, got {args.generate}")
    engine, about = choose_engine(args.engine)
    lengths = [len(s) for s in seqs]
    b, s = len(seqs), max(lengths)
    tokens = np.zeros((b, s), dtype=np.int64)   # padding slots hold token 0
    mask = np.zeros((b, s), dtype=np.int64)
    for i, seq in enumerate(seqs):
        tokens[i, :len(seq)] = seq
        mask[i, :len(seq)] = 1
    if args.generate and len(set(lengths)) != 1:
        raise ColibriError(f"--generate needs prompts of equal length, got lengths "
                           f"{lengths}")

    if engine == "c":
        # One sequence at a time (batch 1, no padding), so any number of
        # --tokens fits a file's max_batch, and each sequence's rows are
        # colibri-cli's for that prompt, bit for bit.
        from .runtime import Model
        with Model(args.file) as m:
            print(f"engine: {about}, kernels {m.info.kernels}")
            if args.generate:
                per = [_c_generate(m, np.array([seq]), args.generate) for seq in seqs]
                generated = np.concatenate([g for g, _ in per])
                logits = np.concatenate([lg for _, lg in per])
            else:
                logits = np.zeros((b, s, m.vocab), np.float32)
                for i, seq in enumerate(seqs):
                    logits[i, :len(seq)] = m.infer(np.array([seq]))[0]
    else:
        from .reference import Reference
        ref = Reference(args.file)
        print(f"engine: {about}")
        if args.generate:
            generated, logits = ref.generate(tokens, args.generate)  # [b, N], [b, rows, V]
        else:
            logits = ref.forward(tokens, mask)                          # [b, s, V]
    if args.generate:
        rows = [logits[i] for i in range(b)]
    else:
        rows = [logits[i, :n] for i, n in enumerate(lengths)]
        generated = None

    for i, seq in enumerate(seqs):
        print(f"sequence {i}: {len(seq)} prompt tokens")
        if generated is not None:
            print("  generated: " + ",".join(str(int(t)) for t in generated[i]))
        else:
            print("  greedy next token per position: "
                  + ",".join(str(int(t)) for t in np.argmax(rows[i], axis=-1)))
        last = rows[i][-1]
        top = np.argsort(-last, kind="stable")[:max(args.top, 0)]
        print("  last row top logits: "
              + ", ".join(f"{int(t)}:{last[t]:.4f}" for t in top))
        print(f"  logits rows {rows[i].shape[0]}, mean {rows[i].mean():.4f}, "
              f"std {rows[i].std():.4f}")

    if args.logits_out:
        data = np.concatenate(rows, axis=0).astype("<f4")
        try:
            args.logits_out.write_bytes(data.tobytes())
        except OSError as exc:
            raise ColibriError(f"--logits-out {args.logits_out}: {exc.strerror}") from None
        print(f"wrote {data.shape[0]} rows x {data.shape[1]} float32 logits to "
              f"{args.logits_out}")
    return 0
