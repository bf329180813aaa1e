"""SCons tool: the Cortex-M bootloader goals (firmware/boot/, docs/IMAGE.md 10).

  env.ColibriBoot(boot_elf, key=, corpus=False)   boot.elf with KEY's public half built in
  env.ColibriSlotImage(img, firmware_bin, version=, key=, security_counter=)
                                                  the slot-A firmware signed (hdr_size 0x200)
  env.ColibriSlotFlash(flash, img, key=)          the agent's flash file: img confirmed in A
  env.ColibriBootCheck(alias, [boot, corpus, flash, img], key=)
                                                  the QEMU matrix (bootloader.boot_check)

Their actions call colibri.buildsteps.bootloader and colibri.device.update_agent, so
tests/test_boot_qemu.py exercises the same functions without SCons.
"""
from pathlib import Path

import SCons.Errors
from SCons.Action import Action

from colibri.device import image as I
from colibri.device import keys
from colibri.device import update_agent as U
from colibri.buildsteps import bootloader as BL
from colibri.errors import ColibriError

SLOT_SIZE, SLOT_ALIGN, WRITE_SIZE = BL.DEMO_SLOT_SIZE, BL.DEMO_SLOT_ALIGN, BL.DEMO_WRITE_SIZE


def _fail(exc):
    raise SCons.Errors.BuildError(errstr=str(exc))


def _boot_action(target, source, env):
    try:
        key = keys.load_private(env["COLIBRI_BOOT_KEY"])
        BL.build_boot(Path(str(target[0])).parent, key.public_key(),
                      target_id=I.TARGET_IDS["cortex-m"], corpus=env["COLIBRI_BOOT_CORPUS"])
    except ColibriError as exc:
        _fail(exc)
    return 0


def _image_action(target, source, env):
    try:
        key = keys.load_private(env["COLIBRI_BOOT_KEY"])
        data = I.pack_image(Path(str(source[0])).read_bytes(), "cortex-m",
                            I.Version.parse(env["COLIBRI_BOOT_VERSION"]), key,
                            security_counter=int(env["COLIBRI_BOOT_COUNTER"], 0),
                            header_size=BL.HEADER_SIZE, slot_size=SLOT_SIZE - BL.TRAILER_SIZE)
        I.write_atomic(str(target[0]), data)
    except (ColibriError, ValueError) as exc:
        _fail(exc)
    return 0


def _flash_action(target, source, env):
    try:
        key = keys.load_private(env["COLIBRI_BOOT_KEY"])
        U.init_flash(str(target[0]), Path(str(source[0])).read_bytes(), key.public_key(),
                     slot_size=SLOT_SIZE, align=SLOT_ALIGN, write_size=WRITE_SIZE)
    except ColibriError as exc:
        _fail(exc)
    return 0


def _check_action(target, source, env):
    boot, corpus, flash, img = (Path(str(s)) for s in source[:4])
    print("boot-check (qemu-system-arm -M mps2-an386):")
    try:
        BL.boot_check(boot, corpus, keys.load_private(env["COLIBRI_BOOT_KEY"]),
                      boot.parent / "check", demo_flash=flash, demo_image=img.read_bytes())
    except ColibriError as exc:
        _fail(f"boot-check: {exc}")
    return 0


def _need_key(env, key):
    if not key:
        raise SCons.Errors.StopError("the boot goals need key=KEY (a private key from "
                                     "`colibri fw keygen`): its public half is built into "
                                     "the bootloader and it signs the slot-A firmware")
    return env.File(key)


def ColibriBoot(env, boot_elf, key, corpus=False):
    key = _need_key(env, key)
    srcs = [env.File(f"#{s}") for s in BL.BOOT_SOURCES + BL.STARTUP] + \
        [env.File("#firmware/boot/boot_core.h"), env.File("#firmware/boot/xip.ld"), key]
    return env.Command(boot_elf, srcs, Action(_boot_action, "  BOOT  [cortex-m] $TARGET"),
                       COLIBRI_BOOT_KEY=key.abspath, COLIBRI_BOOT_CORPUS=corpus)


def ColibriSlotImage(env, img, firmware_bin, version, key, security_counter="0"):
    key = _need_key(env, key)
    if not version:
        raise SCons.Errors.StopError("the boot goals need version=MAJOR.MINOR.PATCH[+BUILD] "
                                     "for the slot-A image")
    nodes = env.Command(img, [firmware_bin, key], Action(_image_action,
                                                         "  SIGN  [cortex-m] $TARGET"),
                        COLIBRI_BOOT_KEY=key.abspath, COLIBRI_BOOT_VERSION=version,
                        COLIBRI_BOOT_COUNTER=str(security_counter))
    env.Depends(nodes, env.Value((version, str(security_counter))))
    return nodes


def ColibriSlotFlash(env, flash, img, key):
    key = _need_key(env, key)
    return env.Command(flash, [img, key], Action(_flash_action, "  FLASH [cortex-m] $TARGET"),
                       COLIBRI_BOOT_KEY=key.abspath)


def ColibriBootCheck(env, alias, sources, key):
    key = _need_key(env, key)
    e = env.Clone(COLIBRI_BOOT_KEY=key.abspath)
    a = e.Alias(alias, sources, Action(_check_action, cmdstr=None))
    e.AlwaysBuild(a)
    return a


def generate(env):
    env.AddMethod(ColibriBoot)
    env.AddMethod(ColibriSlotImage)
    env.AddMethod(ColibriSlotFlash)
    env.AddMethod(ColibriBootCheck)


def exists(env):
    return True
