"""The model inside the firmware.

- `blob_for_target`: the .colibri file in the target's byte order (a
  big-endian target uses a big-endian file in place from flash: the runtime
  cannot swap without allocating).
- `embed_asm`: assembly that puts the blob in a read-only, 64-byte aligned
  `.colibri_model` section with start/end/size symbols (.incbin keeps the
  bytes out of the compiler: no giant C array to parse).
- `arena_bytes`: the arena a model needs, from its header alone:
  colibri/model/memory.py's arena formula with the target's struct sizes
  (`table_sizes_from_object`: firmware/arena_tables.c compiled for the
  target) and the KV cache type of the build (kv=f32|i8).
- `config_header`: the firmware's generated header (arena size, model facts,
  the prompts, the sampling parameters), so the firmware needs no malloc.
- `FirmwareInputs` / `plan_inputs`: what the firmware will be asked to do and
  what the host expects of it: a text prompt is tokenised ON THE DEVICE when
  the model file carries a tokenizer (the host computes the expected ids with
  the Python tokenizer, colibri/text/tokenizer.py, for the check); a model without
  one (a byte-level model, vocab >= 256) gets the prompt's UTF-8 bytes as ids.
  Written next to fw_config.h as fw_inputs.json for check and run.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import ColibriError
from ..file import format as cformat
from ..model import memory
from ..text.sampling import SampleParams

SECTION = ".colibri_model"
# Symbols the firmware uses (declared in firmware/app/model_blob.h).
SYM_START = "colibri_model_blob"
SYM_END = "colibri_model_blob_end"
SYM_SIZE = "colibri_model_blob_size"

# Fixed prompts the firmware runs (token ids < vocab of any model >= 16
# tokens). Two prompts of different lengths exercise a multi-token prefill
# and decode steps from different cache lengths.
DEFAULT_PROMPTS = ((1, 2, 3, 4, 5, 6), (11, 7, 3))
DEFAULT_GENERATE = 4
# Tokens processed together by the runtime (COLIBRI_CHUNK_TOKENS default).
CHUNK_TOKENS = 16


INPUTS_JSON = "fw_inputs.json"


@dataclass
class FirmwareInputs:
    """What the firmware runs, as the host sees it (fw_inputs.json).

    prompts       token-id prompts compiled into the firmware (id mode), or
                  [the ids the host's tokenizer gives the text] (text mode:
                  the device tokenises `text` itself; these are the expected ids)
    text          the prompt as text ("" for the fixed token-id prompts)
    device_tokenizes  True: the firmware calls colibri_tokenize on `text`
    add_bos       text mode: the device puts bos first (the template does)
    sampling      SampleParams fields (temperature 0: greedy)
    n_generate    tokens generated after each prompt
    kv            the KV cache the firmware runs with: "f32" or "i8"
                  (colibri_options.kv_dtype; the check's reference quantises
                  its cache the same way)"""
    prompts: list[list[int]]
    text: str = ""
    device_tokenizes: bool = False
    add_bos: bool = False
    n_generate: int = 4
    sampling: dict = field(default_factory=lambda: asdict(SampleParams()))
    kv: str = "f32"

    @property
    def params(self) -> SampleParams:
        return SampleParams(**self.sampling)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def load(cls, fw_dir: str | os.PathLike) -> "FirmwareInputs":
        path = Path(fw_dir) / INPUTS_JSON
        try:
            return cls(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError) as exc:
            raise ColibriError(f"{path}: cannot read the firmware's inputs ({exc}): "
                               "rebuild the firmware with scons") from None


def _model_tokenizer(model):
    """The Python tokenizer of the model file, or None when it has none."""
    from ..text.tokenizer import KIND_TOKENIZER, Tokenizer, parse_section
    f = cformat.read_file(model)
    try:
        for e in f.entries:
            if e.kind == KIND_TOKENIZER:
                return Tokenizer(parse_section(bytes(f.section(e))))
    finally:
        f.close()
    return None


def check_kv(model, kv: str) -> None:
    """The KV cache type `kv` must be one the runtime has: f32 or i8.
    Raises ColibriError."""
    if kv not in memory.KV_TYPES:
        raise ColibriError(f"kv={kv}: the KV cache is f32 (float32, the default) or i8 "
                           "(8-bit with a float32 scale per head vector)")


def plan_inputs(model, text: str = "", prompts=None, n_generate: int = None,
                sampling: SampleParams | None = None, kv: str = "f32") -> FirmwareInputs:
    """The firmware's inputs for `model`: a text prompt (tokenised on the
    device when the file has a tokenizer, else fed as UTF-8 bytes) or the
    token-id `prompts` (default DEFAULT_PROMPTS), run with the KV cache
    `kv`. Raises ColibriError saying what to change."""
    from ..text.tokenizer import F_TEMPLATE_BOS
    check_kv(model, kv)
    n_generate = DEFAULT_GENERATE if n_generate is None else n_generate
    sp = sampling or SampleParams()
    try:
        sp.check()
    except ValueError as exc:
        raise ColibriError(f"sampling: {exc}") from None
    if not text:
        return FirmwareInputs([list(p) for p in (prompts or DEFAULT_PROMPTS)], "",
                              n_generate=n_generate, sampling=asdict(sp), kv=kv)
    tok = _model_tokenizer(model)
    if tok is None:
        ids = list(text.encode("utf-8"))
        return FirmwareInputs([ids], text, n_generate=n_generate, sampling=asdict(sp), kv=kv)
    bos = bool(tok.spec.flags & F_TEMPLATE_BOS) and tok.spec.bos_id >= 0
    ids = tok.encode(text, add_bos=bos)
    if not ids:
        raise ColibriError(f"prompt={text!r} has no tokens: give some text")
    return FirmwareInputs([ids], text, device_tokenizes=True, add_bos=bos,
                          n_generate=n_generate, sampling=asdict(sp), kv=kv)


def _write_if_changed(path: Path, data: bytes) -> None:
    """Write `data` unless the file already holds it: keeps the timestamp
    stable, so make-like tools and editors see no change."""
    path = Path(path)
    if path.exists() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def check_model(path: str | os.PathLike) -> cformat.ModelShape:
    """Validate the model a build embeds, as `blob_for_target` will (every
    field, every CRC, finite weights), and return its shape. Raises a
    ColibriError whose message names the file and what to do."""
    f = cformat.read_file(path)
    f.close()
    return f.shape


def blob_for_target(src: str | os.PathLike, dst: str | os.PathLike, byte_order: str) -> Path:
    """Write the .colibri file `src` to `dst` in `byte_order` ("little" or
    "big"). The file is validated (every CRC) first; a file already in that
    order is copied byte for byte, otherwise every tensor is re-encoded in
    the other order with the same values (the CRCs change with the bytes),
    the tokenizer section re-packed in that order. Optional sections of
    unknown kind cannot be re-encoded and are refused."""
    f = cformat.read_file(src)
    try:
        if f.byte_order == byte_order:
            _write_if_changed(Path(dst), bytes(f._buf))
            return Path(dst)
        from ..text.tokenizer import KIND_TOKENIZER, pack_section, parse_section
        unknown = [e.label() for e in f.entries
                   if e.kind not in cformat.Kind._value2member_map_ and e.kind != KIND_TOKENIZER]
        if unknown:
            raise ColibriError(f"{src}: cannot convert to {byte_order}-endian: it holds "
                               f"sections of unknown kind ({', '.join(unknown)})")
        # The tokenizer section is re-packed in the target's order (the C
        # tokenizer uses it in place, like the tensors).
        optional = [(KIND_TOKENIZER, pack_section(parse_section(bytes(f.section(e))), byte_order))
                    for e in f.entries if e.kind == KIND_TOKENIZER]
        Path(dst).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(str(dst) + ".swap")
        cformat.write_file(tmp, f.shape, f.tensors(), byte_order=byte_order, desc=f.desc,
                           optional_sections=optional)
        data = tmp.read_bytes()
        tmp.unlink()
        _write_if_changed(Path(dst), data)
        return Path(dst)
    finally:
        f.close()


def embed_asm(blob_path: str, linux: bool) -> str:
    """GNU assembler source that embeds `blob_path` (a path the assembler
    can open from the build's working directory). Works for x86-64, ARM and
    PowerPC gas: only portable directives, `%` for section types."""
    lines = [
        f"/* Generated by colibri/buildsteps/blob.py: the model blob, read-only and",
        f"   64-byte aligned, used in place by colibri_init_from_memory. */",
        f'    .section {SECTION},"a",%progbits',
        "    .balign 64",
        f"    .global {SYM_START}",
        f"    .global {SYM_END}",
        f"    .type {SYM_START}, %object",
        f"{SYM_START}:",
        f'    .incbin "{blob_path}"',
        f"{SYM_END}:",
        f"    .size {SYM_START}, {SYM_END} - {SYM_START}",
        "    .section .rodata",
        "    .balign 4",
        f"    .global {SYM_SIZE}",
        f"    .type {SYM_SIZE}, %object",
        f"    .size {SYM_SIZE}, 4",
        f"{SYM_SIZE}:",
        f"    .long {SYM_END} - {SYM_START}",
    ]
    if linux:  # no executable stack for a data-only object
        lines.append('    .section .note.GNU-stack,"",%progbits')
    return "\n".join(lines) + "\n"


def table_sizes_from_object(path: str | os.PathLike) -> tuple[memory.Tables, int]:
    """(the arena's table sizes, COLIBRI_CHUNK_TOKENS) as the target's
    compiler laid them out: the st_size of the array symbols of
    firmware/arena_tables.c compiled with the library's flags. Raises
    ColibriError naming a missing symbol (a stale or foreign object)."""
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as fh:
        tab = ELFFile(fh).get_section_by_name(".symtab")
        sizes = {}
        for name in (*TABLE_SYMBOLS.values(), CHUNK_SYMBOL):
            syms = tab.get_symbol_by_name(name) if tab is not None else None
            if not syms:
                raise ColibriError(f"{path}: no symbol {name}: rebuild it from "
                                   "firmware/arena_tables.c")
            sizes[name] = int(syms[0]["st_size"])
    tables = memory.Tables(**{f: sizes[sym] for f, sym in TABLE_SYMBOLS.items()})
    return tables, sizes[CHUNK_SYMBOL]


# memory.Tables field -> the symbol of firmware/arena_tables.c sized by it.
TABLE_SYMBOLS = {"plan": "colibri_sizeof_clb_plan", "layer": "colibri_sizeof_clb_layer",
                 "expert": "colibri_sizeof_clb_expert", "encdec": "colibri_sizeof_clb_encdec",
                 "xattn": "colibri_sizeof_clb_xattn"}
CHUNK_SYMBOL = "colibri_chunk_tokens"


def arena_bytes(shape: cformat.ModelShape, tables: memory.Tables,
                desc: cformat.Description | None = None, kv: str = "f32",
                chunk_tokens: int = CHUNK_TOKENS) -> int:
    """The arena the firmware reserves: colibri/model/memory.py's copy of
    clb_layout (held equal to the C library by tests/test_memory.py) for a
    caller's arena (chunk_tokens rows) with the KV cache `kv` ("f32"/"i8").
    `tables`: the target's struct sizes (table_sizes_from_object: then this
    is exactly colibri_arena_size_ex on the target) or a bound
    (memory.tables_bound(pointer_bytes)). The firmware still checks the
    runtime's own colibri_arena_size_ex against it at start-up and stops
    with status 2, naming both numbers, if the runtime ever needs more."""
    return memory.arena_bytes(shape, desc, kv, chunk_tokens, tables)


def _c_string(data: bytes) -> str:
    """A C string literal of exactly these bytes (hex escapes, split so a
    following hex digit never extends an escape)."""
    return "".join(f'"\\x{b:02x}"' for b in data) if data else '""'


def _c_float(v: float) -> str:
    """A float literal that is the float32 value the host uses (repr of the
    float32 rounded value: parses back to the same float32)."""
    import numpy as np
    return repr(float(np.float32(v))) + "f"


def config_header(target_name: str, shape: cformat.ModelShape, model_bytes: int,
                  arena: int, prompts=DEFAULT_PROMPTS, n_generate: int = DEFAULT_GENERATE,
                  inputs: FirmwareInputs | None = None,
                  chunk_tokens: int = CHUNK_TOKENS) -> str:
    """The firmware's generated configuration (firmware/app/main.c includes
    it as fw_config.h). `inputs` (default: the token-id `prompts`, greedy,
    f32 KV cache) adds the text prompt the device tokenises, the sampling
    parameters and the KV cache type. chunk_tokens: the library's
    COLIBRI_CHUNK_TOKENS."""
    inputs = inputs or FirmwareInputs([list(p) for p in prompts], n_generate=n_generate)
    prompts, n_generate = inputs.prompts, inputs.n_generate
    for p in prompts:
        if not p:
            raise ColibriError("firmware prompts must not be empty")
        bad = [t for t in p if not 0 <= t < shape.vocab]
        if bad:
            raise ColibriError(f"firmware prompt {list(p)}: token ids {bad} are outside the "
                               f"model's vocabulary 0..{shape.vocab - 1}: give a model that has "
                               "them (prompt= text needs a model with a tokenizer, or a "
                               "byte-level model, vocab 256), or leave out prompt=")
        if len(p) + n_generate - 1 > shape.max_seq_len:
            raise ColibriError(f"firmware prompt {list(p)} + {n_generate} tokens needs "
                               f"{len(p) + n_generate - 1} positions, the model has "
                               f"max_seq_len {shape.max_seq_len}")
    # Rows of the logits buffer: a prefill runs in chunks of at most this
    # many tokens (the device's own tokenisation may differ in length).
    max_rows = min(max(len(p) for p in prompts), chunk_tokens)
    sp = inputs.params
    out = [
        "/* Generated by colibri/buildsteps/blob.py from the model header: do not edit. */",
        "#ifndef COLIBRI_FW_CONFIG_H",
        "#define COLIBRI_FW_CONFIG_H",
        "#include <stdint.h>",
        f'#define FW_TARGET "{target_name}"',
        f"#define FW_MODEL_BYTES {model_bytes}u",
        f"#define FW_ARENA_BYTES {arena}u   /* colibri_arena_size_ex, see blob.arena_bytes */",
        "/* The KV cache (colibri_options.kv_dtype): COLIBRI_KV_F32 or COLIBRI_KV_I8. */",
        f"#define FW_KV_DTYPE COLIBRI_KV_{inputs.kv.upper()}",
        f'#define FW_KV_NAME "{inputs.kv}"',
        f"#define FW_VOCAB {shape.vocab}u",
        f"#define FW_MAX_ROWS {max_rows}u   /* longest prompt: rows of the logits buffer */",
        f"#define FW_N_GENERATE {n_generate}u",
        f"#define FW_N_PROMPTS {len(prompts)}u",
        "/* Sampling (colibri_sample.h); temperature 0: greedy. */",
        f"#define FW_SAMPLE_TEMPERATURE {_c_float(0.0 if sp.greedy else sp.temperature)}",
        f"#define FW_SAMPLE_TOP_K {int(sp.top_k)}u",
        f"#define FW_SAMPLE_TOP_P {_c_float(sp.top_p)}",
        f"#define FW_SAMPLE_MIN_P {_c_float(sp.min_p)}",
        f"#define FW_SAMPLE_REPETITION_PENALTY {_c_float(sp.repetition_penalty)}",
        f"#define FW_SAMPLE_SEED {int(sp.seed) & (2**64 - 1)}ull",
    ]
    if inputs.device_tokenizes:
        data = inputs.text.encode("utf-8")
        out += [
            "/* Text mode: the device tokenises fw_prompt_text (colibri_tokenize) and",
            "   prints the generated text (colibri_detok_push). */",
            "#define FW_TEXT_PROMPT 1",
            f"#define FW_TOK_FLAGS (COLIBRI_TOK_PARSE_SPECIAL"
            f"{' | COLIBRI_TOK_ADD_BOS' if inputs.add_bos else ''})",
            f"#define FW_PROMPT_TEXT_BYTES {len(data)}u",
            # One id per byte at most (byte-level and SentencePiece BPE), + bos.
            f"#define FW_PROMPT_ID_CAP {len(data) + 1}u",
            f"static const char fw_prompt_text[FW_PROMPT_TEXT_BYTES + 1] = {_c_string(data)};",
            "#endif",
        ]
        return "\n".join(out) + "\n"
    out += ["#define FW_TEXT_PROMPT 0",
            f"#define FW_MAX_PROMPT {max(len(p) for p in prompts)}u   /* longest prompt */"]
    flat = [t for p in prompts for t in p]
    offsets, o = [], 0
    for p in prompts:
        offsets.append(o)
        o += len(p)
    out += [
        "static const int32_t fw_prompt_tokens[] = {" + ", ".join(map(str, flat)) + "};",
        "static const uint32_t fw_prompt_start[FW_N_PROMPTS] = {"
        + ", ".join(map(str, offsets)) + "};",
        "static const uint32_t fw_prompt_len[FW_N_PROMPTS] = {"
        + ", ".join(str(len(p)) for p in prompts) + "};",
        "#endif",
    ]
    return "\n".join(out) + "\n"


def _check_arena_fits(target, model, shape: cformat.ModelShape, arena: int, kv: str) -> None:
    """A bare-metal target's static arena lives in its RAM (the linker
    script's region of target.ram_bytes): one that cannot fit is refused
    here, in one line with what to do, not by the linker's "region `RAM'
    overflowed" after compiling everything. Linux targets allocate at run
    time (their RAM is the size report's budget)."""
    if target.is_linux or not target.ram_bytes or arena <= target.ram_bytes:
        return
    _, kv_total = memory.kv_bytes(shape, kv)
    fix = "re-convert with a smaller --max-seq-len" + (", or build with kv=i8" if kv == "f32"
                                                        else "")
    raise ColibriError(f"{model}: the firmware's arena of {arena} bytes (the KV cache {kv} "
                       f"{kv_total} of it, at max_seq_len {shape.max_seq_len}) does not fit "
                       f"{target.name}'s {target.ram_bytes} bytes of RAM: {fix}")


def prepare_firmware_inputs(model: str | os.PathLike, out_dir: str | os.PathLike,
                            target, prompts=DEFAULT_PROMPTS,
                            n_generate: int = DEFAULT_GENERATE, text: str = "",
                            sampling: SampleParams | None = None, kv: str = "f32",
                            tables_object: str | os.PathLike | None = None
                            ) -> dict[str, Path]:
    """Everything the firmware build generates from the model, in out_dir:
    model.bin (target byte order), model_blob.S, fw_config.h, fw_inputs.json
    (plan_inputs: the prompt, expected ids, sampling, KV cache). Returns
    their paths. Each file is rewritten only when its content changes.
    tables_object: firmware/arena_tables.c compiled for the target (the
    arena is then exact); None: memory.tables_bound(target.pointer_bytes)."""
    inputs = plan_inputs(model, text, prompts, n_generate, sampling, kv)
    out = Path(out_dir)
    blob = blob_for_target(model, out / "model.bin", target.byte_order)
    f = cformat.read_file(blob)
    shape, size = f.shape, len(f._buf)
    f.close()
    asm = out / "model_blob.S"
    _write_if_changed(asm, embed_asm(blob.as_posix(), target.is_linux).encode())
    hdr = out / "fw_config.h"
    if tables_object is None:
        tables, chunk = memory.tables_bound(target.pointer_bytes), CHUNK_TOKENS
    else:
        tables, chunk = table_sizes_from_object(tables_object)
    arena = arena_bytes(shape, tables, f.desc, inputs.kv, chunk)
    _check_arena_fits(target, model, shape, arena, inputs.kv)
    _write_if_changed(hdr, config_header(target.name, shape, size, arena, inputs=inputs,
                                         chunk_tokens=chunk).encode())
    js = out / INPUTS_JSON
    _write_if_changed(js, inputs.to_json().encode())
    return {"blob": blob, "asm": asm, "config": hdr, "inputs": js}
