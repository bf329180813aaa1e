#!/usr/bin/env bash
# Idempotent setup for a fresh Debian 12 machine (run as root or with sudo):
#   1. Debian packages: host compiler, sanitizer runtimes, valgrind, the cross
#      compilers and QEMU emulators for every target (DESIGN.md section 6),
#      the static analysers (cppcheck with its MISRA addon, Frama-C's EVA;
#      clang --analyze and gcc -fanalyzer come with the compilers), SIMDe's
#      headers (the avx512 kernels emulated on an AVX2 CPU, tests/test_kernels.py).
#   2. A virtual environment at .venv/ with the colibri package (editable) and
#      everything the tests need, torch pinned to the CPU wheel.
# A second run checks what is there and finishes in seconds.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

say() { printf '[setup] %s\n' "$*"; }

# --- 1. Debian packages -----------------------------------------------------
apt_packages=(
    gcc g++ make clang libclang-rt-14-dev valgrind
    gcc-arm-linux-gnueabihf libc6-dev-armhf-cross
    gcc-powerpc-linux-gnu libc6-dev-powerpc-cross
    gcc-aarch64-linux-gnu libc6-dev-arm64-cross
    gcc-riscv64-linux-gnu libc6-dev-riscv64-cross
    gcc-arm-none-eabi libnewlib-arm-none-eabi
    qemu-user qemu-system-arm
    python3-venv
    python3.11-doc
    cppcheck
    libsimde-dev
)
missing=()
for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    say "Debian packages present"
fi

# --- 2. Python virtual environment -----------------------------------------
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    say "creating .venv"
    "$python" -m venv .venv
fi
# Reinstall only when the dependency list changed.
stamp=.venv/.colibri-setup-stamp
want=$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    say "installing Python packages into .venv (torch is the pinned CPU wheel)"
    # pip's output (notes about absent mirror folders, setuptools notices)
    # goes to a log that is shown only when an install fails.
    log=.venv/setup-pip.log
    : > "$log"
    pipq() {
        if ! .venv/bin/python -m pip install -q "$@" >> "$log" 2>&1; then
            tail -n 40 "$log" >&2
            echo "[setup] pip install $* failed (full log: $log)" >&2
            exit 1
        fi
    }
    pipq --upgrade pip
    # torch first and alone, pinned, so nothing can pull a CUDA build.
    pipq "torch==2.13.0"
    .venv/bin/python -c 'import torch' 2>> "$log" || { echo "[setup] torch==2.13.0 did not install" >&2; exit 1; }
    pipq -e ".[test,golden]"
    .venv/bin/python -c 'import colibri, numpy, safetensors, transformers, elftools, SCons' \
        || { echo "[setup] the Python environment is incomplete" >&2; exit 1; }
    echo "$want" > "$stamp"
else
    say "Python packages present"
fi

# --- 3. Third-party C sources for the bootloader --------------------------
# firmware/boot/ verifies Ed25519 signatures with Orson Peters' ed25519 (zlib
# licence, SHA-512 included), taken from the PyPI source distribution
# ed25519-orlp, pinned by version and SHA-256 and unpacked into third_party/
# (ignored by git: it is fetched, never committed). pip only downloads the
# sdist; nothing is built or installed from it.
orlp_version=0.1.3
orlp_sha256=5dfa52e8f63687f028ed0e3f8e2b385bffd22a630c740be642d73a532d0137dd
orlp_dir=third_party/ed25519-orlp-$orlp_version
if [ "$(cat "$orlp_dir/.sha256" 2>/dev/null)" != "$orlp_sha256" ]; then
    say "fetching ed25519-orlp==$orlp_version (sdist) for the bootloader"
    dl=third_party/download
    rm -rf "$dl" "$orlp_dir"
    mkdir -p "$dl"
    .venv/bin/python -m pip download -q --no-deps --no-binary :all: \
        "ed25519-orlp==$orlp_version" -d "$dl" >> .venv/setup-pip.log 2>&1 \
        || { echo "[setup] could not download ed25519-orlp==$orlp_version" >&2; exit 1; }
    sdist="$dl/ed25519_orlp-$orlp_version.tar.gz"
    got=$(sha256sum "$sdist" | cut -d' ' -f1)
    if [ "$got" != "$orlp_sha256" ]; then
        echo "[setup] $sdist has SHA-256 $got, expected $orlp_sha256: refusing to use it" >&2
        exit 1
    fi
    mkdir -p "$orlp_dir"
    tar -xzf "$sdist" -C "$orlp_dir" --strip-components=4 \
        "ed25519_orlp-$orlp_version/src/ed25519_orlp/csrc"
    tar -xzf "$sdist" -C "$orlp_dir" --strip-components=1 "ed25519_orlp-$orlp_version/LICENSE"
    echo "$orlp_sha256" > "$orlp_dir/.sha256"
    rm -rf "$dl"
else
    say "ed25519-orlp $orlp_version present"
fi
