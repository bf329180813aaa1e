"""The build: the C runtime on the host without SCons (cbuild.py, `python -m
colibri.buildsteps.cbuild`) and the functions behind SCons
(site_scons/site_tools/*), plain so that pytest can test them without SCons.

sources   the canonical C source lists (library, kernels, CLI, firmware)
toolchain compiler and flags per target
cbuild    the C runtime on the host: libcolibri.a/.so, colibri-cli
blob      the model blob for a target: byte order, embedding assembly,
          the firmware's generated config header (arena size, prompts)
size      section/symbol sizes from an ELF (pyelftools) and budget checks
emulate   emulator commands, running firmware/CLI under a timeout, parsing
          the firmware's output
golden    golden logits from the numpy reference and their comparison
check     `scons check`: the firmware and the CLI against golden logits
testmodel deterministic tiny .colibri models for firmware builds and tests
bootloader, fwrun, cli_check, compdb, analysis: the bootloader build, firmware
          runs, the CLI check, compile_commands.json, the static analysis

It stands on top: it uses the file, text, model and device packages, and
nothing of colibri imports it.

May import: errors, file, text, model, device
"""
