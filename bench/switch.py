"""Switch Transformers (encoder-decoder) on Colibri against transformers and
the numpy reference: encoder time and decoder step time, wall and CPU,
on one randomly initialised model (no download), one thread by default.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m bench.switch [--quick] [--threads N]

Prints one table: per engine the median encode time of an N-token input
(batch 1) and the median time of one cached decode step (after the start
token), wall and CPU, and the ratio to transformers. Colibri computes the
cross-attention K/V in colibri_encode; transformers and the numpy reference
in their first decoder step (counted in the decode figures). Colibri runs through
colibri.runtime (libcolibri.so: python -m colibri.buildsteps.cbuild first), f32 and
int8 files converted from the same loaded model. --threads N gives Colibri
N workers (colibri_set_threads, and once more with spinning workers) and
torch N threads; the numpy reference keeps OPENBLAS_NUM_THREADS. CPU time is
the whole process's, so at N threads it counts every worker. Nothing is
asserted: these are measurements.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIG = dict(vocab_size=2048, d_model=256, d_kv=32, d_ff=512, num_heads=8, num_experts=8,
              expert_capacity=64, num_layers=4, num_sparse_encoder_layers=2,
              num_decoder_layers=4, num_sparse_decoder_layers=2,
              relative_attention_num_buckets=32, relative_attention_max_distance=128,
              dropout_rate=0.0, router_jitter_noise=0.0, decoder_start_token_id=0)


def timed(fn, reps: int):
    """Median wall and CPU seconds of fn() over reps runs after one warm-up."""
    fn()
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--tokens", type=int, metavar="N",
                    help="encoder input tokens (default 64, --quick 32); the files are "
                         "converted with room for max(N, 128) positions")
    ap.add_argument("--threads", type=int, default=1, metavar="N",
                    help="Colibri's workers and torch's threads (default 1)")
    args = ap.parse_args(argv)
    import torch
    import transformers

    from colibri.model.convert import ColibriExporter
    from colibri.model.reference_encdec import from_file
    from colibri.runtime import Model

    torch.set_num_threads(args.threads)
    reps, n_enc, n_steps = (3, 32, 4) if args.quick else (7, 64, 16)
    n_enc = args.tokens or n_enc
    torch.manual_seed(0)
    config = transformers.SwitchTransformersConfig(**CONFIG)
    config._attn_implementation = "eager"
    hf = transformers.SwitchTransformersForConditionalGeneration(config).float().eval()
    ids = np.random.default_rng(1).integers(2, CONFIG["vocab_size"], size=(1, n_enc))
    tmp_dir = tempfile.TemporaryDirectory(prefix="colibri-switch-bench-")  # removed at exit
    tmp = Path(tmp_dir.name)
    files = {q: ColibriExporter(model=hf, quant=q, max_seq_len=max(n_enc, 128)).export(tmp / f"{q}.colibri")
             for q in ("f32", "int8")}

    rows = {}
    t_ids = torch.as_tensor(ids)
    with torch.no_grad():
        enc = hf.get_encoder()(input_ids=t_ids)

        def hf_encode():
            hf.get_encoder()(input_ids=t_ids)

        def hf_decode():   # start token, then n_steps cached steps
            cache = transformers.EncoderDecoderCache(transformers.DynamicCache(config=config),
                                                     transformers.DynamicCache(config=config))
            tok = torch.zeros((1, 1), dtype=torch.long)
            for _ in range(n_steps + 1):
                out = hf(encoder_outputs=enc, decoder_input_ids=tok, cache=cache, use_cache=True)
                cache = out.cache
                tok = out.logits[:, -1:].argmax(-1)
        rows["transformers f32"] = (timed(hf_encode, reps), timed(hf_decode, reps))

    # at 1 thread one run; at N, plain (sleeping) workers and spinning ones
    spins = (False,) if args.threads == 1 else (False, True)
    for q, path in files.items():
        for spin in spins:
            m = Model(path, threads=args.threads, spin=spin)
            m.encode(ids)

            def c_decode(m=m):
                tok = np.zeros((1, 1), np.int32)
                for i in range(n_steps + 1):
                    tok = m.infer(tok, n_past=i)[:, -1:].argmax(-1).astype(np.int32)
            name = f"colibri {q}" + (" spin" if spin else "")
            rows[name] = (timed(lambda m=m: m.encode(ids), reps), timed(c_decode, reps))
            m.close()
        ref = from_file(path)

        ref.encode(ids)

        def r_decode(ref=ref):
            ref.reset_decoder()   # its first step computes the cross-attention K/V
            tok = [[0]]
            for _ in range(n_steps + 1):
                tok = ref.decode(tok)[:, -1:].argmax(-1)
        rows[f"numpy reference {q}"] = (timed(lambda ref=ref: ref.encode(ids), reps),
                                        timed(r_decode, reps))

    (hf_enc, _), (hf_dec, _) = rows["transformers f32"]
    from bench.threads import cpu_description, cpu_features
    cpu = cpu_description()
    print(f"CPU: {cpu['model']}, {cpu['cores']} cores ({cpu_features(cpu)})")
    print(f"Switch encoder-decoder, d_model {CONFIG['d_model']}, {CONFIG['num_experts']} "
          f"experts, {CONFIG['num_layers']}+{CONFIG['num_decoder_layers']} layers; encoder "
          f"input {n_enc} tokens; decode = start token + {n_steps} cached steps; "
          f"{args.threads} thread(s) (numpy reference: OPENBLAS_NUM_THREADS="
          f"{os.environ.get('OPENBLAS_NUM_THREADS')})\n")
    print("| engine | encode wall ms | encode CPU ms | vs transformers | decode step wall ms "
          "| decode CPU ms | vs transformers |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, ((ew, ec), (dw, dc)) in rows.items():
        k = n_steps + 1
        print(f"| {name} | {ew * 1e3:.2f} | {ec * 1e3:.2f} | {hf_enc / ew:.2f}x | "
              f"{dw / k * 1e3:.3f} | {dc / k * 1e3:.3f} | {hf_dec / dw:.2f}x |")
    print("\n(vs transformers: its time / this engine's time; > 1 is faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
