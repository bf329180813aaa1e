"""The measurements of the suite, one function each; bench/run.py calls them
in order and collects their dicts into the results JSON.

Single thread everywhere: OMP/OPENBLAS/MKL threads are set to 1 before numpy
is imported (here and in every peer process), torch uses 1 thread, llama.cpp
n_threads = n_threads_batch = 1, Colibri is single-threaded by design.
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import glob
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from colibri.file import format as cfmt
from colibri.file.format import DType, Kind

from .cdrivers import ROOT, run_json

PY = sys.executable


def stats(xs) -> dict:
    """Summary of a list of seconds (or counts)."""
    a = np.asarray(xs, dtype=np.float64)
    if a.size == 0:
        return {"n": 0}
    return {"n": int(a.size), "mean": float(a.mean()), "median": float(np.median(a)),
            "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "min": float(a.min()), "max": float(a.max()), "std": float(a.std())}


def token_file(path: Path, vocab: int, n: int = 512, seed: int = 1) -> Path:
    """n token ids in [3, vocab) (0-2 are the GGUF vocabulary's specials)."""
    rng = np.random.default_rng(seed)
    path.write_text(" ".join(str(t) for t in rng.integers(3, vocab, n)) + "\n")
    return path


def speed_summary(raw: dict, n_prefill: int) -> dict:
    """tokens/s from a speed JSON: prefill = n_prefill / median of the timed
    repetitions (the first, which pays page faults and caches, dropped when
    there are others), decode = 1 / median step time; each from wall time
    and from process CPU time (the `_cpu` figures: what the engine costs
    when it has the core, on a machine shared with other work)."""
    out = dict(raw)
    for clock in ("", "_cpu"):
        pre = raw[f"prefill{clock}_s"]
        pre = pre[1:] if len(pre) > 1 else pre
        dec = raw[f"decode{clock}_s"]
        out[f"prefill{clock}"] = stats(pre)
        out[f"decode{clock}"] = stats(dec)
        out[f"prefill_tok_s{clock}"] = n_prefill / float(np.median(pre))
        out[f"decode_tok_s{clock}"] = 1.0 / float(np.median(dec)) if dec else None
    return out


def run_colibri_speed(drivers, model: Path, tokens: Path, n_prompt: int, n_prefill: int,
                      reps: int, budget: float, max_decode: int, program=None) -> dict:
    raw = run_json([program or drivers.bench, "speed", model, tokens, n_prompt, n_prefill,
                    reps + 1, budget, max_decode])
    return speed_summary(raw, n_prefill)


def run_peer(engine: str, model: Path, tokens: Path, n_prompt: int, n_prefill: int,
             reps: int, budget: float, max_decode: int, expect=None) -> dict:
    cmd = [PY, "-m", "bench.peers", engine, str(model), str(tokens), str(n_prompt),
           str(n_prefill), str(reps + 1), str(budget), str(max_decode)]
    if expect:
        cmd += ["--expect", ",".join(map(str, expect))]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout)[-2000:]}
    return speed_summary(json.loads(proc.stdout.strip().splitlines()[-1]), n_prefill)


# --- machine ceilings -------------------------------------------------------

def machine(drivers, quick: bool) -> dict:
    fma = run_json([drivers.machine, "fma", 1.0 if quick else 3.0])
    mem = run_json([drivers.machine, "mem", 256 if quick else 1024, 3 if quick else 5])
    return {**fma, **mem}


# --- bytes a decode step reads ------------------------------------------------

def decode_weight_bytes(path: Path) -> dict:
    """Weight bytes one decode token reads, from the tensor table: every
    non-expert tensor once (the embedding: one row), top_k of n_experts
    experts per layer (all experts have the same size)."""
    cf = cfmt.read_file(path, check_crc=False)
    try:
        s = cf.shape
        total = expert = 0
        for e in cf.entries:
            if e.kind == Kind.EMBED:
                total += e.size // s.vocab
            elif e.kind in (Kind.EXPERT_W1, Kind.EXPERT_W2, Kind.EXPERT_W3):
                expert += e.size
            else:
                total += e.size
        per_tok = total + expert * s.top_k // s.n_experts
        return {"bytes_per_token": per_tok, "expert_bytes_per_token": expert * s.top_k // s.n_experts,
                "file_bytes": path.stat().st_size}
    finally:
        cf.close()


# --- expert FFN at prefill ------------------------------------------------------

def ffn_routing(model: Path, tokens: list[int]) -> np.ndarray:
    """Experts [s, top_k] the numpy reference picks for each prefill token of
    the one-layer ffn model (the same routing Colibri computes)."""
    from colibri.model.reference import Reference
    ref = Reference(model)
    ref.forward(np.asarray(tokens)[None])
    return ref.routing()[0].experts[0]


def numpy_ffn_sgemm(model: Path, experts: np.ndarray, reps: int) -> dict:
    """numpy (OpenBLAS sgemm, 1 thread) on Colibri's expert shapes: per expert
    e with n_e routed tokens, X[n_e, D] @ W1^T, X @ W3^T ([n_e, I]) and
    A[n_e, I] @ W2^T ([n_e, D]); only the three matmuls are timed."""
    cf = cfmt.read_file(model, check_crc=False)
    s = cf.shape
    W = [[np.array(cf.tensor(k, 0, e).values, dtype=np.float32)
          for k in (Kind.EXPERT_W1, Kind.EXPERT_W3, Kind.EXPERT_W2)] for e in range(s.n_experts)]
    cf.close()
    counts = np.bincount(experts.reshape(-1), minlength=s.n_experts)
    rng = np.random.default_rng(0)
    X = [rng.standard_normal((int(n), s.hidden), dtype=np.float32) for n in counts]
    A = [rng.standard_normal((int(n), s.intermediate), dtype=np.float32) for n in counts]
    times, cpu = [], []
    for _ in range(reps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        for e in range(s.n_experts):
            if counts[e]:
                w1, w3, w2 = W[e]
                X[e] @ w1.T
                X[e] @ w3.T
                A[e] @ w2.T
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    flops = 6.0 * s.hidden * s.intermediate * int(counts.sum())
    return {"counts": counts.tolist(), "flops": flops, "times_s": times, "cpu_s": cpu,
            "openblas_core": openblas_core(),
            "gflops": flops / float(np.median(times[1:])) / 1e9,
            "gflops_cpu": flops / float(np.median(cpu[1:])) / 1e9}


def openblas_core() -> str | None:
    """The kernel set numpy's OpenBLAS picked at run time (DYNAMIC_ARCH), e.g.
    SkylakeX (AVX-512) or Haswell (AVX2): which ISA the sgemm figure used."""
    import ctypes
    libs = glob.glob(str(Path(np.__file__).parent.parent / "numpy.libs" / "*openblas*.so*"))
    for path in libs:
        lib = ctypes.CDLL(path)
        for name in ("scipy_openblas_get_corename64_", "openblas_get_corename64_",
                     "openblas_get_corename"):
            if hasattr(lib, name):
                f = getattr(lib, name)
                f.restype = ctypes.c_char_p
                return f().decode()
    return None


# --- latency and instruction counts ---------------------------------------------

def latency(drivers, model: Path, tokens: Path, n_prompt: int, steps: int, mode: str,
            control_bytes: int = 0) -> dict:
    """Per-step decode latency: wall-time statistics at the top level, the
    same from each step's CPU time under "cpu" (what the step cost while it
    held the core: preemption by other processes removed, their cache and
    memory-bandwidth interference not). With control_bytes, a read-only pass
    over that many bytes of a private buffer follows every decode step (same
    run, interleaved); its wall-time statistics are under "control": the
    spread the machine gives to a constant memory stream."""
    cmd = [drivers.bench, "latency", model, tokens, n_prompt, steps, mode]
    with tempfile.NamedTemporaryFile(suffix=".f64") as f:
        info = run_json(cmd + [f.name] + ([int(control_bytes)] if control_bytes else []))
        out = np.fromfile(f.name, dtype=np.float64)
    res = {**info, **_latency_stats(out[:steps]), "cpu": _latency_stats(out[steps:2 * steps])}
    if control_bytes:
        res["control"] = _latency_stats(out[2 * steps:3 * steps])
    return res


def _latency_stats(lat: np.ndarray) -> dict:
    st = stats(lat)
    st["std_pct_of_mean"] = 100 * st["std"] / st["mean"]
    # Robust spread too: on a shared machine a few preempted steps dominate std.
    q25, q75 = np.percentile(lat, [25, 75])
    st["iqr_pct_of_median"] = 100 * float(q75 - q25) / st["median"]
    st["steps_over_2x_median"] = int((lat > 2 * st["median"]).sum())
    # Without the slowest 1 % (preemptions by other processes on a shared
    # machine): shown beside, never instead of, the full figure.
    kept = lat[lat <= np.percentile(lat, 99)]
    st["std_pct_of_mean_without_slowest_1pct"] = 100 * float(kept.std() / kept.mean())
    # Step-to-step jitter: the std of successive differences / sqrt(2) (von
    # Neumann). Equal to std for independent steps; a slow drift of the
    # machine's speed (other tenants of the host) raises std but not this.
    if len(lat) > 1:
        st["successive_std_pct_of_mean"] = 100 * float(np.diff(lat).std() / np.sqrt(2) / lat.mean())
    return st


def instruction_counts(drivers, model: Path, tokens: Path, n_prompt: int, n_inputs: int) -> dict:
    """Instructions of one decode step (callgrind Ir) for n_inputs tokens."""
    if not drivers.callgrind:
        return {"error": "valgrind/callgrind.h not found"}
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={d}/cg.%p", str(drivers.bench), "icount", str(model),
             str(tokens), str(n_prompt), str(n_inputs)], capture_output=True, text=True)
        if proc.returncode != 0:
            return {"error": proc.stderr[-2000:]}
        counts = []
        for path in sorted(glob.glob(f"{d}/cg.*.*"), key=lambda p: int(p.rsplit(".", 1)[1])):
            m = re.search(r"^summary:\s*(\d+)", Path(path).read_text(), re.M)
            counts.append(int(m.group(1)))
        wall = time.perf_counter() - t0
    if len(counts) != n_inputs:
        return {"error": f"{len(counts)} callgrind dumps for {n_inputs} inputs"}
    c = np.asarray(counts)
    return {"inputs": n_inputs, "min": int(c.min()), "max": int(c.max()),
            "spread": int(c.max() - c.min()), "spread_pct": 100 * float(c.max() - c.min()) / c.min(),
            "distinct": int(len(set(counts))), "wall_s": wall}


# --- init, RSS, CRC -----------------------------------------------------------------

def init_modes(drivers, model: Path, reps: int) -> dict:
    """Each mode in a fresh process (peak RSS is per process)."""
    out = {}
    for name, prog, mode in (("mmap", drivers.bench_mmap, "path"), ("fread", drivers.bench, "path"),
                             ("memory", drivers.bench, "memory")):
        out[name] = run_json([prog, "init", model, mode, reps])
    return out


def crc(drivers, model: Path, reps: int) -> dict:
    return run_json([drivers.bench, "crc", model, reps])


# --- library size ------------------------------------------------------------------

def library_sizes(drivers_dir: Path) -> dict:
    """Per target, the runtime library's code/data/rodata from the size report
    (build/<target>/size.txt, written by `scons target=X size`), and the
    library this run benchmarked (measured with colibri.buildsteps.size)."""
    out = {}
    for t in ("x86_64", "armv7", "ppc", "cortex-m"):
        p = ROOT / "build" / t / "size.txt"
        if not p.exists():
            out[t] = {"error": f"{p.relative_to(ROOT)} missing: run scons target={t} size"}
            continue
        m = re.search(r"^libcolibri\.a: (.*)$", p.read_text(), re.M)
        if not m:
            out[t] = {"error": f"{p.relative_to(ROOT)}: no libcolibri.a line"}
            continue
        # "code 16152, data 116, rodata 3608" (kinds with 0 bytes are left out)
        kinds = {k: int(v) for k, v in re.findall(r"(\w+) (\d+)", m.group(1))}
        out[t] = {**kinds, "total": sum(kinds.values()),
                  "report": str(p.relative_to(ROOT)),
                  "report_time": time.strftime("%Y-%m-%d %H:%M", time.gmtime(p.stat().st_mtime))}
    try:
        from colibri.buildsteps.size import measure_runtime
        sizes, _ = measure_runtime(Path(drivers_dir) / "lib-mmap" / "libcolibri.a")
        out["benchmarked (x86_64, this run)"] = {**sizes, "total": sum(sizes.values())}
    except Exception as exc:  # the size tool is someone else's; report, do not fail
        out["benchmarked (x86_64, this run)"] = {"error": str(exc)}
    return out
