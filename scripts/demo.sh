#!/usr/bin/env bash
# The main job, from a fresh machine: set up, convert the bundled demo model
# (models/demo: a Mixtral with a 2048-piece BPE tokenizer, trained on the
# Python documentation; the .colibri file carries the tokenizer), build
# firmware for a target with the model embedded, run it under the target's
# emulator on a prompt (the device tokenises it and samples with a fixed
# seed), print the generated text, tokens/s, the size report, and sign the
# firmware into an image and an OTA package.
#
#   ./scripts/demo.sh            # armv7 under qemu-arm
#   ./scripts/demo.sh ppc        # any target of `scons target=list`
#   PROMPT="Python is" GENERATE=64 ./scripts/demo.sh
#   GREEDY=1 ./scripts/demo.sh   # argmax instead of seeded sampling
#   TEMPERATURE=1.0 TOP_K=0 SEED=5 ./scripts/demo.sh
#   QUANT=q4 ./scripts/demo.sh   # the 4-bit mix (default int8; f32 too):
#                                # hidden 128 rows give Q4_0, int8 fallbacks
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
target=${1:-armv7}
prompt=${PROMPT:-The Python tutorial}
generate=${GENERATE:-60}
quant=${QUANT:-int8}
case "$quant" in
    f32|int8|q4) ;;
    *) echo "QUANT=$quant: choose f32, int8 or q4 (colibri convert --quant)" >&2; exit 2 ;;
esac
# Seeded sampling (models/demo/eval.py's SAMPLE_*): the same text on every
# target; greedy=1 overrides the temperature.
sampling=(temperature="${TEMPERATURE:-0.8}" top_k="${TOP_K:-40}" seed="${SEED:-1}"
          greedy="${GREEDY:-0}")

step() { printf '\n== %s\n' "$*"; }

step "1/6 setup (installs only what is missing)"
bash scripts/setup.sh
export PATH="$root/.venv/bin:$PATH"
out=build/demo
model=$out/demo-$quant.colibri
key=$out/dev-signing.key
mkdir -p "$out"

step "2/6 colibri convert models/demo/checkpoint -o $model --quant $quant"
colibri convert models/demo/checkpoint -o "$model" --quant "$quant"
colibri info --brief "$model"

step "3/6 scons target=$target model=$model (library, colibri-cli, firmware, size budgets)"
scons -Q target="$target" model="$model" prompt="$prompt" generate="$generate" "${sampling[@]}"

step "4/6 running the firmware under emulation: prompt '$prompt', $generate tokens (${sampling[*]})"
scons -Q target="$target" model="$model" prompt="$prompt" generate="$generate" "${sampling[@]}" run

step "5/6 size report"
scons -Q target="$target" model="$model" prompt="$prompt" generate="$generate" "${sampling[@]}" size

step "6/6 signed firmware image and OTA package"
if [ ! -f "$key" ]; then
    colibri fw keygen -o "$key"
    echo "(a development key: sign releases with your own, kept off the build machine)"
fi
scons -Q target="$target" model="$model" prompt="$prompt" generate="$generate" "${sampling[@]}" \
    image ota version=0.1.0 key="$key"
colibri fw verify "build/$target/firmware.img" --key "$key.pub" --target "$target"

cat <<EOT

Done. Outputs in build/$target/:
  firmware.elf   firmware with the model embedded (.colibri_model section)
  firmware.img   signed image      (colibri fw info build/$target/firmware.img)
  firmware.ota   signed OTA package (colibri fw verify build/$target/firmware.ota --key $key.pub)
  libcolibri.a, size.txt, compile_commands.json$( [ -f "build/$target/colibri-cli" ] && echo ", colibri-cli" )
Check every target against the numpy reference: scons target=all check
EOT
