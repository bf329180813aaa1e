"""The results as a markdown table (printed and written to results.md) and a
PNG plot, from the results dict bench/run.py builds."""
from __future__ import annotations

from pathlib import Path

ENGINE_ORDER = ["colibri f32", "colibri int8", "colibri f32 mmap", "colibri int8 mmap",
                "llama.cpp f32", "llama.cpp q8_0",
                "transformers f32", "reference f32", "reference int8"]
# (Colibri engine, peer) pairs whose ratio the table prints.
PAIRS = [("colibri f32", "llama.cpp f32"), ("colibri int8", "llama.cpp q8_0"),
         ("colibri f32", "transformers f32"), ("colibri f32", "reference f32"),
         ("colibri int8", "reference int8"), ("colibri f32 mmap", "llama.cpp f32"),
         ("colibri int8 mmap", "llama.cpp q8_0")]


def _f(x, fmt="{:.1f}"):
    return "n/a" if x is None else fmt.format(x)


def _ratio(a, b):
    return None if not a or not b else a / b


def _goal(ok, text):
    if ok is None:
        return f"- n/a: {text}"
    return f"- {'MET' if ok else 'MISSED'}: {text}"


def _load_note(env: dict) -> str:
    load = max(env["loadavg_start"][0], env.get("loadavg_end", [0])[0])
    if load > 1.5:
        return ("The machine was shared with other work while this ran (both cores busy): "
                "wall-time figures are pessimistic and noisy; CPU-time figures remove "
                "preemption but not the memory-bandwidth and cache interference.")
    return ("Nothing else ran in this machine (a virtual machine: it shares the host's memory "
            "system with other tenants, whose load varies from minute to minute; see the "
            "latency control below).")


def markdown(r: dict) -> str:
    env, mach = r["env"], r["machine"]
    L = [f"# Colibri benchmark results ({r['mode']} run)", "",
         f"{env['date_utc']} UTC, git {env['git']}{' (src/ modified)' if env['src_dirty'] else ''}, "
         f"{env['cpu']}, {env['cores']} cores, kernels {'+'.join(env.get('kernels', []))}. "
         f"Load average {env['loadavg_start'][0]:.1f} at the start, "
         f"{env.get('loadavg_end', [0])[0]:.1f} at the end. " + _load_note(env) +
         f" Whole run: {r['wall_s'] / 60:.1f} min.",
         "", "Everything single-threaded. Medians (prefill: of the timed repetitions after a "
         "warm-up one; decode: of the per-step times). Each figure twice: from wall time, and "
         "from the process's CPU time (the time it actually held a core: on this shared "
         "machine the fairer comparison between engines, and the one the goals are judged "
         "on below; memory stalls still count as CPU time).", "",
         "Colibri rows are the x86_64 target's default build, which reads the file into memory "
         "advised for transparent huge pages; rows marked 'mmap' map the file instead (4 KiB "
         "pages; llama.cpp maps its GGUF by default).", "",
         "## Machine (same run)", "",
         f"- AVX2 FMA peak (1 core): {mach['fma_gflops']:.1f} GFLOPS wall, "
         f"{mach['fma_gflops_cpu']:.1f} GFLOPS CPU time",
         f"- memcpy bandwidth: {mach['memcpy_bytes_per_s'] / 1e9:.2f} GB/s wall, "
         f"{mach['memcpy_bytes_per_cpu_s'] / 1e9:.2f} GB/s CPU time (bytes copied); "
         f"read-only AVX2 sum: {mach['read_bytes_per_s'] / 1e9:.2f} GB/s wall, "
         f"{mach['read_bytes_per_cpu_s'] / 1e9:.2f} GB/s CPU time; {mach['buffer_mib']} MiB buffers", ""]

    goals = {}
    for name, m in r["models"].items():
        eng = m["engines"]
        c = m["config"]
        L += [f"## Model {name}: hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, "
              f"{c['num_local_experts']} experts top-{c['num_experts_per_tok']}, "
              f"intermediate {c['intermediate_size']}, vocab {c['vocab_size']}", "",
              "| engine | prefill tok/s (wall) | prefill tok/s (CPU) | decode tok/s (wall) | "
              "decode tok/s (CPU) | decode p99 ms (wall) | steps | greedy = transformers |",
              "|---|---:|---:|---:|---:|---:|---:|---|"]
        for k in ENGINE_ORDER:
            v = eng.get(k)
            if v is None:
                continue
            if "error" in v:
                L.append(f"| {k} | error | | | | | | {v['error'].strip().splitlines()[-1][:80]} |")
                continue
            p99 = v["decode"].get("p99")
            L.append(f"| {k} | {_f(v['prefill_tok_s'])} | {_f(v['prefill_tok_s_cpu'])} | "
                     f"{_f(v['decode_tok_s'], '{:.2f}')} | {_f(v['decode_tok_s_cpu'], '{:.2f}')} | "
                     f"{_f(p99 and p99 * 1e3, '{:.2f}')} | {v['decode']['n']} | "
                     f"{m['greedy_equal_to_transformers'].get(k, 'n/a')} |")
        L += ["", "| ratio (tokens/s) | prefill (wall) | prefill (CPU) | decode (wall) | decode (CPU) |",
              "|---|---:|---:|---:|---:|"]
        for a, b in PAIRS:
            va, vb = eng.get(a, {}), eng.get(b, {})
            rs = [_ratio(va.get(k), vb.get(k)) for k in
                  ("prefill_tok_s", "prefill_tok_s_cpu", "decode_tok_s", "decode_tok_s_cpu")]
            L.append(f"| {a} / {b} | " + " | ".join(_f(x, '{:.2f}x') for x in rs) + " |")
            if name == "small" and b.startswith("llama"):
                goals[f"decode {a} vs {b}"] = (rs[3], rs[2])
        chk = m.get("llama_check")
        if chk:
            L += ["", f"llama.cpp f32 greedy tokens {chk['got']} vs transformers "
                      f"{chk['expected']}: **{'equal' if chk['equal'] else 'DIFFERENT'}** "
                      "(checked before timing: the GGUF is the same model)."]
        L += ["", "Decode bandwidth (weight bytes a token reads / median step time):", "",
              "| file | MB read per token | GB/s (wall) | % of memcpy (wall) | GB/s (CPU) | "
              "% of memcpy (CPU) | % of read-only (CPU) |",
              "|---|---:|---:|---:|---:|---:|---:|"]
        for q, b in m["decode_bandwidth"].items():
            bps, bpc = b["bytes_per_s"], b.get("bytes_per_cpu_s")
            pm = _ratio(bps, mach["memcpy_bytes_per_s"])
            pc = _ratio(bpc, mach["memcpy_bytes_per_cpu_s"])
            pr = _ratio(bpc, mach["read_bytes_per_cpu_s"])
            pct = lambda x: _f(x and 100 * x, '{:.0f}%')  # noqa: E731
            L.append(f"| colibri {q} | {b['bytes_per_token'] / 1e6:.2f} | {_f(bps and bps / 1e9, '{:.2f}')} | "
                     f"{pct(pm)} | {_f(bpc and bpc / 1e9, '{:.2f}')} | {pct(pc)} | {pct(pr)} |")
            if name == "small":
                goals[f"bandwidth {q}"] = (pc, pm)
        L += ["", "Decode latency. 'cycle': the position runs from 16 to max_seq_len-1, then n_past "
                  "rewinds (attention work grows with the position, by design); 'fixed position': "
                  "every step at n_past 16, the same work each time, so any spread is jitter. "
                  "After every fixed-position step a control step reads as many bytes of a private "
                  "buffer as the decode step reads weights (rows 'control', wall time): the spread "
                  "this machine gives a constant memory stream in the same minutes. 'step-to-step' "
                  "is the std of successive differences / sqrt(2): it leaves out a slow drift of "
                  "the machine's speed, which std includes.", "",
              "| series | steps | mean ms | p50 ms | p99 ms | std ms | std % of mean | "
              "step-to-step % | std % without slowest 1% | IQR % of median | steps > 2x median |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for q, s0 in m["latency"].items():
            series = [("wall", s0), ("CPU", s0["cpu"])]
            if "control" in s0:
                series.append(("control, wall", s0["control"]))
            for clock, s in series:
                L.append(f"| colibri {q}, {clock} | {s['n']} | {s['mean'] * 1e3:.3f} | {s['p50'] * 1e3:.3f} | "
                         f"{s['p99'] * 1e3:.3f} | {s['std'] * 1e3:.3f} | {s['std_pct_of_mean']:.1f}% | "
                         f"{_f(s.get('successive_std_pct_of_mean'), '{:.1f}%')} | "
                         f"{s['std_pct_of_mean_without_slowest_1pct']:.1f}% | "
                         f"{s['iqr_pct_of_median']:.1f}% | {s['steps_over_2x_median']} |")
            if name == "small" and "control" in s0:
                goals[f"latency {q}"] = (s0["cpu"]["std_pct_of_mean"], s0["std_pct_of_mean"],
                                         s0["control"]["std_pct_of_mean"])
        L += ["", "Instructions of one decode step (callgrind, same position, different input tokens):", "",
              "| file | inputs | min | max | spread | distinct counts |", "|---|---:|---:|---:|---:|---:|"]
        for q, s in m["icount"].items():
            if "error" in s:
                L.append(f"| colibri {q} | error: {s['error'][:80]} | | | | |")
            else:
                L.append(f"| colibri {q} | {s['inputs']} | {s['min']:,} | {s['max']:,} | "
                         f"{s['spread']:,} ({s['spread_pct']:.4f}%) | {s['distinct']} |")
        L.append("")

    if "ffn" in r:
        f = r["ffn"]
        L += ["## Expert FFN at prefill (128 tokens, one layer of the small model's experts)", "",
              f"Routing of the 128 tokens over the 8 experts: {f['routing_counts']}; "
              f"{f['expert_flops'] / 1e9:.2f} GFLOP of expert matmuls per prefill. Colibri and "
              "llama.cpp: whole prefill of the ffn model (>99% expert FFN), so their figure is a "
              "slight underestimate; numpy: the three sgemm per expert alone "
              f"(OpenBLAS kernels: {f['numpy sgemm'].get('openblas_core')}).", "",
              "| engine | GFLOPS wall (int8: GOPS) | / numpy (wall) | GFLOPS CPU | / numpy (CPU) | "
              "% of FMA peak (CPU) |", "|---|---:|---:|---:|---:|---:|"]
        sg, sgc = f["numpy sgemm"]["gflops"], f["numpy sgemm"]["gflops_cpu"]
        peak = mach["fma_gflops_cpu"]
        for k in ("colibri f32", "colibri int8", "numpy sgemm", "llama.cpp f32", "llama.cpp q8_0"):
            v = f.get(k)
            if not v or "gflops" not in v:
                continue
            L.append(f"| {k} | {v['gflops']:.1f} | {v['gflops'] / sg:.2f}x | {v['gflops_cpu']:.1f} | "
                     f"{v['gflops_cpu'] / sgc:.2f}x | {100 * v['gflops_cpu'] / peak:.0f}% |")
        goals["ffn f32"] = (f["colibri f32"]["gflops_cpu"] / sgc, f["colibri f32"]["gflops"] / sg)
        L.append("")

    L += ["## Init time and peak RSS per load mode", "",
          "Init time as wall ms (CPU ms); every init checks every CRC. Peak RSS = VmHWM of the "
          "process (mapped or read file + arena).", "",
          "| file | size MB | mmap init ms | mmap RSS MB | fread init ms | fread RSS MB | "
          "memory init ms (+read ms) | memory RSS MB |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for k, v in r["init"].items():
        mm, fr, me = v["mmap"], v["fread"], v["memory"]
        ms = lambda x: f"{x['init_best_s'] * 1e3:.1f} ({x['init_best_cpu_s'] * 1e3:.1f})"  # noqa: E731
        L.append(f"| {k} | {mm['file_size'] / 1e6:.1f} | {ms(mm)} | "
                 f"{mm['peak_rss_kib'] / 1024:.1f} | {ms(fr)} | "
                 f"{fr['peak_rss_kib'] / 1024:.1f} | {ms(me)} "
                 f"(+{me['read_s'] * 1e3:.0f}) | {me['peak_rss_kib'] / 1024:.1f} |")
    cr = r["crc"]
    L += ["", f"CRC throughput (colibri_verify on {cr['file']} in memory): "
              f"{cr['bytes_per_s'] / 1e9:.2f} GB/s wall, {cr['bytes_per_cpu_s'] / 1e9:.2f} GB/s CPU time "
              f"({cr['bytes'] / 1e6:.0f} MB in {cr['best_s'] * 1e3:.0f} ms wall, "
              f"{cr['best_cpu_s'] * 1e3:.0f} ms CPU).", "",
          "## Library size per target (libcolibri.a, from the size reports)", "",
          "| target | code | data | rodata | total |", "|---|---:|---:|---:|---:|"]
    for t, v in r["library_size"].items():
        if "error" in v:
            L.append(f"| {t} | {v['error']} | | | |")
        else:
            L.append(f"| {t} | {v.get('code', 0):,} | {v.get('data', 0):,} | {v.get('rodata', 0):,} | "
                     f"{v['total']:,} |")

    L += ["", "## Goals of issue 7 (small model)", ""]
    if "decode colibri f32 vs llama.cpp f32" in goals or "bandwidth f32" in goals:
        L.append("Judged on CPU-time figures (wall-time figure in brackets).")
        L.append("")
        for k in ("decode colibri f32 vs llama.cpp f32", "decode colibri int8 vs llama.cpp q8_0",
                  "decode colibri f32 mmap vs llama.cpp f32",
                  "decode colibri int8 mmap vs llama.cpp q8_0"):
            if k not in goals:
                continue
            v, vw = goals.get(k, (None, None))
            L.append(_goal(v and v >= 1.0, f"{k}: {_f(v, '{:.2f}x')} ({_f(vw, '{:.2f}x')}) (goal >= 1.0x)"))
        v, vw = goals.get("ffn f32", (None, None))
        L.append(_goal(v and v >= 1.0, f"expert FFN prefill f32 vs numpy sgemm: {_f(v, '{:.2f}x')} "
                                       f"({_f(vw, '{:.2f}x')}) (goal >= 1.0x)"))
        for q in ("f32", "int8"):
            v, vw = goals.get(f"bandwidth {q}", (None, None))
            L.append(_goal(v and v >= 0.7, f"decode {q} at {_f(v and 100 * v, '{:.0f}%')} "
                                           f"({_f(vw and 100 * vw, '{:.0f}%')}) of memcpy bandwidth (goal >= 70%)"))
        for q in ("f32 fixed position", "int8 fixed position"):
            v, vw, vc = goals.get(f"latency {q}", (None, None, None))
            L.append(_goal(None if v is None else v <= 2.0,
                           f"decode latency std {q}: {_f(v, '{:.1f}%')} ({_f(vw, '{:.1f}%')}) of the "
                           f"mean; the control read of the same bytes in the same run: "
                           f"{_f(vc, '{:.1f}%')} (goal <= 2% on an idle machine)"))
    else:
        L.append("(quick run: the goals are judged on the small model of a full run)")
    L.append("")
    return "\n".join(L)


def plot(r: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(2, 2, figsize=(13, 9))
    names = list(r["models"])
    engines = [e for e in ENGINE_ORDER if any(e in r["models"][n]["engines"] for n in names)]
    w = 0.8 / max(1, len(engines))
    for col, key, title in ((0, "decode_tok_s_cpu", "decode tokens/s (batch 1, 1 thread, CPU time)"),
                            (1, "prefill_tok_s_cpu", "prefill tokens/s (128 tokens, 1 thread, CPU time)")):
        a = ax[0][col]
        for i, e in enumerate(engines):
            vals = [r["models"][n]["engines"].get(e, {}).get(key) or 0 for n in names]
            a.bar(np.arange(len(names)) + i * w, vals, w, label=e)
        a.set_xticks(np.arange(len(names)) + w * (len(engines) - 1) / 2)
        a.set_xticklabels(names)
        a.set_yscale("log")
        a.set_title(title)
        a.legend(fontsize=7)
    a = ax[1][0]
    for n in names:
        for q, s in r["models"][n]["latency"].items():
            v = s["cpu"]["std_pct_of_mean"]
            a.bar(f"{n}\n{q}", v, color="tab:red" if v > 2 else "tab:green")
    a.axhline(2.0, color="k", ls="--", lw=1)
    a.set_yscale("log")
    a.set_title("decode latency std from CPU time, % of mean (goal <= 2%)")
    a.tick_params(axis="x", labelsize=7)
    a = ax[1][1]
    labels, vals = [], []
    mach = r["machine"]
    labels.append("FMA peak")
    vals.append(mach["fma_gflops_cpu"])
    if "ffn" in r:
        for k in ("colibri f32", "colibri int8", "numpy sgemm", "llama.cpp f32", "llama.cpp q8_0"):
            if "gflops" in r["ffn"].get(k, {}):
                labels.append(f"FFN {k}")
                vals.append(r["ffn"][k]["gflops_cpu"])
    a.bar(labels, vals, color="tab:blue")
    a.set_ylabel("GFLOPS")
    a2 = a.twinx()
    bl, bv = ["memcpy", "read"], [mach["memcpy_bytes_per_cpu_s"] / 1e9, mach["read_bytes_per_cpu_s"] / 1e9]
    for n in names:
        if n == "tiny" and len(names) > 1:
            continue  # in cache: not a bandwidth
        for q, b in r["models"][n]["decode_bandwidth"].items():
            if b.get("bytes_per_cpu_s"):
                bl.append(f"decode {n} {q}")
                bv.append(b["bytes_per_cpu_s"] / 1e9)
    x0 = len(labels)
    a2.bar(np.arange(x0, x0 + len(bl)), bv, color="tab:orange")
    a2.set_ylabel("GB/s (orange)")
    a.set_xticks(np.arange(x0 + len(bl)))
    a.set_xticklabels(labels + bl, rotation=60, ha="right", fontsize=7)
    a.set_title("CPU time: expert FFN GFLOPS (blue), decode bandwidth GB/s (orange)")
    fig.suptitle(f"Colibri bench {r['env']['date_utc']} UTC, git {r['env']['git']} "
                 f"(load avg {r['env']['loadavg_start'][0]:.1f})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
