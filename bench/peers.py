"""The peer engines, one per process (`python -m bench.peers ENGINE ...`), each
timed exactly as bench/c/colibri_bench.c `speed` times Colibri and printing
the same JSON: prefill_s (every repetition of a fresh 128-token prefill),
decode_s (every greedy decode step after a prompt, batch 1, KV cache), the
same as process CPU time (prefill_cpu_s, decode_cpu_s) and tokens (the
greedy tokens: the prompt's next token, then one per step).

Engines, all single-threaded (the caller also sets OMP/OPENBLAS/MKL threads 1):
  reference     colibri.model.reference.Reference on a .colibri file (numpy)
  transformers  MixtralForCausalLM from the HF directory, torch 1 thread
  llama         llama-cpp-python on a GGUF file, n_threads = n_threads_batch = 1

Every engine computes the logits of all prefill positions (Colibri's API
always does; llama.cpp is asked to with logits_all=True) so prefill is the
same work everywhere. --expect (llama): before timing, greedy-decode from the
prompt and compare with the given tokens (transformers' on the same weights).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402


class Engine:
    """prefill(tokens) -> logits of the last position; step(token, n_past) ->
    logits; start(prompt) -> last logits (fresh sequence)."""


class ReferenceEngine(Engine):
    def __init__(self, path):
        from colibri.model.reference import Reference
        self.ref = Reference(path)

    def start(self, tokens):
        return self.ref.forward(np.asarray(tokens)[None], n_past=0)[0, -1]

    prefill = start

    def step(self, token, n_past):
        return self.ref.forward(np.array([[token]]), n_past=n_past)[0, -1]


class TransformersEngine(Engine):
    def __init__(self, path):
        import torch
        from transformers import MixtralForCausalLM
        torch.set_num_threads(1)
        self.torch = torch
        self.model = MixtralForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.cache = None

    def start(self, tokens):
        with self.torch.inference_mode():
            out = self.model(input_ids=self.torch.tensor([list(tokens)]), use_cache=True)
        self.cache = out.past_key_values
        return out.logits[0, -1].numpy()

    prefill = start

    def step(self, token, n_past):
        with self.torch.inference_mode():
            out = self.model(input_ids=self.torch.tensor([[token]]),
                             past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return out.logits[0, -1].numpy()


class LlamaEngine(Engine):
    def __init__(self, path, n_ctx=512):
        import llama_cpp
        self.llm = llama_cpp.Llama(
            model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
            n_threads=1, n_threads_batch=1, logits_all=True,
            # float32 KV cache as Colibri's (llama.cpp's default is f16)
            type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
            use_mmap=True, verbose=False)

    def start(self, tokens):
        self.llm.reset()
        self.llm.eval(list(map(int, tokens)))
        return self.llm.scores[self.llm.n_tokens - 1]

    prefill = start

    def step(self, token, n_past):
        assert self.llm.n_tokens == n_past
        self.llm.eval([int(token)])
        return self.llm.scores[self.llm.n_tokens - 1]


ENGINES = {"reference": ReferenceEngine, "transformers": TransformersEngine, "llama": LlamaEngine}


def greedy(engine, prompt, n_steps, budget_s=None, times=None, cpu_times=None):
    """Greedy tokens from prompt: [next of prompt, then one per step]; each
    step's wall and process CPU time appended to times / cpu_times."""
    toks = [int(np.argmax(engine.start(prompt)))]
    start = time.perf_counter()
    n = len(prompt)
    while len(toks) <= n_steps:
        if budget_s is not None and len(toks) > 3 and time.perf_counter() - start > budget_s:
            break
        t0, c0 = time.perf_counter(), time.process_time()
        logits = engine.step(toks[-1], n)
        if times is not None:
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
        toks.append(int(np.argmax(logits)))
        n += 1
    return toks


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers")
    p.add_argument("engine", choices=sorted(ENGINES))
    p.add_argument("model")
    p.add_argument("tokens", help="text file of token ids")
    p.add_argument("n_prompt", type=int)
    p.add_argument("n_prefill", type=int)
    p.add_argument("prefill_reps", type=int)
    p.add_argument("decode_budget_s", type=float)
    p.add_argument("max_decode", type=int)
    p.add_argument("--expect", help="comma-separated greedy tokens to check first")
    a = p.parse_args(argv)
    tokens = [int(t) for t in open(a.tokens).read().split()]
    t0 = time.perf_counter()
    engine = ENGINES[a.engine](a.model)
    out = {"load_s": time.perf_counter() - t0}
    if a.expect:
        want = [int(t) for t in a.expect.split(",")]
        got = greedy(engine, tokens[:a.n_prompt], len(want) - 1)
        out["check"] = {"expected": want, "got": got, "equal": got == want}
    pre, pre_cpu = [], []
    for _ in range(a.prefill_reps):
        t0, c0 = time.perf_counter(), time.process_time()
        engine.prefill(tokens[:a.n_prefill])
        pre.append(time.perf_counter() - t0)
        pre_cpu.append(time.process_time() - c0)
    dec, dec_cpu = [], []
    toks = greedy(engine, tokens[:a.n_prompt], a.max_decode, a.decode_budget_s, dec, dec_cpu)
    out.update(prefill_s=pre, prefill_cpu_s=pre_cpu, decode_s=dec, decode_cpu_s=dec_cpu,
               tokens=toks)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
