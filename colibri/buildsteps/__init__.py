"""Build helpers behind SCons (site_scons/site_tools/*): plain functions so
pytest can test them without SCons.

sources   the canonical C source lists (library, kernels, CLI, firmware)
blob      the model blob for a target: byte order, embedding assembly,
          the firmware's generated config header (arena size, prompts)
size      section/symbol sizes from an ELF (pyelftools) and budget checks
emulate   emulator commands, running firmware/CLI under a timeout, parsing
          the firmware's output
golden    golden logits from the numpy reference and their comparison
testmodel deterministic tiny .colibri models for firmware builds and tests
"""
