"""The benchmark's harnesses on the tiny model.

1. The GGUF writer (bench/gguf_export.py) produces the same model
for llama.cpp as the checkpoint is for transformers: expert stacking, the q/k
row permutation for llama.cpp's RoPE layout, rope_theta, eps and the router
all have to be right for the greedy tokens and the logits to agree. Without
this the benchmark's llama.cpp figures would be of a different model.

llama-cpp-python and gguf are bench-only packages (scripts/bench.sh installs
them); without them this test is skipped.

2. The thread benchmark (bench/threads.py --quick, one round): it runs end to
end, every Colibri row has figures, the figures are what the raw times say
(median of the rounds' medians), and the answers agree with each other
(last-only vs all-positions prefill, 1 vs 2 threads, vnni=0 vs VNNI).
Nothing about speed is asserted.
"""
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _need_bench_packages():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: it is a "
                        "bench-only package (scripts/bench.sh installs it), not part of the "
                        "test setup")
    pytest.importorskip("gguf", reason="gguf is not installed: it is a bench-only package "
                        "(scripts/bench.sh installs it), not part of the test setup")


def test_gguf_f32_matches_transformers(tmp_path):
    _need_bench_packages()
    from bench.gguf_export import write_gguf
    from bench.models import write_tiny_checkpoint
    from bench.peers import LlamaEngine, TransformersEngine, greedy

    hf_dir = tmp_path / "hf"
    write_tiny_checkpoint(hf_dir, seed=3)
    gguf_path = write_gguf(hf_dir, tmp_path / "tiny-f32.gguf", "f32")
    prompt = [int(t) for t in np.random.default_rng(5).integers(3, 96, 12)]

    hf, ll = TransformersEngine(hf_dir), LlamaEngine(gguf_path)
    # The logits of a 12-token prompt (all positions' attention and RoPE).
    np.testing.assert_allclose(ll.start(prompt), hf.start(prompt), rtol=1e-3, atol=1e-3)
    # And 16 greedy decode steps through the KV caches.
    want = greedy(hf, prompt, 16)
    assert greedy(ll, prompt, 16) == want


def test_model_set_with_gguf_serves_a_run_without(tmp_path):
    """bench/models.prepare: a set generated with its GGUF files is reused as
    it is by a run that wants none (context.py --no-llama), not deleted and
    regenerated; one generated without them is regenerated for a run that
    wants them."""
    pytest.importorskip("gguf", reason="gguf is not installed")
    from bench import models

    logs = []
    ms = models.prepare("tiny", tmp_path, seed=1, log=logs.append, with_gguf=True)
    made = {p: p.stat().st_mtime_ns for p in ms.dir.iterdir() if p.is_file()}
    assert any(p.suffix == ".gguf" for p in made)
    n = len(logs)
    models.prepare("tiny", tmp_path, seed=1, log=logs.append, with_gguf=False)
    assert len(logs) == n, logs[n:]  # nothing generated
    assert {p: p.stat().st_mtime_ns for p in ms.dir.iterdir() if p.is_file()} == made

    other = tmp_path / "other"
    models.prepare("tiny", other, seed=1, log=logs.append, with_gguf=False)
    n = len(logs)
    ms2 = models.prepare("tiny", other, seed=1, log=logs.append, with_gguf=True)
    assert len(logs) > n and any(p.suffix == ".gguf" for p in ms2.dir.iterdir())


def test_threads_summary_is_median_of_round_medians():
    """The figure of a cell: tokens / (median over rounds of each round's
    median time); llama-bench's avg_ts taken as it reports it."""
    from bench.threads import ratios, summarise
    plan = {"n_prefill": 100}
    def cell(pl, pa, dec):
        return {"prefill_last": {"wall_s": pl, "cpu_s": [2 * x for x in pl]},
                "prefill_all": {"wall_s": pa, "cpu_s": pa}, "decode": {"wall_s": dec, "cpu_s": dec}}
    rounds = [{"servers": {"colibri f32": {1: cell([1.0, 3.0], [2.0], [0.1, 0.1, 0.4]),
                                           2: cell([0.5], [1.0], [0.05])}},
               "llama_bench": {"llama-bench native f32": {
                   "rows": [{"n_prompt": 128, "n_gen": 0, "n_threads": 1, "avg_ts": 40.0},
                            {"n_prompt": 0, "n_gen": 32, "n_threads": 1, "avg_ts": 8.0}],
                   "process_cpu_s": 3.0, "process_wall_s": 2.0}}},
              {"servers": {"colibri f32": {1: cell([4.0], [4.0], [0.2]),
                                           2: cell([0.5], [1.0], [0.05])}},
               "llama_bench": {"llama-bench native f32": {
                   "rows": [{"n_prompt": 128, "n_gen": 0, "n_threads": 1, "avg_ts": 60.0},
                            {"n_prompt": 0, "n_gen": 32, "n_threads": 1, "avg_ts": 12.0}],
                   "process_cpu_s": 3.0, "process_wall_s": 2.0}}},
              {"servers": {"colibri f32": {1: cell([2.0], [3.0], [0.25]),
                                           2: cell([1.0], [1.0], [0.1])}},
               "llama_bench": {"llama-bench native f32": {
                   "rows": [{"n_prompt": 128, "n_gen": 0, "n_threads": 1, "avg_ts": 50.0},
                            {"n_prompt": 0, "n_gen": 32, "n_threads": 1, "avg_ts": 10.0}],
                   "process_cpu_s": 3.0, "process_wall_s": 2.0}}}]
    t = summarise(rounds, plan)
    c = t["colibri f32"]["1"]
    # rounds' medians 2.0, 4.0, 2.0 s -> 2.0 s -> 50 tok/s; CPU twice the time
    assert c["prefill_last"]["tok_s"] == pytest.approx(50.0)
    assert c["prefill_last"]["tok_s_cpu"] == pytest.approx(25.0)
    assert c["prefill_all"]["tok_s"] == pytest.approx(100 / 3.0)
    assert c["decode"]["tok_s"] == pytest.approx(1 / 0.2)  # medians 0.1, 0.2, 0.25
    assert t["llama-bench native f32"]["1"]["prefill_last"]["tok_s"] == 50.0
    assert t["llama-bench native f32"]["1"]["decode"]["tok_s"] == 10.0
    r = {(lab, th, m): w for lab, th, m, w, _, _ in ratios(t)}
    assert r[("colibri f32 / llama-bench native f32", 1, "prefill_last")] == pytest.approx(1.0)
    assert r[("colibri f32 / llama-bench native f32", 1, "decode")] == pytest.approx(0.5)
    assert r[("colibri f32: 2 threads / 1 thread", "2/1", "prefill_last")] == pytest.approx(4.0)
    assert ("colibri f32 / llama-bench native f32", 1, "prefill_all") not in r


def test_threads_pairs_a_gguf_import_with_its_llama_bench_file():
    """An imported GGUF file ("colibri q4_0 gguf") is judged against
    llama-bench on that very file, and its greedy tokens are compared with
    no other engine's (no other file holds its values)."""
    from bench.threads import consistency, ratios
    t = {"colibri q4_0 gguf": {"1": {"decode": {"tok_s": 30.0, "tok_s_cpu": 30.0}}},
         "llama-bench native q4_0": {"1": {"decode": {"tok_s": 20.0, "tok_s_cpu": None}}},
         "llama-bench native q4_k_m": {"1": {"decode": {"tok_s": 10.0, "tok_s_cpu": None}}}}
    r = {(lab, th, m): w for lab, th, m, w, _, _ in ratios(t)}
    assert r[("colibri q4_0 gguf / llama-bench native q4_0", 1, "decode")] == pytest.approx(1.5)
    assert not any("q4_k_m" in lab and "gguf" in lab for lab, _, _ in r)
    dec = {"decode": {"tokens": [5, 6]}, "prefill_last": {"argmax": 5},
           "prefill_all": {"argmax": 5}}
    c = consistency([{"servers": {"colibri q4_0 gguf": {1: dec, 2: dec},
                                  "colibri q4": {1: {"decode": {"tokens": [7, 8]}}}}}])
    assert c["colibri q4_0 gguf"] == {"decode_tokens_equal_across_threads": True,
                                      "prefill_last_argmax_equals_all": True}


def test_threads_bench_quick_runs(tmp_path):
    """bench/threads.py --quick --rounds 1 end to end on the tiny model (the
    models and libraries cached under build/bench, as the benchmark keeps
    them), then its JSON checked for figures and agreeing answers."""
    import json
    from bench import threads
    out = tmp_path / "out"
    assert threads.main(["--quick", "--rounds", "1", "--out", str(out)]) == 0
    res = json.loads((out / "threads.json").read_text())
    assert (out / "threads.md").read_text().startswith("# Thread benchmark (quick")
    assert res["env"]["cpu"]["model"] and "avx2" in res["env"]["cpu"]["flags"]
    t = res["table"]
    api = res["threads_api"]
    for eng in ("colibri f32", "colibri int8", "colibri int8 vnni=0"):
        for n in ((1, 2) if api else (1,)):
            for m in (("prefill_last", "prefill_all", "decode") if api
                      else ("prefill_all", "decode")):
                assert t[eng][str(n)][m]["tok_s"] > 0, (eng, n, m)
                assert t[eng][str(n)][m]["tok_s_cpu"] > 0, (eng, n, m)
    # the vnni=0 build really runs the non-VNNI int8 table
    assert res["kernels"]["colibri int8 vnni=0"] != "avx2-vnni"
    con = res["consistency"]
    # the int8 kernels are bit-identical across tables: same greedy tokens
    assert con["colibri int8 vnni=0"]["greedy_equal_to_colibri_int8"] is True
    if api:
        for eng in ("colibri f32", "colibri int8", "colibri int8 vnni=0"):
            assert con[eng]["decode_tokens_equal_across_threads"] is True, eng
            assert con[eng]["prefill_last_argmax_equals_all"] is True, eng
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return
    for q in ("f32", "q8_0"):
        assert t[f"llama-cpp-python {q}"]["2"]["decode"]["tok_s"] > 0
        assert res["consistency"][f"llama-cpp-python {q}"]["prefill_last_argmax_equals_all"]


def test_committed_quantize_reports_render_from_their_results():
    """bench/quantize.py's report is a function of the run's JSON alone (its
    date the run's, not the rendering's): every committed quantize*.json
    renders to its committed .md, so a reader can trust the two agree."""
    import json
    from bench import quantize
    found = sorted(ROOT.glob("bench/results/*/quantize*.json"))
    assert found
    for js in found:
        md = js.with_suffix(".md")
        assert quantize.report(json.loads(js.read_text())) == md.read_text(), md


def test_threads_two_thread_ratio_over_rounds_both_cores_streamed():
    """At 2 threads, each engine's rounds whose pairing probes (before and
    after) both reach PAIRED_MIN give a second figure, and the ratio over
    those rounds alone is reported beside the all-rounds one; a round with
    a probe below, or none, does not count."""
    from bench.threads import PAIRED_MIN, ratios, summarise
    hi, lo = PAIRED_MIN + 0.3, PAIRED_MIN - 0.3

    def cell(dec):
        return {m: {"wall_s": [dec], "cpu_s": [dec]} for m in ("prefill_last", "prefill_all",
                                                               "decode")}

    def lb(ts2):
        return {"rows": [{"n_prompt": 0, "n_gen": 32, "n_threads": 1, "avg_ts": 10.0},
                         {"n_prompt": 0, "n_gen": 32, "n_threads": 2, "avg_ts": ts2}],
                "process_cpu_s": 1.0, "process_wall_s": 1.0}

    # colibri at 2 threads: 0.05 s (paired), 0.10 (not), 0.04 (paired);
    # llama-bench: 15 (not), 16 (paired), 18 (paired)
    pairs = [([hi, hi], [lo, hi]), ([hi, lo], [hi, hi]), ([hi, hi], [hi, hi])]
    rounds = [{"servers": {"colibri int8": {1: cell(0.1), 2: cell(d)}},
               "llama_bench": {"llama-bench native q8_0": lb(ts)},
               "pairing": {"colibri int8": pc, "llama-bench native q8_0": pl}}
              for d, ts, (pc, pl) in zip((0.05, 0.10, 0.04), (15.0, 16.0, 18.0), pairs)]
    t = summarise(rounds, {"n_prefill": 1})
    dec = t["colibri int8"]["2"]["decode"]
    assert dec["rounds_paired"] == [True, False, True]
    assert dec["tok_s"] == pytest.approx(20.0)           # median of 20, 10, 25
    assert dec["tok_s_paired"] == pytest.approx(22.5)    # median of 20, 25
    assert t["colibri int8"]["1"]["decode"]["rounds_paired"] == [None] * 3
    assert t["llama-bench native q8_0"]["2"]["decode"]["tok_s_paired"] == pytest.approx(17.0)
    r = {(lab, th, m): w for lab, th, m, w, _, _ in ratios(t)}
    assert r[("colibri int8 / llama-bench native q8_0", 2, "decode")] == pytest.approx(20 / 16)
    assert r[("colibri int8 / llama-bench native q8_0, both cores streaming", 2, "decode")] \
        == pytest.approx(22.5 / 17.0)
    assert not any(lab.endswith("streaming") and th == 1 for lab, th, _ in r)
    # no probes at all (an older threads.json): no second figure, no second ratio
    for rnd in rounds:
        del rnd["pairing"]
    t = summarise(rounds, {"n_prefill": 1})
    assert t["colibri int8"]["2"]["decode"]["tok_s_paired"] is None
    assert not any(lab.endswith("streaming") for lab, _, _ in
                   {(lab, th, m) for lab, th, m, *_ in ratios(t)})


def test_context_two_thread_ratio_over_rounds_both_cores_streamed():
    """bench/context.py: the 2-thread figures of the rounds whose pairing
    probes (before and after, per engine and N) both reach PAIRED_MIN make a
    second table, and its section gives the ratio over those rounds; the
    1-thread figures never enter it, and a round without a probe does not."""
    from bench import context
    from bench.threads import PAIRED_MIN
    hi, lo = PAIRED_MIN + 0.3, PAIRED_MIN - 0.3
    ours, peer = context.engine("int8", "f32"), f"llama-bench {context.PEER['int8']}"

    def cell(dec):
        return {"decode": {"wall": dec, "cpu": dec}, "prefill": {"wall": 2 * dec, "cpu": dec}}

    # decode tok/s at 2 threads, colibri: 20 (paired), 10 (not), 30 (paired);
    # llama-bench: 15 (not), 16 (paired), 18 (paired)
    rounds = [{"bandwidth_gb_s": {}, ours: {"2048": {"1": cell(1.0), "2": cell(c)}},
               peer: {"2048": {"1": cell(1.0), "2": cell(p)}},
               "pairing": {f"{ours} N=2048": pc, f"{peer} N=2048": pp}}
              for c, p, pc, pp in ((20.0, 15.0, [hi, hi], [lo, hi]),
                                   (10.0, 16.0, [hi, lo], [hi, hi]),
                                   (30.0, 18.0, [hi, hi], [hi, hi]))]
    all_rounds, only = context.summarise(rounds), context.summarise(rounds, paired_only=True)
    assert all_rounds[ours]["2048"]["2"]["decode"]["wall"] == pytest.approx(20.0)
    assert only[ours]["2048"]["2"]["decode"]["wall"] == pytest.approx(25.0)   # 20, 30
    assert only[peer]["2048"]["2"]["decode"]["wall"] == pytest.approx(17.0)   # 16, 18
    assert "1" not in only[ours]["2048"]
    res = {"raw": rounds, "table_paired": only, "precisions": ["int8"], "kv": ["f32"],
           "positions": [2048]}
    text = "\n".join(context._paired_section(res))
    # prefill is twice decode: 50 (40, 60) over 34 (32, 36)
    assert f"| colibri int8 | f32 | 2048 | **{50 / 34:.2f}x** | **{25 / 17:.2f}x** |" in text
    assert f"{hi:.2f} / {hi:.2f} ✓" in text and f"{hi:.2f} / {lo:.2f} |" in text
    for rnd in rounds:      # an older context.json: no probes, no section
        del rnd["pairing"]
    assert context._paired_section({**res, "raw": rounds}) == []
