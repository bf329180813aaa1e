"""Long-context benchmark (issue 28): prefill of N positions and decode at depth
N, Colibri against llama.cpp's own llama-bench, side by side in one run,
interleaved, at 1 and 2 threads.

    .venv/bin/python bench/context.py                  # N = 2048, int8 and q4
    .venv/bin/python bench/context.py --positions 128,2048 --precisions int8
    .venv/bin/python bench/context.py --kernels avx2 --llama-build avx2
                                      # an AVX2-only CPU's pair, on an AVX-512 one

The model is bench/threads.py's "small" Mixtral (bench/models.py: hidden 1024,
8 layers, 16 heads of 64, 8 KV heads), converted again with room for N + steps
positions (`colibri convert --max-seq-len`; the files of threads.py have 512).
Its peers are the GGUF files threads.py makes of the same checkpoint: Q8_0 for
int8, llama-quantize's Q4_K_M for q4.

Colibri runs each file with its float32 KV cache (the default) and, with
`--kv f32,i8` (the default), the int8 one (colibri_options.kv_dtype; 2 x (head_dim
+ 4) bytes a head and position against 8 x head_dim): decode at depth reads the
whole cache every step. llama.cpp's default cache is float16.

Figures (tokens/s; Colibri from bench/c/threads_bench.c, wall and process CPU
time; llama-bench wall time, its default settings otherwise, flash attention
"auto"):
  prefill N     one fresh prefill of N tokens, the last position's logits
                (colibri_infer_ex COLIBRI_LOGITS_LAST; llama-bench `-p N -n 0`)
  decode at N   a prompt of N tokens (untimed), then `steps` greedy single-token
                calls with the KV cache (llama-bench `-p 0 -n steps -d N`)
A round runs every engine once at 1 then 2 threads; the figure is the median
over rounds of each round's median. The read bandwidth of 1 and 2 cores is
probed in each round (bench/c/bandwidth.c), and each engine's 2-thread
figures sit between two of threads.py's pairing probes: the ratios over the
rounds in which both cores streamed are reported apart (bench/README.md,
"Two threads on a VM"). Nothing is asserted.
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import models, threads  # noqa: E402
from bench.measure import token_file  # noqa: E402

THREADS = threads.THREADS
PEER = {"int8": "q8_0", "q4": "q4_k_m", "f32": "f32"}  # Colibri precision -> GGUF peer
LLAMA_REPS = 2  # llama-bench -r: each repetition of -d N first prefills N positions


def log(msg: str) -> None:
    print(f"[context {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def long_file(ms: models.ModelSet, precision: str, max_seq: int) -> Path:
    """The checkpoint of ms converted at `precision` with max_seq positions
    (cached next to threads.py's files; q4 remade when its quantiser changes)."""
    from colibri import cli
    out = ms.dir / f"model-{precision}-ctx{max_seq}.colibri"
    stamp = out.with_suffix(".done")
    digest = threads._q4_sources_digest() if precision == "q4" else "1"
    if not (out.exists() and stamp.exists() and stamp.read_text() == digest):
        log(f"  colibri convert --quant {precision} --max-seq-len {max_seq} -> {out.name}")
        rc = cli.main(["convert", str(ms.hf), "-o", str(out), "--quant", precision,
                       "--max-seq-len", str(max_seq), "-q"])
        if rc:
            raise RuntimeError(f"colibri convert --quant {precision} failed ({rc})")
        stamp.write_text(digest)
    return out


def llama_bench(gguf: Path, args: list, build: str, n_threads=THREADS) -> dict:
    """One llama-bench run (build: native or avx2) at n_threads: {threads: tokens/s}."""
    cmd = [str(threads.LLAMA_BENCH[build]), "-m", str(gguf), *args, "-r", str(LLAMA_REPS),
           "-t", ",".join(map(str, n_threads)), "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if proc.returncode:
        return {"error": (proc.stderr or proc.stdout)[-800:]}
    return {str(r["n_threads"]): r["avg_ts"] for r in json.loads(proc.stdout)}


def colibri_round(s: threads.Server, n: int, steps: int, t: int) -> dict:
    """prefill N (last logits) and decode at depth N at t threads:
    {metric: {"wall": tok/s, "cpu": tok/s, ...}}."""
    out = {}
    r = s.ask(f"threads {t} 0")
    if "error" in r:
        return {"error": r["error"]}
    s.ask("prefill all 8 1")  # wake the workers, untimed
    r = s.ask(f"prefill last {n} 1")
    if "error" in r:
        return {"error": r["error"]}
    out["prefill"] = {"wall": n / r["wall_s"][0], "cpu": n / r["cpu_s"][0], "argmax": r["argmax"]}
    r = s.ask(f"decode {n} {steps}")
    if "error" in r:
        return {"error": r["error"]}
    out["decode"] = {"wall": 1 / threads._median(r["wall_s"]),
                     "cpu": 1 / threads._median(r["cpu_s"]), "tokens": r["tokens"]}
    return out


def summarise(rounds: list, paired_only: bool = False) -> dict:
    """{engine: {N: {threads: {metric: {"wall", "cpu"}}}}}: medians over rounds
    (paired_only: the 2-thread figures of the rounds whose pairing probes
    both read threads.PAIRED_MIN or more, threads.paired)."""
    acc: dict = {}
    for rnd in rounds:
        for eng, per_n in rnd.items():
            if eng in ("bandwidth_gb_s", "pairing"):
                continue
            for n, per_t in per_n.items():
                for t, res in per_t.items():
                    if paired_only and (t == "1" or not threads.paired(
                            rnd.get("pairing", {}).get(f"{eng} N={n}"))):
                        continue
                    for m, v in res.items():
                        if not isinstance(v, dict):
                            continue
                        for clock in ("wall", "cpu"):
                            if v.get(clock) is not None:
                                (acc.setdefault(eng, {}).setdefault(n, {}).setdefault(t, {})
                                 .setdefault(m, {}).setdefault(clock, []).append(v[clock]))
    return {e: {n: {t: {m: {c: threads._median(v) for c, v in cl.items()}
                        for m, cl in mt.items()} for t, mt in tt.items()}
                for n, tt in nn.items()} for e, nn in acc.items()}


def engine(precision: str, kv: str) -> str:
    return f"colibri {precision}" + (" kv=i8" if kv == "i8" else "")


def markdown(res: dict) -> str:
    env, table = res["env"], res["table"]
    cpu = env["cpu"]
    flags = threads.cpu_features(cpu)
    bw = res["bandwidth_gb_s"]
    L = ["# Long context: Colibri against llama-bench", "",
         f"{env['date_utc']} UTC · `{res['command']}` · {res['wall_s'] / 60:.1f} min",
         "",
         f"- CPU: {cpu['model']}, {cpu['cores']} cores; {flags}",
         "- git: " + ", ".join(f"{k} {v}" for k, v in env["git"].items()),
         "- Colibri kernels: " + ", ".join(f"{k}: {v}" for k, v in res["kernels"].items()),
         f"- llama-bench {res['llama_build']} (scripts/build_llama_bench.sh), `-r {LLAMA_REPS}`, defaults "
         "otherwise (flash attention auto)",
         f"- load average start/end: {env['loadavg_start']} / {env.get('loadavg_end')}",
         "- read bandwidth (bench/c/bandwidth.c, each round): " + "; ".join(
             f"{t} core{'s' if t != '1' else ''} {threads._f(v)} GB/s" for t, v in bw.items()),
         f"- {res['rounds']} interleaved rounds; prefill N: one fresh prefill, last "
         f"logits; decode at N: {res['steps']} greedy steps after N positions", "",
         "tokens/s from wall time (Colibri's process CPU time in brackets); ratio: "
         "Colibri over its peer at equal threads, wall time.", "",
         "| Colibri | KV cache | peer (KV f16) | positions N | threads | prefill N: Colibri "
         "| peer | ratio | decode at N: Colibri | peer | ratio |",
         "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for prec, kv in ((p, k) for p in res["precisions"] for k in res["kv"]):
        ours, peer = engine(prec, kv), f"llama-bench {PEER[prec]}"
        for n in map(str, res["positions"]):
            for t in map(str, THREADS):
                row = [f"colibri {prec}", kv, PEER[prec].upper(), n, t]
                for m in ("prefill", "decode"):
                    c = table.get(ours, {}).get(n, {}).get(t, {}).get(m, {})
                    p = table.get(peer, {}).get(n, {}).get(t, {}).get(m, {})
                    w, pw = c.get("wall"), p.get("wall")
                    row += [f"{threads._f(w)} ({threads._f(c.get('cpu'))})", threads._f(pw),
                            f"**{w / pw:.2f}x**" if w and pw else "—"]
                L.append("| " + " | ".join(row) + " |")
    L += _paired_section(res)
    L += ["", "Consistency: " + "; ".join(f"{k}: {v}" for k, v in res["consistency"].items())]
    return "\n".join(L) + "\n"


def _paired_section(res: dict) -> list:
    """The 2-thread ratios over the rounds in which the host let both cores
    stream for both engines (threads.py's pairing probe around each
    2-thread figure), and every probe: bench/README.md, "Two threads on a VM"."""
    probes = [rnd.get("pairing", {}) for rnd in res["raw"]]
    if not any(probes):
        return []
    tp = res.get("table_paired", {})
    t = str(THREADS[-1])
    L = ["", "## Two threads and the host", "",
         f"Around each {t}-thread figure the 2-core over 1-core read bandwidth was probed "
         f"before and after (bench/threads.py's pairing probe); ✓: both at "
         f"{threads.PAIRED_MIN} or more (both cores streaming at full speed). Ratios over "
         "those rounds only, where both engines have one:", "",
         "| Colibri | KV cache | positions N | prefill N ratio | decode at N ratio |",
         "|---|---|---:|---:|---:|"]
    for prec, kv in ((p, k) for p in res["precisions"] for k in res["kv"]):
        ours, peer = engine(prec, kv), f"llama-bench {PEER[prec]}"
        for n in map(str, res["positions"]):
            cells = []
            for m in ("prefill", "decode"):
                w = tp.get(ours, {}).get(n, {}).get(t, {}).get(m, {}).get("wall")
                pw = tp.get(peer, {}).get(n, {}).get(t, {}).get(m, {}).get("wall")
                cells.append(f"**{w / pw:.2f}x**" if w and pw else "— (no such round)")
            L.append(f"| colibri {prec} | {kv} | {n} | " + " | ".join(cells) + " |")
    L += ["", "| engine, N | " + " | ".join(f"round {i + 1}" for i in range(len(probes))) + " |",
          "|---|" + "---:|" * len(probes)]
    for key in dict.fromkeys(k for p in probes for k in p):
        cells = [("—" if not p.get(key) else " / ".join(threads._f(x, 2) for x in p[key])
                  + (" ✓" if threads.paired(p[key]) else "")) for p in probes]
        L.append(f"| {key} | " + " | ".join(cells) + " |")
    return L


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench/context.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--positions", default="2048",
                    help="comma-separated N (default 2048): prefill N, decode at depth N")
    ap.add_argument("--precisions", default="int8,q4",
                    help="comma-separated Colibri files (f32, int8, q4; default int8,q4)")
    ap.add_argument("--kv", default="f32,i8",
                    help="comma-separated Colibri KV caches (f32, i8; default both)")
    ap.add_argument("--steps", type=int, default=32, help="decode steps (default 32)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    ap.add_argument("--no-llama", action="store_true", help="Colibri rows only")
    ap.add_argument("--llama-build", choices=sorted(threads.LLAMA_BENCH), default="native",
                    help="llama-bench build (default native; avx2: its AVX2-only build, the "
                         "peer of Colibri's --kernels avx2 on an AVX-512 CPU)")
    ap.add_argument("--kernels", help="Colibri's kernel table (COLIBRI_KERNELS: avx2, "
                                      "avx2-vnni, avx512-vnni; default the best the CPU has)")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "bench")
    ap.add_argument("--out", type=Path, help="results directory (default "
                                             "bench/results/context-<cpu>)")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    positions = sorted(int(x) for x in a.positions.split(",") if x)
    precisions = [p for p in a.precisions.split(",") if p]
    for p in precisions:
        if p not in PEER:
            ap.error(f"--precisions: unknown {p!r} (f32, int8, q4)")
    max_seq = max(positions) + a.steps
    env = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
           "cpu": threads.cpu_description(), "git": threads.git_revisions(),
           "python": platform.python_version(), "loadavg_start": os.getloadavg()}
    slug = "".join(ch if ch.isalnum() else "-" for ch in env["cpu"]["model"].lower()).strip("-")
    out_dir = a.out or ROOT / "bench" / "results" / f"context-{slug}"
    out_dir.mkdir(parents=True, exist_ok=True)
    log(f"CPU: {env['cpu']['model']}; N = {positions}; precisions {precisions}")
    progs = threads.build_colibri(a.work)
    ms = models.prepare("small", a.work / "models", log=log, with_gguf=not a.no_llama)
    ggufs = {}
    if not a.no_llama:
        if not threads.LLAMA_BENCH[a.llama_build].exists():
            log("no llama-bench (scripts/build_llama_bench.sh builds it): Colibri rows only")
        else:
            q4 = threads.prepare_q4(ms, True) if "q4" in precisions else {}
            ggufs = {p: (q4.get("q4_k_m") if p == "q4" else ms.gguf[PEER[p]]) for p in precisions}
    tokens = token_file(a.work / f"tokens-context-{max_seq}.txt", ms.config()["vocab_size"],
                        n=max_seq)
    kvs = [k for k in a.kv.split(",") if k]
    for k in kvs:
        if k not in ("f32", "i8"):
            ap.error(f"--kv: unknown {k!r} (f32, i8)")
    if a.kernels:
        os.environ["COLIBRI_KERNELS"] = a.kernels      # the servers inherit it
    servers = [threads.Server(engine(p, k), [progs["vnni"], long_file(ms, p, max_seq), tokens,
                                             *(["kv=i8"] if k == "i8" else [])], "colibri", p)
               for p in precisions for k in kvs]
    probe = threads.build_bandwidth(a.work)
    rounds = []
    try:
        for r in range(a.rounds):
            rnd = {"bandwidth_gb_s": threads.run_bandwidth(probe), "pairing": {}}
            for s in servers:
                for n in positions:
                    log(f"round {r + 1}/{a.rounds}: {s.name}, N = {n}")
                    per_t = rnd.setdefault(s.name, {}).setdefault(str(n), {})
                    per_t["1"] = colibri_round(s, n, a.steps, 1)
                    # 2 threads between two probes of the host's mode (threads.py)
                    for t in THREADS[1:]:
                        per_t[str(t)], rnd["pairing"][f"{s.name} N={n}"] = threads.bracketed(
                            probe, lambda t=t: colibri_round(s, n, a.steps, t))
            for p, g in ggufs.items():
                if g is None:
                    continue
                eng = f"llama-bench {PEER[p]}"
                for n in positions:
                    log(f"round {r + 1}/{a.rounds}: {eng}, N = {n}")

                    def runs(n_threads, n=n, g=g):  # (prefill N, decode at N)
                        return (llama_bench(g, ["-p", str(n), "-n", "0"], a.llama_build,
                                            n_threads),
                                llama_bench(g, ["-p", "0", "-n", str(a.steps), "-d", str(n)],
                                            a.llama_build, n_threads))
                    one = runs(THREADS[:1])
                    more, rnd["pairing"][f"{eng} N={n}"] = threads.bracketed(
                        probe, lambda runs=runs: runs(THREADS[1:]))
                    for t in map(str, THREADS):
                        pre, dec = one if t == str(THREADS[0]) else more
                        cell = rnd.setdefault(eng, {}).setdefault(str(n), {}).setdefault(t, {})
                        for m, res in (("prefill", pre), ("decode", dec)):
                            cell[m] = {"wall": res.get(t)} if "error" not in res else res
            rounds.append(rnd)
    finally:
        for s in servers:
            s.close()
    env["loadavg_end"] = os.getloadavg()
    # Colibri promises the same bits for every thread count: the same greedy tokens
    consistency = {}
    for s in servers:
        per_n = rounds[0].get(s.name, {})
        consistency[f"{s.name} decode tokens equal at 1 and 2 threads"] = all(
            len({tuple(per_t[t]["decode"]["tokens"]) for t in per_t}) == 1
            for per_t in per_n.values() if all("decode" in v for v in per_t.values()))
    bw = {t: threads._median([rnd["bandwidth_gb_s"].get(t) for rnd in rounds
                              if rnd["bandwidth_gb_s"].get(t)]) for t in map(str, THREADS)}
    res = {"env": env, "positions": positions, "precisions": precisions, "kv": kvs,
           "llama_build": a.llama_build,
           "steps": a.steps,
           "rounds": a.rounds, "kernels": {s.name: s.info.get("kernels") for s in servers},
           "command": "bench/context.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "bandwidth_gb_s": bw, "table": summarise(rounds),
           "table_paired": summarise(rounds, paired_only=True), "consistency": consistency,
           "raw": rounds, "wall_s": time.perf_counter() - t_start}
    (out_dir / "context.json").write_text(json.dumps(res, indent=1) + "\n")
    md = markdown(res)
    (out_dir / "context.md").write_text(md)
    print(md)
    log(f"wrote {out_dir}/context.md and context.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
