"""Build options and compiler flags for a target, without SCons.

`resolve_options` turns the user's variables (strings from the command line,
"auto" = the target's default) into checked values; `flags` gives the
compiler/linker settings for a target and those options. SCons's
colibri_toolchain tool applies them; pytest checks them directly.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from . import sources
from ..errors import ColibriError

TRUE = ("1", "yes", "true", "on")
FALSE = ("0", "no", "false", "off")


@dataclass(frozen=True)
class Options:
    mmap: bool
    workbuf: str        # "static" or "dynamic"
    debug: bool
    avx2: bool
    fma: bool
    neon: bool
    tokenizer: bool = True   # 0: -DCOLIBRI_NO_TOKENIZER (src/tokenizer.c stubs)
    encdec: bool = True      # 0: -DCOLIBRI_NO_ENCDEC (src/encdec.c stubs)
    # the tokenizer's NFC / NFKC composition tables (src/unicode_norm.h, about
    # 32 KiB); 0: -DCOLIBRI_NO_TOK_NORM, such a tokenizer is COLIBRI_E_UNSUPPORTED
    nfc: bool = True
    threads: bool = False    # COLIBRI_THREADS (src/threads.c): Linux targets only
    # 0: -DCOLIBRI_AVX2_NO_VNNI, the AVX2 kernels never pick their vpdpbusd
    # table "avx2-vnni": stands in for an AVX2-only CPU (Zen 2/3, Haswell).
    vnni: bool = False

    @property
    def kernels(self) -> tuple[str, ...]:
        """Optional kernel sets compiled in (the ref kernels always are)."""
        return tuple(k for k in ("avx2", "neon") if getattr(self, k))


NO_TOK_NORM = "COLIBRI_NO_TOK_NORM"
# What the NFC / NFKC tables may add to a target's runtime budget when
# `nfc=1` asks for them where the target leaves them out (they are 32 KiB).
NFC_BUDGET = 40 << 10


def _bool(name: str, value, default: bool) -> bool:
    if value is None or value == "auto":
        return default
    if isinstance(value, bool):
        return value
    v = str(value).lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise ColibriError(f"{name}={value!r}: expected 0, 1 or auto")


def resolve_options(target, mmap="auto", workbuf="auto", debug="0", avx2="auto",
                    fma="auto", neon="auto", tokenizer="1", threads="auto",
                    vnni="auto", encdec="1", nfc="auto") -> Options:
    """Check the variables against what `target` supports and fill in its
    defaults. Errors name the variable, the value and what is allowed."""
    d = target.defaults
    if workbuf in (None, "auto"):
        workbuf = d.get("workbuf", "dynamic")
    if workbuf not in ("static", "dynamic"):
        raise ColibriError(f"workbuf={workbuf!r}: expected static, dynamic or auto")
    use_avx2 = _bool("avx2", avx2, d.get("avx2", False))
    opts = Options(
        mmap=_bool("mmap", mmap, d.get("mmap", False)),
        workbuf=workbuf,
        debug=_bool("debug", debug, False),
        avx2=use_avx2,
        # FMA is part of the AVX2 kernels (src/kernels/avx2.c): it follows avx2.
        fma=_bool("fma", fma, use_avx2),
        neon=_bool("neon", neon, d.get("neon", False)),
        tokenizer=_bool("tokenizer", tokenizer, True),
        encdec=_bool("encdec", encdec, True),
        # The firmware targets leave the tables out (their defines say so).
        nfc=_bool("nfc", nfc, NO_TOK_NORM not in target.defines),
        # The pthread pool needs Linux (pthreads, futex): the Linux targets'
        # default. Bare metal builds without (and keeps its size); threads=1
        # there compiles the executor hook alone (an RTOS's tasks).
        threads=_bool("threads", threads, target.is_linux),
        # vpdpbusd is part of the AVX2 kernels (a run-time choice): it follows avx2.
        vnni=_bool("vnni", vnni, use_avx2),
    )
    for k in ("avx2", "neon"):
        if getattr(opts, k) and k not in target.kernels:
            have = ", ".join(target.kernels) or "none"
            raise ColibriError(f"{k}=1: target {target.name} has no {k} kernels "
                               f"(available: {have})")
    if opts.fma != opts.avx2:
        raise ColibriError(f"fma={int(opts.fma)} with avx2={int(opts.avx2)}: the AVX2 kernels "
                           "(src/kernels/avx2.c) are AVX2+FMA kernels, so fma must equal avx2 "
                           "(scalar ref kernels never fuse: -ffp-contract=off)")
    if opts.vnni and not opts.avx2:
        raise ColibriError("vnni=1 with avx2=0: the VNNI int8 kernels are part of the AVX2 "
                           "kernels (src/kernels/avx2.c); give avx2=1 or leave vnni=auto")
    if not target.is_linux and (opts.mmap or opts.workbuf != "static"):
        raise ColibriError(f"target {target.name} is bare metal: it needs mmap=0 "
                           "workbuf=static (there is no file system and no heap)")
    return opts


@dataclass(frozen=True)
class Flags:
    ccflags: tuple[str, ...]
    cppdefines: tuple[str, ...]
    linkflags: tuple[str, ...]
    libs: tuple[str, ...]
    # per-source extra flags and defines for the optional kernels
    kernel_ccflags: dict


def flags(target, opts: Options, root: str | Path) -> Flags:
    """Compiler and linker settings for `target` built with `opts`. `root`
    (the repository) is mapped to "." in debug info and __FILE__, so builds
    in different checkouts give the same bytes."""
    from targets import COMMON_CFLAGS

    opt = ("-O0", "-g3") if opts.debug else ("-O2", "-g")
    ccflags = (*COMMON_CFLAGS, *target.arch_flags, *opt,
               f"-ffile-prefix-map={Path(root).resolve()}=.")
    defines = [f"COLIBRI_ENABLE_MMAP={int(opts.mmap)}"]
    if opts.workbuf == "static":
        defines.append("COLIBRI_STATIC_WORKBUF")
    if opts.debug:
        defines.append("COLIBRI_DEBUG")
    if not opts.tokenizer:
        defines.append("COLIBRI_NO_TOKENIZER")
    if not opts.encdec:
        defines.append("COLIBRI_NO_ENCDEC")
    defines.append(f"COLIBRI_THREADS={int(opts.threads)}")
    defines.extend(d for d in target.defines if d != NO_TOK_NORM)
    if not opts.nfc:
        defines.append(NO_TOK_NORM)
    kernel_ccflags = {}
    for k in opts.kernels:
        kset = sources.KERNELS[k]
        defines.append(kset.define)
        kernel_ccflags[k] = tuple(kset.flags)
    if not opts.kernels:
        defines.append("COLIBRI_KERNELS_REF_ONLY")
    if opts.avx2 and not opts.vnni:
        defines.append("COLIBRI_AVX2_NO_VNNI")
    linkflags = (*target.arch_flags, *target.link_flags)
    if opts.debug and "--specs=nano.specs" in target.link_flags:
        # newlib-nano leaves float printf out unless asked: the debug dumps need it.
        linkflags += ("-u", "_printf_float")
    return Flags(ccflags, tuple(defines), linkflags, tuple(target.libs), kernel_ccflags)


def missing_tools(target) -> list[str]:
    """Messages for the build tools of `target` not found on PATH."""
    out = []
    for tool in ("gcc", "ar", "objcopy"):
        name = target.tool(tool)
        if shutil.which(name) is None:
            out.append(f"{name} not found: install the Debian package(s) {target.package} "
                       f"(apt-get install {target.package}) to build target {target.name}")
            break
    return out


def missing_emulator(target) -> str | None:
    """A message if the emulator of `target` is not on PATH, else None."""
    if not target.emulator:
        return None
    if shutil.which(target.emulator[0]) is None:
        return (f"{target.emulator[0]} not found: install the Debian package "
                f"{target.emulator_package} (apt-get install {target.emulator_package}) "
                f"to run target {target.name}")
    return None
