"""Build the C runtime (libcolibri.a, colibri-cli and, on request,
libcolibri.so) with a given toolchain.

The plain-function build the tests use for their variants (sanitizers, static
work buffer, debug, cross compilers) and `python -m colibri.buildsteps.cbuild` uses for the
default host build into build/x86_64/ (with libcolibri.so, the library
colibri.runtime loads). The SCons build reuses the same source
lists (colibri/buildsteps/sources.py), so there is one definition of what the
runtime is made of.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from . import sources as _sources

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"

# The canonical source lists live in colibri/buildsteps/sources.py (shared with
# SConstruct). KERNELS: name -> sources, the define telling plan.c the set is
# linked in, and flags for those files. "ref" is always linked.
LIB_SOURCES = tuple(x for x in _sources.LIBRARY if x != "src/kernels/ref.c")
KERNELS = {"ref": dict(sources=("src/kernels/ref.c",), define=None, flags=())}
for _name, _k in _sources.KERNELS.items():
    KERNELS[_name] = dict(sources=tuple(_k.sources), define=_k.define, flags=tuple(_k.flags))
CLI_SOURCES = tuple(_sources.CLI)
SHARED_ONLY = tuple(_sources.SHARED_ONLY)
INCLUDE_DIRS = tuple(_sources.INCLUDE_DIRS)
# -ffp-contract=off: no fused multiply-add behind our back, so the ref kernels
# give bit-identical results on every target. -Wvla: no variable-length
# arrays (stack use must be known on small targets).
BASE_CFLAGS = ("-std=c11", "-Wall", "-Wextra", "-Werror", "-Wvla", "-ffp-contract=off",
               "-O2")
LIBS = ("-lm",)


class BuildError(RuntimeError):
    """A compiler or archiver failed; the message carries its output."""


def tool_for(cc: str, tool: str) -> str:
    """The binutils `tool` matching compiler `cc`: arm-linux-gnueabihf-gcc ->
    arm-linux-gnueabihf-ar; gcc/clang -> ar."""
    name = os.path.basename(cc)
    if name.endswith("-gcc") or name.endswith("-cc"):
        return os.path.join(os.path.dirname(cc), name.rsplit("-", 1)[0] + "-" + tool)
    return tool


@contextlib.contextmanager
def build_lock(directory: Path):
    """Hold an exclusive lock on directory/.lock while building there:
    several test sessions, or the xdist workers of one, may ask for the
    same build at once; the first builds it, the others then find it
    current."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}")


def _flags(*, cflags, defines, kernels, sanitize, static_workbuf, mmap, debug):
    """Compile flags shared by every object (and by test programs)."""
    flags = list(BASE_CFLAGS)
    if debug or sanitize:
        flags += ["-g"]
    if sanitize:
        flags += [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer",
                  "-fno-sanitize-recover=all"]
    flags += [f"-I{ROOT / d}" for d in INCLUDE_DIRS]
    defs = list(defines)
    if sanitize:
        # The SIMD kernels as plain loops: same accesses, 30x less compile
        # time under the sanitizers (src/kernels/avx2.c).
        defs.append("COLIBRI_KERNELS_PLAIN")
    defs.append(f"COLIBRI_ENABLE_MMAP={1 if mmap else 0}")
    if static_workbuf:
        defs.append("COLIBRI_STATIC_WORKBUF")
    if debug:
        defs.append("COLIBRI_DEBUG")
    if tuple(kernels) == ("ref",):
        defs.append("COLIBRI_KERNELS_REF_ONLY")
    for k in kernels:
        if KERNELS[k]["define"]:
            defs.append(KERNELS[k]["define"])
    flags += [f"-D{d}" for d in defs]
    flags += list(cflags)
    ldflags = [f"-fsanitize={sanitize}"] if sanitize else []
    return flags, ldflags


def build(out_dir, *, cc="gcc", cflags=(), defines=(), kernels=("ref", "avx2"),
          sanitize=None, static_workbuf=False, mmap=True, debug=False,
          ldflags=(), program_sources=(), cli=True, shared=False) -> dict:
    """Compile libcolibri.a and colibri-cli into out_dir.

    kernels: kernel sets to link ("ref" is always added); ("ref",) alone
    defines COLIBRI_KERNELS_REF_ONLY. sanitize: e.g. "address,undefined" or
    "thread". Returns {"lib", "cli", "include_flags", "cflags", "ldflags",
    "cc"} (paths as Path); rebuilds only when the sources or the options
    changed. ldflags and program_sources (extra C files, e.g. a target's
    emulator workaround) go into colibri-cli and every build_program().
    cli=False builds the library alone (bare-metal targets have no
    colibri-cli: it needs a file system and a clock).
    shared=True adds libcolibri.so (result key "so", else None), for
    colibri.runtime: the same sources, compiler, flags and kernels compiled
    a second time with -fPIC into obj-pic/ (the static library's objects
    stay non-PIC, byte for byte what they were), plus src/shared_abi.c;
    linked with -shared, without a "-static" of ldflags.
    """
    out = Path(out_dir)
    kernels = tuple(dict.fromkeys(("ref",) + tuple(kernels)))
    for k in kernels:
        if k not in KERNELS:
            raise BuildError(f"unknown kernel set {k!r}: choose from {sorted(KERNELS)}")
        for src in KERNELS[k]["sources"]:
            if not (ROOT / src).exists():
                raise BuildError(f"kernel set {k!r} needs {src}, which is not in this tree")
    flags, link = _flags(cflags=cflags, defines=defines, kernels=kernels,
                         sanitize=sanitize, static_workbuf=static_workbuf,
                         mmap=mmap, debug=debug)
    link += list(ldflags)
    extra = [str(ROOT / p) for p in program_sources]
    sources = list(LIB_SOURCES) + [src for k in kernels for src in KERNELS[k]["sources"]]
    result = {"lib": out / "libcolibri.a", "cli": out / "colibri-cli",
              "so": out / "libcolibri.so" if shared else None,
              "cflags": flags, "ldflags": link, "cc": cc, "program_sources": extra}

    # Rebuild only when something that matters changed.
    h = hashlib.sha256(json.dumps([cc, flags, link, sources, extra, cli, shared]).encode())
    for path in sorted(SRC.rglob("*.[ch]")):
        h.update(str(path).encode())
        h.update(path.read_bytes())
    stamp = out / ".build-stamp"
    if (stamp.exists() and stamp.read_text() == h.hexdigest()
            and result["lib"].exists() and (result["cli"].exists() or not cli)
            and (not shared or result["so"].exists())):
        return result

    obj_dir = out / "obj"
    if obj_dir.exists():
        shutil.rmtree(obj_dir)
    obj_dir.mkdir(parents=True)
    objs = []
    for src in sources:
        obj = obj_dir / (Path(src).stem + ".o")
        extra = []
        for k in kernels:
            if src in KERNELS[k]["sources"]:
                extra = list(KERNELS[k]["flags"])
        _run([cc, *flags, *extra, "-c", str(ROOT / src), "-o", str(obj)])
        objs.append(obj)
    if result["lib"].exists():
        result["lib"].unlink()
    _run([tool_for(cc, "ar"), "rcs", str(result["lib"]), *map(str, objs)])
    if shared:
        _build_shared(result["so"], out / "obj-pic", cc, flags, link, sources, kernels)
    if not cli:
        result["cli"] = None
        stamp.write_text(h.hexdigest())
        return result
    cli_objs = []
    for src in CLI_SOURCES:
        obj = obj_dir / (Path(src).stem + ".o")
        _run([cc, *flags, "-c", str(ROOT / src), "-o", str(obj)])
        cli_objs.append(obj)
    _run([cc, *flags, *map(str, cli_objs), *extra, str(result["lib"]), *link, *LIBS,
          "-o", str(result["cli"])])
    stamp.write_text(h.hexdigest())
    return result


def _build_shared(so: Path, obj_dir: Path, cc, flags, link, sources, kernels) -> None:
    """libcolibri.so from PIC objects of `sources` (+ SHARED_ONLY), compiled
    with exactly the static library's flags plus -fPIC."""
    if obj_dir.exists():
        shutil.rmtree(obj_dir)
    obj_dir.mkdir(parents=True)
    objs = []
    for src in list(sources) + list(SHARED_ONLY):
        obj = obj_dir / (Path(src).stem + ".o")
        extra = []
        for k in kernels:
            if src in KERNELS[k]["sources"]:
                extra = list(KERNELS[k]["flags"])
        _run([cc, *flags, *extra, "-fPIC", "-c", str(ROOT / src), "-o", str(obj)])
        objs.append(obj)
    if so.exists():
        so.unlink()
    # -Wl,--no-undefined: every symbol resolved at link time (libm, libc),
    # not at dlopen.
    _run([cc, *flags, "-shared", "-Wl,--no-undefined", *map(str, objs),
          *[f for f in link if f != "-static"], *LIBS, "-o", str(so)])


def build_program(info: dict, sources, out_path, *, extra_cflags=(),
                  extra_ldflags=()) -> Path:
    """Compile and link a C program (e.g. a test) against the library of a
    build() result, with the same compiler and flags."""
    out_path = Path(out_path)
    _run([info["cc"], *info["cflags"], *extra_cflags, *map(str, sources),
          *info.get("program_sources", ()), str(info["lib"]), *info["ldflags"],
          *extra_ldflags, *LIBS,
          "-o", str(out_path)])
    return out_path


def host_kernels() -> tuple:
    """The kernel sets the default host build links: ref, plus avx2 on x86-64
    when its source is in the tree."""
    import platform
    ks = ["ref"]
    if platform.machine() in ("x86_64", "AMD64") and all(
            (ROOT / src).exists() for src in KERNELS["avx2"]["sources"]):
        ks.append("avx2")
    return tuple(ks)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m colibri.buildsteps.cbuild",
        description="Build libcolibri.a, libcolibri.so (for colibri.runtime) and "
                    "colibri-cli for the host into build/x86_64/.")
    parser.add_argument("--out", default=str(ROOT / "build" / "x86_64"))
    parser.add_argument("--cc", default="gcc")
    parser.add_argument("--kernels", default=None,
                        help="comma-separated kernel sets (default: ref + host SIMD present)")
    parser.add_argument("--sanitize", default=None)
    parser.add_argument("--static-workbuf", action="store_true")
    parser.add_argument("--no-mmap", action="store_true")
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("--no-shared", action="store_true",
                        help="do not build libcolibri.so (the Python binding's library)")
    args = parser.parse_args(argv)
    kernels = tuple(args.kernels.split(",")) if args.kernels else host_kernels()
    try:
        res = build(args.out, cc=args.cc, kernels=kernels, sanitize=args.sanitize,
                    static_workbuf=args.static_workbuf, mmap=not args.no_mmap,
                    debug=args.debug, shared=not args.no_shared and not args.sanitize)
    except BuildError as exc:
        print(f"colibri.buildsteps.cbuild: build failed: {exc}", file=sys.stderr)
        return 1
    built = [res["lib"], res["so"], res["cli"]]
    print(f"built {', '.join(str(p) for p in built if p)} (kernels: {', '.join(kernels)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
