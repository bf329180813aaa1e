"""Colibri benchmark suite: every figure of issue 7, measured side by side in
one run. Usually started by scripts/bench.sh (which installs the bench-only
packages first):

    scripts/bench.sh             # full: tiny + small models  -> bench/results/
    scripts/bench.sh --quick     # tiny model, few steps      -> build/bench/quick/

Prints a table of figures and ratios, writes results.json, results.md and
results.png. No figure is asserted: these are measurements, not tests.
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import measure, models, report  # noqa: E402
from bench.cdrivers import Drivers  # noqa: E402

N_PROMPT = 16    # prompt before decode
N_PREFILL = 128  # prefill length
GREEDY_CHECK = 8  # decode steps of the llama.cpp-vs-transformers check

# Per model: (prefill repetitions timed, decode budget in seconds per engine,
# max decode steps, latency steps f32/int8 with the position cycling and at a
# fixed position (each fixed step followed by a control step), callgrind
# inputs f32/int8).
PLANS = {
    "quick": {"tiny": dict(reps=3, ref_reps=3, budget=0.5, max_decode=64, lat=(1000, 1000),
                           lat_fixed=(1000, 1000), icount=(20, 20))},
    "full": {
        "tiny": dict(reps=5, ref_reps=5, budget=2.0, max_decode=400, lat=(10000, 10000),
                     lat_fixed=(10000, 10000), icount=(100, 100)),
        # A small-model decode step takes 30-60 ms here (plus as much again
        # for the control step): 10 000 steps would take 10-20 minutes per
        # series, so the small model gets fewer (the tiny model the full
        # 10 000). The numpy reference's small prefill takes 30 s: one, no
        # warm-up.
        "small": dict(reps=2, ref_reps=0, budget=10.0, max_decode=64, lat=(500, 2000),
                      lat_fixed=(1000, 3000), icount=(20, 50)),
    },
}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def environment() -> dict:
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout.strip()
        except OSError:
            return ""
    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    import importlib.metadata as md
    vers = {}
    for pkg in ("numpy", "torch", "transformers", "llama_cpp_python", "gguf", "matplotlib"):
        try:
            vers[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            vers[pkg] = None
    return {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "git": sh(["git", "rev-parse", "--short", "HEAD"]),
            "src_dirty": bool(sh(["git", "status", "--porcelain", "src"])),
            "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "loadavg_start": os.getloadavg(), "packages": vers}


def bench_model(name: str, ms: models.ModelSet, drivers: Drivers, plan: dict,
                work: Path, have_llama: bool) -> dict:
    cfg = ms.config()
    tokens = measure.token_file(work / f"tokens-{name}.txt", cfg["vocab_size"])
    args = (tokens, N_PROMPT, N_PREFILL, plan["reps"], plan["budget"], plan["max_decode"])
    res = {"config": {k: cfg[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                          "num_hidden_layers", "num_attention_heads",
                                          "num_key_value_heads", "num_local_experts",
                                          "num_experts_per_tok")},
           "files": {k: v.stat().st_size for k, v in {**ms.colibri, **ms.gguf}.items()
                     if v.exists()}}
    eng = {}
    log(f"{name}: transformers (torch, 1 thread)")
    eng["transformers f32"] = measure.run_peer("transformers", ms.hf, *args)
    hf_tokens = eng["transformers f32"].get("tokens")
    for q in ("f32", "int8"):
        log(f"{name}: colibri {q}")
        eng[f"colibri {q}"] = measure.run_colibri_speed(drivers, ms.colibri[q], *args)
    if name != "tiny":  # the file mapped (4 KiB pages) instead of read
        for q in ("f32", "int8"):
            log(f"{name}: colibri {q} mmap")
            eng[f"colibri {q} mmap"] = measure.run_colibri_speed(
                drivers, ms.colibri[q], *args, program=drivers.bench_mmap)
    if have_llama:
        expect = hf_tokens[:GREEDY_CHECK + 1] if hf_tokens else None
        for q in ("f32", "q8_0"):
            log(f"{name}: llama.cpp {q}" + (" (greedy check against transformers first)"
                                            if q == "f32" else ""))
            eng[f"llama.cpp {q}"] = measure.run_peer("llama", ms.gguf[q], *args,
                                                     expect=expect if q == "f32" else None)
    else:
        eng["llama.cpp f32"] = eng["llama.cpp q8_0"] = {"error": "llama-cpp-python not installed"}
    ref_args = (tokens, N_PROMPT, N_PREFILL, plan["ref_reps"], plan["budget"], plan["max_decode"])
    for q in ("f32", "int8"):
        log(f"{name}: numpy reference {q}")
        eng[f"reference {q}"] = measure.run_peer("reference", ms.colibri[q], *ref_args)
    res["engines"] = eng

    # Same model, same greedy tokens? (the first GREEDY_CHECK+1 tokens)
    agree = {}
    for k, v in eng.items():
        if hf_tokens and v.get("tokens"):
            n = min(len(hf_tokens), len(v["tokens"]), GREEDY_CHECK + 1)
            agree[k] = v["tokens"][:n] == hf_tokens[:n]
    res["greedy_equal_to_transformers"] = agree
    chk = eng.get("llama.cpp f32", {}).get("check")
    if chk:
        log(f"{name}: llama.cpp f32 greedy tokens {chk['got']} vs transformers {chk['expected']}: "
            f"{'EQUAL' if chk['equal'] else 'DIFFERENT'}")
    res["llama_check"] = chk

    # Decode bandwidth: weight bytes per token / median step time.
    bw = {}
    for q in ("f32", "int8"):
        wb = measure.decode_weight_bytes(ms.colibri[q])
        tps = eng[f"colibri {q}"].get("decode_tok_s")
        tpc = eng[f"colibri {q}"].get("decode_tok_s_cpu")
        bw[q] = {**wb, "bytes_per_s": wb["bytes_per_token"] * tps if tps else None,
                 "bytes_per_cpu_s": wb["bytes_per_token"] * tpc if tpc else None}
    res["decode_bandwidth"] = bw

    log(f"{name}: latency distribution")
    res["latency"] = {}
    for q, steps in zip(("f32", "int8"), plan["lat"]):
        res["latency"][q] = measure.latency(drivers, ms.colibri[q], tokens, N_PROMPT, steps, "cycle")
    # Fixed position: the same work every step, so the spread is jitter. The
    # control (a read-only pass over the weight bytes a step reads, after
    # every step) shows the spread the machine alone gives that much memory
    # traffic in the same minutes.
    for q, steps in zip(("f32", "int8"), plan["lat_fixed"]):
        res["latency"][f"{q} fixed position"] = measure.latency(
            drivers, ms.colibri[q], tokens, N_PROMPT, steps, "fixed",
            control_bytes=bw[q]["bytes_per_token"])
    log(f"{name}: instruction counts (callgrind)")
    res["icount"] = {q: measure.instruction_counts(drivers, ms.colibri[q], tokens, N_PROMPT, n)
                     for q, n in zip(("f32", "int8"), plan["icount"])}
    return res


def bench_ffn(ms: models.ModelSet, drivers: Drivers, work: Path, have_llama: bool,
              reps: int) -> dict:
    """Expert FFN GFLOPS at a 128-token prefill of the one-layer ffn model."""
    cfg = ms.config()
    tokens = measure.token_file(work / "tokens-ffn.txt", cfg["vocab_size"])
    toks = [int(t) for t in tokens.read_text().split()][:N_PREFILL]
    experts = measure.ffn_routing(ms.colibri["f32"], toks)
    sg = measure.numpy_ffn_sgemm(ms.colibri["f32"], experts, reps)
    flops = sg["flops"]
    out = {"routing_counts": sg["counts"], "expert_flops": flops,
           "numpy sgemm": {"gflops": sg["gflops"], "gflops_cpu": sg["gflops_cpu"],
                           "openblas_core": sg["openblas_core"],
                           "times_s": sg["times_s"], "cpu_s": sg["cpu_s"]}}
    args = (tokens, N_PROMPT, N_PREFILL, reps, 0.0, 1)
    for q in ("f32", "int8"):
        r = measure.run_colibri_speed(drivers, ms.colibri[q], *args)
        out[f"colibri {q}"] = _gflops(flops, r)
    if have_llama:
        for q in ("f32", "q8_0"):
            r = measure.run_peer("llama", ms.gguf[q], *args)
            if "error" in r:
                out[f"llama.cpp {q}"] = r
            else:
                out[f"llama.cpp {q}"] = _gflops(flops, r)
    return out


def _gflops(flops: float, r: dict) -> dict:
    return {"gflops": flops / r["prefill"]["median"] / 1e9,
            "gflops_cpu": flops / r["prefill_cpu"]["median"] / 1e9,
            "prefill_s": r["prefill_s"], "prefill_cpu_s": r["prefill_cpu_s"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench/run.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny model only, few steps")
    ap.add_argument("--out", type=Path, help="results directory (default: bench/results, "
                                             "or build/bench/quick with --quick)")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "bench",
                    help="generated models and builds (cached between runs)")
    ap.add_argument("--report-only", action="store_true",
                    help="measure nothing: rewrite results.md and results.png from results.json")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    out_dir = a.out or (ROOT / "build" / "bench" / "quick" if a.quick else ROOT / "bench" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    if a.report_only:
        res = json.loads((out_dir / "results.json").read_text())
        (out_dir / "results.md").write_text(report.markdown(res))
        report.plot(res, out_dir / "results.png")
        log(f"rewrote {out_dir}/results.md and results.png from results.json")
        return 0
    a.work.mkdir(parents=True, exist_ok=True)
    plan = PLANS["quick" if a.quick else "full"]
    try:
        import llama_cpp  # noqa: F401
        have_llama = True
    except ImportError:
        have_llama = False
        log("llama-cpp-python is not installed (scripts/bench.sh installs it): no llama.cpp figures")

    res = {"mode": "quick" if a.quick else "full", "env": environment()}
    log(f"free disk under {a.work}: {shutil.disk_usage(a.work).free / 2**30:.1f} GiB")
    log("building the Colibri library (mmap and fread builds) and the C drivers")
    drivers = Drivers(a.work)
    res["env"]["kernels"] = list(drivers.kernels)
    log("machine ceilings: FMA peak, memcpy and read bandwidth")
    res["machine"] = measure.machine(drivers, a.quick)

    names = list(plan)
    sets = {n: models.prepare(n, a.work / "models", log=log) for n in names}
    if not a.quick:
        sets["ffn"] = models.prepare("ffn", a.work / "models", log=log)
    res["models"] = {}
    for n in names:
        res["models"][n] = bench_model(n, sets[n], drivers, plan[n], a.work, have_llama)

    if "ffn" in sets:
        log("expert FFN GFLOPS at prefill (ffn model) vs numpy sgemm")
        res["ffn"] = bench_ffn(sets["ffn"], drivers, a.work, have_llama, reps=5)

    log("init time and peak RSS per load mode; CRC throughput")
    res["init"] = {}
    for n, ms in sets.items():
        for q, p in ms.colibri.items():
            # a 2.6 GB init is a minute of CRC on a busy machine: once
            reps = 3 if p.stat().st_size < 100e6 else 1
            res["init"][f"{n} {q}"] = measure.init_modes(drivers, p, reps=reps)
    big = sets.get("small", sets["tiny"]).colibri["int8"]
    res["crc"] = {**measure.crc(drivers, big, reps=3), "file": big.name}
    res["library_size"] = measure.library_sizes(a.work)
    res["env"]["loadavg_end"] = os.getloadavg()
    res["wall_s"] = time.perf_counter() - t_start

    (out_dir / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    md = report.markdown(res)
    (out_dir / "results.md").write_text(md)
    print(md)
    try:
        report.plot(res, out_dir / "results.png")
    except ImportError:
        log("matplotlib is not installed (scripts/bench.sh installs it): no plot")
    log(f"wrote {out_dir}/results.json, results.md, results.png in {res['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
