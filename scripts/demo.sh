#!/usr/bin/env bash
# The main job, from a fresh machine: set up, make a tiny Mixtral checkpoint
# locally (no download), convert it to an int8 .colibri file, inspect it, and
# generate tokens with the numpy reference and with the C runtime.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/setup.sh
py=.venv/bin/python
colibri=.venv/bin/colibri
out=build/demo
mkdir -p "$out"

step() { printf '\n== %s\n' "$*"; }

if [ ! -f "$out/hf/config.json" ]; then
    step "making a tiny Mixtral checkpoint (fixed seed) in $out/hf"
    "$py" tests/golden_configs.py tiny "$out/hf" 2>&1 | grep -v 'Writing model shards' || true
fi

step "colibri convert $out/hf -o $out/tiny-int8.colibri --quant int8"
"$colibri" convert "$out/hf" -o "$out/tiny-int8.colibri" --quant int8

step "colibri info"
"$colibri" info "$out/tiny-int8.colibri"

step "colibri run (numpy reference): prompt 1,2,3,4, 8 greedy tokens"
"$colibri" run "$out/tiny-int8.colibri" --tokens 1,2,3,4 --generate 8

if [ -f colibri/cbuild.py ]; then
    step "building the C runtime into build/x86_64 and running colibri-cli on the same prompt"
    "$py" -m colibri.cbuild >/dev/null
    build/x86_64/colibri-cli --model "$out/tiny-int8.colibri" --tokens 1,2,3,4 --generate 8
fi
