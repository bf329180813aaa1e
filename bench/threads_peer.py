"""llama-cpp-python's side of the thread benchmark (bench/threads.py): the
same stdin command protocol as bench/c/threads_bench.c, so the harness drives
both alike and interleaves them round after round without reloading models.

    python -m bench.threads_peer MODEL.gguf TOKENS

Commands (one per stdin line; one JSON object per stdout line in answer):
  threads N SPIN           n_threads = n_threads_batch = N (llama_set_n_threads
                           on the loaded contexts; SPIN must be 0: ggml's thread
                           pool has its own policy)
  prefill last|all N REPS  REPS fresh prefills of TOKENS[0:N]; last: a context
                           made with logits_all=False (llama.cpp computes the
                           last position's logits only, as llama-bench's pp
                           test does); all: logits_all=True (every position)
  decode N_PROMPT STEPS    prompt (untimed), then STEPS greedy single-token evals
  info, quit

Two Llama objects share the GGUF (mmap): one per logits mode, because
logits_all is fixed when a context is made. KV cache float32 like
Colibri's (llama.cpp's default is f16), 512 positions, batch = ubatch = 512.
CPU time is time.process_time(): all threads of this process.
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np

N_CTX = 512


def _llama(path: str, logits_all: bool, n_threads: int):
    import llama_cpp
    return llama_cpp.Llama(
        model_path=path, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX,
        n_threads=n_threads, n_threads_batch=n_threads, logits_all=logits_all,
        type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
        use_mmap=True, verbose=False)


def _set_threads(llm, n: int) -> None:
    import llama_cpp
    llama_cpp.llama_set_n_threads(llm.ctx, n, n)
    llm.n_threads = llm.n_threads_batch = n  # what the object reports


def _last_logits(llm) -> np.ndarray:
    """The last evaluated position's logits, from the context itself: with
    logits_all=False llama-cpp-python does not copy them into llm.scores."""
    import llama_cpp
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))


def serve(path: str, tokens: list[int], inp=sys.stdin, out=sys.stdout) -> None:
    t0 = time.perf_counter()
    ctx = {"last": _llama(path, False, 1), "all": _llama(path, True, 1)}
    threads = 1

    def say(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    say({"ready": True, "load_s": time.perf_counter() - t0})
    for line in inp:
        f = line.split()
        if not f:
            continue
        try:
            if f[0] == "quit":
                break
            if f[0] == "info":
                import llama_cpp
                say({"kernels": "ggml", "threads_api": 1, "llama_cpp_python":
                     getattr(llama_cpp, "__version__", "?"),
                     "system_info": llama_cpp.llama_print_system_info().decode()})
            elif f[0] == "threads":
                n, spin = int(f[1]), int(f[2]) if len(f) > 2 else 0
                if spin:
                    say({"error": "llama.cpp has no spin-only mode switch here"})
                    continue
                for llm in ctx.values():
                    _set_threads(llm, n)
                threads = n
                say({"threads": n, "spin": 0})
            elif f[0] == "prefill":
                mode, n, reps = f[1], int(f[2]), int(f[3])
                llm = ctx[mode]
                wall, cpu = [], []
                for _ in range(reps):
                    w0, c0 = time.perf_counter(), time.process_time()
                    llm.reset()
                    llm.eval(tokens[:n])
                    wall.append(time.perf_counter() - w0)
                    cpu.append(time.process_time() - c0)
                say({"wall_s": wall, "cpu_s": cpu,
                     "argmax": int(np.argmax(_last_logits(llm)))})
            elif f[0] == "decode":
                n_prompt, steps = int(f[1]), int(f[2])
                llm = ctx["last"]
                llm.reset()
                llm.eval(tokens[:n_prompt])
                gen = [int(np.argmax(_last_logits(llm)))]
                wall, cpu = [], []
                for _ in range(steps):
                    w0, c0 = time.perf_counter(), time.process_time()
                    llm.eval([gen[-1]])
                    wall.append(time.perf_counter() - w0)
                    cpu.append(time.process_time() - c0)
                    gen.append(int(np.argmax(_last_logits(llm))))
                say({"wall_s": wall, "cpu_s": cpu, "tokens": gen, "threads": threads})
            else:
                say({"error": f"unknown command {f[0]!r}"})
        except Exception as e:  # one bad command must not end the server
            say({"error": f"{type(e).__name__}: {e}"})


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m bench.threads_peer MODEL.gguf TOKENS", file=sys.stderr)
        return 2
    tokens = [int(t) for t in open(argv[1]).read().split()]
    serve(argv[0], tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
