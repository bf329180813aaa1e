"""Sizes from ELF files (pyelftools) and the budgets of targets/*.py.

Budgets (bytes, in a target's `budgets`):
  runtime         libcolibri.a: text + rodata + data of all its objects
  firmware_flash  firmware.elf: every allocated section with file contents
                  (code, rodata, the .colibri_model blob, the .data image)
  firmware_ram    firmware.elf: writable allocated sections (data, bss: the
                  arena and the logits buffer live in bss)
  image           the packed image (firmware.bin, objcopy -O binary): what
                  the flash slot must hold, padding between sections included
  bootloader      boot.elf (firmware/boot/, `scons target=cortex-m boot`):
                  every allocated section with file contents; measured only
                  when the boot goal builds it

`measure` collects the numbers, `check_budgets` returns one actionable
message per budget exceeded, `format_report` is what `scons size` prints.
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


def check_budgets(report: SizeReport, target) -> list[str]:
    """One message per budget of `target` that the report exceeds, naming
    the budget, the total, the largest section and the largest symbols."""
    problems = []
    for name, budget in target.budgets.items():
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
    lines += ["", f"{n_symbols} largest symbols of the firmware:"]
    for s in report.symbols[:n_symbols]:
        lines.append(f"  {s.size:>10}  {s.section:<16} {s.name}")
    return "\n".join(lines) + "\n"
