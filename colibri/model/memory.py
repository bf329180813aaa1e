"""What a model holds resident when the C runtime runs it (all-resident mode:
the file mapped or read, plus one arena): the file's sections by part of the
network, the arena with its KV cache, and the total.

- `weight_parts(entries)`: section bytes, storage types and tensor counts
  per part, the grouping colibri_get_weight_bytes (src/info.c) uses.
- `kv_bytes(shape, kv)`: the KV cache per token and as the arena holds it,
  for kv "f32" or "i8" (colibri_kv_size).
- `arena_bytes(shape, desc, kv, chunk_tokens, tables)`: src/plan.c
  clb_layout (and src/encdec.c clb_encdec_layout) term by term, each buffer
  rounded up to 64 bytes: what colibri_arena_size_ex returns for the chunk
  (COLIBRI_CHUNK_TOKENS 16: a caller's arena; COLIBRI_CHUNK_TOKENS_OWNED
  128: the arena colibri_init allocates). `tables` are the sizes of the C
  structs of the arena's tables (TABLES_LP64 for 64-bit Linux hosts; the
  test holds both equal to libcolibri.so's colibri_abi_sizeof_table and
  colibri_arena_size_ex).
- `plan_from_config(dir)`: the shape, description and table entries a
  conversion would write, from config.json alone (no weights), for the
  documented sizes of real checkpoints (docs/QUANTISATION.md, "Memory");
  `report(...)` prints them.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..file import format as fmt
from ..file.format import DType, Feat, Kind

PARTS = ("embed", "attn", "router", "experts", "ffn", "norms", "lm_head", "other")
PART_TITLES = {"embed": "embedding", "attn": "attention", "router": "router",
               "experts": "routed experts", "ffn": "shared/dense FFN", "norms": "norms",
               "lm_head": "LM head", "other": "other sections"}
PART_OF_KIND = {
    Kind.EMBED: "embed",
    **{k: "attn" for k in (Kind.WQ, Kind.WK, Kind.WV, Kind.WO, Kind.BQ, Kind.BK, Kind.BV,
                           Kind.BO, Kind.XWQ, Kind.XWK, Kind.XWV, Kind.XWO,
                           Kind.ENC_POS_BIAS, Kind.DEC_POS_BIAS)},
    Kind.ROUTER: "router",
    **{k: "experts" for k in fmt.EXPERT_KINDS},
    **{k: "ffn" for k in (Kind.SHARED_GATE, *fmt.SHARED_KINDS, *fmt.DENSE_KINDS)},
    **{k: "norms" for k in (Kind.ATTN_NORM, Kind.FFN_NORM, Kind.FINAL_NORM, Kind.Q_NORM,
                            Kind.K_NORM, Kind.XATTN_NORM, Kind.ENC_FINAL_NORM)},
    Kind.LM_HEAD: "lm_head",
}
KV_TYPES = ("f32", "i8")
CHUNK_TOKENS = 16          # COLIBRI_CHUNK_TOKENS: a caller's arena (colibri_arena_size)
CHUNK_TOKENS_OWNED = 128   # COLIBRI_CHUNK_TOKENS_OWNED: the arena colibri_init allocates
QK_COLS, Q4_0_COLS = 256, 32   # CLB_QK_COLS, CLB_Q4_0_COLS (block activations)


def part_of(kind: int) -> str:
    return PART_OF_KIND.get(kind, "other")


@dataclass(frozen=True)
class Part:
    bytes: int
    dtypes: tuple       # DType values present, sorted
    tensors: int


def weight_parts(entries) -> dict[str, Part]:
    """Entries (format.Entry, or anything with kind, dtype, size) -> {part:
    Part}, every part of PARTS present. "other" holds DESC and sections of
    kinds the runtime skips (the tokenizer); their dtypes are not listed."""
    acc = {p: [0, set(), 0] for p in PARTS}
    for e in entries:
        p = part_of(e.kind)
        acc[p][0] += e.size
        acc[p][2] += 1
        if p != "other":
            acc[p][1].add(DType(e.dtype))
    return {p: Part(b, tuple(sorted(d)), n) for p, (b, d, n) in acc.items()}


def _up(n: int) -> int:
    return (n + 63) // 64 * 64


def kv_bytes(shape: fmt.ModelShape, kv: str = "f32") -> tuple[int, int]:
    """(bytes per token of one sequence over all layers, bytes of the whole
    cache in the arena) for the KV cache type kv ("f32" or "i8": int8 values
    and one float32 scale per head vector)."""
    s = shape
    slots = s.n_layers * s.max_batch * s.max_seq_len
    kvdim = s.n_kv_heads * s.head_dim
    if kv == "f32":
        return 2 * s.n_layers * kvdim * 4, 2 * _up(slots * kvdim * 4)
    if kv == "i8":
        return (2 * s.n_layers * s.n_kv_heads * (s.head_dim + 4),
                2 * (_up(slots * kvdim) + _up(slots * s.n_kv_heads * 4)))
    raise ValueError(f"kv = {kv!r}: f32 or i8")


@dataclass(frozen=True)
class Tables:
    """sizeof of the C structs the arena holds tables of (src/internal.h,
    src/encdec.h): clb_plan, clb_layer, clb_expert, clb_encdec, clb_xattn."""
    plan: int
    layer: int
    expert: int
    encdec: int
    xattn: int


TABLES_LP64 = Tables(plan=688, layer=464, expert=96, encdec=112, xattn=136)


def tables_bound(pointer_bytes: int) -> Tables:
    """Sizes no smaller than the structs' on a target with pointers of
    pointer_bytes, when its compiler's own sizes are not at hand (the
    firmware build measures them: buildsteps/blob.table_sizes_from_object).
    8 (LP64): TABLES_LP64, exact on 64-bit Linux targets. 4 (ILP32: ARMv7,
    PowerPC, Cortex-M): TABLES_LP64 too, an upper bound -- every member
    type of these structs is the same size or smaller under ILP32 (pointers,
    size_t) with the same or a smaller alignment (uint64_t: 8 on AAPCS and
    PowerPC, 4 on i386), so each member's offset, and the padded size, can
    only shrink (align_up(x', a') <= align_up(x, a) when x' <= x and a' | a);
    COLIBRI_THREADS=0 shrinks clb_team to one byte."""
    if pointer_bytes not in (4, 8):
        raise ValueError(f"pointer_bytes = {pointer_bytes}: 4 or 8")
    return TABLES_LP64


def _kv_bufs(rows: int, kvdim: int, heads: int, kv: str) -> list[int]:
    """src/plan.c clb_kv_carve: the buffers of `rows` rows of keys and values
    (f32: k, v; i8: int8 k, v, then their float32 scales per head vector)."""
    if kv == "i8":
        return [rows * kvdim] * 2 + [rows * heads * 4] * 2
    return [rows * kvdim * 4] * 2


def arena_bytes(shape: fmt.ModelShape, desc: fmt.Description | None = None,
                kv: str = "f32", chunk_tokens: int = CHUNK_TOKENS,
                tables: Tables = TABLES_LP64) -> int:
    """clb_layout's arena, buffer by buffer in its order (see the module
    docstring); desc None: Mixtral (a version 1 file)."""
    s, d = shape, desc or fmt.Description()
    L, E, K, h, S = s.n_layers, s.n_experts, s.top_k, s.hidden, s.max_seq_len
    qdim, kvdim = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
    inter = max(s.intermediate, d.shared_intermediate, d.dense_intermediate)
    max_cols = max(h, qdim, inter)
    max_groups = math.ceil(max_cols / s.group_size)
    tokens = s.max_batch * S
    C = min(tokens, chunk_tokens)
    padded = math.ceil(max_cols / QK_COLS) * QK_COLS
    max_blocks = padded // Q4_0_COLS
    bufs = [tables.plan, L * tables.layer, L * E * tables.expert,
            S * (s.head_dim // 2) * 4, S * (s.head_dim // 2) * 4]   # RoPE cos, sin
    bufs += _kv_bufs(L * tokens, kvdim, s.n_kv_heads, kv)
    bufs += [
        tokens,                                  # mask cache
        C * 4, C * 4,                            # chunk rows' sequence, position
        C * 4 * h, C * 4 * h, C * 4 * h,         # x, xn, tmp
        C * 4 * qdim, C * 4 * qdim,              # q, attention output
        C * 4 * kvdim, C * 4 * kvdim,            # new keys, values
        C * 4 * E, C * 4 * E,                    # router logits, probs
        C * 2 * K, C * 4 * K,                    # selections, their weights
        E, E * 4, (E + 1) * 4,                   # chosen, counts, offsets
        C * 4 * K,                               # token lists
        C * 4 * K * h,                           # per-selection outputs
        C * 4 * h, C * 4 * h,                    # one expert's in/out
        C * 4 * inter, C * 4 * inter,            # h1, h3
        C * padded,                              # int8 activations
        C * 4 * max(max_groups, max_blocks),     # their scales
        C * 2 * (padded // 16),                  # block sums of 16
    ]
    if d.features & Feat.ENC_DEC:                # clb_encdec_layout
        Ld = L - d.encoder_layers
        bufs += [tables.encdec, L * tables.xattn, tokens * h * 4, tokens]
        bufs += _kv_bufs(Ld * tokens, kvdim, s.n_kv_heads, kv)   # cross-attention K/V
        bufs += [L * s.max_batch * E * 4]
    return sum(_up(b) for b in bufs)


# ---- a conversion's tables from config.json alone ------------------------------

QUANTS = ("f32", "int8", "q4")


def _presets() -> dict:
    return {"f32": fmt.PRESET_F32, "int8": fmt.PRESET_INT8, "q4": fmt.PRESET_Q4}


@dataclass
class Planned:
    """What converting a checkpoint would write, without its weights."""
    shape: fmt.ModelShape
    desc: fmt.Description | None      # None: a version 1 (Mixtral) file
    entries: list                     # format.Entry-like: kind, layer, expert, dtype,
    #                                   rows, cols, size
    family: str

    def file_size(self, tokenizer_bytes: int = 0) -> int:
        """Header, table, every section 64-byte aligned (FORMAT.md 3), with a
        tokenizer section of tokenizer_bytes (0: none)."""
        n = len(self.entries) + (1 if tokenizer_bytes else 0)
        at = fmt.align64(fmt.HEADER_SIZE + n * fmt.ENTRY_SIZE)
        for e in self.entries:
            at = fmt.align64(at + e.size)
        return at + fmt.align64(tokenizer_bytes) if tokenizer_bytes else at


@dataclass(frozen=True)
class _Entry:
    kind: int
    layer: int          # NO_LAYER (0xFFFF) outside the layers, as in the table
    expert: int         # NO_EXPERT (0xFFFF) outside the experts
    dtype: int
    rows: int
    cols: int
    size: int


def planned_entries(shape: fmt.ModelShape, desc: fmt.Description | None, quant: str
                    ) -> list[_Entry]:
    """The table a conversion with `--quant quant` writes: format.tensor_order,
    format.expected_shape, the preset's storage type per kind fitted to the
    row width (format.fit_dtype), format.section_size; a tied embedding in
    the preset's tied type (format.TIED_TYPE, as export.tied_dtype)."""
    dtypes = dict(_presets()[quant])
    if desc is not None and desc.has(fmt.Feat.TIED_LM_HEAD):
        dtypes[Kind.EMBED] = fmt.TIED_TYPE[quant]
    out = []
    for kind, layer, expert in fmt.tensor_order(shape, desc):
        rows, cols = fmt.expected_shape(shape, kind, desc)
        dt = fmt.fit_dtype(dtypes[kind], cols, kind)
        out.append(_Entry(int(kind), fmt.NO_INDEX if layer is None else layer,
                          fmt.NO_INDEX if expert is None else expert, int(dt), rows, cols,
                          fmt.section_size(dt, rows, cols, shape.group_size)))
    return out


def tokenizer_entry(size: int) -> _Entry:
    """The table entry of a tokenizer section of `size` bytes (its kind:
    format.OPTIONAL_SECTIONS; the runtime skips it, so it is "other")."""
    return _Entry(fmt.KIND_TOKENIZER, fmt.NO_INDEX, fmt.NO_INDEX, 0, 1, size, size)


def _config_path(path: str | Path) -> Path:
    p = Path(path)
    return p / "config.json" if p.is_dir() else p


def plan_from_config(path: str | Path, quant: str = "int8", max_seq_len: int | None = None,
                     max_batch: int = 1, group_size: int = 32) -> Planned:
    """config.json (or its directory) -> the Planned file of a conversion
    with these options (the converters' defaults: max_seq_len as `colibri
    convert` chooses it)."""
    cfg_path = _config_path(path)
    from . import convert_encdec, hf
    from ..errors import ColibriError
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise ColibriError(f"{cfg_path}: cannot read a config.json: {exc}") from None
    if convert_encdec.is_encdec_config(cfg):
        shape, desc = convert_encdec.shape_and_desc(cfg, max_seq_len, max_batch, group_size)
        family = "switch_transformers"
    else:
        from .export import shape_and_desc
        c = hf.config_from_dict(cfg, str(cfg_path))
        shape, desc = shape_and_desc(c, None, None, max_seq_len, max_batch, group_size)
        family = c.family
    if desc == fmt.Description.default(shape):
        desc = None          # the writer stores Mixtral's computation as version 1
    return Planned(shape, desc, planned_entries(shape, desc, quant), family)


# ---- the report -------------------------------------------------------------------

def _dtype_names(dts) -> str:
    return "+".join(DType(d).name.lower() for d in dts) or "-"


def _fmt(n: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


def report_lines(shape, desc, entries, file_size: int, kv_this: str | None = None,
                 tables: Tables = TABLES_LP64, arena_of=None) -> list[str]:
    """The memory section of `colibri info`: weights by part, the arena for
    both cache types (the arena colibri_init allocates: chunk 128 tokens;
    `arena_of(kv)` overrides it, e.g. the C library's own figure), the KV
    cache per token and at max_seq_len, and the total resident bytes."""
    parts = weight_parts(entries)
    lines = ["", "resident memory (all-resident: the file mapped or read + one arena)",
             f"  {'part':<18} {'bytes':>14} {'size':>11}  tensors  storage"]
    for p in PARTS:
        x = parts[p]
        lines.append(f"  {PART_TITLES[p]:<18} {x.bytes:>14} {_fmt(x.bytes):>11}  {x.tensors:>7}  "
                     + ("desc, tokenizer" if p == "other" else _dtype_names(x.dtypes)))
    rest = file_size - sum(x.bytes for x in parts.values())
    lines.append(f"  {'header+table+pad':<18} {rest:>14} {_fmt(rest):>11}")
    lines.append(f"  {'file':<18} {file_size:>14} {_fmt(file_size):>11}")
    for kv in KV_TYPES:
        per_tok, total = kv_bytes(shape, kv)
        arena = arena_of(kv) if arena_of else arena_bytes(shape, desc, kv, CHUNK_TOKENS_OWNED,
                                                          tables)
        mark = "  (this run)" if kv == kv_this else ""
        lines.append(f"  kv {kv:<4} {per_tok:>8} B/token, {total:>12} B at max_seq_len "
                     f"{shape.max_seq_len} x batch {shape.max_batch}; arena {arena} B; "
                     f"resident total {file_size + arena} B ({_fmt(file_size + arena)}){mark}")
    return lines


def readme_table(rows) -> str:
    """rows: (name, Planned per quant) -> the documented table (markdown)."""
    out = ["| model | max_seq_len | quant | file | KV/token f32 | KV/token i8 | "
           "resident, kv f32 | resident, kv i8 |", "|---|---|---|---|---|---|---|---|"]
    for name, by_quant in rows:
        for quant, pl in by_quant.items():
            size = pl.file_size()
            t32, _ = kv_bytes(pl.shape, "f32")
            t8, _ = kv_bytes(pl.shape, "i8")
            r32 = size + arena_bytes(pl.shape, pl.desc, "f32", CHUNK_TOKENS_OWNED)
            r8 = size + arena_bytes(pl.shape, pl.desc, "i8", CHUNK_TOKENS_OWNED)
            out.append(f"| {name} | {pl.shape.max_seq_len} | {quant} | {_fmt(size)} | "
                       f"{_fmt(t32)} | {_fmt(t8)} | {_fmt(r32)} | {_fmt(r8)} |")
    return "\n".join(out)


def readme_rows(config_paths, quants=QUANTS):
    """(name, {quant: Planned}) for each config.json (the name: the file's
    stem, e.g. models/configs/Qwen3-30B-A3B.json), every quant planned with
    the converters' defaults (format.PRESET_* as they are now)."""
    return [(Path(p).stem if Path(p).is_file() else Path(p).name,
             {q: plan_from_config(p, q) for q in quants}) for p in config_paths]


def main(argv=None) -> int:
    """python -m colibri.model.memory --readme-table CONFIG.json ...: the sizes
    table of real checkpoints (docs/QUANTISATION.md) from their config.json
    alone."""
    import argparse
    import sys
    from ..errors import ColibriError
    ap = argparse.ArgumentParser(prog="python -m colibri.model.memory",
                                 description="file size and resident bytes of checkpoints "
                                             "from their config.json alone")
    ap.add_argument("--readme-table", nargs="+", metavar="CONFIG", required=True,
                    help="config.json files (or their directories), e.g. models/configs/*.json")
    args = ap.parse_args(argv)
    try:
        print(readme_table(readme_rows(args.readme_table)))
    except ColibriError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
