"""`colibri tokenize FILE "text"` (prints the ids) and `colibri generate FILE
"prompt"` (prints text as it is generated). Greedy unless --temperature > 0.

`generate --engine c` runs the C runtime through colibri.runtime
(Model.generate: the C tokenizer, colibri_sample and the streaming
detokenizer, as colibri-cli --prompt); `--engine reference` the numpy
reference with the Python tokenizer and colibri.text.sampling. Without --engine:
c when libcolibri.so is built, else reference (colibri.model.run.choose_engine).
The first line printed names the engine.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from ..errors import ColibriError
from ..text.sampling import SampleParams, sample
from ..text.tokenizer import StreamDecoder, Tokenizer, TokenizerError


def _tokenizer(path) -> Tokenizer:
    try:
        return Tokenizer.from_file(path)
    except TokenizerError as exc:
        raise ColibriError(str(exc)) from None


def generate(path, prompt: str, max_tokens: int, params: SampleParams,
             add_bos: bool | None = None, out=None, ref=None, tok=None) -> list[int]:
    """Prompt -> generated ids (the prompt's excluded), writing the text to
    `out` as it becomes final. Stops at eos, max_tokens or the KV cache's end.
    add_bos None: as the tokenizer's template does (Mixtral's <s>; byte-level
    tokenizers usually add none)."""
    from .reference import Reference
    from ..text.tokenizer import F_TEMPLATE_BOS
    tok = tok or _tokenizer(path)
    ref = ref or Reference(path)
    if add_bos is None:
        add_bos = bool(tok.spec.flags & F_TEMPLATE_BOS)
    bos = add_bos and tok.spec.bos_id >= 0
    ids = tok.encode(prompt, add_bos=bos)
    if not ids:
        raise ColibriError("the prompt is empty: give some text")
    limit = ref.shape.max_seq_len
    if len(ids) >= limit:
        raise ColibriError(f"the prompt is {len(ids)} tokens, the model's KV cache holds "
                           f"{limit}: shorten it")
    try:
        params.check()
    except ValueError as exc:
        raise ColibriError(str(exc)) from None
    dec = StreamDecoder(tok, skip_special=True)
    history = list(ids)
    # A model's vocabulary may be padded past the tokenizer's ids: those rows
    # have no text, so they are never chosen.
    n_text = tok.n_vocab

    def last_row(x):
        row = x[0, -1].copy()
        row[n_text:] = -np.inf
        return row

    logits = last_row(ref.forward(np.array([ids])))
    made: list[int] = []
    for step in range(max_tokens):
        nxt = sample(logits, params, history, step)
        made.append(nxt)
        history.append(nxt)
        if out is not None:
            out.write(dec.push(nxt))
            out.flush()
        if nxt == tok.spec.eos_id or len(history) >= limit:
            break
        logits = last_row(ref.forward(np.array([[nxt]]), n_past=len(history) - 1))
    if out is not None:
        out.write(dec.finish() + "\n")
    return made


def add_sampling_args(p) -> None:
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most probable (0: off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (1: off)")
    p.add_argument("--min-p", type=float, default=0.0, help="keep p >= min_p * p_max (0: off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="1: off")
    p.add_argument("--seed", type=int, default=0, help="the counter-based generator's seed")


def add_parser(subparsers) -> None:
    t = subparsers.add_parser("tokenize", help="print the token ids of a text (the file's "
                              "tokenizer)")
    t.add_argument("file", metavar="FILE")
    t.add_argument("text")
    t.add_argument("--add-bos", action="store_true", help="put the bos id first")
    t.add_argument("--no-special", action="store_true",
                   help="special tokens in the text are plain text")
    t.set_defaults(func=_tokenize)
    g = subparsers.add_parser("generate", help="generate text: the C runtime "
                              "(libcolibri.so) or the numpy reference")
    g.add_argument("file", metavar="FILE")
    g.add_argument("prompt")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--no-bos", action="store_true",
                   help="do not put the bos id first (default: as the tokenizer's template)")
    add_sampling_args(g)
    g.add_argument("--engine", choices=("c", "reference"), default=None,
                   help="c: the C runtime through colibri.runtime; reference: the numpy "
                        "reference. Default: c when libcolibri.so is built, else reference")
    g.set_defaults(func=_generate)


def _tokenize(args: argparse.Namespace) -> int:
    tok = _tokenizer(args.file)
    print(",".join(map(str, tok.encode(args.text, add_bos=args.add_bos,
                                       parse_special=not args.no_special))))
    return 0


def _generate(args: argparse.Namespace) -> int:
    if args.max_tokens < 1:
        raise ColibriError(f"--max-tokens {args.max_tokens}: give at least 1")
    p = SampleParams(args.temperature, args.top_k, args.top_p, args.min_p,
                     args.repetition_penalty, args.seed)
    from .run import choose_engine, is_encoder_decoder
    encdec = is_encoder_decoder(args.file)
    engine, about = choose_engine(args.engine)
    if encdec and engine != "c":
        raise ColibriError(f"{args.file} is an encoder-decoder: `colibri generate` runs it "
                           "with the C engine (build it: python -m colibri.buildsteps.cbuild); "
                           "the reference runs it on token ids with `colibri run FILE "
                           "--encoder-tokens IDS --tokens START --generate N`")
    add_bos = False if args.no_bos else None
    if engine == "c":
        from ..runtime import Model
        with Model(args.file) as m:
            print(f"engine: {about}, kernels {m.info.kernels}")
            # Everything is checked before the prompt is echoed. An
            # encoder-decoder's text is the decoder's own, not a continuation.
            stream = m.generate(args.prompt, args.max_tokens, p.temperature, p.top_k,
                                p.top_p, p.min_p, p.repetition_penalty, p.seed,
                                add_bos=add_bos)
            if not encdec:
                sys.stdout.write(args.prompt)
            for piece in stream:
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
        return 0
    print(f"engine: {about}")
    sys.stdout.write(args.prompt)
    generate(args.file, args.prompt, args.max_tokens, p, add_bos=add_bos, out=sys.stdout)
    return 0
