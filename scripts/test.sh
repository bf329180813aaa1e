#!/usr/bin/env bash
# Set everything up (idempotent) and run every test: Python unit tests, golden
# tests against transformers, C runtime tests (also under sanitizers), kernels
# natively and under QEMU. Extra arguments go to pytest (e.g. -k golden).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
