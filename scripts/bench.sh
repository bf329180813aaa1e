#!/usr/bin/env bash
# The benchmark suite (bench/README.md): one command.
#   scripts/bench.sh            full run (tiny + small model), ~30-40 min on 2 cores
#   scripts/bench.sh --quick    tiny model only, few steps (~3 min)
#   scripts/bench.sh --threads  the thread benchmark of issue 15 (bench/threads.py:
#                               1 and 2 threads vs llama.cpp, ~15 min; first
#                               builds llama-bench, scripts/build_llama_bench.sh)
#   scripts/bench.sh --threads --quick   the same on the tiny model (~1 min)
#                               (--precisions q4: Colibri q4 vs llama-bench Q4_K_M/Q4_0 only)
#   scripts/bench.sh --context  long context (bench/context.py: prefill 2048 and decode
#                               at depth 2048, int8 and q4, float32 and int8 KV cache, vs
#                               llama-bench Q8_0 / Q4_K_M; ~10 min; extra args to context.py)
#   scripts/bench.sh --quality  quality at equal bits (bench/quality.py: KL divergence,
#                               top-1, bpb, bits per weight of Colibri int8/q4 vs
#                               llama.cpp Q8_0/Q4_K_M/Q4_0; builds llama-quantize and
#                               llama-perplexity first; ~10 min; extra args to quality.py)
# Extra arguments go to bench/run.py (see `--help`).
#
# Installs the bench-only Python packages into .venv, idempotently and without
# touching the test setup (scripts/setup.sh, pyproject.toml): llama-cpp-python
# (built from source: CPU only, no GPU back-end, no OpenMP thread pool, so
# n_threads=1 is really one thread), gguf (GGUF writer + Q8_0 quantiser) and
# matplotlib (the plot). Then builds the Colibri host library and runs.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
say() { printf '[bench] %s\n' "$*"; }

[ -x .venv/bin/python ] || { echo "[bench] no .venv: run scripts/setup.sh first" >&2; exit 1; }
py=.venv/bin/python

# --- bench-only packages ----------------------------------------------------
# Pinned so that results stay comparable between runs.
LLAMA_CPP_PYTHON_VERSION=0.3.36
GGUF_VERSION=0.19.0
MATPLOTLIB_VERSION=3.11.2
have() { "$py" - "$1" "$2" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
sys.exit(0 if md.version(sys.argv[1]) == sys.argv[2] else 1)
PY
}
pipq() { "$py" -m pip install -q "$@" 2>&1 | grep -v -e '^WARNING: Location' -e 'BuildBackendWarning' || true; }
if ! have gguf "$GGUF_VERSION" || ! have matplotlib "$MATPLOTLIB_VERSION"; then
    say "installing gguf $GGUF_VERSION, matplotlib $MATPLOTLIB_VERSION"
    pipq "gguf==$GGUF_VERSION" "matplotlib==$MATPLOTLIB_VERSION"
fi
# The quality benchmark needs gguf and llama.cpp's own tools, not llama-cpp-python.
if [ "${1:-}" = --quality ]; then
    shift
    # llama-quantize and llama-perplexity: the native build (same sources).
    LLAMA_CPP_PYTHON_VERSION=$LLAMA_CPP_PYTHON_VERSION bash scripts/build_llama_bench.sh \
        "$LLAMA_CPP_PYTHON_VERSION" native
    exec nice -n 10 "$py" bench/quality.py "$@"
fi
# The long-context benchmark needs gguf, llama-quantize and llama-bench only.
if [ "${1:-}" = --context ]; then
    shift
    LLAMA_CPP_PYTHON_VERSION=$LLAMA_CPP_PYTHON_VERSION bash scripts/build_llama_bench.sh \
        "$LLAMA_CPP_PYTHON_VERSION" native
    exec "$py" bench/context.py "$@"
fi
# AVX-VNNI only where this CPU has it: a build with it dies on SIGILL on an
# AVX2-only CPU (Zen 2/3), and one made on another machine is rebuilt here.
# pip's wheel cache is keyed by the version, not by CMAKE_ARGS, so it is
# never used for this build.
avx_vnni=OFF
grep -qw avx_vnni /proc/cpuinfo 2>/dev/null && avx_vnni=ON
llama_vnni_mismatch() {
    [ "$avx_vnni" = OFF ] && "$py" -c 'import llama_cpp, sys
sys.exit(0 if b"AVX_VNNI = 1" in llama_cpp.llama_print_system_info() else 1)' 2>/dev/null
}
reinstall=()
llama_vnni_mismatch && reinstall=(--force-reinstall --no-deps)
if ! have llama_cpp_python "$LLAMA_CPP_PYTHON_VERSION" || [ ${#reinstall[@]} -gt 0 ]; then
    say "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION from source (CPU only, AVX-VNNI $avx_vnni; several minutes)"
    # CPU back-end only; no CUDA/Metal/Vulkan/BLAS; no OpenMP so that the
    # ggml thread pool honours n_threads=1 without an idle spinning team.
    # Same instruction set as Colibri's x86 kernels (AVX2 + FMA + F16C, and
    # AVX-VNNI where present), not -march=native: a CPU may also have
    # AVX-512 and AMX, which Colibri's avx2 table does not use, and the
    # comparison is of engines, not of ISAs.
    CMAKE_ARGS="-DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=$avx_vnni -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_BMI2=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=2 \
        pipq --no-binary llama-cpp-python --no-cache-dir "${reinstall[@]}" \
            "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
fi
"$py" -c 'import llama_cpp, gguf, matplotlib' \
    || { echo "[bench] bench packages did not install (see pip output above)" >&2; exit 1; }

# --- run --------------------------------------------------------------------
[ "${BENCH_INSTALL_ONLY:-0}" = 1 ] && { say "packages present"; exit 0; }
if [ "${1:-}" = --threads ]; then
    shift
    # llama.cpp's own llama-bench from the same sources as llama-cpp-python
    # (native and AVX2-only builds; idempotent, pinned to the same version).
    LLAMA_CPP_PYTHON_VERSION=$LLAMA_CPP_PYTHON_VERSION bash scripts/build_llama_bench.sh
    exec "$py" bench/threads.py "$@"
fi
exec "$py" bench/run.py "$@"
