"""The device side: signed MCUboot images (image.py; agrees with
src/include/colibri_image.h), Ed25519 keys (keys.py), OTA packages (ota.py),
the A/B update agent with rollback over a simulated flash (update_agent.py)
and `colibri fw` (fw_cli.py), docs/IMAGE.md.

An image describes the model it carries (file.format); nothing here
converts or runs a model.

May import: errors, file
"""
