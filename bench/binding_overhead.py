"""Per-call overhead of colibri.runtime (the ctypes binding) against a direct C
call, for a one-token decode step: measured side by side, printed as ratios.

    .venv/bin/python -m bench.binding_overhead [--model F.colibri] [--steps N]
                                               [--rounds R] [--json OUT]

Both sides call the same libcolibri.so (built by colibri.buildsteps.cbuild into
build/bench/binding/, the host kernels, the x86_64 target's default of
reading the file into memory): the direct side is bench/c/so_decode.c, which
dlopens the library like ctypes does and times each colibri_infer call in C;
the binding side times each Model.infer call in this process, two ways:
"array+out" (an int32 [1, 1] array and a reused logits array: the
zero-allocation loop) and "list" (`m.infer([[tok]], n_past=p)`: a new
logits array every call). Every call decodes one token at the same position
(n_past = the prompt length, 16 or max_seq_len - 1 if smaller; the cache
rewound each time), so each call is
the same work. R rounds alternate the three, N calls each; a figure is the
median of all calls, from wall time and from CPU time (the CPU time is what
the call costs while it holds the core; on a shared machine the wall time
adds other processes' turns).

Default model: bench's "tiny" (tests/golden_configs.py "tiny", 512
positions, f32 and int8; generated with transformers into
build/bench/binding/models/). The overhead in microseconds is also put
against a small-model decode step, taken from the last full benchmark run
(bench/results/results.json, "small", Colibri int8: the fastest small-model
step) and labelled as such: this script does not time the 2.6 GB model.
Nothing is asserted: measurements, not tests.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from colibri.buildsteps import cbuild
from colibri.runtime import Model

ROOT = Path(__file__).resolve().parent.parent
C_DIR = ROOT / "bench" / "c"
OUT_DIR = ROOT / "build" / "bench" / "binding"
RESULTS = ROOT / "bench" / "results" / "results.json"
N_PROMPT = 16


def build() -> tuple[Path, Path]:
    """(libcolibri.so, so_decode)."""
    info = cbuild.build(OUT_DIR / "lib", kernels=cbuild.host_kernels(), mmap=False,
                        cli=False, shared=True)
    exe = OUT_DIR / "so_decode"
    cbuild._run([info["cc"], *info["cflags"], f"-I{C_DIR}", str(C_DIR / "so_decode.c"),
                 "-ldl", "-o", str(exe)])
    return info["so"], exe


def direct(exe: Path, so: Path, model: Path, steps: int, n_prompt: int
           ) -> tuple[np.ndarray, np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "t.f64"
        subprocess.run([str(exe), str(so), str(model), str(n_prompt), str(steps), str(out)],
                       check=True, timeout=600)
        t = np.fromfile(out, dtype=np.float64)
    return t[:steps], t[steps:]


def binding(m: Model, steps: int, style: str, n_prompt: int
            ) -> tuple[np.ndarray, np.ndarray]:
    wall, cpu = np.empty(steps), np.empty(steps)
    ids = np.zeros((1, 1), np.int32)
    out = np.empty((1, 1, m.vocab), np.float32)
    pc, pt, infer = time.perf_counter, time.process_time, m.infer
    for i in range(steps):
        tok = i % m.vocab
        if style == "array+out":
            ids[0, 0] = tok
            t0, c0 = pc(), pt()
            infer(ids, n_past=n_prompt, out=out)
            t1, c1 = pc(), pt()
        else:
            t0, c0 = pc(), pt()
            infer([[tok]], n_past=n_prompt)
            t1, c1 = pc(), pt()
        wall[i], cpu[i] = t1 - t0, c1 - c0
    return wall, cpu


def small_model_step() -> tuple[float, float] | None:
    """(wall s, CPU s) of one small-model Colibri int8 decode step in the
    committed last full run, or None."""
    try:
        e = json.loads(RESULTS.read_text())["models"]["small"]["engines"]["colibri int8"]
        return 1 / e["decode_tok_s"], 1 / e["decode_tok_s_cpu"]
    except (OSError, KeyError, ValueError):
        return None


def measure(model: Path, so: Path, exe: Path, steps: int, rounds: int) -> dict:
    samples = {k: ([], []) for k in ("direct C", "array+out", "list")}
    with Model(model, library=so) as m:
        n_prompt = min(N_PROMPT, m.max_seq_len - 1)
        m.infer(np.arange(1, n_prompt + 1) % m.vocab)              # the prompt, untimed
        binding(m, min(steps, 200), "array+out", n_prompt)         # warm-up
        for _ in range(rounds):
            for name in samples:
                w, c = (direct(exe, so, model, steps, n_prompt) if name == "direct C"
                        else binding(m, steps, name, n_prompt))
                samples[name][0].append(w)
                samples[name][1].append(c)
        kernels = m.info.kernels
    med = {k: (float(np.median(np.concatenate(w))), float(np.median(np.concatenate(c))))
           for k, (w, c) in samples.items()}
    return dict(model=str(model), kernels=kernels, steps=steps, rounds=rounds,
                n_past=n_prompt,
                median_s={k: dict(wall=v[0], cpu=v[1]) for k, v in med.items()})


def report(res: dict, small) -> list[str]:
    d = res["median_s"]["direct C"]
    lines = [f"{Path(res['model']).name} (kernels {res['kernels']}), {res['rounds']} rounds "
             f"x {res['steps']} one-token decode calls each, medians:",
             "| | wall µs | CPU µs | wall ratio | CPU ratio | overhead wall µs | "
             "overhead CPU µs | overhead / small-model step (CPU) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for k, v in res["median_s"].items():
        ow, oc = v["wall"] - d["wall"], v["cpu"] - d["cpu"]
        rel = f"{100 * oc / small[1]:.3f} %" if small and k != "direct C" else "–"
        lines.append(f"| {k} | {1e6 * v['wall']:.2f} | {1e6 * v['cpu']:.2f} | "
                     f"{v['wall'] / d['wall']:.3f} | {v['cpu'] / d['cpu']:.3f} | "
                     + ("– | – |" if k == "direct C" else f"{1e6 * ow:.2f} | {1e6 * oc:.2f} |")
                     + f" {rel} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.binding_overhead",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, action="append",
                    help=".colibri file (repeatable); default: bench's tiny f32 and int8")
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write the measurements as JSON")
    args = ap.parse_args(argv)
    so, exe = build()
    models = args.model
    if not models:
        from . import models as bench_models
        ms = bench_models.prepare("tiny", OUT_DIR / "models", with_gguf=False)
        models = [ms.colibri["f32"], ms.colibri["int8"]]
    small = small_model_step()
    results = []
    for model in models:
        res = measure(model, so, exe, args.steps, args.rounds)
        results.append(res)
        print("\n".join(report(res, small)))
        print()
    if small:
        print(f"small-model decode step: {1e3 * small[0]:.2f} ms wall, {1e3 * small[1]:.2f} ms "
              f"CPU (Colibri int8, from {RESULTS.relative_to(ROOT)}: the last full run, "
              "not timed here)")
    if args.json:
        args.json.write_text(json.dumps(dict(results=results, small_step_s=small), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
