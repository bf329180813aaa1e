"""Static analysis of the C sources: gcc -fanalyzer, cppcheck (warning,
portability, performance and the MISRA C:2012 addon) and clang's static
analyser, over the library, the firmware application and the bootloader,
compiled with each build configuration's defines (CONFIGS).

A finding is (tool, rule, file, function, line, message). docs/DEVIATIONS.md
lists the kept ones (the MISRA compliance report's deviations): `check`
returns the findings no deviation covers, and deviations that no longer
match anything (stale entries hide nothing, but lie about the code).

Nothing is cached between runs: every run preprocesses and analyses from
scratch. Within a run, a source whose preprocessed text (for the same
compiler) is identical in two configurations is analysed once.

    python -m colibri.buildsteps.analysis          # all tools, report, exit 1 on new findings
    python -m colibri.buildsteps.analysis --list   # every finding, deviated or not
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import sources as _sources

ROOT = Path(__file__).resolve().parents[2]
DEVIATIONS = "docs/DEVIATIONS.md"
TOOLS = ("gcc-analyzer", "cppcheck", "clang-analyzer")
ORLP = "third_party/ed25519-orlp-0.1.3"


@dataclass(frozen=True)
class Config:
    """One build configuration: the compiler family, its flags and defines,
    and the sources compiled with them (paths relative to the root)."""
    name: str
    cc: str                      # gcc driver used for -E and -fanalyzer
    arch: tuple[str, ...]        # -m flags
    defines: tuple[str, ...]
    sources: tuple[str, ...]
    includes: tuple[str, ...]
    cppcheck_platform: str       # unix64 / unix32
    clang_target: tuple[str, ...] = ()   # clang flags for the same target
    fw_text: bool = False        # firmware/app/main.c in text mode (fw_config.h)
    # sources gcc -fanalyzer skips here because another configuration
    # analyses the same code with more paths (cppcheck and clang still run)
    no_gcc_analyzer: tuple[str, ...] = ()


LIB_INC = tuple(_sources.INCLUDE_DIRS)
FW_INC = LIB_INC + tuple(_sources.FIRMWARE_INCLUDE_DIRS)
ARM_CLANG = ("--target=thumbv7em-none-eabihf", "-mcpu=cortex-m4", "-mfloat-abi=hard",
             "-isystem", "/usr/lib/arm-none-eabi/include")


def _target_defines(target_name: str, **opts) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(arch flags, defines) of a target built with `opts` (the SCons
    variables, e.g. tokenizer="0"), from the build's own definitions."""
    sys.path.insert(0, str(ROOT))
    import targets
    from . import toolchain
    t = targets.get(target_name)
    o = toolchain.resolve_options(t, **opts)
    f = toolchain.flags(t, o, ROOT)
    return tuple(t.arch_flags), tuple(f.cppdefines)


def configs() -> list[Config]:
    """The configurations analysed: each target's defaults and the variants
    that change which code is compiled (threads, tokenizer, encdec, static
    work buffer, mmap), the bootloader in its two builds."""
    from . import bootloader
    lib = tuple(_sources.LIBRARY)
    app = tuple(_sources.FIRMWARE_APP) + ("firmware/arena_tables.c",)
    # the kernel sets' files as the builds compile them (avx2.c and avx512.c;
    # neon.c, neon_dotprod.c, neon_attend.c)
    x86 = tuple(_sources.KERNELS["avx2"].sources)
    neon = tuple(_sources.KERNELS["neon"].sources)
    out = []
    arch, d = _target_defines("x86_64")
    out.append(Config("x86_64", "gcc", arch, d,
                      lib + x86 + app + tuple(_sources.FIRMWARE_LINUX)
                      + ("firmware/boot/boot_core.c",),
                      FW_INC + ("firmware/boot", "src/include", ORLP), "unix64", (), True))
    arch, d = _target_defines("x86_64", tokenizer="0", encdec="0", threads="0", mmap="1",
                              workbuf="static", vnni="0")
    # avx2.c with vnni=0 is x86_64's text but for cpu_vnni_form's body,
    # `return 0` (one of the paths -fanalyzer follows there); -fanalyzer on
    # it took 53 s of the whole analysis's 420 (Zen 3) and, like x86_64's,
    # found nothing.
    out.append(Config("x86_64-minimal", "gcc", arch, d,
                      lib + x86 + app, FW_INC, "unix64",
                      no_gcc_analyzer=("src/kernels/avx2.c",)))
    arch, d = _target_defines("aarch64")
    out.append(Config("aarch64-neon", "aarch64-linux-gnu-gcc", arch, d,
                      neon + ("src/plan.c",),
                      LIB_INC, "unix64", ("--target=aarch64-linux-gnu",)))
    cm = tuple(_sources.FIRMWARE_APP) + ("firmware/cortex_m/startup.c",
                                          "firmware/cortex_m/semihost.c")
    arch, d = _target_defines("cortex-m")
    out.append(Config("cortex-m", "arm-none-eabi-gcc", arch, d, lib + cm, FW_INC,
                      "unix32", ARM_CLANG, True))
    arch, d = _target_defines("cortex-m", threads="1", tokenizer="0")
    out.append(Config("cortex-m-hook-notok", "arm-none-eabi-gcc", arch, d, lib + cm, FW_INC,
                      "unix32", ARM_CLANG))
    boot_arch = tuple(f for f in bootloader.CFLAGS if f.startswith("-m"))
    boot_def = tuple(f[2:] for f in bootloader.CFLAGS if f.startswith("-D"))
    boot_src = tuple(s for s in bootloader.BOOT_SOURCES + bootloader.STARTUP)
    boot_inc = ("firmware", "firmware/boot", "src/include", ORLP)
    out.append(Config("boot", "arm-none-eabi-gcc", boot_arch, boot_def, boot_src, boot_inc,
                      "unix32", ARM_CLANG))
    out.append(Config("boot-corpus", "arm-none-eabi-gcc", boot_arch, boot_def + ("BOOT_CORPUS",),
                      ("firmware/boot/main.c",), boot_inc, "unix32", ARM_CLANG))
    return out


# ---------------------------------------------------------------------------
# Findings and the function that holds them
# ---------------------------------------------------------------------------

@dataclass(frozen=True, order=True)
class Finding:
    tool: str
    rule: str
    file: str       # relative to the analysed root when inside it
    function: str   # enclosing function, "<file>" at file scope
    line: int
    message: str

    def __str__(self):
        return (f"{self.file}:{self.line}: {self.function}: [{self.tool} {self.rule}] "
                f"{self.message}")


_SIG = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def _function_map(path: Path) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of each function defined in `path`, in
    the project's layout: the signature starts in column 0, the body's
    braces stand alone in column 0."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    out, start, name = [], None, None
    for i, text in enumerate(lines, 1):
        if (start is None and (text[:1].isalpha() or text[:1] == "_")
                and text.rstrip().endswith("{") and "=" not in text and _SIG.search(text)):
            start, name = i, _SIG.search(text).group(1)   # "int f(void) {" (firmware/boot/)
        elif text.startswith("{") and start is None:
            for j in range(i - 2, max(-1, i - 12), -1):
                s = lines[j]
                if s[:1].isalpha() or s[:1] == "_":
                    m = _SIG.search(s)
                    if m:
                        start, name = i, m.group(1)
                    break
        elif text.startswith("}") and start is not None:
            out.append((start, i, name))
            start = None
    return out


class _Locator:
    def __init__(self, root: Path):
        self.root = root
        self.maps: dict[str, list] = {}

    def rel(self, path: str) -> str:
        p = Path(path)
        if not p.is_absolute():
            p = (self.root / p)
        p = Path(os.path.normpath(p))
        try:
            return str(p.relative_to(self.root))
        except ValueError:
            return str(p)

    def function(self, rel: str, line: int) -> str:
        if rel not in self.maps:
            self.maps[rel] = _function_map(self.root / rel)
        for a, b, name in self.maps[rel]:
            if a <= line <= b:
                return name
        return "<file>"


# ---------------------------------------------------------------------------
# Running the tools
# ---------------------------------------------------------------------------

@dataclass
class Unit:
    """One source file in one configuration."""
    config: Config
    source: str
    key: str = ""           # compiler + preprocessed text: units with equal keys analyse alike


def have_tool(tool: str, cfgs=None) -> str | None:
    """None if `tool` can run, else why not (the missing program)."""
    prog = {"gcc-analyzer": "gcc", "cppcheck": "cppcheck", "clang-analyzer": "clang"}[tool]
    if shutil.which(prog) is None:
        return f"{prog} is not installed (scripts/setup.sh installs it)"
    if tool == "cppcheck" and _misra_addon() is None:
        return "cppcheck's MISRA addon (misra.py) is not installed"
    return None


def _misra_addon() -> str | None:
    for d in ("/usr/share/cppcheck/addons", "/usr/lib/x86_64-linux-gnu/cppcheck/addons",
              "/usr/lib/cppcheck/addons"):
        if Path(d, "misra.py").exists():
            return str(Path(d, "misra.py"))
    # Debian 12's cppcheck resolves the bare name itself
    if shutil.which("cppcheck"):
        return "misra"
    return None


def _fw_config(dirpath: Path, text: bool) -> None:
    """fw_config.h as the firmware build generates it (blob.config_header)
    for a small model: firmware/app/main.c needs one to compile."""
    from ..file.format import ModelShape
    from . import blob
    shape = ModelShape(vocab=256, hidden=64, intermediate=128, max_seq_len=64, n_layers=2,
                       n_heads=4, n_kv_heads=2, head_dim=16, n_experts=4, top_k=2)
    inputs = None
    if text:
        inputs = blob.FirmwareInputs([[1, 2, 3]], text="Hello, world", device_tokenizes=True,
                                     add_bos=True)
    dirpath.mkdir(parents=True, exist_ok=True)
    (dirpath / "fw_config.h").write_text(
        blob.config_header("analysis", shape, 1 << 20, 1 << 20, inputs=inputs))


def _cflags(cfg: Config, root: Path, gen: Path) -> list[str]:
    inc = [f"-I{gen / ('text' if cfg.fw_text else 'ids')}"]
    inc += [f"-I{root / d}" for d in cfg.includes]
    return ["-std=c11", *cfg.arch, *[f"-D{d}" for d in cfg.defines], *inc]


def _run(cmd, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)


def _preprocess_key(unit: Unit, root: Path, gen: Path) -> str:
    cfg = unit.config
    r = _run([cfg.cc, *_cflags(cfg, root, gen), "-E", "-P", str(root / unit.source)], root)
    if r.returncode:
        # -E alone does not apply `#pragma GCC target` (neon_dotprod.c tests
        # the feature macro it sets): no sharing for this unit; a real
        # error shows when the tools compile it.
        return f"{cfg.name}:{unit.source}"
    return hashlib.sha256((cfg.cc + " ".join(cfg.arch) + "\0" + r.stdout).encode()).hexdigest()


_GCC = re.compile(r"^(.+?):(\d+):\d+: (?:warning|error): (.*?)(?: \[CWE-\d+\])? \[(-W[^\]]+)\]$")
_ERR = re.compile(r"^(.+?):(\d+):\d+: (?:fatal )?error: (.*)$")
_CLANG = re.compile(r"^(.+?):(\d+):\d+: warning: (.*) \[([\w.]+)\]$")


def _diagnostics(tool: str, pattern: re.Pattern, stderr: str, loc: _Locator) -> list[Finding]:
    """The findings in a compiler's diagnostics: `pattern` matches one line
    with groups (file, line, message, rule)."""
    out = []
    for text in stderr.splitlines():
        m = pattern.match(text)
        if m:
            f = loc.rel(m.group(1))
            line = int(m.group(2))
            out.append(Finding(tool, m.group(4), f, loc.function(f, line), line, m.group(3)))
    return out


def _gcc_analyzer(unit: Unit, root: Path, gen: Path, loc: _Locator) -> list[Finding]:
    cfg = unit.config
    cmd = [cfg.cc, *_cflags(cfg, root, gen), "-O2", "-Wall", "-Wextra", "-ffp-contract=off",
           "-fanalyzer", "-fdiagnostics-plain-output", "-c", str(root / unit.source),
           "-o", os.devnull]
    r = _run(cmd, root)
    out = _diagnostics("gcc-analyzer", _GCC, r.stderr, loc)
    if r.returncode and not out:
        raise RuntimeError(f"{cfg.name}: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return out


def _cppcheck(unit: Unit, root: Path, gen: Path, loc: _Locator, workdir: Path) -> list[Finding]:
    cfg = unit.config
    # the dump files of the MISRA addon go next to a copy-free build dir
    bdir = Path(tempfile.mkdtemp(dir=workdir))
    inc = [f"-I{gen / ('text' if cfg.fw_text else 'ids')}"]
    inc += [f"-I{root / d}" for d in cfg.includes]
    cmd = ["cppcheck", "-q", "--std=c11", f"--platform={cfg.cppcheck_platform}",
           "--enable=warning,portability,performance", f"--addon={_misra_addon()}",
           "--suppress=missingIncludeSystem", f"--cppcheck-build-dir={bdir}",
           "--template={file}\t{line}\t{id}\t{severity}\t{message}",
           *[f"-D{d}" for d in cfg.defines], *inc, str(root / unit.source)]
    # the defines of the compiler itself that the code tests
    if cfg.cc.startswith("arm-none-eabi"):
        cmd[1:1] = ["-D__arm__", "-D__ARM_ARCH_7EM__", "-D__thumb__"]
    elif cfg.cc.startswith("aarch64"):
        # neon_dotprod.c's `#pragma GCC target` defines the feature macro
        cmd[1:1] = ["-D__aarch64__", "-D__ARM_NEON", "-D__ARM_FEATURE_DOTPROD"]
    else:
        cmd[1:1] = ["-D__x86_64__", "-D__GNUC__=12"]
    r = _run(cmd, root)
    if r.returncode:
        raise RuntimeError(f"{cfg.name}: cppcheck on {unit.source} failed:\n{r.stderr[-2000:]}")
    out = []
    for text in r.stderr.splitlines():
        parts = text.split("\t")
        if len(parts) != 5 or not parts[1].isdigit():
            continue
        f = loc.rel(parts[0])
        line = int(parts[1])
        out.append(Finding("cppcheck", parts[2], f, loc.function(f, line), line, parts[4]))
    return out


def _clang_analyzer(unit: Unit, root: Path, gen: Path, loc: _Locator) -> list[Finding]:
    cfg = unit.config
    flags = _cflags(cfg, root, gen)
    flags = [f for f in flags if not f.startswith("-m")] + list(cfg.clang_target)
    if cfg.cc == "gcc":
        flags += list(cfg.arch)
    if unit.source.endswith("neon_dotprod.c"):
        flags.append("-march=armv8.2-a+dotprod")  # clang ignores its `#pragma GCC target`
    cmd = ["clang", "--analyze", *flags, "-Wno-unknown-warning-option",
           "-Wno-unused-command-line-argument", str(root / unit.source), "-o", os.devnull]
    r = _run(cmd, root)
    out = _diagnostics("clang-analyzer", _CLANG, r.stderr, loc)
    if r.returncode:
        raise RuntimeError(f"{cfg.name}: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return out


@dataclass
class Result:
    findings: dict[str, list[Finding]] = field(default_factory=dict)   # tool -> sorted, unique
    skipped: dict[str, str] = field(default_factory=dict)              # tool -> why
    units: int = 0
    analysed: int = 0
    seconds: float = 0.0


def analyse(root: Path = ROOT, tools=TOOLS, cfgs: list[Config] | None = None,
            only: set[str] | None = None, jobs: int = 2) -> Result:
    """Run `tools` over every (configuration, source) of `cfgs` (default:
    configs()) in the tree at `root`; `only`: analyse these sources alone.
    Tools that cannot run are listed in Result.skipped."""
    t0 = time.monotonic()
    root = Path(root).resolve()
    cfgs = configs() if cfgs is None else cfgs
    res = Result()
    run_tools = []
    for tool in tools:
        why = have_tool(tool)
        if why:
            res.skipped[tool] = why
        else:
            run_tools.append(tool)
    cfgs = [c for c in cfgs if shutil.which(c.cc)]
    loc = _Locator(root)
    with tempfile.TemporaryDirectory(prefix="colibri-analysis-") as tmp:
        tmp = Path(tmp)
        gen = tmp / "gen"
        _fw_config(gen / "ids", text=False)
        _fw_config(gen / "text", text=True)
        units = [Unit(c, s) for c in cfgs for s in c.sources if only is None or s in only]
        with cf.ThreadPoolExecutor(max_workers=jobs) as pool:
            keys = pool.map(lambda u: _preprocess_key(u, root, gen), units)
            for u, k in zip(units, keys):
                u.key = k
            first: dict[str, Unit] = {}
            for u in units:
                first.setdefault(u.key, u)
            res.units, res.analysed = len(units), len(first)
            todo = []
            for u in first.values():
                for tool in run_tools:
                    if tool == "gcc-analyzer":
                        if u.source in u.config.no_gcc_analyzer:
                            continue
                        fut = pool.submit(_gcc_analyzer, u, root, gen, loc)
                    elif tool == "cppcheck":
                        fut = pool.submit(_cppcheck, u, root, gen, loc, tmp)
                    else:
                        fut = pool.submit(_clang_analyzer, u, root, gen, loc)
                    todo.append((tool, u, fut))
            # the slowest (avx2.c under -fanalyzer) is submitted in source order;
            # results are gathered in submission order so the output is stable
            got: dict[str, set] = {t: set() for t in run_tools}
            for tool, u, fut in todo:
                try:
                    got[tool].update(fut.result())
                except RuntimeError as e:
                    # a tool that cannot analyse a unit is a finding no
                    # deviation covers (rule "tool-error"), never a silent pass
                    got[tool].add(Finding(tool, "tool-error", u.source, "<file>", 0,
                                          str(e).splitlines()[0][:300]))
    res.findings = {t: sorted(v) for t, v in got.items()}
    res.seconds = time.monotonic() - t0
    return res


# ---------------------------------------------------------------------------
# Deviations (docs/DEVIATIONS.md)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Deviation:
    """A row of a deviation table: | tool | rule | file | function | lines | why |.
    file and function are fnmatch patterns ("*": any); lines is the number
    of distinct lines the row covers ("*": a rule-level deviation, any
    number)."""
    tool: str
    rule: str
    file: str
    function: str
    lines: int | None
    why: str

    def covers(self, f: Finding) -> bool:
        return (f.tool == self.tool and fnmatch.fnmatchcase(f.rule, self.rule)
                and fnmatch.fnmatchcase(f.file, self.file)
                and fnmatch.fnmatchcase(f.function, self.function))


def load_deviations(path: Path) -> list[Deviation]:
    out = []
    for text in Path(path).read_text().splitlines():
        cells = [c.strip() for c in text.strip().strip("|").split("|")]
        if len(cells) != 6 or cells[0] not in TOOLS:
            continue
        tool, rule, file, func, lines, why = cells
        strip = lambda s: s.strip("`")
        out.append(Deviation(tool, strip(rule), strip(file), strip(func),
                             None if lines == "*" else int(lines), why))
    return out


@dataclass
class Verdict:
    new: list[Finding]                   # covered by no deviation
    over: list[tuple[Deviation, int]]    # rows whose line count is exceeded (count found)
    stale: list[Deviation]               # rows (of tools that ran) matching nothing
    deviated: int


def check(res: Result, devs: list[Deviation]) -> Verdict:
    """Sort the findings into deviated and new; count each row's lines."""
    new, hits = [], {d: set() for d in devs}
    deviated = 0
    for tool, fs in res.findings.items():
        for f in fs:
            d = next((d for d in devs if d.covers(f)), None)
            if d is None:
                new.append(f)
            else:
                hits[d].add((f.file, f.line))
                deviated += 1
    over = [(d, len(h)) for d, h in hits.items() if d.lines is not None and len(h) > d.lines]
    stale = [d for d, h in hits.items() if not h and d.tool in res.findings]
    return Verdict(new, over, stale, deviated)


def report(res: Result, v: Verdict) -> str:
    lines = [f"analysed {res.analysed} distinct units of {res.units} (configuration x source) "
             f"in {res.seconds:.0f} s"]
    for tool in TOOLS:
        if tool in res.skipped:
            lines.append(f"  {tool}: skipped ({res.skipped[tool]})")
        elif tool in res.findings:
            n = len(res.findings[tool])
            lines.append(f"  {tool}: {n} findings, "
                         f"{sum(1 for f in v.new if f.tool == tool)} not deviated")
    for f in v.new:
        lines.append(f"NEW {f}")
    for d, n in v.over:
        lines.append(f"MORE {d.tool} {d.rule} {d.file} {d.function}: {n} lines, the deviation "
                     f"covers {d.lines}")
    for d in v.stale:
        lines.append(f"STALE {d.tool} {d.rule} {d.file} {d.function}: matches nothing")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--list", action="store_true", help="print every finding")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    res = analyse(tools=a.tools.split(","), jobs=a.jobs)
    v = check(res, load_deviations(ROOT / DEVIATIONS))
    if a.list:
        for tool in res.findings:
            for f in res.findings[tool]:
                print(f)
    print(report(res, v))
    return 1 if (v.new or v.over or v.stale) else 0


if __name__ == "__main__":
    sys.exit(main())
