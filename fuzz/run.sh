#!/bin/sh
# fuzz/run.sh - build the libFuzzer harness and fuzz colibri_init_from_memory
# + colibri_infer under AddressSanitizer and UndefinedBehaviorSanitizer.
#
#   fuzz/run.sh SECONDS        build, then fuzz for SECONDS (default 60)
#   fuzz/run.sh build          build only (build/fuzz/fuzz_init_infer)
#   fuzz/run.sh merge          minimise the committed corpus fuzz/corpus/ with
#                              what the runs found (libFuzzer -merge=1); its
#                              regress-* and seed-* inputs are kept
#   fuzz/run.sh repro FILE...  run the fuzzer binary on given inputs
#   fuzz/run.sh coverage       line/branch coverage of src/ by the committed
#                              corpus and the seeds (llvm-cov report)
#
# Needs clang (with compiler-rt's libFuzzer). One fuzzing process: the
# machine is shared. New inputs go to build/fuzz/work/ (not committed), crashes
# to build/fuzz/artifacts/; fuzz/corpus/ is read as a second corpus. Seeds
# (valid tiny files of every quantisation) come from fuzz/gen_seeds.py.
# The source list mirrors colibri/buildsteps/sources.py (LIBRARY plus the AVX2
# kernels on x86-64); tests/test_fuzz_corpus.py checks that they agree.
# KERNELS=ref fuzz/run.sh ... builds the portable reference kernels only
# (into build/fuzz-ref/), the path every non-x86 target runs.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT="$ROOT/build/fuzz${KERNELS:+-$KERNELS}"
CC=${CC:-clang}
PY=${PY:-$ROOT/.venv/bin/python}
SOURCES="src/format.c src/load.c src/plan.c src/forward.c src/tensor.c src/moe.c src/stream.c src/encdec.c src/threads.c src/info.c src/detail.c src/tokenizer.c src/sample.c src/crc32.c src/kernels/ref.c"
DEFS=""
case "${KERNELS:-host}-$(uname -m)" in
    host-x86_64|host-amd64) SOURCES="$SOURCES src/kernels/avx2.c src/kernels/avx512.c"; DEFS="-DCOLIBRI_USE_AVX2" ;;
    ref-*) DEFS="-DCOLIBRI_KERNELS_REF_ONLY" ;;
esac

build() {
    mkdir -p "$OUT"
    # -fno-sanitize-recover: any UB report is a crash the fuzzer keeps.
    # -ffp-contract=off as in every colibri build.
    (cd "$ROOT" && $CC -std=c11 -g -O1 -ffp-contract=off -fno-omit-frame-pointer \
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
        -Isrc/include -Isrc -Isrc/kernels $DEFS -DCOLIBRI_KERNELS_PLAIN -DCOLIBRI_ENABLE_MMAP=1 \
        fuzz/fuzz_init_infer.c $SOURCES -lm -o "$OUT/fuzz_init_infer")
    if [ ! -d "$OUT/seeds" ]; then
        "$PY" "$ROOT/fuzz/gen_seeds.py" "$OUT/seeds" >/dev/null
    fi
    mkdir -p "$OUT/work" "$OUT/artifacts"
}

FLAGS="-rss_limit_mb=2048 -timeout=20 -max_len=20000 -print_final_stats=1"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

case "${1:-60}" in
build)
    build ;;
merge)
    build
    # Kept whatever the budget: regress-* inputs (named after the bug they
    # found) as they are, and seed-* ones (gen_seeds.py's files that reach
    # code nothing smaller reaches: the block kernels and their byte swap,
    # 16 KB each, the first the budget would drop) as gen_seeds.py makes
    # them today. In the merge's output from the start, so it counts their
    # features and copies no twin.
    rm -rf "$OUT/merged" && mkdir -p "$OUT/merged"
    for f in "$ROOT"/fuzz/corpus/regress-* "$ROOT"/fuzz/corpus/seed-*; do
        [ -f "$f" ] || continue
        n=$(basename "$f")
        case "$n" in seed-*) [ -f "$OUT/seeds/$n" ] && f="$OUT/seeds/$n" ;; esac
        cp "$f" "$OUT/merged/$n"
    done
    "$OUT/fuzz_init_infer" -merge=1 $FLAGS "$OUT/merged" "$ROOT/fuzz/corpus" \
        "$OUT/seeds" "$OUT/work"
    find "$ROOT/fuzz/corpus" -type f ! -name 'regress-*' ! -name 'seed-*' -delete
    cp "$OUT"/merged/* "$ROOT/fuzz/corpus/"
    # Budget: drop the largest other inputs until the corpus is under
    # BUDGET_KB (merge keeps the smallest input per feature, so this loses
    # the least).
    while [ "$(du -sk "$ROOT/fuzz/corpus" | cut -f1)" -gt "${BUDGET_KB:-1900}" ]; do
        big=$(ls -S "$ROOT/fuzz/corpus" | grep -v -e '^regress-' -e '^seed-' | head -1)
        [ -n "$big" ] || break
        rm -f "$ROOT/fuzz/corpus/$big"
    done
    echo "fuzz/corpus: $(ls "$ROOT/fuzz/corpus" | wc -l) files, $(du -sk "$ROOT/fuzz/corpus" | cut -f1) KB"
    ;;
coverage)
    build
    COV="$OUT/coverage" && mkdir -p "$COV"
    (cd "$ROOT" && $CC -std=c11 -O1 -ffp-contract=off -fprofile-instr-generate \
        -fcoverage-mapping -Isrc/include -Isrc -Isrc/kernels $DEFS -DCOLIBRI_ENABLE_MMAP=1 \
        fuzz/fuzz_init_infer.c fuzz/replay_main.c $SOURCES -lm -o "$COV/replay")
    LLVM_PROFILE_FILE="$COV/replay.profraw" "$COV/replay" "$ROOT"/fuzz/corpus/* \
        "$OUT"/seeds/* > /dev/null
    llvm-profdata merge -sparse "$COV/replay.profraw" -o "$COV/replay.profdata"
    (cd "$ROOT" && llvm-cov report "$COV/replay" -instr-profile="$COV/replay.profdata" $SOURCES)
    ;;
repro)
    build
    shift
    "$OUT/fuzz_init_infer" $FLAGS "$@" ;;
*)
    build
    cd "$OUT"
    ./fuzz_init_infer $FLAGS -max_total_time="$1" -artifact_prefix="$OUT/artifacts/" \
        "$OUT/work" "$ROOT/fuzz/corpus" "$OUT/seeds"
    ;;
esac
