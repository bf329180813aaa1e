#!/usr/bin/env bash
# Idempotent setup for a fresh Debian 12 machine (run as root or with sudo):
#   1. Debian packages: host compiler, sanitizer runtimes, valgrind, the cross
#      compilers and QEMU emulators for every target (DESIGN.md section 6).
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
