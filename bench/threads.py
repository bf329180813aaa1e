"""Thread benchmark (issue 15): Colibri at 1 and 2 threads against llama.cpp
at 1 and 2 threads, side by side in one run, interleaved.

    scripts/bench.sh --threads            # small model -> bench/results/threads.{md,json}
    scripts/bench.sh --threads --quick    # tiny model, few steps -> build/bench/threads-quick/

Engines (each loaded once, in its own process, then driven round after round):
  colibri f32 / int8          bench/c/threads_bench.c on the default host build
                              (x86_64: the file read into memory; kernels ref+avx2,
                              the int8 table "avx2-vnni" where the CPU has VNNI)
  colibri int8 vnni=0         the same with COLIBRI_AVX2_NO_VNNI (`scons vnni=0`):
                              the int8 kernels an AVX2-only CPU (Zen 2/3) runs
  colibri q4                  `colibri convert --quant q4` (the 4-bit mix: Q4_K, Q5_K,
                              Q6_K; Q5_0 / int8 on rows not a multiple of 256)
  colibri q4_k_m gguf / q4_0 gguf
                              llama.cpp's own Q4_K_M and Q4_0 files (the llama-bench
                              peers below) through `colibri convert FILE.gguf`, their
                              blocks kept byte for byte: equal bits exactly
  colibri q8_0 gguf           llama.cpp's Q8_0 file (the int8 peers' own) imported the
                              same way: Q8_0 blocks, 8.5 bits a weight where `colibri
                              int8` stores the same kind of values at 9
  colibri int8/q4 avx2-vnni   on an AVX-512 VNNI CPU: the same files with the AVX2 VNNI
                              table forced (COLIBRI_KERNELS), beside the default
                              avx512-vnni: what the 512-bit forms add
  llama-cpp-python f32/q8_0   bench/threads_peer.py, n_threads = n_threads_batch = N
  llama-bench native/avx2     llama.cpp's own tool, built from the same sources
                              (scripts/build_llama_bench.sh): `-p 128 -n 32 -t 1,2`,
                              default settings otherwise; f32 and Q8_0 on both
                              builds, Q4_K_M and Q4_0 (llama-quantize of the f32
                              GGUF) on the native build: the peers of colibri q4

Figures: prefill of 128 tokens, (a) last position's logits only (colibri_infer_ex
COLIBRI_LOGITS_LAST; llama.cpp logits_all=False; llama-bench's pp128) and (b) every
position's logits (COLIBRI_LOGITS_ALL; logits_all=True); decode: greedy single-token
steps after a 16-token prompt (llama-bench tg32: 32 tokens from an empty context).

A round runs every engine once, at 1 then 2 threads; the figure is the median over
the rounds of each round's median; wall time and process CPU time. Nothing asserted.

Two threads and the host: on a VM the two vCPUs may at times share the memory's
bandwidth with something outside (bench/results/FINDINGS.md 34, 35): then two
streams at once each run at about half speed, for every engine. So each engine's
2-thread figures are bracketed by a quick pairing probe (the 2-core over the
1-core read bandwidth, bench/c/bandwidth.c): a round counts as "both cores
streaming" for that engine when both probes reach PAIRED_MIN. The ratios are
given over all rounds, and at 2 threads also over those rounds alone.
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import models  # noqa: E402
from bench.measure import token_file  # noqa: E402

PY = sys.executable
LLAMA_BENCH = {  # flavour -> binary (scripts/build_llama_bench.sh)
    "native": ROOT / "build" / "bench" / "llama.cpp" / "native" / "bin" / "llama-bench",
    "avx2": ROOT / "build" / "bench" / "llama.cpp" / "avx2" / "bin" / "llama-bench",
}
THREADS = (1, 2)
METRICS = ("prefill_last", "prefill_all", "decode")
PLANS = {  # model, prefill length, prefill reps per round, decode prompt + steps, rounds
    "full": dict(model="small", n_prefill=128, reps=2, n_prompt=16, steps=32, rounds=3,
                 lb_args=["-p", "128", "-n", "32"]),
    "quick": dict(model="tiny", n_prefill=32, reps=2, n_prompt=8, steps=8, rounds=3,
                  lb_args=["-p", "32", "-n", "8", "-r", "2"]),
}
# Goals of issue 15, judged on the wall-time ratios (llama-bench has no CPU clock).
GOAL_VS_PEER, GOAL_PREFILL_SCALING, GOAL_DECODE_SCALING = 1.2, 1.8, 1.5
PRECISIONS = ("f32", "int8", "q4")  # --precisions: which Colibri files (and their peers) run
LLAMA_QUANTIZE = ROOT / "build" / "bench" / "llama.cpp" / "native" / "bin" / "llama-quantize"
Q4_PEERS = ("q4_k_m", "q4_0")       # llama-quantize types, native llama-bench only
PEER_QUANTS = {"f32": ("f32",), "int8": ("q8_0",), "q4": Q4_PEERS}


def log(msg: str) -> None:
    print(f"[threads {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- machine ----------------------------------------------------------------

CPU_FLAGS = ("avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512vl",
             "avx512_vnni", "avx_vnni", "amx_int8", "neon", "asimd", "asimddp")


def cpu_description() -> dict:
    model, flags = "", set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags") and not flags:
            flags = set(line.split(":", 1)[1].split())
    return {"model": model, "cores": os.cpu_count(),
            "flags": {f: f in flags for f in CPU_FLAGS}}


def cpu_features(cpu: dict) -> str:
    """The features of CPU_FLAGS a cpu_description() has, comma-separated:
    what a report names beside the model."""
    return ", ".join(f for f, on in cpu["flags"].items() if on)


def git_revisions() -> dict:
    def sh(*cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout.strip()
        except OSError:
            return ""
    revs = {"HEAD": sh("git", "rev-parse", "--short", "HEAD"),
            "branch": sh("git", "rev-parse", "--abbrev-ref", "HEAD"),
            "src_dirty": bool(sh("git", "status", "--porcelain", "src", "bench"))}
    for b in ("threads", "i8avx2"):  # the branches issue 15 is built on, if merged
        tip = sh("git", "rev-parse", "--short", "--verify", "-q", b)
        if tip:
            merged = subprocess.run(["git", "merge-base", "--is-ancestor", b, "HEAD"],
                                    cwd=ROOT).returncode == 0
            revs[b] = f"{tip} ({'merged' if merged else 'NOT merged'})"
    return revs


# --- engines ----------------------------------------------------------------

class Server:
    """One engine process speaking the threads_bench command protocol."""

    def __init__(self, name: str, cmd: list, kind: str, precision: str, env: dict | None = None):
        self.name, self.kind, self.precision = name, kind, precision
        self.model = Path(cmd[1]) if len(cmd) > 1 else None
        self.proc = subprocess.Popen([str(c) for c in cmd], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                     env=dict(os.environ, **(env or {})))
        hello = self._read()
        if not hello.get("ready"):
            raise RuntimeError(f"{name}: did not start: {hello}")
        self.load_s = hello["load_s"]
        self.info = self.ask("info")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name}: the engine process ended "
                               f"(exit {self.proc.wait()}); see its stderr above")
        return json.loads(line)

    def ask(self, line: str) -> dict:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
            self.proc.wait(timeout=60)


def build_colibri(work: Path) -> dict:
    """{"vnni": program, "novnni": program, "have_threads": bool}: the thread
    driver linked against the host library as the x86_64 target builds it
    (file read, not mapped), and against the same with VNNI disabled."""
    from colibri.buildsteps import cbuild
    header = (ROOT / "src" / "include" / "colibri.h").read_text()
    have_threads = "colibri_set_threads" in header and "COLIBRI_LOGITS_LAST" in header
    extra = ["-DBENCH_HAVE_THREADS"] if have_threads else []
    kernels = cbuild.host_kernels()
    out = {"have_threads": have_threads}
    for flavour, defines in (("vnni", ()), ("novnni", ("COLIBRI_AVX2_NO_VNNI",))):
        lib = cbuild.build(work / f"lib-threads-{flavour}", kernels=kernels, mmap=False,
                           cli=False, defines=defines)
        out[flavour] = cbuild.build_program(lib, [ROOT / "bench" / "c" / "threads_bench.c"],
                                            work / f"threads_bench_{flavour}",
                                            extra_cflags=extra)
    return out


def build_bandwidth(work: Path) -> Path:
    """bench/c/bandwidth.c, the read-bandwidth probe (issue 28)."""
    out = work / "bandwidth"
    src = ROOT / "bench" / "c" / "bandwidth.c"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["gcc", "-std=c11", "-O2", "-pthread", str(src), "-o", str(out)],
                       check=True)
    return out


BW_MIB = 512  # per thread: far past any L3 of the machines we run on
# The pairing probe: 2-core / 1-core read bandwidth, median of PAIR_PASSES passes
# over PAIR_MIB a thread. On the Zen 5 VM (FINDINGS.md 35) it read 0.96-1.34
# while two one-thread q4 decodes at once each took 6.1-6.5 ms a token (3.5
# alone), and 1.77-2.22 while they took 3.4-3.8; PAIRED_MIN splits the two.
PAIR_MIB, PAIR_PASSES, PAIRED_MIN = 128, 3, 1.4


def run_bandwidth(probe: Path) -> dict:
    """{threads: GB/s} read bandwidth from 1 and N (= max THREADS) cores."""
    out = {}
    for t in sorted({1, max(THREADS)}):
        r = subprocess.run([str(probe), str(BW_MIB // t), "4", str(t)], capture_output=True,
                           text=True)
        out[str(t)] = json.loads(r.stdout).get("read_gb_s") if r.returncode == 0 else None
    return out


def run_pairing(probe: Path) -> float | None:
    """2-core over 1-core read bandwidth now (PAIR_MIB a thread, the median of
    PAIR_PASSES passes): near 2 when both vCPUs stream at full speed at once,
    near 1 when they share one's worth of bandwidth. None if the probe fails."""
    gb = {}
    for t in (1, 2):
        r = subprocess.run([str(probe), str(PAIR_MIB), str(PAIR_PASSES), str(t)],
                           capture_output=True, text=True)
        passes = json.loads(r.stdout).get("passes_gb_s") if r.returncode == 0 else None
        if not passes:  # failed, or {"error": "no AVX2"}
            return None
        gb[t] = float(np.median(passes))
    return gb[2] / gb[1] if gb[1] else None


def bracketed(probe: Path, run) -> tuple:
    """run() between two pairing probes: (its result, [pairing before, after])."""
    before = run_pairing(probe)
    out = run()
    return out, [before, run_pairing(probe)]


def paired(pairing) -> bool | None:
    """Both probes around a 2-thread figure at PAIRED_MIN or more (None: not
    probed)."""
    if not pairing or any(p is None for p in pairing):
        return None
    return min(pairing) >= PAIRED_MIN


def decode_bytes_colibri(path: Path) -> int:
    """Weight bytes one decode token reads from a .colibri file: every tensor
    section but the embedding (one row of it), the experts' at top_k /
    num_experts (the routed share, on average over tokens); not the
    tokenizer section a GGUF import carries."""
    from colibri.file import format as cformat
    f = cformat.read_file(path, check_crc=False)
    k, e = f.shape.top_k, f.shape.n_experts
    total = 0.0
    for en in f.entries:
        if en.kind not in set(cformat.Kind):  # an optional section: the tokenizer
            continue
        name = cformat.Kind(en.kind).name
        if name == "EMBED":
            total += en.size / max(en.rows, 1)
        elif name.startswith("EXPERT_"):
            total += en.size * k / e
        else:
            total += en.size
    return int(total)


def decode_bytes_gguf(path: Path) -> int | None:
    """The same for a GGUF file (gguf-py): token_embd one row, *_exps tensors
    at expert_used_count / expert_count."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return None
    r = GGUFReader(str(path))
    def field(suffix):
        for name, f in r.fields.items():
            if name.endswith(suffix):
                return int(f.parts[f.data[0]][0])
        return None
    k, e = field(".expert_used_count"), field(".expert_count")
    total = 0.0
    for t in r.tensors:
        if t.name == "token_embd.weight":
            total += t.n_bytes / max(int(t.shape[-1]), 1)
        elif "_exps" in t.name and k and e:
            total += t.n_bytes * k / e
        else:
            total += t.n_bytes
    return int(total)


def _q4_sources_digest() -> str:
    """The code a q4 file depends on (the 4-bit quantisers are still changing):
    a new digest re-makes the cached q4 .colibri file."""
    import hashlib
    h = hashlib.sha256()
    for rel in ("colibri/file/kquants.py", "colibri/file/blocks.py", "colibri/file/format.py",
                "colibri/model/convert.py", "colibri/model/export.py", "colibri/file/quant.py"):
        p = ROOT / rel
        h.update(p.read_bytes() if p.exists() else b"")
    return h.hexdigest()[:16]


def prepare_q4(ms: models.ModelSet, with_gguf: bool) -> dict:
    """The 4-bit files of model set ms, next to its other artefacts:
    {"colibri": model-q4.colibri, "q4_k_m": .gguf, "q4_0": .gguf} (GGUF ones
    only when llama-quantize is built and the f32 GGUF exists). The GGUF files
    are llama-quantize's of the f32 GGUF (default options)."""
    from colibri import cli
    out = {"colibri": ms.dir / "model-q4.colibri"}
    stamp = ms.dir / ".q4-done"
    digest = _q4_sources_digest()
    if not (out["colibri"].exists() and stamp.exists() and stamp.read_text() == digest):
        log(f"  colibri convert --quant q4 -> {out['colibri'].name}")
        rc = cli.main(["convert", str(ms.hf), "-o", str(out["colibri"]), "--quant", "q4",
                       "--max-seq-len", str(models.MAX_SEQ_LEN), "-q"])
        if rc:
            raise RuntimeError(f"colibri convert --quant q4 failed ({rc})")
        stamp.write_text(digest)
    if with_gguf and LLAMA_QUANTIZE.exists() and ms.gguf["f32"].exists():
        for q in Q4_PEERS:
            path = ms.dir / f"model-{q}.gguf"
            if not path.exists():
                log(f"  llama-quantize {q.upper()} -> {path.name}")
                tmp = path.with_suffix(".part")
                r = subprocess.run(["nice", "-n", "10", str(LLAMA_QUANTIZE), str(ms.gguf["f32"]),
                                    str(tmp), q.upper(), str(os.cpu_count() or 1)],
                                   capture_output=True, text=True, errors="replace")
                if r.returncode:
                    raise RuntimeError(f"llama-quantize {q}: {(r.stderr or r.stdout)[-1500:]}")
                tmp.rename(path)
            out[q] = path
            out[f"{q} gguf"] = import_gguf(path)
    elif with_gguf:
        log(f"no {LLAMA_QUANTIZE} (scripts/build_llama_bench.sh builds it): no Q4 llama rows")
    return out


def import_gguf(gguf: Path) -> Path:
    """`colibri convert FILE.gguf` with the file's own types kept (docs/GGUF.md):
    the very blocks llama-bench runs, so Colibri and llama.cpp meet at equal
    bits exactly. Re-made when the GGUF or the converter is newer."""
    from colibri import cli
    out = gguf.with_name(gguf.stem + "-gguf.colibri")
    code = ROOT / "colibri" / "model" / "convert_gguf.py"
    if out.exists() and out.stat().st_mtime > max(gguf.stat().st_mtime, code.stat().st_mtime):
        return out
    log(f"  colibri convert {gguf.name} -> {out.name}")
    rc = cli.main(["convert", str(gguf), "-o", str(out), "--max-seq-len",
                   str(models.MAX_SEQ_LEN), "-q"])
    if rc:
        raise RuntimeError(f"colibri convert {gguf.name} failed ({rc})")
    return out


def start_servers(ms: models.ModelSet, tokens: Path, progs: dict, with_llama: bool,
                  precisions=PRECISIONS, q4: dict | None = None,
                  q8_gguf: Path | None = None) -> list:
    servers = []
    if "f32" in precisions:
        servers.append(Server("colibri f32", [progs["vnni"], ms.colibri["f32"], tokens],
                              "colibri", "f32"))
    if "int8" in precisions:
        servers += [
            Server("colibri int8", [progs["vnni"], ms.colibri["int8"], tokens], "colibri", "int8"),
            Server("colibri int8 vnni=0", [progs["novnni"], ms.colibri["int8"], tokens],
                   "colibri", "int8"),
        ]
        if q8_gguf:  # llama.cpp's own Q8_0 file, imported: Q8_0 blocks, its 8.5 bits
            servers.append(Server("colibri q8_0 gguf", [progs["vnni"], q8_gguf, tokens],
                                  "colibri", "int8"))
    if "q4" in precisions and q4:
        servers.append(Server("colibri q4", [progs["vnni"], q4["colibri"], tokens],
                              "colibri", "q4"))
        for name, path in q4.items():  # "q4_k_m gguf": llama.cpp's own file, imported
            if name.endswith(" gguf"):
                servers.append(Server(f"colibri {name}", [progs["vnni"], path, tokens],
                                      "colibri", "q4"))
    # On an AVX-512 VNNI CPU the default table is avx512-vnni: the AVX2 VNNI
    # table beside it (COLIBRI_KERNELS forces it) shows what the 512-bit forms add.
    if "int8" in precisions and cpu_description()["flags"].get("avx512_vnni"):
        servers.append(Server("colibri int8 avx2-vnni",
                              [progs["vnni"], ms.colibri["int8"], tokens], "colibri", "int8",
                              env={"COLIBRI_KERNELS": "avx2-vnni"}))
    if "q4" in precisions and q4 and cpu_description()["flags"].get("avx512_vnni"):
        servers.append(Server("colibri q4 avx2-vnni", [progs["vnni"], q4["colibri"], tokens],
                              "colibri", "q4", env={"COLIBRI_KERNELS": "avx2-vnni"}))
    if with_llama and all(p.exists() for p in ms.gguf.values()):
        for q, prec in (("f32", "f32"), ("q8_0", "int8")):
            if prec in precisions:
                servers.append(Server(f"llama-cpp-python {q}",
                                      [PY, "-m", "bench.threads_peer", ms.gguf[q], tokens],
                                      "llama-cpp-python", q))
    return servers


def run_server_round(s: Server, plan: dict, n_threads: int) -> dict:
    """One round of one engine at n_threads: {metric: {"wall_s", "cpu_s"}}."""
    r = s.ask(f"threads {n_threads} 0")
    if "error" in r:
        return {"error": r["error"]}
    s.ask(f"prefill all {min(8, plan['n_prefill'])} 1")  # wake the workers, untimed
    out = {}
    for mode in ("last", "all"):
        r = s.ask(f"prefill {mode} {plan['n_prefill']} {plan['reps']}")
        out[f"prefill_{mode}"] = r
    out["decode"] = s.ask(f"decode {plan['n_prompt']} {plan['steps']}")
    return out


def run_llama_bench(flavour: str, gguf: Path, plan: dict, threads=THREADS) -> dict:
    """One llama-bench invocation (at `threads`): its JSON, plus the whole
    process's CPU and wall seconds (it loads the model and warms up inside,
    so only the ratio CPU/wall is meaningful from those)."""
    binary = LLAMA_BENCH[flavour]
    cmd = [str(binary), "-m", str(gguf), *plan["lb_args"],
           "-t", ",".join(map(str, threads)), "-o", "json"]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    wall = time.perf_counter() - w0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout)[-1500:]}
    rows = json.loads(proc.stdout)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {"rows": rows, "process_wall_s": wall, "process_cpu_s": cpu}


def run_llama_bench_paired(flavour: str, gguf: Path, plan: dict, probe: Path) -> tuple:
    """llama-bench at 1 thread, then at the others between two pairing
    probes: (its results as one invocation's, [pairing before, after])."""
    one = run_llama_bench(flavour, gguf, plan, (1,))
    more, pairing = bracketed(
        probe, lambda: run_llama_bench(flavour, gguf, plan, tuple(t for t in THREADS if t > 1)))
    for r in (one, more):
        if "error" in r:
            return r, pairing
    return {"rows": one["rows"] + more["rows"],
            "process_wall_s": one["process_wall_s"] + more["process_wall_s"],
            "process_cpu_s": one["process_cpu_s"] + more["process_cpu_s"]}, pairing


# --- summaries ----------------------------------------------------------------

def _median(v):
    return float(np.median(v)) if len(v) else None


def summarise(rounds: list, plan: dict) -> dict:
    """{engine: {threads: {metric: {tok_s, tok_s_cpu, per_round...}}}} from
    the rounds' raw answers: per round the median of its repetitions, then
    the median over rounds; tokens/s = tokens of the figure / time."""
    table: dict = {}
    for rnd in rounds:
        pairing = rnd.get("pairing", {})
        for name, per_t in rnd["servers"].items():
            for t, res in per_t.items():
                cell = table.setdefault(name, {}).setdefault(str(t), {})
                if "error" in res:
                    cell["error"] = res["error"]
                    continue
                for m in METRICS:
                    r = res[m]
                    if "error" in r:
                        cell.setdefault(m, {})["error"] = r["error"]
                        continue
                    n = plan["n_prefill"] if m != "decode" else 1
                    c = cell.setdefault(m, {"rounds_tok_s": [], "rounds_tok_s_cpu": [],
                                            "rounds_paired": []})
                    c["rounds_tok_s"].append(n / _median(r["wall_s"]))
                    c["rounds_tok_s_cpu"].append(n / _median(r["cpu_s"]))
                    c["rounds_paired"].append(paired(pairing.get(name)) if int(t) > 1 else None)
        for name, res in rnd["llama_bench"].items():
            if "error" in res:
                table.setdefault(name, {})["error"] = res["error"]
                continue
            for row in res["rows"]:
                m = "prefill_last" if row["n_prompt"] else "decode"
                cell = table.setdefault(name, {}).setdefault(str(row["n_threads"]), {})
                c = cell.setdefault(m, {"rounds_tok_s": [], "rounds_tok_s_cpu": [],
                                        "rounds_paired": []})
                c["rounds_tok_s"].append(row["avg_ts"])
                c["rounds_paired"].append(paired(pairing.get(name))
                                          if row["n_threads"] > 1 else None)
            table[name].setdefault("process_cpu_per_wall", []).append(
                res["process_cpu_s"] / res["process_wall_s"])
    for name, per_t in table.items():
        for t, cell in per_t.items():
            if not isinstance(cell, dict):
                continue
            for m, c in cell.items():
                if isinstance(c, dict) and "rounds_tok_s" in c:
                    c["tok_s"] = _median(c["rounds_tok_s"])
                    c["tok_s_cpu"] = _median(c["rounds_tok_s_cpu"])
                    both = [x for x, p in zip(c["rounds_tok_s"], c.get("rounds_paired", []))
                            if p]
                    c["tok_s_paired"] = _median(both)
    return table


def fig(table, engine, t, metric, cpu=False, paired_only=False):
    c = table.get(engine, {}).get(str(t), {})
    c = c.get(metric) if isinstance(c, dict) else None
    return (c or {}).get("tok_s_paired" if paired_only else "tok_s_cpu" if cpu else "tok_s")


def ratios(table: dict) -> list:
    """[(label, threads, metric, ratio wall, ratio cpu, goal)] of issue 15's goals."""
    pairs = [  # (ours, peer) at equal threads
        ("colibri f32", "llama-cpp-python f32"),
        ("colibri f32", "llama-bench native f32"),
        ("colibri int8", "llama-cpp-python q8_0"),
        ("colibri int8", "llama-bench native q8_0"),
        ("colibri int8 vnni=0", "llama-bench avx2 q8_0"),
        ("colibri int8 vnni=0", "llama-cpp-python q8_0"),
        ("colibri f32", "llama-bench avx2 f32"),
        ("colibri int8", "colibri int8 avx2-vnni"),
        ("colibri q4", "llama-bench native q4_k_m"),
        ("colibri q4", "llama-bench native q4_0"),
        ("colibri q4", "colibri q4 avx2-vnni"),
    ]
    pairs += [(name, f"llama-bench native {name.split()[1]}") for name in table
              if name.startswith("colibri ") and name.endswith(" gguf")]
    out = []
    for ours, peer in pairs:
        for t in THREADS:
            for m in METRICS:
                a, b = fig(table, ours, t, m), fig(table, peer, t, m)
                if a is None or b is None:
                    continue
                ac, bc = fig(table, ours, t, m, True), fig(table, peer, t, m, True)
                out.append((f"{ours} / {peer}", t, m, a / b,
                            ac / bc if ac and bc else None, GOAL_VS_PEER))
                if t > 1:  # the rounds in which both cores streamed, for both
                    ap, bp = (fig(table, e, t, m, paired_only=True) for e in (ours, peer))
                    if ap and bp:
                        out.append((f"{ours} / {peer}, both cores streaming", t, m, ap / bp,
                                    None, GOAL_VS_PEER))
    for eng in list(table):
        for m in METRICS:
            a, b = fig(table, eng, 2, m), fig(table, eng, 1, m)
            if a is None or b is None:
                continue
            ac, bc = fig(table, eng, 2, m, True), fig(table, eng, 1, m, True)
            goal = (GOAL_DECODE_SCALING if m == "decode" else GOAL_PREFILL_SCALING) \
                if eng.startswith("colibri") else None
            out.append((f"{eng}: 2 threads / 1 thread", "2/1", m, a / b,
                        ac / bc if ac and bc else None, goal))
    return out


def consistency(rounds: list) -> dict:
    """Same model, same answers? Per engine (first round): decode tokens equal
    at 1 and 2 threads (Colibri promises bit-identical logits whatever the
    thread count: seen from the outside), prefill with last-only and with all
    logits give the same next token, and the greedy tokens at 1 thread equal
    those of Colibri at the same precision (f32: colibri f32; int8/q8_0:
    colibri int8; the vnni=0 build must agree with the VNNI one exactly)."""
    out = {}
    first = rounds[0]["servers"]

    def toks(name, t):
        r = first.get(name, {}).get(t, {})
        return r.get("decode", {}).get("tokens") if isinstance(r, dict) else None

    for name, per_t in first.items():
        tk = {t: toks(name, t) for t in per_t}
        pl = [(r.get("prefill_last", {}).get("argmax"), r.get("prefill_all", {}).get("argmax"))
              for r in per_t.values() if isinstance(r, dict)]
        out[name] = {
            "decode_tokens_equal_across_threads":
                len({tuple(v) for v in tk.values() if v}) == 1 if all(tk.values()) else None,
            "prefill_last_argmax_equals_all":
                all(x == y for x, y in pl) if all(None not in p for p in pl) else None,
        }
        if name.endswith(" gguf"):  # no other engine runs its values
            continue
        base = ("colibri f32" if name.endswith("f32") else
                "colibri q4" if " q4" in name else "colibri int8")
        b = toks(base, 1)
        out[name][f"greedy_equal_to_{base.replace(' ', '_')}"] = \
            (tk.get(1) == b) if (b and tk.get(1) and name != base) else None
    return out


# --- report -----------------------------------------------------------------

def _f(x, nd=1):
    return "—" if x is None else f"{x:.{nd}f}"


def markdown(res: dict) -> str:
    env, plan, table = res["env"], res["plan"], res["table"]
    cpu = env["cpu"]
    flags = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in cpu["flags"].items())
    L = [f"# Thread benchmark ({res['mode']}: {plan['model']} model)", "",
         f"{env['date_utc']} UTC · `{res['command']}` · {res['wall_s'] / 60:.1f} min",
         "",
         f"- CPU: {cpu['model']}, {cpu['cores']} cores; {flags}",
         f"- git: " + ", ".join(f"{k} {v}" for k, v in env["git"].items()),
         f"- Colibri kernels: " + ", ".join(f"{k}: {v}" for k, v in res["kernels"].items()),
         f"- llama-cpp-python {env['llama_cpp_python']} (pip build of scripts/bench.sh); "
         f"llama-bench from the same llama.cpp sources: " + ", ".join(
             f"{k}: {v}" for k, v in res.get("llama_bench_build", {}).items()),
         f"- load average start/end: {env['loadavg_start']} / {env.get('loadavg_end')}",
         f"- prefill {plan['n_prefill']} tokens ({plan['reps']} per round); decode "
         f"{plan['steps']} steps after a {plan['n_prompt']}-token prompt; llama-bench "
         f"`{' '.join(plan['lb_args'])} -t 1,2`; {plan['rounds']} interleaved rounds, "
         f"median of the rounds' medians",
         "",
         "tokens/s from wall time; in brackets from process CPU time, which with 2 threads "
         "is the sum over both threads including the time a worker spins or waits for "
         "work: a 2-thread CPU figure equal to the 1-thread one means no idle or "
         "synchronisation cost, the shortfall below it is that cost. llama-bench reports "
         "wall time only.", "",
         "| engine | threads | prefill, last logits | prefill, all logits | decode |",
         "|---|---:|---:|---:|---:|"]
    for eng, per_t in table.items():
        for t in THREADS:
            cell = per_t.get(str(t))
            if not isinstance(cell, dict):
                continue
            if "error" in cell and not any(m in cell for m in METRICS):
                L.append(f"| {eng} | {t} | {cell['error'][:60]} | | |")
                continue
            cols = []
            for m in METRICS:
                w, c = fig(table, eng, t, m), fig(table, eng, t, m, True)
                cols.append("n/a" if w is None else
                            f"{_f(w)}" + (f" ({_f(c)})" if c else ""))
            L.append(f"| {eng} | {t} | " + " | ".join(cols) + " |")
    L += ["", "## Ratios (issue 15's goals)", "",
          "| ratio | threads | figure | wall | CPU | goal | met |", "|---|---:|---|---:|---:|---:|---|"]
    for label, t, m, rw, rc, goal in res["ratios"]:
        met = "" if goal is None else ("yes" if rw >= goal else "**no**")
        L.append(f"| {label} | {t} | {m.replace('_', ' ')} | {_f(rw, 2)} | {_f(rc, 2)} | "
                 f"{'' if goal is None else f'≥ {goal}'} | {met} |")
    pairing = [rnd.get("pairing", {}) for rnd in res.get("rounds", [])]
    if any(pairing):
        L += ["", "## Two threads and the host", "",
              "Pairing probe (2-core / 1-core read bandwidth, bench/c/bandwidth.c, "
              f"{PAIR_MIB} MiB a thread, median of {PAIR_PASSES} passes) before / after each "
              f"engine's 2-thread figures; a round counts for an engine when both reach "
              f"{PAIRED_MIN} (both cores streaming at full speed). The ratios above marked "
              "\"both cores streaming\" take only those rounds, for both engines.", "",
              "| engine | " + " | ".join(f"round {i + 1}" for i in range(len(pairing))) + " |",
              "|---|" + "---:|" * len(pairing)]
        for eng in table:
            cells = []
            for p in pairing:
                v = p.get(eng)
                cells.append("—" if not v else " / ".join(_f(x, 2) for x in v)
                             + (" ✓" if paired(v) else ""))
            if any(c != "—" for c in cells):
                L.append(f"| {eng} | " + " | ".join(cells) + " |")
    bw = res.get("bandwidth_gb_s")
    if bw:
        L += ["", "## Decode against the memory's read bandwidth (issue 28)", "",
              "Read bandwidth (bench/c/bandwidth.c, 4-stream AVX2 loads, best of 4 passes "
              "each round, in the same run as the engines): " + "; ".join(
                  f"{t} core{'s' if t != '1' else ''}: median {_f(v['median'])} GB/s "
                  f"(rounds: {', '.join(_f(x) for x in v['rounds'])})" for t, v in bw.items()),
              "", "Bytes a token: the weights a decode step reads (the file's tensor sizes, "
              "experts at top_k / num_experts, one embedding row). Fraction: decode tokens/s "
              "x bytes a token / the bandwidth of as many cores as threads.", "",
              "| engine | MB a token | threads | decode tok/s | GB/s | fraction of bandwidth |",
              "|---|---:|---:|---:|---:|---:|"]
        for eng, nbytes in res.get("decode_bytes_per_token", {}).items():
            if not nbytes:
                continue
            for t in THREADS:
                d = fig(table, eng, t, "decode")
                b = (bw.get(str(t)) or {}).get("median")
                if d is None:
                    continue
                gbs = d * nbytes / 1e9
                L.append(f"| {eng} | {nbytes / 1e6:.0f} | {t} | {_f(d)} | {_f(gbs)} | "
                         f"{_f(100 * gbs / b, 0) + ' %' if b else '—'} |")
    L += ["", "## Consistency", ""]
    for eng, c in res["consistency"].items():
        L.append(f"- {eng}: " + ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in c.items()))
    lbcpu = {k: v.get("process_cpu_per_wall") for k, v in table.items()
             if k.startswith("llama-bench") and isinstance(v, dict)}
    if lbcpu:
        L += ["", "llama-bench process CPU / wall per invocation (load and warm-up "
              "included): " + "; ".join(f"{k}: " + ", ".join(f"{x:.2f}" for x in v)
                                         for k, v in lbcpu.items() if v)]
    return "\n".join(L) + "\n"


# --- main -------------------------------------------------------------------

def main(argv=None) -> int:
    global Q4_PEERS
    ap = argparse.ArgumentParser(prog="bench/threads.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny model, few steps")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 3)")
    ap.add_argument("--out", type=Path, help="results directory (default bench/results, "
                                             "or build/bench/threads-quick with --quick)")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "bench",
                    help="generated models and builds (cached between runs)")
    ap.add_argument("--no-llama", action="store_true", help="Colibri rows only")
    ap.add_argument("--precisions", default=",".join(PRECISIONS),
                    help="comma-separated subset of f32,int8,q4: the Colibri files that run, "
                         "with their peers (f32: llama.cpp f32; int8: Q8_0; q4: llama-bench "
                         "native Q4_K_M and Q4_0); default all")
    ap.add_argument("--q4-peers", default=",".join(Q4_PEERS),
                    help="llama-quantize types run as the peers of colibri q4 (default "
                         "q4_k_m,q4_0)")
    ap.add_argument("--report-only", action="store_true",
                    help="measure nothing: rewrite threads.md from threads.json")
    a = ap.parse_args(argv)
    if a.report_only:
        d = a.out or ROOT / "bench" / "results"
        (d / "threads.md").write_text(markdown(json.loads((d / "threads.json").read_text())))
        log(f"rewrote {d}/threads.md from threads.json")
        return 0
    t_start = time.perf_counter()
    mode = "quick" if a.quick else "full"
    plan = dict(PLANS[mode])
    if a.rounds:
        plan["rounds"] = a.rounds
    out_dir = a.out or (ROOT / "build" / "bench" / "threads-quick" if a.quick
                        else ROOT / "bench" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    a.work.mkdir(parents=True, exist_ok=True)

    with_llama = not a.no_llama
    if with_llama:
        try:
            import llama_cpp
            llama_version = llama_cpp.__version__
        except ImportError:
            log("llama-cpp-python is not installed (scripts/bench.sh installs it): "
                "no llama-cpp-python rows")
            with_llama, llama_version = False, None
    else:
        llama_version = None
    lb = {k: p for k, p in LLAMA_BENCH.items() if p.exists()} if not a.no_llama else {}
    for k in set(LLAMA_BENCH) - set(lb):
        if not a.no_llama:
            log(f"no {LLAMA_BENCH[k]} (scripts/build_llama_bench.sh builds it): "
                f"no llama-bench {k} rows")

    env = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
           "cpu": cpu_description(), "git": git_revisions(), "python": platform.python_version(),
           "llama_cpp_python": llama_version, "loadavg_start": os.getloadavg()}
    log(f"CPU: {env['cpu']['model']}; " + " ".join(k for k, v in env["cpu"]["flags"].items() if v))
    log("building the Colibri thread driver (VNNI on and vnni=0)")
    progs = build_colibri(a.work)
    if not progs["have_threads"]:
        log("colibri.h has no colibri_set_threads/COLIBRI_LOGITS_LAST yet: Colibri rows "
            "at 1 thread, all-logits prefill only")
    import importlib.util
    have_gguf = importlib.util.find_spec("gguf") is not None
    ms = models.prepare(plan["model"], a.work / "models", log=log, with_gguf=have_gguf)
    tokens = token_file(a.work / f"tokens-threads-{plan['model']}.txt", ms.config()["vocab_size"])
    precisions = tuple(p for p in a.precisions.split(",") if p)
    for p in precisions:
        if p not in PRECISIONS:
            ap.error(f"--precisions: unknown {p!r} (f32, int8, q4)")
    Q4_PEERS = tuple(q for q in a.q4_peers.split(",") if q)
    q4 = prepare_q4(ms, have_gguf and not a.no_llama) if "q4" in precisions else None
    lb_files = {q: ms.gguf[q] for q, prec in (("f32", "f32"), ("q8_0", "int8"))
                if prec in precisions and ms.gguf[q].exists()}
    lb_q4 = {q: q4[q] for q in Q4_PEERS if q4 and q in q4}
    q8_gguf = (import_gguf(ms.gguf["q8_0"]) if "int8" in precisions and have_gguf
               and ms.gguf["q8_0"].exists() else None)

    probe = build_bandwidth(a.work)
    log("loading the engines")
    servers = start_servers(ms, tokens, progs, with_llama, precisions, q4, q8_gguf)
    kernels = {s.name: s.info.get("kernels") for s in servers if s.kind == "colibri"}
    rounds = []
    try:
        for r in range(plan["rounds"]):
            rnd = {"servers": {}, "llama_bench": {}}
            log(f"round {r + 1}/{plan['rounds']}: read bandwidth probe")
            rnd["bandwidth_gb_s"] = run_bandwidth(probe)
            rnd["pairing"] = {}
            for s in servers:
                log(f"round {r + 1}/{plan['rounds']}: {s.name}")
                per = {1: run_server_round(s, plan, 1)}
                for t in THREADS[1:]:
                    per[t], rnd["pairing"][s.name] = bracketed(
                        probe, lambda t=t: run_server_round(s, plan, t))
                rnd["servers"][s.name] = per
            for flavour in lb:
                files = dict(lb_files, **(lb_q4 if flavour == "native" else {}))
                for q, path in files.items():
                    name = f"llama-bench {flavour} {q}"
                    log(f"round {r + 1}/{plan['rounds']}: {name}")
                    rnd["llama_bench"][name], rnd["pairing"][name] = run_llama_bench_paired(
                        flavour, path, plan, probe)
            rounds.append(rnd)
    finally:
        for s in servers:
            s.close()

    table = summarise(rounds, plan)
    lb_build = {}
    for name, res in rounds[0]["llama_bench"].items():
        if res.get("rows"):
            row = res["rows"][0]
            lb_build[name.split()[1]] = (f"build {row.get('build_commit')} "
                                         f"({row.get('build_number')}), {row.get('backends')}")
    env["loadavg_end"] = os.getloadavg()
    bw_rounds = {t: [rnd["bandwidth_gb_s"].get(t) for rnd in rounds] for t in rounds[0]["bandwidth_gb_s"]}
    bandwidth = {t: {"rounds": v, "median": _median([x for x in v if x])} for t, v in bw_rounds.items()}
    bytes_tok = {s.name: decode_bytes_colibri(s.model) for s in servers
                 if s.kind == "colibri" and s.model}
    for name, path in {**{f"llama-bench {f} {q}": p for f in lb for q, p in lb_files.items()},
                       **{f"llama-bench native {q}": p for q, p in lb_q4.items()}}.items():
        bytes_tok[name] = decode_bytes_gguf(path)
    res = {"mode": mode, "plan": plan, "env": env, "kernels": kernels,
           "threads_api": progs["have_threads"], "llama_bench_build": lb_build,
           "command": "scripts/bench.sh --threads" + (" --quick" if a.quick else "")
                      + (f" --precisions {a.precisions}" if precisions != PRECISIONS else "")
                      + (f" --rounds {a.rounds}" if a.rounds else ""),
           "precisions": precisions,
           "table": table, "ratios": ratios(table), "consistency": consistency(rounds),
           "bandwidth_gb_s": bandwidth, "decode_bytes_per_token": bytes_tok,
           "load_s": {s.name: s.load_s for s in servers}, "rounds": rounds,
           "wall_s": time.perf_counter() - t_start}
    (out_dir / "threads.json").write_text(json.dumps(res, indent=1) + "\n")
    md = markdown(res)
    (out_dir / "threads.md").write_text(md)
    print(md)
    log(f"wrote {out_dir}/threads.json and threads.md in {res['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
