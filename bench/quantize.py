"""Conversion speed: `colibri convert --quant q4` against llama.cpp's
`llama-quantize ... Q4_K_M`, the same model, side by side in one run,
interleaved, at 1 and 2 worker processes / threads.

    .venv/bin/python bench/quantize.py                 # 1 round, small model
    .venv/bin/python bench/quantize.py --rounds 2 --out bench/results/quantize-NAME

The model is bench/threads.py's "small" Mixtral (bench/models.py, 0.64 B
parameters, float32 safetensors). Colibri converts its checkpoint directory
(`--no-tokenizer -q --jobs N`); llama-quantize (scripts/build_llama_bench.sh)
quantises the float32 GGUF that bench/models.py writes of the same
checkpoint, without an imatrix, with N threads. Both write their whole
4-bit file; the figures are each command's wall time and CPU time (its
process and every child it waited for: Colibri's worker processes), and
the ratio is llama-quantize's wall time over Colibri's (above 1: Colibri
is faster). The two files are not the same mix (QUANTISATION.md: the q4
mix keeps attention and the embedding in Q6_K and uses more candidate
scales); the run also checks that Colibri's file is the same bytes at
every --jobs. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import models, threads  # noqa: E402

JOBS = (1, 2)
COLIBRI = ROOT / ".venv" / "bin" / "colibri"


def log(msg: str) -> None:
    print(f"[quantize {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_one(cmd: list[str]) -> dict:
    """Run cmd: {"wall_s", "cpu_s"} (user + system time of it and of every
    child it waited for: RUSAGE_CHILDREN grows by those once it is reaped),
    or {"error"}."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        return {"error": f"exit {p.returncode}: {p.stderr[-800:]}"}
    return {"wall_s": wall,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds (default 1)")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "bench")
    ap.add_argument("--out", type=Path, help="results directory (default: print only)")
    a = ap.parse_args(argv)
    quantize = models.LLAMA_QUANTIZE
    if not quantize.exists():
        print(f"bench/quantize.py: no {quantize}: run scripts/build_llama_bench.sh first",
              file=sys.stderr)
        return 2
    started = time.time()
    ms = models.prepare("small", a.work / "models", log=log)
    gguf = ms.gguf["f32"]
    engines = []
    for n in JOBS:
        engines.append((f"colibri convert --quant q4 --jobs {n}", n, "colibri",
                        lambda out, n=n: [str(COLIBRI), "convert", str(ms.hf), "-o", str(out),
                                          "--quant", "q4", "--no-tokenizer", "-q",
                                          "--jobs", str(n)]))
        engines.append((f"llama-quantize Q4_K_M {n} threads", n, "llama",
                        lambda out, n=n: [str(quantize), str(gguf), str(out), "Q4_K_M", str(n)]))
    runs: dict = {name: [] for name, *_ in engines}
    digests = set()
    with tempfile.TemporaryDirectory(prefix="colibri-quantize-", dir=a.work) as tmp:
        for r in range(a.rounds):
            for name, n, kind, cmd in engines:
                out = Path(tmp) / ("x.colibri" if kind == "colibri" else "x.gguf")
                log(f"round {r + 1}/{a.rounds}: {name}")
                res = run_one(cmd(out))
                if "error" not in res:
                    res["bytes"] = out.stat().st_size
                    if kind == "colibri":
                        digests.add(sha256(out))
                out.unlink(missing_ok=True)
                runs[name].append(res)
    cpu = threads.cpu_description()
    table = []
    for name, n, kind, _ in engines:
        ok = [x for x in runs[name] if "error" not in x]
        table.append({"engine": name, "jobs": n, "kind": kind,
                      "wall_s": statistics.median(x["wall_s"] for x in ok) if ok else None,
                      "cpu_s": statistics.median(x["cpu_s"] for x in ok) if ok else None,
                      "bytes": ok[0]["bytes"] if ok else None,
                      "errors": [x["error"] for x in runs[name] if "error" in x]})
    res = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
           "cpu": cpu, "git": threads.git_revisions(), "rounds": a.rounds,
           "command": " ".join(["bench/quantize.py", *(argv or sys.argv[1:])]),
           "model": {"name": ms.name, "parameters": models.checkpoint_bytes(models.SMALL) // 4},
           "colibri_same_bytes_at_every_jobs": len(digests) == 1,
           "table": table, "runs": runs, "minutes": (time.time() - started) / 60}
    md = report(res)
    print(md)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "quantize.json").write_text(json.dumps(res, indent=1))
        (a.out / "quantize.md").write_text(md)
        log(f"wrote {a.out}/quantize.md and quantize.json")
    return 0


def report(res: dict) -> str:
    cpu = res["cpu"]
    flags = threads.cpu_features(cpu)
    lines = [
        "# Conversion to 4 bits: colibri convert --quant q4 against llama-quantize Q4_K_M", "",
        f"{res['date_utc']} UTC · `{res['command']}` · "
        f"{res['minutes']:.1f} min", "",
        f"- CPU: {cpu['model']}, {cpu['cores']} cores; {flags}",
        f"- git: HEAD {res['git'].get('HEAD')}, src_dirty {res['git'].get('src_dirty')}",
        f"- model: bench's {res['model']['name']} Mixtral, {res['model']['parameters']:,} "
        "parameters, float32 (Colibri from safetensors, llama-quantize from the f32 GGUF)",
        f"- {res['rounds']} interleaved round(s), medians; Colibri's file the same bytes at "
        f"every --jobs: {res['colibri_same_bytes_at_every_jobs']}", "",
        "| engine | workers / threads | wall s | CPU s | file MiB | llama-quantize wall / this |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    llama = {row["jobs"]: row for row in res["table"] if row["kind"] == "llama"}
    for row in res["table"]:
        if row["wall_s"] is None:
            lines.append(f"| {row['engine']} | {row['jobs']} | failed: "
                         f"{row['errors'][0][:80]} | | | |")
            continue
        peer = llama.get(row["jobs"])
        ratio = (f"{peer['wall_s'] / row['wall_s']:.2f}x"
                 if peer and peer["wall_s"] and row["kind"] == "colibri" else "")
        lines.append(f"| {row['engine']} | {row['jobs']} | {row['wall_s']:.1f} | "
                     f"{row['cpu_s']:.1f} | {row['bytes'] / 2**20:.1f} | {ratio} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
