"""`colibri info FILE` (metadata, storage type and size per kind and per
section) and `colibri verify FILE` (every CRC; names the sections that fail).

Both open the file with format.read_file(check_crc=False): the structure
(header CRC, table CRC, offsets, sizes) is always validated, but section CRCs
(and, behind them, the finiteness of every stored float) are left to
`verify`, so `info` on a file with a damaged section still shows what is in it.
"""
from __future__ import annotations

import argparse
import sys
from collections import OrderedDict
from pathlib import Path

from . import memory
from ..errors import ColibriError, FileReadError, FormatError, VersionError
from ..file import format as fmt
from ..file.format import DType, Kind
from ..text import tokenizer
from ..text.tokenizer import KIND_TOKENIZER

# `colibri verify` exit statuses: a script can tell a file to fetch again
# (DAMAGED) from a path or tool to fix (CANNOT_CHECK).
INTACT, DAMAGED, CANNOT_CHECK = 0, 1, 2


class Damaged(ColibriError):
    """`colibri verify`: the file was read and is not an intact .colibri file."""
    exit_status = DAMAGED


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def describe(cf: fmt.ColibriFile, sections: bool = True) -> str:
    """The text `colibri info` prints."""
    s = cf.shape
    size = cf.path.stat().st_size if cf.path else None
    lines = []
    if cf.path:
        lines.append(f"file          {cf.path}")
    lines += [
        f"format        version {cf.version}, {cf.byte_order}-endian, {len(cf.entries)} tensors",
        f"model         {s.n_layers} layers, hidden {s.hidden}, vocab {s.vocab}",
        f"attention     {s.n_heads} heads, {s.n_kv_heads} kv heads, head_dim {s.head_dim}, "
        f"rope_theta {s.rope_theta:g}, rms_eps {s.rms_eps:g}",
        f"experts       {s.n_experts} experts, top_k {s.top_k}, intermediate {s.intermediate}",
        f"runtime       max_seq_len {s.max_seq_len}, max_batch {s.max_batch}, "
        f"group_size {s.group_size}",
    ]
    d = cf.desc
    if cf.version >= 2:  # what the description adds to Mixtral's computation
        feats = "+".join(f.name.lower() for f in fmt.Feat if d.features & f) or "none"
        extra = [f"shared_intermediate {d.shared_intermediate}" if d.shared_intermediate else "",
                 f"dense layers {list(d.dense_layers)} of {d.dense_intermediate}"
                 if d.dense_layers else "",
                 f"clip_qkv {d.clip_qkv:g}" if d.clip_qkv else ""]
        lines.append(f"computes      {feats}")
        lines.append(f"scales        embed {d.embed_scale:g}, attention {d.attn_scale:g}, "
                     f"residual {d.residual_scale:g}, logits / {d.logits_divisor:g}"
                     + "".join(f", {x}" for x in extra if x))
        if d.has(fmt.Feat.ENC_DEC):
            lines.append(f"enc-dec       layers 0-{d.encoder_layers - 1} encoder, "
                         f"{d.encoder_layers}-{cf.shape.n_layers - 1} decoder; expert capacity "
                         f"{d.expert_capacity}; decoder start token {d.decoder_start}; "
                         f"lm_scale {d.lm_scale:g}")
    lines.append(f"tokenizer     {_tokenizer_line(cf)}")
    # Weights only: the description and optional sections (the tokenizer)
    # are bytes, not parameters.
    params = sum(e.rows * e.cols for e in cf.entries
                 if e.kind in Kind._value2member_map_ and e.kind != Kind.DESC)
    lines.append(f"parameters    {params}")

    # Per kind: storage type, count, bytes (section sizes, excluding padding).
    per_kind: OrderedDict[str, list] = OrderedDict()
    for e in cf.entries:
        name = Kind(e.kind).name if e.kind in Kind._value2member_map_ else (
            fmt.OPTIONAL_SECTIONS.get(e.kind, f"kind {e.kind}"))
        dt = DType(e.dtype).name if e.dtype in DType._value2member_map_ else str(e.dtype)
        row = per_kind.setdefault(name, [set(), 0, 0])
        row[0].add(dt)
        row[1] += 1
        row[2] += e.size
    lines.append("")
    lines.append(f"{'kind':<12} {'dtype':<9} {'count':>6} {'bytes':>14} {'size':>12}")
    for name, (dts, count, nbytes) in per_kind.items():
        lines.append(f"{name:<12} {'/'.join(sorted(dts)):<9} {count:>6} {nbytes:>14} "
                     f"{_mib(nbytes):>12}")
    data = sum(e.size for e in cf.entries)
    lines.append(f"{'sections':<12} {'':<9} {len(cf.entries):>6} {data:>14} {_mib(data):>12}")
    if size is not None:
        lines.append(f"{'total file':<12} {'':<9} {'':>6} {size:>14} {_mib(size):>12}"
                     f"  (header, table and 64-byte alignment: {size - data} bytes)")
    if size is not None:
        lines += memory_lines(cf, size)
    if sections:
        lines.append("")
        lines.append(f"{'section':<32} {'dtype':<9} {'shape':<14} {'offset':>12} "
                     f"{'bytes':>12} {'crc':>10}")
        for e in cf.entries:
            dt = DType(e.dtype).name if e.dtype in DType._value2member_map_ else str(e.dtype)
            lines.append(f"{e.label():<32} {dt:<9} {f'[{e.rows}, {e.cols}]':<14} "
                         f"{e.offset:>12} {e.size:>12}   0x{e.crc:08x}")
    return "\n".join(lines)


def _tokenizer_line(cf: fmt.ColibriFile) -> str:
    """What the file's tokenizer section holds, or why it cannot be read
    (info describes a damaged file as far as it can)."""
    from ..text import tokenizer as tk
    entries = [e for e in cf.entries if e.kind == KIND_TOKENIZER]
    if not entries:
        return "none (the runtime takes token ids)"
    try:
        return tk.describe(tk.parse_section(bytes(cf.section(entries[0]))))
    except ColibriError as exc:
        return f"unreadable section: {exc}"


def _c_arena(cf: fmt.ColibriFile):
    """kv -> the arena colibri_init would allocate, from libcolibri.so when
    it is built and loads this file; None otherwise (the formula serves)."""
    if cf.path is None:
        return None
    try:
        from .. import runtime
        lib = runtime.load_library()
    except Exception:      # no library built: colibri.model.memory's formula
        return None
    arenas = {}
    for kv in memory.KV_TYPES:
        try:
            with runtime.Model(cf.path, library=lib.path, kv=kv) as m:
                arenas[kv] = m.info.arena_bytes
        except Exception:  # e.g. a file in the other byte order
            arenas[kv] = memory.arena_bytes(cf.shape, cf.desc, kv, memory.CHUNK_TOKENS_OWNED)
    return arenas.__getitem__


def memory_lines(cf: fmt.ColibriFile, size: int) -> list[str]:
    """colibri.model.memory's report of an open file (arena: the C library's own
    figure when libcolibri.so is built, else the same formula)."""
    return memory.report_lines(cf.shape, cf.desc, cf.entries, size, arena_of=_c_arena(cf))


def describe_config(path: str, quants=memory.QUANTS, max_seq_len: int | None = None,
                    max_batch: int = 1) -> str:
    """`colibri info --config`: the file and resident sizes a conversion
    of this config.json would give, per --quant, without weights; the
    tokenizer section counted when a tokenizer.json the converter takes is
    next to the config."""
    lines = [f"config        {path}"]
    tok_bytes, tok_line = _config_tokenizer(path)
    for q in quants:
        pl = memory.plan_from_config(path, q, max_seq_len, max_batch)
        s = pl.shape
        if q == quants[0]:
            lines += [f"family        {pl.family}",
                      f"model         {s.n_layers} layers, hidden {s.hidden}, vocab {s.vocab}, "
                      f"{s.n_experts} experts top_k {s.top_k}, intermediate {s.intermediate}",
                      f"attention     {s.n_heads} heads, {s.n_kv_heads} kv heads, head_dim "
                      f"{s.head_dim}; max_seq_len {s.max_seq_len}, max_batch {s.max_batch}",
                      tok_line]
        entries = pl.entries + ([memory.tokenizer_entry(tok_bytes)] if tok_bytes else [])
        lines += ["", f"--quant {q}"]
        lines += memory.report_lines(s, pl.desc, entries, pl.file_size(tok_bytes))[1:]
    return "\n".join(lines)


def _config_tokenizer(path: str) -> tuple[int, str]:
    """(bytes of the tokenizer section a conversion would write, the
    `tokenizer` line) for `colibri info --config PATH`: from the
    tokenizer.json next to the config, as the converter packs it."""
    d = Path(path) if Path(path).is_dir() else Path(path).parent
    try:
        spec = tokenizer.spec_from_dir(d)
    except tokenizer.TokenizerError as exc:  # UnsupportedTokenizer included
        return 0, f"tokenizer     not counted: {exc}"
    if spec is None:
        return 0, f"tokenizer     not counted: no tokenizer.json in {d}"
    n = len(tokenizer.pack_section(spec, "little"))
    return n, f"tokenizer     {d / 'tokenizer.json'}: a {n}-byte section"


HOW = {"copy": "kept exactly", "quantise": "quantised from float",
       "requantise": "requantised (second rounding)", "narrow": "narrowed to float32 (rounded)"}


def _info_warning(line: str) -> None:
    """A conversion's warning (e.g. a tokenizer left out) as `colibri info` says it."""
    print(f"colibri info: {line}", file=sys.stderr, flush=True)


def describe_gguf(path: str, quant: str | None = None, sections: bool = True) -> str:
    """`colibri info FILE.gguf`: what `colibri convert FILE.gguf [--quant Q]`
    would write (family, shapes, per GGUF tensor its type, the storage type
    and whether the values are kept), from the metadata alone."""
    from .convert_gguf import GGUFExporter
    ex = GGUFExporter(path, quant=quant, warn=_info_warning)
    s, d = ex.shape, ex.desc
    feats = "+".join(f.name.lower() for f in fmt.Feat if d.features & f) or "none"
    from ..text import tokenizer as tk
    tok = "none" if ex.tokenizer is None else tk.describe(ex.tokenizer)
    lines = [f"file          {path} (GGUF, architecture {ex.gguf.arch})",
             f"family        {ex.family.title}",
             f"model         {s.n_layers} layers, hidden {s.hidden}, vocab {s.vocab}",
             f"attention     {s.n_heads} heads, {s.n_kv_heads} kv heads, head_dim {s.head_dim}, "
             f"rope_theta {s.rope_theta:g}, rms_eps {s.rms_eps:g}",
             f"experts       {s.n_experts} experts, top_k {s.top_k}, intermediate {s.intermediate}",
             f"computes      {feats}",
             f"scales        embed {d.embed_scale:g}, attention {d.attn_scale:g}, residual "
             f"{d.residual_scale:g}, logits / {d.logits_divisor:g}",
             f"tokenizer     {tok}",
             f"--quant       {quant or 'none: keep the GGUF types'}", ""]
    total = 0
    per_tensor: OrderedDict[str, list] = OrderedDict()
    for st, (dt, how) in zip(ex.steps, ex.choices):
        rows, cols = fmt.expected_shape(s, st.kind, d)
        total += fmt.align64(fmt.section_size(dt, rows, cols, s.group_size))
        t = st.source.tensor
        row = per_tensor.setdefault(t.name, [t, set()])
        row[1].add((dt.name, how))
    summary = ex.summary()
    for (src, dst, how), n in sorted(summary.items()):
        lines.append(f"{n:>6} tensors {src:<6} -> {dst:<9} {HOW[how]}")
    lines.append(f"about {_mib(total)} of .colibri sections")
    if sections:
        lines.append("")
        lines.append(f"{'GGUF tensor':<34} {'shape':<18} {'type':<7} stored as")
        for name, (t, outs) in per_tensor.items():
            stored = ", ".join(f"{dt} ({HOW[how]})" for dt, how in sorted(outs))
            lines.append(f"{name:<34} {str(list(t.shape)):<18} {t.type_name:<7} {stored}")
    return "\n".join(lines)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("info", help="print a .colibri file's metadata and sizes "
                              "(or what converting a GGUF file would do)",
                              description="Print the model shape, the storage type and "
                              "size per kind, the total, and (unless --brief) one line "
                              "per section. Section CRCs are not checked: use verify.")
    p.add_argument("file", metavar="FILE", nargs="?")
    p.add_argument("--brief", action="store_true", help="omit the per-section lines")
    p.add_argument("--config", metavar="CONFIG",
                   help="instead of FILE: a checkpoint's config.json (or its directory); "
                   "print the file size and resident memory a conversion would have, for "
                   "each --quant, without the weights")
    p.add_argument("--quant", choices=memory.QUANTS, action="append",
                   help="with --config: only this preset (repeatable; default all); with "
                   "FILE.gguf: what convert --quant Q would store (default: keep)")
    p.add_argument("--max-seq-len", type=int, help="with --config: as colibri convert's")
    p.add_argument("--max-batch", type=int, default=1, help="with --config: as colibri "
                   "convert's")
    p.set_defaults(func=_info)

    p = subparsers.add_parser("verify", help="check every CRC of a .colibri file",
                              description="Validate the header, the table and every "
                              "section's CRC32; list each damaged section on stdout, "
                              "then one error line. Exit status 0: intact; 1: damaged "
                              "(a CRC mismatch anywhere, truncated, or not a valid "
                              ".colibri file); 2: cannot check (the file cannot be "
                              "read, its format version is newer than this colibri, "
                              "or a usage error).")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(func=_verify)


def _info(args: argparse.Namespace) -> int:
    if (args.file is None) == (args.config is None):
        raise ColibriError("colibri info: give a FILE or --config CONFIG")
    if args.config is not None:
        print(describe_config(args.config, tuple(args.quant or memory.QUANTS),
                              args.max_seq_len, args.max_batch), flush=True)
        return 0
    # what a conversion would choose does not apply to a file already made
    if args.max_seq_len is not None or args.max_batch != 1:
        raise ColibriError("colibri info FILE: --max-seq-len and --max-batch are for --config "
                           "(a file has its own: see its `runtime` line)")
    from . import gguf_in
    if gguf_in.is_gguf(args.file) or gguf_in.named_gguf(args.file):
        if args.quant and len(args.quant) > 1:
            raise ColibriError("colibri info FILE.gguf: give at most one --quant (what "
                               "colibri convert --quant Q would do)")
        print(describe_gguf(args.file, args.quant[0] if args.quant else None,
                            sections=not args.brief), flush=True)
        return 0
    if args.quant:
        raise ColibriError(f"colibri info {args.file}: --quant is for --config or a GGUF file "
                           "(a .colibri file's types are its own)")
    # `colibri info big.colibri | head`: a reader that leaves is handled in cli.main
    cf = fmt.read_file(args.file, check_crc=False)
    try:
        print(describe(cf, sections=not args.brief), flush=True)
    finally:
        cf.close()
    return 0


def _verify(args: argparse.Namespace) -> int:
    # One status for "damaged" whatever part is (header, table, a section,
    # the length), another for "cannot check": the CLI prints either as one
    # `colibri: error:` line with the error's exit_status.
    try:
        cf = fmt.read_file(args.file, check_crc=False)
    except (FileReadError, VersionError):
        raise                                           # CANNOT_CHECK
    except FormatError as exc:                          # incl. header/table CRC
        raise Damaged(str(exc)) from None
    try:
        problems = cf.verify()
        n = len(cf.entries)
        if not problems:
            # CRC-valid but NaN or infinite weights (a float32 value, an int8
            # scale, a block's d or dmin): colibri_init and colibri-cli
            # --verify refuse such a file, so verify does too.
            try:
                fmt._check_finite(cf)
            except FormatError as exc:
                problems = [str(exc)]
    finally:
        cf.close()
    if problems:
        # The list is the report (stdout); the verdict is the one error line.
        for p in problems:
            print(f"{args.file}: FAIL: {p}")
        raise Damaged(f"{args.file}: {len(problems)} of {n} sections damaged (listed "
                      "above): copy or convert the file again")
    print(f"{args.file}: OK: header, table and {n} section CRCs match")
    return INTACT
