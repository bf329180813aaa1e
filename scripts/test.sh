#!/usr/bin/env bash
# Set everything up (idempotent) and run every test: Python unit tests, golden
# tests against transformers, C runtime tests (also under sanitizers), kernels
# natively and under QEMU. Extra arguments go to pytest (e.g. -k golden).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/setup.sh
# Tests run on the machine's cores with pytest-xdist (each worker builds what
# its tests need in its own temporary directories). More than 4 workers only
# repeat the session fixtures (golden models, C builds) once more each.
# COLIBRI_TEST_JOBS=N overrides (0: one process, no workers).
jobs=${COLIBRI_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
[ "$jobs" -gt 4 ] && jobs=4
[ "$jobs" -lt 2 ] && jobs=0
# --durations: the slowest tests, so a run shows where the suite's time goes.
exec .venv/bin/python -m pytest -n "$jobs" --durations=25 "$@"
