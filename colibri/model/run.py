"""`colibri run`: a forward pass on a .colibri file, from the command line,
through the C runtime or the numpy reference.

    colibri run model.colibri --tokens 1,2,3 [--tokens 4,5 ...] [--generate N]
                [--logits-out logits.f32] [--engine c|reference]

--engine c runs libcolibri.so through colibri.runtime (found as that module
says: COLIBRI_LIBRARY, else the package's build/<host>/libcolibri.so);
--engine reference the numpy reference (colibri.model.reference), the golden truth
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

An encoder-decoder file (Switch Transformers) takes the encoder input with
--encoder-tokens (one per sequence; several make a right-padded batch) and
the decoder tokens with --tokens (as many; equal lengths, usually starting
with the decoder start token the first line prints):

    colibri run switch.colibri --encoder-tokens 1,2,3 --tokens 0 [--generate N]

The encoder runs once; --tokens is the decoder prefill, --generate N then
decodes N tokens greedily from the KV cache; --logits-out writes the decoder
logits, one vocab row per decoder position fed (prefill, then N - 1 rows).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ..errors import ColibriError


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
                   help="comma-separated token ids; repeat for a batch (an encoder-decoder: "
                        "the decoder's tokens)")
    p.add_argument("--encoder-tokens", action="append", metavar="IDS",
                   help="an encoder-decoder's encoder input, comma-separated; repeat for a "
                        "batch (as many as --tokens)")
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
                        "built (python -m colibri.buildsteps.cbuild), else reference")
    p.set_defaults(func=run_command)


def choose_engine(requested: str | None) -> tuple[str, str]:
    """(engine, what to print about it). An explicit "c" whose library is
    missing is an error (LibraryNotFoundError, with how to build it)."""
    from .. import runtime
    if requested == "reference":
        return "reference", "reference (numpy, colibri.model.reference)"
    try:
        lib = runtime.load_library()
    except ColibriError as exc:
        if requested == "c":
            raise
        return "reference", (f"reference (numpy, colibri.model.reference; C runtime not "
                             f"used: {exc})")
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


def is_encoder_decoder(path: Path) -> bool:
    """Whether a .colibri file's header has the ENC_DEC flag (only the first
    64 bytes are read; a broken file is left to the full reader)."""
    import struct

    from ..file import format as cformat
    try:
        with open(path, "rb") as f:
            head = f.read(cformat.HEADER_SIZE)
    except OSError:
        return False
    if len(head) < cformat.HEADER_SIZE or head[:4] != cformat.MAGIC:
        return False
    bc = "<" if struct.unpack("<H", head[6:8])[0] == cformat.BOM else ">"
    flags = struct.unpack(bc + "I", head[56:60])[0]
    return bool(flags & cformat.Feat.ENC_DEC)


def run_encdec(args, engine: str, about: str) -> int:
    """--encoder-tokens and --tokens on an encoder-decoder file."""
    enc = [parse_tokens(t) for t in args.encoder_tokens]
    dec = [parse_tokens(t) for t in args.tokens]
    if len(enc) != len(dec):
        raise ColibriError(f"{len(enc)} --encoder-tokens but {len(dec)} --tokens: give one "
                           "decoder prompt per encoder input")
    if len({len(d) for d in dec}) != 1:
        raise ColibriError(f"--tokens of an encoder-decoder must have equal lengths, got "
                           f"{[len(d) for d in dec]}")
    b, n = len(enc), max(len(e) for e in enc)
    ids = np.zeros((b, n), dtype=np.int64)
    mask = np.zeros((b, n), dtype=np.int64)
    for i, e in enumerate(enc):
        ids[i, :len(e)] = e
        mask[i, :len(e)] = 1
    tokens = np.array(dec, dtype=np.int64)
    if engine == "c":
        from ..runtime import Model
        model = Model(args.file)
        print(f"engine: {about}, kernels {model.info.kernels}")
        start = model.decoder_start
        model.encode(ids, mask)

        def step(t, past):
            return model.infer(t, n_past=past)
    else:
        from .reference_encdec import from_file
        model = from_file(args.file)
        print(f"engine: {about}")
        start = model.shape.decoder_start
        model.encode(ids, mask)

        def step(t, past):
            return model.decode(t)
    try:
        print(f"encoder-decoder: decoder start token {start}")
        rows = [step(tokens, 0)]                                   # [b, s, V]
        generated = np.empty((b, args.generate), dtype=np.int64)
        for i in range(args.generate):
            nxt = np.argmax(rows[-1][:, -1, :], axis=-1)
            generated[:, i] = nxt
            if i + 1 < args.generate:
                rows.append(step(nxt[:, None], tokens.shape[1] + i))
    finally:
        if engine == "c":
            model.close()
    logits = np.concatenate(rows, axis=1)
    for i in range(b):
        print(f"sequence {i}: {len(enc[i])} encoder tokens, {len(dec[i])} decoder tokens")
        if args.generate:
            print("  generated: " + ",".join(str(int(t)) for t in generated[i]))
        else:
            print("  greedy next token per position: "
                  + ",".join(str(int(t)) for t in np.argmax(logits[i], axis=-1)))
        last = logits[i, -1]
        top = np.argsort(-last, kind="stable")[:max(args.top, 0)]
        print("  last row top logits: " + ", ".join(f"{int(t)}:{last[t]:.4f}" for t in top))
    _write_logits(args, [logits[i] for i in range(b)])
    return 0


def _write_logits(args, rows) -> None:
    if not args.logits_out:
        return
    data = np.concatenate(rows, axis=0).astype("<f4")
    try:
        args.logits_out.write_bytes(data.tobytes())
    except OSError as exc:
        raise ColibriError(f"--logits-out {args.logits_out}: {exc.strerror}") from None
    print(f"wrote {data.shape[0]} rows x {data.shape[1]} float32 logits to "
          f"{args.logits_out}")


def run_command(args) -> int:
    seqs = [parse_tokens(t) for t in args.tokens]
    if args.generate < 0:
        raise ColibriError(f"--generate must be >= 0, got {args.generate}")
    encdec = is_encoder_decoder(args.file)
    if encdec and not args.encoder_tokens:
        raise ColibriError(f"{args.file} is an encoder-decoder: give its input with "
                           "--encoder-tokens IDS (and the decoder's with --tokens)")
    if args.encoder_tokens and not encdec:
        raise ColibriError(f"--encoder-tokens: {args.file} is a decoder-only model; "
                           "give only --tokens")
    engine, about = choose_engine(args.engine)
    if encdec:
        return run_encdec(args, engine, about)
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
        from ..runtime import Model
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
        try:
            if args.generate:
                generated, logits = ref.generate(tokens, args.generate)  # [b, N], [b, rows, V]
            else:
                logits = ref.forward(tokens, mask)                          # [b, s, V]
        except ColibriError as exc:
            # the input's fault (ids, lengths): named with the file, as the
            # C engine's errors are
            raise ColibriError(f"{args.file}: {exc}") from None
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

    _write_logits(args, rows)
    return 0
