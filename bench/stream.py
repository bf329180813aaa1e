"""Experts from storage inside a memory limit, side by side with llama.cpp.

Each run is one process in a cgroup v1 memory group of LIMIT bytes (no
swap: anonymous memory over the limit is an OOM kill), after the page cache
is dropped (a cold start, as a device after boot):

  colibri mmap    colibri-cli, all-resident, the file mapped (today's default
                  on a file bigger than memory: the page cache thrashes)
  colibri ram     colibri-cli --ram LIMIT-HEADROOM: the routed experts read
                  into as many slots as the budget holds (docs/STREAMING.md),
                  a layer's experts predicted and read during its attention
                  (the default prefetch); "(no prefetch)": --prefetch 0;
                  "(sync reads)": no reader thread (so no prefetch either);
                  "(page cache)": buffered reads
  llama.cpp       llama-bench, the same shapes as a Q8_0 GGUF (--quant q4:
                  Q4_K_M), mmap (its default), the same limit

First token: wall time of a process that loads the model and runs a
4-token prompt to its first logits (colibri-cli --tokens .. --generate 1,
llama-bench -p 4 -n 0). Decode: tokens/s of N greedy steps after a 4-token
prompt (colibri-cli --generate N+1, stderr; llama-bench -n N). Colibri's
hit rate and MB read per token come from its `experts:` line. Wall and CPU
time (user + system of the process) are both printed.

    python -m bench.stream [--model small] [--limits 256M,384M,512M,1G] [--steps 8]
    python -m bench.stream --model moe7b --limits 512M,1G,2G,4G   # the 7B class
    python -m bench.stream --model moe7b-skewed ...                # skewed routers
    python -m bench.stream --model moe7b --quant q4 ...            # Q4_K_M, both engines

Writes bench/results/stream-<cpu>.{json,md} (stream-<model>-<cpu> for a
model other than small); bench/models.py describes the models. Needs root (cgroups, the drop
of the page cache); a machine without the memory controller is refused.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CGROUP = Path("/sys/fs/cgroup/memory")
LLAMA_BIN = ROOT / "build" / "bench" / "llama.cpp" / "native" / "bin"
HEADROOM = 24 << 20   # the process itself: binary, libc, stacks, page tables
PROMPT = "1,2,3,4"


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def cache_file(path: Path) -> None:
    """Read the file through the page cache from this process, outside the
    memory group: a warm start, as when another process (or an earlier
    boot's service) has read it; its pages are charged to this process's
    group, not to the run's. (A run inside the group right after a cold
    one finds nothing cached: Colibri's reader leaves the cache as it found
    it, and the limit holds little of a larger file.)"""
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


class Group:
    """A cgroup v1 memory group with a limit; run() starts a command in it."""

    def __init__(self, name: str, limit: int):
        self.dir = CGROUP / name
        self.dir.mkdir(exist_ok=True)
        (self.dir / "memory.limit_in_bytes").write_text(str(limit))
        self.limit = limit

    def run(self, cmd: list[str], env=None, timeout=1800, cold=True) -> dict:
        (self.dir / "memory.max_usage_in_bytes").write_text("0")
        if cold:
            drop_caches()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        wrapped = ["sh", "-c", f'echo $$ > {self.dir}/cgroup.procs && exec "$@"', "sh", *cmd]
        p = subprocess.run(wrapped, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **(env or {})})
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        peak = int((self.dir / "memory.max_usage_in_bytes").read_text())
        return {"rc": p.returncode, "wall_s": wall, "cpu_s": cpu, "peak": peak,
                "stdout": p.stdout, "stderr": p.stderr}

    def remove(self) -> None:
        try:
            self.dir.rmdir()
        except OSError:
            pass


def colibri_decode(stderr: str) -> dict:
    out = {}
    m = re.search(r"decode: (\d+) steps, ([\d.]+) tokens/s", stderr)
    if m:
        out["decode_tps"] = float(m[2])
    m = re.search(r"experts: (\d+) slots, (\d+) uses, (\d+) hits \(([\d.]+)%\), (\d+) read "
                  r"\(([\d.]+) MB, ([\d.]+) ms in reads, ([\d.]+) ms waited\)", stderr)
    if m:
        out.update(slots=int(m[1]), hit_rate=float(m[4]) / 100, reads=int(m[5]),
                   mb_read=float(m[6]), read_ms=float(m[7]), wait_ms=float(m[8]))
    m = re.search(r"prefetch (\d+) a layer: (\d+) read, (\d+) hit, (\d+) cancelled", stderr)
    if m:
        out.update(prefetch=int(m[1]), prefetched=int(m[2]), prefetch_hits=int(m[3]),
                   prefetch_cancelled=int(m[4]))
    return out


def llama_tps(stdout: str) -> float | None:
    try:
        rows = json.loads(stdout)
    except json.JSONDecodeError:
        return None
    return rows[0]["avg_ts"] if rows else None


ENGINES = ("colibri mmap", "colibri ram", "colibri ram (no prefetch)",
           "colibri ram (sync reads)", "colibri ram (page cache)", "llama.cpp",
           "llama.cpp (repack 0)")
# llama-bench as it comes, and without its CPU repacking (which copies
# Q4_K and Q4_0 weights into anonymous memory at load: a mapped model then
# no longer fits a limit smaller than the file)
LLAMA_VARIANTS = {"llama.cpp": [], "llama.cpp (repack 0)": ["--repack", "0"]}


def top_quarter_share(tr) -> float:
    """How concentrated the routing of trace `tr` (route_trace.Trace) is:
    the share of a layer's expert uses that go to its most used quarter of
    experts, over all MoE layers (0.25 for uniform routing over many tokens;
    a trained router's is higher)."""
    per = {}
    for layer, ex in tr.passes:
        for e, c in ex:
            per.setdefault(layer, [0] * tr.n_experts)[e] += c
    top = sum(sum(sorted(u, reverse=True)[:max(1, tr.n_experts // 4)]) for u in per.values())
    return top / max(1, sum(sum(u) for u in per.values()))


def run_all(model: Path, gguf: Path, cli: Path, limits: list[int], steps: int,
            engines=ENGINES, trace: Path | None = None, gguf_kind: str = "Q8_0",
            kv: str = "f32") -> list[dict]:
    llama = [str(LLAMA_BIN / "llama-bench"), "-m", str(gguf), "-t", "1", "-r", "1",
             "--no-warmup", "-o", "json"]
    lenv = {"LD_LIBRARY_PATH": str(LLAMA_BIN)}
    rows = []
    for limit in limits:
        g = Group(f"colibri-bench-{limit >> 20}M", limit)
        ram = ["--ram", str(limit - HEADROOM)]
        runs = {
            "colibri mmap": ([], {}),
            "colibri ram": (ram, {}),
            # what predicting the next layer's experts is worth
            "colibri ram (no prefetch)": (ram + ["--prefetch", "0"], {}),
            # the reader thread's worth: the same reads on infer's thread
            "colibri ram (sync reads)": (ram, {"COLIBRI_STREAM_SYNC": "1"}),
            "colibri ram (page cache)": (ram, {"COLIBRI_STREAM_BUFFERED": "1"}),
        }
        for name, (extra, env) in runs.items():
            if name not in engines:
                continue
            base = [str(cli), "--model", str(model), "--tokens", PROMPT, "--kv", kv] + extra
            first = g.run(base + ["--generate", "1"], env)
            cache_file(model)
            warm = g.run(base + ["--generate", "1"], env, cold=False)
            one = [str(cli), "--model", str(model), "--tokens", "1", "--kv", kv] + extra
            warm1 = g.run(one + ["--generate", "1"], env, cold=False)
            traced = ["--route-trace", str(trace)] if trace and name == "colibri ram" else []
            dec = g.run(base + ["--generate", str(steps + 1)] + traced, env)
            row = {"limit": limit, "engine": name, "first_token_s": first["wall_s"],
                   "first_token_warm_s": warm["wall_s"], "first_token_warm_1_s": warm1["wall_s"],
                   "first_rc": first["rc"], "rc": dec["rc"], "wall_s": dec["wall_s"],
                   "cpu_s": dec["cpu_s"], "peak": dec["peak"], **colibri_decode(dec["stderr"])}
            if dec["rc"]:
                row["error"] = (dec["stderr"].strip().splitlines() or ["killed"])[-1][:200]
            if "mb_read" in row:
                row["mb_per_token"] = row["mb_read"] / (steps + 1 + 1)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items()}), flush=True)
        for name, extra in LLAMA_VARIANTS.items():
            if name not in engines:
                continue
            first = g.run(llama + extra + ["-p", "4", "-n", "0"], lenv)
            cache_file(gguf)
            warm = g.run(llama + extra + ["-p", "4", "-n", "0"], lenv, cold=False)
            warm1 = g.run(llama + extra + ["-p", "1", "-n", "0"], lenv, cold=False)
            dec = g.run(llama + extra + ["-p", "0", "-n", str(steps)], lenv)
            row = {"limit": limit, "engine": f"llama.cpp {gguf_kind} mmap" + (
                       f", {' '.join(extra)}" if extra else ""),
                   "first_token_s": first["wall_s"], "first_token_warm_s": warm["wall_s"],
                   "first_token_warm_1_s": warm1["wall_s"], "first_rc": first["rc"], "rc": dec["rc"], "wall_s": dec["wall_s"],
                   "cpu_s": dec["cpu_s"], "peak": dec["peak"],
                   "decode_tps": llama_tps(dec["stdout"])}
            if dec["rc"]:
                row["error"] = (dec["stderr"].strip().splitlines() or ["killed"])[-1][:200]
            rows.append(row)
            print(json.dumps(row), flush=True)
        g.remove()
    return rows


def report(rows: list[dict], meta: dict) -> str:
    feats = meta.get("cpu_features") or {}
    lines = [f"# Experts from storage inside a memory limit ({meta['cpu']})", "",
             f"CPU: {meta['cpu']}, {meta.get('cores', '?')} cores; "
             + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in feats.items()), "",
             f"Model: {meta['model']} ({meta['model_bytes'] / 1e6:.0f} MB .colibri, "
             f"{meta['gguf_bytes'] / 1e6:.0f} MB GGUF), 1 thread, cold page cache, "
             f"disk {meta['disk_mb_s']:.0f} MB/s (O_DIRECT, 8 MB reads), "
             f"{meta['steps']} decode steps. `python -m bench.stream`.", "",
             *([f"Routing: a layer's most used quarter of experts takes "
                f"{meta['top_quarter_share']:.0%} of its uses over the decode run's "
                f"{meta.get('trace_tokens', '?')} tokens (25 % would be uniform over "
                "many tokens; a short run is more concentrated).", ""]
               if "top_quarter_share" in meta else []),
             "First token: a process that loads the model and runs a 4-token prompt "
             "to its first logits, after the page cache is dropped (cold), and again "
             "with the file read into the page cache by another process first "
             "(warm; `warm, 1 token`: a 1-token prompt).", "",
             "Prefetch: experts a layer's prediction started reading / used / "
             "cancelled before a byte was read.", "",
             "| limit | engine | first token s, cold | warm | warm, 1 token | decode tok/s "
             "| vs llama.cpp | wall s | CPU s | peak MB | slots | hit rate | MB read/token "
             "| prefetch |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    peer = {}   # the faster llama.cpp row of each limit
    for r in rows:
        if r["engine"].startswith("llama") and r.get("decode_tps"):
            peer[r["limit"]] = max(peer.get(r["limit"], 0.0), r["decode_tps"])
    for r in rows:
        tps = r.get("decode_tps")
        ratio = f"{tps / peer[r['limit']]:.1f}x" if tps and peer.get(r["limit"]) else "-"
        err = f" ({r['error']})" if r.get("error") else ""
        hit = f"{r['hit_rate']:.0%}" if "hit_rate" in r else "-"
        mb = f"{r['mb_per_token']:.0f}" if "mb_per_token" in r else "-"
        tps_text = f"{tps:.2f}" if tps else "-"
        pf = (f"{r['prefetched']} / {r['prefetch_hits']} / {r['prefetch_cancelled']}"
              if r.get("prefetch") else "-")
        lines.append(
            f"| {r['limit'] >> 20} MiB | {r['engine']}{err} | {r['first_token_s']:.2f} | "
            f"{r.get('first_token_warm_s', float('nan')):.2f} | "
            f"{r.get('first_token_warm_1_s', float('nan')):.2f} | {tps_text} | {ratio} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
            f"{r['peak'] / 2**20:.0f} | {r.get('slots', '-')} | {hit} | {mb} | {pf} |")
    return "\n".join(lines) + "\n"


def disk_speed(path: Path) -> float:
    drop_caches()
    p = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=8M", "count=48", "iflag=direct"],
                       capture_output=True, text=True)
    m = re.search(r"([\d.]+) s, ", p.stderr)
    return 48 * 8 * 2**20 / float(m[1]) / 1e6 if m else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--limits", default="256M,384M,512M,1G")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--quant", choices=("int8", "q4"), default="int8",
                    help="int8: the .colibri int8 file beside the Q8_0 GGUF; q4: llama.cpp's "
                         "Q4_K_M of the Q8_0 GGUF and the .colibri file imported from it")
    ap.add_argument("--append", action="store_true",
                    help="merge these rows into the results file (same limit and engine: "
                         "replaced) instead of writing it anew")
    ap.add_argument("--engines", default=",".join(ENGINES),
                    help="a comma-separated subset of: " + ", ".join(ENGINES))
    a = ap.parse_args(argv)
    engines = [e.strip() for e in a.engines.split(",")]
    if not set(engines) <= set(ENGINES):
        print(f"bench.stream: --engines: choose from {', '.join(ENGINES)}", file=sys.stderr)
        return 2
    if not (CGROUP / "memory.limit_in_bytes").exists() or os.geteuid() != 0:
        print("bench.stream: needs root and the cgroup v1 memory controller at "
              f"{CGROUP}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from bench import models
    from colibri.buildsteps import cbuild
    from bench.threads import cpu_description
    ms = models.prepare(a.model, ROOT / "build" / "bench" / "models")
    cli = Path(cbuild.build(ROOT / "build" / "bench" / "stream-cli",
                            kernels=cbuild.host_kernels())["cli"])
    if a.quant == "q4":
        model, gguf = models.prepare_q4_from_gguf(ms)
    else:
        model, gguf = ms.colibri["int8"], ms.gguf["q8_0"]
    limits = [parse_size(x) for x in a.limits.split(",")]
    cpu = cpu_description()
    meta = {"cpu": cpu["model"] or "?", "cores": cpu["cores"], "cpu_features": cpu["flags"],
            "model": a.model + (" q4, i8 KV cache" if a.quant == "q4" else " int8"),
            "model_bytes": model.stat().st_size,
            "gguf_bytes": gguf.stat().st_size, "disk_mb_s": disk_speed(model),
            "steps": a.steps, "load": os.getloadavg()[0]}
    trace = ROOT / "build" / "bench" / f"stream-{a.model}-trace.txt"
    trace.unlink(missing_ok=True)
    # q4: the compact cache too (the seed's 512 MiB class needs both)
    rows = run_all(model, gguf, cli, limits, a.steps, engines, trace,
                   "Q4_K_M" if a.quant == "q4" else "Q8_0", "i8" if a.quant == "q4" else "f32")
    if trace.exists():
        from colibri.model import route_trace
        tr = route_trace.read_trace(trace)
        meta["top_quarter_share"] = top_quarter_share(tr)
        meta["trace_tokens"] = tr.tokens()
    flags = Path("/proc/cpuinfo").read_text()
    tag = re.sub(r"\W+", "-", meta["cpu"]).strip("-").lower()[:24] + (
        "-avx512" if " avx512f" in flags else "-avx2")
    name = "stream" if a.model == "small" else f"stream-{a.model}"
    name += "-q4" if a.quant == "q4" else ""
    out = ROOT / "bench" / "results" / f"{name}-{tag}"
    if a.append and out.with_suffix(".json").exists():
        old = json.loads(out.with_suffix(".json").read_text())
        new = {(r["limit"], r["engine"]) for r in rows}
        rows = [r for r in old["rows"] if (r["limit"], r["engine"]) not in new] + rows
        rows.sort(key=lambda r: r["limit"])   # stable: a limit's rows in run order
        meta = {**old["meta"], "appended": f"{', '.join(engines)} (load {meta['load']:.1f})"}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    md = report(rows, meta)
    out.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
