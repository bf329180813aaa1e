"""Build targets: one small module per target in this package.

Each module defines `TARGET = Target(...)`. Adding a target means adding one
module here; SConstruct, `scons target=list`, the size budgets and the QEMU
matrix (tests/test_targets_matrix.py) all discover targets through `load_all`.

Nothing here imports SCons, so pytest can use the same definitions.
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from dataclasses import dataclass, field

# Flags every target gets. -ffp-contract=off: no fused multiply-add unless a
# kernel asks for it explicitly, so the reference kernels round identically on
# every target (bit-identical logits on x86_64, armv7, ppc, aarch64, riscv64).
COMMON_CFLAGS = ("-std=c11", "-Wall", "-Wextra", "-ffp-contract=off",
                 "-ffunction-sections", "-fdata-sections")


@dataclass(frozen=True)
class Target:
    """Everything the build needs to know about one target.

    name            the `target=` value
    os              "linux" (colibri-cli + a static user-mode firmware) or
                    "bare" (firmware only, our own start-up code)
    prefix          cross toolchain prefix ("" = host gcc)
    package         Debian package(s) that provide the toolchain
    arch_flags      -m flags for compiling and linking
    byte_order      "little" or "big": the firmware embeds the model in it
    pointer_bytes   sizeof(void*), used to size the arena's pointer tables
    kernels         optional SIMD kernels the target can build ("avx2", "neon")
    defaults        defaults of the build variables (mmap, workbuf, avx2, fma, neon)
    emulator        command prefix to run a program, "{prog}" is replaced by
                    the program path (appended when absent); () = run natively
    emulator_package Debian package of the emulator
    cpu_kernels     emulated CPU (-cpu value) -> the kernel table the runtime
                    must pick on it in a build with the target's default
                    kernels; the first CPU is the one `emulator` pins. More
                    than one CPU when the choice depends on the CPU (aarch64:
                    SDOT or not): `scons check` and the QEMU matrix run every
                    CPU listed. Empty when the table depends on the host
                    (x86_64 runs natively)
    ram_bytes, flash_bytes  the device's memories (flash slot = packed image)
    budgets         name -> bytes; see colibri/buildsteps/size.py for the names
    ldscript        linker script of bare-metal targets (relative to the top)
    startup         extra firmware sources of bare-metal targets
    program_sources extra sources linked into every executable of the target
                    (colibri-cli and the firmware), e.g. emulator workarounds
    defines         extra preprocessor definitions of the library's sources,
                    e.g. COLIBRI_CRC32_SLICE8=0 (src/crc32.c) on flash-tight MCUs
    run_timeout     seconds one emulated run may take before it is killed
    """
    name: str
    description: str
    os: str
    prefix: str
    package: str
    arch_flags: tuple[str, ...]
    byte_order: str
    pointer_bytes: int
    kernels: tuple[str, ...] = ()
    defaults: dict = field(default_factory=dict)
    emulator: tuple[str, ...] = ()
    emulator_package: str = ""
    cpu_kernels: dict = field(default_factory=dict)
    ram_bytes: int = 0
    flash_bytes: int = 0
    budgets: dict = field(default_factory=dict)
    ldscript: str = ""
    startup: tuple[str, ...] = ()
    program_sources: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()
    link_flags: tuple[str, ...] = ()
    libs: tuple[str, ...] = ("m",)
    run_timeout: float = 60.0

    @property
    def is_linux(self) -> bool:
        return self.os == "linux"

    def tool(self, name: str) -> str:
        """Full name of a binutils/gcc tool of this target, e.g. 'arm-none-eabi-gcc'."""
        return self.prefix + name

    @property
    def cpu(self) -> str | None:
        """The CPU model the emulator is pinned to (`-cpu X`), or None."""
        e = list(self.emulator)
        return e[e.index("-cpu") + 1] if "-cpu" in e[:-1] else None

    def on_cpu(self, cpu: str) -> "Target":
        """This target with its emulator pinned to `cpu` instead: how the
        tests and `scons check` run the other CPUs of cpu_kernels."""
        if self.cpu is None:
            raise ValueError(f"target {self.name} pins no emulated CPU")
        e = list(self.emulator)
        e[e.index("-cpu") + 1] = cpu
        return dataclasses.replace(self, emulator=tuple(e))

    def emulator_command(self, prog: str, args: tuple[str, ...] = ()) -> list[str]:
        """The argv that runs `prog` (with `args`) on this target."""
        if not self.emulator:
            return [prog, *args]
        cmd = [part.replace("{prog}", prog) for part in self.emulator]
        if not any("{prog}" in part for part in self.emulator):
            cmd.append(prog)
        return cmd + list(args)


def _module_names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def load_all() -> dict[str, Target]:
    """name -> Target for every module of this package, sorted by name."""
    found = {}
    for mod in _module_names():
        target = importlib.import_module(f"{__name__}.{mod}").TARGET
        if target.name in found:
            raise ValueError(f"targets/{mod}.py: target name {target.name!r} is used twice")
        found[target.name] = target
    return dict(sorted(found.items()))


def get(name: str) -> Target:
    """The target called `name`; ValueError naming the valid ones otherwise."""
    targets = load_all()
    if name not in targets:
        raise ValueError(f"unknown target {name!r}; valid targets: "
                         + ", ".join(targets) + " (or 'all', 'list')")
    return targets[name]
