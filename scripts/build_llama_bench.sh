#!/usr/bin/env bash
# Builds llama.cpp's own `llama-bench` from THE SAME sources as the pinned
# llama-cpp-python of scripts/bench.sh (the llama.cpp vendored in its sdist),
# twice, into build/bench/llama.cpp/ (ignored by git). The native flavour also
# builds `llama-quantize` (Q4_K_M / Q4_0 files) and `llama-perplexity`
# (--kl-divergence), the peers of bench/quality.py; the same sdist's
# vendor/llama.cpp holds convert_hf_to_gguf.py and gguf-py:
#
#   native/  cmake defaults, as llama.cpp's README tells its users to build it
#            (`cmake -B build && cmake --build build --config Release`):
#            Release, GGML_NATIVE=ON (-march=native), OpenMP on, CPU only;
#            AMX off (see "AMX" below).
#   avx2/    what an AVX2-only CPU (AMD Zen 2/3, Intel before Alder Lake) gets:
#            GGML_NATIVE=OFF with AVX/AVX2/FMA/F16C/BMI2 on and AVX-512,
#            AVX-VNNI, AMX off -- the peer of Colibri built with `vnni=0`.
#
# Usage: scripts/build_llama_bench.sh [VERSION [FLAVOUR...]]   (default: both
# flavours; idempotent: a `.done` stamp per build holds the version, a re-run
# is a no-op once they exist; builds of different flavours may run at once).
# Needs cmake, make and a C++ compiler (Debian: apt-get install cmake g++).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=${1:-${LLAMA_CPP_PYTHON_VERSION:-0.3.36}}
shift || true
flavours=("$@"); [ ${#flavours[@]} -gt 0 ] || flavours=(native avx2)
out="$root/build/bench/llama.cpp"
jobs=${BENCH_BUILD_JOBS:-2}
say() { printf '[llama-bench] %s\n' "$*"; }
# The programs each flavour builds (llama-bench first: the thread benchmark).
targets_of() {
    case $1 in
        native) echo llama-bench llama-quantize llama-perplexity ;;
        *) echo llama-bench ;;
    esac
}

# AMX: -march=native compiles ggml's AMX kernels wherever the CPU lists
# amx_tile. On the 2-core Xeon VM of 2026-12-02 (amx_tile listed, the
# kernel granting the tile state: a probe's ldtilecfg / tilezero ran) every
# llama-bench run died with SIGILL in ggml's tinygemm_kernel_amx (tilezero
# %tmm4). Colibri has no AMX kernels, so the native flavour is -march=native
# without AMX (every other feature the CPU has stays on); its stamp says so.
native_args=(-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
if grep -qw amx_tile /proc/cpuinfo; then
    native_args+=("-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
                  "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
fi
native_stamp="$version no-amx"
stamp_of() { [ "$1" = native ] && echo "$native_stamp" || echo "$version"; }

need_build=0
for flavour in "${flavours[@]}"; do
    [ "$(cat "$out/$flavour/.done" 2>/dev/null || true)" = "$(stamp_of "$flavour")" ] || need_build=1
    for t in $(targets_of "$flavour"); do [ -x "$out/$flavour/bin/$t" ] || need_build=1; done
done
[ "$need_build" = 0 ] && { say "llama-bench $version present in $out/{${flavours[*]}}"; exit 0; }

command -v cmake >/dev/null || {
    say "installing cmake (Debian)"
    apt-get install -y -q cmake >/dev/null
}

# --- the sources: the sdist pip would build llama-cpp-python from ---------
src="$out/src/llama_cpp_python-$version"
if [ ! -f "$src/vendor/llama.cpp/CMakeLists.txt" ]; then
    mkdir -p "$out/src"
    py="$root/.venv/bin/python"; [ -x "$py" ] || py=python3
    say "downloading the llama-cpp-python $version sdist"
    "$py" -m pip download -q --no-deps --no-binary :all: \
        "llama-cpp-python==$version" -d "$out/src" 2>&1 | grep -v '^WARNING: Location' || true
    tar -xzf "$out/src/llama_cpp_python-$version.tar.gz" -C "$out/src"
fi
llama="$src/vendor/llama.cpp"

common=(-DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DGGML_METAL=OFF
        -DGGML_VULKAN=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
        -DLLAMA_BUILD_SERVER=OFF)
build_one() {  # flavour, extra cmake args...
    local flavour=$1; shift
    local dir="$out/$flavour"
    local targets t missing=0
    targets=$(targets_of "$flavour")
    for t in $targets; do [ -x "$dir/bin/$t" ] || missing=1; done
    local stamp; stamp=$(stamp_of "$flavour")
    [ "$(cat "$dir/.done" 2>/dev/null || true)" = "$stamp" ] && [ "$missing" = 0 ] && return 0
    if [ "$(cat "$dir/.done" 2>/dev/null || true)" = "$stamp" ]; then
        # A build of this version lacking a target (made before the target was
        # added here): build the missing ones into the same tree, no rebuild.
        say "adding $targets to $flavour"
    else
        say "building $flavour (cmake $*; 5-15 minutes on 2 cores)"
        rm -rf "$dir"
        cmake -S "$llama" -B "$dir" "${common[@]}" "$@" > "$out/$flavour.cmake.log" 2>&1 \
            || { say "cmake failed: see $out/$flavour.cmake.log"; exit 1; }
    fi
    # shellcheck disable=SC2086  # $targets: one word per target
    cmake --build "$dir" --target $targets -j "$jobs" > "$out/$flavour.build.log" 2>&1 \
        || { say "build failed: see $out/$flavour.build.log"; exit 1; }
    for t in $targets; do
        [ -x "$dir/bin/$t" ] || { say "no $dir/bin/$t after the build"; exit 1; }
    done
    echo "$stamp" > "$dir/.done"
    for t in $targets; do say "$dir/bin/$t"; done
}
avx2_args=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
    -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF \
    -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
for flavour in "${flavours[@]}"; do
    case $flavour in
        native)
            build_one native "${native_args[@]}" ;;
        avx2) build_one avx2 "${avx2_args[@]}" ;;
        *) say "unknown flavour $flavour (native|avx2)"; exit 2 ;;
    esac
done
