"""Sizes from ELF files (pyelftools) and the budgets of targets/*.py.

Budgets (bytes, in a target's `budgets`):
  runtime         libcolibri.a: text + rodata + data of all its objects
  firmware_flash  firmware.elf: every allocated section with file contents
                  (code, rodata, the .colibri_model blob, the .data image)
  firmware_ram    firmware.elf: writable allocated sections (data, bss: the
                  arena and the logits buffer live in bss)
  image           what the target's flash slot holds: bare metal the raw
                  firmware.bin (objcopy -O binary, padding between sections
                  included), Linux the firmware.stripped.elf the signed
                  image carries (the ELF without its debug sections)
  bootloader      boot.elf (firmware/boot/, `scons target=cortex-m boot`):
                  every allocated section with file contents; measured only
                  when the boot goal builds it

`measure` collects the numbers, `check_budgets` returns one actionable
message per budget exceeded, `format_report` is what `scons size` prints.
`model_memory` adds what the firmware's model holds (colibri/model/memory.py, the
formulas held equal to the C library): in flash the model blob with its
weights by part of the network, in RAM the static arena with its KV cache
(per token and at max_seq_len), for the build's KV cache type.
"""
from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path

from elftools.elf.constants import SH_FLAGS
from elftools.elf.elffile import ELFFile


@dataclass
class Section:
    name: str
    kind: str      # "code", "rodata", "data", "bss", "model", "other"
    size: int
    addr: int = 0


@dataclass
class Symbol:
    name: str
    size: int
    section: str


@dataclass
class SizeReport:
    sections: list[Section]          # firmware.elf allocated sections
    symbols: list[Symbol]            # firmware.elf, largest first
    runtime_sections: dict[str, int] # libcolibri.a: kind -> bytes summed
    runtime_symbols: list[Symbol]    # libcolibri.a, largest first
    totals: dict[str, int] = field(default_factory=dict)  # budget name -> bytes
    boot_sections: list[Section] = field(default_factory=list)   # boot.elf, when measured
    boot_symbols: list[Symbol] = field(default_factory=list)
    model: "ModelMemory | None" = None   # the embedded model's memory, when known


@dataclass
class ModelMemory:
    """What the firmware's model holds (bytes): flash = the blob (the
    .colibri file in the target's byte order: header, table, sections by
    part), RAM = the arena (KV cache + the rest: tables, activations)."""
    blob_bytes: int
    parts: dict                    # memory.PARTS -> memory.Part
    kv: str                        # "f32" or "i8"
    arena_bytes: int               # what colibri_arena_size_ex returns on the target
    kv_per_token: int              # one position of one sequence, all layers
    kv_bytes: int                  # the cache as the arena holds it
    max_seq_len: int
    max_batch: int

    @property
    def header_table_padding(self) -> int:
        return self.blob_bytes - sum(p.bytes for p in self.parts.values())

    @property
    def arena_without_kv(self) -> int:
        return self.arena_bytes - self.kv_bytes


def model_memory(blob_path: str | os.PathLike, kv: str, tables, chunk_tokens: int
                 ) -> ModelMemory:
    """The memory of the model file `blob_path` run with the KV cache `kv`
    from a caller's arena of chunk_tokens rows, the structs of `tables`
    (memory.Tables: the target's, blob.table_sizes_from_object)."""
    from ..file import format as cformat
    from ..model import memory
    f = cformat.read_file(blob_path, check_crc=False)
    try:
        size = len(f._buf)
        shape, desc, parts = f.shape, f.desc, memory.weight_parts(f.entries)
    finally:
        f.close()
    per_token, total = memory.kv_bytes(shape, kv)
    return ModelMemory(size, parts, kv, memory.arena_bytes(shape, desc, kv, chunk_tokens, tables),
                       per_token, total, shape.max_seq_len, shape.max_batch)


def format_model_memory(m: ModelMemory) -> list[str]:
    from ..model.memory import PARTS, PART_TITLES, _dtype_names
    lines = ["", "the firmware's model:",
             f"  flash: model blob {m.blob_bytes} B ({_human(m.blob_bytes)})",
             f"    {'part':<18}{'bytes':>12}  tensors  storage"]
    for p in PARTS:
        x = m.parts[p]
        what = "desc, tokenizer" if p == "other" else _dtype_names(x.dtypes)
        lines.append(f"    {PART_TITLES[p]:<18}{x.bytes:>12}  {x.tensors:>7}  {what}")
    lines += [f"    {'header+table+pad':<18}{m.header_table_padding:>12}",
              f"  ram: arena {m.arena_bytes} B ({_human(m.arena_bytes)}), KV cache {m.kv}",
              f"    KV cache          {m.kv_bytes:>12}  ({m.kv_per_token} B per token x "
              f"max_seq_len {m.max_seq_len} x batch {m.max_batch}, each piece 64-aligned)",
              f"    rest of the arena {m.arena_without_kv:>12}  (tables, RoPE, activations)"]
    return lines


def _kind(name: str, flags: int, sh_type: str) -> str:
    if name == ".colibri_model":
        return "model"
    if sh_type == "SHT_NOBITS":
        return "bss"
    if flags & SH_FLAGS.SHF_EXECINSTR:
        return "code"
    if flags & SH_FLAGS.SHF_WRITE:
        return "data"
    return "rodata"


def _alloc_sections(elf: ELFFile) -> list[Section]:
    out = []
    for s in elf.iter_sections():
        flags = s["sh_flags"]
        if not flags & SH_FLAGS.SHF_ALLOC or s["sh_size"] == 0:
            continue
        out.append(Section(s.name, _kind(s.name, flags, s["sh_type"]), s["sh_size"], s["sh_addr"]))
    return out


def _reserved_stack(elf: ELFFile) -> Section | None:
    """The stack a bare-metal linker script reserves at the top of RAM
    (__stack_limit__ .. __stack_top__, firmware/cortex_m/*.ld): RAM the
    sections do not show but the device must have."""
    tab = elf.get_section_by_name(".symtab")
    if tab is None:
        return None
    found = {}
    for name in ("__stack_limit__", "__stack_top__"):
        syms = tab.get_symbol_by_name(name)
        if syms:
            found[name] = syms[0]["st_value"]
    if len(found) != 2:
        return None
    return Section("(stack)", "bss", found["__stack_top__"] - found["__stack_limit__"],
                   found["__stack_limit__"])


def _symbols(elf: ELFFile) -> list[Symbol]:
    tab = elf.get_section_by_name(".symtab")
    if tab is None:
        return []
    out = []
    for sym in tab.iter_symbols():
        if sym["st_size"] == 0 or sym["st_info"]["type"] not in ("STT_FUNC", "STT_OBJECT"):
            continue
        shndx = sym["st_shndx"]
        sec = elf.get_section(shndx).name if isinstance(shndx, int) else str(shndx)
        out.append(Symbol(sym.name, sym["st_size"], sec))
    out.sort(key=lambda s: (-s.size, s.name))
    return out


def archive_members(path: str | os.PathLike) -> list[tuple[str, bytes]]:
    """(name, bytes) of the members of a System V/GNU `ar` archive, skipping
    the symbol table ('/') and long-name table ('//')."""
    data = Path(path).read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise ValueError(f"{path}: not an ar archive")
    pos, names, out = 8, b"", []
    while pos + 60 <= len(data):
        hdr = data[pos:pos + 60]
        name = hdr[:16].decode().rstrip()
        size = int(hdr[48:58].decode().strip())
        body = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
        if name == "//":
            names = body
        elif name in ("/", "/SYM64/"):
            continue
        else:
            if name.startswith("/") and names:
                off = int(name[1:])
                name = names[off:names.index(b"/\n", off)].decode()
            out.append((name.rstrip("/"), body))
    return out


def measure_runtime(lib: str | os.PathLike) -> tuple[dict[str, int], list[Symbol]]:
    """kind -> bytes over every object of the archive, and its symbols."""
    kinds: dict[str, int] = {}
    syms: list[Symbol] = []
    for member, body in archive_members(lib):
        elf = ELFFile(io.BytesIO(body))
        for s in _alloc_sections(elf):
            kinds[s.kind] = kinds.get(s.kind, 0) + s.size
        syms += [Symbol(f"{sym.name} ({member})", sym.size, sym.section) for sym in _symbols(elf)]
    syms.sort(key=lambda s: (-s.size, s.name))
    return kinds, syms


def measure(firmware: str | os.PathLike, lib: str | os.PathLike,
            image: str | os.PathLike | None = None,
            boot: str | os.PathLike | None = None) -> SizeReport:
    with open(firmware, "rb") as f:
        elf = ELFFile(f)
        sections = _alloc_sections(elf)
        stack = _reserved_stack(elf)
        if stack is not None:
            sections.append(stack)
        symbols = _symbols(elf)
    rt_kinds, rt_syms = measure_runtime(lib)
    totals = {
        "runtime": sum(rt_kinds.get(k, 0) for k in ("code", "rodata", "data")),
        "firmware_flash": sum(s.size for s in sections if s.kind != "bss"),
        "firmware_ram": sum(s.size for s in sections if s.kind in ("data", "bss")),
    }
    if image is not None:
        totals["image"] = Path(image).stat().st_size
    boot_secs, boot_syms = [], []
    if boot is not None:
        with open(boot, "rb") as f:
            elf = ELFFile(f)
            boot_secs, boot_syms = _alloc_sections(elf), _symbols(elf)
        totals["bootloader"] = sum(s.size for s in boot_secs if s.kind != "bss")
    return SizeReport(sections, symbols, rt_kinds, rt_syms, totals, boot_secs, boot_syms)


def _contributors(report: SizeReport, budget: str) -> tuple[list[tuple[str, int]], list[Symbol]]:
    """(section, bytes) largest first and the largest symbols behind a budget."""
    if budget == "runtime":
        secs = sorted(report.runtime_sections.items(), key=lambda kv: -kv[1])
        return secs, [s for s in report.runtime_symbols][:5]
    if budget == "bootloader":
        chosen = [s for s in report.boot_sections if s.kind != "bss"]
        names = {s.name for s in chosen}
        secs = sorted(((s.name, s.size) for s in chosen), key=lambda kv: -kv[1])
        return secs, [s for s in report.boot_symbols if s.section in names][:5]
    if budget == "firmware_ram":
        chosen = [s for s in report.sections if s.kind in ("data", "bss")]
    else:  # flash and image: everything with contents
        chosen = [s for s in report.sections if s.kind != "bss"]
    names = {s.name for s in chosen}
    secs = sorted(((s.name, s.size) for s in chosen), key=lambda kv: -kv[1])
    return secs, [s for s in report.symbols if s.section in names][:5]


def budgets_for(target, opts=None) -> dict:
    """The target's budgets for a build with `opts` (toolchain.Options):
    `nfc=1` where the target leaves the NFC / NFKC tables out raises the
    runtime budget by toolchain.NFC_BUDGET."""
    from .toolchain import NFC_BUDGET, NO_TOK_NORM
    out = dict(target.budgets)
    if opts is not None and opts.nfc and NO_TOK_NORM in target.defines and "runtime" in out:
        out["runtime"] += NFC_BUDGET
    return out


def check_budgets(report: SizeReport, target, opts=None) -> list[str]:
    """One message per budget of `target` (for a build with `opts`) that the
    report exceeds, naming the budget, the total, the largest section and
    the largest symbols."""
    problems = []
    for name, budget in budgets_for(target, opts).items():
        if name not in report.totals:
            continue
        total = report.totals[name]
        if total <= budget:
            continue
        secs, syms = _contributors(report, name)
        big = secs[0] if secs else ("?", 0)
        sym_txt = ", ".join(f"{s.name} {s.size} B" for s in syms) or "none"
        problems.append(
            f"target {target.name}: {name} is {total} bytes, over its budget of {budget} "
            f"bytes by {total - budget}; largest section {big[0]} = {big[1]} bytes; "
            f"largest symbols: {sym_txt}. Shrink those, or raise budgets['{name}'] in "
            f"targets/{target.name.replace('-', '_')}.py")
    return problems


def _human(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < (1 << 20) else f"{n / (1 << 20):.2f} MiB"


def format_report(report: SizeReport, target, n_symbols: int = 15, width: int = 40) -> str:
    lines = [f"Size report for target {target.name}", "",
             f"{'section':<24}{'kind':<8}{'address':>12}{'bytes':>12}"]
    for s in report.sections:
        lines.append(f"{s.name:<24}{s.kind:<8}{s.addr:>#12x}{s.size:>12}")
    lines += ["", "libcolibri.a: " + ", ".join(f"{k} {v}" for k, v in
                                              sorted(report.runtime_sections.items())), ""]
    lines.append("budgets:")
    for name, budget in target.budgets.items():
        if name not in report.totals:
            continue
        total = report.totals[name]
        frac = total / budget if budget else 1.0
        filled = min(width, round(frac * width))
        bar = "#" * filled + "." * (width - filled)
        flag = "  OVER BUDGET" if total > budget else ""
        lines.append(f"  {name:<15}[{bar}] {_human(total):>10} / {_human(budget):<10}"
                     f" {100 * frac:5.1f}%{flag}")
    if report.model is not None:
        lines += format_model_memory(report.model)
    lines += ["", f"{n_symbols} largest symbols of the firmware:"]
    for s in report.symbols[:n_symbols]:
        lines.append(f"  {s.size:>10}  {s.section:<16} {s.name}")
    return "\n".join(lines) + "\n"
